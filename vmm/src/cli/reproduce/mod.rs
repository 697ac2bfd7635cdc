//! `ptiscope reproduce <seed>`: one published PTI table (docs/seeds.md),
//! its rows measured here beside the published figures, on the companion
//! guest and, where the seed was about Linux, on the Linux kernels
//! `ptiscope linux fetch` gets.
//!
//! Every cell is one configuration run through compare's own path
//! (`compare::parse_side`, `preflight`, `compare::run_measured`): nothing
//! here measures anything itself. Sizes are scaled so that a seed finishes
//! in about a minute under QEMU TCG; the published figures are converted to
//! the same unit (per call or per message), and each row's overhead is
//! against its own baseline row, as the seed reported it.

mod seeds;

use seeds::cells;
use std::path::PathBuf;
use std::time::Duration;

use ptiscope_abi::options::Workload;

use super::compare::{parse_side, rates, run_measured};
use super::exit_code::{self, ExitCode as _};
use super::{Arch, Backend, BackendOpts, ExperimentOpts, LinuxArgs, TargetOpts};
use crate::machine::memory::DEFAULT_MEM_MIB;
use crate::preflight::preflight;
use crate::report::time_basis::TimeBasis;
use crate::spec::guest::GuestKind;

/// The seeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Seed {
    /// Roedel 2018: sched-messaging, 32-bit PAE against 64-bit, PTI off/on.
    #[value(name = "roedel-2018")]
    Roedel2018,
    /// Tarreau 2018: getppid round trip, PTI on, off per process, off at boot.
    #[value(name = "tarreau-2018")]
    Tarreau2018,
    /// Chartre 2020: poundsyscall by thread count, PTI off/on.
    #[value(name = "chartre-2020")]
    Chartre2020,
    /// Petkov 2015: cycles per getpid.
    #[value(name = "petkov-2015")]
    Petkov2015,
    /// Gregg 2018: overhead against working set.
    #[value(name = "gregg-2018")]
    Gregg2018,
}

/// Where `reproduce` measures its cells (`--backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ReproduceBackend {
    /// Per cell: this host's KVM (ptiscope's VMM, for the Linux kernels
    /// too), under QEMU where that KVM refuses the guest before boot (e.g.
    /// 32-bit paging, or Linux, on kvm_pvm).
    #[default]
    Auto,
    /// Every cell on this host's KVM, no fallback: a cell it refuses or
    /// cannot run shows that error in its row.
    Kvm,
    /// Every cell under QEMU TCG.
    Qemu,
    /// Every cell on ptiscope's VMM on a real kvm_amd (nested paging)
    /// inside QEMU TCG, all in one nested boot (docs/kvm-hosts.md).
    Nested,
}

impl ReproduceBackend {
    /// The name `--backend` takes.
    pub fn name(self) -> &'static str {
        match self {
            ReproduceBackend::Auto => "auto",
            ReproduceBackend::Kvm => "kvm",
            ReproduceBackend::Qemu => "qemu",
            ReproduceBackend::Nested => "nested",
        }
    }

    /// The backends a cell is tried on, in order (the next one only where
    /// the host's KVM refused the guest before boot).
    fn tries(self) -> &'static [Backend] {
        match self {
            ReproduceBackend::Auto => Backend::preference(),
            ReproduceBackend::Kvm => &[Backend::Kvm],
            ReproduceBackend::Qemu => &[Backend::Qemu],
            // Runs as `--backend kvm` inside the nested boot
            // (`nested::cli::intercept`); nothing is measured out here.
            ReproduceBackend::Nested => &[],
        }
    }
}

/// `ptiscope reproduce`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReproduceArgs {
    /// Which seed.
    #[arg(value_enum)]
    pub seed: Seed,
    /// Runs per cell (their mean is shown).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub runs: u32,
    /// Leave out the Linux kernels (the companion guest only).
    #[arg(long)]
    pub no_linux: bool,
    /// Leave out the companion guest (the Linux kernels only).
    #[arg(long)]
    pub no_companion: bool,
    /// Timeout of each run, in seconds.
    #[arg(long, value_name = "SECS", default_value = "120", value_parser = super::parse_timeout)]
    pub timeout: Duration,
    /// Also write the table as JSON (`ptiscope.reproduce/1`).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Where the cells run. `kvm` and `qemu` force that backend for every
    /// cell with no fallback (a cell it cannot run shows its error in its
    /// row); `nested` runs every cell, the Linux kernels' too, on the VMM
    /// on a real kvm_amd inside QEMU TCG, in one nested boot.
    #[arg(long, value_enum, default_value_t = ReproduceBackend::Auto)]
    pub backend: ReproduceBackend,
}

