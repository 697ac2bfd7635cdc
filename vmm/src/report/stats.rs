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
//!
//! Inference, for `compare` and `sweep` alike (a small API on plain sample
//! slices, so any command can call it):
//! - [`mean_ci95`]: the mean with its 95 % confidence interval, Student's t
//!   quantile with n − 1 degrees of freedom times the standard error
//!   (`t(0.975, n-1) * s / sqrt(n)`), right for small n where the normal
//!   quantile would be too narrow.
//! - [`welch_t_test`]: Welch's unequal-variances t-test, two-sided p-value,
//!   and the 95 % confidence interval of the difference of the means from
//!   the same t distribution. It gives the one verdict every line prints
//!   ([`significance_of`]): significant when p < 0.05, which is when that
//!   interval excludes 0 (the same statement about the same |t|).
//! - Counters that are whole numbers in each run ([`CountRuns`]: a count and
//!   the calls it is per) are compared as integers: a side is exact when
//!   every run has the same per-call rational (`count_i * calls_j ==
//!   count_j * calls_i`), and two exact sides are equal or differ by the same
//!   integer comparison, with no interval, t or p (a float mean of identical
//!   rates can differ from them in the last bit, which once made a constant
//!   26.0088495575221 "differ" with t = 1.47e16).
//! - [`mmtests_significance`]: mmtests' own rule, which compare-kernels uses
//!   to print a difference as `*  x.xx%*` instead of `(  x.xx%)`. From
//!   gormanm/mmtests `bin/lib/MMTests/Stat.pm` (`calc_meanci`: the interval
//!   is mean ± `qnorm(0.975) * stddev`, the sample stddev itself, not the
//!   standard error; `cidiff`: the difference of the means divided by the
//!   sum of the two half-widths on the sides facing each other, or the plain
//!   difference when that sum is 0), `Compare.pm` (`_generateComparisonTable`:
//!   significant when |cidiff| > 1; `_generateRenderTable`: only the Amean
//!   row is marked) and `PrintGeneric.pm` (`printRow` replaces the format's
//!   parentheses by `*`). Reported under its own name (`mmtests`, its
//!   ratio `cidiff`) beside the verdict, never as a second verdict.
//!
//! The quantiles and the t distribution come from the `statrs` crate.
//!
//! Size: about 730 lines with the doc comments (the mmtests statistics,
//! inference and the integer counts belong together: exactness decides
//! which inference runs); the rest are tests against reference values
//! (SciPy, mmtests, closed forms) and seeded properties.

use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, Normal, StudentsT};

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

/// The integer totals of a count over the runs of one side: each run's
/// count and the calls it is per. Per-call rates are rationals of these;
/// they are compared as such, never as floats.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountRuns {
    /// Each run's count over its measured phase, in run order.
    pub counts: Vec<u64>,
    /// Each run's calls (the divisor of its rate), in run order; never 0.
    pub calls: Vec<u64>,
}

impl CountRuns {
    /// The runs' counts and calls; `None` when the lengths differ, there
    /// are no runs, or a run has no calls (no rate).
    pub fn new(counts: Vec<u64>, calls: Vec<u64>) -> Option<Self> {
        (counts.len() == calls.len() && !counts.is_empty() && calls.iter().all(|&c| c > 0))
            .then_some(CountRuns { counts, calls })
    }

    /// Number of runs.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// Whether there are no runs (never, for a value `new` made).
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Run `i`'s count and calls.
    fn run(&self, i: usize) -> (u64, u64) {
        (self.counts[i], self.calls[i])
    }

    /// Each run's rate as a float: `count / calls`, one correctly rounded
    /// division, so equal rationals give the same float.
    pub fn rates(&self) -> Vec<f64> {
        (0..self.len())
            .map(|i| self.counts[i] as f64 / self.calls[i] as f64)
            .collect()
    }

    /// Whether every run has the same per-call rate (integer comparison).
    pub fn exact(&self) -> bool {
        (1..self.len()).all(|i| same_rate(self.run(0), self.run(i)))
    }

