//! `ptiscope compare` (and `ptiscope` with no arguments): a baseline and a
//! compare configuration, each run `--runs` times, interleaved (B C, C B,
//! B C, ...) so that slow drifts of a noisy host hit both sides alike; the
//! per-call rates of every run go into the mmtests compare-kernels table.

use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, Instant};

use std::collections::BTreeMap;

use crate::cli::exit_code::{self, ExitCode};
use crate::cli::{
    Backend, CompareArgs, Runs, DEFAULT_MAX_RUNS, DEFAULT_TARGET_CI_PCT, MIN_AUTO_RUNS,
};
use crate::machine::loader::KernelSource;
use crate::machine::RunOutcome;
use crate::observe::measure::{rate_name, summary_from_result, Measurer};
use crate::output::{open_output, OutputFile};
use crate::preflight::cmdline::{CpuVuln, EntryChoice, PtiMode, Switch, Workload};
use crate::preflight::{host, preflight, ResolvedRun, RunConfig, SerialOut, Target};
use crate::report::environment::{Environment, GuestImage};
use crate::report::stats::Verdict;
use crate::report::{CompareTable, Condition, Metric, RunSummary};
use ptiscope_devices::escape_str;

/// One side of the comparison.
#[derive(Debug, Clone)]
pub struct SideSpec {
    /// Column label: the options as given (`pti=on,pcid=on`).
    pub label: String,
    pub config: RunConfig,
}

/// One side, settled for its backend.
#[derive(Debug, Clone)]
pub struct Side {
    pub label: String,
    pub run: ResolvedRun,
}

impl Backend {
    /// Where preflight settles a run for this backend.
    pub fn target(self) -> Target {
        match self {
            Backend::Kvm => Target::Kvm,
            Backend::Qemu => Target::QemuTcg,
        }
    }
}

/// Errors in `--baseline`/`--compare` options.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SideError {
    #[error("{opts:?}: {word:?} is not key=value")]
    NotKeyValue { opts: String, word: String },
    #[error("{opts:?}: unknown key {key:?} (keys: pti pcid entry workload iterations cpu_vuln mem cmdline pti_switch)")]
    UnknownKey { opts: String, key: String },
    #[error("{opts:?}: bad value for {key}: {why}")]
    BadValue {
        opts: String,
        key: String,
        why: String,
    },
}

fn enum_value<T: clap::ValueEnum>(v: &str) -> Result<T, String> {
    T::from_str(v, false).map_err(|_| {
        let names: Vec<String> = T::value_variants()
            .iter()
            .filter_map(|x| x.to_possible_value().map(|p| p.get_name().to_string()))
            .collect();
        format!("{v:?} (possible values: {})", names.join(", "))
    })
}

/// A guest-ABI option value, with the accepted names in the message.
fn abi_value<T: std::str::FromStr>(
    v: &str,
    names: impl IntoIterator<Item = &'static str>,
) -> Result<T, String> {
    v.parse::<T>().map_err(|_| {
        let names: Vec<&str> = names.into_iter().collect();
        format!("{v:?} (possible values: {})", names.join(", "))
    })
}

/// Builds one side's run configuration from the common arguments and its options.
pub fn parse_side(
    opts: &str,
    args: &CompareArgs,
    embedded: &'static [u8],
) -> Result<SideSpec, SideError> {
    let kernel = match &args.kernel {
        Some(p) => KernelSource::Path(p.clone()),
        None => KernelSource::Embedded(embedded),
    };
    let mut c = RunConfig::new(kernel);
    c.mem_mib = args.mem;
    c.cpus = args.cpus;
    c.timeout = args.timeout;
    c.serial_out = SerialOut::Discard;
    c.handle_signals = true;
    c.guest.workload = Some(args.workload);
    c.guest.iterations = Some(args.iterations);
    c.qemu_args = args.qemu_arg.clone();
    for word in opts.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        let Some((k, v)) = word.split_once('=') else {
            return Err(SideError::NotKeyValue {
                opts: opts.into(),
                word: word.into(),
            });
        };
        let bad = |why: String| SideError::BadValue {
            opts: opts.into(),
            key: k.into(),
            why,
        };
        match k.trim() {
            "pti" => {
                c.guest.pti =
                    Some(abi_value::<PtiMode>(v, PtiMode::NAMES.iter().copied()).map_err(bad)?)
            }
            "pcid" => {
                c.guest.pcid =
                    Some(abi_value::<Switch>(v, Switch::NAMES.iter().copied()).map_err(bad)?)
            }
            "entry" => {
                c.guest.entry = abi_value::<EntryChoice>(v, EntryChoice::names()).map_err(bad)?
            }
            "cpu_vuln" | "cpu-vuln" => c.cpu_vuln = enum_value::<CpuVuln>(v).map_err(bad)?,
            "workload" => {
                c.guest.workload =
                    Some(abi_value::<Workload>(v, Workload::NAMES.iter().copied()).map_err(bad)?)
            }
            "iterations" => {
                c.guest.iterations = Some(
                    v.parse()
                        .map_err(|_| bad(format!("{v:?} is not a count")))?,
                )
            }
            "mem" => c.mem_mib = crate::cli::parse_mem(v).map_err(bad)?,
            "cmdline" => c.guest.extra = format!("{} {v}", c.guest.extra).trim().to_string(),
            // The 2020 RFC's strategy; a guest option, passed on its command line.
            "pti_switch" => {
                let s: ptiscope_abi::options::PtiSwitch =
                    abi_value(v, ptiscope_abi::options::PtiSwitch::NAMES.iter().copied())
                        .map_err(bad)?;
                c.guest.extra = format!("{} pti_switch={s}", c.guest.extra)
                    .trim()
                    .to_string();
            }
            other => {
                return Err(SideError::UnknownKey {
                    opts: opts.into(),
                    key: other.into(),
                })
            }
        }
    }
    Ok(SideSpec {
        label: opts.trim().to_string(),
        config: c,
    })
}

