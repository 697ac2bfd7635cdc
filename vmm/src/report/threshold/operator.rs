//! What both kinds of condition share: the comparison operators and the
//! number grammar (a finite decimal number, one that underflows refused),
//! and how a threshold prints.

use super::error::ConditionError;

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
    pub(super) fn symbol(self) -> &'static str {
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
    pub(super) fn holds(self, a: f64, b: f64) -> bool {
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
