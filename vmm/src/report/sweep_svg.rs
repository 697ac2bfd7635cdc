//! A sweep as a picture: Gregg's plot (overhead % against syscall rate,
//! log x, one curve per working set and configuration) and, per compare
//! configuration, a heat map of overhead over (working set, reads per
//! iteration) with each cell's syscall rate. Plain SVG written by hand, as
//! `report::plot` does.

use super::sweep::{fmt_rate, fmt_size, SweepReport};

// Wide enough for the legend of long configuration labels beside the plot
// (`wss 16M pti=on,cmdline=pti_global_text=on`) and the refill chart's title.
const W: f64 = 1040.0;
const PLOT_L: f64 = 80.0;
const PLOT_R: f64 = 600.0;
const PLOT_T: f64 = 60.0;
const PLOT_B: f64 = 400.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A colour per working set (blue → red as it grows).
fn colour(i: usize, n: usize) -> String {
    let t = if n <= 1 {
        0.0
    } else {
        i as f64 / (n - 1) as f64
    };
    let r = (40.0 + 200.0 * t) as u8;
    let b = (220.0 - 180.0 * t) as u8;
    format!("rgb({r},70,{b})")
}

/// Dash pattern per configuration (solid for the first compare one).
fn dash(k: usize) -> &'static str {
    ["", "6,4", "2,3", "10,3,2,3"][k % 4]
}

/// Heat colour for an overhead % (white at 0, dark red at `max`).
fn heat(v: f64, max: f64) -> String {
    let t = if max > 0.0 {
        (v / max).clamp(0.0, 1.0)
    } else {
        0.0
    };
    let g = (255.0 * (1.0 - t)) as u8;
    let b = (255.0 * (1.0 - t).powf(1.5)) as u8;
    let r = (255.0 - 80.0 * t * t) as u8;
    format!("rgb({r},{g},{b})")
}

