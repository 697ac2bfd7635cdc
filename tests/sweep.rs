//! `ptiscope sweep`, end to end: the grid it runs, its JSON/CSV/SVG, bad
//! usage, the i386 flavour under QEMU, and the TLB half of PTI's cost:
//! where the host shows it (the probe's `cr3_write_refill`), with PTI the
//! user loop's reads of a 4 MiB working set take longer per call than
//! without (the guest's own user-mode timing of its reads, medians of
//! interleaved runs; a one-sided check with a wide margin); and the probe's
//! verdict agrees with that direct measurement wherever it is clear.

mod common;

use common::*;
use serde_json::Value;

/// The tests that boot guests take turns: on a 2-core machine a QEMU run
/// beside a timed sweep would measure the QEMU run.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn sweep(args: &[&str], dir: &std::path::Path) -> (Option<i32>, Value, String) {
    let json = dir.join("sweep.json");
    let _ = std::fs::remove_file(&json);
    let o = ptiscope()
        .args(["sweep", "--quiet", "--json", json.to_str().unwrap()])
        .args(args)
        .output()
        .unwrap();
    let v = json_or_null(&json);
    (o.status.code(), v, stdout(&o) + &stderr(&o))
}

/// A [`sweep`] of the [`TWO_CELLS`] grid and `args`, in its turn, in the
/// scratch directory `name`.
fn two_cell_sweep(name: &str, args: &[&str]) -> (Option<i32>, Value, String) {
    let _turn = turn();
    let dir = Scratch::new(name);
    sweep(&[&TWO_CELLS[..], args].concat(), &dir)
}

fn cell<'a>(v: &'a Value, wss: u64, spec: &str) -> &'a Value {
    v["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["wss"] == wss && c["touches_spec"] == spec)
        .unwrap_or_else(|| panic!("no cell wss={wss} {spec} in {v}"))
}

#[test]
fn a_small_sweep_has_every_cell_and_output() {
    if !kvm_or_skip("sweep outputs") {
        return;
    }
    let _turn = turn();
    let dir = scratch("sweep-out");
    let (csv, svg) = (dir.join("s.csv"), dir.join("s.svg"));
    let (code, v, out) = sweep(
        &[
            "--wss",
            "0,64K",
            "--touches",
            "1x,100",
            "--runs",
            "2",
            "--iterations",
            "200",
            "--config",
            "pti=off",
            "--config",
            "pti=on",
            "--config",
            "pti=on,cmdline=pti_global_text=on",
            "--csv",
            csv.to_str().unwrap(),
            "--svg",
            svg.to_str().unwrap(),
        ],
        &dir,
    );
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(v["schema"], "ptiscope.sweep/1");
    assert_eq!(v["time_metric"], "ns_per_call");
    // wss=0 is one cell; 64K has two (one pass = 16 reads, and 100 reads).
    assert_eq!(v["cells"].as_array().unwrap().len(), 3, "{v}");
    let c = cell(&v, 65536, "100");
    assert_eq!(c["touches"], 100);
    assert_eq!(c["pages"], 16);
    assert_eq!(cell(&v, 65536, "1x")["touches"], 16);
    // Every JSON report records where it came from.
    assert!(v["environment"]["host"].is_object(), "{}", v["environment"]);
    let pvm = ran_on_kvm_pvm(
        &v,
        "sweep outputs: one KVM tlb_flush per call with PTI",
        "that is kvm_pvm's shadow MMU",
    );
    for c in v["cells"].as_array().unwrap() {
        let configs = c["configs"].as_array().unwrap();
        assert_eq!(configs.len(), 3);
        assert!(c["syscall_rate"].as_f64().unwrap() > 0.0);
        for (i, k) in configs.iter().enumerate() {
            assert_eq!(k["samples"].as_array().unwrap().len(), 2);
            // The statistics of compare, per cell: a mean with its CI from
            // the two runs, and a Welch p and verdict against the baseline.
            let ci = &k["mean_ci95"];
            assert!(
                ci["low"].as_f64().unwrap() <= ci["mean"].as_f64().unwrap(),
                "{k}"
            );
            assert!(
                ci["mean"].as_f64().unwrap() <= ci["high"].as_f64().unwrap(),
                "{k}"
            );
            if i == 0 {
                assert!(k["welch_p"].is_null() && k["significant"].is_null(), "{k}");
            } else {
                assert!(k["significant"].is_boolean(), "{k}");
            }
            // The exact counts hold in every cell: 2 CR3 writes per call
            // with PTI (N + 1 calls in the phase), none without.
            let cr3 = k["cr3_writes_per_call"].as_f64().unwrap();
            assert_eq!(cr3, if i == 0 { 0.0 } else { 2.0 }, "{k}");
            // KVM: one flush per kernel->user switch, whatever the working
            // set (16 or 100 reads of 16 pages per call). KVM's own flushes
            // when the host preempts the vCPU come on top: two per
            // preemption, a few per 201-call run on a busy host, hence the
            // margin (0.2 per call is 40 flushes in a run).
            let flush = k["tlb_flush_per_call"].as_f64().unwrap();
            if !pvm {
                // Other KVMs flush per CR3 write (shadow paging) or not at
                // all for guest CR3 writes (EPT/NPT): checked in the runs'
                // own cross-checks, not here.
            } else if i == 0 {
                assert!(flush < 0.2, "{k}");
            } else {
                assert!((0.99..1.2).contains(&flush), "{k}");
            }
            assert_eq!(k["delta"].is_null(), i == 0);
        }
        let refill = &configs[1]["refill_per_page"];
        assert_eq!(refill.is_null(), c["wss"] == 0, "{c}");
    }
    // 1 % and 5 % for each working set and compare configuration.
    assert_eq!(v["crossings"].as_array().unwrap().len(), 2 * 2 * 2);
    let csv = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(csv.lines().count(), 1 + 3 * 3, "{csv}");
    assert!(csv.starts_with("wss,touches_spec,"));
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("<polyline"), "a curve per working set");
    assert!(svg.contains("overhead of pti=on"), "and a heat map");
    assert!(svg.contains("user-mode refill"), "and the refill per page");
    render_png(&svg, "sweep-small");
    let _ = std::fs::remove_dir_all(dir);
}

