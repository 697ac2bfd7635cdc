//! `ptiscope compare` (and `ptiscope` with no arguments): a baseline and a
//! compare configuration, each run `--runs` times, interleaved (B C, C B,
//! B C, ...) so that slow drifts of a noisy host hit both sides alike; the
//! per-call rates of every run go into the mmtests compare-kernels table.
//!
//! The runs are one `experiment` (the runner); this file settles the sides,
//! prints the header, and turns the runner's outcome into the report
//! (`output.rs`: tables, files, `--fail-if`).

mod against;
mod durations;
mod output;
mod runs;
pub(crate) mod side;
pub(crate) mod side_key;

pub use against::Against;
pub use runs::RunsReport;
pub use side::{
    build_table, config_words, guest_image_of, parse_side, rates, run_measured, Side, SideSpec,
};

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use against::read_earlier;
use durations::{CpuTimes, Durations};
pub(crate) use output::write_file;
use runs::ci_pct;
pub(crate) use runs::progress;

use crate::backend::Backend;
use crate::cli::command_error::{CommandError, SideError};
use crate::cli::exit_code::{self, ExitCode};
use crate::cli::{CompareArgs, Runs, DEFAULT_MAX_RUNS, DEFAULT_TARGET_CI_PCT};
use crate::experiment::MIN_AUTO_RUNS;
use crate::experiment::{Experiment, Progress, RunCount, RunId};
use crate::preflight::preflight;
use crate::report::environment::Environment;
use crate::report::{CompareTable, Condition, FailIf, RunSummary};
use crate::spec::guest::GuestKind;
use crate::spec::linux::LinuxGuest;
use crate::spec::ResolvedRun;
use ptiscope_abi::options::Workload;

/// Runs the comparison and prints it; returns the process exit code.
/// (`ptiscope compare` with poundsyscall's thread counts is
/// [`crate::cli::pound::run`]; [`crate::cli::compare_command`] chooses.)
pub fn run(args: &CompareArgs) -> i32 {
    exit_code::finish("compare", compare(args))
}

/// Both sides' options parsed (shared with poundsyscall's table).
pub(crate) fn parse_sides(args: &CompareArgs) -> Result<(SideSpec, SideSpec), SideError> {
    let embedded = args.target.arch().embedded_image();
    Ok((
        parse_side(&args.baseline, &args.exp, &args.target, embedded)?,
        parse_side(&args.compare, &args.exp, &args.target, embedded)?,
    ))
}

