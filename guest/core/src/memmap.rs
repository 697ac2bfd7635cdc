//! The E820 memory map (as PVH's `hvm_memmap_table_entry`) and a physical
//! frame allocator over its RAM.
//!
//! The allocator is a bump allocator that never frees: the guest runs one
//! experiment and stops, so reuse buys nothing, and handing out only frames
//! never touched before means they are still zero as the VMM (fresh anonymous
//! memory) and QEMU hand them over. Zeroing 4 KiB costs ~1000 emulated
//! instructions on kvm_pvm (software KVM), so page tables are not zeroed again.

/// E820 type of usable RAM.
pub const E820_RAM: u32 = 1;
/// E820 type of reserved memory (the telemetry page is reserved this way).
pub const E820_RESERVED: u32 = 2;
/// Size of a page frame.
pub const FRAME_SIZE: u64 = 4096;
/// Most RAM regions the allocator keeps track of.
pub const MAX_REGIONS: usize = 16;

/// One memory-map entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemRegion {
    /// Physical start address.
    pub base: u64,
    /// Length, bytes.
    pub size: u64,
    /// E820 type (1 = RAM, 2 = reserved, ...).
    pub kind: u32,
}

impl MemRegion {
    /// First byte past the region (saturating at `u64::MAX`).
    pub const fn end(&self) -> u64 {
        self.base.saturating_add(self.size)
    }
    /// Short name of the E820 type ("ram", "reserved", "acpi", ...).
    pub const fn kind_name(&self) -> &'static str {
        match self.kind {
            E820_RAM => "ram",
            E820_RESERVED => "reserved",
            3 => "acpi",
            4 => "nvs",
            5 => "unusable",
            _ => "other",
        }
    }
}

const fn align_up(v: u64, a: u64) -> u64 {
    match v.checked_add(a - 1) {
        Some(x) => x & !(a - 1),
        None => !(a - 1),
    }
}

/// Bump allocator of physical frames over RAM regions.
#[derive(Debug, Clone)]
pub struct FrameAllocator {
    /// Usable ranges `[start, end)`, page-aligned, sorted, non-overlapping.
    ranges: [(u64, u64); MAX_REGIONS],
    count: usize,
    /// Index of the range being used and the next free address in it.
    current: usize,
    next: u64,
    allocated: u64,
}

impl FrameAllocator {
    /// An allocator with no memory (every allocation fails).
    pub const EMPTY: FrameAllocator = FrameAllocator {
        ranges: [(0, 0); MAX_REGIONS],
        count: 0,
        current: 0,
        next: 0,
        allocated: 0,
    };

    /// Builds the allocator from a memory map: RAM regions, clipped to
    /// `[floor, ceiling)` (e.g. above the kernel image, below the end of the
    /// direct map), minus any non-RAM region overlapping them. Regions beyond
    /// [`MAX_REGIONS`] are ignored.
    pub fn new(map: &[MemRegion], floor: u64, ceiling: u64) -> Self {
        let mut a = Self::EMPTY;
        a.rebuild(map, None, floor, ceiling);
        a
    }

    /// [`FrameAllocator::new`] in place, with `extra` (e.g. a page the
    /// map does not list) excluded as if the map reserved it: the guest
    /// builds its allocator in a static at boot, where each instruction is
    /// emulated on software-KVM hosts, so nothing is copied (neither the
    /// map nor the allocator) and the loops are plain ones over the map.
    pub fn rebuild(
        &mut self,
        map: &[MemRegion],
        extra: Option<MemRegion>,
        floor: u64,
        ceiling: u64,
    ) {
        // Only `ranges[..count]` is ever read: the rest need not be cleared.
        self.count = 0;
        self.current = 0;
        self.next = 0;
        self.allocated = 0;
        // A reserved region overlapping RAM wins (maps can overlap).
        let clip = |o: &MemRegion, start: &mut u64, end: &mut u64| {
            let o_end = o.end();
            // Most do not touch the RAM region at all: two compares. (A
            // range already empty stays empty: start only grows, end only
            // shrinks.)
            if o.base >= *end || o_end <= *start {
                return;
            }
            if o.base <= *start {
                *start = align_up(o_end, FRAME_SIZE);
            }
            if o_end >= *end {
                *end = o.base & !(FRAME_SIZE - 1);
            }
        };
        for r in map {
            if r.kind != E820_RAM {
                continue;
            }
            let mut start = align_up(r.base.max(floor), FRAME_SIZE);
            let mut end = r.end().min(ceiling) & !(FRAME_SIZE - 1);
            for o in map {
                if o.kind != E820_RAM {
                    clip(o, &mut start, &mut end);
                }
            }
            if let Some(o) = &extra {
                clip(o, &mut start, &mut end);
            }
            if start < end && self.count < MAX_REGIONS {
                self.ranges[self.count] = (start, end);
                self.count += 1;
            }
        }
        // Insertion sort: the map is tiny and need not be sorted.
        for i in 1..self.count {
            let mut j = i;
            while j > 0 && self.ranges[j - 1].0 > self.ranges[j].0 {
                self.ranges.swap(j - 1, j);
                j -= 1;
            }
        }
        if self.count > 0 {
            self.next = self.ranges[0].0;
        }
    }

