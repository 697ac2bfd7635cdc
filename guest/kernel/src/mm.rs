//! Physical memory: the frame allocator and access to page tables through
//! the direct map.
use crate::arch::layout::{phys_to_virt, DIRECT_MAP_SIZE};
use crate::sync::{SpinGuard, SpinLock};
use guest_core::memmap::{FrameAllocator, MemRegion};
use guest_core::pte::{FrameSource, PhysMem};

/// Empty (every allocation fails) until [`init`]. Locked: the APs allocate
/// their stacks while coming up, the scheduler its tasks' (under its own
/// lock, taken first: this one never waits for it).
static FRAMES: SpinLock<FrameAllocator> = SpinLock::new(FrameAllocator::EMPTY);

extern "C" {
    static __image_end_phys: u8;
}

/// Physical end of the kernel image (user section included).
pub fn image_end_phys() -> u64 {
    core::ptr::addr_of!(__image_end_phys) as u64
}

/// Sets up the frame allocator over RAM above the kernel image and inside
/// the direct map, minus the telemetry page: our VMM reserves it in the
/// map, but under QEMU `telemetry=` may well point into RAM.
pub fn init(map: &[MemRegion], telemetry: Option<u64>) {
    let telemetry = telemetry.map(|t| MemRegion {
        base: t,
        size: 4096,
        kind: guest_core::memmap::E820_RESERVED,
    });
    // Built in place (each emulated instruction counts on kvm_pvm).
    FRAMES
        .lock()
        .rebuild(map, telemetry, image_end_phys(), DIRECT_MAP_SIZE);
}

/// Frames for page tables and stacks: zero, because the allocator never
/// hands out a frame twice and the VMM/QEMU hand over zeroed RAM.
pub struct Frames;

impl FrameSource for Frames {
    fn frame(&mut self) -> Option<u64> {
        FRAMES.lock().alloc()
    }
    fn pair(&mut self) -> Option<u64> {
        FRAMES.lock().alloc_contiguous(2, 8192)
    }
}