/// The configuration words of a run (its guest command line without the
/// telemetry address, which is the VMM's business).
pub fn config_words(outcome: &RunOutcome) -> Vec<String> {
    outcome
        .cmdline
        .split_whitespace()
        .filter(|w| !w.starts_with("telemetry="))
        .map(str::to_string)
        .collect()
}

/// One measured run; `Err` carries the exit code and what to print.
pub fn run_measured(
    resolved: &ResolvedRun,
    backend: Backend,
) -> Result<(RunOutcome, RunSummary), (i32, String)> {
    let mut m = Measurer::new();
    let run = match backend {
        Backend::Kvm => {
            crate::machine::run(resolved, &mut m).map_err(|e| (e.exit_code(), e.to_string()))
        }
        Backend::Qemu => {
            crate::backend::qemu::run_resolved(resolved).map_err(|e| (e.exit_code(), e.to_string()))
        }
    };
    match run {
        Ok(o) => {
            let s = match backend {
                Backend::Kvm => m.summary(&o, config_words(&o)),
                Backend::Qemu => summary_from_result(&o, config_words(&o)),
            };
            if o.exit_code() == 0 && s.phase.is_none() {
                return Err((
                    exit_code::VM_ERROR,
                    format!(
                        "the guest marked no workload phase, so there is nothing to compare \
                         (workload {}: use one that measures, e.g. getpid)",
                        resolved.guest.workload.map_or("-", Workload::name)
                    ),
                ));
            }
            if o.exit_code() != 0 {
                // Guest text: escaped before it reaches the terminal.
                let mut msg = o.stop_description();
                for f in o.faults() {
                    msg.push_str(&format!("\n  guest reported: {}", escape_str(f)));
                }
                if !o.console_tail.is_empty() {
                    msg.push_str("\n  last console lines:");
                    for l in &o.console_tail {
                        msg.push_str(&format!("\n    | {}", escape_str(l)));
                    }
                }
                return Err((o.exit_code(), msg));
            }
            Ok((o, s))
        }
        Err(e) => Err(e),
    }
}

/// Per-call rates of a run: `(metric, value)` for every row with one.
pub fn rates(s: &RunSummary) -> Vec<(Metric, f64)> {
    s.rows
        .iter()
        .filter_map(|r| {
            let v = r.per_iteration?;
            let mut m = r.metric.clone();
            m.name = rate_name(&r.metric.name, &r.metric.unit);
            if r.metric.unit != "KiB" {
                m.unit = format!("{}/{}", r.metric.unit, s.iteration_name);
            }
            Some((m, v))
        })
        .collect()
}

/// The table from the runs of both sides: every rate present in every run.
pub fn build_table(
    baseline: (&str, &[RunSummary]),
    compare: (&str, &[RunSummary]),
) -> (CompareTable, Vec<String>) {
    let side = |label: &str, runs: &[RunSummary]| crate::report::compare::Side {
        label: label.to_string(),
        config: runs.first().map(|r| r.config.clone()).unwrap_or_default(),
    };
    let mut t = CompareTable::new(side(baseline.0, baseline.1), side(compare.0, compare.1));
    let mut dropped = Vec::new();
    let Some(first) = baseline.1.first() else {
        return (t, dropped);
    };
    let all: Vec<&RunSummary> = baseline.1.iter().chain(compare.1.iter()).collect();
    for (metric, _) in rates(first) {
        let samples = |runs: &[RunSummary]| -> Option<Vec<f64>> {
            runs.iter()
                .map(|r| {
                    rates(r)
                        .into_iter()
                        .find(|(m, _)| m.name == metric.name)
                        .map(|(_, v)| v)
                })
                .collect()
        };
        match (samples(baseline.1), samples(compare.1)) {
            (Some(b), Some(c)) => {
                if let Err(e) = t.add(metric.clone(), &b, &c) {
                    dropped.push(format!("{}: {e}", metric.name));
                }
            }
            _ => dropped.push(format!("{}: missing in some runs", metric.name)),
        }
    }
    let _ = all;
    (t, dropped)
}

