//! Conditions on the compare table: `METRIC[.STAT][.FIELD] OP NUMBER`,
//! parsed, printed back and evaluated.

use std::fmt;

use super::error::{ConditionError, EvalError};
use super::operator::{number_text, split_operator, threshold, Op};
use crate::report::compare::CompareTable;
use crate::report::stats::Stat;

/// Which number of a metric's comparison a condition looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// The statistic on the compare side.
    Compare,
    /// The statistic on the baseline side.
    Baseline,
    /// `compare - baseline`.
    Delta,
    /// Relative change in % (positive = grew).
    DeltaPct,
    /// mmtests-style % difference (negative = worse).
    DiffPct,
    /// Welch's two-sided p-value of the two sides' means.
    WelchP,
    /// 1 where the difference of the means is significant (Welch at 95 %,
    /// or exact values that differ), else 0.
    Significant,
}

impl Field {
    pub(super) const ALL: [Field; 7] = [
        Field::Compare,
        Field::Baseline,
        Field::Delta,
        Field::DeltaPct,
        Field::DiffPct,
        Field::WelchP,
        Field::Significant,
    ];

    /// Whether the field is about the means, not about one statistic.
    pub(super) fn of_the_means(self) -> bool {
        matches!(self, Field::WelchP | Field::Significant)
    }

    pub(super) fn key(self) -> &'static str {
        match self {
            Field::Compare => "compare",
            Field::Baseline => "baseline",
            Field::Delta => "delta",
            Field::DeltaPct => "delta_pct",
            Field::DiffPct => "diff_pct",
            Field::WelchP => "welch_p",
            Field::Significant => "significant",
        }
    }
}

/// A parsed `--fail-if` condition.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    /// Metric name, snake_case (e.g. `cr3_writes_per_call`).
    pub metric: String,
    /// Statistic of the runs (default Amean).
    pub stat: Stat,
    /// Which number of the comparison (default the compare side).
    pub field: Field,
    /// The comparison.
    pub op: Op,
    /// The number compared against.
    pub threshold: f64,
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.of_the_means() {
            return write!(
                f,
                "{}.{}{}{}",
                self.metric,
                self.field.key(),
                self.op.symbol(),
                number_text(self.threshold)
            );
        }
        write!(
            f,
            "{}.{}.{}{}{}",
            self.metric,
            self.stat.key(),
            self.field.key(),
            self.op.symbol(),
            number_text(self.threshold)
        )
    }
}

impl Condition {
    /// Parses one table condition (a `--fail-if` list is [`FailIf::parse`]'s).
    pub fn parse(text: &str) -> Result<Self, ConditionError> {
        let cond = text.trim();
        if cond.is_empty() {
            return Err(ConditionError::Empty(text.to_owned()));
        }
        let (lhs, op, rhs) = split_operator(cond)?;
        let threshold = threshold(cond, rhs)?;
        let mut parts = lhs.split('.');
        let metric = parts.next().unwrap_or("").trim();
        let snake = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        if !snake(metric) {
            return Err(ConditionError::BadMetric {
                cond: cond.to_owned(),
                name: metric.to_owned(),
            });
        }
        let (mut stat, mut field) = (None, None);
        for part in parts {
            let part = part.trim();
            if let Some(s) = Stat::from_key(part) {
                if stat.replace(s).is_some() {
                    return Err(ConditionError::Repeated {
                        cond: cond.to_owned(),
                        what: "statistic",
                    });
                }
            } else if let Some(f) = Field::ALL.into_iter().find(|f| f.key() == part) {
                if field.replace(f).is_some() {
                    return Err(ConditionError::Repeated {
                        cond: cond.to_owned(),
                        what: "field",
                    });
                }
            } else {
                return Err(ConditionError::UnknownQualifier {
                    cond: cond.to_owned(),
                    part: part.to_owned(),
                });
            }
        }
        if let (Some(f), Some(s)) = (field, stat) {
            if f.of_the_means() {
                return Err(ConditionError::StatWithMeansField {
                    cond: cond.to_owned(),
                    field: f.key(),
                    stat: s.key(),
                });
            }
        }
        Ok(Condition {
            metric: metric.to_owned(),
            stat: stat.unwrap_or(Stat::Amean),
            field: field.unwrap_or(Field::Compare),
            op,
            threshold,
        })
    }

