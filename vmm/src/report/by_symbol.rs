//! Per-call kernel instructions by kernel symbol (`--by-symbol`): one run's
//! counts ([`BySymbol`], carried in its [`super::RunSummary`]), the two
//! sides of a comparison and their difference ([`SymbolDiff`]), and
//! `--fail-if symbol:NAME...` (`report::threshold::SymbolCondition`, which
//! this table answers).

use serde::{Deserialize, Serialize};

/// The row of addresses no symbol covers.
pub const UNKNOWN: &str = "[unknown]";
/// The row of instructions the plugin counted at no address (a call too
/// long for its per-call log).
pub const UNATTRIBUTED: &str = "[unattributed]";

/// One symbol's instructions over a run's phase.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SymbolCount {
    /// The function (kallsyms name; ` [module]` for a module's), or
    /// [`UNKNOWN`] / [`UNATTRIBUTED`].
    pub symbol: String,
    /// Instructions executed in it by the phase's undisturbed calls.
    pub instructions: u64,
}

/// One run's undisturbed system calls' kernel instructions, by symbol.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BySymbol {
    /// The calls the counts are of (the phase's calls less those set apart:
    /// the divisor of `kernel_instructions_per_call`).
    pub calls: u64,
    /// The plugin's `kernel_instructions` of the phase; the rows sum to it.
    pub kernel_instructions: u64,
    /// By symbol, sorted by name.
    pub symbols: Vec<SymbolCount>,
    /// Text symbols in the kernel's table.
    pub table_symbols: u64,
}

impl BySymbol {
    /// Per-call instructions of `symbol` (0 if it never ran).
    pub fn per_call(&self, symbol: &str) -> f64 {
        let n = self
            .symbols
            .iter()
            .find(|s| s.symbol == symbol)
            .map_or(0, |s| s.instructions);
        if self.calls == 0 {
            0.0
        } else {
            n as f64 / self.calls as f64
        }
    }
}

impl BySymbol {
    /// The terminal list: the `limit` symbols with the most instructions
    /// per call, and how many more there are.
    pub fn render_text(&self, limit: usize) -> String {
        let mut rows: Vec<&SymbolCount> = self.symbols.iter().collect();
        rows.sort_by(|a, b| {
            b.instructions
                .cmp(&a.instructions)
                .then(a.symbol.cmp(&b.symbol))
        });
        let per = |n: u64| n as f64 / self.calls.max(1) as f64;
        let mut s = format!(
            "\nkernel instructions per call by symbol ({} instructions over {} calls, {:.3} per call; {} symbols in the kernel's table):\n",
            self.kernel_instructions,
            self.calls,
            per(self.kernel_instructions),
            self.table_symbols
        );
        for r in rows.iter().take(limit) {
            s.push_str(&format!(
                "  {:<44} {:>12.3}\n",
                r.symbol,
                per(r.instructions)
            ));
        }
        if rows.len() > limit {
            s.push_str(&format!(
                "  ... {} more symbols (--json has every one)\n",
                rows.len() - limit
            ));
        }
        s
    }
}

/// One symbol on both sides, per call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SymbolRow {
    /// The symbol.
    pub symbol: String,
    /// Per call on the baseline side (mean over its runs).
    pub baseline: f64,
    /// Per call on the compare side.
    pub compare: f64,
    /// `compare - baseline`.
    pub delta: f64,
}

/// Both sides by symbol and their difference.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SymbolDiff {
    /// Every symbol that ran on either side: largest absolute difference
    /// first, then largest baseline, then by name.
    pub rows: Vec<SymbolRow>,
    /// Rows whose difference is zero.
    pub zero_rows: usize,
    /// `kernel_instructions_per_call` of each side (the rows' sums).
    pub baseline_total: f64,
    /// As above, compare side.
    pub compare_total: f64,
    /// Whether every run of a side gave the same per-call counts.
    pub identical_runs: bool,
    /// Per baseline run: its calls, its `kernel_instructions` and the sum
    /// of its symbols' instructions (equal, or the run gave no rows).
    pub baseline_runs: Vec<RunTotals>,
    /// As above, compare side.
    pub compare_runs: Vec<RunTotals>,
}

