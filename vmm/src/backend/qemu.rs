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
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ptiscope_devices::{ConsoleRecorder, ConsoleSink};

use crate::machine::exit::ExitCounts;
use crate::machine::loader::{self, LoadError};
use crate::machine::memory::MemoryLayout;
use crate::machine::{RunConfig, RunOutcome, SerialOut, StopReason};
use crate::preflight::cmdline::{self, CmdlineError, Entry};

/// Errors of a QEMU-backed run.
#[derive(Debug, thiserror::Error)]
pub enum QemuError {
    #[error(transparent)]
    Memory(#[from] crate::machine::memory::MemoryError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Cmdline(#[from] CmdlineError),
    #[error("cannot start {binary}: {source} (install QEMU: `apt-get install qemu-system-x86`)")]
    Spawn {
        binary: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write the guest console to {path}: {source}")]
    SerialOut {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("QEMU failed ({how}) before the guest reported a status{}", if stderr.is_empty() { String::new() } else { format!(": {stderr}") })]
    Qemu { how: String, stderr: String },
}

impl QemuError {
    /// The process exit code for this error (see `ptiscope run --help`).
    pub fn exit_code(&self) -> i32 {
        use crate::machine::exit_code::*;
        match self {
            QemuError::Memory(_) | QemuError::Cmdline(_) => USAGE,
            QemuError::Load(LoadError::Read { .. }) => NO_IMAGE,
            QemuError::Load(LoadError::Scratch(..)) => INTERNAL,
            QemuError::Load(_) => BAD_IMAGE,
            QemuError::Spawn { .. } => KVM_UNAVAILABLE,
            QemuError::SerialOut { .. } => CANT_CREATE,
            QemuError::Io { .. } | QemuError::Qemu { .. } => VM_ERROR,
        }
    }
}

/// The QEMU system emulator for an image: i386 for ELF32, x86_64 otherwise.
pub fn binary_for(image: &[u8]) -> &'static str {
    if loader::is_elf32(image) {
        "qemu-system-i386"
    } else {
        "qemu-system-x86_64"
    }
}

/// `entry=auto` under QEMU: TCG delivers every entry, so the native one of
/// each flavour (SYSCALL on x86_64, SYSENTER on i386).
fn native_entry(image: &[u8]) -> Entry {
    if loader::is_elf32(image) {
        Entry::Sysenter
    } else {
        Entry::Syscall
    }
}

/// The guest command line for QEMU: as for KVM, without `telemetry=`.
fn guest_cmdline(config: &RunConfig, image: &[u8]) -> Result<String, QemuError> {
    let layout = MemoryLayout::new(config.mem_mib)?;
    let mut guest = config.guest.clone();
    if guest.entry == Some(Entry::Auto) {
        guest.entry = Some(native_entry(image));
    }
    let line = cmdline::build(&guest, layout.telemetry_addr())?;
    Ok(line
        .split_whitespace()
        .filter(|w| !w.starts_with("telemetry="))
        .collect::<Vec<_>>()
        .join(" "))
}

/// A private temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<Self, QemuError> {
        let base = std::env::temp_dir();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        for attempt in 0..16u32 {
            let dir = base.join(format!(
                "ptiscope-qemu-{}-{nanos:08x}-{attempt}",
                std::process::id()
            ));
            // `create_dir`, not `create_dir_all`: an existing path (or a
            // symlink planted there) is not ours to use.
            match std::fs::create_dir(&dir) {
                Ok(()) => return Ok(TempDir(dir)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(source) => {
                    return Err(QemuError::Io {
                        what: "creating a temporary directory for the image",
                        source,
                    })
                }
            }
        }
        Err(QemuError::Io {
            what: "creating a temporary directory for the image",
            source: std::io::Error::from(std::io::ErrorKind::AlreadyExists),
        })
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
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

/// SIGINT or SIGTERM, if one is pending. `ptiscope` blocks both for the
/// KVM backend's signalfd; here they are taken with a zero-timeout
/// `sigtimedwait` so that a QEMU run stops as cleanly as a KVM one.
fn pending_termination() -> Option<i32> {
    // SAFETY: an all-zero sigset_t is a valid value to initialise.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t; the calls only modify it.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
    }
    let zero = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid set and timeout; a null siginfo pointer is allowed.
    let sig = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &zero) };
    (sig > 0).then_some(sig)
}

/// Boots `config.kernel` under QEMU TCG and waits for it (or the timeout,
/// or SIGINT/SIGTERM).
pub fn run_qemu(config: &RunConfig) -> Result<RunOutcome, QemuError> {
    let setup_start = Instant::now();
    let image = loader::read_image(&config.kernel)?;
    let name = config.kernel.describe();
    let layout = MemoryLayout::new(config.mem_mib)?;
    loader::check_image(&image, &name, &layout)?;
    let cmdline = guest_cmdline(config, &image)?;
    let entry = cmdline
        .split_whitespace()
        .find_map(|w| w.strip_prefix("entry="))
        .and_then(|e| <Entry as clap::ValueEnum>::from_str(e, false).ok());

    // Everything that can fail is done before QEMU starts, so that no
    // error leaves it running.
    let out: Option<Box<dyn std::io::Write + Send>> = match &config.serial_out {
        SerialOut::Stdout => Some(Box::new(std::io::stdout())),
        SerialOut::Discard => None,
        SerialOut::File(path) => Some(Box::new(std::fs::File::create(path).map_err(|source| {
            QemuError::SerialOut {
                path: path.clone(),
                source,
            }
        })?)),
    };
    // QEMU reads the kernel from a file: a private temporary copy.
    let dir = TempDir::new()?;
    let elf = dir.0.join("guest.elf");
    std::fs::write(&elf, &image).map_err(|source| QemuError::Io {
        what: "writing the image for QEMU",
        source,
    })?;

    let binary = binary_for(&image);
    let machine = if loader::is_elf32(&image) {
        "pc"
    } else {
        "microvm"
    };
    let mut cmd = Command::new(binary);
    cmd.args(["-M", machine, "-accel", "tcg", "-cpu", "max"])
        .args(["-m", &format!("{}M", config.mem_mib)])
        .args(["-nodefaults", "-no-user-config", "-display", "none"])
        // A triple fault resets the machine; without this QEMU would boot
        // the guest again instead of stopping.
        .arg("-no-reboot")
        .args(["-serial", "stdio"])
        .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=4"])
        .arg("-kernel")
        .arg(&elf)
        .args(["-append", &cmdline])
        .args(&config.qemu_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
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
    let run_time = run_start.elapsed();
    let _ = reader.join();
    let qemu_stderr = err_reader.join().unwrap_or_default();

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
    })
}
