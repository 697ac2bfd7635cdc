//! `ptiscope ledger`: what each mitigation a Linux kernel enabled costs per
//! system call, exactly (QEMU TCG and ptiscope's plugin). The smallest real
//! case: Debian's 6.1 amd64 on QEMU's Skylake-Client-v1, getppid, the PTI
//! and VERW rows only (four boots, two at a time).

mod common;

use common::*;

/// Whether the QEMU plugin and the Debian kernel `name` are here (else
/// prints why the test skips).
fn kernel_or_skip(test: &str, name: &str) -> bool {
    if !plugin_or_skip(test, "qemu-system-x86_64") {
        return false;
    }
    match ptiscope::preflight::linux::known_path(name) {
        Some(Ok(p)) if p.is_file() => true,
        _ => {
            ptiscope::test_support::skip(
                test,
                &format!("{name} is not fetched: run `ptiscope linux fetch` (apt-get download)"),
            );
            false
        }
    }
}

/// Runs the ledger with `args`; its exit code, text and JSON.
fn ledger(args: &[&str], json: &std::path::Path) -> (i32, String, serde_json::Value) {
    let o = ptiscope()
        .arg("ledger")
        .args(args)
        .arg("--json")
        .arg(json)
        .output()
        .expect("run ptiscope");
    let text = stdout(&o) + &stderr(&o);
    (o.status.code().unwrap_or(-1), text, json_or_null(json))
}

fn row<'a>(block: &'a serde_json::Value, key: &str) -> &'a serde_json::Value {
    block["rows"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["key"] == key))
        .unwrap_or_else(|| panic!("no row {key} in {block}"))
}

/// Per-call special instruction `col` of a measure.
fn special(m: &serde_json::Value, col: &str) -> f64 {
    m["specials"][col].as_f64().unwrap_or(0.0) / m["calls"].as_f64().expect("calls")
}

#[test]
fn unknown_cpu_models_and_rows_are_refused_before_any_boot() {
    if !qemu_or_skip(
        "unknown_cpu_models_and_rows_are_refused_before_any_boot",
        "qemu-system-x86_64",
    ) {
        return;
    }
    let t = assert_refused(
        &[
            "ledger",
            "--linux",
            "debian-amd64",
            "--cpu",
            "Skylake-Clinet-v1",
        ],
        64,
        &[
            "Skylake-Clinet-v1",
            "-cpu help",
            "Skylake-Client-v1",
            "EPYC-Rome",
        ],
    );
    assert!(!t.contains("boot 1"), "{t}");
    assert_refused(
        &["ledger", "--linux", "debian-amd64", "--mitigation", "pti"],
        64,
        &["\"pti\"", "meltdown", "verw"],
    );
    assert_refused(
        &[
            "ledger",
            "--linux",
            "debian-amd64",
            "--workload",
            "poundsyscall",
        ],
        64,
        &["getppid", "sched-messaging"],
    );
}

