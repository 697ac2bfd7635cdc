//! The seccomp-bpf filters on the VMM's run-time threads (seccompiler, the
//! rust-vmm/Firecracker filter compiler).
//!
//! The threads that touch what the guest controls run confined once their
//! set-up is done:
//! - the vCPU thread, from just before its first `KVM_RUN` (after the
//!   observers' `on_start`, which opens KVM stats fds and may start the
//!   metrics thread): it handles every exit (port I/O to the devices, phase
//!   markers, page-table walks and telemetry reads of guest memory). Its
//!   filter is compiled here ([`vcpu_filter`]) and handed to the thread by
//!   whoever calls `machine::run`, which applies what it is given;
//! - the live-metrics thread, from its first instruction: it reads stats fds
//!   and guest memory (the telemetry page) and writes `--metrics-out`.
//!
//! Each may make only the system calls it needs: `ioctl` only with the few
//! KVM requests the vCPU thread uses (none for the metrics thread) and two
//! read-only terminal queries, no `open`, `socket`, `execve`, `fork`/`clone`
//! or `ptrace`, and `mmap`/`mprotect` only without `PROT_EXEC`. Anything
//! else raises SIGSYS, whose
//! handler names the system call on stderr and ends the process with
//! [`EXIT_SECCOMP`]: it is a ptiscope bug or an attack, never a result.
//!
//! Not confined (see docs/design.md): the main thread, which sets up each
//! VM (it opens files and `/dev/kvm`, and `compare` boots many VMs in turn)
//! and runs the event loop; a filter cannot be lifted once set, so it would
//! have to allow all of that. The output writer threads (`output.rs`), which
//! write queued bytes to descriptors opened before the boot and touch
//! nothing the guest controls. The `probe` command's throw-away probe VMs,
//! and the QEMU backend, which is a separate process (ptiscope does not
//! filter QEMU).
//!
//! The allow-lists were found by tracing every thread of `ptiscope run`
//! (with `--metrics-interval`, `--serial-out`, `--json`, a timeout and a
//! signal stop), `ptiscope pagetables` and the test suite (`strace -f`),
//! then kept with the calls the C library and Rust's runtime may make on
//! paths a short trace misses (memory allocation, thread exit, signal
//! return, sleeping, writing a warning).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

/// Exit status when a confined thread makes a system call its filter does
/// not allow (128 + SIGSYS, as a shell reports a process killed by SIGSYS).
pub const EXIT_SECCOMP: i32 = 159;

/// Whether run-time threads are confined (`--no-seccomp` clears it).
static ENABLED: AtomicBool = AtomicBool::new(true);

/// Turns the filters on or off for the threads started from now on
/// (`--no-seccomp`, for debugging: e.g. to run the VMM under a tracer that
/// needs system calls the filters refuse, or to tell whether a failure is
/// the filter's).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::SeqCst);
}

/// Whether [`confine`] applies a filter.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::SeqCst)
}

/// The confined threads, each with its own allow-list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadKind {
    /// The vCPU thread's run loop.
    Vcpu,
    /// The live-metrics sampler.
    Metrics,
}

impl ThreadKind {
    fn name(self) -> &'static str {
        match self {
            ThreadKind::Vcpu => "vCPU",
            ThreadKind::Metrics => "metrics",
        }
    }
}

/// Errors building or applying a filter.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The filter could not be compiled.
    #[error("building the seccomp filter of the {thread} thread: {source}")]
    Build {
        /// The thread it was for (`vCPU`, `metrics`).
        thread: &'static str,
        /// The compile error.
        #[source]
        source: seccompiler::BackendError,
    },
    /// The kernel refused the filter.
    #[error(
        "applying the seccomp filter to the {thread} thread: {source} \
         (a kernel without seccomp-bpf? `--no-seccomp` runs without it)"
    )]
    Apply {
        /// The thread's role.
        thread: &'static str,
        /// The seccomp error.
        #[source]
        source: seccompiler::Error,
    },
    /// The SIGSYS handler could not be installed.
    #[error("installing the SIGSYS handler: {0}")]
    Handler(#[source] std::io::Error),
}

