//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `ptiscope` binary under test.
pub fn ptiscope() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ptiscope"));
    // Keep the VMM's own diagnostics at warn level whatever the caller's env says.
    c.env("RUST_LOG", "warn");
    c
}

/// How much longer than its own deadline a ptiscope process may take
/// before a test calls it a hang: the suite shares 2 loaded cores with
/// builds, so a run that ends in 0.1 s idle can take several seconds. The
/// checks that use it tell "ends by itself, soon after its deadline" from
/// "hangs until killed", not fast from slow (speed is for benchmarks/).
pub const HANG_SLACK: std::time::Duration = std::time::Duration::from_secs(10);

/// Sends SIGINT to `child` and waits for it to end: within [`HANG_SLACK`]
/// ("within a second" on an idle host), with exit code 130. Returns its stdout and stderr.
pub fn interrupt(mut child: std::process::Child) -> (String, String) {
    use std::time::{Duration, Instant};
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let sent = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if sent.elapsed() >= 2 * HANG_SLACK {
            // Leave no ptiscope behind for the rest of the suite.
            let _ = child.kill();
            let _ = child.wait();
            panic!("still running {:?} after SIGINT", 2 * HANG_SLACK);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = sent.elapsed();
    let out = child.wait_with_output().unwrap();
    let (text, err) = (stdout(&out), stderr(&out));
    assert!(took < HANG_SLACK, "took {took:?}\n{err}");
    assert_eq!(status.code(), Some(130), "{err}");
    (text, err)
}

/// Reads `child`'s piped stderr until a line for which `marker` is true
/// (a test then acts at a point the run itself reached, not after a
/// fixed sleep that a slower host overruns); panics with what it printed if
/// the stream ends first. Returns the lines read and a thread that drains
/// the rest of stderr.
pub fn stderr_until(
    child: &mut std::process::Child,
    marker: impl Fn(&str) -> bool,
) -> (String, std::thread::JoinHandle<String>) {
    use std::io::{BufRead, Read};
    let mut r = std::io::BufReader::new(child.stderr.take().expect("stderr is piped"));
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap() == 0 {
            panic!("stderr ended before the marker line:\n{seen}");
        }
        seen.push_str(&line);
        if marker(&line) {
            break;
        }
    }
    let rest = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    });
    (seen, rest)
}

/// Checks the `@result` of `poundsyscall` with `threads=2` of `calls`
/// getppid each: every call made and answered rightly, the syscalls
/// counted (2 x `calls` getppid, an exit per thread, the parent's waits,
/// one per thread and the final -ECHILD, and its end marker), and a CR3
/// write on each entry and exit with `pti` on, none with it off. Returns
/// the syscalls.
pub fn check_two_threads(
    r: &std::collections::HashMap<String, String>,
    calls: u64,
    pti: &str,
    what: &str,
) -> u64 {
    assert_eq!(num(r, "iterations"), 2 * calls, "{what}: {r:?}");
    assert_eq!(
        num(r, "mismatches"),
        0,
        "{what}: getppid answered wrongly: {r:?}"
    );
    let syscalls = 2 * calls + 2 + 3 + 1;
    assert_eq!(num(r, "syscalls"), syscalls, "{what}: {r:?}");
    let (entry, exit) = (num(r, "cr3_entry"), num(r, "cr3_exit"));
    let want = if pti == "on" { syscalls } else { 0 };
    assert_eq!((entry, exit), (want, want), "{what}: {r:?}");
    syscalls
}

/// Checks the console of sched-messaging with `groups=1 loops=2` and PTI
/// on over two CPUs: every message (20 senders x 20 receivers x 2 loops)
/// delivered and none wrong; the syscalls counted (a write and a read per
/// message, the 40 workers' exits, the parent's 41 waits, the end
/// marker), each with a CR3 write on entry and on exit; and a wake-up that
/// crossed the CPUs (an IPI in `@smp`).
pub fn check_messaging_across_cpus(console: &str, what: &str) {
    let r = result_line(console);
    let messages = 20 * 20 * 2;
    assert_eq!(num(&r, "iterations"), messages, "{what}: {r:?}");
    assert_eq!(num(&r, "mismatches"), 0, "{what}: {r:?}");
    let syscalls = 2 * messages + 40 + 41 + 1;
    assert_eq!(num(&r, "syscalls"), syscalls, "{what}: {r:?}");
    assert_eq!(num(&r, "cr3_entry"), syscalls, "{what}: {r:?}");
    assert_eq!(num(&r, "cr3_exit"), syscalls, "{what}: {r:?}");
    let smp = machine_line(console, "@smp");
    assert!(
        num(&smp, "ipis_sent") > 0,
        "{what}: no cross-CPU wake-up: {smp:?}"
    );
}

