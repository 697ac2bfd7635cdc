//! Host-side page-table inspection: walks the guest's page tables straight
//! from guest memory and checks what the user copy maps.
//!
//! This is the host's own proof of isolation, independent of the guest's
//! word: the walker reads only guest RAM (through vm-memory, bounds-checked)
//! and the guest ELF's section headers. The page tables are guest-controlled
//! and treated as hostile: table addresses outside RAM are reported, and a
//! walk is bounded by the entries it reads ([`WalkLimits`]: count and time),
//! not by what it finds, because tables that share one table at every level
//! can make a walk read 512^4 entries while producing few mappings. A walk
//! that stopped early says so ([`Walk::incomplete`]) and its verdict is
//! "not verified", never ISOLATED. Address arithmetic is checked or done in
//! `u128`, so a mapping that ends at 2^64 is seen like any other.
//!
//! Size: two paging modes' walkers with their bounds, the isolation check and
//! the observer that runs it; about half of the file is tests (hostile
//! tables, both modes, the guest's own builders).
use std::fmt;
use std::ops::Range;
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress, GuestMemory};

use crate::x86::pte::{ADDR_MASK, GLOBAL, HUGE, NO_EXECUTE, PRESENT, USER, WRITABLE};

/// The paging modes the guest flavours use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Paging {
    /// x86_64 4-level paging (48-bit virtual addresses).
    FourLevel,
    /// x86_32 PAE paging: 4-entry PDPT, 2 MiB / 4 KiB pages.
    Pae,
}

impl Paging {
    /// First virtual address of the kernel half.
    pub fn kernel_half_start(self) -> u64 {
        match self {
            Paging::FourLevel => 0xffff_8000_0000_0000,
            Paging::Pae => 0xc000_0000,
        }
    }
}

/// Effective permissions of a mapping (combined over all levels, as the CPU does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Access {
    /// Writes allowed (R/W at every level).
    pub writable: bool,
    /// User-mode access allowed (U/S at every level).
    pub user: bool,
    /// No instruction fetch (XD at some level).
    pub no_execute: bool,
    /// Global (G on the leaf): survives CR3 writes in the TLB.
    pub global: bool,
}

impl Access {
    /// What the root grants before any entry restricts it.
    const ROOT: Access = Access {
        writable: true,
        user: true,
        no_execute: false,
        global: false,
    };
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}{}{}{}",
            if self.writable { 'W' } else { 'r' },
            if self.user { 'U' } else { 'k' },
            if self.no_execute { '-' } else { 'X' },
            if self.global { 'G' } else { '.' }
        )
    }
}

/// A virtually and physically contiguous run of pages with the same access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Mapping {
    /// First virtual address.
    pub virt: u64,
    /// Guest-physical address `virt` maps to.
    pub phys: u64,
    /// Length, bytes.
    pub size: u64,
    /// Effective permissions of every page in the run.
    pub access: Access,
}

impl Mapping {
    /// One past the last virtual byte, in `u128`: a mapping may end at 2^64.
    pub fn virt_end(&self) -> u128 {
        u128::from(self.virt) + u128::from(self.size)
    }
}

/// Result of one walk.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Walk {
    /// Present mappings, sorted by virtual address, coalesced.
    pub mappings: Vec<Mapping>,
    /// Page-table pages the tables point to but that are not in guest RAM.
    pub unreadable_tables: Vec<u64>,
    /// Why the walk stopped before reading every table (its entry or time
    /// budget ran out); `None` when it read them all.
    pub incomplete: Option<String>,
}

/// Errors starting a walk.
#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    /// The root table is not in guest memory.
    #[error("CR3 {cr3:#x} points outside guest memory")]
    RootOutsideMemory {
        /// The CR3 value given.
        cr3: u64,
    },
}

/// What one walk may cost at most. The guest's own tables need a few
/// thousand reads (a few dozen tables of 512 entries); the defaults bound
/// what a hostile guest can make the host do to well under a second of
/// reads, and the time limit bounds it on a slow or busy host too.
#[derive(Debug, Clone, Copy)]
pub struct WalkLimits {
    /// Page-table entries read (every level counts, present or not).
    pub max_entries_read: u64,
    /// Mappings recorded (after coalescing); bounds the walk's memory.
    pub max_mappings: usize,
    /// Wall-clock time.
    pub max_time: Duration,
}

impl Default for WalkLimits {
    fn default() -> Self {
        WalkLimits {
            max_entries_read: 1 << 21,
            max_mappings: 1 << 16,
            max_time: Duration::from_secs(2),
        }
    }
}

/// Under PAE, CR3 holds the PDPT's 32-byte-aligned address.
const PAE_CR3_MASK: u64 = 0xffff_ffe0;

/// Entries read between two looks at the clock (a read is tens of ns).
const CLOCK_EVERY: u64 = 4096;

/// Why a walk stopped early (internal: becomes [`Walk::incomplete`]).
struct GaveUp(String);

