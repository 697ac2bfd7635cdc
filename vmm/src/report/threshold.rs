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
//! Size: the `--fail-if` grammar, its evaluation and messages; about half is tests.

use std::fmt;

use super::by_symbol::{SymbolDiff, SymbolRow};
use super::compare::CompareTable;
use super::stats::Stat;

/// The two forms of a condition, for the messages that refuse one.
const FORMS: &str =
    "a condition is METRIC[.STAT][.FIELD] OP NUMBER (e.g. cycles_per_call.delta_pct>50) \
     or symbol:NAME[.delta|.baseline|.compare] OP NUMBER (e.g. symbol:entry_SYSCALL_64>4), \
     OP one of > >= < <= == !=";

/// The qualifiers a table condition takes, for the messages.
const QUALIFIERS: &str = "statistics: min amean stddev coeffvar max bamean50 bamean95 bamean99; \
     fields: compare baseline delta delta_pct diff_pct welch_p significant";

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
    const ALL: [Field; 7] = [
        Field::Compare,
        Field::Baseline,
        Field::Delta,
        Field::DeltaPct,
        Field::DiffPct,
        Field::WelchP,
        Field::Significant,
    ];

    /// Whether the field is about the means, not about one statistic.
    fn of_the_means(self) -> bool {
        matches!(self, Field::WelchP | Field::Significant)
    }

    fn key(self) -> &'static str {
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

/// Comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `==`
    Eq,
    /// `!=`
    Ne,
}

impl Op {
    fn symbol(self) -> &'static str {
        match self {
            Op::Gt => ">",
            Op::Ge => ">=",
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Eq => "==",
            Op::Ne => "!=",
        }
    }

    /// Exact comparison: per-call counts such as 2N/N are exact in f64.
    fn holds(self, a: f64, b: f64) -> bool {
        match self {
            Op::Gt => a > b,
            Op::Ge => a >= b,
            Op::Lt => a < b,
            Op::Le => a <= b,
            Op::Eq => a == b,
            Op::Ne => a != b,
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

/// Why a condition does not parse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConditionError {
    /// Nothing but whitespace where a condition should be (an empty
    /// `--fail-if`, or an empty item of a comma-separated list).
    #[error("{0:?} has an empty condition (conditions are separated by single commas; {FORMS})")]
    Empty(String),
    /// No comparison operator (the condition).
    #[error("condition {0:?} has no comparison operator ({FORMS})")]
    NoOperator(String),
    /// Operator characters that are no operator (`=>`, `<>`, `=`).
    #[error("condition {cond:?}: {op:?} is not a comparison operator (OP is one of > >= < <= == !=; equality is ==)")]
    BadOperator {
        /// The condition.
        cond: String,
        /// The operator characters as written.
        op: String,
    },
    /// The metric name is not snake_case.
    #[error("condition {cond:?}: metric name {name:?} is not snake_case ([a-z0-9_], non-empty); {FORMS}")]
    BadMetric {
        /// The condition.
        cond: String,
        /// The metric name given.
        name: String,
    },
    /// The right-hand side is not a number.
    #[error("condition {cond:?}: {text:?} is not a finite decimal number (e.g. 2, -0.5, 1e3)")]
    BadNumber {
        /// The condition.
        cond: String,
        /// The text after the operator.
        text: String,
    },
    /// The number is too small for an f64 (it would silently become 0 or
    /// lose its precision).
    #[error("condition {cond:?}: {text:?} is below the smallest normal f64 (2.2e-308) and would not compare as written; use 0 or a larger value")]
    Underflow {
        /// The condition.
        cond: String,
        /// The text after the operator.
        text: String,
    },
    /// A qualifier that is neither a statistic nor a field.
    #[error("condition {cond:?}: unknown qualifier {part:?} ({QUALIFIERS})")]
    UnknownQualifier {
        /// The condition.
        cond: String,
        /// The qualifier.
        part: String,
    },
    /// Two statistics or two fields.
    #[error("condition {cond:?}: more than one {what} given ({QUALIFIERS}; one of each at most)")]
    Repeated {
        /// The condition.
        cond: String,
        /// `statistic` or `field`.
        what: &'static str,
    },
    /// A statistic given with a field that is about the means.
    #[error(
        "condition {cond:?}: {field} is about the means and takes no statistic (drop {stat:?})"
    )]
    StatWithMeansField {
        /// The condition.
        cond: String,
        /// The field (`welch_p` or `significant`).
        field: &'static str,
        /// The statistic given.
        stat: &'static str,
    },
    /// A symbol condition without a usable symbol name.
    #[error("condition {cond:?}: {name:?} is not a kernel symbol name (ASCII letters, digits, _ and $, with dots between parts as in foo.cold; or [unknown], [unattributed]), e.g. symbol:entry_SYSCALL_64.delta>4")]
    BadSymbol {
        /// The condition.
        cond: String,
        /// The name given.
        name: String,
    },
    /// A symbol condition with a table condition's qualifier (it would
    /// otherwise be read as part of the name, of a symbol that never runs).
    #[error("condition {cond:?}: a symbol condition takes .delta (the default), .baseline or .compare, not .{part}")]
    SymbolQualifier {
        /// The condition.
        cond: String,
        /// The qualifier given.
        part: String,
    },
}