/// The SVG of a sweep.
pub fn svg(r: &SweepReport) -> String {
    let mut body = String::new();
    let sets = r.working_sets();
    let compares: Vec<usize> = (1..r.configs.len()).collect();
    // Every (rate, overhead) point, for the axes.
    let mut all: Vec<(f64, f64)> = Vec::new();
    for &w in &sets {
        for &k in &compares {
            all.extend(r.curve(w, k));
        }
    }
    let title = format!(
        "PTI overhead against syscall rate: {} ({} runs per cell, medians), baseline {}",
        esc(&r.workload),
        r.runs,
        esc(&r.configs[0])
    );
    body.push_str(&format!(
        r#"<text x="{PLOT_L}" y="24" font-size="15" font-weight="bold">{title}</text>"#
    ));
    body.push_str(&format!(
        r##"<text x="{PLOT_L}" y="42" font-size="11" fill="#555">time per call: {} [{}]; overhead = (config - baseline) / baseline; syscall rate = 1 / baseline time per call (derived)</text>"##,
        esc(&r.time_unit),
        esc(&r.time_source)
    ));
    let mut y_after = PLOT_B + 50.0;
    if all.is_empty() {
        body.push_str(&format!(
            r#"<text x="{PLOT_L}" y="{}" font-size="13">no syscall rate measured (the time unit is {}: rates need ns per call, i.e. --backend kvm); see the heat map</text>"#,
            PLOT_T + 30.0,
            esc(&r.time_unit)
        ));
        y_after = PLOT_T + 60.0;
    } else {
        let (mut xmin, mut xmax) = (f64::MAX, f64::MIN);
        let (mut ymin, mut ymax) = (0.0f64, f64::MIN);
        for &(x, y) in &all {
            xmin = xmin.min(x);
            xmax = xmax.max(x);
            ymin = ymin.min(y);
            ymax = ymax.max(y);
        }
        let lx0 = (xmin.log10()).floor();
        let lx1 = (xmax.log10()).ceil().max(lx0 + 1.0);
        let ymax = (ymax * 1.1).max(5.0);
        let ymin = if ymin < 0.0 { ymin * 1.1 } else { 0.0 };
        let px = |x: f64| PLOT_L + (x.log10() - lx0) / (lx1 - lx0) * (PLOT_R - PLOT_L);
        let py = |y: f64| PLOT_B - (y - ymin) / (ymax - ymin) * (PLOT_B - PLOT_T);
        // Axes, decades, thresholds.
        body.push_str(&format!(
            r##"<rect x="{PLOT_L}" y="{PLOT_T}" width="{}" height="{}" fill="none" stroke="#888"/>"##,
            PLOT_R - PLOT_L,
            PLOT_B - PLOT_T
        ));
        let mut d = lx0;
        while d <= lx1 + 1e-9 {
            let x = px(10f64.powf(d));
            body.push_str(&format!(
                r##"<line x1="{x:.1}" y1="{PLOT_T}" x2="{x:.1}" y2="{PLOT_B}" stroke="#ddd"/><text x="{x:.1}" y="{}" font-size="11" text-anchor="middle">{}</text>"##,
                PLOT_B + 16.0,
                fmt_rate(10f64.powf(d))
            ));
            d += 1.0;
        }
        body.push_str(&format!(
            r#"<text x="{}" y="{}" font-size="12" text-anchor="middle">syscalls per second (baseline, log scale)</text>"#,
            (PLOT_L + PLOT_R) / 2.0,
            PLOT_B + 34.0
        ));
        body.push_str(&format!(
            r#"<text x="20" y="{}" font-size="12" transform="rotate(-90 20 {})" text-anchor="middle">overhead %</text>"#,
            (PLOT_T + PLOT_B) / 2.0,
            (PLOT_T + PLOT_B) / 2.0
        ));
        let step = nice_step((ymax - ymin) / 6.0);
        let mut t = (ymin / step).ceil() * step;
        while t <= ymax {
            let y = py(t);
            body.push_str(&format!(
                r##"<line x1="{PLOT_L}" y1="{y:.1}" x2="{PLOT_R}" y2="{y:.1}" stroke="#eee"/><text x="{}" y="{:.1}" font-size="11" text-anchor="end">{t}</text>"##,
                PLOT_L - 4.0,
                y + 4.0
            ));
            t += step;
        }
        for th in [1.0, 5.0] {
            if th <= ymax {
                let y = py(th);
                body.push_str(&format!(
                    r##"<line x1="{PLOT_L}" y1="{y:.1}" x2="{PLOT_R}" y2="{y:.1}" stroke="#c00" stroke-dasharray="3,3"/><text x="{}" y="{:.1}" font-size="10" fill="#c00">{th} %</text>"##,
                    PLOT_R + 3.0,
                    y + 3.0
                ));
            }
        }
        // Curves.
        let mut legend_y = PLOT_T;
        for (wi, &w) in sets.iter().enumerate() {
            let c = colour(wi, sets.len());
            for (ki, &k) in compares.iter().enumerate() {
                let pts = r.curve(w, k);
                if pts.is_empty() {
                    continue;
                }
                let path: Vec<String> = pts
                    .iter()
                    .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
                    .collect();
                body.push_str(&format!(
                    r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="2" stroke-dasharray="{}"/>"#,
                    path.join(" "),
                    dash(ki)
                ));
                for &(x, y) in &pts {
                    body.push_str(&format!(
                        r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{c}"><title>wss {} {}: {y:.1} % at {}/s</title></circle>"#,
                        px(x),
                        py(y),
                        fmt_size(w),
                        esc(&r.configs[k]),
                        fmt_rate(x)
                    ));
                }
                body.push_str(&format!(
                    r#"<line x1="{}" y1="{legend_y}" x2="{}" y2="{legend_y}" stroke="{c}" stroke-width="2" stroke-dasharray="{}"/><text x="{}" y="{}" font-size="11">wss {} {}</text>"#,
                    PLOT_R + 30.0,
                    PLOT_R + 55.0,
                    dash(ki),
                    PLOT_R + 60.0,
                    legend_y + 4.0,
                    fmt_size(w),
                    esc(&r.configs[k])
                ));
                legend_y += 16.0;
            }
        }
    }
    // Heat maps: rows = working sets, columns = reads-per-iteration specs.
    let mut specs: Vec<String> = Vec::new();
    for c in &r.cells {
        if c.wss != 0 && !specs.contains(&c.touches_spec) {
            specs.push(c.touches_spec.clone());
        }
    }
    let max = r
        .cells
        .iter()
        .flat_map(|c| c.configs.iter().filter_map(|x| x.overhead_pct))
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    let cw = 110.0;
    let ch = 34.0;
    let mut y0 = y_after + 20.0;
    for &k in &compares {
        body.push_str(&format!(
            r#"<text x="{PLOT_L}" y="{y0}" font-size="13" font-weight="bold">heat map: overhead % of {} (cell: overhead, baseline syscalls/s)</text>"#,
            esc(&r.configs[k])
        ));
        y0 += 10.0;
        for (si, s) in specs.iter().enumerate() {
            body.push_str(&format!(
                r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">reads/iter {}</text>"#,
                PLOT_L + 60.0 + cw * (si as f64 + 0.5),
                y0 + 12.0,
                esc(s)
            ));
        }
        y0 += 18.0;
        for (wi, &w) in sets.iter().enumerate() {
            let y = y0 + ch * wi as f64;
            body.push_str(&format!(
                r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">wss {}</text>"#,
                PLOT_L + 54.0,
                y + ch / 2.0 + 4.0,
                fmt_size(w)
            ));
            for c in r.cells.iter().filter(|c| c.wss == w) {
                let col = if w == 0 {
                    // No working set: the one cell spans every column.
                    None
                } else {
                    specs.iter().position(|s| *s == c.touches_spec)
                };
                let (x, width) = match col {
                    Some(i) => (PLOT_L + 60.0 + cw * i as f64, cw),
                    None => (PLOT_L + 60.0, cw * specs.len().max(1) as f64),
                };
                let ovh = c.configs.get(k).and_then(|x| x.overhead_pct);
                let fill = ovh.map_or("#eee".to_string(), |v| heat(v, max));
                body.push_str(&format!(
                    r##"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{fill}" stroke="#fff"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">{} · {}</text>"##,
                    width - 2.0,
                    ch - 2.0,
                    x + width / 2.0,
                    y + ch / 2.0 + 4.0,
                    ovh.map_or("-".into(), |v| format!("{v:.1} %")),
                    c.syscall_rate.map_or("-".into(), |v| format!("{}/s", fmt_rate(v)))
                ));
            }
        }
        y0 += ch * sets.len() as f64 + 30.0;
    }
    y0 = refill_bars(r, &mut body, y0);
    let h = y0 + 10.0;
    format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h:.0}" viewBox="0 0 {W} {h:.0}" font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>{body}</svg>