struct Walker<'a, M: GuestMemory> {
    mem: &'a M,
    cr3: u64,
    limits: WalkLimits,
    started: Instant,
    entries_read: u64,
    out: Walk,
}

impl<M: GuestMemory> Walker<'_, M> {
    /// Reads entry `index` of `table`, charging it to the walk's budget.
    /// `Ok(None)`: the table is not in guest RAM (recorded).
    fn read_entry(&mut self, table: u64, index: u64) -> Result<Option<u64>, GaveUp> {
        self.entries_read += 1;
        if self.entries_read > self.limits.max_entries_read {
            return Err(GaveUp(format!(
                "read {} page-table entries without finishing (tables shared between levels or looping?)",
                self.limits.max_entries_read
            )));
        }
        if self.entries_read.is_multiple_of(CLOCK_EVERY)
            && self.started.elapsed() > self.limits.max_time
        {
            return Err(GaveUp(format!(
                "still walking after {:?} ({} entries read)",
                self.limits.max_time, self.entries_read
            )));
        }
        // A table address comes from a guest entry: the index arithmetic is
        // checked, and an address that overflows is as unreadable as one
        // outside RAM.
        let value = table
            .checked_add(index * 8)
            .and_then(|addr| self.mem.read_obj::<u64>(GuestAddress(addr)).ok());
        if value.is_none() && !self.out.unreadable_tables.contains(&table) {
            self.out.unreadable_tables.push(table);
        }
        Ok(value)
    }

    fn leaf(&mut self, virt: u64, phys: u64, size: u64, access: Access) -> Result<(), GaveUp> {
        if let Some(last) = self.out.mappings.last_mut() {
            let contiguous = last.virt.checked_add(last.size) == Some(virt)
                && last.phys.checked_add(last.size) == Some(phys);
            if last.access == access && contiguous {
                if let Some(size) = last.size.checked_add(size) {
                    last.size = size;
                    return Ok(());
                }
            }
        }
        if self.out.mappings.len() >= self.limits.max_mappings {
            return Err(GaveUp(format!(
                "the tables map more than {} separate runs of pages",
                self.limits.max_mappings
            )));
        }
        self.out.mappings.push(Mapping {
            virt,
            phys,
            size,
            access,
        });
        Ok(())
    }

    /// Walks a table at `level` (4 = PML4 ... 1 = PT) covering virtual
    /// addresses from `base`, with the access accumulated from upper levels.
    /// `base + index * span` stays below 2^48 (4-level) or 2^32 (PAE), so
    /// it cannot overflow; the sign extension happens once, per mapping.
    fn table(&mut self, table: u64, level: u32, base: u64, up: Access) -> Result<(), GaveUp> {
        let span = 1u64 << (12 + 9 * (level - 1));
        for index in 0..512u64 {
            let Some(entry) = self.read_entry(table, index)? else {
                return Ok(());
            };
            if entry & PRESENT == 0 {
                continue;
            }
            let virt = canonical(base + index * span);
            let access = Access {
                writable: up.writable && entry & WRITABLE != 0,
                user: up.user && entry & USER != 0,
                no_execute: up.no_execute || entry & NO_EXECUTE != 0,
                global: entry & GLOBAL != 0,
            };
            let leaf = level == 1 || (entry & HUGE != 0 && (level == 2 || level == 3));
            if leaf {
                let phys = entry & ADDR_MASK & !(span - 1);
                self.leaf(virt, phys, span, access)?;
            } else if level > 1 {
                self.table(entry & ADDR_MASK, level - 1, base + index * span, access)?;
            }
        }
        Ok(())
    }

    /// PAE: a 4-entry PDPT (only P and cache bits), then PDs and PTs of 512 entries.
    fn pae(&mut self) -> Result<(), GaveUp> {
        let pdpt = self.cr3 & PAE_CR3_MASK;
        for index in 0..4u64 {
            let Some(entry) = self.read_entry(pdpt, index)? else {
                return Ok(());
            };
            if entry & PRESENT == 0 {
                continue;
            }
            self.table(entry & ADDR_MASK, 2, index << 30, Access::ROOT)?;
        }
        Ok(())
    }
}

/// Sign-extends a 48-bit virtual address.
fn canonical(virt: u64) -> u64 {
    if virt & (1 << 47) != 0 {
        virt | 0xffff_0000_0000_0000
    } else {
        virt
    }
}

/// Walks the page tables rooted at `cr3` within the default [`WalkLimits`].
pub fn walk<M: GuestMemory>(mem: &M, paging: Paging, cr3: u64) -> Result<Walk, WalkError> {
    walk_with_limits(mem, paging, cr3, WalkLimits::default())
}

