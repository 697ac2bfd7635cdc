//! `ptiscope sweep`: the TLB half of PTI's cost. Runs a grid of (working
//! set, reads per iteration) cells for a baseline and compare
//! configurations, interleaved as `compare` does (every run index visits
//! every cell, the configurations' order rotating), and reports per cell the
//! time per call of each configuration, the baseline's syscall rate, the
//! overhead against the baseline, the host's evidence and the derived
//! refill cost per page (`report::sweep`).
//!
//! Each cell is one experiment (`crate::experiment`), run a round of every
//! cell at a time. Size: the command's options, refusals, header, runs and
//! report assembly; the grid is `plan.rs`, what a run gives `figures.rs`,
//! the report itself report/sweep.rs.

mod figures;
mod plan;

use std::time::{Duration, Instant};

use clap::Args;

use crate::backend::Backend;
use crate::cli::command_error::CommandError;
use crate::cli::compare::{parse_side, progress, run_measured, write_file};
use crate::cli::exit_code::{self, ExitCode};
use crate::cli::measured_error::MeasuredRunError;
use crate::cli::partial::{csv_with_banner, svg_with_banner};
use crate::cli::{abi_option, Arch, ExperimentOpts, OutputOpts, TargetOpts};
use crate::experiment::{Experiment, ExperimentError, Progress, RunId};
use crate::output::OutputFile;
use crate::preflight::PreflightError;
use crate::probe::host;
use crate::report::sweep::{self as rs, Cell, CellConfig, Omitted, SweepReport};
use crate::signals;
use ptiscope_abi::options::Workload;
use ptiscope_abi::options::WssPages;

use figures::{
    describe_refill, half_range, median_rate, partial_json, refill_visibility, Partial, Preparer,
    RunFigures,
};
use plan::plan;
use plan::DEFAULT_SWEEP_ITERATIONS_STR;
pub use plan::{
    cell_iterations, TouchSpec, DEFAULT_SWEEP_ITERATIONS, DEFAULT_SWEEP_RUNS, DEFAULT_TOUCHES,
    DEFAULT_WSS, FULL_ITERATIONS_READS, MAX_SWEEP_CELLS, MAX_SWEEP_RUNS, MIN_CELL_ITERATIONS,
};

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
    mut_arg("json", |a| a.help("Write the sweep as JSON (schema ptiscope.sweep/1)")),
    mut_arg("csv", |a| a.help("Write the sweep as CSV (one line per cell and configuration)")),
    mut_arg("svg", |a| a.help("Write the sweep as SVG: overhead against syscall rate (log x), one \
        curve per working set and configuration, and a heat map")),
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
    /// The sweep's files (`compare`'s options, this command's help).
    #[command(flatten)]
    pub out: OutputOpts,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Where the runs run (`compare`'s options, this command's help).
    #[command(flatten)]
    pub target: TargetOpts,
}

/// The default configurations, and those left out with the reason.
fn default_configs(args: &SweepArgs, backend: &dyn Backend) -> (Vec<String>, Vec<Omitted>) {
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
    } else if let Some(reason) = (backend.profile().omits_pcid)() {
        omitted.push(Omitted {
            config: pcid,
            reason,
        });
    } else {
        configs.push(pcid);
    }
    (configs, omitted)
}

/// Runs the sweep and prints it; returns the process exit code.
pub fn run(args: &SweepArgs) -> i32 {
    exit_code::finish("sweep", sweep(args))
}

/// Why one run of a cell gave no figures.
#[derive(Debug, thiserror::Error)]
enum CellRunError {
    /// The (cell, configuration) could not be settled.
    #[error(transparent)]
    Settle(#[from] PreflightError),
    /// The run failed.
    #[error(transparent)]
    Run(#[from] MeasuredRunError),
    /// A signal arrived before the run started.
    #[error("{}", signals::describe(*.0))]
    Signal(i32),
}

impl ExitCode for CellRunError {
    fn exit_code(&self) -> i32 {
        match self {
            CellRunError::Settle(e) => e.exit_code(),
            CellRunError::Run(e) => e.exit_code(),
            CellRunError::Signal(sig) => 128 + sig,
        }
    }
}

/// The sweep's progress: the bar and the runs done.
struct Counter<'a> {
    bar: &'a indicatif::ProgressBar,
    done: u64,
}

impl Progress<RunFigures> for Counter<'_> {
    fn finished(&mut self, _: &RunId, _: &RunFigures) -> Result<(), String> {
        self.done += 1;
        self.bar.inc(1);
        Ok(())
    }
}

