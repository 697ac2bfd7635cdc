//! The user working set of the syscall loops (`wss=`, `stride=`,
//! `touches=`, `wss_pages=`), end to end:
//! - the loop really reads `touches` words per iteration, counted by the
//!   loop and checked by the kernel against the sum of what it read;
//! - the exact counts (syscalls, CR3 writes) and KVM's `tlb_flush` per call
//!   do not change with the working set;
//! - a kernel working set (`kwss=`) is read by every call, and PTI adds
//!   the same kernel instructions per call with it as without;
//! - each poundsyscall thread reads the shared working set before each
//!   getppid (every thread's count and sum checked by the kernel), and the
//!   exact counts do not change with it;
//! - bad values are refused before boot (exit 64);
//! - the 32-bit PAE flavour does the same under QEMU;
//! - on a host where a flushing CR3 write really empties the TLB (kvm_pvm,
//!   a software KVM), PTI costs more per call with a 4 MiB working set
//!   than without one (medians of interleaved runs, one-sided).

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::*;
use serde_json::Value;

/// `ptiscope run` under KVM with a JSON summary; (exit code, @result, JSON, output).
fn run_json(
    args: &[&str],
    dir: &Path,
    name: &str,
) -> (Option<i32>, HashMap<String, String>, Value, String) {
    let json = dir.join(format!("{name}.json"));
    let o = ptiscope()
        .args(["run", "--timeout", "60", "--serial-out"])
        .arg(dir.join(format!("{name}.console")))
        .args(["--json", json.to_str().unwrap()])
        .args(args)
        .output()
        .unwrap();
    let console = std::fs::read_to_string(dir.join(format!("{name}.console"))).unwrap_or_default();
    let v = json_or_null(&json);
    let out = format!("{console}\n{}{}", stdout(&o), stderr(&o));
    let r = if console.contains("@result") {
        result_line(&console)
    } else {
        HashMap::new()
    };
    (o.status.code(), r, v, out)
}

/// [`run_json`] of `--pti PTI --workload WORKLOAD --iterations N
/// --cmdline CMDLINE`.
fn run_loop(
    dir: &Path,
    name: &str,
    pti: &str,
    workload: &str,
    n: u64,
    cmdline: &str,
) -> (Option<i32>, HashMap<String, String>, Value, String) {
    let n = n.to_string();
    let args = ["--pti", pti, "--workload", workload, "--iterations", &n];
    run_json(&[&args[..], &["--cmdline", cmdline]].concat(), dir, name)
}

#[test]
fn the_loop_reads_touches_words_per_iteration() {
    let Some(dir) = kvm_scratch_or_skip("working set touches", "wss-touches") else {
        return;
    };
    const N: u64 = 300;
    // (extra command line, reads per iteration)
    for (extra, touches) in [
        ("wss=64K", 16),
        ("wss=64K stride=64 touches=100", 100),
        ("wss=10000 stride=64", 157),
        ("wss=1M touches=1000", 1000),
        ("wss=4M wss_pages=2m", 1024),
        ("wss=64K touches=0", 0),
    ] {
        for workload in ["getpid", "write-badfd"] {
            let (code, r, _, out) = run_loop(&dir, "touches", "on", workload, N, extra);
            assert_eq!(code, Some(0), "{extra} {workload}:\n{out}");
            assert_eq!(num(&r, "touches"), touches, "{extra}: {r:?}");
            assert_eq!(num(&r, "touched"), N * touches, "{extra}: {r:?}");
            assert_eq!(r["touch_check"], "ok", "{extra}: {r:?}");
            // The loop times its reads: the fewest cycles of one iteration
            // cannot exceed their mean.
            let (total, min) = (num(&r, "read_cycles"), num(&r, "read_cycles_min"));
            assert!(total > 0 && min * N <= total, "{extra}: {r:?}");
            assert_eq!(num(&r, "syscalls"), N + 1, "{extra}: {r:?}");
            assert_eq!(num(&r, "cr3_writes"), 2 * N + 2, "{extra}: {r:?}");
        }
    }
}