/// Walks the page tables rooted at `cr3`. A walk that runs out of budget is
/// not an error: it returns what it found with [`Walk::incomplete`] set.
pub fn walk_with_limits<M: GuestMemory>(
    mem: &M,
    paging: Paging,
    cr3: u64,
    limits: WalkLimits,
) -> Result<Walk, WalkError> {
    let root = match paging {
        Paging::FourLevel => cr3 & ADDR_MASK,
        Paging::Pae => cr3 & PAE_CR3_MASK,
    };
    if mem.read_obj::<u64>(GuestAddress(root)).is_err() {
        return Err(WalkError::RootOutsideMemory { cr3 });
    }
    let mut walker = Walker {
        mem,
        cr3,
        limits,
        started: Instant::now(),
        entries_read: 0,
        out: Walk::default(),
    };
    let finished = match paging {
        Paging::FourLevel => walker.table(root, 4, 0, Access::ROOT),
        Paging::Pae => walker.pae(),
    };
    if let Err(GaveUp(why)) = finished {
        walker.out.incomplete = Some(why);
    }
    Ok(walker.out)
}

/// Kernel-half virtual ranges the user copy may map under PTI: the entry
/// area, as the guest ELF's section headers declare it.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct EntryArea {
    /// Each `.entry*` section: its name and virtual range.
    pub ranges: Vec<(String, Range<u64>)>,
}

/// Errors finding the entry area in the guest image.
#[derive(Debug, thiserror::Error)]
pub enum EntryAreaError {
    /// The image could not be parsed as ELF (the parser's message).
    #[error("the guest image is not an ELF object we can read: {0}")]
    Parse(String),
    /// The image has no `.entry*` section.
    #[error("the guest image has no `.entry*` sections, so its entry area is unknown")]
    NoEntrySections,
    /// A section's end overflows `u64` (its name).
    #[error("the guest image's section {0} ends past the top of the address space")]
    SectionPastTheTop(String),
}

impl EntryArea {
    /// The `.entry*` sections of the guest ELF (entry text, GDT/IDT/TSS,
    /// per-CPU entry stacks and data), page-rounded.
    pub fn from_elf(image: &[u8]) -> Result<Self, EntryAreaError> {
        use object::{Object, ObjectSection};
        let file = object::File::parse(image).map_err(|e| EntryAreaError::Parse(e.to_string()))?;
        let mut ranges = Vec::new();
        for section in file.sections() {
            let Ok(name) = section.name() else { continue };
            if !name.starts_with(".entry") || section.size() == 0 {
                continue;
            }
            let start = section.address() & !0xfff;
            let end = section
                .address()
                .checked_add(section.size())
                .and_then(|end| end.checked_next_multiple_of(0x1000))
                .ok_or_else(|| EntryAreaError::SectionPastTheTop(name.to_string()))?;
            ranges.push((name.to_string(), start..end));
        }
        if ranges.is_empty() {
            return Err(EntryAreaError::NoEntrySections);
        }
        Ok(EntryArea { ranges })
    }

    /// Whether every byte of `[start, end)` is inside some entry range (the
    /// ranges may be adjacent: a run may span several sections). `u128`, so
    /// a mapping ending at 2^64 is checked like any other; the loop takes at
    /// most one step per range.
    fn covers(&self, start: u64, end: u128) -> bool {
        let mut cursor = u128::from(start);
        while cursor < end {
            let next = self.ranges.iter().find_map(|(_, r)| {
                let (rs, re) = (u128::from(r.start), u128::from(r.end));
                (rs <= cursor && cursor < re).then_some(re)
            });
            match next {
                Some(re) => cursor = re,
                None => return false,
            }
        }
        true
    }

    /// The page-aligned text of the guest's Rust-side kernel->user CR3
    /// switch (`pti_switch=deferred`): the ELF symbols
    /// `__pti_deferred_start`/`__pti_deferred_end`, if the image has them.
    /// The user copy maps it only in that mode; walks classify it apart.
    pub fn deferred_switch_text(image: &[u8]) -> Option<Range<u64>> {
        use object::{Object, ObjectSymbol};
        let file = object::File::parse(image).ok()?;
        let find = |name: &str| {
            file.symbols()
                .find(|s| s.name() == Ok(name))
                .map(|s| s.address())
        };
        let (start, end) = (find("__pti_deferred_start")?, find("__pti_deferred_end")?);
        (start < end).then_some(start..end)
    }
}

/// What the user copy of an address space maps in the kernel half.
#[derive(Debug, Clone, serde::Serialize)]
pub struct IsolationCheck {
    /// Every kernel-half mapping of the user copy.
    pub kernel_mappings: Vec<Mapping>,
    /// Those that are not inside the entry area: must be empty under PTI.
    pub outside_entry_area: Vec<Mapping>,
    /// Bytes of kernel-half virtual memory the user copy maps.
    pub kernel_bytes_mapped: u64,
    /// Why the walk cannot prove isolation even though it found nothing
    /// outside the entry area: it stopped early, or some table is outside
    /// guest RAM. `None` when the walk read every table.
    pub not_verified: Option<String>,
    /// Mappings of the deferred CR3 switch's text (`pti_switch=deferred`):
    /// kernel text the user copy maps besides the entry area, by design of
    /// that strategy; listed apart, not in `outside_entry_area`.
    pub deferred_switch: Vec<Mapping>,
}

