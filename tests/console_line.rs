//! The guest's console lines reach the VMM through its console-line port:
//! one exit per line, not one per byte, with the text unchanged.

mod common;

use common::*;

#[test]
fn console_lines_cost_one_exit_each() {
    if !kvm_or_skip("console_lines_cost_one_exit_each") {
        return;
    }
    let dir = scratch("console_line");
    let (json, console) = (dir.join("run.json"), dir.join("console.txt"));
    let o = ptiscope()
        .args(["run", "--timeout", "20", "--json"])
        .arg(&json)
        .arg("--serial-out")
        .arg(&console)
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let text = std::fs::read_to_string(&console).unwrap();
    assert!(
        text.starts_with(ptiscope_abi::BANNER_PREFIX),
        "console: {text}"
    );
    assert!(text.contains("\nconfig: pti="), "console: {text}");
    // workload=none measures nothing: its config line claims no iterations.
    let config = text
        .lines()
        .find(|l| l.starts_with("config: "))
        .unwrap_or_default();
    assert!(
        config.contains(" workload=none ") && !config.contains("iterations="),
        "{config}"
    );
    assert!(
        text.ends_with("workload none: nothing to run\n"),
        "console: {text}"
    );
    let doc = json_or_null(&json);
    let vmm_exits = doc["rows"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["name"] == "vmm_exits"))
        .and_then(|r| r["total"].as_f64())
        .unwrap_or_else(|| panic!("no vmm_exits row in {doc}"));
    let lines = text.lines().count() as f64;
    // One `out` per line, the port's one `in`, the exit port; a kick or two
    // from the host at most. Per-byte COM1 writes would be text.len() exits.
    assert!(
        vmm_exits <= lines + 4.0,
        "{vmm_exits} userspace exits for {lines} console lines ({} bytes): {err}",
        text.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
