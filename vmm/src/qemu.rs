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

use crate::cmdline::{self, CmdlineError, Entry};
use crate::exit::ExitCounts;
use crate::loader::{self, LoadError};
use crate::memory::MemoryLayout;
use crate::vm::{RunConfig, RunOutcome, SerialOut, StopReason};

/// Errors of a QEMU-backed run.
#[derive(Debug, thiserror::Error)]
pub enum QemuError {
    #[error(transparent)]
    Memory(#[from] crate::memory::MemoryError),
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
    #[error("QEMU failed (exit {code:?}) before the guest reported a status: {stderr}")]
    Qemu { code: Option<i32>, stderr: String },
}

impl QemuError {
    /// The process exit code for this error (see `ptiscope run --help`).
    pub fn exit_code(&self) -> i32 {
        use crate::vm::exit_code::*;
        match self {
            QemuError::Memory(_) | QemuError::Cmdline(_) => USAGE,
            QemuError::Load(LoadError::Read { .. }) => NO_IMAGE,
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

/// Boots `config.kernel` under QEMU TCG and waits for it (or the timeout).
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

    // QEMU reads the kernel from a file: a private temporary copy.
    let dir = std::env::temp_dir().join(format!("ptiscope-qemu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|source| QemuError::Io {
        what: "creating a temporary directory for the image",
        source,
    })?;
    let elf = dir.join("guest.elf");
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
        .args(["-serial", "stdio"])
        .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=4"])
        .arg("-kernel")
        .arg(&elf)
        .args(["-append", &cmdline])
        .args(&config.qemu_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|source| QemuError::Spawn {
        binary: binary.to_string(),
        source,
    })?;
    let setup_time = setup_start.elapsed();
    let run_start = Instant::now();

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
    let recorder = Arc::new(Mutex::new(ConsoleRecorder::new()));
    let mut sink = ConsoleSink::new(out, recorder.clone());
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
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
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(source) => {
                let _ = child.kill();
                return Err(QemuError::Io {
                    what: "waiting for QEMU",
                    source,
                });
            }
        }
    };
    let run_time = run_start.elapsed();
    let _ = reader.join();
    let qemu_stderr = err_reader.join().unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);

    let stop = match status {
        None => StopReason::Timeout {
            after_ms: config.timeout.as_millis() as u64,
        },
        // isa-debug-exit: QEMU exits with (status << 1) | 1.
        Some(s) => match s.code() {
            Some(c) if c & 1 == 1 => StopReason::GuestExit {
                status: (c as u32) >> 1,
            },
            code => {
                return Err(QemuError::Qemu {
                    code,
                    stderr: qemu_stderr.trim().to_string(),
                })
            }
        },
    };
    let mut rec = recorder.lock().unwrap_or_else(|p| p.into_inner());
    rec.flush_partial();
    let stats = rec.stats();
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