impl IsolationCheck {
    /// ISOLATED: the whole user copy was read and maps nothing of the
    /// kernel half outside the entry area.
    pub fn isolated(&self) -> bool {
        self.outside_entry_area.is_empty() && self.not_verified.is_none()
    }

    /// The one-line verdict of the report.
    pub fn verdict(&self) -> String {
        if !self.outside_entry_area.is_empty() {
            "NOT isolated".into()
        } else if let Some(why) = &self.not_verified {
            format!("NOT VERIFIED (the walk could not read the whole user copy: {why})")
        } else if !self.deferred_switch.is_empty() {
            let bytes = self
                .deferred_switch
                .iter()
                .fold(0u64, |sum, m| sum.saturating_add(m.size));
            format!(
                "ISOLATED apart from the deferred CR3 switch (pti_switch=deferred): \
                 {} KiB of kernel text at {} mapped besides the entry area",
                bytes >> 10,
                self.deferred_switch
                    .iter()
                    .map(|m| format!("{:#x}", m.virt))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else {
            "ISOLATED (only the entry area is mapped)".into()
        }
    }
}

/// Checks a walk of a user copy against the entry area.
pub fn check_isolation(user: &Walk, paging: Paging, entry: &EntryArea) -> IsolationCheck {
    check_isolation_with(user, paging, entry, None)
}

/// [`check_isolation`], with the deferred switch's text (if any) listed
/// apart: mappings wholly inside `deferred` go to `deferred_switch`.
pub fn check_isolation_with(
    user: &Walk,
    paging: Paging,
    entry: &EntryArea,
    deferred: Option<&Range<u64>>,
) -> IsolationCheck {
    let kernel_mappings: Vec<Mapping> = user
        .mappings
        .iter()
        .filter(|m| m.virt >= paging.kernel_half_start())
        .copied()
        .collect();
    let outside_entry_area: Vec<Mapping> = kernel_mappings
        .iter()
        .filter(|m| !entry.covers(m.virt, m.virt_end()))
        .copied()
        .collect();
    let kernel_bytes_mapped = kernel_mappings
        .iter()
        .fold(0u64, |sum, m| sum.saturating_add(m.size));
    let not_verified = match (&user.incomplete, user.unreadable_tables.first()) {
        (Some(why), _) => Some(why.clone()),
        (None, Some(table)) => Some(format!(
            "a page table at {table:#x} is outside guest RAM, so what it maps is unknown"
        )),
        (None, None) => None,
    };
    let inside = |m: &Mapping| {
        deferred.is_some_and(|d| d.start <= m.virt && m.virt.saturating_add(m.size) <= d.end)
    };
    let (deferred_switch, outside_entry_area): (Vec<Mapping>, Vec<Mapping>) =
        outside_entry_area.into_iter().partition(|m| inside(m));
    IsolationCheck {
        kernel_mappings,
        outside_entry_area,
        kernel_bytes_mapped,
        not_verified,
        deferred_switch,
    }
}

/// Human listing of a walk, one mapping a line.
pub fn render(walk: &Walk) -> String {
    let mut s = String::new();
    for m in &walk.mappings {
        s += &format!(
            "  {:#018x}-{:#018x} -> {:#012x}  {:>10}  {}\n",
            m.virt,
            m.virt_end(),
            m.phys,
            human_size(m.size),
            m.access
        );
    }
    for t in &walk.unreadable_tables {
        s += &format!("  (page table at {t:#x} is outside guest memory)\n");
    }
    if let Some(why) = &walk.incomplete {
        s += &format!("  (walk stopped early: {why})\n");
    }
    s
}

fn human_size(bytes: u64) -> String {
    if bytes >= 1 << 30 && bytes.is_multiple_of(1 << 30) {
        format!("{} GiB", bytes >> 30)
    } else if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 24)]).unwrap()
    }

    fn put(mem: &GuestMemoryMmap, table: u64, index: u64, value: u64) {
        mem.write_obj(value, GuestAddress(table + index * 8))
            .unwrap();
    }

    const P: u64 = PRESENT;
    const W: u64 = WRITABLE;
    const U: u64 = USER;

    #[test]
    fn four_level_user_and_kernel_mappings() {
        let m = mem();
        // PML4 at 0x1000; user PDPT 0x2000 -> PD 0x3000 -> PT 0x4000 mapping 2 pages at 0x400000.
        put(&m, 0x1000, 0, 0x2000 | P | W | U);
        put(&m, 0x2000, 0, 0x3000 | P | W | U);
        put(&m, 0x3000, 2, 0x4000 | P | W | U);
        put(&m, 0x4000, 0, 0x10_0000 | P | U);
        put(&m, 0x4000, 1, 0x10_1000 | P | U);
        // Kernel: PML4[511] -> PDPT 0x5000, [510] -> PD 0x6000, 2 MiB page, global, NX.
        put(&m, 0x1000, 511, 0x5000 | P | W);
        put(&m, 0x5000, 510, 0x6000 | P | W);
        put(&m, 0x6000, 0, HUGE | GLOBAL | NO_EXECUTE | P | W);
        let w = walk(&m, Paging::FourLevel, 0x1000).unwrap();
        assert_eq!(w.mappings.len(), 2, "{w:?}");
        let user = w.mappings[0];
        assert_eq!(
            (user.virt, user.phys, user.size),
            (0x40_0000, 0x10_0000, 0x2000)
        );
        assert!(user.access.user && !user.access.writable);
        let kernel = w.mappings[1];
        assert_eq!(kernel.virt, 0xffff_ffff_8000_0000);
        assert_eq!(kernel.size, 2 << 20);
        assert!(!kernel.access.user && kernel.access.global && kernel.access.no_execute);
    }

    #[test]
    fn isolation_check_flags_kernel_pages_outside_the_entry_area() {
        let m = mem();
        put(&m, 0x1000, 511, 0x5000 | P | W);
        put(&m, 0x5000, 510, 0x6000 | P | W);
        put(&m, 0x6000, 1, 0x7000 | P | W);
        put(&m, 0x7000, 0, 0x20_0000 | P | GLOBAL); // entry text page
        put(&m, 0x7000, 5, 0x20_5000 | P | W); // some other kernel page
        let w = walk(&m, Paging::FourLevel, 0x1000).unwrap();
        let base = 0xffff_ffff_8020_0000u64;
        let entry = EntryArea {
            ranges: vec![(".entry.text".into(), base..base + 0x1000)],
        };
        let check = check_isolation(&w, Paging::FourLevel, &entry);
        assert_eq!(check.kernel_mappings.len(), 2);
        assert_eq!(check.outside_entry_area.len(), 1);
        assert_eq!(check.outside_entry_area[0].virt, base + 0x5000);
        assert!(!check.isolated());
    }

    #[test]
    fn pae_walk_and_hostile_tables() {
        let m = mem();
        // PDPT at 0x1020 (32-byte aligned): entry 3 (3G..4G) -> PD 0x2000 with a 2 MiB page.
        put(&m, 0x1020, 3, 0x2000 | P);
        put(&m, 0x2000, 0, 0x100_0000 | HUGE | P | W);
        let w = walk(&m, Paging::Pae, 0x1020).unwrap();
        assert_eq!(w.mappings[0].virt, 0xc000_0000);
        assert_eq!(w.mappings[0].size, 2 << 20);

        // A table pointing outside RAM is reported, not fatal.
        put(&m, 0x3000, 0, 0xdead_0000_0000 | P);
        let w = walk(&m, Paging::FourLevel, 0x3000).unwrap();
        assert!(w.mappings.is_empty());
        assert_eq!(w.unreadable_tables.len(), 1);

        // CR3 outside RAM is an error.
        assert!(matches!(
            walk(&m, Paging::FourLevel, 0x7fff_0000_0000),
            Err(WalkError::RootOutsideMemory { .. })
        ));

        // A self-referencing PML4 (every entry points to itself) terminates.
        for i in 0..512 {
            put(&m, 0x8000, i, 0x8000 | P | W | U);
        }
        let w = walk(&m, Paging::FourLevel, 0x8000).unwrap();
        assert!(w.incomplete.is_some(), "{w:?}");
    }

    fn entry_area_at(base: u64, size: u64) -> EntryArea {
        EntryArea {
            ranges: vec![(".entry.text".into(), base..base + size)],
        }
    }

    /// Every entry of a level points to the same next table (one table
    /// shared per level), and the last level maps one page: 2^36 entries to
    /// read for 2^27 leaves of the same page. Counting leaves let this run
    /// for minutes; the walk must stop on its read budget, fast, and the
    /// verdict must be "not verified".
    #[test]
    fn tables_shared_at_every_level_end_fast_and_are_not_verified() {
        let m = mem();
        let (pml4, pdpt, pd, pt) = (0xa000, 0xb000, 0xc000, 0xd000);
        // Only the kernel half, so every mapping found is a kernel one.
        for i in 256..512 {
            put(&m, pml4, i, pdpt | P | W | U);
        }
        for i in 0..512 {
            put(&m, pdpt, i, pd | P | W | U);
            put(&m, pd, i, pt | P | W | U);
        }
        put(&m, pt, 0, 0x20_0000 | P | U);
        let started = Instant::now();
        let w = walk(&m, Paging::FourLevel, 0xa000).unwrap();
        let took = started.elapsed();
        assert!(took < Duration::from_secs(3), "took {took:?}");
        let why = w.incomplete.as_deref().expect("the walk gave up");
        assert!(why.contains("entries"), "{why}");
        // Even with an entry area covering every mapping found, the verdict
        // is not ISOLATED: the walk did not read everything.
        let entry = entry_area_at(0xffff_8000_0000_0000, 0x7fff_ffff_f000);
        let check = check_isolation(&w, Paging::FourLevel, &entry);
        assert!(check.outside_entry_area.is_empty());
        assert!(!check.isolated());
        assert!(
            check.verdict().starts_with("NOT VERIFIED"),
            "{}",
            check.verdict()
        );

        // The time bound alone stops it too.
        let limits = WalkLimits {
            max_entries_read: u64::MAX,
            max_time: Duration::from_millis(50),
            ..WalkLimits::default()
        };
        let started = Instant::now();
        let w = walk_with_limits(&m, Paging::FourLevel, 0xa000, limits).unwrap();
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(w.incomplete.as_deref().unwrap().contains("still walking"));
    }

    /// A 4 KiB kernel page at the very top of the address space, ending at
    /// 2^64, outside the entry area: it is seen, and the verdict is NOT
    /// isolated (the sum `virt + size` used to wrap to 0 and skip it).
    #[test]
    fn a_mapping_at_the_top_of_the_address_space_is_seen() {
        let m = mem();
        put(&m, 0x1000, 511, 0x2000 | P | W);
        put(&m, 0x2000, 511, 0x3000 | P | W);
        put(&m, 0x3000, 511, 0x4000 | P | W);
        put(&m, 0x4000, 511, 0x50_0000 | P | W);
        let w = walk(&m, Paging::FourLevel, 0x1000).unwrap();
        assert_eq!(w.mappings.len(), 1);
        let top = w.mappings[0];
        assert_eq!((top.virt, top.size), (0xffff_ffff_ffff_f000, 0x1000));
        assert_eq!(top.virt_end(), 1u128 << 64);
        let entry = entry_area_at(0xffff_ffff_8000_0000, 0x1000);
        let check = check_isolation(&w, Paging::FourLevel, &entry);
        assert_eq!(check.outside_entry_area, vec![top]);
        assert_eq!(check.verdict(), "NOT isolated");
        assert!(render(&w).contains("0x10000000000000000"), "{}", render(&w));

        // A 1 GiB page at the top, with the entry area covering its first
        // 4 KiB only: the rest is outside. Covering it in two adjacent
        // sections up to 2^64 minus one page still leaves the last page out.
        put(&m, 0x2000, 511, HUGE | 0x4000_0000 | P | W);
        let w = walk(&m, Paging::FourLevel, 0x1000).unwrap();
        let top = w.mappings[0];
        assert_eq!((top.virt, top.size), (0xffff_ffff_c000_0000, 1 << 30));
        let check = check_isolation(&w, Paging::FourLevel, &entry_area_at(top.virt, 0x1000));
        assert!(!check.isolated());
        let last_page = !0xfffu64;
        let nearly = EntryArea {
            ranges: vec![
                (".entry.a".into(), top.virt..top.virt + 0x1000),
                (".entry.b".into(), top.virt + 0x1000..last_page),
            ],
        };
        assert!(!check_isolation(&w, Paging::FourLevel, &nearly).isolated());
    }

    /// A table outside guest RAM in the user copy: reported, and the
    /// verdict is not ISOLATED because what it maps is unknown.
    #[test]
    fn a_table_outside_ram_makes_the_verdict_not_verified() {
        let m = mem();
        put(&m, 0x1000, 511, 0x7fff_0000_0000 | P | W);
        let w = walk(&m, Paging::FourLevel, 0x1000).unwrap();
        assert_eq!(w.unreadable_tables, vec![0x7fff_0000_0000]);
        let check = check_isolation(
            &w,
            Paging::FourLevel,
            &entry_area_at(0xffff_ffff_8000_0000, 0x1000),
        );
        assert!(check.outside_entry_area.is_empty());
        assert!(!check.isolated());
        assert!(
            check.verdict().contains("outside guest RAM"),
            "{}",
            check.verdict()
        );
    }

    /// Guest memory as guest-core's builders see it.
    struct BuilderMem<'a>(&'a GuestMemoryMmap);

    impl guest_core::paging::PhysMem for BuilderMem<'_> {
        fn read(&self, table: u64, index: usize) -> u64 {
            self.0
                .read_obj(GuestAddress(table + index as u64 * 8))
                .unwrap()
        }
        fn write(&mut self, table: u64, index: usize, value: u64) {
            self.0
                .write_obj(value, GuestAddress(table + index as u64 * 8))
                .unwrap()
        }
    }

    /// Zeroed frames from 8 MiB up (fresh guest memory is zero).
    struct BuilderFrames(u64);

    impl guest_core::paging::FrameSource for BuilderFrames {
        fn frame(&mut self) -> Option<u64> {
            self.0 += 4096;
            Some(self.0 - 4096)
        }
        fn pair(&mut self) -> Option<u64> {
            self.0 = self.0.next_multiple_of(8192) + 8192;
            Some(self.0 - 8192)
        }
    }

    const ENTRY: (u64, u64) = (0x10a000, 0x10e000);
    const ENTRY_TEXT_END: u64 = 0x10b000;

    fn user_spec() -> guest_core::paging::UserSpec {
        guest_core::paging::UserSpec {
            text_phys: 0x200000,
            text_pages: 1,
            stack: [0x300000, 0x301000],
        }
    }

    /// The x86_64 guest's own builder, walked by the host: with PTI the user
    /// copy holds the entry area only; without, the whole direct map.
    #[test]
    fn host_walk_of_the_guests_own_4_level_tables() {
        use guest_core::layout::KERNEL_BASE;
        for pti in [true, false] {
            let m = mem();
            let mut frames = BuilderFrames(8 << 20);
            let spec = guest_core::paging::KernelSpec {
                pti,
                entry_area: ENTRY,
                entry_text_end: ENTRY_TEXT_END,
                telemetry: 0x7f000,
                direct_map: 8 << 20,
                deferred_text: (0, 0),
            };
            let half =
                guest_core::paging::build_kernel_half(&mut BuilderMem(&m), &mut frames, &spec)
                    .unwrap();
            let pair = guest_core::paging::build_address_space(
                &mut BuilderMem(&m),
                &mut frames,
                &half,
                &user_spec(),
            )
            .unwrap();
            let entry = EntryArea {
                ranges: vec![(
                    ".entry".into(),
                    KERNEL_BASE + ENTRY.0..KERNEL_BASE + ENTRY.1,
                )],
            };
            let user_cr3 = if pti { pair + 4096 } else { pair };
            let user = walk(&m, Paging::FourLevel, user_cr3).unwrap();
            let check = check_isolation(&user, Paging::FourLevel, &entry);
            assert_eq!(check.isolated(), pti, "pti={pti}: {}", render(&user));
            if pti {
                assert_eq!(check.kernel_bytes_mapped, ENTRY.1 - ENTRY.0);
                let kernel = walk(&m, Paging::FourLevel, pair).unwrap();
                assert!(kernel
                    .mappings
                    .iter()
                    .filter(|m| m.virt < Paging::FourLevel.kernel_half_start())
                    .all(|m| m.access.no_execute));
            }
        }
    }

    /// The same for the PAE flavour's builder, which the host walker cannot
    /// see live here (this KVM refuses 32-bit paging): PTI isolates, global
    /// text adds the kernel text to the user copy (v6 of the 2018 series),
    /// and without PTI the user copy is the kernel's.
    #[test]
    fn host_walk_of_the_guests_own_pae_tables() {
        use guest_core::pae::{build_address_space, build_kernel_half, layout, KernelSpec};
        for (pti, global_text) in [(true, false), (true, true), (false, false)] {
            let m = mem();
            let mut frames = BuilderFrames(8 << 20);
            let text = (0x10e000, 0x118000);
            let spec = KernelSpec {
                pti,
                entry_area: ENTRY,
                entry_text_end: ENTRY_TEXT_END,
                text,
                global_text,
                nx: true,
                telemetry: 0x7f000,
                direct_map: 8 << 20,
                deferred_text: (0, 0),
            };
            let half = build_kernel_half(&mut BuilderMem(&m), &mut frames, &spec).unwrap();
            let pair =
                build_address_space(&mut BuilderMem(&m), &mut frames, &half, &user_spec(), true)
                    .unwrap();
            let base = layout::KERNEL_BASE;
            let entry = EntryArea {
                ranges: vec![(".entry".into(), base + ENTRY.0..base + ENTRY.1)],
            };
            let user_cr3 = if pti { pair + 4096 } else { pair };
            let user = walk(&m, Paging::Pae, user_cr3).unwrap();
            let check = check_isolation(&user, Paging::Pae, &entry);
            let what = format!("pti={pti} global_text={global_text}");
            assert_eq!(
                check.isolated(),
                pti && !global_text,
                "{what}: {}",
                render(&user)
            );
            if pti && global_text {
                // Exactly the text is added, and it is global.
                assert_eq!(
                    check.kernel_bytes_mapped,
                    (ENTRY.1 - ENTRY.0) + (text.1 - text.0),
                    "{what}"
                );
                assert!(check.outside_entry_area.iter().all(|m| m.access.global
                    && m.virt >= base + text.0
                    && m.virt + m.size <= base + text.1));
            }
            // The user program is mapped, user-accessible, in both copies.
            assert!(user
                .mappings
                .iter()
                .any(|m| m.virt == layout::USER_TEXT_BASE && m.access.user));
        }
    }
}