/// One run's integer totals, for checking that nothing was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RunTotals {
    /// The calls the counts are of.
    pub calls: u64,
    /// The plugin's `kernel_instructions` of the phase.
    pub kernel_instructions: u64,
    /// The sum over the run's symbols.
    pub symbol_sum: u64,
}

fn totals(runs: &[&BySymbol]) -> Vec<RunTotals> {
    runs.iter()
        .map(|b| RunTotals {
            calls: b.calls,
            kernel_instructions: b.kernel_instructions,
            symbol_sum: b.symbols.iter().map(|s| s.instructions).sum(),
        })
        .collect()
}

/// Per-call instructions by symbol over a side's runs (the mean), and
/// whether all runs agree.
fn side_means(runs: &[&BySymbol]) -> (std::collections::BTreeMap<String, f64>, f64, bool) {
    let mut sum = std::collections::BTreeMap::<String, f64>::new();
    let mut total = 0.0;
    let per_run = |b: &BySymbol| -> Vec<(String, f64)> {
        b.symbols
            .iter()
            .map(|s| {
                (
                    s.symbol.clone(),
                    s.instructions as f64 / b.calls.max(1) as f64,
                )
            })
            .collect()
    };
    let first = runs.first().map(|b| per_run(b));
    let mut identical = true;
    for b in runs {
        let rows = per_run(b);
        identical &= Some(&rows) == first.as_ref();
        for (s, v) in rows {
            *sum.entry(s).or_default() += v;
        }
        total += b.kernel_instructions as f64 / b.calls.max(1) as f64;
    }
    let n = runs.len().max(1) as f64;
    for v in sum.values_mut() {
        *v /= n;
    }
    (sum, total / n, identical)
}

impl SymbolDiff {
    /// The difference of two sides' runs.
    pub fn new(baseline: &[&BySymbol], compare: &[&BySymbol]) -> SymbolDiff {
        let (b, bt, bi) = side_means(baseline);
        let (c, ct, ci) = side_means(compare);
        let names: std::collections::BTreeSet<&String> = b.keys().chain(c.keys()).collect();
        let mut rows: Vec<SymbolRow> = names
            .into_iter()
            .map(|s| {
                let (x, y) = (
                    b.get(s).copied().unwrap_or(0.0),
                    c.get(s).copied().unwrap_or(0.0),
                );
                SymbolRow {
                    symbol: s.clone(),
                    baseline: x,
                    compare: y,
                    delta: y - x,
                }
            })
            .collect();
        rows.sort_by(|p, q| {
            q.delta
                .abs()
                .total_cmp(&p.delta.abs())
                .then(q.baseline.total_cmp(&p.baseline))
                .then(p.symbol.cmp(&q.symbol))
        });
        let zero_rows = rows.iter().filter(|r| r.delta == 0.0).count();
        SymbolDiff {
            rows,
            zero_rows,
            baseline_total: bt,
            compare_total: ct,
            identical_runs: bi && ci,
            baseline_runs: totals(baseline),
            compare_runs: totals(compare),
        }
    }

    /// The row of `symbol`, if it ran on either side.
    pub fn row(&self, symbol: &str) -> Option<&SymbolRow> {
        self.rows.iter().find(|r| r.symbol == symbol)
    }