/// The 4 MiB sweep both refill tests read (run once per test binary): its
/// exit code, JSON and output.
fn sweep_4m() -> &'static (Option<i32>, Value, String) {
    static SWEEP: std::sync::OnceLock<(Option<i32>, Value, String)> = std::sync::OnceLock::new();
    SWEEP.get_or_init(|| {
        let _turn = turn();
        let dir = scratch("sweep-delta");
        let r = sweep(
            &[
                "--wss",
                "0,4M",
                "--touches",
                "1x",
                "--runs",
                "5",
                "--iterations",
                "1000",
                "--config",
                "pti=off",
                "--config",
                "pti=on",
            ],
            &dir,
        );
        let _ = std::fs::remove_dir_all(dir);
        r
    })
}

/// The user loop's own reads of the 4 MiB working set, timed by the guest
/// in user mode (RDTSC around each iteration's reads; the fewest cycles of
/// one iteration, median over the runs): with PTI's CR3 switches minus
/// without, per page (1024 pages): what a refill after every flushing CR3
/// write costs, measured directly in the real guest.
fn direct_growth_per_page(v: &Value, out: &str) -> (f64, f64, f64) {
    let c4 = cell(v, 4 << 20, "1x");
    let reads = |i: usize| {
        c4["configs"][i]["read_cycles_min"]
            .as_f64()
            .unwrap_or_else(|| panic!("no read_cycles_min for config {i}:\n{out}"))
    };
    let (off, on) = (reads(0), reads(1));
    ((on - off) / 1024.0, off, on)
}

/// The probe's verdict as the sweep's JSON carries it, and its figure.
fn sweep_verdict(v: &Value) -> (String, String) {
    let r = &v["cr3_write_refill"];
    (
        r["verdict"].as_str().unwrap_or("missing").to_owned(),
        r.to_string(),
    )
}

