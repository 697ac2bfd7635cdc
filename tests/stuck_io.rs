//! Outputs that stop draining, FIFOs nobody opens, termination signals and
//! a QEMU child whose parent dies: every case ends within `--timeout` + 2 s
//! with its documented exit code, and leaves no process behind. How a run
//! ended and what became of its outputs are read from its `--json` (its
//! `stop`, its notes' codes); stderr only where the words are the point (a
//! refusal's message, an output error that leaves no document).

mod common;

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A FIFO in this test's scratch directory, removed on drop.
struct Fifo(PathBuf);

impl Fifo {
    fn new(name: &str) -> Self {
        let path = scratch(name).join("fifo");
        let _ = std::fs::remove_file(&path);
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
        Fifo(path)
    }

    /// A reader that opens the FIFO and never reads (`sleep 60 <f`).
    fn stalled_reader(&self) -> std::fs::File {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&self.0)
            .unwrap()
    }
}

impl Drop for Fifo {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn spawn(args: &[&str]) -> Child {
    ptiscope()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The notes of run document `v` with code `code` (`output_dropped`, ...)
/// about output `output` (`--metrics-out`, ...).
fn output_notes<'a>(
    v: &'a serde_json::Value,
    code: &str,
    output: &str,
) -> Vec<&'a serde_json::Value> {
    v["notes"]
        .as_array()
        .map(|n| {
            n.iter()
                .filter(|n| n["code"] == code && n["output"] == output)
                .collect()
        })
        .unwrap_or_default()
}

