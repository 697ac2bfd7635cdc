//! What `compare` does while its runs run (the experiment's `Progress`).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use super::durations::{CpuTimes, Durations};
use super::side::rates;
use crate::experiment::{Progress, RunId};
use crate::report::{Condition, RunSummary};

/// What compare does while the runs run: the progress bar, each side's CPU
/// times, telemetry warnings, the cross-checks that disagree, and a
/// `--fail-if` naming a metric the runs do not produce (a typo: said after
/// the first run, not the last).
pub(super) struct Watcher<'a> {
    pub(super) bar: &'a indicatif::ProgressBar,
    pub(super) quiet: bool,
    pub(super) started: Instant,
    pub(super) before: Option<CpuTimes>,
    pub(super) durations: [Durations; 2],
    pub(super) disagreements: Vec<String>,
    pub(super) conditions: &'a [Condition],
    pub(super) checked: bool,
}

impl Progress<RunSummary> for Watcher<'_> {
    fn starting(&mut self, run: &RunId) {
        // Only on a terminal, and only once the compare has taken a while:
        // a short compare stays silent.
        if self.bar.is_hidden()
            && !self.quiet
            && std::io::stderr().is_terminal()
            && self.started.elapsed() > Duration::from_secs(2)
        {
            self.bar
                .set_draw_target(indicatif::ProgressDrawTarget::stderr());
        }
        self.bar.set_message(run.label.clone());
        self.before = Some(CpuTimes::now());
    }

    fn ran(&mut self, run: &RunId) {
        if let (false, Some(before)) = (run.warming, &self.before) {
            self.durations[run.side].add(before, &CpuTimes::now());
        }
    }

    fn finished(&mut self, run: &RunId, s: &RunSummary) -> Result<(), String> {
        let what = run.what();
        if !s.telemetry_valid() {
            self.bar.suspend(|| {
                say!(
                    "ptiscope compare: warning: {what}: guest telemetry invalid: {}",
                    s.telemetry_problems.join("; ")
                )
            });
        }
        if !run.warming {
            for c in s.cross_checks.iter().filter(|c| !c.agrees) {
                self.disagreements.push(format!(
                    "{what}: {}: {} {} vs {} {}",
                    c.what, c.host_metric, c.host_value, c.guest_metric, c.guest_value
                ));
            }
            if !std::mem::replace(&mut self.checked, true) {
                let names: Vec<String> = rates(s).into_iter().map(|(m, _)| m.name).collect();
                if let Some(c) = self.conditions.iter().find(|c| !names.contains(&c.metric)) {
                    return Err(format!(
                        "--fail-if: no metric {:?} in these runs (metrics: {})",
                        c.metric,
                        names.join(" ")
                    ));
                }
            }
        }
        self.bar.inc(1);
        Ok(())
    }
}