/// The refusals before anything runs, the sides settled, the runs and the
/// report; the exit code of a comparison that reported.
fn compare(args: &CompareArgs) -> Result<i32, CommandError> {
    let backend = args.target.on.backend();
    if let Some(why) = args.target.on.refusal(&args.target.on.requested()) {
        return Err(CommandError::Usage(why));
    }
    if args.runs != Runs::Auto && (args.max_runs.is_some() || args.target_ci.is_some()) {
        return Err(CommandError::Usage(
            "--max-runs and --target-ci go with --runs auto \
             (give --runs auto, or drop them)"
                .into(),
        ));
    }
    let earlier = match &args.against {
        Some(p) => Some(
            read_earlier(p, args.exp.timeout.min(crate::input::READ_TIME_LIMIT)).map_err(
                |(code, message)| CommandError::Against {
                    path: p.clone(),
                    code,
                    message,
                },
            )?,
        ),
        None => None,
    };
    // One parser for every `--fail-if`: `symbol:NAME...` conditions are on
    // the by-symbol difference, the others on the table.
    let FailIf {
        table: conditions,
        symbol: symbol_conditions,
    } = FailIf::parse(&args.fail_if).map_err(|e| CommandError::Usage(format!("--fail-if: {e}")))?;
    if args.by_symbol_csv.is_some() && !args.by_symbol {
        return Err(CommandError::Usage(
            "--by-symbol-csv writes the --by-symbol table: add --by-symbol".into(),
        ));
    }
    if !symbol_conditions.is_empty() && !args.by_symbol {
        return Err(CommandError::Usage(
            "--fail-if symbol:... needs --by-symbol (the counts by kernel symbol)".into(),
        ));
    }
    if args.by_symbol {
        refuse_by_symbol(backend.as_ref(), args.target.on.no_plugin, None)?;
    }
    let (base, comp) = parse_sides(args)?;
    // A workload that marks no phase has nothing to compare: a usage error
    // before any guest boots, not a failed run after the first one.
    for side in [&base, &comp] {
        if !side
            .config
            .guest
            .workload
            .is_some_and(Workload::runs_user_code)
        {
            return Err(CommandError::Usage(format!(
                "{}: workload {} only boots the guest and measures nothing; \
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
            )));
        }
    }
    let [json, csv, svg, symbol_csv] = crate::output::open_outputs(
        [
            ("--json", args.out.json.as_deref()),
            ("--csv", args.out.csv.as_deref()),
            ("--svg", args.out.svg.as_deref()),
            ("--by-symbol-csv", args.by_symbol_csv.as_deref()),
        ],
        args.exp.timeout,
    )?;
    let files = [json, csv, svg];

    // Settle both sides once (image read, entry resolved, host limits
    // checked): every run of a side then boots the same resolved run.
    let settle = |spec: SideSpec| {
        preflight(&spec.config, backend.target(), &crate::cli::host_facts()).map(|run| Side {
            label: spec.label,
            run,
        })
    };
    let (mut base, mut comp) = (settle(base)?, settle(comp)?);
    if args.by_symbol {
        refuse_by_symbol(
            backend.as_ref(),
            args.target.on.no_plugin,
            Some([&base, &comp]),
        )?;
        // The init sends the kernel's symbols after the phase, and the
        // backend has the plugin count by address, when the command line
        // carries this word (the same on both sides).
        for side in [&mut base, &mut comp] {
            side.run.boot.cmdline =
                format!("{} {}", side.run.boot.cmdline, crate::linux::SYMBOLS_WORD);
        }
    }
    let count = match args.runs {
        Runs::Fixed(n) => RunCount::Fixed(n),
        Runs::Auto => RunCount::Auto {
            max_runs: args.max_runs.unwrap_or(DEFAULT_MAX_RUNS),
            target_ci_pct: args.target_ci.unwrap_or(DEFAULT_TARGET_CI_PCT),
        },
    };
    let watched = backend.profile().time.metric;
    let mut environment = print_header(args, &*backend, &base, &comp, count, watched);

    let bar = progress(
        2 * u64::from(count.max_runs() + args.warmup),
        args.quiet,
        false,
    );
    let started = Instant::now();
    let mut watcher = Watcher {
        bar: &bar,
        quiet: args.quiet,
        started,
        before: None,
        durations: [Durations::default(), Durations::default()],
        disagreements: Vec::new(),
        conditions: &conditions,
        checked: false,
    };
    let specs = [&base, &comp];
    let result = Experiment::new(vec![base.label.clone(), comp.label.clone()]).run(
        args.warmup,
        count,
        &|runs: &[RunSummary]| ci_pct(runs, watched),
        &mut |id: &RunId| run_measured(&specs[id.side].run, &*backend).map(|(_, s)| s),
        &mut watcher,
    );
    bar.finish_and_clear();
    let of = |id: &RunId| match args.runs {
        Runs::Fixed(n) if !id.warming => format!(" of {n}"),
        _ => String::new(),
    };
    let outcome = result
        .map_err(|e| CommandError::experiment(e, |run| format!("{}{}", run.what(), of(run))))?;
    // A run failing after complete pairs: said now, the pairs reported.
    let partial = outcome.failed.as_ref().map(|f| {
        say!(
            "ptiscope compare: {}{} failed: {}",
            f.run.what(),
            of(&f.run),
            f.error
        );
        let code = exit_code::failed_run(f.error.exit_code());
        let reason = match exit_code::terminating_signal(code) {
            Some(sig) => format!("{} during {}", crate::signals::describe(sig), f.run.what()),
            None => format!("{} failed", f.run.what()),
        };
        let failed = f
            .error
            .failed_run(format!("{}{}", f.run.what(), of(&f.run)), code);
        (code, reason, failed)
    });
    let runs = outcome.runs;
    let (mut table, dropped) = build_table((&base.label, &runs[0]), (&comp.label, &runs[1]));
    let target_ci = count.target_ci_pct();
    let max_runs = count.max_runs();
    let per_side = runs[0].len() as u32;
    let runs_report = RunsReport {
        mode: if target_ci.is_some() { "auto" } else { "fixed" },
        per_side,
        warmup: args.warmup,
        metric: target_ci.map(|_| watched.to_owned()),
        target_ci_pct: target_ci,
        max_runs: target_ci.map(|_| max_runs),
        final_ci_pct: target_ci.map(|_| [ci_pct(&runs[0], watched), ci_pct(&runs[1], watched)]),
        stopped: outcome.stopped,
    };
    // What each side's kernel says of its mitigations, known once it ran:
    // what differs is a `differs:` line like the header's.
    let mitigations = output::SideMitigations::of(&runs[0], &runs[1]);
    if !mitigations.differences.is_empty() {
        environment
            .options
            .entry("sides_differ".into())
            .or_default()
            .extend(mitigations.differences.iter().cloned());
    }
    environment
        .options
        .insert("baseline".into(), table.baseline.config.clone());
    environment
        .options
        .insert("compare".into(), table.compare.config.clone());
    table.environment = Some(environment);
    let banner = partial.as_ref().map(|(_, why, _)| {
        format!(
            "PARTIAL: {why}; {} complete run pairs of {} reported",
            runs[0].len(),
            match args.runs {
                Runs::Fixed(n) => n.to_string(),
                Runs::Auto => format!("up to {max_runs}"),
            }
        )
    });
    let by_symbol = args.by_symbol.then(|| side_symbols(&runs[0], &runs[1]));
    let report = output::Report {
        mitigations: &mitigations,
        by_symbol: by_symbol.as_ref(),
        symbol_csv: symbol_csv.as_ref(),
        symbol_conditions: &symbol_conditions,
        table: &table,
        dropped: &dropped,
        runs: &runs_report,
        durations: &watcher.durations,
        disagreements: &watcher.disagreements,
        banner: banner.as_deref(),
        failed_run: partial.as_ref().map(|(_, _, run)| run),
        seconds: started.elapsed().as_secs_f64(),
    };
    let code = output::print(
        args,
        &*backend,
        &base,
        &comp,
        &report,
        earlier,
        &files,
        &conditions,
    );
    Ok(code.max(partial.map_or(0, |(c, _, _)| c)))
}

