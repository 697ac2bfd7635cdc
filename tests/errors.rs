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

/// No KVM device, or a file that is not one: 69, saying which.
#[test]
fn no_kvm_device_or_a_file_that_is_not_kvm() {
    for (device, want) in [
        ("/nonexistent/kvm", "KVM is not available on this host"),
        ("/dev/null", "is not a usable KVM device"),
    ] {
        let o = ptiscope()
            .env("PTISCOPE_KVM_DEVICE", device)
            .arg("run")
            .output()
            .unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(69), "{device}: {err}");
        assert!(err.contains(want), "{device}: {err}");
    }
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
            "`telemetry=` in --cmdline: the VMM owns it",
        ),
        // The guest would wait for CPUs the VMM never created (it made
        // one): the VMM's keys are refused in --cmdline, naming the option.
        (
            &["--cmdline", "cpus=2 threads=2", "--workload", "poundsyscall"][..],
            "`cpus=` in --cmdline: the VMM owns it (the guest starts the CPUs the VMM created); give --cpus N instead",
        ),
        (
            &["--cpus", "2", "--cmdline", "cpus=1"][..],
            "give --cpus N instead",
        ),
        (&["--cmdline", "rdcl_no=1"][..], "--cpu-vuln"),
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

/// A `--qemu-arg` that would replace what ptiscope gives QEMU (the image,
/// the command line, the initrd, memory, vCPUs, CPU, machine type or
/// accelerator, in any place of `-machine`'s list) or put a device on the
/// console's stdio, or that QEMU cannot read (`--machine=q35`), is refused before
/// QEMU starts, on every command that takes it, naming it; its text is
/// escaped in the message.
#[test]
fn qemu_args_that_override_ptiscope_are_refused_before_boot() {
    for qemu in [
        &["-kernel", "/boot/vmlinuz"][..],
        &["-append", "init=/bin/sh"],
        &["-initrd", "/tmp/x"],
        &["-m", "4G"],
        &["--smp", "2"],
        &["-serial", "mon:stdio"],
        &["-machine", "usb=off,type=q35"],
        &["-machine", "accel=tcg,type=q35"],
        &["-accel", "tcg,tb-size=64"],
        &["--machine=q35"],
        &["-monitor", "stdio"],
        &["-chardev", "stdio,id=x"],
        &["-nographic"],
        &["-M", "q35"],
        &["-machine", "pc\x1b[2J"],
        &["-daemonize"],
    ] {
        let words: Vec<String> = qemu.iter().map(|w| format!("--qemu-arg={w}")).collect();
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        for command in [&["run"][..], &["compare", "--runs", "1"], &["sweep"]] {
            let o = ptiscope()
                .args(command)
                .args(["--backend", "qemu"])
                .args(&words)
                .output()
                .unwrap();
            let err = stderr(&o);
            assert_eq!(o.status.code(), Some(64), "{command:?} {qemu:?}: {err}");
            assert!(err.contains("--qemu-arg"), "{command:?} {qemu:?}: {err}");
            assert!(!err.contains('\x1b'), "raw escape: {err}");
        }
    }
}

/// A Unix socket QEMU makes for a `--qemu-arg` (here its monitor) is gone
/// once the run ends, however it ended: the guest's own exit (QEMU then
/// exits without its cleanup) and the timeout (QEMU stopped).
#[test]
fn a_socket_qemu_makes_for_a_qemu_arg_is_removed_when_the_run_ends() {
    let test = "a_socket_qemu_makes_for_a_qemu_arg_is_removed_when_the_run_ends";
    if !qemu_or_skip(test, "qemu-system-x86_64") {
        return;
    }
    let dir = Scratch::new("qemu-socket");
    for (name, cmdline, timeout, code) in [
        ("exit", "workload=none", "60", 0),
        ("timeout", "fault=hang", "2", 124),
    ] {
        let sock = dir.join(format!("mon-{name}.sock"));
        let monitor = format!("--qemu-arg=unix:{},server=on,wait=off", sock.display());
        let (got, err) = run_within(
            &[
                "run",
                "--backend",
                "qemu",
                "--no-plugin",
                "--timeout",
                timeout,
                "--cmdline",
                cmdline,
                "--qemu-arg=-monitor",
                &monitor,
            ],
            HANG_SLACK * 7,
        );
        assert_eq!(got, Some(code), "{name}: {err}");
        assert!(!sock.exists(), "{name}: {} left behind", sock.display());
    }
}

