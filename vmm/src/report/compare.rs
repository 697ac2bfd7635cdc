//! Baseline-vs-compare tables in the mmtests compare-kernels layout, plus
//! JSON (schema `ptiscope.compare/1`, docs/report-json.md) and CSV.
//!
//! ```text
//!                                       pti=off                 pti=on
//! Min       cycles_per_call      800.00 (   0.00%)     1500.00 ( -87.50%)
//! Amean     cycles_per_call      812.00 (   0.00%)     1523.00 ( -87.56%)
//! ```
//! Rows are grouped by statistic, then metric, as compare-kernels does; each
//! value is `%12.2f` followed by ` (%7.2f%)` (mmtests' printed width), the baseline's own difference
//! being 0.00 %. Negative differences are worse (see `stats.rs`).
//!
//! On the Amean row a significant difference is printed as `*  x.xx%*`
//! instead of `(  x.xx%)`: mmtests' marker, set by the one verdict every
//! other line prints (Welch at 95 %, or exactness; `stats.rs`), not by a
//! second rule. A block with each side's mean and 95 % confidence interval,
//! Welch's p-value, the one verdict and mmtests' ratio follows the table.
//!
//! Size: the mmtests table model with its text, JSON and CSV forms, which
//! must stay in step; about 290 lines are tests.

use serde::{Deserialize, Serialize};

use super::csv_field;
use super::environment::Environment;
use super::metric::{Metric, Source};
use super::stats::{self, CountRuns, Significance, Stat, Summary, SummaryError};
use super::time_basis::is_time;

/// Schema id written into the JSON; bump on incompatible changes.
pub const SCHEMA: &str = "ptiscope.compare/1";

/// Errors of building a compare table.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CompareError {
    /// A side's samples of a metric could not be summarised.
    #[error("metric {metric}: {side} samples: {source}")]
    BadSamples {
        /// The metric's name.
        metric: String,
        /// `baseline` or `compare`.
        side: &'static str,
        /// Why the samples were refused.
        #[source]
        source: SummaryError,
    },
    /// The metric was added to the table twice (its name).
    #[error("metric {0} added twice")]
    Duplicate(String),
    /// The metric's name is not snake_case.
    #[error("metric name {0:?} must be non-empty snake_case ([a-z0-9_])")]
    BadName(String),
}

/// One configuration of a comparison.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Side {
    /// Short column label, e.g. `pti=off`.
    pub label: String,
    /// The full configuration (`key=value` options) the runs used.
    pub config: Vec<String>,
}

/// Per-statistic values; `None` where undefined (JSON `null`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct StatValues {
    /// Min.
    pub min: Option<f64>,
    /// Amean.
    pub amean: Option<f64>,
    /// Stddev.
    pub stddev: Option<f64>,
    /// CoeffVar.
    pub coeffvar: Option<f64>,
    /// Max.
    pub max: Option<f64>,
    /// BAmean-50.
    pub bamean50: Option<f64>,
    /// BAmean-95.
    pub bamean95: Option<f64>,
    /// BAmean-99.
    pub bamean99: Option<f64>,
}

impl StatValues {
    fn from_fn(mut f: impl FnMut(Stat) -> Option<f64>) -> Self {
        StatValues {
            min: f(Stat::Min),
            amean: f(Stat::Amean),
            stddev: f(Stat::Stddev),
            coeffvar: f(Stat::CoeffVar),
            max: f(Stat::Max),
            bamean50: f(Stat::BAmean50),
            bamean95: f(Stat::BAmean95),
            bamean99: f(Stat::BAmean99),
        }
    }

    /// The value for one statistic.
    pub fn get(&self, stat: Stat) -> Option<f64> {
        match stat {
            Stat::Min => self.min,
            Stat::Amean => self.amean,
            Stat::Stddev => self.stddev,
            Stat::CoeffVar => self.coeffvar,
            Stat::Max => self.max,
            Stat::BAmean50 => self.bamean50,
            Stat::BAmean95 => self.bamean95,
            Stat::BAmean99 => self.bamean99,
        }
    }
}

