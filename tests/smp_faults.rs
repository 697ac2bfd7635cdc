//! Every `fault=` kind on every vCPU stops the VM within `--timeout` + 2 s:
//! an exception with the faulting vCPU named and guest status 2, a hang or
//! halt with the watchdog's 124. (`fault=kread fault_cpu=1` used to print
//! "CPU 1 raises fault=kread" and hang until the timeout: the AP returned
//! from `raise` to idle, as kread is raised by a user program, and no user
//! program ever ran there.)

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

const TIMEOUT_S: u64 = 3;

/// Runs `args`; returns the exit code, stdout and stderr and fails if it
/// took longer than `--timeout` + the hang slack (killing it at twice that).
fn run_bounded(args: &[&str], what: &str) -> (Option<i32>, String, String) {
    let start = Instant::now();
    let child = ptiscope()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Its stdout and stderr are drained while it runs, so a chatty guest
    // never blocks it.
    let limit = Duration::from_secs(TIMEOUT_S) + HANG_SLACK;
    let o = wait_output_within(child, limit * 2).unwrap_or_else(|e| panic!("{what}: {e}"));
    let took = start.elapsed();
    let (out, err) = (stdout(&o), stderr(&o));
    assert!(
        took <= limit,
        "{what}: took {took:?}, more than --timeout + {HANG_SLACK:?}\n{err}"
    );
    (o.status.code(), out, err)
}

/// How many of a test's runs go at once. The runs are independent VMs,
/// and a third of them (hang, halt) wait out their --timeout: side by side
/// those waits overlap instead of adding up, and the bound each run is held
/// to (--timeout + the hang slack) leaves room for sharing the cores.
const AT_ONCE: usize = 4;

fn check_every_fault_on_every_vcpu(backend: &[&str], name_the_vcpu: bool) {
    let timeout = TIMEOUT_S.to_string();
    let cases: Vec<(&str, &str)> = ["pf", "gp", "ud", "de", "kread", "hang", "halt"]
        .into_iter()
        .flat_map(|fault| ["0", "1"].map(|cpu| (fault, cpu)))
        .collect();
    let one = |(fault, cpu): (&str, &str)| -> Option<String> {
        let cmdline = format!("fault={fault} fault_cpu={cpu}");
        let what = format!("{backend:?} {cmdline}");
        let dir = scratch(&format!("smp-fault-{}-{fault}-{cpu}", backend.len()));
        let json = dir.join("run.json");
        let json_arg = json.to_string_lossy().into_owned();
        let mut args = vec![
            "run",
            "--cpus",
            "2",
            "--timeout",
            &timeout,
            "--cmdline",
            &cmdline,
            "--json",
            &json_arg,
        ];
        args.extend_from_slice(backend);
        let (code, out, err) = run_bounded(&args, &what);
        let doc = std::fs::read_to_string(&json).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        let hangs = matches!(fault, "hang" | "halt");
        let expected = if hangs { 124 } else { 2 };
        if code != Some(expected) {
            return Some(format!(
                "{what}: exit {code:?}, expected {expected}\n{out}\n{err}"
            ));
        }
        // How the run ended, from its JSON: a guest whose run ended
        // writes it however it stopped (docs/report-json.md).
        let v: serde_json::Value = match serde_json::from_str(&doc) {
            Ok(v) => v,
            Err(e) => return Some(format!("{what}: --json is not a document ({e})\n{err}")),
        };
        let stop = &v["stop"];
        if hangs {
            if stop["code"] != "timeout" {
                return Some(format!("{what}: stop {stop}, expected a timeout"));
            }
        } else {
            if stop["code"] != "guest_exit" || stop["status"] != 2 {
                return Some(format!("{what}: stop {stop}, expected guest_exit status 2"));
            }
            if !stop["guest_faults"][0]["vector"].is_string() {
                return Some(format!(
                    "{what}: no @fault vector in the stop: {stop}\n{out}"
                ));
            }
            if name_the_vcpu && stop["vcpu"] != cpu.parse::<u32>().unwrap() {
                return Some(format!("{what}: vCPU {cpu} not named: {stop}"));
            }
        }
        None
    };
    let failures = run_at_once(&cases, AT_ONCE, one);
    assert!(failures.is_empty(), "{}", failures.join("\n-----\n"));
}

#[test]
fn every_fault_on_every_vcpu_stops_the_vm_in_time_kvm() {
    if !kvm_or_skip("every_fault_on_every_vcpu_stops_the_vm_in_time_kvm") {
        return;
    }
    check_every_fault_on_every_vcpu(&[], true);
}

#[test]
fn every_fault_on_every_vcpu_stops_the_vm_in_time_qemu() {
    let test = "every_fault_on_every_vcpu_stops_the_vm_in_time_qemu";
    if !plugin_or_skip(test, "qemu-system-x86_64") {
        return;
    }
    // QEMU reports the guest's status, not which vCPU wrote it.
    check_every_fault_on_every_vcpu(&["--backend", "qemu"], false);
    check_every_fault_on_every_vcpu(&["--backend", "qemu", "--arch", "i386"], false);
}
