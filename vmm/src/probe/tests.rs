//! Probe tests: unit tests of the report logic, and the full probe on this
//! host (skipped with a printed reason where /dev/kvm is absent).

use std::time::{Duration, Instant};

use super::*;

/// Whether KVM can be used; prints why not.
fn kvm_available(test: &str) -> bool {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => true,
        Err(e) => {
            crate::test_support::skip(test, &format!("/dev/kvm not usable: {e}"));
            false
        }
    }
}

/// Whether this host runs the kvm_pvm software virtualizer (HOST-KVM.md).
fn is_pvm_host() -> bool {
    std::path::Path::new("/sys/module/kvm_pvm").exists()
}

fn entry_probe(entry: Option<Entry>, outcome: EntryOutcome) -> EntryProbe {
    EntryProbe {
        instruction: entry.map_or("int1".into(), |e| e.to_string()),
        bytes: "cc".into(),
        entry,
        outcome,
        detail: String::new(),
        reached_user: true,
    }
}

/// A report built from made-up findings, for the pure logic.
fn fake_report(entries: Vec<EntryProbe>) -> ProbeReport {
    let paging = |works: bool| PagingProbe {
        outcome: if works {
            PagingOutcome::Works
        } else {
            PagingOutcome::Exception {
                vector: 13,
                rip: 0x8030,
            }
        },
        detail: "d".into(),
    };
    let mut r = ProbeReport {
        host: HostInfo {
            api_version: 12,
            max_vcpus: 4,
            recommended_vcpus: 2,
            caps: vec![Cap {
                name: "KVM_CAP_IRQCHIP",
                number: 0,
                value: 1,
            }],
            kvm_modules: vec!["kvm_pvm".into()],
        },
        stats_fd: StatsFdProbe {
            vm_descriptors: Some(5),
            vcpu_descriptors: Some(40),
            detail: "d".into(),
        },
        paging: PagingProbes {
            long_mode: paging(true),
            pae: paging(false),
            legacy: paging(false),
        },
        entries,
        iretq: IretqProbe {
            works: true,
            detail: "d".into(),
        },
        pcid: PcidProbe {
            cpuid_bit: Some(false),
            pcide: false,
            cr3_noflush: false,
            detail: "d".into(),
        },
        arch_capabilities: ArchCapsProbe {
            cpuid_bit: Some(true),
            feature_value: Some(0x0c00_e16d),
            kvm_value: Some(0x0c00_e16d),
            guest_value: Some(0x0c00_e16d),
            override_value: 0x0c00_e16c,
            set_msrs_works: true,
            msr_exit_works: true,
            detail: "d".into(),
        },
        rdtsc_user: RdtscProbe {
            works: true,
            detail: "d".into(),
        },
        cr3_write_refill: RefillProbe::unmeasured(None, "d".into()),
        best_entry: None,
        elapsed_ms: 1.0,
        rows: Vec::new(),
    };
    r.best_entry = r.best_entry();
    r.rows = r.build_rows();
    r
}

#[test]
fn best_entry_prefers_syscall_then_int80_int3_int4() {
    use EntryOutcome::*;
    let ok = DeliveredCpl0;
    let ud = Exception {
        vector: 6,
        error_code: None,
    };
    let r = fake_report(vec![
        entry_probe(Some(Entry::Syscall), WrongCpl { cpl: 3 }),
        entry_probe(Some(Entry::Sysenter), ok.clone()),
        entry_probe(Some(Entry::Int80), ud.clone()),
        entry_probe(Some(Entry::Int3), ok.clone()),
        entry_probe(Some(Entry::Int4), ok.clone()),
        entry_probe(None, ok.clone()),
    ]);
    assert_eq!(
        r.working_entries(),
        vec![Entry::Sysenter, Entry::Int3, Entry::Int4]
    );
    // SYSENTER works but is not chosen for the 64-bit guest.
    assert_eq!(r.best_entry(), Some(Entry::Int3));
    assert_eq!(
        preferred_entry(&[Entry::Int4, Entry::Syscall]),
        Some(Entry::Syscall)
    );
    assert_eq!(
        preferred_entry(&[Entry::Int4, Entry::Int80]),
        Some(Entry::Int80)
    );
    assert_eq!(preferred_entry(&[Entry::Int4]), Some(Entry::Int4));
    assert_eq!(preferred_entry(&[Entry::Sysenter]), None);
    assert_eq!(fake_report(vec![]).best_entry(), None);
}