/// The Linux kernels a reproduction measures (`--no-linux`: none): the
/// fetched ones, each named with its cached image; the others are said to
/// be left out.
pub fn linux_kernels(args: &ReproduceArgs) -> Vec<(&'static str, std::path::PathBuf)> {
    let mut out = Vec::new();
    // Every seed was measured on Linux.
    if !args.no_linux {
        for k in ["debian-amd64", "debian-686-pae"] {
            match crate::preflight::linux::known_path(k) {
                Some(Ok(p)) if p.is_file() => out.push((k, p)),
                _ => say!(
                    "ptiscope reproduce: {k} is not fetched: its rows are left out (run `ptiscope linux fetch`)"
                ),
            }
        }
    }
    out
}

/// What one nested boot for `reproduce --backend nested` needs: the bound
/// of the whole inner command, the vCPUs of the inner Linux and the Linux
/// kernels to pack for the inner command ([`linux_kernels`]). Refuses
/// (the message says why and what to do) a reproduction with nothing to
/// measure.
#[allow(clippy::type_complexity)]
pub fn nested_session(
    args: &ReproduceArgs,
) -> Result<(Duration, u32, Vec<(&'static str, std::path::PathBuf)>), String> {
    let kernels = linux_kernels(args);
    let mut guests: Vec<CellGuest> = if args.no_companion {
        Vec::new()
    } else {
        CellGuest::COMPANIONS.to_vec()
    };
    guests.extend(kernels.iter().map(|(k, _)| CellGuest::linux(k)));
    let (_, cells) = cells(args.seed, &guests);
    if cells.is_empty() {
        return Err("no guest to measure: --no-linux and --no-companion leave nothing".to_owned());
    }
    // Every run of every cell is bounded by --timeout (a refused cell
    // costs nothing); the rest is the inner command's own start and report.
    let runs = cells.len() as u32 * args.runs;
    let cpus = cells.iter().map(|c| c.cpus).max().unwrap_or(1);
    Ok((
        args.timeout * runs + Duration::from_secs(120),
        cpus,
        kernels,
    ))
}

/// Which guest a cell boots: the guest kind (a Linux kernel by its known
/// name) and its architecture, which the companion is built for with
/// `--arch` and a Linux kernel has by its name (the seeds' 32-bit PAE
/// rows go with the i386 guests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CellGuest {
    kind: GuestKind<&'static str>,
    arch: Arch,
}

impl CellGuest {
    /// The companion guest's two flavours, x86_64 first.
    const COMPANIONS: [CellGuest; 2] = [
        CellGuest {
            kind: GuestKind::Companion,
            arch: Arch::X86_64,
        },
        CellGuest {
            kind: GuestKind::Companion,
            arch: Arch::I386,
        },
    ];

    /// A known Linux kernel (`debian-686-pae` is the i386 one).
    fn linux(kernel: &'static str) -> Self {
        CellGuest {
            kind: GuestKind::Linux(kernel),
            arch: if kernel == "debian-686-pae" {
                Arch::I386
            } else {
                Arch::X86_64
            },
        }
    }

    /// The 64-bit guests (the seeds that were measured on x86_64 only).
    fn is_x86_64(self) -> bool {
        self.arch == Arch::X86_64
    }

    /// Calls per run: `linux` under a Linux kernel (QEMU TCG, slow), else
    /// `companion`.
    fn calls(self, linux: u64, companion: u64) -> u64 {
        match self.kind {
            GuestKind::Linux(_) => linux,
            GuestKind::Companion => companion,
        }
    }

    fn name(self) -> String {
        match (self.kind, self.arch) {
            (GuestKind::Companion, Arch::X86_64) => "ptiscope guest (x86_64)".into(),
            (GuestKind::Companion, Arch::I386) => "ptiscope guest (i386 PAE)".into(),
            (GuestKind::Linux(k), _) => format!("Linux {k}"),
        }
    }
}

