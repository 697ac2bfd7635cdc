//! SMP of the i386 PAE flavour, under QEMU TCG (this host's KVM refuses
//! 32-bit paging): `--arch i386 --backend qemu --cpus 2` starts the second
//! CPU by INIT/SIPI, poundsyscall's two threads (one pinned to each CPU)
//! make exactly one CR3 switch in and one out per syscall with PTI,
//! sched-messaging loses no message when its tasks wake each other across
//! CPUs, and the user copy still maps only the entry area (now with the
//! per-CPU entry areas of the APs). All figures are guest-reported.

mod common;

use common::*;

const CALLS: u64 = 300;

/// `ptiscope run --arch i386 --backend qemu --cpus 2 ARGS --json FILE`:
/// (exit code, console and summary, the run document: `null` for a
/// failed run), or None (with the reason printed) without
/// qemu-system-i386.
fn run_i386_two_cpus(
    test: &str,
    args: &[&str],
) -> Option<(Option<i32>, String, serde_json::Value)> {
    if !qemu_i386_or_skip(test) {
        return None;
    }
    // One directory per run: the tests of this binary run side by side.
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = Scratch::new(&format!("smp-i386-{n}"));
    let mut cmd = ptiscope();
    cmd.args(["run", "--arch", "i386", "--backend", "qemu", "--cpus", "2"])
        .args(["--timeout", "120"])
        .args(args);
    let (o, v) = output_and_json(&mut cmd, &dir, "run");
    Some((o.status.code(), stdout(&o) + &stderr(&o), v))
}

/// The document of a run of the embedded i386 guest on two CPUs: the VMM
/// booted the i386 image and asked the guest for 2 CPUs.
fn assert_i386_on_two_cpus(v: &serde_json::Value, what: &str) {
    assert_eq!(guest_image(v), ("embedded i386", true), "{what}: {v}");
    assert!(config_has(v, "cpus=2"), "{what}: {v}");
}

#[test]
fn two_cpus_come_online_by_init_sipi() {
    let what = "i386 two_cpus_come_online_by_init_sipi";
    let Some((code, out, v)) = run_i386_two_cpus(
        what,
        &["--pti", "on", "--workload", "getpid", "--iterations", "50"],
    ) else {
        return;
    };
    assert_eq!(code, Some(0), "{out}");
    // 2 CPUs asked for (the document), 2 online (the guest's count: only
    // the guest knows how many APs answered its INIT/SIPI; the document
    // has no such field).
    assert_i386_on_two_cpus(&v, what);
    let smp = machine_line(&out, "@smp");
    assert_eq!(num(&smp, "cpus"), 2, "{smp:?}");
    // The one-CPU loop's counts are unchanged by the second CPU.
    assert_eq!(row_total(&v, "syscalls"), 51.0, "{v}");
    assert_eq!(row_total(&v, "cr3_writes"), 102.0, "{v}");
    assert_cross_checks_agree(&v, what);
}

#[test]
fn poundsyscall_two_threads_make_two_cr3_writes_per_call() {
    for entry in ["int80", "sysenter"] {
        for pti in ["on", "off"] {
            let what = format!("i386 poundsyscall entry={entry} pti={pti}");
            let Some((code, out, v)) = run_i386_two_cpus(
                &what,
                &[
                    "--pti",
                    pti,
                    "--entry",
                    entry,
                    "--workload",
                    "poundsyscall",
                    "--iterations",
                    &CALLS.to_string(),
                    "--cmdline",
                    "threads=2",
                ],
            ) else {
                return;
            };
            assert_eq!(code, Some(0), "{what}:\n{out}");
            assert_i386_on_two_cpus(&v, &what);
            // Thread 1 is pinned to CPU 1 and tasks never migrate: the run
            // finishes with all its calls answered only if CPU 1 ran it.
            check_two_threads(&result_line(&out), CALLS, pti, &what);
            // And the host saw it: the plugin counts vCPU 1's syscall
            // entries, thread 1's calls and its exit.
            assert_eq!(
                row_total(&v, "syscall_entries_vcpu1"),
                (CALLS + 1) as f64,
                "{what}: {v}"
            );
            assert_cross_checks_agree(&v, &what);
            let smp = machine_line(&out, "@smp");
            assert_eq!(num(&smp, "cpus"), 2, "{what}: {smp:?}");
            assert_eq!(num(&smp, "threads"), 2, "{what}: {smp:?}");
            assert_eq!(num(&smp, "calls_per_thread"), CALLS, "{what}: {smp:?}");
            // CPU 0 woke CPU 1 at the begin marker (its thread was queued there).
            assert!(num(&smp, "ipis_sent") > 0, "{what}: {smp:?}");
        }
    }
}

