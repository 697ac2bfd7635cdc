//! Measuring one cell: compare's options for it, its runs on the backends
//! the choice tries (the next only where this host's KVM refuses the
//! guest), and the figures kept from them.

use super::backend_choice::{backend_basis, backend_name, Backends, ReproduceBackend};
use super::cell::Cell;
use crate::backend::registry::BackendName;
use crate::cli::compare::{parse_side, rates, run_measured};
use crate::cli::exit_code::{self, ExitCode as _};
use crate::cli::{Arch, BackendOpts, ExperimentOpts, LinuxArgs, TargetOpts};
use crate::machine::memory::DEFAULT_MEM_MIB;
use crate::preflight::preflight;
use crate::report::time_basis::TimeBasis;
use crate::spec::guest::GuestKind;
use std::time::Duration;

/// A measured cell.
#[derive(Debug, Clone, Default)]
pub(super) struct Measured {
    pub(super) value: Option<f64>,
    pub(super) unit: String,
    pub(super) metric: String,
    pub(super) cr3_per_call: Option<f64>,
    pub(super) cr3_source: &'static str,
    /// Kernel instructions per call (the plugin's: one call's own path;
    /// kvm_pvm's emulated instructions), where the backend counts them.
    pub(super) kernel_insns_per_call: Option<f64>,
    pub(super) backend: &'static str,
    /// What its times are on that backend (the backend's own word,
    /// [`backend_basis`]); `None` where no backend was tried.
    pub(super) time_basis: Option<TimeBasis>,
    pub(super) error: Option<(i32, String)>,
}

/// A per-call rate of a run: (metric name, source key, value).
pub(super) type Rate = (String, String, f64);

/// compare's options for a cell, as compare's own structs (its defaults
/// where the seed says nothing: the embedded guest's memory size, the
/// QEMU plugin on); `parse_side` and `preflight` make the checks.
pub(super) fn cell_options(
    cell: &Cell,
    backend: BackendName,
    timeout: Duration,
) -> (ExperimentOpts, TargetOpts) {
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
        on: BackendOpts::on(backend.as_str()),
    };
    (exp, target)
}

/// Why one run of a cell did not give figures: its exit code and message,
/// and whether it was the host's KVM refusing the guest before boot (then
/// the next backend is tried).
pub(super) struct CellError {
    pub(super) code: i32,
    pub(super) message: String,
    pub(super) host_kvm_refuses: bool,
}

impl CellError {
    pub(super) fn new(code: i32, message: String) -> Self {
        CellError {
            code,
            message,
            host_kvm_refuses: false,
        }
    }
}

/// The figures of one run of `cell` on `backend`.
pub(super) fn measure_on(
    cell: &Cell,
    opts: &str,
    backend: BackendName,
    timeout: Duration,
    backends: &Backends,
) -> Result<(Vec<Rate>, &'static str), CellError> {
    let (exp, target) = cell_options(cell, backend, timeout);
    let embedded = target.arch.unwrap_or(Arch::X86_64).embedded_image();
    let spec = parse_side(opts, &exp, &target, embedded)
        .map_err(|e| CellError::new(exit_code::USAGE, e.to_string()))?;
    let backend = backends
        .get(target.on.backend)
        .map_err(|e| CellError::new(e.exit_code(), e.to_string()))?;
    // The facts of the KVM the backend runs on (nested: its inner one).
    let facts = crate::cli::facts_for(&*backend, &spec.config)
        .map_err(|e| CellError::new(e.exit_code(), e.to_string()))?;
    let resolved = preflight(&spec.config, backend.target(), &facts).map_err(|e| CellError {
        code: e.exit_code(),
        message: e.to_string(),
        host_kvm_refuses: e.host_kvm_refuses(),
    })?;
    let (_, summary) = run_measured(&resolved, &*backend)
        .map_err(|e| CellError::new(e.exit_code(), e.to_string()))?;
    Ok((
        rates(&summary)
            .into_iter()
            .map(|(m, v)| (m.name, m.source.key().to_string(), v))
            .collect(),
        // Inside `--backend nested` this KVM is the nested kvm_amd.
        crate::spec::nested::reported_backend(crate::cli::host_facts().nested(), backend.name()),
    ))
}

/// Measures a cell `runs` times on `choice`'s backends ([`ReproduceBackend::tries`]).
pub(super) fn measure(
    cell: &Cell,
    runs: u32,
    timeout: Duration,
    choice: ReproduceBackend,
    backends: &Backends,
) -> Measured {
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
        let mut tried = BackendName::default();
        let mut r = Err(CellError::new(
            exit_code::INTERNAL,
            "no backend to measure on".to_owned(),
        ));
        for (i, &b) in tries.iter().enumerate() {
            tried = b;
            r = measure_on(cell, &opts, b, timeout, backends);
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
                time_basis = Some(backend_basis(tried, backends));
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
                    time_basis: (!tries.is_empty()).then(|| backend_basis(tried, backends)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::reproduce::cell::CellGuest;
    use crate::cli::reproduce::seeds::{cells, Seed};

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
            for backend in ["kvm", "qemu"].map(|b| BackendName::of(b).unwrap()) {
                let timeout = Duration::from_secs(7);
                let (exp, target) = cell_options(cell, backend, timeout);
                let mut argv: Vec<String> = vec!["ptiscope".into(), "compare".into()];
                argv.extend(
                    [
                        "--backend",
                        backend.as_str(),
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
                let Some(crate::cli::Command::Compare(parsed)) =
                    crate::cli::Cli::try_parse_from(&argv).unwrap().command
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
}