/// One cell of a seed's table.
#[derive(Debug, Clone)]
struct Cell {
    guest: CellGuest,
    row: String,
    column: String,
    /// compare's side options (`pti=on,cmdline=...`); `None`: not
    /// measurable on this guest (the reason).
    opts: Result<String, &'static str>,
    workload: Workload,
    iterations: u64,
    cpus: u32,
    /// The published figure in this cell's unit, and as published.
    published: Option<f64>,
    /// The unit of `published` (`ns/call`, `ns/message`, `cycles/call`);
    /// empty where nothing is published.
    published_unit: &'static str,
    published_text: String,
    /// The index (in the seed's cells) of the row this one's overhead is against.
    baseline: Option<usize>,
}

/// A measured cell.
#[derive(Debug, Clone, Default)]
struct Measured {
    value: Option<f64>,
    unit: String,
    metric: String,
    cr3_per_call: Option<f64>,
    cr3_source: &'static str,
    /// Kernel instructions per call (the plugin's: one call's own path;
    /// kvm_pvm's emulated instructions), where the backend counts them.
    kernel_insns_per_call: Option<f64>,
    backend: &'static str,
    /// What its times are on that backend (the backend's own word,
    /// [`backend_basis`]); `None` where no backend was tried.
    time_basis: Option<TimeBasis>,
    error: Option<(i32, String)>,
}

/// A per-call rate of a run: (metric name, source key, value).
type Rate = (String, String, f64);

const ROEDEL_MESSAGES: f64 = 20.0 * 400.0 * 100.0;

/// compare's options for a cell, as compare's own structs (its defaults
/// where the seed says nothing: the embedded guest's memory size, the
/// QEMU plugin on); `parse_side` and `preflight` make the checks.
fn cell_options(cell: &Cell, backend: Backend, timeout: Duration) -> (ExperimentOpts, TargetOpts) {
    let exp = ExperimentOpts {
        workload: cell.workload,
        iterations: cell.iterations,
        cpus: cell.cpus,
        kernel: None,
        mem: DEFAULT_MEM_MIB,
        timeout,
    };
    let (arch, linux) = match (cell.guest.kind, cell.guest.arch) {
        (GuestKind::Companion, Arch::I386) => (Some(Arch::I386), None),
        (GuestKind::Companion, Arch::X86_64) => (None, None),
        // A Linux kernel's architecture is its image's: no --arch.
        (GuestKind::Linux(k), _) => (None, Some(k.to_owned())),
    };
    let target = TargetOpts {
        arch,
        linux: LinuxArgs {
            linux,
            append: None,
            tick_free: Default::default(),
        },
        on: BackendOpts {
            backend,
            qemu_arg: Vec::new(),
            no_plugin: false,
            nested_paging: None,
        },
    };
    (exp, target)
}

/// Why one run of a cell did not give figures: its exit code and message,
/// and whether it was the host's KVM refusing the guest before boot (then
/// the next backend is tried).
struct CellError {
    code: i32,
    message: String,
    host_kvm_refuses: bool,
}

impl CellError {
    fn new(code: i32, message: String) -> Self {
        CellError {
            code,
            message,
            host_kvm_refuses: false,
        }
    }
}

/// The figures of one run of `cell` on `backend`.
fn measure_on(
    cell: &Cell,
    opts: &str,
    backend: Backend,
    timeout: Duration,
) -> Result<(Vec<Rate>, &'static str), CellError> {
    let (exp, target) = cell_options(cell, backend, timeout);
    let embedded = target.arch.unwrap_or(Arch::X86_64).embedded_image();
    let spec = parse_side(opts, &exp, &target, embedded)
        .map_err(|e| CellError::new(exit_code::USAGE, e.to_string()))?;
    let backend = target.on.backend();
    let resolved =
        preflight(&spec.config, backend.target(), &crate::cli::host_facts()).map_err(|e| {
            CellError {
                code: e.exit_code(),
                message: e.to_string(),
                host_kvm_refuses: e.host_kvm_refuses(),
            }
        })?;
    let (_, summary) = run_measured(&resolved, &*backend)
        .map_err(|e| CellError::new(e.exit_code(), e.to_string()))?;
    Ok((
        rates(&summary)
            .into_iter()
            .map(|(m, v)| (m.name, m.source.key().to_string(), v))
            .collect(),
        // Inside `--backend nested` this KVM is the nested kvm_amd.
        crate::spec::nested::reported_backend(backend.name()),
    ))
}