    /// Evaluates against a table. An undefined value (e.g. `delta_pct` with a
    /// zero baseline, `stddev` of a single run) is an error, so that a CI
    /// guard never passes silently because its number did not exist.
    pub fn evaluate(&self, table: &CompareTable) -> Result<Evaluation, EvalError> {
        let cond = self.to_string();
        let m = table
            .metric(&self.metric)
            .ok_or_else(|| EvalError::UnknownMetric {
                cond: cond.clone(),
                metric: self.metric.clone(),
                available: table
                    .metrics
                    .iter()
                    .map(|m| m.metric.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let (value, why) = match self.field {
            Field::Compare => (
                m.compare.get(self.stat),
                "statistic undefined for these runs",
            ),
            Field::Baseline => (
                m.baseline.get(self.stat),
                "statistic undefined for these runs",
            ),
            Field::Delta => (m.delta(self.stat), "statistic undefined for these runs"),
            Field::DeltaPct => (
                m.delta_pct.get(self.stat),
                "baseline is 0 or statistic undefined",
            ),
            Field::DiffPct => (
                m.diff_pct.get(self.stat),
                "baseline is 0 or statistic undefined",
            ),
            Field::WelchP => (
                m.significance.and_then(|s| s.welch).map(|w| w.p_value),
                "Welch's test needs two runs a side and variance on one side at least",
            ),
            Field::Significant => (
                m.significance
                    .filter(|s| s.verdict != crate::report::stats::Verdict::Undefined)
                    .map(|s| if s.verdict.marked() { 1.0 } else { 0.0 }),
                "significance needs two runs a side",
            ),
        };
        let value = value.ok_or(EvalError::Undefined {
            cond: cond.clone(),
            why,
        })?;
        Ok(Evaluation {
            triggered: self.op.holds(value, self.threshold),
            condition: cond,
            value,
        })
    }
}

/// Result of evaluating one condition.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    /// The condition in canonical form.
    pub condition: String,
    /// The number the condition looked at.
    pub value: f64,
    /// True if the condition holds, i.e. the run should fail.
    pub triggered: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::threshold::FailIf;

    fn table() -> CompareTable {
        crate::report::compare::tests::sample_table()
    }

    fn eval(s: &str) -> Result<Evaluation, EvalError> {
        Condition::parse(s).unwrap().evaluate(&table())
    }

    #[test]
    fn parse_defaults_and_qualifiers() {
        let c = Condition::parse(" cr3_writes_per_call > 2 ").unwrap();
        assert_eq!(
            (c.stat, c.field, c.op, c.threshold),
            (Stat::Amean, Field::Compare, Op::Gt, 2.0)
        );
        let c = Condition::parse("cycles_per_call.delta_pct>=50").unwrap();
        assert_eq!((c.field, c.op), (Field::DeltaPct, Op::Ge));
        let c = Condition::parse("cycles_per_call.baseline.coeffvar<-1e-3").unwrap();
        assert_eq!(
            (c.stat, c.field, c.op, c.threshold),
            (Stat::CoeffVar, Field::Baseline, Op::Lt, -0.001)
        );
        assert_eq!(c.to_string(), "cycles_per_call.coeffvar.baseline<-0.001");
        assert_eq!(FailIf::parse(&["a>1,b.max!=2"]).unwrap().table.len(), 2);
    }

    #[test]
    fn a_threshold_that_underflows_is_refused_not_zero() {
        for t in ["1e-400", "0.5e-320", "-3e-310"] {
            let e = Condition::parse(&format!("ns_per_call>{t}")).unwrap_err();
            assert!(matches!(e, ConditionError::Underflow { .. }), "{t}: {e:?}");
            assert!(e.to_string().contains("smallest normal f64"), "{e}");
        }
        // Zero written as zero, in any spelling, is zero.
        for t in ["0", "0.0", "0e-400", "-0"] {
            assert!(Condition::parse(&format!("ns_per_call>{t}")).is_ok(), "{t}");
        }
        assert!(Condition::parse("ns_per_call>2.3e-308").is_ok());
    }

    #[test]
    fn parse_errors_name_the_problem() {
        assert_eq!(
            Condition::parse("  "),
            Err(ConditionError::Empty("  ".into()))
        );
        assert!(matches!(
            Condition::parse("cycles 50"),
            Err(ConditionError::NoOperator(_))
        ));
        assert!(matches!(
            Condition::parse(">5"),
            Err(ConditionError::BadMetric { .. })
        ));
        assert!(matches!(
            Condition::parse("Cycles>5"),
            Err(ConditionError::BadMetric { .. })
        ));
        assert_eq!(
            Condition::parse("x>fifty"),
            Err(ConditionError::BadNumber {
                cond: "x>fifty".into(),
                text: "fifty".into()
            })
        );
        assert!(matches!(
            Condition::parse("x>inf"),
            Err(ConditionError::BadNumber { .. })
        ));
        assert!(matches!(
            Condition::parse("x=>1"),
            Err(ConditionError::BadOperator { .. })
        ));
        let e = Condition::parse("x.median>1").unwrap_err();
        assert!(e.to_string().contains("\"median\""), "{e}");
        assert!(matches!(
            Condition::parse("x.min.max>1"),
            Err(ConditionError::Repeated {
                what: "statistic",
                ..
            })
        ));
        assert!(matches!(
            Condition::parse("x.delta.compare>1"),
            Err(ConditionError::Repeated { what: "field", .. })
        ));
    }

    #[test]
    fn evaluation() {
        // Amean compare = 2 exactly.
        assert!(!eval("cr3_writes_per_call!=2").unwrap().triggered);
        assert!(eval("cr3_writes_per_call.baseline==0").unwrap().triggered);
        assert!(!eval("cr3_writes_per_call>2").unwrap().triggered);
        // 812 -> 1523: +87.56 %.
        let e = eval("cycles_per_call.delta_pct>50").unwrap();
        assert!(e.triggered && (e.value - 87.5616).abs() < 1e-3);
        assert!(!eval("cycles_per_call.delta_pct>90").unwrap().triggered);
        assert!(eval("cycles_per_call.diff_pct<-50").unwrap().triggered);
        assert_eq!(
            eval("cycles_per_call.max.delta>0").unwrap().value,
            1546.0 - 824.0
        );
        // 0 -> 2: no percentage; an error, not a silent pass.
        assert!(matches!(
            eval("cr3_writes_per_call.delta_pct>1"),
            Err(EvalError::Undefined { .. })
        ));
        // Significance: 812 -> 1523 is marked; 0 -> 2 exact and different.
        assert!(eval("cycles_per_call.significant==1").unwrap().triggered);
        assert!(
            eval("cr3_writes_per_call.significant==1")
                .unwrap()
                .triggered
        );
        let p = eval("cycles_per_call.welch_p<0.001").unwrap();
        assert!(p.triggered && (p.value - 1.976_578_999_274_445e-5).abs() < 1e-9);
        assert_eq!(p.condition, "cycles_per_call.welch_p<0.001");
        // Both sides exact: no Welch test, an error rather than a pass.
        assert!(matches!(
            eval("cr3_writes_per_call.welch_p<0.05"),
            Err(EvalError::Undefined { .. })
        ));
        assert!(matches!(
            Condition::parse("x.max.welch_p<0.05"),
            Err(ConditionError::StatWithMeansField { .. })
        ));
        let e = eval("nope>1").unwrap_err();
        assert!(
            e.to_string()
                .contains("cycles_per_call, cr3_writes_per_call"),
            "{e}"
        );
    }
}
