//! Processes: a small fixed task table, one address space (PML4 pair) and
//! one kernel stack per task, round-robin scheduling at system calls.
//!
//! Switching to a task installs what its entries need: CR3 (its kernel
//! copy, counted as a context switch), TSS.RSP0, the task-stack pointer the
//! PTI stubs load, the syscall stub variant for the task's mode (PTI or not:
//! a process that opted out runs the PTI-off stubs, so neither path tests the
//! mode at run time) and, for int entries with PTI, the 40-byte user frame
//! kept on the per-CPU entry stack (see entry.rs).
use crate::arch::context::{initial_stack, switch_to, UserRegs};
use crate::arch::descriptors::entry_stack_top_addr;
use crate::arch::entry::ENTRY_FRAME_WORDS;
use crate::arch::layout::{cr3_value, phys_to_virt, USER_STACK_PAGES, USER_STACK_TOP};
use crate::arch::paging::{write_cr3, Cr3Reason, KernelHalf, UserSpec};
use crate::arch::sysentry;
use crate::mm::{Frames, Global};
use crate::telemetry;
use core::ptr::addr_of_mut;
use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use guest_core::cmdline::Entry;
use guest_core::paging::FrameSource;
use ptiscope_abi::telemetry::Counter;

pub const MAX_TASKS: usize = 4;
/// Kernel stack per task.
const KSTACK_PAGES: u64 = 2;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum State {
    Free,
    Runnable,
    /// Blocked in wait() for a child to exit.
    Waiting,
    Zombie(i64),
}

#[derive(Clone, Copy)]
pub struct Task {
    pub pid: u64,
    pub ppid: u64,
    pub state: State,
    /// Physical address of the PML4 pair.
    pub pair: u64,
    pub kstack_top: u64,
    saved_rsp: u64,
    /// The user frame of an int entry with PTI, while another task runs.
    entry_frame: [usize; ENTRY_FRAME_WORDS],
    /// Opted out of PTI with arch_prctl(ARCH_SET_NOPTI, 1).
    pub nopti: bool,
    pcid_used: bool,
    user_flush_pending: u64,
}

const FREE: Task = Task {
    pid: 0,
    ppid: 0,
    state: State::Free,
    pair: 0,
    kstack_top: 0,
    saved_rsp: 0,
    entry_frame: [0; ENTRY_FRAME_WORDS],
    nopti: false,
    pcid_used: false,
    user_flush_pending: 0,
};

pub struct Sched {
    pub tasks: [Task; MAX_TASKS],
    pub current: Option<usize>,
    /// kmain's context while tasks run.
    idle_rsp: u64,
    pub pti: bool,
    pub pcid: bool,
    pub entry: Entry,
    pub half: KernelHalf,
    next_pid: u64,
}

pub static SCHED: Global<Sched> = Global::new(Sched {
    tasks: [FREE; MAX_TASKS],
    current: None,
    idle_rsp: 0,
    pti: false,
    pcid: false,
    entry: Entry::Int3,
    half: KernelHalf::EMPTY,
    next_pid: 1,
});

/// pid and ppid of the running task, read by getpid/getppid in two instructions.
pub static CURRENT_PID: AtomicUsize = AtomicUsize::new(0);
pub static CURRENT_PPID: AtomicUsize = AtomicUsize::new(0);

extern "C" {
    static mut cpu_current_kstack_top: u64;
    static mut cpu_user_flush_pending: u64;
    static mut cpu_exit_pti: u64;
    static mut cpu_frame_on_entry_stack: u64;
    static mut entry_pcid_on: u64;
}

/// # Safety
/// One CPU, no interrupts: callers must not hold another reference across
/// a call that switches tasks.
pub unsafe fn sched() -> &'static mut Sched {
    // SAFETY: delegated to the caller.
    unsafe { SCHED.get() }
}

#[derive(Debug)]
pub enum SpawnError {
    TableFull,
    OutOfMemory,
    #[allow(dead_code, reason = "shown through Debug in the panic message")]
    Map(guest_core::paging::MapError),
}

