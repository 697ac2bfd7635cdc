//! ptiscope's QEMU TCG plugin (`--backend qemu`): its host-observed counts
//! agree exactly with the guest's own, are exact across runs, match the
//! companion kernel's known path lengths, come per vCPU with `--cpus 2`,
//! and catch a guest that misreports its CR3 writes. Every test skips with
//! a printed reason when QEMU is missing, too old or built without plugins.

mod common;

use common::*;
use ptiscope_abi::phase::{Marker, ID_WORKLOAD};
use serde_json::Value;

fn binary(arch: &str) -> &'static str {
    if arch == "i386" {
        "qemu-system-i386"
    } else {
        "qemu-system-x86_64"
    }
}

/// `ptiscope run --backend qemu` with `args`; the JSON summary and stderr.
fn run_json(name: &str, args: &[&str]) -> (Value, String) {
    // Tests run in parallel in one process: one directory per call.
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = Scratch::new(&format!("{name}-{n}"));
    let json = dir.join("run.json");
    let o = ptiscope()
        .args(["run", "--backend", "qemu", "--timeout", "120"])
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
    (read_json(&json), err)
}

/// Whether run document `v` has a note of code `code`.
fn has_note(v: &Value, code: &str) -> bool {
    v["notes"]
        .as_array()
        .is_some_and(|n| n.iter().any(|n| n["code"] == code))
}

fn check<'a>(v: &'a Value, host_metric: &str) -> &'a Value {
    v["cross_checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["host_metric"] == host_metric)
        .unwrap_or_else(|| panic!("no {host_metric} cross-check: {v}"))
}

#[test]
fn plugin_cr3_writes_equal_the_guests_on_both_flavours() {
    for arch in ["x86_64", "i386"] {
        if !plugin_or_skip("plugin CR3 writes", binary(arch)) {
            return;
        }
        for pti in ["on", "off"] {
            let (v, err) = run_json(
                "plugin-cr3",
                &[
                    "--arch",
                    arch,
                    "--workload",
                    "getpid",
                    "--iterations",
                    "300",
                    "--pti",
                    pti,
                ],
            );
            let host = row_total(&v, "insn_mov_cr3");
            let guest = row_total(&v, "cr3_writes");
            assert_eq!(host, guest, "{arch} pti={pti}: {err}");
            assert_eq!(
                host,
                if pti == "on" { 602.0 } else { 0.0 },
                "{arch} pti={pti}"
            );
            let r = summary_row(&v, "insn_mov_cr3").unwrap();
            assert_eq!(r["source"], "qemu_plugin", "{r}");
            let c = check(&v, "insn_mov_cr3");
            assert_eq!(c["agrees"], true, "{c}");
            assert_eq!(check(&v, "syscall_entries")["agrees"], true, "{v}");
            assert!(has_note(&v, "plugin_rows"), "{}", v["notes"]);
        }
    }
}

/// Instructions (kernel, and kernel + user) in the phase of `n` getpid
/// calls, with the guest's `-icount` cycles (instructions of its loop
/// alone, counted by QEMU's icount rather than by the plugin).
fn phase_instructions(arch: &str, entry: &str, pti: &str, n: u64) -> (f64, f64, f64) {
    let n = n.to_string();
    let (v, _) = run_json(
        "plugin-insns",
        &[
            "--arch",
            arch,
            "--entry",
            entry,
            "--pti",
            pti,
            "--workload",
            "getpid",
            "--iterations",
            &n,
            "--qemu-arg=-icount",
            "--qemu-arg=shift=0,align=off",
        ],
    );
    let k = row_total(&v, "kernel_instructions");
    let u = row_total(&v, "user_instructions");
    (k, k + u, row_total(&v, "cycles"))
}