// The KVM requests the vCPU thread makes after set-up: run, register reads
// for stop reports and the page-table inspector, MSR reads for the
// measurer, and the stats-fd requests the measurer may make when it
// (re)opens a stats fd.
use crate::machine::kvm::request::{
    KVM_CHECK_EXTENSION, KVM_GET_MSRS, KVM_GET_REGS, KVM_GET_SREGS, KVM_GET_STATS_FD, KVM_RUN,
};

/// KVM `ioctl` requests the vCPU thread may make.
fn vcpu_ioctls() -> Vec<u64> {
    vec![
        KVM_RUN(),
        KVM_GET_REGS(),
        KVM_GET_SREGS(),
        KVM_GET_MSRS(),
        KVM_CHECK_EXTENSION(),
        KVM_GET_STATS_FD(),
    ]
}

/// System calls every confined thread may make without conditions: I/O on
/// descriptors it already has, memory management by the allocator, locks,
/// time, signal return, and thread exit.
const COMMON: &[libc::c_long] = &[
    libc::SYS_read,
    libc::SYS_pread64,
    libc::SYS_readv,
    libc::SYS_write,
    libc::SYS_pwrite64,
    libc::SYS_writev,
    libc::SYS_lseek,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_close,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_fstat,
    libc::SYS_munmap,
    libc::SYS_madvise,
    libc::SYS_mremap,
    libc::SYS_brk,
    libc::SYS_futex,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_getrandom,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigprocmask,
    libc::SYS_sigaltstack,
    libc::SYS_restart_syscall,
    // A panic's report asks for the working directory (to shorten paths).
    libc::SYS_getcwd,
    libc::SYS_exit,
    libc::SYS_exit_group,
];

fn cond(
    arg: u8,
    op: SeccompCmpOp,
    value: u64,
) -> Result<SeccompCondition, seccompiler::BackendError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, value)
}

/// The filter of one kind of thread.
fn filter(kind: ThreadKind) -> Result<BpfProgram, seccompiler::BackendError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        COMMON.iter().map(|&nr| (nr, Vec::new())).collect();
    // Memory may be mapped and protected, but never executable: no new
    // code can appear in a confined thread's address space.
    let no_exec = || -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
        Ok(vec![SeccompRule::new(vec![cond(
            2,
            SeccompCmpOp::MaskedEq(libc::PROT_EXEC as u64),
            0,
        )?])?])
    };
    rules.insert(libc::SYS_mmap, no_exec()?);
    rules.insert(libc::SYS_mprotect, no_exec()?);
    // Descriptor flags only (std's debug builds check an fd with F_GETFD
    // before closing it; a writer may switch O_NONBLOCK): no F_DUPFD.
    rules.insert(
        libc::SYS_fcntl,
        [libc::F_GETFD, libc::F_SETFD, libc::F_GETFL, libc::F_SETFL]
            .into_iter()
            .map(|cmd| SeccompRule::new(vec![cond(1, SeccompCmpOp::Eq, cmd as u64)?]))
            .collect::<Result<Vec<_>, _>>()?,
    );
    // std's `abort` and a re-raised signal.
    rules.insert(
        libc::SYS_tgkill,
        vec![SeccompRule::new(vec![cond(
            0,
            SeccompCmpOp::Eq,
            // SAFETY: getpid has no preconditions.
            unsafe { libc::getpid() } as u64,
        )?])?],
    );
    // Terminal queries (read-only) for every thread: the logger asks
    // whether stderr is a terminal (TCGETS) when a thread logs a warning,
    // e.g. the vCPU thread about an unknown port.
    let mut requests = vec![libc::TCGETS, libc::TIOCGWINSZ];
    if kind == ThreadKind::Vcpu {
        requests.extend(vcpu_ioctls());
    }
    {
        let ioctls = requests
            .into_iter()
            .map(|request| {
                // The request is a 32-bit value in an unsigned long.
                SeccompRule::new(vec![SeccompCondition::new(
                    1,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::Eq,
                    request,
                )?])
            })
            .collect::<Result<Vec<_>, _>>()?;
        rules.insert(libc::SYS_ioctl, ioctls);
    }
    let arch = std::env::consts::ARCH.try_into()?;
    SeccompFilter::new(rules, SeccompAction::Trap, SeccompAction::Allow, arch)?.try_into()
}