    /// How many runs have a rate other than the most common one (0 when
    /// exact).
    pub fn runs_differing(&self) -> usize {
        let most = (0..self.len())
            .map(|i| {
                (0..self.len())
                    .filter(|&j| same_rate(self.run(i), self.run(j)))
                    .count()
            })
            .max()
            .unwrap_or(0);
        self.len() - most
    }

    /// Whether this side's first run has the same rate as `other`'s (for
    /// two exact sides: whether they are equal).
    pub fn same_rate_as(&self, other: &CountRuns) -> bool {
        !self.is_empty() && !other.is_empty() && same_rate(self.run(0), other.run(0))
    }
}

/// `a.0 / a.1 == b.0 / b.1` for positive divisors, exactly: cross products
/// in 128 bits cannot overflow.
fn same_rate(a: (u64, u64), b: (u64, u64)) -> bool {
    u128::from(a.0) * u128::from(b.1) == u128::from(b.0) * u128::from(a.1)
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

/// The mean; identical samples give that very value (a sum divided back
/// can be off by one in the last bit, and a constant must stay constant).
fn mean(v: &[f64]) -> f64 {
    if all_equal(v) {
        return v[0];
    }
    v.iter().sum::<f64>() / v.len() as f64
}

/// Whether `v` is non-empty and all its values are the same float.
fn all_equal(v: &[f64]) -> bool {
    v.first().is_some_and(|f| v.iter().all(|x| x == f))
}

/// Below this a per-call figure is near zero: it prints as 0.00 or 0.0x
/// with two decimals, an event in fewer than one call of twenty. A
/// percentage of it (0.0012 -> 0.0113 is "+838 %"), or a bar scaled to it,
/// says nothing about the call; its values are shown instead.
pub const NEAR_ZERO: f64 = 0.05;

/// Whether `v` is near zero (0 itself included).
pub fn near_zero(v: f64) -> bool {
    v.abs() < NEAR_ZERO
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

/// The arithmetic mean; `None` for no samples.
pub fn amean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| mean(v))
}

/// The sample standard deviation (n − 1); `None` for fewer than two samples.
pub fn sample_stddev(v: &[f64]) -> Option<f64> {
    if v.len() < 2 {
        return None;
    }
    if all_equal(v) {
        return Some(0.0);
    }
    let m = mean(v);
    let ss: f64 = v.iter().map(|x| (x - m).powi(2)).sum();
    Some((ss / (v.len() - 1) as f64).sqrt())
}

/// The `p` quantile of Student's t distribution with `df` degrees of
/// freedom (`df` may be fractional, as Welch's is); `None` for `df <= 0`
/// or `p` outside (0, 1).
pub fn t_quantile(p: f64, df: f64) -> Option<f64> {
    if !(p > 0.0 && p < 1.0) {
        return None;
    }
    let t = StudentsT::new(0.0, 1.0, df).ok()?;
    Some(t.inverse_cdf(p))
}

/// The `p` quantile of the standard normal distribution (R's `qnorm(p)`);
/// `None` for `p` outside (0, 1).
pub fn normal_quantile(p: f64) -> Option<f64> {
    if !(p > 0.0 && p < 1.0) {
        return None;
    }
    Some(Normal::new(0.0, 1.0).ok()?.inverse_cdf(p))
}

/// A mean with its two-sided 95 % confidence interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MeanCi {
    /// The sample mean.
    pub mean: f64,
    /// `t(0.975, n-1) * stddev / sqrt(n)`; 0 when every sample is equal.
    pub half_width: f64,
    /// `mean - half_width`.
    pub low: f64,
    /// `mean + half_width`.
    pub high: f64,
    /// `half_width * 100 / |mean|`; `None` when the mean is 0 (0 when the
    /// half-width is 0 too).
    pub relative_pct: Option<f64>,
}

/// The mean and its 95 % confidence interval from Student's t with n − 1
/// degrees of freedom; `None` for fewer than two samples or non-finite ones.
pub fn mean_ci95(samples: &[f64]) -> Option<MeanCi> {
    if samples.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let n = samples.len();
    let sd = sample_stddev(samples)?;
    let m = mean(samples);
    let half_width = if sd == 0.0 {
        0.0
    } else {
        t_quantile(0.975, (n - 1) as f64)? * sd / (n as f64).sqrt()
    };
    let relative_pct = if half_width == 0.0 {
        Some(0.0)
    } else if m == 0.0 {
        None
    } else {
        Some(half_width * 100.0 / m.abs())
    };
    Some(MeanCi {
        mean: m,
        half_width,
        low: m - half_width,
        high: m + half_width,
        relative_pct,
    })
}

