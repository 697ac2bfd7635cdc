//! `--backend replay` (vmm/src/backend/replay.rs): the fourth backend, one
//! module and its registry line. Runs recorded on this host's KVM
//! (`run --record`) are replayed by `run` and `compare`: the same figures,
//! stop and exit code; a compare of two records gives their difference
//! with no spread; records given in the wrong order, none, or of the wrong
//! kind are refused with their exit codes; `--replay` under another
//! backend is refused naming the backend it needs.

mod common;

use common::{compare_metric, kvm_scratch_or_skip, ptiscope, read_json, run_getpid, stderr};
use std::path::Path;

/// Records a getpid run with `pti` on this host's KVM: its record and
/// its run document.
fn record(dir: &Path, pti: &str) -> (std::path::PathBuf, serde_json::Value) {
    let rec = dir.join(format!("{pti}.record.json"));
    let json = dir.join(format!("{pti}.run.json"));
    let o = run_getpid(pti, 2000)
        .arg("--record")
        .arg(&rec)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    (rec, read_json(&json))
}

/// The rows of a run document, by name: (total, per iteration, source).
fn rows(v: &serde_json::Value) -> Vec<(String, serde_json::Value, serde_json::Value, String)> {
    v["rows"]
        .as_array()
        .unwrap_or_else(|| panic!("no rows: {v}"))
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap_or_default().to_owned(),
                r["total"].clone(),
                r["per_iteration"].clone(),
                r["source"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[test]
fn a_replayed_run_reports_the_recorded_figures_stop_and_exit_code() {
    let test = "a_replayed_run_reports_the_recorded_figures_stop_and_exit_code";
    let Some(dir) = kvm_scratch_or_skip(test, "replay-run") else {
        return;
    };
    let (rec, original) = record(&dir, "on");
    let json = dir.join("replayed.json");
    let o = run_getpid("on", 2000)
        .args(["--backend", "replay", "--replay"])
        .arg(&rec)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let replayed = read_json(&json);
    assert_eq!(rows(&replayed), rows(&original));
    assert_eq!(replayed["stop"], original["stop"]);
    assert_eq!(replayed["exit_code"], original["exit_code"]);
    assert_eq!(replayed["environment"]["backend"], "replay");
    // What observed the recorded run (KVM's host-side observer), not what
    // observes here: nothing streams live metrics from a record.
    let caps = &replayed["environment"]["capabilities"];
    assert_eq!(caps["host_observer"], true, "{caps}");
    assert_eq!(caps["live_metrics"], false, "{caps}");
    assert_eq!(
        original["environment"]["capabilities"]["live_metrics"], true,
        "{original}"
    );
    // PTI's two CR3 writes per call, as recorded.
    let cr3 = rows(&replayed)
        .into_iter()
        .find(|r| r.0 == "cr3_writes")
        .unwrap_or_else(|| panic!("no cr3_writes row: {replayed}"));
    assert!(cr3.2.as_f64().is_some_and(|v| v > 1.9), "{cr3:?}");
}

#[test]
fn a_compare_of_two_records_gives_their_difference_and_refuses_them_swapped() {
    let test = "a_compare_of_two_records_gives_their_difference_and_refuses_them_swapped";
    let Some(dir) = kvm_scratch_or_skip(test, "replay-compare") else {
        return;
    };
    let (off, _) = record(&dir, "off");
    let (on, _) = record(&dir, "on");
    let compare = |first: &Path, second: &Path, json: &Path| {
        ptiscope()
            .args(["compare", "--backend", "replay", "--replay"])
            .arg(first)
            .arg("--replay")
            .arg(second)
            .args([
                "--workload",
                "getpid",
                "--iterations",
                "2000",
                "--runs",
                "3",
            ])
            .args(["--quiet", "--json"])
            .arg(json)
            .output()
            .unwrap()
    };
    let json = dir.join("compare.json");
    let o = compare(&off, &on, &json);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = read_json(&json);
    let cr3 = compare_metric(&v, "cr3_writes_per_call");
    let (base, comp) = common::ameans(cr3);
    assert_eq!(base, 0.0, "{cr3}");
    assert!(comp > 1.9, "{cr3}");
    // Three runs of one record each: no spread at all.
    assert_eq!(cr3["compare"]["stddev"].as_f64(), Some(0.0), "{cr3}");
    assert_eq!(v["environment"]["backend"], "replay");

    // Swapped, the baseline's pti=off meets the record's pti=on.
    let o = compare(&on, &off, &dir.join("swapped.json"));
    assert_eq!(o.status.code(), Some(65), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the run asks pti=off, the record ran pti=on"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn replay_without_records_with_a_bad_record_or_under_another_backend_is_refused() {
    let dir = common::Scratch::new("replay-refusals");
    let o = run_getpid("on", 10)
        .args(["--backend", "replay"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
    assert!(stderr(&o).contains("give --replay FILE"), "{}", stderr(&o));

    let o = run_getpid("on", 10)
        .args(["--backend", "replay", "--replay", "/nonexistent/r.json"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(66), "{}", stderr(&o));

    // A FIFO with no writer would block a plain read forever.
    let fifo = dir.join("record.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let o = run_getpid("on", 10)
        .args(["--backend", "replay", "--replay"])
        .arg(&fifo)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
    assert!(stderr(&o).contains("is a FIFO"), "{}", stderr(&o));

    let not_a_record = dir.join("run.json");
    std::fs::write(&not_a_record, "{\"schema\": \"ptiscope.run/2\"}").unwrap();
    let o = run_getpid("on", 10)
        .args(["--backend", "replay", "--replay"])
        .arg(&not_a_record)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(65), "{}", stderr(&o));
    assert!(stderr(&o).contains("ptiscope.record/1"), "{}", stderr(&o));

    // A backend's own option is refused under the others, naming it.
    let o = run_getpid("on", 10)
        .args(["--backend", "kvm", "--replay"])
        .arg(&not_a_record)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--replay needs --backend replay"),
        "{}",
        stderr(&o)
    );
}
