//! `ptiscope compare --workload poundsyscall` without a `threads=` on
//! either side: the mmtests poundsyscall layout, one row group per thread
//! count T = 1, 2, ... 2 × `--cpus`, baseline vs compare, `--runs` runs per
//! side and thread count, interleaved. The figure is the elapsed time of
//! the measured phase (from the begin marker, when every thread is released,
//! until the last one is reaped), as mmtests reports it; the per-call time
//! and the CR3 writes per call follow. With a `threads=` on both sides the
//! ordinary compare runs (one thread count, the full table, `--fail-if`).

use crate::cli::command_error::CommandError;
use crate::cli::compare::side::{guest_image_of, parse_side, run_measured, SideSpec};
use crate::cli::compare::{parse_sides, write_file};
use crate::cli::exit_code;
use crate::cli::{CompareArgs, Runs};
use crate::experiment::{Experiment, ExperimentError, Failed, Outcome, RunCount, RunId, Silent};
use crate::output::open_outputs;
use crate::preflight::preflight;
use crate::probe::host;
use crate::report::environment::Environment;
use crate::report::RunSummary;
use ptiscope_abi::cmdline::THREADS;
use ptiscope_abi::options::Workload;

/// Whether `args` asks for the thread-count sweep: `--workload poundsyscall`
/// and neither side sets the guest's `threads=` (a word of its parsed
/// `cmdline=`). A side whose options do not parse is decided by its text, as
/// it always was, so the checks and the message that refuse it stay the same.
pub fn wants_sweep(args: &CompareArgs) -> bool {
    let sets_threads = |opts: &str| match parse_side(
        opts,
        &args.exp,
        &args.target,
        args.arch().embedded_image(),
    ) {
        Ok(side) => side.config.guest.extra_value(THREADS).is_some(),
        Err(_) => opts.contains("threads="),
    };
    args.exp.workload == Workload::Poundsyscall
        && !sets_threads(&args.baseline)
        && !sets_threads(&args.compare)
}

/// Samples of one side at one thread count.
#[derive(Debug, Default, Clone, serde::Serialize)]
struct Samples {
    elapsed_ns: Vec<f64>,
    ns_per_call: Vec<f64>,
    cr3_writes_per_call: Vec<f64>,
}

impl Samples {
    /// The figures of one side's runs, in run order.
    fn of(runs: &[RunSummary]) -> Samples {
        let mut samples = Samples::default();
        for s in runs {
            if let Some(r) = s.row("elapsed") {
                samples.elapsed_ns.push(r.total);
                samples.ns_per_call.extend(r.per_iteration);
            }
            if let Some(r) = s.row("cr3_writes") {
                samples.cr3_writes_per_call.extend(r.per_iteration);
            }
        }
        samples
    }
}

#[derive(Debug, Clone, serde::Serialize)]
struct ThreadCount {
    threads: u32,
    baseline: Samples,
    compare: Samples,
}

fn stats(v: &[f64]) -> (f64, f64, f64) {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mean = if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    };
    (min, mean, max)
}

/// mmtests' sign: the compare column's difference in %, negative = worse
/// (slower) for a time.
fn diff_pct(base: f64, comp: f64) -> f64 {
    if base == 0.0 {
        0.0
    } else {
        (base - comp) / base * 100.0
    }
}

/// Runs the sweep; returns the exit status.
pub fn run(args: &CompareArgs) -> i32 {
    exit_code::finish("compare", pound(args))
}