/// Welch's unequal-variances t-test of two samples.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WelchTest {
    /// `(mean_b - mean_a) / sqrt(var_a/n_a + var_b/n_b)`.
    pub t: f64,
    /// Welch–Satterthwaite degrees of freedom.
    pub df: f64,
    /// Two-sided p-value: the probability of a |t| at least this large if
    /// both samples came from populations with the same mean.
    pub p_value: f64,
    /// The 95 % confidence interval of `mean_b - mean_a`: the difference
    /// ± `t(0.975, df)` x its standard error. It excludes 0 exactly when
    /// `p_value < 0.05` (see [`WelchTest::significant`]). Absent in
    /// documents written before it existed.
    #[serde(default)]
    pub delta_ci95: Option<[f64; 2]>,
}

impl WelchTest {
    /// The one verdict: p < 0.05. The interval is made to agree with it
    /// (see [`welch_t_test`]), so no printed line can contradict itself.
    pub fn significant(&self) -> bool {
        self.p_value < 0.05
    }
}

/// Welch's t-test of `b` against `a`; `None` when a side has fewer than two
/// samples, a sample is not finite, or both sides have no variance at all
/// (exact values: they are equal or not, nothing to test).
pub fn welch_t_test(a: &[f64], b: &[f64]) -> Option<WelchTest> {
    if a.iter().chain(b).any(|v| !v.is_finite()) {
        return None;
    }
    let (na, nb) = (a.len() as f64, b.len() as f64);
    let va = sample_stddev(a)?.powi(2) / na;
    let vb = sample_stddev(b)?.powi(2) / nb;
    let se2 = va + vb;
    if se2 == 0.0 {
        return None;
    }
    let d = mean(b) - mean(a);
    let se = se2.sqrt();
    let t = d / se;
    let df = se2.powi(2) / (va.powi(2) / (na - 1.0) + vb.powi(2) / (nb - 1.0));
    let dist = StudentsT::new(0.0, 1.0, df).ok()?;
    // sf, not 1 - cdf: keeps precision for large |t|.
    let p_value = (2.0 * dist.sf(t.abs())).min(1.0);
    let delta_ci95 = t_quantile(0.975, df).map(|q| {
        let (lo, hi) = (d - q * se, d + q * se);
        // p comes from the cdf, the interval from its inverse: at
        // |t| = t(0.975, df) to within rounding they can fall on either
        // side of the line. The verdict is p's; the interval's bound
        // nearest 0 is set on 0's side the verdict says (a shift of a
        // few ulps), so the two never contradict.
        let excludes = lo > 0.0 || hi < 0.0;
        if (p_value < 0.05) != excludes {
            let near = if d > 0.0 { lo } else { hi };
            debug_assert!(
                near.abs() <= 1e-6 * (hi - lo),
                "Welch p {p_value} and CI [{lo}, {hi}] disagree beyond rounding"
            );
        }
        match (p_value < 0.05, excludes) {
            (true, false) if d > 0.0 => [f64::MIN_POSITIVE, hi],
            (true, false) if d < 0.0 => [lo, -f64::MIN_POSITIVE],
            (false, true) if d > 0.0 => [0.0, hi],
            (false, true) => [lo, 0.0],
            _ => [lo, hi],
        }
    });
    Some(WelchTest {
        t,
        df,
        p_value,
        delta_ci95,
    })
}

/// mmtests' significance of a difference of means (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MmtestsSignificance {
    /// `qnorm(0.975) * stddev` of the baseline side.
    pub baseline_half_width: f64,
    /// `qnorm(0.975) * stddev` of the compare side.
    pub compare_half_width: f64,
    /// mmtests' `cidiff`: `(mean_c - mean_b) / (half_b + half_c)`, or the
    /// plain difference when both half-widths are 0.
    pub ratio: f64,
    /// `|ratio| > 1`, mmtests' rule.
    pub significant: bool,
}

