//! `ptiscope sweep`: the TLB half of PTI's cost. Runs a grid of (working
//! set, reads per iteration) cells for a baseline and compare
//! configurations, interleaved as `compare` does (every run index visits
//! every cell, the configurations' order rotating), and reports per cell the
//! time per call of each configuration, the baseline's syscall rate, the
//! overhead against the baseline, the host's evidence and the derived
//! refill cost per page (`report::sweep`).
//!
//! Size: the sweep command's grid, its interleaved runs and the outputs; the
//! report itself is report/sweep.rs.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;

use crate::cli::compare::{parse_side, rates, run_measured};
use crate::cli::exit_code::{self, ExitCode};
use crate::cli::{abi_option, parse_cpus, parse_mem, parse_timeout, Arch, Backend, CompareArgs};
use crate::machine::memory::DEFAULT_MEM_MIB;
use crate::output::{open_outputs, OutputFile};
use crate::preflight::cmdline::Workload;
use crate::preflight::{host, preflight, ResolvedRun};
use crate::report::sweep::{self as rs, Cell, CellConfig, Omitted, SweepReport};
use crate::report::RunSummary;
use ptiscope_abi::options::WssPages;
use ptiscope_abi::workingset as ws;

/// Default `--wss`.
pub const DEFAULT_WSS: &str = "0,64K,1M,4M,16M";
/// Default `--touches`: one, four and 32 passes over the working set (the
/// last lowers the syscall rate towards the 1 % and 5 % crossings).
pub const DEFAULT_TOUCHES: &str = "1x,4x,32x";
/// Default iterations per run: with the defaults below the sweep takes
/// about a minute under kvm_pvm (a round trip costs 30-90 µs there).
pub const DEFAULT_SWEEP_ITERATIONS: u64 = 1000;
/// Default runs per (cell, configuration).
pub const DEFAULT_SWEEP_RUNS: u32 = 5;

/// `ptiscope sweep`: PTI's overhead over working-set size and reads per call.
#[derive(Debug, Args)]
pub struct SweepArgs {
    /// Working sets, comma-separated sizes (K/M/G suffixes); 0 = none.
    #[arg(long, value_name = "LIST", default_value = DEFAULT_WSS)]
    pub wss: String,
    /// Reads of the working set per iteration, comma-separated: `Nx` = N
    /// passes over it, or a number of reads. More reads per call lower the
    /// syscall rate at the same footprint (Gregg's knob).
    #[arg(long, value_name = "LIST", default_value = DEFAULT_TOUCHES)]
    pub touches: String,
    /// Bytes between two reads (a multiple of 8; 64 reads every cache line).
    #[arg(long, value_name = "BYTES", default_value = "4096")]
    pub stride: String,
    /// Page size of the working set's mappings.
    #[arg(long, value_name = "SIZE", default_value = "4k", value_parser = abi_option::<WssPages>(WssPages::NAMES.iter().copied()))]
    pub wss_pages: WssPages,
    /// A configuration (compare's OPTS: `pti=on,cmdline=pti_global_text=on`),
    /// repeatable; the first is the baseline. Default: pti=off (baseline),
    /// pti=on, pti=on with pti_global_text=on, and pti=on with pcid=on where
    /// this host has PCID.
    #[arg(long = "config", value_name = "OPTS")]
    pub configs: Vec<String>,
    /// Runs per cell and configuration.
    #[arg(long, value_name = "R", default_value_t = DEFAULT_SWEEP_RUNS, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub runs: u32,
    /// Syscall-loop workload (getpid, getppid, write-badfd, nopti-getpid),
    /// or poundsyscall: its threads each read the working set before each
    /// getppid.
    #[arg(long, value_name = "NAME", default_value = "getpid", value_parser = abi_option::<Workload>(Workload::NAMES.iter().copied()))]
    pub workload: Workload,
    /// vCPUs of every run (1..=8). With `--workload poundsyscall` one thread
    /// per vCPU unless a configuration says `cmdline=threads=N`.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = parse_cpus)]
    pub cpus: u32,
    /// Iterations (system calls) per run.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SWEEP_ITERATIONS)]
    pub iterations: u64,
    /// Boot this PVH kernel instead of the embedded guest.
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,
    /// Guest memory in MiB (16..=1024); must hold the largest working set.
    #[arg(long, value_name = "MiB", default_value_t = DEFAULT_MEM_MIB, value_parser = parse_mem)]
    pub mem: u64,
    /// Stop a run after this many seconds.
    #[arg(long, value_name = "SECS", default_value = "60", value_parser = parse_timeout)]
    pub timeout: Duration,
    /// Write the sweep as JSON (schema ptiscope.sweep/1).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the sweep as CSV (one line per cell and configuration).
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Write the sweep as SVG: overhead against syscall rate (log x), one
    /// curve per working set and configuration, and a heat map.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Which embedded guest (default x86_64; with `--kernel` the image
    /// decides; with `--linux` it must match the image).
    #[arg(long, value_enum, conflicts_with = "kernel")]
    pub arch: Option<Arch>,
    /// A Linux kernel as the guest (`--backend qemu`).
    #[command(flatten)]
    pub linux: crate::cli::LinuxArgs,
    /// Our VMM on KVM, or QEMU TCG (guest-reported cycles per call only).
    #[arg(long, value_enum, default_value = "kvm")]
    pub backend: Backend,
    /// An extra argument for QEMU (`--backend qemu`), repeatable.
    #[arg(long, value_name = "ARG", allow_hyphen_values = true)]
    pub qemu_arg: Vec<String>,
}

