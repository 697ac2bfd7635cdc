//! The summary row of one side's samples, as mmtests' compare-kernels
//! prints it (Min, Amean, Stddev, CoeffVar, Max, BAmean-50/95/99), with the
//! mean's confidence interval and, for counts, the integers behind it.

use serde::{Deserialize, Serialize};

use super::counts::CountRuns;
use super::estimators::{mean, mean_ci95, sample_stddev, MeanCi};

/// One row kind of the compare table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stat {
    /// Smallest sample.
    Min,
    /// Arithmetic mean.
    Amean,
    /// Sample standard deviation.
    Stddev,
    /// Stddev as a percentage of Amean.
    CoeffVar,
    /// Largest sample.
    Max,
    /// Mean of the best 50 % of samples.
    BAmean50,
    /// Mean of the best 95 % of samples.
    BAmean95,
    /// Mean of the best 99 % of samples.
    BAmean99,
}

impl Stat {
    /// The rows compare-kernels prints, in its order.
    pub const ALL: [Stat; 8] = [
        Stat::Min,
        Stat::Amean,
        Stat::Stddev,
        Stat::CoeffVar,
        Stat::Max,
        Stat::BAmean50,
        Stat::BAmean95,
        Stat::BAmean99,
    ];

    /// Row title as mmtests prints it (`BAmean-50`).
    pub fn title(self) -> &'static str {
        match self {
            Stat::Min => "Min",
            Stat::Amean => "Amean",
            Stat::Stddev => "Stddev",
            Stat::CoeffVar => "CoeffVar",
            Stat::Max => "Max",
            Stat::BAmean50 => "BAmean-50",
            Stat::BAmean95 => "BAmean-95",
            Stat::BAmean99 => "BAmean-99",
        }
    }

    /// Stable key for JSON, CSV and `--fail-if` (`bamean50`).
    pub fn key(self) -> &'static str {
        match self {
            Stat::Min => "min",
            Stat::Amean => "amean",
            Stat::Stddev => "stddev",
            Stat::CoeffVar => "coeffvar",
            Stat::Max => "max",
            Stat::BAmean50 => "bamean50",
            Stat::BAmean95 => "bamean95",
            Stat::BAmean99 => "bamean99",
        }
    }

    /// The stat whose key is `key`.
    pub fn from_key(key: &str) -> Option<Stat> {
        Stat::ALL.into_iter().find(|s| s.key() == key)
    }

    /// Whether a smaller value of this statistic is better, given the
    /// metric's direction: variation is always better smaller.
    pub fn lower_is_better(self, metric_lower_is_better: bool) -> bool {
        match self {
            Stat::Stddev | Stat::CoeffVar => true,
            _ => metric_lower_is_better,
        }
    }
}

/// Summary of one metric over the runs of one configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The raw per-run values, in run order.
    pub samples: Vec<f64>,
    /// Smallest sample.
    pub min: f64,
    /// Arithmetic mean.
    pub amean: f64,
    /// Sample standard deviation; `None` with fewer than two samples.
    pub stddev: Option<f64>,
    /// Stddev as a percentage of Amean; `None` where undefined.
    pub coeffvar: Option<f64>,
    /// Largest sample.
    pub max: f64,
    /// Mean of the best 50 % of samples.
    pub bamean50: f64,
    /// Mean of the best 95 % of samples.
    pub bamean95: f64,
    /// Mean of the best 99 % of samples.
    pub bamean99: f64,
    /// The mean's 95 % confidence interval (Student's t); `None` with fewer
    /// than two samples. Absent in documents written before it existed.
    #[serde(default)]
    pub ci95: Option<MeanCi>,
    /// The per-run integer counts behind `samples` when the metric is a
    /// count (each sample is `counts[i] / calls[i]`); exactness is decided
    /// on them. Absent for measured quantities (times) and in documents
    /// written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counts: Option<CountRuns>,
}

/// Why samples cannot be summarised.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SummaryError {
    /// No samples at all.
    #[error("no samples")]
    Empty,
    /// A sample is NaN or infinite.
    #[error("sample {index} is not a finite number ({value})")]
    NotFinite {
        /// Its position in the samples.
        index: usize,
        /// The sample.
        value: f64,
    },
}

