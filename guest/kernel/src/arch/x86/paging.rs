//! CR3 writes from Rust code, and the PAE page tables of the kernel and of
//! processes (built by `guest_core::pae`).
pub use crate::arch::x86_shared::paging::map_kernel_range;
use crate::arch::x86_shared::paging::{load_kernel_root, print_pti_line, PtiLine};
use crate::arch::x86_shared::sections;
use crate::mm::{DirectMap, Frames};
use crate::telemetry;
use core::arch::asm;
use guest_core::cmdline::Config;
use guest_core::pae::layout::cr3_value;
use guest_core::pae::{build_kernel_half, build_kernel_only, KernelSpec};
pub use guest_core::pae::{KernelHalf, MapError, UserSpec};
use guest_core::pte::PhysMem;
use guest_core::workingset::{Range, Tables};
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
    // guest_core::pae (kernel GiB always present), so the code and data in
    // use stay mapped across the switch.
    unsafe { asm!("mov cr3, {}", in(reg) value as usize, options(nostack, preserves_flags)) }
    telemetry::inc(match reason {
        Cr3Reason::ContextSwitch => Counter::Cr3ContextSwitch,
        Cr3Reason::Other => Counter::Cr3Other,
    });
    telemetry::inc(Counter::TlbFlushFull);
}

/// Builds the kernel GiB of every address space (see `guest_core::pae`),
/// maps the telemetry page and switches from the boot tables to a
/// kernel-only page table.
pub fn setup_kernel_tables(config: &Config, pti: bool, direct_map: u64) -> KernelHalf {
    let (entry_start, entry_text_end, entry_end) = sections::entry_area();
    let nx = super::cpu::has_nx();
    let spec = KernelSpec {
        pti,
        entry_area: (entry_start, entry_end),
        entry_text_end,
        text: sections::kernel_text(),
        global_text: config.pti_global_text,
        nx,
        telemetry: sections::telemetry_page(config, direct_map),
        direct_map: direct_map.max(2 << 20),
        deferred_text: sections::deferred_text(config, pti),
    };
    let deferred = spec.deferred_text.1 > spec.deferred_text.0;
    super::sysentry::set_deferred(deferred);
    let half = match build_kernel_half(&mut DirectMap, &mut Frames, &spec) {
        Ok(h) => h,
        Err(e) => panic!("cannot build the kernel page tables: {e:?}"),
    };
    let root = match build_kernel_only(&mut DirectMap, &mut Frames, &half) {
        Ok(r) => r,
        Err(e) => panic!("cannot build the kernel page tables: {e:?}"),
    };
    if pti {
        print_pti_line(&PtiLine {
            user_copy_kernel_pages: half.user_kernel_pages,
            entry_area: spec.entry_area,
            deferred_text: spec.deferred_text,
            global_text: config.pti_global_text,
            nx,
        });
    }
    load_kernel_root(cr3_value(root, false, 0, false));
    half
}

/// A process's PDPT pair for `user`, the kernel PMD shared; NX where the
/// CPU has it.
pub fn new_address_space(half: &KernelHalf, user: &UserSpec) -> Result<u64, MapError> {
    let nx = super::cpu::has_nx();
    guest_core::pae::build_address_space(&mut DirectMap, &mut Frames, half, user, nx)
}

/// `arch_prctl(ARCH_SET_NOPTI, 1)` on the page tables of `pair`.
pub fn opt_out_of_pti(pair: u64, half: &KernelHalf) {
    guest_core::pae::opt_out_of_pti(&mut DirectMap, pair, half)
}

/// Maps a thread's stack page into the shared address space `pair`.
pub fn map_user_stack_page(pair: u64, va: u64, frame: u64) -> Result<(), MapError> {
    let nx = super::cpu::has_nx();
    guest_core::pae::map_user_stack_page(&mut DirectMap, &mut Frames, pair, va, frame, nx)
}

/// Maps `[va, va + len)` of the user half of `pair` to `[phys, phys + len)`,
/// user, writable, NX when the CPU has it, with `page`-sized leaves: the
/// working set of `wss=` (see workingset.rs). The user PMD is shared by
/// both copies.
pub fn map_user_range(pair: u64, va: u64, phys: u64, len: u64, page: u64) -> Result<(), MapError> {
    let nx = super::cpu::has_nx();
    let slot = guest_core::pae::indices(va)[0];
    let pmd = guest_core::pae::Pte(DirectMap.read(pair, slot));
    if !pmd.present() {
        return Err(MapError::NotCanonical(va));
    }
    let range = Range::new(va, phys, len, page);
    guest_core::workingset::map_range_pae(&mut DirectMap, &mut Frames, pmd.addr(), range, nx)
}

/// The kernel working set's tables, leaf and table flags (see
/// `map_kernel_range`): the kernel PMD, shared by every address space;
/// writable, NX when the CPU has it.
pub fn kernel_range_tables(half: &KernelHalf) -> Result<(Tables, u64, u64), MapError> {
    use guest_core::pte::flags::{NO_EXECUTE, PRESENT, WRITABLE};
    let nx = if super::cpu::has_nx() { NO_EXECUTE } else { 0 };
    Ok((
        Tables::PaePmd(half.kernel_pmd),
        WRITABLE | nx,
        PRESENT | WRITABLE,
    ))
}