/// mmtests' rule on two samples; `None` when a side has fewer than two
/// samples (mmtests' stddev is NaN there and it marks nothing).
pub fn mmtests_significance(baseline: &[f64], compare: &[f64]) -> Option<MmtestsSignificance> {
    let z = normal_quantile(0.975)?;
    let (mb, mc) = (amean(baseline)?, amean(compare)?);
    let hb = z * sample_stddev(baseline)?;
    let hc = z * sample_stddev(compare)?;
    // cidiff adds the sides of the two intervals that face each other
    // (upper of the lower mean, lower of the higher one); the intervals are
    // symmetric, so that is the sum of the half-widths either way.
    let cisum = hb + hc;
    let diff = mc - mb;
    let ratio = if cisum == 0.0 { diff } else { diff / cisum };
    Some(MmtestsSignificance {
        baseline_half_width: hb,
        compare_half_width: hc,
        ratio,
        significant: ratio.abs() > 1.0,
    })
}

/// What can be said about the difference of two sides' means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Both sides exact (every run the same value) and equal.
    ExactEqual,
    /// Both sides exact and different: a certain difference.
    ExactDifferent,
    /// Welch: p < 0.05, the 95 % CI of the difference excludes 0.
    Significant,
    /// Welch: p >= 0.05, the 95 % CI of the difference includes 0.
    NotSignificant,
    /// A side has fewer than two samples: no variance, no inference.
    Undefined,
}

impl Verdict {
    /// Whether the text table marks the difference (`*  x.xx%*`).
    pub fn marked(self) -> bool {
        matches!(self, Verdict::ExactDifferent | Verdict::Significant)
    }

    /// Short word for tables.
    pub fn word(self) -> &'static str {
        match self {
            Verdict::ExactEqual => "exact, equal",
            Verdict::ExactDifferent => "exact, differ",
            Verdict::Significant => "significant",
            Verdict::NotSignificant => "not significant",
            Verdict::Undefined => "n/a (1 run)",
        }
    }
}

/// The rule a verdict was reached by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// Both sides exact: compared as values (counts as integers).
    Exact,
    /// Welch's t-test at 95 %: p < 0.05, equivalently the difference's
    /// 95 % CI excludes 0.
    Welch95,
    /// No rule applies (a side with one run).
    None,
}

/// The inference about one metric's baseline-vs-compare difference.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Significance {
    /// The one verdict (by `rule`).
    pub verdict: Verdict,
    /// Welch's t-test; `None` when undefined (a side with one sample, or
    /// both sides exact: a constant gets no t, p or CI).
    pub welch: Option<WelchTest>,
    /// mmtests' rule, under its own name and never the verdict; `None`
    /// when a side has one sample or both sides are exact.
    pub mmtests: Option<MmtestsSignificance>,
    /// How the verdict was reached; absent in documents written before it
    /// existed (their verdict was mmtests' rule).
    #[serde(default)]
    pub rule: Option<Rule>,
}

/// Significance of `compare` against `baseline`, from plain samples (no
/// integer counts: exactness is equality of the floats).
pub fn significance(baseline: &[f64], compare: &[f64]) -> Significance {
    match (Summary::new(baseline, true), Summary::new(compare, true)) {
        (Ok(b), Ok(c)) => significance_of(&b, &c),
        _ => Significance {
            verdict: Verdict::Undefined,
            welch: None,
            mmtests: None,
            rule: Some(Rule::None),
        },
    }
}