/// One metric, summarised on both sides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricComparison {
    /// The metric: name, unit, source, direction.
    #[serde(flatten)]
    pub metric: Metric,
    /// The baseline side's runs.
    pub baseline: Summary,
    /// The compare side's runs.
    pub compare: Summary,
    /// mmtests-style % difference per statistic: positive = compare is better.
    pub diff_pct: StatValues,
    /// Plain % change per statistic: positive = compare is larger.
    pub delta_pct: StatValues,
    /// Whether the means differ beyond the noise: mmtests' rule, Welch's
    /// t-test, exactness. Always present in tables this version builds;
    /// `None` only in documents written before it existed.
    #[serde(default)]
    pub significance: Option<Significance>,
}

impl MetricComparison {
    /// Absolute change `compare - baseline` of one statistic.
    pub fn delta(&self, stat: Stat) -> Option<f64> {
        Some(self.compare.get(stat)? - self.baseline.get(stat)?)
    }
}

/// A full comparison: metrics x {baseline, compare} x statistics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareTable {
    /// Always [`SCHEMA`] for tables this version writes.
    pub schema: String,
    /// The configuration compared against.
    pub baseline: Side,
    /// The configuration under test.
    pub compare: Side,
    /// One entry per metric, in the order added.
    pub metrics: Vec<MetricComparison>,
    /// Where the runs came from (host, KVM, probe, build, image, options);
    /// set by `ptiscope compare`, absent in documents from before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<Environment>,
}

impl CompareTable {
    /// An empty table for two configurations.
    pub fn new(baseline: Side, compare: Side) -> Self {
        CompareTable {
            schema: SCHEMA.to_owned(),
            baseline,
            compare,
            metrics: Vec::new(),
            environment: None,
        }
    }

    /// Adds a metric with its per-run samples on each side (a measured
    /// quantity; counts go through [`CompareTable::add_counts`]).
    pub fn add(
        &mut self,
        metric: Metric,
        baseline: &[f64],
        compare: &[f64],
    ) -> Result<&MetricComparison, CompareError> {
        let summarise = |side, s: &[f64]| {
            Summary::new(s, metric.lower_is_better).map_err(|source| CompareError::BadSamples {
                metric: metric.name.clone(),
                side,
                source,
            })
        };
        let b = summarise("baseline", baseline)?;
        let c = summarise("compare", compare)?;
        self.add_summaries(metric, b, c)
    }

    /// Adds a count with each side's per-run integer totals and calls: its
    /// samples are the per-call rates, its exactness the integers'.
    pub fn add_counts(
        &mut self,
        metric: Metric,
        baseline: CountRuns,
        compare: CountRuns,
    ) -> Result<&MetricComparison, CompareError> {
        let summarise = |side, c: CountRuns| {
            Summary::from_counts(c, metric.lower_is_better).map_err(|source| {
                CompareError::BadSamples {
                    metric: metric.name.clone(),
                    side,
                    source,
                }
            })
        };
        let b = summarise("baseline", baseline)?;
        let c = summarise("compare", compare)?;
        self.add_summaries(metric, b, c)
    }

    /// Adds a metric from each side's summary (e.g. taken from another
    /// table, counts and all).
    pub fn add_summaries(
        &mut self,
        metric: Metric,
        b: Summary,
        c: Summary,
    ) -> Result<&MetricComparison, CompareError> {
        let valid_name = !metric.name.is_empty()
            && metric
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !valid_name {
            return Err(CompareError::BadName(metric.name));
        }
        if self.metric(&metric.name).is_some() {
            return Err(CompareError::Duplicate(metric.name));
        }
        let diff_pct = StatValues::from_fn(|s| {
            stats::diff_pct(
                c.get(s)?,
                b.get(s)?,
                s.lower_is_better(metric.lower_is_better),
            )
        });
        let delta_pct = StatValues::from_fn(|s| stats::delta_pct(c.get(s)?, b.get(s)?));
        let significance = Some(stats::significance_of(&b, &c));
        self.metrics.push(MetricComparison {
            metric,
            baseline: b,
            compare: c,
            diff_pct,
            delta_pct,
            significance,
        });
        Ok(self.metrics.last().expect("just pushed"))
    }

