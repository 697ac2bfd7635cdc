//! CR3 writes from Rust code: the one counted place besides the entry
//! macros in entry.rs, which update the same counters.
use crate::mm::{DirectMap, Frames};
use crate::{println, telemetry};
use core::arch::asm;
use guest_core::cmdline::Config;
use guest_core::layout::{cr3_value, CR3_NOFLUSH};
use guest_core::paging::{build_kernel_half, FrameSource, KernelSpec, PhysMem, KERNEL_PML4_SLOT};
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
    // guest_core::paging (kernel half always present), so the code and data
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

/// Physical addresses of the entry area: (start, text end, end).
fn entry_area() -> (u64, u64, u64) {
    extern "C" {
        static __entry_start: u8;
        static __entry_text_end: u8;
        static __entry_end: u8;
    }
    let phys = |p: *const u8| p as u64 - guest_core::layout::KERNEL_BASE;
    (
        phys(core::ptr::addr_of!(__entry_start)),
        phys(core::ptr::addr_of!(__entry_text_end)),
        phys(core::ptr::addr_of!(__entry_end)),
    )
}

fn boot_telemetry_phys() -> u64 {
    extern "C" {
        static boot_telemetry_page: u8;
    }
    // The boot section is identity mapped: its symbols' values are physical.
    core::ptr::addr_of!(boot_telemetry_page) as u64
}

/// Builds the kernel half of every address space, maps the telemetry page
/// and switches from the boot tables to a kernel-only address space.
pub fn setup_kernel_tables(config: &Config, pti: bool, direct_map: u64) -> KernelHalf {
    let (entry_start, entry_text_end, entry_end) = entry_area();
    let telemetry = match config.telemetry {
        Some(gpa) if gpa < direct_map => gpa,
        Some(gpa) => {
            println!(
                "telemetry region {gpa:#x} is beyond the direct map; using a page of the image"
            );
            boot_telemetry_phys()
        }
        None => boot_telemetry_phys(),
    };
    let spec = KernelSpec {
        pti,
        entry_area: (entry_start, entry_end),
        entry_text_end,
        telemetry,
        direct_map,
        deferred_text: if pti && config.pti_switch == guest_core::cmdline::PtiSwitch::Deferred {
            super::pti_deferred::text_range()
        } else {
            (0, 0)
        },
    };
    let half = match build_kernel_half(&mut DirectMap, &mut Frames, &spec) {
        Ok(h) => h,
        Err(e) => panic!("cannot build the kernel page tables: {e:?}"),
    };
    let deferred = spec.deferred_text.1 > spec.deferred_text.0;
    super::sysentry::set_deferred(deferred);
    if pti {
        let pages = |(s, e): (u64, u64)| e.saturating_sub(s) / 4096;
        println!(
            "@pti user_copy_kernel_pages={} entry_area_pages={} deferred_switch_pages={} pti_switch={}",
            pages(spec.entry_area) + pages(spec.deferred_text),
            pages(spec.entry_area),
            pages(spec.deferred_text),
            if deferred { "deferred" } else { "asm" },
        );
    }
    // A kernel-only address space: slot 511 only.
    let Some(root) = Frames.pair() else {
        panic!("out of memory for the kernel page tables")
    };
    DirectMap.write(root, KERNEL_PML4_SLOT, half.kernel_pml4e);
    // SAFETY: enabling global pages; the TLB is flushed by the CR3 write below.
    unsafe { super::cpu::write_cr4(super::cpu::read_cr4() | super::cpu::CR4_PGE) };
    write_cr3(cr3_value(root, false, 0, false), Cr3Reason::Other);
    // The 32-bit boot code's CR3 load happened before counters existed.
    telemetry::inc(Counter::Cr3Other);
    telemetry::inc(Counter::TlbFlushFull);
    half
}

/// A process's PML4 pair (see `guest_core::paging::build_address_space`).
pub fn new_address_space(half: &KernelHalf, user: &UserSpec) -> Result<u64, MapError> {
    guest_core::paging::build_address_space(&mut DirectMap, &mut Frames, half, user)
}

/// `arch_prctl(ARCH_SET_NOPTI, 1)` on the page tables of `pair`.
pub fn opt_out_of_pti(pair: u64, half: &KernelHalf) {
    guest_core::paging::opt_out_of_pti(&mut DirectMap, pair, half)
}

/// Maps a thread's stack page into the shared address space `pair`.
pub fn map_user_stack_page(pair: u64, va: u64, frame: u64) -> Result<(), MapError> {
    guest_core::paging::map_user_stack_page(&mut DirectMap, &mut Frames, pair, va, frame)
}
