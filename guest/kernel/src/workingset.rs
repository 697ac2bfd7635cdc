//! The user working set of the syscall loops (`wss=`, `stride=`,
//! `touches=`, `wss_pages=`; `ptiscope_abi::workingset`).
//!
//! Before the workload runs, the kernel maps a physically contiguous buffer
//! at `workingset::BASE` into the loop process and writes the loop's
//! parameters into a control page just below it. The user loop
//! (`arch::user`, `user_loop` with `FLAG_WSS`) writes each slot's offset
//! into it before its phase begins, reads `touches` slots between two
//! system calls, and leaves its read count and the sum of what it read in
//! the control page, with the TSC cycles its reads took (in total, and
//! the fewest of one iteration); [`result`] checks the count and the sum
//! after the run. Nothing of that runs inside the measured phase.
//!
//! With `workload=poundsyscall` the threads of the one process share the
//! buffer: the parent fills it before the phase begins, each thread reads
//! `touches` slots before each getppid (each from offset 0) and leaves its
//! own count and sum in its record of the control page (no shared
//! counter, no atomics in the loop); [`result`] checks every thread.
//!
//! The kernel working set (`kwss=`) is a buffer mapped kernel-only at
//! [`KWSS_VA`]; with it the loop calls [`sys_kwss_call`], which reads one
//! word per page of it and then performs the loop's own system call: the
//! kernel half's TLB refill after each entry's CR3 switch.
use crate::arch::layout::phys_to_virt;
use crate::mm::Frames;
use core::sync::atomic::{AtomicUsize, Ordering, Ordering::Relaxed};
use guest_core::cmdline::{Config, Workload};
use guest_core::pte::FrameSource;
use ptiscope_abi::workingset::{self as ws, control};

/// Physical address of the control page once mapped (0: none; frame 0 is
/// never handed out, it lies below the kernel image).
static CONTROL: AtomicUsize = AtomicUsize::new(0);

/// Why the working set could not be set up.
pub enum SetupError {
    /// Not enough free memory (bytes needed, bytes free).
    OutOfMemory(u64, u64),
    Map(crate::arch::paging::MapError),
}

impl core::fmt::Display for SetupError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SetupError::OutOfMemory(need, free) => write!(
                f,
                "wss= needs {} KiB of contiguous guest memory but {} KiB are free; give the guest more memory (--mem) or a smaller wss=",
                need >> 10,
                free >> 10
            ),
            SetupError::Map(e) => write!(f, "cannot map the working set: {e:?}"),
        }
    }
}

/// Maps the working set and its control page into the address space
/// `pair`; `Ok(false)` without `wss=`.
pub fn setup(config: &Config, pair: u64) -> Result<bool, SetupError> {
    if config.wss == 0 {
        return Ok(false);
    }
    let page = config.wss_pages.bytes();
    let len = config.wss.next_multiple_of(page);
    let free = crate::mm::free_bytes();
    let buffer = crate::mm::alloc_aligned(len / 4096, page)
        .ok_or(SetupError::OutOfMemory(len + 4096, free))?;
    let ctrl = Frames.frame().ok_or(SetupError::OutOfMemory(4096, 0))?;
    crate::arch::paging::map_user_range(pair, ws::BASE, buffer, len, page)
        .map_err(SetupError::Map)?;
    crate::arch::paging::map_user_range(pair, control::VA, ctrl, 4096, 4096)
        .map_err(SetupError::Map)?;
    let words = [config.wss, config.stride, config.touches_per_iteration()];
    let va = phys_to_virt(ctrl).ok_or(SetupError::OutOfMemory(4096, 0))?;
    for (i, w) in words.iter().enumerate() {
        // SAFETY: the control frame was just allocated (inside the direct
        // map, as every frame) and nothing else uses it yet.
        unsafe { (va as usize as *mut u64).add(i).write_volatile(*w) };
    }
    CONTROL.store(ctrl as usize, Ordering::Release);
    Ok(true)
}

/// What the loop (or the poundsyscall threads) did with the working set.
pub struct Outcome {
    /// Reads counted in the measured phase (all threads together).
    pub touched: u64,
    /// Reads there should have been: iterations × touches per iteration,
    /// times the threads for poundsyscall.
    pub expected: u64,
    /// Whether each reader's sum of the words it read matches its reads'
    /// offsets (modulo the machine word: 2^32 on x86_32), and each
    /// poundsyscall thread read its share.
    pub sum_ok: bool,
    /// TSC cycles the loop spent in its reads, over the whole phase
    /// (`None` for poundsyscall, whose threads do not time their reads).
    pub read_cycles: Option<u64>,
    /// The fewest TSC cycles of one iteration's reads (`None`: no
    /// iteration, or poundsyscall).
    pub read_cycles_min: Option<u64>,
}

