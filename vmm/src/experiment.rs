//! The experiment runner: two or more sides (configurations) run again and
//! again, interleaved so that slow drifts of a noisy host hit every side
//! alike, after discarded warm-up rounds, for a fixed number of runs or
//! (`--runs auto`) until the watched metric's confidence interval is narrow
//! enough on every side.
//!
//! `compare` runs one experiment; `sweep` runs one per grid cell, a round of
//! each cell at a time; poundsyscall's table runs one per thread count. The
//! runner knows nothing of backends, guests or exit codes: it is handed a
//! function that runs one side once and returns its sample (or an error),
//! and a [`Progress`] that is told of every run. What a run failing means for
//! the process (its exit code) is `cli::exit_code`'s business.

use serde::Serialize;

/// How many measured runs per side.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RunCount {
    /// Exactly this many runs per side.
    Fixed(u32),
    /// Rounds until the watched metric's 95 % CI half-width is within
    /// `target_ci_pct` % of its mean on every side (after at least
    /// [`MIN_AUTO_RUNS`] runs), or `max_runs` runs per side.
    Auto {
        /// The most runs per side.
        max_runs: u32,
        /// The target CI half-width, in % of the mean.
        target_ci_pct: f64,
    },
}

/// `--runs auto`: runs per side before the first look at the confidence
/// interval (Student's t with 1 degree of freedom is 12.7 wide: two runs say little).
pub const MIN_AUTO_RUNS: u32 = 3;

impl RunCount {
    /// The most measured runs per side.
    pub fn max_runs(self) -> u32 {
        match self {
            RunCount::Fixed(n) => n,
            RunCount::Auto { max_runs, .. } => max_runs,
        }
    }

    /// The CI target of `--runs auto`.
    pub fn target_ci_pct(self) -> Option<f64> {
        match self {
            RunCount::Fixed(_) => None,
            RunCount::Auto { target_ci_pct, .. } => Some(target_ci_pct),
        }
    }
}

/// How the runs of an experiment ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunsStop {
    /// A fixed count: that many runs per side.
    Fixed,
    /// `--runs auto`: the CI half-width reached the target on every side.
    TargetReached,
    /// `--runs auto`: the most runs per side reached first.
    MaxRuns,
    /// A signal or a failed run stopped the experiment: the complete rounds
    /// before it are kept.
    Partial,
}

/// One run of one side, as the runner names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunId {
    /// The side's index (0 = the baseline).
    pub side: usize,
    /// The side's label.
    pub label: String,
    /// A discarded warm-up run.
    pub warming: bool,
    /// The run's number within its kind (warm-up or measured), from 1.
    pub number: u32,
}

impl RunId {
    /// `pti=on run 3`, `pti=on warm-up run 1`.
    pub fn what(&self) -> String {
        if self.warming {
            format!("{} warm-up run {}", self.label, self.number)
        } else {
            format!("{} run {}", self.label, self.number)
        }
    }
}

/// What the caller is told while an experiment runs (a progress bar, CPU
/// times, warnings). Every method has a do-nothing default.
pub trait Progress<T> {
    /// A run is about to start.
    fn starting(&mut self, _run: &RunId) {}
    /// A run has ended, well or not (before its sample is looked at).
    fn ran(&mut self, _run: &RunId) {}
    /// A run gave its sample (warm-up runs too). An error stops the
    /// experiment at once, without a partial result.
    fn finished(&mut self, _run: &RunId, _sample: &T) -> Result<(), String> {
        Ok(())
    }
}

/// A [`Progress`] that is told nothing.
pub struct Silent;

impl<T> Progress<T> for Silent {}

/// Why an experiment stopped without a result.
#[derive(Debug, thiserror::Error)]
pub enum ExperimentError<E: std::error::Error + 'static> {
    /// A run failed before any complete round (or while warming up).
    #[error("{} failed: {source}", .run.what())]
    Run {
        /// The run that failed.
        run: RunId,
        /// Why.
        #[source]
        source: E,
    },
    /// The caller's [`Progress::finished`] refused a sample.
    #[error("{0}")]
    Refused(String),
}