/// `ptiscope run --pti PTI --workload getpid --iterations N`; the caller
/// adds the rest.
pub fn run_getpid(pti: &str, iterations: u32) -> Command {
    let mut c = ptiscope();
    c.args(["run", "--pti", pti, "--workload", "getpid", "--iterations"])
        .arg(iterations.to_string());
    c
}

/// The JSON document at `path`, or `null` if it is missing or not JSON
/// (a run that failed before writing it).
pub fn json_or_null(path: &Path) -> serde_json::Value {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// `Some(value)`, or `None` after printing why `test` skips: the error
/// is the reason.
pub fn ok_or_skip<T, E: std::fmt::Display>(test: &str, r: Result<T, E>) -> Option<T> {
    r.map_err(|e| ptiscope::test_support::skip(test, &e.to_string()))
        .ok()
}

/// True if `binary` (a QEMU system emulator) starts; otherwise prints why
/// `test` is skipped.
/// The first time a test binary uses a QEMU, it prints which one (the
/// version line), so that a log names the QEMU the tests ran, not only the
/// one installed when the log began.
pub fn qemu_or_skip(test: &str, binary: &str) -> bool {
    let version = Command::new(binary)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .to_string()
        });
    let Some(version) = version else {
        ptiscope::test_support::skip(test, &format!("{binary} is not installed"));
        return false;
    };
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    if !said.iter().any(|b| b == binary) {
        said.push(binary.to_string());
        // Straight to the stderr descriptor: `eprintln!` is captured.
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "QEMU: tests use {binary}: {version}");
    }
    true
}

/// True if qemu-system-i386 starts and loads ptiscope's TCG plugin (what a
/// `--backend qemu` run without `--no-plugin` needs); otherwise prints why
/// `test` is skipped.
pub fn qemu_i386_or_skip(test: &str) -> bool {
    plugin_or_skip(test, "qemu-system-i386")
}

/// True if `binary` is installed and loads ptiscope's TCG plugin (what a
/// `--backend qemu` run loads unless given `--no-plugin`); otherwise prints
/// why `test` is skipped. The library's own check comes first (`-plugin`
/// in `-help`, a plugin API this QEMU version takes, the plugin file),
/// then a trial load into a machine that runs nothing: a QEMU whose
/// plugin loader fails (built without it, or refusing ptiscope's plugin)
/// is found here, not half-way through a test. Once per binary and
/// process.
pub fn plugin_or_skip(test: &str, binary: &str) -> bool {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static SEEN: Mutex<Option<HashMap<String, Result<(), String>>>> = Mutex::new(None);
    if !qemu_or_skip(test, binary) {
        return false;
    }
    let found = SEEN
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .entry(binary.to_string())
        .or_insert_with(|| plugin_loads(binary))
        .clone();
    ok_or_skip(
        test,
        found.map_err(|e| format!("no usable QEMU plugin: {e}")),
    )
    .is_some()
}

/// Loads ptiscope's plugin into `binary -M none` and quits through the
/// monitor: Ok if QEMU accepted it.
fn plugin_loads(binary: &str) -> Result<(), String> {
    use std::io::Write;
    use std::process::Stdio;
    let (plugin, _api) = ptiscope::backend::qemu::plugin_for(binary).map_err(|e| e.to_string())?;
    let counts = std::env::temp_dir().join(format!(
        "ptiscope-test-{}-plugin-trial-{binary}",
        std::process::id()
    ));
    let mut child = Command::new(binary)
        .args([
            "-M",
            "none",
            "-accel",
            "tcg",
            "-display",
            "none",
            "-nodefaults",
        ])
        .args(["-no-user-config", "-monitor", "stdio", "-plugin"])
        .arg(format!(
            "{},out={},kernel=0-1000",
            plugin.display(),
            counts.display()
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{binary} did not start: {e}"))?;
    // If QEMU refused the plugin it has exited already; the write may fail.
    let _ = child.stdin.take().map(|mut i| i.write_all(b"quit\n"));
    let out = wait_output_within(child, std::time::Duration::from_secs(30))
        .map_err(|e| format!("{binary} with the plugin: {e}"))?;
    let _ = std::fs::remove_file(&counts);
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{binary} -plugin {} failed ({}): {}",
            plugin.display(),
            out.status,
            stderr(&out).trim()
        ))
    }
}

