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
use crate::cli::partial::{csv_with_banner, svg_with_banner};
use crate::cli::{abi_option, Arch, Backend, ExperimentOpts, TargetOpts};
use crate::machine::signals;
use crate::output::{open_outputs, OutputFile};
use crate::preflight::cmdline::Workload;
use crate::preflight::{host, preflight_with_image, PreflightError, ResolvedRun};
use crate::report::sweep::{self as rs, Cell, CellConfig, Omitted, SweepReport};
use crate::report::RunSummary;
use ptiscope_abi::options::WssPages;
use ptiscope_abi::workingset as ws;

/// Default `--wss`.
pub const DEFAULT_WSS: &str = "0,64K,1M,16M";
/// Default `--touches`: 4 Ki, 64 Ki and 2 Mi reads per call, the same for
/// every working set (Gregg's knob: the user work between two calls), so
/// that the syscall rate spans more than two decades (on kvm_pvm: about
/// 9k/s at wss=0 down to about 30/s at 16M x 2M reads).
pub const DEFAULT_TOUCHES: &str = "4K,64K,2M";
/// Default iterations per run (of a cell reading at most
/// [`FULL_ITERATIONS_READS`] per call): with the defaults the sweep takes
/// about a minute under kvm_pvm (a round trip costs 30-120 µs there).
pub const DEFAULT_SWEEP_ITERATIONS: u64 = 1000;
/// [`DEFAULT_SWEEP_ITERATIONS`] as `--iterations`' default text.
const DEFAULT_SWEEP_ITERATIONS_STR: &str = "1000";
/// A cell whose calls read more than this many times runs
/// `iterations x FULL_ITERATIONS_READS / reads` calls (at least
/// [`MIN_CELL_ITERATIONS`]): its calls are slow, and a run of a thousand
/// of them would take minutes; per call the figures are the same.
pub const FULL_ITERATIONS_READS: u64 = 4096;
/// The fewest calls per run a slow cell is given (unless `--iterations` is lower).
pub const MIN_CELL_ITERATIONS: u64 = 20;

/// Calls per run of a cell reading `reads` times per call.
pub fn cell_iterations(iterations: u64, reads: u64) -> u64 {
    if reads <= FULL_ITERATIONS_READS {
        return iterations;
    }
    let scaled =
        (u128::from(iterations) * u128::from(FULL_ITERATIONS_READS) / u128::from(reads)) as u64;
    scaled.max(MIN_CELL_ITERATIONS).min(iterations)
}
/// Default runs per (cell, configuration).
pub const DEFAULT_SWEEP_RUNS: u32 = 5;

/// Most cells (working set x reads per iteration) one sweep runs: a grid
/// that size is already hours of runs; a larger one is refused before any
/// work (docs/running.md).
pub const MAX_SWEEP_CELLS: usize = 1024;
/// Most runs one sweep plans (cells x configurations x `--runs`).
pub const MAX_SWEEP_RUNS: u64 = 100_000;

/// `ptiscope sweep`: PTI's overhead over working-set size and reads per call.
#[derive(Debug, Args)]
// The shared options with this command's help, defaults and parsing (and
// `--cpus` listed before `--iterations`, as it always was).
#[command(
    mut_arg("workload", |a| a.help("Syscall-loop workload (getpid, getppid, write-badfd, nopti-getpid), \
        or poundsyscall: its threads each read the working set before each getppid")),
    mut_arg("cpus", |a| a.display_order(7).help("vCPUs of every run (1..=8). With `--workload poundsyscall` \
        one thread per vCPU unless a configuration says `cmdline=threads=N`")),
    mut_arg("iterations", |a| a
        .display_order(8)
        .help("Iterations (system calls) per run")
        .default_value(DEFAULT_SWEEP_ITERATIONS_STR)
        .allow_negative_numbers(false)),
    mut_arg("kernel", |a| a.help("Boot this PVH kernel instead of the embedded guest")),
    mut_arg("mem", |a| a
        .help("Guest memory in MiB (16..=1024); must hold the largest working set")
        .allow_negative_numbers(false)),
    mut_arg("timeout", |a| a.allow_negative_numbers(false)),
    mut_arg("arch", |a| a.help("Which embedded guest (default x86_64; with `--kernel` the image \
        decides; with `--linux` it must match the image)")),
    mut_arg("backend", |a| a.help("Our VMM on KVM, or QEMU TCG (guest-reported cycles per call; \
        the plugin's counts)")),
    mut_arg("qemu_arg", |a| a.help("An extra argument for QEMU (`--backend qemu`), repeatable")),
    mut_arg("no_plugin", |a| a.help("`--backend qemu`: do not load ptiscope's TCG plugin")),
)]
pub struct SweepArgs {
    /// Working sets, comma-separated sizes (K/M/G suffixes); 0 = none.
    #[arg(long, value_name = "LIST", default_value = DEFAULT_WSS)]
    pub wss: String,
    /// Reads of the working set per iteration, comma-separated: `Nx` = N
    /// passes over it, or a number of reads (K/M suffixes: 4K = 4096). More
    /// reads per call lower the syscall rate at the same footprint (Gregg's
    /// knob). Cells reading more than 4K times per call run fewer calls.
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
    /// What every run runs (`compare`'s options, this command's help).
    #[command(flatten)]
    pub exp: ExperimentOpts,
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
    /// Where the runs run (`compare`'s options, this command's help).
    #[command(flatten)]
    pub target: TargetOpts,
}