/// Significance of `compare` against `baseline`. Two exact sides (counts:
/// by their integers) are equal or differ, with no test; otherwise Welch's
/// test gives the verdict, and mmtests' rule is computed beside it. The
/// old zero-width fallback of mmtests (a difference above 1 in the metric's
/// unit) is not used: it called 0 vs 0.5 flushes per call the same.
pub fn significance_of(baseline: &Summary, compare: &Summary) -> Significance {
    let undefined = Significance {
        verdict: Verdict::Undefined,
        welch: None,
        mmtests: None,
        rule: Some(Rule::None),
    };
    if baseline.n() < 2 || compare.n() < 2 {
        return undefined;
    }
    if baseline.exact() && compare.exact() {
        let equal = match (&baseline.counts, &compare.counts) {
            (Some(b), Some(c)) => b.same_rate_as(c),
            _ => baseline.amean == compare.amean,
        };
        return Significance {
            verdict: if equal {
                Verdict::ExactEqual
            } else {
                Verdict::ExactDifferent
            },
            welch: None,
            mmtests: None,
            rule: Some(Rule::Exact),
        };
    }
    let mmtests = mmtests_significance(&baseline.samples, &compare.samples);
    match welch_t_test(&baseline.samples, &compare.samples) {
        Some(w) => Significance {
            verdict: if w.significant() {
                Verdict::Significant
            } else {
                Verdict::NotSignificant
            },
            welch: Some(w),
            mmtests,
            rule: Some(Rule::Welch95),
        },
        None => Significance {
            mmtests,
            ..undefined
        },
    }
}

#[cfg(test)]
pub(crate) mod tests {
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

    fn near(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs().max(1e-300)
    }

    /// Quantiles against R / SciPy: qt(0.975, 1) = 12.706204736174694,
    /// qt(0.975, 2) = 4.302652729749462, qt(0.975, 4) = 2.7764451051977934,
    /// qt(0.975, 29) = 2.045229642132703, qnorm(0.975) = 1.959963984540054.
    #[test]
    fn quantiles_match_reference_values() {
        for (df, q) in [
            (1.0, 12.706_204_736_174_694),
            (2.0, 4.302_652_729_749_462),
            (4.0, 2.776_445_105_197_793_4),
            (29.0, 2.045_229_642_132_703),
        ] {
            let got = t_quantile(0.975, df).unwrap();
            assert!(near(got, q, 1e-9), "df {df}: {got} vs {q}");
        }
        assert!(near(
            normal_quantile(0.975).unwrap(),
            1.959_963_984_540_054,
            1e-12
        ));
        assert_eq!(t_quantile(1.0, 3.0), None);
        assert_eq!(t_quantile(0.975, 0.0), None);
        assert_eq!(normal_quantile(0.0), None);
    }

    /// The fixture above: mean 5, s = 2.138089935299395, n = 8:
    /// t(0.975, 7) = 2.3646242510102993, half-width = 2.3646 * 2.1381 / sqrt(8)
    /// = 1.7874879182362098 (SciPy), 35.75 % of the mean.
    #[test]
    fn mean_confidence_interval() {
        let s = [5.0, 4.0, 9.0, 2.0, 4.0, 7.0, 4.0, 5.0];
        let ci = mean_ci95(&s).unwrap();
        assert!(near(ci.half_width, 1.787_487_918_236_209_8, 1e-9));
        assert!(near(ci.low, 5.0 - 1.787_487_918_236_209_8, 1e-9));
        assert!(near(ci.relative_pct.unwrap(), 35.749_758_364_724_2, 1e-9));
        assert_eq!(Summary::new(&s, true).unwrap().ci95, Some(ci));
        // n = 5: 30.1 29.5 31.2 30.8 29.9 -> mean 30.3, s 0.689202437604511,
        // half-width 2.7764 * 0.6892 / sqrt(5) = 0.8557578542477975 (SciPy).
        let ci = mean_ci95(&[30.1, 29.5, 31.2, 30.8, 29.9]).unwrap();
        assert!(near(ci.mean, 30.3, 1e-12));
        assert!(near(ci.half_width, 0.855_757_854_247_797_5, 1e-9));
        // Exact: zero width; one sample: undefined.
        let exact = mean_ci95(&[2.0, 2.0, 2.0]).unwrap();
        assert_eq!((exact.half_width, exact.relative_pct), (0.0, Some(0.0)));
        assert!(Summary::new(&[2.0, 2.0], true).unwrap().exact());
        assert_eq!(mean_ci95(&[1.0]), None);
        assert_eq!(mean_ci95(&[]), None);
        assert_eq!(mean_ci95(&[-1.0, 1.0]).unwrap().relative_pct, None);
    }

