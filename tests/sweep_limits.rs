//! A sweep grid that could not finish is refused before any work, naming
//! the limit; repeated `--touches` run once; an empty `--config` is refused;
//! SIGINT stops a running sweep within a second or so, and what it has is
//! printed and written, marked partial, while an earlier `--json` survives a
//! sweep that is stopped before it has anything.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

fn grid(n: usize, f: impl Fn(usize) -> String) -> String {
    (0..n).map(f).collect::<Vec<_>>().join(",")
}

#[test]
fn a_grid_over_the_cell_limit_is_refused_at_once() {
    let wss = grid(1000, |i| ((i + 1) * 4096).to_string());
    let touches = grid(1000, |i| (i + 1).to_string());
    let start = Instant::now();
    let out = ptiscope()
        .args(["sweep", "--wss", &wss, "--touches", &touches])
        .args(["--runs", "100", "--iterations", "1"])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.contains("1000000 cells") && err.contains("at most 1024 cells (the sweep cell limit)"),
        "{err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    // The run limit: within the cell limit, but too many runs.
    let wss = grid(100, |i| ((i + 1) * 4096).to_string());
    let out = ptiscope()
        .args(["sweep", "--wss", &wss, "--touches", "1,2,3,4,5,6,7,8,9,10"])
        .args(["--config", "pti=off", "--config", "pti=on"])
        .args(["--runs", "100", "--iterations", "1"])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.contains("200000 runs") && err.contains("the sweep run limit"),
        "{err}"
    );
}

#[test]
fn an_empty_config_is_refused() {
    let out = ptiscope()
        .args(["sweep", "--config", "", "--config", "pti=on"])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("--config '': an empty configuration"), "{err}");
}

#[test]
fn repeated_touches_run_once() {
    if !kvm_or_skip("repeated_touches_run_once") {
        return;
    }
    let dir = scratch("sweep-dedup");
    let json = dir.join("s.json");
    let out = ptiscope()
        .args(["sweep", "--wss", "64K,64K", "--touches", "1x,1x"])
        .args(["--config", "pti=off", "--config", "pti=on"])
        .args(["--runs", "1", "--iterations", "50", "--quiet", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["cells"].as_array().unwrap().len(), 1, "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigint_stops_a_sweep_soon_and_keeps_what_it_has() {
    if !kvm_or_skip("sigint_stops_a_sweep_soon_and_keeps_what_it_has") {
        return;
    }
    let dir = scratch("sweep-sigint");
    let json = dir.join("s.json");
    let csv = dir.join("s.csv");
    std::fs::write(&json, "earlier result\n").unwrap();
    // Many short runs: the first cells finish within a few seconds.
    let child = ptiscope()
        .args(["sweep", "--wss", "0,64K,128K,256K", "--touches", "1x"])
        .args(["--config", "pti=off", "--config", "pti=on"])
        .args(["--runs", "100", "--iterations", "20", "--quiet"])
        .arg("--json")
        .arg(&json)
        .arg("--csv")
        .arg(&csv)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Until the previous result would be overwritten, it must still be there.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(std::fs::read_to_string(&json).unwrap(), "earlier result\n");
    let (text, err) = interrupt(child);
    assert!(err.contains("interrupted by SIGINT"), "{err}");
    assert!(text.contains("PARTIAL: interrupted by SIGINT"), "{text}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["schema"], "ptiscope.sweep/1");
    let p = &v["partial"];
    assert!(p["reason"].as_str().unwrap().contains("SIGINT"), "{p}");
    let done = p["runs_done"].as_u64().unwrap();
    assert!(
        done > 0 && done < p["runs_planned"].as_u64().unwrap(),
        "{p}"
    );
    assert_eq!(
        p["cells_reported"].as_u64().unwrap(),
        v["cells"].as_array().unwrap().len() as u64
    );
    let csv_text = std::fs::read_to_string(&csv).unwrap();
    assert!(csv_text.starts_with("# PARTIAL: "), "{csv_text}");
    // No temporary file is left beside the outputs.
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "s.json" && n != "s.csv")
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
