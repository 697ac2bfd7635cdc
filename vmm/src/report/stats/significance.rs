//! Tests of significance between two sides: exact sides compared as values
//! (counts as integers), otherwise Welch's t-test gives the one verdict, and
//! mmtests' own rule is computed beside it under its own name.

use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, StudentsT};

use super::estimators::{amean, mean, normal_quantile, sample_stddev, t_quantile};
use super::summary::Summary;

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
mod tests {
    use super::*;
    use crate::report::stats::counts::{same_rate, CountRuns};
    use crate::report::stats::estimators::mean_ci95;
    use crate::report::stats::tests::{near, Rng};

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
