//! Host-side telemetry against live guests under KVM: the KVM stats fd, the
//! guest telemetry page through real runs, phase deltas, a hostile guest,
//! live metrics, `--cpu-vuln` and the refusal of what the host cannot run.

mod common;

use std::path::Path;

use common::*;
use ptiscope::machine::kvm_stats::{self, KvmStats, StatsSnapshot};
use ptiscope::machine::loader::KernelSource;
use ptiscope::machine::VmContext;
use ptiscope::SerialOut;
use ptiscope::{run_vm, HostFacts, PhaseObserver, RunConfig, StopReason};
use ptiscope_abi::phase::Marker;
use ptiscope_abi::telemetry as abi;
use serde_json::Value;

/// Opens the vCPU stats fd at start and reads it at every marker.
#[derive(Default)]
struct StatsRecorder {
    vcpu: Option<KvmStats>,
    vm: Option<KvmStats>,
    at_markers: Vec<StatsSnapshot>,
}

impl PhaseObserver for StatsRecorder {
    fn on_start(&mut self, ctx: &VmContext<'_>) {
        self.vcpu = KvmStats::from_vcpu(ctx.vcpu).ok();
        self.vm = KvmStats::from_vm(ctx.vm).ok();
    }
    fn on_phase(&mut self, _m: Marker, _ctx: &VmContext<'_>) {
        if let Some(s) = &self.vcpu {
            self.at_markers.push(s.read().expect("read vCPU stats"));
        }
    }
}

// 32-bit protected-mode machine code pieces for hand-made PVH guests.
const MOV_DX_PHASE: [u8; 4] = [0x66, 0xba, 0x00, 0x06];
fn mov_eax(v: u32) -> Vec<u8> {
    let mut c = vec![0xb8];
    c.extend_from_slice(&v.to_le_bytes());
    c
}
const OUT_DX_EAX: u8 = 0xef;
const EXIT_0: [u8; 5] = [0x31, 0xc0, 0xe7, 0xf4, 0xf4];
/// `mov dword [edi + disp32], imm32`
fn store(disp: u32, v: u32) -> Vec<u8> {
    let mut c = vec![0xc7, 0x87];
    c.extend_from_slice(&disp.to_le_bytes());
    c.extend_from_slice(&v.to_le_bytes());
    c
}
/// `mov ecx, n; L: mov eax, value; out dx, eax; dec ecx; jnz L`
fn out_loop(n: u32, value: u32) -> Vec<u8> {
    let mut c = vec![0xb9];
    c.extend_from_slice(&n.to_le_bytes());
    c.extend(mov_eax(value));
    c.extend([OUT_DX_EAX, 0x49, 0x75, 0xf7]);
    c
}

fn config_for(elf: &Path) -> RunConfig {
    let mut c = RunConfig::new(KernelSource::Path(elf.to_path_buf()));
    c.serial_out = SerialOut::Discard;
    c.mem_mib = 16;
    c
}

#[test]
fn kvm_stats_fd_against_a_live_guest() {
    if !kvm_or_skip("kvm_stats_fd_against_a_live_guest") {
        return;
    }
    // begin 1; 200 writes to the exit-free unknown port 0x80; end 1; exit 0.
    let mut code = MOV_DX_PHASE.to_vec();
    code.extend(mov_eax(Marker::begin(1).encode()));
    code.push(OUT_DX_EAX);
    code.extend([0x66, 0xba, 0x80, 0x00]); // mov dx, 0x80
    code.extend(out_loop(200, 0));
    code.extend(MOV_DX_PHASE);
    code.extend(mov_eax(Marker::end(1).encode()));
    code.push(OUT_DX_EAX);
    code.extend(EXIT_0);
    let elf = scratch("stats").join("pio.elf");
    write_pvh_elf(&elf, 0x100000, &code);
    let mut obs = StatsRecorder::default();
    let out = run_vm(&config_for(&elf), &HostFacts::read(), &mut obs).expect("run");
    assert_eq!(out.stop, StopReason::GuestExit { status: 0 });
    let Some(vcpu) = &obs.vcpu else {
        ptiscope::test_support::skip(
            "kvm_stats_fd_against_a_live_guest",
            "this KVM has no binary stats fd",
        );
        return;
    };
    assert!(vcpu.descriptor("exits").is_some(), "no `exits` stat");
    assert!(obs.vm.as_ref().is_some_and(|v| !v.descriptors().is_empty()));
    assert_eq!(obs.at_markers.len(), 2);
    let (a, b) = (&obs.at_markers[0], &obs.at_markers[1]);
    // Every cumulative counter is monotonic (delta refuses otherwise).
    let d = kvm_stats::delta(a, b).expect("counters monotonic");
    let exits = d.get("exits").unwrap();
    assert!(
        (201..2000).contains(&exits),
        "200 PIO exits + the end marker, got {exits}"
    );
}

