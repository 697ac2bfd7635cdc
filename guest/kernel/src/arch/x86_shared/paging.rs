//! What both flavours' paging.rs share: the switch from the boot page
//! tables to the kernel-only root, the `@pti` line that describes the
//! user copy's kernel part, and mapping the kernel working set.
use crate::arch::cpu;
use crate::arch::paging::{kernel_range_tables, write_cr3, Cr3Reason, KernelHalf, MapError};
use crate::mm::{DirectMap, Frames};
use crate::telemetry;
use ptiscope_abi::telemetry::Counter;

/// Enables global pages and loads `cr3` (the kernel-only root, as the
/// flavour encodes it), counting that write and the boot code's CR3 load,
/// which happened before counters existed.
pub fn load_kernel_root(cr3: u64) {
    // SAFETY: enabling global pages; the TLB is flushed by the CR3 write below.
    unsafe { cpu::write_cr4(cpu::read_cr4() | cpu::CR4_PGE) };
    write_cr3(cr3, Cr3Reason::Other);
    // The 32-bit boot code's CR3 load happened before counters existed.
    telemetry::inc(Counter::Cr3Other);
    telemetry::inc(Counter::TlbFlushFull);
}

/// What the `@pti` line reports (pages of the user copy's kernel part).
pub struct PtiLine {
    pub user_copy_kernel_pages: u64,
    pub entry_area: (u64, u64),
    pub deferred_text: (u64, u64),
    pub global_text: bool,
    pub nx: bool,
}

/// Prints the `@pti` line (the VMM and the tests read it), through
/// `console::Line` rather than `core::fmt`: the same text for a fraction
/// of the emulated instructions.
pub fn print_pti_line(line: &PtiLine) {
    let pages = |(s, e): (u64, u64)| e.saturating_sub(s) / 4096;
    let deferred = line.deferred_text.1 > line.deferred_text.0;
    crate::console::Line::start()
        .str("@pti user_copy_kernel_pages=")
        .dec(line.user_copy_kernel_pages)
        .str(" entry_area_pages=")
        .dec(pages(line.entry_area))
        .str(" deferred_switch_pages=")
        .dec(pages(line.deferred_text))
        .str(if deferred {
            " pti_switch=deferred global_text="
        } else {
            " pti_switch=asm global_text="
        })
        .str(if line.global_text {
            "on nx="
        } else {
            "off nx="
        })
        .str(if line.nx { "1\n" } else { "0\n" });
}

/// Maps `[va, va + len)` of the kernel half (shared by every address space)
/// to `[phys, phys + len)` with 4 KiB pages, kernel-only, writable, NX
/// where the CPU has it, non-global with PTI (so that the CR3 switches
/// flush them, like the rest of the kernel) and global without: the kernel
/// working set of `kwss=`. The flavour's `kernel_range_tables` names the
/// tables below the kernel half and the leaf and table flags.
pub fn map_kernel_range(
    half: &KernelHalf,
    va: u64,
    phys: u64,
    len: u64,
    pti: bool,
) -> Result<(), MapError> {
    use guest_core::pte::flags::GLOBAL;
    let (tables, leaf, table_flags) = kernel_range_tables(half)?;
    let global = if pti { 0 } else { GLOBAL };
    let range = guest_core::workingset::Range::new(va, phys, len, 4096);
    guest_core::workingset::map_range_flags(
        &mut DirectMap,
        &mut Frames,
        tables,
        range,
        leaf | global,
        table_flags,
    )
}
