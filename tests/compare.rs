//! `ptiscope compare` end to end under KVM: the table, the JSON schema round
//! trip, CSV, and `--fail-if` failing and passing as it should.

mod common;

use common::*;
use ptiscope::report::CompareTable;

fn compare(extra: &[&str], name: &str) -> (Option<i32>, String, String, std::path::PathBuf) {
    let dir = scratch(name);
    let json = dir.join("compare.json");
    let o = ptiscope()
        .args(["compare", "--runs", "2", "--iterations", "200", "--quiet"])
        .args(["--json", json.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap();
    (o.status.code(), stdout(&o), stderr(&o), json)
}

#[test]
fn compare_prints_the_table_and_writes_json_and_csv() {
    if !kvm_or_skip("compare_table") {
        return;
    }
    let csv = scratch("compare-csv").join("c.csv");
    let (code, out, err, json) = compare(
        &[
            "--csv",
            csv.to_str().unwrap(),
            "--fail-if",
            "cr3_writes_per_call.compare!=2,cr3_writes_per_call.baseline!=0",
            "--fail-if",
            "syscalls_per_call.max!=1",
        ],
        "compare-ok",
    );
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("baseline:  pti=off") && out.contains("compare:   pti=on"));
    let header = out
        .lines()
        .find(|l| l.trim_start().starts_with("pti=off"))
        .unwrap_or("");
    assert!(header.contains("pti=on"), "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("Amean     ns_per_call")),
        "{out}"
    );
    assert!(out.contains("CoeffVar"), "{out}");
    assert!(err.contains("does not hold"), "{err}");

    let text = std::fs::read_to_string(&json).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["schema"], "ptiscope.compare/1");
    // The mmtests duration table: CPU and wall seconds per side, positive.
    for side in ["baseline", "compare"] {
        let d = &v["durations"][side];
        assert!(d["elapsed_s"].as_f64().unwrap() > 0.0, "{d}");
        assert!(d["system_s"].as_f64().unwrap() + d["user_s"].as_f64().unwrap() > 0.0);
    }
    assert!(out.contains("Duration Elapsed"), "{out}");
    let t = CompareTable::from_json(v.clone()).expect("schema round trip");
    assert_eq!(t.baseline.label, "pti=off");
    let cr3 = t.metric("cr3_writes_per_call").expect("cr3 metric");
    assert_eq!(cr3.baseline.samples, vec![0.0, 0.0]);
    assert_eq!(cr3.compare.samples, vec![2.0, 2.0]);
    let ns = t.metric("ns_per_call").unwrap();
    assert_eq!(ns.metric.source, ptiscope::report::Source::HostClock);
    assert_eq!(ns.baseline.samples.len(), 2);
    // Reading and writing again gives the same document.
    assert_eq!(
        serde_json::to_string(&t.to_json()).unwrap(),
        serde_json::to_string(&CompareTable::from_json(t.to_json()).unwrap().to_json()).unwrap()
    );
    let csv = std::fs::read_to_string(&csv).unwrap();
    assert!(csv.starts_with("metric,unit,source,lower_is_better,stat,"));
    assert!(csv.contains("\ncr3_writes_per_call,count/call,guest,true,amean,0,2,"));
}

#[test]
fn fail_if_fails_when_a_condition_holds() {
    if !kvm_or_skip("compare_fail_if") {
        return;
    }
    let (code, out, err, _) = compare(
        &[
            "--fail-if",
            "cr3_writes_per_call==2",
            "--baseline",
            "pti=off,entry=auto",
        ],
        "compare-fail",
    );
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(
        err.contains("--fail-if cr3_writes_per_call.amean.compare==2 holds"),
        "{err}"
    );
    // A metric the runs do not have is a usage error, found after the first run.
    let (code, _, err, _) = compare(&["--fail-if", "no_such_metric>1"], "compare-unknown");
    assert_eq!(code, Some(64));
    assert!(err.contains("no metric \"no_such_metric\""), "{err}");
}

#[test]
fn bad_compare_usage_is_refused_before_any_run() {
    // No KVM needed: these fail before a VM is created.
    for (args, needle) in [
        (
            &["--fail-if", "cr3_writes_per_call=2"][..],
            "no comparison operator",
        ),
        (&["--baseline", "pti=maybe"][..], "possible values"),
        (&["--compare", "colour=blue"][..], "unknown key"),
        (&["--compare", "pti"][..], "not key=value"),
    ] {
        let o = ptiscope().arg("compare").args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(64), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn a_fail_if_on_a_metric_the_runs_do_not_have_stops_after_the_first_run() {
    if !common::kvm_or_skip("fail-if typo") {
        return;
    }
    let o = common::ptiscope()
        .args(["compare", "--runs", "5", "--iterations", "50", "--quiet"])
        .args(["--fail-if", "cr3_writs_per_call!=2"])
        .output()
        .unwrap();
    let err = common::stderr(&o);
    assert_eq!(o.status.code(), Some(64), "{err}");
    assert!(err.contains("no metric \"cr3_writs_per_call\""), "{err}");
    assert!(
        err.contains("cr3_writes_per_call"),
        "lists what exists: {err}"
    );
}
