//! x86_64 4-level page tables: a mapper over an abstract physical memory
//! and frame source, and the builder of PTI page-table pairs. The entry
//! encoding and the abstractions are [`crate::pte`]'s, shared with PAE (and
//! re-exported here).
//!
//! PTI layout (after Linux `arch/x86/mm/pti.c`): every address space is an
//! 8 KiB-aligned pair of PML4 pages, the kernel copy at `pair` and the user
//! copy at `pair + 4096`; CR3 bit 12 selects between them. The user half
//! (PML4 slot 0) points at the same PDPT from both copies, with NX in the
//! kernel copy, so a missed switch back to the user copy faults instead of
//! running user code with kernel mappings. The kernel half (slot 511) of the
//! kernel copy maps everything; that of the user copy maps only the entry
//! area with 4 KiB global pages, at the same virtual addresses.

use crate::layout::{KERNEL_BASE, TELEMETRY_VA};
use crate::pte::Tables;
use crate::pti::PagingMode;

pub use crate::pte::{
    flags, FrameSource, MapError, PhysMem, Pte, Translation, UserSpec, ADDR_MASK,
    KERNEL_TABLE_FLAGS, TABLE_FLAGS,
};
use flags::*;

/// Entries per table.
pub const ENTRIES: usize = 512;
/// PML4 slot of the user half used by the guest.
pub const USER_PML4_SLOT: usize = 0;
/// PML4 slot of the kernel half.
pub const KERNEL_PML4_SLOT: usize = 511;

/// Table indices (PML4, PDPT, PD, PT) of a virtual address.
pub const fn indices(va: u64) -> [usize; 4] {
    [
        ((va >> 39) & 511) as usize,
        ((va >> 30) & 511) as usize,
        ((va >> 21) & 511) as usize,
        ((va >> 12) & 511) as usize,
    ]
}

/// Whether `va` is a canonical 48-bit address.
pub const fn is_canonical(va: u64) -> bool {
    let top = va >> 47;
    top == 0 || top == 0x1ffff
}

/// Returns the table that `table[index]` points to, creating it if absent.
fn next_table<M: PhysMem, F: FrameSource>(
    mem: &mut M,
    frames: &mut F,
    table: u64,
    index: usize,
    table_flags: u64,
    va: u64,
) -> Result<u64, MapError> {
    let e = Pte(mem.read(table, index));
    if e.present() {
        if e.huge() {
            return Err(MapError::AlreadyMapped(va));
        }
        return Ok(e.addr());
    }
    let t = frames.frame().ok_or(MapError::OutOfFrames)?;
    mem.write(table, index, Pte::new(t, table_flags).0);
    Ok(t)
}

/// Maps the 4 KiB page at `va` to `phys` in the tree rooted at `root`.
pub fn map_4k<M: PhysMem, F: FrameSource>(
    mem: &mut M,
    frames: &mut F,
    root: u64,
    va: u64,
    phys: u64,
    leaf_flags: u64,
    table_flags: u64,
) -> Result<(), MapError> {
    if !is_canonical(va) {
        return Err(MapError::NotCanonical(va));
    }
    if !va.is_multiple_of(4096) || !phys.is_multiple_of(4096) {
        return Err(MapError::Misaligned(va));
    }
    let [i4, i3, i2, i1] = indices(va);
    let pdpt = next_table(mem, frames, root, i4, table_flags, va)?;
    let pd = next_table(mem, frames, pdpt, i3, table_flags, va)?;
    let pt = next_table(mem, frames, pd, i2, table_flags, va)?;
    if Pte(mem.read(pt, i1)).present() {
        return Err(MapError::AlreadyMapped(va));
    }
    mem.write(pt, i1, Pte::new(phys, leaf_flags | PRESENT).0);
    Ok(())
}

/// Maps the 2 MiB page at `va` to `phys` in the tree rooted at `root`.
pub fn map_2m<M: PhysMem, F: FrameSource>(
    mem: &mut M,
    frames: &mut F,
    root: u64,
    va: u64,
    phys: u64,
    leaf_flags: u64,
    table_flags: u64,
) -> Result<(), MapError> {
    if !is_canonical(va) {
        return Err(MapError::NotCanonical(va));
    }
    if !va.is_multiple_of(2 << 20) || !phys.is_multiple_of(2 << 20) {
        return Err(MapError::Misaligned(va));
    }
    let [i4, i3, i2, _] = indices(va);
    let pdpt = next_table(mem, frames, root, i4, table_flags, va)?;
    let pd = next_table(mem, frames, pdpt, i3, table_flags, va)?;
    if Pte(mem.read(pd, i2)).present() {
        return Err(MapError::AlreadyMapped(va));
    }
    mem.write(pd, i2, Pte::new(phys, leaf_flags | PRESENT | HUGE).0);
    Ok(())
}

