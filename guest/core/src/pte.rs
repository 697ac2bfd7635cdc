//! What 4-level and PAE page tables share: the 64-bit entry encoding
//! ([`Pte`], [`flags`]: PAE entries have the 4-level layout), the
//! abstractions the builders work over (page-table pages by physical address,
//! [`PhysMem`]; a source of zeroed frames, [`FrameSource`]), their error, a
//! walk's result and what a process maps in the user half. The builders are
//! [`crate::paging`] (x86_64, 4 levels) and [`crate::pae`] (x86_32, 3 levels).

use crate::layout::USER_STACK_PAGES;

/// Page-table entry bits.
pub mod flags {
    /// P: the entry is valid.
    pub const PRESENT: u64 = 1 << 0;
    /// R/W: writes allowed (if every level allows them).
    pub const WRITABLE: u64 = 1 << 1;
    /// U/S: user-mode access allowed (if every level allows it).
    pub const USER: u64 = 1 << 2;
    /// PWT: write-through caching.
    pub const WRITE_THROUGH: u64 = 1 << 3;
    /// PCD: caching disabled.
    pub const NO_CACHE: u64 = 1 << 4;
    /// A: set by the CPU when the entry is used.
    pub const ACCESSED: u64 = 1 << 5;
    /// D: set by the CPU when the leaf's page is written.
    pub const DIRTY: u64 = 1 << 6;
    /// PS: a 2 MiB (PD) or 1 GiB (PDPT) leaf.
    pub const HUGE: u64 = 1 << 7;
    /// G: the leaf's TLB entry survives CR3 writes (needs CR4.PGE).
    pub const GLOBAL: u64 = 1 << 8;
    /// XD: no instruction fetch (needs EFER.NXE).
    pub const NO_EXECUTE: u64 = 1 << 63;
}
use flags::*;

/// Physical-address bits of an entry.
pub const ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;

/// Flags of intermediate tables: the leaves decide the permissions.
pub const TABLE_FLAGS: u64 = PRESENT | WRITABLE | USER;
/// Flags of intermediate tables of the kernel half (no USER).
pub const KERNEL_TABLE_FLAGS: u64 = PRESENT | WRITABLE;

/// One page-table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pte(pub u64);

impl Pte {
    /// An entry pointing to `phys` (masked to [`ADDR_MASK`]) with `flags`.
    pub const fn new(phys: u64, flags: u64) -> Self {
        Pte((phys & ADDR_MASK) | flags)
    }
    /// Physical address the entry points to.
    pub const fn addr(self) -> u64 {
        self.0 & ADDR_MASK
    }
    /// Flag bits (everything outside [`ADDR_MASK`]).
    pub const fn flags(self) -> u64 {
        self.0 & !ADDR_MASK
    }
    /// Whether P is set.
    pub const fn present(self) -> bool {
        self.0 & PRESENT != 0
    }
    /// Whether PS is set (a huge leaf at PD or PDPT level).
    pub const fn huge(self) -> bool {
        self.0 & HUGE != 0
    }
}

/// Access to page-table pages by physical address.
pub trait PhysMem {
    /// The 64-bit entry `index` of the table at physical address `table`.
    fn read(&self, table: u64, index: usize) -> u64;
    /// Writes the 64-bit entry `index` of the table at physical address `table`.
    fn write(&mut self, table: u64, index: usize, value: u64);
    /// Writes the run of leaves `first`, `first + step`, ... into entries
    /// `index..index + count` of `table` (`index + count` at most 512),
    /// stopping at the first entry already present: its index is the error,
    /// and nothing from it on is written. The builders map long runs of
    /// pages through it; an implementation may write the run in a tighter
    /// loop than `read`/`write` per entry (the guest's direct map does: each
    /// emulated instruction counts on software-KVM hosts).
    fn fill(
        &mut self,
        table: u64,
        index: usize,
        count: usize,
        first: u64,
        step: u64,
    ) -> Result<(), usize> {
        fill_checked(self, table, index..index + count, first, step)
    }
}

/// [`PhysMem::fill`]'s contract entry by entry over `entries` of `table`:
/// each one checked for presence, then written (`first`, `first + step`,
/// ...). The default `fill`, and what a faster one falls back to.
pub fn fill_checked<M: PhysMem + ?Sized>(
    mem: &mut M,
    table: u64,
    entries: core::ops::Range<usize>,
    first: u64,
    step: u64,
) -> Result<(), usize> {
    let mut value = first;
    for i in entries {
        if Pte(mem.read(table, i)).present() {
            return Err(i);
        }
        mem.write(table, i, value);
        value = value.wrapping_add(step);
    }
    Ok(())
}

/// Source of zeroed physical frames.
pub trait FrameSource {
    /// One zeroed 4 KiB frame.
    fn frame(&mut self) -> Option<u64>;
    /// Two contiguous zeroed frames, 8 KiB aligned (a PML4 or PDPT pair).
    fn pair(&mut self) -> Option<u64>;
}

/// Why a mapping could not be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapError {
    /// The frame source ran dry while creating a table.
    OutOfFrames,
    /// Something is already mapped there (a leaf, or a huge page in the way).
    AlreadyMapped(u64),
    /// The virtual address is not canonical.
    NotCanonical(u64),
    /// The virtual or physical address is not aligned to the page size.
    Misaligned(u64),
}

/// A translation found by a page-table walk (`paging::translate`,
/// `pae::translate`): the physical address and the
/// effective permissions (USER and WRITABLE only if every level allows them,
/// NO_EXECUTE if any level sets it; GLOBAL from the leaf).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Translation {
    /// Physical address `va` translates to (page offset included).
    pub phys: u64,
    /// Effective permissions and GLOBAL, in [`flags`] bits.
    pub flags: u64,
    /// Size of the leaf page in bytes.
    pub page_size: u64,
}

/// What one process maps in the user half.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserSpec {
    /// Physical start of the user programs' text (shared, read-only).
    pub text_phys: u64,
    /// Number of 4 KiB pages of user text from `text_phys`.
    pub text_pages: u64,
    /// Physical frames of this process's stack, lowest first.
    pub stack: [u64; USER_STACK_PAGES as usize],
}

impl UserSpec {
    /// The user half's 4 KiB leaves in both paging modes, as (virtual
    /// address, physical address, leaf flags): the text read-only and
    /// executable at `USER_TEXT_BASE`, the stack writable below
    /// `USER_STACK_TOP`, NX if `nx` is set (`flags::NO_EXECUTE`, or 0 where
    /// a PAE CPU has no NX).
    pub fn leaves(&self, nx: u64) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        use crate::layout::{USER_STACK_TOP, USER_TEXT_BASE};
        let text = (0..self.text_pages)
            .map(move |i| (USER_TEXT_BASE + i * 4096, self.text_phys + i * 4096, USER));
        let stack_base = USER_STACK_TOP - USER_STACK_PAGES * 4096;
        let stack = self
            .stack
            .iter()
            .enumerate()
            .map(move |(i, &f)| (stack_base + i as u64 * 4096, f, USER | WRITABLE | nx));
        text.chain(stack)
    }
}

/// The page tables a range goes into.
#[derive(Clone, Copy, Debug)]
pub enum Tables {
    /// The 4-level tree at this root (x86_64). Both copies of a PTI pair
    /// share the user half below the PML4, so the root may be either.
    FourLevel(u64),
    /// This x86_32 PAE PMD, which must cover the whole range (one GiB).
    PaePmd(u64),
}
