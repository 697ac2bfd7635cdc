//! The ledger as a picture: one horizontal stacked bar per block, one
//! segment per measured mitigation (its instructions per call), and a mark
//! at the `mitigations=off` total, so that overlap (rows that remove the
//! same instructions) and cost no row covers both show.

use super::model::{Block, RowOutcome};
use super::render::Ledger;

/// Segment colours, in row order (cycled).
const COLOURS: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The positive segments of a block: (row key, instructions per call).
fn segments(b: &Block) -> Vec<(&'static str, f64)> {
    b.rows
        .iter()
        .filter_map(|r| match &r.outcome {
            RowOutcome::Measured { delta, .. } if delta.kernel_instructions > 0.0 => {
                Some((r.key, delta.kernel_instructions))
            }
            _ => None,
        })
        .collect()
}

/// The SVG document.
pub fn svg(l: &Ledger) -> String {
    let (left, width, bar, gap, top) = (330.0, 520.0, 18.0, 10.0, 40.0);
    let widest = l
        .blocks
        .iter()
        .map(|b| {
            let rows: f64 = segments(b).iter().map(|s| s.1).sum();
            rows.max(b.sum.as_ref().map_or(0.0, |s| s.total))
        })
        .fold(1.0f64, f64::max);
    let scale = width / widest;
    let keys: Vec<&str> = {
        let mut k: Vec<&str> = l
            .blocks
            .iter()
            .flat_map(|b| segments(b).into_iter().map(|s| s.0))
            .collect();
        k.sort_unstable();
        k.dedup();
        k
    };
    let colour = |key: &str| {
        let i = keys.iter().position(|k| *k == key).unwrap_or(0);
        COLOURS[i % COLOURS.len()]
    };
    let height = top + l.blocks.len() as f64 * (bar + gap) + 30.0 + keys.len() as f64 * 16.0;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <text x=\"10\" y=\"20\" font-size=\"14\">Kernel instructions per call each mitigation adds (exact, QEMU TCG); | = mitigations=off total</text>\n",
        left + width + 60.0
    );
    for (i, b) in l.blocks.iter().enumerate() {
        let y = top + i as f64 * (bar + gap);
        let name = format!(
            "{} {} {}",
            b.release.as_deref().unwrap_or(&b.kernel),
            b.cpu,
            b.workload
        );
        out.push_str(&format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n",
            left - 6.0,
            y + bar * 0.75,
            esc(&name)
        ));
        let mut x = left;
        for (key, v) in segments(b) {
            let w = v * scale;
            out.push_str(&format!(
                "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{bar}\" fill=\"{}\"><title>{} +{v:.2}</title></rect>\n",
                colour(key),
                esc(key)
            ));
            x += w;
        }
        if let Some(s) = &b.sum {
            let tx = left + s.total.max(0.0) * scale;
            out.push_str(&format!(
                "<line x1=\"{tx:.1}\" x2=\"{tx:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"black\" stroke-width=\"2\"/>\n\
                 <text x=\"{:.1}\" y=\"{:.1}\">{:.0}</text>\n",
                y - 2.0,
                y + bar + 2.0,
                x.max(tx) + 6.0,
                y + bar * 0.75,
                s.total
            ));
        }
    }
    let ly = top + l.blocks.len() as f64 * (bar + gap) + 20.0;
    for (i, k) in keys.iter().enumerate() {
        let y = ly + i as f64 * 16.0;
        out.push_str(&format!(
            "<rect x=\"{left}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{:.1}\">{}</text>\n",
            y - 10.0,
            colour(k),
            left + 18.0,
            y,
            esc(k)
        ));
    }
    out.push_str("</svg>\n");
    out
}
