//! Installing the syscall entry of the configured kind for the running
//! task: an IDT gate for the `int` entries, LSTAR for SYSCALL; one stub per
//! mode (PTI off, on, on with PCID), so the fast paths test nothing.
use super::cpu;
use super::descriptors::{self, entry_stack_top_addr, set_gate, set_rsp0};
use core::sync::atomic::{AtomicBool, Ordering};
use guest_core::cmdline::Entry;

extern "C" {
    // Entry stubs (code labels in entry.rs; only their addresses are used).
    static entry_int_off: u8;
    static entry_int_pti: u8;
    static entry_int_pti_pcid: u8;
    static entry_int_pti_deferred: u8;
    static entry_syscall_off: u8;
    static entry_syscall_pti: u8;
    static entry_syscall_pti_pcid: u8;
    static entry_syscall_pti_deferred: u8;
}

/// `pti_switch=deferred` chosen (set once at boot, before any task runs).
static DEFERRED: AtomicBool = AtomicBool::new(false);

/// Selects the deferred exit switch for the entries with PTI (no PCID).
pub fn set_deferred(on: bool) {
    DEFERRED.store(on, Ordering::Relaxed);
}

/// Once per run: the MSRs of SYSCALL.
pub fn init(entry: Entry) {
    if entry == Entry::Syscall {
        // SAFETY: EFER, STAR, LSTAR and FMASK exist on every x86_64 CPU.
        // STAR as Linux: kernel CS 0x10 (SS 0x18), SYSRET base 0x23
        // (CS 0x33, SS 0x2b). FMASK clears TF, IF, DF, AC, NT, RF, IOPL.
        unsafe {
            cpu::wrmsr(
                cpu::MSR_STAR,
                ((descriptors::USER32_CS as u64) << 48) | ((descriptors::KERNEL_CS as u64) << 32),
            );
            cpu::wrmsr(cpu::MSR_FMASK, 0x0004_7700);
            cpu::wrmsr(cpu::MSR_EFER, cpu::rdmsr(cpu::MSR_EFER) | cpu::EFER_SCE);
        }
    }
}

/// Points the entry at the stub for `mode` (0 PTI off, 1 PTI, 2 PTI+PCID)
/// and TSS.RSP0 at the entry stack (PTI) or the task stack. Returns whether
/// a syscall's user frame stays on the entry stack (int entries with PTI).
pub fn install(entry: Entry, mode: u64, kstack_top: u64) -> bool {
    let pti = mode != 0;
    set_rsp0(if pti {
        entry_stack_top_addr()
    } else {
        kstack_top
    });
    let deferred = DEFERRED.load(Ordering::Relaxed);
    let stub = match entry {
        Entry::Syscall if deferred => [
            core::ptr::addr_of!(entry_syscall_off) as u64,
            core::ptr::addr_of!(entry_syscall_pti_deferred) as u64,
            core::ptr::addr_of!(entry_syscall_pti_pcid) as u64,
        ],
        Entry::Syscall => [
            core::ptr::addr_of!(entry_syscall_off) as u64,
            core::ptr::addr_of!(entry_syscall_pti) as u64,
            core::ptr::addr_of!(entry_syscall_pti_pcid) as u64,
        ],
        _ if deferred => [
            core::ptr::addr_of!(entry_int_off) as u64,
            core::ptr::addr_of!(entry_int_pti_deferred) as u64,
            core::ptr::addr_of!(entry_int_pti_pcid) as u64,
        ],
        _ => [
            core::ptr::addr_of!(entry_int_off) as u64,
            core::ptr::addr_of!(entry_int_pti) as u64,
            core::ptr::addr_of!(entry_int_pti_pcid) as u64,
        ],
    }[mode as usize];
    match entry.vector() {
        Some(v) => {
            set_gate(v, stub, 3, 0);
            pti
        }
        None => {
            // SAFETY: LSTAR takes any canonical kernel address; this is a stub.
            unsafe { cpu::wrmsr(cpu::MSR_LSTAR, stub) };
            false
        }
    }
}
