//! Linux on ptiscope's VMM under `--backend nested` (kvm_amd inside QEMU
//! TCG), in two nested boots that run side by side (the runs, and the
//! compare a CI runs):
//! - where the outer QEMU runs shadow paging correctly (QEMU 7.2), kvm_amd
//!   runs `npt=0`: KVM intercepts every guest CR3 write, so its
//!   `tlb_flush` counts them. ptiscope's guest counts its own: the two must
//!   agree exactly. For Linux KVM's count is the `[kvm] cr3_writes` row and
//!   the host side of the PTI check, and the Linux compare a CI runs is
//!   guarded on it (`--fail-if`);
//! - where it does not (QEMU 10.0.2: an intercepted CR3 read returns a
//!   wrong value), `--nested-paging shadow` is refused, naming the version,
//!   and Linux runs on nested paging, where the outer QEMU's TCG plugin
//!   counts its CR3 writes (`svm=1`: only what QEMU's SVM runs in guest
//!   mode): exactly 2 per undisturbed getppid, the `[qemu-plugin]` rows and
//!   the host side of the PTI check.
//!
//! Either way Linux boots to ptiscope's init on the VMM with one and with
//! two vCPUs (the ACPI tables describe them), and its workloads run.
//! Skipped, with the reason, without a fetched kernel with its KVM modules
//! or without QEMU.

mod common;

use common::*;
use serde_json::{json, Value};

const CALLS: u64 = 2000;

fn job<S: AsRef<str>>(name: &str, argv: &[S]) -> Value {
    let mut argv: Vec<String> = argv.iter().map(|s| s.as_ref().to_string()).collect();
    argv.push(format!("--json=/tmp/out/{name}.json"));
    json!({"argv": argv, "collect": [format!("/tmp/out/{name}.json")], "timeout_secs": 150.0})
}

fn summary(job: &Value, what: &str) -> Value {
    assert_eq!(
        job["status"].as_i64(),
        Some(0),
        "{what}: {}",
        job["stderr"].as_str().unwrap_or("")
    );
    let text = job["files"][0][1]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: no JSON came back: {job}"));
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: {e}: {text}"))
}

/// (total, per call) of the row `name` from `source`, if there is one.
fn row(s: &Value, name: &str, source: &str) -> Option<(f64, f64)> {
    let r = s["rows"]
        .as_array()?
        .iter()
        .find(|r| r["name"] == name && r["source"] == source)?;
    Some((r["total"].as_f64()?, r["per_iteration"].as_f64()?))
}

fn has_config(s: &Value, word: &str) -> bool {
    s["config"]
        .as_array()
        .is_some_and(|c| c.iter().any(|w| w == word))
}

/// The kvm_amd paging the tests use: shadow (npt=0) where the outer QEMU
/// runs it correctly, else nested paging, after checking that
/// `--nested-paging shadow` is refused there (naming the QEMU). `None`:
/// skipped, the reason printed.
fn paging_or_skip(test: &str, check_refusal: bool) -> Option<bool> {
    if !nested_or_skip(test) {
        return None;
    }
    let shadow = ptiscope::nested::boot::shadow_paging_works();
    if let Err(why) = &shadow {
        if check_refusal {
            // Refused before anything boots, naming the QEMU and what to use.
            let o = ptiscope()
                .args(["run", "--backend", "nested", "--nested-paging", "shadow"])
                .output()
                .unwrap();
            let err = stderr(&o);
            assert_eq!(o.status.code(), Some(69), "{err}");
            assert!(
                err.contains("--nested-paging npt") && err.contains("QEMU"),
                "{err}"
            );
            ptiscope::test_support::skip(
                "nested shadow paging",
                &format!("its refusal is checked, and Linux runs on nested paging: {why}"),
            );
        }
    }
    Some(shadow.is_ok())
}

