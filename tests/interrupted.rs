//! Nothing lost: an interrupted `compare` prints and writes its complete
//! pairs marked partial; a document is renamed into place only when
//! complete, so an earlier result survives a run that never writes it (a run
//! whose guest ran writes how it ended, however it ended); two
//! outputs given one file are refused.

mod common;

use std::time::Duration;

use common::*;

#[test]
fn sigint_stops_a_compare_and_keeps_its_complete_pairs() {
    let test = "sigint_stops_a_compare_and_keeps_its_complete_pairs";
    let Some(dir) = kvm_scratch_or_skip(test, "compare-sigint") else {
        return;
    };
    let json = dir.join("c.json");
    let csv = dir.join("c.csv");
    // What one pair takes here, start-up included (the compare prints no
    // progress to a pipe to wait for): ~0.2 s on kvm_pvm, seconds under a
    // nested KVM in QEMU TCG, where the probe runs at TCG's speed.
    let start = std::time::Instant::now();
    let one = ptiscope()
        .args(["compare", "--baseline", "pti=off", "--compare", "pti=on"])
        .args(["--runs", "1", "--iterations", "20", "--quiet"])
        .output()
        .unwrap();
    assert_eq!(one.status.code(), Some(0), "{}", stderr(&one));
    let pair = start.elapsed();
    let child = spawn_writing(
        ptiscope()
            .args(["compare", "--baseline", "pti=off", "--compare", "pti=on"])
            // 1000 pairs take ~40 s on kvm_pvm: far more than the wait
            // before the signal, which is a few pairs' time.
            .args(["--runs", "1000", "--iterations", "20", "--quiet"]),
        &json,
        &csv,
    );
    std::thread::sleep((4 * pair).max(Duration::from_secs(2)));
    assert!(!json.exists(), "--json appeared before the compare ended");
    let (text, _) = interrupt(child);
    assert!(
        text.contains("PARTIAL: interrupted by SIGINT during "),
        "{text}"
    );
    let v = read_json(&json);
    assert_eq!(v["schema"], "ptiscope.compare/1");
    assert_eq!(v["runs"]["stopped"], "partial", "{}", v["runs"]);
    let per_side = v["runs"]["per_side"].as_u64().unwrap();
    assert!((1..1000).contains(&per_side), "{}", v["runs"]);
    // The run the signal stopped, as data: SIGINT's exit code, and its
    // VM's stop (none when the signal came before the guest ran).
    let run = &v["partial"]["run"];
    assert_eq!(run["exit_code"], 130, "{}", v["partial"]);
    let stop = &run["stop"];
    assert!(
        stop.is_null() || (stop["code"] == "signal" && stop["signal"] == libc::SIGINT),
        "{}",
        v["partial"]
    );
    assert!(std::fs::read_to_string(&csv)
        .unwrap()
        .starts_with("# PARTIAL: "));
}

