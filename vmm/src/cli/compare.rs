//! `ptiscope compare` (and `ptiscope` with no arguments): a baseline and a
//! compare configuration, each run `--runs` times, interleaved (B C, C B,
//! B C, ...) so that slow drifts of a noisy host hit both sides alike; the
//! per-call rates of every run go into the mmtests compare-kernels table.

use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::cli::exit_code::{self, ExitCode};
use crate::cli::{Backend, CompareArgs};
use crate::machine::loader::KernelSource;
use crate::machine::RunOutcome;
use crate::observe::measure::{rate_name, summary_from_result, Measurer};
use crate::preflight::cmdline::{CpuVuln, EntryChoice, PtiMode, Switch, Workload};
use crate::preflight::{host, preflight, ResolvedRun, RunConfig, SerialOut, Target};
use crate::report::{CompareTable, Condition, Metric, RunSummary};

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
    let config = &resolved.config;
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
                Backend::Kvm => m.summary(&o, config_words(&o), config.guest.iterations),
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
                let mut msg = o.stop_description();
                for f in o.faults() {
                    msg.push_str(&format!("\n  guest reported: {f}"));
                }
                if !o.console_tail.is_empty() {
                    msg.push_str("\n  last console lines:");
                    for l in &o.console_tail {
                        msg.push_str(&format!("\n    | {l}"));
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

    println!("ptiscope compare: what PTI costs in the ptiscope guest on this host");
    println!("  host:      {}", host::describe_host());
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
    let workload = base.run.guest.workload.map_or("-", Workload::name);
    if base.run.guest.workload == Some(Workload::SchedMessaging) {
        // Its size comes from groups=/loops= (cmdline=...), not --iterations.
        println!(
            "  workload:  sched-messaging (perf bench sched messaging, pipes), {} runs per side, \
             interleaved; rates are per message",
            args.runs
        );
    } else {
        println!(
            "  workload:  {workload} x {} iterations per run, {} runs per side, interleaved",
            base.run.guest.iterations.unwrap_or(0),
            args.runs
        );
    }
    println!("  baseline:  {}", base.label);
    println!("  compare:   {}", comp.label);
    println!();

    let total = 2 * u64::from(args.runs);
    let bar = progress(total, args.quiet);
    let started = Instant::now();
    let mut runs: [Vec<RunSummary>; 2] = [Vec::new(), Vec::new()];
    let mut durations = [Durations::default(), Durations::default()];
    let mut disagreements: Vec<String> = Vec::new();
    let specs = [&base, &comp];
    for i in 0..args.runs {
        let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
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
            durations[side].add(&before, &CpuTimes::now());
            match result {
                Ok((_, s)) => {
                    if !s.telemetry_valid() {
                        bar.suspend(|| {
                            eprintln!(
                                "ptiscope compare: warning: {} run {}: guest telemetry invalid: {}",
                                specs[side].label,
                                i + 1,
                                s.telemetry_problems.join("; ")
                            )
                        });
                    }
                    for c in s.cross_checks.iter().filter(|c| !c.agrees) {
                        disagreements.push(format!(
                            "{} run {}: {}: {} {} vs {} {}",
                            specs[side].label,
                            i + 1,
                            c.what,
                            c.host_metric,
                            c.host_value,
                            c.guest_metric,
                            c.guest_value
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
                    eprintln!(
                        "ptiscope compare: {} run {} of {} failed: {msg}",
                        specs[side].label,
                        i + 1,
                        args.runs
                    );
                    return if code == 0 { 1 } else { code };
                }
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let (table, dropped) = build_table((&base.label, &runs[0]), (&comp.label, &runs[1]));
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
    println!(
        "  {} runs in {:.1} s",
        total,
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

    let mut code = 0;
    if let Some(p) = &args.json {
        code = code.max(write_file(p, &json_text(&table, &durations)));
    }
    if let Some(p) = &args.svg {
        code = code.max(write_file(p, &crate::report::plot::compare_svg(&table)));
    }
    if let Some(p) = &args.csv {
        code = code.max(write_file(p, &table.to_csv()));
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

fn json_text(t: &CompareTable, durations: &[Durations; 2]) -> String {
    let mut v = t.to_json();
    if let Some(o) = v.as_object_mut() {
        o.insert(
            "durations".into(),
            serde_json::json!({ "baseline": durations[0], "compare": durations[1] }),
        );
    }
    serde_json::to_string_pretty(&v).unwrap_or_else(|_| "null".into())
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

fn write_file(p: &Path, text: &str) -> i32 {
    match std::fs::write(p, text) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ptiscope compare: cannot write {}: {e}", p.display());
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
        if let Some((x, y, pct)) = mean(name) {
            let pct = pct.map_or(String::new(), |p| format!(" ({p:+.1} %)"));
            println!("  {what:<52} {x:>12.2} -> {y:>12.2}{pct}");
        }
    }
}
