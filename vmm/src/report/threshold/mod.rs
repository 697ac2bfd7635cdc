//! `--fail-if` conditions: small expressions over a [`CompareTable`] that a
//! CI job uses to fail on a regression.
//!
//! Grammar (whitespace around the operator is allowed):
//! ```text
//! condition := metric { "." qualifier } op number
//! qualifier := stat | field                      (each at most once, any order)
//! stat      := min | amean | stddev | coeffvar | max | bamean50 | bamean95 | bamean99
//!                                                    (default: amean)
//! field     := compare | baseline | delta | delta_pct | diff_pct
//!            | welch_p | significant                 (default: compare)
//! op        := ">" | ">=" | "<" | "<=" | "==" | "!="
//! number    := a decimal number, e.g. 2, -0.5, 1e3
//! ```
//! `compare`/`baseline` are the statistic's value on that side; `delta` is
//! `compare - baseline`; `delta_pct` is the plain relative change in %
//! (positive = grew); `diff_pct` is the mmtests-style % (negative = worse).
//! `welch_p` is Welch's two-sided p-value of the means and `significant` is
//! 1 where the table marks the difference (Welch's test at 95 %, or exact values
//! that differ), else 0; both are about the means, so they take no statistic.
//! A condition that holds means *fail*. Examples:
//! - `cr3_writes_per_call!=2` — Amean CR3 writes per call of the compare runs is not exactly 2;
//! - `cycles_per_call.delta_pct>50` — Amean cycles per call grew by more than 50 %;
//! - `cycles_per_call.coeffvar.baseline>2` — the baseline is too noisy;
//! - `kernel_instructions_per_call.significant==1` — the path length changed.
//!
//! A `--fail-if` is a comma-separated list of conditions ([`FailIf::parse`],
//! the one parser of the option): each either such a table condition or a
//! kernel symbol's (`symbol:NAME[.delta|.baseline|.compare] OP NUMBER`,
//! [`SymbolCondition`], evaluated on the `--by-symbol` table), in any order
//! and mixed. Both kinds share the operators and the number grammar
//! ([`split_operator`], [`threshold`]): a finite decimal number, and one
//! written non-zero that an f64 cannot hold (`1e-400`) is refused.
//!
//! Here: the option, a list of conditions of either kind ([`FailIf`]). Under
//! it: `table` (conditions on the compare table), `symbol` (on the
//! `--by-symbol` table), `operator` (the operators and numbers both share)
//! and `error` (the refusals).

mod error;
mod operator;
mod symbol;
mod table;

pub use error::{ConditionError, EvalError};
pub use operator::{number_text, split_operator, threshold, Op};
pub use symbol::{parse_symbol, SymbolCondition};
pub use table::{Condition, Evaluation, Field};

/// Every `--fail-if` of a command, parsed: the table's conditions and the
/// kernel symbols', each in the order given.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FailIf {
    /// Conditions on the compare table.
    pub table: Vec<Condition>,
    /// Conditions on the `--by-symbol` table.
    pub symbol: Vec<SymbolCondition>,
}

impl FailIf {
    /// Parses every `--fail-if` given: each a comma-separated list of
    /// conditions of either kind, in any order (a kernel symbol's name and
    /// a number hold no comma, so the comma always separates conditions).
    pub fn parse<S: AsRef<str>>(given: &[S]) -> Result<FailIf, ConditionError> {
        let mut out = FailIf::default();
        for list in given {
            let list = list.as_ref();
            for item in list.split(',') {
                let item = item.trim();
                if item.is_empty() {
                    return Err(ConditionError::Empty(list.to_owned()));
                }
                if item.starts_with(SymbolCondition::PREFIX) {
                    out.symbol.push(parse_symbol(item)?);
                } else {
                    out.table.push(Condition::parse(item)?);
                }
            }
        }
        Ok(out)
    }

