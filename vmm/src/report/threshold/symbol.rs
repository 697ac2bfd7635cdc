//! Conditions on the `--by-symbol` table: `symbol:NAME[.FIELD] OP NUMBER`,
//! a name that may hold dots, evaluated on one symbol's row.

use super::error::ConditionError;
use super::operator::{number_text, split_operator, threshold};
use super::table::Field;
use crate::report::by_symbol::{SymbolDiff, SymbolRow};
use crate::report::stats::Stat;

/// A table condition's qualifier that a symbol condition does not take.
pub(super) fn table_qualifier(part: &str) -> bool {
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
    let name_ok = [
        crate::report::by_symbol::UNKNOWN,
        crate::report::by_symbol::UNATTRIBUTED,
    ]
    .contains(&symbol)
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