#[test]
fn report_json_has_stable_shape() {
    let r = fake_report(vec![entry_probe(
        Some(Entry::Int80),
        EntryOutcome::Exception {
            vector: 13,
            error_code: Some(0x402),
        },
    )]);
    let v = serde_json::to_value(&r).unwrap_or_default();
    for key in [
        "host",
        "stats_fd",
        "paging",
        "entries",
        "iretq",
        "pcid",
        "arch_capabilities",
        "rdtsc_user",
        "best_entry",
        "elapsed_ms",
        "rows",
    ] {
        assert!(v.get(key).is_some(), "missing key {key} in {v}");
    }
    assert_eq!(v["host"]["api_version"], 12);
    assert_eq!(v["paging"]["long_mode"]["outcome"]["result"], "works");
    assert_eq!(v["paging"]["pae"]["outcome"]["result"], "exception");
    assert_eq!(v["entries"][0]["entry"], "int80");
    assert_eq!(v["entries"][0]["outcome"]["outcome"], "exception");
    assert_eq!(v["entries"][0]["outcome"]["vector"], 13);
    assert_eq!(v["entries"][0]["outcome"]["error_code"], 0x402);
    assert!(v["best_entry"].is_null());
    let rows = v["rows"].as_array().cloned().unwrap_or_default();
    assert!(!rows.is_empty());
    for row in &rows {
        assert!(row["probe"].is_string() && row["detail"].is_string());
        let res = row["result"].as_str().unwrap_or("");
        assert!(["yes", "no", "partial", "info"].contains(&res), "{row}");
    }
}

#[test]
fn display_is_one_line_per_row_with_header() {
    let r = fake_report(vec![entry_probe(
        Some(Entry::Int3),
        EntryOutcome::DeliveredCpl0,
    )]);
    let text = r.to_string();
    // Header, rule, the rows, then a blank line and the refill verdict.
    assert_eq!(text.lines().count(), r.rows.len() + 4);
    assert!(
        text.lines()
            .last()
            .is_some_and(|l| l.starts_with("cr3_write_refill: unmeasured")),
        "{text}"
    );
    assert!(text.lines().next().is_some_and(|l| l.starts_with("probe")));
    let int3 = text
        .lines()
        .find(|l| l.starts_with("user int3"))
        .unwrap_or_default();
    assert!(int3.contains(" yes "), "{int3}");
    assert!(text.contains("entry=auto"));
}