/// The jobs in one nested boot, with one outer vCPU (as `--backend
/// nested` gives a Linux guest); the setup line checked for the paging.
fn batch(test: &str, name: &str, shadow: bool, jobs: Vec<Value>) -> Option<Vec<Value>> {
    let s = Scratch::new(name);
    let paging = if shadow { "shadow" } else { "npt" };
    let request = json!({ "kvm_paging": paging, "jobs": jobs });
    let r = nested_batch(test, &s, &request, 1)?;
    let setup = r["setup"].to_string();
    let npt = if shadow { "npt=0" } else { "npt=1" };
    assert!(setup.contains(&format!("kvm-amd.ko {npt}")), "{setup}");
    Some(r["jobs"].as_array().expect("jobs").clone())
}

/// `ptiscope run --linux debian-amd64 --workload W --pti on` with `n` calls.
fn linux_run(workload: &str, n: &str) -> Vec<String> {
    [
        "run",
        "--linux",
        "debian-amd64",
        "--workload",
        workload,
        "--iterations",
        n,
        "--timeout",
        "90",
        "--pti",
        "on",
    ]
    .map(str::to_string)
    .to_vec()
}

/// Whether this QEMU loads ptiscope's plugin (the nested session then
/// loads it into the outer QEMU under nested paging).
fn outer_plugin_loads() -> bool {
    ptiscope::backend::qemu::plugin_for("qemu-system-x86_64").is_ok()
}

/// Under nested paging: the outer QEMU's plugin's CR3 count of a Linux
/// `pti=on` getppid run (summary `on`, its notes `notes`): exactly 2 per
/// undisturbed call, and the PTI check's host side; without a plugin, the
/// note that there is no host count.
fn outer_plugin_counts(on: &Value, notes: &str) {
    let check = &note(on, "pti")["host_check"];
    if !outer_plugin_loads() {
        assert_eq!(check["kind"], "no_nested_paging_count", "{notes}");
        return;
    }
    let (_, per_call) = row(on, "insn_mov_cr3_calls", "qemu_plugin")
        .unwrap_or_else(|| panic!("no [qemu-plugin] CR3 count: {notes}"));
    assert_eq!(per_call, 2.0, "{notes}");
    // All of them (interrupts from user mode add two each): 2 a call and a few.
    let (total, _) = row(on, "insn_mov_cr3", "qemu_plugin").expect("insn_mov_cr3");
    let calls = CALLS as f64;
    assert!(
        (2.0 * calls..2.1 * calls).contains(&total),
        "{total}: {notes}"
    );
    assert_eq!(
        (check["kind"].as_str(), check["source"].as_str()),
        (Some("agrees"), Some("qemu-plugin")),
        "the PTI check's host side: {notes}"
    );
    // The inner Linux's and the VMM's own instructions are not the guest's:
    // a getppid is a few hundred kernel instructions, as under --backend qemu.
    let (_, kernel) = row(on, "kernel_instructions", "qemu_plugin").expect("kernel_instructions");
    assert!((100.0..2000.0).contains(&kernel), "{kernel} a call");
}

