//! `pti_switch=deferred`: the exit's kernel->user CR3 switch done from Rust
//! code, late in the syscall path, as the 2020 "defer CR3 switch to C code"
//! RFC moved it out of the assembly entry code.
//!
//! [`pti_exit_to_user`] runs on the per-CPU entry stack (mapped in the user
//! copy), counts the switch while the counters are still mapped, writes CR3
//! and returns: the instructions after the CR3 write (its epilogue) run on
//! the user copy, so this function's text page is mapped there as well
//! (`.text.pti_deferred`, page aligned by linker.ld, mapped by
//! `guest_core::paging::build_kernel_half` only in this mode). That page is
//! the strategy's extra exposure; `ptiscope pagetables` lists it.
use crate::telemetry;
use core::arch::asm;
use guest_core::layout::PTI_USER_PGTABLE_BIT;
use ptiscope_abi::telemetry::Counter;

/// Counted switch to the user copy of the current address space (no PCID:
/// the mode is refused with `pcid=on`). Called only by
/// `entry_int_pti_deferred` and `entry_syscall_pti_deferred`, with
/// interrupts off, on the entry stack.
#[no_mangle]
#[link_section = ".text.pti_deferred"]
pub extern "C" fn pti_exit_to_user() {
    telemetry::inc(Counter::Cr3Exit);
    telemetry::inc(Counter::TlbFlushFull);
    // SAFETY: the user copy maps the entry area (this stack, the stub we
    // return to) and this function's page; the write flushes non-global
    // TLB entries, which the next entry refills.
    unsafe {
        asm!(
            "mov {t}, cr3",
            "or {t}, {bit}",
            "mov cr3, {t}",
            t = out(reg) _,
            bit = const PTI_USER_PGTABLE_BIT,
            options(nostack, preserves_flags),
        )
    };
}