/// The operators, two-character ones first so that `>=` is not read as
/// `>` then `=2`.
const OPERATORS: [(&str, Op); 6] = [
    (">=", Op::Ge),
    ("<=", Op::Le),
    ("==", Op::Eq),
    ("!=", Op::Ne),
    (">", Op::Gt),
    ("<", Op::Lt),
];

/// The characters operators are made of: neither a metric nor a symbol
/// name nor a number holds one.
const OPERATOR_CHARS: &str = "<>=!";

/// `cond` split at its comparison operator: the whole run of operator
/// characters at the first of them, which must be one of [`OPERATORS`]
/// (so `=>`, `<>`, `>>` or a lone `=` are refused as operators, not read
/// as `>` beside a stray character that a later message would blame on
/// the name or the number): the text before it, the operator, the text
/// after it, both trimmed. One reading for both kinds of condition.
pub fn split_operator(cond: &str) -> Result<(&str, Op, &str), ConditionError> {
    let pos = cond
        .find(|c| OPERATOR_CHARS.contains(c))
        .ok_or_else(|| ConditionError::NoOperator(cond.to_owned()))?;
    let len = cond[pos..]
        .find(|c| !OPERATOR_CHARS.contains(c))
        .unwrap_or(cond.len() - pos);
    let written = &cond[pos..pos + len];
    let op = OPERATORS
        .iter()
        .find(|(sym, _)| *sym == written)
        .map(|(_, op)| *op)
        .ok_or_else(|| ConditionError::BadOperator {
            cond: cond.to_owned(),
            op: written.to_owned(),
        })?;
    Ok((cond[..pos].trim(), op, cond[pos + len..].trim()))
}

/// A threshold as conditions print it: as written for ordinary
/// magnitudes, in exponent form beyond them (`1e308`, not 309 digits).
pub fn number_text(v: f64) -> String {
    if v != 0.0 && !(1e-4..1e15).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

/// The number a condition compares against: a finite decimal number; one
/// written non-zero that parses to 0 or a subnormal (`1e-400`, `1e-310`)
/// is refused, since it is not the number compared. One grammar for both
/// kinds of condition.
pub fn threshold(cond: &str, rhs: &str) -> Result<f64, ConditionError> {
    let value = rhs
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
        .ok_or_else(|| ConditionError::BadNumber {
            cond: cond.to_owned(),
            text: rhs.to_owned(),
        })?;
    let mantissa = rhs.split(['e', 'E']).next().unwrap_or("");
    let written_nonzero = mantissa.bytes().any(|b| (b'1'..=b'9').contains(&b));
    if written_nonzero && value.abs() < f64::MIN_POSITIVE {
        return Err(ConditionError::Underflow {
            cond: cond.to_owned(),
            text: rhs.to_owned(),
        });
    }
    Ok(value)
}

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

/// A table condition's qualifier that a symbol condition does not take.
fn table_qualifier(part: &str) -> bool {
    Stat::from_key(part).is_some() || Field::ALL.iter().any(|f| f.key() == part)
}

/// One `symbol:NAME[.delta|.baseline|.compare] OP NUMBER`. A name may hold
/// dots (`foo.cold`, `foo.isra.0`): only a last part that is a field is
/// taken as one, and a table condition's qualifier there is refused rather
/// than read as part of the name.
pub fn parse_symbol(text: &str) -> Result<SymbolCondition, ConditionError> {
    let cond = text.trim();
    let Some(rest) = cond.strip_prefix(SymbolCondition::PREFIX) else {
        return Err(ConditionError::BadSymbol {
            cond: cond.to_owned(),
            name: cond.to_owned(),
        });
    };
    let (lhs, op, rhs) = split_operator(rest).map_err(|e| match e {
        ConditionError::BadOperator { op, .. } => ConditionError::BadOperator {
            cond: cond.to_owned(),
            op,
        },
        _ => ConditionError::NoOperator(cond.to_owned()),
    })?;
    let value = threshold(cond, rhs)?;
    let (symbol, field) = match lhs.rsplit_once('.').map(|(s, f)| (s.trim(), f.trim())) {
        Some((s, f @ ("delta" | "baseline" | "compare"))) => (s, f),
        Some((_, part)) if table_qualifier(part) => {
            return Err(ConditionError::SymbolQualifier {
                cond: cond.to_owned(),
                part: part.to_owned(),
            })
        }
        _ => (lhs, "delta"),
    };
    let field: &'static str = match field {
        "baseline" => "baseline",
        "compare" => "compare",
        _ => "delta",
    };
    // What /proc/kallsyms names hold: ASCII letters, digits, `_`, `$` and
    // the dots of compiler suffixes (`foo.cold`, `foo.isra.0`), never
    // leading, trailing or doubled (an empty part is a typo, e.g. `foo.`);
    // and the table's own rows for addresses outside every symbol.
    let name_ok = [super::by_symbol::UNKNOWN, super::by_symbol::UNATTRIBUTED].contains(&symbol)
        || !symbol.is_empty()
            && symbol
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_$.".contains(&b))
            && symbol.split('.').all(|part| !part.is_empty());
    if !name_ok {
        return Err(ConditionError::BadSymbol {
            cond: cond.to_owned(),
            name: symbol.to_owned(),
        });
    }
    Ok(SymbolCondition {
        symbol: symbol.to_owned(),
        field,
        op: op.symbol(),
        value,
    })
}

