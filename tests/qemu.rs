//! The same guest ELF boots under QEMU (microvm, TCG): the independent check
//! that our ELF/PVH image is standard.

mod common;

use std::time::Duration;

use common::*;

#[test]
fn embedded_guest_boots_under_qemu_microvm() {
    let test = "embedded_guest_boots_under_qemu_microvm";
    let Some(o) = qemu_microvm_guest(test, &[], Duration::from_secs(60)) else {
        return;
    };
    let (status, out, err) = (o.status, stdout(&o), stderr(&o));
    let banner = out
        .lines()
        .find(|l| l.contains(ptiscope_abi::BANNER_PREFIX))
        .unwrap_or_else(|| panic!("no banner under QEMU:\n{out}\n{err}"));
    // isa-debug-exit: QEMU exits with (status << 1) | 1; guest status 0 → 1.
    assert_eq!(status.code(), Some(1), "{out}\n{err}");

    if !kvm_or_skip("banner matches the KVM run") {
        return;
    }
    let o = ptiscope()
        .args(["run", "--timeout", "20"])
        .output()
        .unwrap();
    let kvm_banner = stdout(&o).lines().next().unwrap_or("").to_string();
    assert_eq!(
        banner.trim_start_matches(|c: char| c != 'p').trim(),
        kvm_banner.trim()
    );
}

#[test]
fn backend_qemu_runs_the_workload_and_reports_guest_figures() {
    if !plugin_or_skip("backend qemu", "qemu-system-x86_64") {
        return;
    }
    let json = scratch("backend-qemu").join("run.json");
    let o = ptiscope()
        .args(["run", "--backend", "qemu", "--timeout", "60", "--pti", "on"])
        .args(["--workload", "getpid", "--iterations", "100", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = read_json(&json);
    // The backend that ran, as the document records it.
    assert_eq!(v["environment"]["backend"], "qemu", "{}", v["environment"]);
    let row = |name: &str| the_row(&v, name);
    assert_eq!(v["iterations"], 101, "N + the end-marker call");
    assert_eq!(row("cr3_writes")["total"], 202.0);
    assert_eq!(row("cr3_writes")["source"], "guest");
    assert_eq!(row("syscalls")["total"], 101.0);
    // No telemetry page under QEMU: nothing was checked, and the JSON says so.
    assert_eq!(v["telemetry_checked"], false);
    assert!(v["telemetry_valid"].is_null());
    // Nothing host-observed but what ptiscope's TCG plugin counted inside
    // QEMU (tests/qemu_plugin.rs): no KVM, VMM or host-clock rows.
    assert!(v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["source"] == "guest" || r["source"] == "qemu_plugin"));
}
