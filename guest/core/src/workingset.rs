//! Mapping the user working set (`wss=`) and the kernel one (`kwss=`): a
//! physically contiguous buffer mapped with 4 KiB or 2 MiB pages, one table
//! walk per page table rather than per page (the kernel code that runs this
//! is emulated on some hosts, and a 16 MiB buffer is 4096 pages).

use crate::paging::{self, flags::*, FrameSource, MapError, PhysMem, Pte};
use crate::pte::Tables;

/// Page sizes the working set can be mapped with.
const SMALL: u64 = 4096;
const HUGE: u64 = 2 << 20;

/// Checks the common arguments: page size known, everything aligned to it.
fn check(va: u64, phys: u64, len: u64, page: u64) -> Result<(), MapError> {
    if (page != SMALL && page != HUGE)
        || !va.is_multiple_of(page)
        || !phys.is_multiple_of(page)
        || !len.is_multiple_of(page)
    {
        return Err(MapError::Misaligned(va));
    }
    Ok(())
}

/// A physically contiguous range to map: `[va, va + len)` to `[phys,
/// phys + len)` with `page`-sized leaves (4 KiB or 2 MiB), all aligned to
/// `page`.
#[derive(Clone, Copy, Debug)]
pub struct Range {
    /// First virtual address.
    pub va: u64,
    /// First physical address.
    pub phys: u64,
    /// Bytes to map.
    pub len: u64,
    /// Leaf size: 4096 or 2 MiB.
    pub page: u64,
}

impl Range {
    /// The range of `len` bytes from `va` to `phys` with `page`-sized leaves.
    pub const fn new(va: u64, phys: u64, len: u64, page: u64) -> Self {
        Range {
            va,
            phys,
            len,
            page,
        }
    }
}

/// Maps `range` user and writable, NX, into the 4-level tree at `root`
/// (x86_64); intermediate tables as user tables.
pub fn map_range<M: PhysMem, F: FrameSource>(
    mem: &mut M,
    frames: &mut F,
    root: u64,
    range: Range,
) -> Result<(), MapError> {
    let leaf = USER | WRITABLE | NO_EXECUTE;
    map_range_flags(
        mem,
        frames,
        Tables::FourLevel(root),
        range,
        leaf,
        paging::TABLE_FLAGS,
    )
}

/// [`map_range`] for x86_32 PAE: into the PMD `pmd`, NX only if the CPU
/// has it.
pub fn map_range_pae<M: PhysMem, F: FrameSource>(
    mem: &mut M,
    frames: &mut F,
    pmd: u64,
    range: Range,
    nx: bool,
) -> Result<(), MapError> {
    let leaf = USER | WRITABLE | if nx { NO_EXECUTE } else { 0 };
    let tables = PRESENT | WRITABLE | USER;
    map_range_flags(mem, frames, Tables::PaePmd(pmd), range, leaf, tables)
}

/// Maps `range` into `tables` with the leaves' and the intermediate
/// tables' flags given (the kernel working set, `kwss=`, is mapped
/// kernel-only). One table walk per page table: the first page of each
/// through the builder (which creates the table), the rest of that table
/// by direct writes.
pub fn map_range_flags<M: PhysMem, F: FrameSource>(
    mem: &mut M,
    frames: &mut F,
    tables: Tables,
    range: Range,
    leaf: u64,
    table_flags: u64,
) -> Result<(), MapError> {
    let Range {
        va,
        phys,
        len,
        page,
    } = range;
    check(va, phys, len, page)?;
    if let Tables::PaePmd(_) = tables {
        let end = va.checked_add(len).ok_or(MapError::NotCanonical(va))?;
        if len > 0 && (va >> 30) != ((end - 1) >> 30) {
            return Err(MapError::NotCanonical(end - 1));
        }
    }
    let mut off = 0;
    while off < len {
        let v = va + off;
        if page == HUGE {
            match tables {
                Tables::FourLevel(root) => {
                    paging::map_2m(mem, frames, root, v, phys + off, leaf, table_flags)?
                }
                Tables::PaePmd(pmd) => {
                    let i2 = crate::pae::indices(v)[1];
                    if Pte(mem.read(pmd, i2)).present() {
                        return Err(MapError::AlreadyMapped(v));
                    }
                    mem.write(pmd, i2, Pte::new(phys + off, leaf | PRESENT | HUGE_FLAG).0);
                }
            }
            off += HUGE;
            continue;
        }
        let (pt, i1) = match tables {
            Tables::FourLevel(root) => {
                paging::map_4k(mem, frames, root, v, phys + off, leaf, table_flags)?;
                let [i4, i3, i2, i1] = paging::indices(v);
                let pdpt = Pte(mem.read(root, i4)).addr();
                let pd = Pte(mem.read(pdpt, i3)).addr();
                (Pte(mem.read(pd, i2)).addr(), i1)
            }
            Tables::PaePmd(pmd) => {
                crate::pae::map_4k_in_pmd(mem, frames, pmd, v, phys + off, leaf, table_flags)?;
                let [_, i2, i1] = crate::pae::indices(v);
                (Pte(mem.read(pmd, i2)).addr(), i1)
            }
        };
        off = fill_page_table(mem, pt, i1 + 1, va, phys, off + SMALL, len, leaf)?;
    }
    Ok(())
}

