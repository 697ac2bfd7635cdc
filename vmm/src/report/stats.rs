//! Summary statistics over repeated runs, as mmtests' compare-kernels prints
//! them (Min, Amean, Stddev, CoeffVar, Max, BAmean-50/95/99).
//!
//! Definitions follow mmtests `bin/lib/MMTests/Stat.pm`:
//! - Stddev is the *sample* standard deviation (divides by n - 1); it is
//!   undefined for fewer than two samples (mmtests prints NaN, we give `None`).
//! - CoeffVar = Stddev * 100 / Amean. mmtests returns 0 when Amean is 0 or
//!   Stddev is NaN; we return `Some(0)` only for the 0/0 case of identical
//!   all-zero samples and `None` otherwise (undefined, not "no variation").
//! - BAmean-p is the mean of the best `floor(n * p / 100)` samples (lowest for
//!   lower-is-better metrics); with fewer than one such sample it is the mean of
//!   all samples, as mmtests' `select_data` falls back to the whole set.
//!   mmtests' `select_highest` (higher-is-better) takes one sample more than
//!   `select_lowest`; we take `floor(n * p / 100)` in both directions.
//! - The % difference of a compare column against the baseline is mmtests'
//!   `pndiff` for lower-is-better figures, `100 - compare * 100 / base`, and
//!   `pdiff` for higher-is-better ones, `compare * 100 / base - 100`: positive
//!   means better, negative worse (0.24 s -> 0.30 s shows -25.00%). Stddev
//!   and CoeffVar always use `pndiff` (less variation is better).

use serde::{Deserialize, Serialize};

/// One row kind of the compare table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stat {
    Min,
    Amean,
    Stddev,
    CoeffVar,
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
    pub min: f64,
    pub amean: f64,
    /// Sample standard deviation; `None` with fewer than two samples.
    pub stddev: Option<f64>,
    /// Stddev as a percentage of Amean; `None` where undefined.
    pub coeffvar: Option<f64>,
    pub max: f64,
    pub bamean50: f64,
    pub bamean95: f64,
    pub bamean99: f64,
}

/// Why samples cannot be summarised.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SummaryError {
    #[error("no samples")]
    Empty,
    #[error("sample {index} is not a finite number ({value})")]
    NotFinite { index: usize, value: f64 },
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
        let stddev = (n > 1).then(|| {
            let ss: f64 = samples.iter().map(|x| (x - amean).powi(2)).sum();
            (ss / (n - 1) as f64).sqrt()
        });
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
        })
    }

    /// Number of samples.
    pub fn n(&self) -> usize {
        self.samples.len()
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

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// mmtests-style % difference of `compare` against `base`: positive = better.
///
/// `None` when the baseline is 0 and the compare value is not (no finite
/// percentage exists; mmtests would print -99 or 100 there).
pub fn diff_pct(compare: f64, base: f64, lower_is_better: bool) -> Option<f64> {
    if compare == base {
        return Some(0.0);
    }
    if base == 0.0 {
        return None;
    }
    let ratio = compare * 100.0 / base;
    Some(if lower_is_better {
        100.0 - ratio
    } else {
        ratio - 100.0
    })
}

/// Plain relative change of `compare` against `base` in %, regardless of
/// direction: positive = grew (`(compare - base) / base * 100`). `None` when
/// the baseline is 0 and the compare value is not.
pub fn delta_pct(compare: f64, base: f64) -> Option<f64> {
    if compare == base {
        return Some(0.0);
    }
    if base == 0.0 {
        return None;
    }
    Some((compare - base) * 100.0 / base)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

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

    /// 0.24 s -> 0.30 s (lower is better): 100 - 0.30*100/0.24 = 100 - 125 = -25.
    /// 812 -> 1523 cycles: 100 - 152300/812 = 100 - 187.5616 = -87.5616.
    /// 100 -> 120 ops/s (higher is better): 120*100/100 - 100 = +20.
    #[test]
    fn percent_differences() {
        assert!(close(diff_pct(0.30, 0.24, true).unwrap(), -25.0));
        assert!(close(
            diff_pct(1523.0, 812.0, true).unwrap(),
            -87.561_576_354_679_8
        ));
        assert!(close(diff_pct(120.0, 100.0, false).unwrap(), 20.0));
        assert_eq!(diff_pct(2.0, 0.0, true), None);
        assert_eq!(diff_pct(0.0, 0.0, true), Some(0.0));
        assert!(close(delta_pct(0.30, 0.24).unwrap(), 25.0));
        assert!(close(
            delta_pct(1523.0, 812.0).unwrap(),
            87.561_576_354_679_8
        ));
        assert_eq!(delta_pct(2.0, 0.0), None);
        assert!(Stat::Stddev.lower_is_better(false) && !Stat::Amean.lower_is_better(false));
        for s in Stat::ALL {
            assert_eq!(Stat::from_key(s.key()), Some(s));
        }
    }
}
