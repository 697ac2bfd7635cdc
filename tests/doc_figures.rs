//! Every measured figure the docs quote from a kept result file says so,
//! and says it right. A figure is written as a Markdown link to the file
//! with the figure's place in it as the link's title:
//!
//! ```text
//! [385](results/linux-6.1-amd64-getppid.json "kernel_instructions_per_call.compare")
//! ```
//!
//! (relative to the document; from README.md, `docs/results/...`). The
//! place is `METRIC.SIDE[.STAT]`: the `metrics[]` entry named METRIC of a
//! `ptiscope compare --json` document, its `baseline` or `compare` side, and
//! STAT of it (default `amean`), or `METRIC.delta` (compare's amean minus
//! baseline's); or `symbol:NAME.SIDE` (SIDE also `delta`), a row of the
//! `--by-symbol` table. The number in the link must equal the file's value rounded
//! to the decimals the number shows (thousands separators allowed). So a
//! figure cannot drift from the run that measured it, and one run is quoted
//! the same everywhere: docs/results/README.md lists the files and the
//! commands that made them.

use std::path::{Path, PathBuf};

struct Quote {
    doc: PathBuf,
    line: usize,
    shown: String,
    file: PathBuf,
    place: String,
}

/// The figure links of one Markdown document.
fn quotes(doc: &Path) -> Vec<Quote> {
    let text = std::fs::read_to_string(doc).unwrap();
    let dir = doc.parent().unwrap();
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(open) = rest.find('[') {
            rest = &rest[open + 1..];
            let Some(close) = rest.find("](") else { break };
            let shown = &rest[..close];
            let after = &rest[close + 2..];
            let Some(end) = after.find(')') else { break };
            let target = &after[..end];
            rest = &after[end..];
            let Some((file, title)) = target.split_once(' ') else {
                continue;
            };
            if !file.contains("results/") || !file.ends_with(".json") {
                continue;
            }
            let place = title.trim().trim_matches('"').to_string();
            out.push(Quote {
                doc: doc.to_path_buf(),
                line: i + 1,
                shown: shown.to_string(),
                file: dir.join(file),
                place,
            });
        }
    }
    out
}

/// The value at `place` in a compare document.
fn value(doc: &serde_json::Value, place: &str) -> Result<f64, String> {
    // `symbol:NAME.SIDE`: a row of the by-symbol table (`--by-symbol`).
    if let Some(rest) = place.strip_prefix("symbol:") {
        let (name, side) = rest
            .rsplit_once('.')
            .ok_or("no side (baseline, compare or delta)")?;
        let row = doc["by_symbol"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["symbol"] == name))
            .ok_or_else(|| format!("no by-symbol row {name}"))?;
        return row[side]
            .as_f64()
            .ok_or_else(|| format!("no {side} of {name}"));
    }
    let mut parts = place.split('.');
    let metric = parts.next().ok_or("empty place")?;
    let side = parts.next().ok_or("no side (baseline, compare or delta)")?;
    let stat = parts.next().unwrap_or("amean");
    let m = doc["metrics"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["name"] == metric))
        .ok_or_else(|| format!("no metric {metric}"))?;
    let side_value = |s: &str| {
        m[s][stat]
            .as_f64()
            .ok_or_else(|| format!("no {s}.{stat} of {metric}"))
    };
    match side {
        "delta" => Ok(side_value("compare")? - side_value("baseline")?),
        "baseline" | "compare" => side_value(side),
        other => Err(format!("{other}: not baseline, compare or delta")),
    }
}

/// Whether `shown` is `actual` rounded to the decimals shown.
fn agrees(shown: &str, actual: f64) -> Result<(), String> {
    let plain: String = shown
        .chars()
        .filter(|c| !matches!(c, ',' | '+' | '\u{202f}'))
        .collect();
    let number: f64 = plain
        .parse()
        .map_err(|_| format!("{shown:?} is not a number"))?;
    let decimals = plain.split_once('.').map_or(0, |(_, d)| d.len()) as i32;
    let rounded = (actual * 10f64.powi(decimals)).round() / 10f64.powi(decimals);
    if (rounded - number).abs() < 0.5 * 10f64.powi(-decimals) {
        Ok(())
    } else {
        Err(format!("{shown} is not {actual} (rounded: {rounded})"))
    }
}

#[test]
fn quoted_figures_equal_their_result_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut docs = vec![root.join("README.md")];
    for e in std::fs::read_dir(root.join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            docs.push(p);
        }
    }
    let mut wrong = Vec::new();
    let mut checked = 0;
    for q in docs.iter().flat_map(|d| quotes(d)) {
        let at = format!("{}:{}", q.doc.display(), q.line);
        let doc: serde_json::Value = match std::fs::read(&q.file)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        {
            Ok(d) => d,
            Err(e) => {
                wrong.push(format!("{at}: {}: {e}", q.file.display()));
                continue;
            }
        };
        match value(&doc, &q.place).and_then(|v| agrees(&q.shown, v)) {
            Ok(()) => checked += 1,
            Err(e) => wrong.push(format!("{at}: {} {:?}: {e}", q.file.display(), q.place)),
        }
    }
    assert!(
        wrong.is_empty(),
        "figures that disagree with their result files:\n{}",
        wrong.join("\n")
    );
    // The kept results are quoted: a result file nothing quotes, or docs
    // that quote none, mean the mechanism fell out of use.
    assert!(checked > 0, "no figure in the docs links to docs/results/");
    println!("{checked} quoted figures agree with their result files");
}

#[test]
fn the_agreement_rule_rounds_to_the_decimals_shown() {
    assert!(agrees("385", 385.0).is_ok());
    assert!(agrees("384.67", 384.666).is_ok());
    assert!(agrees("384", 384.67).is_err());
    assert!(agrees("385", 384.67).is_ok());
    assert!(agrees("2.00", 2.0).is_ok());
    assert!(agrees("2.005", 2.0).is_err());
    assert!(agrees("14,038", 14038.2).is_ok());
    assert!(agrees("+8", 8.0).is_ok());
    assert!(agrees("n/a", 1.0).is_err());
}
