//! Bad input gets a clear message, its documented exit code, and no panic.

mod common;

use common::*;

fn run(args: &[&str]) -> (Option<i32>, String) {
    let o = ptiscope().arg("run").args(args).output().unwrap();
    let err = stderr(&o);
    assert!(!err.contains("panicked"), "{err}");
    (o.status.code(), err)
}

#[test]
fn missing_kernel() {
    let (code, err) = run(&["--kernel", "/nonexistent/ptiscope-kernel"]);
    assert_eq!(code, Some(66), "{err}");
    assert!(
        err.contains("cannot read kernel image") && err.contains("No such file"),
        "{err}"
    );
}

#[test]
fn kernel_that_is_not_an_elf() {
    let f = scratch("notelf").join("kernel.txt");
    std::fs::write(&f, "#!/bin/sh\necho hi\n").unwrap();
    let (code, err) = run(&["--kernel", f.to_str().unwrap()]);
    assert_eq!(code, Some(65), "{err}");
    assert!(err.contains("is not an ELF file"), "{err}");
}

#[test]
fn elf_without_pvh_note() {
    // The test binary itself is an ELF64 without a PVH note.
    let me = std::env::current_exe().unwrap();
    let (code, err) = run(&["--kernel", me.to_str().unwrap()]);
    assert_eq!(code, Some(65), "{err}");
    assert!(err.contains("has no PVH entry note"), "{err}");
}

#[test]
fn segment_outside_guest_memory() {
    let f = scratch("outside").join("high.elf");
    write_pvh_elf(&f, 0x200_0000, &[0xf4]);
    let (code, err) = run(&["--mem", "16", "--kernel", f.to_str().unwrap()]);
    assert_eq!(code, Some(65), "{err}");
    assert!(err.contains("lies outside usable guest RAM"), "{err}");
}

#[test]
fn bad_memory_sizes_name_the_bound() {
    for (v, needle) in [
        ("lots", "is not a number of MiB"),
        ("15", "at least 16 MiB"),
        ("1025", "at most 1024 MiB"),
        // Not "unexpected argument": a negative size is a bad --mem value.
        ("-1", "--mem -1 MiB is negative: at least 16 MiB"),
    ] {
        let (code, err) = run(&["--mem", v]);
        assert_eq!(code, Some(64), "{v}: {err}");
        assert!(err.contains(needle), "{v}: {err}");
    }
}

#[test]
fn bad_option_values() {
    for (k, v) in [("--pti", "maybe"), ("--pcid", "yes"), ("--entry", "int81")] {
        let (code, err) = run(&[k, v]);
        assert_eq!(code, Some(64), "{k} {v}: {err}");
        assert!(err.contains("possible values"), "{err}");
    }
}

#[test]
fn command_line_too_long() {
    let long = "x".repeat(5000);
    let (code, err) = run(&["--cmdline", &long]);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("at most 4095 fit"), "{err}");
}

#[test]
fn no_kvm_device() {
    let o = ptiscope()
        .env("PTISCOPE_KVM_DEVICE", "/nonexistent/kvm")
        .arg("run")
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(69), "{err}");
    assert!(err.contains("KVM is not available on this host"), "{err}");
}

#[test]
fn a_file_that_is_not_kvm() {
    let o = ptiscope()
        .env("PTISCOPE_KVM_DEVICE", "/dev/null")
        .arg("run")
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(69), "{err}");
    assert!(err.contains("is not a usable KVM device"), "{err}");
}

#[test]
fn unknown_workloads_and_repeated_keys_are_refused_before_boot() {
    for (args, needle) in [
        (
            &["--workload", "bogus"][..],
            "possible values: none, getpid",
        ),
        (
            &["--pti", "on", "--cmdline", "pti=off"][..],
            "`pti=` is given twice",
        ),
        (
            &["--cmdline", "telemetry=0x1000"][..],
            "telemetry= is always the VMM's",
        ),
        (
            &["--cmdline", "workload=bogus"][..],
            "expected one of none|getpid",
        ),
        (
            &["--iterations", "4294967297", "--workload", "getpid"][..],
            "at most 4294967296",
        ),
        (&["--cmdline", "fault=pf\u{1b}[2J"][..], "printable ASCII"),
    ] {
        let (code, err) = run(args);
        assert_eq!(code, Some(64), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn options_of_the_other_backend_are_refused() {
    for (args, needle) in [
        (
            &["--backend", "qemu", "--metrics-interval", "10"][..],
            "--metrics-interval",
        ),
        (
            &["--backend", "qemu", "--cpu-vuln", "none"][..],
            "--cpu-vuln",
        ),
        (&["--backend", "qemu", "--no-irqchip"][..], "--no-irqchip"),
        (&["--qemu-arg=-S"][..], "--qemu-arg needs --backend qemu"),
    ] {
        let (code, err) = run(args);
        assert_eq!(code, Some(64), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn a_qemu_that_fails_to_start_is_not_a_guest_success() {
    if std::process::Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .is_err()
    {
        ptiscope::test_support::skip("qemu start failure", "qemu-system-x86_64 is not installed");
        return;
    }
    // QEMU exits 1 on a bad option: the same code as a guest's status 0
    // through isa-debug-exit, which must not be mistaken for it.
    let (code, err) = run(&["--backend", "qemu", "--qemu-arg=-no-such-option"]);
    assert_eq!(code, Some(81), "{err}");
    assert!(
        err.contains("QEMU failed") && err.contains("invalid option"),
        "{err}"
    );
}

#[test]
fn timeouts_below_a_millisecond_are_refused_not_zero() {
    for v in ["1e-9", "0.0001", "-3", "NaN", "inf"] {
        let (code, err) = run(&["--timeout", v]);
        assert_eq!(code, Some(64), "{v}: {err}");
        assert!(
            err.contains("--timeout") && err.contains("from 0.001 (1 ms) to 86400 seconds"),
            "{v}: {err}"
        );
    }
}

#[test]
fn compare_without_a_measuring_workload_is_a_usage_error() {
    for args in [
        &["--workload", "none"][..],
        &["--compare", "pti=on,workload=none"][..],
    ] {
        let o = ptiscope()
            .arg("compare")
            .args(["--runs", "1"])
            .args(args)
            .output()
            .unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(64), "{args:?}: {err}");
        assert!(
            err.contains("workload none only boots the guest and measures nothing")
                && err.contains("getpid"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("run 1"), "refused before any run: {err}");
    }
}

#[test]
fn an_entry_in_cmdline_is_the_entry_not_a_repeated_key() {
    if !kvm_or_skip("cmdline entry") {
        return;
    }
    // int3 reaches the kernel on every x86 KVM.
    let (code, err) = run(&[
        "--cmdline",
        "entry=int3",
        "--workload",
        "getpid",
        "--iterations",
        "10",
    ]);
    assert_eq!(code, Some(0), "{err}");
    // SYSCALL runs where the host delivers it, and is refused by name (69)
    // where it does not (kvm_pvm): never "given twice".
    let (code, err) = run(&[
        "--cmdline",
        "entry=syscall",
        "--workload",
        "getpid",
        "--iterations",
        "10",
    ]);
    assert!(!err.contains("given twice"), "{err}");
    match code {
        Some(0) => {}
        Some(69) => assert!(err.contains("--entry syscall"), "{err}"),
        c => panic!("exit {c:?}: {err}"),
    }
}