/// A run document read from a FIFO whose reader (`reader`, opened
/// non-blocking) never read while the run wrote it: it is in the pipe.
fn json_from_fifo(mut reader: std::fs::File) -> serde_json::Value {
    use std::io::Read;
    let mut text = String::new();
    let _ = reader.read_to_string(&mut text);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

#[test]
fn a_metrics_reader_that_stops_reading_costs_dropped_lines_not_a_hang() {
    if !kvm_or_skip("stalled metrics reader") {
        return;
    }
    // The issue's `mkfifo f; sleep 60 <f & ptiscope run ... --metrics-out f`,
    // made small: a reader that never reads, a line every millisecond, and a
    // guest that spins until --timeout.
    let fifo = Fifo::new("stalled-metrics");
    let _reader = fifo.stalled_reader();
    // The console and --json stall too: one drain deadline covers them all.
    let console = Fifo::new("stalled-metrics-console");
    let _console_reader = console.stalled_reader();
    let json = Fifo::new("stalled-metrics-json");
    let json_reader = json.stalled_reader();
    let timeout = 1.0;
    let start = Instant::now();
    let child = spawn(&[
        "run",
        "--cmdline",
        "fault=hang",
        "--timeout",
        "1",
        "--metrics-interval",
        "1",
        "--metrics-out",
        fifo.0.to_str().unwrap(),
        "--serial-out",
        console.0.to_str().unwrap(),
        "--json",
        json.0.to_str().unwrap(),
    ]);
    let (code, err) = code_and_stderr_within(child, 3 * HANG_SLACK, "stalled metrics");
    let took = start.elapsed().as_secs_f64();
    assert_eq!(code, Some(124), "{err}");
    assert!(
        took < timeout + HANG_SLACK.as_secs_f64(),
        "took {took:.2} s: {err}"
    );
    // The document was written all the same (a run summary fits in the
    // pipe): the timeout, and the dropped metrics lines, as data.
    let v = json_from_fifo(json_reader);
    let stop = &v["stop"];
    assert_eq!(
        (&stop["code"], &stop["after_ms"]),
        (&"timeout".into(), &1000.into()),
        "{stop}"
    );
    assert_eq!(v["exit_code"], 124);
    let dropped = output_notes(&v, "output_dropped", "--metrics-out");
    assert!(
        dropped
            .first()
            .is_some_and(|n| n["dropped_bytes"].as_u64() > Some(0)),
        "{}",
        v["notes"]
    );
}

/// A PVH guest that prints 128 KiB (its own image and what follows it),
/// twice what a pipe holds, to the serial port in one `rep outsb`, then
/// exits 0 (about 2 s here: kvm_pvm exits once per byte).
fn write_chatty_guest(path: &Path) {
    let code = [
        0xfc, // cld
        0xbe, 0x00, 0x00, 0x10, 0x00, // mov esi, 0x100000
        0xb9, 0x00, 0x00, 0x02, 0x00, // mov ecx, 0x20000
        0x66, 0xba, 0xf8, 0x03, // mov dx, 0x3f8
        0xf3, 0x6e, // rep outsb
        0x31, 0xc0, // xor eax, eax
        0x66, 0xba, 0xf4, 0x00, // mov dx, 0xf4
        0xef, // out dx, eax
        0xf4, // hlt
    ];
    write_pvh_elf(path, 0x100000, &code);
}

#[test]
fn a_console_fifo_that_stops_reading_does_not_block_the_vcpu() {
    if !kvm_or_skip("stalled console reader") {
        return;
    }
    // The guest prints far more than a pipe holds into a FIFO whose reader
    // never reads: the vCPU must not block in write(2), so the guest exits
    // by itself, long before --timeout, and the drop is reported.
    let fifo = Fifo::new("stalled-console");
    let elf = fifo.0.with_file_name("chatty.elf");
    write_chatty_guest(&elf);
    // What the guest takes to print it all where nothing stalls (a regular
    // file): one exit per byte, ~2 s on kvm_pvm, a minute under a nested
    // KVM in QEMU TCG. The stalled run is bounded by that, not by a
    // figure of one host.
    let plain = fifo.0.with_file_name("console.txt");
    let start = Instant::now();
    let child = spawn(&[
        "run",
        "--kernel",
        elf.to_str().unwrap(),
        "--mem",
        "16",
        "--timeout",
        "600",
        "--serial-out",
        plain.to_str().unwrap(),
    ]);
    let (code, err) = code_and_stderr_within(child, Duration::from_secs(660), "plain console");
    assert_eq!(code, Some(0), "{err}");
    let unobstructed = start.elapsed();
    let bound = 3 * unobstructed + HANG_SLACK;
    let _reader = fifo.stalled_reader();
    let json = fifo.0.with_file_name("run.json");
    let start = Instant::now();
    let timeout = format!("{:.0}", (2 * bound).as_secs_f64());
    let child = spawn(&[
        "run",
        "--kernel",
        elf.to_str().unwrap(),
        "--mem",
        "16",
        "--timeout",
        &timeout,
        "--serial-out",
        fifo.0.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    let (code, err) = code_and_stderr_within(child, 2 * bound + HANG_SLACK, "stalled console");
    assert_eq!(code, Some(0), "{err}");
    // Well inside its --timeout (twice the bound): the stalled reader cost
    // lines, not time.
    assert!(
        start.elapsed() < bound,
        "{:?} against {unobstructed:?} with a reader that keeps up: {err}",
        start.elapsed()
    );
    let v = read_json(&json);
    assert_eq!(
        (&v["stop"]["code"], &v["stop"]["status"]),
        (&"guest_exit".into(), &0.into())
    );
    let dropped = output_notes(&v, "output_dropped", "--serial-out");
    assert!(
        dropped
            .first()
            .is_some_and(|n| n["dropped_bytes"].as_u64() > Some(0)),
        "{}",
        v["notes"]
    );
}

#[test]
fn a_fifo_nobody_opens_is_refused_after_the_timeout() {
    for opt in ["--serial-out", "--json", "--metrics-out"] {
        let fifo = Fifo::new(&format!("noreader{opt}"));
        let mut args = vec!["run", "--timeout", "0.5", opt, fifo.0.to_str().unwrap()];
        if opt == "--metrics-out" {
            args.extend(["--metrics-interval", "10"]);
        }
        let start = Instant::now();
        let child = spawn(&args);
        let (code, err) = code_and_stderr_within(child, 2 * HANG_SLACK, opt);
        assert_eq!(code, Some(73), "{opt}: {err}");
        assert!(err.contains("no reader opened it"), "{opt}: {err}");
        assert!(err.contains(opt), "{opt}: {err}");
        assert!(start.elapsed() < HANG_SLACK, "{opt}: {err}");
    }
}

#[test]
fn compare_opens_its_outputs_before_the_first_run() {
    // A FIFO without a reader, and a path that cannot be created: both are
    // refused before any guest boots (the compare would take seconds).
    let fifo = Fifo::new("compare-out");
    for (opt, path) in [
        ("--csv", fifo.0.to_str().unwrap()),
        ("--svg", "/nonexistent-dir/ptiscope.svg"),
    ] {
        let start = Instant::now();
        let child = spawn(&["compare", "--runs", "1", "--timeout", "0.5", opt, path]);
        let (code, err) = code_and_stderr_within(child, 2 * HANG_SLACK, opt);
        assert_eq!(code, Some(73), "{opt}: {err}");
        assert!(err.contains(opt), "{opt}: {err}");
        assert!(!err.contains("run 1"), "no run was started: {err}");
        assert!(start.elapsed() < HANG_SLACK, "{opt}: {err}");
    }
}

#[test]
fn waiting_for_a_fifo_reader_ends_on_sigint() {
    let fifo = Fifo::new("fifo-sigint");
    let child = spawn(&["run", "--timeout", "60", "--json", fifo.0.to_str().unwrap()]);
    std::thread::sleep(Duration::from_millis(500));
    signal(&child, libc::SIGINT);
    let (code, err) = code_and_stderr_within(child, HANG_SLACK, "fifo sigint");
    assert_eq!(code, Some(130), "{err}");
    assert!(
        err.contains("interrupted by SIGINT while waiting for a reader"),
        "{err}"
    );
}

#[test]
fn an_output_device_that_fails_writes_is_exit_73() {
    if !kvm_or_skip("serial-out /dev/full") {
        return;
    }
    if !Path::new("/dev/full").exists() {
        ptiscope::test_support::skip("serial-out /dev/full", "no /dev/full here");
        return;
    }
    let dir = Scratch::new("dev-full");
    let json = dir.join("run.json");
    for (opt, extra) in [
        ("--serial-out", &["--json", json.to_str().unwrap()][..]),
        ("--json", &[][..]),
        (
            "--metrics-out",
            &["--metrics-interval", "5", "--json", json.to_str().unwrap()][..],
        ),
    ] {
        let _ = std::fs::remove_file(&json);
        let mut args = vec![
            "run",
            "--workload",
            "getpid",
            "--iterations",
            "10",
            opt,
            "/dev/full",
        ];
        args.extend_from_slice(extra);
        let child = spawn(&args);
        let (code, err) = code_and_stderr_within(child, Duration::from_secs(20), opt);
        assert_eq!(code, Some(73), "{opt}: {err}");
        // The error's words are the point: what failed, and why.
        assert!(err.contains("No space left on device"), "{opt}: {err}");
        if opt == "--json" {
            // The document itself could not be written: nothing to read.
            continue;
        }
        // The run itself succeeded; the failed output is its note.
        let v = read_json(&json);
        assert_eq!(
            (&v["stop"]["code"], &v["stop"]["status"]),
            (&"guest_exit".into(), &0.into())
        );
        let failed = output_notes(&v, "output_failed", opt);
        assert_eq!(failed.len(), 1, "{opt}: {}", v["notes"]);
    }
}

#[test]
fn sighup_stops_a_kvm_run_like_sigterm() {
    let Some(dir) = kvm_scratch_or_skip("sighup kvm", "sighup-kvm") else {
        return;
    };
    let json = dir.join("run.json");
    let child = spawn(&[
        "run",
        "--cmdline",
        "fault=hang",
        "--timeout",
        "30",
        "--json",
        json.to_str().unwrap(),
    ]);
    std::thread::sleep(Duration::from_millis(700));
    signal(&child, libc::SIGHUP);
    let (code, err) = code_and_stderr_within(child, Duration::from_secs(5), "sighup kvm");
    assert_eq!(code, Some(129), "{err}");
    let v = read_json(&json);
    assert_eq!(
        (&v["stop"]["code"], &v["stop"]["signal"]),
        (&"signal".into(), &libc::SIGHUP.into()),
        "{v}"
    );
}

/// Children of `pid` (from /proc), with their command names.
fn children_of(pid: u32) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let comm = head.split_once('(').map_or("", |x| x.1).to_string();
        let ppid = rest
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push((p, comm));
        }
    }
    out
}

