//! The ledger's figures: one boot's per-call counts ([`Measure`], from its
//! run summary), and a block's rows (default minus that mitigation off),
//! the all-off total and how the rows add up to it.

use std::collections::BTreeMap;

use serde::Serialize;

use super::plan::{PlannedRow, RowPlan};
use crate::report::mitigations::GuestMitigations;
use crate::report::RunSummary;

/// The special instructions the ledger shows, as (column, the run's row
/// of their executions in the undisturbed calls, the row of all of them
/// in the phase).
pub const SPECIALS: [(&str, &str, &str); 6] = [
    ("mov_cr3", "insn_mov_cr3_calls", "insn_mov_cr3"),
    ("verw", "insn_verw_calls", "insn_verw"),
    ("lfence", "insn_lfence_calls", "insn_lfence"),
    ("wrmsr", "insn_wrmsr_calls", "insn_wrmsr"),
    (
        "wrmsr_spec_ctrl",
        "insn_wrmsr_spec_ctrl_calls",
        "insn_wrmsr_spec_ctrl",
    ),
    (
        "wrmsr_pred_cmd",
        "insn_wrmsr_pred_cmd_calls",
        "insn_wrmsr_pred_cmd",
    ),
];

/// The special figures of a boot on ptiscope's VMM (`--backend kvm`,
/// and `nested` inside its inner Linux), as (column, the run's row):
/// KVM's exits, the guest's CR3 writes KVM saw (shadow paging only; a
/// run under nested paging has no such row), the VMM's own exits.
pub const KVM_SPECIALS: [(&str, &str); 3] = [
    ("kvm_exits", "kvm_exits"),
    ("cr3_writes", "cr3_writes"),
    ("vmm_exits", "vmm_exits"),
];

/// Every special column, TCG's then KVM's (the CSV has them all).
pub fn special_columns() -> impl Iterator<Item = &'static str> {
    SPECIALS
        .iter()
        .map(|(c, _, _)| *c)
        .chain(KVM_SPECIALS.iter().map(|(c, _)| *c))
}

/// What a boot's main figure is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Figure {
    /// Kernel instructions (QEMU TCG and the plugin).
    KernelInstructions,
    /// Host-clock nanoseconds over the phase (ptiscope's VMM on a KVM:
    /// hardware time on a hardware KVM, QEMU's emulated time under
    /// `--backend nested`, the emulator's on kvm_pvm).
    HostNs,
}

/// One boot's figures, per undisturbed system call (exact: the plugin's
/// counts over the calls of the phase during which no interrupt came).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measure {
    /// The calls the counts are over (messages, for a messaging workload).
    pub calls: u64,
    /// Whether the figures are exact: a system-call loop's undisturbed
    /// calls. A messaging workload's are its undisturbed system calls'
    /// kernel instructions (the reads and writes with the context switches
    /// inside them) over its messages: how often a reader blocks, so how
    /// many switches there are, depends on when the timer ticks, so they
    /// differ from boot to boot (the block's `noise` says by how much).
    pub exact: bool,
    /// What `kernel_instructions` or `host_ns` is the main figure.
    pub figure: Figure,
    /// Their kernel instructions, all together (0 on a KVM: not counted).
    pub kernel_instructions: u64,
    /// The phase's host-clock nanoseconds (a KVM backend only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_ns: Option<u64>,
    /// The special instructions in them, all together (by [`SPECIALS`]).
    pub specials: BTreeMap<String, u64>,
    /// Kernel instructions by symbol, all together.
    pub symbols: BTreeMap<String, u64>,
    /// What the kernel said of its mitigations in this boot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mitigations: Option<GuestMitigations>,
}

impl Measure {
    /// The figures of a run, or why there are none: per undisturbed call
    /// (`per_message` false), or the undisturbed calls' kernel
    /// instructions per message (interrupts, idle, kernel threads and the
    /// calls an interrupt disturbed left out: they depend on the host's
    /// speed, not on the workload).
    pub fn of(s: &RunSummary, per_message: bool) -> Result<Measure, String> {
        let total = |name: &str| {
            s.rows
                .iter()
                .find(|r| r.metric.name == name)
                .map(|r| r.total)
        };
        let kernel = total("kernel_instructions").ok_or_else(|| {
            let why = s.notes.iter().find(|n| n.is_plugin_gap()).map_or_else(
                || "the run has no kernel_instructions row".into(),
                |n| n.to_string(),
            );
            format!("no exact counts: {why}")
        })?;
        let apart = total("syscalls_set_apart").unwrap_or(0.0) as u64;
        let calls = if per_message {
            s.iterations
        } else {
            s.iterations.saturating_sub(apart)
        };
        if calls == 0 {
            return Err(format!(
                "no undisturbed call among the run's {} (every one was interrupted)",
                s.iterations
            ));
        }
        let specials = SPECIALS
            .iter()
            .map(|(col, calls_row, _)| ((*col).to_owned(), total(calls_row).unwrap_or(0.0) as u64))
            .collect();
        let symbols = s
            .by_symbol
            .as_ref()
            .map(|b| {
                b.symbols
                    .iter()
                    .map(|c| (c.symbol.clone(), c.instructions))
                    .collect()
            })
            .unwrap_or_default();
        Ok(Measure {
            calls,
            exact: !per_message,
            figure: Figure::KernelInstructions,
            host_ns: None,
            kernel_instructions: kernel as u64,
            specials,
            symbols,
            mitigations: s.guest_mitigations.clone(),
        })
    }