    /// Allocates `count` contiguous frames aligned to `align` bytes (a power
    /// of two, at least [`FRAME_SIZE`]). Frames skipped for alignment are lost.
    pub fn alloc_contiguous(&mut self, count: u64, align: u64) -> Option<u64> {
        if !align.is_power_of_two() || count == 0 {
            return None;
        }
        let align = align.max(FRAME_SIZE);
        let bytes = count.checked_mul(FRAME_SIZE)?;
        // First fit from the current range on. A request that fits only in a
        // later range moves there (the rest of the earlier ones is given up:
        // bump allocation); one that fits nowhere changes nothing.
        for i in self.current..self.count {
            let (first, end) = self.ranges[i];
            let from = if i == self.current { self.next } else { first };
            let start = align_up(from, align);
            if start < end && end - start >= bytes {
                self.current = i;
                self.next = start + bytes;
                self.allocated += count;
                return Some(start);
            }
        }
        None
    }

    /// Allocates one frame. The common case, a frame left in the current
    /// range (`next` is always frame aligned), is a few instructions: the
    /// guest's page tables come from here and each instruction is emulated
    /// on software-KVM hosts.
    pub fn alloc(&mut self) -> Option<u64> {
        if self.current < self.count {
            let end = self.ranges[self.current].1;
            if end.saturating_sub(self.next) >= FRAME_SIZE {
                let frame = self.next;
                self.next += FRAME_SIZE;
                self.allocated += 1;
                return Some(frame);
            }
        }
        self.alloc_contiguous(1, FRAME_SIZE)
    }

    /// Frames handed out so far.
    pub fn allocated(&self) -> u64 {
        self.allocated
    }

    /// Bytes still available (ignoring alignment losses).
    pub fn free_bytes(&self) -> u64 {
        let mut total = 0;
        for i in self.current..self.count {
            let (start, end) = self.ranges[i];
            let from = if i == self.current { self.next } else { start };
            total += end.saturating_sub(from);
        }
        total
    }

    /// The usable ranges the allocator was built with.
    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges[..self.count]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ram(base: u64, size: u64) -> MemRegion {
        MemRegion {
            base,
            size,
            kind: E820_RAM,
        }
    }

    /// The map our VMM writes for 128 MiB: low RAM, high RAM up to the
    /// telemetry page, which is reserved.
    fn vmm_map() -> [MemRegion; 3] {
        let mem = 128 << 20;
        [
            ram(0, 640 << 10),
            ram(1 << 20, mem - (1 << 20) - 4096),
            MemRegion {
                base: mem - 4096,
                size: 4096,
                kind: E820_RESERVED,
            },
        ]
    }

