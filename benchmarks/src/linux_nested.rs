//! `linux-nested`: what Linux on ptiscope's VMM costs under `--backend
//! nested`. The same Linux comparison (`ptiscope compare --linux K
//! --workload getppid`, pti=off vs pti=on) on the VMM inside QEMU TCG with
//! the inner KVM on nested paging (`--nested-paging npt`) and on shadow
//! paging (`shadow`, where KVM counts the CR3 writes; with the loop on a
//! tick-free vCPU, the default, and with `--tick-free off`), beside it straight
//! under QEMU TCG (`--backend qemu`), interleaved in rotating order, in
//! one invocation. Each figure is a whole command's wall time (the boots
//! included: what a user waits), and each Linux run's own time (the
//! compare's `durations` in its JSON: boot of the Linux guest, the loop and
//! its exit, without the nested session's outer boot). Target (issue 29):
//! a Linux run on the VMM within 1.5x of the same run under `--backend
//! qemu`.
use crate::measure::{self, median};
use crate::Report;
use clap::Args;
use serde_json::json;
use std::path::Path;
use std::process::Command;

#[derive(Args)]
pub struct LinuxNestedArgs {
    /// The kernel (`debian-amd64` or a path).
    #[arg(long, default_value = "debian-amd64")]
    kernel: String,
    /// Comparisons per variant.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// `--runs` of each comparison.
    #[arg(long, default_value_t = 2)]
    runs: u32,
    /// Skip the shadow-paging variant (a QEMU whose SVM breaks it refuses it).
    #[arg(long)]
    no_shadow: bool,
}

/// The target ratio: VMM under nested / QEMU TCG.
const TARGET_RATIO: f64 = 1.5;

/// The variants: (name, ptiscope's backend arguments).
fn variants(args: &LinuxNestedArgs) -> Vec<(&'static str, Vec<&'static str>)> {
    let mut v = vec![
        ("qemu", vec!["--backend", "qemu"]),
        (
            "nested-npt",
            vec!["--backend", "nested", "--nested-paging", "npt"],
        ),
    ];
    if !args.no_shadow {
        // With the default --tick-free auto (the loop on a nohz_full vCPU,
        // for an exact CR3 count), and without it.
        v.push((
            "nested-shadow",
            vec!["--backend", "nested", "--nested-paging", "shadow"],
        ));
        v.push((
            "shadow-ticking",
            vec![
                "--backend",
                "nested",
                "--nested-paging",
                "shadow",
                "--tick-free",
                "off",
            ],
        ));
    }
    v
}

/// One comparison: (its wall time, the mean time of one of its runs), seconds.
fn one(ptiscope: &Path, args: &LinuxNestedArgs, backend: &[&str]) -> Result<(f64, f64), String> {
    let json = std::env::temp_dir().join(format!(
        "ptiscope-bench-linux-nested-{}.json",
        std::process::id()
    ));
    let mut cmd = Command::new(ptiscope);
    cmd.args(["compare", "--quiet", "--linux", &args.kernel])
        .args(["--workload", "getppid", "--runs", &args.runs.to_string()])
        .arg("--json")
        .arg(&json)
        .args(backend);
    let s = measure::run(&mut cmd).map_err(|e| format!("running {}: {e}", ptiscope.display()))?;
    if s.code != Some(0) {
        return Err(format!(
            "ptiscope compare --linux {} {} exited with {:?}",
            args.kernel,
            backend.join(" "),
            s.code
        ));
    }
    let doc: serde_json::Value = std::fs::read(&json)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        .map_err(|e| format!("reading the compare's JSON {}: {e}", json.display()))?;
    let _ = std::fs::remove_file(&json);
    let side = |k: &str| doc["durations"][k]["elapsed_s"].as_f64();
    let (Some(b), Some(c)) = (side("baseline"), side("compare")) else {
        return Err(format!(
            "the compare's JSON has no durations: {}",
            doc["durations"]
        ));
    };
    Ok((
        s.wall.as_secs_f64(),
        (b + c) / (2.0 * f64::from(args.runs.max(1))),
    ))
}

/// Runs the benchmark.
pub fn run(ptiscope: &Path, args: &LinuxNestedArgs) -> Result<Report, String> {
    let variants = variants(args);
    let mut walls: Vec<Vec<(f64, f64)>> = vec![Vec::new(); variants.len()];
    for round in 0..args.rounds.max(1) {
        // Rotate the order, so that no variant always runs first.
        for k in 0..variants.len() {
            let i = (round + k) % variants.len();
            walls[i].push(one(ptiscope, args, &variants[i].1)?);
        }
    }
    let med = |w: &[(f64, f64)], per_run: bool| {
        median(
            &w.iter()
                .map(|r| if per_run { r.1 } else { r.0 })
                .collect::<Vec<_>>(),
        )
    };
    let medians: Vec<(f64, f64)> = walls
        .iter()
        .map(|w| (med(w, false), med(w, true)))
        .collect();
    let (qemu, qemu_run) = medians[0];
    let mut text = format!(
        "compare --linux {} --workload getppid --runs {}, medians of {} each, rotated \
         (whole command; one Linux run, the target):\n",
        args.kernel,
        args.runs,
        args.rounds.max(1)
    );
    let mut rows = Vec::new();
    for ((name, backend), ((m, r), w)) in variants.iter().zip(medians.iter().zip(&walls)) {
        let (ratio, run_ratio) = (m / qemu, r / qemu_run);
        let verdict = if *name == "qemu" {
            String::new()
        } else {
            format!(
                "  ({ratio:.2}x; a run {run_ratio:.2}x qemu's: {} {TARGET_RATIO}x)",
                if run_ratio <= TARGET_RATIO {
                    "within"
                } else {
                    "NOT within"
                }
            )
        };
        text.push_str(&format!(
            "  {name:<14} {m:7.1} s; a run {r:6.2} s{verdict}\n"
        ));
        rows.push(json!({
            "variant": name,
            "args": backend,
            "wall_s": w.iter().map(|x| x.0).collect::<Vec<_>>(),
            "run_s": w.iter().map(|x| x.1).collect::<Vec<_>>(),
            "median_wall_s": m,
            "median_run_s": r,
            "ratio_to_qemu": ratio,
            "run_ratio_to_qemu": run_ratio,
            "within_target": run_ratio <= TARGET_RATIO,
        }));
    }
    Ok(Report {
        text,
        json: json!({
            "bench": "linux-nested",
            "kernel": args.kernel,
            "rounds": args.rounds.max(1),
            "runs": args.runs,
            "target_ratio": TARGET_RATIO,
            "variants": rows,
        }),
    })
}
