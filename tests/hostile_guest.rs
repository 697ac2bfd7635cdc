//! Text from a hostile guest decides nothing on the host: terminal escape
//! sequences reach the terminal escaped (and `--serial-out` files raw), and
//! a lying `@result iterations=` does not change host-observed rates.

mod common;

use std::path::Path;

use common::*;
use ptiscope_abi::phase::{Marker, ID_WORKLOAD};
use serde_json::Value;

const PADDR: u32 = 0x100000;

/// `xor eax, eax; out 0xf4, eax; hlt`: exit status 0.
const EXIT_0: [u8; 5] = [0x31, 0xc0, 0xe7, 0xf4, 0xf4];
/// `jmp $`: spin until --timeout.
const SPIN: [u8; 2] = [0xeb, 0xfe];

/// A guest that runs `before`, prints `text`, runs `after`.
fn guest(path: &Path, before: &[u8], text: &[u8], after: &[u8]) {
    write_pvh_elf(
        path,
        u64::from(PADDR),
        &print_code(PADDR, before, text, after),
    );
}

const HOSTILE: &[u8] = b"title\x1b]0;pwned\x07 clip\x1b]52;c;aGk=\x07 csi\x9b2J end\n";

#[test]
fn guest_escape_sequences_reach_the_terminal_escaped_and_files_raw() {
    let Some(dir) = kvm_scratch_or_skip("guest escape sequences", "escapes") else {
        return;
    };
    let elf = dir.join("escapes.elf");
    guest(&elf, &[], HOSTILE, &SPIN);
    let o = run_image(&elf, "0.5", None);
    let (out, err) = (stdout(&o), stderr(&o));
    assert_eq!(o.status.code(), Some(124), "{err}");
    for (name, text) in [("stdout", &o.stdout), ("stderr", &o.stderr)] {
        assert!(
            !text.iter().any(|&b| b == 0x1b || b == 0x07 || b == 0x9b),
            "raw control bytes on {name}: {text:?}"
        );
    }
    // The console on stdout, and the console tail the timeout summary repeats.
    let shown = r"title\x1b]0;pwned\x07 clip\x1b]52;c;aGk=\x07 csi\x9b2J end";
    assert!(out.contains(shown), "{out}");
    assert!(err.contains(&format!("| {shown}")), "{err}");

    // --serial-out is a file: the guest's bytes, unchanged.
    let file = dir.join("console.raw");
    let o = run_image(&elf, "0.5", Some(("--serial-out", &file)));
    assert_eq!(o.status.code(), Some(124), "{}", stderr(&o));
    assert_eq!(std::fs::read(&file).unwrap(), HOSTILE);
}

/// `ptiscope run` of the guest image `elf` in 16 MiB, stopped after
/// `timeout` seconds, with an output option (`--json PATH`, ...) if given.
fn run_image(elf: &Path, timeout: &str, output: Option<(&str, &Path)>) -> std::process::Output {
    let mut c = ptiscope();
    c.args(["run", "--mem", "16", "--timeout", timeout, "--kernel"])
        .arg(elf);
    if let Some((option, path)) = output {
        c.arg(option).arg(path);
    }
    c.output().unwrap()
}

#[test]
fn a_spoofed_iteration_count_does_not_change_host_rates() {
    // The VMM asks for 1000 getpid calls; the guest marks a phase, claims
    // it ran 1, and exits. Host-observed rates divide by the 1000 asked
    // (+ the marker call), and a cross-check says the guest disagrees.
    let Some(dir) = kvm_scratch_or_skip("spoofed iterations", "spoof") else {
        return;
    };
    let elf = dir.join("spoof.elf");
    guest(
        &elf,
        &mark_code(Marker::begin(ID_WORKLOAD)),
        b"@result workload=getpid iterations=1 cycles=5000\n",
        &[mark_code(Marker::end(ID_WORKLOAD)), EXIT_0.to_vec()].concat(),
    );
    let json = dir.join("run.json");
    let o = ptiscope()
        .args([
            "run",
            "--mem",
            "16",
            "--timeout",
            "10",
            "--workload",
            "getpid",
        ])
        .args(["--iterations", "1000", "--kernel"])
        .arg(&elf)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let v: Value = read_json(&json);
    assert_eq!(v["iterations"], 1001, "{v}");
    for name in ["vmm_exits", "elapsed"] {
        let r = the_row(&v, name);
        let total = r["total"].as_f64().unwrap();
        let per = r["per_iteration"].as_f64().unwrap();
        assert!(
            (per - total / 1001.0).abs() <= 1e-9 * total.max(1.0),
            "{name}: {r}"
        );
    }
    // The guest's own figure stays the guest's, over the N the VMM asked for.
    let cycles = the_row(&v, "cycles");
    assert_eq!(cycles["source"], "guest", "{cycles}");
    assert_eq!(cycles["per_iteration"].as_f64(), Some(5.0), "{cycles}");
    let check = v["cross_checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["host_metric"] == "requested_iterations")
        .unwrap_or_else(|| panic!("no iterations cross-check: {v}"));
    assert_eq!(check["host_value"], 1000.0, "{check}");
    assert_eq!(check["guest_value"], 1.0, "{check}");
    assert_eq!(check["agrees"], false, "{check}");
    assert!(
        err.contains("requested_iterations [vmm] 1,000 vs iterations [guest] 1: DISAGREE"),
        "{err}"
    );
}

#[test]
fn a_guest_that_never_initialised_its_telemetry_is_not_called_valid() {
    let Some(dir) = kvm_scratch_or_skip("uninitialised telemetry", "notelemetry") else {
        return;
    };
    let elf = dir.join("quiet.elf");
    guest(&elf, &[], b"hello\n", &EXIT_0);
    let json = dir.join("run.json");
    let o = run_image(&elf, "5", Some(("--json", &json)));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(!err.contains("guest telemetry: valid"), "{err}");
    assert!(
        err.contains("guest telemetry: none (the guest never initialised its page)"),
        "{err}"
    );
    let v: Value = read_json(&json);
    assert_eq!(v["telemetry_initialized"], false, "{v}");
    assert!(v["telemetry_valid"].is_null(), "{v}");
}