/// Maps `[va, va + len)` to `[phys, phys + len)` with leaves of `page`
/// bytes (4 KiB, or 2 MiB with PS) and `leaf_flags` in the tree rooted at
/// `root`: what [`map_4k`] or [`map_2m`] page after page would do (the same
/// tables and entries, [`MapError::AlreadyMapped`] for the first page found
/// mapped, the pages before it left mapped), but each table of leaves is
/// found or created once and its run of entries written by
/// [`PhysMem::fill`]. The kernel half's direct map used to be 64 calls of
/// `map_2m` (128 MiB), most of the boot's emulated instructions.
#[allow(clippy::too_many_arguments)]
pub fn map_run<M: PhysMem, F: FrameSource>(
    mem: &mut M,
    frames: &mut F,
    root: u64,
    va: u64,
    phys: u64,
    len: u64,
    page: u64,
    leaf_flags: u64,
    table_flags: u64,
) -> Result<(), MapError> {
    // Shifts and masks, not divisions: `page` is a power of two.
    let (huge, shift) = match page {
        4096 => (0, 12),
        p if p == 2 << 20 => (HUGE, 21),
        _ => return Err(MapError::Misaligned(va)),
    };
    if (va | phys | len) & (page - 1) != 0 {
        return Err(MapError::Misaligned(va));
    }
    let mut off = 0;
    while off < len {
        let v = va.checked_add(off).ok_or(MapError::NotCanonical(va))?;
        // A run never leaves its table, so it stays in v's canonical half.
        if !is_canonical(v) {
            return Err(MapError::NotCanonical(v));
        }
        let [i4, i3, i2, i1] = indices(v);
        let pdpt = next_table(mem, frames, root, i4, table_flags, v)?;
        let pd = next_table(mem, frames, pdpt, i3, table_flags, v)?;
        let (table, index) = if huge != 0 {
            (pd, i2)
        } else {
            (next_table(mem, frames, pd, i2, table_flags, v)?, i1)
        };
        let count = ((ENTRIES - index) as u64).min((len - off) >> shift);
        let first = Pte::new(phys + off, leaf_flags | PRESENT | huge).0;
        mem.fill(table, index, count as usize, first, page)
            .map_err(|i| MapError::AlreadyMapped(v + (i - index) as u64 * page))?;
        off += count * page;
    }
    Ok(())
}

/// Walks the tree rooted at `root` for `va`, as the MMU would.
pub fn translate<M: PhysMem>(mem: &M, root: u64, va: u64) -> Option<Translation> {
    if !is_canonical(va) {
        return None;
    }
    let idx = indices(va);
    let mut table = root;
    let mut eff = PRESENT | WRITABLE | USER;
    for (level, &i) in idx.iter().enumerate() {
        let e = Pte(mem.read(table, i));
        if !e.present() {
            return None;
        }
        eff &= e.0 | !(WRITABLE | USER);
        eff |= e.0 & NO_EXECUTE;
        let size = match level {
            1 if e.huge() => 1u64 << 30,
            2 if e.huge() => 2 << 20,
            3 => 4096,
            _ => 0,
        };
        if size != 0 {
            return Some(Translation {
                phys: e.addr() + (va & (size - 1)),
                flags: eff | (e.0 & GLOBAL),
                page_size: size,
            });
        }
        table = e.addr();
    }
    None
}

/// What the kernel half maps: the inputs of [`build_kernel_half`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSpec {
    /// Page table isolation on: kernel mappings non-global, user copy built.
    pub pti: bool,
    /// Physical range `[start, end)` of the entry area (page aligned).
    pub entry_area: (u64, u64),
    /// Physical end of the entry area's text (its first part); the rest is data.
    pub entry_text_end: u64,
    /// Physical address of the telemetry page (mapped at [`TELEMETRY_VA`]).
    pub telemetry: u64,
    /// Bytes of physical memory in the direct map at [`KERNEL_BASE`] (2 MiB multiple).
    pub direct_map: u64,
    /// `pti_switch=deferred`: physical range `[start, end)` (page aligned)
    /// of the kernel text that switches to the user copy from Rust, mapped
    /// read-only, executable and global in the user copy besides the entry
    /// area; `(0, 0)` with the asm switch (nothing more is mapped).
    pub deferred_text: (u64, u64),
}

/// The kernel half, shared by every address space: the PML4 entries for slot
/// 511 of the kernel copy and of the user copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelHalf {
    /// PML4 entry for slot 511 of the kernel copy: the whole kernel half.
    pub kernel_pml4e: u64,
    /// Slot 511 of the user copy: only the entry area (equal to
    /// `kernel_pml4e` when PTI is off, so both copies are the same).
    pub user_pml4e: u64,
    /// Whether PTI is on (the user copy maps only the entry area).
    pub pti: bool,
    /// 4 KiB kernel pages the user copy maps (0 without PTI).
    pub user_kernel_pages: u64,
}

