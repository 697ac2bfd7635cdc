//! CR3 writes from Rust code: the one counted place besides the entry
//! macros in entry.rs, which update the same counters; the paging mode the
//! shared page-table code (`x86_shared::paging`) builds with.
pub use crate::arch::x86_shared::paging::{
    map_kernel_range, map_user_range, map_user_stack_page, new_address_space, opt_out_of_pti,
    setup_kernel_tables,
};
use crate::telemetry;
use core::arch::asm;
use guest_core::layout::CR3_NOFLUSH;
pub use guest_core::paging::{KernelHalf, MapError, UserSpec};
use ptiscope_abi::telemetry::Counter;

/// Why CR3 is written; each reason has its own counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cr3Reason {
    ContextSwitch,
    Other,
}

/// Loads CR3 and counts the write. A write without NOFLUSH flushes all
/// non-global TLB entries (of the PCID written, with PCID on).
pub fn write_cr3(value: u64, reason: Cr3Reason) {
    // SAFETY: callers pass the root of a complete address space built by
    // guest_core::pti (kernel half always present), so the code and data
    // in use stay mapped across the switch.
    unsafe { asm!("mov cr3, {}", in(reg) value, options(nostack, preserves_flags)) }
    telemetry::inc(match reason {
        Cr3Reason::ContextSwitch => Counter::Cr3ContextSwitch,
        Cr3Reason::Other => Counter::Cr3Other,
    });
    telemetry::inc(if value & CR3_NOFLUSH != 0 {
        Counter::Cr3NoFlush
    } else {
        Counter::TlbFlushFull
    });
}

/// x86_64's paging mode, which `x86_shared::paging` builds every page
/// table with.
pub type Mode = guest_core::paging::FourLevel;

/// Whether the CPU has NX: always in long mode here (EFER.NXE is set at boot).
pub fn nx() -> bool {
    true
}
