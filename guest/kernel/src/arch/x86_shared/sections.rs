//! The physical ranges of the image's sections that the page-table code
//! maps (linker.ld's symbols, the same names in both flavours): the entry
//! area, the kernel text, the deferred CR3 switch's page and the boot
//! telemetry page.

use crate::arch::layout::KERNEL_BASE;
use crate::println;
use core::ptr::addr_of;
use guest_core::cmdline::{Config, PtiSwitch};

extern "C" {
    static __entry_start: u8;
    static __entry_text_end: u8;
    static __entry_end: u8;
    static __text_start: u8;
    static __text_end: u8;
    static __pti_deferred_start: u8;
    static __pti_deferred_end: u8;
    static boot_telemetry_page: u8;
}

/// Physical address of a kernel-half symbol.
fn phys(p: *const u8) -> u64 {
    p as u64 - KERNEL_BASE
}

/// The entry area (`.entry.text` and `.entry.data`): (start, text end, end).
pub fn entry_area() -> (u64, u64, u64) {
    (
        phys(addr_of!(__entry_start)),
        phys(addr_of!(__entry_text_end)),
        phys(addr_of!(__entry_end)),
    )
}

/// The kernel text (`.text`, page aligned).
pub fn kernel_text() -> (u64, u64) {
    (phys(addr_of!(__text_start)), phys(addr_of!(__text_end)))
}

/// The deferred switch's text (`.text.pti_deferred`, page aligned; see
/// pti_deferred.rs): mapped in the user copy with `pti_switch=deferred`.
fn pti_deferred_text() -> (u64, u64) {
    (
        phys(addr_of!(__pti_deferred_start)),
        phys(addr_of!(__pti_deferred_end)),
    )
}

/// The boot telemetry page (in `.boot`, where VMA = LMA): its physical
/// address.
fn boot_telemetry_phys() -> u64 {
    addr_of!(boot_telemetry_page) as u64
}

/// Where the telemetry page is: the region the VMM named (`telemetry=`) if
/// the direct map reaches it, else the image's boot telemetry page (said so
/// on the console).
pub fn telemetry_page(config: &Config, direct_map: u64) -> u64 {
    match config.telemetry {
        Some(gpa) if gpa < direct_map => gpa,
        Some(gpa) => {
            println!(
                "telemetry region {gpa:#x} is beyond the direct map; using a page of the image"
            );
            boot_telemetry_phys()
        }
        None => boot_telemetry_phys(),
    }
}

/// The deferred switch's text if `pti_switch=deferred` is in use with PTI
/// (mapped in the user copy then), else the empty range.
pub fn deferred_text(config: &Config, pti: bool) -> (u64, u64) {
    if pti && config.pti_switch == PtiSwitch::Deferred {
        pti_deferred_text()
    } else {
        (0, 0)
    }
}