    /// Whether nothing was given.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty() && self.symbol.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both kinds of condition in one comma-separated list, in any order
    /// and over several `--fail-if`s, each kept in the order given.
    #[test]
    fn lists_mix_table_and_symbol_conditions() {
        let f = FailIf::parse(&[
            "symbol:entry_SYSCALL_64>1,symbol:syscall_return_via_sysret>2",
            "cr3_writes_per_call.compare<1.9, symbol:x.delta>4 ,ns_per_call.max.delta_pct>=5",
        ])
        .unwrap();
        let symbols: Vec<String> = f.symbol.iter().map(SymbolCondition::text).collect();
        assert_eq!(
            symbols,
            [
                "symbol:entry_SYSCALL_64.delta>1",
                "symbol:syscall_return_via_sysret.delta>2",
                "symbol:x.delta>4"
            ]
        );
        let table: Vec<String> = f.table.iter().map(Condition::to_string).collect();
        assert_eq!(
            table,
            [
                "cr3_writes_per_call.amean.compare<1.9",
                "ns_per_call.max.delta_pct>=5"
            ]
        );
        // A table condition after a symbol one is a table condition.
        let f = FailIf::parse(&["symbol:a . compare==3,cycles_per_call>1"]).unwrap();
        assert_eq!((f.symbol.len(), f.table.len()), (1, 1));
        assert_eq!(f.symbol[0].field, "compare");
        assert!(FailIf::parse::<&str>(&[]).unwrap().is_empty());
    }

    /// The same number grammar for both kinds: finite, and refused where an
    /// f64 cannot hold what was written.
    #[test]
    fn symbol_conditions_take_the_table_number_grammar() {
        for t in ["1e-400", "0.5e-320", "-3e-310"] {
            for cond in [format!("symbol:x>{t}"), format!("ns_per_call>{t}")] {
                let e = FailIf::parse(&[&cond]).unwrap_err();
                assert!(
                    matches!(e, ConditionError::Underflow { .. }),
                    "{cond}: {e:?}"
                );
            }
        }
        for t in ["inf", "NaN", "1e400", "fifty", "", "0x10"] {
            for cond in [format!("symbol:x>{t}"), format!("ns_per_call>{t}")] {
                let e = FailIf::parse(&[&cond]).unwrap_err();
                assert!(
                    matches!(e, ConditionError::BadNumber { .. }),
                    "{cond}: {e:?}"
                );
                assert!(e.to_string().contains("finite decimal number"), "{e}");
            }
        }
        for t in ["0", "-0.5", "1e3", "+2", "2.3e-308"] {
            assert!(FailIf::parse(&[format!("symbol:x<={t}")]).is_ok(), "{t}");
        }
    }

    /// Operator characters are read as one token: one that is not an
    /// operator is named as such, in both kinds of condition, instead of
    /// a stray `=` or `>` being blamed on the name or the number.
    #[test]
    fn operator_tokens_that_are_no_operator_are_named() {
        for (cond, op) in [
            ("cycles_per_call=>1", "=>"),
            ("cycles_per_call<>1", "<>"),
            ("cycles_per_call>>1", ">>"),
            ("cycles_per_call=1", "="),
            ("cycles_per_call===1", "==="),
            ("cycles_per_call =< 1", "=<"),
            ("symbol:x=>5", "=>"),
            ("symbol:!x>1", "!"),
            ("symbol:x!1", "!"),
        ] {
            let e = FailIf::parse(&[cond]).unwrap_err();
            assert_eq!(
                e,
                ConditionError::BadOperator {
                    cond: cond.into(),
                    op: op.into()
                },
                "{cond}"
            );
            assert!(e.to_string().contains("one of > >= < <= == !="), "{e}");
        }
        for (cond, op) in [
            ("a>=-1", Op::Ge),
            ("a>-1", Op::Gt),
            ("a != 2", Op::Ne),
            ("a<=1e3", Op::Le),
        ] {
            assert_eq!(split_operator(cond).unwrap().1, op, "{cond}");
        }
        assert_eq!(
            FailIf::parse(&["a\u{2265}1"]).unwrap_err(),
            ConditionError::NoOperator("a\u{2265}1".into())
        );
    }