fn progress(total: u64, quiet: bool) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(total),
        indicatif::ProgressDrawTarget::hidden(),
    );
    if !quiet && std::io::stderr().is_terminal() {
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} runs {msg}",
        ) {
            bar.set_style(style);
        }
    }
    bar
}

/// How `--runs` ends.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunsStop {
    /// `--runs N`: N runs per side.
    Fixed,
    /// `--runs auto`: the CI half-width reached the target on both sides.
    TargetReached,
    /// `--runs auto`: `--max-runs` reached first.
    MaxRuns,
}

/// What `--runs` did, for the text and the JSON (`runs`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunsReport {
    /// `fixed` or `auto`.
    pub mode: &'static str,
    /// Measured runs per side.
    pub per_side: u32,
    /// Discarded warm-up pairs.
    pub warmup: u32,
    /// `--runs auto`: the metric watched, the target and the limit.
    pub metric: Option<String>,
    pub target_ci_pct: Option<f64>,
    pub max_runs: Option<u32>,
    /// The watched metric's CI half-width in % of its mean at the end,
    /// per side (`null` where undefined).
    pub final_ci_pct: Option<[Option<f64>; 2]>,
    pub stopped: RunsStop,
}

impl RunsReport {
    /// One sentence for the text report.
    pub fn sentence(&self) -> String {
        let pct = |v: Option<f64>| v.map_or("n/a".to_owned(), |v| format!("{v:.2} %"));
        let ci = self
            .final_ci_pct
            .map(|[b, c]| format!("baseline {}, compare {}", pct(b), pct(c)))
            .unwrap_or_default();
        let warm = if self.warmup > 0 {
            format!(" (plus {} discarded warm-up pair(s))", self.warmup)
        } else {
            String::new()
        };
        let metric = self.metric.as_deref().unwrap_or("-");
        let target = self.target_ci_pct.unwrap_or(0.0);
        match self.stopped {
            RunsStop::Fixed => format!("{} runs per side{warm}", self.per_side),
            RunsStop::TargetReached => format!(
                "--runs auto: stopped after {} runs per side{warm}: the 95 % CI of {metric}'s \
                 mean is within {target} % of it on both sides ({ci})",
                self.per_side
            ),
            RunsStop::MaxRuns => format!(
                "--runs auto: stopped at --max-runs {} runs per side{warm}: the 95 % CI of \
                 {metric}'s mean did NOT reach {target} % ({ci})",
                self.per_side
            ),
        }
    }
}

/// The time metric `--runs auto` watches: the host clock under KVM, the
/// guest's RDTSC under QEMU (the only time figure there).
fn main_time_metric(backend: Backend) -> &'static str {
    match backend {
        Backend::Kvm => "ns_per_call",
        Backend::Qemu => "cycles_per_call",
    }
}

/// The CI half-width of `metric`'s mean in % of the mean over `runs`.
fn ci_pct(runs: &[RunSummary], metric: &str) -> Option<f64> {
    let samples: Vec<f64> = runs
        .iter()
        .filter_map(|r| rates(r).into_iter().find(|(m, _)| m.name == metric))
        .map(|(_, v)| v)
        .collect();
    if samples.len() != runs.len() {
        return None;
    }
    crate::report::stats::mean_ci95(&samples)?.relative_pct
}

/// The image a configuration boots, named and hashed for the environment.
pub fn guest_image(kernel: &KernelSource) -> GuestImage {
    let name = match kernel {
        KernelSource::Embedded(b) if std::ptr::eq(*b, crate::GUEST_I386) => {
            "embedded i386".to_owned()
        }
        KernelSource::Embedded(_) => "embedded x86_64".to_owned(),
        KernelSource::Path(p) => p.display().to_string(),
    };
    let bytes = crate::machine::loader::read_image(kernel).ok();
    GuestImage::new(name, bytes.as_deref())
}