/// Text from the user (a `--linux` or `--kernel` path) reaches the
/// terminal escaped in error messages, as the guest's console does.
#[test]
fn user_text_in_error_messages_is_escaped() {
    let bad = "/nonexistent/\x1b]0;owned\x07\x1b[31mkernel";
    for args in [
        &["run", "--backend", "qemu", "--linux", bad][..],
        &["run", "--kernel", bad],
        &[
            "compare",
            "--runs",
            "1",
            "--backend",
            "qemu",
            "--linux",
            bad,
        ],
    ] {
        let o = ptiscope().args(args).output().unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(66), "{args:?}: {err}");
        assert!(
            !err.contains('\x1b') && !err.contains('\x07'),
            "{args:?}: {err}"
        );
        assert!(err.contains("\\x1b]0;owned"), "{args:?}: {err}");
    }
    // Every command that names a path it could not use, whatever its
    // option: each refuses before booting anything.
    for (args, code) in [
        (&["pagetables", "--kernel", bad][..], 66),
        (&["sweep", "--kernel", bad], 66),
        (&["compare", "--runs", "1", "--against", bad], 64),
        (&["compare", "--runs", "1", "--kernel", bad], 66),
        (&["run", "--json", bad], 73),
        (&["compare", "--runs", "1", "--json", bad], 73),
    ] {
        let o = ptiscope().args(args).output().unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert!(
            !err.contains('\x1b') && !err.contains('\x07'),
            "{args:?}: {err}"
        );
        assert!(err.contains("\\x1b]0;owned"), "{args:?}: {err}");
    }
}

