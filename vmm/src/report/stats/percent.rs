//! Differences as percentages (mmtests' `pndiff`/`pdiff`, and the plain
//! relative change), and the figures too near zero for a percentage.

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::stats::tests::close;
    use crate::report::stats::Stat;

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
