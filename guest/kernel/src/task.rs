//! Tasks: a fixed task table, one kernel stack per task, an address space
//! (PML4 pair / PDPT pair) per process or shared by threads, and a FIFO run
//! queue served when the running task blocks (wait, a pipe) or yields: no
//! timer, no preemption.
//!
//! Switching to a task installs what its entries need: CR3 (its kernel
//! copy, counted as a context switch), TSS.RSP0, the task-stack pointer the
//! PTI stubs load, the syscall stub variant for the task's mode (PTI or not:
//! a process that opted out runs the PTI-off stubs, so neither path tests the
//! mode at run time) and, for int entries with PTI, the 40-byte user frame
//! kept on the per-CPU entry stack (see entry.rs).
use crate::arch::context::{initial_stack, switch_to, UserRegs};
use crate::arch::layout::{
    cr3_value, phys_to_virt, USER_STACK_PAGES, USER_STACK_TOP, USER_TEXT_BASE,
};
use crate::arch::paging::{write_cr3, Cr3Reason, KernelHalf, UserSpec};
use crate::arch::percpu::ENTRY_FRAME_WORDS;
use crate::arch::percpu::{self, EntryState};
use crate::arch::smp;
use crate::arch::sysentry;
use crate::mm::Frames;
use crate::sync::{LockedBy, SpinLock, StaticGuard, StaticLock};
use crate::telemetry;
use core::ptr::addr_of_mut;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, Ordering::Relaxed};
use guest_core::cmdline::{Entry, GROUP_SIZE, MAX_GROUPS};
use guest_core::pipe::FIRST_PIPE_FD;
use guest_core::pte::FrameSource;
use ptiscope_abi::telemetry::Counter;
use ptiscope_abi::telemetry::MAX_CPUS;

/// The largest sched-messaging run (4 groups of 20 senders and 20
/// receivers) plus its parent.
pub const MAX_TASKS: usize = (MAX_GROUPS * 2 * GROUP_SIZE) as usize + 1;
/// Kernel stack per task.
const KSTACK_PAGES: u64 = 2;
/// "No task" in the u16 slot links.
pub const NONE: u16 = u16::MAX;
const _: () = assert!(MAX_TASKS < NONE as usize);

/// Lowest user stack address mapped in every address space (thread stacks
/// lower it; see [`Sched::spawn_task`]): the bound of the syscalls' user
/// buffer checks.
pub static USER_STACK_LOW: AtomicUsize =
    AtomicUsize::new((USER_STACK_TOP - USER_STACK_PAGES * 4096) as usize);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum State {
    Free,
    Runnable,
    /// Blocked in wait() for a child to exit.
    Waiting,
    /// Blocked on a pipe (in its wait queue).
    Blocked,
    Zombie(i64),
}

/// A task's pipe descriptors: fds `FIRST_PIPE_FD..FIRST_PIPE_FD + count`
/// are the read (or write) ends of pipes `first..first + count`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PipeFds {
    pub first: u16,
    pub count: u16,
    pub write: bool,
}

impl PipeFds {
    pub const NONE: PipeFds = PipeFds {
        first: 0,
        count: 0,
        write: false,
    };
    /// The pipe behind `fd`, if it is one of these ends in direction `write`.
    #[inline]
    pub fn get(&self, fd: usize, write: bool) -> Option<usize> {
        let i = fd.wrapping_sub(FIRST_PIPE_FD);
        (i < self.count as usize && self.write == write).then_some(self.first as usize + i)
    }
}

/// A FIFO of blocked tasks, linked through [`Task::link`].
#[derive(Clone, Copy, Debug)]
pub struct WaitQueue {
    head: u16,
    tail: u16,
}