impl Summary {
    /// Summarises `samples`; `lower_is_better` picks the "best" samples for BAmean.
    pub fn new(samples: &[f64], lower_is_better: bool) -> Result<Self, SummaryError> {
        if samples.is_empty() {
            return Err(SummaryError::Empty);
        }
        if let Some((index, &value)) = samples.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(SummaryError::NotFinite { index, value });
        }
        let n = samples.len();
        let amean = mean(samples);
        let stddev = sample_stddev(samples);
        let coeffvar = match stddev {
            Some(sd) if amean != 0.0 => Some(sd * 100.0 / amean),
            Some(0.0) => Some(0.0),
            _ => None,
        };
        let mut sorted = samples.to_vec();
        // total_cmp: all values are finite here, so this is the usual order.
        sorted.sort_by(f64::total_cmp);
        if !lower_is_better {
            sorted.reverse();
        }
        let best_mean = |pct: usize| {
            let k = n * pct / 100;
            if k == 0 {
                amean
            } else {
                mean(&sorted[..k])
            }
        };
        Ok(Summary {
            samples: samples.to_vec(),
            min: samples.iter().copied().fold(f64::INFINITY, f64::min),
            amean,
            stddev,
            coeffvar,
            max: samples.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            bamean50: best_mean(50),
            bamean95: best_mean(95),
            bamean99: best_mean(99),
            ci95: mean_ci95(samples),
            counts: None,
        })
    }

    /// Summarises a count's runs: the samples are the per-call rates, and
    /// exactness is the integers' ([`CountRuns::exact`]).
    pub fn from_counts(counts: CountRuns, lower_is_better: bool) -> Result<Self, SummaryError> {
        let mut s = Summary::new(&counts.rates(), lower_is_better)?;
        s.counts = Some(counts);
        Ok(s)
    }

    /// Number of samples.
    pub fn n(&self) -> usize {
        self.samples.len()
    }

    /// Whether every run gave the same value (an exact counter, such as
    /// CR3 writes per call), over two runs at least: there is no noise to
    /// infer about. A count's integers decide, not the floats.
    pub fn exact(&self) -> bool {
        self.n() > 1
            && self
                .counts
                .as_ref()
                .map_or(self.stddev == Some(0.0), CountRuns::exact)
    }

    /// How many runs differ from the most common value: a count's runs by
    /// integer comparison, `None` for a measured quantity.
    pub fn runs_differing(&self) -> Option<usize> {
        self.counts.as_ref().map(CountRuns::runs_differing)
    }

    /// The value of one statistic (`None` where undefined).
    pub fn get(&self, stat: Stat) -> Option<f64> {
        match stat {
            Stat::Min => Some(self.min),
            Stat::Amean => Some(self.amean),
            Stat::Stddev => self.stddev,
            Stat::CoeffVar => self.coeffvar,
            Stat::Max => Some(self.max),
            Stat::BAmean50 => Some(self.bamean50),
            Stat::BAmean95 => Some(self.bamean95),
            Stat::BAmean99 => Some(self.bamean99),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::stats::tests::close;

    /// Fixture computed by hand:
    /// samples 2 4 4 4 5 5 7 9 (n = 8), sum 40, Amean 5.
    /// Squared deviations 9 1 1 1 0 0 4 16, sum 32; sample variance 32/7,
    /// Stddev sqrt(32/7) = 2.138089935...; CoeffVar 2.138089935 * 100 / 5 = 42.7617987...
    /// BAmean-50: floor(8*50/100) = 4 lowest: 2 4 4 4 -> 14/4 = 3.5.
    /// BAmean-95: floor(7.6) = 7 lowest: 2 4 4 4 5 5 7 -> 31/7 = 4.428571...
    /// BAmean-99: floor(7.92) = 7 -> same 31/7.
    /// Higher-is-better BAmean-50: 4 highest 9 7 5 5 -> 26/4 = 6.5;
    /// BAmean-95: 9 7 5 5 4 4 4 -> 38/7 = 5.428571...
    #[test]
    fn hand_computed_fixture() {
        let s = [5.0, 4.0, 9.0, 2.0, 4.0, 7.0, 4.0, 5.0];
        let lo = Summary::new(&s, true).unwrap();
        assert_eq!((lo.min, lo.max, lo.n()), (2.0, 9.0, 8));
        assert!(close(lo.amean, 5.0));
        assert!(close(lo.stddev.unwrap(), (32.0f64 / 7.0).sqrt()));
        assert!(close(lo.stddev.unwrap(), 2.138_089_935_299_395));
        assert!(close(lo.coeffvar.unwrap(), 42.761_798_705_987_9));
        assert!(close(lo.bamean50, 3.5));
        assert!(close(lo.bamean95, 31.0 / 7.0));
        assert!(close(lo.bamean99, 31.0 / 7.0));
        let hi = Summary::new(&s, false).unwrap();
        assert!(close(hi.bamean50, 6.5));
        assert!(close(hi.bamean95, 38.0 / 7.0));
        assert_eq!(hi.samples, s.to_vec(), "samples keep run order");
    }

    /// One sample: no stddev; BAmean falls back to the mean (floor(0.5) = 0).
    /// Two identical zero samples: Stddev 0, CoeffVar 0 (0/0 by convention).
    #[test]
    fn degenerate_inputs() {
        let one = Summary::new(&[3.0], true).unwrap();
        assert_eq!((one.stddev, one.coeffvar), (None, None));
        assert_eq!((one.bamean50, one.bamean99), (3.0, 3.0));
        let zeros = Summary::new(&[0.0, 0.0], true).unwrap();
        assert_eq!((zeros.stddev, zeros.coeffvar), (Some(0.0), Some(0.0)));
        let mixed = Summary::new(&[-1.0, 1.0], true).unwrap();
        assert_eq!(mixed.coeffvar, None, "mean 0 with spread: undefined");
        assert_eq!(Summary::new(&[], true), Err(SummaryError::Empty));
        assert!(matches!(
            Summary::new(&[1.0, f64::NAN], true),
            Err(SummaryError::NotFinite { index: 1, .. })
        ));
    }
}
