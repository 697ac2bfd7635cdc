//! The system call table. Entry stubs (entry.rs) index `syscall_table` by
//! rax and call the handler with the C ABI: (rdi, rsi, rdx, r10).
use crate::arch::x86_shared::io::outl;
use crate::mm::Global;
use crate::task::{sched, State};
use crate::telemetry::{self, Snapshot};
use core::sync::atomic::Ordering::Relaxed;
use guest_core::layout::{USER_STACK_PAGES, USER_STACK_TOP, USER_TEXT_BASE};
use ptiscope_abi::phase::{Edge, Marker, ID_WORKLOAD};
use ptiscope_abi::syscall::{self as nr, EBADF, EINVAL, ENOSYS, TABLE_SIZE};

type Handler = extern "C" fn(u64, u64, u64, u64) -> i64;

/// No child to wait for (Linux -ECHILD).
const ECHILD: i64 = -10;
/// Bad user address (Linux -EFAULT).
const EFAULT: i64 = -14;

#[no_mangle]
#[allow(non_upper_case_globals)]
pub static syscall_table: [Handler; TABLE_SIZE] = {
    let mut t = [sys_enosys as Handler; TABLE_SIZE];
    t[nr::WRITE] = sys_write;
    t[nr::SCHED_YIELD] = sys_sched_yield;
    t[nr::GETPID] = sys_getpid;
    t[nr::EXIT] = sys_exit;
    t[nr::WAIT] = sys_wait;
    t[nr::GETPPID] = sys_getppid;
    t[nr::ARCH_PRCTL] = sys_arch_prctl;
    t[nr::PHASE_MARK] = sys_phase_mark;
    t
};

extern "C" fn sys_enosys(_: u64, _: u64, _: u64, _: u64) -> i64 {
    ENOSYS as i64
}

extern "C" fn sys_getpid(_: u64, _: u64, _: u64, _: u64) -> i64 {
    crate::task::CURRENT_PID.load(Relaxed) as i64
}

extern "C" fn sys_getppid(_: u64, _: u64, _: u64, _: u64) -> i64 {
    crate::task::CURRENT_PPID.load(Relaxed) as i64
}

/// Whether `[addr, addr + len)` lies in user memory every process maps.
fn user_range_ok(addr: u64, len: u64) -> bool {
    let (_, text_pages) = crate::user::section();
    let text = (USER_TEXT_BASE, USER_TEXT_BASE + text_pages * 4096);
    let stack = (USER_STACK_TOP - USER_STACK_PAGES * 4096, USER_STACK_TOP);
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    [text, stack].iter().any(|&(s, e)| addr >= s && end <= e)
}

extern "C" fn sys_write(fd: u64, buf: u64, len: u64, _: u64) -> i64 {
    if fd != 1 {
        return EBADF as i64;
    }
    if len > 4096 || !user_range_ok(buf, len) {
        return EFAULT;
    }
    // SAFETY: the range is mapped user memory of the current process (checked
    // above); the kernel copy maps the user half (NX, readable).
    let bytes = unsafe { core::slice::from_raw_parts(buf as *const u8, len as usize) };
    crate::arch::x86_shared::serial::write_bytes(bytes);
    len as i64
}

extern "C" fn sys_sched_yield(_: u64, _: u64, _: u64, _: u64) -> i64 {
    // SAFETY: no other reference to the scheduler is live in this call.
    unsafe { sched() }.schedule();
    0
}

extern "C" fn sys_exit(status: u64, _: u64, _: u64, _: u64) -> i64 {
    // SAFETY: as above.
    let s = unsafe { sched() };
    let t = s.current_task();
    t.state = State::Zombie(status as i64);
    let ppid = t.ppid;
    for p in s.tasks.iter_mut() {
        if p.pid == ppid && p.state == State::Waiting {
            p.state = State::Runnable;
        }
    }
    if ppid == 0 {
        // No parent to reap it: record the status for kmain.
        // SAFETY: one CPU.
        unsafe { RESULT.get() }.exit_status = Some(status as i64);
    }
    s.schedule();
    unreachable!("an exited task was scheduled again")
}

extern "C" fn sys_wait(_: u64, _: u64, _: u64, _: u64) -> i64 {
    loop {
        // SAFETY: the reference is dropped before schedule() switches tasks.
        let s = unsafe { sched() };
        let me = s.current_task().pid;
        let mut has_child = false;
        for t in s.tasks.iter_mut() {
            if t.ppid != me || t.state == State::Free {
                continue;
            }
            has_child = true;
            if let State::Zombie(status) = t.state {
                t.state = State::Free;
                return status;
            }
        }
        if !has_child {
            return ECHILD;
        }
        s.current_task().state = State::Waiting;
        s.schedule();
    }
}

extern "C" fn sys_arch_prctl(code: u64, arg: u64, _: u64, _: u64) -> i64 {
    // SAFETY: no task switch happens in this call.
    let s = unsafe { sched() };
    match code as usize {
        nr::ARCH_SET_NOPTI => match arg {
            0 | 1 if s.set_nopti(arg == 1) => 0,
            _ => EINVAL as i64,
        },
        nr::ARCH_GET_NOPTI => s.nopti() as i64,
        _ => EINVAL as i64,
    }
}

/// What the workload's phase markers recorded.
pub struct PhaseResult {
    pub begin: Option<Snapshot>,
    pub end: Option<Snapshot>,
    pub cycles: u64,
    pub mismatches: u64,
    /// Exit status of the first process (pid 1).
    pub exit_status: Option<i64>,
}

pub static RESULT: Global<PhaseResult> = Global::new(PhaseResult {
    begin: None,
    end: None,
    cycles: 0,
    mismatches: 0,
    exit_status: None,
});

/// phase_mark(marker, cycles, mismatches): writes the marker to the phase
/// port; for the workload phase, snapshots the counters right after the
/// begin write and right before the end write (so the window matches the
/// VMM's), and keeps the user-measured cycles and mismatch count.
extern "C" fn sys_phase_mark(marker: u64, cycles: u64, mismatches: u64, _: u64) -> i64 {
    let Some(m) = u32::try_from(marker).ok().and_then(Marker::decode) else {
        return EINVAL as i64;
    };
    // SAFETY: one CPU, no task switch in this call.
    let r = unsafe { RESULT.get() };
    match m.edge {
        Edge::Begin => {
            outl(ptiscope_abi::port::PHASE, m.encode());
            if m.id == ID_WORKLOAD {
                r.begin = Some(telemetry::snapshot());
            }
        }
        Edge::End => {
            if m.id == ID_WORKLOAD {
                r.end = Some(telemetry::snapshot());
                r.cycles = cycles;
                r.mismatches = mismatches;
            }
            outl(ptiscope_abi::port::PHASE, m.encode());
        }
    }
    0
}
