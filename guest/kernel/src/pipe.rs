//! Pipes for `workload=sched-messaging`: a table of pipes, each a 4 KiB
//! ring in a frame of its own (`guest_core::pipe::Ring`), with FIFO wait
//! queues of blocked readers and writers. A read blocks while the pipe is
//! empty and returns what is there (up to `len`); a write of at most
//! `PIPE_BUF` bytes blocks until all of it fits (atomic, as Linux). Tasks
//! reach pipes through their descriptor range (`task::PipeFds`). The pipes
//! stand on the scheduler (its lock, wait queues and wake-ups); the
//! scheduler knows nothing of them: the table is reached with the lock's
//! guard through `task::SchedGuard::with_guarded`.
use crate::arch::layout::phys_to_virt;
use crate::mm::Frames;
use crate::sync::LockedBy;
use crate::task::{lock, SchedLock, WaitQueue, MAX_TASKS};
use crate::uaccess::user_range_ok;
use guest_core::pipe::{Ring, PIPE_BUF, PIPE_SIZE};
use guest_core::pte::FrameSource;
use ptiscope_abi::syscall::{EBADF, EFAULT, EINVAL};

/// One pipe per receiver of the largest run.
pub const MAX_PIPES: usize = MAX_TASKS / 2;

#[derive(Clone, Copy)]
struct Pipe {
    ring: Ring,
    /// Kernel virtual address of the buffer frame.
    buf: usize,
    readers: WaitQueue,
    writers: WaitQueue,
}

/// The pipe table. Its readers and writers block on the pipes' wait
/// queues, which link tasks of the scheduler's table.
pub struct Pipes {
    pipes: [Pipe; MAX_PIPES],
    count: usize,
}

impl Pipes {
    pub const EMPTY: Pipes = Pipes {
        pipes: [Pipe {
            ring: Ring::EMPTY,
            buf: 0,
            readers: WaitQueue::EMPTY,
            writers: WaitQueue::EMPTY,
        }; MAX_PIPES],
        count: 0,
    };

    /// Creates a pipe; returns its index (consecutive from 0).
    pub fn create(&mut self) -> Option<u16> {
        if self.count == MAX_PIPES {
            return None;
        }
        let frame = Frames.frame()?;
        self.pipes[self.count].buf = phys_to_virt(frame)? as usize;
        self.count += 1;
        Some((self.count - 1) as u16)
    }
}

/// The pipes, under the scheduler lock (`task::SchedGuard::with_guarded`).
pub static PIPES: LockedBy<SchedLock, Pipes> = LockedBy::new(Pipes::EMPTY);

impl Pipe {
    fn buffer(&self) -> &'static mut [u8; PIPE_SIZE] {
        // SAFETY: `buf` is this pipe's own frame in the direct map; it is
        // touched only through its `Pipe`, under the scheduler lock that
        // guards the table, and the caller keeps no reference across a switch.
        unsafe { &mut *(self.buf as *mut [u8; PIPE_SIZE]) }
    }
}

/// The pipe behind `fd` for the current task, in direction `write`.
fn lookup(fd: usize, write: bool) -> Option<usize> {
    lock().current_task().pipes.get(fd, write)
}

/// read(fd, buf, len) on a pipe's read end.
pub fn read(fd: usize, buf: usize, len: usize) -> isize {
    let Some(i) = lookup(fd, false) else {
        return EBADF;
    };
    if len == 0 {
        return 0;
    }
    if !user_range_ok(buf as u64, len as u64, true) {
        return EFAULT;
    }
    let mut s = lock();
    loop {
        // Under the scheduler lock, which owns the pipes (held here and
        // taken again after every block); the references end before
        // `schedule`, which gives the lock back while other tasks run.
        let (sched, pipes) = s.with_guarded(&PIPES);
        let pipe = &mut pipes.pipes[i];
        if !pipe.ring.is_empty() {
            // SAFETY: a writable user range of the current address space
            // (checked above), mapped in the kernel copy.
            let out = unsafe { core::slice::from_raw_parts_mut(buf as *mut u8, len) };
            let n = pipe.ring.pop(pipe.buffer(), out);
            // Room for one more message: wake one writer; an empty pipe
            // wakes them all (they re-check and block again if need be).
            if pipe.ring.is_empty() {
                while sched.wake_one(&mut pipe.writers) {}
            } else {
                sched.wake_one(&mut pipe.writers);
            }
            return n as isize;
        }
        // Queue first, then switch: no reference into the pipes lives
        // across the switch (other tasks use the pipe meanwhile).
        sched.add_waiter(&mut pipe.readers);
        s.schedule();
    }
}

/// write(fd, buf, len) on a pipe's write end (fd >= 0, fd != 1).
pub fn write(fd: usize, buf: usize, len: usize) -> isize {
    let Some(i) = lookup(fd, true) else {
        return EBADF;
    };
    if len > PIPE_BUF {
        return EINVAL;
    }
    if len == 0 {
        return 0;
    }
    if !user_range_ok(buf as u64, len as u64, false) {
        return EFAULT;
    }
    let mut s = lock();
    loop {
        // As in read.
        let (sched, pipes) = s.with_guarded(&PIPES);
        let pipe = &mut pipes.pipes[i];
        if pipe.ring.free() >= len {
            // SAFETY: a readable user range of the current address space.
            let data = unsafe { core::slice::from_raw_parts(buf as *const u8, len) };
            let n = pipe.ring.push(pipe.buffer(), data);
            sched.wake_one(&mut pipe.readers);
            return n as isize;
        }
        // Queue first, then switch: no reference into the pipes lives
        // across the switch (other tasks use the pipe meanwhile).
        sched.add_waiter(&mut pipe.writers);
        s.schedule();
    }
}
