//! Boot-to-exit wall time of the default guest: ptiscope vs QEMU microvm.
//!
//! Both boot the same ELF (the one `vmm/build.rs` embeds into ptiscope) with
//! `workload=none`, so the guest prints its banner and writes its exit status.
//! Runs are interleaved (ptiscope, QEMU, ptiscope, ...) so that machine noise
//! hits both alike. QEMU uses qboot, not SeaBIOS: SeaBIOS is very slow under
//! software KVM (kvm_pvm) and would flatter ptiscope.
use crate::measure::{self, median, Sample};
use crate::Report;
use clap::Args;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Args)]
pub struct BootArgs {
    /// Boots per contender.
    #[arg(long, default_value_t = 10)]
    runs: usize,
    /// Guest memory in MiB (both contenders).
    #[arg(long, default_value_t = 128)]
    mem: u32,
    /// Guest ELF (default: the image vmm/build.rs built, target/guest/...).
    #[arg(long)]
    kernel: Option<PathBuf>,
    /// QEMU binary.
    #[arg(long, default_value = "qemu-system-x86_64")]
    qemu: String,
    /// QEMU firmware for microvm.
    #[arg(long, default_value = "/usr/share/qemu/qboot.rom")]
    qemu_bios: PathBuf,
}

/// Ratio the issue sets as the target: ptiscope's median at most a quarter of QEMU's.
const TARGET_RATIO: f64 = 0.25;

pub fn run(ptiscope: &Path, args: &BootArgs) -> Result<Report, String> {
    if args.runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    let kernel = args.kernel.clone().unwrap_or_else(default_kernel);
    if !kernel.is_file() {
        return Err(format!(
            "guest ELF {} not found; build with `cargo build --release` or pass --kernel",
            kernel.display()
        ));
    }
    let mut ours = Vec::new();
    let mut lean = Vec::new();
    let mut qemu = Vec::new();
    for _ in 0..args.runs {
        let ptiscope_run = |extra: &[&str]| {
            let mut cmd = Command::new(ptiscope);
            cmd.arg("run")
                .args(extra)
                .arg("--kernel")
                .arg(&kernel)
                .arg("--mem")
                .arg(args.mem.to_string());
            measure::run(&mut cmd)
        };
        ours.push(checked(ptiscope_run(&[]), "ptiscope", 0)?);
        lean.push(checked(
            ptiscope_run(&["--no-irqchip"]),
            "ptiscope --no-irqchip",
            0,
        )?);

        let mut cmd = Command::new(&args.qemu);
        // No `-cpu host`: QEMU then sets MSR 0x10a, which kvm_pvm (software KVM) refuses.
        cmd.args(["-M", "microvm", "-accel", "kvm"])
            .arg("-bios")
            .arg(&args.qemu_bios)
            .args(["-m", &format!("{}M", args.mem)])
            .args(["-nodefaults", "-no-user-config", "-display", "none"])
            .args(["-serial", "stdio"])
            .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=4"])
            .arg("-kernel")
            .arg(&kernel);
        // isa-debug-exit turns guest status 0 into QEMU exit code 1.
        qemu.push(checked(measure::run(&mut cmd), "qemu", 1)?);
    }
    let ms = |s: &[Sample]| -> Vec<f64> { s.iter().map(|x| x.wall.as_secs_f64() * 1e3).collect() };
    let rss = |s: &[Sample]| -> Vec<f64> { s.iter().map(|x| x.max_rss_kib as f64).collect() };
    let (ours_ms, lean_ms, qemu_ms) = (median(&ms(&ours)), median(&ms(&lean)), median(&ms(&qemu)));
    let (ours_rss, lean_rss, qemu_rss) = (
        median(&rss(&ours)),
        median(&rss(&lean)),
        median(&rss(&qemu)),
    );
    let ratio = ours_ms / qemu_ms;
    let lean_ratio = lean_ms / qemu_ms;
    let verdict = |r: f64| if r <= TARGET_RATIO { "met" } else { "NOT met" };
    let text = format!(
        "boot-to-exit, {runs} interleaved runs each, {mem} MiB, guest {kernel}\n\
         {:<34} {:>10} {:>15} {:>14}\n\
         {:<34} {:>10.1} {:>15.0} {:>14.3}\n\
         {:<34} {:>10.1} {:>15.0} {:>14.3}\n\
         {:<34} {:>10.1} {:>15.0} {:>14}\n\
         target: ptiscope at most {TARGET_RATIO} of QEMU's median wall time: default {}, --no-irqchip {}\n\
         ratio of median peak RSS ptiscope/qemu: {:.3}",
        "contender",
        "median ms",
        "median RSS KiB",
        "ratio to qemu",
        "ptiscope run",
        ours_ms,
        ours_rss,
        ratio,
        "ptiscope run --no-irqchip",
        lean_ms,
        lean_rss,
        lean_ratio,
        "qemu microvm (kvm, qboot)",
        qemu_ms,
        qemu_rss,
        "1",
        verdict(ratio),
        verdict(lean_ratio),
        ours_rss / qemu_rss,
        runs = args.runs,
        mem = args.mem,
        kernel = kernel.display(),
    );
    let json = json!({
        "benchmark": "boot",
        "runs": args.runs,
        "mem_mib": args.mem,
        "ptiscope": {"wall_ms": ms(&ours), "median_wall_ms": ours_ms, "median_max_rss_kib": ours_rss},
        "ptiscope_no_irqchip": {"wall_ms": ms(&lean), "median_wall_ms": lean_ms, "median_max_rss_kib": lean_rss},
        "qemu_microvm": {"wall_ms": ms(&qemu), "median_wall_ms": qemu_ms, "median_max_rss_kib": qemu_rss},
        "ratio_wall": ratio,
        "ratio_wall_no_irqchip": lean_ratio,
        "target_ratio_wall": TARGET_RATIO,
        "target_met": ratio <= TARGET_RATIO,
        "target_met_no_irqchip": lean_ratio <= TARGET_RATIO,
    });
    Ok(Report { text, json })
}

fn checked(sample: std::io::Result<Sample>, who: &str, expected: i32) -> Result<Sample, String> {
    let sample = sample.map_err(|e| format!("cannot start {who}: {e}"))?;
    if sample.code != Some(expected) {
        return Err(format!(
            "{who} exited with {:?}, expected {expected}: the boot failed, so its time means nothing",
            sample.code
        ));
    }
    Ok(sample)
}

fn default_kernel() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/guest/x86_64-unknown-none/release/ptiscope-guest")
}
