//! The answer first: what isolation cost per call, in a few lines a kernel
//! engineer can paste into a mailing-list post, then a compact table of
//! every metric's mean with its 95 % confidence interval.
//!
//! ```text
//! pti=on - pti=off per getpid call (+ = more with pti=on; means of 5 + 5 runs, 95 % CI):
//!   [host-clock] time                 +35835.89 ns  (+46.4 %)   CI [+23233.95, +48437.83]  mmtests: significant; Welch p 0.0004
//!   [guest]      CR3 writes                     +2  0 -> 2      exact in every run         exact, differ
//! ```
//!
//! One sign convention everywhere: a difference is compare minus baseline,
//! so `+` means the compare side (with PTI) spends more. The mmtests table,
//! with its own convention (negative = worse), is behind `--mmtests`.

use serde::Serialize;

use super::compare::{CompareTable, MetricComparison};
use super::metric::Source;
use super::stats::{self, Verdict};

/// The headline metrics, in the order shown, with their names for people.
/// The first time metric present is the one shown (one view of one time).
const HEADLINE: [(&str, &str); 8] = [
    ("ns_per_call", "time"),
    ("cycles_per_call", "time"),
    ("cr3_writes_per_call", "CR3 writes"),
    ("insn_mov_cr3_per_call", "MOV CR3 executed"),
    ("tlb_flush_per_call", "TLB flushes"),
    ("tlb_flushes_full_per_call", "TLB flushes"),
    ("kernel_instructions_per_call", "kernel instructions"),
    ("kvm_exits_per_call", "VM exits"),
];

/// Metrics that are another view of the time the default screen shows once.
pub const OTHER_TIME_VIEWS: [&str; 3] = ["ns_per_call", "tsc_per_call", "cycles_per_call"];

/// One line of the answer: a metric's difference, compare minus baseline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AnswerLine {
    /// The metric's name (as in `metrics[]`).
    pub metric: String,
    /// What it is, for people (`time`, `CR3 writes`, ...).
    pub what: String,
    /// Where the figure came from (`kvm`, `vmm`, `host_clock`, `guest`).
    pub source: &'static str,
    /// The metric's unit.
    pub unit: String,
    /// The baseline's mean.
    pub baseline: f64,
    /// The compare side's mean.
    pub compare: f64,
    /// `compare - baseline`: positive = more with the compare configuration.
    pub delta: f64,
    /// `delta` in % of the baseline's mean; `None` when the baseline is 0.
    pub delta_pct: Option<f64>,
    /// The 95 % confidence interval of `delta` (Welch: Student's t with the
    /// Welch–Satterthwaite degrees of freedom); `None` when both sides are
    /// exact (no spread: the difference is exact) or a side has one run.
    pub delta_ci95: Option<[f64; 2]>,
    /// Both sides had the same value in every run.
    pub exact: bool,
    /// The verdict (mmtests' rule, or exactness).
    pub verdict: Verdict,
    /// Welch's two-sided p-value, where defined.
    pub welch_p: Option<f64>,
}

/// The 95 % CI of the difference of two samples' means (Welch).
pub fn delta_ci95(baseline: &[f64], compare: &[f64]) -> Option<[f64; 2]> {
    let w = stats::welch_t_test(baseline, compare)?;
    let (nb, nc) = (baseline.len() as f64, compare.len() as f64);
    let se = (stats::sample_stddev(baseline)?.powi(2) / nb
        + stats::sample_stddev(compare)?.powi(2) / nc)
        .sqrt();
    let t = stats::t_quantile(0.975, w.df)?;
    let d = stats::amean(compare)? - stats::amean(baseline)?;
    Some([d - t * se, d + t * se])
}

