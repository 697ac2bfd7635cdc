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

/// Sends SIGINT to `child` and waits for it to end: within 5 s ("within a
/// second" on an idle host; a generous margin for a loaded one), with exit
/// code 130. Returns its stdout and stderr.
pub fn interrupt(mut child: std::process::Child) -> (String, String) {
    use std::time::{Duration, Instant};
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let sent = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if sent.elapsed() >= Duration::from_secs(10) {
            // Leave no ptiscope behind for the rest of the suite.
            let _ = child.kill();
            let _ = child.wait();
            panic!("still running 10 s after SIGINT");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = sent.elapsed();
    let out = child.wait_with_output().unwrap();
    let (text, err) = (stdout(&out), stderr(&out));
    assert!(took < Duration::from_secs(5), "took {took:?}\n{err}");
    assert_eq!(status.code(), Some(130), "{err}");
    (text, err)
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

/// True if qemu-system-i386 starts; otherwise prints why `test` is skipped.
pub fn qemu_i386_or_skip(test: &str) -> bool {
    if Command::new("qemu-system-i386")
        .arg("--version")
        .output()
        .is_err()
    {
        ptiscope::test_support::skip(test, "qemu-system-i386 is not installed");
        return false;
    }
    true
}

/// `ptiscope run --arch i386 --backend qemu --timeout SECS`: the embedded
/// i386 guest under QEMU TCG; the caller adds the rest.
pub fn run_i386_qemu(timeout_secs: u32) -> Command {
    let mut c = ptiscope();
    c.args(["run", "--arch", "i386", "--backend", "qemu", "--timeout"])
        .arg(timeout_secs.to_string());
    c
}

/// True if /dev/kvm can be opened; otherwise prints why the test is skipped.
pub fn kvm_or_skip(test: &str) -> bool {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => true,
        Err(e) => {
            ptiscope::test_support::skip(test, &format!("/dev/kvm is not usable here ({e})"));
            false
        }
    }
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

/// Completes a PVH image: the Xen PHYS32_ENTRY note (entry `entry`) at
/// 0x180, `code` at file offset 0x200; writes it to `path`.
fn finish_pvh(mut f: Vec<u8>, entry: u32, code: &[u8], path: &Path) {
    let n = 0x180;
    f[n..n + 4].copy_from_slice(&4u32.to_le_bytes()); // namesz
    f[n + 4..n + 8].copy_from_slice(&4u32.to_le_bytes()); // descsz
    f[n + 8..n + 12].copy_from_slice(&18u32.to_le_bytes()); // XEN_ELFNOTE_PHYS32_ENTRY
    f[n + 12..n + 16].copy_from_slice(b"Xen\0");
    f[n + 16..n + 20].copy_from_slice(&entry.to_le_bytes());
    f[0x200..0x200 + code.len()].copy_from_slice(code);
    std::fs::write(path, f).unwrap();
}

/// Writes a minimal PVH ELF64 whose 32-bit entry runs `code`, loaded at `paddr`.
pub fn write_pvh_elf(path: &Path, paddr: u64, code: &[u8]) {
    assert!(code.len() <= 0x100);
    let mut f = vec![0u8; 0x300];
    f[..4].copy_from_slice(b"\x7fELF");
    f[4] = 2; // ELFCLASS64
    f[5] = 1; // little endian
    f[6] = 1;
    f[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    f[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    f[24..32].copy_from_slice(&paddr.to_le_bytes());
    f[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
    f[52..54].copy_from_slice(&64u16.to_le_bytes());
    f[54..56].copy_from_slice(&56u16.to_le_bytes());
    f[56..58].copy_from_slice(&2u16.to_le_bytes());
    let ph = 64; // PT_LOAD
    f[ph..ph + 4].copy_from_slice(&1u32.to_le_bytes());
    f[ph + 4..ph + 8].copy_from_slice(&7u32.to_le_bytes());
    f[ph + 8..ph + 16].copy_from_slice(&0x200u64.to_le_bytes());
    f[ph + 16..ph + 24].copy_from_slice(&paddr.to_le_bytes());
    f[ph + 24..ph + 32].copy_from_slice(&paddr.to_le_bytes());
    f[ph + 32..ph + 40].copy_from_slice(&0x100u64.to_le_bytes());
    f[ph + 40..ph + 48].copy_from_slice(&0x1000u64.to_le_bytes());
    let ph = 64 + 56; // PT_NOTE
    f[ph..ph + 4].copy_from_slice(&4u32.to_le_bytes());
    f[ph + 8..ph + 16].copy_from_slice(&0x180u64.to_le_bytes());
    f[ph + 32..ph + 40].copy_from_slice(&20u64.to_le_bytes());
    finish_pvh(f, paddr as u32, code, path);
}

/// Writes a minimal PVH ELF32 (i386) whose 32-bit entry runs `code`, loaded at `paddr`.
pub fn write_pvh_elf32(path: &Path, paddr: u32, code: &[u8]) {
    assert!(code.len() <= 0x100);
    let mut f = vec![0u8; 0x300];
    f[..4].copy_from_slice(b"\x7fELF");
    f[4] = 1; // ELFCLASS32
    f[5] = 1; // little endian
    f[6] = 1;
    f[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    f[18..20].copy_from_slice(&3u16.to_le_bytes()); // EM_386
    f[20..24].copy_from_slice(&1u32.to_le_bytes());
    f[24..28].copy_from_slice(&paddr.to_le_bytes());
    f[28..32].copy_from_slice(&52u32.to_le_bytes()); // e_phoff
    f[40..42].copy_from_slice(&52u16.to_le_bytes());
    f[42..44].copy_from_slice(&32u16.to_le_bytes());
    f[44..46].copy_from_slice(&2u16.to_le_bytes());
    let ph = 52; // PT_LOAD
    f[ph..ph + 4].copy_from_slice(&1u32.to_le_bytes());
    f[ph + 4..ph + 8].copy_from_slice(&0x200u32.to_le_bytes());
    f[ph + 8..ph + 12].copy_from_slice(&paddr.to_le_bytes());
    f[ph + 12..ph + 16].copy_from_slice(&paddr.to_le_bytes());
    f[ph + 16..ph + 20].copy_from_slice(&0x100u32.to_le_bytes());
    f[ph + 20..ph + 24].copy_from_slice(&0x1000u32.to_le_bytes());
    let ph = 52 + 32; // PT_NOTE
    f[ph..ph + 4].copy_from_slice(&4u32.to_le_bytes());
    f[ph + 4..ph + 8].copy_from_slice(&0x180u32.to_le_bytes());
    f[ph + 16..ph + 20].copy_from_slice(&20u32.to_le_bytes());
    finish_pvh(f, paddr, code, path);
}

/// What `ptiscope probe --json` found for 32-bit PAE paging on this host.
pub fn host_pae_paging_works() -> bool {
    let o = ptiscope().args(["probe", "--json"]).output().unwrap();
    assert!(o.status.success(), "probe failed: {}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["paging"]["pae"]["outcome"]["result"] == "works"
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