/// Runs the comparison and prints it; returns the process exit code.
pub fn run(args: &CompareArgs) -> i32 {
    if crate::cli::pound::wants_sweep(args) {
        return crate::cli::pound::run(args);
    }
    let embedded = args.arch.embedded_image();
    if args.backend == Backend::Kvm && !args.qemu_arg.is_empty() {
        eprintln!("ptiscope compare: --qemu-arg needs --backend qemu");
        return exit_code::USAGE;
    }
    if args.runs != Runs::Auto && (args.max_runs.is_some() || args.target_ci.is_some()) {
        eprintln!(
            "ptiscope compare: --max-runs and --target-ci go with --runs auto \
             (give --runs auto, or drop them)"
        );
        return exit_code::USAGE;
    }
    let earlier = match &args.against {
        Some(p) => match read_earlier(p) {
            Ok(t) => Some(t),
            Err(msg) => {
                eprintln!("ptiscope compare: --against {}: {msg}", p.display());
                return exit_code::USAGE;
            }
        },
        None => None,
    };
    let conditions: Vec<Condition> = match args
        .fail_if
        .iter()
        .map(|c| Condition::parse_list(c))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(v) => v.into_iter().flatten().collect(),
        Err(e) => {
            eprintln!("ptiscope compare: --fail-if: {e}");
            return exit_code::USAGE;
        }
    };
    let sides = parse_side(&args.baseline, args, embedded)
        .and_then(|b| Ok((b, parse_side(&args.compare, args, embedded)?)));
    let (base, comp) = match sides {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ptiscope compare: {e}");
            return exit_code::USAGE;
        }
    };
    // A workload that marks no phase has nothing to compare: a usage error
    // before any guest boots, not a failed run after the first one.
    for side in [&base, &comp] {
        if !side
            .config
            .guest
            .workload
            .is_some_and(Workload::runs_user_code)
        {
            eprintln!(
                "ptiscope compare: {}: workload {} only boots the guest and measures nothing; \
                 compare needs a measuring workload ({})",
                side.label,
                side.config
                    .guest
                    .workload
                    .map_or("(none given)", Workload::name),
                Workload::NAMES
                    .iter()
                    .filter(|n| **n != Workload::None.name())
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            return exit_code::USAGE;
        }
    }

    // The output files are opened (created, checked writable, a FIFO's
    // reader waited for up to --timeout) before the first boot: a typo in
    // a path must not cost a whole compare.
    let mut files: [Option<OutputFile>; 3] = [None, None, None];
    for (slot, (what, path)) in files.iter_mut().zip([
        ("--json", &args.json),
        ("--csv", &args.csv),
        ("--svg", &args.svg),
    ]) {
        if let Some(p) = path {
            match open_output(what, p, args.timeout) {
                Ok(f) => *slot = Some(f),
                Err(e) => {
                    eprintln!("ptiscope compare: {e}");
                    return e.exit_code();
                }
            }
        }
    }
    let [json_file, csv_file, svg_file] = files;

    // Settle both sides once (image read, entry resolved, host limits
    // checked): every run of a side then boots the same resolved run.
    let settle = |spec: SideSpec| {
        preflight(&spec.config, args.backend.target()).map(|run| Side {
            label: spec.label,
            run,
        })
    };
    let (base, comp) = match settle(base).and_then(|b| Ok((b, settle(comp)?))) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ptiscope compare: {e}");
            return e.exit_code();
        }
    };
    let (max_runs, target_ci) = match args.runs {
        Runs::Fixed(n) => (n, None),
        Runs::Auto => (
            args.max_runs.unwrap_or(DEFAULT_MAX_RUNS),
            Some(args.target_ci.unwrap_or(DEFAULT_TARGET_CI_PCT)),
        ),
    };
    let watched = main_time_metric(args.backend);

    println!("ptiscope compare: what PTI costs in the ptiscope guest on this host");
    // Probed once per process (the entry probe also resolves entry=auto).
    let mut environment = Environment::collect(
        match args.backend {
            Backend::Kvm => "kvm",
            Backend::Qemu => "qemu",
        },
        guest_image(&base.run.config.kernel),
        BTreeMap::new(),
    );
    print!("{}", environment.render_text());
    match args.backend {
        Backend::Kvm => {
            let entry = match (base.run.config.guest.entry, base.run.guest.entry) {
                (_, None) => "none (the workload runs no user code)".to_string(),
                (EntryChoice::Auto, Some(e)) => {
                    let how = if base.run.entry_guessed {
                        "guessed from the KVM module: the probe could not run"
                    } else {
                        "from the probe"
                    };
                    format!("{e} (entry=auto, {how})")
                }
                (EntryChoice::Fixed(_), Some(e)) => e.to_string(),
            };
            println!("  KVM:       {}", host::kvm_flavour().describe());
            println!("  entry:     {entry}");
        }
        Backend::Qemu => {
            println!(
                "  backend:   QEMU TCG ({}): software emulation, every figure guest-reported",
                crate::backend::qemu::binary_for(&base.run.image)
            );
        }
    }
    let runs_text = match (args.runs, target_ci) {
        (Runs::Fixed(n), _) => format!("{n} runs per side"),
        (Runs::Auto, Some(t)) => format!(
            "runs per side: auto, until the 95 % CI of {watched} is within {t} % of its mean \
             (at least {MIN_AUTO_RUNS}, at most {max_runs})"
        ),
        (Runs::Auto, None) => "runs per side: auto".to_owned(),
    };
    let warmup_text = if args.warmup > 0 {
        format!(", after {} discarded warm-up pair(s)", args.warmup)
    } else {
        String::new()
    };
    let workload = base.run.guest.workload.map_or("-", Workload::name);
    if base.run.guest.workload == Some(Workload::SchedMessaging) {
        // Its size comes from groups=/loops= (cmdline=...), not --iterations.
        println!(
            "  workload:  sched-messaging (perf bench sched messaging, pipes), {runs_text}, \
             interleaved{warmup_text}; rates are per message"
        );
    } else {
        println!(
            "  workload:  {workload} x {} iterations per run, {runs_text}, interleaved{warmup_text}",
            base.run.guest.iterations.unwrap_or(0),
        );
    }
    println!("  baseline:  {}", base.label);
    println!("  compare:   {}", comp.label);
    println!();

    let total = 2 * u64::from(max_runs + args.warmup);
    let bar = progress(total, args.quiet);
    let started = Instant::now();
    let mut runs: [Vec<RunSummary>; 2] = [Vec::new(), Vec::new()];
    let mut durations = [Durations::default(), Durations::default()];
    let mut disagreements: Vec<String> = Vec::new();
    let specs = [&base, &comp];
    let mut pair: u32 = 0;
    let stopped = loop {
        let warming = pair < args.warmup;
        // Run number within its kind (warm-up or measured), from 1.
        let number = if warming {
            pair + 1
        } else {
            pair - args.warmup + 1
        };
        let order = if pair.is_multiple_of(2) {
            [0, 1]
        } else {
            [1, 0]
        };
        for side in order {
            // Only on a terminal, and only once the compare has taken a
            // while: a short compare stays silent.
            if bar.is_hidden()
                && !args.quiet
                && std::io::stderr().is_terminal()
                && started.elapsed() > Duration::from_secs(2)
            {
                bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            }
            bar.set_message(specs[side].label.clone());
            let before = CpuTimes::now();
            let result = run_measured(&specs[side].run, args.backend);
            if !warming {
                durations[side].add(&before, &CpuTimes::now());
            }
            let what = if warming {
                format!("{} warm-up run {number}", specs[side].label)
            } else {
                format!("{} run {number}", specs[side].label)
            };
            match result {
                Ok((_, s)) => {
                    if !s.telemetry_valid() {
                        bar.suspend(|| {
                            eprintln!(
                                "ptiscope compare: warning: {what}: guest telemetry invalid: {}",
                                s.telemetry_problems.join("; ")
                            )
                        });
                    }
                    if warming {
                        bar.inc(1);
                        continue;
                    }
                    for c in s.cross_checks.iter().filter(|c| !c.agrees) {
                        disagreements.push(format!(
                            "{what}: {}: {} {} vs {} {}",
                            c.what, c.host_metric, c.host_value, c.guest_metric, c.guest_value
                        ));
                    }
                    // A --fail-if naming a metric the runs do not produce
                    // is a typo: say so after the first run, not the last.
                    if runs[0].is_empty() && runs[1].is_empty() {
                        let names: Vec<String> =
                            rates(&s).into_iter().map(|(m, _)| m.name).collect();
                        if let Some(c) = conditions.iter().find(|c| !names.contains(&c.metric)) {
                            bar.finish_and_clear();
                            eprintln!(
                                "ptiscope compare: --fail-if: no metric {:?} in these runs (metrics: {})",
                                c.metric,
                                names.join(" ")
                            );
                            return exit_code::USAGE;
                        }
                    }
                    runs[side].push(s);
                }
                Err((code, msg)) => {
                    bar.finish_and_clear();
                    let of = match args.runs {
                        Runs::Fixed(n) if !warming => format!(" of {n}"),
                        _ => String::new(),
                    };
                    eprintln!("ptiscope compare: {what}{of} failed: {msg}");
                    return if code == 0 { 1 } else { code };
                }
            }
            bar.inc(1);
        }
        pair += 1;
        if warming {
            continue;
        }
        let done = pair - args.warmup;
        match target_ci {
            None if done >= max_runs => break RunsStop::Fixed,
            None => {}
            Some(target) => {
                let ci = [ci_pct(&runs[0], watched), ci_pct(&runs[1], watched)];
                if done >= MIN_AUTO_RUNS && ci.iter().all(|c| c.is_some_and(|c| c <= target)) {
                    break RunsStop::TargetReached;
                }
                if done >= max_runs {
                    break RunsStop::MaxRuns;
                }
            }
        }
    };
    bar.finish_and_clear();
    let (mut table, dropped) = build_table((&base.label, &runs[0]), (&comp.label, &runs[1]));
    let per_side = runs[0].len() as u32;
    let runs_report = RunsReport {
        mode: if target_ci.is_some() { "auto" } else { "fixed" },
        per_side,
        warmup: args.warmup,
        metric: target_ci.map(|_| watched.to_owned()),
        target_ci_pct: target_ci,
        max_runs: target_ci.map(|_| max_runs),
        final_ci_pct: target_ci.map(|_| [ci_pct(&runs[0], watched), ci_pct(&runs[1], watched)]),
        stopped,
    };
    environment
        .options
        .insert("baseline".into(), table.baseline.config.clone());
    environment
        .options
        .insert("compare".into(), table.compare.config.clone());
    table.environment = Some(environment);
    // The text shows the metrics that are non-zero somewhere; JSON and CSV have all.
    let mut shown = table.clone();
    shown.metrics.retain(|m| {
        m.baseline
            .samples
            .iter()
            .chain(&m.compare.samples)
            .any(|&v| v != 0.0)
    });
    let omitted: Vec<&str> = table
        .metrics
        .iter()
        .filter(|m| shown.metric(&m.metric.name).is_none())
        .map(|m| m.metric.name.as_str())
        .collect();
    print!("{}", shown.render_text());
    if !omitted.is_empty() {
        println!(
            "zero in every run (omitted above, present in --json/--csv): {}",
            omitted.join(" ")
        );
    }
    println!();
    headline(&table);
    print!("{}", render_durations(&base.label, &comp.label, &durations));
    println!("  {}", runs_report.sentence());
    println!(
        "  {} runs in {:.1} s",
        2 * (per_side + args.warmup),
        started.elapsed().as_secs_f64()
    );
    for d in &dropped {
        println!("  note: metric {d}, left out of the table");
    }
    if args.backend == Backend::Qemu {
        println!("  backend qemu: no host-observed figures, so nothing to cross-check");
    } else if disagreements.is_empty() {
        println!("  cross-checks (host-observed vs guest-reported): all agree in every run");
    } else {
        println!("  cross-checks that DISAGREE:");
        for d in disagreements.iter().take(10) {
            println!("    {d}");
        }
    }
    if args.backend == Backend::Kvm && !host::kvm_flavour().sees_cr3_writes() {
        println!(
            "  note: with EPT/NPT KVM does not see guest CR3 writes; cr3_writes_* are guest-reported only"
        );
    }
    let against = earlier.map(|(path, earlier)| {
        let a = Against::new(&path, &earlier, &table);
        print!("{}", a.render_text());
        for d in &a.environment_differences {
            eprintln!("ptiscope compare: warning: --against: the environment differs: {d}");
        }
        if a.environment_missing {
            eprintln!(
                "ptiscope compare: warning: --against: {} records no environment; \
                 cannot tell whether it came from the same host and build",
                path.display()
            );
        }
        a
    });

    let mut code = 0;
    if let Some(f) = &json_file {
        code = code.max(write_file(
            f,
            &json_text(&table, &durations, &runs_report, against.as_ref()),
        ));
    }
    if let Some(f) = &svg_file {
        code = code.max(write_file(f, &crate::report::plot::compare_svg(&table)));
    }
    if let Some(f) = &csv_file {
        code = code.max(write_file(f, &table.to_csv()));
    }
    for c in &conditions {
        match c.evaluate(&table) {
            Ok(ev) if ev.triggered => {
                eprintln!(
                    "ptiscope compare: --fail-if {} holds (value {})",
                    ev.condition, ev.value
                );
                code = code.max(1);
            }
            Ok(ev) => eprintln!(
                "ptiscope compare: --fail-if {} does not hold (value {})",
                ev.condition, ev.value
            ),
            Err(e) => {
                eprintln!("ptiscope compare: --fail-if cannot be evaluated: {e}");
                code = code.max(1);
            }
        }
    }
    code
}