fn line(m: &MetricComparison, what: &str) -> AnswerLine {
    let sig = m
        .significance
        .unwrap_or_else(|| stats::significance(&m.baseline.samples, &m.compare.samples));
    let exact = matches!(sig.verdict, Verdict::ExactEqual | Verdict::ExactDifferent);
    AnswerLine {
        metric: m.metric.name.clone(),
        what: what.to_owned(),
        source: m.metric.source.key(),
        unit: m.metric.unit.clone(),
        baseline: m.baseline.amean,
        compare: m.compare.amean,
        delta: m.compare.amean - m.baseline.amean,
        delta_pct: m.delta_pct.amean,
        delta_ci95: if exact {
            None
        } else {
            delta_ci95(&m.baseline.samples, &m.compare.samples)
        },
        exact,
        verdict: sig.verdict,
        welch_p: sig.welch.map(|w| w.p_value),
    }
}

/// The answer's lines: the headline metrics the table has, one time metric.
pub fn answer(t: &CompareTable) -> Vec<AnswerLine> {
    let mut out: Vec<AnswerLine> = Vec::new();
    for (name, what) in HEADLINE {
        if out.iter().any(|l| l.what == what) {
            continue;
        }
        if let Some(m) = t.metric(name) {
            // A counter that is zero on both sides in every run says nothing here.
            if what != "time" && m.baseline.amean == 0.0 && m.compare.amean == 0.0 {
                continue;
            }
            out.push(line(m, what));
        }
    }
    out
}

fn source_tag(key: &str) -> &'static str {
    Source::ALL
        .into_iter()
        .find(|s| s.key() == key)
        .map_or("?", Source::tag)
}

/// A figure with two decimals, or none when it is a whole number.
fn num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn signed(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:+.0}")
    } else {
        format!("{v:+.2}")
    }
}

/// The verdict, naming its rule: mmtests' (|difference| > both sides'
/// qnorm(0.975) x stddev summed) with Welch's p beside it, or exactness.
fn verdict_text(v: Verdict, p: Option<f64>) -> String {
    match (v, p) {
        (Verdict::Significant | Verdict::NotSignificant, Some(p)) => {
            format!(
                "mmtests: {}; Welch p {}",
                v.word(),
                super::compare::p_text(p)
            )
        }
        (Verdict::Significant | Verdict::NotSignificant, None) => {
            format!("mmtests: {}", v.word())
        }
        _ => v.word().to_owned(),
    }
}

/// Where each source's figures come from, in a few words.
fn source_words(s: Source) -> &'static str {
    match s {
        Source::Kvm => "KVM's stats fd",
        Source::Vmm => "counted by the VMM",
        Source::HostClock => "host monotonic clock",
        Source::Guest => "guest telemetry page (guest-reported)",
        Source::QemuPlugin => "QEMU TCG plugin (host-observed instrumentation)",
    }
}

/// The answer block: a heading with the sign convention, then one line per
/// headline metric: `[source] what  difference (% of baseline)  CI  verdict`.
/// `per` names what a rate is per (`getpid call`, `message`).
pub fn render_answer(t: &CompareTable, per: &str) -> String {
    let lines = answer(t);
    let (b, c) = (&t.baseline.label, &t.compare.label);
    let n = |m: &MetricComparison| (m.baseline.n(), m.compare.n());
    let (nb, nc) = t.metrics.first().map_or((0, 0), n);
    let mut out =
        format!("{c} - {b} per {per} (+ = more with {c}; means of {nb} + {nc} runs, 95 % CI):\n");
    let tag_w = lines
        .iter()
        .map(|l| source_tag(l.source).len() + 2)
        .max()
        .unwrap_or(0);
    let what_w = lines.iter().map(|l| l.what.len()).max().unwrap_or(0);
    for l in &lines {
        let unit = l.unit.split('/').next().unwrap_or("");
        // Counts read as a plain number; a time keeps its unit.
        let unit = if unit == "count" {
            String::new()
        } else {
            format!(" {unit}")
        };
        let diff = format!("{}{unit}", signed(l.delta));
        let (pct, ci) = if l.exact {
            (
                format!("{} -> {}", num(l.baseline), num(l.compare)),
                "exact in every run".to_owned(),
            )
        } else {
            (
                l.delta_pct.map_or_else(
                    || format!("{} -> {}", num(l.baseline), num(l.compare)),
                    |p| format!("({p:+.1} %)"),
                ),
                l.delta_ci95.map_or_else(
                    || "no CI (1 run)".to_owned(),
                    |[lo, hi]| format!("CI [{}, {}]", signed(lo), signed(hi)),
                ),
            )
        };
        out.push_str(&format!(
            "  {:<tag_w$} {:<what_w$} {diff:>13}  {pct:<11} {ci:<26} {}\n",
            format!("[{}]", source_tag(l.source)),
            l.what,
            verdict_text(l.verdict, l.welch_p),
        ));
    }
    out
}

