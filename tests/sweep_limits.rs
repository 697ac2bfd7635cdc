//! A sweep grid that could not finish is refused before any work, naming
//! the limit; repeated `--touches` run once; an empty `--config` is refused;
//! SIGINT stops a running sweep within a second or so, and what it has is
//! printed and written, marked partial, while an earlier `--json` survives a
//! sweep that is stopped before it has anything.

mod common;

use std::time::{Duration, Instant};

use common::*;

fn grid(n: usize, f: impl Fn(usize) -> String) -> String {
    (0..n).map(f).collect::<Vec<_>>().join(",")
}

#[test]
fn a_grid_over_the_cell_limit_is_refused_at_once() {
    let (wss1000, wss100) = (
        grid(1000, |i| ((i + 1) * 4096).to_string()),
        grid(100, |i| ((i + 1) * 4096).to_string()),
    );
    let touches = grid(1000, |i| (i + 1).to_string());
    let runs = ["--runs", "100", "--iterations", "1"];
    for (grid, wants) in [
        (
            vec!["--wss", wss1000.as_str(), "--touches", touches.as_str()],
            ["1000000 cells", "at most 1024 cells (the sweep cell limit)"],
        ),
        // The run limit: within the cell limit, but too many runs.
        (
            vec![
                "--wss",
                wss100.as_str(),
                "--touches",
                "1,2,3,4,5,6,7,8,9,10",
            ]
            .into_iter()
            .chain(["--config", "pti=off", "--config", "pti=on"])
            .collect(),
            ["200000 runs", "the sweep run limit"],
        ),
    ] {
        let start = Instant::now();
        assert_refused(&[&["sweep"][..], &grid, &runs].concat(), 64, &wants);
        let took = start.elapsed();
        assert!(took < Duration::from_secs(10), "{took:?}");
    }
}

#[test]
fn an_empty_config_is_refused() {
    assert_refused(
        &["sweep", "--config", "", "--config", "pti=on"],
        64,
        &["--config '': an empty configuration"],
    );
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
    let v = read_json(&json);
    assert_eq!(v["cells"].as_array().unwrap().len(), 1, "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigint_stops_a_sweep_soon_and_keeps_what_it_has() {
    let test = "sigint_stops_a_sweep_soon_and_keeps_what_it_has";
    let Some(dir) = kvm_scratch_or_skip(test, "sweep-sigint") else {
        return;
    };
    let json = dir.join("s.json");
    let csv = dir.join("s.csv");
    std::fs::write(&json, "earlier result\n").unwrap();
    // Many short runs: the first cells finish within a few seconds.
    let child = spawn_writing(
        ptiscope()
            .args(["sweep", "--wss", "0,64K,128K,256K", "--touches", "1x"])
            .args(["--config", "pti=off", "--config", "pti=on"])
            .args(["--runs", "100", "--iterations", "20", "--quiet"]),
        &json,
        &csv,
    );
    // Until the previous result would be overwritten, it must still be there.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(std::fs::read_to_string(&json).unwrap(), "earlier result\n");
    let (text, err) = interrupt(child);
    assert!(err.contains("interrupted by SIGINT"), "{err}");
    assert!(text.contains("PARTIAL: interrupted by SIGINT"), "{text}");
    let v = read_json(&json);
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
}
