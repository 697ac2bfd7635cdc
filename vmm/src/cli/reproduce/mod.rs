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
//!
//! Here: the arguments, the guests asked and the table printed. Under it:
//! `seeds` (each seed's cells), `cell` (one cell's guest and figure),
//! `measure` (one cell's runs) and `backend_choice` (`--backend`).

mod backend_choice;
mod cell;
mod measure;
mod seeds;

use std::path::PathBuf;
use std::time::Duration;

use self::backend_choice::Backends;
use self::cell::CellGuest;
use self::measure::{measure, Measured};
use self::seeds::{cells, seed_name};
use super::exit_code::{self, ExitCode as _};
use crate::report::time_basis::TimeBasis;

pub use backend_choice::ReproduceBackend;
pub use seeds::Seed;

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
    #[arg(long, default_value = "auto", value_parser = ReproduceBackend::parser())]
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

/// Runs the seed and prints its table; returns the process exit code.
pub fn run(args: &ReproduceArgs) -> i32 {
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
        let why = if args.no_linux {
            "--no-linux and --no-companion leave nothing: drop one"
        } else {
            "--no-companion, and every kernel left out: run `ptiscope linux fetch`, or drop \
             --no-companion"
        };
        say!("ptiscope reproduce: no guest to measure: {why}");
        return exit_code::USAGE;
    }
    println!("ptiscope reproduce {}", seed_name(args.seed));
    println!("  {title}");
    // The backend asked for: inside the nested boot, `nested` (its `kvm`).
    let requested = if crate::cli::host_facts().nested() {
        "nested"
    } else {
        args.backend.name()
    };
    // `auto` (the default) prints as it always has.
    if requested != ReproduceBackend::Auto.name() {
        println!("  backend: {requested}");
    }
    // Each backend is built once and serves every cell it measures (the
    // nested backend's sessions with it).
    let backends = Backends::default();
    if let ReproduceBackend::On(b) = args.backend {
        if let Some(line) = backends.get(b).ok().and_then(|b| b.profile().header_line) {
            println!("  KVM: {line}");
        }
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
        let m = measure(c, args.runs, args.timeout, args.backend, &backends);
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
            "kvm": crate::cli::host_facts().nested().then(|| crate::cli::host_facts().describe_kvm()),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::registry::BackendName;

    fn on(name: &str) -> ReproduceBackend {
        ReproduceBackend::On(BackendName::of(name).unwrap())
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
            ("kvm", on("kvm")),
            ("qemu", on("qemu")),
            ("nested", on("nested")),
        ] {
            let a = parse(&["roedel-2018", "--backend", word]).unwrap();
            assert_eq!(a.backend, want);
            assert_eq!(a.backend.name(), word);
        }
        assert!(parse(&["roedel-2018", "--backend", "tcg"]).is_err());
        // Auto: this host's KVM first, for Linux too, then QEMU.
        let names = |b: ReproduceBackend| {
            b.tries()
                .into_iter()
                .map(BackendName::as_str)
                .collect::<Vec<_>>()
        };
        assert_eq!(names(ReproduceBackend::Auto), ["kvm", "qemu"]);
        assert_eq!(names(on("kvm")), ["kvm"]);
        assert_eq!(names(on("qemu")), ["qemu"]);
        // Nested, through the backend trait like the others.
        assert_eq!(names(on("nested")), ["nested"]);
    }
}
