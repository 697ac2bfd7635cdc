//! Paging-mode probes. Each starts the vCPU in 32-bit protected mode with
//! paging off (as a PVH boot does), with a 32-bit IDT whose handlers report
//! any exception, and turns paging on itself: 4-level long mode, 32-bit
//! PAE, or legacy 32-bit paging. Progress markers tell how far it got.

use serde::Serialize;

use super::code::{self, report, sel, Asm};
use super::entry::vector_name;
use super::vm::{Kit, ProbeVm, Program, StartMode, Stop, Trace, VmError};
use crate::x86::{cr0, cr4, efer, msr};

/// Markers.
const STAGE_START: u8 = 1;
const STAGE_CR3_SET: u8 = 2;
const STAGE_PAGING_ON: u8 = 3;
const STAGE_LONG_MODE: u8 = 4;

/// Result of a paging-mode probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum PagingOutcome {
    /// Paging came on and code ran with it.
    Works,
    /// The `mov cr0` that sets PG raised an exception.
    Exception {
        /// The exception vector.
        vector: u8,
        /// The faulting instruction's address, as the handler saw it.
        rip: u32,
    },
    /// The VM triple-faulted.
    Shutdown {
        /// RIP at the shutdown, if the registers could be read.
        rip: Option<u64>,
    },
    /// Something else stopped it.
    Failed {
        /// What stopped it.
        detail: String,
    },
}

impl PagingOutcome {
    /// True for [`PagingOutcome::Works`].
    pub fn works(&self) -> bool {
        *self == PagingOutcome::Works
    }
}

impl std::fmt::Display for PagingOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PagingOutcome::Works => f.write_str("works"),
            PagingOutcome::Exception { vector, rip } => {
                write!(f, "refused: {} at rip {rip:#x}", vector_name(*vector))
            }
            PagingOutcome::Shutdown { rip: Some(r) } => {
                write!(f, "refused: KVM_EXIT_SHUTDOWN at rip {r:#x}")
            }
            PagingOutcome::Shutdown { rip: None } => f.write_str("refused: KVM_EXIT_SHUTDOWN"),
            PagingOutcome::Failed { detail } => write!(f, "failed: {detail}"),
        }
    }
}

/// The paging modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// PAE + CR3 + EFER.LME + CR0.PG, then a far jump to 64-bit code.
    Long,
    /// CR4.PAE + CR0.PG with EFER.LME = 0.
    Pae,
    /// CR4.PSE + CR0.PG with CR4.PAE = 0.
    Legacy,
}

/// The 32-bit code turning on paging in `mode`.
fn kernel(mode: Mode) -> (Asm, Option<Asm>) {
    let mut k = Asm::new(code::KERNEL_CODE);
    k.stage(STAGE_START);
    let (cr4_bit, cr3) = match mode {
        Mode::Long => (cr4::PAE, code::PML4),
        Mode::Pae => (cr4::PAE, code::PAE_PDPT),
        Mode::Legacy => (cr4::PSE, code::LEGACY_PD),
    };
    k.mov_eax_cr4().or_eax(cr4_bit as u32).mov_cr4_eax();
    k.mov_eax(cr3 as u32).mov_cr3_eax();
    if mode == Mode::Long {
        k.mov_ecx(msr::EFER)
            .rdmsr()
            .or_eax(efer::LME as u32)
            .wrmsr();
    }
    k.stage(STAGE_CR3_SET);
    k.mov_eax_cr0().or_eax(cr0::PG as u32).mov_cr0_eax();
    k.stage(STAGE_PAGING_ON);
    if mode != Mode::Long {
        // Still running, with paging: report CR0 and stop.
        k.mov_eax_cr0().report_eax().end(0);
        return (k, None);
    }
    // Compatibility mode now; the far jump loads the 64-bit CS.
    let lm_at = code::KERNEL_CODE + 0x200;
    k.ljmp32(sel::KERNEL_CS, lm_at as u32);
    let mut lm = Asm::new(lm_at);
    lm.stage(STAGE_LONG_MODE)
        .report_cs(report::LANDING_CS)
        .mov_ecx(msr::EFER)
        .rdmsr()
        .report_eax()
        .end(0);
    (k, Some(lm))
}