/// A reads-per-iteration spec: passes over the working set, or reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TouchSpec {
    /// `Nx`: N passes over the working set.
    Passes(u64),
    /// A plain number of reads.
    Reads(u64),
}

impl TouchSpec {
    fn parse(s: &str) -> Result<TouchSpec, String> {
        let bad = || format!("--touches: {s:?} is not `Nx` (N passes) or a number of reads");
        if let Some(n) = s.strip_suffix(['x', 'X']) {
            let n: u64 = n.parse().map_err(|_| bad())?;
            if n == 0 {
                return Err(format!("--touches: {s:?}: at least one pass (1x)"));
            }
            return Ok(TouchSpec::Passes(n));
        }
        s.parse().map(TouchSpec::Reads).map_err(|_| bad())
    }

    fn label(self) -> String {
        match self {
            TouchSpec::Passes(n) => format!("{n}x"),
            TouchSpec::Reads(n) => n.to_string(),
        }
    }

    /// Reads per iteration for a working set of `slots` slots.
    fn reads(self, slots: u64) -> u64 {
        match self {
            TouchSpec::Passes(n) => n.saturating_mul(slots),
            TouchSpec::Reads(n) => n,
        }
    }
}

/// One cell of the grid, before it runs.
#[derive(Debug, Clone)]
struct CellPlan {
    wss: u64,
    spec: String,
    touches: u64,
    pages: u64,
    words: String,
}

/// Pages of `page` bytes a window of `reads` consecutive slots spans at
/// most, capped by the whole buffer.
fn pages_touched(wss: u64, stride: u64, reads: u64, page: u64) -> u64 {
    let total = wss.div_ceil(page);
    let slots = ws::slots(wss, stride);
    if reads >= slots {
        return total;
    }
    let span = if stride >= page {
        reads
    } else {
        (reads * stride).div_ceil(page)
    };
    span.min(total)
}

