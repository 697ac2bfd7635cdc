//! CR3 writes from Rust code: the one counted place besides the entry
//! macros in entry.rs, which update the same counters.
pub use crate::arch::x86_shared::paging::map_kernel_range;
use crate::arch::x86_shared::paging::{load_kernel_root, print_pti_line, PtiLine};
use crate::arch::x86_shared::sections;
use crate::mm::{DirectMap, Frames};
use crate::telemetry;
use core::arch::asm;
use guest_core::cmdline::Config;
use guest_core::layout::{cr3_value, CR3_NOFLUSH};
use guest_core::paging::{
    build_kernel_half_global_text, FrameSource, KernelSpec, PhysMem, KERNEL_PML4_SLOT,
};
pub use guest_core::paging::{KernelHalf, MapError, UserSpec};
use guest_core::workingset::{Range, Tables};
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

/// Builds the kernel half of every address space, maps the telemetry page
/// and switches from the boot tables to a kernel-only address space.
pub fn setup_kernel_tables(config: &Config, pti: bool, direct_map: u64) -> KernelHalf {
    let (entry_start, entry_text_end, entry_end) = sections::entry_area();
    let spec = KernelSpec {
        pti,
        entry_area: (entry_start, entry_end),
        entry_text_end,
        telemetry: sections::telemetry_page(config, direct_map),
        direct_map,
        deferred_text: sections::deferred_text(config, pti),
    };
    let text = sections::kernel_text();
    let global_text = (pti && config.pti_global_text).then_some(text);
    let half = match build_kernel_half_global_text(&mut DirectMap, &mut Frames, &spec, global_text)
    {
        Ok(h) => h,
        Err(e) => panic!("cannot build the kernel page tables: {e:?}"),
    };
    let deferred = spec.deferred_text.1 > spec.deferred_text.0;
    super::sysentry::set_deferred(deferred);
    if pti {
        let pages = |(s, e): (u64, u64)| e.saturating_sub(s) / 4096;
        let text_pages = if global_text.is_some() {
            pages(text)
        } else {
            0
        };
        // The deferred switch's page is inside the text: counted once.
        let deferred_extra = if global_text.is_some() {
            0
        } else {
            pages(spec.deferred_text)
        };
        print_pti_line(&PtiLine {
            user_copy_kernel_pages: pages(spec.entry_area) + text_pages + deferred_extra,
            entry_area: spec.entry_area,
            deferred_text: spec.deferred_text,
            global_text: global_text.is_some(),
            nx: true,
        });
    }
    // A kernel-only address space: slot 511 only.
    let Some(root) = Frames.pair() else {
        panic!("out of memory for the kernel page tables")
    };
    DirectMap.write(root, KERNEL_PML4_SLOT, half.kernel_pml4e);
    load_kernel_root(cr3_value(root, false, 0, false));
    half
}

/// A process's PML4 pair for `user`, the kernel half shared.
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

/// Maps `[va, va + len)` of the user half of `pair` to `[phys, phys + len)`,
/// user, writable, NX, with `page`-sized leaves: the working set of `wss=`
/// (see workingset.rs). Both copies share the user half below the PML4.
pub fn map_user_range(pair: u64, va: u64, phys: u64, len: u64, page: u64) -> Result<(), MapError> {
    let range = Range::new(va, phys, len, page);
    guest_core::workingset::map_range(&mut DirectMap, &mut Frames, pair + 4096, range)
}

/// The kernel working set's tables, leaf and table flags (see
/// `map_kernel_range`): a scratch root whose slot 511 is the kernel half,
/// so that the tables below it are the ones every address space shares;
/// writable, NX.
pub fn kernel_range_tables(half: &KernelHalf) -> Result<(Tables, u64, u64), MapError> {
    use guest_core::paging::flags::{NO_EXECUTE, WRITABLE};
    let root = Frames.frame().ok_or(MapError::OutOfFrames)?;
    DirectMap.write(root, KERNEL_PML4_SLOT, half.kernel_pml4e);
    let table_flags = guest_core::paging::KERNEL_TABLE_FLAGS;
    Ok((Tables::FourLevel(root), WRITABLE | NO_EXECUTE, table_flags))
}
