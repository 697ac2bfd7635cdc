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
//! The concerns, one file each: `summary` (the summary row), `estimators`
//! (one sample: mean, stddev, quantiles, the mean's interval), `counts`
//! (integer counts over runs), `significance` (two sides: exact, Welch,
//! mmtests' rule) and `percent` (differences as percentages).

mod counts;
mod estimators;
mod percent;
mod significance;
mod summary;

pub use counts::CountRuns;
pub use estimators::{amean, mean_ci95, normal_quantile, sample_stddev, t_quantile, MeanCi};
pub use percent::{delta_pct, diff_pct, near_zero, NEAR_ZERO};
pub use significance::{
    mmtests_significance, significance, significance_of, welch_t_test, MmtestsSignificance, Rule,
    Significance, Verdict, WelchTest,
};
pub use summary::{Stat, Summary, SummaryError};

/// Test helpers shared by the statistics' tests (and `answer`'s).
#[cfg(test)]
pub(crate) mod tests {
    pub(crate) fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    pub(crate) fn near(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs().max(1e-300)
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
}
