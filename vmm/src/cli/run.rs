//! `ptiscope run`: one configuration on KVM (or QEMU), its outputs opened
//! before the boot, the summary printed and written as JSON.

use std::os::fd::AsFd;

use crate::backend::{HostWatch, Observed, Profile, Ran, Summarized};
use crate::cli::exit_code::{self, ExitCode as _};
use crate::cli::RunArgs;
use crate::machine::{RunOutcome, StopReason};
use crate::observe::live_metrics::LiveMetricsConfig;
use crate::output::{open_output, OutputFile, OutputQueue, OutputReport};
use crate::spec::guest::GuestKind;
use ptiscope_devices::escape_str;

/// Rows of the by-symbol list in the terminal (--json has all).
const SYMBOL_ROWS: usize = 25;

/// `ptiscope run`: one configuration, the perf-stat-like summary and
/// `--json`; returns the process exit code.
pub fn run(args: &RunArgs) -> i32 {
    if let Some(why) = args.backend_mismatch() {
        say!("ptiscope: error: {}", exit_code::escape_message(&why));
        return exit_code::USAGE;
    }
    let backend = match args.on.backend() {
        Ok(b) => b,
        Err(e) => {
            say!(
                "ptiscope: error: {}",
                exit_code::escape_message(&e.to_string())
            );
            return e.exit_code();
        }
    };
    let config = args.to_config(args.arch().embedded_image());
    let facts = match super::facts_for(backend.as_ref(), &config) {
        Ok(f) => f,
        Err(e) => {
            say!(
                "ptiscope: error: {}",
                exit_code::escape_message(&e.to_string())
            );
            return e.exit_code();
        }
    };
    let mut resolved = match crate::preflight::preflight(&config, backend.target(), &facts) {
        Ok(r) => r,
        Err(e) => {
            say!(
                "ptiscope: error: {}",
                exit_code::escape_message(&e.to_string())
            );
            return e.exit_code();
        }
    };
    if args.by_symbol {
        let why = if !backend.profile().capabilities.counts_kernel_by_address {
            Some("--by-symbol counts by address with ptiscope's QEMU TCG plugin: give --backend qemu (without --no-plugin)")
        } else if resolved.guest_kind.is_companion() {
            Some("--by-symbol is for Linux guests (their init sends the kernel's /proc/kallsyms): give --linux debian-amd64 (or a bzImage path)")
        } else {
            None
        };
        if let Some(why) = why {
            say!("ptiscope: error: {why}");
            return exit_code::USAGE;
        }
        // The init sends the symbols, the backend has the plugin count by
        // address, when the command line carries this word.
        resolved.boot.cmdline = format!("{} {}", resolved.boot.cmdline, crate::linux::SYMBOLS_WORD);
    }
    // Every output is opened (created, checked writable, a FIFO's reader
    // waited for up to --timeout) before the guest boots, so a bad path
    // costs no run and nothing blocks once it runs.
    let opened = (|| -> Result<_, crate::output::OpenError> {
        crate::output::check_distinct(&[
            ("--serial-out", args.serial_out.as_deref()),
            ("--metrics-out", args.metrics_out.as_deref()),
            ("--json", args.json.as_deref()),
            ("--record", args.record.as_deref()),
        ])?;
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
            .map(|p| crate::output::open_document("--json", p, args.timeout))
            .transpose()?;
        let record = args
            .record
            .as_deref()
            .map(|p| crate::output::open_document("--record", p, args.timeout))
            .transpose()?;
        Ok((serial, metrics, json, record))
    })();
    let (serial, metrics, json, record) = match opened {
        Ok(o) => o,
        Err(e) => {
            say!(
                "ptiscope: error: {}",
                exit_code::escape_message(&e.to_string())
            );
            return e.exit_code();
        }
    };
    if let Some(f) = serial {
        resolved.config.serial_out = crate::output::SerialOut::Opened(std::sync::Arc::new(f));
    }
    let mut watch = HostWatch::default();
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
                say!("ptiscope: error: cannot start the --metrics-out writer: {e}");
                return exit_code::INTERNAL;
            }
        };
        watch.live_metrics = Some(LiveMetricsConfig {
            interval: std::time::Duration::from_millis(ms),
            out,
            format: args.metrics_format,
        });
    }
    // The report's environment block is collected while the guest runs (the
    // image's SHA-256 is most of it; the main thread only waits meanwhile).
    let environment = Pending::start(facts.clone(), backend.as_ref(), &resolved);
    let ran = match backend.run(&resolved, watch) {
        Ok(ran) => ran,
        Err(e) => {
            say!(
                "ptiscope: error: {}",
                exit_code::escape_message(&e.to_string())
            );
            return e.exit_code();
        }
    };
    // The run's record, as its backend gave it (before this command adds
    // its environment and notes), for a backend that replays it.
    let mut failed_record = None;
    if let Some(f) = &record {
        let config = crate::cli::compare::config_words(&ran.outcome);
        let text = ran
            .record(backend.name(), &resolved, config)
            .described(&backend.profile())
            .to_json();
        failed_record = f.write_document(&text).err();
    }
    // What a run reports follows what observed it: the host (KVM's exits
    // and statistics, the telemetry page), or only the guest's console;
    // which summary it gets is `Ran::summary`'s choice, as for compare's runs.
    let Summarized {
        mut summary,
        host: linux_host,
    } = ran.summary(&resolved, crate::cli::compare::config_words(&ran.outcome));
    let host_observed = ran.host_observed();
    let Ran { outcome, observed } = ran;
    // A Linux run's end in words: a panic, a kernel that never reached the
    // init, an init that did not finish, PTI not as asked.
    let linux_end = match &resolved.guest_kind {
        GuestKind::Linux(l) => crate::cli::linux::diagnose(&outcome, l, linux_host.as_ref()),
        GuestKind::Companion => None,
    };
    if host_observed {
        print_summary(&outcome);
    } else {
        print_console(&backend.profile(), &outcome);
    }
    summary.environment = Some(environment.finish("run", &summary.config));
    if host_observed
        && resolved.guest_kind.is_companion()
        && !resolved
            .guest
            .workload
            .is_some_and(ptiscope_abi::options::Workload::runs_user_code)
    {
        summary
            .notes
            .insert(0, crate::report::note::Note::OnlyBooted);
    }
    let measurer = match observed {
        Observed::Host(m) => Some(m),
        Observed::Console { .. } | Observed::Recorded(_) => None,
    };
    let outputs: Vec<_> = outcome
        .outputs
        .iter()
        .chain(measurer.iter().flat_map(|m| m.live_output()))
        .cloned()
        .collect();
    // KVM destroys the VM when its last descriptor closes (the measurer's
    // stats fds), ~0.5 ms here: on another thread, while the report is
    // written.
    let teardown = std::thread::spawn(move || drop(measurer));
    // A Linux run diagnosed well measured, even where --timeout cut its
    // teardown after the @result line (its summary's note says so).
    let exit = end_of(&mut summary, linux_end, &resolved, &outcome);
    let code = report(&mut summary, &outputs, json.as_ref(), exit, failed_record);
    let _ = teardown.join();
    code
}

