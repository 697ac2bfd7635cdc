//! SMP under KVM: `--cpus 2` boots the guest's second CPU by INIT/SIPI, the
//! poundsyscall threads run on both vCPUs (both vCPUs' KVM exits rise, each
//! guest CPU makes its threads' syscalls) with exactly one CR3 switch in and
//! one out per syscall with PTI, and sched-messaging loses no message when
//! its tasks are spread over two CPUs and wake each other by IPI.

mod common;

use common::*;
use serde_json::Value;

const CALLS: u64 = 300;

fn row(v: &Value, name: &str) -> Option<f64> {
    summary_row(v, name)?["total"].as_f64()
}

/// Boots with `--cpus 2`, returns (console, summary JSON).
fn run_two_cpus(test: &str, args: &[&str]) -> (String, Value) {
    let json = scratch(test).join("run.json");
    let out = ptiscope()
        .args(["run", "--cpus", "2", "--json"])
        .arg(&json)
        .args(args)
        .output()
        .expect("run ptiscope");
    let console = stdout(&out);
    assert!(
        out.status.success(),
        "{test}: {:?}\n{console}\n{}",
        out.status,
        stderr(&out)
    );
    (console, read_json(&json))
}

#[test]
fn poundsyscall_two_threads_run_on_both_vcpus_with_two_cr3_writes_per_call() {
    if !kvm_or_skip("poundsyscall_two_threads_run_on_both_vcpus_with_two_cr3_writes_per_call") {
        return;
    }
    for pti in ["on", "off"] {
        let (console, v) = run_two_cpus(
            &format!("pound-{pti}"),
            &[
                "--pti",
                pti,
                "--workload",
                "poundsyscall",
                "--iterations",
                &CALLS.to_string(),
                "--cmdline",
                "threads=2",
            ],
        );
        // 2 CPUs asked for (the document), 2 online (the guest's count:
        // the document has none).
        assert!(config_has(&v, "cpus=2"), "{v}");
        assert_eq!(num(&machine_line(&console, "@smp"), "cpus"), 2, "{console}");
        let r = result_line(&console);
        check_two_threads(&r, CALLS, pti, &format!("pti={pti}"));
        // Both vCPUs ran guest code: each one's KVM exits (2 per int3 round
        // trip here) rose by at least its thread's calls, and each guest CPU
        // counted at least its thread's syscalls.
        // The exits rise per call only where each entry exits to KVM
        // (kvm_pvm, whose guest kernel runs emulated); hardware KVM runs
        // the syscalls without exits.
        let pvm = ran_on_kvm_pvm(
            &v,
            "poundsyscall: per-vCPU KVM exits per call",
            "only kvm_pvm exits on every guest entry",
        );
        for cpu in 0..2 {
            let exits = row(&v, &format!("kvm_exits_vcpu{cpu}")).expect("per-vCPU KVM exits");
            assert!(!pvm || exits >= CALLS as f64, "vCPU {cpu}: {exits} exits");
            let sys = row(&v, &format!("syscalls_cpu{cpu}")).expect("per-CPU syscalls");
            assert!(sys >= CALLS as f64, "CPU {cpu}: {sys} syscalls");
        }
        assert_eq!(v["telemetry_valid"], Value::Bool(true), "{v}");
    }
}

#[test]
fn sched_messaging_across_two_cpus_loses_no_message() {
    if !kvm_or_skip("sched_messaging_across_two_cpus_loses_no_message") {
        return;
    }
    let (console, v) = run_two_cpus(
        "messaging",
        &[
            "--pti",
            "on",
            "--workload",
            "sched-messaging",
            "--cmdline",
            "groups=1 loops=2",
        ],
    );
    check_messaging_across_cpus(&console, "sched-messaging on two vCPUs");
    for cpu in 0..2 {
        let sys = row(&v, &format!("syscalls_cpu{cpu}")).expect("per-CPU syscalls");
        assert!(sys > 0.0, "CPU {cpu} ran no task");
    }
}