impl Outcome {
    /// Whether the loop read exactly what it should have.
    pub fn ok(&self) -> bool {
        self.touched == self.expected && self.sum_ok
    }
}

/// Reads the loop's counts from the control page (each thread's record
/// for poundsyscall); `None` without `wss=`.
pub fn result(config: &Config) -> Option<Outcome> {
    let ctrl = match CONTROL.load(Ordering::Acquire) {
        0 => return None,
        c => c as u64,
    };
    let va = phys_to_virt(ctrl)? as usize as *const u64;
    // SAFETY: the control page is a frame of the direct map owned by the
    // working set; every reader that wrote it has exited. `off` is one of
    // the page's word offsets (below 4096, by the ABI's layout).
    let word = |off: usize| unsafe { va.byte_add(off).read_volatile() };
    let per_reader = config
        .iterations
        .wrapping_mul(config.touches_per_iteration());
    let mask = usize::MAX as u64;
    let want = ws::expected_sum(per_reader, config.wss, config.stride) & mask;
    if config.workload == Workload::Poundsyscall {
        let mut touched = 0u64;
        let mut each_ok = true;
        for i in 0..config.threads as usize {
            let record = control::THREADS + i * control::THREAD_RECORD;
            let reads = word(record);
            touched = touched.wrapping_add(reads);
            each_ok &= reads == per_reader && word(record + 8) & mask == want;
        }
        return Some(Outcome {
            touched,
            expected: per_reader.wrapping_mul(config.threads),
            sum_ok: each_ok,
            read_cycles: None,
            read_cycles_min: None,
        });
    }
    let read_cycles_min = word(control::READ_CYCLES_MIN);
    Some(Outcome {
        touched: word(control::TOUCHED),
        expected: per_reader,
        sum_ok: word(control::SUM) & mask == want,
        read_cycles: Some(word(control::READ_CYCLES)),
        read_cycles_min: (read_cycles_min != u64::MAX).then_some(read_cycles_min),
    })
}

/// Where the kernel working set (`kwss=`) is mapped: 2 MiB above the
/// telemetry page, in 4 KiB pages of the kernel half.
pub const KWSS_VA: u64 = crate::arch::layout::TELEMETRY_VA + (2 << 20);

/// Pages of the kernel working set (0: none).
static KWSS_PAGES: AtomicUsize = AtomicUsize::new(0);
/// The loop's own system call, which [`sys_kwss_call`] performs after its
/// reads (out of range: none, `-ENOSYS`).
static KWSS_INNER: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Allocates and maps the kernel working set (`kwss=`) and makes
/// [`sys_kwss_call`] perform system call `inner` after reading it;
/// `Ok(false)` without `kwss=`.
pub fn setup_kernel(
    config: &Config,
    half: &crate::arch::paging::KernelHalf,
    pti: bool,
    inner: usize,
) -> Result<bool, SetupError> {
    if config.kwss == 0 {
        return Ok(false);
    }
    let len = config.kwss.next_multiple_of(ws::KWSS_STRIDE);
    let free = crate::mm::free_bytes();
    let buffer =
        crate::mm::alloc_aligned(len / 4096, 4096).ok_or(SetupError::OutOfMemory(len, free))?;
    crate::arch::paging::map_kernel_range(half, KWSS_VA, buffer, len, pti)
        .map_err(SetupError::Map)?;
    KWSS_PAGES.store((len / ws::KWSS_STRIDE) as usize, Relaxed);
    KWSS_INNER.store(inner, Relaxed);
    Ok(true)
}

/// Pages of the kernel working set read since boot.
/// Each CPU counts its own (`percpu::add_kwss_reads`); read after every
/// task has exited.
pub fn kernel_reads() -> u64 {
    (0..ptiscope_abi::telemetry::MAX_CPUS)
        .map(crate::arch::percpu::kwss_reads_of)
        .sum()
}

/// The kernel working set's read of `KWSS_CALL` (see
/// `syscall::sys_kwss_call`): one word of each page, counted. Returns the
/// system call the loop asked for with it.
pub fn read_kernel_working_set() -> usize {
    let pages = KWSS_PAGES.load(Relaxed);
    let mut p = KWSS_VA as usize as *const usize;
    for _ in 0..pages {
        // SAFETY: [KWSS_VA, KWSS_VA + pages * 4096) is mapped kernel memory
        // (setup_kernel), in every address space's kernel copy.
        unsafe {
            p.read_volatile();
            p = p.byte_add(ws::KWSS_STRIDE as usize);
        }
    }
    crate::arch::percpu::add_kwss_reads(pages);
    KWSS_INNER.load(Relaxed)
}
