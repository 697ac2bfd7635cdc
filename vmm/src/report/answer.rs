//! The answer first: what isolation cost per call, in a few lines a kernel
//! engineer can paste into a mailing-list post, then a compact table of
//! every metric's mean with its 95 % confidence interval.
//!
//! ```text
//! pti=on - pti=off per getpid call (+ = more with pti=on; means of 5 + 5 runs, 95 % CI):
//!   [guest]      CR3 writes                   +2  0 -> 2      exact in every run         exact, differ
//!   [host-clock] time [kvm_pvm emulated] +35835.89 ns  (+46.4 %)   CI [+23233.95, +48437.83]  significant, p 0.0004
//!   time here: kvm_pvm: guest kernel code emulated; not what hardware would take, so the counts lead
//! ```
//!
//! One verdict per line (Welch's test at 95 %, whose p and CI are the ones
//! printed beside it; or exactness, with neither); counts compared as
//! integers; every time labelled with what it is on this backend
//! ([`TimeBasis`]).
//!
//! One sign convention everywhere: a difference is compare minus baseline,
//! so `+` means the compare side (with PTI) spends more. The mmtests table,
//! with its own convention (negative = worse), is behind `--mmtests`.

use serde::Serialize;

use super::compare::{fig, fig_signed, CompareTable, MetricComparison};
use super::metric::Source;
use super::stats::{self, Rule, Verdict};
use super::time_basis::{is_time, TimeBasis};

/// The headline metrics, in the order shown, with their names for people.
/// The first time metric present is the one shown (one view of one time),
/// and of the plugin's CR3 counts the calls' own (exact in every run) before
/// the phase's (interrupts' included).
const HEADLINE: [(&str, &str); 9] = [
    ("ns_per_call", "time"),
    ("cycles_per_call", "time"),
    ("cr3_writes_per_call", "CR3 writes"),
    ("insn_mov_cr3_calls_per_call", "MOV CR3 executed"),
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
    /// `delta` in % of the baseline's mean; `None` when the baseline is 0
    /// or is near zero (below 0.05: a percentage of a near-zero rate says
    /// nothing; [`stats::NEAR_ZERO`]).
    pub delta_pct: Option<f64>,
    /// The 95 % confidence interval of `delta` (Welch: Student's t with the
    /// Welch–Satterthwaite degrees of freedom); `None` when both sides are
    /// exact (no spread: the difference is exact) or a side has one run.
    /// It excludes 0 exactly when the verdict is `significant`.
    pub delta_ci95: Option<[f64; 2]>,
    /// Both sides had the same value in every run (counts: the same
    /// integer rate, compared as integers).
    pub exact: bool,
    /// The one verdict: exactness, or Welch's test at 95 %.
    pub verdict: Verdict,
    /// How the verdict was reached (`exact`, `welch95`, `none`).
    pub rule: Option<Rule>,
    /// Welch's two-sided p-value, where defined (never for exact sides).
    pub welch_p: Option<f64>,
    /// For a count: how many runs of each side (baseline, compare) differ
    /// from that side's most common value; `None` for a measured quantity.
    pub runs_differing: Option<[usize; 2]>,
    /// For a time: what it measures on this backend (`hardware`,
    /// `kvm_pvm`, `qemu_tcg`, `unknown`); `None` for a count.
    pub time_basis: Option<&'static str>,
}

/// The 95 % CI of the difference of two samples' means (Welch).
pub fn delta_ci95(baseline: &[f64], compare: &[f64]) -> Option<[f64; 2]> {
    stats::welch_t_test(baseline, compare)?.delta_ci95
}

fn line(m: &MetricComparison, what: &str, basis: TimeBasis) -> AnswerLine {
    let sig = m
        .significance
        .unwrap_or_else(|| stats::significance_of(&m.baseline, &m.compare));
    let exact = matches!(sig.verdict, Verdict::ExactEqual | Verdict::ExactDifferent);
    let runs_differing = match (m.baseline.runs_differing(), m.compare.runs_differing()) {
        (Some(b), Some(c)) => Some([b, c]),
        _ => None,
    };
    AnswerLine {
        metric: m.metric.name.clone(),
        what: what.to_owned(),
        source: m.metric.source.key(),
        unit: m.metric.unit.clone(),
        baseline: m.baseline.amean,
        compare: m.compare.amean,
        delta: m.compare.amean - m.baseline.amean,
        delta_pct: m
            .delta_pct
            .amean
            .filter(|_| !stats::near_zero(m.baseline.amean)),
        // The interval of the test that gave the verdict: never for a
        // constant, and never one that contradicts it.
        delta_ci95: if exact {
            None
        } else {
            sig.welch.and_then(|w| w.delta_ci95)
        },
        exact,
        verdict: sig.verdict,
        rule: sig.rule,
        welch_p: sig.welch.map(|w| w.p_value),
        runs_differing,
        time_basis: is_time(&m.metric.unit).then(|| basis.key()),
    }
}