fn json_text(
    t: &CompareTable,
    durations: &[Durations; 2],
    runs: &RunsReport,
    against: Option<&Against>,
) -> String {
    let mut v = t.to_json();
    if let Some(o) = v.as_object_mut() {
        o.insert(
            "durations".into(),
            serde_json::json!({ "baseline": durations[0], "compare": durations[1] }),
        );
        o.insert(
            "runs".into(),
            serde_json::to_value(runs).unwrap_or_default(),
        );
        if let Some(a) = against {
            o.insert("against".into(), a.to_json());
        }
    }
    serde_json::to_string_pretty(&v).unwrap_or_else(|_| "null".into())
}

/// Reads an earlier `compare --json` document.
fn read_earlier(p: &Path) -> Result<(std::path::PathBuf, CompareTable), String> {
    let text = std::fs::read_to_string(p).map_err(|e| format!("cannot read it: {e}"))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("not JSON: {e}"))?;
    let schema = v["schema"].as_str().unwrap_or("").to_owned();
    if !schema.starts_with("ptiscope.compare/") {
        return Err(format!(
            "not a `ptiscope compare --json` document (schema {:?}, expected {:?})",
            schema,
            crate::report::compare::SCHEMA
        ));
    }
    CompareTable::from_json(v)
        .map(|t| (p.to_path_buf(), t))
        .map_err(|e| format!("not a readable {schema} document: {e}"))
}