impl WaitQueue {
    pub const EMPTY: WaitQueue = WaitQueue {
        head: NONE,
        tail: NONE,
    };
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
    /// Slot whose address space this task runs in: its own for a process,
    /// the creator's for a thread. PCID and flush state live there.
    mm: u16,
    /// Slot of the parent (NONE: kmain's), for exit's wake-up.
    parent: u16,
    /// Children not yet reaped, and the list of those that exited.
    children: u16,
    zombies: u16,
    /// Next task in a wait queue or a parent's zombie list.
    link: u16,
    pub pipes: PipeFds,
    /// The CPU it runs on, always (tasks are pinned: no migration).
    pub cpu: u8,
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
    mm: NONE,
    parent: NONE,
    children: 0,
    zombies: NONE,
    link: NONE,
    pipes: PipeFds::NONE,
    cpu: 0,
};

pub struct Sched {
    pub tasks: [Task; MAX_TASKS],
    /// The task each CPU runs (None: its idle context).
    current: [Option<usize>; MAX_CPUS],
    /// Each CPU's idle context while tasks run (kmain's on CPU 0).
    idle_rsp: [u64; MAX_CPUS],
    pub pti: bool,
    pub pcid: bool,
    pub entry: Entry,
    pub half: KernelHalf,
    next_pid: u64,
    /// Per CPU: runnable tasks not running, FIFO (a ring of slots).
    run_queue: [[u16; MAX_TASKS]; MAX_CPUS],
    rq_head: [usize; MAX_CPUS],
    rq_len: [usize; MAX_CPUS],
    /// Tasks not yet exited (runnable, running, waiting or blocked).
    live: usize,
    /// Bottom of the last thread stack handed out.
    thread_stack_low: u64,
}

/// The scheduler lock and the scheduler it owns; the pipe table is under
/// it too (pipe.rs's `PIPES`, a [`LockedBy`] this lock: a pipe's wait
/// queues link tasks of the table and are woken through the run queues;
/// the pipes reach it through [`SchedGuard::with_guarded`], so the
/// scheduler knows nothing of pipes). The syscall fast paths
/// (getpid, getppid, write(-1)) never take it; blocking calls, exit, wait
/// and the idle loops do. It is given back across a context switch (see
/// [`SchedGuard::switch`]).
pub static SCHED: SpinLock<Sched> = SpinLock::new(Sched {
    tasks: [FREE; MAX_TASKS],
    current: [None; MAX_CPUS],
    idle_rsp: [0; MAX_CPUS],
    pti: false,
    pcid: false,
    entry: Entry::Int3,
    half: KernelHalf::EMPTY,
    next_pid: 1,
    run_queue: [[NONE; MAX_TASKS]; MAX_CPUS],
    rq_head: [0; MAX_CPUS],
    rq_len: [0; MAX_CPUS],
    live: 0,
    thread_stack_low: USER_STACK_TOP - USER_STACK_PAGES * 4096,
});

extern "C" {
    static mut entry_pcid_on: u64;
}

/// [`SCHED`], named for its zero-sized guard.
pub struct SchedLock;
impl StaticLock for SchedLock {
    type Data = Sched;
    #[inline(always)]
    fn get() -> &'static SpinLock<Sched> {
        &SCHED
    }
}

/// The scheduler, locked (derefs to [`Sched`]); unlocked when dropped.
/// What gives the lock back for a while (a switch to another context, the
/// idle wait) is a method of the guard, so that no reference into the
/// scheduler can live across it.
pub struct SchedGuard(StaticGuard<SchedLock>);

impl core::ops::Deref for SchedGuard {
    type Target = Sched;
    fn deref(&self) -> &Sched {
        &self.0
    }
}
impl core::ops::DerefMut for SchedGuard {
    fn deref_mut(&mut self) -> &mut Sched {
        &mut self.0
    }
}

/// Locks the scheduler (and with it the pipes).
pub fn lock() -> SchedGuard {
    SchedGuard(StaticGuard::lock())
}

/// What an AP needs from the BSP to join: the kernel page tables, CR4 and
/// the syscall entry kind (set before the APs are started).
pub static AP_KERNEL_CR3: AtomicU64 = AtomicU64::new(0);
pub static AP_CR4: AtomicU64 = AtomicU64::new(0);
pub static AP_ENTRY: AtomicUsize = AtomicUsize::new(0);
/// `fault_cpu=`: CPU index << 8 | (the `Fault` + 1); 0 for none.
pub static AP_FAULT: AtomicUsize = AtomicUsize::new(0);