fn plan(args: &SweepArgs) -> Result<(Vec<CellPlan>, u64), String> {
    let stride = ws::parse_size(&args.stride)
        .filter(|s| *s >= ws::MIN_STRIDE && s.is_multiple_of(ws::MIN_STRIDE) && *s <= ws::MAX_WSS)
        .ok_or_else(|| {
            format!(
                "--stride {:?}: a multiple of {} bytes from {} to {}M",
                args.stride,
                ws::MIN_STRIDE,
                ws::MIN_STRIDE,
                ws::MAX_WSS >> 20
            )
        })?;
    let mut sizes = Vec::new();
    for w in args.wss.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        let b = ws::parse_size(w)
            .filter(|b| *b <= ws::MAX_WSS)
            .ok_or_else(|| format!("--wss: {w:?} is not a size up to {}M", ws::MAX_WSS >> 20))?;
        if !sizes.contains(&b) {
            sizes.push(b);
        }
    }
    if sizes.is_empty() {
        return Err("--wss: no working set given".into());
    }
    sizes.sort_unstable();
    let specs: Vec<TouchSpec> = args
        .touches
        .split(',')
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .map(TouchSpec::parse)
        .collect::<Result<_, _>>()?;
    if specs.is_empty() {
        return Err("--touches: no value given".into());
    }
    let page = args.wss_pages.bytes();
    let mut cells = Vec::new();
    for &wss in &sizes {
        if wss == 0 {
            cells.push(CellPlan {
                wss,
                spec: "-".into(),
                touches: 0,
                pages: 0,
                words: String::new(),
            });
            continue;
        }
        for spec in &specs {
            let reads = spec.reads(ws::slots(wss, stride));
            if reads > ws::MAX_TOUCHES {
                return Err(format!(
                    "--touches {}: {reads} reads per iteration at wss={} (at most {})",
                    spec.label(),
                    rs::fmt_size(wss),
                    ws::MAX_TOUCHES
                ));
            }
            cells.push(CellPlan {
                wss,
                spec: spec.label(),
                touches: reads,
                pages: pages_touched(wss, stride, reads, page),
                words: format!(
                    "wss={wss} stride={stride} touches={reads} wss_pages={}",
                    args.wss_pages
                ),
            });
        }
    }
    Ok((cells, stride))
}

/// The default configurations, and those left out with the reason.
fn default_configs(args: &SweepArgs) -> (Vec<String>, Vec<Omitted>) {
    let mut configs = vec![
        "pti=off".to_string(),
        "pti=on".to_string(),
        "pti=on,cmdline=pti_global_text=on".to_string(),
    ];
    let mut omitted = Vec::new();
    let pcid = "pti=on,pcid=on".to_string();
    if args.linux.linux.is_some() {
        // pti_global_text and pcid are options of ptiscope's own guest.
        return (
            vec!["pti=off".to_string(), "pti=on".to_string()],
            vec![Omitted {
                config: "pti=on,cmdline=pti_global_text=on".into(),
                reason: "an option of ptiscope's own guest, not of Linux".into(),
            }],
        );
    }
    let elf32 = args.kernel.is_none() && args.arch == Some(Arch::I386);
    if elf32 {
        omitted.push(Omitted {
            config: pcid,
            reason: "PAE paging has no PCID".into(),
        });
    } else {
        match args.backend {
            Backend::Qemu => omitted.push(Omitted {
                config: pcid,
                reason:
                    "not probed under QEMU (TCG before QEMU 8 has no PCID); add it with --config"
                        .into(),
            }),
            Backend::Kvm => match host::pcid_usable() {
                Some((true, _)) => configs.push(pcid),
                Some((false, detail)) => omitted.push(Omitted {
                    config: pcid,
                    reason: format!("this host's vCPU has no usable PCID (probe: {detail})"),
                }),
                None => omitted.push(Omitted {
                    config: pcid,
                    reason: "the PCID probe could not run".into(),
                }),
            },
        }
    }
    (configs, omitted)
}

fn progress(total: u64, quiet: bool) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(total),
        indicatif::ProgressDrawTarget::hidden(),
    );
    if !quiet && std::io::stderr().is_terminal() {
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} runs {msg}",
        ) {
            bar.set_style(style);
        }
        bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    }
    bar
}