impl KernelHalf {
    /// No kernel half yet (all entries zero, PTI off).
    pub const EMPTY: KernelHalf = KernelHalf {
        kernel_pml4e: 0,
        user_pml4e: 0,
        pti: false,
        user_kernel_pages: 0,
    };
}

/// Builds the kernel half ([`crate::pti::build_kernel_half`]). The direct
/// map uses 2 MiB pages, global unless PTI is on; the user copy maps the
/// entry area with 4 KiB global pages.
pub fn build_kernel_half<M: PhysMem, F: FrameSource>(
    mem: &mut M,
    frames: &mut F,
    spec: &KernelSpec,
) -> Result<KernelHalf, MapError> {
    build_kernel_half_global_text(mem, frames, spec, None)
}

/// [`build_kernel_half`], and with PTI and `global_text` = the kernel
/// text's physical range `[start, end)` (page aligned), the text mapped
/// global as Linux does on CPUs without PCID (`pti_global_text=on`), so its
/// TLB entries survive the CR3 switches: the first 2 MiB of the direct map
/// use 4 KiB pages, global for the text and the entry area, non-global for
/// the rest, and the user copy maps the text too, global and read-only.
/// Without PTI everything is global anyway and `global_text` changes nothing.
pub fn build_kernel_half_global_text<M: PhysMem, F: FrameSource>(
    mem: &mut M,
    frames: &mut F,
    spec: &KernelSpec,
    global_text: Option<(u64, u64)>,
) -> Result<KernelHalf, MapError> {
    let spec = crate::pti::KernelSpec {
        pti: spec.pti,
        entry_area: spec.entry_area,
        entry_text_end: spec.entry_text_end,
        text: global_text.unwrap_or((0, 0)),
        global_text: global_text.is_some(),
        nx: true,
        telemetry: spec.telemetry,
        direct_map: spec.direct_map,
        deferred_text: spec.deferred_text,
    };
    crate::pti::build_kernel_half::<FourLevel, M, F>(mem, frames, &spec)
}

/// Builds a process's PML4 pair and returns its physical address. With PTI,
/// the kernel copy's user slot carries NX; without, both copies are equal.
pub fn build_address_space<M: PhysMem, F: FrameSource>(
    mem: &mut M,
    frames: &mut F,
    half: &KernelHalf,
    user: &UserSpec,
) -> Result<u64, MapError> {
    crate::pti::build_address_space::<FourLevel, M, F>(mem, frames, half, user, true)
}

/// Maps one more user stack page (user, writable, NX) at `va` into the
/// address space `pair`: a thread's own stack in a shared address space
/// (sched-messaging `mode=thread`). Both copies see it: they share the
/// user half below the PML4.
pub fn map_user_stack_page<M: PhysMem, F: FrameSource>(
    mem: &mut M,
    frames: &mut F,
    pair: u64,
    va: u64,
    phys: u64,
) -> Result<(), MapError> {
    crate::pti::map_user_stack_page::<FourLevel, M, F>(mem, frames, pair, va, phys, true)
}

/// Opts an address space out of PTI (`arch_prctl(ARCH_SET_NOPTI, 1)`): the
/// kernel copy's user slot loses NX (the process will run on the kernel copy
/// in user mode) and the user copy becomes a full copy of the kernel copy, so
/// that the one exit still taken through the PTI path lands on a full map.
pub fn opt_out_of_pti<M: PhysMem>(mem: &mut M, pair: u64, half: &KernelHalf) {
    FourLevel::opt_out_of_pti(mem, pair, half)
}

/// Undoes [`opt_out_of_pti`]: NX back on the kernel copy's user slot and
/// the user copy's kernel half back to the entry area only.
pub fn opt_in_to_pti<M: PhysMem>(mem: &mut M, pair: u64, half: &KernelHalf) {
    FourLevel::opt_in_to_pti(mem, pair, half)
}

/// x86_64's 4-level paging as a [`PagingMode`]: a half table is a scratch
/// PML4 whose slot 511 is kept; a process's user table is its kernel
/// copy's PML4 (slot 0, shared with the user copy below the PML4). With
/// PTI the kernel copy's user slot carries NX, so a missed switch back to
/// the user copy faults instead of running user code with kernel mappings.
pub struct FourLevel;

impl PagingMode for FourLevel {
    type Half = KernelHalf;
    const KERNEL_BASE: u64 = KERNEL_BASE;
    const TELEMETRY_VA: u64 = TELEMETRY_VA;
    const SMALL_FIRST_2M: bool = false;

