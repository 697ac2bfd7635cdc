//! The system call table. Entry stubs (entry.rs) index `syscall_table` by
//! rax and call the handler with the C ABI: (rdi, rsi, rdx, r10).
use crate::arch::x86_shared::io::outl;
use crate::sync::SyncUnsafeCell;
use crate::task::lock;
use crate::telemetry::{self, Snapshot};
use crate::uaccess::user_range_ok;
use ptiscope_abi::phase::{Edge, Marker, ID_WORKLOAD};
use ptiscope_abi::syscall::{self as nr, EBADF, ECHILD, EFAULT, EINVAL, ENOSYS, TABLE_SIZE};

/// Arguments and result are machine words: registers on x86_64, the stack
/// slots of a cdecl call on x86 (the entry stubs push the argument
/// registers).
type Handler = extern "C" fn(usize, usize, usize, usize) -> isize;

#[no_mangle]
#[allow(non_upper_case_globals)]
pub static syscall_table: [Handler; TABLE_SIZE] = {
    let mut t = [sys_enosys as Handler; TABLE_SIZE];
    t[nr::READ] = sys_read;
    // SAFETY: the same signature; the assembly dispatcher is as safe to
    // call as the Rust handlers it jumps to.
    t[nr::WRITE] = unsafe {
        core::mem::transmute::<unsafe extern "C" fn(usize, usize, usize, usize) -> isize, Handler>(
            sys_write,
        )
    };
    t[nr::SCHED_YIELD] = sys_sched_yield;
    t[nr::GETPID] = sys_getpid;
    t[nr::EXIT] = sys_exit;
    t[nr::WAIT] = sys_wait;
    t[nr::GETPPID] = sys_getppid;
    t[nr::ARCH_PRCTL] = sys_arch_prctl;
    t[nr::PHASE_MARK] = sys_phase_mark;
    t[nr::KWSS_CALL] = sys_kwss_call;
    t
};

/// `KWSS_CALL(a, b, c, d)`: reads the kernel working set (`kwss=`), then
/// performs the loop's own system call with the same arguments (see
/// `ptiscope_abi::syscall::KWSS_CALL`).
extern "C" fn sys_kwss_call(a0: usize, a1: usize, a2: usize, a3: usize) -> isize {
    let inner = crate::workingset::read_kernel_working_set();
    match syscall_table.get(inner) {
        Some(handler) => handler(a0, a1, a2, a3),
        None => ENOSYS,
    }
}

extern "C" fn sys_enosys(_: usize, _: usize, _: usize, _: usize) -> isize {
    ENOSYS
}

extern "C" fn sys_getpid(_: usize, _: usize, _: usize, _: usize) -> isize {
    crate::arch::percpu::current_pid() as isize
}

extern "C" fn sys_getppid(_: usize, _: usize, _: usize, _: usize) -> isize {
    crate::arch::percpu::current_ppid() as isize
}

/// read(fd, buf, len): pipe read ends only (see pipe.rs).
extern "C" fn sys_read(fd: usize, buf: usize, len: usize, _: usize) -> isize {
    crate::pipe::read(fd, buf, len)
}

// write(fd, buf, len) dispatches in assembly, so that write(-1, ...)
// (workload write-badfd) keeps its four-instruction path (mov, test, js,
// ret) instead of paying for a Rust frame set up for the tail calls:
// fd 1 → the console, other fds >= 0 → pipes, negative fds → -EBADF.
/// The flavour's fd test of `sys_write`: eax/rax = -EBADF, then `1:` (the
/// `ret`) for negative fds, the tail calls for fd 1 and the others.
#[cfg(target_pointer_width = "64")]
macro_rules! sys_write_dispatch {
    () => {
        "
    movq ${ebadf}, %rax
    testq %rdi, %rdi
    js 1f
    cmpq $1, %rdi"
    };
}
#[cfg(target_pointer_width = "32")]
macro_rules! sys_write_dispatch {
    () => {
        "
    movl ${ebadf}, %eax
    cmpl $0, 4(%esp)
    jl 1f
    cmpl $1, 4(%esp)"
    };
}
core::arch::global_asm!(
    r#"
    .section .text.sys_write, "ax"
    .global sys_write
sys_write:"#,
    sys_write_dispatch!(),
    r#"
    jne {pipe}
    jmp {console}
1:  ret
    .previous
"#,
    ebadf = const EBADF,
    pipe = sym sys_write_pipe,
    console = sym sys_write_console,
    options(att_syntax)
);