/// A run that failed after complete rounds: the experiment's result is
/// those rounds, marked partial.
#[derive(Debug)]
pub struct Failed<E> {
    /// The run that failed.
    pub run: RunId,
    /// Why.
    pub error: E,
}

/// What an experiment gave.
#[derive(Debug)]
pub struct Outcome<T, E> {
    /// The measured samples per side; as many on every side.
    pub runs: Vec<Vec<T>>,
    /// How the runs ended.
    pub stopped: RunsStop,
    /// With [`RunsStop::Partial`]: the run that failed.
    pub failed: Option<Failed<E>>,
}

/// One experiment's sides and samples, run round by round.
#[derive(Debug)]
pub struct Experiment<T> {
    labels: Vec<String>,
    runs: Vec<Vec<T>>,
}

impl<T> Experiment<T> {
    /// An experiment over these sides (the first is the baseline).
    pub fn new(labels: Vec<String>) -> Self {
        let runs = labels.iter().map(|_| Vec::new()).collect();
        Experiment { labels, runs }
    }

    /// The measured samples so far, per side.
    pub fn runs(&self) -> &[Vec<T>] {
        &self.runs
    }

    /// The samples, per side.
    pub fn into_runs(self) -> Vec<Vec<T>> {
        self.runs
    }

    /// One round: every side once, the order rotated by `rotation` (side
    /// `(k + rotation) % n` runs k-th), numbered `number`. Measured samples
    /// are kept; a warm-up round's are dropped. Stops at the first failure.
    pub fn round<E: std::error::Error + 'static>(
        &mut self,
        rotation: usize,
        number: u32,
        warming: bool,
        run_one: &mut dyn FnMut(&RunId) -> Result<T, E>,
        progress: &mut dyn Progress<T>,
    ) -> Result<(), ExperimentError<E>> {
        let n = self.labels.len();
        for k in 0..n {
            let side = (k + rotation) % n;
            let id = RunId {
                side,
                label: self.labels[side].clone(),
                warming,
                number,
            };
            progress.starting(&id);
            let result = run_one(&id);
            progress.ran(&id);
            let sample = result.map_err(|source| ExperimentError::Run {
                run: id.clone(),
                source,
            })?;
            progress
                .finished(&id, &sample)
                .map_err(ExperimentError::Refused)?;
            if !warming {
                self.runs[side].push(sample);
            }
        }
        Ok(())
    }

    /// The whole experiment: `warmup` discarded rounds, then measured rounds
    /// until `count` says stop (`ci` gives the watched metric's CI half-width
    /// in % of its mean over one side's samples, for `--runs auto`). Round i
    /// runs the sides rotated by i. A run failing after complete measured
    /// rounds ends it with those rounds ([`RunsStop::Partial`]); failing
    /// earlier, or while warming up, is an error.
    pub fn run<E: std::error::Error + 'static>(
        mut self,
        warmup: u32,
        count: RunCount,
        ci: &dyn Fn(&[T]) -> Option<f64>,
        run_one: &mut dyn FnMut(&RunId) -> Result<T, E>,
        progress: &mut dyn Progress<T>,
    ) -> Result<Outcome<T, E>, ExperimentError<E>> {
        let mut round: u32 = 0;
        let stopped = loop {
            let warming = round < warmup;
            let number = if warming {
                round + 1
            } else {
                round - warmup + 1
            };
            match self.round(round as usize, number, warming, run_one, progress) {
                Ok(()) => {}
                Err(ExperimentError::Run { run, source }) => {
                    let complete = self.runs.iter().map(Vec::len).min().unwrap_or(0);
                    if warming || complete == 0 {
                        return Err(ExperimentError::Run { run, source });
                    }
                    for r in &mut self.runs {
                        r.truncate(complete);
                    }
                    return Ok(Outcome {
                        runs: self.runs,
                        stopped: RunsStop::Partial,
                        failed: Some(Failed { run, error: source }),
                    });
                }
                Err(e) => return Err(e),
            }
            round += 1;
            if warming {
                continue;
            }
            let done = round - warmup;
            match count {
                RunCount::Fixed(n) if done >= n => break RunsStop::Fixed,
                RunCount::Fixed(_) => {}
                RunCount::Auto {
                    max_runs,
                    target_ci_pct,
                } => {
                    let reached = self
                        .runs
                        .iter()
                        .all(|r| ci(r).is_some_and(|c| c <= target_ci_pct));
                    if done >= MIN_AUTO_RUNS && reached {
                        break RunsStop::TargetReached;
                    }
                    if done >= max_runs {
                        break RunsStop::MaxRuns;
                    }
                }
            }
        };
        Ok(Outcome {
            runs: self.runs,
            stopped,
            failed: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("boom")]
    struct Boom;

    /// Records the order the runs ran in.
    #[derive(Default)]
    struct Log(Vec<String>);

    impl Progress<f64> for Log {
        fn starting(&mut self, run: &RunId) {
            self.0.push(run.what());
        }
    }

    fn labels() -> Vec<String> {
        vec!["b".into(), "c".into()]
    }

    #[test]
    fn rounds_interleave_after_warm_up() {
        let mut log = Log::default();
        let out = Experiment::new(labels())
            .run(
                1,
                RunCount::Fixed(2),
                &|_| None,
                &mut |id: &RunId| Ok::<_, Boom>(id.side as f64),
                &mut log,
            )
            .unwrap();
        assert_eq!(
            log.0,
            [
                "b warm-up run 1",
                "c warm-up run 1",
                "c run 1",
                "b run 1",
                "b run 2",
                "c run 2"
            ]
        );
        assert_eq!(out.runs, vec![vec![0.0, 0.0], vec![1.0, 1.0]]);
        assert_eq!(out.stopped, RunsStop::Fixed);
    }

    #[test]
    fn auto_stops_at_the_target_or_the_limit() {
        let run = |ci: Option<f64>, max_runs| {
            Experiment::new(labels())
                .run(
                    0,
                    RunCount::Auto {
                        max_runs,
                        target_ci_pct: 1.0,
                    },
                    &move |_: &[f64]| ci,
                    &mut |_: &RunId| Ok::<_, Boom>(1.0),
                    &mut Silent,
                )
                .unwrap()
        };
        let o = run(Some(0.5), 20);
        assert_eq!((o.stopped, o.runs[0].len()), (RunsStop::TargetReached, 3));
        let o = run(Some(2.0), 5);
        assert_eq!((o.stopped, o.runs[1].len()), (RunsStop::MaxRuns, 5));
        let o = run(None, 4);
        assert_eq!((o.stopped, o.runs[1].len()), (RunsStop::MaxRuns, 4));
    }

    #[test]
    fn a_failure_after_complete_rounds_is_partial_and_before_is_an_error() {
        let fail_at = |n: usize| {
            let mut calls = 0;
            Experiment::new(labels()).run(
                0,
                RunCount::Fixed(5),
                &|_| None,
                &mut move |_: &RunId| {
                    calls += 1;
                    if calls == n {
                        Err(Boom)
                    } else {
                        Ok(1.0)
                    }
                },
                &mut Silent,
            )
        };
        match fail_at(2) {
            Err(ExperimentError::Run { run, .. }) => assert_eq!(run.what(), "c run 1"),
            other => panic!("{other:?}"),
        }
        let o = fail_at(4).unwrap();
        assert_eq!(o.stopped, RunsStop::Partial);
        assert_eq!(o.runs, vec![vec![1.0], vec![1.0]]);
        assert_eq!(o.failed.unwrap().run.what(), "b run 2");
    }

    #[test]
    fn a_refused_sample_stops_at_once() {
        struct Refuse;
        impl Progress<f64> for Refuse {
            fn finished(&mut self, _: &RunId, _: &f64) -> Result<(), String> {
                Err("no".into())
            }
        }
        let e = Experiment::new(labels())
            .run(
                0,
                RunCount::Fixed(1),
                &|_| None,
                &mut |_: &RunId| Ok::<_, Boom>(1.0),
                &mut Refuse,
            )
            .unwrap_err();
        assert_eq!(e.to_string(), "no");
    }
}