    fn map_4k<M: PhysMem, F: FrameSource>(
        mem: &mut M,
        frames: &mut F,
        table: u64,
        va: u64,
        phys: u64,
        leaf_flags: u64,
        table_flags: u64,
    ) -> Result<(), MapError> {
        map_4k(mem, frames, table, va, phys, leaf_flags, table_flags)
    }

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
    ) -> Result<(), MapError> {
        map_run(
            mem,
            frames,
            table,
            va,
            phys,
            len,
            page,
            leaf_flags,
            table_flags,
        )
    }

    fn page_table<M: PhysMem, F: FrameSource>(
        mem: &mut M,
        frames: &mut F,
        table: u64,
        va: u64,
        table_flags: u64,
    ) -> Result<u64, MapError> {
        if !is_canonical(va) {
            return Err(MapError::NotCanonical(va));
        }
        let [i4, i3, i2, _] = indices(va);
        let pdpt = next_table(mem, frames, table, i4, table_flags, va)?;
        let pd = next_table(mem, frames, pdpt, i3, table_flags, va)?;
        next_table(mem, frames, pd, i2, table_flags, va)
    }

    fn half<M: PhysMem>(mem: &M, kernel: u64, user: Option<(u64, u64)>) -> KernelHalf {
        let kernel_pml4e = mem.read(kernel, KERNEL_PML4_SLOT);
        match user {
            Some((table, pages)) => KernelHalf {
                kernel_pml4e,
                user_pml4e: mem.read(table, KERNEL_PML4_SLOT),
                pti: true,
                user_kernel_pages: pages,
            },
            None => KernelHalf {
                kernel_pml4e,
                user_pml4e: kernel_pml4e,
                pti: false,
                user_kernel_pages: 0,
            },
        }
    }

    fn kernel_only<M: PhysMem, F: FrameSource>(
        mem: &mut M,
        frames: &mut F,
        half: &KernelHalf,
    ) -> Result<u64, MapError> {
        let root = frames.pair().ok_or(MapError::OutOfFrames)?;
        mem.write(root, KERNEL_PML4_SLOT, half.kernel_pml4e);
        Ok(root)
    }

    fn new_user_table<M: PhysMem, F: FrameSource>(
        _: &mut M,
        _: &mut F,
        pair: u64,
    ) -> Result<u64, MapError> {
        Ok(pair)
    }

    fn user_table<M: PhysMem>(_: &M, pair: u64) -> Option<u64> {
        Some(pair + 4096)
    }

    fn install<M: PhysMem>(mem: &mut M, pair: u64, user_table: u64, half: &KernelHalf) {
        let user_slot = mem.read(user_table, USER_PML4_SLOT);
        let (kernel_user_slot, user_kernel_slot) = if half.pti {
            (user_slot | NO_EXECUTE, half.user_pml4e)
        } else {
            (user_slot, half.kernel_pml4e)
        };
        mem.write(pair, USER_PML4_SLOT, kernel_user_slot);
        mem.write(pair, KERNEL_PML4_SLOT, half.kernel_pml4e);
        mem.write(pair + 4096, USER_PML4_SLOT, user_slot);
        mem.write(pair + 4096, KERNEL_PML4_SLOT, user_kernel_slot);
    }

    fn opt_out_of_pti<M: PhysMem>(mem: &mut M, pair: u64, half: &KernelHalf) {
        let user_slot = mem.read(pair + 4096, USER_PML4_SLOT);
        mem.write(pair, USER_PML4_SLOT, user_slot);
        mem.write(pair + 4096, KERNEL_PML4_SLOT, half.kernel_pml4e);
    }

    fn opt_in_to_pti<M: PhysMem>(mem: &mut M, pair: u64, half: &KernelHalf) {
        let user_slot = mem.read(pair + 4096, USER_PML4_SLOT);
        if half.pti {
            mem.write(pair, USER_PML4_SLOT, user_slot | NO_EXECUTE);
        }
        mem.write(pair + 4096, KERNEL_PML4_SLOT, half.user_pml4e);
    }

    fn tables(user_table: u64) -> Tables {
        Tables::FourLevel(user_table)
    }

    fn kernel_tables<M: PhysMem, F: FrameSource>(
        mem: &mut M,
        frames: &mut F,
        half: &KernelHalf,
    ) -> Result<Tables, MapError> {
        let root = frames.frame().ok_or(MapError::OutOfFrames)?;
        mem.write(root, KERNEL_PML4_SLOT, half.kernel_pml4e);
        Ok(Tables::FourLevel(root))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{USER_STACK_TOP, USER_TEXT_BASE};
    use std::collections::BTreeMap;
    use std::vec::Vec;

    /// Sparse fake physical memory: absent entries read as zero.
    #[derive(Default, PartialEq, Debug)]
    struct FakeMem(BTreeMap<(u64, usize), u64>);
    impl PhysMem for FakeMem {
        fn read(&self, table: u64, index: usize) -> u64 {
            assert_eq!(table % 4096, 0, "table address must be page aligned");
            assert!(index < ENTRIES);
            *self.0.get(&(table, index)).unwrap_or(&0)
        }
        fn write(&mut self, table: u64, index: usize, value: u64) {
            assert_eq!(table % 4096, 0);
            assert!(index < ENTRIES);
            self.0.insert((table, index), value);
        }
    }

    struct Bump {
        next: u64,
        limit: u64,
        handed: Vec<u64>,
    }
    impl FrameSource for Bump {
        fn frame(&mut self) -> Option<u64> {
            if self.next >= self.limit {
                return None;
            }
            let f = self.next;
            self.next += 4096;
            self.handed.push(f);
            Some(f)
        }
        fn pair(&mut self) -> Option<u64> {
            self.next = (self.next + 8191) & !8191;
            let p = self.frame()?;
            self.frame()?;
            Some(p)
        }
    }
    fn bump() -> Bump {
        Bump {
            next: 0x20_0000,
            limit: 0x40_0000,
            handed: Vec::new(),
        }
    }

    const ENTRY: (u64, u64) = (0x10_2000, 0x10_5000);
    const ENTRY_TEXT_END: u64 = 0x10_3000;
    const TELEMETRY: u64 = 0x7fff000;
    const KDATA: u64 = 0x10_8000; // kernel data outside the entry area

    fn spec(pti: bool) -> KernelSpec {
        KernelSpec {
            pti,
            entry_area: ENTRY,
            entry_text_end: ENTRY_TEXT_END,
            telemetry: TELEMETRY,
            direct_map: 64 << 20,
            deferred_text: (0, 0),
        }
    }
    fn user() -> UserSpec {
        UserSpec {
            text_phys: 0x11_0000,
            text_pages: 2,
            stack: [0x12_0000, 0x12_1000],
        }
    }
    fn setup(pti: bool) -> (FakeMem, Bump, KernelHalf, u64) {
        let (mut m, mut f) = (FakeMem::default(), bump());
        let half = build_kernel_half(&mut m, &mut f, &spec(pti)).unwrap();
        let pair = build_address_space(&mut m, &mut f, &half, &user()).unwrap();
        (m, f, half, pair)
    }

    /// `map_run` against `map_4k`/`map_2m` page by page: the same tables
    /// (frames handed out in the same order) and entries, across a table
    /// boundary; and the same error at the first page already mapped.
    #[test]
    fn map_run_equals_page_by_page() {
        for (page, va, phys, pages) in [
            (4096u64, KERNEL_BASE + 0x1f_c000, 0x1f_c000u64, 9u64),
            (2 << 20, KERNEL_BASE + (506 << 21), 506 << 21, 10),
            (2 << 20, KERNEL_BASE, 0, 64),
        ] {
            let (mut a, mut fa) = (FakeMem::default(), bump());
            let (mut b, mut fb) = (FakeMem::default(), bump());
            let (ra, rb) = (fa.frame().unwrap(), fb.frame().unwrap());
            let leaf = WRITABLE | NO_EXECUTE;
            map_run(
                &mut a,
                &mut fa,
                ra,
                va,
                phys,
                pages * page,
                page,
                leaf,
                KERNEL_TABLE_FLAGS,
            )
            .unwrap();
            for i in 0..pages {
                let (v, p) = (va + i * page, phys + i * page);
                if page == 4096 {
                    map_4k(&mut b, &mut fb, rb, v, p, leaf, KERNEL_TABLE_FLAGS).unwrap();
                } else {
                    map_2m(&mut b, &mut fb, rb, v, p, leaf, KERNEL_TABLE_FLAGS).unwrap();
                }
            }
            assert_eq!(a, b, "page {page:#x} from {va:#x}");
            assert_eq!(fa.handed, fb.handed);
            if phys < 3 * page {
                continue;
            }
            // Once more over a range whose fourth page is now mapped.
            let start = va - 3 * page;
            let err = map_run(
                &mut a,
                &mut fa,
                ra,
                start,
                phys - 3 * page,
                6 * page,
                page,
                leaf,
                KERNEL_TABLE_FLAGS,
            );
            assert_eq!(err, Err(MapError::AlreadyMapped(va)));
            assert!(
                translate(&a, ra, start).is_some(),
                "the pages before it are mapped"
            );
        }
        let (mut m, mut f) = (FakeMem::default(), bump());
        let root = f.frame().unwrap();
        for (va, phys, len, page) in [
            (KERNEL_BASE + 4096, 0, 2 << 20, 2 << 20),
            (KERNEL_BASE, 0x1800, 4096, 4096),
            (KERNEL_BASE, 0, 0x1800, 4096),
            (KERNEL_BASE, 0, 8192, 8192),
        ] {
            let r = map_run(
                &mut m,
                &mut f,
                root,
                va,
                phys,
                len,
                page,
                0,
                KERNEL_TABLE_FLAGS,
            );
            assert_eq!(r, Err(MapError::Misaligned(va)));
        }
        let r = map_run(&mut m, &mut f, root, 1 << 47, 0, 4096, 4096, 0, TABLE_FLAGS);
        assert_eq!(r, Err(MapError::NotCanonical(1 << 47)));
    }

    #[test]
    fn entry_encoding() {
        let e = Pte::new(0x1234_5000 | 0xfff, PRESENT | WRITABLE | NO_EXECUTE);
        assert_eq!(e.addr(), 0x1234_5000);
        assert_eq!(e.0, 0x8000_0000_1234_5003);
        assert!(e.present() && !e.huge());
        assert_eq!(e.flags(), PRESENT | WRITABLE | NO_EXECUTE);
        assert_eq!(indices(0xffff_ffff_8010_2000), [511, 510, 0, 0x102]);
        assert_eq!(indices(USER_TEXT_BASE), [0, 0, 2, 0]);
        assert!(is_canonical(KERNEL_BASE) && !is_canonical(0x8000_0000_0000));
    }

    #[test]
    fn mapper_rejects_bad_requests() {
        let (mut m, mut f) = (FakeMem::default(), bump());
        let root = f.frame().unwrap();
        assert_eq!(
            map_4k(&mut m, &mut f, root, 0x8000_0000_0000, 0, 0, TABLE_FLAGS),
            Err(MapError::NotCanonical(0x8000_0000_0000))
        );
        assert_eq!(
            map_4k(&mut m, &mut f, root, 0x1001, 0, 0, TABLE_FLAGS),
            Err(MapError::Misaligned(0x1001))
        );
        map_2m(
            &mut m,
            &mut f,
            root,
            0x20_0000,
            0x20_0000,
            WRITABLE,
            TABLE_FLAGS,
        )
        .unwrap();
        assert_eq!(
            map_4k(&mut m, &mut f, root, 0x20_1000, 0, 0, TABLE_FLAGS),
            Err(MapError::AlreadyMapped(0x20_1000)),
            "a huge page is in the way"
        );
        map_4k(&mut m, &mut f, root, 0x1000, 0x5000, 0, TABLE_FLAGS).unwrap();
        assert_eq!(
            map_4k(&mut m, &mut f, root, 0x1000, 0x6000, 0, TABLE_FLAGS),
            Err(MapError::AlreadyMapped(0x1000))
        );
        let mut tiny = Bump {
            next: 0,
            limit: 4096,
            handed: Vec::new(),
        };
        let r = tiny.frame().unwrap();
        assert_eq!(
            map_4k(&mut m, &mut tiny, r, 0x1000, 0, 0, TABLE_FLAGS),
            Err(MapError::OutOfFrames)
        );
    }

    #[test]
    fn pair_is_8k_aligned_and_both_copies_share_the_user_pdpt() {
        let (m, _, _, pair) = setup(true);
        assert_eq!(pair % 8192, 0);
        let k = Pte(m.read(pair, USER_PML4_SLOT));
        let u = Pte(m.read(pair + 4096, USER_PML4_SLOT));
        assert_eq!(k.addr(), u.addr(), "lower levels are shared");
        assert!(k.0 & NO_EXECUTE != 0, "user half is NX in the kernel copy");
        assert!(u.0 & NO_EXECUTE == 0);
    }

    #[test]
    fn deferred_switch_text_is_mapped_in_the_user_copy_and_nothing_more() {
        let (mut m, mut f) = (FakeMem::default(), bump());
        let spec = KernelSpec {
            deferred_text: (KDATA, KDATA + 4096),
            ..spec(true)
        };
        let half = build_kernel_half(&mut m, &mut f, &spec).unwrap();
        let pair = build_address_space(&mut m, &mut f, &half, &user()).unwrap();
        let uroot = pair + 4096;
        // Read-only, executable, global kernel text.
        let t = translate(&m, uroot, KERNEL_BASE + KDATA).unwrap();
        assert_eq!(t.phys, KDATA);
        assert_eq!(t.flags & (GLOBAL | NO_EXECUTE | WRITABLE | USER), GLOBAL);
        // Only that page: the next one is still absent.
        assert_eq!(translate(&m, uroot, KERNEL_BASE + KDATA + 4096), None);
        // The entry area is mapped as without it.
        assert!(translate(&m, uroot, KERNEL_BASE + ENTRY.0).is_some());
    }

    #[test]
    fn pti_user_copy_maps_only_the_entry_area() {
        let (m, _, _, pair) = setup(true);
        let (kroot, uroot) = (pair, pair + 4096);
        // Entry text: present, global, executable, read-only, not user.
        let t = translate(&m, uroot, KERNEL_BASE + ENTRY.0).unwrap();
        assert_eq!(t.phys, ENTRY.0);
        assert_eq!(t.page_size, 4096);
        assert_eq!(t.flags & (GLOBAL | NO_EXECUTE | WRITABLE | USER), GLOBAL);
        // Entry data: writable, NX, global.
        let d = translate(&m, uroot, KERNEL_BASE + ENTRY_TEXT_END).unwrap();
        assert_eq!(
            d.flags & (GLOBAL | NO_EXECUTE | WRITABLE | USER),
            GLOBAL | NO_EXECUTE | WRITABLE
        );
        // Nothing else of the kernel: data, the page after the area, telemetry.
        for va in [
            KERNEL_BASE + KDATA,
            KERNEL_BASE + ENTRY.1,
            KERNEL_BASE + ENTRY.0 - 4096,
            TELEMETRY_VA,
            KERNEL_BASE,
        ] {
            assert_eq!(
                translate(&m, uroot, va),
                None,
                "{va:#x} must be absent from the user copy"
            );
        }
        // Exhaustive: every present leaf under the user copy's slot 511 is in the entry area.
        let pdpt = Pte(m.read(uroot, KERNEL_PML4_SLOT)).addr();
        let mut leaves = 0;
        for i3 in 0..ENTRIES {
            let e3 = Pte(m.read(pdpt, i3));
            if !e3.present() {
                continue;
            }
            assert!(!e3.huge());
            for i2 in 0..ENTRIES {
                let e2 = Pte(m.read(e3.addr(), i2));
                if !e2.present() {
                    continue;
                }
                assert!(!e2.huge(), "no 2 MiB kernel page in the user copy");
                for i1 in 0..ENTRIES {
                    let e1 = Pte(m.read(e2.addr(), i1));
                    if e1.present() {
                        assert!((ENTRY.0..ENTRY.1).contains(&e1.addr()));
                        leaves += 1;
                    }
                }
            }
        }
        assert_eq!(leaves, (ENTRY.1 - ENTRY.0) / 4096);
        // The kernel copy maps it all, non-global with PTI.
        let kd = translate(&m, kroot, KERNEL_BASE + KDATA).unwrap();
        assert_eq!(kd.phys, KDATA);
        assert_eq!(kd.flags & (GLOBAL | USER), 0);
        let tel = translate(&m, kroot, TELEMETRY_VA + 8).unwrap();
        assert_eq!(tel.phys, TELEMETRY + 8);
    }

    #[test]
    fn global_text_is_global_in_both_copies_and_nothing_else_widens() {
        const TEXT: (u64, u64) = (ENTRY.1, ENTRY.1 + 3 * 4096);
        let (mut m, mut f) = (FakeMem::default(), bump());
        let half = build_kernel_half_global_text(&mut m, &mut f, &spec(true), Some(TEXT)).unwrap();
        let pair = build_address_space(&mut m, &mut f, &half, &user()).unwrap();
        let (kroot, uroot) = (pair, pair + 4096);
        for pa in (TEXT.0..TEXT.1).step_by(4096) {
            let u = translate(&m, uroot, KERNEL_BASE + pa).unwrap();
            assert_eq!(u.phys, pa);
            assert_eq!(u.flags & (GLOBAL | WRITABLE | USER | NO_EXECUTE), GLOBAL);
            let k = translate(&m, kroot, KERNEL_BASE + pa).unwrap();
            assert_eq!((k.page_size, k.flags & GLOBAL), (4096, GLOBAL));
        }
        // The rest of the first 2 MiB: 4 KiB, non-global in the kernel copy,
        // absent from the user copy; beyond it, 2 MiB pages as before.
        let kd = translate(&m, kroot, KERNEL_BASE + TEXT.1).unwrap();
        assert_eq!((kd.page_size, kd.flags & GLOBAL), (4096, 0));
        assert_eq!(translate(&m, uroot, KERNEL_BASE + TEXT.1), None);
        assert_eq!(translate(&m, uroot, KERNEL_BASE + KDATA + 0x10_0000), None);
        let far = translate(&m, kroot, KERNEL_BASE + (4 << 20)).unwrap();
        assert_eq!((far.page_size, far.flags & GLOBAL), (2 << 20, 0));
        // The entry area is global in the kernel copy now too.
        let e = translate(&m, kroot, KERNEL_BASE + ENTRY.0).unwrap();
        assert_eq!(e.flags & GLOBAL, GLOBAL);
        // Without PTI the text range changes nothing.
        let (mut m2, mut f2) = (FakeMem::default(), bump());
        let a = build_kernel_half_global_text(&mut m2, &mut f2, &spec(false), Some(TEXT)).unwrap();
        let (mut m3, mut f3) = (FakeMem::default(), bump());
        let b = build_kernel_half(&mut m3, &mut f3, &spec(false)).unwrap();
        assert_eq!(a, b);
        assert_eq!(m2, m3);
    }

    #[test]
    fn extra_stack_pages_show_in_both_copies() {
        for pti in [false, true] {
            let (mut m, mut f, _, pair) = setup(pti);
            let va = USER_STACK_TOP - 5 * 4096;
            map_user_stack_page(&mut m, &mut f, pair, va, 0x13_0000).unwrap();
            for root in [pair, pair + 4096] {
                let t = translate(&m, root, va + 8).unwrap();
                assert_eq!(t.phys, 0x13_0008);
                assert_eq!(
                    t.flags & (USER | WRITABLE | NO_EXECUTE),
                    USER | WRITABLE | NO_EXECUTE
                );
            }
            assert_eq!(
                map_user_stack_page(&mut m, &mut f, pair, va, 0x14_0000),
                Err(MapError::AlreadyMapped(va))
            );
            assert!(map_user_stack_page(&mut m, &mut f, pair, USER_STACK_TOP, 0x14_0000).is_err());
            assert!(map_user_stack_page(&mut m, &mut f, pair, KERNEL_BASE, 0x14_0000).is_err());
        }
    }

    #[test]
    fn user_mappings_and_nx_per_copy() {
        let (m, _, _, pair) = setup(true);
        let ut = translate(&m, pair + 4096, USER_TEXT_BASE + 4096 + 5).unwrap();
        assert_eq!(ut.phys, 0x11_1005);
        assert_eq!(ut.flags & (USER | WRITABLE | NO_EXECUTE), USER);
        let kt = translate(&m, pair, USER_TEXT_BASE).unwrap();
        assert!(
            kt.flags & NO_EXECUTE != 0,
            "user text not executable with the kernel copy"
        );
        let st = translate(&m, pair + 4096, USER_STACK_TOP - 8).unwrap();
        assert_eq!(st.phys, 0x12_1ff8);
        assert_eq!(
            st.flags & (USER | WRITABLE | NO_EXECUTE),
            USER | WRITABLE | NO_EXECUTE
        );
        assert_eq!(translate(&m, pair + 4096, USER_STACK_TOP), None);
        assert_eq!(translate(&m, pair + 4096, USER_TEXT_BASE + 2 * 4096), None);
    }

    #[test]
    fn without_pti_both_copies_are_equal_and_global() {
        let (m, _, half, pair) = setup(false);
        assert_eq!(half.kernel_pml4e, half.user_pml4e);
        for slot in [USER_PML4_SLOT, KERNEL_PML4_SLOT] {
            assert_eq!(m.read(pair, slot), m.read(pair + 4096, slot));
        }
        let kd = translate(&m, pair + 4096, KERNEL_BASE + KDATA).unwrap();
        assert!(kd.flags & GLOBAL != 0 && kd.flags & USER == 0);
        assert!(translate(&m, pair, USER_TEXT_BASE).unwrap().flags & NO_EXECUTE == 0);
    }

    #[test]
    fn opt_out_gives_a_full_executable_map() {
        let (mut m, _, half, pair) = setup(true);
        opt_out_of_pti(&mut m, pair, &half);
        assert!(translate(&m, pair, USER_TEXT_BASE).unwrap().flags & NO_EXECUTE == 0);
        assert!(translate(&m, pair + 4096, KERNEL_BASE + KDATA).is_some());
        // Another process keeps its isolation: the kernel half is shared, not modified.
        let mut f = Bump {
            next: 0x30_0000,
            limit: 0x40_0000,
            handed: Vec::new(),
        };
        let other = build_address_space(&mut m, &mut f, &half, &user()).unwrap();
        assert_eq!(translate(&m, other + 4096, KERNEL_BASE + KDATA), None);
        // And opting back in restores the isolation of the first one.
        opt_in_to_pti(&mut m, pair, &half);
        assert_eq!(translate(&m, pair + 4096, KERNEL_BASE + KDATA), None);
        assert!(translate(&m, pair, USER_TEXT_BASE).unwrap().flags & NO_EXECUTE != 0);
        assert!(translate(&m, pair + 4096, KERNEL_BASE + ENTRY.0).is_some());
    }

    #[test]
    fn page_tables_come_only_from_the_frame_source() {
        let (_, f, _, pair) = setup(true);
        assert!(f.handed.contains(&pair) && f.handed.contains(&(pair + 4096)));
        // 64 MiB direct map: scratch root + PDPT + PD (2M pages) + telemetry PD + PT,
        // user copy: root + PDPT + PD + PT; process: pair(2) + PDPT + PD + PT.
        assert_eq!(f.handed.len(), 5 + 4 + 5);
    }
}