impl Sched {
    /// Configures the syscall entry for the run and, for SYSCALL, the MSRs.
    pub fn init(&mut self, pti: bool, pcid: bool, entry: Entry, half: KernelHalf) {
        self.pti = pti;
        self.pcid = pcid;
        self.entry = entry;
        self.half = half;
        // SAFETY: single CPU at boot; the entry code reads this flag only on
        // exceptions from user mode, none of which can happen yet.
        unsafe { *addr_of_mut!(entry_pcid_on) = pcid as u64 };
        sysentry::init(entry);
    }

    /// Creates a process running `rip` with the given initial registers.
    pub fn spawn(&mut self, ppid: u64, rip: u64, regs: &UserRegs) -> Result<u64, SpawnError> {
        let slot = self
            .tasks
            .iter()
            .position(|t| t.state == State::Free)
            .ok_or(SpawnError::TableFull)?;
        let (text_phys, text_pages) = crate::arch::user::section();
        let mut stack = [0u64; USER_STACK_PAGES as usize];
        for f in stack.iter_mut() {
            *f = Frames.frame().ok_or(SpawnError::OutOfMemory)?;
        }
        let spec = UserSpec {
            text_phys,
            text_pages,
            stack,
        };
        let pair =
            crate::arch::paging::new_address_space(&self.half, &spec).map_err(SpawnError::Map)?;
        let kstack = crate::mm::alloc_contiguous(KSTACK_PAGES).ok_or(SpawnError::OutOfMemory)?;
        let kstack_top = phys_to_virt(kstack).ok_or(SpawnError::OutOfMemory)? + KSTACK_PAGES * 4096;
        // SAFETY: the stack was just allocated for this task alone.
        let saved_rsp = unsafe { initial_stack(kstack_top, rip, USER_STACK_TOP, regs) };
        let pid = self.next_pid;
        self.next_pid += 1;
        self.tasks[slot] = Task {
            pid,
            ppid,
            state: State::Runnable,
            pair,
            kstack_top,
            saved_rsp,
            ..FREE
        };
        Ok(pid)
    }

    fn task_pti(&self, t: &Task) -> bool {
        self.pti && !t.nopti
    }

    /// PCID of a task's kernel copy (0 without PCID): asid + 1, as Linux.
    fn pcid_of(&self, slot: usize) -> u64 {
        if self.pcid {
            slot as u64 + 1
        } else {
            0
        }
    }

    /// The CR3 value of a task's kernel copy, NOFLUSH when its PCID is warm.
    fn kernel_cr3(&mut self, slot: usize) -> u64 {
        let pcid = self.pcid_of(slot);
        let t = &mut self.tasks[slot];
        let noflush = pcid != 0 && t.pcid_used;
        if pcid != 0 && !t.pcid_used {
            // First use of this PCID: flush it now, and its user twin at the
            // next exit to user mode.
            t.pcid_used = true;
            t.user_flush_pending = 1;
        }
        cr3_value(t.pair, false, pcid, noflush)
    }

    /// Installs the entry configuration for task `slot` (see module docs).
    pub fn install_entry(&mut self, slot: usize) {
        let t = self.tasks[slot];
        let pti = self.task_pti(&t);
        let mode = match (pti, self.pcid) {
            (false, _) => 0u64,
            (true, false) => 1,
            (true, true) => 2,
        };
        // SAFETY: one CPU with interrupts off; the entry code reads these
        // only on the next entry from user mode, after we return there.
        unsafe {
            *addr_of_mut!(cpu_current_kstack_top) = t.kstack_top;
            *addr_of_mut!(cpu_exit_pti) = mode;
            *addr_of_mut!(cpu_user_flush_pending) = t.user_flush_pending;
        }
        CURRENT_PID.store(t.pid as usize, Relaxed);
        CURRENT_PPID.store(t.ppid as usize, Relaxed);
        let on_entry_stack = sysentry::install(self.entry, mode, t.kstack_top);
        // SAFETY: as above.
        unsafe { *addr_of_mut!(cpu_frame_on_entry_stack) = on_entry_stack as u64 };
    }

