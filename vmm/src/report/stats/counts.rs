//! Counts over runs as integers: each run's count and the calls it is per,
//! whose per-call rates are compared as rationals, never as floats.

use serde::{Deserialize, Serialize};

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
pub(super) fn same_rate(a: (u64, u64), b: (u64, u64)) -> bool {
    u128::from(a.0) * u128::from(b.1) == u128::from(b.0) * u128::from(a.1)
}