/// The answer's lines: the headline metrics the table has, one time
/// metric. Where times are not the hardware's (kvm_pvm, TCG, unknown) the
/// counts lead and the time comes last.
pub fn answer(t: &CompareTable) -> Vec<AnswerLine> {
    let basis = crate::report::environment::time_basis(t.environment.as_ref());
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
            out.push(line(m, what, basis));
        }
    }
    if !basis.is_hardware() {
        // Stable: the counts keep their order, the time goes last.
        out.sort_by_key(|l| l.time_basis.is_some());
    }
    out
}

fn source_tag(key: &str) -> &'static str {
    Source::ALL
        .into_iter()
        .find(|s| s.key() == key)
        .map_or("?", Source::tag)
}

/// A figure for people: whole numbers plain, else [`fig`] (two decimals,
/// or three significant digits where two decimals would show 0.00).
fn num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        fig(v)
    }
}

fn signed(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:+.0}")
    } else {
        fig_signed(v)
    }
}

/// The one verdict, with the p-value it was reached by: `significant, p
/// 0.0004` (Welch's test), `exact, differ`, ...
fn verdict_text(v: Verdict, p: Option<f64>) -> String {
    match (v, p) {
        (Verdict::Significant | Verdict::NotSignificant, Some(p)) => {
            format!("{}, p {}", v.word(), super::compare::p_text(p))
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

/// `what` as shown: a time carries its basis (`time [kvm_pvm emulated]`).
fn shown_what(l: &AnswerLine, basis: TimeBasis) -> String {
    if l.time_basis.is_some() {
        format!("{} [{}]", l.what, basis.tag())
    } else {
        l.what.clone()
    }
}

/// `k of n runs differ` for a side of a count, or `exact`.
fn spread_words(s: &stats::Summary) -> String {
    match s.runs_differing() {
        Some(0) => format!("{} in every run", num(s.amean)),
        Some(k) => {
            // As many decimals as it takes for the two ends to differ
            // (1.0195..1.0205, not 1.02..1.02).
            let (lo, hi) = (2..=9)
                .map(|d| (format!("{:.d$}", s.min), format!("{:.d$}", s.max)))
                .find(|(a, b)| a != b)
                .unwrap_or_else(|| (s.min.to_string(), s.max.to_string()));
            format!("{lo}..{hi}, {k} of {} runs differ", s.n())
        }
        None => num(s.amean),
    }
}

/// Why KVM's TLB flushes per call are not the guest's CR3 writes per call
/// (as `run` says in its cross-check), where both are in the answer.
fn tlb_note(t: &CompareTable) -> Option<String> {
    let kvm = t.metric("tlb_flush_per_call")?;
    let cr3 = t.metric("cr3_writes_per_call")?;
    if kvm.metric.source != Source::Kvm {
        return None;
    }
    let env = t.environment.as_ref()?;
    let (k, c) = (num(kvm.compare.amean), num(cr3.compare.amean));
    let label = &t.compare.label;
    Some(match env.kvm.module.as_deref() {
        Some("kvm_pvm") => format!(
            "[kvm] TLB flushes {k}/call beside [guest] CR3 writes {c}/call with {label}: kvm_pvm's \
             shadow MMU flushes once per kernel->user CR3 round trip (and per context switch), \
             not per write; the rest are KVM's own flushes (preemption, page faults); `ptiscope \
             run` cross-checks it per run"
        ),
        _ if !env.kvm.sees_cr3_writes => format!(
            "[kvm] TLB flushes {k}/call are KVM's own: with EPT/NPT KVM does not intercept guest \
             CR3 writes ([guest] {c}/call with {label})"
        ),
        _ => return None,
    })
}

/// The answer block: a heading with the sign convention, then one line per
/// headline metric: `[source] what  difference (% of baseline)  CI  verdict`,
/// then what the time is on this backend, the spread of counts that
/// differ between runs, and why KVM's flushes are not the guest's writes.
/// `per` names what a rate is per (`getpid call`, `message`).
pub fn render_answer(t: &CompareTable, per: &str) -> String {
    let lines = answer(t);
    let basis = crate::report::environment::time_basis(t.environment.as_ref());
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
    let what_w = lines
        .iter()
        .map(|l| shown_what(l, basis).len())
        .max()
        .unwrap_or(0);
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
            "  {:<tag_w$} {:<what_w$} {diff:>16}  {pct:<14} {ci:<26} {}\n",
            format!("[{}]", source_tag(l.source)),
            shown_what(l, basis),
            verdict_text(l.verdict, l.welch_p),
        ));
    }
    if lines.iter().any(|l| l.time_basis.is_some()) {
        out.push_str(&format!(
            "  time here: {}{}\n",
            basis.label(),
            if basis.is_hardware() {
                String::new()
            } else {
                "; not what hardware would take, so the counts lead".to_owned()
            }
        ));
    }
    for l in &lines {
        if l.runs_differing.is_some_and(|[b, c]| b + c > 0) {
            if let Some(m) = t.metric(&l.metric) {
                out.push_str(&format!(
                    "  {} not exact: {b} {}; {c} {}\n",
                    l.what,
                    spread_words(&m.baseline),
                    spread_words(&m.compare),
                ));
            }
        }
    }
    if let Some(note) = tlb_note(t).filter(|_| lines.iter().any(|l| l.what == "TLB flushes")) {
        out.push_str(&format!("  note: {note}\n"));
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
    let basis = crate::report::environment::time_basis(t.environment.as_ref());
    let shown: Vec<&MetricComparison> = t.metrics.iter().filter(|m| !left_out(t, m)).collect();
    let label = |m: &MetricComparison| {
        let time = if is_time(&m.metric.unit) {
            format!(" [{}]", basis.tag())
        } else {
            String::new()
        };
        format!("[{}] {}{time}", m.metric.source.tag(), m.metric.name)
    };
    let name_w = shown
        .iter()
        .map(|m| label(m).chars().count())
        .max()
        .unwrap_or(0)
        .max(22);
    let cell = |s: &stats::Summary| match s.ci95 {
        Some(ci) => format!("{:>12} ± {:<9}", fig(s.amean), fig(ci.half_width)),
        None => format!("{:>12}   (1 run)  ", fig(s.amean)),
    };
    let mut out = format!(
        "{:<name_w$} {:>12}{:12} {:>12}{:12} {}\n",
        "mean per call, 95 % CI", t.baseline.label, "", t.compare.label, "", "verdict"
    );
    for m in &shown {
        let sig = m
            .significance
            .unwrap_or_else(|| stats::significance_of(&m.baseline, &m.compare));
        let both_exact = matches!(sig.verdict, Verdict::ExactEqual | Verdict::ExactDifferent);
        // An exact side is shown once, as its value: no interval.
        let side = |s: &stats::Summary| {
            if both_exact || s.exact() {
                format!("{:>12}   exact    ", num(s.amean))
            } else {
                cell(s)
            }
        };
        let (bc, cc) = if both_exact {
            // Shown once as exact: the verdict says it.
            (
                format!("{:>12}{:12}", num(m.baseline.amean), ""),
                format!("{:>12}{:12}", num(m.compare.amean), ""),
            )
        } else {
            (side(&m.baseline), side(&m.compare))
        };
        let pad = name_w.saturating_sub(label(m).chars().count());
        out.push_str(&format!(
            "{}{} {bc} {cc} {}\n",
            label(m),
            " ".repeat(pad),
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
    // Counts that are not one value in every run: how many runs differed.
    let varying: Vec<String> = shown
        .iter()
        .filter_map(|m| {
            let sides = [
                (&t.baseline.label, &m.baseline),
                (&t.compare.label, &m.compare),
            ];
            let words: Vec<String> = sides
                .iter()
                .filter_map(|(label, s)| {
                    let k = s.runs_differing().filter(|&k| k > 0)?;
                    Some(format!("{label} {k} of {}", s.n()))
                })
                .collect();
            (!words.is_empty()).then(|| format!("{} ({})", m.metric.name, words.join(", ")))
        })
        .collect();
    if !varying.is_empty() {
        out.push_str(&format!(
            "counts not the same in every run (runs that differ from the most common value): {}\n",
            varying.join("; ")
        ));
    }
    if shown.iter().any(|m| is_time(&m.metric.unit)) {
        out.push_str(&format!("times [{}]: {}\n", basis.tag(), basis.label()));
    }
    out.push_str(
        "verdict: Welch's t-test, significant when p < 0.05 (the difference's 95 % CI \
         excludes 0); exact: every run the same (counts compared as integers), no test\n",
    );
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
        t.environment = Some(env("kvm", "kvm_intel"));
        t
    }

    fn env(backend: &str, module: &str) -> crate::report::Environment {
        let mut e = crate::report::Environment {
            backend: backend.into(),
            time_basis: match backend {
                "qemu" => TimeBasis::QemuTcg,
                _ => TimeBasis::of_kvm_module(Some(module)),
            },
            ..Default::default()
        };
        e.kvm.module = Some(module.into());
        e.kvm.sees_cr3_writes = module == "kvm_pvm";
        e
    }

    #[test]
    fn the_difference_has_one_sign_and_a_welch_interval() {
        let t = table();
        let a = answer(&t);
        // One time metric; the all-zero counter is left out.
        let names: Vec<&str> = a.iter().map(|l| l.metric.as_str()).collect();
        assert_eq!(names, ["ns_per_call", "cr3_writes_per_call"]);
        assert_eq!(a[0].time_basis, Some("hardware"));
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
            lines[1]
                .trim_start()
                .starts_with("[host-clock] time [hardware]"),
            "{text}"
        );
        assert!(
            lines[1].contains("+10.52 ns") && lines[1].contains("(+34.7 %)"),
            "{text}"
        );
        assert!(
            lines[1].contains("CI [+") && lines[1].ends_with("significant, p <0.0001"),
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
        assert!(
            lines[3].starts_with("  time here: hardware"),
            "the time says what it is: {text}"
        );
        let table = render_table(&t);
        // One time metric, the exact counter shown once, the zero one counted.
        let rows: Vec<&str> = table.lines().filter(|l| l.starts_with('[')).collect();
        assert_eq!(rows.len(), 2, "{table}");
        assert!(rows[0].contains("30.30 ± 0.86"), "{table}");
        assert!(
            rows[0].starts_with("[host-clock] ns_per_call [hardware]"),
            "{table}"
        );
        assert!(
            !rows[1].contains('±') && rows[1].ends_with("exact, differ"),
            "{table}"
        );
        assert!(
            table.contains("cycles_per_call (the same time) in --mmtests, --json, --csv; 1 more"),
            "{table}"
        );
    }

    /// Under kvm_pvm (and TCG, and where the basis is unknown) the counts
    /// lead and the time says it is not hardware time, in the answer, the
    /// JSON and the table; a KVM flush count beside the guest's CR3 writes
    /// is explained.
    #[test]
    fn where_times_are_not_hardware_the_counts_lead() {
        let mut t = table();
        t.add(
            Metric::new("tlb_flush_per_call", "count/call", Source::Kvm),
            &[0.01, 0.012, 0.011, 0.01, 0.01],
            &[1.01, 1.012, 1.011, 1.01, 1.01],
        )
        .unwrap();
        t.environment = Some(env("kvm", "kvm_pvm"));
        let a = answer(&t);
        let names: Vec<&str> = a.iter().map(|l| l.metric.as_str()).collect();
        assert_eq!(
            names,
            ["cr3_writes_per_call", "tlb_flush_per_call", "ns_per_call"]
        );
        assert_eq!(a[2].time_basis, Some("kvm_pvm"));
        assert_eq!(a[0].time_basis, None);
        let text = render_answer(&t, "getpid call");
        assert!(
            text.contains("time [kvm_pvm emulated]")
                && text.contains(
                    "time here: kvm_pvm: guest kernel code emulated; not what hardware would \
                     take, so the counts lead"
                ),
            "{text}"
        );
        assert!(
            text.contains("note: [kvm] TLB flushes 1.01/call beside [guest] CR3 writes 2/call")
                && text.contains("once per kernel->user CR3 round trip"),
            "{text}"
        );
        // A near-zero baseline (0.0106 flushes per call) gets no percentage.
        let tlb = &a[1];
        assert_eq!(tlb.delta_pct, None, "{tlb:?}");
        assert!(render_table(&t).contains("times [kvm_pvm emulated]: kvm_pvm: guest kernel"));
        // A count that differs between runs: its spread and how many runs.
        t.add_counts(
            Metric::new("kvm_exits_per_call", "count/call", Source::Kvm),
            crate::report::stats::CountRuns::new(vec![201, 202, 201], vec![100; 3]).unwrap(),
            crate::report::stats::CountRuns::new(vec![203; 3], vec![100; 3]).unwrap(),
        )
        .unwrap();
        let text = render_answer(&t, "getpid call");
        assert!(
            text.contains("VM exits not exact: pti=off 2.01..2.02, 1 of 3 runs differ; pti=on 2.03 in every run"),
            "{text}"
        );
        assert!(
            render_table(&t).contains(
                "counts not the same in every run (runs that differ from the most common value): \
                 kvm_exits_per_call (pti=off 1 of 3)"
            ),
            "{}",
            render_table(&t)
        );
        t.environment = Some(env("qemu", "kvm_pvm"));
        let text = render_answer(&t, "getpid call");
        assert!(
            text.contains("time [TCG]")
                && text.contains("QEMU TCG: every CR3 write flushes the soft TLB"),
            "{text}"
        );
        t.environment = None;
        assert!(render_answer(&t, "x").contains("time [basis unknown]"));
    }

    /// Property over seeded random samples: the printed answer line has one
    /// verdict word, and it agrees with the p and the CI printed beside it
    /// (significant == p < 0.05 == the CI's printed bounds exclude 0).
    #[test]
    fn the_printed_verdict_agrees_with_the_printed_p_and_ci() {
        let mut rng = crate::report::stats::tests::Rng(0x00c0_ffee_2026_0026);
        let mut seen = [0usize; 2];
        for _ in 0..3000 {
            let (na, nb) = (2 + (rng.next() % 8) as usize, 2 + (rng.next() % 8) as usize);
            let scale = 10f64.powi((rng.next() % 7) as i32 - 3);
            let (sda, sdb) = (scale * rng.unit() * 3.0, scale * rng.unit() * 3.0);
            let base = rng.samples(na, 10.0 * scale, sda);
            let shift = scale * (rng.unit() * 4.0 - 2.0);
            let comp = rng.samples(nb, 10.0 * scale + shift, sdb);
            let mut t = CompareTable::new(side("a"), side("b"));
            t.add(
                Metric::new("ns_per_call", "ns/call", Source::HostClock),
                &base,
                &comp,
            )
            .unwrap();
            t.environment = Some(env("kvm", "kvm_amd"));
            let text = render_answer(&t, "call");
            let l = text.lines().nth(1).unwrap();
            let words = [
                "not significant",
                "significant",
                "exact, equal",
                "exact, differ",
            ];
            let found: Vec<&str> = words
                .iter()
                .copied()
                .filter(|w| l.contains(&format!("  {w}")) || l.contains(&format!(" {w},")))
                .collect();
            assert!(!found.is_empty(), "a verdict: {l}");
            if found.iter().any(|w| w.starts_with("exact")) {
                assert!(!l.contains("CI [") && !l.contains(", p "), "{l}");
                continue;
            }
            let significant = !l.contains("not significant");
            let p = l.rsplit(", p ").next().unwrap();
            let p_below = p == "<0.0001" || p.parse::<f64>().unwrap() < 0.05;
            let ci = l.split("CI [").nth(1).unwrap().split(']').next().unwrap();
            let (lo, hi) = ci.split_once(", ").unwrap();
            let (lo, hi): (f64, f64) = (lo.parse().unwrap(), hi.parse().unwrap());
            let excludes = lo > 0.0 || hi < 0.0;
            assert_eq!(significant, p_below, "{l}");
            assert_eq!(significant, excludes, "{l}");
            seen[usize::from(significant)] += 1;
        }
        assert!(seen[0] > 100 && seen[1] > 100, "{seen:?}");
    }
}
