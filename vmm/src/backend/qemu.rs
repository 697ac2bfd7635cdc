//! `--backend qemu`: the same guest image, the same command line, run under
//! QEMU's TCG (software emulation) instead of our VMM on KVM.
//!
//! For hosts whose KVM cannot run a flavour (the i386 PAE guest on kvm_pvm,
//! which refuses 32-bit paging) and for paths the host lacks (PCID under a
//! QEMU whose TCG has it). It is slower, and the host sees nothing of the
//! guest: no KVM statistics, no VM exits, no telemetry page (QEMU does not
//! reserve one; the guest keeps its counters in its own memory). Every figure
//! of such a run comes from the guest's console (`@result`), and the reports
//! say so.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ptiscope_devices::{ConsoleRecorder, ConsoleSink};

use crate::machine::exit::ExitCounts;
use crate::machine::loader;
use crate::machine::{RunOutcome, StopReason};
use crate::output::{OpenError, DRAIN_GRACE};
use crate::preflight::{PreflightError, ResolvedRun, RunConfig, Target};

/// Errors of a QEMU-backed run.
#[derive(Debug, thiserror::Error)]
pub enum QemuError {
    /// Resolving the run failed before QEMU started.
    #[error(transparent)]
    Preflight(#[from] PreflightError),
    /// QEMU could not be started.
    #[error("cannot start {binary}: {source} (install QEMU: `apt-get install qemu-system-x86`)")]
    Spawn {
        /// The QEMU binary tried.
        binary: String,
        /// The spawn error.
        #[source]
        source: std::io::Error,
    },
    /// An I/O step around QEMU failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// An output (`--json`, `--serial-out`, ...) could not be opened.
    #[error(transparent)]
    Output(#[from] OpenError),
    /// QEMU ended before the guest reported its exit status.
    #[error("QEMU failed ({how}) before the guest reported a status{}", if stderr.is_empty() { String::new() } else { format!(": {stderr}") })]
    Qemu {
        /// How QEMU ended (`exit N`, `killed by signal N`).
        how: String,
        /// What QEMU printed on stderr, trimmed.
        stderr: String,
    },
}

/// The QEMU system emulator for an image: i386 for ELF32, x86_64 otherwise.
pub fn binary_for(image: &[u8]) -> &'static str {
    if loader::is_elf32(image) {
        "qemu-system-i386"
    } else {
        "qemu-system-x86_64"
    }
}

/// The image for QEMU, in an anonymous memory file (memfd): QEMU reads
/// `-kernel` from a path, and `/proc/self/fd/N` of a descriptor it inherits
/// is one. Nothing is written to the file system, so nothing is left behind
/// however ptiscope ends (SIGKILL included), and no other user can swap the
/// file between our write and QEMU's read.
struct ImageFd(std::os::fd::OwnedFd);

impl ImageFd {
    fn new(image: &[u8]) -> Result<Self, QemuError> {
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

/// The QEMU child, killed and reaped on drop unless it already ended.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// SIGINT, SIGTERM or SIGHUP, if one is pending. `ptiscope` blocks them
/// for the KVM backend's signalfd; here they are taken with a zero-timeout
/// `sigtimedwait` so that a QEMU run stops as cleanly as a KVM one.
fn pending_termination() -> Option<i32> {
    crate::machine::signals::wait_termination(Duration::ZERO)
}

/// Settles `config` for QEMU ([`crate::preflight::preflight`]) and runs it.
pub fn run_qemu(config: &RunConfig) -> Result<RunOutcome, QemuError> {
    let resolved = crate::preflight::preflight(config, Target::QemuTcg)?;
    run_resolved(&resolved)
}

/// Boots a run resolved for [`Target::QemuTcg`] under QEMU and waits for it
/// (or the timeout, or SIGINT/SIGTERM).
pub fn run_resolved(run: &ResolvedRun) -> Result<RunOutcome, QemuError> {
    let setup_start = Instant::now();
    let config = &run.config;
    let image = &run.image;
    let cmdline = run.cmdline.clone();
    let entry = run.guest.entry;

    // Everything that can fail is done before QEMU starts, so that no
    // error leaves it running.
    let (out, console_queue) = crate::output::console_output(&config.serial_out, config.timeout)?;
    let image_fd = ImageFd::new(image)?;
    let image_raw = image_fd.0.as_raw_fd();
    // A Linux guest's initramfs, in a memfd of its own.
    let linux = run.linux.as_deref();
    let initrd_fd = linux.map(|l| ImageFd::new(&l.initramfs)).transpose()?;
    let initrd_raw = initrd_fd.as_ref().map(|f| f.0.as_raw_fd());

    let binary = match linux {
        Some(l) => match l.arch {
            crate::linux::LinuxArch::X86_64 => "qemu-system-x86_64",
            crate::linux::LinuxArch::I386 => "qemu-system-i386",
        },
        None => binary_for(image),
    };
    // Linux 6.1 under QEMU 7.2's microvm never gets a working timer in TCG
    // (it stops after "tsc: Marking TSC unstable"): Linux guests boot on pc.
    let machine = if loader::is_elf32(image) || linux.is_some() {
        "pc"
    } else {
        "microvm"
    };
    let mut cmd = Command::new(binary);
    cmd.args(["-M", machine, "-accel", "tcg", "-cpu", "max"])
        .args(["-m", &format!("{}M", config.mem_mib)])
        .args(["-smp", &config.cpus.to_string()])
        .args(["-nodefaults", "-no-user-config", "-display", "none"])
        // A triple fault resets the machine; without this QEMU would boot
        // the guest again instead of stopping.
        .arg("-no-reboot")
        .args(["-serial", "stdio"])
        .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=4"])
        .arg("-kernel")
        .arg(format!("/proc/self/fd/{image_raw}"))
        .args(["-append", &cmdline]);
    if let Some(fd) = initrd_raw {
        cmd.arg("-initrd").arg(format!("/proc/self/fd/{fd}"));
    }
    cmd.args(&config.qemu_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec and calls
    // only async-signal-safe functions (prctl, getppid, fcntl), touching
    // no memory of the parent's other threads.
    unsafe {
        cmd.pre_exec(move || {
            // QEMU dies with the thread that spawned it (this one, the main
            // thread of `run`/`compare`): SIGKILL of ptiscope, a panic, any
            // exit that runs no code of ours still stops QEMU.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // ptiscope died before the prctl: the signal will never come.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("ptiscope exited while starting QEMU"));
            }
            // The image's descriptor (and a Linux guest's initramfs) are
            // the one thing QEMU inherits.
            for fd in std::iter::once(image_raw).chain(initrd_raw) {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut child = Child(cmd.spawn().map_err(|source| QemuError::Spawn {
        binary: binary.to_string(),
        source,
    })?);
    let setup_time = setup_start.elapsed();
    let run_start = Instant::now();

    let recorder = Arc::new(Mutex::new(ConsoleRecorder::new()));
    let mut sink = ConsoleSink::new(out, recorder.clone());
    let mut stdout = child.0.stdout.take();
    let mut stderr = child.0.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Some(Ok(n @ 1..)) = stdout.as_mut().map(|s| s.read(&mut buf)) {
            let _ = std::io::Write::write_all(&mut sink, &buf[..n]);
        }
        sink.flush_out();
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = stderr.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    });

    let deadline = run_start + config.timeout;
    enum End {
        Exited(std::process::ExitStatus),
        Timeout,
        Signal(i32),
    }
    let end = loop {
        match child.0.try_wait() {
            Ok(Some(status)) => break End::Exited(status),
            Ok(None) => {
                if let Some(sig) = pending_termination() {
                    break End::Signal(sig);
                }
                if Instant::now() >= deadline {
                    break End::Timeout;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(source) => {
                return Err(QemuError::Io {
                    what: "waiting for QEMU",
                    source,
                })
            }
        }
    };
    // Stops QEMU if it is still running (timeout, signal).
    drop(child);
    drop(image_fd);
    drop(initrd_fd);
    let run_time = run_start.elapsed();
    // QEMU is gone, so its stdout ends: the reader only forwards what is
    // left into the console queue, which never blocks.
    let _ = reader.join();
    let qemu_stderr = err_reader.join().unwrap_or_default();
    let outputs: Vec<_> = console_queue
        .map(|q| q.finish_by(Instant::now() + DRAIN_GRACE))
        .into_iter()
        .collect();

    let mut rec = recorder.lock().unwrap_or_else(|p| p.into_inner());
    rec.flush_partial();
    let stats = rec.stats();
    // QEMU's own failures (bad options, no image) exit 1 with a message on
    // stderr before the guest ran: only a run where the guest printed, or
    // QEMU said nothing, is the guest's.
    let guest_ran = stats.bytes > 0 || qemu_stderr.trim().is_empty();
    let stop = match end {
        End::Timeout => StopReason::Timeout {
            after_ms: config.timeout.as_millis() as u64,
        },
        End::Signal(signal) => StopReason::Signal { signal },
        // isa-debug-exit: QEMU exits with (status << 1) | 1. QEMU's own
        // failures exit 1 too, before the guest has printed anything.
        End::Exited(s) => match s.code() {
            Some(c) if c & 1 == 1 && guest_ran => StopReason::GuestExit {
                status: (c as u32) >> 1,
            },
            // With -no-reboot, a guest reset (triple fault) ends QEMU with 0.
            Some(0) if guest_ran => StopReason::Shutdown { regs: None },
            code => {
                use std::os::unix::process::ExitStatusExt;
                let how = match (code, s.signal()) {
                    (Some(c), _) => format!("exit {c}"),
                    (None, Some(sig)) => format!("killed by signal {sig}"),
                    (None, None) => "no exit status".into(),
                };
                return Err(QemuError::Qemu {
                    how,
                    stderr: qemu_stderr.trim().to_string(),
                });
            }
        },
    };
    Ok(RunOutcome {
        stop,
        stopped_by: None,
        vcpus: Vec::new(),
        run_time,
        setup_time,
        exits: ExitCounts::default(),
        machine_lines: rec.machine_lines().to_vec(),
        banner: rec.banner().map(str::to_string),
        console_tail: rec.tail().map(str::to_string).collect(),
        console_bytes: stats.bytes,
        dropped_machine_lines: stats.dropped_machine_lines,
        phases: Vec::new(),
        dropped_phase_events: 0,
        unknown_accesses: 0,
        cmdline,
        entry,
        arch_capabilities: None,
        mem_mib: config.mem_mib,
        telemetry_addr: 0,
        outputs,
    })
}