    /// The comparison of metric `name`.
    pub fn metric(&self, name: &str) -> Option<&MetricComparison> {
        self.metrics.iter().find(|m| m.metric.name == name)
    }

    /// The mmtests-like text table with the default statistics.
    pub fn render_text(&self) -> String {
        self.render_text_with(&Stat::ALL)
    }

    /// The mmtests-like text table with a chosen set of statistics, followed
    /// by a legend of units and sources.
    pub fn render_text_with(&self, stats: &[Stat]) -> String {
        const FIELD: usize = 12;
        const COLUMN: usize = FIELD + 11; // "%12.2f" + " (%7.2f%)"
        let stat_w = stats.iter().map(|s| s.title().len()).max().unwrap_or(0);
        let name_w = self
            .metrics
            .iter()
            .map(|m| m.metric.name.len())
            .max()
            .unwrap_or(0);
        let mut out = String::new();
        out.push_str(&format!(
            "{:w$}{:>c$}{:>c$}\n",
            "",
            self.baseline.label,
            self.compare.label,
            w = stat_w + 1 + name_w,
            c = COLUMN
        ));
        for &stat in stats {
            for m in &self.metrics {
                out.push_str(&format!(
                    "{:<stat_w$} {:<name_w$}",
                    stat.title(),
                    m.metric.name
                ));
                // The baseline's difference to itself is 0 by definition
                // (mmtests prints it too), unless the value is undefined.
                let base = m.baseline.get(stat);
                out.push_str(&cell(base, base.map(|_| 0.0), false));
                // Marked only on the row of the comparison statistic, the
                // mean, as mmtests does; but by the one verdict every
                // other line prints (Welch, or exactness), not a second.
                let marked =
                    stat == Stat::Amean && m.significance.is_some_and(|s| s.verdict.marked());
                // A percentage of a near-zero rate says nothing (stats::NEAR_ZERO).
                let diff = m
                    .diff_pct
                    .get(stat)
                    .filter(|_| !base.is_some_and(stats::near_zero) || base == Some(0.0));
                out.push_str(&cell(m.compare.get(stat), diff, marked));
                out.push('\n');
            }
        }
        out.push('\n');
        out.push_str(&self.render_confidence());
        out.push('\n');
        out.push_str(&format!(
            "runs: {} {}, {} {}; % difference: positive = compare better, negative = worse, \
             n/a where the baseline is 0 or near it (below 0.05); *  x.xx%* on an Amean row: the \
             verdict (Welch's t-test: p < 0.05, the difference's 95 % CI excludes 0; exact \
             counters: they differ)\n",
            self.baseline.label,
            self.metrics.first().map_or(0, |m| m.baseline.n()),
            self.compare.label,
            self.metrics.first().map_or(0, |m| m.compare.n()),
        ));
        let basis = crate::report::environment::time_basis(self.environment.as_ref());
        for m in &self.metrics {
            out.push_str(&format!(
                "{:<name_w$}  {} ({}; {}{})\n",
                m.metric.name,
                m.metric.unit,
                m.metric.source.tag(),
                if m.metric.lower_is_better {
                    "lower is better"
                } else {
                    "higher is better"
                },
                if is_time(&m.metric.unit) {
                    format!("; time: {}", basis.label())
                } else {
                    String::new()
                }
            ));
        }
        let used: Vec<Source> = Source::ALL
            .into_iter()
            .filter(|s| self.metrics.iter().any(|m| m.metric.source == *s))
            .collect();
        for s in used {
            out.push_str(&format!("  {}: {}\n", s.tag(), s.describe()));
        }
        out
    }