#[test]
fn pti_and_verw_on_skylake_client() {
    let test = "pti_and_verw_on_skylake_client";
    if !kernel_or_skip(test, "debian-amd64") {
        return;
    }
    let dir = scratch(test);
    let (code, text, v) = ledger(
        &[
            "--linux",
            "debian-amd64",
            "--cpu",
            "Skylake-Client-v1",
            "--workload",
            "getppid",
            "--iterations",
            "300",
            "--mitigation",
            "meltdown",
            "--mitigation",
            "verw",
            "--svg",
            dir.join("ledger.svg")
                .to_str()
                .expect("a UTF-8 scratch path"),
        ],
        &dir.join("ledger.json"),
    );
    let svg = std::fs::read_to_string(dir.join("ledger.svg")).expect("the --svg file");
    assert!(
        svg.starts_with("<svg") && svg.contains(">meltdown<") && svg.contains(">verw<"),
        "{svg}"
    );
    assert_eq!(code, 0, "{text}");
    let block = &v["blocks"][0];
    assert_eq!(block["cpu"], "Skylake-Client-v1", "{text}");
    // Exact: every undisturbed call the same path, so whole numbers.
    let default = &block["default"];
    let per_call =
        default["kernel_instructions"].as_f64().unwrap() / default["calls"].as_f64().unwrap();
    assert_eq!(per_call.fract(), 0.0, "{text}");
    // PTI: 8 instructions, 2 CR3 writes per call (entry and exit), in the
    // entry and exit code.
    let pti = row(block, "meltdown");
    assert_eq!(pti["status"], "measured", "{text}");
    assert_eq!(pti["delta"]["kernel_instructions"], 8.0, "{text}");
    assert_eq!(pti["delta"]["specials"]["mov_cr3"], 2.0, "{text}");
    assert_eq!(special(default, "mov_cr3"), 2.0, "{text}");
    // VERW: the kernel says MDS buffers are cleared ("Clear CPU buffers
    // attempted": no microcode under TCG, but the VERW runs): one VERW
    // per return to user, and none with the group off.
    let verw = row(block, "verw");
    let mds = verw["states"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s[0] == "mds"))
        .and_then(|s| s[1].as_str())
        .unwrap_or_else(|| panic!("no mds state: {text}"));
    assert!(mds.contains("Clear CPU buffers"), "{mds}");
    assert_eq!(special(default, "verw"), 1.0, "{text}");
    assert_eq!(verw["status"], "measured", "{text}");
    assert_eq!(verw["delta"]["specials"]["verw"], 1.0, "{text}");
    assert_eq!(special(&verw["off"], "verw"), 0.0, "{text}");
    // Rows not asked for are said so, the sum flagged incomplete; a row
    // the kernel did not enable is "not enabled", never a zero.
    assert_eq!(
        row(block, "indirect_target_selection")["status"],
        "not_measured",
        "{text}"
    );
    // SRSO is AMD's: "Not affected" on this Intel model.
    assert_eq!(
        row(block, "spec_rstack_overflow")["status"],
        "not_enabled",
        "{text}"
    );
    assert_eq!(block["sum"]["incomplete"], true, "{text}");
    assert!(text.contains("not enabled"), "{text}");
    assert!(text.contains("entry_SYSCALL_64"), "{text}");
}

/// The bigger matrix: twice the same block (every count identical), and
/// the 6.12 and 686-pae kernels. Minutes: only with PTISCOPE_SLOW_TESTS=1.
#[test]
fn counts_repeat_exactly_and_other_kernels() {
    let test = "counts_repeat_exactly_and_other_kernels";
    if !ptiscope::test_support::slow_tier() {
        ptiscope::test_support::skip(
            test,
            "slow (several minutes of TCG boots): set PTISCOPE_SLOW_TESTS=1 to run it",
        );
        return;
    }
    if !kernel_or_skip(test, "debian-amd64") {
        return;
    }
    let dir = scratch(test);
    let args = [
        "--linux",
        "debian-amd64",
        "--cpu",
        "Skylake-Client-v1",
        "--cpu",
        "EPYC-Rome",
        "--workload",
        "getppid",
        "--iterations",
        "200",
    ];
    let (c1, t1, a) = ledger(&args, &dir.join("a.json"));
    let (c2, t2, b) = ledger(&args, &dir.join("b.json"));
    assert_eq!((c1, c2), (0, 0), "{t1}\n{t2}");
    // Per call: the undisturbed calls' number may differ by one or two
    // between boots (a timer interrupt that came, or not); what one call
    // executes may not.
    let per_call = |m: &serde_json::Value| -> Vec<(String, f64)> {
        let calls = m["calls"].as_f64().unwrap_or(f64::NAN);
        let mut v = vec![(
            "kernel_instructions".to_owned(),
            m["kernel_instructions"].as_f64().unwrap_or(f64::NAN) / calls,
        )];
        for key in ["specials", "symbols"] {
            for (k, n) in m[key].as_object().into_iter().flatten() {
                v.push((format!("{key}.{k}"), n.as_f64().unwrap_or(f64::NAN) / calls));
            }
        }
        v
    };
    let figures = |v: &serde_json::Value| -> Vec<(String, f64)> {
        let mut out = Vec::new();
        for b in v["blocks"].as_array().into_iter().flatten() {
            let name = format!("{} {}", b["kernel"], b["cpu"]);
            for (what, m) in [("default", &b["default"]), ("all_off", &b["all_off"])] {
                out.extend(
                    per_call(m)
                        .into_iter()
                        .map(|(k, x)| (format!("{name} {what} {k}"), x)),
                );
            }
            for r in b["rows"].as_array().into_iter().flatten() {
                out.push((format!("{name} {} {}", r["key"], r["status"]), 0.0));
                if !r["off"].is_null() {
                    out.extend(
                        per_call(&r["off"])
                            .into_iter()
                            .map(|(k, x)| (format!("{name} {} {k}", r["key"]), x)),
                    );
                }
            }
        }
        out
    };
    assert!(!figures(&a).is_empty(), "{t1}");
    assert_eq!(figures(&a), figures(&b), "{t1}\n{t2}");
    for k in ["debian-6.12-amd64", "debian-686-pae"] {
        if !kernel_or_skip(test, k) {
            continue;
        }
        let (c, t, v) = ledger(
            &[
                "--linux",
                k,
                "--cpu",
                "Skylake-Client-v1",
                "--workload",
                "getppid",
                "--iterations",
                "200",
            ],
            &dir.join(format!("{k}.json")),
        );
        assert_eq!(c, 0, "{t}");
        let block = &v["blocks"][0];
        assert_eq!(row(block, "meltdown")["status"], "measured", "{t}");
        assert_eq!(
            row(block, "meltdown")["delta"]["specials"]["mov_cr3"],
            2.0,
            "{t}"
        );
    }
}

