//! Per-CPU data of the x86_32 PAE flavour: one CPU (its SMP is not built
//! yet), so "per-CPU" words are the plain statics of CPU 0 that the entry
//! code addresses absolutely, as before SMP existed.
use core::ptr::addr_of_mut;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};
use ptiscope_abi::telemetry::Counter;

extern "C" {
    static mut cpu_current_kstack_top: u64;
    static mut cpu_user_flush_pending: u64;
    static mut cpu_exit_pti: u64;
    static mut cpu_frame_on_entry_stack: u64;
}

static PID: AtomicU64 = AtomicU64::new(0);
static PPID: AtomicU64 = AtomicU64::new(0);

/// Index of the CPU this runs on: always 0 here.
#[inline(always)]
pub fn cpu() -> usize {
    0
}

#[inline(always)]
pub fn current_pid() -> u64 {
    PID.load(Relaxed)
}

#[inline(always)]
pub fn current_ppid() -> u64 {
    PPID.load(Relaxed)
}

/// What the entry code needs about the task the CPU now runs.
pub struct EntryState {
    pub kstack_top: u64,
    pub exit_pti: u64,
    pub user_flush_pending: u64,
    pub frame_on_entry_stack: bool,
    pub pid: u64,
    pub ppid: u64,
}

pub fn set_entry_state(s: &EntryState) {
    // SAFETY: one CPU with interrupts off; the entry code reads these only
    // on the next entry from user mode.
    unsafe {
        *addr_of_mut!(cpu_current_kstack_top) = s.kstack_top;
        *addr_of_mut!(cpu_exit_pti) = s.exit_pti;
        *addr_of_mut!(cpu_user_flush_pending) = s.user_flush_pending;
        *addr_of_mut!(cpu_frame_on_entry_stack) = s.frame_on_entry_stack as u64;
    }
    PID.store(s.pid, Relaxed);
    PPID.store(s.ppid, Relaxed);
}

pub fn user_flush_pending() -> u64 {
    // SAFETY: as above.
    unsafe { *addr_of_mut!(cpu_user_flush_pending) }
}

/// The user frame slot at the top of the entry stack.
pub fn entry_frame_slot() -> *mut [usize; super::entry::ENTRY_FRAME_WORDS] {
    let bytes = (super::entry::ENTRY_FRAME_WORDS * core::mem::size_of::<usize>()) as u64;
    (super::descriptors::entry_stack_top_addr() - bytes) as usize as *mut _
}

fn slot(c: Counter) -> *mut u64 {
    (super::layout::TELEMETRY_VA + c.offset(0) as u64) as usize as *mut u64
}

/// Adds `n` to CPU 0's counter `c`.
#[inline(always)]
pub fn counter_add(c: Counter, n: u64) {
    // SAFETY: TELEMETRY_VA is mapped in every kernel page table; the slot is
    // inside the page and aligned. Volatile: the host reads it.
    unsafe { slot(c).write_volatile(slot(c).read_volatile().wrapping_add(n)) }
}

/// CPU `n`'s counter `c` (only CPU 0 exists here).
pub fn counter_of(n: usize, c: Counter) -> u64 {
    if n != 0 {
        return 0;
    }
    // SAFETY: as for counter_add.
    unsafe { slot(c).read_volatile() }
}