/// The frame allocator, locked for a series of allocations (a page-table
/// build): one lock where [`Frames`] takes it per frame (each emulated
/// instruction counts on software-KVM hosts).
pub struct LockedFrames(SpinGuard<'static, FrameAllocator>);

/// Locks the frame allocator until the result is dropped.
pub fn lock_frames() -> LockedFrames {
    LockedFrames(FRAMES.lock())
}

impl FrameSource for LockedFrames {
    fn frame(&mut self) -> Option<u64> {
        self.0.alloc()
    }
    fn pair(&mut self) -> Option<u64> {
        self.0.alloc_contiguous(2, 8192)
    }
}

/// Page tables through the direct map.
pub struct DirectMap;

impl PhysMem for DirectMap {
    fn read(&self, table: u64, index: usize) -> u64 {
        let v = phys_to_virt(table).expect("page tables are allocated inside the direct map");
        // SAFETY: `table` is a page-table frame inside the direct map, index < 512.
        unsafe { ((v as usize as *const u64).add(index & 511)).read_volatile() }
    }
    fn write(&mut self, table: u64, index: usize, value: u64) {
        let v = phys_to_virt(table).expect("page tables are allocated inside the direct map");
        // SAFETY: as for `read`.
        unsafe { ((v as usize as *mut u64).add(index & 511)).write_volatile(value) }
    }
    /// The run with one `rep scas` finding how many of its entries are
    /// zero (not present) and a loop of stores for those (they need no
    /// check), then the careful loop from the first nonzero entry on, if
    /// any. Each emulated instruction counts on software-KVM hosts, and the
    /// direct map's runs go into fresh (zeroed) tables.
    fn fill(
        &mut self,
        table: u64,
        index: usize,
        count: usize,
        first: u64,
        step: u64,
    ) -> Result<(), usize> {
        let v = phys_to_virt(table).expect("page tables are allocated inside the direct map");
        let base = v as usize as *mut u64;
        let (from, to) = (index.min(512), index.saturating_add(count).min(512));
        // SAFETY: `table` is a page-table frame inside the direct map and
        // `from <= to <= 512`.
        let zero_end = unsafe { zero_prefix_end(base, from, to) };
        let mut value = first;
        let mut from = from;
        // Entries of `LEAVES_2M` (the direct map's) are copied from it with
        // one `rep movs`, the rest written one by one.
        let start = (first >> 21) as usize;
        let leaves = &LEAVES_2M[(first & guest_core::pte::flags::GLOBAL != 0) as usize];
        if step == 2 << 20 && start < leaves.len() && leaves[start] == first {
            let n = (zero_end - from).min(leaves.len() - start);
            // SAFETY: entries `from..from + n` of the table (from + n <=
            // zero_end <= 512) and of `leaves` (start + n <= its length).
            unsafe { copy_entries(base.add(from), leaves.as_ptr().add(start), n) };
            value = value.wrapping_add(step.wrapping_mul(n as u64));
            from += n;
        }
        for i in from..zero_end {
            // SAFETY: as above, i < 512.
            unsafe { base.add(i).write_volatile(value) };
            value = value.wrapping_add(step);
        }
        // From the first nonzero entry on (rare: the runs go into fresh
        // tables), entry by entry.
        guest_core::pte::fill_checked(self, table, zero_end..to, value, step)
    }
}

/// Entry `i` maps `i` × 2 MiB, present and writable: what the direct
/// map's 2 MiB entries are, non-global with PTI (`[0]`) and global without
/// (`[1]`), for its first 128 MiB (our VMM's default memory; built at
/// compile time, and kept small: the image is what the VMM reads and
/// loads). In `.data`, where the image's last page has room (`.rodata`'s
/// has not), so the image keeps its size.
#[link_section = ".data.leaves_2m"]
static LEAVES_2M: [[u64; 64]; 2] = {
    use guest_core::pte::flags::{GLOBAL, HUGE, PRESENT, WRITABLE};
    let mut t = [[0; 64]; 2];
    let mut i = 0;
    while i < 64 {
        t[0][i] = (i as u64) << 21 | PRESENT | WRITABLE | HUGE;
        t[1][i] = t[0][i] | GLOBAL;
        i += 1;
    }
    t
};

/// Copies `n` page-table entries from `src` to `dst` with one `rep movs`
/// (of machine words: two per entry on x86_32).
///
/// # Safety
/// `dst` and `src` valid for `n` entries, not overlapping.
unsafe fn copy_entries(dst: *mut u64, src: *const u64, n: usize) {
    // SAFETY: delegated to the caller (DF is clear in kernel code).
    #[cfg(target_arch = "x86_64")]
    unsafe {
        core::arch::asm!("rep movsq", inout("rdi") dst => _, inout("rsi") src => _,
                         inout("rcx") n => _, options(nostack, preserves_flags))
    };
    // SAFETY: as above (esi is reserved by LLVM on x86: swapped around it).
    #[cfg(target_arch = "x86")]
    unsafe {
        core::arch::asm!("xchg esi, {s}", "rep movsd", "xchg esi, {s}", s = inout(reg) src => _,
                         inout("edi") dst => _, inout("ecx") n * 2 => _,
                         options(nostack, preserves_flags))
    };
}

/// The index of the first nonzero entry of `base[from..to]`, or `to` if
/// they are all zero: one `repe scas` (of machine words: two per entry on
/// x86_32) and one load.
///
/// # Safety
/// `base` valid for reads of `to` entries, `from <= to`.
unsafe fn zero_prefix_end(base: *mut u64, from: usize, to: usize) -> usize {
    const WORDS: usize = 8 / core::mem::size_of::<usize>();
    let words = base.cast::<usize>();
    let left: usize;
    // SAFETY: reads `base[from..to]` only (DF is clear in kernel code).
    #[cfg(target_arch = "x86_64")]
    unsafe {
        core::arch::asm!("repe scasq", in("rax") 0usize, inout("rdi") words.add(from * WORDS) => _,
                         inout("rcx") (to - from) * WORDS => left, options(nostack, readonly))
    };
    // SAFETY: as above.
    #[cfg(target_arch = "x86")]
    unsafe {
        core::arch::asm!("repe scasd", in("eax") 0usize, inout("edi") words.add(from * WORDS) => _,
                         inout("ecx") (to - from) * WORDS => left, options(nostack, readonly))
    };
    // The scan stopped after word `end - 1`: the mismatch, or the last one.
    let end = to * WORDS - left;
    // SAFETY: `from * WORDS < end <= to * WORDS` when read.
    if end > from * WORDS && unsafe { words.add(end - 1).read_volatile() } != 0 {
        (end - 1) / WORDS
    } else {
        to
    }
}

/// `count` contiguous zeroed frames, for kernel stacks.
pub fn alloc_contiguous(count: u64) -> Option<u64> {
    FRAMES.lock().alloc_contiguous(count, 4096)
}

/// `count` contiguous zeroed frames starting at a multiple of `align` (a
/// power of two): the working set of `wss=` (2 MiB aligned for 2 MiB pages).
pub fn alloc_aligned(count: u64, align: u64) -> Option<u64> {
    FRAMES.lock().alloc_contiguous(count, align)
}

/// Bytes the frame allocator can still hand out (ignoring alignment losses).
pub fn free_bytes() -> u64 {
    FRAMES.lock().free_bytes()
}