/// Confines the calling thread with the filter of `kind`, unless
/// `--no-seccomp` turned the filters off. Call it after the thread's
/// set-up: a filter cannot be lifted.
pub fn confine(kind: ThreadKind) -> Result<(), SandboxError> {
    if !enabled() {
        return Ok(());
    }
    let program = filter(kind).map_err(|source| SandboxError::Build {
        thread: kind.name(),
        source,
    })?;
    install_sigsys_handler()?;
    settle_c_library();
    seccompiler::apply_filter(&program).map_err(|source| SandboxError::Apply {
        thread: kind.name(),
        source,
    })
}

/// The vCPU threads' filter, for the caller of `machine::run` to hand to
/// them ([`crate::machine::HostSide::vcpu_filter`]); `None` when
/// `--no-seccomp` turned the filters off. Compiled here, on the caller's
/// thread, with the SIGSYS handler installed and the C library settled
/// (both process-wide) before any vCPU thread applies it.
pub fn vcpu_filter() -> Result<Option<std::sync::Arc<BpfProgram>>, SandboxError> {
    if !enabled() {
        return Ok(None);
    }
    let kind = ThreadKind::Vcpu;
    let program = filter(kind).map_err(|source| SandboxError::Build {
        thread: kind.name(),
        source,
    })?;
    install_sigsys_handler()?;
    settle_c_library();
    Ok(Some(std::sync::Arc::new(program)))
}

/// Settles, once per process and before the first filter is applied, the
/// C library's allocator decisions that would otherwise make it open a
/// file from whichever thread frees or allocates at the wrong moment; a
/// confined thread frees memory all its life, its teardown included.
///
/// glibc's `free` trims a thread arena's heap when its top chunk reaches
/// `M_TRIM_THRESHOLD`, and the first trim reads
/// `/proc/sys/vm/overcommit_memory` (`shrink_heap` asks whether it may
/// shrink by remapping): from a confined thread that `openat` is refused
/// and the process ends with [`EXIT_SECCOMP`] after a good run. A trim
/// threshold above any heap a thread arena can have (64 MiB) means no trim,
/// hence no open: freed memory stays in the process for reuse (allocations
/// of 128 KiB and more are separate mappings and are still unmapped on
/// free). And the arena limit glibc computes from the CPU count the first
/// time a ninth arena is wanted (which may read
/// `/sys/devices/system/cpu/online`) is set here to the same value
/// (8 per CPU), so no thread has to compute it.
fn settle_c_library() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        #[cfg(target_env = "gnu")]
        {
            // The CPUs this process may run on: one sched_getaffinity, where
            // `available_parallelism` also reads the cgroup's quota files
            // (~0.2 ms on the main thread, before every first boot).
            let cpus = online_cpus().unwrap_or(2);
            let arenas = libc::c_int::try_from(cpus.saturating_mul(8)).unwrap_or(libc::c_int::MAX);
            // SAFETY: mallopt takes two ints and changes allocator
            // parameters only; it is thread-safe (it takes the arena lock).
            unsafe {
                libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX);
                libc::mallopt(libc::M_ARENA_MAX, arenas);
            }
        }
    });
}

/// The number of CPUs in this thread's affinity mask; `None` if the kernel
/// does not say.
#[cfg(target_env = "gnu")]
fn online_cpus() -> Option<usize> {
    // SAFETY: an all-zero cpu_set_t is an empty set; sched_getaffinity
    // writes at most `size_of::<cpu_set_t>()` bytes into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        usize::try_from(libc::CPU_COUNT(&set))
            .ok()
            .filter(|&n| n > 0)
    }
}

/// Installs (once per process) the SIGSYS handler that reports a refused
/// system call.
fn install_sigsys_handler() -> Result<(), SandboxError> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        // SAFETY: a zeroed sigaction is valid; the handler is an
        // `extern "C"` function with the SA_SIGINFO signature and only makes
        // async-signal-safe calls (write, _exit).
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigsys as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut()) != 0 {
                result = Err(SandboxError::Handler(std::io::Error::last_os_error()));
            }
        }
    });
    result
}