extern "C" {
    fn sys_write(fd: usize, buf: usize, len: usize, _: usize) -> isize;
}

extern "C" fn sys_write_pipe(fd: usize, buf: usize, len: usize, _: usize) -> isize {
    crate::pipe::write(fd, buf, len)
}

extern "C" fn sys_write_console(_fd: usize, buf: usize, len: usize, _: usize) -> isize {
    if len > 4096 || !user_range_ok(buf as u64, len as u64, false) {
        return EFAULT;
    }
    // SAFETY: the range is mapped user memory of the current process (checked
    // above); the kernel copy maps the user half (NX, readable).
    let bytes = unsafe { core::slice::from_raw_parts(buf as *const u8, len) };
    crate::arch::x86_shared::serial::write_bytes(bytes);
    len as isize
}

extern "C" fn sys_sched_yield(_: usize, _: usize, _: usize, _: usize) -> isize {
    lock().schedule();
    0
}

extern "C" fn sys_exit(status: usize, _: usize, _: usize, _: usize) -> isize {
    let mut s = lock();
    if !s.exit_current(status as isize as i64) {
        // No parent to reap it: record the status for kmain.
        // SAFETY: only the root task (one) gets here, under the scheduler
        // lock (see RESULT).
        unsafe { RESULT.get() }.exit_status = Some(status as isize as i64);
    }
    s.schedule();
    unreachable!("an exited task was scheduled again")
}

extern "C" fn sys_wait(_: usize, _: usize, _: usize, _: usize) -> isize {
    let mut s = lock();
    loop {
        match s.reap() {
            Ok(status) => return status as isize,
            Err(false) => return ECHILD,
            Err(true) => {
                s.current_task().state = crate::task::State::Waiting;
                s.schedule();
            }
        }
    }
}

extern "C" fn sys_arch_prctl(code: usize, arg: usize, _: usize, _: usize) -> isize {
    let mut s = lock();
    match code {
        nr::ARCH_SET_NOPTI => match arg {
            0 | 1 if s.set_nopti(arg == 1) => 0,
            _ => EINVAL,
        },
        nr::ARCH_GET_NOPTI => s.nopti() as isize,
        _ => EINVAL,
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

/// Written by the workload's lead task (its phase markers; its exit status
/// if it has no parent: the root task) and read by kmain once every task
/// has exited. Not a lock: the markers write it inside the measured window,
/// where a lock's instructions would be counted. Its accesses never overlap
/// all the same: the tasks that write it (the phase-marking one and the
/// root) are pinned to one CPU, which runs one of them at a time and
/// switches between them under the scheduler lock, and kmain reads it only
/// after seeing, under that lock, that they have all exited.
pub static RESULT: SyncUnsafeCell<PhaseResult> = SyncUnsafeCell::new(PhaseResult {
    begin: None,
    end: None,
    cycles: 0,
    mismatches: 0,
    exit_status: None,
});

/// phase_mark(marker, cycles, mismatches): writes the marker to the phase
/// port; for the workload phase, snapshots the counters right after the
/// begin write and right before the end write (so the window matches the
/// VMM's), and keeps the user-measured cycles and mismatch count. On x86
/// the 64-bit cycle count comes in two words: low in `cycles`, high in the
/// fourth argument.
extern "C" fn sys_phase_mark(marker: usize, cycles: usize, mismatches: usize, _hi: usize) -> isize {
    #[cfg(target_pointer_width = "32")]
    let cycles = cycles as u64 | (_hi as u64) << 32;
    #[cfg(target_pointer_width = "64")]
    let cycles = cycles as u64;
    let Some(m) = u32::try_from(marker).ok().and_then(Marker::decode) else {
        return EINVAL;
    };
    // SAFETY: the one task that marks phases, on its CPU; no task switch
    // in this call, and the reference ends with it (see RESULT).
    let r = unsafe { RESULT.get() };
    match m.edge {
        Edge::Begin => {
            outl(ptiscope_abi::port::PHASE, m.encode());
            if m.id == ID_WORKLOAD {
                r.begin = Some(telemetry::snapshot());
                // Tasks queued on other CPUs start now, all together (the
                // perf-bench "go"): their CPUs idle until woken.
                if crate::arch::smp::online() > 1 {
                    lock().kick_other_cpus();
                }
            }
        }
        Edge::End => {
            if m.id == ID_WORKLOAD {
                r.end = Some(telemetry::snapshot());
                r.cycles = cycles;
                r.mismatches = mismatches as u64;
            }
            outl(ptiscope_abi::port::PHASE, m.encode());
        }
    }
    0
}