#[test]
fn bad_cpu_counts_are_usage_errors() {
    for (args, want) in [
        (&["run", "--cpus", "0"][..], "1..=8"),
        (&["run", "--cpus", "9"][..], "1..=8"),
        (&["run", "--cpus", "2", "--no-irqchip"][..], "irqchip"),
    ] {
        assert_refused(args, 64, &[want]);
    }
}

#[test]
fn two_cpus_boot_under_qemu_smp_with_syscall_entry() {
    if !plugin_or_skip("qemu smp", "qemu-system-x86_64") {
        return;
    }
    let dir = Scratch::new("qemu-smp");
    let (out, v) = output_and_json(
        ptiscope().args([
            "run",
            "--backend",
            "qemu",
            "--cpus",
            "2",
            "--pti",
            "on",
            "--entry",
            "syscall",
            "--workload",
            "poundsyscall",
            "--iterations",
            "100",
            "--cmdline",
            "threads=2",
            "--timeout",
            "120",
        ]),
        &dir,
        "run",
    );
    let console = stdout(&out);
    assert!(out.status.success(), "{console}\n{}", stderr(&out));
    assert!(config_has(&v, "cpus=2"), "{v}");
    assert_eq!(num(&machine_line(&console, "@smp"), "cpus"), 2, "{console}");
    check_two_threads(&result_line(&console), 100, "on", "qemu smp");
    // The host saw CPU 1 run thread 1: the plugin's count of vCPU 1's
    // syscall entries, its 100 calls and its exit.
    assert_eq!(row_total(&v, "syscall_entries_vcpu1"), 101.0, "{v}");
    assert_cross_checks_agree(&v, "qemu smp");
}

#[test]
fn poundsyscall_on_one_cpu_runs_its_threads_in_turn() {
    if !kvm_or_skip("poundsyscall_on_one_cpu_runs_its_threads_in_turn") {
        return;
    }
    let out = ptiscope()
        .args([
            "run",
            "--pti",
            "on",
            "--workload",
            "poundsyscall",
            "--iterations",
            "100",
            "--cmdline",
            "threads=3",
        ])
        .output()
        .expect("run ptiscope");
    let console = stdout(&out);
    assert!(out.status.success(), "{console}\n{}", stderr(&out));
    let r = result_line(&console);
    assert_eq!(num(&r, "iterations"), 300, "{r:?}");
    assert_eq!(num(&r, "mismatches"), 0, "{r:?}");
    let syscalls = 300 + 2 * 3 + 2;
    assert_eq!(num(&r, "syscalls"), syscalls, "{r:?}");
    assert_eq!(
        (num(&r, "cr3_entry"), num(&r, "cr3_exit")),
        (syscalls, syscalls),
        "{r:?}"
    );
    // Threads of one address space: no CR3 write between them.
    assert_eq!(num(&r, "cr3_context_switch"), 0, "{r:?}");
}

#[test]
fn a_fault_on_the_second_vcpu_stops_the_vm_and_is_named() {
    let test = "a_fault_on_the_second_vcpu_stops_the_vm_and_is_named";
    let Some(dir) = kvm_scratch_or_skip(test, "second-vcpu-fault") else {
        return;
    };
    let (out, v) = output_and_json(
        ptiscope().args(["run", "--cpus", "2", "--cmdline", "fault=ud fault_cpu=1"]),
        &dir,
        "fault",
    );
    let err = stderr(&out);
    // Guest status 2: a CPU exception, reported by the faulting CPU,
    // whose own stop stopped the VM.
    assert_eq!(out.status.code(), Some(2), "{err}");
    let stop = stop_of(&v);
    assert_eq!(
        (&stop["code"], &stop["status"], &stop["vcpu"]),
        (&"guest_exit".into(), &2.into(), &1.into()),
        "{stop}"
    );
    assert_eq!(stop["guest_faults"][0]["vector"], "6", "{stop}");

    // A hang on the second vCPU: the watchdog stops both (no vCPU's own
    // stop: the timeout's).
    let (out, v) = output_and_json(
        ptiscope().args([
            "run",
            "--cpus",
            "2",
            "--timeout",
            "1",
            "--cmdline",
            "fault=hang fault_cpu=1",
        ]),
        &dir,
        "hang",
    );
    assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));
    let stop = stop_of(&v);
    assert_eq!(
        (&stop["code"], &stop["vcpu"]),
        (&"timeout".into(), &Value::Null),
        "{stop}"
    );

    // fault_cpu must name a CPU that exists.
    let out = ptiscope()
        .args(["run", "--cpus", "2", "--cmdline", "fault=ud fault_cpu=2"])
        .output()
        .expect("run ptiscope");
    assert_eq!(out.status.code(), Some(4), "{}", stdout(&out));
}

