//! Installing the syscall entry for the running task: an IDT gate for the
//! `int` entries, the SYSENTER MSRs for SYSENTER; one stub per mode (PTI
//! off, on), so the fast paths test nothing.
use super::cpu;
use super::descriptors::{set_gate, set_rsp0, KERNEL_CS};
use core::sync::atomic::{AtomicBool, Ordering};
use guest_core::cmdline::Entry;

extern "C" {
    // Entry stubs (code labels in entry.rs; only their addresses are used).
    static entry_int_off: u8;
    static entry_int_pti: u8;
    static entry_sysenter_off: u8;
    static entry_sysenter_pti: u8;
    static entry_int_pti_deferred: u8;
    static entry_sysenter_pti_deferred: u8;
}

/// `pti_switch=deferred` chosen (set once at boot, before any task runs).
static DEFERRED: AtomicBool = AtomicBool::new(false);

/// Selects the deferred exit switch for the entries with PTI.
pub fn set_deferred(on: bool) {
    DEFERRED.store(on, Ordering::Relaxed);
}

/// Once per CPU: SYSENTER_CS (SS = CS + 8, SYSEXIT uses CS + 16 and + 24).
pub fn init(entry: Entry) {
    if entry == Entry::Sysenter {
        // SAFETY: the CPU has SYSENTER (checked by arch::unsupported).
        unsafe { cpu::wrmsr(cpu::MSR_SYSENTER_CS, KERNEL_CS as u64) };
    }
}

/// Points the entry at the stub for `mode` (0 PTI off, else PTI) and the
/// entry stacks (TSS.ESP0, SYSENTER_ESP) at the per-CPU entry stack (PTI) or
/// the task stack. Returns whether a syscall's user frame stays on the entry
/// stack (int entries with PTI).
pub fn install(entry: Entry, mode: u64, kstack_top: u64) -> bool {
    let pti = mode != 0;
    let stack = if pti {
        super::percpu::entry_stack_top()
    } else {
        kstack_top
    };
    set_rsp0(stack);
    match entry.vector() {
        Some(v) => {
            let stub = if pti && DEFERRED.load(Ordering::Relaxed) {
                core::ptr::addr_of!(entry_int_pti_deferred)
            } else if pti {
                core::ptr::addr_of!(entry_int_pti)
            } else {
                core::ptr::addr_of!(entry_int_off)
            };
            set_gate(v, stub as u64, 3, 0);
            pti
        }
        None => {
            let stub = if pti && DEFERRED.load(Ordering::Relaxed) {
                core::ptr::addr_of!(entry_sysenter_pti_deferred)
            } else if pti {
                core::ptr::addr_of!(entry_sysenter_pti)
            } else {
                core::ptr::addr_of!(entry_sysenter_off)
            };
            // SAFETY: SYSENTER exists (arch::unsupported); the values are a
            // mapped kernel stack top and a stub in the entry area.
            unsafe {
                cpu::wrmsr(cpu::MSR_SYSENTER_ESP, stack);
                cpu::wrmsr(cpu::MSR_SYSENTER_EIP, stub as u64);
            }
            false
        }
    }
}