#[test]
fn a_qemu_that_fails_to_start_is_not_a_guest_success() {
    if !plugin_or_skip("qemu start failure", "qemu-system-x86_64") {
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
    // int3 reaches the kernel on every x86 KVM; another entry this host
    // delivers (`probe --json`), where there is one, is not what `auto`
    // would pick, so the run's config shows whose choice it ran.
    let probe = probe_json();
    let auto = probe["environment"]["probe"]["entry_auto"]
        .as_str()
        .unwrap();
    let other = probe["environment"]["probe"]["entries_working"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e.as_str())
        .find(|e| *e != auto);
    let dir = Scratch::new("cmdline-entry");
    for entry in std::iter::once("int3").chain(other) {
        let cmdline = format!("entry={entry}");
        let (o, v) = output_and_json(
            ptiscope().arg("run").args([
                "--cmdline",
                &cmdline,
                "--workload",
                "getpid",
                "--iterations",
                "10",
            ]),
            &dir,
            entry,
        );
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(0), "{err}");
        // The run's configuration has the one entry asked for, once.
        let entries: Vec<&str> = v["config"]
            .as_array()
            .unwrap_or_else(|| panic!("{cmdline}: no config in {v}"))
            .iter()
            .filter_map(|w| w.as_str())
            .filter(|w| w.starts_with("entry="))
            .collect();
        assert_eq!(entries, [cmdline.as_str()], "{v}");
    }
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

/// `--kernel /dev/zero` used to read until memory ran out (the size cap
/// looked at the file's metadata, 0 for a device): devices are refused.
#[test]
fn a_device_as_kernel_is_refused_at_once() {
    let (code, err) = run_within(
        &["run", "--kernel", "/dev/zero"],
        std::time::Duration::from_secs(10),
    );
    assert_eq!(code, Some(66), "{err}");
    assert!(
        err.contains("/dev/zero") && err.contains("is a character device, not a regular file"),
        "{err}"
    );
}

/// A FIFO with no writer used to block the open for ever (termination
/// signals are blocked during a run): it is opened without blocking and
/// refused.
#[test]
fn a_fifo_as_kernel_is_refused_without_waiting_for_a_writer() {
    let fifo = scratch("fifo-kernel").join("kernel.fifo");
    let _ = std::fs::remove_file(&fifo);
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (code, err) = run_within(
        &["run", "--kernel", fifo.to_str().unwrap()],
        std::time::Duration::from_secs(10),
    );
    assert_eq!(code, Some(66), "{err}");
    assert!(err.contains("is a FIFO"), "{err}");
    let _ = std::fs::remove_file(&fifo);
}

/// A PVH entry outside every loaded segment is refused before anything
/// boots, for ELF64 and ELF32 images and for both backends (QEMU used to be
/// started with it, and aborted).
#[test]
fn an_entry_point_outside_every_segment_is_refused_for_every_image_and_backend() {
    let dir = scratch("entry-outside");
    let elf64 = dir.join("entry64.elf");
    let elf32 = dir.join("entry32.elf");
    write_pvh_elf(&elf64, 0x10_0000, &[0xf4]);
    write_pvh_elf32(&elf32, 0x10_0000, &[0xf4]);
    for path in [&elf64, &elf32] {
        // The PVH note's descriptor (the entry) is at 0x190 in both helpers'
        // images; the segment is 0x100000..0x101000.
        let mut bytes = std::fs::read(path).unwrap();
        bytes[0x190..0x194].copy_from_slice(&0x50_0000u32.to_le_bytes());
        std::fs::write(path, bytes).unwrap();
        for backend in ["kvm", "qemu"] {
            let (code, err) = run(&[
                "--backend",
                backend,
                "--mem",
                "16",
                "--kernel",
                path.to_str().unwrap(),
            ]);
            assert_eq!(code, Some(65), "{backend} {}: {err}", path.display());
            assert!(
                err.contains("PVH entry 0x500000 is not inside a loaded segment"),
                "{backend} {}: {err}",
                path.display()
            );
            assert!(!err.contains("QEMU"), "QEMU was not started: {err}");
        }
    }
}

/// The smaller cases of issue 18: each exits with the code docs/running.md
/// gives and says what to do.
#[test]
fn smaller_bad_inputs_exit_as_documented() {
    // A --fail-if threshold that underflows is refused, not turned into 0.
    let o = ptiscope()
        .args(["compare", "--fail-if", "ns_per_call>1e-400"])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(64), "{err}");
    assert!(err.contains("below the smallest normal f64"), "{err}");
    // The i386 guest's working-set advice does not point above its 768 MiB.
    let o = ptiscope()
        .args([
            "run",
            "--arch",
            "i386",
            "--mem",
            "768",
            "--workload",
            "getpid",
        ])
        .args(["--cmdline", "wss=1008M"])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(64), "{err}");
    assert!(err.contains("a 32-bit guest has at most 768 MiB"), "{err}");
    assert!(!err.contains("up to 1024"), "{err}");
    let o = ptiscope()
        .args([
            "run",
            "--mem",
            "512",
            "--workload",
            "getpid",
            "--cmdline",
            "wss=600M",
        ])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(64), "{err}");
    assert!(
        err.contains("raise --mem (to 608 or more, up to 1024)"),
        "{err}"
    );
    // --cpus outside 1..=8 is a usage error (64).
    let o = ptiscope().args(["run", "--cpus", "9"]).output().unwrap();
    assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
}