    /// The figures of a run on ptiscope's VMM: host-clock nanoseconds and
    /// KVM's exits over the phase, per call (or message). Never exact: the
    /// clock, and the exits of interrupts that came during the phase.
    pub fn of_kvm(s: &RunSummary) -> Result<Measure, String> {
        let total = |name: &str| {
            s.rows
                .iter()
                .find(|r| r.metric.name == name)
                .map(|r| r.total)
        };
        let ns = total("elapsed").ok_or("the run has no host-clock (elapsed) row")?;
        if s.iterations == 0 {
            return Err("the run made no calls".into());
        }
        let specials = KVM_SPECIALS
            .iter()
            .filter_map(|(col, row)| total(row).map(|v| ((*col).to_owned(), v as u64)))
            .collect();
        Ok(Measure {
            calls: s.iterations,
            exact: false,
            figure: Figure::HostNs,
            kernel_instructions: 0,
            host_ns: Some(ns as u64),
            specials,
            symbols: BTreeMap::new(),
            mitigations: s.guest_mitigations.clone(),
        })
    }

    /// The main figure per call: kernel instructions, or host-clock ns.
    pub fn per_call(&self) -> f64 {
        let v = match self.figure {
            Figure::KernelInstructions => self.kernel_instructions,
            Figure::HostNs => self.host_ns.unwrap_or(0),
        };
        v as f64 / self.calls as f64
    }

    /// The special columns this measure has, in column order.
    pub fn special_names(&self) -> Vec<&'static str> {
        special_columns()
            .filter(|c| self.specials.contains_key(*c))
            .collect()
    }

    /// Special instruction `col` per call.
    pub fn special_per_call(&self, col: &str) -> f64 {
        self.specials.get(col).copied().unwrap_or(0) as f64 / self.calls as f64
    }

    /// Symbol `name`'s instructions per call.
    pub fn symbol_per_call(&self, name: &str) -> f64 {
        self.symbols.get(name).copied().unwrap_or(0) as f64 / self.calls as f64
    }
}

/// What `with` costs over `without`, per call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Delta {
    /// Kernel instructions added per call.
    pub kernel_instructions: f64,
    /// Special instructions added per call, by [`SPECIALS`] column (only
    /// those that differ).
    pub specials: BTreeMap<String, f64>,
    /// The symbols whose instructions differ, most first (by size).
    pub symbols: Vec<(String, f64)>,
}

impl Delta {
    /// `with - without`.
    pub fn between(with: &Measure, without: &Measure) -> Delta {
        let specials = special_columns()
            .filter(|c| with.specials.contains_key(*c) || without.specials.contains_key(*c))
            .map(|c| {
                (
                    c.to_owned(),
                    with.special_per_call(c) - without.special_per_call(c),
                )
            })
            .filter(|(_, d)| d.abs() > 1e-9)
            .collect();
        let mut names: Vec<&String> = with.symbols.keys().chain(without.symbols.keys()).collect();
        names.sort();
        names.dedup();
        let mut symbols: Vec<(String, f64)> = names
            .into_iter()
            .map(|n| {
                (
                    n.clone(),
                    with.symbol_per_call(n) - without.symbol_per_call(n),
                )
            })
            .filter(|(_, d)| d.abs() > 1e-9)
            .collect();
        symbols.sort_by(|a, b| b.1.abs().total_cmp(&a.1.abs()).then(a.0.cmp(&b.0)));
        Delta {
            kernel_instructions: with.per_call() - without.per_call(),
            specials,
            symbols,
        }
    }

    /// Whether turning the mitigation off changed nothing measured.
    pub fn is_nothing(&self) -> bool {
        self.kernel_instructions.abs() < 1e-9 && self.specials.is_empty() && self.symbols.is_empty()
    }
}