    /// Welch's t-test against SciPy's `ttest_ind(b, a, equal_var=False)`.
    /// The first pair is Wikipedia's worked example ("Welch's t-test",
    /// A1/A2, n = 15 each): t = 2.455356398286006, df = 24.988529290231416,
    /// p = 0.021378001462866992.
    #[test]
    fn welch_against_reference_values() {
        let a1 = [
            27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7,
            21.4,
        ];
        let a2 = [
            27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5,
            24.4,
        ];
        // (a, b, t, df, p)
        type Case<'a> = (&'a [f64], &'a [f64], f64, f64, f64);
        let cases: [Case; 3] = [
            (
                &a1,
                &a2,
                2.455_356_398_286_006,
                24.988_529_290_231_416,
                0.021_378_001_462_866_992,
            ),
            // The compare.rs fixture: 800 812 824 vs 1500 1523 1546.
            (
                &[800.0, 812.0, 824.0],
                &[1500.0, 1523.0, 1546.0],
                47.470_378_657_913_67,
                3.013_730_258_802_236_3,
                1.976_578_999_274_445e-5,
            ),
            // Overlapping samples of n = 5: not significant.
            (
                &[30.1, 29.5, 31.2, 30.8, 29.9],
                &[30.6, 31.0, 30.2, 31.9, 30.4],
                1.207_670_558_105_469_9,
                7.995_078_257_107_569,
                0.261_683_091_321_901_7,
            ),
        ];
        for (a, b, t, df, p) in cases {
            let w = welch_t_test(a, b).unwrap();
            assert!(near(w.t, t, 1e-9), "t {} vs {t}", w.t);
            assert!(near(w.df, df, 1e-9), "df {} vs {df}", w.df);
            assert!(near(w.p_value, p, 1e-6), "p {} vs {p}", w.p_value);
            // Swapping the sides flips t and keeps p.
            let back = welch_t_test(b, a).unwrap();
            assert!(near(back.t, -t, 1e-9) && near(back.p_value, p, 1e-6));
        }
        assert_eq!(welch_t_test(&[1.0], &[1.0, 2.0]), None);
        assert_eq!(welch_t_test(&[2.0, 2.0], &[3.0, 3.0]), None, "both exact");
        // One exact side: df = n_other - 1, still a test.
        let w = welch_t_test(&[2.0, 2.0, 2.0], &[2.0, 3.0, 4.0]).unwrap();
        assert!(near(w.df, 2.0, 1e-12) && near(w.t, 1.732_050_807_568_877_2, 1e-12));
    }

    /// mmtests' rule by hand: 100 101 99 100 100 has s = sqrt(2/4) =
    /// 0.7071067811865476, so its half-width is qnorm(0.975) * s =
    /// 1.959963984540054 * 0.7071067811865476 = 1.3859038243496777.
    /// Against the same spread shifted by +3: ratio 3 / (2 * 1.3859038...) =
    /// 1.0823262 > 1, significant; shifted by +2: 0.7215508 < 1, not.
    /// SciPy for the n = 5 pair of the Welch test: half-widths
    /// 1.3508119557620555 and 1.317702313481214, ratio 0.19486498760505405.
    #[test]
    fn mmtests_rule_on_fixed_samples() {
        let base = [100.0, 101.0, 99.0, 100.0, 100.0];
        let plus = |d: f64| base.map(|v| v + d);
        let m = mmtests_significance(&base, &plus(3.0)).unwrap();
        assert!(near(m.baseline_half_width, 1.385_903_824_349_677_7, 1e-12));
        assert!(near(m.ratio, 3.0 / (2.0 * 1.385_903_824_349_677_7), 1e-12));
        assert!(m.significant);
        let m = mmtests_significance(&base, &plus(2.0)).unwrap();
        assert!(near(m.ratio, 0.721_550_790_488_106_6, 1e-9) && !m.significant);
        // Lower compare mean: negative ratio, same magnitude.
        let m = mmtests_significance(&plus(3.0), &base).unwrap();
        assert!(m.ratio < -1.0 && m.significant);
        let m = mmtests_significance(
            &[30.1, 29.5, 31.2, 30.8, 29.9],
            &[30.6, 31.0, 30.2, 31.9, 30.4],
        )
        .unwrap();
        assert!(near(m.baseline_half_width, 1.350_811_955_762_055_5, 1e-9));
        assert!(near(m.compare_half_width, 1.317_702_313_481_214, 1e-9));
        assert!(near(m.ratio, 0.194_864_987_605_054_05, 1e-9) && !m.significant);
        // Zero widths: mmtests falls back to the plain difference.
        let m = mmtests_significance(&[0.0, 0.0], &[2.0, 2.0]).unwrap();
        assert_eq!((m.ratio, m.significant), (2.0, true));
        let m = mmtests_significance(&[0.0, 0.0], &[0.5, 0.5]).unwrap();
        assert_eq!((m.ratio, m.significant), (0.5, false));
        assert_eq!(mmtests_significance(&[1.0], &[1.0, 2.0]), None);
    }