/// Runs the probe for `mode` in a fresh VM.
pub fn probe(kit: &Kit, mode: Mode) -> Result<(PagingOutcome, String), VmError> {
    let (k, lm) = kernel(mode);
    let mut p = Program::new(StartMode::Protected32, k);
    p.extra.extend(lm);
    let mut vm = ProbeVm::new(kit)?;
    vm.load(&p)?;
    let t = vm.run(kit.timeout)?;
    Ok(classify(mode, &t))
}

fn classify(mode: Mode, t: &Trace) -> (PagingOutcome, String) {
    let stage = t.stage();
    if let Some(d) = t.deliveries().first() {
        let what = match stage {
            s if s >= STAGE_PAGING_ON => "after paging came on",
            STAGE_CR3_SET => "on the `mov cr0` setting PG",
            _ => "before paging was enabled",
        };
        return (
            PagingOutcome::Exception {
                vector: d.vector,
                rip: d.saved_rip(),
            },
            format!("{} {what}", vector_name(d.vector)),
        );
    }
    match &t.stop {
        Stop::End(0) => {
            let ok = match mode {
                Mode::Long => {
                    stage >= STAGE_LONG_MODE
                        && t.last(report::LANDING_CS) == Some(u64::from(sel::KERNEL_CS))
                        && t.last(report::VALUE)
                            .is_some_and(|efer| efer & efer::LMA != 0)
                }
                _ => {
                    stage >= STAGE_PAGING_ON
                        && t.last(report::VALUE).is_some_and(|v| v & cr0::PG != 0)
                }
            };
            if ok {
                let detail = match mode {
                    Mode::Long => format!(
                        "64-bit code ran with CS {:#x}, EFER {:#x} (LMA set)",
                        sel::KERNEL_CS,
                        t.last(report::VALUE).unwrap_or(0)
                    ),
                    _ => format!(
                        "code ran with CR0 {:#x} (PG set)",
                        t.last(report::VALUE).unwrap_or(0)
                    ),
                };
                (PagingOutcome::Works, detail)
            } else {
                (
                    PagingOutcome::Failed {
                        detail: "ran to the end without the expected state".into(),
                    },
                    format!("stage {stage}, writes {:x?}", t.writes),
                )
            }
        }
        Stop::Shutdown => {
            let what = if stage == STAGE_CR3_SET {
                "on the `mov cr0` setting PG"
            } else {
                "at stage"
            };
            (
                PagingOutcome::Shutdown { rip: t.rip },
                format!("triple fault {what} (stage {stage}, {})", t.where_()),
            )
        }
        other => (
            PagingOutcome::Failed {
                detail: other.to_string(),
            },
            format!("stage {stage}, {}", t.where_()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gp_on_cr0_write_is_refused_with_its_rip() {
        let t = Trace {
            writes: vec![
                (report::STAGE, 1),
                (report::STAGE, 2),
                (report::VECTOR, 13),
                (report::HANDLER_CS, 8),
                (report::FRAME, 0),
                (report::FRAME, 0x8030),
                (report::FRAME, 8),
            ],
            stop: Stop::Hlt,
            rip: None,
            cr3: None,
        };
        let (o, d) = classify(Mode::Pae, &t);
        assert_eq!(
            o,
            PagingOutcome::Exception {
                vector: 13,
                rip: 0x8030
            }
        );
        assert!(d.contains("mov cr0"), "{d}");
        assert!(!o.works());
    }

    #[test]
    fn long_mode_needs_lma_and_64bit_cs() {
        let mut t = Trace {
            writes: vec![
                (report::STAGE, 4),
                (report::LANDING_CS, 0x10),
                (report::VALUE, 0x500),
            ],
            stop: Stop::End(0),
            rip: None,
            cr3: None,
        };
        assert!(classify(Mode::Long, &t).0.works());
        t.writes[2].1 = 0x100; // LME without LMA
        assert!(!classify(Mode::Long, &t).0.works());
    }

    #[test]
    fn kernel_code_fits_below_long_mode_target() {
        let (k, lm) = kernel(Mode::Long);
        assert!(k.here() <= code::KERNEL_CODE + 0x200);
        assert!(lm.is_some_and(|l| l.here() < code::SYSCALL_LANDING));
    }
}
