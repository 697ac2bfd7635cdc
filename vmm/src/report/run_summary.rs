//! The summary of one run: a perf-stat-like text block and a JSON document
//! (schema `ptiscope.run/2`, docs/report-json.md).
//!
//! ```text
//!  ptiscope run: pti=on workload=getpid iterations=1000
//!  phase workload, 1,000 calls
//!
//!            2,000      cr3_writes           #        2.000 /call        [guest]
//!            2,004      tlb_flush            #        2.004 /call        [kvm]
//!       29,123,456 ns   elapsed              #   29,123.456 ns/call      [host-clock]
//! ```
//! Every row names its source; cross-checks between a host-observed and a
//! guest-reported count of the same thing, and notes (e.g. "with EPT/NPT KVM
//! does not see guest CR3 writes"), follow the rows.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::metric::{Metric, Source};

/// Schema id written into the JSON; bump on incompatible changes.
pub const SCHEMA: &str = "ptiscope.run/2";

/// One figure of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRow {
    /// The figure's name, unit, source and direction.
    #[serde(flatten)]
    pub metric: Metric,
    /// Total over the phase, in `unit`.
    pub total: f64,
    /// `total / iterations`, in `unit` per iteration; `None` when the phase
    /// has no iterations (or the rate means nothing for this figure).
    pub per_iteration: Option<f64>,
}

/// Whether `unit` is a size rather than a count or a duration.
pub fn is_size(unit: &str) -> bool {
    matches!(unit, "B" | "bytes" | "KiB" | "MiB" | "GiB" | "pages")
}

impl RunRow {
    /// A row whose rate is `total / iterations` (none for 0 iterations).
    pub fn new(metric: Metric, total: f64, iterations: u64) -> Self {
        RunRow {
            metric,
            total,
            per_iteration: (iterations > 0).then(|| total / iterations as f64),
        }
    }
}

/// A host-observed count set against a guest-reported count of the same
/// thing, e.g. KVM `tlb_flush` (shadow paging) vs guest CR3 writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrossCheck {
    /// What both count, in words.
    pub what: String,
    /// Name of the host-side metric (e.g. `tlb_flush`).
    pub host_metric: String,
    /// Where the host count came from.
    pub host_source: Source,
    /// The host count.
    pub host_value: f64,
    /// Name of the guest-side counter (e.g. `cr3_writes`).
    pub guest_metric: String,
    /// The guest count.
    pub guest_value: f64,
    /// Largest relative difference, in % of the larger value, still called agreement.
    pub tolerance_pct: f64,
    /// An absolute excess of the host count over the guest's that is still
    /// agreement (KVM also flushes when the host preempts the vCPU: the
    /// allowance is KVM's own count of those, plus a few); 0 = none.
    #[serde(default)]
    pub host_excess_allowed: f64,
    /// `host_value - guest_value`.
    pub difference: f64,
    /// Whether the two agree within the tolerance.
    pub agrees: bool,
}

impl CrossCheck {
    /// Sets a host count (name, source, value) against a guest count (name,
    /// value); they agree within `tolerance_pct` % of the larger.
    pub fn new(
        what: impl Into<String>,
        (host_metric, host_source, host_value): (&str, Source, f64),
        (guest_metric, guest_value): (&str, f64),
        tolerance_pct: f64,
    ) -> Self {
        let difference = host_value - guest_value;
        let scale = host_value.abs().max(guest_value.abs());
        let agrees = difference == 0.0 || difference.abs() * 100.0 <= tolerance_pct * scale;
        CrossCheck {
            what: what.into(),
            host_metric: host_metric.to_owned(),
            host_source,
            host_value,
            guest_metric: guest_metric.to_owned(),
            guest_value,
            tolerance_pct,
            host_excess_allowed: 0.0,
            difference,
            agrees,
        }
    }

    /// Also calls it agreement when the host counts up to `excess` more
    /// than the guest (never fewer).
    pub fn allowing_host_excess(mut self, excess: f64) -> Self {
        self.host_excess_allowed = excess;
        self.agrees |= (0.0..=excess).contains(&self.difference);
        self
    }

