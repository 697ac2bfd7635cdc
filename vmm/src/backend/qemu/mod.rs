//! `--backend qemu`: the same guest image, the same command line, run under
//! QEMU's TCG (software emulation) instead of our VMM on KVM.
//!
//! For hosts whose KVM cannot run a flavour (the i386 PAE guest on kvm_pvm,
//! which refuses 32-bit paging) and for paths the host lacks (PCID under a
//! QEMU whose TCG has it). It is slower, and the host sees nothing of the
//! guest: no KVM statistics, no VM exits, no telemetry page (QEMU does not
//! reserve one; the guest keeps its counters in its own memory). Every figure
//! of such a run comes from the guest's console (`@result`), and the reports
//! say so, unless the TCG plugin is loaded (the default, `--no-plugin` to
//! run without): `qemu-plugin/` counts instructions, CR3 writes and the
//! other events per vCPU inside QEMU and writes them to a file that
//! [`crate::observe::qemu_plugin`] parses; those rows are host-observed
//! (source `qemu-plugin`).
//!
//! Here: the run (`run_resolved`: everything that can fail done first, then
//! QEMU started, waited for and its output read). The concerns under it:
//! `binary` (which QEMU, its version), `cpu_models`, `plugin` (the TCG
//! plugin's API, file, thread mode and output file), `child` (the process:
//! its descriptors, its death with ptiscope, its stop) and `console` (the
//! first panic line kept).

mod binary;
mod child;
mod console;
mod cpu_models;
mod error;
mod plugin;

use std::io::Read;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ptiscope_devices::{ConsoleRecorder, ConsoleSink};

use crate::machine::exit::ExitCounts;
use crate::machine::loader;
use crate::machine::{RunOutcome, StopReason};
use crate::observe::qemu_plugin::PluginOutput;
use crate::output::DRAIN_GRACE;
use crate::spec::guest::GuestKind;
use crate::spec::linux::LinuxArch;
use crate::spec::ResolvedRun;

use self::child::{pending_termination, remove_new_sockets, socket_paths, Child, ImageFd};
use self::console::{tail_with_panic, PanicScan};
use self::plugin::OutFd;

pub use binary::{binary_for, binary_of, parse_qemu_version, qemu_support, QemuSupport};
pub use child::die_with_ptiscope_inheriting;
pub use cpu_models::{cpu_model_refusal, cpu_models, parse_cpu_models};
pub use error::QemuError;
pub use plugin::{find_plugin, plugin_api_for, plugin_for, tcg_accel};

