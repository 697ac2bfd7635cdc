//! What a probe VM's run reports: why it stopped ([`Stop`]), the
//! exceptions its handlers saw ([`Delivery`]) and the values its code
//! stored ([`Trace`]).

use super::code;

/// Why a probe run stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// The guest stored its end code to [`code::report::END`].
    End(u32),
    /// KVM_EXIT_HLT (a handler's `cli; hlt`, or a HLT the probe did not expect).
    Hlt,
    /// KVM_EXIT_SHUTDOWN (triple fault).
    Shutdown,
    /// KVM_EXIT_INTERNAL_ERROR with its suberror.
    InternalError(u32),
    /// KVM_EXIT_FAIL_ENTRY with the hardware reason.
    FailEntry(u64),
    /// An access to unbacked guest memory.
    Mmio(u64),
    /// The watchdog stopped the vCPU.
    Timeout,
    /// Some other exit (named).
    Other(String),
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::End(c) => write!(f, "ran to its end (code {c})"),
            Stop::Hlt => f.write_str("HLT exit"),
            Stop::Shutdown => f.write_str("KVM_EXIT_SHUTDOWN"),
            Stop::InternalError(s) => write!(f, "KVM_EXIT_INTERNAL_ERROR (suberror {s})"),
            Stop::FailEntry(r) => write!(f, "KVM_EXIT_FAIL_ENTRY (reason {r:#x})"),
            Stop::Mmio(a) => write!(f, "access to unbacked memory at {a:#x}"),
            Stop::Timeout => f.write_str("timed out (watchdog)"),
            Stop::Other(s) => write!(f, "unexpected exit {s}"),
        }
    }
}

/// An interrupt-gate entry a handler reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    pub vector: u8,
    /// CS at the handler: its low two bits are the handler's CPL.
    pub handler_cs: u16,
    /// The first three stack slots at handler entry (low 32 bits each).
    pub frame: [u32; 3],
}

impl Delivery {
    /// The error code, for exceptions that push one.
    pub fn error_code(&self) -> Option<u32> {
        code::has_error_code(self.vector).then_some(self.frame[0])
    }
    /// RIP saved in the frame (low 32 bits; probe code lives below 64 KiB).
    pub fn saved_rip(&self) -> u32 {
        if code::has_error_code(self.vector) {
            self.frame[1]
        } else {
            self.frame[0]
        }
    }
    /// CS saved in the frame (its low bits are the interrupted CPL).
    pub fn saved_cs(&self) -> u16 {
        let v = if code::has_error_code(self.vector) {
            self.frame[2]
        } else {
            self.frame[1]
        };
        v as u16
    }
    pub fn cpl(&self) -> u8 {
        (self.handler_cs & 3) as u8
    }
}

/// Everything a probe run produced.
#[derive(Debug, Clone)]
pub struct Trace {
    /// Report stores in order: (report address, value masked to its width).
    pub writes: Vec<(u64, u64)>,
    pub stop: Stop,
    /// Registers after the stop (KVM_GET_REGS/SREGS work even after
    /// SHUTDOWN and INTERNAL_ERROR here).
    pub rip: Option<u64>,
    pub cr3: Option<u64>,
}

impl Trace {
    pub fn values(&self, addr: u64) -> Vec<u64> {
        self.writes
            .iter()
            .filter(|(p, _)| *p == addr)
            .map(|(_, v)| *v)
            .collect()
    }
    pub fn last(&self, addr: u64) -> Option<u64> {
        self.values(addr).last().copied()
    }
    /// The highest progress marker reached.
    pub fn stage(&self) -> u8 {
        self.values(code::report::STAGE)
            .into_iter()
            .max()
            .unwrap_or(0) as u8
    }
    /// Gate entries reported by handlers, in order.
    pub fn deliveries(&self) -> Vec<Delivery> {
        let mut out = Vec::new();
        let mut cur: Option<(u8, u16, Vec<u32>)> = None;
        for &(p, v) in &self.writes {
            match p {
                code::report::VECTOR => {
                    cur = Some((v as u8, 0, Vec::new()));
                }
                code::report::HANDLER_CS => {
                    if let Some(c) = cur.as_mut() {
                        c.1 = v as u16;
                    }
                }
                code::report::FRAME => {
                    if let Some(c) = cur.as_mut() {
                        c.2.push(v as u32);
                        if c.2.len() == 3 {
                            out.push(Delivery {
                                vector: c.0,
                                handler_cs: c.1,
                                frame: [c.2[0], c.2[1], c.2[2]],
                            });
                            cur = None;
                        }
                    }
                }
                _ => {}
            }
        }
        out
    }
    /// Where it stopped, for details: "at rip 0x.., cr3 0x..".
    pub fn where_(&self) -> String {
        match (self.rip, self.cr3) {
            (Some(r), Some(c)) => format!("rip {r:#x}, cr3 {c:#x}"),
            (Some(r), None) => format!("rip {r:#x}"),
            _ => "registers unavailable".to_string(),
        }
    }
}