    fn line(&self) -> String {
        let verdict = if self.agrees {
            "agree".to_owned()
        } else {
            format!("DISAGREE by {}", group(self.difference))
        };
        format!(
            "{}: {} [{}] {} vs {} [guest] {}: {} (tolerance {}%{})",
            self.what,
            self.host_metric,
            self.host_source.tag(),
            group(self.host_value),
            self.guest_metric,
            group(self.guest_value),
            verdict,
            self.tolerance_pct,
            if self.host_excess_allowed > 0.0 {
                // Counts are whole: an allowance of 57.02 admits 57.
                format!(
                    " or up to {} more on the host",
                    self.host_excess_allowed.floor()
                )
            } else {
                String::new()
            }
        )
    }
}

/// One run, ready to render.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// Always [`SCHEMA`] for summaries this version writes.
    pub schema: String,
    /// The configuration as `key=value` options (`pti=on`, `workload=getpid`, ...).
    pub config: Vec<String>,
    /// The measured phase (e.g. `workload`), if the figures are per phase.
    pub phase: Option<String>,
    /// Iterations of the measured loop (the divisor of every rate).
    pub iterations: u64,
    /// What one iteration is called in rates (`call`).
    pub iteration_name: String,
    /// The figures, in display order.
    pub rows: Vec<RunRow>,
    /// Host counts set against guest counts of the same thing.
    pub cross_checks: Vec<CrossCheck>,
    /// Caveats the reader must see (unavailable sources, invalid
    /// telemetry, what the host cannot observe), as data; written each
    /// with its words (`text`).
    #[serde(serialize_with = "super::note::serialize_with_text")]
    pub notes: Vec<super::note::Note>,
    /// Why the guest's telemetry is invalid (bad magic, counters going
    /// backwards, unknown phase ids, a marker flood, ...); empty = valid.
    #[serde(default)]
    pub telemetry_problems: Vec<String>,
    /// Whether the guest's telemetry page was read and checked at all (not
    /// under `--backend qemu`, where the figures come from `@result` only).
    #[serde(default = "checked_by_default")]
    pub telemetry_checked: bool,
    /// Where the run came from (host, KVM, probe, build, image, options);
    /// set by `ptiscope run`, absent in documents from before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<super::environment::Environment>,
    /// Whether the guest initialised its telemetry page at all. A guest
    /// that never did (a foreign kernel, a crash in early boot) has no
    /// telemetry to call valid or invalid.
    #[serde(default = "checked_by_default")]
    pub telemetry_initialized: bool,
    /// `--by-symbol` (a Linux guest under the QEMU plugin): the phase's
    /// undisturbed calls' kernel instructions by kernel symbol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by_symbol: Option<super::by_symbol::BySymbol>,
    /// KVM's exits by reason over the same span as the rows (the phase, or
    /// the whole run), from its stats fds, summed over the vCPUs: the
    /// stats' own names (`io_exits`, `mmio_exits`, `halt_exits`,
    /// `irq_exits`, ...), each a subset of `kvm_exits`, and `other_exits`,
    /// the rest (`kvm_exits` minus them: exits no per-reason stat names).
    /// Empty where KVM did not observe the run (`--backend qemu`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kvm_exits_by_reason: BTreeMap<String, u64>,
    /// The VMM's userspace exits by kind over the whole run (port I/O per
    /// device, MMIO, HLT, shutdown, ...), as its status lines print them;
    /// `None` where the VMM did not run the guest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vmm_exits_by_kind: Option<crate::machine::exit::ExitCounts>,
    /// A Linux guest's CPU-bug mitigations as its kernel reported them
    /// (its vulnerabilities files, PTI's state, its command line); `None`
    /// for ptiscope's own guest, or an init that said nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_mitigations: Option<super::mitigations::GuestMitigations>,
    /// How the run ended: the VM's stop reason as data (`code` and its
    /// parameters), the vCPU that stopped it and the words; `None` in a
    /// summary that is not of one run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<super::end::RunEnd>,
    /// Why the run failed although its VM stopped as it did, where it did
    /// (a Linux guest's end: `cli::linux::diagnose`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<super::end::FailureData>,
    /// The exit code `ptiscope run` ends with (0: success); set by the
    /// command, `None` elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
}