    /// Per metric: each side's mean with its 95 % confidence interval
    /// (Student's t), Welch's two-sided p-value, the one verdict, and
    /// mmtests' ratio under its own name (a number, not a second verdict).
    pub fn render_confidence(&self) -> String {
        let name_w = self
            .metrics
            .iter()
            .map(|m| m.metric.name.len())
            .max()
            .unwrap_or(0)
            .max(12);
        // Labels over the means (the 12 columns at each cell's left).
        let label = |l: &str| format!("{:<CI_W$}", format!("{l:>12}"));
        let mut out = format!(
            "{:<name_w$} {} {}  {:<10} {:<16} {}\n",
            "mean, 95% CI",
            label(&self.baseline.label),
            label(&self.compare.label),
            "Welch p",
            "verdict",
            "mmtests cidiff",
        );
        for m in &self.metrics {
            let (p, verdict, cidiff) = match m.significance {
                Some(s) => (
                    s.welch.map_or("-".to_owned(), |w| p_text(w.p_value)),
                    s.verdict.word(),
                    s.mmtests
                        .map_or("-".to_owned(), |x| format!("{:.2}", x.ratio)),
                ),
                None => ("-".to_owned(), "-", "-".to_owned()),
            };
            out.push_str(&format!(
                "{:<name_w$} {} {}  {p:<10} {verdict:<16} {cidiff}\n",
                m.metric.name,
                ci_cell(&m.baseline),
                ci_cell(&m.compare),
            ));
        }
        out.push_str(
            "verdict: Welch's t-test, significant when p < 0.05 (the difference's 95 % CI \
             excludes 0); exact: every run the same value (counts compared as integers), no \
             test. mmtests cidiff: mmtests' ratio of the difference to both sides' \
             qnorm(0.975) x stddev summed (mmtests marks |cidiff| > 1)\n",
        );
        out
    }

