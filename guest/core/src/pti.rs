//! The PTI page-table pair, written once over both paging modes: what the
//! kernel half maps in the kernel copy and in the user copy, and how a
//! process's address space is put together, over a [`PagingMode`] that
//! supplies the mechanism (levels, where each half's table hangs, how a
//! top-level slot is encoded). x86_64's 4-level paging is
//! [`crate::paging::FourLevel`], x86_32's PAE [`crate::pae::Pae`]; the
//! per-mode differences (PAE's PDPTEs carry no permission bits, 4-level's
//! kernel copy marks the user half NX at the top) stay in those modules.
//!
//! Every address space is an 8 KiB-aligned pair of top-level tables, the
//! kernel copy at `pair` and the user copy at `pair + 4096` (CR3 bit 12
//! selects between them). The user half is shared by both copies below the
//! top level. The kernel half of the kernel copy maps everything; that of
//! the user copy only what [`map_user_copy_kernel`] maps: the entry area
//! (text read-only and executable, data writable and NX, 4 KiB global
//! pages), all of the kernel text with `pti_global_text=on`, and the
//! deferred CR3 switch's page with `pti_switch=deferred`. A new isolation
//! scheme changes that one function (or [`build_kernel_half`]) for both
//! modes.

use crate::layout::{USER_STACK_TOP, USER_TEXT_BASE};
use crate::pte::Tables;
use crate::pte::{
    flags::*, FrameSource, MapError, PhysMem, Pte, UserSpec, KERNEL_TABLE_FLAGS, TABLE_FLAGS,
};

/// A paging mode's mechanism, as the PTI builders need it. "Half table":
/// the table one copy's kernel half is built in (4-level: a scratch
/// top-level table of which only the kernel slot is kept; PAE: the kernel
/// GiB's PMD). "User table": the table a process's user half is mapped
/// through (4-level: a copy's top-level table; PAE: the user PMD).
pub trait PagingMode {
    /// The kernel half as every address space shares it.
    type Half: Copy;
    /// Virtual address of physical 0 (the kernel's direct map).
    const KERNEL_BASE: u64;
    /// Virtual address of the telemetry page.
    const TELEMETRY_VA: u64;
    /// Whether the kernel copy maps its first 2 MiB with 4 KiB pages even
    /// without global text: PAE does, so that with PTI the entry area is
    /// global in both copies (as Linux x86_32); 4-level paging does only
    /// for global text, and otherwise maps the first 2 MiB as one page.
    const SMALL_FIRST_2M: bool;

    /// Maps the 4 KiB page `va` to `phys` in the tree at `table`.
    fn map_4k<M: PhysMem, F: FrameSource>(
        mem: &mut M,
        frames: &mut F,
        table: u64,
        va: u64,
        phys: u64,
        leaf_flags: u64,
        table_flags: u64,
    ) -> Result<(), MapError>;

    /// Maps `[va, va + len)` to `[phys, phys + len)` with `page`-sized
    /// leaves (4 KiB or 2 MiB) in the tree at `table`: what [`Self::map_4k`]
    /// (or a 2 MiB map) page after page would do, as fast as the mode can.
    #[allow(clippy::too_many_arguments)]
    fn map_run<M: PhysMem, F: FrameSource>(
        mem: &mut M,
        frames: &mut F,
        table: u64,
        va: u64,
        phys: u64,
        len: u64,
        page: u64,
        leaf_flags: u64,
        table_flags: u64,
    ) -> Result<(), MapError>;

    /// The last-level page table covering `va` in the tree at `table`,
    /// created (with the tables above it) if absent.
    fn page_table<M: PhysMem, F: FrameSource>(
        mem: &mut M,
        frames: &mut F,
        table: u64,
        va: u64,
        table_flags: u64,
    ) -> Result<u64, MapError>;

    /// The kernel half from the kernel copy's half table and, with PTI, the
    /// user copy's and the 4 KiB kernel pages mapped there.
    fn half<M: PhysMem>(mem: &M, kernel: u64, user: Option<(u64, u64)>) -> Self::Half;

    /// A kernel-only address space (no user half), for kmain before any
    /// process exists: its pair's physical address.
    fn kernel_only<M: PhysMem, F: FrameSource>(
        mem: &mut M,
        frames: &mut F,
        half: &Self::Half,
    ) -> Result<u64, MapError>;

    /// The user table of the new address space `pair`, created if the mode
    /// needs one.
    fn new_user_table<M: PhysMem, F: FrameSource>(
        mem: &mut M,
        frames: &mut F,
        pair: u64,
    ) -> Result<u64, MapError>;

