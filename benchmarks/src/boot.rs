//! Boot-to-exit wall time of the default guest: ptiscope vs QEMU microvm.
//!
//! Both boot the same ELF (the one `vmm/build.rs` embeds into ptiscope) with
//! `workload=none`, so the guest prints its banner and writes its exit status.
//! Runs are interleaved (ptiscope, QEMU, ptiscope, ...) so that machine noise
//! hits both alike. QEMU uses qboot, not SeaBIOS: SeaBIOS is very slow under
//! software KVM (kvm_pvm) and would flatter ptiscope.
//!
//! The default `run` reads the probe's host facts from its per-boot cache
//! (the first `ptiscope` process after a host boot probes and writes it;
//! this benchmark warms it once before timing). Each ptiscope binary timed
//! here gets a cache directory of its own for the benchmark
//! (`XDG_CACHE_HOME`, removed afterwards): the cache file is keyed by the
//! binary, so another ptiscope build run on the same host meanwhile (or the
//! `--before` binary, interleaved) would otherwise replace it and make
//! some "warm" runs probe the host again (~0.5 s each). The row `host cache off`
//! (`PTISCOPE_HOST_CACHE=off`) is a run that probes everything itself, as
//! the first run after a boot does; `--before PATH` adds another ptiscope
//! binary (an earlier build) to the same interleaved runs.
//!
//! The target is read two ways: the ratio of the two medians, and each
//! round's own ratio (its two boots ran back to back, under the same load),
//! whose median gets a distribution-free 95 % interval; the target is "met
//! reliably" when that whole interval is at or under it.
use crate::measure::{self, median, median_ci95, Sample};
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
    /// Another ptiscope binary (e.g. an earlier build) to time in the same
    /// interleaved runs, reported beside the others.
    #[arg(long)]
    before: Option<PathBuf>,
}