/// ptiscope's guest and Linux (getppid, and poundsyscall on two vCPUs) on
/// the VMM, in one nested boot.
#[test]
fn linux_runs_on_the_vmm_under_nested_kvm_amd_and_kvm_counts_cr3_writes_where_it_can() {
    let test = "Linux on the VMM under nested";
    let Some(shadow) = paging_or_skip(test, true) else {
        return;
    };
    let n = CALLS.to_string();
    let getppid = linux_run("getppid", &n);
    let mut pound = linux_run("poundsyscall", &n);
    pound.extend(["--cpus", "2", "--cmdline", "threads=2"].map(str::to_string));
    let jobs = vec![
        job(
            "on",
            &[
                "run",
                "--pti",
                "on",
                "--workload",
                "getpid",
                "--iterations",
                &n,
                // Emulated time: 2000 calls take about a second alone, far
                // more on a loaded host; the default 10 s is not for TCG.
                "--timeout",
                "60",
            ],
        ),
        job("linux-on", &getppid),
        job("pound", &pound),
    ];
    let Some(j) = batch(test, "nested-linux-vmm", shadow, jobs) else {
        return;
    };
    // ptiscope's guest: under shadow paging KVM's flushes are exactly its
    // CR3 writes, 2 a call.
    let on = summary(&j[0], "ptiscope's guest, pti=on");
    let kvm_env = &on["environment"]["kvm"];
    assert_eq!(kvm_env["sees_cr3_writes"], shadow, "{kvm_env}");
    let (guest, per_call) = row(&on, "cr3_writes", "guest").expect("the guest's count");
    assert!((per_call - 2.0).abs() < 0.01, "{per_call}");
    if shadow {
        assert_eq!(kvm_env["paging"], "shadow", "{kvm_env}");
        let (kvm, _) = row(&on, "tlb_flush", "kvm").expect("KVM's tlb_flush");
        assert_eq!(kvm, guest, "KVM's tlb_flush vs the guest's CR3 writes");
        let checks = on["cross_checks"].as_array().unwrap();
        assert!(
            checks.iter().any(|c| c["what"]
                .as_str()
                .is_some_and(|w| w.contains("shadow paging"))
                && c["agrees"] == true),
            "{checks:?}"
        );
    }

    // Linux, getppid with PTI: the init's figures, KVM's exits, and PTI's
    // state from the kernel log, with KVM's count beside it under shadow
    // paging: exactly 2 a call, the loop alone on a tick-free vCPU
    // (--tick-free auto), where no timer interrupt from user mode adds two.
    let on = summary(&j[1], "Linux pti=on");
    assert!(has_config(&on, "linux=x86_64"), "{}", on["config"]);
    assert!(row(&on, "cycles", "guest").is_some_and(|(t, _)| t > 0.0));
    assert!(row(&on, "kvm_exits", "kvm").is_some(), "{}", on["rows"]);
    let notes = on["notes"].to_string();
    assert_eq!(note(&on, "pti")["enabled"], true, "{notes}");
    match row(&on, "cr3_writes", "kvm") {
        Some((total, per_call)) if shadow => {
            // 2 a call, and now and then a CR3 write of the kernel's own
            // on that CPU (a TLB shootdown's full flush reloads CR3: up to
            // 6 in 2,000 calls seen on a loaded host; 10 allowed).
            let calls = CALLS as f64;
            assert!(
                (2.0 * calls..=2.0 * calls + 10.0).contains(&total),
                "{per_call} a call: {notes}"
            );
            let check = &note(&on, "pti")["host_check"];
            assert_eq!(check["kind"], "agrees", "{notes}");
            assert_eq!(
                check["source"], "kvm tlb_flush of the loop's vCPU, shadow paging",
                "{notes}"
            );
            // The loop alone on tick-free CPU 1, where no timer interrupt came.
            let tick_free = note(&on, "tick_free");
            assert_eq!(tick_free["cpu"], 1, "{notes}");
            assert_eq!(tick_free["dynticks"], true, "{notes}");
            assert_eq!(tick_free["ticks"], 0, "{notes}");
            assert!(has_config(&on, "tick_free=cpu1"), "{}", on["config"]);
        }
        None if !shadow => outer_plugin_counts(&on, &notes),
        r => panic!("[kvm] cr3_writes {r:?} with shadow paging {shadow}: {notes}"),
    }

    // Two vCPUs (the MADT's): both brought up, each thread made its calls.
    let what = "Linux poundsyscall --cpus 2";
    let p = summary(&j[2], what);
    let out = j[2]["stdout"].as_str().unwrap_or_default();
    assert!(out.contains("@smp cpus=2 threads=2"), "{what}: {out}");
    assert_eq!(p["iterations"], 2 * CALLS, "{what}");
    for cpu in 0..2 {
        assert!(
            row(&p, &format!("kvm_exits_vcpu{cpu}"), "kvm").is_some(),
            "{what}: no KVM exit row for vCPU {cpu}: {}",
            p["rows"]
        );
    }
}