/// What `ptiscope pagetables` found: both copies of the workload process's
/// address space, walked at its phase-begin exit, and the isolation verdict.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Inspection {
    /// Paging mode the tables were walked in.
    pub paging: Paging,
    /// CR3 of the vCPU at the exit (the kernel copy: the guest is in the
    /// syscall that wrote the marker).
    pub kernel_cr3: u64,
    /// The user copy's CR3 (kernel copy + 4 KiB, CR3 bit 12) when the guest
    /// runs with PTI; `None` when user code runs on the kernel copy.
    pub user_cr3: Option<u64>,
    /// The kernel copy's mappings.
    pub kernel: Walk,
    /// The table user code runs on: the user copy with PTI, else the kernel copy.
    pub user: Walk,
    /// The entry area the user copy may map.
    pub entry_area: EntryArea,
    /// The isolation verdict of the `user` walk.
    pub isolation: IsolationCheck,
}

/// A [`crate::machine::PhaseObserver`] that walks the page tables at the first
/// phase-begin marker.
pub struct Inspector {
    paging: Paging,
    entry_area: EntryArea,
    deferred_text: Option<Range<u64>>,
    /// The inspection once made; `Err` says why it failed.
    pub result: Option<Result<Inspection, String>>,
}

impl Inspector {
    /// An inspector for a guest in `paging` mode, with the entry area from its image.
    pub fn new(paging: Paging, entry_area: EntryArea) -> Self {
        Inspector {
            paging,
            entry_area,
            deferred_text: None,
            result: None,
        }
    }