#[test]
fn kernel_instructions_per_getpid_are_exact_and_the_known_path_lengths() {
    // Each getpid round trip adds the same instructions: the slope between
    // 200 and 700 calls is the path length, exactly. It must equal what
    // QEMU's -icount counts for the guest's loop (an independent count),
    // and PTI must add the stubs' known instructions (docs/guest.md,
    // docs/results.md: 12 on x86_64, 16 for int80 and 17 for SYSENTER on
    // i386).
    for (arch, entry, pti_adds) in [
        ("x86_64", "int3", 12.0),
        ("x86_64", "syscall", 12.0),
        ("i386", "int80", 16.0),
        ("i386", "sysenter", 17.0),
    ] {
        if !plugin_or_skip("plugin kernel instructions", binary(arch)) {
            return;
        }
        let mut kernel_slope = Vec::new();
        for pti in ["off", "on"] {
            let (k1, t1, icount1) = phase_instructions(arch, entry, pti, 200);
            let (k2, t2, icount2) = phase_instructions(arch, entry, pti, 700);
            // Exact across runs: the same run twice counts the same.
            let (k1b, t1b, _) = phase_instructions(arch, entry, pti, 200);
            assert_eq!(
                (k1, t1),
                (k1b, t1b),
                "{arch} {entry} pti={pti}: not repeatable"
            );
            let slope = (t2 - t1) / 500.0;
            assert_eq!(slope.fract(), 0.0, "{arch} {entry} pti={pti}: {slope}");
            let icount_slope = (icount2 - icount1) / 500.0;
            assert_eq!(
                slope, icount_slope,
                "{arch} {entry} pti={pti}: plugin vs -icount"
            );
            let ks = (k2 - k1) / 500.0;
            assert_eq!(ks.fract(), 0.0, "{arch} {entry} pti={pti}: {ks}");
            assert!(
                ks > 0.0 && ks < slope,
                "{arch} {entry} pti={pti}: {ks} of {slope}"
            );
            kernel_slope.push(ks);
        }
        assert_eq!(
            kernel_slope[1] - kernel_slope[0],
            pti_adds,
            "{arch} {entry}: PTI's kernel instructions per call"
        );
    }
}

#[test]
fn x86_64_kernel_path_matches_kvm_insn_emulation() {
    // KVM on kvm_pvm counts 26 / 38 kernel instructions per getpid (int3,
    // pti off/on; docs/results.md). The plugin's kernel-range count must
    // give the same path lengths.
    if !plugin_or_skip("plugin vs the KVM path length", "qemu-system-x86_64") {
        return;
    }
    for (pti, want) in [("off", 26.0), ("on", 38.0)] {
        let (k1, _, _) = phase_instructions("x86_64", "int3", pti, 200);
        let (k2, _, _) = phase_instructions("x86_64", "int3", pti, 700);
        assert_eq!((k2 - k1) / 500.0, want, "pti={pti}");
    }
}

#[test]
fn poundsyscall_with_two_cpus_gives_per_vcpu_rows() {
    if !plugin_or_skip("plugin per-vCPU rows", "qemu-system-i386") {
        return;
    }
    for arch in ["i386", "x86_64"] {
        let (v, err) = run_json(
            "plugin-smp",
            &[
                "--arch",
                arch,
                "--workload",
                "poundsyscall",
                "--iterations",
                "200",
                "--cpus",
                "2",
                "--cmdline",
                "threads=2",
                "--pti",
                "on",
            ],
        );
        let total = row_total(&v, "kernel_instructions");
        let per: Vec<f64> = (0..2)
            .map(|i| row_total(&v, &format!("kernel_instructions_vcpu{i}")))
            .collect();
        assert_eq!(per.iter().sum::<f64>(), total, "{arch}: {err}");
        // Each thread runs on its own CPU: both vCPUs make ~200 calls.
        for i in 0..2 {
            let calls = row_total(&v, &format!("syscall_entries_vcpu{i}"));
            assert!(calls >= 200.0, "{arch} vCPU {i}: {calls} syscalls: {err}");
            let cr3 = row_total(&v, &format!("insn_mov_cr3_vcpu{i}"));
            assert!(cr3 >= 400.0, "{arch} vCPU {i}: {cr3} CR3 writes");
        }
        assert_eq!(check(&v, "insn_mov_cr3")["agrees"], true, "{v}");
    }
}