/// Waits for `child` to end, at most `deadline`: its output (stdout and
/// stderr, where piped, read while it runs), or, after killing it so that
/// nothing outlives the test, an error saying it hung.
pub fn wait_output_within(
    mut child: std::process::Child,
    deadline: std::time::Duration,
) -> Result<Output, String> {
    fn drain<R: std::io::Read + Send + 'static>(
        pipe: Option<R>,
    ) -> Option<std::thread::JoinHandle<Vec<u8>>> {
        pipe.map(|mut p| {
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                let _ = p.read_to_end(&mut bytes);
                bytes
            })
        })
    }
    let (out, err) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child
            .try_wait()
            .map_err(|e| format!("waiting for it: {e}"))?
        {
            break s;
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("still running after {deadline:?} (killed)"));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let joined = |h: Option<std::thread::JoinHandle<Vec<u8>>>| {
        h.map(|h| h.join().unwrap_or_default()).unwrap_or_default()
    };
    Ok(Output {
        status,
        stdout: joined(out),
        stderr: joined(err),
    })
}

/// `ptiscope run --arch i386 --backend qemu --timeout SECS`: the embedded
/// i386 guest under QEMU TCG; the caller adds the rest.
pub fn run_i386_qemu(timeout_secs: u32) -> Command {
    let mut c = ptiscope();
    c.args(["run", "--arch", "i386", "--backend", "qemu", "--timeout"])
        .arg(timeout_secs.to_string());
    c
}

/// Waits for a ptiscope `child` whose stderr is piped, at most `limit`:
/// its exit code and stderr. Fails the test (`what` names the run) if it
/// is still running then (it is killed) or it panicked.
pub fn code_and_stderr_within(
    child: std::process::Child,
    limit: std::time::Duration,
    what: &str,
) -> (Option<i32>, String) {
    let o = wait_output_within(child, limit).unwrap_or_else(|e| panic!("{what}: {e}"));
    let err = stderr(&o);
    assert!(!err.contains("panicked"), "{what}: {err}");
    (o.status.code(), err)
}

/// `ptiscope ARGS` (stdin empty, stdout discarded) with a deadline: a hang
/// is a failure, not a stuck test. Its exit code and stderr.
pub fn run_within(args: &[&str], limit: std::time::Duration) -> (Option<i32>, String) {
    use std::process::Stdio;
    let child = ptiscope()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    code_and_stderr_within(child, limit, &format!("ptiscope {args:?}"))
}

/// Boots the embedded x86_64 guest straight under `qemu-system-x86_64 -M
/// microvm -accel tcg` (no ptiscope: the independent check that the image
/// is standard), console on stdout, with `extra` QEMU arguments; waits at
/// most `limit`. QEMU's output (its exit code is isa-debug-exit's, the
/// guest status `(s << 1) | 1`), or `None` after printing why `test` is
/// skipped (no QEMU).
pub fn qemu_microvm_guest(
    test: &str,
    extra: &[&str],
    limit: std::time::Duration,
) -> Option<Output> {
    use std::process::Stdio;
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let qemu = "qemu-system-x86_64";
    if !qemu_or_skip(test, qemu) {
        return None;
    }
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = Scratch::new(&format!("microvm-{n}"));
    let elf = dir.join("guest.elf");
    std::fs::write(&elf, ptiscope::GUEST_X86_64).unwrap();
    let child = Command::new(qemu)
        .args(["-M", "microvm", "-accel", "tcg", "-m", "128"])
        .args(["-nodefaults", "-no-user-config", "-nographic"])
        .args(["-serial", "stdio"])
        .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=4"])
        .args(extra)
        .arg("-kernel")
        .arg(&elf)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = wait_output_within(child, limit)
        .unwrap_or_else(|e| panic!("{test}: QEMU did not stop: {e}"));
    Some(o)
}

/// True if /dev/kvm can be opened; otherwise prints why the test is skipped.
pub fn kvm_or_skip(test: &str) -> bool {
    let kvm = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm");
    ok_or_skip(
        test,
        kvm.map_err(|e| format!("/dev/kvm is not usable here ({e})")),
    )
    .is_some()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A scratch directory for this test binary.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ptiscope-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A [`scratch`] directory that is removed when dropped, unless the test
/// is failing (then it is left to be looked at).
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Self {
        Scratch(scratch(name))
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A KVM test's set-up: its [`Scratch`] directory `name`, or `None` after
/// printing why `test` is skipped (no usable /dev/kvm).
pub fn kvm_scratch_or_skip(test: &str, name: &str) -> Option<Scratch> {
    kvm_or_skip(test).then(|| Scratch::new(name))
}

/// The JSON document at `path`; panics, naming it, if it is missing or
/// not JSON.
pub fn read_json(path: &Path) -> serde_json::Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()))
}