/// `--by-symbol` where it cannot work, refused before anything boots.
fn refuse_by_symbol(
    backend: &dyn crate::backend::Backend,
    no_plugin: bool,
    sides: Option<[&Side; 2]>,
) -> Result<(), CommandError> {
    // Whether the backend counts by address is its Profile's to say.
    let why = if backend.profile().counts_by_address {
        None
    } else if no_plugin {
        Some("--by-symbol needs ptiscope's QEMU plugin: drop --no-plugin".to_string())
    } else {
        Some(format!(
            "--by-symbol counts instructions by address with ptiscope's QEMU TCG plugin: \
             give --backend qemu (this is --backend {})",
            backend.name()
        ))
    };
    let why = if why.is_some() {
        why
    } else {
        sides
            .into_iter()
            .flatten()
            .find(|s| s.run.guest_kind.is_companion())
            .map(|side| {
                format!(
                    "--by-symbol is for Linux guests (their init sends the kernel's \
                     /proc/kallsyms); {} boots ptiscope's own guest: give it \
                     linux=debian-amd64 (or a bzImage path), or --linux",
                    side.label
                )
            })
    };
    why.map_or(Ok(()), |w| Err(CommandError::Usage(w)))
}

/// Both sides' by-symbol difference from their runs; `Err` says why a
/// side has none (the first run's note).
fn side_symbols(
    base: &[RunSummary],
    comp: &[RunSummary],
) -> Result<crate::report::by_symbol::SymbolDiff, String> {
    fn side<'a>(
        runs: &'a [RunSummary],
        label: &str,
    ) -> Result<Vec<&'a crate::report::by_symbol::BySymbol>, String> {
        runs.iter()
            .map(|r| {
                r.by_symbol.as_ref().ok_or_else(|| {
                    let why = r
                        .notes
                        .iter()
                        .find_map(|n| match n {
                            crate::report::note::Note::BySymbolNone { error } => {
                                Some(error.as_str())
                            }
                            _ => None,
                        })
                        .unwrap_or("the run gave no counts by symbol");
                    format!("{label}: {why}")
                })
            })
            .collect::<Result<Vec<_>, _>>()
    }
    let (b, c) = (side(base, "baseline")?, side(comp, "compare")?);
    if b.is_empty() || c.is_empty() {
        return Err("no complete run on a side".into());
    }
    Ok(crate::report::by_symbol::SymbolDiff::new(&b, &c))
}

