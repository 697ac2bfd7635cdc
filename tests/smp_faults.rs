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

fn check_every_fault_on_every_vcpu(backend: &[&str], name_the_vcpu: bool) {
    let timeout = TIMEOUT_S.to_string();
    let mut failures = Vec::new();
    for fault in ["pf", "gp", "ud", "de", "kread", "hang", "halt"] {
        for cpu in ["0", "1"] {
            let cmdline = format!("fault={fault} fault_cpu={cpu}");
            let what = format!("{backend:?} {cmdline}");
            let mut args = vec![
                "run",
                "--cpus",
                "2",
                "--timeout",
                &timeout,
                "--cmdline",
                &cmdline,
            ];
            args.extend_from_slice(backend);
            let (code, out, err) = run_bounded(&args, &what);
            let hangs = matches!(fault, "hang" | "halt");
            let expected = if hangs { 124 } else { 2 };
            if code != Some(expected) {
                failures.push(format!(
                    "{what}: exit {code:?}, expected {expected}\n{out}\n{err}"
                ));
                continue;
            }
            if !hangs {
                if !out.contains("@fault vector=") {
                    failures.push(format!("{what}: no @fault line\n{out}"));
                }
                let named = format!("ptiscope: vCPU {cpu}: guest exited with status 2");
                if name_the_vcpu && !err.contains(&named) {
                    failures.push(format!("{what}: vCPU {cpu} not named\n{err}"));
                }
            }
        }
    }
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