/// The `CompareArgs` that `parse_side` reads the common options from.
fn compare_args(args: &SweepArgs) -> CompareArgs {
    CompareArgs {
        baseline: String::new(),
        compare: String::new(),
        runs: crate::cli::Runs::Fixed(args.runs),
        max_runs: None,
        target_ci: None,
        warmup: 0,
        against: None,
        cpus: args.cpus,
        workload: args.workload,
        iterations: args.iterations,
        kernel: args.kernel.clone(),
        mem: args.mem,
        timeout: args.timeout,
        json: None,
        csv: None,
        svg: None,
        fail_if: Vec::new(),
        quiet: args.quiet,
        arch: args.arch,
        linux: args.linux.clone(),
        backend: args.backend,
        qemu_arg: args.qemu_arg.clone(),
    }
}

fn write_file(f: &OutputFile, text: &str) -> i32 {
    match f.write_document(text) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ptiscope sweep: {e}");
            exit_code::CANT_CREATE
        }
    }
}

/// The median of a rate over runs, if every run has it.
fn median_rate(runs: &[RunSummary], name: &str) -> Option<f64> {
    let v: Option<Vec<f64>> = runs
        .iter()
        .map(|r| {
            rates(r)
                .into_iter()
                .find(|(m, _)| m.name == name)
                .map(|(_, v)| v)
        })
        .collect();
    v.filter(|v| !v.is_empty()).map(|v| rs::median(&v))
}

