//! `pti_switch=deferred` on i386: the exit's kernel->user CR3 switch done
//! from Rust code, late in the syscall path, as the 2020 "defer CR3 switch
//! to C code" RFC moved it out of the assembly entry code (see the x86_64
//! flavour's pti_deferred.rs, which this mirrors).
//!
//! [`pti_exit_to_user`] runs on this CPU's entry stack (mapped in the user
//! copy), counts the switch while the counters are still mapped, writes CR3
//! and returns: its epilogue runs on the user copy, so its text page
//! (`.text.pti_deferred`, page aligned by linker.ld) is mapped there as
//! well, by `guest_core::pae::build_kernel_half`, only in this mode.
use core::arch::asm;
use guest_core::layout::PTI_USER_PGTABLE_BIT;
use ptiscope_abi::telemetry::Counter;

/// Counted switch to the user copy of the current address space. Called
/// only by `entry_int_pti_deferred` and `entry_sysenter_pti_deferred`, with
/// interrupts off, on the entry stack.
#[no_mangle]
#[link_section = ".text.pti_deferred"]
pub extern "C" fn pti_exit_to_user() {
    // SAFETY: FS is this CPU's counter block (kernel copy still loaded); the
    // user copy maps the entry area (this stack, the stub we return to) and
    // this function's page; the CR3 write reloads the PDPTEs and flushes
    // non-global TLB entries, which the next entry refills. The counters
    // are added FS-relative as the asm exit does (`telemetry::inc` goes
    // through the block's linear address: 5 instructions instead of 2).
    unsafe {
        asm!(
            "add dword ptr fs:[{exit}], 1",
            "adc dword ptr fs:[{exit} + 4], 0",
            "add dword ptr fs:[{flush}], 1",
            "adc dword ptr fs:[{flush} + 4], 0",
            "mov {t}, cr3",
            "or {t}, {bit}",
            "mov cr3, {t}",
            t = out(reg) _,
            bit = const PTI_USER_PGTABLE_BIT,
            exit = const Counter::Cr3Exit.offset_in_block(),
            flush = const Counter::TlbFlushFull.offset_in_block(),
            options(nostack),
        )
    };
}