    /// Thresholds print in exponent form beyond ordinary magnitudes, and
    /// print back to the same number.
    #[test]
    fn large_and_small_thresholds_print_short() {
        for (cond, shown) in [
            ("a>1e308", "a.amean.compare>1e308"),
            ("a>-1.5e20", "a.amean.compare>-1.5e20"),
            ("a>2.5e-7", "a.amean.compare>2.5e-7"),
            ("a>1234.5", "a.amean.compare>1234.5"),
            ("a>-0", "a.amean.compare>-0"),
        ] {
            let c = Condition::parse(cond).unwrap();
            assert_eq!(c.to_string(), shown);
            assert_eq!(Condition::parse(shown).unwrap(), c);
        }
        let f = FailIf::parse(&["symbol:x>1e300"]).unwrap();
        assert_eq!(f.symbol[0].text(), "symbol:x.delta>1e300");
    }

    /// What a list refuses, naming the item and what is valid.
    #[test]
    fn list_refusals_say_what_is_valid() {
        for list in ["", "a>1,", ",a>1", "a>1,,b<2", " , "] {
            let e = FailIf::parse(&[list]).unwrap_err();
            assert_eq!(e, ConditionError::Empty(list.into()), "{list:?}");
            assert!(e.to_string().contains("symbol:NAME"), "{e}");
        }
        let e = FailIf::parse(&["entry_SYSCALL_64>1"]).unwrap_err();
        assert!(matches!(e, ConditionError::BadMetric { .. }), "{e:?}");
        assert!(e.to_string().contains("symbol:NAME"), "{e}");
        let e = FailIf::parse(&["a>1,symbol:x"]).unwrap_err();
        assert_eq!(e, ConditionError::NoOperator("symbol:x".into()));
        for bad in [
            "symbol:>5",
            "symbol:x y>1",
            "symbol: >1",
            "symbol:f\u{f6}\u{f6}>1",
            "symbol:foo.>1",
            "symbol:.foo>1",
            "symbol:a..b>1",
            "symbol:symbol:foo>1",
            "symbol:a/b>1",
        ] {
            let e = FailIf::parse(&[bad]).unwrap_err();
            assert!(
                matches!(e, ConditionError::BadSymbol { .. }),
                "{bad}: {e:?}"
            );
        }
        // A table qualifier is refused, not read as a symbol named x.delta_pct.
        for q in ["delta_pct", "amean", "max", "significant"] {
            let e = FailIf::parse(&[format!("symbol:x.{q}>1")]).unwrap_err();
            assert_eq!(
                e,
                ConditionError::SymbolQualifier {
                    cond: format!("symbol:x.{q}>1"),
                    part: q.into()
                }
            );
        }
        // Compiler suffixes are part of a kernel symbol's name.
        let f = FailIf::parse(&["symbol:foo.isra.0.baseline>1,symbol:bar.cold!=0"]).unwrap();
        assert_eq!(
            (f.symbol[0].symbol.as_str(), f.symbol[0].field),
            ("foo.isra.0", "baseline")
        );
        assert_eq!(
            (f.symbol[1].symbol.as_str(), f.symbol[1].field),
            ("bar.cold", "delta")
        );
        let e = FailIf::parse(&["x.median>1"]).unwrap_err();
        assert!(
            e.to_string().contains("bamean99") && e.to_string().contains("welch_p"),
            "{e}"
        );
    }

    /// What parses prints back to what parses the same way (the fuzz
    /// target's property, on the corner cases).
    #[test]
    fn conditions_print_back_to_themselves() {
        for list in [
            "symbol:foo.delta.delta>1",
            "symbol:foo.isra.0<=-0",
            "symbol:[unknown].compare!=2.3e-308",
            "symbol:x>1e300",
            "a.max.delta_pct>=0.5,b.welch_p<0.01",
        ] {
            let f = FailIf::parse(&[list]).unwrap();
            for c in &f.symbol {
                let again = FailIf::parse(&[c.text()]).unwrap().symbol;
                assert_eq!(again, vec![c.clone()], "{list}");
            }
            for c in &f.table {
                assert_eq!(Condition::parse(&c.to_string()).as_ref(), Ok(c), "{list}");
            }
        }
    }
}