/// The header: what is compared, on which host, how many runs; returns the
/// environment (probed once per process) for the report.
fn print_header(
    args: &CompareArgs,
    backend: &dyn Backend,
    base: &Side,
    comp: &Side,
    count: RunCount,
    watched: &str,
) -> Environment {
    let differences = side_differences(&base.run, &comp.run);
    let linux_name = |l: &LinuxGuest| {
        format!(
            "Linux ({}, {})",
            l.arch.name(),
            l.version.as_deref().unwrap_or("version unknown")
        )
    };
    let two_images = base.run.boot.image != comp.run.boot.image;
    match (&base.run.guest_kind, &comp.run.guest_kind) {
        (GuestKind::Linux(b), GuestKind::Linux(c)) if two_images => println!(
            "{}",
            crate::cli::exit_code::escape_message(&format!(
                "ptiscope compare: two kernels on this host: {} against {}",
                linux_name(b),
                linux_name(c)
            ))
        ),
        (GuestKind::Linux(l), _) => println!(
            "{}",
            crate::cli::exit_code::escape_message(&format!(
                "ptiscope compare: what PTI costs in {} on this host",
                linux_name(l)
            ))
        ),
        (GuestKind::Companion, _) => {
            println!("ptiscope compare: what PTI costs in the ptiscope guest on this host")
        }
    }
    // Probed once per process (the entry probe also resolves entry=auto).
    // What differs between the sides goes into the environment too, so
    // that `--against` and readers of the JSON see it.
    let mut extra = BTreeMap::new();
    if !differences.is_empty() {
        extra.insert("sides_differ".to_owned(), differences.clone());
    }
    let mut environment = Environment::collect(
        &crate::cli::host_facts(),
        (backend.name(), backend.profile().time_basis),
        side::guest_image_of(&base.run.config.kernel, Some(&base.run.boot.image)),
        extra,
    );
    // A Linux guest is named by its release (pictures say which kernel's
    // PTI they show, not only the host's); the companion by its image hash.
    let release_of = |l: &LinuxGuest| {
        let release = l
            .version
            .as_deref()
            .and_then(|v| v.split_whitespace().next())
            .unwrap_or("version unknown");
        format!("Linux {release} ({})", l.arch.name())
    };
    environment.guest_kernel = match (&base.run.guest_kind, &comp.run.guest_kind) {
        // Two kernels: a picture names both.
        (GuestKind::Linux(b), GuestKind::Linux(c)) if two_images => {
            Some(format!("{} vs {}", release_of(b), release_of(c)))
        }
        (GuestKind::Linux(b), _) => Some(release_of(b)),
        (GuestKind::Companion, _) => None,
    };
    let profile = backend.profile();
    let (kvm_line, entry_text) = (profile.header_line, (profile.run_note)(&base.run));
    print!("{}", environment.render_header(kvm_line));
    let runs_text = match count {
        RunCount::Fixed(1) => "1 run per side".to_string(),
        RunCount::Fixed(n) => format!("{n} runs per side"),
        RunCount::Auto {
            max_runs,
            target_ci_pct,
        } => format!(
            "runs per side: auto, until the 95 % CI of {watched} is within {target_ci_pct} % of its mean \
             (at least {MIN_AUTO_RUNS}, at most {max_runs})"
        ),
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
            "  runs:      sched-messaging (perf bench sched messaging, pipes), {runs_text}, \
             interleaved{warmup_text}; rates are per message{entry_text}"
        );
    } else {
        println!(
            "  runs:      {workload} x {} iterations per run, {runs_text}, interleaved{warmup_text}{entry_text}",
            base.run.guest.iterations.unwrap_or(0),
        );
    }
    println!(
        "  sides:     baseline {}, compare {}",
        base.label, comp.label
    );
    for d in &differences {
        // Paths and command-line words from the user: escaped.
        println!(
            "{}",
            crate::cli::exit_code::escape_message(&format!("  differs:   {d}"))
        );
    }
    println!();
    environment
}

