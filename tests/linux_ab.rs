//! A kernel engineer's A/B under QEMU TCG: compare sides that differ in
//! more than `pti=` — the kernel (`linux=`), its command line (`append=`)
//! — with the header saying exactly what differs.

mod common;

use std::path::PathBuf;

use common::*;

/// Both Debian kernels, or `None` after printing why the test skips.
fn kernels_or_skip(test: &str) -> Option<(PathBuf, PathBuf)> {
    if !plugin_or_skip(test, "qemu-system-x86_64") || !plugin_or_skip(test, "qemu-system-i386") {
        return None;
    }
    let known = |name: &str| match ptiscope::preflight::linux::known_path(name) {
        Some(Ok(p)) if p.is_file() => Some(p),
        _ => {
            ptiscope::test_support::skip(
                test,
                &format!("{name} is not fetched: run `ptiscope linux fetch` (apt-get download)"),
            );
            None
        }
    };
    Some((known("debian-amd64")?, known("debian-686-pae")?))
}

fn compare(args: &[&str], json: &std::path::Path) -> (bool, String, serde_json::Value) {
    let o = ptiscope()
        .args(["compare", "--backend", "qemu"])
        .args([
            "--workload",
            "getppid",
            "--iterations",
            "300",
            "--timeout",
            "120",
        ])
        .args(args)
        .arg("--json")
        .arg(json)
        .output()
        .expect("run ptiscope");
    let text = stdout(&o) + &stderr(&o);
    let v = if o.status.success() {
        read_json(json)
    } else {
        serde_json::Value::Null
    };
    (o.status.success(), text, v)
}

/// A metric's per-run samples on one side.
fn samples(v: &serde_json::Value, metric: &str, side: &str) -> Vec<f64> {
    v["metrics"]
        .as_array()
        .and_then(|a| a.iter().find(|m| m["name"] == metric))
        .and_then(|m| m[side]["samples"].as_array())
        .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
        .unwrap_or_else(|| panic!("no {metric} samples for {side} in {v}"))
}

/// The metric's value, the same in every run of the side.
fn identical(v: &serde_json::Value, metric: &str, side: &str) -> f64 {
    let s = samples(v, metric, side);
    assert!(
        s.len() >= 2 && s.iter().all(|x| *x == s[0]),
        "{metric} {side} not identical in every run: {s:?}"
    );
    s[0]
}

fn amean(v: &serde_json::Value, metric: &str, side: &str) -> f64 {
    v["metrics"]
        .as_array()
        .and_then(|a| a.iter().find(|m| m["name"] == metric))
        .and_then(|m| m[side]["amean"].as_f64())
        .unwrap_or_else(|| panic!("no {metric} for {side} in {v}"))
}

