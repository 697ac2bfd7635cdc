//! The experiment runner and the backends behind it, through the commands:
//! `--qemu-arg`s that turn on KVM acceleration are refused (ptiscope gives
//! QEMU its accelerator, TCG, itself), and compare's interleaved
//! runs and warm-up reach its `--json` as asked.

mod common;

use common::*;

fn ptiscope_err(args: &[&str]) -> (Option<i32>, String, String) {
    let o = ptiscope().args(args).output().unwrap();
    let (out, err) = (stdout(&o), stderr(&o));
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    (o.status.code(), out, err)
}

const KVM_ACCEL: [&[&str]; 4] = [
    &["--qemu-arg=-enable-kvm"],
    &["--qemu-arg=-accel", "--qemu-arg=kvm"],
    &["--qemu-arg=-machine", "--qemu-arg=q35,accel=kvm"],
    &["--qemu-arg=-M", "--qemu-arg=accel=tcg:kvm"],
];

#[test]
fn kvm_acceleration_is_refused_before_anything_runs() {
    // ptiscope gives QEMU -accel tcg with or without its plugin (QEMU
    // refuses -enable-kvm and -machine accel= beside it and ignores a
    // second -accel), so every spelling is refused, --no-plugin or not.
    for command in [
        &["run"][..],
        &["compare", "--runs", "1"],
        &["sweep", "--wss", "0", "--runs", "1"],
    ] {
        for plugin in [&[][..], &["--no-plugin"]] {
            for accel in KVM_ACCEL {
                let mut args = command.to_vec();
                args.extend(["--backend", "qemu"]);
                args.extend_from_slice(plugin);
                args.extend_from_slice(accel);
                let (code, out, err) = ptiscope_err(&args);
                assert_eq!(code, Some(64), "{args:?}: {err}");
                // `q35,accel=kvm` is refused for its machine type first.
                assert!(
                    (err.contains("KVM acceleration") && err.contains("--backend kvm"))
                        || err.contains("-machine's type="),
                    "{args:?}: {err}"
                );
                // Refused before the header: nothing was measured.
                assert!(!out.contains("ptiscope compare:"), "{args:?}: {out}");
                assert!(!out.contains("ptiscope sweep:"), "{args:?}: {out}");
            }
        }
    }
}

#[test]
fn qemu_options_that_ptiscope_does_not_set_are_not_acceleration() {
    // The next check (a side whose options do not parse) is what stops the
    // compare, before any run.
    for extra in [
        &["--qemu-arg=-icount", "--qemu-arg=shift=0,align=off"][..],
        &["--qemu-arg=-machine", "--qemu-arg=usb=off"],
        &["--qemu-arg=-plugin", "--qemu-arg=libexeclog.so"],
    ] {
        let mut args = vec!["compare", "--backend", "qemu", "--baseline", "pti=maybe"];
        args.extend_from_slice(extra);
        let (code, _, err) = ptiscope_err(&args);
        assert_eq!(code, Some(64), "{err}");
        assert!(err.contains("bad value for pti"), "{args:?}: {err}");
    }
}

#[test]
fn compare_runs_interleaved_pairs_after_its_warm_up() {
    if !kvm_or_skip("compare_runs_interleaved_pairs_after_its_warm_up") {
        return;
    }
    let dir = scratch("experiment-warmup");
    let json = dir.join("c.json");
    let o = ptiscope()
        .args([
            "compare",
            "--runs",
            "2",
            "--warmup",
            "1",
            "--iterations",
            "200",
        ])
        .args(["--quiet", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = json_or_null(&json);
    let runs = &v["runs"];
    assert_eq!(runs["mode"], "fixed", "{runs}");
    assert_eq!(runs["per_side"], 2, "{runs}");
    assert_eq!(runs["warmup"], 1, "{runs}");
    assert_eq!(runs["stopped"], "fixed", "{runs}");
    // Every metric has the measured runs only (the warm-up pair discarded).
    let metrics = v["metrics"].as_array().unwrap();
    assert!(!metrics.is_empty(), "{v}");
    for m in metrics {
        for side in ["baseline", "compare"] {
            assert_eq!(
                m[side]["samples"].as_array().map(Vec::len),
                Some(2),
                "{}: {side}",
                m["name"]
            );
        }
    }
    // The compare side (pti=on) writes CR3 on every entry and exit, the
    // baseline never: an exact count, the same in every run.
    let cr3 = metrics
        .iter()
        .find(|m| m["name"] == "cr3_writes_per_call")
        .expect("cr3_writes_per_call");
    assert!(cr3["baseline"]["samples"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s.as_f64() == Some(0.0)));
    assert!(cr3["compare"]["samples"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s.as_f64().is_some_and(|x| x >= 2.0)));
    let _ = std::fs::remove_dir_all(&dir);
}
