//! User-mode entry probes: long mode set up by the VMM, a CPL0 prologue
//! that IRETQs to CPL3, and user code that executes one entry instruction.
//! Handlers (every vector, DPL3 gates) report vector and CPL; the SYSCALL
//! and SYSENTER landing points report their CS.

use serde::Serialize;

use super::code::{self, report, sel, Asm, HandlerExit};
use super::entry::EntryOutcome;
use super::vm::{Kit, ProbeVm, Program, StartMode, Stop, Trace, VmError};
use ptiscope_abi::options::Entry;

use crate::x86::{efer, msr};

const RFLAGS_DF: u64 = 1 << 10;
/// User RFLAGS: IOPL 3 (so `out` works at CPL3), DF set so that the SYSCALL
/// landing can tell whether FMASK (which clears DF) was applied; IF off.
const USER_RFLAGS: u32 = 0x3002 | RFLAGS_DF as u32;
use code::SYSCALL_FMASK as FMASK;

/// Markers of the entry programs.
const STAGE_IN_USER: u8 = 1;
const STAGE_AFTER_INSN: u8 = 2;
const STAGE_SYSCALL_LANDING: u8 = 0x10;
const STAGE_SYSENTER_LANDING: u8 = 0x11;

/// How the tested instruction is supposed to enter the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    Syscall,
    Sysenter,
    /// Through IDT gate `vector`.
    Gate(u8),
}

/// One instruction tested from user mode.
#[derive(Debug, Clone, Copy)]
struct UserInsn {
    name: &'static str,
    bytes: &'static [u8],
    entry: Option<Entry>,
    via: Via,
}

/// The instructions tested, as byte arrays (see each name).
const INSNS: [UserInsn; 9] = [
    UserInsn {
        name: "syscall",
        bytes: &[0x0f, 0x05], // syscall
        entry: Some(Entry::Syscall),
        via: Via::Syscall,
    },
    UserInsn {
        name: "sysenter",
        bytes: &[0x0f, 0x34], // sysenter
        entry: Some(Entry::Sysenter),
        via: Via::Sysenter,
    },
    UserInsn {
        name: "int $0x80",
        bytes: &[0xcd, 0x80], // int imm8
        entry: Some(Entry::Int80),
        via: Via::Gate(0x80),
    },
    UserInsn {
        name: "int3",
        bytes: &[0xcc], // one-byte breakpoint
        entry: Some(Entry::Int3),
        via: Via::Gate(3),
    },
    UserInsn {
        name: "int $3",
        bytes: &[0xcd, 0x03], // int imm8 with 3: not the same instruction as CC
        entry: None,
        via: Via::Gate(3),
    },
    UserInsn {
        name: "int $4",
        bytes: &[0xcd, 0x04],
        entry: Some(Entry::Int4),
        via: Via::Gate(4),
    },
    UserInsn {
        name: "int1",
        bytes: &[0xf1], // ICEBP: #DB without DPL check
        entry: None,
        via: Via::Gate(1),
    },
    UserInsn {
        name: "int $0x20",
        bytes: &[0xcd, 0x20],
        entry: None,
        via: Via::Gate(0x20),
    },
    UserInsn {
        name: "ud2",
        bytes: &[0x0f, 0x0b], // an exception from user mode: #UD
        entry: None,
        via: Via::Gate(6),
    },
];

/// Result of one user-mode entry probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EntryProbe {
    /// The instruction, as written in assembly.
    pub instruction: String,
    /// Its bytes, hex.
    pub bytes: String,
    /// The `entry=` value it backs, if any.
    pub entry: Option<Entry>,
    /// How the entry went.
    pub outcome: EntryOutcome,
    /// What was seen (landing CS, RIP, RFLAGS...).
    pub detail: String,
    /// Whether the prologue's IRETQ reached CPL3 before the instruction ran.
    #[serde(skip)]
    pub reached_user: bool,
}

/// The CPL0 prologue: IRETQ to the user code at CPL3 with [`USER_RFLAGS`].
pub(super) fn kernel_prologue() -> Asm {
    let mut k = Asm::new(code::KERNEL_CODE);
    k.push_imm8(sel::USER_DS as u8) // SS
        .push_imm32(code::USER_STACK_TOP as u32) // RSP
        .push_imm32(USER_RFLAGS) // RFLAGS
        .push_imm8(sel::USER_CS as u8) // CS
        .push_imm32(code::USER_CODE as u32) // RIP
        .iretq();
    k
}

/// User code: mark, report CS, run `insn`, mark, report CS, end.
fn user_code(insn: &[u8]) -> Asm {
    let mut u = Asm::new(code::USER_CODE);
    u.stage(STAGE_IN_USER).report_cs(report::USER_CS);
    // RFLAGS before the instruction, to compare with the SYSCALL landing's.
    u.pushf().pop_rax().report_eax();
    u.raw(insn);
    u.stage(STAGE_AFTER_INSN).report_cs(report::USER_CS).end(0);
    u
}