#[test]
fn an_earlier_json_survives_a_run_that_never_writes_it() {
    let dir = scratch("json-survives");
    let json = dir.join("r.json");
    std::fs::write(&json, "{\"earlier\": true}\n").unwrap();
    // Refused after the outputs are opened (preflight: a cmdline key the
    // VMM owns), so no document is written.
    let out = ptiscope()
        .args(["run", "--cmdline", "cpus=2", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(&json).unwrap(),
        "{\"earlier\": true}\n"
    );
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["r.json"], "a temporary file was left behind");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run that fails (the guest faults) writes its `--json` all the same,
/// replacing an earlier one: its `stop` and `exit_code` say how it ended
/// (the guest's own status 2, its `@fault` line's fields); nothing else is
/// left beside it.
#[test]
fn a_run_that_fails_writes_how_it_ended() {
    let test = "a_run_that_fails_writes_how_it_ended";
    if !qemu_or_skip(test, "qemu-system-x86_64") {
        return;
    }
    let dir = scratch("json-failure");
    let json = dir.join("r.json");
    std::fs::write(&json, "{\"earlier\": true}\n").unwrap();
    let out = ptiscope()
        .args(["run", "--backend", "qemu", "--no-plugin", "--timeout", "60"])
        .args(["--workload", "getpid", "--cmdline", "fault=ud", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let v = read_json(&json);
    assert_eq!(v["exit_code"], 2, "{v}");
    let stop = &v["stop"];
    assert_eq!(
        (&stop["code"], &stop["status"]),
        (&"guest_exit".into(), &2.into()),
        "{stop}"
    );
    assert_eq!(stop["guest_faults"][0]["name"], "#UD", "{stop}");
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["r.json"], "a temporary file was left behind");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Linux run that `--timeout` stops before the kernel reaches
/// ptiscope's init writes its document too: the VM's stop (the timeout)
/// and the Linux guest's end (`failure`, `boot_timeout`) as data, with the
/// words stderr says.
#[test]
fn a_linux_run_that_times_out_writes_its_failure() {
    let test = "a_linux_run_that_times_out_writes_its_failure";
    if !plugin_or_skip(test, "qemu-system-x86_64") {
        return;
    }
    match ptiscope::preflight::linux::known_path("debian-amd64") {
        Some(Ok(p)) if p.is_file() => {}
        _ => {
            ptiscope::test_support::skip(
                test,
                "debian-amd64 is not fetched (ptiscope linux fetch)",
            );
            return;
        }
    }
    let dir = Scratch::new("linux-timeout");
    let (o, v) = output_and_json(
        ptiscope().args([
            "run",
            "--backend",
            "qemu",
            "--linux",
            "debian-amd64",
            "--workload",
            "getppid",
            "--timeout",
            "0.5",
        ]),
        &dir,
        "run",
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(124), "{err}");
    assert_eq!(v["exit_code"], 124, "{v}");
    let stop = stop_of(&v);
    assert_eq!(
        (&stop["code"], &stop["after_ms"]),
        (&"timeout".into(), &500.into()),
        "{stop}"
    );
    let failure = &v["failure"];
    assert_eq!(
        (&failure["code"], &failure["after_ms"]),
        (&"boot_timeout".into(), &500.into()),
        "{v}"
    );
    // The words are the ones stderr gave.
    let text = failure["text"].as_str().unwrap_or_default();
    assert!(!text.is_empty() && err.contains(text), "{text}\n{err}");
}

/// `cmd`, started with `signal` already pending (blocked across exec):
/// the first place the command looks at signals takes it.
fn with_pending(cmd: &mut std::process::Command, signal: i32) -> &mut std::process::Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: runs in the forked child before exec; sigprocmask, getpid
    // and kill are async-signal-safe and touch only the child's state.
    unsafe {
        cmd.pre_exec(move || {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, signal);
            libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            // Process-directed, as a kill(1) from the user is: whichever
            // thread looks first takes it.
            libc::kill(libc::getpid(), signal);
            Ok(())
        })
    }
}

/// A signal while the kernel image is read (the first thing `--linux` and
/// `--kernel` runs do with a file) ends run, compare and sweep with
/// 128 + the signal, naming it, for either backend, nothing booted.
#[test]
fn a_signal_while_the_image_is_read_ends_every_command_with_128_plus_it() {
    let dir = scratch("signal-reading");
    let image = dir.join("vmlinuz");
    // Any regular file: the read is interrupted before its bytes matter.
    std::fs::write(&image, vec![0u8; 4096]).unwrap();
    let image = image.to_str().unwrap();
    for (signal, command) in [
        (
            libc::SIGTERM,
            &["run", "--backend", "qemu", "--linux", image][..],
        ),
        (libc::SIGINT, &["run", "--kernel", image]),
        (
            libc::SIGHUP,
            &["run", "--backend", "qemu", "--kernel", image],
        ),
        (
            libc::SIGTERM,
            &[
                "compare",
                "--runs",
                "1",
                "--backend",
                "qemu",
                "--linux",
                image,
            ],
        ),
        (libc::SIGINT, &["compare", "--runs", "1", "--kernel", image]),
        (
            libc::SIGTERM,
            &["sweep", "--backend", "qemu", "--linux", image],
        ),
        (libc::SIGHUP, &["sweep", "--kernel", image]),
    ] {
        let out = with_pending(ptiscope().args(command), signal)
            .output()
            .unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(128 + signal), "{command:?}: {err}");
        // Named (sweep may take it while checking its grid, just before).
        let name = match signal {
            libc::SIGTERM => "SIGTERM",
            libc::SIGINT => "SIGINT",
            _ => "SIGHUP",
        };
        assert!(err.contains(name), "{command:?}: {err}");
        if command[0] != "sweep" {
            assert!(err.contains("while reading"), "{command:?}: {err}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `reproduce`: a signal while a Linux cell's kernel is read stops the
/// reproduction there: the later cells are not run, the PARTIAL line is
/// printed, the exit status is 128 + the signal.
#[test]
fn a_signal_while_a_cell_image_is_read_ends_a_reproduction_partial() {
    let test = "a_signal_while_a_cell_image_is_read_ends_a_reproduction_partial";
    let fetched = ptiscope::preflight::linux::known_path("debian-amd64")
        .and_then(Result::ok)
        .is_some_and(|p| p.is_file());
    if !fetched {
        ptiscope::test_support::skip(test, "debian-amd64 is not fetched");
        return;
    }
    let out = with_pending(
        ptiscope().args(["reproduce", "tarreau-2018", "--no-companion"]),
        libc::SIGTERM,
    )
    .output()
    .unwrap();
    let (text, err) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(143), "{text}\n{err}");
    assert!(text.contains("PARTIAL: stopped by SIGTERM"), "{text}");
    assert!(text.contains("not run: stopped by SIGTERM"), "{text}");
    assert_eq!(
        err.matches("ptiscope reproduce: Linux").count(),
        1,
        "a cell after the signal was measured: {err}"
    );
}

/// A termination signal no part of the command looked at (here: pending
/// from the start, blocked across exec, on a command with nothing to
/// interrupt) is not swallowed: the process ends with 128 + the signal
/// once the command is done, and says so.
#[test]
fn a_signal_the_command_never_looked_at_still_ends_it_with_128_plus_it() {
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // A fetch that stops at once, before any tool (its cache is a file).
        let file = scratch("pending-signal").join("a-file");
        std::fs::write(&file, "").unwrap();
        let mut cmd = ptiscope();
        cmd.args(["linux", "fetch", "--only", "debian-amd64"])
            .env("PTISCOPE_LINUX_CACHE", &file);
        with_pending(&mut cmd, signal);
        let out = cmd.output().unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(128 + signal), "{err}");
        assert!(err.contains("after the command finished"), "{err}");
    }
}

#[test]
fn two_outputs_given_one_file_are_refused() {
    let dir = scratch("same-path");
    let f = dir.join("out");
    let f = f.to_str().unwrap();
    for args in [
        vec!["compare", "--json", f, "--csv", f],
        vec!["sweep", "--json", f, "--svg", f],
        vec!["run", "--json", f, "--serial-out", f],
    ] {
        assert_refused(&args, 64, &["are the same file"]);
    }
    // /dev/null may take several.
    let out = ptiscope()
        .args([
            "compare",
            "--json",
            "/dev/null",
            "--csv",
            "/dev/null",
            "--runs",
            "1",
        ])
        .args(["--iterations", "10", "--quiet"])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(64), "{}", stderr(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigint_ends_a_reproduction_and_names_the_cells_not_run() {
    let test = "sigint_ends_a_reproduction_and_names_the_cells_not_run";
    let Some(dir) = kvm_scratch_or_skip(test, "reproduce-sigint") else {
        return;
    };
    let json = dir.join("r.json");
    let mut child = ptiscope()
        .args(["reproduce", "tarreau-2018", "--no-linux", "--json"])
        .arg(&json)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Signalled as its first cell (300,000 getppid calls: ~15 s on
    // kvm_pvm, ~0.3 s on a nested KVM) starts: the later ones are not run.
    let (_, rest) = stderr_until(&mut child, |l| l.starts_with("ptiscope reproduce: "));
    let (text, _) = interrupt(child);
    let _ = rest.join();
    assert!(text.contains("PARTIAL: "), "{text}");
    let v = read_json(&json);
    assert_eq!(v["schema"], "ptiscope.reproduce/1");
    assert!(v["partial"].as_str().unwrap().contains("SIGINT"), "{v}");
    let rows = v["rows"].as_array().unwrap();
    let not_run = rows
        .iter()
        .filter(|r| {
            r["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("not run"))
        })
        .count();
    // Every cell is in the document; the ones after the signal say so.
    assert!(rows.len() >= 2 && not_run >= 1, "{v}");
}