/// The workload's start, set by its begin marker ([`Sched::kick_other_cpus`]):
/// until then the other CPUs leave their queued tasks waiting.
static GO: AtomicBool = AtomicBool::new(false);

/// An AP's entry into the kernel proper: it joins and idles.
pub fn ap_enter(cpu: usize) -> ! {
    smp::ap_setup(AP_KERNEL_CR3.load(Relaxed), AP_CR4.load(Relaxed));
    if let Some(e) = Entry::from_abi_code(AP_ENTRY.load(Relaxed) as u32) {
        sysentry::init(e);
    }
    let fault = AP_FAULT.load(Relaxed);
    if fault != 0 && fault >> 8 == cpu {
        let f = guest_core::cmdline::Fault::ALL
            .get((fault & 0xff) - 1)
            .copied();
        if let Some(f) = f {
            crate::raise(f);
        }
    }
    let mut s = lock();
    loop {
        s.idle_once(cpu);
    }
}

#[derive(Debug)]
pub enum SpawnError {
    TableFull,
    OutOfMemory,
    #[allow(dead_code, reason = "shown through Debug in the panic message")]
    Map(guest_core::pte::MapError),
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

    /// Creates a process running `rip` with the given initial registers,
    /// a child of the task with pid `ppid` (0: of kmain).
    pub fn spawn(&mut self, ppid: u64, rip: u64, regs: &UserRegs) -> Result<u64, SpawnError> {
        let parent = self
            .tasks
            .iter()
            .position(|t| ppid != 0 && t.pid == ppid && t.state != State::Free);
        let slot = self.spawn_task(parent, rip, regs, None)?;
        Ok(self.tasks[slot].pid)
    }

    /// Creates a task running `rip` and queues it; returns its slot. With
    /// `thread_of`, it shares that task's address space and gets a stack
    /// page of its own in it (below the others); otherwise it is a process
    /// with a new address space.
    pub fn spawn_task(
        &mut self,
        parent: Option<usize>,
        rip: u64,
        regs: &UserRegs,
        thread_of: Option<usize>,
    ) -> Result<usize, SpawnError> {
        let slot = self
            .tasks
            .iter()
            .position(|t| t.state == State::Free)
            .ok_or(SpawnError::TableFull)?;
        let (text_phys, text_pages) = crate::arch::user::section();
        let (pair, mm, stack_top) = match thread_of {
            None => {
                let mut stack = [0u64; USER_STACK_PAGES as usize];
                for f in stack.iter_mut() {
                    *f = Frames.frame().ok_or(SpawnError::OutOfMemory)?;
                }
                let spec = UserSpec {
                    text_phys,
                    text_pages,
                    stack,
                };
                let pair = crate::arch::paging::new_address_space(&self.half, &spec)
                    .map_err(SpawnError::Map)?;
                (pair, slot, USER_STACK_TOP)
            }
            Some(owner) => {
                let mm = self.tasks[owner].mm as usize;
                let pair = self.tasks[mm].pair;
                let top = self.thread_stack_low;
                let va = top - 4096;
                if va < USER_TEXT_BASE + text_pages * 4096 {
                    return Err(SpawnError::OutOfMemory);
                }
                let frame = Frames.frame().ok_or(SpawnError::OutOfMemory)?;
                crate::arch::paging::map_user_stack_page(pair, va, frame)
                    .map_err(SpawnError::Map)?;
                self.thread_stack_low = va;
                USER_STACK_LOW.store(va as usize, Relaxed);
                (pair, mm, top)
            }
        };
        let kstack = crate::mm::alloc_contiguous(KSTACK_PAGES).ok_or(SpawnError::OutOfMemory)?;
        let kstack_top = phys_to_virt(kstack).ok_or(SpawnError::OutOfMemory)? + KSTACK_PAGES * 4096;
        // SAFETY: the stack was just allocated for this task alone.
        let saved_rsp = unsafe { initial_stack(kstack_top, rip, stack_top, regs) };
        let pid = self.next_pid;
        self.next_pid += 1;
        let ppid = parent.map_or(0, |p| self.tasks[p].pid);
        if let Some(p) = parent {
            self.tasks[p].children += 1;
        }
        self.tasks[slot] = Task {
            pid,
            ppid,
            state: State::Runnable,
            pair,
            kstack_top,
            saved_rsp,
            mm: mm as u16,
            parent: parent.map_or(NONE, |p| p as u16),
            ..FREE
        };
        self.live += 1;
        self.enqueue(slot);
        Ok(slot)
    }