/// A reads-per-iteration spec: passes over the working set, or reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
        ws::parse_size(s)
            .filter(|n| *n > 0 || s == "0")
            .map(TouchSpec::Reads)
            .ok_or_else(bad)
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
    iterations: u64,
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
        sizes.push(b);
    }
    if sizes.is_empty() {
        return Err("--wss: no working set given".into());
    }
    sizes.sort_unstable();
    sizes.dedup();
    // Repeated specs are run once, as repeated sizes are (`1x,1x` is `1x`).
    let mut seen = std::collections::HashSet::new();
    let mut specs: Vec<TouchSpec> = Vec::new();
    for w in args
        .touches
        .split(',')
        .map(str::trim)
        .filter(|w| !w.is_empty())
    {
        let spec = TouchSpec::parse(w)?;
        if seen.insert(spec) {
            specs.push(spec);
        }
    }
    if specs.is_empty() {
        return Err("--touches: no value given".into());
    }
    let nonzero = sizes.iter().filter(|&&w| w > 0).count();
    let count = (sizes.len() - nonzero).saturating_add(nonzero.saturating_mul(specs.len()));
    if count > MAX_SWEEP_CELLS {
        return Err(format!(
            "--wss x --touches: {count} cells ({} working sets x {} reads per iteration); \
             a sweep runs at most {MAX_SWEEP_CELLS} cells (the sweep cell limit): split the grid \
             into several sweeps",
            sizes.len(),
            specs.len()
        ));
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
                iterations: args.exp.iterations,
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
                iterations: cell_iterations(args.exp.iterations, reads),
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
    if args.target.linux.linux.is_some() {
        // pti_global_text and pcid are options of ptiscope's own guest.
        return (
            vec!["pti=off".to_string(), "pti=on".to_string()],
            vec![Omitted {
                config: "pti=on,cmdline=pti_global_text=on".into(),
                reason: "an option of ptiscope's own guest, not of Linux".into(),
            }],
        );
    }
    let elf32 = args.exp.kernel.is_none() && args.target.arch == Some(Arch::I386);
    if elf32 {
        omitted.push(Omitted {
            config: pcid,
            reason: "PAE paging has no PCID".into(),
        });
    } else {
        match args.target.backend {
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

fn write_file(f: &OutputFile, text: &str) -> i32 {
    match f.write_document(text) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ptiscope sweep: {e}");
            exit_code::CANT_CREATE
        }
    }
}

/// Runs the sweep and prints it; returns the process exit code.
pub fn run(args: &SweepArgs) -> i32 {
    if args.target.backend == Backend::Kvm && !args.target.qemu_arg.is_empty() {
        eprintln!("ptiscope sweep: --qemu-arg needs --backend qemu");
        return exit_code::USAGE;
    }
    if !args.exp.workload.takes_working_set() {
        eprintln!(
            "ptiscope sweep: --workload {}: the sweep needs a syscall-loop workload (getpid, getppid, write-badfd, nopti-getpid or poundsyscall)",
            args.exp.workload
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
    if labels.iter().any(|l| l.trim().is_empty()) {
        eprintln!(
            "ptiscope sweep: --config '': an empty configuration has no label and means every \
             default (pti=auto); give its options, e.g. --config pti=off"
        );
        return exit_code::USAGE;
    }
    let planned = (cells.len() as u64)
        .saturating_mul(labels.len() as u64)
        .saturating_mul(u64::from(args.runs));
    if planned > MAX_SWEEP_RUNS {
        eprintln!(
            "ptiscope sweep: {} cells x {} configurations x {} runs = {planned} runs; a sweep \
             plans at most {MAX_SWEEP_RUNS} (the sweep run limit): fewer cells, configurations or --runs",
            cells.len(),
            labels.len(),
            args.runs
        );
        return exit_code::USAGE;
    }
    // The output files are opened before the first boot (as compare does):
    // a bad path must not cost a whole sweep.
    let outputs = [
        ("--json", args.json.as_deref()),
        ("--csv", args.csv.as_deref()),
        ("--svg", args.svg.as_deref()),
    ];
    let [json_file, csv_file, svg_file] = match open_outputs(outputs, args.exp.timeout) {
        Ok(files) => files,
        Err(e) => {
            eprintln!("ptiscope sweep: {e}");
            return e.exit_code();
        }
    };
    let embedded = args.target.arch.unwrap_or(Arch::X86_64).embedded_image();
    let mut sides = Vec::new();
    for label in &labels {
        match parse_side(label, &args.exp, &args.target, embedded) {
            Ok(s) => sides.push(s),
            Err(e) => {
                eprintln!("ptiscope sweep: --config {e}");
                return exit_code::USAGE;
            }
        }
    }
    let mut prep = Preparer {
        sides,
        image: None,
        workload: args.exp.workload,
        cpus: args.exp.cpus,
        iterations: args.exp.iterations,
        target: args.target.backend.target(),
    };
    // Settle every (cell, configuration) before the first boot, so that a
    // bad cell does not cost the runs before it; nothing is kept (each run
    // is settled again when it runs, sharing its configuration's image), so
    // memory does not grow with the grid. A signal stops this at once.
    for cell in &cells {
        for (k, label) in labels.iter().enumerate() {
            if let Some(signal) = signals::wait_termination(Duration::ZERO) {
                eprintln!(
                    "ptiscope sweep: {} while checking the grid; nothing ran",
                    signals::describe(signal)
                );
                return 128 + signal;
            }
            if let Err(e) = prep.prepare(k, cell) {
                eprintln!(
                    "ptiscope sweep: {label} at wss={}: {e}",
                    rs::fmt_size(cell.wss)
                );
                return e.exit_code();
            }
        }
    }

    let (time_metric, time_unit, time_source) = match args.target.backend {
        Backend::Kvm => ("ns_per_call", "ns", "host-clock"),
        Backend::Qemu => ("cycles_per_call", "cycles", "guest"),
    };
    println!("ptiscope sweep: PTI's overhead over working set x syscall rate");
    println!("  host:      {}", host::describe_host());
    match args.target.backend {
        Backend::Kvm => println!("  KVM:       {}", host::kvm_flavour().describe()),
        Backend::Qemu => println!(
            "  backend:   QEMU TCG: software emulation, guest-reported cycles per call{}",
            if args.target.no_plugin {
                " (--no-plugin)"
            } else {
                "; kernel instructions and MOV CR3 host-observed by ptiscope's TCG plugin"
            }
        ),
    }
    let fewest = cells.iter().map(|c| c.iterations).min().unwrap_or(0);
    let fewer = if fewest < args.exp.iterations {
        format!(" (down to {fewest} where a call reads more than {FULL_ITERATIONS_READS} times: column calls/run)")
    } else {
        String::new()
    };
    // Probed before the timed runs (a few hundred ms), cached for the
    // environment block.
    let cr3_write_refill = refill_visibility(args.target.backend);
    println!("  refill:    {}", describe_refill(&cr3_write_refill));
    println!(
        "  workload:  {} x {} iterations per run{fewer}, {} runs per cell and configuration, interleaved; stride {stride}, {} pages",
        args.exp.workload, args.exp.iterations, args.runs, args.wss_pages
    );
    if args.exp.workload == Workload::Poundsyscall {
        println!(
            "             {} vCPUs; each thread calls getppid {} times and reads the shared working set before each call; per call = per getppid of all threads (wall clock)",
            args.exp.cpus, args.exp.iterations
        );
    } else if args.exp.cpus > 1 {
        println!(
            "             {} vCPUs (the loop runs on vCPU 0)",
            args.exp.cpus
        );
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
    // Per (cell, configuration), the few figures the report takes from each
    // run (not the run's whole summary).
    let mut runs: Vec<Vec<Vec<RunFigures>>> = vec![vec![Vec::new(); n]; cells.len()];
    let mut stopped: Option<(i32, String)> = None;
    let mut done = 0u64;
    'runs: for r in 0..args.runs as usize {
        for (ci, cell) in cells.iter().enumerate() {
            for k in 0..n {
                let side = (k + r + ci) % n;
                let at = format!(
                    "{} at wss={} touches={} run {}",
                    labels[side],
                    rs::fmt_size(cell.wss),
                    cell.spec,
                    r + 1
                );
                if let Some(signal) = signals::wait_termination(Duration::ZERO) {
                    stopped = Some((
                        128 + signal,
                        format!("{} before {at}", signals::describe(signal)),
                    ));
                    break 'runs;
                }
                bar.set_message(format!("wss={} {}", rs::fmt_size(cell.wss), labels[side]));
                let result = prep
                    .prepare(side, cell)
                    .map_err(|e| (e.exit_code(), e.to_string()))
                    .and_then(|resolved| {
                        run_measured(&resolved, args.target.backend)
                            .map_err(|e| (e.exit_code(), e.to_string()))
                    });
                match result {
                    Ok((_, s)) => runs[ci][side].push(RunFigures::of(&s, time_metric)),
                    Err((code, msg)) => {
                        let why = match code - 128 {
                            sig if signals::TERMINATION_SIGNALS.contains(&sig) => {
                                format!("{} during {at}", signals::describe(sig))
                            }
                            _ => format!("{at} failed: {msg}"),
                        };
                        stopped = Some((exit_code::failed_run(code), why));
                        break 'runs;
                    }
                }
                done += 1;
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    if let Some((_, why)) = &stopped {
        eprintln!("ptiscope sweep: {why}");
    }
    // The banner and the outputs take the reason's first line (a failed
    // run's message goes on with its console tail, printed above).
    let stopped = stopped.map(|(c, why)| (c, why.lines().next().unwrap_or_default().to_string()));

    let mut report = SweepReport {
        schema: rs::SCHEMA.into(),
        host: host::describe_host(),
        backend: format!("{:?}", args.target.backend).to_lowercase(),
        workload: args.exp.workload.to_string(),
        iterations: args.exp.iterations,
        cpus: args.exp.cpus,
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
        cr3_write_refill,
        seconds: started.elapsed().as_secs_f64(),
        environment: Some(crate::report::environment::Environment::collect(
            &format!("{:?}", args.target.backend).to_lowercase(),
            crate::cli::compare::guest_image_of(
                &match (&args.exp.kernel, &args.target.linux.linux) {
                    (Some(p), _) => crate::machine::loader::KernelSource::Path(p.clone()),
                    (None, Some(k)) => crate::machine::loader::KernelSource::Path(
                        crate::linux::kernel_path(k).unwrap_or_else(|_| k.into()),
                    ),
                    (None, None) => crate::machine::loader::KernelSource::Embedded(
                        args.target.arch.unwrap_or(Arch::X86_64).embedded_image(),
                    ),
                },
                prep.image.as_deref(),
            ),
            [("configs".to_owned(), labels.clone())].into(),
        )),
    };
    for (ci, cell) in cells.iter().enumerate() {
        // A stopped sweep reports the cells every configuration has run in.
        if runs[ci].iter().any(Vec::is_empty) {
            continue;
        }
        let mut configs = Vec::new();
        for (k, label) in labels.iter().enumerate() {
            let rr = &runs[ci][k];
            let samples: Vec<f64> = rr.iter().filter_map(|f| f.time).collect();
            if samples.len() != rr.len() {
                eprintln!(
                    "ptiscope sweep: {label} at wss={}: some runs have no {time_metric}",
                    rs::fmt_size(cell.wss)
                );
                return exit_code::VM_ERROR;
            }
            let rate = |i: usize| median_rate(rr, i);
            configs.push(CellConfig {
                config: label.clone(),
                median: rs::median(&samples),
                min: samples.iter().copied().fold(f64::INFINITY, f64::min),
                samples,
                delta: None,
                overhead_pct: None,
                refill_per_page: None,
                refill_spread_per_page: None,
                tlb_flush_per_call: rate(0),
                kvm_pf_taken_per_call: rate(1),
                kvm_exits_per_call: rate(2),
                cr3_writes_per_call: rate(3),
                kernel_instructions_per_call: rate(6),
                insn_mov_cr3_per_call: rate(7),
                read_cycles_per_call: rate(4),
                read_cycles_min: rate(5),
                read_cycles_min_spread: half_range(rr, 5),
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
            iterations: cell.iterations,
            syscall_rate: None,
            configs,
        });
    }
    report.derive();
    let partial = stopped.as_ref().map(|(_, why)| Partial {
        reason: why.clone(),
        runs_done: done,
        runs_planned: total,
        cells_reported: report.cells.len(),
        cells_planned: cells.len(),
    });
    if let Some(p) = &partial {
        println!("{}", p.banner());
    }
    print!("{}", rs::text(&report));
    println!("\n({:.0} s)", report.seconds);
    let mut code = stopped.as_ref().map_or(0, |(c, _)| *c);
    let mut write = |f: &Option<OutputFile>, text: String| {
        if let Some(f) = f {
            let c = write_file(f, &text);
            if code == 0 {
                code = c;
            }
        }
    };
    write(
        &json_file,
        partial_json(rs::json(&report), partial.as_ref()),
    );
    let banner = partial.as_ref().map(Partial::banner);
    write(
        &csv_file,
        csv_with_banner(rs::csv(&report), banner.as_deref()),
    );
    write(
        &svg_file,
        svg_with_banner(crate::report::sweep_svg::svg(&report), banner.as_deref()),
    );
    code
}

/// The probe's refill verdict, as the sweep report carries it. Under QEMU
/// the KVM probe says nothing about TCG (whose soft TLB is flushed whole on
/// every CR3 write).
fn refill_visibility(backend: Backend) -> rs::RefillVisibility {
    use crate::probe::RefillVerdict;
    if backend == Backend::Qemu {
        return rs::RefillVisibility::Unknown {
            reason: "not probed under QEMU TCG: its soft TLB is flushed whole on every CR3 write"
                .into(),
        };
    }
    let p = host::cr3_write_refill();
    match p.verdict {
        RefillVerdict::Visible => rs::RefillVisibility::Visible {
            probe_ns_per_page: p.ns_per_page,
        },
        RefillVerdict::NotVisible => rs::RefillVisibility::NotVisible {
            probe_ns_per_page: p.ns_per_page,
            threshold_ns_per_page: p.threshold_ns_per_page,
        },
        RefillVerdict::Unmeasured => rs::RefillVisibility::Unknown {
            reason: format!("the refill probe could not measure: {}", p.detail),
        },
    }
}

fn describe_refill(v: &rs::RefillVisibility) -> String {
    let ns = |v: &Option<f64>| v.map_or("?".into(), |x| format!("{x:.2}"));
    match v {
        rs::RefillVisibility::Visible { probe_ns_per_page } => format!(
            "a guest CR3 write costs user code a TLB refill here (probe: {} ns/page)",
            ns(probe_ns_per_page)
        ),
        rs::RefillVisibility::NotVisible {
            probe_ns_per_page,
            threshold_ns_per_page,
        } => format!(
            "{} ({} ns/page, below {threshold_ns_per_page}): no per-page refill figure is PTI's here",
            rs::RefillVisibility::HIDDEN,
            ns(probe_ns_per_page)
        ),
        rs::RefillVisibility::Unknown { reason } => format!("unknown ({reason})"),
    }
}

/// Settles one (cell, configuration) run when it is needed: the
/// configuration's options plus the cell's guest words, through preflight,
/// with the image read once and shared (`Arc`) by every configuration,
/// cell and run.
struct Preparer {
    sides: Vec<crate::cli::compare::SideSpec>,
    /// The image, read by the first run settled: every configuration boots
    /// the same `--kernel` (or embedded guest).
    image: Option<std::sync::Arc<[u8]>>,
    workload: Workload,
    cpus: u32,
    /// `--iterations`: a cell that reads more runs fewer ([`CellPlan::iterations`]).
    iterations: u64,
    target: crate::preflight::Target,
}

impl Preparer {
    fn prepare(&mut self, k: usize, cell: &CellPlan) -> Result<ResolvedRun, PreflightError> {
        let mut config = self.sides[k].config.clone();
        // A slow cell runs fewer calls, unless the configuration names its own count.
        if config.guest.iterations == Some(self.iterations) {
            config.guest.iterations = Some(cell.iterations);
        }
        let extra = &mut config.guest.extra;
        if !cell.words.is_empty() {
            *extra = format!("{} {}", extra.trim(), cell.words)
                .trim()
                .to_string();
        }
        if self.workload == Workload::Poundsyscall && !extra.contains("threads=") {
            *extra = format!("{} threads={}", extra.trim(), self.cpus)
                .trim()
                .to_string();
        }
        let resolved = preflight_with_image(&config, self.target, self.image.clone())?;
        if self.image.is_none() {
            self.image = Some(resolved.image.clone());
        }
        Ok(resolved)
    }
}

/// The rates (per call) the report takes from each run, in this order.
const RATE_NAMES: [&str; 8] = [
    "tlb_flush_per_call",
    "kvm_pf_taken_per_call",
    "kvm_exits_per_call",
    "cr3_writes_per_call",
    "read_cycles_per_call",
    "read_cycles_min_per_call",
    "kernel_instructions_per_call",
    "insn_mov_cr3_per_call",
];

/// What the report keeps of one run.
#[derive(Debug, Clone, Copy, Default)]
struct RunFigures {
    /// The time metric per call.
    time: Option<f64>,
    /// [`RATE_NAMES`], each if the run has it.
    rates: [Option<f64>; RATE_NAMES.len()],
}

impl RunFigures {
    fn of(s: &RunSummary, time_metric: &str) -> Self {
        let all = rates(s);
        let find = |name: &str| all.iter().find(|(m, _)| m.name == name).map(|(_, v)| *v);
        RunFigures {
            time: find(time_metric),
            rates: RATE_NAMES.map(find),
        }
    }
}

/// The median of rate `i` over runs, if every run has it.
fn median_rate(runs: &[RunFigures], i: usize) -> Option<f64> {
    let v: Option<Vec<f64>> = runs.iter().map(|f| f.rates[i]).collect();
    v.filter(|v| !v.is_empty()).map(|v| rs::median(&v))
}

/// Half the range (max - min) of rate `i` over runs, if two or more runs have it.
fn half_range(runs: &[RunFigures], i: usize) -> Option<f64> {
    let v: Vec<f64> = runs.iter().filter_map(|f| f.rates[i]).collect();
    (v.len() >= 2).then(|| {
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
        (hi - lo) / 2.0
    })
}

/// Why a sweep's result is partial and how much of it there is.
#[derive(Debug, Clone, serde::Serialize)]
struct Partial {
    reason: String,
    runs_done: u64,
    runs_planned: u64,
    cells_reported: usize,
    cells_planned: usize,
}

impl Partial {
    fn banner(&self) -> String {
        format!(
            "PARTIAL: {}; {} of {} runs done, {} of {} cells reported (those every configuration ran in)",
            self.reason, self.runs_done, self.runs_planned, self.cells_reported, self.cells_planned
        )
    }
}

/// The JSON document with a `partial` object when the sweep stopped early.
fn partial_json(doc: String, partial: Option<&Partial>) -> String {
    let Some(p) = partial else { return doc };
    match serde_json::from_str::<serde_json::Value>(&doc) {
        Ok(serde_json::Value::Object(mut m)) => {
            m.insert("partial".into(), serde_json::json!(p));
            serde_json::to_string_pretty(&m).unwrap_or(doc)
        }
        _ => doc,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iterations_default_text_is_the_default() {
        assert_eq!(
            DEFAULT_SWEEP_ITERATIONS_STR.parse::<u64>(),
            Ok(DEFAULT_SWEEP_ITERATIONS)
        );
    }

    #[test]
    fn touch_specs() {
        assert_eq!(TouchSpec::parse("1x"), Ok(TouchSpec::Passes(1)));
        assert_eq!(TouchSpec::parse("300"), Ok(TouchSpec::Reads(300)));
        assert!(TouchSpec::parse("0x").is_err());
        assert!(TouchSpec::parse("x").is_err());
        assert!(TouchSpec::parse("-1").is_err());
        assert_eq!(TouchSpec::parse("4K"), Ok(TouchSpec::Reads(4096)));
        assert_eq!(TouchSpec::parse("8M"), Ok(TouchSpec::Reads(8 << 20)));
        // Slow cells run fewer calls, never fewer than 20 nor more than asked.
        assert_eq!(cell_iterations(1000, 4096), 1000);
        assert_eq!(cell_iterations(1000, 64 << 10), 62);
        assert_eq!(cell_iterations(1000, 2 << 20), 20);
        assert_eq!(cell_iterations(10, 8 << 20), 10);
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