fn run_json(args: &[&str], dir: &Path, name: &str) -> (Option<i32>, Value, String, String) {
    let json = dir.join(format!("{name}.json"));
    let o = ptiscope()
        .arg("run")
        .args(args)
        .args(["--json", json.to_str().unwrap(), "--timeout", "30"])
        .output()
        .unwrap();
    let v = json_or_null(&json);
    (o.status.code(), v, stdout(&o), stderr(&o))
}

#[test]
fn telemetry_round_trip_through_real_runs() {
    if !kvm_or_skip("telemetry_round_trip") {
        return;
    }
    let dir = scratch("roundtrip");
    let n = 300.0;
    for (pti, cr3_per_call) in [("on", 2.0), ("off", 0.0)] {
        let (code, v, out, err) = run_json(
            &["--pti", pti, "--workload", "getpid", "--iterations", "300"],
            &dir,
            pti,
        );
        assert_eq!(code, Some(0), "{out}\n{err}");
        assert_eq!(v["schema"], "ptiscope.run/2");
        assert_eq!(v["phase"], "workload");
        assert_eq!(v["telemetry_valid"], true, "{v}");
        // The phase holds the N calls plus the phase-marker syscall.
        assert_eq!(v["iterations"].as_f64(), Some(n + 1.0));
        assert_eq!(row_total(&v, "syscalls"), n + 1.0);
        assert_eq!(
            row_total(&v, "cr3_writes"),
            cr3_per_call * (n + 1.0),
            "pti={pti}"
        );
        assert_eq!(
            summary_row(&v, "cr3_writes").unwrap()["per_iteration"].as_f64(),
            Some(cr3_per_call)
        );
        assert_eq!(
            row_total(&v, "cr3_writes_other"),
            0.0,
            "boot is outside the phase"
        );
        for r in ["elapsed", "vmm_exits", "cycles"] {
            assert!(summary_row(&v, r).is_some(), "row {r}: {v}");
        }
        assert_eq!(summary_row(&v, "elapsed").unwrap()["source"], "host_clock");
        assert_eq!(summary_row(&v, "cr3_writes").unwrap()["source"], "guest");
        let checks = v["cross_checks"].as_array().unwrap();
        let sys = checks
            .iter()
            .find(|c| c["guest_metric"] == "syscalls")
            .expect("syscalls cross-check");
        assert_eq!(sys["agrees"], true, "{sys}");
        // The telemetry verdict, and the KVM stats: rows from the stats
        // fd, or a note that this KVM has none.
        assert_eq!(v["telemetry_checked"], true, "{v}");
        assert_eq!(v["telemetry_valid"], true, "{err}\n{v}");
        let kvm_rows = v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["source"] == "kvm");
        let no_fd = v["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["code"] == "kvm_stats_unavailable");
        assert!(kvm_rows || no_fd, "{v}");
        // The JSON is the documented schema: it reads back.
        let back = ptiscope::report::RunSummary::from_json(v.clone()).expect("schema");
        assert_eq!(back.iterations, 301);
    }
}

