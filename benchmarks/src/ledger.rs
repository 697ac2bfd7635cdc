//! `ledger`: the wall time of `ptiscope ledger` (issue 39's "within 15
//! minutes on 2 cores"), beside what its boots cost one at a time. The
//! ledger (by default the default one: every fetched kernel, the default
//! CPU models and workloads) runs once; plain single boots of the same
//! kind (`ptiscope run --backend qemu --linux K --workload getppid
//! --by-symbol`, what each ledger boot is) run before and after it,
//! interleaved around it, so both see the same host. The ratio says what
//! running the boots `--jobs` at a time gains over one after another:
//! (boots x a plain boot's median wall) / the ledger's wall. The host's
//! load average at start and end is part of the result: on a shared
//! machine the absolute wall time is as good as the load allows.
use crate::measure::{self, median};
use crate::Report;
use clap::Args;
use serde_json::json;
use std::path::Path;
use std::process::Command;

#[derive(Args)]
pub struct LedgerArgs {
    /// Plain single boots before the ledger, and as many after it.
    #[arg(long, default_value_t = 1)]
    boots: usize,
    /// The kernel of the plain boots.
    #[arg(long, default_value = "debian-amd64")]
    linux: String,
    /// More arguments for `ptiscope ledger` (repeatable, e.g.
    /// `--ledger-arg=--linux --ledger-arg=debian-amd64`); default: none,
    /// the default ledger.
    #[arg(long = "ledger-arg", allow_hyphen_values = true)]
    ledger_args: Vec<String>,
    /// Keep the ledger's JSON here (e.g. to compare two runs' counts).
    #[arg(long)]
    ledger_json: Option<std::path::PathBuf>,
}

/// The bound on the default ledger, on 2 cores.
const TARGET_SECS: f64 = 900.0;

/// The 1-minute load average (`/proc/loadavg`), if readable.
fn load() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// One plain boot: wall seconds.
fn plain(ptiscope: &Path, linux: &str) -> Result<f64, String> {
    let mut cmd = Command::new(ptiscope);
    cmd.args([
        "run",
        "--backend",
        "qemu",
        "--linux",
        linux,
        "--workload",
        "getppid",
        "--iterations",
        "1000",
        "--by-symbol",
    ]);
    let s = measure::run(&mut cmd).map_err(|e| format!("running {}: {e}", ptiscope.display()))?;
    if s.code != Some(0) {
        return Err(format!(
            "ptiscope run --linux {linux} exited with {:?}",
            s.code
        ));
    }
    Ok(s.wall.as_secs_f64())
}

/// The boots a ledger JSON document records: per block its default and
/// all-off boots, a second default where `noise` is there, and one per
/// row that booted (measured, no change or failed).
fn boots(v: &serde_json::Value) -> usize {
    v["blocks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| {
            let rows = b["rows"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|r| {
                    matches!(
                        r["status"].as_str(),
                        Some("measured" | "no_change" | "failed")
                    )
                })
                .count();
            2 + usize::from(!b["noise"].is_null()) + rows
        })
        .sum::<usize>()
        + v["failed"].as_array().map_or(0, Vec::len)
}

/// Runs the benchmark.
pub fn run(ptiscope: &Path, args: &LedgerArgs) -> Result<Report, String> {
    let load_start = load();
    let mut plain_walls = Vec::new();
    for _ in 0..args.boots {
        plain_walls.push(plain(ptiscope, &args.linux)?);
    }
    let json_path =
        std::env::temp_dir().join(format!("ptiscope-bench-ledger-{}.json", std::process::id()));
    let mut cmd = Command::new(ptiscope);
    cmd.arg("ledger")
        .arg("--quiet")
        .arg("--json")
        .arg(&json_path)
        .args(&args.ledger_args);
    let s = measure::run(&mut cmd).map_err(|e| format!("running {}: {e}", ptiscope.display()))?;
    if let Some(keep) = &args.ledger_json {
        std::fs::copy(&json_path, keep)
            .map_err(|e| format!("keeping the ledger's JSON as {}: {e}", keep.display()))?;
    }
    let doc = measure::take_run_json(&json_path)?;
    if s.code != Some(0) {
        return Err(format!("ptiscope ledger exited with {:?}", s.code));
    }
    for _ in 0..args.boots {
        plain_walls.push(plain(ptiscope, &args.linux)?);
    }
    let load_end = load();
    let wall = s.wall.as_secs_f64();
    let cpu = s.cpu.as_secs_f64();
    let n = boots(&doc);
    let blocks = doc["blocks"].as_array().map_or(0, Vec::len);
    let one = median(&plain_walls);
    let serial = n as f64 * one;
    // The bound is the default ledger's: a subset (`--ledger-arg`) is not judged.
    let judged = args.ledger_args.is_empty();
    let met = judged && wall < TARGET_SECS;
    let la = |l: Option<f64>| l.map_or("?".to_string(), |l| format!("{l:.1}"));
    let text = format!(
        "ptiscope ledger {}: {blocks} blocks, {n} boots\n  \
         ledger       wall {wall:7.1} s  cpu {cpu:7.1} s\n  \
         plain boot   wall {one:7.1} s (median of {}, before and after)\n  \
         {n} plain boots one after another would take {serial:.0} s: ledger / serial {:.2}x\n  \
         load average {} at start, {} at end (a shared host: other work slows every boot)\n  \
         target: the default ledger under {TARGET_SECS:.0} s: {}",
        args.ledger_args.join(" "),
        plain_walls.len(),
        wall / serial,
        la(load_start),
        la(load_end),
        match (judged, met) {
            (false, _) => "not judged (not the default ledger)",
            (true, true) => "met",
            (true, false) => "NOT met",
        }
    );
    Ok(Report {
        text,
        json: json!({
            "bench": "ledger",
            "ledger_args": args.ledger_args,
            "blocks": blocks,
            "boots": n,
            "ledger_wall_s": wall,
            "ledger_cpu_s": cpu,
            "plain_boot_wall_s": plain_walls,
            "plain_boot_median_s": one,
            "ratio_ledger_to_serial": wall / serial,
            "load_start": load_start,
            "load_end": load_end,
            "target_s": TARGET_SECS,
            "target_met": judged.then_some(met),
        }),
    })
}