#[test]
fn compare_poundsyscall_prints_the_per_thread_count_table() {
    if !kvm_or_skip("compare_poundsyscall_prints_the_per_thread_count_table") {
        return;
    }
    let json = scratch("pound-compare").join("sweep.json");
    let out = ptiscope()
        .args([
            "compare",
            "--workload",
            "poundsyscall",
            "--cpus",
            "2",
            "--iterations",
            "50",
            "--runs",
            "1",
            "--quiet",
            "--json",
        ])
        .arg(&json)
        .output()
        .expect("run ptiscope");
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    for t in 1..=4 {
        assert!(text.contains(&format!("Amean  elapsed-{t}")), "{text}");
    }
    let v = read_json(&json);
    assert!(v["environment"]["host"].is_object(), "{}", v["environment"]);
    let counts = v["thread_counts"].as_array().expect("thread counts");
    assert_eq!(counts.len(), 4, "T = 1..=2 x 2 vCPUs");
    for c in counts {
        let cr3 = |side: &str| c[side]["cr3_writes_per_call"][0].as_f64().unwrap();
        // Per getppid call: 2 with PTI, plus the few per-phase syscalls
        // (2T + 2 over 50T calls) and context switches; none without.
        assert!(cr3("compare") >= 2.0 && cr3("compare") < 2.2, "{c}");
        assert!(cr3("baseline") < 0.1, "{c}");
    }
    // --fail-if needs one thread count.
    let out = ptiscope()
        .args([
            "compare",
            "--workload",
            "poundsyscall",
            "--fail-if",
            "ns_per_call>0",
        ])
        .output()
        .expect("run ptiscope");
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
}

#[test]
fn live_metrics_report_every_vcpu() {
    if !kvm_or_skip("live_metrics_report_every_vcpu") {
        return;
    }
    let dir = scratch("smp-live-metrics");
    let lines = dir.join("metrics.jsonl");
    let out = ptiscope()
        .args(["run", "--cpus", "2", "--workload", "poundsyscall"])
        .args(["--iterations", "300", "--cmdline", "threads=2"])
        .args(["--metrics-interval", "5", "--metrics-out"])
        .arg(&lines)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = std::fs::read_to_string(&lines).unwrap();
    let samples: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!samples.is_empty(), "no metrics lines");
    let exits = |vcpu: usize| -> f64 {
        samples
            .iter()
            .filter_map(|s| s["kvm_vcpu"][vcpu]["exits"].as_f64())
            .sum()
    };
    for s in &samples {
        assert_eq!(s["kvm_vcpu"].as_array().map(Vec::len), Some(2), "{s}");
    }
    // Both threads make system calls (two exits each on kvm_pvm) on their
    // own vCPU.
    if host_is_kvm_pvm(
        "live_metrics_report_every_vcpu: 2 KVM exits per call on each vCPU",
        "only kvm_pvm exits on every guest kernel entry and return",
    ) {
        assert!(
            exits(0) > 300.0 && exits(1) > 300.0,
            "{} {}",
            exits(0),
            exits(1)
        );
    } else {
        // Both vCPUs ran (each exited to KVM at least once: the AP's
        // start-up, its halts), and their exits are reported apart.
        assert!(
            exits(0) > 0.0 && exits(1) > 0.0,
            "{} {}",
            exits(0),
            exits(1)
        );
    }
}