/// The refusals, the grid checked, the runs (one experiment per cell, a
/// round of every cell at a time) and the report.
fn sweep(args: &SweepArgs) -> Result<i32, CommandError> {
    let backend = args.target.on.backend()?;
    if let Some(why) = args.target.on.refusal(&args.target.on.requested()) {
        return Err(CommandError::Usage(why));
    }
    if !args.exp.workload.takes_working_set() {
        return Err(CommandError::Usage(format!(
            "--workload {}: the sweep needs a syscall-loop workload (getpid, getppid, write-badfd, nopti-getpid or poundsyscall)",
            args.exp.workload
        )));
    }
    let (cells, stride) = plan(args).map_err(CommandError::Usage)?;
    // The KVM the runs run on: this host's, or the backend's own (nested's
    // inner kvm_amd), settled for the grid's guest (a Linux one if the
    // command or a configuration names a kernel) before the
    // configurations, whose defaults ask it about PCID.
    let embedded = args.target.arch.unwrap_or(Arch::X86_64).embedded_image();
    let facts = {
        let mut probe = parse_side("pti=off", &args.exp, &args.target, embedded)
            .map_err(|source| CommandError::Side {
                prefix: "--config ",
                source,
            })?
            .config;
        if probe.guest_kind.is_companion() {
            if let Some(kernel) = args
                .configs
                .iter()
                .flat_map(|c| c.split(','))
                .find_map(|w| w.trim().strip_prefix("linux="))
            {
                probe.guest_kind =
                    crate::spec::guest::GuestKind::Linux(crate::spec::linux::LinuxRequest {
                        kernel: kernel.trim().into(),
                        append: String::new(),
                        arch: None,
                        tick_free: Default::default(),
                    });
            }
        }
        crate::cli::facts_for(&*backend, &probe)?
    };
    let (labels, omitted) = if args.configs.is_empty() {
        default_configs(args, &*backend)
    } else {
        (args.configs.clone(), Vec::new())
    };
    if labels.len() < 2 {
        return Err(CommandError::Usage(
            "give at least two --config (the first is the baseline)".into(),
        ));
    }
    if labels.iter().any(|l| l.trim().is_empty()) {
        return Err(CommandError::Usage(
            "--config '': an empty configuration has no label and means every \
             default (pti=auto); give its options, e.g. --config pti=off"
                .into(),
        ));
    }
    let planned = (cells.len() as u64)
        .saturating_mul(labels.len() as u64)
        .saturating_mul(u64::from(args.runs));
    if planned > MAX_SWEEP_RUNS {
        return Err(CommandError::Usage(format!(
            "{} cells x {} configurations x {} runs = {planned} runs; a sweep \
             plans at most {MAX_SWEEP_RUNS} (the sweep run limit): fewer cells, configurations or --runs",
            cells.len(),
            labels.len(),
            args.runs
        )));
    }
    let [json_file, csv_file, svg_file] = args.out.open(args.exp.timeout)?;
    let mut sides = Vec::new();
    for label in &labels {
        sides.push(
            parse_side(label, &args.exp, &args.target, embedded).map_err(|source| {
                CommandError::Side {
                    prefix: "--config ",
                    source,
                }
            })?,
        );
    }
    let mut prep = Preparer {
        sides,
        image: None,
        workload: args.exp.workload,
        cpus: args.exp.cpus,
        iterations: args.exp.iterations,
        target: backend.target(),
        facts: facts.clone(),
    };
    // Settle every (cell, configuration) before the first boot, so that a
    // bad cell does not cost the runs before it; nothing is kept (each run
    // is settled again when it runs, sharing its configuration's image), so
    // memory does not grow with the grid. A signal stops this at once.
    for cell in &cells {
        for (k, label) in labels.iter().enumerate() {
            if let Some(signal) = signals::wait_termination(Duration::ZERO) {
                return Err(CommandError::Interrupted {
                    signal,
                    what: "while checking the grid",
                });
            }
            prep.prepare(k, cell)
                .map_err(|source| CommandError::Settle {
                    at: format!("{label} at wss={}: ", rs::fmt_size(cell.wss)),
                    source,
                })?;
        }
    }

    let profile = backend.profile();
    let time = profile.time;
    let time_metric = time.metric;
    println!("ptiscope sweep: PTI's overhead over working set x syscall rate");
    println!("  host:      {}", host::describe_host());
    let (what, line) = &profile.sweep_line;
    println!("  {:<11}{line}", format!("{what}:"));
    let fewest = cells.iter().map(|c| c.iterations).min().unwrap_or(0);
    let fewer = if fewest < args.exp.iterations {
        format!(" (down to {fewest} where a call reads more than {FULL_ITERATIONS_READS} times: column calls/run)")
    } else {
        String::new()
    };
    // Probed before the timed runs (a few hundred ms), cached for the
    // environment block.
    let cr3_write_refill = refill_visibility(&*backend, &facts);
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
    let bar = progress(total, args.quiet, true);
    let started = Instant::now();
    // One experiment per cell, keeping per (cell, configuration) the few
    // figures the report takes from each run (not the run's whole summary).
    // Round r runs every cell once, cell ci's configurations rotated by r + ci.
    let mut grid: Vec<Experiment<RunFigures>> = cells
        .iter()
        .map(|_| Experiment::new(labels.clone()))
        .collect();
    let mut counter = Counter { bar: &bar, done: 0 };
    let mut stopped: Option<(i32, String)> = None;
    let mut failed_run = None;
    'runs: for r in 0..args.runs as usize {
        for (ci, cell) in cells.iter().enumerate() {
            let at = |id: &RunId| {
                format!(
                    "{} at wss={} touches={} run {}",
                    id.label,
                    rs::fmt_size(cell.wss),
                    cell.spec,
                    id.number
                )
            };
            let mut run_one = |id: &RunId| -> Result<RunFigures, CellRunError> {
                if let Some(signal) = signals::wait_termination(Duration::ZERO) {
                    return Err(CellRunError::Signal(signal));
                }
                bar.set_message(format!("wss={} {}", rs::fmt_size(cell.wss), id.label));
                let resolved = prep.prepare(id.side, cell)?;
                let (_, s) = run_measured(&resolved, &*backend)?;
                Ok(RunFigures::of(&s, time_metric))
            };
            let round = grid[ci].round(r + ci, r as u32 + 1, false, &mut run_one, &mut counter);
            match round {
                Ok(()) => {}
                Err(ExperimentError::Run { run, source }) => {
                    let why = match (&source, exit_code::terminating_signal(source.exit_code())) {
                        (CellRunError::Signal(sig), _) => {
                            format!("{} before {}", signals::describe(*sig), at(&run))
                        }
                        (_, Some(sig)) => format!("{} during {}", signals::describe(sig), at(&run)),
                        (_, None) => format!("{} failed: {source}", at(&run)),
                    };
                    let code = exit_code::failed_run(source.exit_code());
                    if let CellRunError::Run(e) = &source {
                        failed_run = Some(e.failed_run(at(&run), code));
                    }
                    stopped = Some((code, why));
                    break 'runs;
                }
                Err(ExperimentError::Refused(why)) => {
                    stopped = Some((exit_code::USAGE, why));
                    break 'runs;
                }
            }
        }
    }
    let done = counter.done;
    bar.finish_and_clear();
    if let Some((_, why)) = &stopped {
        say!("ptiscope sweep: {why}");
    }
    // The banner and the outputs take the reason's first line (a failed
    // run's message goes on with its console tail, printed above).
    let stopped = stopped.map(|(c, why)| (c, why.lines().next().unwrap_or_default().to_string()));
    let runs: Vec<Vec<Vec<RunFigures>>> = grid.into_iter().map(Experiment::into_runs).collect();

    let mut report = SweepReport {
        schema: rs::SCHEMA.into(),
        host: host::describe_host(),
        backend: backend.name().into(),
        workload: args.exp.workload.to_string(),
        iterations: args.exp.iterations,
        cpus: args.exp.cpus,
        runs: args.runs,
        stride,
        wss_pages: args.wss_pages.to_string(),
        time_metric: time_metric.into(),
        time_unit: time.unit.into(),
        time_source: time.source.into(),
        configs: labels.clone(),
        omitted,
        cells: Vec::new(),
        crossings: Vec::new(),
        cr3_write_refill,
        seconds: started.elapsed().as_secs_f64(),
        environment: Some(crate::report::environment::Environment::collect(
            &facts,
            crate::backend::identity(&*backend),
            crate::cli::compare::guest_image_of(
                &match (&args.exp.kernel, &args.target.linux.linux) {
                    (Some(p), _) => crate::machine::loader::KernelSource::Path(p.clone()),
                    (None, Some(k)) => crate::machine::loader::KernelSource::Path(
                        crate::preflight::linux::kernel_path(k).unwrap_or_else(|_| k.into()),
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
                return Err(CommandError::Missing(format!(
                    "{label} at wss={}: some runs have no {time_metric}",
                    rs::fmt_size(cell.wss)
                )));
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
        run: failed_run,
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
            let c = write_file("sweep", f, &text);
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
    Ok(code)
}