/// The full probe on this host. On the kvm_pvm host it must find what
/// HOST-KVM.md documents; elsewhere only internal consistency is checked.
#[test]
fn full_probe_on_this_host() {
    if !kvm_available("full_probe_on_this_host") {
        return;
    }
    let t0 = Instant::now();
    let r = match run(&ProbeOptions::default()) {
        Ok(r) => r,
        Err(e) => panic!("probe failed: {e}"),
    };
    let took = t0.elapsed();
    println!("{r}");
    println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
    // Its time is reported (docs: about 0.5 s, the refill probe most of
    // it), not asserted: this machine's other load sets it.
    println!("full probe took {took:?}");

    // Consistency, on every host.
    assert_eq!(r.host.api_version, 12);
    assert!(r.long_mode_paging(), "{:?}", r.paging.long_mode);
    assert!(r.stats_fd.works() || r.host.cap("KVM_CAP_BINARY_STATS_FD") == Some(0));
    assert_eq!(r.best_entry, preferred_entry(&r.working_entries()));
    assert!(r.entries.iter().all(|e| e.reached_user), "{:?}", r.entries);
    if r.pcid() {
        assert_eq!(r.pcid.cpuid_bit, Some(true));
    }
    // ud2 from user mode must always be a #UD delivered at CPL0 (sanity).
    let ud2 = r.entries.iter().find(|e| e.instruction == "ud2");
    assert_eq!(ud2.map(|e| &e.outcome), Some(&EntryOutcome::DeliveredCpl0));
    assert!(r.rdtsc_user.works, "{}", r.rdtsc_user.detail);
    let a = &r.arch_capabilities;
    if a.guest_value.is_some() {
        // A readable MSR must be enumerated (KVM #GPs the read otherwise).
        assert_eq!(a.cpuid_bit, Some(true), "{}", a.detail);
    }
    // The user-space MSR exit does not depend on the guest CPUID, only on
    // the capabilities.
    if r.host
        .cap("KVM_CAP_X86_USER_SPACE_MSR")
        .is_some_and(|v| v > 0)
        && r.host.cap("KVM_CAP_X86_MSR_FILTER").is_some_and(|v| v > 0)
    {
        assert!(a.msr_exit_works, "{}", a.detail);
    }

    // The refill verdict follows its own figure and threshold; its
    // agreement with a direct measurement is tests/sweep.rs's.
    let f = &r.cr3_write_refill;
    match (f.verdict, f.ns_per_page) {
        (RefillVerdict::Unmeasured, _) => println!("refill unmeasured: {}", f.detail),
        (v, Some(ns)) => {
            let fastest = f
                .ns_per_page_fastest
                .expect("a fastest figure beside the median");
            assert_eq!(v, refill::verdict_for(ns.min(fastest)), "{}", f.detail);
            let m = f.medians_ns_per_trip.expect("medians with a figure");
            assert!(
                m.bare_0 > 0.0 && m.bare_w > m.bare_0,
                "the reads take time: {m:?}"
            );
        }
        (v, None) => panic!("verdict {v} without a figure: {}", f.detail),
    }

    if !is_pvm_host() {
        return;
    }
    // What HOST-KVM.md documents for kvm_pvm.
    let outcome = |name: &str| {
        r.entries
            .iter()
            .find(|e| e.instruction == name)
            .map(|e| e.outcome.clone())
    };
    assert!(!r.pae_paging(), "{:?}", r.paging.pae);
    assert!(!r.paging.legacy.outcome.works(), "{:?}", r.paging.legacy);
    assert_eq!(outcome("syscall"), Some(EntryOutcome::WrongCpl { cpl: 3 }));
    assert!(matches!(
        outcome("sysenter"),
        Some(EntryOutcome::Exception { vector: 6, .. })
    ));
    assert!(!outcome("int $0x80").is_some_and(|o| o.works()));
    assert_eq!(outcome("int3"), Some(EntryOutcome::DeliveredCpl0));
    assert_eq!(outcome("int $4"), Some(EntryOutcome::DeliveredCpl0));
    assert_eq!(outcome("int1"), Some(EntryOutcome::DeliveredCpl0));
    assert_eq!(r.best_entry, Some(Entry::Int3));
    assert!(r.iretq.works, "{}", r.iretq.detail);
    assert!(!r.pcid());
    assert!(!r.pcid.pcide);
    // ARCH_CAPABILITIES differs between kvm_pvm hosts (it
    // follows the host CPU's CPUID leaf 7), so only the consistency checks
    // above apply to it.
}

/// The cheap entry probe used for `entry=auto` is fast and agrees with the full one.
#[test]
fn entry_probe_is_fast_and_consistent() {
    if !kvm_available("entry_probe_is_fast_and_consistent") {
        return;
    }
    let t0 = Instant::now();
    let found = match probe_entries(&ProbeOptions::default()) {
        Ok(f) => f,
        Err(e) => panic!("entry probe failed: {e}"),
    };
    let took = t0.elapsed();
    println!("entry probe took {took:?}: {found:?}");
    let names: Vec<Entry> = found.iter().map(|(e, _)| *e).collect();
    assert_eq!(names, Entry::ALL.to_vec());
    if is_pvm_host() {
        let working: Vec<Entry> = found
            .iter()
            .filter(|(_, o)| o.works())
            .map(|(e, _)| *e)
            .collect();
        assert_eq!(working, vec![Entry::Int3, Entry::Int4]);
    }
}

/// The watchdog stops a guest spinning at CPL0 with interrupts off.
#[test]
fn watchdog_stops_a_spinning_guest() {
    if !kvm_available("watchdog_stops_a_spinning_guest") {
        return;
    }
    let kit = match vm::Kit::new(Duration::from_millis(30)) {
        Ok(k) => k,
        Err(e) => panic!("{e}"),
    };
    let mut k = code::Asm::new(code::KERNEL_CODE);
    k.stage(1).spin();
    let p = vm::Program::new(vm::StartMode::Long64, k);
    let t0 = Instant::now();
    let trace = vm::ProbeVm::new(&kit)
        .and_then(|mut v| {
            v.load(&p)?;
            v.run(kit.timeout)
        })
        .unwrap_or_else(|e| panic!("{e}"));
    let took = t0.elapsed();
    assert_eq!(trace.stop, vm::Stop::Timeout);
    assert_eq!(trace.stage(), 1);
    // A 30 ms watchdog that has not stopped the guest after 5 s has hung
    // (a bound on hanging, not a speed target).
    assert!(took < Duration::from_secs(5), "took {took:?}");
}