/// Whether the default table leaves metric `name` out: the other views of
/// the one time the table shows, and metrics zero in every run.
fn left_out(t: &CompareTable, m: &MetricComparison) -> bool {
    let time_shown = OTHER_TIME_VIEWS.into_iter().find(|n| t.metric(n).is_some());
    let zero = m
        .baseline
        .samples
        .iter()
        .chain(&m.compare.samples)
        .all(|&v| v == 0.0);
    zero || (OTHER_TIME_VIEWS.contains(&m.metric.name.as_str())
        && Some(m.metric.name.as_str()) != time_shown)
}

/// The compact table: per metric its source, each side's mean with its
/// 95 % CI (or `exact` when every run had the same value) and the verdict;
/// then one line naming what was left out (all of it is in --json/--csv and
/// behind --mmtests).
pub fn render_table(t: &CompareTable) -> String {
    let shown: Vec<&MetricComparison> = t.metrics.iter().filter(|m| !left_out(t, m)).collect();
    let name_w = shown
        .iter()
        .map(|m| m.metric.name.len() + source_tag(m.metric.source.key()).len() + 3)
        .max()
        .unwrap_or(0)
        .max(20);
    let cell = |s: &stats::Summary| match s.ci95 {
        Some(ci) if ci.half_width == 0.0 => format!("{:>12}   exact    ", num(s.amean)),
        Some(ci) => format!("{:>12.2} ± {:<9.2}", s.amean, ci.half_width),
        None => format!("{:>12.2}   (1 run)  ", s.amean),
    };
    let mut out = format!(
        "{:<name_w$} {:>12}{:12} {:>12}{:12} {}\n",
        "mean per call, 95 % CI", t.baseline.label, "", t.compare.label, "", "verdict"
    );
    for m in &shown {
        let sig = m
            .significance
            .unwrap_or_else(|| stats::significance(&m.baseline.samples, &m.compare.samples));
        let both_exact = matches!(sig.verdict, Verdict::ExactEqual | Verdict::ExactDifferent);
        let (bc, cc) = if both_exact {
            // Shown once as exact: the verdict says it.
            (
                format!("{:>12}{:12}", num(m.baseline.amean), ""),
                format!("{:>12}{:12}", num(m.compare.amean), ""),
            )
        } else {
            (cell(&m.baseline), cell(&m.compare))
        };
        out.push_str(&format!(
            "{:<name_w$} {bc} {cc} {}\n",
            format!("[{}] {}", m.metric.source.tag(), m.metric.name),
            verdict_text(sig.verdict, sig.welch.map(|w| w.p_value)),
        ));
    }
    let time: Vec<&str> = t
        .metrics
        .iter()
        .filter(|m| {
            OTHER_TIME_VIEWS.contains(&m.metric.name.as_str())
                && !shown.iter().any(|s| s.metric.name == m.metric.name)
        })
        .map(|m| m.metric.name.as_str())
        .collect();
    let zero = t.metrics.len() - shown.len() - time.len();
    let mut also = Vec::new();
    if !time.is_empty() {
        also.push(format!(
            "{} (the same time) in --mmtests, --json, --csv",
            time.join(", ")
        ));
    }
    if zero > 0 {
        also.push(format!("{zero} more, zero in every run, in --json, --csv"));
    }
    if !also.is_empty() {
        out.push_str(&format!("also: {}\n", also.join("; ")));
    }
    let used: Vec<String> = Source::ALL
        .into_iter()
        .filter(|s| t.metrics.iter().any(|m| m.metric.source == *s))
        .map(|s| format!("[{}] {}", s.tag(), source_words(s)))
        .collect();
    out.push_str(&format!("sources: {}\n", used.join(", ")));
    out
}

