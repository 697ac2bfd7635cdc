//! The workloads: the syscall loops (getpid, getppid, write-badfd, with an
//! optional user working set), sched-messaging with perf bench's semantics,
//! and poundsyscall. Each brackets its measured part with the phase markers
//! (`marker`): a store to a mapped page, so that no measured task holds
//! I/O permission (the port after `ioperm` only where the kernel refuses
//! the mapping).

use std::fmt::Write as _;

use guest_core::cmdline::Config;
use ptiscope_abi::options::{TaskMode, Workload, GROUP_SIZE};
use ptiscope_abi::phase::{Marker, ID_WORKLOAD};
use ptiscope_abi::workingset as ws;

use crate::marker;
use crate::sys::{self, nr, Gate};

/// What a workload measured.
pub struct Outcome {
    /// Calls (messages for sched-messaging) the figures are divided by.
    pub calls: u64,
    /// TSC cycles of the measured part.
    pub cycles: u64,
    /// CLOCK_MONOTONIC nanoseconds of the measured part.
    pub ns: u64,
    /// Calls that returned something else than expected.
    pub mismatches: u64,
    /// Whether the workload's own checks passed (working-set sum, message counts).
    pub ok: bool,
    /// More `@result` keys (` key=value` each).
    pub extra: String,
}

#[inline(never)]
fn phase_begin() {
    marker::mark(Marker::begin(ID_WORKLOAD).encode());
}

#[inline(never)]
fn phase_end() {
    marker::mark(Marker::end(ID_WORKLOAD).encode());
}

/// The measured call of a syscall loop and what it must return.
fn call_of(workload: Workload) -> (usize, usize, isize) {
    match workload {
        // PID 1's pid is 1 and its parent is the kernel (0).
        Workload::Getpid => (nr::GETPID, usize::MAX, 1),
        Workload::Getppid => (nr::GETPPID, usize::MAX, 0),
        // write(-1, ...) fails at once with -EBADF.
        _ => (nr::WRITE, usize::MAX, -9),
    }
}

/// A user working set: `slots` words at `stride` bytes, each holding its
/// own offset (as the companion guest's, so the same sum checks it).
struct WorkingSet {
    buf: Vec<u64>,
    stride_words: usize,
    slots: u64,
    touches: u64,
    next: u64,
    sum: u64,
    read_cycles: u64,
    read_cycles_min: u64,
}

impl WorkingSet {
    fn new(c: &Config) -> Option<WorkingSet> {
        if c.wss == 0 {
            return None;
        }
        let words = (c.wss as usize).div_ceil(8);
        let mut buf = vec![0u64; words];
        let stride_words = (c.stride / 8) as usize;
        let slots = ws::slots(c.wss, c.stride);
        for s in 0..slots as usize {
            buf[s * stride_words] = (s * stride_words * 8) as u64;
        }
        Some(WorkingSet {
            buf,
            stride_words,
            slots,
            touches: c.touches_per_iteration(),
            next: 0,
            sum: 0,
            read_cycles: 0,
            read_cycles_min: u64::MAX,
        })
    }

    /// One iteration's reads, timed.
    #[inline(always)]
    fn touch(&mut self) {
        let t0 = sys::rdtsc();
        let mut sum = self.sum;
        let mut next = self.next;
        for _ in 0..self.touches {
            // SAFETY: next < slots, and slot * stride_words < buf.len().
            sum = sum.wrapping_add(unsafe {
                core::ptr::read_volatile(self.buf.as_ptr().add(next as usize * self.stride_words))
            });
            next += 1;
            if next == self.slots {
                next = 0;
            }
        }
        self.sum = sum;
        self.next = next;
        let dt = sys::rdtsc().wrapping_sub(t0);
        self.read_cycles += dt;
        self.read_cycles_min = self.read_cycles_min.min(dt);
    }
}

