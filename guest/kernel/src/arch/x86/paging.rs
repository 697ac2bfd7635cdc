//! CR3 writes from Rust code, and the paging mode (PAE) the shared
//! page-table code (`x86_shared::paging`) builds with.
pub use crate::arch::x86_shared::paging::{
    map_kernel_range, map_user_range, map_user_stack_page, new_address_space, opt_out_of_pti,
    setup_kernel_tables,
};
use crate::telemetry;
use core::arch::asm;
pub use guest_core::pae::{KernelHalf, MapError, UserSpec};
use ptiscope_abi::telemetry::Counter;

/// Why CR3 is written; each reason has its own counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cr3Reason {
    ContextSwitch,
    Other,
}

/// Loads CR3 and counts the write. With PAE every CR3 write reloads the
/// four PDPTEs and flushes all non-global TLB entries (there is no PCID).
pub fn write_cr3(value: u64, reason: Cr3Reason) {
    // SAFETY: callers pass the root of a complete address space built by
    // guest_core::pti over PAE (kernel GiB always present), so the code and data in
    // use stay mapped across the switch.
    unsafe { asm!("mov cr3, {}", in(reg) value as usize, options(nostack, preserves_flags)) }
    telemetry::inc(match reason {
        Cr3Reason::ContextSwitch => Counter::Cr3ContextSwitch,
        Cr3Reason::Other => Counter::Cr3Other,
    });
    telemetry::inc(Counter::TlbFlushFull);
}

/// x86_32's paging mode (PAE), which `x86_shared::paging` builds every
/// page table with.
pub type Mode = guest_core::pae::Pae;

/// Whether the CPU has NX (EFER.NXE set at boot when it does; without it
/// bit 63 of an entry is reserved).
pub fn nx() -> bool {
    super::cpu::has_nx()
}