/// Why a condition cannot be evaluated against a table.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EvalError {
    /// The table has no such metric.
    #[error("{cond}: no metric {metric:?} in the table (have: {available})")]
    UnknownMetric {
        /// The condition.
        cond: String,
        /// The metric asked for.
        metric: String,
        /// The table's metrics, comma-separated.
        available: String,
    },
    /// The number is undefined for these runs (too few runs, a zero baseline, ...).
    #[error("{cond}: value is undefined ({why})")]
    Undefined {
        /// The condition.
        cond: String,
        /// Why it is undefined.
        why: &'static str,
    },
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
                    .filter(|s| s.verdict != super::stats::Verdict::Undefined)
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

/// `--fail-if symbol:NAME[.FIELD] OP NUMBER`: FIELD is `delta` (the
/// default: compare - baseline, per call), `baseline` or `compare`.
#[derive(Debug, Clone, PartialEq)]
pub struct SymbolCondition {
    /// The symbol.
    pub symbol: String,
    /// `delta`, `baseline` or `compare`.
    pub field: &'static str,
    /// The operator.
    pub op: &'static str,
    /// The threshold.
    pub value: f64,
}

impl SymbolCondition {
    /// The prefix that makes a `--fail-if` a symbol condition.
    pub const PREFIX: &'static str = "symbol:";

    /// Parses one condition (starting with [`Self::PREFIX`]): the
    /// `--fail-if` grammar's, [`parse_symbol`].
    pub fn parse(text: &str) -> Result<SymbolCondition, ConditionError> {
        parse_symbol(text)
    }

    /// The text of the condition.
    pub fn text(&self) -> String {
        format!(
            "{}{}.{}{}{}",
            Self::PREFIX,
            self.symbol,
            self.field,
            self.op,
            number_text(self.value)
        )
    }

    /// Whether it holds on `diff`, and the value it looked at (a symbol
    /// that ran on neither side is 0 there).
    pub fn evaluate<'a>(&self, diff: &'a SymbolDiff) -> (bool, f64, Option<&'a SymbolRow>) {
        let row = diff.row(&self.symbol);
        let v = row.map_or(0.0, |r| match self.field {
            "baseline" => r.baseline,
            "compare" => r.compare,
            _ => r.delta,
        });
        let holds = match self.op {
            ">" => v > self.value,
            ">=" => v >= self.value,
            "<" => v < self.value,
            "<=" => v <= self.value,
            "==" => v == self.value,
            _ => v != self.value,
        };
        (holds, v, row)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn symbol_conditions() {
        let side = |n: u64| crate::report::by_symbol::BySymbol {
            calls: 10,
            kernel_instructions: n,
            symbols: vec![crate::report::by_symbol::SymbolCount {
                symbol: "entry_SYSCALL_64".into(),
                instructions: n,
            }],
            table_symbols: 10,
        };
        let (b, c) = (side(100), side(180));
        let d = SymbolDiff::new(&[&b], &[&c]);
        let cond = SymbolCondition::parse("symbol:entry_SYSCALL_64>5").unwrap();
        assert_eq!(cond.field, "delta");
        assert!(cond.evaluate(&d).0);
        assert_eq!(cond.evaluate(&d).1, 8.0);
        let cond = SymbolCondition::parse("symbol:entry_SYSCALL_64.compare <= 18").unwrap();
        assert!(cond.evaluate(&d).0);
        let absent = SymbolCondition::parse("symbol:nothing.delta!=0").unwrap();
        assert_eq!(absent.evaluate(&d), (false, 0.0, None));
        for bad in [
            "symbol:>5",
            "symbol:x",
            "symbol:x>",
            "symbol:x>abc",
            "symbol:x=>5",
            "symbol:x>inf",
            "entry>5",
        ] {
            assert!(SymbolCondition::parse(bad).is_err(), "{bad}");
        }
    }
}