#[test]
fn a_guest_that_misreports_its_cr3_writes_is_caught() {
    if !plugin_or_skip("misreported CR3 writes", "qemu-system-i386") {
        return;
    }
    // A hand-made ELF32 guest (PVH entry, paging off, QEMU -M pc): marks the phase,
    // writes CR3 twice, ends the phase, and claims it wrote none.
    const PADDR: u32 = 0x100000;
    let text = b"@result workload=getpid iterations=1000 cycles=5000 cr3_writes=0\n";
    let mut before = mark_code(Marker::begin(ID_WORKLOAD));
    // mov eax, cr3; mov cr3, eax; mov cr3, eax
    before.extend([0x0f, 0x20, 0xd8, 0x0f, 0x22, 0xd8, 0x0f, 0x22, 0xd8]);
    before.extend(mark_code(Marker::end(ID_WORKLOAD)));
    let exit = [0x31, 0xc0, 0xe7, 0xf4, 0xf4]; // xor eax,eax; out 0xf4,eax; hlt
    let code = print_code(PADDR, &before, text, &exit);
    let dir = Scratch::new("plugin-liar");
    let elf = dir.join("liar.elf");
    write_pvh_elf32(&elf, PADDR, &code);
    // QEMU divides by the PT_NOTE's p_align (0 in the minimal ELF: SIGFPE).
    let mut f = std::fs::read(&elf).unwrap();
    f[52 + 32 + 28..52 + 32 + 32].copy_from_slice(&4u32.to_le_bytes());
    std::fs::write(&elf, f).unwrap();
    let (v, err) = run_json(
        "plugin-liar-run",
        &[
            "--workload",
            "getpid",
            "--iterations",
            "1000",
            "--kernel",
            elf.to_str().unwrap(),
        ],
    );
    assert_eq!(row_total(&v, "insn_mov_cr3"), 2.0, "{err}");
    let c = check(&v, "insn_mov_cr3");
    assert_eq!(c["guest_value"], 0.0, "{c}");
    assert_eq!(c["agrees"], false, "{c}");
    assert!(
        err.contains("insn_mov_cr3 [qemu-plugin] 2 vs cr3_writes [guest] 0: DISAGREE"),
        "{err}"
    );
}

#[test]
fn no_plugin_means_no_host_observed_rows() {
    if !plugin_or_skip("--no-plugin", "qemu-system-x86_64") {
        return;
    }
    let (v, err) = run_json(
        "plugin-off",
        &["--workload", "getpid", "--iterations", "100", "--no-plugin"],
    );
    assert!(summary_row(&v, "insn_mov_cr3").is_none(), "{v}");
    assert!(summary_row(&v, "cr3_writes").is_some(), "{v}");
    assert!(has_note(&v, "plugin_off"), "{err}\n{}", v["notes"]);
}