#[test]
fn exact_counts_and_kvm_flushes_do_not_change_with_the_working_set() {
    let Some(dir) = kvm_scratch_or_skip("working set counts", "wss-counts") else {
        return;
    };
    const N: u64 = 1000;
    for pti in ["on", "off"] {
        let mut seen: Vec<(String, f64, f64, f64, f64)> = Vec::new();
        for wss in ["0", "1M", "4M"] {
            let (code, r, v, out) =
                run_loop(&dir, "counts", pti, "getppid", N, &format!("wss={wss}"));
            assert_eq!(code, Some(0), "pti={pti} wss={wss}:\n{out}");
            let cr3 = if pti == "on" { 2 * N + 2 } else { 0 };
            assert_eq!(num(&r, "syscalls"), N + 1, "pti={pti} wss={wss}: {r:?}");
            assert_eq!(num(&r, "cr3_writes"), cr3, "pti={pti} wss={wss}: {r:?}");
            assert_eq!(num(&r, "page_faults"), 0, "pti={pti} wss={wss}: {r:?}");
            if wss != "0" {
                assert_eq!(r["touch_check"], "ok", "{r:?}");
            } else {
                assert!(!r.contains_key("touched"), "no working set, no keys: {r:?}");
            }
            seen.push((
                wss.to_string(),
                row_total(&v, "tlb_flush"),
                row_total(&v, "cr3_writes"),
                row_total(&v, "syscalls"),
                flush_allowance(&v),
            ));
        }
        let (_, flush0, cr3_0, sys0, allowed0) = seen[0].clone();
        for (wss, flush, cr3, sys, allowed) in &seen[1..] {
            assert_eq!((*cr3, *sys), (cr3_0, sys0), "pti={pti} wss={wss}");
            // KVM flushes once per flushing kernel->user switch here; flushes
            // of its own come on top when the host preempts the vCPU (the
            // cross-check's allowance, which counts the preemptions of each
            // run: a longer run on a busy host has more), but never one per
            // page of the working set (1M: 256 per call, 256,000 here).
            let bound = 40.0 + allowed + allowed0;
            assert!(
                (flush - flush0).abs() <= bound,
                "pti={pti} wss={wss}: KVM tlb_flush {flush} vs {flush0} without a working set \
                 (allowed {bound})"
            );
        }
    }
}

#[test]
fn poundsyscall_threads_each_read_the_working_set() {
    let Some(dir) = kvm_scratch_or_skip("poundsyscall working set", "wss-pound") else {
        return;
    };
    const N: u64 = 200;
    let pound = |pti: &str, threads: u64, extra: &str| {
        let cmdline = format!("threads={threads} {extra}");
        let (code, r, _, out) = run_json(
            &[
                "--pti",
                pti,
                "--workload",
                "poundsyscall",
                "--cpus",
                "2",
                "--iterations",
                &N.to_string(),
                "--cmdline",
                cmdline.trim(),
            ],
            &dir,
            "pound",
        );
        assert_eq!(code, Some(0), "pti={pti} {cmdline}:\n{out}");
        r
    };
    // (extra command line, reads per call)
    for (extra, touches) in [
        ("wss=64K stride=64 touches=100", 100),
        ("wss=1M", 256),
        ("wss=4M wss_pages=2m touches=7", 7),
    ] {
        // Three threads on two vCPUs: two share CPU 0 and take turns.
        let r = pound("on", 3, extra);
        assert_eq!(num(&r, "touches"), touches, "{extra}: {r:?}");
        assert_eq!(num(&r, "touched"), 3 * N * touches, "{extra}: {r:?}");
        assert_eq!(r["touch_check"], "ok", "{extra}: {r:?}");
        // The threads do not time their reads: no figure rather than 0.
        assert!(!r.contains_key("read_cycles"), "{extra}: {r:?}");
    }
    // One thread per vCPU: the exact counts are the same with a working set
    // as without one.
    for pti in ["on", "off"] {
        let plain = pound(pti, 2, "");
        let with = pound(pti, 2, "wss=1M");
        assert!(!plain.contains_key("touched"), "{plain:?}");
        assert_eq!(num(&with, "touched"), 2 * N * 256, "{with:?}");
        for key in ["syscalls", "cr3_entry", "cr3_exit", "page_faults"] {
            assert_eq!(
                num(&with, key),
                num(&plain, key),
                "pti={pti} {key}: {with:?} vs {plain:?}"
            );
        }
    }
}

/// The host-side allowance of the run's tlb_flush cross-check (KVM's own
/// flushes: a base, two per preemption of the vCPU, 1 %); 0 without one.
fn flush_allowance(v: &Value) -> f64 {
    v["cross_checks"]
        .as_array()
        .and_then(|c| c.iter().find(|x| x["host_metric"] == "tlb_flush"))
        .and_then(|x| x["host_excess_allowed"].as_f64())
        .unwrap_or(0.0)
}