fn checked_by_default() -> bool {
    true
}

impl RunSummary {
    /// An empty summary of `iterations` calls; telemetry counts as checked
    /// and valid until told otherwise.
    pub fn new(config: Vec<String>, phase: Option<String>, iterations: u64) -> Self {
        RunSummary {
            schema: SCHEMA.to_owned(),
            config,
            phase,
            iterations,
            iteration_name: "call".to_owned(),
            rows: Vec::new(),
            cross_checks: Vec::new(),
            notes: Vec::new(),
            telemetry_problems: Vec::new(),
            telemetry_checked: true,
            environment: None,
            telemetry_initialized: true,
            by_symbol: None,
            kvm_exits_by_reason: BTreeMap::new(),
            vmm_exits_by_kind: None,
            guest_mitigations: None,
            stop: None,
            failure: None,
            exit_code: None,
        }
    }

    /// Adds a row with its rate computed from `iterations`.
    pub fn push(&mut self, metric: Metric, total: f64) -> &mut Self {
        self.rows.push(RunRow::new(metric, total, self.iterations));
        self
    }

    /// The row of metric `name`.
    pub fn row(&self, name: &str) -> Option<&RunRow> {
        self.rows.iter().find(|r| r.metric.name == name)
    }

    /// The perf-stat-like text block.
    pub fn render_text(&self) -> String {
        let name_w = self
            .rows
            .iter()
            .map(|r| r.metric.name.len())
            .max()
            .unwrap_or(0)
            .max(10);
        let mut out = format!(" ptiscope run: {}\n", self.config.join(" "));
        if let Some(env) = &self.environment {
            out.push_str(&env.render_text());
        }
        match &self.phase {
            Some(p) => out.push_str(&format!(
                " phase {p}, {} {}s\n\n",
                group(self.iterations as f64),
                self.iteration_name
            )),
            None if self.iterations == 0 => {
                out.push_str(" whole run (no complete phase: totals only, no per-call rates)\n\n")
            }
            None => out.push_str(&format!(
                " whole run, {} {}s\n\n",
                group(self.iterations as f64),
                self.iteration_name
            )),
        }
        for r in &self.rows {
            // Counts carry no unit word; measured quantities do (ns, cycles).
            let unit = if r.metric.unit == "count" {
                ""
            } else {
                r.metric.unit.as_str()
            };
            // A size (the user copy's view of the kernel, in KiB) is the
            // same whatever the calls: no per-call column.
            let rate = match r.per_iteration {
                Some(v) if !is_size(&r.metric.unit) => {
                    format!("# {:>12} {}/{}", group3(v), unit, self.iteration_name)
                }
                _ => String::new(),
            };
            out.push_str(&format!(
                "  {:>16} {:<6} {:<name_w$}  {:<30} [{}]\n",
                group(r.total),
                unit,
                r.metric.name,
                rate,
                r.metric.source.tag()
            ));
        }
        if let Some(m) = &self.guest_mitigations {
            out.push_str(&format!(
                "\n guest mitigations (its kernel's vulnerabilities files): {}\n",
                m.compact()
            ));
        }
        if !self.kvm_exits_by_reason.is_empty() {
            let reasons: Vec<String> = self
                .kvm_exits_by_reason
                .iter()
                .map(|(k, v)| format!("{} {}", k.trim_end_matches("_exits"), group(*v as f64)))
                .collect();
            out.push_str(&format!(
                "\n KVM exits by reason [kvm]: {}\n",
                reasons.join(", ")
            ));
        }
        if !self.cross_checks.is_empty() {
            out.push_str("\n cross-checks (host-observed vs guest-reported):\n");
            for c in &self.cross_checks {
                out.push_str(&format!("   {}\n", c.line()));
            }
        }
        if !self.telemetry_checked {
            out.push_str(
                "\n guest telemetry page: not read (figures from the guest's @result line)\n",
            );
        } else if !self.telemetry_initialized && self.telemetry_problems.is_empty() {
            out.push_str("\n guest telemetry: none (the guest never initialised its page)\n");
        } else if self.telemetry_problems.is_empty() {
            out.push_str("\n guest telemetry: valid\n");
        } else {
            out.push_str("\n guest telemetry: INVALID\n");
            for p in &self.telemetry_problems {
                out.push_str(&format!("   - {p}\n"));
            }
        }
        if !self.notes.is_empty() {
            out.push_str("\n notes:\n");
            for n in &self.notes {
                out.push_str(&format!("   - {n}\n"));
            }
        }
        let used: Vec<Source> = Source::ALL
            .into_iter()
            .filter(|s| {
                self.rows.iter().any(|r| r.metric.source == *s)
                    || self.cross_checks.iter().any(|c| c.host_source == *s)
            })
            .collect();
        if !used.is_empty() {
            out.push_str("\n sources:\n");
            for s in used {
                out.push_str(&format!("   {:<10} {}\n", s.tag(), s.describe()));
            }
        }
        out
    }