/// The answer as JSON (the compare document's `answer` array).
pub fn to_json(t: &CompareTable) -> serde_json::Value {
    serde_json::to_value(answer(t)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::compare::Side;
    use crate::report::Metric;

    fn side(label: &str) -> Side {
        Side {
            label: label.into(),
            config: vec![label.into()],
        }
    }

    fn table() -> CompareTable {
        let mut t = CompareTable::new(side("pti=off"), side("pti=on"));
        t.add(
            Metric::new("ns_per_call", "ns/call", Source::HostClock),
            &[30.1, 29.5, 31.2, 30.8, 29.9],
            &[40.6, 41.0, 40.2, 41.9, 40.4],
        )
        .unwrap();
        t.add(
            Metric::new("cycles_per_call", "cycles/call", Source::Guest),
            &[80.0, 81.0, 82.0, 80.0, 81.0],
            &[100.0, 101.0, 102.0, 100.0, 101.0],
        )
        .unwrap();
        t.add(
            Metric::new("cr3_writes_per_call", "count/call", Source::Guest),
            &[0.0; 5],
            &[2.0; 5],
        )
        .unwrap();
        t.add(
            Metric::new("invlpg_per_call", "count/call", Source::Guest),
            &[0.0; 5],
            &[0.0; 5],
        )
        .unwrap();
        t
    }

    #[test]
    fn the_difference_has_one_sign_and_a_welch_interval() {
        let t = table();
        let a = answer(&t);
        // One time metric; the all-zero counter is left out.
        let names: Vec<&str> = a.iter().map(|l| l.metric.as_str()).collect();
        assert_eq!(names, ["ns_per_call", "cr3_writes_per_call"]);
        let ns = &a[0];
        // 40.82 - 30.30 = +10.52: positive = more with the compare side.
        assert!((ns.delta - 10.52).abs() < 1e-9, "{ns:?}");
        // Welch: df 7.995, t(0.975, df) 2.30625, se 0.43058 (computed
        // apart from this code, by numerical integration of Student's t).
        let [lo, hi] = ns.delta_ci95.unwrap();
        assert!(
            (lo - 9.526_972).abs() < 1e-5 && (hi - 11.513_028).abs() < 1e-5,
            "{lo} {hi}"
        );
        let cr3 = &a[1];
        assert!(cr3.exact && cr3.delta_ci95.is_none());
        assert_eq!(cr3.verdict, Verdict::ExactDifferent);
        assert_eq!(cr3.delta, 2.0);
    }

    #[test]
    fn the_text_names_source_sign_ci_and_verdict() {
        let t = table();
        let text = render_answer(&t, "getpid call");
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("pti=on - pti=off per getpid call (+ = more with pti=on"));
        assert!(
            lines[1].trim_start().starts_with("[host-clock] time"),
            "{text}"
        );
        assert!(
            lines[1].contains("+10.52 ns") && lines[1].contains("(+34.7 %)"),
            "{text}"
        );
        assert!(
            lines[1].contains("CI [+") && lines[1].contains("mmtests: significant; Welch p"),
            "{text}"
        );
        assert!(
            lines[2].contains("[guest]") && lines[2].contains("+2 "),
            "{text}"
        );
        assert!(
            lines[2].contains("0 -> 2") && lines[2].ends_with("exact, differ"),
            "{text}"
        );
        let table = render_table(&t);
        // One time metric, the exact counter shown once, the zero one counted.
        let rows: Vec<&str> = table.lines().filter(|l| l.starts_with('[')).collect();
        assert_eq!(rows.len(), 2, "{table}");
        assert!(rows[0].contains("30.30 ± 0.86"), "{table}");
        assert!(
            !rows[1].contains('±') && rows[1].ends_with("exact, differ"),
            "{table}"
        );
        assert!(
            table.contains("cycles_per_call (the same time) in --mmtests, --json, --csv; 1 more"),
            "{table}"
        );
    }
}