/// Measures a cell `runs` times on `choice`'s backends ([`ReproduceBackend::tries`]).
fn measure(cell: &Cell, runs: u32, timeout: Duration, choice: ReproduceBackend) -> Measured {
    let opts = match &cell.opts {
        Ok(o) => o.clone(),
        Err(why) => {
            return Measured {
                error: Some((0, why.to_string())),
                ..Default::default()
            }
        }
    };
    let mut samples: Vec<Vec<Rate>> = Vec::new();
    let mut backend = "";
    let mut time_basis = None;
    for _ in 0..runs {
        let tries = choice.tries();
        let mut tried = Backend::Kvm;
        let mut r = Err(CellError::new(
            exit_code::INTERNAL,
            "no backend to measure on".to_owned(),
        ));
        for (i, &b) in tries.iter().enumerate() {
            tried = b;
            r = measure_on(cell, &opts, b, timeout);
            // The next backend only where this host's KVM refuses the guest.
            match &r {
                Err(e) if i + 1 < tries.len() && e.host_kvm_refuses => {}
                _ => break,
            }
        }
        let r = r.map_err(|e| (e.code, e.message));
        match r {
            Ok((rates, b)) => {
                samples.push(rates);
                backend = b;
                time_basis = Some(backend_basis(tried));
            }
            Err(e) => {
                // The row names the backend that gave the error (e.g.
                // `--backend kvm` on a KVM that refuses the guest).
                return Measured {
                    error: Some(e),
                    backend: if tries.is_empty() {
                        ""
                    } else {
                        backend_name(tried)
                    },
                    time_basis: (!tries.is_empty()).then(|| backend_basis(tried)),
                    ..Default::default()
                };
            }
        }
    }
    let mean = |name: &str| -> Option<(f64, String)> {
        let vals: Vec<(f64, String)> = samples
            .iter()
            .filter_map(|s| {
                s.iter()
                    .find(|(n, _, _)| n == name)
                    .map(|(_, src, v)| (*v, src.clone()))
            })
            .collect();
        (vals.len() == samples.len() && !vals.is_empty()).then(|| {
            (
                vals.iter().map(|(v, _)| v).sum::<f64>() / vals.len() as f64,
                vals[0].1.clone(),
            )
        })
    };
    let time_names: &[(&str, &str)] = if cell.column == "cycles" {
        &[("cycles_per_call", "cycles")]
    } else {
        &[
            ("ns_per_call", "ns"),
            ("guest_ns_per_call", "ns"),
            ("cycles_per_call", "cycles"),
        ]
    };
    let (value, unit, metric) = time_names
        .iter()
        .find_map(|(n, u)| mean(n).map(|(v, _)| (Some(v), u.to_string(), n.to_string())))
        .unwrap_or((None, String::new(), String::new()));
    let kernel_insns_per_call = mean("kernel_instructions_per_call").map(|(v, _)| v);
    // The calls' own CR3 writes where the plugin has them (exact), else
    // the phase's, else the guest's count.
    let (cr3, src) =
        match mean("insn_mov_cr3_calls_per_call").or_else(|| mean("insn_mov_cr3_per_call")) {
            Some((v, _)) => (Some(v), "qemu-plugin"),
            // The guest's own count, or KVM's (a Linux guest, shadow paging).
            None => match mean("cr3_writes_per_call") {
                Some((v, src)) if src == "kvm" => (Some(v), "kvm"),
                Some((v, _)) => (Some(v), "guest"),
                None => (None, ""),
            },
        };
    Measured {
        value,
        unit,
        metric,
        cr3_per_call: cr3,
        cr3_source: src,
        kernel_insns_per_call,
        backend,
        time_basis,
        error: None,
    }
}