/// `--backend kvm` on kvm_pvm (which cannot run Linux: no user SYSCALL,
/// CPL0 instructions it lacks) is refused before any boot, with the
/// reason and the way out (`--backend nested`); `--cpu` there is QEMU's
/// and refused too. On a KVM that runs Linux the ledger would boot
/// (minutes): skipped.
#[test]
fn kvm_backend_refused_with_the_reason_where_it_cannot_run_linux() {
    let test = "kvm_backend_refused_with_the_reason_where_it_cannot_run_linux";
    assert_refused(
        &[
            "ledger",
            "--backend",
            "kvm",
            "--linux",
            "debian-amd64",
            "--cpu",
            "max",
        ],
        64,
        &["--cpu", "KVM's CPU"],
    );
    // --backend nested's --cpu is refused as early, before any session.
    assert_refused(
        &[
            "ledger",
            "--backend",
            "nested",
            "--linux",
            "debian-amd64",
            "--cpu",
            "max",
        ],
        64,
        &["--cpu"],
    );
    if !kernel_or_skip(test, "debian-amd64")
        || !kvm_or_skip(test)
        || !host_is_kvm_pvm(test, "only kvm_pvm refuses Linux before the boot")
    {
        return;
    }
    let err = assert_refused(
        &[
            "ledger",
            "--backend",
            "kvm",
            "--linux",
            "debian-amd64",
            "--workload",
            "getppid",
        ],
        69,
        &["--backend kvm", "kvm_pvm", "--backend nested"],
    );
    assert!(!err.contains("boot 1"), "{err}");
}

/// The ledger on a real kvm_amd (`--backend nested`): host-clock time,
/// KVM exits per call, labelled not exact. Slow tier (a nested session
/// of several Linux boots).
#[test]
fn nested_ledger_shows_exits_and_host_clock() {
    let test = "nested_ledger_shows_exits_and_host_clock";
    if !ptiscope::test_support::slow_tier() {
        ptiscope::test_support::skip(
            test,
            "slow (a nested session, minutes): set PTISCOPE_SLOW_TESTS=1 to run it",
        );
        return;
    }
    if !kernel_or_skip(test, "debian-amd64") || !kvm_or_skip(test) {
        return;
    }
    let dir = scratch(test);
    let (code, text, v) = ledger(
        &[
            "--backend",
            "nested",
            "--linux",
            "debian-amd64",
            "--workload",
            "getppid",
            "--mitigation",
            "spectre_v2",
        ],
        &dir.join("nested.json"),
    );
    assert_eq!(code, 0, "{text}");
    let block = &v["blocks"][0];
    assert_eq!(block["cpu"], "host", "{text}");
    assert_eq!(block["default"]["figure"], "host_ns", "{text}");
    assert_eq!(block["default"]["exact"], false, "{text}");
    assert!(
        block["default"]["host_ns"].as_f64().unwrap_or(0.0) > 0.0,
        "{text}"
    );
    assert!(
        !block["default"]["specials"]["kvm_exits"].is_null(),
        "{text}"
    );
    // Not exact: a second default boot says how far apart two boots are.
    assert!(block["noise"].as_f64().is_some(), "{text}");
    assert!(
        text.contains("ns/call") && text.contains("NOT exact"),
        "{text}"
    );
}