/// The SYSCALL and SYSENTER landing points: mark, report CS (and RFLAGS
/// for SYSCALL: FMASK should have cleared DF), end. They use no stack
/// that SYSCALL does not provide (RSP is still the user's, which is mapped).
fn landings() -> Vec<Asm> {
    let mut s = Asm::new(code::SYSCALL_LANDING);
    s.stage(STAGE_SYSCALL_LANDING)
        .report_cs(report::LANDING_CS)
        .pushf()
        .pop_rax()
        .report_eax()
        .end(u32::from(STAGE_SYSCALL_LANDING));
    let mut e = Asm::new(code::SYSENTER_LANDING);
    e.stage(STAGE_SYSENTER_LANDING)
        .report_cs(report::LANDING_CS)
        .end(u32::from(STAGE_SYSENTER_LANDING));
    vec![s, e]
}

fn program(insn: &[u8], handler_exit: HandlerExit) -> Program {
    let mut p = Program::new(StartMode::Long64, kernel_prologue());
    p.handler_exit = handler_exit;
    p.extra.push(user_code(insn));
    p.extra.extend(landings());
    p.efer_extra = efer::SCE;
    p.msrs = code::syscall_msrs().to_vec();
    p.msrs.extend([
        (msr::SYSENTER_CS, u64::from(sel::KERNEL_CS)),
        (msr::SYSENTER_ESP, code::KERNEL_STACK_TOP),
        (msr::SYSENTER_EIP, code::SYSENTER_LANDING),
    ]);
    p
}

fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs one instruction's probe in a fresh VM.
fn run_one(kit: &Kit, insn: &UserInsn) -> Result<EntryProbe, VmError> {
    let mut vm = ProbeVm::new(kit)?;
    vm.load(&program(insn.bytes, HandlerExit::Halt))?;
    let t = vm.run(kit.timeout)?;
    let (outcome, detail) = classify(insn.via, &t);
    Ok(EntryProbe {
        instruction: insn.name.to_string(),
        bytes: hex(insn.bytes),
        entry: insn.entry,
        outcome,
        detail,
        reached_user: reached_user(&t),
    })
}

/// Whether the prologue's IRETQ got to user code at CPL3.
fn reached_user(t: &Trace) -> bool {
    t.values(report::STAGE).contains(&u64::from(STAGE_IN_USER))
        && t.values(report::USER_CS)
            .first()
            .is_some_and(|cs| cs & 3 == 3)
}

/// Classifies a trace of an entry program.
fn classify(via: Via, t: &Trace) -> (EntryOutcome, String) {
    if !reached_user(t) {
        let (o, what) = stop_outcome(t);
        return (
            o,
            format!("never reached CPL3 user code: {what} at {}", t.where_()),
        );
    }
    let deliveries = t.deliveries();
    let landing_cs = t.last(report::LANDING_CS);
    match via {
        Via::Syscall | Via::Sysenter if landing_cs.is_some() => {
            let cs = landing_cs.unwrap_or(0) as u16;
            let cpl = (cs & 3) as u8;
            let mut detail = format!("landed with CS {cs:#x}");
            if via == Via::Syscall {
                if let [before, landing] = t.values(report::VALUE)[..] {
                    let left = landing & FMASK;
                    detail.push_str(&format!(
                        "; RFLAGS {before:#x} in user mode, {landing:#x} at LSTAR: FMASK {FMASK:#x} {}",
                        if left == 0 {
                            "applied".to_string()
                        } else {
                            format!("not applied (bits {left:#x} still set)")
                        }
                    ));
                }
            }
            if cpl == 0 {
                (EntryOutcome::DeliveredCpl0, detail)
            } else {
                (EntryOutcome::WrongCpl { cpl }, detail)
            }
        }
        _ => {
            if let Some(d) = deliveries.first() {
                let detail = format!(
                    "{} entered at CPL{} from CS {:#x}, rip {:#x}",
                    super::entry::vector_name(d.vector),
                    d.cpl(),
                    d.saved_cs(),
                    d.saved_rip()
                );
                let expected = matches!(via, Via::Gate(v) if v == d.vector);
                let o = if !expected {
                    EntryOutcome::Exception {
                        vector: d.vector,
                        error_code: d.error_code(),
                    }
                } else if d.cpl() == 0 {
                    EntryOutcome::DeliveredCpl0
                } else {
                    EntryOutcome::WrongCpl { cpl: d.cpl() }
                };
                (o, detail)
            } else if t.stage() >= STAGE_AFTER_INSN {
                (
                    EntryOutcome::NotDelivered,
                    "the next user instruction ran".to_string(),
                )
            } else {
                let (o, what) = stop_outcome(t);
                (o, format!("{what} at {}", t.where_()))
            }
        }
    }
}

