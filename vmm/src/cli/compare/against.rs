//! `--against FILE.json`: this comparison beside an earlier one, and what
//! differs between the environments they came from.

use std::path::Path;

use crate::report::CompareTable;

/// The most bytes `--against` reads: a compare document is tens of KiB (a
/// few hundred runs of a few dozen metrics); parsing is about 20 times its
/// size in memory.
pub(super) const MAX_AGAINST_BYTES: u64 = 16 << 20;

/// Reads an earlier `compare --json` document: a regular file of at most
/// [`MAX_AGAINST_BYTES`], read within `time_limit` (signals end the read).
/// The error is the exit code (64, or 128 + the signal) and the message.
pub(super) fn read_earlier(
    p: &Path,
    time_limit: std::time::Duration,
) -> Result<(std::path::PathBuf, CompareTable), (i32, String)> {
    use crate::input::{read_regular, InputError};
    let usage = |msg: String| (crate::cli::exit_code::USAGE, msg);
    let bytes = read_regular("--against", p, MAX_AGAINST_BYTES, time_limit).map_err(|e| {
        let code = e.signal().map_or(crate::cli::exit_code::USAGE, |s| 128 + s);
        let msg = match &e {
            InputError::TooLarge { .. } => format!(
                "larger than {} MiB, the most read for --against (a compare --json document is far smaller)",
                MAX_AGAINST_BYTES >> 20
            ),
            InputError::Io { source, .. } => format!("cannot read it: {source}"),
            InputError::NotRegular { kind, .. } => {
                format!("{kind}, not a regular file; give a `ptiscope compare --json` file")
            }
            _ => e.to_string(),
        };
        (code, msg)
    })?;
    let v: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| usage(format!("not JSON: {e}")))?;
    drop(bytes);
    let schema = v["schema"].as_str().unwrap_or("").to_owned();
    if schema != crate::report::compare::SCHEMA {
        return Err(usage(format!(
            "not a `ptiscope compare --json` document this version reads (schema {:?}, expected {:?})",
            schema,
            crate::report::compare::SCHEMA
        )));
    }
    CompareTable::from_json(v)
        .map(|t| (p.to_path_buf(), t))
        .map_err(|e| usage(format!("not a readable {schema} document: {e}")))
}

/// `--against FILE`: each side of this compare against the same side of an
/// earlier one, and what differs in their environments.
pub struct Against {
    /// The earlier document.
    pub file: std::path::PathBuf,
    /// Earlier baseline runs vs this compare's baseline runs, and the same
    /// for the compare side.
    pub sides: [CompareTable; 2],
    /// One line per environment field that differs (`field: earlier -> now`).
    pub environment_differences: Vec<String>,
    /// The earlier document had no `environment` block.
    pub environment_missing: bool,
}

impl Against {
    /// The earlier table `earlier` (from `file`) beside this compare's `now`.
    pub fn new(file: &Path, earlier: &CompareTable, now: &CompareTable) -> Self {
        let side = |label: &str,
                    earlier_side: &crate::report::compare::Side,
                    now_side: &crate::report::compare::Side| {
            let mut t = CompareTable::new(
                crate::report::compare::Side {
                    label: format!("earlier {}", earlier_side.label),
                    config: earlier_side.config.clone(),
                },
                crate::report::compare::Side {
                    label: format!("now {}", now_side.label),
                    config: now_side.config.clone(),
                },
            );
            for m in &now.metrics {
                if let Some(e) = earlier.metric(&m.metric.name) {
                    let (e, n) = if label == "baseline" {
                        (&e.baseline, &m.baseline)
                    } else {
                        (&e.compare, &m.compare)
                    };
                    // A count's integers come along (exactness is theirs);
                    // an earlier document without them is compared by its
                    // samples. Both come from valid tables: this cannot
                    // fail but for a hand-edited file, where the metric is
                    // skipped.
                    let _ = match (&e.counts, &n.counts) {
                        (Some(_), Some(_)) => {
                            t.add_summaries(m.metric.clone(), e.clone(), n.clone())
                        }
                        _ => t.add(m.metric.clone(), &e.samples, &n.samples),
                    };
                }
            }
            t
        };
        let (environment_differences, environment_missing) =
            match (&earlier.environment, &now.environment) {
                (Some(e), Some(n)) => (n.differences(e), false),
                _ => (Vec::new(), true),
            };
        Against {
            file: file.to_path_buf(),
            sides: [
                side("baseline", &earlier.baseline, &now.baseline),
                side("compare", &earlier.compare, &now.compare),
            ],
            environment_differences,
            environment_missing,
        }
    }

    /// The text section printed after this compare's own table.
    pub fn render_text(&self) -> String {
        let mut out = format!(
            "\nagainst {}: each side now vs the same side then (means, 95 % CI, Welch p)\n",
            self.file.display()
        );
        for t in &self.sides {
            // As in the main table: metrics zero in every run stay in the JSON only.
            out.push('\n');
            out.push_str(&super::nonzero_metrics(t).render_confidence());
        }
        out.push('\n');
        if self.environment_missing {
            out.push_str("  environment: the earlier result records none\n");
        } else if self.environment_differences.is_empty() {
            out.push_str("  environment: the same as the earlier result's\n");
        } else {
            out.push_str(&format!(
                "  environment: DIFFERS from the earlier result's in {} field(s) (see stderr)\n",
                self.environment_differences.len()
            ));
        }
        out
    }

    /// The `against` object of the compare JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "file": self.file.display().to_string(),
            "environment_differences": self.environment_differences,
            "environment_missing": self.environment_missing,
            "baseline": self.sides[0].to_json(),
            "compare": self.sides[1].to_json(),
        })
    }
}
