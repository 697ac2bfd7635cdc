//! Boots real guests under KVM through the `ptiscope` binary.
//!
//! Most runs here end in a failure (a fault, a timeout, a halt, a signal,
//! a triple fault), and a failed run writes no `--json` document (the
//! summary on stderr is all it leaves): the decision is read from the exit
//! status, and the text checked is the report's message naming what went
//! wrong. The per-kind user-space exit counts (`hlt 1`, `unknown 2000`)
//! are in no document at all, so they are read from the summary line.

mod common;

use std::time::{Duration, Instant};

use common::*;

#[test]
fn embedded_guest_boots_prints_banner_and_exits_0() {
    let Some(o) = kvm_run_or_skip("embedded_guest_boots", &["--timeout", "20"]) else {
        return;
    };
    let (out, err) = (stdout(&o), stderr(&o));
    assert!(
        out.lines()
            .next()
            .unwrap_or("")
            .starts_with(ptiscope_abi::BANNER_PREFIX),
        "first console line is not the banner:\n{out}\n{err}"
    );
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    assert!(
        err.contains("guest exited with status 0 (success)"),
        "{err}"
    );
    // The per-kind exit counts are the summary's alone (the run document
    // has the phase's `vmm_exits` total, not the kinds).
    assert!(
        err.contains("port out: serial"),
        "summary has exit counts: {err}"
    );
}

#[test]
fn guest_fault_is_reported_with_its_vector() {
    let args = ["--cmdline", "fault=pf", "--timeout", "20"];
    let Some(o) = kvm_run_or_skip("guest_fault_is_reported", &args) else {
        return;
    };
    let err = stderr(&o);
    assert_eq!(
        o.status.code(),
        Some(ptiscope_abi::exit_status::EXCEPTION as i32),
        "{err}"
    );
    // The VMM relays the guest's @fault line; its fields are read as
    // fields.
    let relayed: String = err
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("guest reported: "))
        .map(|l| format!("{l}\n"))
        .collect();
    let f = machine_line(&relayed, "@fault");
    assert_eq!(
        (f["vector"].as_str(), f["name"].as_str()),
        ("14", "#PF"),
        "{err}"
    );
}

fn assert_times_out(fault: &str) {
    let start = Instant::now();
    let o = ptiscope()
        .args(["run", "--cmdline", fault, "--timeout", "0.7"])
        .output()
        .unwrap();
    let took = start.elapsed();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(124), "{fault}: {err}");
    assert!(err.contains("timeout"), "{err}");
    assert!(
        took >= Duration::from_millis(700) && took < Duration::from_secs(5),
        "{fault}: took {took:?}"
    );
}

#[test]
fn timeout_stops_a_guest_spinning_with_interrupts_off() {
    if kvm_or_skip("timeout_spinning") {
        assert_times_out("fault=hang");
    }
}

#[test]
fn timeout_stops_a_guest_halted_for_ever() {
    if kvm_or_skip("timeout_halted") {
        assert_times_out("fault=halt");
    }
}

#[test]
fn without_the_irqchip_a_halt_reaches_the_vmm_and_stops_the_run() {
    let start = Instant::now();
    let args = ["--no-irqchip", "--timeout", "20", "--cmdline", "fault=halt"];
    let Some(o) = kvm_run_or_skip("no_irqchip_halt", &args) else {
        return;
    };
    let err = stderr(&o);
    // KVM_EXIT_HLT: nothing can wake the guest, so no timeout is needed.
    assert_eq!(o.status.code(), Some(81), "{err}");
    assert!(err.contains("halted with nothing to wake it"), "{err}");
    assert!(err.contains("hlt 1"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn sigterm_stops_the_vm_cleanly() {
    if !kvm_or_skip("sigterm") {
        return;
    }
    let child = ptiscope()
        .args(["run", "--cmdline", "fault=hang", "--timeout", "20"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let start = Instant::now();
    let o = child.wait_with_output().unwrap();
    // Well before its --timeout 20: the signal ended it.
    assert!(start.elapsed() < HANG_SLACK);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(143), "{err}");
    assert!(err.contains("stopped by SIGTERM"), "{err}");
}

#[test]
fn serial_out_writes_the_console_to_a_file() {
    let dir = Scratch::new("serial");
    let file = dir.join("console.txt");
    let args = ["--timeout", "20", "--serial-out", file.to_str().unwrap()];
    let Some(o) = kvm_run_or_skip("serial_out", &args) else {
        return;
    };
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!stdout(&o).contains(ptiscope_abi::BANNER_PREFIX));
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.starts_with(ptiscope_abi::BANNER_PREFIX), "{text}");
}

#[test]
fn triple_fault_is_reported_with_registers() {
    // ud2 with no IDT (IDTR base 0 over zeroed memory): #UD, #GP, #DF, shutdown.
    let Some(o) = kvm_run_code_or_skip("triple_fault", false, &[0x0f, 0x0b], "5") else {
        return;
    };
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(80), "{err}");
    assert!(err.contains("triple fault (KVM_EXIT_SHUTDOWN)"), "{err}");
    if shutdown_resets_the_vcpu() {
        // SVM: the report says the registers are lost, never presents
        // the reset state as the fault's.
        assert!(err.contains("the faulting registers are lost"), "{err}");
        assert!(!err.contains("cr0=0x11"), "{err}");
    } else {
        assert!(
            err.contains("cr0=0x11") && err.contains("efer=0x0"),
            "{err}"
        );
    }
}

/// True where KVM resets the vCPU before it reports a triple fault (AMD
/// SVM: the VMCB is undefined after a SHUTDOWN intercept, kvm_amd
/// reinitialises it), so no faulting registers can be reported; kvm_pvm
/// and kvm_intel keep them.
fn shutdown_resets_the_vcpu() -> bool {
    std::path::Path::new("/sys/module/kvm_amd").exists()
}

#[test]
fn unknown_port_flood_is_logged_once_and_not_fatal() {
    // mov ecx, 2000; 1: out 0x80, al; dec ecx; jnz 1b; mov eax, 7; out 0xf4, eax; hlt
    let code = [
        0xb9, 0xd0, 0x07, 0x00, 0x00, 0xe6, 0x80, 0x49, 0x75, 0xfb, 0xb8, 0x07, 0x00, 0x00, 0x00,
        0xe7, 0xf4, 0xf4,
    ];
    let Some(o) = kvm_run_code_or_skip("unknown_port_flood", false, &code, "10") else {
        return;
    };
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(7), "{err}");
    assert_eq!(err.matches("unknown address 0x80").count(), 1, "{err}");
    assert!(err.contains("unknown 2000"), "counted per exit: {err}");
}

#[test]
fn kvm_internal_error_or_triple_fault_is_reported() {
    // int3 at CPL0: kvm_pvm's emulator gives up (KVM_EXIT_INTERNAL_ERROR with
    // the instruction bytes); hardware KVM delivers #BP and triple-faults.
    let Some(o) = kvm_run_code_or_skip("internal_error", false, &[0xcc], "5") else {
        return;
    };
    let err = stderr(&o);
    match o.status.code() {
        Some(81) => assert!(err.contains("KVM_EXIT_INTERNAL_ERROR"), "{err}"),
        Some(80) => assert!(err.contains("KVM_EXIT_SHUTDOWN"), "{err}"),
        c => panic!("exit {c:?}: {err}"),
    }
    if o.status.code() == Some(80) && shutdown_resets_the_vcpu() {
        assert!(err.contains("the faulting registers are lost"), "{err}");
    } else {
        assert!(err.contains("rip=0x100000"), "{err}");
    }
}