/// One row's outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum RowOutcome {
    /// Measured: the default boot minus the boot with it off.
    Measured {
        /// What it costs.
        delta: Delta,
        /// The off boot's own figures.
        off: Measure,
    },
    /// Its parameter changed nothing in the counts.
    NoChange {
        /// The off boot's own figures.
        off: Measure,
    },
    /// The kernel does not run it on this CPU model.
    NotEnabled,
    /// The kernel has no vulnerabilities file for it.
    NoFile,
    /// Enabled, but not measured: `--mitigation` named others.
    NotMeasured,
    /// Its boot failed (why).
    Failed {
        /// The error.
        error: String,
    },
}

/// One row of a block.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// The mitigation's key.
    pub key: &'static str,
    /// Its label.
    pub label: &'static str,
    /// The parameters its boot added (`off_params`: `off` is the boot's
    /// figures, in the outcome).
    #[serde(rename = "off_params")]
    pub off: &'static str,
    /// Why it is a group, when it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_note: Option<&'static str>,
    /// Its files' texts in the default boot.
    pub states: Vec<(String, String)>,
    /// The outcome.
    #[serde(flatten)]
    pub outcome: RowOutcome,
}

impl Row {
    /// The row from its plan and the off boot (`None` when not booted).
    pub fn new(
        planned: &PlannedRow,
        default: &Measure,
        off: Option<Result<Measure, String>>,
    ) -> Row {
        let outcome = match (&planned.plan, off) {
            (RowPlan::NotEnabled, _) => RowOutcome::NotEnabled,
            (RowPlan::NoFile, _) => RowOutcome::NoFile,
            (RowPlan::Measure, None) => RowOutcome::NotMeasured,
            (RowPlan::Measure, Some(Err(error))) => RowOutcome::Failed { error },
            (RowPlan::Measure, Some(Ok(off))) => {
                let delta = Delta::between(default, &off);
                if delta.is_nothing() {
                    RowOutcome::NoChange { off }
                } else {
                    RowOutcome::Measured { delta, off }
                }
            }
        };
        Row {
            key: planned.mitigation.key,
            label: planned.mitigation.label,
            off: planned.mitigation.off,
            group_note: planned.mitigation.group_note,
            states: planned.states.clone(),
            outcome,
        }
    }

    /// Its kernel instructions per call (0 for a row that measured none).
    pub fn cost(&self) -> Option<f64> {
        match &self.outcome {
            RowOutcome::Measured { delta, .. } => Some(delta.kernel_instructions),
            RowOutcome::NoChange { .. } => Some(0.0),
            _ => None,
        }
    }
}

/// How the rows add up to the all-off total.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sum {
    /// The rows' costs summed (measured rows only).
    pub rows: f64,
    /// Default minus `mitigations=off`.
    pub total: f64,
    /// `total - rows`: positive where the mitigations together cost more
    /// than one at a time (or something the rows do not turn off, e.g. a
    /// mitigation the table lacks), negative where they share work.
    pub interaction: f64,
    /// Whether a row failed, so that the sum is incomplete.
    pub incomplete: bool,
    /// Symbols whose instructions more than one row removes (symbol, the
    /// rows' keys): where an interaction comes from, when it is sharing.
    pub shared: Vec<(String, Vec<&'static str>)>,
}

impl Sum {
    /// The sum of `rows` against `total`.
    pub fn of(rows: &[Row], total: f64) -> Sum {
        let sum: f64 = rows.iter().filter_map(Row::cost).sum();
        let mut by_symbol: BTreeMap<&str, Vec<&'static str>> = BTreeMap::new();
        for r in rows {
            // Only exact rows: a messaging workload's symbols all differ a
            // little from boot to boot, which is no sharing.
            if let RowOutcome::Measured { delta, off } = &r.outcome {
                if !off.exact {
                    continue;
                }
                for (s, _) in &delta.symbols {
                    by_symbol.entry(s.as_str()).or_default().push(r.key);
                }
            }
        }
        let shared = by_symbol
            .into_iter()
            .filter(|(_, keys)| keys.len() > 1)
            .map(|(s, keys)| (s.to_owned(), keys))
            .collect();
        Sum {
            shared,
            rows: sum,
            total,
            interaction: total - sum,
            incomplete: rows.iter().any(|r| {
                matches!(
                    r.outcome,
                    RowOutcome::Failed { .. } | RowOutcome::NotMeasured
                )
            }),
        }
    }

