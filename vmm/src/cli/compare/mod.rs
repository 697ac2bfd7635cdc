//! `ptiscope compare` (and `ptiscope` with no arguments): a baseline and a
//! compare configuration, each run `--runs` times, interleaved (B C, C B,
//! B C, ...) so that slow drifts of a noisy host hit both sides alike; the
//! per-call rates of every run go into the mmtests compare-kernels table.
//!
//! Size: `run` is the compare command's one sequence (outputs, sides, header,
//! the interleaved loop, tables, files, guards); the pieces it uses are in
//! this folder's other files.

mod against;
mod durations;
mod runs;
pub(crate) mod side;

pub use against::Against;
pub use runs::{RunsReport, RunsStop};
pub use side::{
    build_table, config_words, guest_image, guest_image_of, parse_side, rates, run_measured, Side,
    SideError, SideSpec,
};

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use against::read_earlier;
use durations::{render_durations, CpuTimes, Durations};
use runs::{ci_pct, main_time_metric, progress};

use crate::cli::exit_code::{self, ExitCode};
use crate::cli::{
    Backend, CompareArgs, Runs, DEFAULT_MAX_RUNS, DEFAULT_TARGET_CI_PCT, MIN_AUTO_RUNS,
};
use crate::output::{open_outputs, OutputFile};
use crate::preflight::cmdline::{EntryChoice, Workload};
use crate::preflight::{host, preflight};
use crate::report::environment::Environment;
use crate::report::{CompareTable, Condition, RunSummary};