/// Runs the seed and prints its table; returns the process exit code.
pub fn run(args: &ReproduceArgs) -> i32 {
    if args.backend == ReproduceBackend::Nested {
        // `nested::cli::intercept` runs it in the nested boot; reaching
        // here means its refusal or boot was skipped.
        if let Err(e) = nested_session(args) {
            say!("ptiscope reproduce: {e}");
            return exit_code::USAGE;
        }
        say!("ptiscope reproduce: --backend nested runs inside the nested boot, not here");
        return exit_code::INTERNAL;
    }
    let mut guests = Vec::new();
    if !args.no_companion {
        guests.extend(CellGuest::COMPANIONS);
    }
    guests.extend(
        linux_kernels(args)
            .into_iter()
            .map(|(k, _)| CellGuest::linux(k)),
    );
    // The output is opened before the first boot: a bad path must not
    // cost the runs.
    let json_file = match &args.json {
        Some(p) => match crate::output::open_document("--json", p, args.timeout) {
            Ok(f) => Some(f),
            Err(e) => {
                say!("ptiscope reproduce: {e}");
                return e.exit_code();
            }
        },
        None => None,
    };
    let (title, cells) = cells(args.seed, &guests);
    if cells.is_empty() {
        say!("ptiscope reproduce: no guest to measure (every kernel left out)");
        return exit_code::USAGE;
    }
    println!("ptiscope reproduce {}", seed_name(args.seed));
    println!("  {title}");
    // The backend asked for: inside the nested boot, `nested` (its `kvm`).
    let requested = if crate::spec::nested::inside() {
        ReproduceBackend::Nested.name()
    } else {
        args.backend.name()
    };
    // `auto` (the default) prints as it always has.
    if requested != ReproduceBackend::Auto.name() {
        println!("  backend: {requested}");
    }
    if crate::spec::nested::inside() {
        println!("  KVM: {}", crate::cli::host_facts().describe_kvm());
    }
    let started = std::time::Instant::now();
    let mut measured: Vec<Measured> = Vec::with_capacity(cells.len());
    // A termination signal ends the reproduction: the cells measured so far
    // are printed and written, the rest are named as not run.
    let mut stopped_by: Option<(i32, String)> = None;
    for c in &cells {
        if let Some((code, why)) = &stopped_by {
            measured.push(Measured {
                error: Some((*code, format!("not run: {why}"))),
                ..Default::default()
            });
            continue;
        }
        say!(
            "ptiscope reproduce: {} / {} / {} ...",
            c.guest.name(),
            c.row,
            c.column
        );
        let m = measure(c, args.runs, args.timeout, args.backend);
        if let Some((code, _)) = &m.error {
            if let Some(sig) = exit_code::terminating_signal(*code) {
                stopped_by = Some((*code, crate::signals::describe(sig)));
            }
        }
        measured.push(m);
    }
    let mut exit = 0;
    let mut json_rows = Vec::new();
    let mut current: Option<CellGuest> = None;
    let mut unlike_units = false;
    for (i, (c, m)) in cells.iter().zip(&measured).enumerate() {
        if current != Some(c.guest) {
            current = Some(c.guest);
            println!();
            // What its times are on the backend it ran on (kvm_pvm's
            // emulated kernel, the hardware, TCG), beside the guest's name:
            // the backend's own word, as every other report takes it.
            let basis = m.time_basis.map(TimeBasis::label);
            println!(
                "{} ({}{})",
                c.guest.name(),
                if m.backend.is_empty() { "-" } else { m.backend },
                basis.map_or(String::new(), |b| format!("; times: {b}"))
            );
            println!(
                "  {:<26} {:<12} {:>14} {:>18}   {:>22} {:>10}   {:>9} {:>11}",
                "row",
                "column",
                "published",
                "published, per",
                "here",
                "vs base",
                "CR3/call",
                "kinsns/call"
            );
        }
        let base_value = c.baseline.and_then(|b| measured[b].value);
        let vs = match (m.value, base_value) {
            (Some(v), Some(b)) if b > 0.0 => Some((v / b - 1.0) * 100.0),
            _ => None,
        };
        let pub_vs = match (c.published, c.baseline.and_then(|b| cells[b].published)) {
            (Some(v), Some(b)) if b > 0.0 => Some((v / b - 1.0) * 100.0),
            _ => None,
        };
        let here = match (&m.error, m.value) {
            (Some((_, e)), _) => {
                if let Some((code, _)) = &m.error {
                    if *code != 0 && exit == 0 {
                        exit = *code;
                    }
                }
                // The table keeps one line per cell; the whole message is in
                // the JSON's `error`.
                format!(
                    "n/a: {}",
                    ptiscope_devices::escape_str(e.lines().next().unwrap_or_default())
                )
            }
            (None, Some(v)) => {
                let per = c.published_unit.split('/').nth(1).unwrap_or("call");
                // A figure in another unit than the published one (the
                // i386 companion's cycles beside published ns) is marked:
                // only the overheads compare.
                let other = !c.published_unit.is_empty()
                    && c.published_unit.split('/').next() != Some(m.unit.as_str());
                if other {
                    unlike_units = true;
                }
                format!("{v:.1} {}/{per}{}", m.unit, if other { " ≠" } else { "" })
            }
            (None, None) => "n/a".into(),
        };
        println!(
            "  {:<26} {:<12} {:>14} {:>18}   {:>22} {:>10}   {:>9} {:>11}",
            c.row,
            c.column,
            match pub_vs {
                Some(p) => format!("{} ({p:+.0}%)", c.published_text),
                None => c.published_text.clone(),
            },
            c.published
                .map_or("-".into(), |p| format!("{p:.1} {}", c.published_unit)),
            here,
            vs.map_or("-".into(), |v| format!("{v:+.1}%")),
            m.cr3_per_call.map_or("-".into(), |v| format!("{v:.2}")),
            m.kernel_insns_per_call
                .map_or("-".into(), |v| if v.fract() == 0.0 {
                    format!("{v:.0}")
                } else {
                    format!("{v:.2}")
                }),
        );
        json_rows.push(serde_json::json!({
            "guest": c.guest.name(),
            "backend": m.backend,
            "time_basis": m.time_basis.map(TimeBasis::key),
            "row": c.row,
            "column": c.column,
            "published": c.published_text,
            "published_per_unit": c.published,
            "published_unit": c.published_unit,
            "published_vs_baseline_pct": pub_vs,
            "here": m.value,
            "unit": m.unit,
            "metric": m.metric,
            "vs_baseline_pct": vs,
            "baseline_row": c.baseline,
            "cr3_writes_per_call": m.cr3_per_call,
            "cr3_source": m.cr3_source,
            "kernel_instructions_per_call": m.kernel_insns_per_call,
            "error": m.error.as_ref().map(|(_, e)| e.clone()),
            "index": i,
        }));
    }
    println!();
    if unlike_units {
        println!(
            "  ≠: measured in another unit than the published figure (e.g. cycles beside \
             published ns): not comparable as values; only the overheads (vs base) are"
        );
    }
    if let Some((_, why)) = &stopped_by {
        println!("  PARTIAL: {why}; the cells after it were not run");
    }
    println!(
        "  {} cells in {:.1} s; runs per cell: {}. Under QEMU TCG every CR3 write flushes TCG's whole \
         software TLB, so time ratios there overstate hardware's; the exact figures are the CR3 \
         writes and kernel instructions per call (kinsns/call: one call's own path under the \
         plugin, docs/telemetry-abi.md; kvm_pvm's emulated instructions on KVM).",
        cells.len(),
        started.elapsed().as_secs_f64(),
        args.runs
    );
    if let Some(f) = &json_file {
        let doc = serde_json::json!({
            "schema": "ptiscope.reproduce/1",
            "seed": seed_name(args.seed),
            "title": title,
            "runs_per_cell": args.runs,
            "backend": requested,
            "kvm": crate::spec::nested::inside().then(|| crate::cli::host_facts().describe_kvm()),
            "partial": stopped_by.as_ref().map(|(_, why)| why.clone()),
            "rows": json_rows,
        });
        let text = serde_json::to_string_pretty(&doc).unwrap_or_else(|_| "null".into());
        if let Err(e) = f.write_document(&text) {
            say!("ptiscope reproduce: {e}");
            return exit_code::CANT_CREATE;
        }
    }
    exit
}