/// Ratio the issue sets as the target: ptiscope's median at most a tenth
/// of QEMU's (issue 41; issue 17 had a fifth).
const TARGET_RATIO: f64 = 0.10;

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
    let caches = CacheDirs::new()?;
    let run_with = |binary: &Path, extra: &[&str], cache: Option<&str>| {
        let mut cmd = Command::new(binary);
        cmd.arg("run")
            .args(extra)
            .arg("--kernel")
            .arg(&kernel)
            .arg("--mem")
            .arg(args.mem.to_string())
            .env("XDG_CACHE_HOME", caches.dir(binary == ptiscope));
        if let Some(v) = cache {
            cmd.env("PTISCOPE_HOST_CACHE", v);
        }
        measure::run(&mut cmd)
    };
    // Warm the host facts caches (what every run after the first one of a
    // host boot finds), untimed.
    checked(run_with(ptiscope, &[], None), "ptiscope (warm-up)", 0)?;
    if let Some(b) = &args.before {
        checked(run_with(b, &[], None), "--before ptiscope (warm-up)", 0)?;
    }
    let mut ours = Vec::new();
    let mut lean = Vec::new();
    let mut cold = Vec::new();
    let mut before = Vec::new();
    let mut qemu = Vec::new();
    for _ in 0..args.runs {
        ours.push(checked(run_with(ptiscope, &[], None), "ptiscope", 0)?);
        lean.push(checked(
            run_with(ptiscope, &["--no-irqchip"], None),
            "ptiscope --no-irqchip",
            0,
        )?);
        cold.push(checked(
            run_with(ptiscope, &[], Some("off")),
            "ptiscope (host cache off)",
            0,
        )?);
        if let Some(b) = &args.before {
            before.push(checked(run_with(b, &[], None), "--before ptiscope", 0)?);
        }

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
    // Each round's own ratio (its ptiscope and QEMU boots ran back to back,
    // under the same load), and a distribution-free 95 % interval of their
    // median: "met reliably" when the whole interval is at the target.
    let per_round: Vec<f64> = ms(&ours)
        .iter()
        .zip(ms(&qemu))
        .map(|(o, q)| o / q)
        .collect();
    let round_median = median(&per_round);
    let round_ci = median_ci95(&per_round);
    let reliably = match round_ci {
        Some((_, hi)) if hi <= TARGET_RATIO => {
            "met reliably (the interval's top is at most the target)"
        }
        Some(_) if round_median <= TARGET_RATIO => {
            "met, not reliably (the interval reaches above the target)"
        }
        Some(_) => "NOT met",
        None => "not decided (at least 6 runs give an interval)",
    };
    let round_line = format!(
        "per-round ratio ptiscope/qemu: median {round_median:.3}, 95% CI of the median {}: {reliably}",
        round_ci.map_or("-".to_owned(), |(lo, hi)| format!("[{lo:.3}, {hi:.3}]"))
    );
    // CPU time (user + system, the child's own threads) is what a loaded
    // machine charges: with both cores busy, wall time follows it.
    let cpu = |s: &[Sample]| -> Vec<f64> { s.iter().map(|x| x.cpu.as_secs_f64() * 1e3).collect() };
    let (ours_cpu, lean_cpu, qemu_cpu) = (
        median(&cpu(&ours)),
        median(&cpu(&lean)),
        median(&cpu(&qemu)),
    );
    let (cold_ms, cold_rss, cold_cpu) =
        (median(&ms(&cold)), median(&rss(&cold)), median(&cpu(&cold)));
    let verdict = |r: f64| if r <= TARGET_RATIO { "met" } else { "NOT met" };
    let row = |name: &str, wall: f64, rss: f64, cpu: f64, ratio: String| {
        format!("{name:<34} {wall:>10.1} {cpu:>10.1} {rss:>15.0} {ratio:>14}\n")
    };
    let mut rows = String::new();
    let mut before_line = String::new();
    rows += &row(
        "ptiscope run",
        ours_ms,
        ours_rss,
        ours_cpu,
        format!("{ratio:.3}"),
    );
    rows += &row(
        "ptiscope run --no-irqchip",
        lean_ms,
        lean_rss,
        lean_cpu,
        format!("{lean_ratio:.3}"),
    );
    rows += &row(
        "ptiscope run, host cache off",
        cold_ms,
        cold_rss,
        cold_cpu,
        format!("{:.3}", cold_ms / qemu_ms),
    );
    let before_json = (!before.is_empty()).then(|| {
        let (b_ms, b_rss, b_cpu) = (
            median(&ms(&before)),
            median(&rss(&before)),
            median(&cpu(&before)),
        );
        // The earlier build's own per-round ratios, read as ptiscope's are.
        let b_rounds: Vec<f64> = ms(&before)
            .iter()
            .zip(ms(&qemu))
            .map(|(b, q)| b / q)
            .collect();
        let b_ci = median_ci95(&b_rounds);
        before_line = format!(
            "\nper-round ratio --before/qemu: median {:.3}, 95% CI of the median {}",
            median(&b_rounds),
            b_ci.map_or("-".to_owned(), |(lo, hi)| format!("[{lo:.3}, {hi:.3}]"))
        );
        rows += &row(
            "--before ptiscope run",
            b_ms,
            b_rss,
            b_cpu,
            format!("{:.3}", b_ms / qemu_ms),
        );
        json!({"wall_ms": ms(&before), "median_wall_ms": b_ms, "median_max_rss_kib": b_rss,
               "median_cpu_ms": b_cpu, "ratio_wall": b_ms / qemu_ms,
               "ratio_per_round_median": median(&b_rounds),
               "ratio_per_round_median_ci95": b_ci.map(|(lo, hi)| [lo, hi])})
    });
    rows += &row(
        "qemu microvm (kvm, qboot)",
        qemu_ms,
        qemu_rss,
        qemu_cpu,
        "1".to_owned(),
    );
    let text = format!(
        "boot-to-exit, {runs} interleaved runs each, {mem} MiB, guest {kernel}\n\
         {:<34} {:>10} {:>10} {:>15} {:>14}\n\
         {rows}\
         target: ptiscope at most {TARGET_RATIO} of QEMU's median wall time: default {}, --no-irqchip {}\n\
         {round_line}{before_line}\n\
         ratio of median CPU time (user + system) ptiscope/qemu: {:.3}\n\
         ratio of median peak RSS ptiscope/qemu: {:.3}",
        "contender",
        "median ms",
        "CPU ms",
        "median RSS KiB",
        "ratio to qemu",
        verdict(ratio),
        verdict(lean_ratio),
        ours_cpu / qemu_cpu,
        ours_rss / qemu_rss,
        runs = args.runs,
        mem = args.mem,
        kernel = kernel.display(),
    );
    let json = json!({
        "benchmark": "boot",
        "runs": args.runs,
        "mem_mib": args.mem,
        "ptiscope": {"wall_ms": ms(&ours), "median_wall_ms": ours_ms, "median_max_rss_kib": ours_rss,
                     "median_cpu_ms": ours_cpu},
        "ptiscope_no_irqchip": {"wall_ms": ms(&lean), "median_wall_ms": lean_ms, "median_max_rss_kib": lean_rss,
                                "median_cpu_ms": lean_cpu},
        "ptiscope_host_cache_off": {"wall_ms": ms(&cold), "median_wall_ms": cold_ms, "median_max_rss_kib": cold_rss,
                                    "median_cpu_ms": cold_cpu, "ratio_wall": cold_ms / qemu_ms},
        "before": before_json,
        "qemu_microvm": {"wall_ms": ms(&qemu), "median_wall_ms": qemu_ms, "median_max_rss_kib": qemu_rss,
                         "median_cpu_ms": qemu_cpu},
        "ratio_wall": ratio,
        "ratio_cpu": ours_cpu / qemu_cpu,
        "ratio_wall_no_irqchip": lean_ratio,
        "target_ratio_wall": TARGET_RATIO,
        "target_met": ratio <= TARGET_RATIO,
        "target_met_no_irqchip": lean_ratio <= TARGET_RATIO,
        "ratio_per_round": per_round,
        "ratio_per_round_median": round_median,
        "ratio_per_round_median_ci95": round_ci.map(|(lo, hi)| [lo, hi]),
        "target_met_reliably": round_ci.is_some_and(|(_, hi)| hi <= TARGET_RATIO),
    });
    Ok(Report { text, json })
}

/// The benchmark's private host-facts cache directories, one per binary
/// timed, removed when dropped.
struct CacheDirs(PathBuf);

impl CacheDirs {
    fn new() -> Result<CacheDirs, String> {
        let root = std::env::temp_dir().join(format!("ptiscope-bench-boot-{}", std::process::id()));
        for sub in ["ours", "before"] {
            std::fs::create_dir_all(root.join(sub)).map_err(|e| {
                format!(
                    "cannot create the benchmark's cache directory {}: {e}",
                    root.display()
                )
            })?;
        }
        Ok(CacheDirs(root))
    }

    /// The `XDG_CACHE_HOME` of the binary under test, or of `--before`.
    fn dir(&self, ours: bool) -> PathBuf {
        self.0.join(if ours { "ours" } else { "before" })
    }
}

impl Drop for CacheDirs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
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