#[test]
fn each_call_reads_the_kernel_working_set() {
    let Some(dir) = kvm_scratch_or_skip("kernel working set", "kwss") else {
        return;
    };
    const N: u64 = 300;
    // Kernel instructions per call (KVM's insn_emulation where kernel code
    // is emulated, else not reported) with and without PTI, per kwss.
    let mut insns: Vec<(u64, bool, Option<f64>)> = Vec::new();
    for (kwss, pages) in [(0u64, 0u64), (64 << 10, 16), (256 << 10, 64)] {
        for pti in ["off", "on"] {
            let extra = if kwss == 0 {
                String::new()
            } else {
                format!("kwss={kwss}")
            };
            let (code, r, v, out) = run_loop(&dir, "kwss", pti, "getppid", N, &extra);
            assert_eq!(code, Some(0), "kwss={kwss} pti={pti}:\n{out}");
            assert_eq!(num(&r, "syscalls"), N + 1, "{r:?}");
            let cr3 = if pti == "on" { 2 * N + 2 } else { 0 };
            assert_eq!(num(&r, "cr3_writes"), cr3, "{r:?}");
            assert_eq!(num(&r, "mismatches"), 0, "getppid still answers: {r:?}");
            if kwss > 0 {
                // Every call of the loop and the one before the phase.
                assert_eq!(num(&r, "kernel_touched"), (N + 1) * pages, "{r:?}");
            }
            let k = v["rows"]
                .as_array()
                .and_then(|rows| rows.iter().find(|r| r["name"] == "kernel_instructions"))
                .map(|_| row_per_call(&v, "kernel_instructions"));
            insns.push((kwss, pti == "on", k));
        }
    }
    if insns.iter().any(|(_, _, k)| k.is_none()) {
        ptiscope::test_support::skip(
            "each_call_reads_the_kernel_working_set",
            "this host's KVM reports no kernel_instructions row (no insn_emulation: kernel code \
             is not emulated), so the kernel instructions the reads add cannot be counted; \
             the exact syscall, CR3 and kernel_touched counts above were checked",
        );
    } else {
        let get = |kwss: u64, pti: bool| {
            insns
                .iter()
                .find(|(w, p, _)| *w == kwss && *p == pti)
                .and_then(|(_, _, k)| *k)
                .unwrap()
        };
        // The reads add kernel instructions: at least the load of each page
        // (the 48 pages between kwss=64K and 256K; the wrapper call itself
        // costs some more once per call)...
        let (k0, k16, k64) = (get(0, false), get(64 << 10, false), get(256 << 10, false));
        assert!(k16 > k0 + 16.0 && k64 - k16 >= 48.0, "{insns:?}");
        // ...and PTI adds the same to each call, with or without them.
        for kwss in [64 << 10, 256 << 10] {
            let d = get(kwss, true) - get(kwss, false);
            let d0 = get(0, true) - get(0, false);
            assert!((d - d0).abs() < 0.5, "PTI delta {d} at kwss={kwss} vs {d0}");
        }
    }
}

#[test]
fn bad_working_set_values_are_refused_before_boot() {
    for (extra, workload, what) in [
        ("wss=lots", "getpid", "not a size"),
        ("wss=2G", "getpid", "1 GiB"),
        ("wss=1M stride=0", "getpid", "multiple of 8"),
        ("wss=1M stride=12", "getpid", "multiple of 8"),
        ("wss=1M touches=x", "getpid", "reads per iteration"),
        ("wss=1M wss_pages=1g", "getpid", "4k|2m"),
        ("touches=10", "getpid", "wss=SIZE"),
        ("wss=1M", "sched-messaging", "syscall-loop workload"),
        ("wss=200M", "getpid", "--mem"),
        ("kwss=65M", "getpid", "kernel working set"),
        ("kwss=64K", "none", "syscall loop"),
        ("kwss=64K", "poundsyscall", "single-task syscall loop"),
    ] {
        assert_refused(
            &["run", "--workload", workload, "--cmdline", extra],
            64,
            &[what],
        );
    }
    // The same words in a compare side.
    let o = ptiscope()
        .args([
            "compare",
            "--runs",
            "1",
            "--baseline",
            "pti=off,cmdline=wss=1M stride=3",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
}

#[test]
fn the_i386_flavour_reads_its_working_set_under_qemu() {
    if !qemu_i386_or_skip("i386 working set") {
        return;
    }
    const N: u64 = 100;
    for (extra, touches) in [
        ("wss=256K stride=64 touches=300 entry=int80", 300),
        ("wss=4M wss_pages=2m entry=sysenter kwss=64K", 1024),
    ] {
        let o = run_i386_qemu(120)
            .args(["--pti", "on", "--workload", "getpid", "--iterations"])
            .arg(N.to_string())
            .args(["--cmdline", extra])
            .output()
            .unwrap();
        let out = stdout(&o) + &stderr(&o);
        assert_eq!(o.status.code(), Some(0), "{extra}:\n{out}");
        let r = result_line(&out);
        assert_eq!(num(&r, "touched"), N * touches, "{extra}: {r:?}");
        assert_eq!(r["touch_check"], "ok", "{extra}: {r:?}");
        assert_eq!(num(&r, "cr3_writes"), 2 * N + 2, "{extra}: {r:?}");
        if extra.contains("kwss=64K") {
            assert_eq!(num(&r, "kernel_touched"), (N + 1) * 16, "{r:?}");
        }
    }
    // poundsyscall: three threads on two CPUs, each reading the working set
    // before each getppid (the 32-bit worker keeps its state on the stack).
    for entry in ["sysenter", "int80"] {
        let extra = format!("threads=3 wss=64K stride=64 touches=100 entry={entry}");
        let o = ptiscope()
            .args(["run", "--arch", "i386", "--backend", "qemu", "--cpus", "2"])
            .args(["--timeout", "120", "--pti", "on"])
            .args(["--workload", "poundsyscall", "--iterations"])
            .arg(N.to_string())
            .args(["--cmdline", &extra])
            .output()
            .unwrap();
        let out = stdout(&o) + &stderr(&o);
        assert_eq!(o.status.code(), Some(0), "{extra}:\n{out}");
        let r = result_line(&out);
        assert_eq!(num(&r, "touched"), 3 * N * 100, "{extra}: {r:?}");
        assert_eq!(r["touch_check"], "ok", "{extra}: {r:?}");
    }
}