    /// Pins task `slot` (just spawned, not yet run) to CPU `cpu`.
    pub fn pin(&mut self, slot: usize, cpu: usize) {
        let from = self.tasks[slot].cpu as usize;
        if from == cpu || cpu >= MAX_CPUS {
            return;
        }
        // Take it out of its queue (it is the most recent there).
        let q = from;
        let len = self.rq_len[q];
        if len > 0 {
            let last = (self.rq_head[q] + len - 1) % MAX_TASKS;
            if self.run_queue[q][last] as usize == slot {
                self.rq_len[q] -= 1;
                self.tasks[slot].cpu = cpu as u8;
                self.enqueue(slot);
            }
        }
    }

    /// Queues `slot` on its CPU (no wake-up: see [`Sched::wake`]).
    fn enqueue(&mut self, slot: usize) {
        let q = self.tasks[slot].cpu as usize;
        debug_assert!(self.rq_len[q] < MAX_TASKS);
        let tail = (self.rq_head[q] + self.rq_len[q]) % MAX_TASKS;
        self.run_queue[q][tail] = slot as u16;
        self.rq_len[q] += 1;
    }

    fn dequeue(&mut self, cpu: usize) -> Option<usize> {
        if self.rq_len[cpu] == 0 {
            return None;
        }
        let slot = self.run_queue[cpu][self.rq_head[cpu]] as usize;
        self.rq_head[cpu] = (self.rq_head[cpu] + 1) % MAX_TASKS;
        self.rq_len[cpu] -= 1;
        Some(slot)
    }

    /// Makes a blocked or waiting task runnable (queued at the tail of its
    /// CPU's queue); a task of another CPU gets that CPU woken by IPI.
    pub fn wake(&mut self, slot: usize) {
        if self.tasks[slot].state != State::Runnable {
            self.tasks[slot].state = State::Runnable;
            self.enqueue(slot);
            smp::wake_cpu(self.tasks[slot].cpu as usize);
        }
    }

    /// Wakes every other CPU that has queued work (the workload's start:
    /// tasks spawned on other CPUs wait in their queues until then).
    pub fn kick_other_cpus(&self) {
        GO.store(true, Ordering::Release);
        for cpu in 0..MAX_CPUS {
            if self.rq_len[cpu] > 0 {
                smp::wake_cpu(cpu);
            }
        }
    }

    /// Blocks the current task in `q`; the caller then calls
    /// [`Sched::schedule`], which returns once the task is woken.
    pub fn add_waiter(&mut self, q: &mut WaitQueue) {
        let cur = self.cur().expect("add_waiter() from a task");
        self.tasks[cur].state = State::Blocked;
        self.tasks[cur].link = NONE;
        if q.tail == NONE {
            q.head = cur as u16;
        } else {
            self.tasks[q.tail as usize].link = cur as u16;
        }
        q.tail = cur as u16;
    }

    /// Wakes the first task of `q`; false if it was empty.
    pub fn wake_one(&mut self, q: &mut WaitQueue) -> bool {
        if q.head == NONE {
            return false;
        }
        let t = q.head as usize;
        q.head = self.tasks[t].link;
        if q.head == NONE {
            q.tail = NONE;
        }
        self.wake(t);
        true
    }