    /// Whether the rows add up to the total exactly.
    pub fn adds_up(&self) -> bool {
        self.interaction.abs() < 1e-9
    }
}

/// One (kernel, CPU model, workload) block.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Block {
    /// The kernel (`debian-amd64` or a path).
    pub kernel: String,
    /// Its release, as the boot said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
    /// QEMU's CPU model.
    pub cpu: String,
    /// The workload.
    pub workload: String,
    /// The default boot.
    pub default: Measure,
    /// The `mitigations=off` boot (why not, when it failed: `{"error": ...}`).
    #[serde(serialize_with = "measure_or_error")]
    pub all_off: Result<Measure, String>,
    /// The rows.
    pub rows: Vec<Row>,
    /// How they add up (when the all-off boot ran).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sum: Option<Sum>,
    /// Files the kernel mitigates that no row covers.
    pub uncovered: Vec<String>,
    /// A workload whose counts are not exact: how far a second default
    /// boot's kernel instructions per call were from the first's (the
    /// boot-to-boot spread; a row no larger than this is noise), or why
    /// there is no figure. `None` for an exact workload (no second boot).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "noise_or_error"
    )]
    pub noise: Option<Result<f64, String>>,
    /// The KVM the block ran on (`--backend kvm`), as the host describes it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kvm: Option<String>,
    /// Wall seconds of the block's boots, summed.
    pub boot_seconds: f64,
}

/// The spread, or `{"error": why}`.
fn noise_or_error<S: serde::Serializer>(
    r: &Option<Result<f64, String>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match r {
        Some(r) => value_or_error(r, s),
        None => s.serialize_none(),
    }
}

impl Block {
    /// Whether a row's cost is within the block's boot-to-boot spread (a
    /// workload that is not exact; never for an exact one).
    pub fn within_noise(&self, cost: f64) -> bool {
        matches!(&self.noise, Some(Ok(n)) if cost.abs() <= *n)
    }
}

/// A boot's figures, or `{"error": why}`.
fn measure_or_error<S: serde::Serializer>(
    r: &Result<Measure, String>,
    s: S,
) -> Result<S::Ok, S::Error> {
    value_or_error(r, s)
}

/// The value, or `{"error": why}`: one shape for every figure that may
/// have failed.
fn value_or_error<T: Serialize, S: serde::Serializer>(
    r: &Result<T, String>,
    s: S,
) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Failed<'a> {
        error: &'a str,
    }
    match r {
        Ok(v) => v.serialize(s),
        Err(e) => Failed { error: e }.serialize(s),
    }
}

