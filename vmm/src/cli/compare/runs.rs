//! How many runs: a fixed `--runs N`, or `--runs auto` adding interleaved
//! pairs until the main time metric's confidence interval is narrow enough.

use std::io::IsTerminal;

use crate::cli::compare::side::rates;
use crate::report::RunSummary;

use crate::experiment::RunsStop;

/// A progress bar over `total` runs, drawn on a terminal unless `quiet`:
/// at once with `now`, else hidden until the caller shows it (shared with
/// `sweep`).
pub(crate) fn progress(total: u64, quiet: bool, now: bool) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(total),
        indicatif::ProgressDrawTarget::hidden(),
    );
    if !quiet && std::io::stderr().is_terminal() {
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} runs {msg}",
        ) {
            bar.set_style(style);
        }
        if now {
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        }
    }
    bar
}

/// What `--runs` did, for the text and the JSON (`runs`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunsReport {
    /// `fixed` or `auto`.
    pub mode: &'static str,
    /// Measured runs per side.
    pub per_side: u32,
    /// Discarded warm-up pairs.
    pub warmup: u32,
    /// `--runs auto`: the metric watched, the target and the limit.
    pub metric: Option<String>,
    /// `--runs auto`: `--target-ci`, in % of the mean.
    pub target_ci_pct: Option<f64>,
    /// `--runs auto`: `--max-runs`.
    pub max_runs: Option<u32>,
    /// The watched metric's CI half-width in % of its mean at the end,
    /// per side (`null` where undefined).
    pub final_ci_pct: Option<[Option<f64>; 2]>,
    /// Why the runs ended.
    pub stopped: RunsStop,
}

impl RunsReport {
    /// One sentence for the text report.
    pub fn sentence(&self) -> String {
        let pct = |v: Option<f64>| v.map_or("n/a".to_owned(), |v| format!("{v:.2} %"));
        let ci = self
            .final_ci_pct
            .map(|[b, c]| format!("baseline {}, compare {}", pct(b), pct(c)))
            .unwrap_or_default();
        let warm = if self.warmup > 0 {
            format!(" (plus {} discarded warm-up pair(s))", self.warmup)
        } else {
            String::new()
        };
        let metric = self.metric.as_deref().unwrap_or("-");
        let target = self.target_ci_pct.unwrap_or(0.0);
        match self.stopped {
            RunsStop::Fixed => format!(
                "{} run{} per side{warm}",
                self.per_side,
                if self.per_side == 1 { "" } else { "s" }
            ),
            RunsStop::TargetReached => format!(
                "--runs auto: stopped after {} runs per side{warm}: the 95 % CI of {metric}'s \
                 mean is within {target} % of it on both sides ({ci})",
                self.per_side
            ),
            RunsStop::Partial => format!(
                "PARTIAL: stopped after {} complete run pairs{warm}",
                self.per_side
            ),
            RunsStop::MaxRuns => format!(
                "--runs auto: stopped at --max-runs {} runs per side{warm}: the 95 % CI of \
                 {metric}'s mean did NOT reach {target} % ({ci})",
                self.per_side
            ),
        }
    }
}

/// The CI half-width of `metric`'s mean in % of the mean over `runs`.
pub(super) fn ci_pct(runs: &[RunSummary], metric: &str) -> Option<f64> {
    let samples: Vec<f64> = runs
        .iter()
        .filter_map(|r| rates(r).into_iter().find(|(m, _)| m.name == metric))
        .map(|(_, v)| v)
        .collect();
    if samples.len() != runs.len() {
        return None;
    }
    crate::report::stats::mean_ci95(&samples)?.relative_pct
}