/// The exit code of a run that ran: a Linux guest's end as diagnosed
/// (said on stderr, recorded as the summary's `failure`), else the stop's;
/// recorded as the summary's `exit_code` (an output that then fails to be
/// written turns a 0 into 73 after the document is written).
fn end_of(
    summary: &mut crate::report::RunSummary,
    linux_end: Option<crate::cli::linux::LinuxEnd>,
    resolved: &crate::spec::ResolvedRun,
    outcome: &RunOutcome,
) -> i32 {
    let exit = match linux_end {
        Some(end) => {
            say!("ptiscope: error: {end}");
            summary.failure = Some((&end.failure).into());
            end.code
        }
        None if resolved.guest_kind.is_linux() => 0,
        None => outcome.exit_code(),
    };
    summary.exit_code = Some(exit);
    exit
}

/// Prints a run's summary (stderr, after the console) with what became of
/// its outputs, writes its `--json`, and returns the process exit code: the
/// run's, or 73 when the run succeeded but an output could not be written.
fn report(
    summary: &mut crate::report::RunSummary,
    outputs: &[OutputReport],
    json: Option<&OutputFile>,
    exit: i32,
    failed_record: Option<String>,
) -> i32 {
    let mut failed: Vec<String> = failed_record.into_iter().collect();
    for o in outputs {
        if let Some(note) = crate::report::note::Note::of_output(o) {
            if o.failed() {
                failed.push(note.to_string());
            }
            summary.notes.push(note);
        }
    }
    // One write: stderr is unbuffered, and the summary is many lines.
    eprint!("\n{}", summary.render_text());
    if let Some(b) = &summary.by_symbol {
        eprint!("{}", b.render_text(SYMBOL_ROWS));
    }
    // A run that ran writes its document however it stopped (a timeout, a
    // fault, a signal): its `stop`, `failure` and `exit_code` say how, so
    // that no reader has to parse stderr for it. Only a run refused or
    // failed before it ran writes none (docs/report-json.md).
    if let Some(f) = json {
        let text =
            serde_json::to_string_pretty(&summary.to_json()).unwrap_or_else(|_| "null".into());
        if let Err(e) = f.write_document(&text) {
            failed.push(e);
        }
    }
    for f in &failed {
        say!("ptiscope: error: {}", exit_code::escape_message(f));
    }
    // A failed run keeps its own status (the guest's, 124, 128 + signal);
    // the output error is printed either way.
    if exit == 0 && !failed.is_empty() {
        return exit_code::CANT_CREATE;
    }
    exit
}

