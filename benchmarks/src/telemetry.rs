//! Benchmarks of the measurement itself.
//!
//! - `telemetry`: getpid cycles/call (guest RDTSC around its loop) with
//!   `--metrics-interval 10` vs without, runs interleaved (A B, B A, ...) in
//!   one invocation. Target: medians within 1 %.
//! - `repeat`: the coefficient of variation of cycles/call over repeated
//!   identical runs. Target: below 2 %.
//!
//! Each run is one `ptiscope run --json` child; figures come from the run
//! JSON (schema ptiscope.run/2), so the benchmark also exercises the CLI.
use crate::measure::median;
use crate::Report;
use clap::Args;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// What each getpid run of these benchmarks is: how many, how long, PTI.
#[derive(Args)]
pub struct GetpidRuns {
    /// Runs (per variant, or identical runs).
    #[arg(long, default_value_t = 10)]
    runs: usize,
    /// getpid iterations per run.
    #[arg(long, default_value_t = 20_000)]
    iterations: u64,
    /// `--pti` of the runs.
    #[arg(long, default_value = "on")]
    pti: String,
}

#[derive(Args)]
pub struct TelemetryArgs {
    #[command(flatten)]
    runs: GetpidRuns,
    /// Live-metrics interval of the "with" variant, in ms.
    #[arg(long, default_value_t = 10)]
    interval_ms: u64,
}

#[derive(Args)]
pub struct RepeatArgs {
    #[command(flatten)]
    runs: GetpidRuns,
}

/// Target of the telemetry-overhead benchmark, in %.
const OVERHEAD_TARGET_PCT: f64 = 1.0;
/// Target of the repeatability benchmark, in %.
const COEFFVAR_TARGET_PCT: f64 = 2.0;

/// One run: (cycles/call from the guest, ns/call from the host clock).
fn one_run(
    ptiscope: &Path,
    pti: &str,
    iterations: u64,
    metrics_ms: Option<u64>,
) -> Result<(f64, f64), String> {
    let dir = std::env::temp_dir();
    let json: PathBuf = dir.join(format!("ptiscope-bench-{}.json", std::process::id()));
    let mut cmd = Command::new(ptiscope);
    cmd.args([
        "run",
        "--pti",
        pti,
        "--workload",
        "getpid",
        "--timeout",
        "120",
    ])
    .args(["--iterations", &iterations.to_string()])
    .arg("--json")
    .arg(&json)
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    if let Some(ms) = metrics_ms {
        cmd.args([
            "--metrics-interval",
            &ms.to_string(),
            "--metrics-out",
            "/dev/null",
        ]);
    }
    let status = cmd
        .status()
        .map_err(|e| format!("running {}: {e}", ptiscope.display()))?;
    if !status.success() {
        return Err(format!("ptiscope run exited with {status}"));
    }
    let v = crate::measure::take_run_json(&json)?;
    let rate = |name: &str| {
        crate::measure::per_iteration(&v, name)
            .ok_or_else(|| format!("no {name} rate in the run JSON"))
    };
    Ok((rate("cycles")?, rate("elapsed")?))
}

fn coeffvar(v: &[f64]) -> f64 {
    let n = v.len() as f64;
    if v.len() < 2 {
        return f64::NAN;
    }
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    var.sqrt() * 100.0 / mean
}

pub fn run_overhead(ptiscope: &Path, args: &TelemetryArgs) -> Result<Report, String> {
    if args.runs.runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for i in 0..args.runs.runs {
        let order = if i % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for live in order {
            let r = one_run(
                ptiscope,
                &args.runs.pti,
                args.runs.iterations,
                live.then_some(args.interval_ms),
            )?;
            if live {
                with.push(r.0);
            } else {
                without.push(r.0);
            }
        }
    }
    let (a, b) = (median(&without), median(&with));
    let diff = (b - a) * 100.0 / a;
    let verdict = if diff.abs() < OVERHEAD_TARGET_PCT {
        "met"
    } else {
        "NOT met"
    };
    let text = format!(
        "telemetry overhead: getpid (pti={}), {} iterations x {} runs per variant, interleaved\n\
         cycles/call median without live metrics: {a:.1} (CoeffVar {:.2} %)\n\
         cycles/call median with --metrics-interval {}: {b:.1} (CoeffVar {:.2} %)\n\
         ratio with/without: {:.4} ({diff:+.2} %); target |diff| < {OVERHEAD_TARGET_PCT} %: {verdict}",
        args.runs.pti,
        args.runs.iterations,
        args.runs.runs,
        coeffvar(&without),
        args.interval_ms,
        coeffvar(&with),
        b / a,
    );
    Ok(Report {
        text,
        json: json!({
            "bench": "telemetry_overhead",
            "pti": args.runs.pti, "iterations": args.runs.iterations, "runs": args.runs.runs,
            "interval_ms": args.interval_ms,
            "cycles_per_call_without": without, "cycles_per_call_with": with,
            "median_without": a, "median_with": b, "diff_pct": diff,
            "target_pct": OVERHEAD_TARGET_PCT,
        }),
    })
}

pub fn run_repeat(ptiscope: &Path, args: &RepeatArgs) -> Result<Report, String> {
    if args.runs.runs < 2 {
        return Err("--runs must be at least 2".into());
    }
    let mut cycles = Vec::new();
    let mut ns = Vec::new();
    for _ in 0..args.runs.runs {
        let (c, t) = one_run(ptiscope, &args.runs.pti, args.runs.iterations, None)?;
        cycles.push(c);
        ns.push(t);
    }
    let cv = coeffvar(&cycles);
    let verdict = if cv < COEFFVAR_TARGET_PCT {
        "met"
    } else {
        "NOT met"
    };
    let text = format!(
        "repeatability: getpid (pti={}), {} iterations, {} identical runs\n\
         cycles/call: median {:.1}, min {:.1}, max {:.1}, CoeffVar {cv:.2} %\n\
         ns/call (host clock): median {:.1}, CoeffVar {:.2} %\n\
         target CoeffVar < {COEFFVAR_TARGET_PCT} %: {verdict}",
        args.runs.pti,
        args.runs.iterations,
        args.runs.runs,
        median(&cycles),
        cycles.iter().cloned().fold(f64::INFINITY, f64::min),
        cycles.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
        median(&ns),
        coeffvar(&ns),
    );
    Ok(Report {
        text,
        json: json!({
            "bench": "repeatability",
            "pti": args.runs.pti, "iterations": args.runs.iterations, "runs": args.runs.runs,
            "cycles_per_call": cycles, "ns_per_call": ns,
            "coeffvar_pct": cv, "target_pct": COEFFVAR_TARGET_PCT,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coeffvar_of_known_samples() {
        // mean 812, sample stddev 12 -> 1.4778 %
        let cv = coeffvar(&[800.0, 812.0, 824.0]);
        assert!((cv - 1.477_832_512_315_271).abs() < 1e-9, "{cv}");
        assert!(coeffvar(&[1.0]).is_nan());
    }
}
