//! Running `ptiscope compare` and reading its JSON (`ptiscope.compare/1`).
use crate::measure::median;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

/// One `ptiscope compare --quiet --json` run with `args`; its document.
pub fn run(ptiscope: &Path, args: &[&str]) -> Result<Compare, String> {
    let json = std::env::temp_dir().join(format!(
        "ptiscope-bench-compare-{}-{}.json",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let out = Command::new(ptiscope)
        .args(["compare", "--quiet"])
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", ptiscope.display()))?;
    if !out.status.success() {
        return Err(format!(
            "ptiscope compare {} failed ({}):\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text =
        std::fs::read_to_string(&json).map_err(|e| format!("reading the compare JSON: {e}"))?;
    let _ = std::fs::remove_file(&json);
    let doc = serde_json::from_str(&text).map_err(|e| format!("compare JSON: {e}"))?;
    Ok(Compare { doc })
}

/// A compare document.
pub struct Compare {
    pub doc: Value,
}

impl Compare {
    /// The per-run values of `metric` on `side` ("baseline" or "compare").
    pub fn samples(&self, metric: &str, side: &str) -> Option<Vec<f64>> {
        self.doc["metrics"]
            .as_array()?
            .iter()
            .find(|m| m["name"] == metric)?[side]["samples"]
            .as_array()?
            .iter()
            .map(|v| v.as_f64())
            .collect()
    }

    /// The median of [`Compare::samples`].
    pub fn median(&self, metric: &str, side: &str) -> Option<f64> {
        self.samples(metric, side).map(|s| median(&s))
    }
}