/// The lines that introduce the report of a run no host-side observer
/// watched (`--backend qemu`: QEMU TCG), as its backend describes it: the
/// figures come from the guest's console and, with the TCG plugin, the
/// plugin's counts.
fn print_console(profile: &Profile, outcome: &RunOutcome) {
    let (label, who) = profile.console.map_or(("", ""), |c| (c.label, c.figures));
    say!("ptiscope: {} ({label})", outcome.stop);
    say!(
        "  time: run {:.1} ms; entry={}; {who}",
        outcome.run_time.as_secs_f64() * 1e3,
        outcome.entry.map_or("-", |e| e.name()),
    );
    for f in outcome.faults() {
        say!("  guest reported: {}", escape_str(f));
    }
}

/// The report's `environment` block for a run (docs/report-json.md), being
/// collected on a thread of its own while the guest runs: the image named
/// and hashed is the one the run booted (read once, at preflight), not the
/// file read again. What the probe found is added by [`Pending::finish`],
/// once the guest has stopped: a fact not known yet is probed then (probe
/// VMs), never beside the measured guest, and a boot does not wait for the
/// facts only the report needs.
pub struct Pending {
    thread: std::thread::JoinHandle<crate::report::Environment>,
    facts: std::sync::Arc<crate::probe::host::HostFacts>,
}

impl Pending {
    /// Starts collecting `run`'s environment under `backend`, the probe's
    /// findings aside.
    pub fn start(
        facts: std::sync::Arc<crate::probe::host::HostFacts>,
        backend: &dyn crate::backend::Backend,
        run: &crate::spec::ResolvedRun,
    ) -> Pending {
        let (identity, kernel, image) = (
            crate::backend::identity(backend),
            run.config.kernel.clone(),
            run.boot.image.clone(),
        );
        let thread_facts = facts.clone();
        Pending {
            thread: std::thread::spawn(move || {
                crate::report::Environment::collect_unprobed(
                    &thread_facts,
                    identity,
                    crate::cli::compare::guest_image_of(&kernel, Some(&image)),
                    Default::default(),
                )
            }),
            facts,
        }
    }

    /// The environment, with the probe's findings (probed now if this
    /// process and the host facts cache do not know them: call it once the
    /// guest has stopped) and the run's options under `key` (a panic while
    /// collecting it goes on here, where it would have happened before).
    pub fn finish(self, key: &str, options: &[String]) -> crate::report::Environment {
        let mut env = self
            .thread
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        env.probe = crate::report::environment::probe_findings(&self.facts, env.guest_image.elf32);
        env.options = [(key.to_owned(), options.to_vec())].into();
        env
    }
}

fn print_summary(o: &RunOutcome) {
    let e = &o.exits;
    say!("ptiscope: {}", o.stop_description());
    say!(
        "  time: run {:.1} ms, setup {:.1} ms; entry={} mem={} MiB; MSR 0x10a as KVM or the VMM answers it {} (the guest prints what it read)",
        o.run_time.as_secs_f64() * 1e3,
        o.setup_time.as_secs_f64() * 1e3,
        o.entry.map_or("-", |e| e.name()),
        o.mem_mib,
        o.arch_capabilities
            .map_or("absent".to_string(), |v| format!("{v:#x}")),
    );
    say!(
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
            say!(
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
        say!(
            "  phase markers: {} ({} invalid)",
            o.phases.len() as u64 + o.dropped_phase_events,
            e.invalid_phase_markers
        );
    }
    // Guest text: escaped before it reaches the terminal.
    for f in o.faults() {
        say!("  guest reported: {}", escape_str(f));
    }
    if let Some(p) = o.machine_lines.iter().find(|l| l.starts_with("@panic")) {
        say!("  guest reported: {}", escape_str(p));
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
        say!("  last console lines:");
        for l in &o.console_tail {
            say!("    | {}", escape_str(l));
        }
    }
}
