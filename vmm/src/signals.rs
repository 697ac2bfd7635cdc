//! Stopping a vCPU from another thread, and SIGINT/SIGTERM/SIGHUP.
//!
//! A vCPU is stopped by sending its thread [`kick_signal`]; the handler sets
//! `immediate_exit = 1` in that vCPU's `kvm_run`, so KVM_RUN returns EINTR
//! whether the signal lands while the guest runs, while it is halted inside
//! KVM, or just before the thread enters KVM_RUN (a handler that only sets a
//! flag can lose that last race). Callers still re-kick until the vCPU
//! thread acknowledges, as belt and braces.

use std::cell::Cell;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::null_mut;
use std::sync::atomic::{fence, Ordering};
use std::sync::OnceLock;

use kvm_bindings::kvm_run;
use kvm_ioctls::VcpuFd;
use libc::{c_int, c_void, siginfo_t};
use vmm_sys_util::signal::{register_signal_handler, SIGRTMIN};

thread_local! {
    // The kvm_run of the vCPU this thread runs, for the kick handler. Const
    // initialised and destructor-free, so reading it in a signal handler is sound.
    static KVM_RUN: Cell<*mut kvm_run> = const { Cell::new(null_mut()) };
}

/// The real-time signal used to kick vCPU threads.
pub fn kick_signal() -> c_int {
    SIGRTMIN()
}

extern "C" fn kick_handler(_: c_int, _: *mut siginfo_t, _: *mut c_void) {
    let _ = KVM_RUN.try_with(|p| {
        let run = p.get();
        if !run.is_null() {
            // SAFETY: `run` is the mmap'd kvm_run of the vCPU owned by this
            // thread's `KickableVcpu`, which clears the pointer before the vCPU
            // (and its mapping) is dropped. A volatile byte store is
            // async-signal-safe.
            unsafe { std::ptr::write_volatile(&raw mut (*run).immediate_exit, 1) };
        }
    });
    fence(Ordering::SeqCst);
}

/// Errors installing the kick handler.
#[derive(Debug, thiserror::Error, Clone)]
pub enum SignalError {
    /// Installing the kick signal's handler failed.
    #[error("installing the vCPU kick signal handler: {0}")]
    Install(String),
    /// Unblocking the kick signal on the vCPU thread failed.
    #[error("unblocking the vCPU kick signal: {0}")]
    Unblock(String),
    /// Creating the signalfd for termination signals failed.
    #[error("creating a signalfd for SIGINT/SIGTERM/SIGHUP: {0}")]
    SignalFd(String),
}

/// Installs the kick handler (once per process).
pub fn install_kick_handler() -> Result<(), SignalError> {
    static INSTALLED: OnceLock<Result<(), SignalError>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            register_signal_handler(kick_signal(), kick_handler)
                .map_err(|e| SignalError::Install(e.to_string()))
        })
        .clone()
}

/// The current thread's registration as the kick target of one vCPU: while
/// it lives, a kick sent to this thread sets that vCPU's `immediate_exit`.
/// Not `Send`: the registration is per thread. Used by the VMM's vCPU
/// threads ([`KickableVcpu`]) and by the probe, which runs its vCPU on the
/// calling thread.
pub struct KickRegistration {
    _not_send: PhantomData<*const ()>,
}

impl KickRegistration {
    /// Registers `vcpu` for kicks on this thread and makes sure the kick
    /// signal is not blocked here. The registration must be dropped before
    /// the vCPU is (it holds a pointer to the vCPU's `kvm_run` mapping).
    pub fn register(vcpu: &mut VcpuFd) -> Result<Self, SignalError> {
        install_kick_handler()?;
        vcpu.set_kvm_immediate_exit(0);
        let run: *mut kvm_run = vcpu.get_kvm_run();
        KVM_RUN.with(|p| p.set(run));
        vmm_sys_util::signal::unblock_signal(kick_signal())
            .map_err(|e| SignalError::Unblock(e.to_string()))?;
        Ok(KickRegistration {
            _not_send: PhantomData,
        })
    }
}

