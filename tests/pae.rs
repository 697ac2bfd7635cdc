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

/// Runs the embedded i386 guest under QEMU TCG (`--backend qemu`); `None`
/// (with the reason printed) where qemu-system-i386 is missing.
fn i386_qemu(args: &[&str]) -> Option<(Option<i32>, String)> {
    if !qemu_i386_or_skip("i386 under QEMU") {
        return None;
    }
    let o = run_i386_qemu(60).args(args).output().unwrap();
    Some((o.status.code(), stdout(&o) + &stderr(&o)))
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
            let n = N.to_string();
            let Some((code, out)) = i386_qemu(&[
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
            assert_eq!(code, Some(0), "{entry} pti={pti}:\n{out}");
            assert!(out.contains("ptiscope guest i386"), "{out}");
            let r = machine_line(&out, "@result");
            assert_eq!(r["entry"], entry);
            assert_eq!(r["pti"], pti);
            assert_eq!(r["mismatches"], "0", "getpid returned wrong pids: {r:?}");
            assert_eq!(r["syscalls"], (N + 1).to_string());
            let expected = if pti == "on" { 2 * (N + 1) } else { 0 };
            assert_eq!(
                r["cr3_writes"],
                expected.to_string(),
                "{entry} pti={pti}: {r:?}"
            );
            // PAE has no PCID: every CR3 write flushes.
            assert_eq!(r["tlb_flushes"], expected.to_string());
            assert_eq!(r["cr3_noflush"], "0");
        }
    }
}

#[test]
fn i386_user_read_of_kernel_memory_faults_not_present_with_pti_and_protection_without() {
    let mut codes = Vec::new();
    for pti in ["on", "off"] {
        let Some((code, out)) = i386_qemu(&["--pti", pti, "--cmdline", "fault=kread"]) else {
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
        let Some((code, out)) = i386_qemu(&[
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
        let p = machine_line(&out, "@pti");
        pages.push(p["user_copy_kernel_pages"].parse::<u64>().unwrap());
        let r = machine_line(&out, "@result");
        assert_eq!(r["cr3_writes"], "102", "still 2 per call: {r:?}");
    }
    assert!(
        pages[1] > pages[0],
        "global text adds kernel text to the user copy: {pages:?}"
    );
}