/// A stand-in `qemu-system-x86_64` in a directory of its own: prints
/// `version` for `--version` and `help` for `-help`, and fails if it is
/// ever asked to boot anything.
fn fake_qemu(name: &str, version: &str, help: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch(name);
    let script = dir.join("qemu-system-x86_64");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncase \"$1\" in\n--version) echo '{version}';;\n-help) printf '%b' '{help}';;\n*) echo booted >&2; exit 3;;\nesac\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

#[test]
fn an_old_qemu_or_one_without_plugins_is_said_before_booting() {
    for (name, version, help, says) in [
        (
            "fake-old",
            "QEMU emulator version 5.2.0",
            "-plugin [file=]<file>\\n",
            "too old",
        ),
        (
            "fake-noplugin",
            "QEMU emulator version 7.2.0",
            "-kernel bzImage\\n",
            "without TCG plugin support",
        ),
    ] {
        let dir = fake_qemu(name, version, help);
        let path = format!(
            "{}:{}",
            dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let o = ptiscope()
            .env("PATH", &path)
            .args(["run", "--backend", "qemu", "--workload", "getpid"])
            .output()
            .unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(69), "{name}: {err}");
        assert!(
            err.contains(says) && err.contains("--no-plugin"),
            "{name}: {err}"
        );
        assert!(!err.contains("booted"), "{name}: QEMU was started: {err}");
        // --no-plugin goes ahead (and reaches the stand-in, which fails).
        let o = ptiscope()
            .env("PATH", &path)
            .args([
                "run",
                "--backend",
                "qemu",
                "--workload",
                "getpid",
                "--no-plugin",
            ])
            .output()
            .unwrap();
        assert!(stderr(&o).contains("booted"), "{name}: {}", stderr(&o));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A REP string instruction counts once, however many iterations it runs:
/// TCG executes one iteration per run of a block that starts at the
/// instruction (it jumps back to itself), so counting per block run would
/// count each iteration. A minimal PVH image, run by QEMU itself with the
/// plugin and no ptiscope in between, executes between its two marker
/// writes: `out` (the begin marker), `mov ecx, 1000; rep stosb` (the REP at
/// the end of a block), `mov ecx, 1000; jmp; rep stosd` (a block that
/// starts with it), `mov ecx, 0; jmp; rep stosb` (no iteration), `mov
/// eax, END; mov dx, 0x600`: 11 instructions, not the 2011 that a count
/// per block run gives (each 1000-iteration REP's block runs 1001 times,
/// the last to find ECX zero).
#[test]
fn a_rep_string_instruction_counts_once() {
    use ptiscope::observe::qemu_plugin::PluginCounter;
    for binary in ["qemu-system-i386", "qemu-system-x86_64"] {
        let test = format!("rep counts once ({binary})");
        if !plugin_or_skip(&test, binary) {
            continue;
        }
        let mut code = vec![0xfc, 0xbf, 0x00, 0x00, 0x20, 0x00]; // cld; mov edi, 0x200000
        code.extend(mark_code(Marker::begin(ID_WORKLOAD)));
        code.extend([0xb9, 0xe8, 0x03, 0x00, 0x00, 0xf3, 0xaa]); // mov ecx, 1000; rep stosb
        code.extend([0xb9, 0xe8, 0x03, 0x00, 0x00, 0xeb, 0x00, 0xf3, 0xab]); // ...; jmp $+2; rep stosd
        code.extend([0xb9, 0x00, 0x00, 0x00, 0x00, 0xeb, 0x00, 0xf3, 0xaa]); // ecx = 0
        code.extend(mark_code(Marker::end(ID_WORKLOAD)));
        // The exit-status write: out dx, eax to isa-debug-exit; QEMU exits 1.
        code.extend([
            0x31, 0xc0, 0xba, 0xf4, 0x00, 0x00, 0x00, 0xef, 0xf4, 0xeb, 0xfd,
        ]);
        let phase = phase_of_pvh_code(binary, &format!("rep-once-{binary}"), &code);
        assert_eq!(
            (
                phase.get(PluginCounter::KernelInsns),
                phase.get(PluginCounter::UserInsns)
            ),
            (11, 0),
            "{binary}: {phase:?}"
        );
    }
}

/// Runs `code` (loaded at 1 MiB, entered in 32-bit protected mode) under
/// QEMU `binary` with the plugin, no ptiscope between them, and returns
/// the plugin's phase counts (the code brackets its phase with
/// [`mark_code`] and ends with an isa-debug-exit write of 0).
fn phase_of_pvh_code(
    binary: &str,
    name: &str,
    code: &[u8],
) -> ptiscope::observe::qemu_plugin::Counts {
    use ptiscope::observe::qemu_plugin::PluginReport;
    let (plugin, _) = ptiscope::backend::qemu::plugin_for(binary).unwrap();
    let dir = Scratch::new(name);
    let elf = dir.join("guest.elf");
    write_pvh_elf32(&elf, 0x10_0000, code);
    note_align_4(&elf);
    let out = dir.join("plugin.txt");
    let mut child = std::process::Command::new(binary)
        .args(["-M", "pc", "-accel", "tcg", "-m", "64", "-display", "none"])
        .args(["-nodefaults", "-no-reboot", "-serial", "none"])
        .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=0x04"])
        .arg("-kernel")
        .arg(&elf)
        .arg("-plugin")
        .arg(format!(
            "{},out={},kernel=0x100000-0x1fffff,marks=0x100000-0x1fffff",
            plugin.display(),
            out.display()
        ))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let limit = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > limit {
            let _ = child.kill();
            panic!("{binary} did not exit within 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    // isa-debug-exit: (0 << 1) | 1.
    assert_eq!(status.code(), Some(1), "{binary}: {err}");
    let report = PluginReport::parse(&std::fs::read(&out).unwrap()).unwrap();
    report.companion_phase().unwrap().delta.total()
}

/// An instruction that reaches into the next page, not first in its
/// block, counts once: TCG ends the block before it and translates it as
/// the next block's first, and QEMU 7.2 still listed it in the first block
/// (it counted twice). Between the markers: the begin `out`, a `jmp` to
/// 13 `nop`s ending at 0x100ffd, a 5-byte `mov eax, imm32` from 0x100ffd
/// to 0x101001, and the end marker's two `mov`s: 18 instructions.
#[test]
fn an_instruction_across_a_page_boundary_counts_once() {
    use ptiscope::observe::qemu_plugin::PluginCounter;
    for binary in ["qemu-system-i386", "qemu-system-x86_64"] {
        let test = format!("page-crossing instruction counts once ({binary})");
        if !plugin_or_skip(&test, binary) {
            continue;
        }
        let mut code = mark_code(Marker::begin(ID_WORKLOAD));
        let nops_at = 0xff0usize;
        let jmp_end = code.len() + 5;
        code.push(0xe9); // jmp rel32
        code.extend(((nops_at - jmp_end) as u32).to_le_bytes());
        code.resize(nops_at, 0xf4); // hlt: never reached
        code.extend([0x90; 13]);
        assert_eq!(code.len(), 0xffd);
        code.extend([0xb8, 0x11, 0x22, 0x33, 0x44]); // mov eax, imm32: 0x100ffd..0x101001
        code.extend(mark_code(Marker::end(ID_WORKLOAD)));
        code.extend([
            0x31, 0xc0, 0xba, 0xf4, 0x00, 0x00, 0x00, 0xef, 0xf4, 0xeb, 0xfd,
        ]);
        let phase = phase_of_pvh_code(binary, &format!("page-cross-{binary}"), &code);
        assert_eq!(
            (
                phase.get(PluginCounter::KernelInsns),
                phase.get(PluginCounter::UserInsns)
            ),
            (18, 0),
            "{binary}: {phase:?}"
        );
    }
}

/// Gives the PT_NOTE segments of an ELF32 `p_align` 4: QEMU's ELF loader
/// divides by it (the shared PVH helper writes 0, which ptiscope refuses
/// for that reason; this test runs QEMU without ptiscope).
fn note_align_4(elf: &std::path::Path) {
    let mut f = std::fs::read(elf).unwrap();
    let u16_at = |f: &[u8], o: usize| u16::from_le_bytes([f[o], f[o + 1]]) as usize;
    let u32_at = |f: &[u8], o: usize| u32::from_le_bytes(f[o..o + 4].try_into().unwrap());
    assert_eq!(f[4], 1, "not an ELF32");
    let (phoff, phentsize, phnum) = (u32_at(&f, 28) as usize, u16_at(&f, 42), u16_at(&f, 44));
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        if u32_at(&f, ph) == 4 {
            f[ph + 28..ph + 32].copy_from_slice(&4u32.to_le_bytes());
        }
    }
    std::fs::write(elf, f).unwrap();
}

/// QEMU loads several plugins side by side, so a user's own `-plugin`
/// (`--qemu-arg=-plugin --qemu-arg=...`) runs beside ptiscope's, whose
/// counts stay exact, and alone with `--no-plugin`. The other plugin is a
/// second copy of ptiscope's own under another name, with its own output
/// file: that it wrote the file shows QEMU loaded and ran it.
#[test]
fn a_users_own_plugin_runs_beside_ptiscopes_and_alone() {
    let qemu = binary("x86_64");
    if !plugin_or_skip("a user's own plugin", qemu) {
        return;
    }
    let (ours, _) = ptiscope::backend::qemu::plugin_for(qemu).unwrap();
    let dir = Scratch::new("user-plugin");
    let other = dir.join("another plugin.so");
    std::fs::copy(&ours, &other).unwrap();
    for with_ours in [true, false] {
        let out = dir.join(format!("another-{with_ours}.out"));
        // QEMU's option syntax: a comma in a value is doubled (none here).
        let arg = format!(
            "--qemu-arg=file={},out={},kernel=0-ffffffffffffffff",
            other.display(),
            out.display()
        );
        let mut args = vec![
            "--workload",
            "getpid",
            "--iterations",
            "300",
            "--pti",
            "on",
            "--qemu-arg=-plugin",
            &arg,
        ];
        if !with_ours {
            args.push("--no-plugin");
        }
        let (v, err) = run_json("user-plugin", &args);
        let written = std::fs::metadata(&out).map_or(0, |m| m.len());
        assert!(
            written > 0,
            "with_ours={with_ours}: {out:?} not written: {err}"
        );
        match with_ours {
            true => {
                assert_eq!(row_total(&v, "insn_mov_cr3"), 602.0, "{err}");
                assert_eq!(check(&v, "insn_mov_cr3")["agrees"], true, "{v}");
            }
            false => assert!(summary_row(&v, "insn_mov_cr3").is_none(), "{v}"),
        }
    }
}