/// Runs the sweep and prints it; returns the process exit code.
pub fn run(args: &SweepArgs) -> i32 {
    if args.backend == Backend::Kvm && !args.qemu_arg.is_empty() {
        eprintln!("ptiscope sweep: --qemu-arg needs --backend qemu");
        return exit_code::USAGE;
    }
    if !args.workload.takes_working_set() {
        eprintln!(
            "ptiscope sweep: --workload {}: the sweep needs a syscall-loop workload (getpid, getppid, write-badfd, nopti-getpid or poundsyscall)",
            args.workload
        );
        return exit_code::USAGE;
    }
    let (cells, stride) = match plan(args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("ptiscope sweep: {e}");
            return exit_code::USAGE;
        }
    };
    let (labels, omitted) = if args.configs.is_empty() {
        default_configs(args)
    } else {
        (args.configs.clone(), Vec::new())
    };
    if labels.len() < 2 {
        eprintln!("ptiscope sweep: give at least two --config (the first is the baseline)");
        return exit_code::USAGE;
    }
    // The output files are opened before the first boot (as compare does):
    // a bad path must not cost a whole sweep.
    let outputs = [
        ("--json", args.json.as_deref()),
        ("--csv", args.csv.as_deref()),
        ("--svg", args.svg.as_deref()),
    ];
    let [json_file, csv_file, svg_file] = match open_outputs(outputs, args.timeout) {
        Ok(files) => files,
        Err(e) => {
            eprintln!("ptiscope sweep: {e}");
            return e.exit_code();
        }
    };
    let common = compare_args(args);
    let embedded = args.arch.unwrap_or(Arch::X86_64).embedded_image();
    // Settle every (cell, configuration) once: image read, entry resolved,
    // host limits checked; every run then boots its resolved run.
    let mut resolved: Vec<Vec<ResolvedRun>> = Vec::new();
    for cell in &cells {
        let mut row = Vec::new();
        for label in &labels {
            let mut spec = match parse_side(label, &common, embedded) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("ptiscope sweep: --config {e}");
                    return exit_code::USAGE;
                }
            };
            let extra = &mut spec.config.guest.extra;
            if !cell.words.is_empty() {
                *extra = format!("{} {}", extra.trim(), cell.words)
                    .trim()
                    .to_string();
            }
            if args.workload == Workload::Poundsyscall && !extra.contains("threads=") {
                *extra = format!("{} threads={}", extra.trim(), args.cpus)
                    .trim()
                    .to_string();
            }
            match preflight(&spec.config, args.backend.target()) {
                Ok(r) => row.push(r),
                Err(e) => {
                    eprintln!(
                        "ptiscope sweep: {label} at wss={}: {e}",
                        rs::fmt_size(cell.wss)
                    );
                    return e.exit_code();
                }
            }
        }
        resolved.push(row);
    }

    let (time_metric, time_unit, time_source) = match args.backend {
        Backend::Kvm => ("ns_per_call", "ns", "host-clock"),
        Backend::Qemu => ("cycles_per_call", "cycles", "guest"),
    };
    println!("ptiscope sweep: PTI's overhead over working set x syscall rate");
    println!("  host:      {}", host::describe_host());
    match args.backend {
        Backend::Kvm => println!("  KVM:       {}", host::kvm_flavour().describe()),
        Backend::Qemu => println!(
            "  backend:   QEMU TCG: software emulation, guest-reported cycles per call only"
        ),
    }
    println!(
        "  workload:  {} x {} iterations per run, {} runs per cell and configuration, interleaved; stride {stride}, {} pages",
        args.workload, args.iterations, args.runs, args.wss_pages
    );
    if args.workload == Workload::Poundsyscall {
        println!(
            "             {} vCPUs; each thread calls getppid {} times and reads the shared working set before each call; per call = per getppid of all threads (wall clock)",
            args.cpus, args.iterations
        );
    } else if args.cpus > 1 {
        println!("             {} vCPUs (the loop runs on vCPU 0)", args.cpus);
    }
    println!("  baseline:  {}", labels[0]);
    for l in &labels[1..] {
        println!("  compare:   {l}");
    }
    for o in &omitted {
        println!("  left out:  {} ({})", o.config, o.reason);
    }
    println!();

    let n = labels.len();
    let total = cells.len() as u64 * n as u64 * u64::from(args.runs);
    let bar = progress(total, args.quiet);
    let started = Instant::now();
    let mut runs: Vec<Vec<Vec<RunSummary>>> = vec![vec![Vec::new(); n]; cells.len()];
    for r in 0..args.runs as usize {
        for (ci, cell) in cells.iter().enumerate() {
            for k in 0..n {
                let side = (k + r + ci) % n;
                bar.set_message(format!("wss={} {}", rs::fmt_size(cell.wss), labels[side]));
                match run_measured(&resolved[ci][side], args.backend) {
                    Ok((_, s)) => runs[ci][side].push(s),
                    Err((code, msg)) => {
                        bar.finish_and_clear();
                        eprintln!(
                            "ptiscope sweep: {} at wss={} touches={} run {} failed: {msg}",
                            labels[side],
                            rs::fmt_size(cell.wss),
                            cell.spec,
                            r + 1
                        );
                        return if code == 0 { 1 } else { code };
                    }
                }
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();

    let mut report = SweepReport {
        schema: rs::SCHEMA.into(),
        host: host::describe_host(),
        backend: format!("{:?}", args.backend).to_lowercase(),
        workload: args.workload.to_string(),
        iterations: args.iterations,
        cpus: args.cpus,
        runs: args.runs,
        stride,
        wss_pages: args.wss_pages.to_string(),
        time_metric: time_metric.into(),
        time_unit: time_unit.into(),
        time_source: time_source.into(),
        configs: labels.clone(),
        omitted,
        cells: Vec::new(),
        crossings: Vec::new(),
        seconds: started.elapsed().as_secs_f64(),
        environment: Some(crate::report::environment::Environment::collect(
            &format!("{:?}", args.backend).to_lowercase(),
            crate::cli::compare::guest_image(&match (&args.kernel, &args.linux.linux) {
                (Some(p), _) => crate::machine::loader::KernelSource::Path(p.clone()),
                (None, Some(k)) => crate::machine::loader::KernelSource::Path(
                    crate::linux::kernel_path(k).unwrap_or_else(|_| k.into()),
                ),
                (None, None) => crate::machine::loader::KernelSource::Embedded(
                    args.arch.unwrap_or(Arch::X86_64).embedded_image(),
                ),
            }),
            [("configs".to_owned(), labels.clone())].into(),
        )),
    };
    for (ci, cell) in cells.iter().enumerate() {
        let mut configs = Vec::new();
        for (k, label) in labels.iter().enumerate() {
            let rr = &runs[ci][k];
            let samples: Vec<f64> = rr
                .iter()
                .filter_map(|s| {
                    rates(s)
                        .into_iter()
                        .find(|(m, _)| m.name == time_metric)
                        .map(|(_, v)| v)
                })
                .collect();
            if samples.len() != rr.len() {
                eprintln!(
                    "ptiscope sweep: {label} at wss={}: some runs have no {time_metric}",
                    rs::fmt_size(cell.wss)
                );
                return exit_code::VM_ERROR;
            }
            configs.push(CellConfig {
                config: label.clone(),
                median: rs::median(&samples),
                min: samples.iter().copied().fold(f64::INFINITY, f64::min),
                samples,
                delta: None,
                overhead_pct: None,
                refill_per_page: None,
                tlb_flush_per_call: median_rate(rr, "tlb_flush_per_call"),
                kvm_pf_taken_per_call: median_rate(rr, "kvm_pf_taken_per_call"),
                kvm_exits_per_call: median_rate(rr, "kvm_exits_per_call"),
                cr3_writes_per_call: median_rate(rr, "cr3_writes_per_call"),
                read_cycles_per_call: median_rate(rr, "read_cycles_per_call"),
                read_cycles_min: median_rate(rr, "read_cycles_min_per_call"),
                user_refill_cycles_per_page: None,
                significant: None,
                mean_ci95: None,
                welch_p: None,
            });
        }
        report.cells.push(Cell {
            wss: cell.wss,
            touches_spec: cell.spec.clone(),
            touches: cell.touches,
            pages: cell.pages,
            guest_words: cell.words.clone(),
            syscall_rate: None,
            configs,
        });
    }
    report.derive();
    print!("{}", rs::text(&report));
    println!("\n({:.0} s)", report.seconds);
    let mut code = 0;
    if let Some(f) = &json_file {
        code = code.max(write_file(f, &rs::json(&report)));
    }
    if let Some(f) = &csv_file {
        code = code.max(write_file(f, &rs::csv(&report)));
    }
    if let Some(f) = &svg_file {
        code = code.max(write_file(f, &crate::report::sweep_svg::svg(&report)));
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touch_specs() {
        assert_eq!(TouchSpec::parse("1x"), Ok(TouchSpec::Passes(1)));
        assert_eq!(TouchSpec::parse("300"), Ok(TouchSpec::Reads(300)));
        assert!(TouchSpec::parse("0x").is_err());
        assert!(TouchSpec::parse("x").is_err());
        assert!(TouchSpec::parse("-1").is_err());
        assert_eq!(TouchSpec::Passes(4).reads(256), 1024);
    }

    #[test]
    fn pages() {
        // 1 MiB, one read per 4 KiB page: all 256 pages.
        assert_eq!(pages_touched(1 << 20, 4096, 256, 4096), 256);
        assert_eq!(pages_touched(1 << 20, 4096, 1024, 4096), 256);
        assert_eq!(pages_touched(1 << 20, 4096, 10, 4096), 10);
        // Cache-line stride: 64 reads per page.
        assert_eq!(pages_touched(1 << 20, 64, 128, 4096), 2);
        // 2 MiB pages: 4 MiB is two TLB entries.
        assert_eq!(pages_touched(4 << 20, 4096, 1024, 2 << 20), 2);
    }
}