/// Runs the comparison and prints it; returns the process exit code.
pub fn run(args: &CompareArgs) -> i32 {
    if crate::cli::pound::wants_sweep(args) {
        return crate::cli::pound::run(args);
    }
    let embedded = args.target.arch().embedded_image();
    if args.target.backend == Backend::Kvm && !args.target.qemu_arg.is_empty() {
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
        Some(p) => match read_earlier(p, args.exp.timeout.min(crate::input::READ_TIME_LIMIT)) {
            Ok(t) => Some(t),
            Err((code, msg)) => {
                eprintln!("ptiscope compare: --against {}: {msg}", p.display());
                return code;
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
    let sides = parse_side(&args.baseline, &args.exp, &args.target, embedded).and_then(|b| {
        Ok((
            b,
            parse_side(&args.compare, &args.exp, &args.target, embedded)?,
        ))
    });
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
    let outputs = [
        ("--json", args.json.as_deref()),
        ("--csv", args.csv.as_deref()),
        ("--svg", args.svg.as_deref()),
    ];
    let [json_file, csv_file, svg_file] = match open_outputs(outputs, args.exp.timeout) {
        Ok(files) => files,
        Err(e) => {
            eprintln!("ptiscope compare: {e}");
            return e.exit_code();
        }
    };

    // Settle both sides once (image read, entry resolved, host limits
    // checked): every run of a side then boots the same resolved run.
    let settle = |spec: SideSpec| {
        preflight(&spec.config, args.target.backend.target()).map(|run| Side {
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
    let watched = main_time_metric(args.target.backend);

    match &base.run.linux {
        Some(l) => println!(
            "ptiscope compare: what PTI costs in Linux ({}, {}) on this host",
            l.arch.name(),
            l.version.as_deref().unwrap_or("version unknown")
        ),
        None => println!("ptiscope compare: what PTI costs in the ptiscope guest on this host"),
    }
    // Probed once per process (the entry probe also resolves entry=auto).
    let mut environment = Environment::collect(
        match args.target.backend {
            Backend::Kvm => "kvm",
            Backend::Qemu => "qemu",
        },
        side::guest_image_of(&base.run.config.kernel, Some(&base.run.image)),
        BTreeMap::new(),
    );
    let mut kvm_line = None;
    let entry_text;
    match args.target.backend {
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
            kvm_line = Some(host::kvm_flavour().describe());
            entry_text = format!("; entry {entry}");
        }
        Backend::Qemu => {
            let binary = match base.run.linux.as_ref().map(|l| l.arch) {
                Some(crate::linux::LinuxArch::X86_64) => "qemu-system-x86_64",
                Some(crate::linux::LinuxArch::I386) => "qemu-system-i386",
                None => crate::backend::qemu::binary_for(&base.run.image),
            };
            entry_text = format!(
                "; backend QEMU TCG ({binary}): software emulation, {}",
                if args.target.no_plugin {
                    "every figure guest-reported"
                } else {
                    "[qemu-plugin] figures host-observed, the others guest-reported"
                }
            );
        }
    }
    print!("{}", environment.render_header(kvm_line));
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
    println!();

    let total = 2 * u64::from(max_runs + args.warmup);
    let bar = progress(total, args.quiet);
    let started = Instant::now();
    let mut runs: [Vec<RunSummary>; 2] = [Vec::new(), Vec::new()];
    let mut durations = [Durations::default(), Durations::default()];
    let mut disagreements: Vec<String> = Vec::new();
    let specs = [&base, &comp];
    let mut pair: u32 = 0;
    // A signal or a failed run after complete pairs: (exit code, reason).
    let mut partial: Option<(i32, String)> = None;
    let stopped = 'pairs: loop {
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
            let result = run_measured(&specs[side].run, args.target.backend);
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
                Err(e) => {
                    let (code, msg) = (e.exit_code(), e);
                    bar.finish_and_clear();
                    let of = match args.runs {
                        Runs::Fixed(n) if !warming => format!(" of {n}"),
                        _ => String::new(),
                    };
                    eprintln!("ptiscope compare: {what}{of} failed: {msg}");
                    let code = exit_code::failed_run(code);
                    // The complete pairs so far are still a result.
                    let complete = runs[0].len().min(runs[1].len());
                    if warming || complete == 0 {
                        return code;
                    }
                    runs[0].truncate(complete);
                    runs[1].truncate(complete);
                    let reason = match code - 128 {
                        sig if crate::machine::signals::TERMINATION_SIGNALS.contains(&sig) => {
                            format!("{} during {what}", crate::machine::signals::describe(sig))
                        }
                        _ => format!("{what} failed"),
                    };
                    partial = Some((code, reason));
                    break 'pairs RunsStop::Partial;
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
    let banner = partial.as_ref().map(|(_, why)| {
        format!(
            "PARTIAL: {why}; {} complete run pairs of {} reported",
            runs[0].len(),
            match args.runs {
                Runs::Fixed(n) => n.to_string(),
                Runs::Auto => format!("up to {max_runs}"),
            }
        )
    });
    if let Some(b) = &banner {
        println!("{b}");
    }
    // The answer first, then the compact table; the mmtests table (the
    // metrics non-zero somewhere) and the durations behind --mmtests.
    let per = match base.run.guest.workload {
        Some(Workload::SchedMessaging) => "message".to_owned(),
        w => format!("{} call", w.map_or("-", Workload::name)),
    };
    print!("{}", crate::report::answer::render_answer(&table, &per));
    println!();
    print!("{}", crate::report::answer::render_table(&table));
    if args.mmtests {
        let mut shown = table.clone();
        shown.metrics.retain(|m| {
            m.baseline
                .samples
                .iter()
                .chain(&m.compare.samples)
                .any(|&v| v != 0.0)
        });
        println!();
        print!("{}", shown.render_text());
        println!();
        print!("{}", render_durations(&base.label, &comp.label, &durations));
    }
    println!();
    println!(
        "  {}; {} runs in {:.1} s",
        runs_report.sentence(),
        2 * (per_side + args.warmup),
        started.elapsed().as_secs_f64()
    );
    for d in &dropped {
        println!("  note: metric {d}, left out of the table");
    }
    if args.target.backend == Backend::Qemu && args.target.no_plugin {
        println!("  backend qemu --no-plugin: no host-observed figures, so nothing to cross-check");
    } else if disagreements.is_empty() {
        println!("  cross-checks (host-observed vs guest-reported): all agree in every run");
    } else {
        println!("  cross-checks that DISAGREE:");
        for d in disagreements.iter().take(10) {
            println!("    {d}");
        }
    }
    if args.target.backend == Backend::Kvm && !host::kvm_flavour().sees_cr3_writes() {
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

    let mut code = partial.as_ref().map_or(0, |(c, _)| *c);
    if let Some(f) = &json_file {
        let mut doc = json_text(&table, &durations, &runs_report, against.as_ref());
        if let Some(b) = &banner {
            doc = json_with_partial(doc, b);
        }
        code = code.max(write_file(f, &doc));
    }
    if let Some(f) = &svg_file {
        let doc = crate::cli::partial::svg_with_banner(
            crate::report::plot::compare_svg(&table),
            banner.as_deref(),
        );
        code = code.max(write_file(f, &doc));
    }
    if let Some(f) = &csv_file {
        let doc = crate::cli::partial::csv_with_banner(table.to_csv(), banner.as_deref());
        code = code.max(write_file(f, &doc));
    }
    for c in &conditions {
        match c.evaluate(&table) {
            Ok(ev) if ev.triggered => {
                eprintln!(
                    "ptiscope compare: --fail-if {} holds (value {})",
                    ev.condition, ev.value
                );
                code = code.max(exit_code::FAILED);
            }
            Ok(ev) => eprintln!(
                "ptiscope compare: --fail-if {} does not hold (value {})",
                ev.condition, ev.value
            ),
            Err(e) => {
                eprintln!("ptiscope compare: --fail-if cannot be evaluated: {e}");
                code = code.max(exit_code::FAILED);
            }
        }
    }
    code
}

/// A compare document with `"partial": {"reason": banner}`.
fn json_with_partial(doc: String, banner: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(&doc) {
        Ok(serde_json::Value::Object(mut m)) => {
            m.insert("partial".into(), serde_json::json!({ "reason": banner }));
            serde_json::to_string_pretty(&m).unwrap_or(doc)
        }
        _ => doc,
    }
}

fn json_text(
    t: &CompareTable,
    durations: &[Durations; 2],
    runs: &RunsReport,
    against: Option<&Against>,
) -> String {
    let mut v = t.to_json();
    if let Some(o) = v.as_object_mut() {
        o.insert("answer".into(), crate::report::answer::to_json(t));
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

fn write_file(f: &OutputFile, text: &str) -> i32 {
    match f.write_document(text) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ptiscope compare: {e}");
            exit_code::CANT_CREATE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::loader::KernelSource;

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