    /// exit(): the current task becomes a zombie on its parent's list and
    /// wakes the parent if it waits. Returns whether it had a parent.
    pub fn exit_current(&mut self, status: i64) -> bool {
        let cur = self.cur().expect("exit() from a task");
        self.tasks[cur].state = State::Zombie(status);
        self.live -= 1;
        if self.live == 0 {
            // CPU 0 reports once every task is done: wake it if it idles.
            smp::wake_cpu(0);
        }
        let parent = self.tasks[cur].parent;
        if parent == NONE {
            return false;
        }
        let p = parent as usize;
        self.tasks[cur].link = self.tasks[p].zombies;
        self.tasks[p].zombies = cur as u16;
        if self.tasks[p].state == State::Waiting {
            self.wake(p);
        }
        true
    }

    /// wait(): reaps an exited child of the current task: `Ok(status)`,
    /// `Err(true)` if children are still running, `Err(false)` if it has none.
    pub fn reap(&mut self) -> Result<i64, bool> {
        let cur = self.cur().expect("wait() from a task");
        let z = self.tasks[cur].zombies;
        if z == NONE {
            return Err(self.tasks[cur].children != 0);
        }
        let z = z as usize;
        self.tasks[cur].zombies = self.tasks[z].link;
        self.tasks[cur].children -= 1;
        let State::Zombie(status) = self.tasks[z].state else {
            unreachable!("only zombies are on the list")
        };
        self.tasks[z].state = State::Free;
        Ok(status)
    }

    fn task_pti(&self, t: &Task) -> bool {
        self.pti && !t.nopti
    }

    /// PCID of an address space's kernel copy (0 without PCID): asid + 1,
    /// as Linux; `slot` is the address space's owner (`Task::mm`).
    fn pcid_of(&self, slot: usize) -> u64 {
        if self.pcid {
            slot as u64 + 1
        } else {
            0
        }
    }

    /// The CR3 value of an address space's kernel copy (`slot` = its
    /// owner), NOFLUSH when its PCID is warm.
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
        let on_entry_stack = sysentry::install(self.entry, mode, t.kstack_top);
        // This CPU's words: the entry code reads them only on the next
        // entry from user mode, after we return there.
        percpu::set_entry_state(&EntryState {
            kstack_top: t.kstack_top,
            exit_pti: mode,
            user_flush_pending: self.tasks[t.mm as usize].user_flush_pending,
            frame_on_entry_stack: on_entry_stack,
            pid: t.pid,
            ppid: t.ppid,
        });
    }

    fn entry_frame_slot() -> *mut [usize; ENTRY_FRAME_WORDS] {
        percpu::entry_frame_slot()
    }

    /// The task this CPU runs.
    fn cur(&self) -> Option<usize> {
        self.current[percpu::cpu()]
    }

    pub fn current_task(&mut self) -> &mut Task {
        let c = self.cur().expect("called from a task");
        &mut self.tasks[c]
    }

    /// arch_prctl(ARCH_SET_NOPTI, 1): this process stops switching page
    /// tables. Opting back in is refused (`false`): the call would return
    /// through the PTI-off stub, with no switch back to the user copy.
    pub fn set_nopti(&mut self, on: bool) -> bool {
        let c = self.cur().expect("called from a task");
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
        let mm = self.tasks[c].mm as usize;
        let pcid = self.pcid_of(mm);
        write_cr3(cr3_value(pair, false, pcid, false), Cr3Reason::Other);
        // install_entry below loads the CPU's flag from here.
        self.tasks[mm].user_flush_pending = 1;
        // This call still returns through the PTI stub it came in by, which
        // switches to the user copy: now a full copy of the kernel copy. The
        // next entry takes the PTI-off stub and switches nothing.
        self.install_entry(c);
        true
    }

    /// Whether the current task runs without PTI.
    pub fn nopti(&self) -> bool {
        let c = self.cur().expect("called from a task");
        !self.task_pti(&self.tasks[c])
    }
}