/// `--against FILE`: each side of this compare against the same side of an
/// earlier one, and what differs in their environments.
pub struct Against {
    pub file: std::path::PathBuf,
    /// Earlier baseline runs vs this compare's baseline runs, and the same
    /// for the compare side.
    pub sides: [CompareTable; 2],
    pub environment_differences: Vec<String>,
    /// The earlier document had no `environment` block.
    pub environment_missing: bool,
}

impl Against {
    pub fn new(file: &Path, earlier: &CompareTable, now: &CompareTable) -> Self {
        let side = |label: &str,
                    earlier_side: &crate::report::compare::Side,
                    now_side: &crate::report::compare::Side| {
            let mut t = CompareTable::new(
                crate::report::compare::Side {
                    label: format!("earlier {}", earlier_side.label),
                    config: earlier_side.config.clone(),
                },
                crate::report::compare::Side {
                    label: format!("now {}", now_side.label),
                    config: now_side.config.clone(),
                },
            );
            for m in &now.metrics {
                if let Some(e) = earlier.metric(&m.metric.name) {
                    let (e, n) = if label == "baseline" {
                        (&e.baseline.samples, &m.baseline.samples)
                    } else {
                        (&e.compare.samples, &m.compare.samples)
                    };
                    // Both come from valid tables: this cannot fail but
                    // for a hand-edited file, where the metric is skipped.
                    let _ = t.add(m.metric.clone(), e, n);
                }
            }
            t
        };
        let (environment_differences, environment_missing) =
            match (&earlier.environment, &now.environment) {
                (Some(e), Some(n)) => (n.differences(e), false),
                _ => (Vec::new(), true),
            };
        Against {
            file: file.to_path_buf(),
            sides: [
                side("baseline", &earlier.baseline, &now.baseline),
                side("compare", &earlier.compare, &now.compare),
            ],
            environment_differences,
            environment_missing,
        }
    }

