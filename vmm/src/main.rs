//! The `ptiscope` binary.

use std::process::ExitCode;

use clap::Parser;
use ptiscope::cli::exit_code::{self, ExitCode as _};
use ptiscope::cli::{Backend, Cli, Command, PagetablesArgs, ProbeArgs, RunArgs};
use ptiscope::machine::RunOutcome;
use ptiscope::observe::live_metrics::LiveMetricsConfig;
use ptiscope::observe::measure::Measurer;
use ptiscope::output::{open_output, OutputFile, OutputQueue, OutputReport};
use ptiscope::{run_vm, StopReason};
use ptiscope_devices::escape_str;
use std::os::fd::AsFd;

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format_target(false)
        .init();
    // Before any thread exists, so that every thread inherits the mask and
    // SIGINT/SIGTERM arrive through the VMM's signalfd (a clean stop).
    ptiscope::machine::signals::block_termination_signals();

    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            // Help and version are not errors; usage errors get EX_USAGE, not
            // clap's 2, which is a guest status here.
            return code(if e.use_stderr() { exit_code::USAGE } else { 0 });
        }
    };
    ptiscope::sandbox::set_enabled(!cli.no_seccomp);
    match cli.command {
        Some(Command::Run(args)) => run(&args),
        Some(Command::Compare(args)) => code(ptiscope::cli::compare::run(&args)),
        Some(Command::Sweep(args)) => code(ptiscope::cli::sweep::run(&args)),
        Some(Command::Probe(args)) => probe(&args),
        Some(Command::Pagetables(args)) => pagetables(&args),
        // No command: the README's main job, the default comparison.
        None => match Cli::try_parse_from(["ptiscope", "compare"]) {
            Ok(Cli {
                command: Some(Command::Compare(args)),
                ..
            }) => code(ptiscope::cli::compare::run(&args)),
            _ => code(exit_code::INTERNAL),
        },
    }
}

fn code(c: i32) -> ExitCode {
    ExitCode::from(u8::try_from(c).unwrap_or(u8::MAX))
}

fn run(args: &RunArgs) -> ExitCode {
    if let Some(why) = args.backend_mismatch() {
        eprintln!("ptiscope: error: {why}");
        return code(exit_code::USAGE);
    }
    let config = args.to_config(args.arch.embedded_image());
    let target = match args.backend {
        Backend::Kvm => ptiscope::Target::Kvm,
        Backend::Qemu => ptiscope::Target::QemuTcg,
    };
    let mut resolved = match ptiscope::preflight(&config, target) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ptiscope: error: {e}");
            return code(e.exit_code());
        }
    };
    // Every output is opened (created, checked writable, a FIFO's reader
    // waited for up to --timeout) before the guest boots, so a bad path
    // costs no run and nothing blocks once it runs.
    let opened = (|| -> Result<_, ptiscope::output::OpenError> {
        let serial = args
            .serial_out
            .as_deref()
            .map(|p| open_output("--serial-out", p, args.timeout))
            .transpose()?;
        let metrics = match (args.metrics_interval, &args.metrics_out) {
            (Some(_), Some(p)) => Some(Some(open_output("--metrics-out", p, args.timeout)?)),
            (Some(_), None) => Some(None),
            (None, _) => None,
        };
        let json = args
            .json
            .as_deref()
            .map(|p| open_output("--json", p, args.timeout))
            .transpose()?;
        Ok((serial, metrics, json))
    })();
    let (serial, metrics, json) = match opened {
        Ok(o) => o,
        Err(e) => {
            eprintln!("ptiscope: error: {e}");
            return code(e.exit_code());
        }
    };
    if let Some(f) = serial {
        resolved.config.serial_out = ptiscope::SerialOut::Opened(std::sync::Arc::new(f));
    }
    if args.backend == Backend::Qemu {
        return run_qemu(&resolved, json.as_ref());
    }
    let mut measurer = Measurer::new();
    if let (Some(ms), Some(file)) = (args.metrics_interval, metrics) {
        let queue = match &file {
            Some(f) => f.try_clone_file().and_then(|c| {
                OutputQueue::start("--metrics-out", &f.path().display().to_string(), c)
            }),
            None => OutputQueue::for_std("--metrics-out", std::io::stderr().as_fd(), "stderr"),
        };
        let out = match queue {
            Ok(q) => q,
            Err(e) => {
                eprintln!("ptiscope: error: cannot start the --metrics-out writer: {e}");
                return code(exit_code::INTERNAL);
            }
        };
        measurer = measurer.with_live_metrics(LiveMetricsConfig {
            interval: std::time::Duration::from_millis(ms),
            out,
            format: args.metrics_format,
        });
    }
    match ptiscope::run(&resolved, &mut measurer) {
        Ok(outcome) => {
            print_summary(&outcome);
            let mut summary =
                measurer.summary(&outcome, ptiscope::cli::compare::config_words(&outcome));
            summary.environment = Some(environment("kvm", &config, "run", &summary.config));
            let outputs: Vec<_> = outcome
                .outputs
                .iter()
                .chain(measurer.live_output())
                .cloned()
                .collect();
            report(&mut summary, &outputs, json.as_ref(), outcome.exit_code())
        }
        Err(e) => {
            eprintln!("ptiscope: error: {e}");
            code(e.exit_code())
        }
    }
}