impl SchedGuard {
    /// The scheduler and `data`, which this lock guards, at once (the pipe
    /// table: a pipe operation wakes or queues tasks on the pipe's wait
    /// queues).
    pub fn with_guarded<'a, T>(
        &'a mut self,
        data: &'a LockedBy<SchedLock, T>,
    ) -> (&'a mut Sched, &'a mut T) {
        data.with_owner(&mut self.0)
    }

    /// Switches from the current context (a task or kmain) to task `next`.
    /// CR3 is written (a counted context-switch write) unless both run in
    /// the same address space (threads).
    ///
    /// The lock is given back just before the stack switch and taken again
    /// when this context resumes. That is sound because tasks are pinned: no
    /// other CPU ever resumes `prev` or touches its saved stack pointer, so
    /// `switch_to` may store it unlocked. (One function, in the order the
    /// context switch has always had: its instructions are counted.)
    fn switch(&mut self, next: usize) {
        let cpu = percpu::cpu();
        let s: &mut Sched = self;
        let prev = s.current[cpu];
        if prev == Some(next) {
            return;
        }
        let next_mm = s.tasks[next].mm as usize;
        let mut same_mm = false;
        if let Some(p) = prev {
            // SAFETY: the entry stack's top words are the frame slot.
            s.tasks[p].entry_frame = unsafe { *Sched::entry_frame_slot() };
            let prev_mm = s.tasks[p].mm as usize;
            // SAFETY: as in install_entry.
            s.tasks[prev_mm].user_flush_pending = percpu::user_flush_pending();
            same_mm = prev_mm == next_mm;
        }
        // SAFETY: as above.
        unsafe { *Sched::entry_frame_slot() = s.tasks[next].entry_frame };
        if !same_mm {
            let cr3 = s.kernel_cr3(next_mm);
            write_cr3(cr3, Cr3Reason::ContextSwitch);
        }
        s.install_entry(next);
        telemetry::inc(Counter::ContextSwitches);
        s.current[cpu] = Some(next);
        let save: *mut u64 = match prev {
            Some(p) => &mut s.tasks[p].saved_rsp,
            None => &mut s.idle_rsp[cpu],
        };
        let next_rsp = s.tasks[next].saved_rsp;
        self.0.unlocked(|| {
            // SAFETY: `next_rsp` is a context saved by switch_to or built
            // by initial_stack; `save` outlives the switch (static task
            // table) and only this CPU uses it (see above).
            unsafe { switch_to(save, next_rsp) }
        });
    }

    /// One round of a CPU's idle context: run the next queued task (until
    /// this CPU has nothing left to run), or wait for a wake-up IPI.
    /// Called and returns with the lock held.
    fn idle_once(&mut self, cpu: usize) {
        // The other CPUs take nothing from their queues before the "go":
        // an AP that reaches its idle loop only after the tasks were queued
        // (or wakes early) would otherwise start them before the phase
        // begins, and their calls would fall outside it.
        let may_run = cpu == 0 || GO.load(Ordering::Acquire);
        if let Some(next) = may_run.then(|| self.dequeue(cpu)).flatten() {
            self.switch(next);
            return;
        }
        self.0.unlocked(smp::idle_wait);
    }

    /// CPU 0: runs tasks until every task has exited (on any CPU); returns
    /// in kmain's context, with the lock released.
    pub fn run(mut self) {
        while self.live > 0 {
            self.idle_once(0);
        }
    }

    /// Gives the CPU to the next queued task (the current one goes to the
    /// tail if it is still runnable: a yield), or back to kmain when none
    /// is left. Returns when the current task runs again.
    pub fn schedule(&mut self) {
        let cpu = percpu::cpu();
        let cur = self.current[cpu].expect("schedule() from a task");
        if self.tasks[cur].state == State::Runnable {
            self.enqueue(cur);
        }
        match self.dequeue(cpu) {
            Some(next) if next != cur => self.switch(next),
            Some(_) => {}
            None => {
                // Nothing runnable here: back to this CPU's idle context
                // (on the kernel copy already, which maps all it needs).
                self.current[cpu] = None;
                let save: *mut u64 = &mut self.tasks[cur].saved_rsp;
                let idle = self.idle_rsp[cpu];
                self.0.unlocked(|| {
                    // SAFETY: idle_rsp was saved by the switch that left the
                    // idle context; `cur` is resumed only by this CPU (pinned).
                    unsafe { switch_to(save, idle) }
                });
            }
        }
    }
}
