//! The 32-bit (i386 PAE) flavour under our VMM: ELF32 images load, and on
//! a host whose KVM refuses 32-bit paging (kvm_pvm) the
//! VMM says so plainly before the guest runs, with a nonzero exit and no hang.

mod common;

use common::*;

#[test]
fn an_elf32_pvh_image_boots_or_is_refused_with_the_host_limitation_named() {
    // xor eax, eax; out 0xf4, eax; cli; hlt
    let code = [0x31, 0xc0, 0xe7, 0xf4, 0xfa, 0xf4];
    let Some(o) = kvm_run_code_or_skip("ELF32 boot or refusal", true, &code, "5") else {
        return;
    };
    let err = stderr(&o);
    // The decision is the exit status, against what `probe --json` found:
    // 69 (EX_UNAVAILABLE) is the host's KVM refusing before the boot. The
    // message's one contract is that it names what to do instead.
    if host_pae_paging_works() {
        assert_eq!(o.status.code(), Some(0), "{err}");
    } else {
        assert_eq!(o.status.code(), Some(69), "{err}");
        assert!(err.contains("--backend qemu"), "{err}");
    }
}

/// Runs the embedded i386 guest under QEMU TCG (`--backend qemu`) with
/// `--json`: (exit code, console and summary, the run document: `null`
/// for a failed run), or `None` (with the reason printed) where
/// qemu-system-i386 is missing.
fn i386_qemu(args: &[&str]) -> Option<(Option<i32>, String, serde_json::Value)> {
    if !qemu_i386_or_skip("i386 under QEMU") {
        return None;
    }
    // One directory per run: the tests of this binary run side by side.
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = Scratch::new(&format!("i386-qemu-{n}"));
    let (o, v) = output_and_json(run_i386_qemu(60).args(args), &dir, "run");
    Some((o.status.code(), stdout(&o) + &stderr(&o), v))
}

/// Asserts that the run document `v` is of the embedded i386 guest (what
/// `--arch i386` chose), not the x86_64 one.
fn assert_i386_image(v: &serde_json::Value) {
    assert_eq!(guest_image(v), ("embedded i386", true), "{v}");
}

#[test]
fn the_embedded_i386_guest_is_refused_here_or_boots_under_kvm() {
    let args = ["--arch", "i386", "--timeout", "20"];
    let Some(o) = kvm_run_or_skip("embedded i386 guest under KVM", &args) else {
        return;
    };
    if host_pae_paging_works() {
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert!(stdout(&o).contains("ptiscope guest i386"));
    } else {
        // Refused before the boot (69, EX_UNAVAILABLE): no guest output.
        assert_eq!(o.status.code(), Some(69), "{}", stderr(&o));
        assert!(
            !stdout(&o).contains("ptiscope guest"),
            "refused, yet the guest ran: {}",
            stdout(&o)
        );
    }
}

#[test]
fn i386_getpid_costs_two_cr3_writes_per_call_with_pti_and_none_without_on_both_entries() {
    const N: u64 = 200;
    for entry in ["sysenter", "int80"] {
        for pti in ["on", "off"] {
            let what = format!("{entry} pti={pti}");
            let n = N.to_string();
            let Some((code, out, v)) = i386_qemu(&[
                "--pti",
                pti,
                "--entry",
                entry,
                "--workload",
                "getpid",
                "--iterations",
                &n,
            ]) else {
                return;
            };
            assert_eq!(code, Some(0), "{what}:\n{out}");
            assert_i386_image(&v);
            // The configuration the VMM gave the guest, and what the
            // plugin saw it execute: every call (and the phase marker's)
            // through the asked entry, none through the other.
            assert!(config_has(&v, &format!("entry={entry}")), "{what}: {v}");
            assert!(config_has(&v, &format!("pti={pti}")), "{what}: {v}");
            let (asked, other) = if entry == "sysenter" {
                ("insn_sysenter", "insn_int")
            } else {
                ("insn_int", "insn_sysenter")
            };
            let calls = (N + 1) as f64;
            assert_eq!(row_total(&v, asked), calls, "{what}: {v}");
            assert_eq!(row_total(&v, other), 0.0, "{what}: {v}");
            // The JSON has no mismatch count: the guest's @result line is
            // where a wrong pid shows.
            let r = machine_line(&out, "@result");
            assert_eq!(r["mismatches"], "0", "getpid returned wrong pids: {r:?}");
            assert_eq!(row_total(&v, "syscalls"), calls, "{what}: {v}");
            let expected = if pti == "on" { 2.0 * calls } else { 0.0 };
            assert_eq!(row_total(&v, "cr3_writes"), expected, "{what}: {v}");
            // The plugin's count agrees (host-observed, exact under TCG).
            assert_eq!(row_total(&v, "insn_mov_cr3"), expected, "{what}: {v}");
            assert_cross_checks_agree(&v, &what);
            // PAE has no PCID: every CR3 write flushes.
            assert_eq!(row_total(&v, "tlb_flushes_full"), expected, "{what}: {v}");
            assert_eq!(row_total(&v, "cr3_writes_noflush"), 0.0, "{what}: {v}");
        }
    }
}

#[test]
fn i386_user_read_of_kernel_memory_faults_not_present_with_pti_and_protection_without() {
    let mut codes = Vec::new();
    for pti in ["on", "off"] {
        // A run that ends in a fault writes no document: its figures are
        // the guest's @fault line.
        let Some((code, out, _)) = i386_qemu(&["--pti", pti, "--cmdline", "fault=kread"]) else {
            return;
        };
        assert_eq!(
            code,
            Some(ptiscope_abi::exit_status::EXCEPTION as i32),
            "{out}"
        );
        let f = machine_line(&out, "@fault");
        assert_eq!(f["vector"], "14", "{f:?}");
        let e = u64::from_str_radix(f["error"].trim_start_matches("0x"), 16).unwrap();
        codes.push(e);
    }
    // Bit 2: from user mode. Bit 0: the page was present.
    assert_eq!(codes[0] & 0b101, 0b100, "PTI: absent from the user copy");
    assert_eq!(codes[1] & 0b101, 0b101, "no PTI: a protection violation");
}

#[test]
fn i386_pti_global_text_maps_kernel_text_into_the_user_copy() {
    let mut pages = Vec::new();
    for global in ["off", "on"] {
        let Some((code, out, v)) = i386_qemu(&[
            "--pti",
            "on",
            "--workload",
            "getpid",
            "--iterations",
            "50",
            "--cmdline",
            &format!("pti_global_text={global}"),
        ]) else {
            return;
        };
        assert_eq!(code, Some(0), "{out}");
        // The JSON of a QEMU run has no user-copy size (KVM runs read it
        // from the telemetry page): the guest's @pti line gives it.
        let p = machine_line(&out, "@pti");
        pages.push(p["user_copy_kernel_pages"].parse::<u64>().unwrap());
        assert_eq!(row_total(&v, "cr3_writes"), 102.0, "still 2 per call: {v}");
    }
    assert!(
        pages[1] > pages[0],
        "global text adds kernel text to the user copy: {pages:?}"
    );
}