#[test]
fn pti_costs_the_4m_working_set_a_refill_per_call() {
    if !kvm_or_skip("PTI refill grows with the working set") {
        return;
    }
    let (code, v, out) = sweep_4m();
    assert_eq!(*code, Some(0), "{out}");
    assert!(cell(v, 0, "-")["configs"][1]["read_cycles_min"].is_null());
    // Only where the host makes user code walk its pages in again after a
    // guest CR3 write (the probe's cr3_write_refill) is there a refill to see.
    let (verdict, probe) = sweep_verdict(v);
    // `disputed`: the probe saw no refill but the sweep's own reads did.
    if verdict != "visible" && verdict != "disputed" {
        ptiscope::test_support::skip(
            "PTI refill grows with the working set",
            &format!(
                "the probe finds a guest CR3 write costs user code no TLB refill on this host \
                 (cr3_write_refill {verdict}: {probe}); `ptiscope probe` has the figures"
            ),
        );
        return;
    }
    // Where it shows (Intel Xeon under kvm_pvm): measured ~5-6 cycles per
    // page (~15k vs ~10k cycles per call); the check asks for 1 cycle per
    // page. Without a working set there are no reads.
    let (per_page, off, on) = direct_growth_per_page(v, out);
    assert!(
        per_page > 1.0,
        "with PTI the 4 MiB working set's reads should take over 1 cycle per page more \
         ({on:.0} vs {off:.0} cycles per call; probe {probe}):\n{out}"
    );
    // The same refill in the whole call (host clock), against the delta
    // without a working set, is what Gregg's plot shows; on this shared
    // 2-core machine other load moves a call by tens of µs, more than the
    // ~10 µs refill, so that form is printed by the sweep but not asserted.
}

/// Below this many cycles per page of direct growth the guest's reads
/// clearly pay no refill (the hidden host: 0-0.4 typically, 1.0-1.6 on an
/// AMD EPYC family 25 host); above the sweep's own bound
/// (`RefillVisibility::DIRECT_VISIBLE_CYCLES_PER_PAGE`, 8) they clearly do.
/// In between the direct measurement decides nothing and the check skips,
/// saying so: on a busy 2-core AMD host with no refill one side's fewest
/// read cycles were seen 2.1 and 4.59 cycles per page apart, as far apart
/// as an Intel host's real refill (5-6).
const CLEARLY_HIDDEN: f64 = 1.0;
const CLEARLY_VISIBLE: f64 =
    ptiscope::report::sweep::RefillVisibility::DIRECT_VISIBLE_CYCLES_PER_PAGE;

#[test]
fn the_probes_refill_verdict_agrees_with_the_guests_own_reads() {
    if !kvm_or_skip("refill verdict against the guest's reads") {
        return;
    }
    let (code, v, out) = sweep_4m();
    assert_eq!(*code, Some(0), "{out}");
    let (verdict, probe) = sweep_verdict(v);
    assert!(
        ["visible", "not_visible", "disputed", "unknown"].contains(&verdict.as_str()),
        "the sweep carries the probe's verdict: {probe}"
    );
    if verdict == "unknown" {
        ptiscope::test_support::skip(
            "refill verdict against the guest's reads",
            &format!("the probe could not measure here: {probe}"),
        );
        return;
    }
    let (per_page, off, on) = direct_growth_per_page(v, out);
    let seen = format!(
        "direct: the real guest's reads of 4 MiB take {per_page:.2} cycles per page more with PTI \
         ({on:.0} vs {off:.0} cycles per call); probe: {probe}"
    );
    println!("refill verdict check: {seen}");
    if per_page <= CLEARLY_HIDDEN {
        assert_eq!(
            verdict, "not_visible",
            "no growth, yet the probe says visible: {seen}"
        );
    } else if per_page >= CLEARLY_VISIBLE {
        // Where the probe missed a growth this clear, the sweep says so
        // (`disputed`) and shows its figures instead of hiding them; a
        // growth inside the runs' spread is not clear, and the check skips.
        let c4 = cell(v, 4 << 20, "1x");
        let spread = |i: usize| c4["configs"][i]["read_cycles_min_spread"].as_f64();
        let clear = match (spread(0), spread(1)) {
            (Some(a), Some(b)) => (on - off) > a + b,
            _ => true,
        };
        if !clear {
            ptiscope::test_support::skip(
                "refill verdict against the guest's reads",
                &format!("the direct growth is inside the runs' spread ({seen})"),
            );
            return;
        }
        assert!(
            verdict == "visible" || verdict == "disputed",
            "growth, yet the sweep hides it: {seen}"
        );
        if verdict == "disputed" {
            assert!(
                out.contains("refill per page: disputed"),
                "a disputed verdict is named in the text:\n{out}"
            );
            ptiscope::test_support::skip(
                "the probe's own refill verdict",
                &format!("the probe missed a refill the real guest's reads show; the sweep names the dispute ({seen})"),
            );
        }
    } else {
        ptiscope::test_support::skip(
            "refill verdict against the guest's reads",
            &format!(
                "the direct measurement is between {CLEARLY_HIDDEN} and {CLEARLY_VISIBLE} cycles \
                 per page, too close to call either way ({seen})"
            ),
        );
    }
    // Where the host hides the refill, the text says so instead of a figure.
    if verdict == "not_visible" {
        assert!(out.contains("refill hidden by this host: probe"), "{out}");
    }
}

