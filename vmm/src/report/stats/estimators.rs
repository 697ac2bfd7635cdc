//! Estimators over one sample: the mean (a constant stays that constant),
//! the sample standard deviation, the quantiles of the normal and of
//! Student's t distribution (from `statrs`), and the mean's 95 % interval.

use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, Normal, StudentsT};

/// The mean; identical samples give that very value (a sum divided back
/// can be off by one in the last bit, and a constant must stay constant).
pub(super) fn mean(v: &[f64]) -> f64 {
    if all_equal(v) {
        return v[0];
    }
    v.iter().sum::<f64>() / v.len() as f64
}

/// Whether `v` is non-empty and all its values are the same float.
pub(super) fn all_equal(v: &[f64]) -> bool {
    v.first().is_some_and(|f| v.iter().all(|x| x == f))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::stats::tests::near;
    use crate::report::stats::Summary;

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
}
