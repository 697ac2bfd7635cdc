//! Reports: per-run summaries, compare tables (mmtests compare-kernels layout), JSON and CSV.
//!
//! Everything here is UI-agnostic: functions return `String`s or serde values
//! and the CLI decides where they go. Every figure carries a [`metric::Metric`]
//! saying what it is, its unit and where it came from (KVM, guest, VMM, host
//! clock). The JSON schemas are documented in `docs/report-json.md`.

pub mod answer;
pub mod by_symbol;
pub mod compare;
pub mod end;
pub mod environment;
pub mod guest_result;
mod kvm_summary;
pub mod metric;
pub mod mitigations;
pub mod note;
pub mod plot;
pub mod plugin_rows;
pub mod run_summary;
pub mod stats;
pub mod sweep;
pub mod sweep_svg;
pub mod threshold;
pub mod time_basis;

pub use compare::{CompareError, CompareTable, MetricComparison};
pub use environment::Environment;
pub use guest_result::{rate_name, requested, result_fields, summary_from_result};
pub use metric::{Metric, Source};
pub use run_summary::{CrossCheck, RunRow, RunSummary};
pub use stats::{Stat, Summary};
pub use threshold::{Condition, ConditionError, EvalError, Evaluation, FailIf};

/// RFC 4180 quoting: a field with a comma, quote or line break is quoted.
pub(crate) fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// Test helper: renders `svg` with resvg (text through the system's
/// fonts) and returns the pixmap; panics, failing the test, when the SVG
/// does not parse or renders to nothing. With `PTISCOPE_PNG_DIR` set, also
/// writes `name.png` there, to be looked at.
#[cfg(test)]
pub(crate) fn render_png(svg: &str, name: &str) -> resvg::tiny_skia::Pixmap {
    let mut opt = resvg::usvg::Options::default();
    opt.fontdb_mut().load_system_fonts();
    let tree = resvg::usvg::Tree::from_str(svg, &opt).unwrap_or_else(|e| panic!("{name}: {e}"));
    let size = tree.size().to_int_size();
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height())
        .unwrap_or_else(|| panic!("{name}: empty picture"));
    resvg::render(
        &tree,
        resvg::tiny_skia::Transform::default(),
        &mut pixmap.as_mut(),
    );
    let ink = pixmap
        .pixels()
        .iter()
        .filter(|p| p.red() < 200 || p.green() < 200 || p.blue() < 200)
        .count();
    assert!(
        ink > 500,
        "{name}: the picture rendered (almost) blank: {ink} dark pixels"
    );
    if let Some(dir) = std::env::var_os("PTISCOPE_PNG_DIR") {
        let path = std::path::Path::new(&dir).join(format!("{name}.png"));
        pixmap
            .save_png(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    pixmap
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
