//! The seccomp sandbox, end to end: the real binary's vCPU and metrics
//! threads run under their filters by default, and `--no-seccomp` turns
//! them off. (That a filtered thread's forbidden call ends the process is
//! tested in `vmm/src/sandbox.rs`, in a child process.)

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;

/// The `Seccomp:` mode (0 none, 2 filter) of each thread of `pid`, by name,
/// once `settled` says the threads are where the test looks (each confines
/// itself a moment after it starts: the vCPU thread just before its first
/// KVM_RUN, the metrics thread after opening its stats), or after
/// `deadline`.
fn seccomp_modes(
    pid: u32,
    deadline: Duration,
    settled: fn(&HashMap<String, u32>) -> bool,
) -> HashMap<String, u32> {
    let started = Instant::now();
    loop {
        let mut modes = HashMap::new();
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for task in tasks.flatten() {
                let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
                let status =
                    std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
                let mode = status
                    .lines()
                    .find_map(|l| l.strip_prefix("Seccomp:"))
                    .and_then(|v| v.trim().parse().ok());
                if let Some(mode) = mode {
                    modes.insert(comm.trim().to_string(), mode);
                }
            }
        }
        if settled(&modes) || started.elapsed() > deadline {
            return modes;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a long workload with the metrics thread on, reads the threads'
/// seccomp modes while it runs (once `settled`, and again `linger` later:
/// a filter, once set, stays), then stops it with SIGTERM.
fn modes_of_a_run(
    extra: &[&str],
    settled: fn(&HashMap<String, u32>) -> bool,
    linger: Duration,
) -> HashMap<String, u32> {
    let child = ptiscope()
        .args(extra)
        .args([
            "run",
            "--workload",
            "getpid",
            "--iterations",
            "100000000",
            "--timeout",
            "20",
            "--metrics-interval",
            "100",
            "--metrics-out",
            "/dev/null",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut modes = seccomp_modes(child.id(), Duration::from_secs(5), settled);
    if !linger.is_zero() {
        std::thread::sleep(linger);
        modes = seccomp_modes(child.id(), Duration::ZERO, |_| true);
    }
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(143), "{err}");
    assert!(!err.contains("seccomp"), "{err}");
    modes
}

#[test]
fn vcpu_and_metrics_threads_run_under_seccomp_by_default() {
    if !kvm_or_skip("seccomp threads") {
        return;
    }
    // Both confined (a look between a thread's start and its filter saw
    // the metrics thread unconfined once).
    let modes = modes_of_a_run(
        &[],
        |m| m.get("vcpu0") == Some(&2) && m.get("metrics") == Some(&2),
        Duration::ZERO,
    );
    assert_eq!(modes.get("vcpu0"), Some(&2), "{modes:?}");
    assert_eq!(modes.get("metrics"), Some(&2), "{modes:?}");
    // The main thread builds VMs and writes reports: not confined (documented).
    assert_eq!(modes.get("ptiscope"), Some(&0), "{modes:?}");
    // Nor are the output writer threads (documented in docs/running.md):
    // they write queued bytes to descriptors opened before the boot.
    assert_eq!(modes.get("output"), Some(&0), "{modes:?}");
}

#[test]
fn no_seccomp_leaves_every_thread_unconfined() {
    if !kvm_or_skip("--no-seccomp") {
        return;
    }
    // Both started, and looked at again a second later, long past the
    // moment they would have confined themselves (milliseconds).
    let modes = modes_of_a_run(
        &["--no-seccomp"],
        |m| m.contains_key("vcpu0") && m.contains_key("metrics"),
        Duration::from_secs(1),
    );
    assert!(modes.contains_key("vcpu0"), "{modes:?}");
    assert!(modes.values().all(|&m| m == 0), "{modes:?}");
}

/// The vCPU thread logs a warning about an unknown port; with stderr a
/// terminal the logger then asks whether it is one (ioctl TCGETS), which
/// the first filter refused (exit 159). Found by hand, under `script`.
#[test]
fn a_warning_from_the_vcpu_thread_to_a_terminal_is_allowed() {
    use std::io::Read;
    use std::os::fd::{FromRawFd, OwnedFd};
    if !kvm_or_skip("vCPU warning to a terminal") {
        return;
    }
    // out 0x80 (an unknown port), then exit status 7 through port 0xf4.
    let code = [0xe6, 0x80, 0xb8, 0x07, 0x00, 0x00, 0x00, 0xe7, 0xf4, 0xf4];
    let elf = scratch("tty-warning").join("warn.elf");
    write_pvh_elf(&elf, 0x100000, &code);
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two descriptors to the pointers given; the
    // name, termios and winsize pointers may be null.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    if rc != 0 {
        ptiscope::test_support::skip(
            "vCPU warning to a terminal",
            &format!("no pseudo-terminal: {}", std::io::Error::last_os_error()),
        );
        return;
    }
    // SAFETY: openpty returned two open descriptors that nothing else owns.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let status = ptiscope()
        .args(["run", "--timeout", "10", "--kernel"])
        .arg(&elf)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(slave))
        .status()
        .unwrap();
    let mut out = Vec::new();
    // The child has exited and the parent's copy of the slave is closed
    // (moved into the Command): reading ends with EIO once drained.
    let _ = std::fs::File::from(master).read_to_end(&mut out);
    let err = String::from_utf8_lossy(&out);
    assert_eq!(status.code(), Some(7), "{err}");
    assert!(err.contains("unknown address 0x80"), "{err}");
    assert!(!err.contains("seccomp"), "{err}");
}
