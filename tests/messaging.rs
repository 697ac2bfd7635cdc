//! `workload=sched-messaging` (perf bench sched messaging with pipes) end
//! to end: every message delivered intact, the exact syscall count, context
//! switches, and the CR3 writes they cost — per syscall 2 with PTI and 0
//! without, plus one per context switch between processes and none between
//! threads. x86_64 under KVM, i386 under QEMU TCG.

mod common;

use std::collections::HashMap;

use common::*;

const GROUPS: u64 = 1;
const LOOPS: u64 = 2;

/// Checks one run's `@result` against the workload's exact counts.
fn check(r: &HashMap<String, String>, pti: &str, mode: &str, what: &str) {
    let messages = GROUPS * 20 * 20 * LOOPS;
    let workers = GROUPS * 40;
    assert_eq!(r["workload"], "sched-messaging", "{what}: {r:?}");
    assert_eq!(r["mode"], mode, "{what}");
    assert_eq!(r["pti"], pti, "{what}");
    assert_eq!(num(r, "groups"), GROUPS, "{what}");
    assert_eq!(num(r, "loops"), LOOPS, "{what}");
    assert_eq!(num(r, "iterations"), messages, "{what}");
    assert_eq!(
        num(r, "mismatches"),
        0,
        "{what}: messages lost or corrupted: {r:?}"
    );
    assert_eq!(num(r, "exit_status"), 0, "{what}");
    // One write and one read per message (100-byte writes are atomic and
    // every read asks for exactly one message), an exit per worker, the
    // parent's waits (one per worker plus the final -ECHILD) and its end
    // marker.
    let syscalls = 2 * messages + workers + (workers + 1) + 1;
    assert_eq!(num(r, "syscalls"), syscalls, "{what}: {r:?}");
    let switches = num(r, "context_switches");
    assert!(switches > 0, "{what}: no context switch: {r:?}");
    let cs_cr3 = num(r, "cr3_context_switch");
    if mode == "process" {
        assert_eq!(
            cs_cr3, switches,
            "{what}: every switch between processes writes CR3: {r:?}"
        );
    } else {
        assert_eq!(cs_cr3, 0, "{what}: threads share the address space: {r:?}");
    }
    let (entry, exit) = (num(r, "cr3_entry"), num(r, "cr3_exit"));
    if pti == "on" {
        assert_eq!((entry, exit), (syscalls, syscalls), "{what}: {r:?}");
    } else {
        assert_eq!((entry, exit), (0, 0), "{what}: {r:?}");
    }
    assert_eq!(num(r, "cr3_writes"), entry + exit + cs_cr3, "{what}: {r:?}");
    assert_eq!(num(r, "cr3_other"), 0, "{what}");
}

#[test]
fn x86_64_delivers_every_message_with_the_expected_cr3_writes_as_processes_and_threads() {
    if !kvm_or_skip("sched-messaging under KVM") {
        return;
    }
    for mode in ["process", "thread"] {
        for pti in ["on", "off"] {
            let cmdline = format!("groups={GROUPS} loops={LOOPS} mode={mode}");
            let json = scratch("messaging").join(format!("{mode}-{pti}.json"));
            let o = ptiscope()
                .args(["run", "--timeout", "30", "--workload", "sched-messaging"])
                .args(["--pti", pti, "--cmdline", &cmdline, "--json"])
                .arg(&json)
                .output()
                .expect("run ptiscope");
            let out = stdout(&o) + &stderr(&o);
            let what = format!("x86_64 {mode} pti={pti}");
            assert_eq!(o.status.code(), Some(0), "{what}:\n{out}");
            let r = result_line(&out);
            check(&r, pti, mode, &what);
            // The host's report: per-message rates, and KVM's flushes agree
            // with the guest's CR3 switches (exits and context switches).
            let v = read_json(&json);
            assert_eq!(v["iteration_name"], "message", "{what}");
            assert_eq!(
                v["iterations"].as_u64(),
                Some(num(&r, "iterations")),
                "{what}"
            );
            let checks = v["cross_checks"].as_array().unwrap();
            // KVM counts the guest's CR3 switches only where it intercepts
            // them (shadow paging); with EPT/NPT the run says so in a note.
            if v["environment"]["kvm"]["sees_cr3_writes"] == true {
                assert!(!checks.is_empty(), "{what}: no cross-check");
            } else {
                ptiscope::test_support::skip(
                    &format!("{what}: KVM tlb_flush cross-check"),
                    &format!(
                        "this KVM does not intercept guest CR3 writes ({} paging)",
                        v["environment"]["kvm"]["paging"]
                    ),
                );
            }
            for c in checks {
                assert_eq!(c["agrees"], true, "{what}: {c}");
            }
        }
    }
}

#[test]
fn i386_delivers_every_message_with_the_expected_cr3_writes_as_processes_and_threads() {
    if !qemu_i386_or_skip("sched-messaging i386 under QEMU") {
        return;
    }
    let dir = Scratch::new("messaging-i386");
    for mode in ["process", "thread"] {
        for pti in ["on", "off"] {
            let cmdline = format!("groups={GROUPS} loops={LOOPS} mode={mode}");
            let (o, v) = output_and_json(
                run_i386_qemu(60)
                    .args(["--workload", "sched-messaging", "--pti", pti])
                    .args(["--cmdline", &cmdline]),
                &dir,
                &format!("{mode}-{pti}"),
            );
            let out = stdout(&o) + &stderr(&o);
            let what = format!("i386 {mode} pti={pti}");
            assert_eq!(o.status.code(), Some(0), "{what}:\n{out}");
            // The VMM booted the i386 image (`--arch i386`).
            assert_eq!(guest_image(&v), ("embedded i386", true), "{what}: {v}");
            check(&result_line(&out), pti, mode, &what);
        }
    }
}

#[test]
fn too_many_groups_is_a_bad_command_line_naming_the_key_and_the_bound() {
    if !kvm_or_skip("sched-messaging groups bound") {
        return;
    }
    let o = ptiscope()
        .args(["run", "--timeout", "30", "--workload", "sched-messaging"])
        .args(["--cmdline", "groups=5"])
        .output()
        .expect("run ptiscope");
    let out = stdout(&o) + &stderr(&o);
    assert_eq!(o.status.code(), Some(4), "{out}");
    assert!(out.contains("`groups`") && out.contains("1 to 4"), "{out}");
}