    /// The allocator's ranges are those of the straightforward
    /// formulation (every non-RAM region tested against every RAM one) on
    /// random maps of overlapping regions.
    #[test]
    fn ranges_match_the_plain_formulation() {
        fn plain(map: &[MemRegion], floor: u64, ceiling: u64) -> std::vec::Vec<(u64, u64)> {
            let mut out = std::vec::Vec::new();
            for r in map.iter().filter(|r| r.kind == E820_RAM) {
                let mut start = align_up(r.base.max(floor), FRAME_SIZE);
                let mut end = r.end().min(ceiling) & !(FRAME_SIZE - 1);
                for o in map.iter().filter(|o| o.kind != E820_RAM) {
                    if o.base <= start && o.end() > start {
                        start = align_up(o.end(), FRAME_SIZE);
                    }
                    if o.base < end && o.end() >= end {
                        end = o.base & !(FRAME_SIZE - 1);
                    }
                }
                if start < end && out.len() < MAX_REGIONS {
                    out.push((start, end));
                }
            }
            out.sort_by_key(|r| r.0);
            out
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        for _ in 0..20000 {
            let map: std::vec::Vec<MemRegion> = (0..1 + next(6))
                .map(|_| MemRegion {
                    base: next(64) * 0x800,
                    size: next(64) * 0x800,
                    kind: if next(2) == 0 {
                        E820_RAM
                    } else {
                        1 + next(4) as u32
                    },
                })
                .collect();
            let (floor, ceiling) = (next(16) * 0x1000, next(40) * 0x1000);
            let a = FrameAllocator::new(&map, floor, ceiling);
            assert_eq!(
                a.ranges(),
                &plain(&map, floor, ceiling)[..],
                "{map:?} {floor:#x} {ceiling:#x}"
            );
        }
    }

    /// An extra reserved region excludes what it would in the map, and a
    /// rebuild forgets what the allocator held.
    #[test]
    fn rebuild_with_extra_equals_new_with_it_in_the_map() {
        let map = vmm_map();
        let telemetry = MemRegion {
            base: 64 << 20,
            size: 4096,
            kind: E820_RESERVED,
        };
        let mut with = std::vec::Vec::from(map);
        with.push(telemetry);
        let expected = FrameAllocator::new(&with, 0x13d000, 1 << 30);
        let mut a = FrameAllocator::new(&map, 0, 1 << 30);
        a.alloc().unwrap();
        a.rebuild(&map, Some(telemetry), 0x13d000, 1 << 30);
        assert_eq!(a.ranges(), expected.ranges());
        assert_eq!(a.allocated(), 0);
        assert_eq!(a.free_bytes(), expected.free_bytes());
        assert_eq!(a.alloc(), Some(0x13d000));
        assert_eq!(FrameAllocator::EMPTY.clone().alloc(), None);
    }

    #[test]
    fn allocates_above_floor_in_order() {
        let mut a = FrameAllocator::new(&vmm_map(), 0x12_3456, 1 << 30);
        assert_eq!(a.ranges(), &[(0x12_4000, (128 << 20) - 4096)]);
        assert_eq!(a.alloc(), Some(0x12_4000));
        assert_eq!(a.alloc(), Some(0x12_5000));
        assert_eq!(a.allocated(), 2);
    }

    #[test]
    fn aligned_pairs_for_pti() {
        let mut a = FrameAllocator::new(&vmm_map(), 0x12_3000, 1 << 30);
        let pair = a.alloc_contiguous(2, 8192).unwrap();
        assert_eq!(pair % 8192, 0);
        assert_eq!(pair, 0x12_4000);
        assert_eq!(a.alloc(), Some(0x12_6000));
        let pair2 = a.alloc_contiguous(2, 8192).unwrap();
        assert_eq!(pair2, 0x12_8000, "0x127000 is skipped for alignment");
    }

    #[test]
    fn never_hands_out_reserved_or_beyond_ceiling() {
        let map = vmm_map();
        let mut a = FrameAllocator::new(&map, 1 << 20, 1 << 30);
        let mut last = 0;
        while let Some(f) = a.alloc() {
            last = f;
        }
        assert_eq!(
            last,
            (128 << 20) - 8192,
            "last frame is just below the telemetry page"
        );
        assert_eq!(a.free_bytes(), 0);
        let mut b = FrameAllocator::new(&map, 1 << 20, 2 << 20);
        assert_eq!(b.free_bytes(), 1 << 20);
        assert_eq!(b.alloc_contiguous(257, 4096), None);
        assert_eq!(b.alloc_contiguous(256, 4096), Some(1 << 20));
    }

    #[test]
    fn overlapping_reserved_region_is_cut_out_and_ranges_sorted() {
        let map = [
            ram(16 << 20, 16 << 20),
            MemRegion {
                base: 0,
                size: 2 << 20,
                kind: E820_RESERVED,
            },
            ram(0, 8 << 20),
        ];
        let a = FrameAllocator::new(&map, 0, u64::MAX);
        assert_eq!(a.ranges(), &[(2 << 20, 8 << 20), (16 << 20, 32 << 20)]);
    }

    #[test]
    fn moves_to_the_next_range_when_one_is_full() {
        let map = [ram(0x10_0000, 0x3000), ram(0x20_0000, 0x4000)];
        let mut a = FrameAllocator::new(&map, 0, u64::MAX);
        assert_eq!(a.alloc_contiguous(2, 8192), Some(0x10_0000));
        // One frame left in range 0, but a pair does not fit: range 1.
        assert_eq!(a.alloc_contiguous(2, 8192), Some(0x20_0000));
        assert_eq!(a.alloc_contiguous(0, 4096), None);
        assert_eq!(
            a.alloc_contiguous(1, 3000),
            None,
            "alignment not a power of two"
        );
    }

    #[test]
    fn alloc_fast_path_equals_the_general_one() {
        // Ranges of odd sizes, pairs in between: `alloc` hands out what
        // `alloc_contiguous(1, FRAME_SIZE)` does, to the last frame.
        let map = [
            ram(0x10_0000, 0x3000),
            ram(0x20_1000, 0x5000),
            ram(0x40_0000, 0x1000),
        ];
        let (mut a, mut b) = (
            FrameAllocator::new(&map, 0, u64::MAX),
            FrameAllocator::new(&map, 0, u64::MAX),
        );
        for i in 0..12 {
            if i % 4 == 1 {
                assert_eq!(a.alloc_contiguous(2, 8192), b.alloc_contiguous(2, 8192));
            }
            assert_eq!(a.alloc(), b.alloc_contiguous(1, FRAME_SIZE), "frame {i}");
            assert_eq!(a.allocated(), b.allocated());
            assert_eq!(a.free_bytes(), b.free_bytes());
        }
        assert_eq!(a.alloc(), None);
    }

    #[test]
    fn empty_and_garbage_maps() {
        let mut a = FrameAllocator::new(&[], 0, u64::MAX);
        assert_eq!(a.alloc(), None);
        let weird = [MemRegion {
            base: u64::MAX - 10,
            size: 100,
            kind: E820_RAM,
        }];
        let mut b = FrameAllocator::new(&weird, 0, u64::MAX);
        assert_eq!(b.alloc(), None);
    }
}