/// `ptiscope pagetables`: boot the guest with a one-call getpid workload,
/// walk both copies of its address space at the phase-begin exit, report.
fn pagetables(args: &PagetablesArgs) -> ExitCode {
    use ptiscope::machine::loader::{self, KernelSource};
    use ptiscope::observe::pagetables::{EntryArea, Inspector, Paging};
    let kernel = match &args.kernel {
        Some(p) => KernelSource::Path(p.clone()),
        None => KernelSource::Embedded(args.arch.embedded_image()),
    };
    let image = match loader::read_image(&kernel) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("ptiscope: error: {e}");
            return code(exit_code::NO_IMAGE);
        }
    };
    let entry_area = match EntryArea::from_elf(&image) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("ptiscope: error: {}: {e}", kernel.describe());
            return code(exit_code::BAD_IMAGE);
        }
    };
    let paging = if loader::is_elf32(&image) {
        Paging::Pae
    } else {
        Paging::FourLevel
    };
    let mut config = ptiscope::RunConfig::new(kernel);
    config.mem_mib = args.mem;
    config.serial_out = ptiscope::SerialOut::Discard;
    // SIGINT/SIGTERM/SIGHUP are blocked in main: without this they would
    // wait for the run's timeout.
    config.handle_signals = true;
    config.guest.pti = args.pti;
    config.guest.workload = Some(ptiscope::preflight::cmdline::Workload::Getpid);
    config.guest.iterations = Some(1);
    config.guest.extra = args.cmdline.clone();
    let json = match args
        .json
        .as_deref()
        .map(|p| open_output("--json", p, ptiscope::preflight::request::DEFAULT_TIMEOUT))
        .transpose()
    {
        Ok(j) => j,
        Err(e) => {
            eprintln!("ptiscope: error: {e}");
            return code(e.exit_code());
        }
    };
    let mut inspector = Inspector::new(paging, entry_area)
        .with_deferred_text(EntryArea::deferred_switch_text(&image));
    let outcome = match run_vm(&config, &mut inspector) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("ptiscope: error: {e}");
            return code(e.exit_code());
        }
    };
    let inspection = match inspector.result {
        Some(Ok(i)) => i,
        Some(Err(e)) => {
            eprintln!("ptiscope: error: the page-table walk failed: {e}");
            return code(exit_code::VM_ERROR);
        }
        None => {
            eprintln!(
                "ptiscope: error: the guest marked no phase, so there was no moment to walk its tables ({})",
                outcome.stop_description()
            );
            // The guest's own failure (a fault, a bad command line) is its
            // status; a guest that exited 0 without a phase is the walk's.
            return code(match outcome.exit_code() {
                0 => exit_code::VM_ERROR,
                status => status,
            });
        }
    };
    print!("{}", inspection.render());
    if let Some(f) = &json {
        let mut value = serde_json::to_value(&inspection).unwrap_or_default();
        if let Some(o) = value.as_object_mut() {
            let options = ptiscope::cli::compare::config_words(&outcome);
            let env = environment("kvm", &config, "pagetables", &options);
            o.insert(
                "environment".into(),
                serde_json::to_value(env).unwrap_or_default(),
            );
        }
        let text = serde_json::to_string_pretty(&value).unwrap_or_else(|_| "null".into());
        if let Err(e) = f.write_document(&text) {
            eprintln!("ptiscope: error: {e}");
            return code(exit_code::CANT_CREATE);
        }
    }
    code(outcome.exit_code())
}

/// Prints a run's summary (stderr, after the console) with what became of
/// its outputs, writes its `--json`, and returns the process exit code: the
/// run's, or 73 when the run succeeded but an output could not be written.
fn report(
    summary: &mut ptiscope::report::RunSummary,
    outputs: &[OutputReport],
    json: Option<&OutputFile>,
    exit: i32,
) -> ExitCode {
    let mut failed = Vec::new();
    for o in outputs {
        if let Some(line) = o.describe() {
            summary.notes.push(line.clone());
            if o.failed() {
                failed.push(line);
            }
        }
    }
    // One write: stderr is unbuffered, and the summary is many lines.
    eprint!("\n{}", summary.render_text());
    if let Some(f) = json {
        let text =
            serde_json::to_string_pretty(&summary.to_json()).unwrap_or_else(|_| "null".into());
        if let Err(e) = f.write_document(&text) {
            failed.push(e);
        }
    }
    for f in &failed {
        eprintln!("ptiscope: error: {f}");
    }
    // A failed run keeps its own status (the guest's, 124, 128 + signal);
    // the output error is printed either way.
    if exit == 0 && !failed.is_empty() {
        return code(exit_code::CANT_CREATE);
    }
    code(exit)
}

