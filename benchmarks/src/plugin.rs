//! `plugin`: what ptiscope's QEMU TCG plugin costs. getpid under QEMU TCG
//! (`--backend qemu`) with the plugin (the default) and with `--no-plugin`,
//! runs interleaved (A B, B A, ...) in one invocation. Speed is the guest's
//! own loop time (RDTSC cycles per call: under TCG the TSC follows the host
//! clock, so it measures emulation speed without QEMU's start-up) and, as
//! a second view, each run's wall time. Target: the plugin run's speed is
//! at least 0.75 of the run without it (ratio of medians).
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

/// One run: (guest cycles per call, wall seconds, the plugin's kernel
/// instructions per call if it ran).
fn one_run(
    ptiscope: &Path,
    args: &PluginArgs,
    plugin: bool,
) -> Result<(f64, f64, Option<f64>), String> {
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
    let text =
        std::fs::read_to_string(&json).map_err(|e| format!("reading {}: {e}", json.display()))?;
    let _ = std::fs::remove_file(&json);
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("run JSON: {e}"))?;
    let rate = |name: &str| {
        v["rows"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["name"] == name))
            .and_then(|r| r["per_iteration"].as_f64())
    };
    let cycles = rate("cycles").ok_or("no cycles rate in the run JSON")?;
    let kernel = rate("kernel_instructions");
    if plugin && kernel.is_none() {
        return Err("the plugin run has no [qemu-plugin] kernel_instructions row".into());
    }
    Ok((cycles, sample.wall.as_secs_f64(), kernel))
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
            let (c, w, k) = one_run(ptiscope, args, plugin)?;
            if plugin {
                with.push((c, w));
                kernel = kernel.or(k);
            } else {
                without.push((c, w));
            }
        }
    }
    let med =
        |v: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
    let (cw, co) = (med(&with, |s| s.0), med(&without, |s| s.0));
    let (ww, wo) = (med(&with, |s| s.1), med(&without, |s| s.1));
    // Speed is the inverse of time: speed(with) / speed(without).
    let ratio = co / cw;
    let wall_ratio = wo / ww;
    let verdict = if ratio >= TARGET_RATIO {
        "meets"
    } else {
        "MISSES"
    };
    let text = format!(
        "QEMU TCG plugin overhead: getpid x {} per run, pti={}, arch={}, {} runs per variant, interleaved\n\
         variant            guest cycles/call   wall s/run\n\
         --no-plugin        {co:>17.1}   {wo:>10.3}\n\
         plugin (default)   {cw:>17.1}   {ww:>10.3}\n\
         speed with the plugin / without: {ratio:.3} (guest loop), {wall_ratio:.3} (wall time per run); \
         target >= {TARGET_RATIO}: {verdict}\n\
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
            "speed_ratio": ratio,
            "wall_speed_ratio": wall_ratio,
            "target_ratio": TARGET_RATIO,
            "meets_target": ratio >= TARGET_RATIO,
            "plugin_kernel_instructions_per_call": kernel,
        }),
    })
}
