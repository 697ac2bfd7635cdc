//! A compare table as a picture: one row per metric, the compare side's
//! mean as a bar relative to the baseline's (100 %), with every run's value
//! as a dot and Min..Max as a whisker, for people who would rather look.
//! Plain SVG, written by hand: a dozen elements per metric do not justify a
//! plotting crate.

use super::compare::CompareTable;

const ROW_H: f64 = 34.0;
const LEFT: f64 = 300.0;
const PLOT_W: f64 = 460.0;
const TOP: f64 = 82.0;

/// Escapes text for SVG.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The SVG of `table`: metrics whose baseline mean is non-zero, as % of it.
/// Metrics with a zero baseline (e.g. CR3 writes without PTI) have no
/// ratio; they are listed under the plot with their compare mean (those zero
/// on both sides are left out).
pub fn compare_svg(table: &CompareTable) -> String {
    let mut rows = Vec::new();
    // Per plotted row: the table's significance mark (mmtests' rule), and
    // the compare side's 95 % CI of the mean, in % of the baseline's mean.
    let mut marked = Vec::new();
    let mut cis: Vec<Option<(f64, f64)>> = Vec::new();
    let mut unplotted = Vec::new();
    for m in &table.metrics {
        let base = m.baseline.amean;
        if base > 0.0 && base.is_finite() {
            marked.push(m.significance.is_some_and(|s| s.verdict.marked()));
            let rel = |v: f64| v / base * 100.0;
            cis.push(m.compare.ci95.map(|c| (rel(c.low), rel(c.high))));
            rows.push((
                m.metric.name.clone(),
                m.metric.source.tag(),
                rel(m.compare.amean),
                rel(m.compare.min),
                rel(m.compare.max),
                m.compare
                    .samples
                    .iter()
                    .map(|&v| rel(v))
                    .collect::<Vec<_>>(),
                m.baseline
                    .samples
                    .iter()
                    .map(|&v| rel(v))
                    .collect::<Vec<_>>(),
            ));
        } else if m.compare.amean != 0.0 {
            unplotted.push(format!(
                "{} [{}]: {} → {:.3}",
                m.metric.name,
                m.metric.source.tag(),
                if base == 0.0 {
                    "0".to_string()
                } else {
                    "n/a".to_string()
                },
                m.compare.amean
            ));
        }
    }
    let max_pct = rows
        .iter()
        .flat_map(|r| r.5.iter().chain(r.6.iter()).copied().chain([r.4, 100.0]))
        .filter(|v| v.is_finite())
        .fold(100.0f64, f64::max);
    // Axis from 0 to a round number above the largest value.
    let axis_max = ((max_pct / 50.0).ceil() * 50.0).max(150.0);
    let x = |pct: f64| LEFT + (pct.clamp(0.0, axis_max) / axis_max) * PLOT_W;
    let height = TOP + ROW_H * rows.len() as f64 + 40.0 + 18.0 * unplotted.len() as f64 + 20.0;
    let width = LEFT + PLOT_W + 120.0;

    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         font-family=\"monospace\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"20\" font-size=\"14\">{} vs {} (baseline = 100 %): bar = mean of {},</text>\n\
         <text x=\"10\" y=\"38\" font-size=\"14\">dots = runs, whisker = min..max, \
         blue = 95 % CI of the mean, * = significant</text>\n",
        esc(&table.compare.label),
        esc(&table.baseline.label),
        esc(&table.compare.label),
    );
    // Grid lines every 50 %.
    let mut pct = 0.0;
    while pct <= axis_max {
        let gx = x(pct);
        let colour = if pct == 100.0 { "#444" } else { "#ddd" };
        s += &format!(
            "<line x1=\"{gx:.1}\" y1=\"{}\" x2=\"{gx:.1}\" y2=\"{}\" stroke=\"{colour}\"/>\n\
             <text x=\"{gx:.1}\" y=\"{}\" text-anchor=\"middle\" fill=\"#666\">{pct:.0}%</text>\n",
            TOP - 14.0,
            TOP + ROW_H * rows.len() as f64,
            TOP - 18.0,
        );
        pct += 50.0;
    }
    for (i, (name, source, mean, min, max, runs, base_runs)) in rows.iter().enumerate() {
        let y = TOP + ROW_H * i as f64;
        let mid = y + ROW_H / 2.0;
        // Red: the compare side needs more of it; green: less; grey: the same.
        let fill = if (*mean - 100.0).abs() < 0.05 {
            "#999"
        } else if *mean > 100.0 {
            "#d9534f"
        } else {
            "#5cb85c"
        };
        s += &format!(
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{} [{}]</text>\n",
            LEFT - 8.0,
            mid + 4.0,
            esc(name),
            esc(source)
        );
        s += &format!(
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{fill}\" opacity=\"0.6\"/>\n",
            LEFT,
            y + 8.0,
            (x(*mean) - LEFT).max(0.0),
            ROW_H - 16.0
        );
        s += &format!(
            "<line x1=\"{:.1}\" y1=\"{mid:.1}\" x2=\"{:.1}\" y2=\"{mid:.1}\" stroke=\"black\"/>\n",
            x(*min),
            x(*max)
        );
        if let Some(Some((low, high))) = cis.get(i) {
            s += &format!(
                "<line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#1f5fbf\" stroke-width=\"3\"/>\n",
                x(*low),
                mid + 2.0,
                x(*high),
                mid + 2.0
            );
        }
        for v in base_runs {
            s += &format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"none\" stroke=\"#333\"/>\n",
                x(*v),
                mid - 6.0
            );
        }
        for v in runs {
            s += &format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"black\"/>\n",
                x(*v),
                mid + 6.0
            );
        }
        s += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\">{mean:.1}%{}</text>\n",
            LEFT + PLOT_W + 8.0,
            mid + 4.0,
            if marked.get(i).copied().unwrap_or(false) {
                " *"
            } else {
                ""
            }
        );
    }
    let mut y = TOP + ROW_H * rows.len() as f64 + 30.0;
    if !unplotted.is_empty() {
        s += &format!(
            "<text x=\"10\" y=\"{y:.1}\">zero in the baseline (no ratio), baseline → compare mean:</text>\n"
        );
        for u in &unplotted {
            y += 18.0;
            s += &format!("<text x=\"20\" y=\"{y:.1}\">{}</text>\n", esc(u));
        }
    }
    s += "</svg>\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::compare::Side;
    use crate::report::{Metric, Source};

    #[test]
    fn plots_ratios_and_lists_zero_baselines() {
        let side = |l: &str| Side {
            label: l.into(),
            config: vec![],
        };
        let mut t = CompareTable::new(side("pti=off"), side("pti=on"));
        t.add(
            Metric::new("ns_per_call", "ns/call", Source::HostClock),
            &[100.0, 110.0],
            &[140.0, 150.0],
        )
        .unwrap();
        t.add(
            Metric::new("cr3_writes_per_call", "count/call", Source::Guest),
            &[0.0, 0.0],
            &[2.0, 2.0],
        )
        .unwrap();
        let svg = compare_svg(&t);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        // 145 / 105 = 138.1 % of the baseline's mean; significant by
        // mmtests' rule (40 / (2 * 1.96 * 7.07) = 1.44 > 1): marked.
        assert!(svg.contains(">138.1% *<"), "{svg}");
        assert!(
            svg.contains("cr3_writes_per_call [guest]: 0 → 2.000"),
            "{svg}"
        );
        assert_eq!(svg.matches("<circle").count(), 4, "one dot per run");
    }
}