    /// The user table of the address space `pair` (`None`: it has none).
    fn user_table<M: PhysMem>(mem: &M, pair: u64) -> Option<u64>;

    /// Points both copies of `pair` at their halves: the user half (mapped
    /// through `user_table`) in both, the kernel half of each copy.
    fn install<M: PhysMem>(mem: &mut M, pair: u64, user_table: u64, half: &Self::Half);

    /// Opts `pair` out of PTI (`arch_prctl(ARCH_SET_NOPTI, 1)`): the user
    /// copy maps the whole kernel half, the kernel copy may run user code.
    fn opt_out_of_pti<M: PhysMem>(mem: &mut M, pair: u64, half: &Self::Half);

    /// Undoes [`Self::opt_out_of_pti`].
    fn opt_in_to_pti<M: PhysMem>(mem: &mut M, pair: u64, half: &Self::Half);

    /// `user_table` as the working-set mapper names it.
    fn tables(user_table: u64) -> Tables;

    /// The tables of the kernel half shared by every address space, as the
    /// working-set mapper names them (4-level: a scratch root whose kernel
    /// slot is the half's).
    fn kernel_tables<M: PhysMem, F: FrameSource>(
        mem: &mut M,
        frames: &mut F,
        half: &Self::Half,
    ) -> Result<Tables, MapError>;
}

/// What the kernel half maps: the inputs of [`build_kernel_half`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSpec {
    /// Page table isolation on: kernel mappings non-global, user copy built.
    pub pti: bool,
    /// Physical `[start, end)` of the entry area (page aligned).
    pub entry_area: (u64, u64),
    /// Physical end of the entry area's text (its first part); the rest is data.
    pub entry_text_end: u64,
    /// Physical `[start, end)` of the kernel text (page aligned).
    pub text: (u64, u64),
    /// `pti_global_text=on`: with PTI, the kernel text global in both
    /// copies and mapped in the user copy, as Linux does on CPUs without
    /// PCID (its TLB entries survive the CR3 switches).
    pub global_text: bool,
    /// The CPU has NX (without it bit 63 is reserved: PAE only).
    pub nx: bool,
    /// Physical address of the telemetry page.
    pub telemetry: u64,
    /// Bytes of physical memory in the direct map (2 MiB multiple).
    pub direct_map: u64,
    /// `pti_switch=deferred`: physical `[start, end)` (page aligned) of the
    /// kernel text that switches to the user copy from Rust, mapped
    /// read-only, executable and global in the user copy besides the entry
    /// area; `(0, 0)` with the asm switch.
    pub deferred_text: (u64, u64),
}

fn in_range(pa: u64, (s, e): (u64, u64)) -> bool {
    pa >= s && pa < e
}

/// Builds the kernel half. The direct map uses 2 MiB pages, global unless
/// PTI is on, except the first 2 MiB where 4 KiB pages are needed (global
/// text, or always on PAE: see [`PagingMode::SMALL_FIRST_2M`]): there the
/// entry area and, with PTI and global text, the text are global and the
/// rest as the direct map. The telemetry page is NX. With PTI the user
/// copy's kernel half is [`map_user_copy_kernel`]'s.
pub fn build_kernel_half<P: PagingMode, M: PhysMem, F: FrameSource>(
    mem: &mut M,
    frames: &mut F,
    spec: &KernelSpec,
) -> Result<P::Half, MapError> {
    let nx = if spec.nx { NO_EXECUTE } else { 0 };
    let global = if spec.pti { 0 } else { GLOBAL };
    let text = if spec.pti && spec.global_text {
        spec.text
    } else {
        (0, 0)
    };
    let ktable = frames.frame().ok_or(MapError::OutOfFrames)?;
    let mut pa = 0;
    if (P::SMALL_FIRST_2M || text.0 < text.1) && spec.direct_map > 0 {
        let pt = P::page_table(mem, frames, ktable, P::KERNEL_BASE, KERNEL_TABLE_FLAGS)?;
        for i in 0..512u64 {
            let pa = i * 4096;
            let g = if in_range(pa, spec.entry_area) || in_range(pa, text) {
                GLOBAL
            } else {
                global
            };
            mem.write(pt, i as usize, Pte::new(pa, PRESENT | WRITABLE | g).0);
        }
        pa = 2 << 20;
    }
    if pa < spec.direct_map {
        P::map_run(
            mem,
            frames,
            ktable,
            P::KERNEL_BASE + pa,
            pa,
            spec.direct_map - pa,
            2 << 20,
            WRITABLE | global,
            KERNEL_TABLE_FLAGS,
        )?;
    }
    P::map_4k(
        mem,
        frames,
        ktable,
        P::TELEMETRY_VA,
        spec.telemetry,
        WRITABLE | nx | global,
        KERNEL_TABLE_FLAGS,
    )?;
    if !spec.pti {
        return Ok(P::half(mem, ktable, None));
    }
    let utable = frames.frame().ok_or(MapError::OutOfFrames)?;
    let pages = map_user_copy_kernel::<P, M, F>(mem, frames, utable, spec)?;
    Ok(P::half(mem, ktable, Some((utable, pages))))
}

