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
mod header;
mod output;
mod runs;
pub(crate) mod side;
pub(crate) mod side_key;
mod watcher;

pub use against::Against;
pub use runs::RunsReport;
pub use side::{
    build_table, config_words, guest_image_of, parse_side, rates, run_measured, Side, SideSpec,
};

use std::time::Instant;

use against::read_earlier;
use durations::Durations;
use header::print_header;
pub(crate) use output::write_file;
use runs::ci_pct;
pub(crate) use runs::progress;
use watcher::Watcher;

use crate::cli::command_error::{CommandError, SideError};
use crate::cli::exit_code::{self, ExitCode};
use crate::cli::{CompareArgs, Runs, DEFAULT_MAX_RUNS, DEFAULT_TARGET_CI_PCT};
use crate::experiment::{Experiment, RunCount, RunId};
use crate::preflight::preflight;
use crate::report::{CompareTable, FailIf, RunSummary};
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
    let backend = args.target.on.backend()?;
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
        refuse_by_symbol(backend.as_ref(), args.target.on.qemu().no_plugin, None)?;
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
    let facts = crate::cli::facts_for(backend.as_ref(), &base.config)?;
    let settle = |spec: SideSpec| {
        preflight(&spec.config, backend.target(), &facts).map(|run| Side {
            label: spec.label,
            run,
        })
    };
    let (mut base, mut comp) = (settle(base)?, settle(comp)?);
    if args.by_symbol {
        refuse_by_symbol(
            backend.as_ref(),
            args.target.on.qemu().no_plugin,
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
    let mut environment = print_header(args, &*backend, &facts, &base, &comp, count, watched);

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
    let why = if backend.profile().capabilities.counts_kernel_by_address {
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
