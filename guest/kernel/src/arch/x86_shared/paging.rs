//! What both flavours' paging.rs share: the kernel half, processes' address
//! spaces and the working sets' mappings, written once over the flavour's
//! paging mode (`arch::paging::Mode`: `guest_core::paging::FourLevel` or
//! `guest_core::pae::Pae`, through `guest_core::pti`); the switch from the
//! boot page tables to the kernel-only root; the `@pti` line that describes
//! the user copy's kernel part. The flavour keeps `write_cr3` (the counted
//! CR3 write: its instructions are measured) and says whether the CPU has NX.
use crate::arch::cpu;
use crate::arch::layout::cr3_value;
use crate::arch::paging::{nx, write_cr3, Cr3Reason, KernelHalf, MapError, Mode, UserSpec};
use crate::arch::x86_shared::sections;
use crate::mm::{lock_frames, DirectMap, Frames};
use crate::telemetry;
use guest_core::cmdline::Config;
use guest_core::pte::flags::{GLOBAL, NO_EXECUTE, USER, WRITABLE};
use guest_core::pte::{KERNEL_TABLE_FLAGS, TABLE_FLAGS};
use guest_core::pti::{self, KernelSpec, PagingMode};
use guest_core::workingset::{map_range_flags, Range};
use ptiscope_abi::telemetry::Counter;

/// NX as a leaf bit: 0 where the CPU has none (PAE only).
fn nx_bit() -> u64 {
    if nx() {
        NO_EXECUTE
    } else {
        0
    }
}

/// Builds the kernel half of every address space, maps the telemetry page,
/// prints the `@pti` line and switches from the boot tables to a
/// kernel-only address space.
pub fn setup_kernel_tables(config: &Config, pti: bool, direct_map: u64) -> KernelHalf {
    let (entry_start, entry_text_end, entry_end) = sections::entry_area();
    let spec = KernelSpec {
        pti,
        entry_area: (entry_start, entry_end),
        entry_text_end,
        text: sections::kernel_text(),
        global_text: config.pti_global_text,
        nx: nx(),
        telemetry: sections::telemetry_page(config, direct_map),
        // At least the first 2 MiB (the image), which PAE maps page by page.
        direct_map: direct_map.max(2 << 20),
        deferred_text: sections::deferred_text(config, pti),
    };
    let deferred = spec.deferred_text.1 > spec.deferred_text.0;
    crate::arch::sysentry::set_deferred(deferred);
    let mut frames = lock_frames();
    let half = pti::build_kernel_half::<Mode, _, _>(&mut DirectMap, &mut frames, &spec)
        .and_then(|half| Ok((half, Mode::kernel_only(&mut DirectMap, &mut frames, &half)?)));
    drop(frames);
    let (half, root) = match half {
        Ok(h) => h,
        Err(e) => panic!("cannot build the kernel page tables: {e:?}"),
    };
    if pti {
        print_pti_line(&PtiLine {
            user_copy_kernel_pages: half.user_kernel_pages,
            entry_area: spec.entry_area,
            deferred_text: spec.deferred_text,
            global_text: spec.global_text,
            nx: spec.nx,
        });
    }
    load_kernel_root(cr3_value(root, false, 0, false));
    half
}

/// A process's address space for `user`, the kernel half shared.
pub fn new_address_space(half: &KernelHalf, user: &UserSpec) -> Result<u64, MapError> {
    pti::build_address_space::<Mode, _, _>(&mut DirectMap, &mut lock_frames(), half, user, nx())
}

/// `arch_prctl(ARCH_SET_NOPTI, 1)` on the page tables of `pair`.
pub fn opt_out_of_pti(pair: u64, half: &KernelHalf) {
    Mode::opt_out_of_pti(&mut DirectMap, pair, half)
}

/// Maps a thread's stack page into the shared address space `pair`.
pub fn map_user_stack_page(pair: u64, va: u64, frame: u64) -> Result<(), MapError> {
    pti::map_user_stack_page::<Mode, _, _>(&mut DirectMap, &mut Frames, pair, va, frame, nx())
}

/// Maps `[va, va + len)` of the user half of `pair` to `[phys, phys + len)`,
/// user, writable, NX where the CPU has it, with `page`-sized leaves: the
/// working set of `wss=` (see workingset.rs). Both copies share the user
/// half below the top level.
pub fn map_user_range(pair: u64, va: u64, phys: u64, len: u64, page: u64) -> Result<(), MapError> {
    let table = Mode::user_table(&DirectMap, pair).ok_or(MapError::NotCanonical(va))?;
    map_range_flags(
        &mut DirectMap,
        &mut Frames,
        Mode::tables(table),
        Range::new(va, phys, len, page),
        USER | WRITABLE | nx_bit(),
        TABLE_FLAGS,
    )
}

/// Maps `[va, va + len)` of the kernel half (shared by every address space)
/// to `[phys, phys + len)` with 4 KiB pages, kernel-only, writable, NX
/// where the CPU has it, non-global with PTI (so that the CR3 switches
/// flush them, like the rest of the kernel) and global without: the kernel
/// working set of `kwss=`.
pub fn map_kernel_range(
    half: &KernelHalf,
    va: u64,
    phys: u64,
    len: u64,
    pti: bool,
) -> Result<(), MapError> {
    let tables = Mode::kernel_tables(&mut DirectMap, &mut Frames, half)?;
    let global = if pti { 0 } else { GLOBAL };
    map_range_flags(
        &mut DirectMap,
        &mut Frames,
        tables,
        Range::new(va, phys, len, 4096),
        WRITABLE | nx_bit() | global,
        KERNEL_TABLE_FLAGS,
    )
}

/// Enables global pages and loads `cr3` (the kernel-only root, as the
/// flavour encodes it), counting that write and the boot code's CR3 load,
/// which happened before counters existed.
fn load_kernel_root(cr3: u64) {
    // SAFETY: enabling global pages; the TLB is flushed by the CR3 write below.
    unsafe { cpu::write_cr4(cpu::read_cr4() | cpu::CR4_PGE) };
    write_cr3(cr3, Cr3Reason::Other);
    // The 32-bit boot code's CR3 load happened before counters existed.
    telemetry::inc(Counter::Cr3Other);
    telemetry::inc(Counter::TlbFlushFull);
}

/// What the `@pti` line reports (pages of the user copy's kernel part).
struct PtiLine {
    user_copy_kernel_pages: u64,
    entry_area: (u64, u64),
    deferred_text: (u64, u64),
    global_text: bool,
    nx: bool,
}

/// Prints the `@pti` line (the VMM and the tests read it), through
/// `console::Line` rather than `core::fmt`: the same text for a fraction
/// of the emulated instructions.
fn print_pti_line(line: &PtiLine) {
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
