//! `--backend nested --nested-paging shadow`: kvm_amd with `npt=0` inside
//! QEMU TCG intercepts every guest CR3 write, so KVM's `tlb_flush` counts
//! them. ptiscope's guest counts its own: the two must agree exactly. For a
//! Linux guest KVM's count is then the only host-side CR3 count on the VMM
//! (`[kvm] cr3_writes`), checked against the kernel log's PTI state.
//!
//! Where the outer QEMU's SVM breaks shadow paging (measured with QEMU
//! 10.0.2), the option is refused with the version and the Linux default
//! falls back to nested paging: that refusal is what is checked there.
//! Skipped, with the reason, without a fetched kernel with its KVM modules
//! or without QEMU.

mod common;

use common::*;
use serde_json::{json, Value};

fn nested_or_skip(test: &str) -> bool {
    if let Err(e) = ptiscope::nested::boot::find_kernel() {
        ptiscope::test_support::skip(test, &e.to_string());
        return false;
    }
    qemu_or_skip(test, "qemu-system-x86_64")
}

const CALLS: u64 = 2000;

fn job(name: &str, argv: &[&str]) -> Value {
    let mut argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    argv.push(format!("--json=/tmp/out/{name}.json"));
    json!({"argv": argv, "collect": [format!("/tmp/out/{name}.json")], "timeout_secs": 150.0})
}

fn summary(job: &Value, what: &str) -> Value {
    assert_eq!(
        job["status"].as_i64(),
        Some(0),
        "{what}: {}",
        job["stderr"].as_str().unwrap_or("")
    );
    let text = job["files"][0][1]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: no JSON came back: {job}"));
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: {e}: {text}"))
}

/// (total, per call) of the row `name` from `source`.
fn row(s: &Value, name: &str, source: &str) -> (f64, f64) {
    let r = s["rows"]
        .as_array()
        .and_then(|rows| {
            rows.iter()
                .find(|r| r["name"] == name && r["source"] == source)
        })
        .unwrap_or_else(|| panic!("no [{source}] {name} row: {}", s["rows"]));
    (
        r["total"].as_f64().unwrap(),
        r["per_iteration"].as_f64().unwrap(),
    )
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn kvm_counts_the_guests_cr3_writes_under_shadow_paging_and_a_linux_compare_is_guarded_on_them() {
    let test = "nested shadow paging";
    if !nested_or_skip(test) {
        return;
    }
    if let Err(why) = ptiscope::nested::boot::shadow_paging_works() {
        // Refused before anything boots, naming the QEMU and what to use.
        let o = ptiscope()
            .args(["run", "--backend", "nested", "--nested-paging", "shadow"])
            .output()
            .unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(69), "{err}");
        assert!(
            err.contains("--nested-paging npt") && err.contains("QEMU"),
            "{err}"
        );
        ptiscope::test_support::skip(test, &format!("only the refusal is checked here: {why}"));
        return;
    }
    let s = Scratch::new("nested-shadow");
    let n = CALLS.to_string();
    let linux = |pti: &str| {
        [
            "run",
            "--linux",
            "debian-amd64",
            "--workload",
            "getppid",
            "--iterations",
            &n,
            "--timeout",
            "90",
            "--pti",
            pti,
        ]
        .map(str::to_string)
    };
    let linux_on = linux("on");
    // The Linux compare a CI runs (.github/workflows/ci.yml on hardware
    // KVM reloaded with ept=0/npt=0), guarded on KVM's CR3 count.
    let compare = [
        "compare",
        "--linux",
        "debian-amd64",
        "--workload",
        "getppid",
        "--iterations",
        &n,
        "--runs",
        "1",
        "--timeout",
        "90",
        "--fail-if",
        "cr3_writes_per_call.compare<1.9",
        "--fail-if",
        "cr3_writes_per_call.baseline>0.1",
    ];
    let jobs = vec![
        job(
            "on",
            &[
                "run",
                "--pti",
                "on",
                "--workload",
                "getpid",
                "--iterations",
                &n,
            ],
        ),
        job("linux-on", &as_strs(&linux_on)),
        job("compare", &compare),
    ];
    let req = s.join("request.json");
    std::fs::write(
        &req,
        json!({ "kvm_paging": "shadow", "jobs": jobs }).to_string(),
    )
    .unwrap();
    let o = ptiscope()
        .args(["nested-batch", "--cpus", "1"])
        .arg(&req)
        .output()
        .unwrap();
    let err = stderr(&o);
    if o.status.code() == Some(69) && err.contains("could not set up KVM") {
        ptiscope::test_support::skip(test, &format!("this QEMU gives no usable SVM: {err}"));
        return;
    }
    assert_eq!(o.status.code(), Some(0), "{err}");
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let setup = r["setup"].to_string();
    assert!(setup.contains("kvm-amd.ko npt=0"), "{setup}");
    let j = r["jobs"].as_array().expect("jobs");

    // ptiscope's guest: KVM's flushes are exactly its CR3 writes, 2 a call.
    let on = summary(&j[0], "ptiscope's guest, pti=on");
    let kvm_env = &on["environment"]["kvm"];
    assert!(
        kvm_env["paging"] == "shadow" && kvm_env["sees_cr3_writes"] == true,
        "{kvm_env}"
    );
    let (kvm, _) = row(&on, "tlb_flush", "kvm");
    let (guest, per_call) = row(&on, "cr3_writes", "guest");
    assert_eq!(kvm, guest, "KVM's tlb_flush vs the guest's CR3 writes");
    assert!((per_call - 2.0).abs() < 0.01, "{per_call}");
    let checks = on["cross_checks"].as_array().unwrap();
    assert!(
        checks.iter().any(|c| c["what"]
            .as_str()
            .is_some_and(|w| w.contains("shadow paging"))
            && c["agrees"] == true),
        "{checks:?}"
    );

    // Linux: KVM's count is the [kvm] cr3_writes row, 0 without PTI and
    // about 2 a call with it (a timer interrupt from user mode adds two),
    // and the PTI check names it.
    let on = summary(&j[1], "Linux pti=on");
    let (_, per_call) = row(&on, "cr3_writes", "kvm");
    assert!((2.0..2.5).contains(&per_call), "{per_call}");
    let notes = on["notes"].to_string();
    assert!(
        notes.contains("PTI enabled") && notes.contains("kvm tlb_flush, shadow paging) agrees"),
        "{notes}"
    );
    // The compare: both guards held (exit 0), and its JSON has KVM's
    // count on both sides: none without PTI.
    let c = summary(&j[2], "Linux compare");
    let m = c["metrics"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["name"] == "cr3_writes_per_call"))
        .unwrap_or_else(|| panic!("no cr3_writes_per_call: {}", c["metrics"]));
    assert_eq!(m["source"], "kvm", "{m}");
    assert_eq!(m["baseline"]["amean"].as_f64(), Some(0.0), "{m}");
    assert!(
        m["compare"]["amean"]
            .as_f64()
            .is_some_and(|v| (2.0..2.5).contains(&v)),
        "{m}"
    );
}