    /// JSON (schema [`SCHEMA`]).
    pub fn to_json(&self) -> serde_json::Value {
        // Serialising plain data with string keys cannot fail; NaN cannot
        // occur (Summary rejects non-finite samples).
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    /// Reads a table back from its JSON form.
    pub fn from_json(v: serde_json::Value) -> Result<Self, serde_json::Error> {
        serde_json::from_value(v)
    }

    /// CSV: one line per metric and statistic. Columns:
    /// `metric,unit,source,lower_is_better,stat,baseline,compare,diff_pct,delta_pct,`
    /// `baseline_ci95,compare_ci95,welch_p,mmtests_ratio,verdict,rule`; the
    /// last six (the mean's 95 % CI half-widths and the significance) only
    /// on the `amean` line; undefined values are empty cells.
    pub fn to_csv(&self) -> String {
        let mut out = String::from(
            "metric,unit,source,lower_is_better,stat,baseline,compare,diff_pct,delta_pct,\
             baseline_ci95,compare_ci95,welch_p,mmtests_ratio,verdict,rule\n",
        );
        let num = |v: Option<f64>| v.map_or(String::new(), |v| v.to_string());
        for m in &self.metrics {
            for stat in Stat::ALL {
                let sig = m.significance.filter(|_| stat == Stat::Amean);
                let key = |v: serde_json::Result<serde_json::Value>| {
                    v.ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default()
                };
                let verdict = sig.map_or(String::new(), |s| key(serde_json::to_value(s.verdict)));
                let rule = sig
                    .and_then(|s| s.rule)
                    .map_or(String::new(), |r| key(serde_json::to_value(r)));
                let amean_only = |v: Option<f64>| num(v.filter(|_| stat == Stat::Amean));
                let fields = [
                    csv_field(&m.metric.name),
                    csv_field(&m.metric.unit),
                    m.metric.source.key().to_owned(),
                    m.metric.lower_is_better.to_string(),
                    stat.key().to_owned(),
                    num(m.baseline.get(stat)),
                    num(m.compare.get(stat)),
                    num(m.diff_pct.get(stat)),
                    num(m.delta_pct.get(stat)),
                    amean_only(m.baseline.ci95.map(|c| c.half_width)),
                    amean_only(m.compare.ci95.map(|c| c.half_width)),
                    num(sig.and_then(|s| s.welch).map(|w| w.p_value)),
                    num(sig.and_then(|s| s.mmtests).map(|m| m.ratio)),
                    verdict,
                    rule,
                ];
                out.push_str(&fields.join(","));
                out.push('\n');
            }
        }
        out
    }
}

/// One value column: `%12.2f (%7.2f%)`, or NaN / n/a where undefined;
/// `marked` prints mmtests' significance form `%12.2f *%7.2f%*`.
fn cell(value: Option<f64>, diff: Option<f64>, marked: bool) -> String {
    let v = value.map_or_else(|| format!("{:>12}", "NaN"), |v| format!("{v:>12.2}"));
    let d = diff.map_or_else(|| format!("{:>8}", "n/a"), |d| format!("{d:>7.2}%"));
    let (open, close) = if marked { ('*', '*') } else { ('(', ')') };
    format!("{v} {open}{d}{close}")
}

/// Width of a confidence cell: `%12.2f ± %9.2f (%6.2f%)`.
const CI_W: usize = 12 + 3 + 9 + 2 + 7 + 1;

/// A figure with two decimals; one below 0.1 (not 0) with three
/// significant digits instead (`0.00123`, `0.0113`), so that a printed
/// line never shows `0.00 ± 0.00` beside a verdict about its difference.
pub(crate) fn fig(v: f64) -> String {
    if v == 0.0 || v.abs() >= 0.1 || !v.is_finite() {
        return format!("{v:.2}");
    }
    let decimals = (-v.abs().log10()).floor() as usize + 3;
    if decimals > 12 {
        format!("{v:.2e}")
    } else {
        format!("{v:.decimals$}")
    }
}

/// [`fig`] with its sign always shown.
pub(crate) fn fig_signed(v: f64) -> String {
    let f = fig(v);
    if f.starts_with('-') {
        f
    } else {
        format!("+{f}")
    }
}

/// `mean ± half-width (relative %)`, `mean   exact`, or the mean alone;
/// the means of all rows in one column.
fn ci_cell(s: &Summary) -> String {
    let text = match s.ci95 {
        _ if s.exact() => format!("{:>12}   exact", fig(s.amean)),
        Some(ci) => {
            // No percentage of a near-zero mean.
            let rel = ci
                .relative_pct
                .filter(|_| !stats::near_zero(s.amean))
                .map_or_else(|| format!("{:>7}", "n/a"), |r| format!("{r:>6.2}%"));
            format!("{:>12} ± {:>9} ({rel})", fig(s.amean), fig(ci.half_width))
        }
        None => format!("{:>12}   (1 run)", fig(s.amean)),
    };
    // `±` is one column but two bytes: pad by characters.
    let pad = CI_W.saturating_sub(text.chars().count());
    format!("{text}{}", " ".repeat(pad))
}

/// A p-value for people: four decimals, or `<0.0001`; near 0.05 as many
/// more as it takes for the printed value to fall on the same side of 0.05
/// as the verdict (0.04996 is not printed "0.0500").
pub fn p_text(p: f64) -> String {
    if p < 1e-4 {
        return "<0.0001".to_owned();
    }
    for decimals in 4..=17 {
        let text = format!("{p:.decimals$}");
        let shown: f64 = text.parse().unwrap_or(p);
        if (shown < 0.05) == (p < 0.05) && (shown != 0.05 || p == 0.05) {
            return text;
        }
    }
    format!("{p}")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::report::stats::Verdict;

    fn side(label: &str) -> Side {
        Side {
            label: label.into(),
            config: vec![label.into(), "workload=getpid".into()],
        }
    }

    /// Two metrics, three runs a side: a guest-timed one that grows with
    /// PTI and an exact count (0 -> 2). The `--fail-if` tests use it too.
    pub(crate) fn sample_table() -> CompareTable {
        let mut t = CompareTable::new(side("pti=off"), side("pti=on"));
        t.add(
            Metric::new("cycles_per_call", "cycles/call", Source::Guest),
            &[800.0, 812.0, 824.0],
            &[1500.0, 1523.0, 1546.0],
        )
        .unwrap();
        t.add(
            Metric::new("cr3_writes_per_call", "count/call", Source::Guest),
            &[0.0, 0.0, 0.0],
            &[2.0, 2.0, 2.0],
        )
        .unwrap();
        t
    }

    #[test]
    fn text_layout_matches_mmtests() {
        let t = sample_table();
        let text = t.render_text_with(&[Stat::Min, Stat::Amean, Stat::Stddev]);
        let lines: Vec<&str> = text.lines().collect();
        // Amean 812 -> 1523: 100 - 1523*100/812 = -87.56 (see stats.rs).
        // Stat column 6 wide ("Stddev"), metric column 19 wide; expected lines
        // produced independently with printf("%-6s %-19s%12.2f (%7.2f%%)...").
        // Significant by mmtests' rule (711 / (1.96 * (12 + 23)) = 10.36 > 1),
        // so the Amean difference prints with mmtests' `*` instead of `()`.
        assert_eq!(
            lines[3],
            "Amean  cycles_per_call          812.00 (   0.00%)     1523.00 * -87.56%*"
        );
        // Exact counters that differ are marked too; n/a stays n/a.
        assert_eq!(
            lines[4],
            "Amean  cr3_writes_per_call        0.00 (   0.00%)        2.00 *     n/a*"
        );
        // Min 800 -> 1500: 100 - 187.5 = -87.50.
        assert_eq!(
            lines[1],
            "Min    cycles_per_call          800.00 (   0.00%)     1500.00 ( -87.50%)"
        );
        // 0 -> 2 has no finite percentage.
        assert_eq!(
            lines[2],
            "Min    cr3_writes_per_call        0.00 (   0.00%)        2.00 (     n/a)"
        );
        // Stddev 12 vs 23 (sample stddev of 800,812,824 = 12; of 1500,1523,1546 = 23):
        // pndiff 100 - 2300/12 = -91.67.
        assert_eq!(
            lines[5],
            "Stddev cycles_per_call           12.00 (   0.00%)       23.00 ( -91.67%)"
        );
        // Header labels right-aligned over their columns: same width as a row.
        assert_eq!(lines[0].len(), lines[1].len());
        assert!(lines[0].ends_with("pti=on"));
        assert!(text.contains("  guest: guest-reported"));
    }

    #[test]
    fn confidence_block_and_unmarked_noise() {
        let mut t = CompareTable::new(side("pti=off"), side("pti=on"));
        // The n = 5 pair of stats.rs: Welch p = 0.2617, mmtests ratio 0.19.
        t.add(
            Metric::new("ns_per_call", "ns/call", Source::HostClock),
            &[30.1, 29.5, 31.2, 30.8, 29.9],
            &[30.6, 31.0, 30.2, 31.9, 30.4],
        )
        .unwrap();
        t.add(
            Metric::new("cr3_writes_per_call", "count/call", Source::Guest),
            &[2.0; 5],
            &[2.0; 5],
        )
        .unwrap();
        let text = t.render_text_with(&[Stat::Amean]);
        let amean = text.lines().find(|l| l.starts_with("Amean ns")).unwrap();
        // 100 - 30.82 * 100 / 30.3 = -1.716...: not significant, parentheses.
        assert!(amean.ends_with("       30.82 (  -1.72%)"), "{amean}");
        // Half-widths 0.8557578542477975 and 0.8347824428944232 (SciPy),
        // 2.82 % and 2.71 % of the means.
        let row = text
            .lines()
            .find(|l| l.starts_with("ns_per_call "))
            .unwrap();
        assert!(row.contains("30.30 ±      0.86 (  2.82%)"), "{row}");
        assert!(row.contains("30.82 ±      0.83 (  2.71%)"), "{row}");
        // One verdict (Welch's), mmtests' ratio beside it as a number.
        assert!(row.ends_with("0.2617     not significant  0.19"), "{row}");
        let row = text
            .lines()
            .find(|l| l.starts_with("cr3_writes_per_call "))
            .unwrap();
        assert!(row.contains("2.00   exact"), "{row}");
        assert!(row.ends_with("-          exact, equal     -"), "{row}");
        let v = t.to_json();
        assert_eq!(
            v["metrics"][0]["significance"]["verdict"],
            "not_significant"
        );
        assert!(
            v["metrics"][0]["compare"]["ci95"]["half_width"]
                .as_f64()
                .unwrap()
                > 0.83
        );
        assert!(v["metrics"][1]["significance"]["welch"].is_null());
        // Documents from before the significance fields still read.
        let mut old = v.clone();
        for m in old["metrics"].as_array_mut().unwrap() {
            let m = m.as_object_mut().unwrap();
            m.remove("significance");
            m["baseline"].as_object_mut().unwrap().remove("ci95");
        }
        let back = CompareTable::from_json(old).unwrap();
        assert_eq!(back.metrics[0].significance, None);
        assert!(back.render_text().contains("ns_per_call"));
    }

    /// A count added as integers: exact over different totals and run
    /// numbers, shown once as exact, with no p; a near-zero rate shows
    /// its digits and no percentage; p-values near 0.05 print on their
    /// side of it.
    #[test]
    fn counts_near_zero_rates_and_p_at_the_line() {
        let mut t = CompareTable::new(side("pti=off"), side("pti=on"));
        // 2939/113 = 5878/226: the issue's 26.008849557522122, 3 runs
        // against 7 (what --runs auto gives).
        t.add_counts(
            Metric::new(
                "kernel_instructions_per_call",
                "count/call",
                Source::QemuPlugin,
            ),
            CountRuns::new(vec![2939, 5878, 2939], vec![113, 226, 113]).unwrap(),
            CountRuns::new(vec![293_900; 7], vec![11_300; 7]).unwrap(),
        )
        .unwrap();
        t.add(
            Metric::new("insn_iret_per_call", "count/call", Source::QemuPlugin),
            &[0.0012, 0.0011, 0.0013],
            &[0.0113, 0.0112, 0.0114],
        )
        .unwrap();
        let m = t.metric("kernel_instructions_per_call").unwrap();
        let sig = m.significance.unwrap();
        assert_eq!(sig.verdict, Verdict::ExactEqual);
        assert_eq!((sig.welch, sig.mmtests), (None, None));
        assert_eq!(m.baseline.amean, m.compare.amean);
        let text = t.render_text_with(&[Stat::Amean]);
        let row = text
            .lines()
            .find(|l| l.starts_with("kernel_instructions_per_call "))
            .unwrap();
        assert_eq!(row.matches("26.01   exact").count(), 2, "{row}");
        assert!(
            !row.contains('±') && row.contains(" -  "),
            "no CI, no p: {row}"
        );
        let amean = text
            .lines()
            .find(|l| l.starts_with("Amean insn_iret"))
            .unwrap();
        assert!(
            amean.ends_with("0.01 *     n/a*"),
            "no % of 0.0012: {amean}"
        );
        let row = text
            .lines()
            .find(|l| l.starts_with("insn_iret_per_call "))
            .unwrap();
        assert!(
            row.contains("0.00120 ±") && row.contains("0.0113 ±"),
            "{row}"
        );
        assert!(
            row.contains("(    n/a)"),
            "no relative % of a near-zero mean: {row}"
        );
        let v = t.to_json();
        assert_eq!(v["metrics"][0]["baseline"]["counts"]["calls"][1], 226);
        assert_eq!(v["metrics"][0]["significance"]["rule"], "exact");
        let back = CompareTable::from_json(v).unwrap();
        assert_eq!(back.metrics[0].baseline.counts, m.baseline.counts);

        assert_eq!(p_text(0.049_996), "0.049996");
        assert_eq!(p_text(0.050_000_4), "0.0500004");
        assert_eq!(p_text(0.05), "0.0500");
        assert_eq!(p_text(0.2617), "0.2617");
        assert_eq!(p_text(0.000_01), "<0.0001");
        assert_eq!(fig(0.0012), "0.00120");
        assert_eq!(fig(-0.000_456), "-0.000456");
        assert_eq!(fig(0.0), "0.00");
        assert_eq!(fig(12.5), "12.50");
        assert_eq!(fig_signed(0.0012), "+0.00120");
    }

    #[test]
    fn json_round_trip_and_field_names() {
        let t = sample_table();
        let v = t.to_json();
        assert_eq!(v["schema"], SCHEMA);
        let m = &v["metrics"][0];
        assert_eq!(m["name"], "cycles_per_call");
        assert_eq!(m["unit"], "cycles/call");
        assert_eq!(m["source"], "guest");
        assert_eq!(m["baseline"]["amean"], 812.0);
        assert_eq!(m["compare"]["samples"][1], 1523.0);
        assert!(m["diff_pct"]["amean"].as_f64().unwrap() < -87.0);
        assert!(v["metrics"][1]["delta_pct"]["amean"].is_null());
        let text = serde_json::to_string(&v).unwrap();
        let back = CompareTable::from_json(serde_json::from_str(&text).unwrap()).unwrap();
        // Exact in memory; through text, serde_json's default float parser
        // may differ in the last bit (the `float_roundtrip` feature fixes that).
        assert_eq!(CompareTable::from_json(v.clone()).unwrap(), t);
        assert!(crate::report::json_approx_eq(&back.to_json(), &v));
    }

    #[test]
    fn csv_rows() {
        let mut t = sample_table();
        t.add(Metric::new("odd_unit", "a,b", Source::Kvm), &[1.0], &[1.0])
            .unwrap();
        let csv = t.to_csv();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 1 + 3 * Stat::ALL.len());
        // Half-widths t(0.975, 2) * s / sqrt(3): 4.302652729749462 * 12 / 1.7320508
        // = 29.8096525..., * 23 -> 57.1351673...; Welch p and the mmtests
        // ratio as in stats.rs (SciPy: 1.976578999274445e-05, 10.364621939240829).
        let amean: Vec<&str> = lines[2].split(',').collect();
        assert_eq!(
            amean[..9].join(","),
            "cycles_per_call,cycles/call,guest,true,amean,812,1523,-87.5615763546798,87.5615763546798"
        );
        let field = |i: usize| amean[i].parse::<f64>().unwrap();
        assert!((field(9) - 29.809_652_541_004).abs() < 1e-9);
        assert!((field(10) - 57.135_167_370_257_67).abs() < 1e-9);
        assert!((field(11) - 1.976_578_999_274_445e-5).abs() < 1e-11);
        assert!((field(12) - 10.364_621_939_240_829).abs() < 1e-9);
        assert_eq!((amean[13], amean[14]), ("significant", "welch95"));
        assert!(
            lines[1].ends_with(",,,,,,"),
            "only the amean line: {}",
            lines[1]
        );
        assert!(lines
            .iter()
            .any(|l| l.starts_with("cr3_writes_per_call,count/call,guest,true,amean,0,2,,")));
        // One sample: stddev undefined -> empty cells; unit with a comma quoted.
        assert!(lines.contains(&"odd_unit,\"a,b\",kvm,true,stddev,,,,,,,,,,"));
        // One run: no CI, no test; the verdict says so.
        assert!(lines.contains(&"odd_unit,\"a,b\",kvm,true,amean,1,1,0,0,,,,,undefined,none"));
    }

    #[test]
    fn bad_input_is_an_error() {
        let mut t = sample_table();
        assert_eq!(
            t.add(
                Metric::new("cycles_per_call", "x", Source::Guest),
                &[1.0],
                &[1.0]
            )
            .unwrap_err(),
            CompareError::Duplicate("cycles_per_call".into())
        );
        assert!(matches!(
            t.add(Metric::new("Bad.Name", "x", Source::Guest), &[1.0], &[1.0]),
            Err(CompareError::BadName(_))
        ));
        assert!(matches!(
            t.add(Metric::new("empty", "x", Source::Guest), &[], &[1.0]),
            Err(CompareError::BadSamples {
                side: "baseline",
                ..
            })
        ));
    }
}