/// Offset of `si_syscall` in a SIGSYS `siginfo_t` on Linux (after
/// si_signo, si_errno, si_code, padding and `si_call_addr`); libc does not
/// expose the field.
const SI_SYSCALL_OFFSET: usize = 24;

extern "C" fn on_sigsys(_signal: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t (128 bytes) to an
    // SA_SIGINFO handler; for SIGSYS from seccomp the int at this offset is
    // the system call number. Nothing here is guest-controlled.
    let nr =
        unsafe { std::ptr::read_unaligned(info.cast::<u8>().add(SI_SYSCALL_OFFSET).cast::<i32>()) };
    let mut message = [0u8; 200];
    let mut len = 0;
    let mut push = |bytes: &[u8]| {
        for &b in bytes {
            if len < message.len() {
                message[len] = b;
                len += 1;
            }
        }
    };
    push(b"ptiscope: error: a VMM thread made system call ");
    let mut digits = [0u8; 12];
    let mut n = nr.unsigned_abs();
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    push(&digits[at..]);
    push(b", which its seccomp filter does not allow: a ptiscope bug (rerun with --no-seccomp and report it)\n");
    // SAFETY: write and _exit are async-signal-safe; `message[..len]` is
    // initialised.
    unsafe {
        libc::write(libc::STDERR_FILENO, message.as_ptr().cast(), len);
        libc::_exit(EXIT_SECCOMP);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set by the parent test for the child it starts.
    const CHILD_ENV: &str = "PTISCOPE_SECCOMP_TEST_CHILD";

    /// Runs one `#[ignore]`d test of this binary in a child process with
    /// the child variable set; returns its exit code and stderr.
    fn run_child(test: &str) -> (Option<i32>, String) {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "--nocapture",
                "--test-threads=1",
                test,
            ])
            .env(CHILD_ENV, "1")
            // A backtrace opens the binary: refused under the filter (documented).
            .env_remove("RUST_BACKTRACE")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    #[test]
    fn both_filters_compile() {
        filter(ThreadKind::Vcpu).unwrap();
        filter(ThreadKind::Metrics).unwrap();
    }

    /// A confined vCPU thread that opens a file (what an exploited device
    /// model would do first) is stopped: SIGSYS, the message, status 159.
    #[test]
    fn a_forbidden_system_call_from_a_confined_thread_ends_the_process() {
        let (code, err) = run_child("sandbox::tests::child_opens_a_file_under_the_vcpu_filter");
        assert_eq!(code, Some(EXIT_SECCOMP), "{err}");
        let openat = libc::SYS_openat.to_string();
        assert!(
            err.contains(&format!(
                "made system call {openat}, which its seccomp filter does not allow"
            )),
            "{err}"
        );
        assert!(!err.contains("CHILD REACHED THE END"), "{err}");
    }

    /// The allowed calls keep working under the filter (a thread writes,
    /// allocates, sleeps and joins), and an ioctl outside the list is refused.
    #[test]
    fn allowed_calls_work_and_other_ioctls_are_refused_under_the_filter() {
        let (code, err) =
            run_child("sandbox::tests::child_runs_allowed_calls_then_a_foreign_ioctl");
        assert!(err.contains("allowed calls ok"), "{err}");
        assert_eq!(code, Some(EXIT_SECCOMP), "{err}");
        assert!(
            err.contains(&format!("made system call {}", libc::SYS_ioctl)),
            "{err}"
        );
    }

    /// A confined thread that frees a large heap (what a vCPU thread does
    /// at its teardown) is not stopped by what the C library does then
    /// (glibc's heap trim reads /proc/sys/vm/overcommit_memory).
    #[test]
    fn a_confined_thread_frees_its_heap_without_a_filter_violation() {
        let (code, err) = run_child("sandbox::tests::child_frees_a_large_heap_under_the_filter");
        assert_eq!(code, Some(0), "{err}");
        assert!(err.contains("freed and exited"), "{err}");
        assert!(!err.contains("seccomp"), "{err}");
    }

    /// `--no-seccomp`: nothing is applied.
    #[test]
    fn disabled_filters_are_not_applied() {
        let (code, err) = run_child("sandbox::tests::child_opens_a_file_with_filters_off");
        assert_eq!(code, Some(0), "{err}");
        assert!(err.contains("opened"), "{err}");
    }

    #[test]
    #[ignore = "run in a child process by a_forbidden_system_call_from_a_confined_thread_ends_the_process"]
    fn child_opens_a_file_under_the_vcpu_filter() {
        if std::env::var_os(CHILD_ENV).is_none() {
            return;
        }
        std::thread::spawn(|| {
            confine(ThreadKind::Vcpu).unwrap();
            let _ = std::fs::File::open("/etc/hostname");
            eprintln!("CHILD REACHED THE END");
        })
        .join()
        .unwrap();
    }

    #[test]
    #[ignore = "run in a child process by allowed_calls_work_and_other_ioctls_are_refused_under_the_filter"]
    fn child_runs_allowed_calls_then_a_foreign_ioctl() {
        if std::env::var_os(CHILD_ENV).is_none() {
            return;
        }
        std::thread::spawn(|| {
            confine(ThreadKind::Vcpu).unwrap();
            let big = vec![7u8; 64 << 20];
            std::thread::sleep(std::time::Duration::from_millis(1));
            let lock = std::sync::Mutex::new(big.len());
            eprintln!("allowed calls ok ({})", *lock.lock().unwrap());
            drop(big);
            let mut pending: libc::c_int = 0;
            // SAFETY: FIONREAD writes an int to the pointer given.
            unsafe { libc::ioctl(libc::STDERR_FILENO, libc::FIONREAD, &mut pending) };
            eprintln!("CHILD REACHED THE END");
        })
        .join()
        .unwrap();
    }

    /// A panic in a confined thread is reported as a panic (its report asks
    /// for the working directory, which the first filter refused), and the
    /// thread's joiner sees it.
    #[test]
    fn a_panic_in_a_confined_thread_is_a_panic_not_a_filter_violation() {
        let (code, err) = run_child("sandbox::tests::child_panics_under_the_vcpu_filter");
        assert_eq!(code, Some(0), "{err}");
        assert!(err.contains("boom in a confined thread"), "{err}");
        assert!(err.contains("joined a panicked thread"), "{err}");
        assert!(!err.contains("seccomp"), "{err}");
    }

    #[test]
    #[ignore = "run in a child process by a_panic_in_a_confined_thread_is_a_panic_not_a_filter_violation"]
    fn child_panics_under_the_vcpu_filter() {
        if std::env::var_os(CHILD_ENV).is_none() {
            return;
        }
        let joined = std::thread::spawn(|| {
            confine(ThreadKind::Vcpu).unwrap();
            panic!("boom in a confined thread");
        })
        .join();
        assert!(joined.is_err());
        eprintln!("joined a panicked thread");
    }

    #[test]
    #[ignore = "run in a child process by a_confined_thread_frees_its_heap_without_a_filter_violation"]
    fn child_frees_a_large_heap_under_the_filter() {
        if std::env::var_os(CHILD_ENV).is_none() {
            return;
        }
        for kind in [ThreadKind::Vcpu, ThreadKind::Metrics] {
            std::thread::spawn(move || {
                // Chunks below the mmap threshold come from this thread's
                // arena; freed together they leave a top chunk far above
                // the default trim threshold.
                let chunks: Vec<Vec<u8>> = (0..256).map(|i| vec![i as u8; 100 << 10]).collect();
                confine(kind).unwrap();
                let more: Vec<Vec<u8>> = (0..256).map(|i| vec![i as u8; 100 << 10]).collect();
                drop(more);
                drop(chunks);
            })
            .join()
            .unwrap();
        }
        eprintln!("freed and exited");
    }

    #[test]
    #[ignore = "run in a child process by disabled_filters_are_not_applied"]
    fn child_opens_a_file_with_filters_off() {
        if std::env::var_os(CHILD_ENV).is_none() {
            return;
        }
        set_enabled(false);
        std::thread::spawn(|| {
            confine(ThreadKind::Vcpu).unwrap();
            std::fs::File::open("/proc/self/status").unwrap();
            eprintln!("opened");
        })
        .join()
        .unwrap();
    }
}