/// The refusals, then one experiment per thread count (each its runs,
/// interleaved), then the table.
fn pound(args: &CompareArgs) -> Result<i32, CommandError> {
    if !args.fail_if.is_empty() {
        return Err(CommandError::Usage(
            "--fail-if needs one thread count: add threads=N to both \
             --baseline and --compare (e.g. 'pti=on,cmdline=threads=2')"
                .into(),
        ));
    }
    let runs = match args.runs {
        Runs::Fixed(n) if args.against.is_none() && args.warmup == 0 => n,
        _ => {
            return Err(CommandError::Usage(
                "--runs auto, --warmup and --against work on one table; \
                 poundsyscall's table per thread count takes a fixed --runs N"
                    .into(),
            ))
        }
    };
    if args.out.csv.is_some() || args.out.svg.is_some() {
        return Err(CommandError::Usage(
            "poundsyscall's table per thread count is written as text and \
             --json only (no --csv or --svg)"
                .into(),
        ));
    }
    let backend = args.target.on.backend()?;
    if let Some(why) = args.target.on.refusal(&args.target.on.requested()) {
        return Err(CommandError::Usage(why));
    }
    // Opened before the first boot, as compare's outputs are.
    let [json_file] = open_outputs([("--json", args.out.json.as_deref())], args.exp.timeout)?;
    let (base, comp) = parse_sides(args)?;
    // The KVM the runs run on: this host's, or the backend's own.
    let facts = crate::cli::facts_for(&*backend, &base.config)?;
    let max_threads = 2 * args.exp.cpus;
    println!("ptiscope compare: poundsyscall (mmtests) per thread count on this host");
    println!("  host:      {}", host::describe_host());
    // What the elapsed seconds below are on this backend.
    let env = crate::report::Environment {
        backend: backend.name().to_owned(),
        kvm: crate::report::environment::kvm(&facts),
        ..Default::default()
    };
    println!(
        "  times:     {}",
        crate::report::environment::time_basis(Some(&env)).label()
    );
    println!(
        "  workload:  T threads x {} getppid calls each, T = 1..={max_threads} (2 x {} vCPUs), \
         {} runs per side and T, interleaved",
        args.exp.iterations, args.exp.cpus, runs
    );
    println!("  baseline:  {}", base.label);
    println!("  compare:   {}", comp.label);
    println!();

    let mut counts: Vec<ThreadCount> = Vec::new();
    // The baseline's image as preflight read it, hashed for the environment.
    let mut booted: Option<std::sync::Arc<[u8]>> = None;
    for threads in 1..=max_threads {
        let with_threads = |spec: &SideSpec| {
            let mut c = spec.config.clone();
            c.guest.extra = format!("{} threads={threads}", c.guest.extra)
                .trim()
                .to_string();
            preflight(&c, backend.target(), &facts)
        };
        let resolved = [with_threads(&base)?, with_threads(&comp)?];
        booted.get_or_insert_with(|| resolved[0].boot.image.clone());
        let outcome = Experiment::new(vec![base.label.clone(), comp.label.clone()]).run(
            0,
            RunCount::Fixed(runs),
            &|_| None,
            &mut |id: &RunId| run_measured(&resolved[id.side], &*backend).map(|(_, s)| s),
            &mut Silent,
        );
        // Any failed run fails the table (no partial table per thread count).
        let failed = match outcome {
            Ok(Outcome {
                failed: Some(Failed { run, error }),
                ..
            }) => Err(ExperimentError::Run { run, source: error }),
            other => other,
        };
        let sides = failed.map_err(|e| {
            CommandError::experiment(e, |run| {
                format!("{} threads={threads} run {}", run.label, run.number)
            })
        })?;
        let [baseline, compare] = [&sides.runs[0], &sides.runs[1]].map(|r| Samples::of(r));
        counts.push(ThreadCount {
            threads,
            baseline,
            compare,
        });
    }
    print!("{}", render(&base.label, &comp.label, &counts));
    if let Some(f) = &json_file {
        let environment = Environment::collect(
            &facts,
            crate::backend::identity(&*backend),
            guest_image_of(&base.config.kernel, booted.as_deref()),
            [
                ("baseline".to_owned(), vec![base.label.clone()]),
                ("compare".to_owned(), vec![comp.label.clone()]),
            ]
            .into(),
        );
        let v = serde_json::json!({
            "schema": "ptiscope-poundsyscall/1",
            "cpus": args.exp.cpus,
            "calls_per_thread": args.exp.iterations,
            "runs": runs,
            "baseline": base.label,
            "compare": comp.label,
            "thread_counts": counts,
            "environment": environment,
        });
        let text = serde_json::to_string_pretty(&v).unwrap_or_else(|_| "null".into());
        return Ok(write_file("compare", f, &text));
    }
    Ok(0)
}