    fn entry_frame_slot() -> *mut [usize; ENTRY_FRAME_WORDS] {
        let bytes = (ENTRY_FRAME_WORDS * core::mem::size_of::<usize>()) as u64;
        (entry_stack_top_addr() - bytes) as usize as *mut [usize; ENTRY_FRAME_WORDS]
    }

    /// Switches from the current context (a task or kmain) to task `next`.
    fn switch(&mut self, next: usize) {
        let prev = self.current;
        if prev == Some(next) {
            return;
        }
        if let Some(p) = prev {
            // SAFETY: the entry stack's top words are the frame slot.
            self.tasks[p].entry_frame = unsafe { *Self::entry_frame_slot() };
            // SAFETY: as in install_entry.
            self.tasks[p].user_flush_pending = unsafe { *addr_of_mut!(cpu_user_flush_pending) };
        }
        // SAFETY: as above.
        unsafe { *Self::entry_frame_slot() = self.tasks[next].entry_frame };
        let cr3 = self.kernel_cr3(next);
        write_cr3(cr3, Cr3Reason::ContextSwitch);
        self.install_entry(next);
        telemetry::inc(Counter::ContextSwitches);
        self.current = Some(next);
        let save: *mut u64 = match prev {
            Some(p) => &mut self.tasks[p].saved_rsp,
            None => &mut self.idle_rsp,
        };
        let next_rsp = self.tasks[next].saved_rsp;
        // SAFETY: `next_rsp` is a context saved by switch_to or built by
        // initial_stack; `save` outlives the switch (static task table).
        unsafe { switch_to(save, next_rsp) };
    }

    /// Runs tasks until none is left; returns in kmain's context.
    pub fn run(&mut self) {
        if let Some(first) = self.pick(0) {
            self.switch(first);
        }
    }

    /// The next runnable task at or after `from`, round robin.
    fn pick(&self, from: usize) -> Option<usize> {
        (0..MAX_TASKS)
            .map(|i| (from + i) % MAX_TASKS)
            .find(|&i| self.tasks[i].state == State::Runnable)
    }

    /// Gives the CPU to the next runnable task, or back to kmain when none
    /// is left. Returns when the current task runs again.
    pub fn schedule(&mut self) {
        let cur = self.current.expect("schedule() from a task");
        match self.pick(cur + 1) {
            Some(next) if next != cur => self.switch(next),
            Some(_) => {}
            None => {
                // Nothing runnable: back to kmain (on the kernel copy already,
                // which maps everything kmain needs).
                self.current = None;
                let save: *mut u64 = &mut self.tasks[cur].saved_rsp;
                // SAFETY: idle_rsp was saved by the switch that left kmain.
                unsafe { switch_to(save, self.idle_rsp) };
            }
        }
    }

    pub fn current_task(&mut self) -> &mut Task {
        let c = self.current.expect("called from a task");
        &mut self.tasks[c]
    }

    /// arch_prctl(ARCH_SET_NOPTI, 1): this process stops switching page
    /// tables. Opting back in is refused (`false`): the call would return
    /// through the PTI-off stub, with no switch back to the user copy.
    pub fn set_nopti(&mut self, on: bool) -> bool {
        let c = self.current.expect("called from a task");
        if self.tasks[c].nopti == on {
            return true;
        }
        if !on {
            return false;
        }
        self.tasks[c].nopti = true;
        if !self.pti {
            return true;
        }
        let pair = self.tasks[c].pair;
        crate::arch::paging::opt_out_of_pti(pair, &self.half);
        // The kernel copy's user entries lost NX: flush this PCID now and
        // the user PCID at the next exit (deferred, as Linux does).
        let pcid = self.pcid_of(c);
        write_cr3(cr3_value(pair, false, pcid, false), Cr3Reason::Other);
        // SAFETY: as in install_entry.
        unsafe { *addr_of_mut!(cpu_user_flush_pending) = 1 };
        // This call still returns through the PTI stub it came in by, which
        // switches to the user copy: now a full copy of the kernel copy. The
        // next entry takes the PTI-off stub and switches nothing.
        self.install_entry(c);
        true
    }

    /// Whether the current task runs without PTI.
    pub fn nopti(&self) -> bool {
        let c = self.current.expect("called from a task");
        !self.task_pti(&self.tasks[c])
    }
}