/// More vCPUs than this host's KVM recommends is a host limit: 69, naming
/// the count to use (docs/running.md, `--cpus`).
#[test]
fn more_vcpus_than_kvm_recommends_is_a_host_limit() {
    if !kvm_or_skip("more_vcpus_than_kvm_recommends_is_a_host_limit") {
        return;
    }
    // What this KVM recommends, from `probe --json`: the decision to
    // refuse is the exit status, the message's contract the count to use.
    let recommended = probe_json()["host"]["recommended_vcpus"]
        .as_u64()
        .expect("probe --json: host.recommended_vcpus");
    if recommended >= 8 {
        ptiscope::test_support::skip(
            "more_vcpus_than_kvm_recommends_is_a_host_limit",
            &format!("this host's KVM recommends {recommended} vCPUs"),
        );
        return;
    }
    let o = ptiscope()
        .args(["run", "--cpus", "8", "--timeout", "5"])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(69), "{err}");
    assert!(
        err.contains(&format!("use --cpus {recommended} or fewer")),
        "{err}"
    );
}

/// An argument QEMU refuses ends the run with 81 and QEMU's own message.
#[test]
fn a_qemu_argument_qemu_refuses_is_81_with_its_message() {
    let test = "a_qemu_argument_qemu_refuses_is_81_with_its_message";
    if !plugin_or_skip(test, "qemu-system-x86_64") {
        return;
    }
    let o = ptiscope()
        .args(["run", "--backend", "qemu", "--qemu-arg=--bogus"])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(81), "{err}");
    assert!(
        err.contains("before the guest reported a status") && err.contains("--bogus"),
        "{err}"
    );
}

/// A bzImage header the VMM checks field by field: exit 65 naming the field.
#[test]
fn bzimage_the_vmm_cannot_boot() {
    let dir = scratch("badbz");
    let bz = |xloadflags: u16, setup_sects: u8| {
        let mut b = vec![0u8; 4096];
        b[0x1f1] = setup_sects;
        b[0x1fe] = 0x55;
        b[0x1ff] = 0xaa;
        b[0x202..0x206].copy_from_slice(b"HdrS");
        b[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
        b[0x211] = 1; // LOADED_HIGH
        b[0x236..0x238].copy_from_slice(&xloadflags.to_le_bytes());
        b[0x238..0x23c].copy_from_slice(&2047u32.to_le_bytes());
        // 1024 bytes of setup (with setup_sects 1), 3072 of kernel.
        b[0x1f4..0x1f8].copy_from_slice(&(3072u32 / 16).to_le_bytes());
        b[0x24c..0x250].copy_from_slice(&64u32.to_le_bytes());
        b
    };
    let cut = |len: usize| bz(1, 1)[..len].to_vec();
    for (name, image, what) in [
        ("setup", bz(1, 100), "setup_sects 100"),
        ("setup-past", bz(1, 10), "truncated"),
        ("cut-header", cut(0x220), "truncated"),
        ("cut-setup", cut(1000), "truncated"),
        ("cut-kernel", cut(4095), "truncated"),
    ] {
        let f = dir.join(name);
        std::fs::write(&f, image).unwrap();
        // Both backends refuse it before anything boots (no QEMU started).
        for backend in ["kvm", "qemu"] {
            let (code, err) = run(&["--backend", backend, "--kernel", f.to_str().unwrap()]);
            assert_eq!(code, Some(65), "{name} {backend}: {err}");
            assert!(err.contains(what), "{name} {backend}: {err}");
            assert!(!err.contains("KVM_EXIT"), "{name} {backend}: {err}");
        }
    }
}

/// `ptiscope compare | head -1`: once the reader is gone, the next line
/// ends the process quietly with 141, as SIGPIPE ends other tools (not
/// Rust's panic and backtrace from `println!`); likewise for stderr.
#[test]
fn a_closed_stdout_or_stderr_ends_the_process_quietly_with_141() {
    use std::io::BufRead;
    use std::process::Stdio;
    if !kvm_or_skip("closed stdout") {
        return;
    }
    // Runs of a second each: the table comes long after the header.
    let mut child = ptiscope()
        .args(["compare", "--runs", "1", "--iterations", "20000"])
        .env("RUST_BACKTRACE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("ptiscope compare"), "{first}");
    // The reader is dropped here, as head's end closes the pipe.
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(141), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    // stderr closed before the run writes its summary there.
    let mut child = ptiscope()
        .args(["run", "--workload", "getpid", "--iterations", "1000"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stderr.take());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(141));
}
