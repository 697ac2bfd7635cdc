//! Where a system call's kernel instructions go, by kernel symbol
//! (`compare --by-symbol`): the QEMU plugin's per-address counts mapped
//! through the running kernel's /proc/kallsyms, which the init sends.

mod common;

use common::*;

/// The Debian kernel `name`, or `None` after printing why the test skips.
fn kernel_or_skip(test: &str, name: &str, qemu: &str) -> bool {
    if !plugin_or_skip(test, qemu) {
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

/// `compare --by-symbol` of two sides (one run each, getppid x 300).
fn compare(
    base: &str,
    comp: &str,
    extra: &[&str],
    json: &std::path::Path,
) -> (i32, String, serde_json::Value) {
    let o = ptiscope()
        .args(["compare", "--backend", "qemu", "--by-symbol", "--quiet"])
        .args([
            "--workload",
            "getppid",
            "--iterations",
            "300",
            "--runs",
            "1",
        ])
        .args(["--timeout", "180", "--baseline", base, "--compare", comp])
        .args(extra)
        .arg("--json")
        .arg(json)
        .output()
        .expect("run ptiscope");
    let text = stdout(&o) + &stderr(&o);
    let v = if json.is_file() {
        read_json(json)
    } else {
        serde_json::Value::Null
    };
    (o.status.code().unwrap_or(-1), text, v)
}

/// The kernel_instructions_per_call of a side (its amean).
fn kernel_per_call(v: &serde_json::Value, side: &str) -> f64 {
    v["metrics"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .find(|m| m["name"] == "kernel_instructions_per_call")
        })
        .and_then(|m| m[side]["amean"].as_f64())
        .unwrap_or_else(|| panic!("no kernel_instructions_per_call for {side} in {v}"))
}

/// The symbols' rows sum, per run, exactly to the plugin's
/// kernel_instructions, and per call to the table's figure.
fn check_sums(v: &serde_json::Value, text: &str) {
    let rows = v["by_symbol"]
        .as_array()
        .unwrap_or_else(|| panic!("no by_symbol: {text}"));
    for side in ["baseline", "compare"] {
        let runs = v["by_symbol_summary"][format!("{side}_runs")]
            .as_array()
            .unwrap_or_else(|| panic!("no {side}_runs: {text}"));
        assert!(!runs.is_empty(), "{text}");
        for r in runs {
            assert_eq!(r["symbol_sum"], r["kernel_instructions"], "{side}: {r}");
            assert!(
                r["kernel_instructions"].as_u64().unwrap() > 0,
                "{side}: {r}"
            );
        }
        let sum: f64 = rows.iter().map(|r| r[side].as_f64().unwrap()).sum();
        let table = kernel_per_call(v, side);
        assert!(
            (sum - table).abs() < 1e-6,
            "{side}: rows sum to {sum}, the table says {table}"
        );
    }
    let delta: f64 = rows.iter().map(|r| r["delta"].as_f64().unwrap()).sum();
    let table = kernel_per_call(v, "compare") - kernel_per_call(v, "baseline");
    assert!(
        (delta - table).abs() < 1e-6,
        "differences sum to {delta}, the table's to {table}"
    );
}

/// No row is the kernel's TSS I/O-bitmap update (`tss_update_io_bitmap`,
/// `native_tss_update_io_bitmap`, anything `io_bitmap`): the init's phase
/// markers leave the measured task without I/O permission, so its calls
/// are an unmodified process's (with `ioperm` Linux runs the update on
/// every return to user mode: 54 instructions per getppid on 6.1).
fn assert_no_io_bitmap(v: &serde_json::Value, text: &str) {
    let rows = v["by_symbol"]
        .as_array()
        .unwrap_or_else(|| panic!("no by_symbol: {text}"));
    let bitmap: Vec<&str> = rows
        .iter()
        .filter_map(|r| r["symbol"].as_str())
        .filter(|s| s.contains("io_bitmap"))
        .collect();
    assert!(bitmap.is_empty(), "{bitmap:?} in the calls:\n{text}");
    assert!(
        text.contains("@marker channel=mmio") || !text.contains("@marker"),
        "{text}"
    );
}

/// The symbols with a nonzero difference.
fn nonzero(v: &serde_json::Value) -> Vec<(String, f64)> {
    v["by_symbol"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|r| r["delta"].as_f64() != Some(0.0))
                .map(|r| {
                    (
                        r["symbol"].as_str().unwrap().to_string(),
                        r["delta"].as_f64().unwrap(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn pti_on_64_bit_syscall_lies_in_the_entry_and_exit_code() {
    let test = "by symbol, debian-amd64";
    if !kernel_or_skip(test, "debian-amd64", "qemu-system-x86_64") {
        return;
    }
    let dir = scratch("linux-symbols");
    let csv = dir.join("pti-symbols.csv");
    let (code, text, v) = compare(
        "linux=debian-amd64",
        "linux=debian-amd64,append=pti=on",
        &[
            "--fail-if",
            "symbol:entry_SYSCALL_64.delta>2",
            "--by-symbol-csv",
            csv.to_str().unwrap(),
        ],
        &dir.join("pti.json"),
    );
    // The condition holds (PTI's CR3 switch on entry is in entry_SYSCALL_64):
    // exit 1, the message naming the symbol and the numbers.
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("--fail-if symbol:entry_SYSCALL_64.delta>2 holds (value 4)"),
        "{text}"
    );
    check_sums(&v, &text);
    assert_no_io_bitmap(&v, &text);
    let moved = nonzero(&v);
    let names: Vec<&str> = moved.iter().map(|(s, _)| s.as_str()).collect();
    // SWITCH_TO_KERNEL_CR3 on entry, SWITCH_TO_USER_CR3_STACK on the
    // SYSRET exit path: the only places PTI adds instructions to getppid.
    assert!(names.contains(&"entry_SYSCALL_64"), "{moved:?}\n{text}");
    assert!(
        names.contains(&"syscall_return_via_sysret"),
        "{moved:?}\n{text}"
    );
    assert!(
        moved.iter().all(|(_, d)| *d > 0.0),
        "PTI removes nothing: {moved:?}"
    );
    assert!(!names.contains(&"[unknown]"), "{moved:?}");
    assert!(
        text.contains("kernel instructions per call by symbol"),
        "{text}"
    );
    assert!(text.contains("entry_SYSCALL_64"), "{text}");
    // --by-symbol-csv: the JSON's rows, one line each, after a header.
    let csv = std::fs::read_to_string(&csv).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("symbol,baseline_per_call,compare_per_call,delta_per_call"),
        "{csv}"
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(
        rows.len(),
        v["by_symbol"].as_array().unwrap().len(),
        "{csv}"
    );
    let delta_sum: f64 = rows.iter().map(|r| r[3].parse::<f64>().unwrap()).sum();
    assert_eq!(
        delta_sum,
        kernel_per_call(&v, "compare") - kernel_per_call(&v, "baseline"),
        "{csv}"
    );
    assert!(
        rows.iter()
            .any(|r| r[0] == "entry_SYSCALL_64" && r[3] == "4"),
        "{csv}"
    );

    // A kernel against itself: zero difference in every symbol, the same
    // symbols on both sides.
    let (code, text, v) = compare(
        "linux=debian-amd64",
        "linux=debian-amd64",
        &["--fail-if", "symbol:entry_SYSCALL_64!=0"],
        &dir.join("self.json"),
    );
    assert_eq!(code, 0, "{text}");
    check_sums(&v, &text);
    let rows = v["by_symbol"].as_array().unwrap();
    assert!(rows.len() > 5, "{text}");
    assert!(
        rows.iter()
            .all(|r| r["delta"] == 0.0 && r["baseline"] == r["compare"]),
        "{rows:?}"
    );
    assert_eq!(
        v["by_symbol_summary"]["zero_rows"].as_u64(),
        Some(rows.len() as u64)
    );
    assert!(text.contains("no symbol differs"), "{text}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn pti_on_32_bit_sysenter_lies_in_entry_sysenter_32() {
    let test = "by symbol, debian-686-pae";
    if !kernel_or_skip(test, "debian-686-pae", "qemu-system-i386") {
        return;
    }
    let dir = scratch("linux-symbols-686");
    let (code, text, v) = compare(
        "linux=debian-686-pae,entry=sysenter",
        "linux=debian-686-pae,entry=sysenter,append=pti=on",
        &[],
        &dir.join("pti.json"),
    );
    assert_eq!(code, 0, "{text}");
    check_sums(&v, &text);
    assert_no_io_bitmap(&v, &text);
    let moved = nonzero(&v);
    // i386 switches CR3 on entry and on the SYSEXIT path inside
    // entry_SYSENTER_32 itself.
    assert!(
        moved
            .iter()
            .any(|(s, d)| s == "entry_SYSENTER_32" && *d > 0.0),
        "{moved:?}\n{text}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The port marker (`--append ptiscope.marker=port`: the init writes its
/// markers with `out` after `ioperm`, as it does where the kernel refuses
/// the `/dev/mem` mapping): the calls then run the kernel's I/O-bitmap
/// update on their return to user mode, and the run says how it marked.
#[test]
fn the_port_marker_costs_each_call_the_io_bitmap_update() {
    let test = "port marker, debian-amd64";
    if !kernel_or_skip(test, "debian-amd64", "qemu-system-x86_64") {
        return;
    }
    let dir = scratch("port-marker");
    let json = dir.join("run.json");
    let o = ptiscope()
        .args(["run", "--backend", "qemu", "--linux", "debian-amd64"])
        .args([
            "--workload",
            "getppid",
            "--iterations",
            "300",
            "--by-symbol",
        ])
        .args(["--append", "ptiscope.marker=port", "--timeout", "180"])
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run ptiscope");
    let text = stdout(&o) + &stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{text}");
    let v = read_json(&json);
    let _ = std::fs::remove_dir_all(dir);
    let symbols = v["by_symbol"]["symbols"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let io_bitmap = symbols
        .iter()
        .find(|s| s["symbol"] == "native_tss_update_io_bitmap")
        .unwrap_or_else(|| {
            panic!(
                "no native_tss_update_io_bitmap by symbol: {}",
                v["by_symbol"]
            )
        });
    assert!(io_bitmap["instructions"].as_u64() > Some(0), "{io_bitmap}");
    // How the phase was marked, as data: the note's code and why.
    let notes = v["notes"].as_array().cloned().unwrap_or_default();
    let marker = notes
        .iter()
        .find(|n| n["code"] == "port_markers")
        .unwrap_or_else(|| panic!("no port_markers note: {notes:?}"));
    assert_eq!(marker["why"]["kind"], "asked", "{marker}");
    assert_eq!(marker["port"], 0x600, "{marker}");
}

/// `--by-symbol` where it cannot work, and bad `--fail-if symbol:`
/// conditions: refused before anything boots (exit 64), saying what to do.
#[test]
fn by_symbol_refusals_before_boot() {
    for (args, why) in [
        (
            &["--backend", "kvm", "--by-symbol"][..],
            "give --backend qemu",
        ),
        (
            &["--backend", "qemu", "--by-symbol"][..],
            "is for Linux guests",
        ),
        (
            &[
                "--backend",
                "qemu",
                "--by-symbol",
                "--no-plugin",
                "--linux",
                "debian-amd64",
            ][..],
            "drop --no-plugin",
        ),
        (
            &[
                "--backend",
                "qemu",
                "--fail-if",
                "symbol:entry_SYSCALL_64>1",
            ][..],
            "needs --by-symbol",
        ),
        (
            &[
                "--backend",
                "qemu",
                "--by-symbol",
                "--fail-if",
                "symbol:entry_SYSCALL_64=>1",
            ][..],
            "\"=>\" is not a comparison operator",
        ),
        (
            &["--backend", "qemu", "--by-symbol", "--fail-if", "symbol:>1"][..],
            "is not a kernel symbol name",
        ),
        (
            &[
                "--backend",
                "qemu",
                "--by-symbol",
                "--fail-if",
                "symbol:entry_SYSCALL_64.delta_pct>1",
            ][..],
            "takes .delta (the default), .baseline or .compare",
        ),
        (
            &["--backend", "qemu", "--by-symbol-csv", "/dev/null"][..],
            "add --by-symbol",
        ),
    ] {
        let o = ptiscope()
            .arg("compare")
            .args(args)
            .args(["--workload", "getppid", "--runs", "1"])
            .output()
            .expect("run ptiscope");
        let text = stdout(&o) + &stderr(&o);
        if text.contains("is not fetched") || text.contains("cannot open /dev/kvm") {
            ptiscope::test_support::skip("by-symbol refusals", &text);
            continue;
        }
        assert_eq!(o.status.code(), Some(64), "{args:?}: {text}");
        assert!(text.contains(why), "{args:?}: {text}");
        assert!(!text.contains("@result"), "{args:?} booted: {text}");
    }
    // `run --by-symbol` likewise.
    for (args, why) in [
        (&["--backend", "qemu"][..], "is for Linux guests"),
        (
            &["--backend", "qemu", "--no-plugin"][..],
            "give --backend qemu",
        ),
    ] {
        let o = ptiscope()
            .args(["run", "--by-symbol", "--workload", "getppid"])
            .args(args)
            .output()
            .expect("run ptiscope");
        let text = stdout(&o) + &stderr(&o);
        assert_eq!(o.status.code(), Some(64), "{args:?}: {text}");
        assert!(text.contains(why), "{args:?}: {text}");
    }
}