/// The mmtests-style table: Min/Amean/Max of the elapsed seconds per
/// thread count, then the mean ns and CR3 writes per call.
fn render(base: &str, comp: &str, counts: &[ThreadCount]) -> String {
    let mut out = String::new();
    out.push_str(&format!("{:<24}{:>24}{:>24}\n", "", base, comp));
    let mut row = |stat: &str, name: String, b: f64, c: f64, scale: f64, prec: usize| {
        // A difference from zero, or from a baseline that prints as zero
        // (0.0004 CR3 writes per call: the phase's few context switches),
        // has no meaningful percentage.
        let prints_as_zero = (b * scale).abs() < 0.5 / 10f64.powi(prec as i32);
        let pct = if prints_as_zero && c != b {
            "    n/a".to_string()
        } else {
            format!("{:>7.2}", diff_pct(b, c))
        };
        out.push_str(&format!(
            "{stat:<7}{name:<17}{:>14.prec$} ({:>7.2}%){:>14.prec$} ({pct}%)\n",
            b * scale,
            0.0,
            c * scale,
        ));
    };
    // Under --backend qemu there is no host clock over the phase: leave the
    // time rows out rather than print empty statistics.
    let timed = counts
        .iter()
        .any(|t| !t.baseline.elapsed_ns.is_empty() || !t.compare.elapsed_ns.is_empty());
    for t in counts.iter().filter(|_| timed) {
        let (bmin, bmean, bmax) = stats(&t.baseline.elapsed_ns);
        let (cmin, cmean, cmax) = stats(&t.compare.elapsed_ns);
        let name = format!("elapsed-{}", t.threads);
        row("Min", name.clone(), bmin, cmin, 1e-9, 4);
        row("Amean", name.clone(), bmean, cmean, 1e-9, 4);
        row("Max", name, bmax, cmax, 1e-9, 4);
    }
    for t in counts.iter().filter(|_| timed) {
        let b = stats(&t.baseline.ns_per_call).1;
        let c = stats(&t.compare.ns_per_call).1;
        row("Amean", format!("ns/call-{}", t.threads), b, c, 1.0, 0);
    }
    for t in counts {
        let b = stats(&t.baseline.cr3_writes_per_call).1;
        let c = stats(&t.compare.cr3_writes_per_call).1;
        row("Amean", format!("cr3/call-{}", t.threads), b, c, 1.0, 3);
    }
    if timed {
        out.push_str(
            "\nelapsed in seconds (host clock over the measured phase), lower is better; \
             (%) is mmtests' difference, negative = slower than the baseline\n",
        );
    } else {
        out.push_str(
            "\nno elapsed or ns/call rows: these runs have no host clock over the measured \
             phase (--backend qemu); the CR3 writes are the guest's count\n",
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn wants(argv: &[&str]) -> bool {
        let mut v = vec!["ptiscope", "compare"];
        v.extend_from_slice(argv);
        match crate::cli::Cli::try_parse_from(v).map(|c| c.command) {
            Ok(Some(crate::cli::Command::Compare(a))) => wants_sweep(&a),
            other => panic!("{argv:?}: {other:?}"),
        }
    }

    #[test]
    fn the_thread_count_table_is_for_poundsyscall_without_threads() {
        assert!(wants(&["--workload", "poundsyscall"]));
        assert!(!wants(&["--workload", "getpid"]));
        let two = "pti=on,cmdline=threads=2";
        assert!(!wants(&["--workload", "poundsyscall", "--compare", two]));
        assert!(!wants(&[
            "--workload",
            "poundsyscall",
            "--baseline",
            "cmdline=threads=1"
        ]));
        // Other guest words are not a thread count.
        assert!(wants(&[
            "--workload",
            "poundsyscall",
            "--compare",
            "cmdline=wss=1M"
        ]));
        // Options that do not parse are decided by their text, as before.
        assert!(!wants(&[
            "--workload",
            "poundsyscall",
            "--compare",
            "threads=2"
        ]));
        assert!(wants(&[
            "--workload",
            "poundsyscall",
            "--compare",
            "pti=maybe"
        ]));
    }

    #[test]
    fn mmtests_sign_and_stats() {
        assert_eq!(diff_pct(2.0, 3.0), -50.0);
        assert_eq!(diff_pct(0.0, 3.0), 0.0);
        assert_eq!(stats(&[1.0, 3.0]), (1.0, 2.0, 3.0));
        let t = ThreadCount {
            threads: 2,
            baseline: Samples {
                elapsed_ns: vec![1e9],
                ns_per_call: vec![100.0],
                cr3_writes_per_call: vec![0.0],
            },
            compare: Samples {
                elapsed_ns: vec![1.5e9],
                ns_per_call: vec![150.0],
                cr3_writes_per_call: vec![2.0],
            },
        };
        let text = render("pti=off", "pti=on", &[t]);
        assert!(text.contains("elapsed-2"), "{text}");
        assert!(text.contains("1.5000 ( -50.00%)"), "{text}");
        assert!(text.contains("cr3/call-2"), "{text}");
    }
}