#[test]
fn sched_messaging_across_two_cpus_loses_no_message() {
    for mode in ["process", "thread"] {
        let what = format!("i386 sched-messaging two CPUs mode={mode}");
        let cmdline = format!("groups=1 loops=2 mode={mode}");
        let Some((code, out, _)) = run_i386_two_cpus(
            &what,
            &[
                "--pti",
                "on",
                "--workload",
                "sched-messaging",
                "--cmdline",
                &cmdline,
            ],
        ) else {
            return;
        };
        assert_eq!(code, Some(0), "{what}:\n{out}");
        // Workers alternate between the CPUs: pipe wake-ups cross them.
        check_messaging_across_cpus(&out, &what);
    }
}

#[test]
fn the_user_copy_stays_isolated_with_two_cpus() {
    // The guest's own checks: a user read of a kernel address faults as
    // "not present" (error code 0x4) with PTI, and the user copy maps the
    // entry area only, the same pages whatever the CPU count.
    let Some((code, out, _)) = run_i386_two_cpus(
        "i386 the_user_copy_stays_isolated_with_two_cpus",
        &["--pti", "on", "--cmdline", "fault=kread"],
    ) else {
        return;
    };
    assert_ne!(code, Some(0), "the kernel read did not fault:\n{out}");
    // A run that ends in a fault writes no document, and the guest prints
    // no @smp line before its workload ends: its boot line is the one
    // record of how many CPUs came online.
    assert!(out.contains("smp: 2 of 2 CPUs online"), "{out}");
    let f = machine_line(&out, "@fault");
    assert_eq!(num(&f, "vector"), 14, "{f:?}");
    assert_eq!(f["error"], "0x4", "not-present fault from user mode: {f:?}");

    let pages = |cpus: &str| {
        let o = ptiscope()
            .args(["run", "--arch", "i386", "--backend", "qemu", "--cpus", cpus])
            .args(["--timeout", "120", "--pti", "on", "--iterations", "10"])
            .output()
            .expect("run ptiscope");
        let out = stdout(&o) + &stderr(&o);
        assert_eq!(o.status.code(), Some(0), "{out}");
        num(&machine_line(&out, "@pti"), "user_copy_kernel_pages")
    };
    assert_eq!(pages("1"), pages("2"));
}

#[test]
fn deferred_switch_on_i386_still_switches_twice_per_call_on_two_cpus() {
    // pti_switch=deferred (the 2020 RFC) on the PAE flavour: the exit's CR3
    // switch from Rust, one more page of kernel text in the user copy.
    let what = "i386 pti_switch=deferred poundsyscall";
    let Some((code, out, v)) = run_i386_two_cpus(
        what,
        &[
            "--pti",
            "on",
            "--entry",
            "int80",
            "--workload",
            "poundsyscall",
            "--iterations",
            &CALLS.to_string(),
            "--cmdline",
            "threads=2 pti_switch=deferred",
        ],
    ) else {
        return;
    };
    assert_eq!(code, Some(0), "{what}:\n{out}");
    let syscalls = (2 * CALLS + 2 + 3 + 1) as f64;
    let entry_exit = |v: &serde_json::Value| {
        (
            row_total(v, "cr3_writes_entry"),
            row_total(v, "cr3_writes_exit"),
        )
    };
    assert!(config_has(&v, "pti_switch=deferred"), "{v}");
    assert_eq!(row_total(&v, "syscalls"), syscalls, "{v}");
    assert_eq!(entry_exit(&v), (syscalls, syscalls), "{v}");
    assert_cross_checks_agree(&v, what);
    // The document has no mismatch count nor the user copy's make-up:
    // the guest's @result and @pti lines give them.
    assert_eq!(num(&result_line(&out), "mismatches"), 0, "{out}");
    let pti = machine_line(&out, "@pti");
    assert_eq!(pti["pti_switch"], "deferred", "{pti:?}");
    assert_eq!(num(&pti, "deferred_switch_pages"), 1, "{pti:?}");
    assert_eq!(
        num(&pti, "user_copy_kernel_pages"),
        num(&pti, "entry_area_pages") + 1,
        "exactly one page more than the entry area: {pti:?}"
    );

    // The same on SYSENTER: its exit's switch from Rust too.
    let Some((code, out, v)) = run_i386_two_cpus(
        what,
        &[
            "--pti",
            "on",
            "--entry",
            "sysenter",
            "--workload",
            "poundsyscall",
            "--iterations",
            &CALLS.to_string(),
            "--cmdline",
            "threads=2 pti_switch=deferred",
        ],
    ) else {
        return;
    };
    assert_eq!(code, Some(0), "sysenter:\n{out}");
    assert!(config_has(&v, "entry=sysenter"), "sysenter: {v}");
    assert_eq!(row_total(&v, "syscalls"), syscalls, "sysenter: {v}");
    assert_eq!(entry_exit(&v), (syscalls, syscalls), "sysenter: {v}");
    assert_cross_checks_agree(&v, "sysenter");
    let r = result_line(&out);
    assert_eq!(num(&r, "mismatches"), 0, "sysenter: {r:?}");
    let pti = machine_line(&out, "@pti");
    assert_eq!(pti["pti_switch"], "deferred", "sysenter: {pti:?}");
    assert_eq!(num(&pti, "deferred_switch_pages"), 1, "sysenter: {pti:?}");
}