    /// Whether the guest's telemetry passed every check.
    pub fn telemetry_valid(&self) -> bool {
        self.telemetry_problems.is_empty()
    }

    /// JSON (schema [`SCHEMA`]).
    pub fn to_json(&self) -> serde_json::Value {
        // Plain data with string keys: serialisation cannot fail; a
        // non-finite total (which callers should not produce) becomes null.
        let mut v = serde_json::to_value(self).unwrap_or(serde_json::Value::Null);
        if let Some(o) = v.as_object_mut() {
            // Derived, for readers that only want the verdict.
            let valid = if self.telemetry_checked && self.telemetry_initialized {
                serde_json::Value::Bool(self.telemetry_valid())
            } else {
                serde_json::Value::Null
            };
            o.insert("telemetry_valid".into(), valid);
        }
        v
    }

    /// Reads a summary back from its JSON form.
    pub fn from_json(v: serde_json::Value) -> Result<Self, serde_json::Error> {
        serde_json::from_value(v)
    }
}

/// `1234567` -> `1,234,567`; non-integers get three decimals.
fn group(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 9.0e15 {
        group_int(&format!("{}", v.abs() as u64), v < 0.0)
    } else {
        group3(v)
    }
}

/// Three decimals with a grouped integer part: `29123.4567` -> `29,123.457`.
fn group3(v: f64) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    let s = format!("{:.3}", v.abs());
    let (int, frac) = s.split_once('.').unwrap_or((&s, "000"));
    format!("{}.{frac}", group_int(int, v < 0.0))
}