    /// The terminal table: the nonzero differences (at most `limit`), the
    /// count of the rest and of the zero rows; with no difference at all,
    /// where the baseline's instructions go (its `limit` largest symbols).
    pub fn render_text(&self, limit: usize) -> String {
        let f = |v: f64| {
            if v.fract() == 0.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.3}")
            }
        };
        let signed = |v: f64| {
            if v > 0.0 {
                format!("+{}", f(v))
            } else {
                f(v)
            }
        };
        let mut s = format!(
            "\nkernel instructions per call by symbol ({}; sums: {} -> {}):\n",
            if self.identical_runs {
                "the same in every run"
            } else {
                "mean over runs, which differ"
            },
            f(self.baseline_total),
            f(self.compare_total)
        );
        let nonzero: Vec<&SymbolRow> = self.rows.iter().filter(|r| r.delta != 0.0).collect();
        let (shown, title): (Vec<&SymbolRow>, _) = if nonzero.is_empty() {
            let mut by_base: Vec<&SymbolRow> = self.rows.iter().collect();
            by_base.sort_by(|p, q| q.baseline.total_cmp(&p.baseline));
            (
                by_base.into_iter().take(limit).collect(),
                "no symbol differs; the largest",
            )
        } else {
            (nonzero.iter().take(limit).copied().collect(), "difference")
        };
        s.push_str(&format!(
            "  {:<44} {:>12} {:>12} {:>10}   ({title})\n",
            "symbol", "baseline", "compare", "delta"
        ));
        for r in &shown {
            s.push_str(&format!(
                "  {:<44} {:>12} {:>12} {:>10}\n",
                r.symbol,
                f(r.baseline),
                f(r.compare),
                signed(r.delta)
            ));
        }
        let more = nonzero.len().saturating_sub(limit);
        if more > 0 {
            s.push_str(&format!(
                "  ... {more} more nonzero differences (--json has every row)\n"
            ));
        }
        s.push_str(&format!(
            "  {} symbols with a zero difference left out\n",
            self.zero_rows
        ));
        s
    }
}

impl SymbolDiff {
    /// The table as CSV: a header, then one line per symbol (the rows'
    /// order: largest absolute difference first), zero differences
    /// included; per-call figures as the JSON has them.
    pub fn to_csv(&self) -> String {
        let mut out = String::from("symbol,baseline_per_call,compare_per_call,delta_per_call\n");
        for r in &self.rows {
            out.push_str(&format!(
                "{},{},{},{}\n",
                crate::report::csv_field(&r.symbol),
                r.baseline,
                r.compare,
                r.delta
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(calls: u64, rows: &[(&str, u64)]) -> BySymbol {
        BySymbol {
            calls,
            kernel_instructions: rows.iter().map(|r| r.1).sum(),
            symbols: rows
                .iter()
                .map(|(s, n)| SymbolCount {
                    symbol: s.to_string(),
                    instructions: *n,
                })
                .collect(),
            table_symbols: 10,
        }
    }

    #[test]
    fn differences_sorted_and_summed() {
        let b = side(1000, &[("a", 300_000), ("entry", 10_000), ("c", 1000)]);
        let c = side(1000, &[("a", 300_000), ("entry", 18_000), ("new", 2000)]);
        let d = SymbolDiff::new(&[&b, &b], &[&c]);
        let names: Vec<&str> = d.rows.iter().map(|r| r.symbol.as_str()).collect();
        assert_eq!(names, ["entry", "new", "c", "a"]);
        assert_eq!(d.row("entry").unwrap().delta, 8.0);
        assert_eq!(d.row("c").unwrap().delta, -1.0);
        assert_eq!(d.zero_rows, 1);
        assert!(d.identical_runs);
        let sum: f64 = d.rows.iter().map(|r| r.delta).sum();
        assert_eq!(sum, d.compare_total - d.baseline_total);
        let t = d.render_text(2);
        assert!(
            t.contains("entry") && t.contains("+8") && t.contains("1 more nonzero"),
            "{t}"
        );
        assert!(
            t.contains("1 symbols with a zero difference left out"),
            "{t}"
        );
        let same = SymbolDiff::new(&[&b], &[&b]);
        assert!(same.rows.iter().all(|r| r.delta == 0.0));
        assert!(same.render_text(5).contains("no symbol differs"));
    }
}