/// Maps the rest of page table `pt` from entry `first` on, while `off <
/// len`, with direct writes (the first page of the table went through the
/// builder, which created it); returns the offset reached.
#[allow(clippy::too_many_arguments)]
fn fill_page_table<M: PhysMem>(
    mem: &mut M,
    pt: u64,
    first: usize,
    va: u64,
    phys: u64,
    mut off: u64,
    len: u64,
    leaf: u64,
) -> Result<u64, MapError> {
    for i in first..paging::ENTRIES {
        if off >= len {
            break;
        }
        if Pte(mem.read(pt, i)).present() {
            return Err(MapError::AlreadyMapped(va + off));
        }
        mem.write(pt, i, Pte::new(phys + off, leaf | PRESENT).0);
        off += SMALL;
    }
    Ok(off)
}

/// The PS bit of a PMD entry (named apart from the page size above).
const HUGE_FLAG: u64 = paging::flags::HUGE;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paging::translate;
    use std::collections::BTreeMap;

    /// Page tables in a map; frames from a counter.
    #[derive(Default)]
    struct Mem(BTreeMap<(u64, usize), u64>);
    impl PhysMem for Mem {
        fn read(&self, table: u64, index: usize) -> u64 {
            *self.0.get(&(table, index)).unwrap_or(&0)
        }
        fn write(&mut self, table: u64, index: usize, value: u64) {
            self.0.insert((table, index), value);
        }
    }
    struct Frames(u64);
    impl FrameSource for Frames {
        fn frame(&mut self) -> Option<u64> {
            self.0 += 4096;
            Some(self.0)
        }
        fn pair(&mut self) -> Option<u64> {
            self.0 = (self.0 + 8192).next_multiple_of(8192);
            Some(self.0)
        }
    }

    #[test]
    fn every_page_of_a_range_translates() {
        for (page, len) in [(SMALL, 3 << 20), (SMALL, 4096), (HUGE, 4 << 20)] {
            let mut mem = Mem::default();
            let mut frames = Frames(0x100_0000);
            let root = frames.pair().unwrap();
            let va = 0x100_0000 - if page == SMALL { 4096 } else { 0 };
            let phys = 0x4000_0000;
            let range = |len| Range::new(va, phys, len, page);
            map_range(&mut mem, &mut frames, root, range(len)).unwrap();
            for off in (0..len).step_by(4096) {
                let t = translate(&mem, root, va + off).unwrap();
                assert_eq!(t.phys, phys + off, "{page} {off:#x}");
                assert!(t.flags & USER != 0 && t.flags & WRITABLE != 0);
            }
            assert!(translate(&mem, root, va + len).is_none());
            assert!(va == 0 || translate(&mem, root, va - 4096).is_none());
            assert_eq!(
                map_range(&mut mem, &mut frames, root, range(page)),
                Err(MapError::AlreadyMapped(va))
            );
        }
    }

    #[test]
    fn pae_ranges_translate_and_stay_in_one_gib() {
        for (page, len) in [(SMALL, (2 << 20) + 8192), (HUGE, 2 << 20)] {
            let mut mem = Mem::default();
            let mut frames = Frames(0x100_0000);
            let pdpt = frames.pair().unwrap();
            let pmd = frames.frame().unwrap();
            mem.write(pdpt, 0, crate::pae::pdpte(pmd));
            let va = 0x100_0000;
            let range = Range::new(va, 0x80_0000, len, page);
            map_range_pae(&mut mem, &mut frames, pmd, range, true).unwrap();
            for off in (0..len).step_by(4096) {
                let t = crate::pae::translate(&mem, pdpt, va + off).unwrap();
                assert_eq!(t.phys, 0x80_0000 + off);
            }
        }
        let mut mem = Mem::default();
        let mut frames = Frames(0);
        let across = Range::new(0x3fe0_0000, 0, 4 << 20, HUGE);
        assert!(map_range_pae(&mut mem, &mut frames, 0x1000, across, false).is_err());
        let misaligned = Range::new(0x1000, 0, 2 << 20, HUGE);
        assert!(map_range(&mut mem, &mut frames, 0x1000, misaligned).is_err());
    }
}