/// The A/B's three shapes are three tests, which run side by side.
#[test]
fn a_kernel_against_itself_differs_in_nothing_and_its_counts_are_identical() {
    let test = "a_kernel_against_itself_differs_in_nothing_and_its_counts_are_identical";
    let Some(_) = kernels_or_skip(test) else {
        return;
    };
    let dir = scratch("linux-ab-self");
    // A kernel against itself: nothing differs, and the calls' own counts
    // are identical in every run, so their differences are exactly zero.
    let (ok, text, v) = compare(
        &[
            "--runs",
            "2",
            "--baseline",
            "linux=debian-amd64",
            "--compare",
            "linux=debian-amd64",
        ],
        &dir.join("self.json"),
    );
    assert!(ok, "{text}");
    // Nothing differs: in the document (no `sides_differ`) and in the header.
    assert!(
        v["environment"]["options"]["sides_differ"].is_null(),
        "{}",
        v["environment"]["options"]
    );
    assert!(!text.contains("differs:"), "{text}");
    // One kernel, one CPU model: one mitigation state, shown once.
    assert!(text.contains("    both:     PTI off"), "{text}");
    assert_eq!(
        v["guest_mitigations"]["baseline"], v["guest_mitigations"]["compare"],
        "{}",
        v["guest_mitigations"]
    );
    for metric in [
        "kernel_instructions_per_call",
        "user_instructions_per_call",
        "insn_mov_cr3_calls_per_call",
    ] {
        assert_eq!(
            identical(&v, metric, "baseline"),
            identical(&v, metric, "compare"),
            "{metric}: {text}"
        );
    }

    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_command_line_difference_is_named_and_its_pti_increment_is_exact() {
    let test = "a_command_line_difference_is_named_and_its_pti_increment_is_exact";
    let Some(_) = kernels_or_skip(test) else {
        return;
    };
    let dir = scratch("linux-ab-append");
    // One kernel, its command line differing by Linux's own `pti=on`:
    // the PTI increment per call is identical in every run.
    let (ok, text, v) = compare(
        &[
            "--runs",
            "2",
            "--baseline",
            "linux=debian-amd64",
            "--compare",
            "linux=debian-amd64,append=pti=on",
        ],
        &dir.join("append.json"),
    );
    assert_eq!(
        identical(&v, "insn_mov_cr3_calls_per_call", "baseline"),
        0.0
    );
    assert_eq!(identical(&v, "insn_mov_cr3_calls_per_call", "compare"), 2.0);
    assert!(
        identical(&v, "kernel_instructions_per_call", "compare")
            > identical(&v, "kernel_instructions_per_call", "baseline"),
        "{text}"
    );
    assert!(ok, "{text}");
    assert!(
        text.contains("differs:   command line: compare only: pti=on"),
        "{text}"
    );
    assert!(!text.contains("differs:   guest image"), "{text}");
    assert_eq!(
        amean(&v, "insn_mov_cr3_per_call", "baseline"),
        0.0,
        "{text}"
    );
    let on = amean(&v, "insn_mov_cr3_per_call", "compare");
    assert!(
        (1.99..2.1).contains(&on),
        "about 2 CR3 writes per call with pti=on: {on}\n{text}"
    );
    // Only the command line differs, the image does not; and with it PTI's
    // state as each kernel's log says (under `-cpu max` the meltdown file
    // says "Not affected" either way).
    assert_eq!(
        v["environment"]["options"]["sides_differ"],
        serde_json::json!([
            "command line: compare only: pti=on",
            "PTI (kernel log): off vs on"
        ]),
        "{text}"
    );

    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn two_kernels_are_named_as_such_with_their_entries() {
    let test = "two_kernels_are_named_as_such_with_their_entries";
    let Some(_) = kernels_or_skip(test) else {
        return;
    };
    let dir = scratch("linux-ab-kernels");
    // Two kernels: 64-bit SYSCALL against 32-bit PAE SYSENTER.
    let (ok, text, v) = compare(
        &[
            "--runs",
            "1",
            "--baseline",
            "linux=debian-amd64",
            "--compare",
            "linux=debian-686-pae",
        ],
        &dir.join("kernels.json"),
    );
    assert!(ok, "{text}");
    assert!(text.contains("two kernels on this host"), "{text}");
    assert!(
        text.contains("differs:   guest image:") && text.contains("686-pae"),
        "{text}"
    );
    let differ = v["environment"]["options"]["sides_differ"]
        .as_array()
        .unwrap_or_else(|| panic!("no sides_differ: {}", v["environment"]));
    assert!(
        differ.iter().any(|d| d
            .as_str()
            .is_some_and(|d| d.starts_with("guest image:") && d.contains("686-pae"))),
        "{differ:?}"
    );
    assert_eq!(
        amean(&v, "insn_syscall_per_call", "baseline"),
        1.0,
        "{text}"
    );
    assert_eq!(
        amean(&v, "insn_sysenter_per_call", "compare"),
        1.0,
        "{text}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Each side's kernel says which mitigations it runs: under `-cpu max`
/// Linux finds itself not affected by Meltdown (PTI off), under
/// Skylake-Client-v1 it turns on PTI by itself; the header, `differs:` and
/// the JSON say so per side.
#[test]
fn each_sides_kernel_mitigations_are_reported_and_meltdown_differs() {
    let test = "each_sides_kernel_mitigations_are_reported_and_meltdown_differs";
    if !plugin_or_skip(test, "qemu-system-x86_64") {
        return;
    }
    if !matches!(ptiscope::preflight::linux::known_path("debian-amd64"), Some(Ok(p)) if p.is_file())
    {
        ptiscope::test_support::skip(
            test,
            "debian-amd64 is not fetched: run `ptiscope linux fetch`",
        );
        return;
    }
    let dir = scratch("linux-ab-mitigations");
    let (ok, text, v) = compare(
        &[
            "--runs",
            "1",
            "--baseline",
            "linux=debian-amd64",
            "--compare",
            "linux=debian-amd64,cpu=Skylake-Client-v1",
        ],
        &dir.join("mitigations.json"),
    );
    assert!(ok, "{text}");
    let m = &v["guest_mitigations"];
    let meltdown = |side: &str| &m[side]["vulnerabilities"]["meltdown"];
    assert_eq!(meltdown("baseline")["state"], "Not affected", "{m}");
    assert_eq!(meltdown("baseline")["class"], "not_affected", "{m}");
    assert_eq!(meltdown("compare")["state"], "Mitigation: PTI", "{m}");
    assert_eq!(meltdown("compare")["class"], "mitigated", "{m}");
    assert_eq!(meltdown("compare")["mitigation"], "PTI", "{m}");
    // Neither side set pti=: each says which PTI state its kernel chose.
    for (side, pti) in [("baseline", "off"), ("compare", "on")] {
        assert_eq!(m[side]["pti"], pti, "{side}: {m}");
        assert_eq!(m[side]["asked_pti"], "auto", "{side}: {m}");
    }
    assert!(
        text.contains("baseline: PTI off (pti= not set: the kernel's choice)")
            && text.contains("compare:  PTI on (pti= not set: the kernel's choice)"),
        "{text}"
    );
    // MDS: affected on Skylake (its buffer clearing), not under max.
    assert_eq!(
        m["baseline"]["vulnerabilities"]["mds"]["class"], "not_affected",
        "{m}"
    );
    assert_ne!(
        m["compare"]["vulnerabilities"]["mds"]["class"], "not_affected",
        "{m}"
    );
    let line = "meltdown: Not affected vs Mitigation: PTI";
    assert!(text.contains(&format!("differs:   {line}")), "{text}");
    let has = |a: &serde_json::Value| a.as_array().is_some_and(|a| a.iter().any(|d| d == line));
    assert!(has(&m["differences"]), "{m}");
    assert!(
        has(&v["environment"]["options"]["sides_differ"]),
        "{}",
        v["environment"]["options"]
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A side's `append=` needs a Linux side; `cpu=` needs QEMU: refused
/// before anything boots, with 64 and the reason.
#[test]
fn side_options_that_cannot_apply_are_refused_before_boot() {
    for (args, why) in [
        (
            &["--backend", "qemu", "--compare", "append=nosmt"][..],
            "Linux kernel command line",
        ),
        (
            &["--compare", "pti=on,cpu=Skylake-Client"],
            "needs --backend qemu",
        ),
    ] {
        let o = ptiscope()
            .arg("compare")
            .args(args)
            .output()
            .expect("run ptiscope");
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(64), "{args:?}: {err}");
        assert!(err.contains(why), "{args:?}: {err}");
    }
}