/// Polls `file` every 200 ms until it contains `needle` (its text then),
/// `child` has ended or `bound` has passed (`None`).
pub fn wait_for_text(
    child: &mut std::process::Child,
    file: &Path,
    needle: &str,
    bound: std::time::Duration,
) -> Option<String> {
    let start = std::time::Instant::now();
    loop {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        if text.contains(needle) {
            return Some(text);
        }
        if child.try_wait().unwrap().is_some() || start.elapsed() > bound {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// The smallest sweep grid: two working sets (none and 64 KiB), one pass
/// over each, one run per cell.
pub const TWO_CELLS: [&str; 6] = ["--wss", "0,64K", "--touches", "1x", "--runs", "1"];

/// The metric `name` of a `compare --json` document; panics if it is not
/// in the table.
pub fn compare_metric<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["metrics"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["name"] == name))
        .unwrap_or_else(|| panic!("no metric {name} in the table: {v}"))
}

/// A compare metric's arithmetic means: (baseline, compare).
pub fn ameans(m: &serde_json::Value) -> (f64, f64) {
    let amean = |side: &str| {
        m[side]["amean"]
            .as_f64()
            .unwrap_or_else(|| panic!("no {side} amean: {m}"))
    };
    (amean("baseline"), amean("compare"))
}

/// Writes to `path` a minimal PVH ELF (ELF64 for x86_64 or ELF32 for
/// i386) loaded at `paddr`, whose 32-bit entry (the Xen PHYS32_ENTRY note
/// at file offset 0x180) runs `code` (at file offset 0x200).
fn write_pvh(path: &Path, elf64: bool, paddr: u64, code: &[u8]) {
    let filesz = code.len().max(0x100);
    let memsz = filesz.next_multiple_of(0x1000);
    let mut f = vec![0u8; 0x200 + filesz];
    let mut put = |at: usize, size: usize, v: u64| {
        f[at..at + size].copy_from_slice(&v.to_le_bytes()[..size]);
    };
    // Word size, where the program headers start, their size, and where
    // the ELF header's own size fields are.
    let (w, phoff, phentsize, sizes) = if elf64 {
        (8, 64, 56, 52)
    } else {
        (4, 52, 32, 40)
    };
    put(0, 4, u64::from(u32::from_le_bytes(*b"\x7fELF")));
    put(4, 1, if elf64 { 2 } else { 1 }); // ELFCLASS64 / ELFCLASS32
    put(5, 1, 1); // little endian
    put(6, 1, 1); // EV_CURRENT
    put(16, 2, 2); // ET_EXEC
    put(18, 2, if elf64 { 62 } else { 3 }); // EM_X86_64 / EM_386
    if !elf64 {
        put(20, 4, 1); // e_version
    }
    put(24, w, paddr); // e_entry
    put(24 + w, w, phoff as u64); // e_phoff
    put(sizes, 2, phoff as u64); // e_ehsize
    put(sizes + 2, 2, phentsize as u64);
    put(sizes + 4, 2, 2); // e_phnum
                          // Program headers: p_type, then p_offset, p_vaddr, p_paddr, p_filesz
                          // and p_memsz one word apart (after ELF64's p_flags).
    let word = |ph: usize, i: usize| ph + w * (i + 1);
    let load = phoff;
    put(load, 4, 1); // PT_LOAD
    if elf64 {
        put(load + 4, 4, 7); // p_flags: RWX
    }
    for (i, v) in [0x200, paddr, paddr, filesz as u64, memsz as u64]
        .into_iter()
        .enumerate()
    {
        put(word(load, i), w, v);
    }
    let note = phoff + phentsize;
    put(note, 4, 4); // PT_NOTE
    put(word(note, 0), w, 0x180); // p_offset
    put(word(note, 3), w, 20); // p_filesz
    let n = 0x180;
    put(n, 4, 4); // namesz
    put(n + 4, 4, 4); // descsz
    put(n + 8, 4, 18); // XEN_ELFNOTE_PHYS32_ENTRY
    put(n + 12, 4, u64::from(u32::from_le_bytes(*b"Xen\0")));
    put(n + 16, 4, paddr); // the entry
    f[0x200..0x200 + code.len()].copy_from_slice(code);
    std::fs::write(path, f).unwrap();
}

/// 32-bit code for a minimal PVH image: `mov eax, marker; mov dx, PHASE;
/// out dx, eax`, the phase-marker port write.
pub fn mark_code(m: ptiscope_abi::phase::Marker) -> Vec<u8> {
    let mut c = vec![0xb8];
    c.extend_from_slice(&m.encode().to_le_bytes());
    c.extend([0x66, 0xba, 0x00, 0x06, 0xef]);
    c
}

/// 32-bit code loaded at `paddr` that runs `before`, prints `text` to
/// COM1 in one `rep outsb`, then runs `after` (`text` is placed after
/// it).
pub fn print_code(paddr: u32, before: &[u8], text: &[u8], after: &[u8]) -> Vec<u8> {
    const PRINT_LEN: usize = 17;
    let text_at = paddr + (before.len() + PRINT_LEN + after.len()) as u32;
    let mut c = before.to_vec();
    c.extend([0xfc, 0xbe]); // cld; mov esi, imm32
    c.extend_from_slice(&text_at.to_le_bytes());
    c.push(0xb9); // mov ecx, imm32
    c.extend_from_slice(&(text.len() as u32).to_le_bytes());
    c.extend([0x66, 0xba, 0xf8, 0x03, 0xf3, 0x6e]); // mov dx, 0x3f8; rep outsb
    assert_eq!(c.len(), before.len() + PRINT_LEN);
    c.extend_from_slice(after);
    c.extend_from_slice(text);
    c
}

/// Writes a minimal PVH ELF64 whose 32-bit entry runs `code`, loaded at `paddr`.
pub fn write_pvh_elf(path: &Path, paddr: u64, code: &[u8]) {
    write_pvh(path, true, paddr, code);
}

/// Writes a minimal PVH ELF32 (i386) whose 32-bit entry runs `code`, loaded at `paddr`.
pub fn write_pvh_elf32(path: &Path, paddr: u32, code: &[u8]) {
    write_pvh(path, false, u64::from(paddr), code);
}

/// `ptiscope run ARGS` under KVM: its output, or `None` after printing
/// why `test` is skipped (no usable /dev/kvm).
pub fn kvm_run_or_skip(test: &str, args: &[&str]) -> Option<Output> {
    kvm_or_skip(test).then(|| ptiscope().arg("run").args(args).output().unwrap())
}

/// `ptiscope run --timeout SECS --kernel ELF` under KVM of a minimal PVH
/// image (ELF32 if `elf32`, else ELF64) whose 32-bit entry at 1 MiB runs
/// `code`: its output, or `None` after printing why `test` is skipped.
pub fn kvm_run_code_or_skip(test: &str, elf32: bool, code: &[u8], secs: &str) -> Option<Output> {
    if !kvm_or_skip(test) {
        return None;
    }
    let dir = Scratch::new(&test.replace(' ', "-"));
    let elf = dir.join("guest.elf");
    if elf32 {
        write_pvh_elf32(&elf, 0x10_0000, code);
    } else {
        write_pvh_elf(&elf, 0x10_0000, code);
    }
    let o = ptiscope()
        .args(["run", "--timeout", secs, "--kernel"])
        .arg(&elf)
        .output()
        .unwrap();
    Some(o)
}

/// `ptiscope run ARGS --json FILE` under KVM: its output and the run
/// document (`null` where none was written: a run refused before its
/// guest ran), or `None` after printing why `test` is skipped. A run
/// writes its document however it stopped: how it ended (`stop`,
/// `exit_code`) and its figures are read there, not from the summary's
/// words.
pub fn kvm_run_json_or_skip(test: &str, args: &[&str]) -> Option<(Output, serde_json::Value)> {
    let dir = kvm_scratch_or_skip(test, &format!("{}-json", test.replace(' ', "-")))?;
    Some(output_and_json(
        ptiscope().arg("run").args(args),
        &dir,
        "run",
    ))
}

/// [`kvm_run_code_or_skip`] with `--json`: the output and the run
/// document (as [`kvm_run_json_or_skip`]).
pub fn kvm_run_code_json_or_skip(
    test: &str,
    elf32: bool,
    code: &[u8],
    secs: &str,
) -> Option<(Output, serde_json::Value)> {
    let dir = kvm_scratch_or_skip(test, &format!("{}-code", test.replace(' ', "-")))?;
    let elf = dir.join("guest.elf");
    if elf32 {
        write_pvh_elf32(&elf, 0x10_0000, code);
    } else {
        write_pvh_elf(&elf, 0x10_0000, code);
    }
    Some(output_and_json(
        ptiscope()
            .args(["run", "--timeout", secs, "--kernel"])
            .arg(&elf),
        &dir,
        "run",
    ))
}

/// The `stop` of a run document, checked to be there (a document of a run
/// whose guest ran always has one).
pub fn stop_of(v: &serde_json::Value) -> &serde_json::Value {
    let stop = &v["stop"];
    assert!(stop["code"].is_string(), "no stop in the run document: {v}");
    stop
}

/// `ptiscope ARGS` is refused: it ends with `code` (not a panic) and
/// its stderr has every one of `wants`. Returns the stderr.
pub fn assert_refused(args: &[&str], code: i32, wants: &[&str]) -> String {
    let o = ptiscope().args(args).output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    for want in wants {
        assert!(err.contains(want), "{args:?}: no {want:?} in: {err}");
    }
    err
}

/// Spawns `cmd` with `--json JSON --csv CSV`, stdin empty and its stdout
/// and stderr piped (for [`interrupt`]).
pub fn spawn_writing(cmd: &mut Command, json: &Path, csv: &Path) -> std::process::Child {
    use std::process::Stdio;
    cmd.arg("--json")
        .arg(json)
        .arg("--csv")
        .arg(csv)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// What `ptiscope probe --json` found for 32-bit PAE paging on this host.
pub fn host_pae_paging_works() -> bool {
    probe_json()["paging"]["pae"]["outcome"]["result"] == "works"
}

/// `key=value` pairs of the first console line starting with `prefix`
/// (`@result`, `@fault`, `@pti`, ...).
pub fn machine_line(console: &str, prefix: &str) -> std::collections::HashMap<String, String> {
    let line = console
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix} line in:\n{console}"));
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `key=value` pairs of the guest's `@result` line.
pub fn result_line(console: &str) -> std::collections::HashMap<String, String> {
    machine_line(console, ptiscope_abi::RESULT_PREFIX.trim_end())
}

/// A numeric field of a machine line.
pub fn num(r: &std::collections::HashMap<String, String>, key: &str) -> u64 {
    r.get(key)
        .unwrap_or_else(|| panic!("no {key} in {r:?}"))
        .parse()
        .unwrap_or_else(|e| panic!("{key}: {e}"))
}

/// The row `name` of a run summary JSON (`ptiscope run --json`: `rows[]`).
pub fn summary_row<'a>(v: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    v["rows"].as_array()?.iter().find(|r| r["name"] == name)
}

/// The row `name` of a run summary JSON; panics naming it if there is
/// none.
pub fn the_row<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    summary_row(v, name).unwrap_or_else(|| panic!("no row {name} in {v}"))
}

