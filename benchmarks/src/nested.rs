//! `nested`: what `--backend nested` costs. The default comparison
//! (`ptiscope compare`, pti=off vs pti=on, getpid) with `--backend nested`
//! (ptiscope's VMM on kvm_amd inside QEMU TCG, its boot included) beside
//! the same comparison with `--backend qemu` (the guest straight under QEMU
//! TCG), runs interleaved (A B, B A, ...). Wall time is what a user waits;
//! CPU time (ptiscope and the QEMU it reaps) is the work done. Target: the
//! nested comparison's median wall time under 60 s.
use crate::measure::{self, median};
use crate::Report;
use clap::Args;
use serde_json::json;
use std::path::Path;
use std::process::Command;

#[derive(Args)]
pub struct NestedArgs {
    /// Comparisons per backend.
    #[arg(long, default_value_t = 2)]
    runs: usize,
    /// `--arch` of the comparisons (x86_64 or i386).
    #[arg(long, default_value = "x86_64")]
    arch: String,
}

/// The target: a default nested comparison, boot included, in under this.
const TARGET_SECS: f64 = 60.0;

/// One comparison on `backend`: (wall seconds, CPU seconds).
fn one(ptiscope: &Path, args: &NestedArgs, backend: &str) -> Result<(f64, f64), String> {
    let mut cmd = Command::new(ptiscope);
    cmd.args([
        "compare",
        "--quiet",
        "--backend",
        backend,
        "--arch",
        &args.arch,
    ]);
    let s = measure::run(&mut cmd).map_err(|e| format!("running {}: {e}", ptiscope.display()))?;
    if s.code != Some(0) {
        return Err(format!(
            "ptiscope compare --backend {backend} exited with {:?}",
            s.code
        ));
    }
    Ok((s.wall.as_secs_f64(), s.cpu.as_secs_f64()))
}

/// Runs the benchmark.
pub fn run(ptiscope: &Path, args: &NestedArgs) -> Result<Report, String> {
    let (mut nested, mut qemu) = (Vec::new(), Vec::new());
    for i in 0..args.runs.max(1) {
        let order = if i % 2 == 0 {
            ["nested", "qemu"]
        } else {
            ["qemu", "nested"]
        };
        for b in order {
            let r = one(ptiscope, args, b)?;
            if b == "nested" {
                nested.push(r)
            } else {
                qemu.push(r)
            }
        }
    }
    let med = |v: &[(f64, f64)], cpu: bool| {
        median(
            &v.iter()
                .map(|r| if cpu { r.1 } else { r.0 })
                .collect::<Vec<_>>(),
        )
    };
    let (nw, nc, qw, qc) = (
        med(&nested, false),
        med(&nested, true),
        med(&qemu, false),
        med(&qemu, true),
    );
    let met = nw < TARGET_SECS;
    let text = format!(
        "compare (defaults, --arch {}), median of {} each, interleaved:\n  \
         --backend nested  wall {nw:6.1} s  cpu {nc:6.1} s   (boot of the inner Linux included)\n  \
         --backend qemu    wall {qw:6.1} s  cpu {qc:6.1} s\n  \
         nested / qemu wall: {:.2}x; target: nested under {TARGET_SECS:.0} s: {}",
        args.arch,
        args.runs.max(1),
        nw / qw,
        if met { "met" } else { "NOT met" }
    );
    Ok(Report {
        text,
        json: json!({
            "bench": "nested",
            "arch": args.arch,
            "runs": args.runs.max(1),
            "nested": {"wall_s": nested.iter().map(|r| r.0).collect::<Vec<_>>(), "cpu_s": nested.iter().map(|r| r.1).collect::<Vec<_>>(), "median_wall_s": nw},
            "qemu": {"wall_s": qemu.iter().map(|r| r.0).collect::<Vec<_>>(), "cpu_s": qemu.iter().map(|r| r.1).collect::<Vec<_>>(), "median_wall_s": qw},
            "ratio_wall": nw / qw,
            "target_s": TARGET_SECS,
            "target_met": met,
        }),
    })
}
