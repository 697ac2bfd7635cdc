//! scripts/kernel-gate.sh builds the compare it runs: both sides on
//! GATE_CPU (default Skylake-Client-v1, where Linux turns PTI on by
//! itself), a side's own `cpu=` kept, and its first line saying which path
//! it measures. Checked with a stand-in for ptiscope that prints its
//! arguments (the gate's real runs are in docs/ci-gate.md).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::*;

/// Runs the gate with `PTISCOPE` a script that prints each argument on a
/// line; its exit code, stdout and stderr.
fn gate(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> (Option<i32>, String, String) {
    let stand_in = dir.join("ptiscope");
    std::fs::write(
        &stand_in,
        "#!/bin/sh\nfor a in \"$@\"; do echo \"arg:$a\"; done\n",
    )
    .unwrap();
    std::fs::set_permissions(&stand_in, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/kernel-gate.sh");
    let o = std::process::Command::new("bash")
        .arg(script)
        .args(args)
        .env("PTISCOPE", &stand_in)
        .envs(env.iter().copied())
        .output()
        .expect("run bash");
    (o.status.code(), stdout(&o), stderr(&o))
}

#[test]
fn the_gate_measures_the_production_path_by_default_and_says_so() {
    let dir = scratch("kernel-gate");
    let (code, out, err) = gate(&dir, &[], &["before/bzImage", "after/bzImage", "3"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.lines().next().is_some_and(|l| {
            l.starts_with(
            "kernel-gate: CPU model Skylake-Client-v1 (GATE_CPU): the path a production kernel runs"
        )
        }),
        "{out}"
    );
    for want in [
        "arg:linux=before/bzImage,cpu=Skylake-Client-v1",
        "arg:linux=after/bzImage,cpu=Skylake-Client-v1",
        "arg:kernel_instructions_per_call.delta>3",
    ] {
        assert!(out.lines().any(|l| l == want), "{want}: {out}");
    }

    // A side's own model wins; GATE_CPU=max says what it measures then.
    let (code, out, err) = gate(
        &dir,
        &[("GATE_CPU", "max")],
        &["debian-amd64", "debian-amd64,cpu=EPYC-Milan"],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("CPU model max (GATE_CPU)") && out.contains("without PTI"),
        "{out}"
    );
    assert!(
        out.lines().any(|l| l == "arg:linux=debian-amd64,cpu=max"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l == "arg:linux=debian-amd64,cpu=EPYC-Milan"),
        "{out}"
    );

    // Not a model name: refused before anything runs.
    let (code, out, err) = gate(&dir, &[("GATE_CPU", "max,append=x")], &["a", "b"]);
    assert_eq!(code, Some(64), "{out}{err}");
    assert!(
        err.contains("GATE_CPU must be a QEMU CPU model name"),
        "{err}"
    );
    assert!(!out.contains("arg:"), "{out}");
    let _ = std::fs::remove_dir_all(dir);
}