/// What a time measured on `b` is: the backend's profile's word (kvm_pvm's
/// emulated kernel, the hardware's under kvm_intel/kvm_amd, QEMU TCG's),
/// as `compare` and `run` record it; `--backend nested` runs its inner
/// command on a KVM inside QEMU TCG.
fn backend_basis(b: Backend) -> TimeBasis {
    match b {
        Backend::Nested => TimeBasis::NestedTcg,
        b => b.with_plugin(true).profile().time_basis,
    }
}

/// A backend's name in the table, as [`measure_on`] gives it on success.
fn backend_name(b: Backend) -> &'static str {
    match b {
        // No run reaches a backend as `nested` out here (its inner command
        // runs as `kvm`): the cell names what was asked.
        Backend::Nested => "nested",
        b => crate::spec::nested::reported_backend(b.with_plugin(true).name()),
    }
}

fn seed_name(s: Seed) -> &'static str {
    match s {
        Seed::Roedel2018 => "roedel-2018",
        Seed::Tarreau2018 => "tarreau-2018",
        Seed::Chartre2020 => "chartre-2020",
        Seed::Petkov2015 => "petkov-2015",
        Seed::Gregg2018 => "gregg-2018",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every backend a block can run on states its times' basis (the
    /// backend's own): none is "unknown" because the table built an
    /// environment without it, as every block's header once did.
    #[test]
    fn each_backend_names_its_time_basis() {
        assert_eq!(backend_basis(Backend::Qemu), TimeBasis::QemuTcg);
        assert_eq!(backend_basis(Backend::Nested), TimeBasis::NestedTcg);
        assert_eq!(backend_basis(Backend::Kvm), crate::cli::kvm_identity().1);
        // On a host whose KVM module is known (this one: kvm_pvm), KVM's is too.
        if crate::report::environment::kvm(&crate::cli::host_facts())
            .module
            .is_some_and(|m| m.starts_with("kvm_"))
        {
            assert_ne!(backend_basis(Backend::Kvm), TimeBasis::Unknown);
        }
    }

    /// A cell's options are what compare's own parser makes of the same
    /// words (its defaults where the cell says nothing), for every cell of
    /// every seed, on each backend.
    #[test]
    fn a_cells_options_are_what_compares_parser_gives_for_its_words() {
        use clap::Parser as _;
        let guests = [
            CellGuest::COMPANIONS[0],
            CellGuest::COMPANIONS[1],
            CellGuest::linux("debian-amd64"),
        ];
        let every_cell: Vec<Cell> = [
            Seed::Roedel2018,
            Seed::Tarreau2018,
            Seed::Chartre2020,
            Seed::Petkov2015,
            Seed::Gregg2018,
        ]
        .into_iter()
        .flat_map(|seed| cells(seed, &guests).1)
        .collect();
        for cell in &every_cell {
            for backend in [Backend::Kvm, Backend::Qemu] {
                let timeout = Duration::from_secs(7);
                let (exp, target) = cell_options(cell, backend, timeout);
                let mut argv: Vec<String> = vec!["ptiscope".into(), "compare".into()];
                argv.extend(
                    [
                        "--backend",
                        if backend == Backend::Kvm {
                            "kvm"
                        } else {
                            "qemu"
                        },
                        "--workload",
                        &cell.workload.to_string(),
                        "--iterations",
                        &cell.iterations.to_string(),
                        "--cpus",
                        &cell.cpus.to_string(),
                        "--timeout",
                        "7",
                    ]
                    .map(String::from),
                );
                match (cell.guest.kind, cell.guest.arch) {
                    (GuestKind::Companion, Arch::I386) => {
                        argv.extend(["--arch".into(), "i386".into()])
                    }
                    (GuestKind::Companion, Arch::X86_64) => {}
                    (GuestKind::Linux(k), _) => argv.extend(["--linux".into(), k.into()]),
                }
                let Some(super::super::Command::Compare(parsed)) =
                    super::super::Cli::try_parse_from(&argv).unwrap().command
                else {
                    panic!("{argv:?} is not a compare command");
                };
                assert_eq!(format!("{exp:?}"), format!("{:?}", parsed.exp), "{argv:?}");
                assert_eq!(
                    format!("{target:?}"),
                    format!("{:?}", parsed.target),
                    "{argv:?}"
                );
            }
        }
    }

    fn parse(words: &[&str]) -> Result<ReproduceArgs, clap::Error> {
        use clap::Parser as _;
        let argv = ["ptiscope", "reproduce"].iter().chain(words);
        match super::super::Cli::try_parse_from(argv)?.command {
            Some(super::super::Command::Reproduce(a)) => Ok(a),
            other => panic!("{words:?} parsed as {other:?}"),
        }
    }

    /// `--backend` defaults to `auto` (today's per-cell choice); `kvm` and
    /// `qemu` are the one backend of every cell, with no fallback.
    #[test]
    fn backend_auto_keeps_the_per_cell_choice_and_kvm_or_qemu_force_one() {
        assert_eq!(
            parse(&["roedel-2018"]).unwrap().backend,
            ReproduceBackend::Auto
        );
        for (word, want) in [
            ("auto", ReproduceBackend::Auto),
            ("kvm", ReproduceBackend::Kvm),
            ("qemu", ReproduceBackend::Qemu),
            ("nested", ReproduceBackend::Nested),
        ] {
            let a = parse(&["roedel-2018", "--backend", word]).unwrap();
            assert_eq!(a.backend, want);
            assert_eq!(a.backend.name(), word);
        }
        assert!(parse(&["roedel-2018", "--backend", "tcg"]).is_err());
        // Auto: this host's KVM first, for Linux too, then QEMU.
        assert_eq!(
            ReproduceBackend::Auto.tries(),
            &[Backend::Kvm, Backend::Qemu]
        );
        assert_eq!(ReproduceBackend::Kvm.tries(), &[Backend::Kvm]);
        assert_eq!(ReproduceBackend::Qemu.tries(), &[Backend::Qemu]);
        // Nothing is measured out here under nested: the cells run in
        // the nested boot as `--backend kvm`.
        assert!(ReproduceBackend::Nested.tries().is_empty());
    }

    /// `--backend nested` with nothing to measure is refused; the bound
    /// covers every run of every cell.
    #[test]
    fn backend_nested_bounds_every_cell_and_refuses_nothing_to_measure() {
        let e = nested_session(
            &parse(&[
                "roedel-2018",
                "--backend=nested",
                "--no-linux",
                "--no-companion",
            ])
            .unwrap(),
        )
        .unwrap_err();
        assert!(e.contains("--no-companion"), "{e}");
        let a = parse(&[
            "roedel-2018",
            "--backend",
            "nested",
            "--no-linux",
            "--runs",
            "3",
            "--timeout",
            "10",
        ])
        .unwrap();
        let (bound, cpus, kernels) = nested_session(&a).unwrap();
        assert!(kernels.is_empty(), "--no-linux packs no kernel");
        let (_, c) = cells(Seed::Roedel2018, &CellGuest::COMPANIONS);
        assert_eq!(
            bound,
            Duration::from_secs(10 * 3 * c.len() as u64 + 120),
            "{} cells",
            c.len()
        );
        assert_eq!(cpus, c.iter().map(|c| c.cpus).max().unwrap());
    }

    #[test]
    fn roedels_table_has_its_four_rows_per_column_each_against_its_own_baseline() {
        let guests = [CellGuest::COMPANIONS[0], CellGuest::linux("debian-686-pae")];
        let (_, c) = cells(Seed::Roedel2018, &guests);
        // Per guest: one kernel (64-bit or 32-bit PAE), 2 PTI states x 2 columns.
        assert_eq!(c.len(), 8);
        for (i, cell) in c.iter().enumerate() {
            match cell.baseline {
                Some(b) => {
                    assert_eq!(i, b + 1);
                    assert_eq!(c[b].column, cell.column);
                    assert!(cell.opts.as_ref().unwrap().starts_with("pti=on"));
                }
                None => assert!(cell.opts.as_ref().unwrap().starts_with("pti=off")),
            }
        }
        // The published 32-bit PAE figures go with the 686-pae kernel.
        let pae: Vec<_> = c
            .iter()
            .filter(|x| x.guest == CellGuest::linux("debian-686-pae"))
            .collect();
        assert!(pae.iter().all(|x| x.row.starts_with("32-bit PAE")));
        assert_eq!(pae[1].published_text, "0.44 s");
    }

    #[test]
    fn every_seed_has_cells_for_the_64_bit_kernels() {
        for seed in [
            Seed::Roedel2018,
            Seed::Tarreau2018,
            Seed::Chartre2020,
            Seed::Petkov2015,
            Seed::Gregg2018,
        ] {
            let (_, c) = cells(seed, &[CellGuest::linux("debian-amd64")]);
            assert!(!c.is_empty(), "{seed:?}");
            assert!(c.iter().any(|x| x.baseline.is_some()), "{seed:?}");
        }
    }
}