    pub fn render_text(&self) -> String {
        let mut out = format!(
            "\nagainst {}: each side now vs the same side then (means, 95 % CI, Welch p)\n",
            self.file.display()
        );
        for t in &self.sides {
            // As in the main table: metrics zero in every run stay in the JSON only.
            let mut shown = t.clone();
            shown.metrics.retain(|m| {
                m.baseline
                    .samples
                    .iter()
                    .chain(&m.compare.samples)
                    .any(|&v| v != 0.0)
            });
            out.push('\n');
            out.push_str(&shown.render_confidence());
        }
        out.push('\n');
        if self.environment_missing {
            out.push_str("  environment: the earlier result records none\n");
        } else if self.environment_differences.is_empty() {
            out.push_str("  environment: the same as the earlier result's\n");
        } else {
            out.push_str(&format!(
                "  environment: DIFFERS from the earlier result's in {} field(s) (see stderr)\n",
                self.environment_differences.len()
            ));
        }
        out
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "file": self.file.display().to_string(),
            "environment_differences": self.environment_differences,
            "environment_missing": self.environment_missing,
            "baseline": self.sides[0].to_json(),
            "compare": self.sides[1].to_json(),
        })
    }
}

/// CPU time of this process and its reaped children (QEMU under
/// `--backend qemu`), and the host clock.
struct CpuTimes {
    user: f64,
    system: f64,
    at: Instant,
}

impl CpuTimes {
    fn now() -> Self {
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        let (mut user, mut system) = (0.0, 0.0);
        for who in [libc::RUSAGE_SELF, libc::RUSAGE_CHILDREN] {
            // SAFETY: all-zero bytes are a valid rusage; getrusage fills it.
            let mut u: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: `u` is a valid out-pointer for the call.
            if unsafe { libc::getrusage(who, &mut u) } == 0 {
                user += secs(u.ru_utime);
                system += secs(u.ru_stime);
            }
        }
        CpuTimes {
            user,
            system,
            at: Instant::now(),
        }
    }
}

/// The mmtests duration table's figures for one side: seconds summed over
/// its runs (boot and teardown included). KVM's guest time counts as
/// system time of the VMM.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
struct Durations {
    user_s: f64,
    system_s: f64,
    elapsed_s: f64,
}

impl Durations {
    fn add(&mut self, before: &CpuTimes, after: &CpuTimes) {
        self.user_s += (after.user - before.user).max(0.0);
        self.system_s += (after.system - before.system).max(0.0);
        self.elapsed_s += after.at.duration_since(before.at).as_secs_f64();
    }
}