/// The Linux steps of GitHub's workflow, scripts/ci-linux.sh, as
/// `.github/workflows/ci.yml` runs them on a hardware-KVM runner, with
/// `--vmm nested` standing in for the hardware KVM: the TCG compare guarded
/// on the plugin's exact MOV-CR3 count, then the compare on the VMM guarded
/// on KVM's CR3 count where KVM sees them (shadow paging). The figures are
/// read from the JSON the script keeps.
#[test]
fn the_ci_workflows_linux_steps_pass_with_nested_standing_in_for_hardware_kvm() {
    let test = "ci-linux.sh --vmm nested";
    let Some(shadow) = paging_or_skip(test, false) else {
        return;
    };
    if !plugin_or_skip(test, "qemu-system-x86_64") {
        return;
    }
    let out = Scratch::new("ci-linux");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/ci-linux.sh");
    let o = std::process::Command::new("bash")
        .arg(script)
        .args(["--vmm", "nested", "--kernel", "debian-amd64", "--out"])
        .arg(&*out)
        .env("PTISCOPE", env!("CARGO_BIN_EXE_ptiscope"))
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let text = format!("{}{}", stdout(&o), stderr(&o));
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert!(text.contains("ci-linux: all steps held"), "{text}");
    let read = |name: &str| -> Value {
        let bytes = std::fs::read(out.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        serde_json::from_slice(&bytes).unwrap()
    };
    let metric = |doc: &Value, name: &str| -> Option<Value> {
        doc["metrics"]
            .as_array()?
            .iter()
            .find(|m| m["name"] == name)
            .cloned()
    };
    let mean = |m: &Value, side: &str| m[side]["amean"].as_f64().unwrap_or(f64::NAN);
    // Under TCG: exactly 0 and 2 MOV CR3 per undisturbed getppid.
    let tcg = read("linux-tcg.json");
    let m = metric(&tcg, "insn_mov_cr3_calls_per_call").expect("the plugin's per-call count");
    assert_eq!(
        (mean(&m, "baseline"), mean(&m, "compare")),
        (0.0, 2.0),
        "{m}"
    );
    // On the VMM: KVM's count where it sees CR3 writes, 0 and 2 a call (the
    // loop on a tick-free vCPU), give or take the kernel's own full TLB
    // flushes (a CR3 reload each; up to 6 in 2,000 calls seen on a loaded
    // 2-core host, so 10 are allowed); none under nested paging.
    let vmm = read("linux-vmm.json");
    let m = metric(&vmm, "cr3_writes_per_call");
    if shadow {
        let m = m.unwrap_or_else(|| panic!("no cr3_writes_per_call: {}", vmm["metrics"]));
        assert_eq!(m["source"], "kvm", "{m}");
        let slack = 10.0 / CALLS as f64;
        assert!((0.0..slack).contains(&mean(&m, "baseline")), "{m}");
        assert!((2.0..2.0 + slack).contains(&mean(&m, "compare")), "{m}");
        assert!(text.contains("[kvm] CR3 writes per getppid"), "{text}");
    } else {
        assert!(m.is_none(), "a CR3 count under nested paging: {m:?}");
        assert!(text.contains("no CR3 guard"), "{text}");
    }
    assert!(
        metric(&vmm, "kvm_exits_per_call").is_some(),
        "{}",
        vmm["metrics"]
    );
}

/// A PVH vmlinux (Debian's, unpacked from the cached bzImage) on the VMM:
/// its initramfs is PVH's first module and its CPUs are the ACPI tables',
/// so it reaches ptiscope's init with two vCPUs and ends on its status,
/// the kernel log saying PTI is on. Nested paging: the shortest boot.
#[test]
fn a_pvh_vmlinux_reaches_the_init_on_the_vmm_under_nested_kvm_amd() {
    let test = "PVH vmlinux on the VMM under nested";
    if !nested_or_skip(test) {
        return;
    }
    let Some(Ok(bz)) = ptiscope::preflight::linux::known_path("debian-amd64") else {
        ptiscope::test_support::skip(test, "debian-amd64 is not fetched (`ptiscope linux fetch`)");
        return;
    };
    let Some(vmlinux) = vmlinux_of(&std::fs::read(&bz).unwrap()) else {
        ptiscope::test_support::skip(test, "the cached bzImage is not LZ4-compressed");
        return;
    };
    let s = Scratch::new("nested-pvh-vmlinux");
    let elf = s.join("vmlinux");
    std::fs::write(&elf, vmlinux).unwrap();
    let json = s.join("run.json");
    let o = ptiscope()
        .args([
            "run",
            "--backend",
            "nested",
            "--nested-paging",
            "npt",
            "--linux",
        ])
        .arg(&elf)
        .args([
            "--workload",
            "getppid",
            "--iterations",
            "500",
            "--pti",
            "on",
        ])
        .args(["--cpus", "2", "--timeout", "90", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let (out, err) = (stdout(&o), stderr(&o));
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    let v = read_json(&json);
    assert!(has_config(&v, "linux=x86_64"), "{}", v["config"]);
    assert_eq!(v["iterations"], 500, "{}", v["config"]);
    assert_eq!(note(&v, "pti")["enabled"], true, "{}", v["notes"]);
    assert!(row(&v, "kvm_exits", "kvm").is_some(), "{}", v["rows"]);
}

/// `compare --backend nested` with the kernels on the sides (`linux=`, not
/// `--linux`): the side kernels are packed as `--linux` kernels are (they
/// used to reach the inner command unpacked: exit 66 "not fetched yet"
/// after the whole boot), the names kept, and the run is a Linux one
/// (shadow paging where it works): KVM counts 0 -> 2 CR3 writes per call.
#[test]
fn compare_sides_with_their_own_linux_kernels_run_under_nested() {
    let test = "compare_sides_with_their_own_linux_kernels_run_under_nested";
    if !nested_or_skip(test) {
        return;
    }
    let json = scratch(test).join("compare.json");
    let o = ptiscope()
        .args(["compare", "--backend", "nested"])
        .args(["--baseline", "linux=debian-amd64,append=pti=off"])
        .args(["--compare", "linux=debian-amd64,append=pti=on"])
        .args([
            "--workload",
            "getppid",
            "--iterations",
            "1000",
            "--runs",
            "1",
        ])
        .args(["--quiet", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let err = stderr(&o);
    if o.status.code() == Some(69) && err.contains("could not set up KVM") {
        ptiscope::test_support::skip(test, &format!("this QEMU gives no usable SVM: {err}"));
        return;
    }
    assert_eq!(o.status.code(), Some(0), "{}\n{err}", stdout(&o));
    let out = stdout(&o);
    assert!(
        out.contains("baseline linux=debian-amd64,append=pti=off"),
        "{out}"
    );
    let v = read_json(&json);
    // Shadow paging (KVM counts the CR3 writes) where this QEMU runs it,
    // else the outer QEMU's plugin counts them: exactly 0 -> 2 per
    // undisturbed call.
    if ptiscope::nested::boot::shadow_paging_works().is_ok() {
        let (off, on) = ameans(compare_metric(&v, "cr3_writes_per_call"));
        assert!(off < 0.1 && (on - 2.0).abs() < 0.1, "{off} -> {on}");
    } else if outer_plugin_loads() {
        let m = compare_metric(&v, "insn_mov_cr3_calls_per_call");
        assert_eq!(m["source"], "qemu_plugin", "{m}");
        assert_eq!(ameans(m), (0.0, 2.0), "{m}");
        assert!(out.contains("[qemu-plugin] MOV CR3 executed"), "{out}");
    }
}

/// The run document's note of `code` (null when it has none).
fn note<'a>(v: &'a Value, code: &str) -> &'a Value {
    v["notes"]
        .as_array()
        .and_then(|n| n.iter().find(|n| n["code"] == code))
        .unwrap_or(&Value::Null)
}