"#
    )
}

/// Bars of the user-mode refill per page (derived from the guest's timing
/// of its reads: fewest cycles of one iteration, configuration − baseline,
/// over the pages), one group per (working set, reads per call) cell and
/// one bar per compare configuration; returns the next free y.
fn refill_bars(r: &SweepReport, body: &mut String, mut y0: f64) -> f64 {
    let cells: Vec<_> = r
        .cells
        .iter()
        .filter(|c| {
            c.configs
                .iter()
                .any(|x| x.user_refill_cycles_per_page.is_some())
        })
        .collect();
    if cells.is_empty() {
        return y0;
    }
    let n = r.configs.len().saturating_sub(1).max(1);
    let vals: Vec<f64> = cells
        .iter()
        .flat_map(|c| {
            c.configs
                .iter()
                .filter_map(|x| x.user_refill_cycles_per_page)
        })
        .filter(|v| v.is_finite())
        .collect();
    let max = vals.iter().copied().fold(1.0f64, f64::max);
    let min = vals.iter().copied().fold(0.0f64, f64::min);
    body.push_str(&format!(
        r#"<text x="{PLOT_L}" y="{y0}" font-size="13" font-weight="bold">user-mode refill: TSC cycles per page walked in again after the CR3 switches (derived, guest-timed reads){}</text>"#,
        if r.cr3_write_refill.hidden() {
            format!(
                " — {}: these bars are not PTI's",
                crate::report::sweep::RefillVisibility::HIDDEN
            )
        } else {
            String::new()
        }
    ));
    y0 += 16.0;
    let plot_h = 160.0;
    let group_w = ((PLOT_R - PLOT_L) / cells.len() as f64).min(90.0);
    let bar_w = (group_w - 10.0) / n as f64;
    let py = |v: f64| y0 + plot_h - (v - min) / (max - min) * plot_h;
    body.push_str(&format!(
        r##"<line x1="{PLOT_L}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#888"/><text x="{}" y="{:.1}" font-size="10" text-anchor="end">{max:.1}</text><text x="{}" y="{:.1}" font-size="10" text-anchor="end">0</text>"##,
        py(0.0),
        PLOT_L + group_w * cells.len() as f64,
        py(0.0),
        PLOT_L - 4.0,
        py(max) + 4.0,
        PLOT_L - 4.0,
        py(0.0) + 4.0
    ));
    for (ci, c) in cells.iter().enumerate() {
        let gx = PLOT_L + group_w * ci as f64 + 5.0;
        for (k, x) in c.configs.iter().enumerate().skip(1) {
            let Some(v) = x.user_refill_cycles_per_page.filter(|v| v.is_finite()) else {
                continue;
            };
            let (top, bottom) = if v >= 0.0 {
                (py(v), py(0.0))
            } else {
                (py(0.0), py(v))
            };
            body.push_str(&format!(
                r#"<rect x="{:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="{}" stroke-dasharray="{}" stroke="black" stroke-width="0.5"><title>wss {} reads/call {} {}: {v:.2} cycles/page</title></rect>"#,
                gx + bar_w * (k - 1) as f64,
                bar_w - 1.0,
                (bottom - top).max(0.5),
                colour(k - 1, n),
                dash(k - 1),
                fmt_size(c.wss),
                esc(&c.touches_spec),
                esc(&x.config)
            ));
        }
        body.push_str(&format!(
            r#"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle">{} {}</text>"#,
            gx + (group_w - 10.0) / 2.0,
            y0 + plot_h + 14.0,
            fmt_size(c.wss),
            esc(&c.touches_spec)
        ));
    }
    let mut ly = y0 + plot_h + 30.0;
    for (k, label) in r.configs.iter().enumerate().skip(1) {
        body.push_str(&format!(
            r#"<rect x="{PLOT_L}" y="{:.1}" width="12" height="10" fill="{}"/><text x="{}" y="{:.1}" font-size="11">{}</text>"#,
            ly - 9.0,
            colour(k - 1, n),
            PLOT_L + 18.0,
            ly,
            esc(label)
        ));
        ly += 15.0;
    }
    ly + 10.0
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let p = 10f64.powf(raw.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * p >= raw {
            return m * p;
        }
    }
    10.0 * p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps() {
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(0.15), 0.2);
        assert_eq!(nice_step(0.0), 1.0);
    }
}
