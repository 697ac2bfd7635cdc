//! Boots real guests under KVM through the `ptiscope` binary.
//!
//! Most runs here end in a failure (a fault, a timeout, a halt, a signal,
//! a triple fault); each still writes its `--json` document, and how it
//! ended (`stop`: a code and its parameters, the registers, the guest's
//! `@fault` fields; `exit_code`) and the per-kind user-space exit counts
//! (`vmm_exits_by_kind`) are read there, beside the process's exit status.
//! Text is read only where the words are the point (a message logged once,
//! what the report says of registers it cannot have).

mod common;

use std::time::{Duration, Instant};

use common::*;

#[test]
fn embedded_guest_boots_prints_banner_and_exits_0() {
    let Some((o, v)) = kvm_run_json_or_skip("embedded_guest_boots", &["--timeout", "20"]) else {
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
    let stop = stop_of(&v);
    assert_eq!(
        (&stop["code"], &stop["status"]),
        (&"guest_exit".into(), &0.into()),
        "{stop}"
    );
    assert_eq!(v["exit_code"], 0);
    // The banner went out through the serial port: counted per device.
    assert!(
        v["vmm_exits_by_kind"]["io_out"]["serial"].as_u64() > Some(0),
        "{}",
        v["vmm_exits_by_kind"]
    );
}

#[test]
fn guest_fault_is_reported_with_its_vector() {
    let args = ["--cmdline", "fault=pf", "--timeout", "20"];
    let Some((o, v)) = kvm_run_json_or_skip("guest_fault_is_reported", &args) else {
        return;
    };
    let err = stderr(&o);
    let exception = ptiscope_abi::exit_status::EXCEPTION;
    assert_eq!(o.status.code(), Some(exception as i32), "{err}");
    // The guest's own exit status, and its @fault line's fields.
    let stop = stop_of(&v);
    assert_eq!(
        (&stop["code"], &stop["status"]),
        (&"guest_exit".into(), &exception.into()),
        "{stop}"
    );
    let f = &stop["guest_faults"][0];
    assert_eq!(
        (&f["vector"], &f["name"]),
        (&"14".into(), &"#PF".into()),
        "{stop}"
    );
}

fn assert_times_out(fault: &str) {
    let dir = Scratch::new(&format!("timeout-{fault}").replace('=', "-"));
    let start = Instant::now();
    let (o, v) = output_and_json(
        ptiscope().args(["run", "--cmdline", fault, "--timeout", "0.7"]),
        &dir,
        "run",
    );
    let took = start.elapsed();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(124), "{fault}: {err}");
    let stop = stop_of(&v);
    assert_eq!(
        (&stop["code"], &stop["after_ms"]),
        (&"timeout".into(), &700.into()),
        "{stop}"
    );
    assert_eq!(v["exit_code"], 124);
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
    let Some((o, v)) = kvm_run_json_or_skip("no_irqchip_halt", &args) else {
        return;
    };
    let err = stderr(&o);
    // KVM_EXIT_HLT: nothing can wake the guest, so no timeout is needed.
    assert_eq!(o.status.code(), Some(81), "{err}");
    assert_eq!(stop_of(&v)["code"], "halted", "{v}");
    assert_eq!(
        v["vmm_exits_by_kind"]["hlt"], 1,
        "{}",
        v["vmm_exits_by_kind"]
    );
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn sigterm_stops_the_vm_cleanly() {
    let Some(dir) = kvm_scratch_or_skip("sigterm", "sigterm") else {
        return;
    };
    let json = dir.join("run.json");
    let child = ptiscope()
        .args([
            "run",
            "--cmdline",
            "fault=hang",
            "--timeout",
            "20",
            "--json",
        ])
        .arg(&json)
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
    let v = read_json(&json);
    let stop = stop_of(&v);
    assert_eq!(
        (&stop["code"], &stop["signal"]),
        (&"signal".into(), &libc::SIGTERM.into()),
        "{stop}"
    );
    assert_eq!(v["exit_code"], 143);
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
    let Some((o, v)) = kvm_run_code_json_or_skip("triple_fault", false, &[0x0f, 0x0b], "5") else {
        return;
    };
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(80), "{err}");
    let stop = stop_of(&v);
    assert_eq!(stop["code"], "shutdown", "{stop}");
    let regs = &stop["regs"];
    if shutdown_resets_the_vcpu() {
        // SVM: the registers are the reset state, and the report's words
        // say the faulting ones are lost, never presenting the reset state
        // as the fault's.
        assert_eq!(
            (&regs["rip"], &regs["cs"]),
            (&0xfff0.into(), &0xf000.into()),
            "{stop}"
        );
        let text = stop["text"].as_str().unwrap_or_default();
        assert!(text.contains("the faulting registers are lost"), "{text}");
        assert!(!text.contains("cr0=0x11"), "{text}");
    } else {
        assert_eq!(
            (&regs["cr0"], &regs["efer"]),
            (&0x11.into(), &0.into()),
            "{stop}"
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
    let Some((o, v)) = kvm_run_code_json_or_skip("unknown_port_flood", false, &code, "10") else {
        return;
    };
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(7), "{err}");
    assert_eq!(stop_of(&v)["status"], 7, "{v}");
    // Logged once (the words on stderr are the point), counted per exit.
    assert_eq!(err.matches("unknown address 0x80").count(), 1, "{err}");
    assert_eq!(
        v["vmm_exits_by_kind"]["io_out"]["unknown"], 2000,
        "{}",
        v["vmm_exits_by_kind"]
    );
}

#[test]
fn kvm_internal_error_or_triple_fault_is_reported() {
    // int3 at CPL0: kvm_pvm's emulator gives up (KVM_EXIT_INTERNAL_ERROR with
    // the instruction bytes); hardware KVM delivers #BP and triple-faults.
    let Some((o, v)) = kvm_run_code_json_or_skip("internal_error", false, &[0xcc], "5") else {
        return;
    };
    let err = stderr(&o);
    let stop = stop_of(&v);
    match o.status.code() {
        Some(81) => assert_eq!(stop["code"], "internal_error", "{stop}"),
        Some(80) => assert_eq!(stop["code"], "shutdown", "{stop}"),
        c => panic!("exit {c:?}: {err}"),
    }
    assert_eq!(v["exit_code"], o.status.code().unwrap_or(-1));
    if o.status.code() == Some(80) && shutdown_resets_the_vcpu() {
        assert_eq!(stop["regs"]["rip"], 0xfff0, "{stop}");
    } else {
        assert_eq!(stop["regs"]["rip"], 0x100000, "{stop}");
    }
}