/// True if the run whose JSON is `v` ran on kvm_pvm (a software KVM
/// whose shadow MMU and emulated guest kernel give exact host counts);
/// otherwise prints that `what` was not checked and why.
pub fn ran_on_kvm_pvm(v: &serde_json::Value, what: &str, why: &str) -> bool {
    let kvm = &v["environment"]["kvm"];
    let pvm = kvm["module"] == "kvm_pvm";
    if !pvm {
        ptiscope::test_support::skip(
            what,
            &format!(
                "{why}; this KVM is {} ({} paging)",
                kvm["module"], kvm["paging"]
            ),
        );
    }
    pvm
}

/// True if this host's KVM is kvm_pvm (where every guest kernel entry
/// exits to KVM and kernel code is emulated), for checks of a stream that
/// carries no environment block; otherwise prints that `what` was not
/// checked and why. The tests run on the host their ptiscope runs on.
pub fn host_is_kvm_pvm(what: &str, why: &str) -> bool {
    let pvm = Path::new("/sys/module/kvm_pvm").exists();
    if !pvm {
        ptiscope::test_support::skip(
            what,
            &format!(
                "{why}; this KVM is {}",
                ptiscope::HostFacts::read().describe_kvm()
            ),
        );
    }
    pvm
}

/// The `environment.backend` a `--backend kvm` report made by this test
/// process says: `nested` inside `--backend nested`
/// (scripts/nested-kvm-tests.sh: the KVM is real, its clock is TCG's),
/// else `kvm`.
pub fn kvm_backend_name() -> &'static str {
    if ptiscope::spec::nested::inside() {
        "nested"
    } else {
        "kvm"
    }
}