/// `Duration User/System/Elapsed`, as mmtests compare-kernels prints it.
fn render_durations(base: &str, comp: &str, d: &[Durations; 2]) -> String {
    let w = base.len().max(comp.len()).max(10);
    let mut s = format!("\n{:<18} {base:>w$} {comp:>w$}\n", "");
    for (name, f) in [
        (
            "Duration User",
            (|x: &Durations| x.user_s) as fn(&Durations) -> f64,
        ),
        ("Duration System", |x| x.system_s),
        ("Duration Elapsed", |x| x.elapsed_s),
    ] {
        s += &format!("{name:<18} {:>w$.2} {:>w$.2}\n", f(&d[0]), f(&d[1]));
    }
    s += "\n";
    s
}

fn write_file(f: &OutputFile, text: &str) -> i32 {
    match f.write_document(text) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ptiscope compare: {e}");
            exit_code::CANT_CREATE
        }
    }
}

/// One plain sentence with what the reader came for.
fn headline(t: &CompareTable) {
    let mean = |name: &str| {
        t.metric(name).and_then(|m| {
            Some((
                m.baseline.get(crate::report::Stat::Amean)?,
                m.compare.get(crate::report::Stat::Amean)?,
                m.delta_pct.amean,
                m.significance,
            ))
        })
    };
    let (b, c) = (&t.baseline.label, &t.compare.label);
    println!("summary ({c} against {b}, means of the runs):");
    for (name, what) in [
        ("ns_per_call", "ns per call (host clock)"),
        ("cycles_per_call", "cycles per call (guest RDTSC)"),
        ("kvm_exits_per_call", "VM exits per call (KVM)"),
        ("cr3_writes_per_call", "CR3 writes per call (guest)"),
        ("tlb_flush_per_call", "TLB flushes per call (KVM)"),
        (
            "kernel_instructions_per_call",
            "kernel instructions per call (KVM insn_emulation)",
        ),
    ] {
        if let Some((x, y, pct, sig)) = mean(name) {
            let pct = pct.map_or(String::new(), |p| format!(" ({p:+.1} %)"));
            // The verdict of the CI block, with Welch's p where it exists.
            let sig = sig.map_or(String::new(), |s| match (s.verdict, s.welch) {
                (Verdict::Significant | Verdict::NotSignificant, Some(w)) => format!(
                    "  mmtests: {}; Welch p {}",
                    s.verdict.word(),
                    crate::report::compare::p_text(w.p_value)
                ),
                (Verdict::Significant | Verdict::NotSignificant, None) => {
                    format!("  mmtests: {}", s.verdict.word())
                }
                _ => format!("  {}", s.verdict.word()),
            });
            println!("  {what:<52} {x:>12.2} -> {y:>12.2}{pct}{sig}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(stopped: RunsStop, per_side: u32) -> RunsReport {
        RunsReport {
            mode: "auto",
            per_side,
            warmup: 1,
            metric: Some("ns_per_call".into()),
            target_ci_pct: Some(1.0),
            max_runs: Some(20),
            final_ci_pct: Some([Some(0.8), None]),
            stopped,
        }
    }

    #[test]
    fn runs_sentences_say_which_stop_and_how_many() {
        assert_eq!(
            report(RunsStop::TargetReached, 7).sentence(),
            "--runs auto: stopped after 7 runs per side (plus 1 discarded warm-up pair(s)): \
             the 95 % CI of ns_per_call's mean is within 1 % of it on both sides \
             (baseline 0.80 %, compare n/a)"
        );
        assert!(report(RunsStop::MaxRuns, 20)
            .sentence()
            .starts_with("--runs auto: stopped at --max-runs 20 runs per side"));
        let fixed = RunsReport {
            mode: "fixed",
            warmup: 0,
            metric: None,
            target_ci_pct: None,
            max_runs: None,
            final_ci_pct: None,
            ..report(RunsStop::Fixed, 5)
        };
        assert_eq!(fixed.sentence(), "5 runs per side");
        let v = serde_json::to_value(report(RunsStop::MaxRuns, 20)).unwrap();
        assert_eq!(v["stopped"], "max_runs");
        assert_eq!(v["final_ci_pct"][1], serde_json::Value::Null);
    }

    #[test]
    fn guest_images_are_named_and_hashed() {
        let g = guest_image(&KernelSource::Embedded(crate::GUEST_X86_64));
        assert_eq!(g.name, "embedded x86_64");
        assert_eq!(g.bytes, crate::GUEST_X86_64.len() as u64);
        assert_eq!(
            g.sha256.as_deref(),
            Some(crate::report::environment::sha256_hex(crate::GUEST_X86_64).as_str())
        );
        let g = guest_image(&KernelSource::Embedded(crate::GUEST_I386));
        assert_eq!(g.name, "embedded i386");
        let g = guest_image(&KernelSource::Path("/nonexistent/kernel".into()));
        assert_eq!((g.sha256, g.bytes), (None, 0));
    }
}