/// A block that could not be measured at all (its default boot failed).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FailedBlock {
    /// The kernel.
    pub kernel: String,
    /// The CPU model.
    pub cpu: String,
    /// The workload.
    pub workload: String,
    /// Why.
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::super::plan::{plan, MITIGATIONS};
    use super::*;
    use crate::report::mitigations::Vulnerability;

    fn measure(insns_per_call: u64, cr3: u64, verw: u64, syms: &[(&str, u64)]) -> Measure {
        let calls = 1000;
        Measure {
            calls,
            exact: true,
            figure: Figure::KernelInstructions,
            host_ns: None,
            kernel_instructions: insns_per_call * calls,
            specials: [("mov_cr3", cr3), ("verw", verw)]
                .iter()
                .map(|(c, v)| ((*c).to_owned(), v * calls))
                .collect(),
            symbols: syms
                .iter()
                .map(|(s, v)| ((*s).to_owned(), v * calls))
                .collect(),
            mitigations: None,
        }
    }

    fn planned(key: &str, p: RowPlan) -> PlannedRow {
        PlannedRow {
            mitigation: MITIGATIONS.iter().find(|m| m.key == key).unwrap(),
            states: vec![],
            plan: p,
        }
    }

    #[test]
    fn a_row_is_the_default_minus_that_one_off() {
        let default = measure(
            348,
            2,
            1,
            &[("entry_SYSCALL_64", 30), ("its_return_thunk", 10)],
        );
        let pti_off = measure(
            340,
            0,
            1,
            &[("entry_SYSCALL_64", 26), ("its_return_thunk", 10)],
        );
        let row = Row::new(
            &planned("meltdown", RowPlan::Measure),
            &default,
            Some(Ok(pti_off)),
        );
        let RowOutcome::Measured { delta, .. } = &row.outcome else {
            panic!("{row:?}")
        };
        assert_eq!(delta.kernel_instructions, 8.0);
        assert_eq!(delta.specials.get("mov_cr3"), Some(&2.0));
        assert_eq!(delta.specials.get("verw"), None);
        assert_eq!(delta.symbols, [("entry_SYSCALL_64".to_owned(), 4.0)]);
        assert_eq!(row.cost(), Some(8.0));
    }

    #[test]
    fn not_enabled_is_not_zero_and_no_change_is_said() {
        let d = measure(329, 0, 0, &[]);
        let not = Row::new(&planned("retbleed", RowPlan::NotEnabled), &d, None);
        assert_eq!(not.outcome, RowOutcome::NotEnabled);
        assert_eq!(not.cost(), None);
        let same = Row::new(&planned("l1tf", RowPlan::Measure), &d, Some(Ok(d.clone())));
        assert!(matches!(same.outcome, RowOutcome::NoChange { .. }));
        assert_eq!(same.cost(), Some(0.0));
        let failed = Row::new(
            &planned("l1tf", RowPlan::Measure),
            &d,
            Some(Err("boom".into())),
        );
        assert_eq!(failed.cost(), None);
        assert!(Sum::of(&[failed], 0.0).incomplete);
    }

    #[test]
    fn rows_against_the_total() {
        let d = measure(350, 2, 1, &[]);
        let rows = vec![
            Row::new(
                &planned("meltdown", RowPlan::Measure),
                &d,
                Some(Ok(measure(342, 0, 1, &[]))),
            ),
            Row::new(
                &planned("verw", RowPlan::Measure),
                &d,
                Some(Ok(measure(349, 2, 0, &[]))),
            ),
            Row::new(&planned("retbleed", RowPlan::NotEnabled), &d, None),
        ];
        let s = Sum::of(&rows, 9.0);
        assert!(s.adds_up() && !s.incomplete, "{s:?}");
        assert!(s.shared.is_empty());
        // Two mitigations that share work: together they cost less than
        // the two rows; the interaction says by how much.
        let s = Sum::of(&rows, 7.0);
        assert!(!s.adds_up());
        assert_eq!(s.interaction, -2.0);
    }

    #[test]
    fn rows_that_remove_the_same_symbol_are_named() {
        // spectre_v2=off and indirect_target_selection=off both remove the
        // ITS return thunk: each row +10, together +10.
        let d = measure(340, 0, 0, &[("its_return_thunk", 10)]);
        let off = measure(330, 0, 0, &[]);
        let rows = vec![
            Row::new(
                &planned("spectre_v2", RowPlan::Measure),
                &d,
                Some(Ok(off.clone())),
            ),
            Row::new(
                &planned("indirect_target_selection", RowPlan::Measure),
                &d,
                Some(Ok(off)),
            ),
        ];
        let s = Sum::of(&rows, 10.0);
        assert_eq!(s.interaction, -10.0);
        assert_eq!(
            s.shared,
            [(
                "its_return_thunk".to_owned(),
                vec!["spectre_v2", "indirect_target_selection"]
            )]
        );
    }

    #[test]
    fn a_kvm_row_is_host_time_and_exits_per_call() {
        let kvm = |ns: u64, exits: u64, cr3: u64| Measure {
            calls: 1000,
            exact: false,
            figure: Figure::HostNs,
            kernel_instructions: 0,
            host_ns: Some(ns * 1000),
            specials: [("kvm_exits", exits), ("cr3_writes", cr3)]
                .iter()
                .map(|(c, v)| ((*c).to_owned(), v * 1000))
                .collect(),
            symbols: BTreeMap::new(),
            mitigations: None,
        };
        let (default, off) = (kvm(2500, 3, 2), kvm(2000, 1, 0));
        assert_eq!(default.per_call(), 2500.0);
        assert_eq!(default.special_names(), ["kvm_exits", "cr3_writes"]);
        let d = Delta::between(&default, &off);
        assert_eq!(d.kernel_instructions, 500.0);
        assert_eq!(d.specials.get("kvm_exits"), Some(&2.0));
        assert_eq!(d.specials.get("cr3_writes"), Some(&2.0));
        // TCG's columns are not the KVM's: none appears as a zero.
        assert!(!d.specials.contains_key("mov_cr3"));
    }

    #[test]
    fn a_plan_from_the_kernels_words_gives_rows_in_table_order() {
        let g = GuestMitigations {
            vulnerabilities: [
                ("meltdown", "Mitigation: PTI"),
                ("retbleed", "Not affected"),
            ]
            .iter()
            .map(|(n, s)| ((*n).to_owned(), Vulnerability::from_state(s)))
            .collect(),
            ..Default::default()
        };
        let p = plan(&g);
        assert_eq!(p[0].mitigation.key, "meltdown");
        assert_eq!(p[0].plan, RowPlan::Measure);
    }
}