fn group_int(digits: &str, negative: bool) -> String {
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if negative {
        out.insert(0, '-');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_excess_is_one_sided_and_bounded() {
        let c = |host: f64| {
            CrossCheck::new("x", ("tlb_flush", Source::Kvm, host), ("cr3", 1000.0), 1.0)
                .allowing_host_excess(64.0)
        };
        assert!(c(1000.0).agrees);
        assert!(c(1010.0).agrees, "within 1 %");
        assert!(c(1060.0).agrees, "within the allowed excess");
        assert!(!c(1070.0).agrees, "beyond both");
        assert!(!c(980.0).agrees, "the host never counts fewer beyond 1 %");
        assert!(c(1060.0).line().contains("or up to 64 more on the host"));
    }

    fn summary() -> RunSummary {
        let mut s = RunSummary::new(
            vec![
                "pti=on".into(),
                "workload=getpid".into(),
                "iterations=1000".into(),
            ],
            Some("workload".into()),
            1000,
        );
        s.push(Metric::new("cr3_writes", "count", Source::Guest), 2000.0)
            .push(Metric::new("tlb_flush", "count", Source::Kvm), 2004.0)
            .push(
                Metric::new("elapsed", "ns", Source::HostClock),
                29_123_456.0,
            );
        s.cross_checks.push(CrossCheck::new(
            "CR3 switches",
            ("tlb_flush", Source::Kvm, 2004.0),
            ("cr3_writes", 2000.0),
            1.0,
        ));
        s.notes
            .push(crate::report::note::Note::KvmStatsUnavailable {
                error: "EACCES".into(),
            });
        s
    }

    #[test]
    fn rates_and_text() {
        let s = summary();
        assert_eq!(s.row("cr3_writes").unwrap().per_iteration, Some(2.0));
        let text = s.render_text();
        assert!(text.contains(" ptiscope run: pti=on workload=getpid iterations=1000\n"));
        assert!(text.contains(" phase workload, 1,000 calls\n"));
        let line = text.lines().find(|l| l.contains(" elapsed ")).unwrap();
        assert!(line.contains("29,123,456 ns"), "{line}");
        assert!(line.contains("29,123.456 ns/call"), "{line}");
        assert!(line.ends_with("[host-clock]"), "{line}");
        let cr3 = text.lines().find(|l| l.contains(" cr3_writes ")).unwrap();
        assert!(
            cr3.contains("2.000 /call") && cr3.ends_with("[guest]"),
            "{cr3}"
        );
        // 4 of 2004 = 0.2 % <= 1 %: agree.
        assert!(
            text.contains("CR3 switches: tlb_flush [kvm] 2,004 vs cr3_writes [guest] 2,000: agree")
        );
        assert!(text.contains("   - KVM stats fd not available: EACCES\n"));
        assert!(text.contains("host-clock host-observed, host monotonic clock"));
    }

    #[test]
    fn zero_iterations_have_no_rate() {
        let mut s = RunSummary::new(vec![], None, 0);
        s.push(Metric::new("cr3_writes", "count", Source::Guest), 3.0);
        assert_eq!(s.rows[0].per_iteration, None);
        assert!(!s.render_text().contains('#'));
    }

    #[test]
    fn cross_check_disagreement() {
        let c = CrossCheck::new(
            "x",
            ("tlb_flush", Source::Kvm, 10.0),
            ("cr3_writes", 2000.0),
            1.0,
        );
        assert!(!c.agrees);
        assert_eq!(c.difference, -1990.0);
        assert!(c.line().contains("DISAGREE by -1,990"));
        let zero = CrossCheck::new("x", ("a", Source::Kvm, 0.0), ("b", 0.0), 0.0);
        assert!(zero.agrees);
    }

    #[test]
    fn json_round_trip() {
        let s = summary();
        let v = s.to_json();
        assert_eq!(v["schema"], SCHEMA);
        assert_eq!(v["rows"][2]["name"], "elapsed");
        assert_eq!(v["rows"][2]["unit"], "ns");
        assert_eq!(v["rows"][2]["source"], "host_clock");
        assert_eq!(v["rows"][0]["per_iteration"], 2.0);
        assert_eq!(v["cross_checks"][0]["agrees"], true);
        assert_eq!(v["notes"][0]["code"], "kvm_stats_unavailable");
        assert_eq!(v["notes"][0]["text"], "KVM stats fd not available: EACCES");
        let text = serde_json::to_string_pretty(&v).unwrap();
        let back = RunSummary::from_json(serde_json::from_str(&text).unwrap()).unwrap();
        assert!(crate::report::json_approx_eq(&back.to_json(), &v));
        assert_eq!(RunSummary::from_json(v).unwrap(), s);
    }

    #[test]
    fn number_grouping() {
        assert_eq!(group(0.0), "0");
        assert_eq!(group(999.0), "999");
        assert_eq!(group(1000.0), "1,000");
        assert_eq!(group(-1_234_567.0), "-1,234,567");
        assert_eq!(group(2.5), "2.500");
        assert_eq!(group3(1234.5678), "1,234.568");
        assert_eq!(group3(-0.5), "-0.500");
    }
}
