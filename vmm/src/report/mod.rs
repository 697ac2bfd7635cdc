//! Reports: per-run summaries, compare tables (mmtests compare-kernels layout), JSON and CSV.
//!
//! Everything here is UI-agnostic: functions return `String`s or serde values
//! and the CLI decides where they go. Every figure carries a [`metric::Metric`]
//! saying what it is, its unit and where it came from (KVM, guest, VMM, host
//! clock). The JSON schemas are documented in `docs/report-json.md`.

pub mod answer;
pub mod compare;
pub mod environment;
pub mod metric;
pub mod plot;
pub mod run_summary;
pub mod stats;
pub mod sweep;
pub mod sweep_svg;
pub mod threshold;

pub use compare::{CompareError, CompareTable, MetricComparison};
pub use environment::Environment;
pub use metric::{Metric, Source};
pub use run_summary::{CrossCheck, RunRow, RunSummary};
pub use stats::{Stat, Summary};
pub use threshold::{Condition, ConditionError, EvalError, Evaluation};

/// RFC 4180 quoting: a field with a comma, quote or line break is quoted.
pub(crate) fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// Test helper: JSON values equal up to the last bits of floats (serde_json
/// without `float_roundtrip` may parse a printed f64 one ulp off).
#[cfg(test)]
pub(crate) fn json_approx_eq(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => x == y || (x - y).abs() <= 1e-12 * x.abs().max(y.abs()),
            _ => x == y,
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_approx_eq(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_approx_eq(v, w)))
        }
        _ => a == b,
    }
}
