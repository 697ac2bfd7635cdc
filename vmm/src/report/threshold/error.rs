//! Why a `--fail-if` condition does not parse, or cannot be evaluated
//! against a table; the refusals name the valid forms.

/// The two forms of a condition, for the messages that refuse one.
const FORMS: &str =
    "a condition is METRIC[.STAT][.FIELD] OP NUMBER (e.g. cycles_per_call.delta_pct>50) \
     or symbol:NAME[.delta|.baseline|.compare] OP NUMBER (e.g. symbol:entry_SYSCALL_64>4), \
     OP one of > >= < <= == !=";

/// The qualifiers a table condition takes, for the messages.
const QUALIFIERS: &str = "statistics: min amean stddev coeffvar max bamean50 bamean95 bamean99; \
     fields: compare baseline delta delta_pct diff_pct welch_p significant";

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