/// A summary row's phase total; panics naming the row if there is none.
pub fn row_total(v: &serde_json::Value, name: &str) -> f64 {
    summary_row(v, name)
        .and_then(|r| r["total"].as_f64())
        .unwrap_or_else(|| panic!("no row {name} in {v}"))
}

/// A summary row's per-call rate (`per_iteration`); panics if there is none.
pub fn row_per_call(v: &serde_json::Value, name: &str) -> f64 {
    summary_row(v, name)
        .and_then(|r| r["per_iteration"].as_f64())
        .unwrap_or_else(|| panic!("no rate {name} in {v}"))
}

/// Renders `svg` with resvg (text through the system's fonts): panics,
/// failing the test, when it does not parse or renders (almost) blank.
/// With `PTISCOPE_PNG_DIR` set, writes `name.png` there to be looked at.
pub fn render_png(svg: &str, name: &str) {
    let mut opt = resvg::usvg::Options::default();
    opt.fontdb_mut().load_system_fonts();
    let tree = resvg::usvg::Tree::from_str(svg, &opt).unwrap_or_else(|e| panic!("{name}: {e}"));
    let size = tree.size().to_int_size();
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height())
        .unwrap_or_else(|| panic!("{name}: empty picture"));
    resvg::render(
        &tree,
        resvg::tiny_skia::Transform::default(),
        &mut pixmap.as_mut(),
    );
    let ink = pixmap
        .pixels()
        .iter()
        .filter(|p| p.red() < 200 || p.green() < 200 || p.blue() < 200)
        .count();
    assert!(
        ink > 500,
        "{name}: rendered (almost) blank: {ink} dark pixels"
    );
    if let Some(dir) = std::env::var_os("PTISCOPE_PNG_DIR") {
        let path = Path::new(&dir).join(format!("{name}.png"));
        pixmap
            .save_png(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

/// Runs `cmd` with `--json FILE` added (FILE `name.json` in `dir`): its
/// output and the document it wrote (`null` where it wrote none: a run
/// refused or failed before its guest ran). Tests read figures and decisions from the
/// document, not from the summary's wording.
pub fn output_and_json(cmd: &mut Command, dir: &Path, name: &str) -> (Output, serde_json::Value) {
    let json = dir.join(format!("{name}.json"));
    let _ = std::fs::remove_file(&json);
    let o = cmd.arg("--json").arg(&json).output().unwrap();
    (o, json_or_null(&json))
}

/// True if a run or sweep document's `config` (the options the VMM gave
/// the guest, `key=value`) holds `word`, e.g. `pti=on` or `cpus=2`.
pub fn config_has(v: &serde_json::Value, word: &str) -> bool {
    v["config"]
        .as_array()
        .is_some_and(|c| c.iter().any(|w| w == word))
}

/// Panics unless every `cross_checks[]` entry of a run document agrees,
/// and there is at least one.
pub fn assert_cross_checks_agree(v: &serde_json::Value, what: &str) {
    let checks = v["cross_checks"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: no cross_checks in {v}"));
    assert!(!checks.is_empty(), "{what}: no cross-check made: {v}");
    for c in checks {
        assert_eq!(c["agrees"], true, "{what}: {c}");
    }
}

/// The cross-check of a run document whose host side is `host_metric`;
/// panics naming it if there is none.
pub fn cross_check<'a>(v: &'a serde_json::Value, host_metric: &str) -> &'a serde_json::Value {
    v["cross_checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["host_metric"] == host_metric))
        .unwrap_or_else(|| panic!("no cross-check of {host_metric} in {v}"))
}

/// The guest image a run document says the VMM booted
/// (`environment.guest_image`): (name, elf32).
pub fn guest_image(v: &serde_json::Value) -> (&str, bool) {
    let g = &v["environment"]["guest_image"];
    (
        g["name"]
            .as_str()
            .unwrap_or_else(|| panic!("no guest_image.name in {v}")),
        g["elf32"]
            .as_bool()
            .unwrap_or_else(|| panic!("no guest_image.elf32 in {v}")),
    )
}

/// `ptiscope probe --json`: what this host's KVM does, as the VMM found it.
pub fn probe_json() -> serde_json::Value {
    let o = ptiscope().args(["probe", "--json"]).output().unwrap();
    assert!(o.status.success(), "probe failed: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).expect("probe --json prints JSON")
}

/// True if a `--backend nested` session can run here (a fetched
/// `debian-amd64` with its KVM modules, and QEMU); otherwise prints why
/// `test` is skipped.
pub fn nested_or_skip(test: &str) -> bool {
    if let Err(e) = ptiscope::nested::payload::find_kernel() {
        ptiscope::test_support::skip(test, &e.to_string());
        return false;
    }
    qemu_or_skip(test, "qemu-system-x86_64")
}

/// Runs `request` (a `nested::Request` as JSON) in one nested boot of
/// `cpus` outer vCPUs (`ptiscope nested-batch`, the request written into
/// `scratch`) and returns the response; `None`, having printed why `test`
/// is skipped, where this QEMU gives no usable SVM. Any other failure of
/// the session fails the test.
pub fn nested_batch(
    test: &str,
    scratch: &Scratch,
    request: &serde_json::Value,
    cpus: u32,
) -> Option<serde_json::Value> {
    let req = scratch.join("request.json");
    std::fs::write(&req, request.to_string()).unwrap();
    let start = std::time::Instant::now();
    let o = ptiscope()
        .args(["nested-batch", "--cpus", &cpus.to_string()])
        .arg(&req)
        .output()
        .unwrap();
    let err = stderr(&o);
    if o.status.code() == Some(69) && err.contains("could not set up KVM") {
        ptiscope::test_support::skip(test, &format!("this QEMU gives no usable SVM: {err}"));
        return None;
    }
    assert_eq!(o.status.code(), Some(0), "{err}");
    let jobs = request["jobs"].as_array().map_or(0, Vec::len);
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "{test}: {jobs} jobs in one nested boot, {:.1} s",
        start.elapsed().as_secs_f64()
    );
    Some(serde_json::from_slice(&o.stdout).unwrap())
}

/// Decompresses an LZ4 legacy-format stream (what Linux's
/// `CONFIG_KERNEL_LZ4` bzImage carries): 4-byte magic, then blocks of a
/// 4-byte compressed size and an LZ4 block, until the sizes run out.
pub fn lz4_legacy(mut input: &[u8]) -> Option<Vec<u8>> {
    input = input.strip_prefix(&[0x02, 0x21, 0x4c, 0x18][..])?;
    let mut out = Vec::new();
    while input.len() >= 4 {
        let size = u32::from_le_bytes(input[..4].try_into().ok()?) as usize;
        if size == 0 || size > input.len() - 4 {
            break;
        }
        let mut b = &input[4..4 + size];
        input = &input[4 + size..];
        loop {
            let token = *b.first()?;
            b = &b[1..];
            let len = lz4_length((token >> 4) as usize, &mut b)?;
            out.extend_from_slice(b.get(..len)?);
            b = &b[len..];
            if b.is_empty() {
                break;
            }
            let offset = u16::from_le_bytes([*b.first()?, *b.get(1)?]) as usize;
            b = &b[2..];
            let mlen = lz4_length((token & 15) as usize, &mut b)? + 4;
            let start = out.len().checked_sub(offset).filter(|_| offset > 0)?;
            for i in 0..mlen {
                out.push(out[start + i]);
            }
        }
    }
    Some(out)
}

/// An LZ4 sequence's length from its 4-bit token field: 15 means more
/// bytes follow, each added, until one below 255.
fn lz4_length(field: usize, b: &mut &[u8]) -> Option<usize> {
    let mut len = field;
    if field == 15 {
        loop {
            let x = *b.first()?;
            *b = &b[1..];
            len += x as usize;
            if x != 255 {
                break;
            }
        }
    }
    Some(len)
}

/// The ELF vmlinux inside an LZ4 bzImage (its setup header locates the payload).
pub fn vmlinux_of(bz: &[u8]) -> Option<Vec<u8>> {
    let sects = match bz[0x1f1] {
        0 => 4,
        n => n as usize,
    };
    let u32_at = |o: usize| u32::from_le_bytes(bz[o..o + 4].try_into().unwrap()) as usize;
    let start = (sects + 1) * 512 + u32_at(0x248);
    let payload = bz.get(start..start + u32_at(0x24c))?;
    lz4_legacy(payload).filter(|v| v.starts_with(b"\x7fELF\x02"))
}

/// Runs `one` on every case, `at_once` at a time on scoped threads (for
/// independent VMs that mostly wait: their timeouts, their start and
/// stop), and returns what `one` said of the cases that failed. A panic in
/// `one` fails the test as it would on the test's own thread.
pub fn run_at_once<T: Copy + Send + Sync>(
    cases: &[T],
    at_once: usize,
    one: impl Fn(T) -> Option<String> + Sync,
) -> Vec<String> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..at_once {
            s.spawn(|| {
                while let Some(&case) =
                    cases.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                {
                    if let Some(f) = one(case) {
                        failures.lock().unwrap_or_else(|p| p.into_inner()).push(f);
                    }
                }
            });
        }
    });
    failures.into_inner().unwrap_or_else(|p| p.into_inner())
}