/// Boots a run resolved for [`Target::QemuTcg`](crate::spec::Target::QemuTcg) under QEMU and waits for it
/// (or the timeout, or SIGINT/SIGTERM): how it ended, and what the TCG
/// plugin wrote.
pub fn run_resolved(run: &ResolvedRun) -> Result<(RunOutcome, PluginOutput), QemuError> {
    let setup_start = Instant::now();
    let config = &run.config;
    let boot = &run.boot;
    let image = &boot.image;
    let cmdline = boot.cmdline.clone();
    let entry = run.guest.entry;
    let linux = run.guest_kind.is_linux();

    // Everything that can fail is done before QEMU starts, so that no
    // error leaves it running.
    let (out, console_queue) = crate::output::console_output(&config.serial_out, config.timeout)?;
    let image_fd = ImageFd::new(image)?;
    let image_raw = image_fd.0.as_raw_fd();
    // The initrd (a Linux guest's initramfs), in a memfd of its own.
    let initrd_fd = boot.initrd.as_deref().map(ImageFd::new).transpose()?;
    let initrd_raw = initrd_fd.as_ref().map(|f| f.0.as_raw_fd());

    let binary = binary_of(run);
    // The plugin is checked before QEMU starts: a QEMU too old or built
    // without plugins is said so, and nothing boots.
    let plugin = if config.qemu_plugin {
        let (path, api) = plugin_for(binary)?;
        Some((path, api, OutFd::new()?))
    } else {
        None
    };
    let plugin_raw = plugin.as_ref().map(|(_, _, f)| f.0.as_raw_fd());
    // A CPU model QEMU does not have would end QEMU at once (`unable to
    // find CPU model`), or `help` would print its list and exit as if the
    // guest had: refused here, before QEMU starts.
    if let Some(why) = config
        .qemu_cpu
        .as_deref()
        .and_then(|m| cpu_model_refusal(binary, m))
    {
        return Err(QemuError::CpuModel(format!(
            "cpu={}: {why}",
            ptiscope_devices::escape_str(config.qemu_cpu.as_deref().unwrap_or_default())
        )));
    }
    // `--by-symbol` (the init's symbol word on a Linux command line, with
    // the plugin): QEMU's isa-debugcon takes the init's kernel symbols into
    // a memfd of its own, which the plugin copies into its file at exit,
    // and the plugin counts the phase's calls by address.
    let symbols = if linux
        && plugin.is_some()
        && cmdline
            .split_ascii_whitespace()
            .any(|w| w == crate::linux::SYMBOLS_WORD)
    {
        Some(OutFd::new()?)
    } else {
        None
    };
    let symbols_raw = symbols.as_ref().map(|f| f.0.as_raw_fd());
    // Linux 6.1 under QEMU 7.2's microvm never gets a working timer in TCG
    // (it stops after "tsc: Marking TSC unstable"): Linux guests boot on pc.
    let machine = if loader::is_elf32(image) || linux {
        "pc"
    } else {
        "microvm"
    };
    let mut cmd = Command::new(binary);
    let accel = tcg_accel(plugin.as_ref().map(|(_, api, _)| *api), config.cpus);
    let cpu_model = config.qemu_cpu.as_deref().unwrap_or("max");
    cmd.args(["-M", machine, "-accel", accel, "-cpu", cpu_model])
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
    if let (Some((path, _, _)), Some(fd)) = (&plugin, plugin_raw) {
        // A Linux guest: kernel = the architecture's kernel half, and the
        // init's user-mode marker pair (`umark=`) instead of kernel-mode
        // markers (Linux's own `out dx, eax` are PCI configuration writes).
        let (kernel, marks, umark) = match &run.guest_kind {
            GuestKind::Linux(l) => {
                let (kernel, marks) =
                    crate::observe::qemu_plugin::kernel_ranges(l.arch == LinuxArch::I386, false);
                let port = crate::observe::qemu_plugin::LINUX_MARK_PORT;
                (kernel, marks, format!(",umark={port:#x}"))
            }
            GuestKind::Companion => {
                let companion = crate::report::requested(&cmdline).is_some();
                let (kernel, marks) =
                    crate::observe::qemu_plugin::kernel_ranges(loader::is_elf32(image), companion);
                (kernel, marks, String::new())
            }
        };
        // QEMU's option syntax: a comma inside a value is doubled.
        let file = path.display().to_string().replace(',', ",,");
        let by_pc = match symbols_raw {
            Some(s) => format!(",pcs=1,syms=/proc/self/fd/{s}"),
            None => String::new(),
        };
        cmd.arg("-plugin").arg(format!(
            "file={file},out=/proc/self/fd/{fd},kernel={},marks={}{umark}{by_pc}",
            crate::observe::qemu_plugin::ranges_arg(&kernel),
            crate::observe::qemu_plugin::ranges_arg(&marks),
        ));
    }
    if let Some(s) = symbols_raw {
        cmd.args([
            "-chardev",
            &format!("file,id=ptiscope-symbols,path=/proc/self/fd/{s}"),
            "-device",
            &format!(
                "isa-debugcon,iobase={:#x},chardev=ptiscope-symbols",
                ptiscope_abi::port::SYMBOLS
            ),
        ]);
    }
    cmd.args(&config.qemu_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // The descriptors of the image, the initrd, the plugin's file and the
    // symbols' memfd are the only things QEMU inherits.
    let inherited: Vec<libc::c_int> = std::iter::once(image_raw)
        .chain(initrd_raw)
        .chain(plugin_raw)
        .chain(symbols_raw)
        .collect();
    die_with_ptiscope_inheriting(&mut cmd, inherited);
    // Sockets a --qemu-arg names that QEMU will make: removed when it ends.
    let fresh_sockets: Vec<_> = socket_paths(&config.qemu_args)
        .into_iter()
        .filter(|p| std::fs::symlink_metadata(p).is_err())
        .collect();
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
        let mut panic = PanicScan::default();
        while let Some(Ok(n @ 1..)) = stdout.as_mut().map(|s| s.read(&mut buf)) {
            panic.feed(&buf[..n]);
            let _ = std::io::Write::write_all(&mut sink, &buf[..n]);
        }
        sink.flush_out();
        panic.finish()
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
    remove_new_sockets(&fresh_sockets);
    drop(image_fd);
    drop(initrd_fd);
    // The plugin has copied it into its own file.
    drop(symbols);
    let run_time = run_start.elapsed();
    // QEMU is gone, so its stdout ends: the reader only forwards what is
    // left into the console queue, which never blocks.
    let panic_line = reader.join().ok().flatten();
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
            Some(0) if guest_ran => StopReason::Reset,
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
    let plugin_output = match plugin {
        None => PluginOutput::Off,
        Some((_, _, mut f)) => match f.read() {
            Ok(b) if b.is_empty() => PluginOutput::Missing(
                "the plugin wrote nothing (QEMU did not exit normally: timeout or signal?)".into(),
            ),
            Ok(b) => PluginOutput::File(b),
            Err(e) => PluginOutput::Missing(format!("reading the plugin's file: {e}")),
        },
    };
    let outcome = RunOutcome {
        stop,
        stopped_by: None,
        vcpus: Vec::new(),
        run_time,
        setup_time,
        exits: ExitCounts::default(),
        machine_lines: rec.machine_lines().to_vec(),
        banner: rec.banner().map(str::to_string),
        console_tail: tail_with_panic(rec.tail().map(str::to_string).collect(), panic_line),
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
    };
    Ok((outcome, plugin_output))
}