/// Whether `pid` is still a live (not zombie) process named `comm`.
fn alive(pid: u32, comm: &str) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let Some((head, rest)) = stat.rsplit_once(')') else {
        return false;
    };
    head.ends_with(comm) && !rest.trim_start().starts_with('Z')
}

/// Starts a hanging guest under QEMU and returns ptiscope and QEMU's pid.
// The caller kills or signals ptiscope and waits for it.
#[allow(clippy::zombie_processes)]
fn hanging_qemu(test: &str, json: Option<&Path>) -> (Child, u32, String) {
    let mut args = vec![
        "run",
        "--backend",
        "qemu",
        "--cmdline",
        "fault=hang",
        "--timeout",
        "60",
    ];
    if let Some(j) = json {
        args.extend(["--json", j.to_str().unwrap()]);
    }
    let mut child = spawn(&args);
    let start = Instant::now();
    loop {
        if let Some((pid, comm)) = children_of(child.id())
            .into_iter()
            .find(|(_, c)| c.starts_with("qemu-system"))
        {
            return (child, pid, comm);
        }
        if start.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{test}: QEMU did not start");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn assert_gone_soon(pid: u32, comm: &str, what: &str) {
    let start = Instant::now();
    while alive(pid, comm) {
        assert!(
            start.elapsed() < HANG_SLACK,
            "{what}: QEMU (pid {pid}) still runs"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn qemu_dies_with_a_sigkilled_ptiscope() {
    if !plugin_or_skip("qemu sigkill", "qemu-system-x86_64") {
        return;
    }
    let (mut child, qemu, comm) = hanging_qemu("qemu sigkill", None);
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap(); // SIGKILL: no code of ptiscope runs.
    let _ = child.wait();
    assert_gone_soon(qemu, &comm, "after SIGKILL of ptiscope");
    // The image went to QEMU through an in-memory file: nothing on disk.
    let leftovers: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("ptiscope-qemu-{}-", child.id()))
        })
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn sighup_stops_a_qemu_run_and_its_qemu() {
    if !plugin_or_skip("qemu sighup", "qemu-system-x86_64") {
        return;
    }
    let dir = Scratch::new("sighup-qemu");
    let json = dir.join("run.json");
    let (child, qemu, comm) = hanging_qemu("qemu sighup", Some(&json));
    std::thread::sleep(Duration::from_millis(300));
    signal(&child, libc::SIGHUP);
    let (code, err) = code_and_stderr_within(child, Duration::from_secs(5), "qemu sighup");
    assert_eq!(code, Some(129), "{err}");
    let v = read_json(&json);
    assert_eq!(
        (&v["stop"]["code"], &v["stop"]["signal"]),
        (&"signal".into(), &libc::SIGHUP.into()),
        "{v}"
    );
    assert_gone_soon(qemu, &comm, "after SIGHUP");
}

#[test]
fn a_closed_stdout_is_not_an_output_failure() {
    let Some(dir) = kvm_scratch_or_skip("closed stdout", "closed-stdout") else {
        return;
    };
    let json = dir.join("run.json");
    // `ptiscope run | head -c 10`: the console on stdout is best effort.
    let mut child = ptiscope()
        .args([
            "run",
            "--workload",
            "getpid",
            "--iterations",
            "10",
            "--json",
        ])
        .arg(&json)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let (code, err) = code_and_stderr_within(child, Duration::from_secs(20), "closed stdout");
    assert_eq!(code, Some(0), "{err}");
    let v = read_json(&json);
    assert_eq!(
        (&v["stop"]["code"], &v["stop"]["status"]),
        (&"guest_exit".into(), &0.into())
    );
    assert_eq!(v["exit_code"], 0);
}
