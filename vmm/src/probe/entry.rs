//! Syscall entry instructions the guest kernel can be told to use
//! (`entry=` on its command line), and what a probe saw when user code ran one.

use std::fmt;

use serde::Serialize;

/// What happened when user code (CPL3, long mode) executed an entry instruction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum EntryOutcome {
    /// The intended kernel entry point ran at CPL0: usable.
    DeliveredCpl0,
    /// The intended entry point ran, but not at CPL0 (e.g. SYSCALL under
    /// kvm-pvm jumps to LSTAR and stays at CPL3): not usable.
    WrongCpl {
        /// The privilege level the entry point ran at.
        cpl: u8,
    },
    /// An exception was raised instead (#UD = 6, #GP = 13, ...), delivered
    /// to the kernel at CPL0.
    Exception {
        /// The exception vector.
        vector: u8,
        /// The error code, for the vectors that push one.
        error_code: Option<u32>,
    },
    /// The instruction completed in user mode without entering the kernel.
    NotDelivered,
    /// The VM triple-faulted.
    Shutdown,
    /// KVM gave up (KVM_EXIT_INTERNAL_ERROR / FAIL_ENTRY / other exit).
    KvmError {
        /// The exit KVM reported.
        detail: String,
    },
    /// The probe did not finish in time.
    Timeout,
}

impl EntryOutcome {
    /// Whether the guest kernel can use this entry.
    pub fn works(&self) -> bool {
        *self == EntryOutcome::DeliveredCpl0
    }
}

/// The conventional mnemonic of an exception vector.
pub fn vector_name(v: u8) -> String {
    let n = match v {
        0 => "#DE",
        1 => "#DB",
        2 => "NMI",
        3 => "#BP",
        4 => "#OF",
        5 => "#BR",
        6 => "#UD",
        7 => "#NM",
        8 => "#DF",
        10 => "#TS",
        11 => "#NP",
        12 => "#SS",
        13 => "#GP",
        14 => "#PF",
        16 => "#MF",
        17 => "#AC",
        18 => "#MC",
        19 => "#XM",
        _ => return format!("vector {v:#x}"),
    };
    n.to_string()
}

impl fmt::Display for EntryOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EntryOutcome::DeliveredCpl0 => f.write_str("delivered at CPL0"),
            EntryOutcome::WrongCpl { cpl } => write!(f, "broken: stays at CPL{cpl}"),
            EntryOutcome::Exception { vector, error_code } => {
                write!(f, "{}", vector_name(*vector))?;
                if let Some(e) = error_code {
                    write!(f, " (error code {e:#x})")?;
                }
                Ok(())
            }
            EntryOutcome::NotDelivered => {
                f.write_str("not delivered: execution went on in user mode")
            }
            EntryOutcome::Shutdown => f.write_str("shutdown (triple fault)"),
            EntryOutcome::KvmError { detail } => write!(f, "KVM error: {detail}"),
            EntryOutcome::Timeout => f.write_str("timed out"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ptiscope_abi::options::Entry;

    #[test]
    fn cmdline_values_round_trip() {
        for e in Entry::ALL {
            assert_eq!(e.name().parse::<Entry>(), Ok(*e));
        }
        assert!("int $0x80".parse::<Entry>().is_err());
        assert!("".parse::<Entry>().is_err());
    }

    #[test]
    fn only_cpl0_delivery_works() {
        assert!(EntryOutcome::DeliveredCpl0.works());
        assert!(!EntryOutcome::WrongCpl { cpl: 3 }.works());
        assert!(!EntryOutcome::Exception {
            vector: 6,
            error_code: None
        }
        .works());
    }

    #[test]
    fn outcome_text_names_the_exception() {
        let gp = EntryOutcome::Exception {
            vector: 13,
            error_code: Some(0x402),
        };
        assert_eq!(gp.to_string(), "#GP (error code 0x402)");
        assert_eq!(
            EntryOutcome::WrongCpl { cpl: 3 }.to_string(),
            "broken: stays at CPL3"
        );
    }
}
