//! `plugin`: what ptiscope's QEMU TCG plugin costs. getpid under QEMU TCG
//! (`--backend qemu`) with the plugin (the default) and with `--no-plugin`,
//! runs interleaved (A B, B A, ...) in one invocation. Speed is the guest's
//! CPU time of each run (ptiscope and the QEMU it reaps: the work done,
//! least disturbed by the other processes of a shared machine), and, as
//! other views, the guest's own loop time (RDTSC cycles per call: under TCG
//! the TSC follows the host clock, so it is emulation speed without QEMU's
//! start-up, but also every other process's) and each run's wall time.
//! Target: the plugin run's speed is at least 0.75 of the run without it
//! (ratio of median CPU times).
use crate::measure::{self, median};
use crate::Report;
use clap::Args;
use serde_json::json;
use std::path::Path;
use std::process::Command;

#[derive(Args)]
pub struct PluginArgs {
    /// Runs per variant.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// getpid iterations per run.
    #[arg(long, default_value_t = 100_000)]
    iterations: u64,
    /// `--pti` of the runs.
    #[arg(long, default_value = "on")]
    pti: String,
    /// `--arch` of the runs (x86_64 or i386).
    #[arg(long, default_value = "x86_64")]
    arch: String,
}

/// The target speed ratio (with plugin / without).
const TARGET_RATIO: f64 = 0.75;

/// One run: (guest cycles per call, wall seconds, CPU seconds), and the
/// plugin's kernel instructions per call if it ran.
type RunFigures = ((f64, f64, f64), Option<f64>);

fn one_run(ptiscope: &Path, args: &PluginArgs, plugin: bool) -> Result<RunFigures, String> {
    let json = std::env::temp_dir().join(format!(
        "ptiscope-bench-plugin-{}-{plugin}.json",
        std::process::id()
    ));
    let mut cmd = Command::new(ptiscope);
    cmd.args([
        "run",
        "--backend",
        "qemu",
        "--workload",
        "getpid",
        "--timeout",
        "300",
    ])
    .args(["--pti", &args.pti, "--arch", &args.arch])
    .args(["--iterations", &args.iterations.to_string()])
    .arg("--json")
    .arg(&json);
    if !plugin {
        cmd.arg("--no-plugin");
    }
    let sample =
        measure::run(&mut cmd).map_err(|e| format!("running {}: {e}", ptiscope.display()))?;
    if sample.code != Some(0) {
        return Err(format!(
            "ptiscope run --backend qemu{} exited with {:?}",
            if plugin { "" } else { " --no-plugin" },
            sample.code
        ));
    }
    let v = crate::measure::take_run_json(&json)?;
    let rate = |name: &str| crate::measure::per_iteration(&v, name);
    let cycles = rate("cycles").ok_or("no cycles rate in the run JSON")?;
    let kernel = rate("kernel_instructions");
    if plugin && kernel.is_none() {
        return Err("the plugin run has no [qemu-plugin] kernel_instructions row".into());
    }
    Ok((
        (cycles, sample.wall.as_secs_f64(), sample.cpu.as_secs_f64()),
        kernel,
    ))
}

pub fn run(ptiscope: &Path, args: &PluginArgs) -> Result<Report, String> {
    if args.runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let mut kernel = None;
    for i in 0..args.runs {
        // A B, B A, ...: neither variant always goes first.
        let order = if i % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for plugin in order {
            let (f, k) = one_run(ptiscope, args, plugin)?;
            if plugin {
                with.push(f);
                kernel = kernel.or(k);
            } else {
                without.push(f);
            }
        }
    }
    type F = (f64, f64, f64);
    let med = |v: &[F], f: fn(&F) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
    let (cw, co) = (med(&with, |s| s.0), med(&without, |s| s.0));
    let (ww, wo) = (med(&with, |s| s.1), med(&without, |s| s.1));
    let (uw, uo) = (med(&with, |s| s.2), med(&without, |s| s.2));
    // Speed is the inverse of time: speed(with) / speed(without).
    let ratio = uo / uw;
    let loop_ratio = co / cw;
    let wall_ratio = wo / ww;
    let verdict = if ratio >= TARGET_RATIO {
        "meets"
    } else {
        "MISSES"
    };
    let text = format!(
        "QEMU TCG plugin overhead: getpid x {} per run, pti={}, arch={}, {} runs per variant, interleaved\n\
         variant            CPU s/run   guest cycles/call   wall s/run\n\
         --no-plugin        {uo:>9.3}   {co:>17.1}   {wo:>10.3}\n\
         plugin (default)   {uw:>9.3}   {cw:>17.1}   {ww:>10.3}\n\
         speed with the plugin / without: {ratio:.3} (CPU time per run; target >= {TARGET_RATIO}: {verdict}); \
         {loop_ratio:.3} (guest loop), {wall_ratio:.3} (wall time per run)\n\
         plugin kernel instructions per call: {}",
        args.iterations,
        args.pti,
        args.arch,
        args.runs,
        kernel.map_or("-".into(), |k| format!("{k:.2}")),
    );
    Ok(Report {
        text,
        json: json!({
            "bench": "plugin",
            "iterations": args.iterations,
            "runs": args.runs,
            "pti": args.pti,
            "arch": args.arch,
            "cycles_per_call": {"plugin": cw, "no_plugin": co},
            "wall_s": {"plugin": ww, "no_plugin": wo},
            "cpu_s": {"plugin": uw, "no_plugin": uo},
            "speed_ratio": ratio,
            "loop_speed_ratio": loop_ratio,
            "wall_speed_ratio": wall_ratio,
            "target_ratio": TARGET_RATIO,
            "meets_target": ratio >= TARGET_RATIO,
            "plugin_kernel_instructions_per_call": kernel,
        }),
    })
}
