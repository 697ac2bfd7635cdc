//! `ptiscope run` reports under KVM: the `environment` block of `--json`,
//! and the `--metrics-format openmetrics` stream.

mod common;

use common::*;

#[test]
fn run_json_has_the_environment_block() {
    let Some(dir) = kvm_scratch_or_skip("run_json_environment", "run-environment") else {
        return;
    };
    let json = dir.join("run.json");
    let o = ptiscope()
        .args([
            "run",
            "--workload",
            "getpid",
            "--iterations",
            "50",
            "--pti",
            "on",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = read_json(&json);
    assert_eq!(v["schema"], "ptiscope.run/2");
    let env = &v["environment"];
    assert_eq!(env["backend"], kvm_backend_name());
    assert!(env["host"]["cpus"].as_u64().unwrap() >= 1, "{env}");
    assert!(env["host"]["vulnerabilities"].is_object(), "{env}");
    assert!(env["kvm"]["module"].as_str().is_some(), "{env}");
    // The probe ran (this host has KVM): it found at least one entry.
    assert!(
        !env["probe"]["entries_working"]
            .as_array()
            .unwrap()
            .is_empty(),
        "{env}"
    );
    assert!(env["probe"]["pcid_usable"].is_boolean(), "{env}");
    // And whether a guest CR3 write costs user code a TLB refill here.
    assert!(
        ["visible", "not_visible", "unmeasured"]
            .contains(&env["probe"]["cr3_write_refill"].as_str().unwrap_or("")),
        "{env}"
    );
    assert_eq!(
        env["guest_image"]["sha256"],
        ptiscope::report::environment::sha256_hex(ptiscope::GUEST_X86_64)
    );
    assert_eq!(
        env["guest_image"]["bytes"],
        ptiscope::GUEST_X86_64.len() as u64
    );
    let options = env["options"]["run"].as_array().unwrap();
    assert!(options.contains(&"pti=on".into()), "{env}");
    // Built from this checkout: the revision is a 40-hex-digit commit.
    match env["ptiscope"]["git_revision"].as_str() {
        Some(rev) => assert!(
            rev.len() == 40 && rev.bytes().all(|b| b.is_ascii_hexdigit()),
            "{rev}"
        ),
        None => ptiscope::test_support::skip(
            "run_json_environment: git_revision",
            "this build has no git revision (not built from a git checkout): its form was not checked",
        ),
    }
    // The time basis the backend's Profile recorded (a KVM's: never TCG's
    // outside --backend nested).
    let basis = env["time_basis"].as_str().unwrap_or_default();
    assert!(
        ["hardware", "kvm_pvm", "nested_tcg", "unknown"].contains(&basis),
        "{env}"
    );
    // KVM's exits by reason add up to its exits (`other_exits` is the rest
    // no per-reason stat names); the VMM's exits by kind hold the two phase
    // markers and the one exit-port write.
    let reasons = v["kvm_exits_by_reason"]
        .as_object()
        .expect("kvm_exits_by_reason");
    assert!(
        reasons.contains_key("io_exits") && reasons.contains_key("other_exits"),
        "{reasons:?}"
    );
    let kvm_exits = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "kvm_exits" && r["source"] == "kvm")
        .and_then(|r| r["total"].as_f64())
        .expect("kvm_exits");
    let summed: u64 = reasons.values().filter_map(|n| n.as_u64()).sum();
    assert!(
        summed as f64 >= kvm_exits,
        "{reasons:?} against {kvm_exits}"
    );
    let kinds = &v["vmm_exits_by_kind"];
    assert_eq!(kinds["io_out"]["phase"], 2, "{kinds}");
    assert_eq!(kinds["io_out"]["exit"], 1, "{kinds}");
    // The text report's header shows it too.
    assert!(stderr(&o).contains("  kvm:       "), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("KVM exits by reason [kvm]: "),
        "{}",
        stderr(&o)
    );
    // And it reads back.
    let s = ptiscope::report::RunSummary::from_json(v).unwrap();
    assert!(s.environment.is_some());
}

/// Every block is one exposition ending in `# EOF`; counters carry `_total`
/// and the vCPU label, have `# TYPE`/`# HELP`, never go down from block to
/// block, and the last block holds the run's final figures.
#[test]
fn openmetrics_stream() {
    let Some(dir) = kvm_scratch_or_skip("openmetrics_stream", "openmetrics") else {
        return;
    };
    let out = dir.join("metrics.txt");
    let o = ptiscope()
        .args(["run", "--workload", "getpid", "--iterations", "3000"])
        .args([
            "--metrics-interval",
            "20",
            "--metrics-format",
            "openmetrics",
        ])
        .arg("--metrics-out")
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.ends_with("# EOF\n"), "{text}");
    let blocks: Vec<&str> = text.split("# EOF\n").filter(|b| !b.is_empty()).collect();
    assert!(!blocks.is_empty());
    let value = |block: &str, sample: &str| -> Option<f64> {
        block.lines().find_map(|l| {
            let (name, v) = l.rsplit_once(' ')?;
            (name == sample).then(|| v.parse().unwrap())
        })
    };
    let exits = "ptiscope_kvm_exits_total{vcpu=\"0\"}";
    let mut last = 0.0;
    for b in &blocks {
        assert!(b.contains("# TYPE ptiscope_kvm_exits counter\n"), "{b}");
        assert!(b.contains("# HELP ptiscope_kvm_exits "), "{b}");
        for l in b.lines().filter(|l| !l.starts_with('#')) {
            let name = l.split([' ', '{']).next().unwrap();
            assert!(
                name.ends_with("_total") || name == "ptiscope_metrics_elapsed_seconds",
                "{l}"
            );
        }
        let v = value(b, exits).unwrap_or_else(|| panic!("no {exits} in {b}"));
        assert!(v >= last, "counters never go down: {v} < {last}");
        last = v;
    }
    // getpid: at least 3000 syscalls (plus the phase markers' own).
    let final_block = blocks.last().unwrap();
    let syscalls = value(final_block, "ptiscope_guest_syscalls_total").unwrap();
    assert!(syscalls >= 3000.0, "{final_block}");
    // Two exits per call (entry and return) exist only where every guest
    // kernel entry exits to KVM; a hardware KVM runs the calls without exits.
    if host_is_kvm_pvm(
        "openmetrics_stream: 2 KVM exits per call",
        "only kvm_pvm exits on every guest kernel entry and return",
    ) {
        assert!(value(final_block, exits).unwrap() >= 2.0 * 3000.0);
    }
}

#[test]
fn metrics_format_needs_metrics_interval() {
    let o = ptiscope()
        .args(["run", "--metrics-format", "openmetrics"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64));
    assert!(stderr(&o).contains("--metrics-interval"), "{}", stderr(&o));
}

/// `probe --json` and `pagetables --json` are reports too: they carry the block.
#[test]
fn probe_and_pagetables_json_have_the_environment_block() {
    if !kvm_or_skip("probe_pagetables_environment") {
        return;
    }
    let o = ptiscope().args(["probe", "--json"]).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        v["environment"]["host"]["cpus"].as_u64().unwrap() >= 1,
        "{v}"
    );
    assert!(v["environment"]["guest_image"]["sha256"].is_null());
    let json = scratch("pagetables-environment").join("pt.json");
    let o = ptiscope()
        .args(["pagetables", "--pti", "on", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = read_json(&json);
    let env = &v["environment"];
    assert_eq!(
        env["guest_image"]["sha256"],
        ptiscope::report::environment::sha256_hex(ptiscope::GUEST_X86_64)
    );
    assert!(
        env["options"]["pagetables"]
            .as_array()
            .unwrap()
            .contains(&"pti=on".into()),
        "{env}"
    );
}