/// The user copy's kernel half, in the half table `utable`: the entry area
/// (its text read-only and executable, the rest writable and NX), then the
/// kernel text the user copy also maps, read-only and global: all of it with
/// `global_text`, and with `pti_switch=deferred` the page of the Rust
/// function that switches CR3 on the way out; a page already mapped (entry
/// area, or text covering the deferred page) is skipped. All 4 KiB global
/// pages, at the kernel copy's virtual addresses. Returns how many.
pub fn map_user_copy_kernel<P: PagingMode, M: PhysMem, F: FrameSource>(
    mem: &mut M,
    frames: &mut F,
    utable: u64,
    spec: &KernelSpec,
) -> Result<u64, MapError> {
    let nx = if spec.nx { NO_EXECUTE } else { 0 };
    let (start, end) = spec.entry_area;
    let text_end = spec
        .entry_text_end
        .next_multiple_of(4096)
        .clamp(start, end.max(start));
    let mut pages = 0;
    for (s, e, perm) in [(start, text_end, 0), (text_end, end, WRITABLE | nx)] {
        if s < e {
            P::map_run(
                mem,
                frames,
                utable,
                P::KERNEL_BASE + s,
                s,
                e - s,
                4096,
                perm | GLOBAL,
                KERNEL_TABLE_FLAGS,
            )?;
            pages += (e - s) / 4096;
        }
    }
    let text_ranges = [
        if spec.global_text { spec.text } else { (0, 0) },
        spec.deferred_text,
    ];
    for (i, &(start, end)) in text_ranges.iter().enumerate() {
        let mut pa = start;
        while pa < end {
            let mapped =
                in_range(pa, spec.entry_area) || text_ranges[..i].iter().any(|&r| in_range(pa, r));
            if !mapped {
                P::map_4k(
                    mem,
                    frames,
                    utable,
                    P::KERNEL_BASE + pa,
                    pa,
                    GLOBAL,
                    KERNEL_TABLE_FLAGS,
                )?;
                pages += 1;
            }
            pa += 4096;
        }
    }
    Ok(pages)
}

/// Builds a process's address space for `user` (NX on its stack if `nx`)
/// and returns its pair's physical address.
pub fn build_address_space<P: PagingMode, M: PhysMem, F: FrameSource>(
    mem: &mut M,
    frames: &mut F,
    half: &P::Half,
    user: &UserSpec,
    nx: bool,
) -> Result<u64, MapError> {
    let nx = if nx { NO_EXECUTE } else { 0 };
    let pair = frames.pair().ok_or(MapError::OutOfFrames)?;
    let table = P::new_user_table(mem, frames, pair)?;
    for (va, phys, flags) in user.leaves(nx) {
        P::map_4k(mem, frames, table, va, phys, flags, TABLE_FLAGS)?;
    }
    P::install(mem, pair, table, half);
    Ok(pair)
}

/// Maps one more user stack page (user, writable, NX if `nx`) at `va` into
/// the address space `pair`: a thread's own stack in a shared address space
/// (sched-messaging `mode=thread`). Both copies see it: they share the user
/// half.
pub fn map_user_stack_page<P: PagingMode, M: PhysMem, F: FrameSource>(
    mem: &mut M,
    frames: &mut F,
    pair: u64,
    va: u64,
    phys: u64,
    nx: bool,
) -> Result<(), MapError> {
    if !(USER_TEXT_BASE..USER_STACK_TOP).contains(&va) {
        return Err(MapError::NotCanonical(va));
    }
    let table = P::user_table(mem, pair).ok_or(MapError::NotCanonical(va))?;
    let nx = if nx { NO_EXECUTE } else { 0 };
    P::map_4k(
        mem,
        frames,
        table,
        va,
        phys,
        USER | WRITABLE | nx,
        TABLE_FLAGS,
    )
}
