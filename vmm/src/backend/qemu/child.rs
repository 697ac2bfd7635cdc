//! The QEMU child process: what it inherits (the image in a memfd, exactly
//! the descriptors given), that it dies with ptiscope, how it is stopped
//! (SIGTERM, then SIGKILL) and the sockets a `--qemu-arg` made, removed.

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use super::error::QemuError;

/// Makes a QEMU child die with ptiscope, however ptiscope ends (a SIGKILL,
/// a panic, an exit that runs no code of ours), and inherit exactly `fds`
/// besides its standard streams (their close-on-exec flag cleared in the
/// child). The nested backend starts its QEMU the same way.
pub fn die_with_ptiscope_inheriting(cmd: &mut Command, fds: Vec<libc::c_int>) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec and calls
    // only async-signal-safe functions (prctl, getppid, fcntl), touching
    // no memory of the parent's other threads (`fds` was moved in before
    // the fork).
    unsafe {
        cmd.pre_exec(move || {
            // QEMU dies with the thread that spawned it (the main thread of
            // `run`/`compare`).
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // ptiscope died before the prctl: the signal will never come.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("ptiscope exited while starting QEMU"));
            }
            for &fd in &fds {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// The image for QEMU, in an anonymous memory file (memfd): QEMU reads
/// `-kernel` from a path, and `/proc/self/fd/N` of a descriptor it inherits
/// is one. Nothing is written to the file system, so nothing is left behind
/// however ptiscope ends (SIGKILL included), and no other user can swap the
/// file between our write and QEMU's read.
pub(super) struct ImageFd(pub(super) std::os::fd::OwnedFd);

impl ImageFd {
    pub(super) fn new(image: &[u8]) -> Result<Self, QemuError> {
        use std::os::fd::FromRawFd;
        let io_err = |source| QemuError::Io {
            what: "creating an in-memory file for the image",
            source,
        };
        // SAFETY: a valid NUL-terminated name and flags; the result is checked.
        let fd = unsafe { libc::memfd_create(c"ptiscope-guest".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io_err(std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a fresh descriptor owned by nobody else.
        let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let mut file = std::fs::File::from(owned);
        std::io::Write::write_all(&mut file, image).map_err(io_err)?;
        Ok(ImageFd(file.into()))
    }
}

/// How long QEMU gets to quit on SIGTERM (it then removes the sockets it
/// listens on) before SIGKILL.
pub(super) const QEMU_STOP_GRACE: Duration = Duration::from_millis(500);

/// The QEMU child, stopped and reaped on drop unless it already ended:
/// SIGTERM first, so that QEMU cleans up after itself (a `--qemu-arg`
/// socket's file), SIGKILL after [`QEMU_STOP_GRACE`].
pub(super) struct Child(pub(super) std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            // SAFETY: kill(2) on our own child's pid, not yet reaped (so
            // not reused); no memory is involved.
            unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
            let until = Instant::now() + QEMU_STOP_GRACE;
            while Instant::now() < until {
                if let Ok(Some(_)) = self.0.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The Unix socket paths a `--qemu-arg` may make QEMU listen on
/// (`unix:PATH` of a character device, `path=PATH` of `-chardev socket`).
pub(super) fn socket_paths(args: &[String]) -> Vec<std::path::PathBuf> {
    let mut paths = Vec::new();
    for arg in args {
        let socket_chardev = arg.starts_with("socket,");
        for part in arg.split(',') {
            let p = part
                .strip_prefix("unix:")
                .or_else(|| part.strip_prefix("path=").filter(|_| socket_chardev));
            if let Some(p) = p.filter(|p| !p.is_empty()) {
                paths.push(std::path::PathBuf::from(p));
            }
        }
    }
    paths
}

/// Removes the sockets QEMU made for `--qemu-arg`s: the paths of
/// [`socket_paths`] that did not exist before it started and are sockets
/// now (QEMU leaves them behind when the guest ends it through
/// isa-debug-exit, which exits without QEMU's cleanup).
pub(super) fn remove_new_sockets(fresh: &[std::path::PathBuf]) {
    use std::os::unix::fs::FileTypeExt;
    for p in fresh {
        if std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket()) {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// SIGINT, SIGTERM or SIGHUP, if one is pending. `ptiscope` blocks them
/// for the KVM backend's signalfd; here they are taken with a zero-timeout
/// `sigtimedwait` so that a QEMU run stops as cleanly as a KVM one.
pub(super) fn pending_termination() -> Option<i32> {
    crate::signals::wait_termination(Duration::ZERO)
}