/// getpid / getppid / write-badfd `iterations` times, reading the working
/// set (`wss=`) before each call.
pub fn syscall_loop(c: &Config, gate: Gate) -> Result<Outcome, String> {
    let (nr, a0, expect) = call_of(c.workload);
    let n = c.iterations;
    let mut wset = WorkingSet::new(c);
    // One call outside the phase: the path is warm, the result checked.
    if sys::syscall3(gate, nr, a0, 0, 0) != expect {
        return Err(format!(
            "the first {} returned {} (expected {expect})",
            c.workload,
            sys::syscall3(gate, nr, a0, 0, 0)
        ));
    }
    let mut mismatches = 0u64;
    // CLOCK_MONOTONIC is read outside the phase: where the vDSO cannot
    // read the clock source (TCG's, often) clock_gettime is a system call,
    // whose kernel instructions would count as the phase's. RDTSC stays
    // inside (a user-mode instruction).
    let t0 = sys::monotonic_ns();
    phase_begin();
    let c0 = sys::rdtsc();
    match wset.as_mut() {
        None => {
            for _ in 0..n {
                mismatches += (sys::syscall3(gate, nr, a0, 0, 0) != expect) as u64;
            }
        }
        Some(w) => {
            for _ in 0..n {
                w.touch();
                mismatches += (sys::syscall3(gate, nr, a0, 0, 0) != expect) as u64;
            }
        }
    }
    let cycles = sys::rdtsc().wrapping_sub(c0);
    phase_end();
    let ns = sys::monotonic_ns() - t0;
    let mut extra = String::new();
    let mut ok = true;
    if let Some(w) = &wset {
        let reads = w.touches.saturating_mul(n);
        ok = w.sum == ws::expected_sum(reads, c.wss, c.stride);
        let _ = write!(
            extra,
            " wss={} stride={} touches={} wss_pages=4k touched={reads} touch_check={} read_cycles={}",
            c.wss,
            c.stride,
            w.touches,
            if ok { "ok" } else { "bad" },
            w.read_cycles
        );
        if n > 0 {
            let _ = write!(extra, " read_cycles_min={}", w.read_cycles_min);
        }
    }
    Ok(Outcome {
        calls: n,
        cycles,
        ns,
        mismatches,
        ok,
        extra,
    })
}

