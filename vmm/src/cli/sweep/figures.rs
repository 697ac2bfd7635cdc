//! What a sweep keeps of each run, how a (cell, configuration) run is
//! settled, the refill verdict, and the partial marker.

use crate::backend::Backend;
use crate::cli::compare::rates;
use crate::preflight::{preflight_with_image, PreflightError};
use crate::report::sweep as rs;
use crate::report::RunSummary;
use crate::spec::ResolvedRun;
use ptiscope_abi::options::Workload;

use super::plan::CellPlan;

/// The probe's refill verdict, as the sweep report carries it. Under QEMU
/// the KVM probe says nothing about TCG (whose soft TLB is flushed whole on
/// every CR3 write).
pub(super) fn refill_visibility(
    backend: &dyn Backend,
    facts: &crate::probe::host::HostFacts,
) -> rs::RefillVisibility {
    use crate::probe::RefillVerdict;
    if let Some(reason) = backend.profile().refill_unprobed {
        return rs::RefillVisibility::Unknown {
            reason: reason.into(),
        };
    }
    let p = facts.cr3_write_refill().clone();
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

pub(super) fn describe_refill(v: &rs::RefillVisibility) -> String {
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
        rs::RefillVisibility::Disputed {
            probe_ns_per_page,
            direct_cycles_per_page,
            ..
        } => format!(
            "disputed: the probe saw {} ns/page, this sweep's own reads {direct_cycles_per_page:.2} \
             cycles/page more with PTI",
            ns(probe_ns_per_page)
        ),
        rs::RefillVisibility::Unknown { reason } => format!("unknown ({reason})"),
    }
}

/// Settles one (cell, configuration) run when it is needed: the
/// configuration's options plus the cell's guest words, through preflight,
/// with the image read once and shared (`Arc`) by every configuration,
/// cell and run.
pub(super) struct Preparer {
    pub sides: Vec<crate::cli::compare::SideSpec>,
    /// The image, read by the first run settled: every configuration boots
    /// the same `--kernel` (or embedded guest).
    pub image: Option<std::sync::Arc<[u8]>>,
    pub workload: Workload,
    pub cpus: u32,
    /// `--iterations`: a cell that reads more runs fewer ([`CellPlan::iterations`]).
    pub iterations: u64,
    pub target: crate::spec::Target,
    /// The facts of the KVM the runs run on (the backend's own, or this host's).
    pub facts: std::sync::Arc<crate::probe::host::HostFacts>,
}

impl Preparer {
    pub(super) fn prepare(
        &mut self,
        k: usize,
        cell: &CellPlan,
    ) -> Result<ResolvedRun, PreflightError> {
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
        let resolved = preflight_with_image(&config, self.target, &self.facts, self.image.clone())?;
        if self.image.is_none() {
            self.image = Some(resolved.boot.image.clone());
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
pub(super) struct RunFigures {
    /// The time metric per call.
    pub time: Option<f64>,
    /// [`RATE_NAMES`], each if the run has it.
    pub rates: [Option<f64>; RATE_NAMES.len()],
}

impl RunFigures {
    pub(super) fn of(s: &RunSummary, time_metric: &str) -> Self {
        let all = rates(s);
        let find = |name: &str| all.iter().find(|(m, _)| m.name == name).map(|(_, v)| *v);
        RunFigures {
            time: find(time_metric),
            rates: RATE_NAMES.map(find),
        }
    }
}

/// The median of rate `i` over runs, if every run has it.
pub(super) fn median_rate(runs: &[RunFigures], i: usize) -> Option<f64> {
    let v: Option<Vec<f64>> = runs.iter().map(|f| f.rates[i]).collect();
    v.filter(|v| !v.is_empty()).map(|v| rs::median(&v))
}

/// Half the range (max - min) of rate `i` over runs, if two or more runs have it.
pub(super) fn half_range(runs: &[RunFigures], i: usize) -> Option<f64> {
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
pub(super) struct Partial {
    pub reason: String,
    /// The run that failed, where one did (not a signal between runs, nor
    /// a configuration refused), with how it ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<crate::report::end::FailedRun>,
    pub runs_done: u64,
    pub runs_planned: u64,
    pub cells_reported: usize,
    pub cells_planned: usize,
}

impl Partial {
    pub(super) fn banner(&self) -> String {
        format!(
            "PARTIAL: {}; {} of {} runs done, {} of {} cells reported (those every configuration ran in)",
            self.reason, self.runs_done, self.runs_planned, self.cells_reported, self.cells_planned
        )
    }
}

/// The JSON document with a `partial` object when the sweep stopped early.
pub(super) fn partial_json(doc: String, partial: Option<&Partial>) -> String {
    let Some(p) = partial else { return doc };
    match serde_json::from_str::<serde_json::Value>(&doc) {
        Ok(serde_json::Value::Object(mut m)) => {
            m.insert("partial".into(), serde_json::json!(p));
            serde_json::to_string_pretty(&m).unwrap_or(doc)
        }
        _ => doc,
    }
}