impl Drop for KickRegistration {
    fn drop(&mut self) {
        // A late kick then finds null and does nothing.
        KVM_RUN.with(|p| p.set(null_mut()));
    }
}

/// Sends the kick signal to thread `tid`.
///
/// # Safety
/// `tid` must be a live thread of this process (not yet joined).
pub unsafe fn kick(tid: libc::pthread_t) -> std::io::Result<()> {
    // SAFETY: the caller guarantees `tid` is alive; the handler is installed
    // by whoever registered a vCPU on that thread.
    match unsafe { libc::pthread_kill(tid, kick_signal()) } {
        0 => Ok(()),
        rc => Err(std::io::Error::from_raw_os_error(rc)),
    }
}

/// A vCPU registered for kicks on the current thread (it owns the vCPU, so
/// the registration cannot outlive it).
pub struct KickableVcpu {
    // Declared first: dropped (pointer cleared) before the vCPU.
    _registration: KickRegistration,
    /// The registered vCPU.
    pub vcpu: VcpuFd,
}

impl KickableVcpu {
    /// Registers `vcpu` as the current thread's kick target.
    pub fn new(mut vcpu: VcpuFd) -> Result<Self, SignalError> {
        let registration = KickRegistration::register(&mut vcpu)?;
        Ok(KickableVcpu {
            _registration: registration,
            vcpu,
        })
    }
}

/// The signals that stop a run cleanly: SIGINT (Ctrl-C), SIGTERM and
/// SIGHUP (the terminal went away). Each ends the process with 128 + its
/// number once the summary is printed.
pub const TERMINATION_SIGNALS: [c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// [`TERMINATION_SIGNALS`] as a signal set.
pub fn termination_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in TERMINATION_SIGNALS {
            libc::sigaddset(&mut set, sig);
        }
        set
    }
}

/// The name of a termination signal, for messages.
pub fn describe(signal: c_int) -> String {
    match signal {
        libc::SIGINT => "interrupted by SIGINT".into(),
        libc::SIGTERM => "stopped by SIGTERM".into(),
        libc::SIGHUP => "stopped by SIGHUP".into(),
        n => format!("stopped by signal {n}"),
    }
}

/// Waits up to `timeout` for a termination signal and takes it (they are
/// blocked, see [`block_termination_signals`]); `None` if none came. Used
/// where the process waits outside the VMM's event loop (opening a FIFO,
/// the QEMU backend).
pub fn wait_termination(timeout: std::time::Duration) -> Option<c_int> {
    let set = termination_set();
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: valid set and timeout pointers; a null siginfo is allowed.
    let sig = unsafe { libc::sigtimedwait(&set, null_mut(), &ts) };
    (sig > 0).then_some(sig)
}

/// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread (and the threads
/// it creates later), so that they are delivered through
/// [`TerminationSignals`] instead of killing the process. Call it early in
/// `main`.
pub fn block_termination_signals() {
    let set = termination_set();
    // SAFETY: valid set pointer, null old-set pointer.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, null_mut()) };
}

/// A signalfd reporting SIGINT/SIGTERM/SIGHUP (effective only where they are blocked).
pub struct TerminationSignals {
    fd: OwnedFd,
}

impl TerminationSignals {
    /// A non-blocking signalfd for SIGINT/SIGTERM/SIGHUP (they arrive here
    /// only where the caller blocks them).
    pub fn new() -> Result<Self, SignalError> {
        let set = termination_set();
        // SAFETY: -1 creates a new signalfd; the set is initialised; we check the result.
        let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) };
        if fd < 0 {
            return Err(SignalError::SignalFd(
                std::io::Error::last_os_error().to_string(),
            ));
        }
        // SAFETY: `fd` is a fresh descriptor we own.
        Ok(TerminationSignals {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// The next pending signal number, if any.
    pub fn read(&self) -> Option<i32> {
        // SAFETY: signalfd_siginfo is plain data.
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: reading at most `size` bytes into `info`.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), (&raw mut info).cast::<c_void>(), size) };
        (n == size as isize).then_some(info.ssi_signo as i32)
    }
}

impl AsRawFd for TerminationSignals {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