    /// Lists mappings of the deferred CR3 switch's text apart (see
    /// [`EntryArea::deferred_switch_text`]).
    pub fn with_deferred_text(mut self, range: Option<Range<u64>>) -> Self {
        self.deferred_text = range;
        self
    }

    fn inspect(&self, ctx: &crate::machine::VmContext<'_>) -> Result<Inspection, String> {
        let cr3 = ctx
            .vcpu
            .get_sregs()
            .map_err(|e| format!("KVM_GET_SREGS: {e}"))?
            .cr3;
        // Whether the guest runs with PTI is its own word (telemetry flags);
        // what the user copy maps is then the host's own finding.
        let telemetry = crate::observe::telemetry::TelemetryReader::new(
            ctx.mem,
            GuestAddress(ctx.layout.telemetry_addr()),
        )
        .and_then(|r| r.snapshot())
        .map_err(|e| format!("guest telemetry: {e}"))?;
        let pti = telemetry.has_flag(ptiscope_abi::telemetry::flags::PTI);
        let kernel_cr3 = cr3 & !0x1000;
        let user_cr3 = pti.then_some(cr3 | 0x1000);
        let kernel = walk(ctx.mem, self.paging, kernel_cr3).map_err(|e| e.to_string())?;
        let user = match user_cr3 {
            Some(u) => walk(ctx.mem, self.paging, u).map_err(|e| e.to_string())?,
            None => kernel.clone(),
        };
        let isolation = check_isolation_with(
            &user,
            self.paging,
            &self.entry_area,
            self.deferred_text.as_ref(),
        );
        Ok(Inspection {
            paging: self.paging,
            kernel_cr3,
            user_cr3,
            kernel,
            user,
            entry_area: self.entry_area.clone(),
            isolation,
        })
    }
}