/// What differs between the two sides' settled runs, one line per kind:
/// the guest image, the command line the guest boots with, QEMU's CPU
/// model, vCPUs and memory. Empty when the sides boot the same thing.
pub(crate) fn side_differences(base: &ResolvedRun, comp: &ResolvedRun) -> Vec<String> {
    let mut out = Vec::new();
    // Compared as bytes (the same shared image is equal at once); hashed
    // for the text only when they differ.
    if base.boot.image != comp.boot.image {
        let image = |r: &ResolvedRun| {
            let g = side::guest_image_of(&r.config.kernel, Some(&r.boot.image));
            let release = r
                .guest_kind
                .linux()
                .and_then(|l| l.version.as_deref())
                .and_then(|v| v.split_whitespace().next())
                .map(|v| format!(" (Linux {v})"))
                .unwrap_or_default();
            let sha = g.sha256.unwrap_or_default();
            format!("{}{release} sha256 {sha:.16}", g.name)
        };
        out.push(format!("guest image: {} vs {}", image(base), image(comp)));
    }
    let words = |r: &ResolvedRun| -> Vec<String> {
        r.boot
            .cmdline
            .split_whitespace()
            .filter(|w| !w.starts_with("telemetry="))
            .map(str::to_string)
            .collect()
    };
    let (bw, cw) = (words(base), words(comp));
    let only = |a: &[String], b: &[String]| -> Vec<String> {
        a.iter().filter(|w| !b.contains(w)).cloned().collect()
    };
    let (gone, added) = (only(&bw, &cw), only(&cw, &bw));
    if !gone.is_empty() || !added.is_empty() {
        let mut parts = Vec::new();
        if !gone.is_empty() {
            parts.push(format!("baseline only: {}", gone.join(" ")));
        }
        if !added.is_empty() {
            parts.push(format!("compare only: {}", added.join(" ")));
        }
        out.push(format!("command line: {}", parts.join("; ")));
    }
    let cpu = |r: &ResolvedRun| r.config.qemu_cpu.clone().unwrap_or_else(|| "max".into());
    if base.config.qemu_cpu != comp.config.qemu_cpu {
        out.push(format!("QEMU CPU model: {} vs {}", cpu(base), cpu(comp)));
    }
    if base.config.cpus != comp.config.cpus {
        out.push(format!(
            "vCPUs: {} vs {}",
            base.config.cpus, comp.config.cpus
        ));
    }
    if base.config.mem_mib != comp.config.mem_mib {
        out.push(format!(
            "memory: {} vs {} MiB",
            base.config.mem_mib, comp.config.mem_mib
        ));
    }
    out
}

/// What compare does while the runs run: the progress bar, each side's CPU
/// times, telemetry warnings, the cross-checks that disagree, and a
/// `--fail-if` naming a metric the runs do not produce (a typo: said after
/// the first run, not the last).
struct Watcher<'a> {
    bar: &'a indicatif::ProgressBar,
    quiet: bool,
    started: Instant,
    before: Option<CpuTimes>,
    durations: [Durations; 2],
    disagreements: Vec<String>,
    conditions: &'a [Condition],
    checked: bool,
}

impl Progress<RunSummary> for Watcher<'_> {
    fn starting(&mut self, run: &RunId) {
        // Only on a terminal, and only once the compare has taken a while:
        // a short compare stays silent.
        if self.bar.is_hidden()
            && !self.quiet
            && std::io::stderr().is_terminal()
            && self.started.elapsed() > Duration::from_secs(2)
        {
            self.bar
                .set_draw_target(indicatif::ProgressDrawTarget::stderr());
        }
        self.bar.set_message(run.label.clone());
        self.before = Some(CpuTimes::now());
    }

    fn ran(&mut self, run: &RunId) {
        if let (false, Some(before)) = (run.warming, &self.before) {
            self.durations[run.side].add(before, &CpuTimes::now());
        }
    }

    fn finished(&mut self, run: &RunId, s: &RunSummary) -> Result<(), String> {
        let what = run.what();
        if !s.telemetry_valid() {
            self.bar.suspend(|| {
                say!(
                    "ptiscope compare: warning: {what}: guest telemetry invalid: {}",
                    s.telemetry_problems.join("; ")
                )
            });
        }
        if !run.warming {
            for c in s.cross_checks.iter().filter(|c| !c.agrees) {
                self.disagreements.push(format!(
                    "{what}: {}: {} {} vs {} {}",
                    c.what, c.host_metric, c.host_value, c.guest_metric, c.guest_value
                ));
            }
            if !std::mem::replace(&mut self.checked, true) {
                let names: Vec<String> = rates(s).into_iter().map(|(m, _)| m.name).collect();
                if let Some(c) = self.conditions.iter().find(|c| !names.contains(&c.metric)) {
                    return Err(format!(
                        "--fail-if: no metric {:?} in these runs (metrics: {})",
                        c.metric,
                        names.join(" ")
                    ));
                }
            }
        }
        self.bar.inc(1);
        Ok(())
    }
}

/// The metrics non-zero in some run (what the text tables show; the JSON
/// and CSV keep every metric).
pub(crate) fn nonzero_metrics(t: &CompareTable) -> CompareTable {
    let mut shown = t.clone();
    shown.metrics.retain(|m| {
        m.baseline
            .samples
            .iter()
            .chain(&m.compare.samples)
            .any(|&v| v != 0.0)
    });
    shown
}