/// perf bench sched messaging: `groups` groups of 20 senders and 20
/// receivers; every sender writes `loops` 100-byte messages to every
/// receiver of its group, each receiver over its own socket pair (or pipe);
/// processes (`mode=process`) or threads (`mode=thread`). Timed, as perf
/// does, from the wake-up of the workers to the last one reaped.
pub fn messaging(c: &Config, pipes: bool) -> Result<Outcome, String> {
    const DATA: usize = 100;
    let group = GROUP_SIZE as usize;
    let loops = c.loops as usize;
    let threads = c.mode == TaskMode::Thread;
    let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
    let ready = sys::make_pipe().map_err(|e| io("ready pipe", e))?;
    let wakeup = sys::make_pipe().map_err(|e| io("wake-up pipe", e))?;

    // Waits for the wake-up: the parent closes the pipe's write end, so
    // every worker's read returns 0 at once.
    let worker_start = move || {
        sys::write_all_fd(ready[1], b"R");
        let mut b = [0u8; 1];
        sys::read_fd(wakeup[0], &mut b);
    };
    let mut handles: Vec<std::thread::JoinHandle<bool>> = Vec::new();
    let mut pids = 0usize;
    let mut spawn = |f: Box<dyn FnOnce() -> bool + Send>| -> Result<(), String> {
        if threads {
            handles.push(std::thread::spawn(f));
        } else {
            match sys::fork_process().map_err(|e| io("fork", e))? {
                0 => {
                    // The wake-up is the write end's last close: a child
                    // must not hold a copy of it.
                    sys::close_fd(wakeup[1]);
                    sys::exit_child(if f() { 0 } else { 1 })
                }
                _ => pids += 1,
            }
        }
        Ok(())
    };
    let mut all_fds = Vec::new();
    for _ in 0..c.groups {
        let mut write_fds = Vec::with_capacity(group);
        for _ in 0..group {
            let fds = if pipes {
                sys::make_pipe()
            } else {
                sys::make_socketpair()
            }
            .map_err(|e| io("receiver channel", e))?;
            all_fds.extend(fds);
            let rx = fds[0];
            write_fds.push(fds[1]);
            spawn(Box::new(move || {
                worker_start();
                let want = group * loops * DATA;
                let mut got = 0;
                let mut buf = [0u8; DATA];
                while got < want {
                    let n = sys::read_fd(rx, &mut buf[..DATA.min(want - got)]);
                    if n <= 0 {
                        return false;
                    }
                    got += n as usize;
                }
                true
            }))?;
        }
        for _ in 0..group {
            let fds = write_fds.clone();
            spawn(Box::new(move || {
                worker_start();
                let msg = [0u8; DATA];
                for _ in 0..loops {
                    for &fd in &fds {
                        if !sys::write_all_fd(fd, &msg) {
                            return false;
                        }
                    }
                }
                true
            }))?;
        }
    }
    let workers = c.groups as usize * group * 2;
    let mut b = [0u8; 1];
    for _ in 0..workers {
        if sys::read_fd(ready[0], &mut b) != 1 {
            return Err("a worker did not report ready".into());
        }
    }
    // CLOCK_MONOTONIC outside the phase, as in `syscall_loop`.
    let t0 = sys::monotonic_ns();
    phase_begin();
    let c0 = sys::rdtsc();
    sys::close_fd(wakeup[1]);
    let mut ok = true;
    for h in handles {
        ok &= h.join().unwrap_or(false);
    }
    for _ in 0..pids {
        match sys::wait_any() {
            Some((_, status)) => ok &= status == 0,
            None => {
                ok = false;
                break;
            }
        }
    }
    let cycles = sys::rdtsc().wrapping_sub(c0);
    phase_end();
    let ns = sys::monotonic_ns() - t0;
    for fd in all_fds.into_iter().chain([ready[0], ready[1], wakeup[0]]) {
        sys::close_fd(fd);
    }
    Ok(Outcome {
        calls: c.messages(),
        cycles,
        ns,
        mismatches: 0,
        ok,
        extra: format!(
            " groups={} loops={} mode={} ipc={} tasks={} time_ms={}.{:03}",
            c.groups,
            c.loops,
            c.mode,
            if pipes { "pipe" } else { "socket" },
            workers + 1,
            ns / 1_000_000,
            ns / 1000 % 1000
        ),
    })
}

/// mmtests poundsyscall: `threads` threads of this process, each calling
/// getppid `iterations` times (checking each result), started together.
pub fn pound(c: &Config, gate: Gate) -> Result<Outcome, String> {
    let wakeup = sys::make_pipe().map_err(|e| format!("wake-up pipe: {e}"))?;
    let ready = sys::make_pipe().map_err(|e| format!("ready pipe: {e}"))?;
    let n = c.iterations;
    let handles: Vec<_> = (0..c.threads)
        .map(|_| {
            std::thread::spawn(move || {
                sys::write_all_fd(ready[1], b"R");
                let mut b = [0u8; 1];
                sys::read_fd(wakeup[0], &mut b);
                let mut bad = 0u64;
                for _ in 0..n {
                    bad += (sys::syscall3(gate, nr::GETPPID, 0, 0, 0) != 0) as u64;
                }
                bad
            })
        })
        .collect();
    let mut b = [0u8; 1];
    for _ in 0..c.threads {
        if sys::read_fd(ready[0], &mut b) != 1 {
            return Err("a thread did not report ready".into());
        }
    }
    // CLOCK_MONOTONIC outside the phase, as in `syscall_loop`.
    let t0 = sys::monotonic_ns();
    phase_begin();
    let c0 = sys::rdtsc();
    sys::close_fd(wakeup[1]);
    let mut mismatches = 0;
    let mut ok = true;
    for h in handles {
        match h.join() {
            Ok(bad) => mismatches += bad,
            Err(_) => ok = false,
        }
    }
    let cycles = sys::rdtsc().wrapping_sub(c0);
    phase_end();
    let ns = sys::monotonic_ns() - t0;
    Ok(Outcome {
        calls: c.threads * n,
        cycles,
        ns,
        mismatches,
        ok,
        extra: format!(" threads={}", c.threads),
    })
}