impl crate::machine::PhaseObserver for Inspector {
    fn on_phase(
        &mut self,
        marker: ptiscope_abi::phase::Marker,
        ctx: &crate::machine::VmContext<'_>,
    ) {
        if marker.edge == ptiscope_abi::phase::Edge::Begin && self.result.is_none() {
            self.result = Some(self.inspect(ctx));
        }
    }
}

impl Inspection {
    /// The human report: the user copy's mappings in full, the kernel copy's
    /// summarised, and the verdict.
    pub fn render(&self) -> String {
        let half = self.paging.kernel_half_start();
        let mut s = String::new();
        match self.user_cr3 {
            Some(u) => {
                s += &format!(
                    "PTI: user copy at CR3 {u:#x}, kernel copy at CR3 {:#x}\n",
                    self.kernel_cr3
                )
            }
            None => {
                s += &format!(
                    "no PTI: user code runs on the kernel's table, CR3 {:#x}\n",
                    self.kernel_cr3
                )
            }
        }
        s += "\nuser copy (what user mode can reach through the page tables):\n";
        s += &render(&self.user);
        let kernel_bytes = self
            .kernel
            .mappings
            .iter()
            .filter(|m| m.virt >= half)
            .fold(0u64, |sum, m| sum.saturating_add(m.size));
        s += &format!(
            "\nkernel copy: {} mappings, {} MiB of kernel half mapped\n",
            self.kernel.mappings.len(),
            kernel_bytes >> 20
        );
        if let Some(why) = &self.kernel.incomplete {
            s += &format!("  (kernel copy walk stopped early: {why})\n");
        }
        s += "\nentry area (from the ELF's .entry* sections):\n";
        for (name, r) in &self.entry_area.ranges {
            s += &format!("  {:#018x}-{:#018x}  {name}\n", r.start, r.end);
        }
        let i = &self.isolation;
        s += &format!(
            "\nverdict: the user copy maps {} KiB of the kernel half, {} mapping(s) outside the entry area: {}\n",
            i.kernel_bytes_mapped >> 10,
            i.outside_entry_area.len(),
            i.verdict()
        );
        s
    }
}