    #[test]
    fn verdicts() {
        let base = [100.0, 101.0, 99.0, 100.0, 100.0];
        let v = |a: &[f64], b: &[f64]| significance(a, b).verdict;
        assert_eq!(v(&base, &base.map(|x| x + 3.0)), Verdict::Significant);
        // +2: mmtests' rule says no (ratio 0.72), Welch says yes (t =
        // 2 / sqrt(0.2) = 4.472, df 8; p = 0.0020773377112268676 from the
        // closed form of Student's t for even df): the verdict is Welch's,
        // mmtests' ratio is kept beside it under its own name.
        let s = significance(&base, &base.map(|x| x + 2.0));
        assert_eq!(s.verdict, Verdict::Significant);
        assert_eq!(s.rule, Some(Rule::Welch95));
        assert!(near(
            s.welch.unwrap().p_value,
            0.002_077_337_711_226_867_6,
            1e-9
        ));
        assert!(!s.mmtests.unwrap().significant);
        // The n = 5 pair of the Welch test: p = 0.2617, not significant.
        assert_eq!(
            v(
                &[30.1, 29.5, 31.2, 30.8, 29.9],
                &[30.6, 31.0, 30.2, 31.9, 30.4]
            ),
            Verdict::NotSignificant
        );
        // Exact values: equal or not, with no test (no t, p, CI or
        // mmtests ratio for a constant).
        assert_eq!(v(&[0.0, 0.0], &[0.5, 0.5]), Verdict::ExactDifferent);
        assert_eq!(v(&[2.0, 2.0, 2.0], &[2.0, 2.0]), Verdict::ExactEqual);
        assert_eq!(v(&[2.0], &[3.0]), Verdict::Undefined);
        assert!(Verdict::ExactDifferent.marked() && !Verdict::ExactEqual.marked());
        let s = significance(&[0.0, 0.0], &[0.5, 0.5]);
        assert_eq!(
            (s.welch, s.mmtests, s.rule),
            (None, None, Some(Rule::Exact))
        );
    }

    /// The `--runs auto` case of the issue: a constant rate's float mean
    /// over a different number of runs must stay that constant.
    #[test]
    fn identical_samples_have_their_own_mean_and_no_spread() {
        for x in [26.008_849_557_522_122, 0.1, 1.0 / 3.0, 2939.0 / 113.0] {
            for n in 1..40 {
                let v = vec![x; n];
                assert_eq!(mean(&v), x, "{x} x {n}");
                assert_eq!(sample_stddev(&v), (n > 1).then_some(0.0));
                assert_eq!(mean_ci95(&v).map(|c| c.half_width), (n > 1).then_some(0.0));
            }
        }
        let a = Summary::new(&[2939.0 / 113.0; 3], true).unwrap();
        let b = Summary::new(&[2939.0 / 113.0; 17], true).unwrap();
        let s = significance_of(&a, &b);
        assert_eq!(s.verdict, Verdict::ExactEqual);
        assert_eq!(s.welch, None);
    }

