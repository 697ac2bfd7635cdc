//! `ptiscope linux fetch` against stand-in package tools (a PATH of shell
//! scripts named apt-cache, apt-get, dpkg): no network, no Debian needed.
//! A signal at any moment stops it with 128 + the signal, its tools and its
//! scratch directory gone; a scratch directory a killed fetch left is
//! removed by the next; a cache that cannot be a directory and a package
//! source that fails are named, with their documented codes.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A directory of stand-in tools: `apt-cache depends` names an image
/// package, `apt-get download` writes its pid to `DIR/apt-get.pid` and
/// sleeps (a download that takes a while), `dpkg` says amd64.
fn fake_tools(dir: &Path, apt_cache_fails: bool) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let script = |name: &str, body: &str| {
        let p = bin.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    if apt_cache_fails {
        script(
            "apt-cache",
            "echo 'E: \u{1b}[31mNo packages found' >&2; exit 100",
        );
    } else {
        script(
            "apt-cache",
            "echo \"$2\"; echo '  Depends: linux-image-6.1.0-fake-cloud-amd64'",
        );
    }
    script(
        "apt-get",
        &format!(
            "echo $$ > {}/apt-get.pid; exec sleep 60",
            dir.to_str().unwrap()
        ),
    );
    script("dpkg", "echo amd64");
    bin
}

/// `ptiscope linux fetch --only debian-amd64` with the stand-in tools
/// first on PATH and the cache at `cache`, in a process group of its own.
fn fetch(bin: &Path, cache: &Path) -> Command {
    let mut c = ptiscope();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    c.env("PATH", path)
        .env("PTISCOPE_LINUX_CACHE", cache)
        .args(["linux", "fetch", "--only", "debian-amd64"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    c
}

/// Waits (at most [`HANG_SLACK`]) until `p` exists.
fn wait_for(p: &Path) {
    let start = Instant::now();
    while !p.exists() {
        assert!(
            start.elapsed() < HANG_SLACK,
            "{} never appeared",
            p.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A pid no process has (one of ours, reaped).
fn dead_pid() -> u32 {
    let mut c = Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    pid
}

fn alive(pid: i32) -> bool {
    // A zombie counts as gone (it has ended; only its parent's wait is left).
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

/// SIGTERM, SIGHUP to ptiscope alone and SIGINT to its whole process group
/// (a Ctrl-C) during the download: each ends the fetch at once with
/// 128 + the signal, the download tool stopped, the scratch directory and
/// a stale one (of a fetch killed earlier) removed, nothing installed.
#[test]
fn a_signal_stops_linux_fetch_and_leaves_nothing_behind() {
    for (signal, group) in [
        (libc::SIGTERM, false),
        (libc::SIGHUP, false),
        (libc::SIGINT, true),
    ] {
        let dir = Scratch::new(&format!("fetch-signal-{signal}"));
        let bin = fake_tools(&dir, false);
        let cache = dir.join("cache");
        std::fs::create_dir_all(&cache).unwrap();
        let stale = cache.join(format!(".fetch-debian-amd64-{}", dead_pid()));
        std::fs::create_dir_all(stale.join("x")).unwrap();
        let child = fetch(&bin, &cache).spawn().unwrap();
        let pid = child.id() as i32;
        let scratch = cache.join(format!(".fetch-debian-amd64-{pid}"));
        let apt_pid = dir.join("apt-get.pid");
        wait_for(&apt_pid);
        assert!(scratch.is_dir(), "no scratch directory while downloading");
        assert!(
            !stale.exists(),
            "the stale scratch directory was not removed"
        );
        let target = if group { -pid } else { pid };
        // SAFETY: kill(2) on our own child (or its process group).
        assert_eq!(unsafe { libc::kill(target, signal) }, 0);
        let (code, err) = code_and_stderr_within(child, HANG_SLACK, "linux fetch");
        assert_eq!(code, Some(128 + signal), "{err}");
        assert!(err.contains("the fetch was stopped"), "{err}");
        let apt: i32 = std::fs::read_to_string(&apt_pid)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(!alive(apt), "apt-get ({apt}) outlived the fetch");
        let left: Vec<_> = std::fs::read_dir(&cache)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "left in the cache: {left:?}");
    }
}

/// A cache that is a file (or lies under one) is named as such (73); a
/// package source that fails is 69, its message escaped.
#[test]
fn linux_fetch_names_a_cache_that_is_not_a_directory_and_a_failing_source() {
    let dir = Scratch::new("fetch-errors");
    let bin = fake_tools(&dir, false);
    let file = dir.join("a-file");
    std::fs::write(&file, "not a directory\n").unwrap();
    for cache in [file.clone(), file.join("below")] {
        let child = fetch(&bin, &cache).spawn().unwrap();
        let (code, err) = code_and_stderr_within(child, HANG_SLACK, "linux fetch");
        assert_eq!(code, Some(73), "{err}");
        assert!(
            err.contains("is not a directory") && err.contains(file.to_str().unwrap()),
            "{err}"
        );
        assert!(!err.contains("File exists"), "{err}");
    }
    let failing = Scratch::new("fetch-errors-source");
    let bin = fake_tools(&failing, true);
    let child = fetch(&bin, &failing.join("cache")).spawn().unwrap();
    let (code, err) = code_and_stderr_within(child, HANG_SLACK, "linux fetch");
    assert_eq!(code, Some(69), "{err}");
    assert!(err.contains("No packages found"), "{err}");
    assert!(
        !err.contains('\u{1b}'),
        "a raw escape reached the terminal: {err}"
    );
}