/// The outcome for a run that stopped without a report.
fn stop_outcome(t: &Trace) -> (EntryOutcome, String) {
    let o = match &t.stop {
        Stop::Shutdown => EntryOutcome::Shutdown,
        Stop::Timeout => EntryOutcome::Timeout,
        other => EntryOutcome::KvmError {
            detail: other.to_string(),
        },
    };
    (o, t.stop.to_string())
}

/// All user-mode instruction probes, in order.
pub fn probe_all(kit: &Kit) -> Result<Vec<EntryProbe>, VmError> {
    INSNS.iter().map(|i| run_one(kit, i)).collect()
}

/// Only the instructions that back an [`Entry`].
pub fn probe_entries(kit: &Kit) -> Result<Vec<(Entry, EntryOutcome)>, VmError> {
    let mut out = Vec::new();
    for i in INSNS.iter() {
        if let Some(e) = i.entry {
            out.push((e, run_one(kit, i)?.outcome));
        }
    }
    Ok(out)
}

/// Result of the IRETQ round trip: user `int3` (or another working gate),
/// handler IRETQs back, user code reports its CS.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IretqProbe {
    /// Whether the round trip reached user mode and reported its CS.
    pub works: bool,
    /// What was seen, for the report.
    pub detail: String,
}

/// IRETQ from a handler back to CPL3, using the first gate entry that works
/// among `candidates` (bytes and vector).
pub fn probe_iretq(kit: &Kit, working: &[Entry]) -> Result<IretqProbe, VmError> {
    let Some(insn) = INSNS
        .iter()
        .find(|i| matches!(i.via, Via::Gate(_)) && i.entry.is_some_and(|e| working.contains(&e)))
    else {
        return Ok(IretqProbe {
            works: false,
            detail: "untested: no `int` entry reaches CPL0".into(),
        });
    };
    let mut vm = ProbeVm::new(kit)?;
    vm.load(&program(insn.bytes, HandlerExit::Iretq))?;
    let t = vm.run(kit.timeout)?;
    let after = t.values(report::USER_CS);
    let works = t.stage() >= STAGE_AFTER_INSN
        && after.len() >= 2
        && after[1] & 3 == 3
        && t.deliveries().len() == 1
        && t.stop == Stop::End(0);
    let detail = if works {
        format!(
            "{} handler at CPL0, IRETQ back to CS {:#x}",
            insn.name, after[1]
        )
    } else {
        format!(
            "{} round trip failed: {} at {}",
            insn.name,
            t.stop,
            t.where_()
        )
    };
    Ok(IretqProbe { works, detail })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(writes: Vec<(u64, u64)>, stop: Stop) -> Trace {
        Trace {
            writes,
            stop,
            rip: Some(0x9000),
            cr3: Some(0x1000),
        }
    }

    fn in_user() -> Vec<(u64, u64)> {
        vec![(report::STAGE, 1), (report::USER_CS, 0x33)]
    }

    #[test]
    fn gate_delivery_at_cpl0_is_delivered() {
        let mut w = in_user();
        w.extend([
            (report::VECTOR, 3),
            (report::HANDLER_CS, 0x10),
            (report::FRAME, 0x9010),
            (report::FRAME, 0x33),
            (report::FRAME, 0x3402),
        ]);
        let (o, d) = classify(Via::Gate(3), &trace(w, Stop::Hlt));
        assert_eq!(o, EntryOutcome::DeliveredCpl0, "{d}");
    }

    #[test]
    fn ud_instead_of_gate_is_an_exception() {
        let mut w = in_user();
        w.extend([
            (report::VECTOR, 13),
            (report::HANDLER_CS, 0x10),
            (report::FRAME, 0x402),
            (report::FRAME, 0x900e),
            (report::FRAME, 0x33),
        ]);
        let (o, d) = classify(Via::Gate(0x80), &trace(w, Stop::Hlt));
        assert_eq!(
            o,
            EntryOutcome::Exception {
                vector: 13,
                error_code: Some(0x402)
            }
        );
        assert!(d.contains("rip 0x900e"), "{d}");
    }

    #[test]
    fn syscall_landing_at_cpl3_is_wrong_cpl() {
        let mut w = in_user();
        w.extend([
            (report::VALUE, 0x3402),
            (report::STAGE, 0x10),
            (report::LANDING_CS, 0x33),
            (report::VALUE, 0x3402),
        ]);
        let (o, d) = classify(Via::Syscall, &trace(w, Stop::End(0x10)));
        assert_eq!(o, EntryOutcome::WrongCpl { cpl: 3 });
        assert!(d.contains("FMASK 0x700 not applied (bits 0x400"), "{d}");
    }

    #[test]
    fn no_user_mode_is_reported_from_the_stop() {
        let (o, _) = classify(Via::Gate(3), &trace(vec![], Stop::Shutdown));
        assert_eq!(o, EntryOutcome::Shutdown);
    }
}
