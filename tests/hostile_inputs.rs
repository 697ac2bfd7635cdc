//! Files ptiscope reads are bounded: `compare --against` and `--kernel` on a
//! FIFO with no writer, /dev/zero, /dev/urandom or a 1 GiB file end at once
//! with a message and exit 64 (66 for an image that cannot be read, 65 for
//! one too large), never a hang or memory exhausted; `--against` takes the
//! one schema it reads, not anything with its prefix.

mod common;

use std::time::Duration;

use common::*;

fn mkfifo(path: &std::path::Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

/// A sparse regular file of 1 GiB (no disk space used).
fn huge_file(path: &std::path::Path) {
    let f = std::fs::File::create(path).unwrap();
    f.set_len(1 << 30).unwrap();
}

#[test]
fn against_reads_only_a_bounded_regular_file() {
    let dir = scratch("against-hostile");
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    let huge = dir.join("huge.json");
    huge_file(&huge);
    let next_schema = dir.join("next.json");
    std::fs::write(&next_schema, r#"{"schema":"ptiscope.compare/2"}"#).unwrap();
    for (path, needle) in [
        (
            fifo.to_str().unwrap(),
            "is a FIFO (named pipe), not a regular file",
        ),
        ("/dev/zero", "is a character device, not a regular file"),
        ("/dev/urandom", "is a character device, not a regular file"),
        (huge.to_str().unwrap(), "larger than 16 MiB"),
        (
            next_schema.to_str().unwrap(),
            "schema \"ptiscope.compare/2\"",
        ),
    ] {
        let (code, err) = run_within(
            &["compare", "--timeout", "5", "--against", path],
            Duration::from_secs(5),
        );
        assert_eq!(code, Some(64), "{path}: {err}");
        assert!(
            err.contains(&format!("--against {path}: ")) && err.contains(needle),
            "{path}: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn kernel_images_are_bounded_regular_files() {
    let dir = scratch("kernel-hostile");
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    let huge = dir.join("huge.elf");
    huge_file(&huge);
    for (path, code, needle) in [
        (
            fifo.to_str().unwrap(),
            66,
            "is a FIFO (named pipe), not a regular file",
        ),
        ("/dev/zero", 66, "is a character device, not a regular file"),
        (huge.to_str().unwrap(), 65, "is larger than 268435456 bytes"),
    ] {
        let (got, err) = run_within(&["run", "--kernel", path], Duration::from_secs(10));
        assert_eq!(got, Some(code), "{path}: {err}");
        assert!(err.contains(needle), "{path}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A minimal x86_64 bzImage that passes the checks before boot (setup
/// header, lengths), for refusals that come after the image is read.
fn fake_bzimage(path: &std::path::Path) {
    let mut b = vec![0u8; 0x1000];
    b[0x1fe] = 0x55;
    b[0x1ff] = 0xaa;
    b[0x202..0x206].copy_from_slice(b"HdrS");
    b[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
    b[0x236..0x238].copy_from_slice(&3u16.to_le_bytes());
    b[0x20e..0x210].copy_from_slice(&0x200u16.to_le_bytes());
    b[0x400..0x40b].copy_from_slice(b"6.1.0-fake\0");
    b[0x1f4..0x1f8].copy_from_slice(&0x60u32.to_le_bytes());
    b[0x24c..0x250].copy_from_slice(&0x100u32.to_le_bytes());
    std::fs::write(path, b).unwrap();
}

/// Every kind of input file, given as a FIFO with no writer, ends at once
/// (well within `--timeout 5` + 2 s; it used to block the open, past the
/// timeout and deaf to SIGTERM) with its documented code and a message
/// naming the file: `--kernel`, `--linux`, the configuration beside a
/// `--linux` kernel, `--against`, a compare side's `linux=`, and the same
/// under `--backend nested`, where they are read by the same preflight
/// before the nested machine boots (66, as on any backend).
#[test]
fn every_input_file_kind_as_a_fifo_ends_at_once_naming_it() {
    let dir = scratch("fifo-kinds");
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    // A kernel whose configuration is a FIFO.
    let kdir = dir.join("k");
    std::fs::create_dir_all(&kdir).unwrap();
    fake_bzimage(&kdir.join("vmlinuz"));
    mkfifo(&kdir.join("config"));
    let f = fifo.to_str().unwrap();
    let k = kdir.join("vmlinuz").to_str().unwrap().to_string();
    let config = kdir.join("config").to_str().unwrap().to_string();
    let side = format!("linux={f},append=pti=off");
    let config_side = format!("linux={k}");
    let t5 = ["--timeout", "5"];
    // (arguments, exit code, the file named)
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (vec!["run", "--kernel", f], 66, f),
        (vec!["run", "--backend", "qemu", "--linux", f], 66, f),
        (
            vec!["run", "--backend", "qemu", "--linux", &k, "--pti", "on"],
            66,
            &config,
        ),
        (vec!["compare", "--against", f], 64, f),
        (
            vec![
                "compare",
                "--backend",
                "qemu",
                "--baseline",
                &side,
                "--compare",
                "pti=on",
            ],
            66,
            f,
        ),
        (vec!["run", "--backend", "nested", "--kernel", f], 66, f),
        (vec!["run", "--backend", "nested", "--linux", f], 66, f),
        (
            vec!["run", "--backend", "nested", "--linux", &k, "--pti", "on"],
            66,
            &config,
        ),
        (
            vec!["compare", "--backend", "nested", "--against", f],
            64,
            f,
        ),
        (
            vec![
                "compare",
                "--backend",
                "nested",
                "--baseline",
                &side,
                "--compare",
                &config_side,
            ],
            66,
            f,
        ),
        (
            vec![
                "compare",
                "--backend",
                "nested",
                "--baseline",
                &config_side,
                "--compare",
                &config_side,
            ],
            66,
            &config,
        ),
    ];
    for (args, code, named) in cases {
        let args: Vec<&str> = args.iter().chain(&t5).copied().collect();
        let start = std::time::Instant::now();
        let (got, err) = run_within(&args, Duration::from_secs(7));
        assert!(start.elapsed() < Duration::from_secs(7), "{args:?}");
        assert_eq!(got, Some(code), "{args:?}: {err}");
        assert!(
            err.contains(named) && err.contains("is a FIFO (named pipe), not a regular file"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("booting"), "{args:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A configuration whose PTI option lies past 4 MiB (the old cap, where
/// the rest was cut and the kernel called PTI-less, exit 6) is read whole;
/// one over the 64 MiB cap is refused naming it and the cap, never "has
/// no". Nothing boots: `--workload nopti-getpid` is refused (64) just
/// after the PTI check, so reaching that refusal shows the check passed.
#[test]
fn a_large_configuration_is_read_whole_or_refused_naming_the_cap() {
    let dir = scratch("config-large");
    fake_bzimage(&dir.join("vmlinuz"));
    let mut text = "# padding line of a large configuration\n"
        .repeat((5 << 20) / 40)
        .into_bytes();
    text.extend_from_slice(b"CONFIG_PAGE_TABLE_ISOLATION=y\n");
    assert!(text.len() > 5 << 20);
    std::fs::write(dir.join("config"), &text).unwrap();
    let k = dir.join("vmlinuz");
    let args = [
        "run",
        "--backend",
        "qemu",
        "--linux",
        k.to_str().unwrap(),
        "--pti",
        "on",
        "--workload",
        "nopti-getpid",
        "--timeout",
        "5",
    ];
    let (code, err) = run_within(&args, Duration::from_secs(7));
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("nopti-getpid"), "{err}");
    // Without the option, the same size: refused with 6, both names given.
    text.truncate(text.len() - "CONFIG_PAGE_TABLE_ISOLATION=y\n".len());
    std::fs::write(dir.join("config"), &text).unwrap();
    let (code, err) = run_within(&args, Duration::from_secs(7));
    assert_eq!(code, Some(6), "{err}");
    assert!(
        err.contains("CONFIG_MITIGATION_PAGE_TABLE_ISOLATION=y")
            && err.contains("CONFIG_PAGE_TABLE_ISOLATION=y"),
        "{err}"
    );
    // Over the cap (sparse: no disk used).
    std::fs::File::create(dir.join("config"))
        .unwrap()
        .set_len((64 << 20) + 1)
        .unwrap();
    let (code, err) = run_within(&args, Duration::from_secs(7));
    assert_eq!(code, Some(66), "{err}");
    assert!(
        err.contains(dir.join("config").to_str().unwrap())
            && err.contains(&(64u64 << 20).to_string())
            && !err.contains("has no"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// What a nested run would refuse is refused before the boot (at once,
/// not after a nested session of seconds: `compare` and `sweep` refuse it
/// as on any backend): a
/// `--fail-if` the one parser refuses, a side's unknown key, an empty side,
/// a side key for another backend (`cpu=`); a symbol condition anywhere in
/// a list.
#[test]
fn nested_refuses_what_its_inner_command_would_before_the_boot() {
    for (args, needle) in [
        (
            &["--fail-if", "cycles_per_call=>1"][..],
            "\"=>\" is not a comparison operator",
        ),
        (
            &["--fail-if", "cycles_per_call>1, symbol:x>1"],
            "--fail-if symbol:... needs --by-symbol",
        ),
        (
            &["--baseline", "bogus=1", "--compare", "pti=off"],
            "unknown key \"bogus\"",
        ),
        (
            &["--baseline", ",,", "--compare", "pti=off"],
            "sets nothing",
        ),
        (
            &["--baseline", "cpu=max", "--compare", "pti=off"],
            "cpu= needs --backend qemu",
        ),
    ] {
        let mut all = vec!["compare", "--backend", "nested"];
        all.extend_from_slice(args);
        let (code, err) = run_within(&all, Duration::from_secs(5));
        assert_eq!(code, Some(64), "{args:?}: {err}");
        assert!(
            err.contains(needle) && !err.contains("booting"),
            "{args:?}: {err}"
        );
    }
    // sweep's configurations go through the same side parser.
    let (code, err) = run_within(
        &[
            "sweep",
            "--backend",
            "nested",
            "--config",
            "bogus=1",
            "--config",
            "pti=on",
        ],
        Duration::from_secs(5),
    );
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("--config \"bogus=1\": unknown key") && !err.contains("nested session took"),
        "{err}"
    );
}

/// `--qemu-arg`s that would keep QEMU from running the guest are refused
/// before QEMU starts (64, naming them): a help or version request, which
/// QEMU answered and exited as if the guest had been reset (80); a wait for
/// a monitor command (`-S`, which ran into --timeout); `-readconfig`.
#[test]
fn qemu_args_that_keep_qemu_from_running_the_guest_are_refused() {
    for (args, needle) in [
        (&["--qemu-arg=-version"][..], "help or version"),
        (
            &["--qemu-arg=-device", "--qemu-arg=help"],
            "help or version",
        ),
        (&["--qemu-arg=-S"], "monitor command"),
        (
            &["--qemu-arg=-readconfig", "--qemu-arg=/dev/null"],
            "-readconfig",
        ),
        (&["--qemu-arg=-machine"], "takes a value"),
    ] {
        let mut all = vec!["run", "--backend", "qemu", "--timeout", "5"];
        all.extend_from_slice(args);
        let (code, err) = run_within(&all, Duration::from_secs(5));
        assert_eq!(code, Some(64), "{args:?}: {err}");
        assert!(
            err.contains("--qemu-arg ") && err.contains(needle),
            "{args:?}: {err}"
        );
    }
}

/// A compare side's `cpu=` is checked against QEMU's own list before
/// anything boots (64, with models close to the one given), not by the
/// side's first run after the other side's (81; `help` printed the list and
/// ended as a reset, 80).
#[test]
fn compare_side_cpu_models_are_checked_against_qemus_list() {
    if !qemu_or_skip(
        "compare_side_cpu_models_are_checked_against_qemus_list",
        "qemu-system-x86_64",
    ) {
        return;
    }
    for (model, needle) in [
        ("bogus", "has no CPU model \"bogus\""),
        ("help", "has no CPU model \"help\""),
        ("skylake-client-v1", "Skylake-Client-v1"),
        ("host", "needs KVM"),
    ] {
        let side = format!("cpu={model}");
        let (code, err) = run_within(
            &[
                "compare",
                "--backend",
                "qemu",
                "--runs",
                "1",
                "--baseline",
                &side,
                "--compare",
                "pti=off",
            ],
            Duration::from_secs(10),
        );
        assert_eq!(code, Some(64), "{model}: {err}");
        assert!(
            err.contains(needle) && err.contains("-cpu help"),
            "{model}: {err}"
        );
    }
}

/// A `--linux` value that is neither a known name nor a file is said to be
/// so, with the known names (66), not "cannot read kernel image NAME".
#[test]
fn unknown_linux_names_list_the_known_ones() {
    for args in [
        &["run", "--backend", "qemu", "--linux", "debian-6.12-i386"][..],
        &[
            "compare",
            "--backend",
            "qemu",
            "--baseline",
            "linux=debian-amd65",
            "--compare",
            "pti=off",
        ],
    ] {
        let (code, err) = run_within(args, Duration::from_secs(5));
        assert_eq!(code, Some(66), "{args:?}: {err}");
        assert!(
            err.contains("neither a kernel ptiscope knows")
                && err.contains("debian-amd64, debian-686-pae, debian-6.12-amd64"),
            "{args:?}: {err}"
        );
    }
}

/// A kernel cache where no file can be created (/proc) is said so before
/// apt is asked anything (73), not after it as "creating
/// /proc/.fetch-...: No such file or directory".
#[test]
fn a_kernel_cache_that_takes_no_files_is_refused_before_apt() {
    let start = std::time::Instant::now();
    let out = ptiscope()
        .args(["linux", "fetch", "--only", "debian-amd64"])
        .env("PTISCOPE_LINUX_CACHE", "/proc")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(73), "{err}");
    assert!(
        err.contains("the kernel cache /proc takes no new files")
            && err.contains("PTISCOPE_LINUX_CACHE")
            && !err.contains("->"),
        "{err}"
    );
    assert!(start.elapsed() < Duration::from_secs(5), "{err}");
}

/// Side keys and guest options that would set nothing where the run goes
/// are refused before it boots, so no label claims what was not measured:
/// `pti_switch=` (ptiscope's own guest's CR3 switch) with a Linux kernel,
/// and a side's `cpu_vuln=` under `--backend qemu` (as `--cpu-vuln` is).
#[test]
fn options_that_would_set_nothing_are_refused_not_ignored() {
    let dir = scratch("set-nothing");
    let k = dir.join("vmlinuz");
    fake_bzimage(&k);
    let k = k.to_str().unwrap();
    let linux_side = format!("linux={k},pti_switch=deferred");
    for (args, needle) in [
        (
            vec![
                "run",
                "--backend",
                "qemu",
                "--linux",
                k,
                "--cmdline",
                "pti_switch=deferred",
            ],
            "pti_switch= chooses where ptiscope's own guest switches CR3",
        ),
        (
            vec![
                "compare",
                "--backend",
                "qemu",
                "--baseline",
                &linux_side,
                "--compare",
                "pti=on",
            ],
            "pti_switch= chooses where ptiscope's own guest switches CR3",
        ),
        (
            vec![
                "compare",
                "--backend",
                "qemu",
                "--baseline",
                "cpu_vuln=meltdown",
                "--compare",
                "pti=on",
            ],
            "cpu_vuln= sets what the KVM vCPU reports: not with --backend qemu",
        ),
    ] {
        let (code, err) = run_within(&args, Duration::from_secs(5));
        assert_eq!(code, Some(64), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A known kernel under a PTISCOPE_LINUX_CACHE that is a file: "not
/// fetched yet" says the cache cannot hold it (a fetch would fail on it),
/// not only "run `ptiscope linux fetch`".
#[test]
fn a_kernel_cache_that_is_a_file_is_named_when_a_kernel_is_missing() {
    let dir = scratch("cache-file");
    let file = dir.join("cache");
    std::fs::write(&file, b"not a directory").unwrap();
    let out = ptiscope()
        .args(["run", "--backend", "qemu", "--linux", "debian-amd64"])
        .env("PTISCOPE_LINUX_CACHE", &file)
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(66), "{err}");
    assert!(
        err.contains(&format!("{} exists and is not a directory", file.display()))
            && err.contains("PTISCOPE_LINUX_CACHE"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