#[test]
fn phase_deltas_exclude_boot_and_teardown() {
    if !kvm_or_skip("phase_deltas_exclude_boot") {
        return;
    }
    let dir = scratch("zero");
    let (code, v, out, err) = run_json(
        &["--pti", "on", "--workload", "getpid", "--iterations", "0"],
        &dir,
        "zero",
    );
    assert_eq!(code, Some(0), "{out}\n{err}");
    // Boot switches CR3 several times (cr3_writes_other); none is in the
    // phase, which holds only the calls and the marker's own round trip.
    // With 0 iterations the phase holds only the marker's own round trip:
    // the begin marker's return to user and the end marker's entry.
    let cr3 = row_total(&v, "cr3_writes");
    assert_eq!(cr3, 2.0, "phase CR3 writes: {v}");
    assert_eq!(row_total(&v, "syscalls"), 1.0, "{v}");
    assert_eq!(row_total(&v, "cr3_writes_other"), 0.0);
    assert!(row_total(&v, "vmm_exits") <= 2.0, "{v}");
}

#[test]
fn hostile_guest_is_reported_invalid_and_stops_cleanly() {
    if !kvm_or_skip("hostile_guest") {
        return;
    }
    let gpa: u32 = 16 * 1024 * 1024 - 4096;
    let syscalls = abi::Counter::Syscalls.offset(0) as u32;
    let mut code = vec![0xbf];
    code.extend_from_slice(&gpa.to_le_bytes()); // mov edi, telemetry
    for (off, v) in [
        (abi::header::VERSION, abi::VERSION),
        (abi::header::CPU_COUNT, 1),
        (abi::header::CPU_BLOCK_OFFSET, abi::CPU_BLOCK_OFFSET as u32),
        (abi::header::CPU_BLOCK_STRIDE, abi::CPU_BLOCK_STRIDE as u32),
        (abi::header::COUNTER_COUNT, abi::Counter::COUNT as u32),
    ] {
        code.extend(store(off as u32, v));
    }
    code.extend(store(syscalls, 1000));
    code.extend(store(0, abi::MAGIC as u32));
    code.extend(store(4, (abi::MAGIC >> 32) as u32));
    code.extend(MOV_DX_PHASE);
    code.extend(mov_eax(Marker::begin(1).encode()));
    code.push(OUT_DX_EAX);
    code.extend(store(syscalls, 5)); // counter goes backwards
    code.extend(mov_eax(Marker::begin(7).encode())); // unknown phase id
    code.push(OUT_DX_EAX);
    code.extend(mov_eax(Marker::end(1).encode()));
    code.push(OUT_DX_EAX);
    code.extend(store(0, 0xdead_beef)); // scribble over the magic
    code.extend(out_loop(5000, Marker::begin(1).encode())); // marker flood
    code.extend(out_loop(100, 0x00ff_0000)); // invalid encodings
    code.extend(EXIT_0);
    let dir = scratch("hostile");
    let elf = dir.join("hostile.elf");
    write_pvh_elf(&elf, 0x100000, &code);
    let (code, v, out, err) = run_json(
        &["--kernel", elf.to_str().unwrap(), "--mem", "16"],
        &dir,
        "hostile",
    );
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert_eq!(v["telemetry_valid"], false, "{v}");
    let problems: Vec<&str> = v["telemetry_problems"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let has = |needle: &str| problems.iter().any(|p| p.contains(needle));
    assert!(has("went backwards"), "{problems:?}");
    assert!(has("unknown phase id 7"), "{problems:?}");
    assert!(has("flood"), "{problems:?}");
    assert!(has("not valid markers"), "{problems:?}");
    // The reader's warning beside the figures (the verdict itself is
    // `telemetry_valid` above): the text is the feature here.
    assert!(err.contains("guest telemetry: INVALID"), "{err}");
    // Guest-reported rows are withheld; host-observed ones stay.
    assert!(summary_row(&v, "syscalls").is_none() && summary_row(&v, "elapsed").is_some());
}

#[test]
fn live_metrics_stream_json_lines() {
    if !kvm_or_skip("live_metrics") {
        return;
    }
    let dir = scratch("live");
    let path = dir.join("metrics.jsonl");
    let o = run_getpid("on", 2000)
        .args([
            "--metrics-interval",
            "10",
            "--metrics-out",
            path.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    assert!(lines.len() >= 3, "{text}");
    let mut syscalls = 0;
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["schema"], "ptiscope.metrics/1");
        assert_eq!(l["seq"].as_u64(), Some(i as u64));
        syscalls += l["guest"]["syscalls"].as_u64().unwrap_or(0);
    }
    // The lines' deltas add up to everything the guest did (2000 calls + markers).
    assert!((2001..2010).contains(&syscalls), "{syscalls}: {text}");
    let exits: u64 = lines
        .iter()
        .filter_map(|l| l["kvm_vcpu"][0]["exits"].as_u64())
        .sum();
    if host_is_kvm_pvm(
        "live_metrics: 2 KVM exits per call",
        "only kvm_pvm exits on every guest kernel entry and return",
    ) {
        assert!(exits >= 4000, "{exits}");
    } else {
        // Every line still carries vCPU 0's exits counter.
        assert!(
            lines.iter().all(|l| l["kvm_vcpu"][0]["exits"].is_u64()),
            "{text}"
        );
    }
}

#[test]
fn cpu_vuln_drives_pti_auto() {
    if !kvm_or_skip("cpu_vuln_drives_pti_auto") {
        return;
    }
    // --cpu-vuln needs the VMM to answer the guest's RDMSR of
    // ARCH_CAPABILITIES (KVM_SET_MSRS or a user-space MSR exit): hosts
    // differ, the probe says which; where neither works it is refused.
    let probe = ptiscope::probe::run(&ptiscope::probe::ProbeOptions::default()).unwrap();
    if !probe.arch_capabilities.vmm_controls_value() {
        let o = ptiscope()
            .args(["run", "--pti", "auto", "--cpu-vuln", "none"])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(69), "{}", stderr(&o));
        ptiscope::test_support::skip(
            "cpu_vuln_drives_pti_auto",
            &format!(
                "this KVM lets the VMM set IA32_ARCH_CAPABILITIES neither by KVM_SET_MSRS nor by a \
                 user-space MSR exit (probe: {}); --cpu-vuln is refused (checked)",
                probe.arch_capabilities.detail
            ),
        );
        return;
    }
    let dir = Scratch::new("cpu-vuln");
    for (vuln, pti) in [("none", "off"), ("meltdown", "on")] {
        let (o, v) = output_and_json(
            ptiscope()
                .args(["run", "--pti", "auto", "--cpu-vuln", vuln])
                .args(["--workload", "getpid", "--iterations", "10"]),
            &dir,
            vuln,
        );
        let (out, err) = (stdout(&o), stderr(&o));
        assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
        // The VMM left the choice to the guest (the document's config);
        // the guest made it (its @result line: the document does not
        // record what `auto` became), and the CR3 writes follow it.
        assert!(config_has(&v, "pti=auto"), "--cpu-vuln {vuln}: {v}");
        let r = result_line(&out);
        assert_eq!(r["pti"], pti, "--cpu-vuln {vuln}: {r:?}");
        let cr3 = if pti == "off" { 0.0 } else { 22.0 };
        assert_eq!(row_total(&v, "cr3_writes"), cr3, "--cpu-vuln {vuln}: {v}");
    }
}

#[test]
fn what_the_host_cannot_run_is_refused_before_boot() {
    if !kvm_or_skip("refusals") {
        return;
    }
    let probe = ptiscope::probe::run(&ptiscope::probe::ProbeOptions::default()).unwrap();
    let working = probe.working_entries();
    for &e in ptiscope_abi::options::Entry::ALL {
        if e == ptiscope_abi::options::Entry::Sysenter {
            continue; // the 32-bit flavour's entry; the 64-bit guest may not have it
        }
        if working.contains(&e) {
            continue;
        }
        let o = ptiscope()
            .args(["run", "--entry", e.name()])
            .output()
            .unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(69), "--entry {e}: {err}");
        assert!(err.contains("does not deliver it"), "{err}");
        assert!(
            !stdout(&o).contains("ptiscope guest"),
            "the guest must not boot"
        );
    }
    if !probe.pcid() {
        let o = ptiscope().args(["run", "--pcid", "on"]).output().unwrap();
        assert_eq!(o.status.code(), Some(69), "{}", stderr(&o));
        assert!(stderr(&o).contains("no usable PCID"));
    }
}