/// `run --backend qemu`: the guest under QEMU TCG, reported from its console.
fn run_qemu(resolved: &ptiscope::ResolvedRun, json: Option<&OutputFile>) -> ExitCode {
    match ptiscope::backend::qemu::run_resolved(resolved) {
        Ok(outcome) => {
            eprintln!("ptiscope: {} (backend qemu, TCG)", outcome.stop);
            eprintln!(
                "  time: run {:.1} ms; entry={}; every figure below is guest-reported",
                outcome.run_time.as_secs_f64() * 1e3,
                outcome.entry.map_or("-", |e| e.name()),
            );
            for f in outcome.faults() {
                eprintln!("  guest reported: {}", escape_str(f));
            }
            let mut summary = ptiscope::observe::measure::summary_from_result(
                &outcome,
                ptiscope::cli::compare::config_words(&outcome),
            );
            summary.environment = Some(environment(
                "qemu",
                &resolved.config,
                "run",
                &summary.config,
            ));
            report(&mut summary, &outcome.outputs, json, outcome.exit_code())
        }
        Err(e) => {
            eprintln!("ptiscope: error: {e}");
            code(e.exit_code())
        }
    }
}

/// The report's `environment` block for a run (docs/report-json.md).
/// `options` are recorded under `key` (`run`, `pagetables`).
fn environment(
    backend: &str,
    config: &ptiscope::RunConfig,
    key: &str,
    options: &[String],
) -> ptiscope::report::Environment {
    ptiscope::report::Environment::collect(
        backend,
        ptiscope::cli::compare::guest_image(&config.kernel),
        [(key.to_owned(), options.to_vec())].into(),
    )
}

fn print_summary(o: &RunOutcome) {
    let e = &o.exits;
    eprintln!("ptiscope: {}", o.stop_description());
    eprintln!(
        "  time: run {:.1} ms, setup {:.1} ms; entry={} mem={} MiB; MSR 0x10a as KVM or the VMM answers it {} (the guest prints what it read)",
        o.run_time.as_secs_f64() * 1e3,
        o.setup_time.as_secs_f64() * 1e3,
        o.entry.map_or("-", |e| e.name()),
        o.mem_mib,
        o.arch_capabilities
            .map_or("absent".to_string(), |v| format!("{v:#x}")),
    );
    eprintln!(
        "  userspace exits: {} (port out: serial {} exit {} phase {} unknown {}; port in: serial {} unknown {}; \
         mmio r/w {}/{}; hlt {}; intr {}; shutdown {}; internal error {}; fail entry {}; other {})",
        e.total(),
        e.io_out.serial,
        e.io_out.exit,
        e.io_out.phase,
        e.io_out.unknown,
        e.io_in.serial,
        e.io_in.unknown + e.io_in.exit + e.io_in.phase,
        e.mmio_read,
        e.mmio_write,
        e.hlt,
        e.intr,
        e.shutdown,
        e.internal_error,
        e.fail_entry,
        e.other,
    );
    if o.vcpus.len() > 1 {
        for v in &o.vcpus {
            eprintln!(
                "  vCPU {}: {} userspace exits; {}",
                v.index,
                v.exits.total(),
                if v.stopped_itself {
                    format!("stopped the VM: {}", v.stop)
                } else {
                    "stopped with the VM".to_string()
                }
            );
        }
    }
    if !o.phases.is_empty() || e.invalid_phase_markers > 0 {
        eprintln!(
            "  phase markers: {} ({} invalid)",
            o.phases.len() as u64 + o.dropped_phase_events,
            e.invalid_phase_markers
        );
    }
    // Guest text: escaped before it reaches the terminal.
    for f in o.faults() {
        eprintln!("  guest reported: {}", escape_str(f));
    }
    if let Some(p) = o.machine_lines.iter().find(|l| l.starts_with("@panic")) {
        eprintln!("  guest reported: {}", escape_str(p));
    }
    if matches!(
        o.stop,
        StopReason::Shutdown { .. }
            | StopReason::InternalError { .. }
            | StopReason::FailEntry { .. }
            | StopReason::Unexpected { .. }
            | StopReason::Timeout { .. }
    ) && !o.console_tail.is_empty()
    {
        eprintln!("  last console lines:");
        for l in &o.console_tail {
            eprintln!("    | {}", escape_str(l));
        }
    }
}

fn probe(args: &ProbeArgs) -> ExitCode {
    match ptiscope::probe::run(&ptiscope::probe::ProbeOptions::default()) {
        Ok(report) => {
            if args.json {
                // Every JSON report records where it came from; the probe's
                // own findings are the report itself, the block adds the rest.
                let mut value = serde_json::to_value(&report).unwrap_or_default();
                if let Some(o) = value.as_object_mut() {
                    let env = ptiscope::report::Environment::collect(
                        "kvm",
                        ptiscope::report::environment::GuestImage::new(
                            "none (the probe's own tiny guests)",
                            None,
                        ),
                        Default::default(),
                    );
                    o.insert(
                        "environment".into(),
                        serde_json::to_value(env).unwrap_or_default(),
                    );
                }
                match serde_json::to_string_pretty(&value) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("ptiscope: error: serializing the probe report: {e}");
                        return code(exit_code::INTERNAL);
                    }
                }
            } else {
                print!("{report}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ptiscope: error: {e}");
            code(exit_code::KVM_UNAVAILABLE)
        }
    }
}