    /// Counts are carried as integers: the same rational rate over
    /// different totals is exact, and a run that differs is counted.
    #[test]
    fn counts_are_compared_as_integers() {
        let c = |counts: &[u64], calls: &[u64]| {
            CountRuns::new(counts.to_vec(), calls.to_vec()).unwrap()
        };
        // 2939/113 = 5878/226 = 26.00884955752212...
        let a = c(&[2939, 5878, 2939], &[113, 226, 113]);
        assert!(a.exact() && a.runs_differing() == 0);
        assert!(a.rates().iter().all(|&r| r == a.rates()[0]));
        let b = c(&[293_900; 7], &[11_300; 7]);
        let (sa, sb) = (
            Summary::from_counts(a.clone(), true).unwrap(),
            Summary::from_counts(b, true).unwrap(),
        );
        assert!(sa.exact() && sb.exact());
        let s = significance_of(&sa, &sb);
        assert_eq!(
            (s.verdict, s.welch, s.mmtests),
            (Verdict::ExactEqual, None, None)
        );
        assert_eq!(sa.ci95.unwrap().half_width, 0.0);
        // One more instruction in one run: exact against it no longer.
        let d = c(&[2939, 2940, 2939, 2939], &[113, 113, 113, 113]);
        assert!(!d.exact());
        assert_eq!(d.runs_differing(), 1);
        let sd = Summary::from_counts(d, true).unwrap();
        assert_eq!(sd.runs_differing(), Some(1));
        let s = significance_of(&sa, &sd);
        assert_eq!(s.rule, Some(Rule::Welch95));
        assert!(s.welch.is_some());
        // Two exact sides that differ by one count in 10^6 calls.
        let e = c(&[2_000_001, 2_000_001], &[1_000_000, 1_000_000]);
        let f = c(&[2_000_000, 4_000_000], &[1_000_000, 2_000_000]);
        let s = significance_of(
            &Summary::from_counts(e, true).unwrap(),
            &Summary::from_counts(f, true).unwrap(),
        );
        assert_eq!(s.verdict, Verdict::ExactDifferent);
        assert_eq!(CountRuns::new(vec![1], vec![0]), None, "no calls, no rate");
        assert_eq!(CountRuns::new(vec![1, 2], vec![1]), None);
        assert!(!same_rate((u64::MAX, 1), (u64::MAX, 2)));
        assert!(same_rate((u64::MAX, u64::MAX), (1, 1)));
    }

    /// A small seeded generator (xorshift64*), so the property below is
    /// reproducible without a dependency.
    pub(crate) struct Rng(pub u64);

    impl Rng {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        /// Uniform in [0, 1).
        pub(crate) fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }

        /// `n` samples around `mean` with spread `sd` (a sum of uniforms).
        pub(crate) fn samples(&mut self, n: usize, mean: f64, sd: f64) -> Vec<f64> {
            (0..n)
                .map(|_| mean + sd * ((0..4).map(|_| self.unit()).sum::<f64>() - 2.0))
                .collect()
        }
    }

    /// Property: for any two samples the verdict, Welch's p and the
    /// difference's 95 % CI say the same thing: significant == p < 0.05
    /// == the CI excludes 0.
    #[test]
    fn verdict_p_and_interval_never_disagree() {
        let mut rng = Rng(0x5eed_1234_abcd_0001);
        let mut seen = [0usize; 2];
        for _ in 0..20_000 {
            let (na, nb) = (2 + (rng.next() % 9) as usize, 2 + (rng.next() % 9) as usize);
            let scale = 10f64.powi((rng.next() % 9) as i32 - 4);
            let (sda, sdb) = (scale * rng.unit() * 3.0, scale * rng.unit() * 3.0);
            let a = rng.samples(na, 100.0 * scale, sda);
            let shift = scale * (rng.unit() * 4.0 - 2.0);
            let b = rng.samples(nb, 100.0 * scale + shift, sdb);
            let s = significance(&a, &b);
            let Some(w) = s.welch else {
                assert!(matches!(
                    s.verdict,
                    Verdict::ExactEqual | Verdict::ExactDifferent
                ));
                continue;
            };
            let [lo, hi] = w.delta_ci95.expect("an interval with a test");
            let excludes = lo > 0.0 || hi < 0.0;
            let significant = s.verdict == Verdict::Significant;
            assert_eq!(significant, w.p_value < 0.05, "{a:?} {b:?}");
            assert_eq!(
                significant, excludes,
                "{a:?} {b:?} p {} [{lo}, {hi}]",
                w.p_value
            );
            seen[usize::from(significant)] += 1;
        }
        assert!(
            seen[0] > 1000 && seen[1] > 1000,
            "both verdicts exercised: {seen:?}"
        );
    }
}