#[test]
fn poundsyscall_sweeps_with_one_thread_per_vcpu() {
    if !kvm_or_skip("poundsyscall sweep") {
        return;
    }
    let (code, v, out) = two_cell_sweep(
        "sweep-pound",
        &[
            "--workload",
            "poundsyscall",
            "--cpus",
            "2",
            "--iterations",
            "200",
            "--config",
            "pti=off",
            "--config",
            "pti=on",
        ],
    );
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        (v["workload"].as_str(), v["cpus"].as_u64()),
        (Some("poundsyscall"), Some(2))
    );
    assert_eq!(v["cells"].as_array().unwrap().len(), 2, "{v}");
    for c in v["cells"].as_array().unwrap() {
        let configs = c["configs"].as_array().unwrap();
        // Per getppid of both threads: 2 CR3 writes with PTI, within the
        // few of the phase's exits and waits, none without.
        let cr3 = |i: usize| configs[i]["cr3_writes_per_call"].as_f64().unwrap();
        assert!(cr3(0) < 0.01 && (2.0..2.05).contains(&cr3(1)), "{c}");
        assert!(configs[1]["median"].as_f64().unwrap() > 0.0, "{c}");
    }
}

#[test]
fn bad_sweep_usage_is_refused() {
    for (args, what) in [
        (vec!["--wss", "0,lots"], "--wss"),
        (vec!["--wss", "2G"], "--wss"),
        (vec!["--touches", "0x"], "at least one pass"),
        (vec!["--touches", "y"], "--touches"),
        (vec!["--stride", "12"], "--stride"),
        (vec!["--config", "pti=on"], "at least two"),
        (vec!["--config", "pti=off", "--config", "pti=maybe"], "pti"),
        (vec!["--workload", "sched-messaging"], "syscall-loop"),
        (vec!["--cpus", "9"], "--cpus"),
        (vec!["--wss", "64M", "--mem", "64"], "--mem"),
    ] {
        assert_refused(&[&["sweep"][..], &args].concat(), 64, &[what]);
    }
}

#[test]
fn the_i386_flavour_sweeps_under_qemu() {
    if !qemu_i386_or_skip("i386 sweep") {
        return;
    }
    let (code, v, out) = two_cell_sweep(
        "sweep-i386",
        &[
            "--arch",
            "i386",
            "--backend",
            "qemu",
            "--iterations",
            "50",
            "--timeout",
            "120",
        ],
    );
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(v["time_metric"], "cycles_per_call");
    assert_eq!(v["time_source"], "guest");
    // Default configurations: pti=off, pti=on, pti=on + global text; no
    // PCID in PAE, said so.
    assert_eq!(v["configs"].as_array().unwrap().len(), 3, "{v}");
    assert!(v["omitted"][0]["reason"]
        .as_str()
        .unwrap()
        .contains("PAE paging has no PCID"));
    let c = cell(&v, 65536, "1x");
    assert!(c["configs"][1]["median"].as_f64().unwrap() > 0.0);
    assert_eq!(c["configs"][1]["cr3_writes_per_call"], 2.0);
    // No host clock: no syscall rates, so no crossings.
    assert!(v["crossings"].as_array().unwrap().is_empty());
    assert_eq!(v["time_unit"], "cycles");
    assert!(v["cells"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["syscall_rate"].is_null()));
}
