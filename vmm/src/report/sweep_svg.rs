//! A sweep as a picture, in three panels under one title (workload, host,
//! guest kernel, what its times are, runs):
//!
//! 1. Gregg's plot: overhead % against the baseline's syscall rate on a log
//!    axis fitted to the data (decades, with 2 and 5 between them when the
//!    data span three decades or fewer), one curve per working set and compare configuration.
//!    Colour means the working set and nothing else in the figure; the
//!    configuration is the marker's shape and the line's dash; a filled
//!    marker is an overhead significant by Welch's t-test (95 %), a hollow one is
//!    not. The legend shows every colour, shape and fill.
//! 2. Per compare configuration, a heat map of overhead over (working set,
//!    reads per call) in grey (darker = more), each cell labelled with its
//!    overhead and rate in black or white, whichever contrasts with it.
//! 3. The user-mode refill per page (guest-timed reads) per cell and
//!    configuration as bars on an axis with round ticks; a refill inside
//!    the run-to-run spread is written `noise`, not drawn as a bar.
//!
//! Plain SVG written by hand, as `report::plot` does: the heat map's
//! per-cell contrast, the marker encodings and the noise cells are a few
//! lines each here, and the pictures render with any SVG renderer (the
//! tests render them with resvg).

use super::plot::{esc, nice_ticks, text_on};
use super::sweep::{
    column_name, fmt_count, fmt_rate, fmt_size, Refill, RefillVisibility, SweepReport,
};

const W: f64 = 1000.0;
const PLOT_L: f64 = 80.0;
const PLOT_R: f64 = 640.0;
const PLOT_T: f64 = 80.0;
const PLOT_B: f64 = 410.0;

/// Okabe–Ito colours (distinguishable with colour-blindness), one per
/// working set; black is kept for axes and text.
const SET_COLOURS: [&str; 7] = [
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
];

fn set_colour(i: usize) -> &'static str {
    SET_COLOURS[i % SET_COLOURS.len()]
}

/// Dash pattern per compare configuration.
fn dash(k: usize) -> &'static str {
    ["", "7,4", "2,3", "10,3,2,3"][k % 4]
}

/// A marker of shape `k` (circle, square, triangle, diamond) at (x, y).
fn marker(k: usize, x: f64, y: f64, colour: &str, filled: bool, title: &str) -> String {
    let fill = if filled { colour } else { "white" };
    let r = 4.5;
    let shape = match k % 4 {
        0 => format!(r#"<circle cx="{x:.1}" cy="{y:.1}" r="{r}""#),
        1 => format!(
            r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}""#,
            x - r,
            y - r,
            2.0 * r,
            2.0 * r
        ),
        2 => format!(
            r#"<polygon points="{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}""#,
            x,
            y - r - 1.0,
            x - r - 0.5,
            y + r,
            x + r + 0.5,
            y + r
        ),
        _ => format!(
            r#"<polygon points="{:.1},{:.1} {:.1},{:.1} {:.1},{:.1} {:.1},{:.1}""#,
            x,
            y - r - 1.0,
            x + r + 1.0,
            y,
            x,
            y + r + 1.0,
            x - r - 1.0,
            y
        ),
    };
    let title = if title.is_empty() {
        String::new()
    } else {
        format!("<title>{}</title>", esc(title))
    };
    format!(
        r#"{shape} fill="{fill}" stroke="{colour}" stroke-width="2">{title}</{}>"#,
        match k % 4 {
            0 => "circle",
            1 => "rect",
            _ => "polygon",
        }
    )
}

/// Grey for an overhead (white at or below 0, near black at `max`).
fn heat(v: f64, max: f64) -> (u8, u8, u8) {
    let t = if max > 0.0 {
        (v / max).clamp(0.0, 1.0)
    } else {
        0.0
    };
    let g = (250.0 - 200.0 * t) as u8;
    (g, g, g)
}

/// Log-axis ticks between 10^lo and 10^hi: decades, and 2 and 5 between
/// them when the axis spans at most three decades.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut d = lo.floor();
    while d <= hi.ceil() {
        let p = 10f64.powf(d);
        let steps: &[f64] = if hi - lo <= 3.0 {
            &[1.0, 2.0, 5.0]
        } else {
            &[1.0]
        };
        for m in steps {
            let v = m * p;
            if v.log10() >= lo - 1e-9 && v.log10() <= hi + 1e-9 {
                out.push(v);
            }
        }
        d += 1.0;
    }
    out
}

/// The SVG of a sweep.
pub fn svg(r: &SweepReport) -> String {
    let mut body = String::new();
    let sets = r.working_sets();
    let compares: Vec<usize> = (1..r.configs.len()).collect();
    let mut all: Vec<(f64, f64)> = Vec::new();
    for &w in &sets {
        for &k in &compares {
            all.extend(r.curve(w, k));
        }
    }
    let title = format!(
        "PTI overhead against syscall rate: {}, {} runs per cell (medians)",
        r.workload, r.runs
    );
    body.push_str(&format!(
        r##"<text x="20" y="24" font-size="16" font-weight="bold">{}</text><text x="20" y="42" font-size="11" fill="#333">host: {}; guest: {}; times: {}</text>"##,
        esc(&title),
        esc(&r.host),
        // The guest kernel and what its times are (a picture pasted
        // elsewhere must not read as the host kernel's PTI on hardware).
        esc(&crate::report::environment::guest_kernel(r.environment.as_ref())),
        esc(crate::report::environment::time_basis(r.environment.as_ref()).label()),
    ));
    body.push_str(&format!(
        r##"<text x="20" y="58" font-size="12" fill="#333">overhead = (config - {}) / {} time per call ({} [{}]); syscall rate = 1 / {} time per call; colour = working set</text>"##,
        esc(&column_name(&r.configs[0])),
        esc(&column_name(&r.configs[0])),
        esc(&r.time_unit),
        esc(&r.time_source),
        esc(&column_name(&r.configs[0])),
    ));
    let mut y_after = PLOT_B + 56.0;
    if all.is_empty() {
        body.push_str(&format!(
            r#"<text x="{PLOT_L}" y="{}" font-size="13">no syscall rate measured (the time unit is {}: rates need ns per call, i.e. --backend kvm); see the heat map</text>"#,
            PLOT_T + 30.0,
            esc(&r.time_unit)
        ));
        y_after = PLOT_T + 60.0;
    } else {
        let (mut xmin, mut xmax) = (f64::MAX, f64::MIN);
        let (mut ymin, mut ymax) = (0.0f64, 5.0f64);
        for &(x, y) in &all {
            xmin = xmin.min(x);
            xmax = xmax.max(x);
            ymin = ymin.min(y);
            ymax = ymax.max(y);
        }
        // Fitted: a little room around the data, in log units.
        let lx0 = xmin.log10() - 0.08;
        let lx1 = (xmax.log10() + 0.08).max(lx0 + 0.5);
        let yt = nice_ticks(ymin, ymax, 6);
        let (y0v, y1v) = (yt[0], *yt.last().unwrap_or(&ymax));
        let px = |x: f64| PLOT_L + (x.log10() - lx0) / (lx1 - lx0) * (PLOT_R - PLOT_L);
        let py = |y: f64| PLOT_B - (y - y0v) / (y1v - y0v) * (PLOT_B - PLOT_T);
        body.push_str(&format!(
            r##"<rect x="{PLOT_L}" y="{PLOT_T}" width="{}" height="{}" fill="none" stroke="#555"/>"##,
            PLOT_R - PLOT_L,
            PLOT_B - PLOT_T
        ));
        for v in log_ticks(lx0, lx1) {
            let x = px(v);
            body.push_str(&format!(
                r##"<line x1="{x:.1}" y1="{PLOT_T}" x2="{x:.1}" y2="{PLOT_B}" stroke="#ddd"/><text x="{x:.1}" y="{}" font-size="12" text-anchor="middle">{}</text>"##,
                PLOT_B + 17.0,
                fmt_rate(v)
            ));
        }
        body.push_str(&format!(
            r#"<text x="{}" y="{}" font-size="13" text-anchor="middle">syscalls per second ({}, log scale)</text>"#,
            (PLOT_L + PLOT_R) / 2.0,
            PLOT_B + 38.0,
            esc(&column_name(&r.configs[0]))
        ));
        body.push_str(&format!(
            r#"<text x="24" y="{0}" font-size="13" transform="rotate(-90 24 {0})" text-anchor="middle">overhead %</text>"#,
            (PLOT_T + PLOT_B) / 2.0,
        ));
        for &t in &yt {
            let y = py(t);
            let stroke = if t == 0.0 { "#555" } else { "#eee" };
            body.push_str(&format!(
                r##"<line x1="{PLOT_L}" y1="{y:.1}" x2="{PLOT_R}" y2="{y:.1}" stroke="{stroke}"/><text x="{}" y="{:.1}" font-size="12" text-anchor="end">{t}</text>"##,
                PLOT_L - 5.0,
                y + 4.0
            ));
        }
        for th in [1.0, 5.0] {
            if th <= y1v {
                let y = py(th);
                body.push_str(&format!(
                    r##"<line x1="{PLOT_L}" y1="{y:.1}" x2="{PLOT_R}" y2="{y:.1}" stroke="#000" stroke-dasharray="2,4"/><text x="{}" y="{:.1}" font-size="11">{th} %</text>"##,
                    PLOT_R + 4.0,
                    y + 4.0
                ));
            }
        }
        for (wi, &w) in sets.iter().enumerate() {
            let c = set_colour(wi);
            for (ki, &k) in compares.iter().enumerate() {
                let pts = r.curve(w, k);
                let path: Vec<String> = pts
                    .iter()
                    .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
                    .collect();
                if pts.len() > 1 {
                    body.push_str(&format!(
                        r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="2" stroke-dasharray="{}"/>"#,
                        path.join(" "),
                        dash(ki)
                    ));
                }
                for cell in r.cells.iter().filter(|x| x.wss == w) {
                    let Some(cfg) = cell.configs.get(k) else {
                        continue;
                    };
                    let (Some(x), Some(y)) = (cell.syscall_rate, cfg.overhead_pct) else {
                        continue;
                    };
                    if !(x.is_finite() && x > 0.0 && y.is_finite()) {
                        continue;
                    }
                    body.push_str(&marker(
                        ki,
                        px(x),
                        py(y),
                        c,
                        cfg.significant == Some(true),
                        &format!(
                            "wss {} reads {} {}: {y:.1} % at {}/s",
                            fmt_size(w),
                            fmt_count(cell.touches),
                            r.configs[k],
                            fmt_rate(x)
                        ),
                    ));
                }
            }
        }
        // Legend: colours (working sets), shapes and dashes
        // (configurations), fill (significance).
        let lx = PLOT_R + 46.0;
        let mut ly = PLOT_T + 6.0;
        body.push_str(&format!(
            r#"<text x="{lx}" y="{ly}" font-size="12" font-weight="bold">working set (colour)</text>"#
        ));
        for (wi, &w) in sets.iter().enumerate() {
            ly += 18.0;
            body.push_str(&format!(
                r#"<line x1="{lx}" y1="{0:.1}" x2="{1}" y2="{0:.1}" stroke="{2}" stroke-width="3"/><text x="{3}" y="{4:.1}" font-size="12">wss {5}</text>"#,
                ly - 4.0,
                lx + 28.0,
                set_colour(wi),
                lx + 36.0,
                ly,
                fmt_size(w)
            ));
        }
        ly += 28.0;
        body.push_str(&format!(
            r#"<text x="{lx}" y="{ly}" font-size="12" font-weight="bold">configuration (marker, dash)</text>"#
        ));
        for (ki, &k) in compares.iter().enumerate() {
            ly += 20.0;
            body.push_str(&format!(
                r##"<line x1="{lx}" y1="{0:.1}" x2="{1}" y2="{0:.1}" stroke="#333" stroke-width="2" stroke-dasharray="{2}"/>"##,
                ly - 4.0,
                lx + 28.0,
                dash(ki)
            ));
            body.push_str(&marker(ki, lx + 14.0, ly - 4.0, "#333", true, ""));
            body.push_str(&format!(
                r#"<text x="{}" y="{ly:.1}" font-size="12">{}</text>"#,
                lx + 36.0,
                esc(&column_name(&r.configs[k]))
            ));
        }
        ly += 28.0;
        body.push_str(&format!(
            r#"<text x="{lx}" y="{ly}" font-size="12" font-weight="bold">fill</text>"#
        ));
        for (filled, what) in [
            (true, "significant (Welch, p &lt; 0.05)"),
            (false, "not significant"),
        ] {
            ly += 20.0;
            body.push_str(&marker(0, lx + 14.0, ly - 4.0, "#333", filled, ""));
            body.push_str(&format!(
                r#"<text x="{}" y="{ly:.1}" font-size="12">{what}</text>"#,
                lx + 36.0
            ));
        }
        ly += 20.0;
        body.push_str(&format!(
            r##"<line x1="{lx}" y1="{0:.1}" x2="{1}" y2="{0:.1}" stroke="#000" stroke-dasharray="2,4"/><text x="{2}" y="{3:.1}" font-size="12">1 % and 5 % overhead</text>"##,
            ly - 4.0,
            lx + 28.0,
            lx + 36.0,
            ly
        ));
    }
    // Heat maps: rows = working sets, columns = reads per call.
    let mut reads: Vec<u64> = r
        .cells
        .iter()
        .filter(|c| c.wss != 0)
        .map(|c| c.touches)
        .collect();
    reads.sort_unstable();
    reads.dedup();
    let max = r
        .cells
        .iter()
        .flat_map(|c| c.configs.iter().filter_map(|x| x.overhead_pct))
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    let cw = 130.0;
    let ch = 40.0;
    let hx = PLOT_L + 40.0;
    let mut y0 = y_after + 20.0;
    for &k in &compares {
        body.push_str(&format!(
            r#"<text x="20" y="{y0}" font-size="14" font-weight="bold">overhead of {} (grey: darker = more, white = none or less; * significant)</text>"#,
            esc(&column_name(&r.configs[k]))
        ));
        y0 += 12.0;
        for (si, n) in reads.iter().enumerate() {
            body.push_str(&format!(
                r#"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle">{} reads/call</text>"#,
                hx + cw * (si as f64 + 0.5),
                y0 + 12.0,
                fmt_count(*n)
            ));
        }
        y0 += 20.0;
        for (wi, &w) in sets.iter().enumerate() {
            let y = y0 + ch * wi as f64;
            body.push_str(&format!(
                r#"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="end">wss {}</text>"#,
                hx - 6.0,
                y + ch / 2.0 + 4.0,
                fmt_size(w)
            ));
            for c in r.cells.iter().filter(|c| c.wss == w) {
                let col = if w == 0 {
                    None
                } else {
                    reads.iter().position(|n| *n == c.touches)
                };
                let (x, width) = match col {
                    Some(i) => (hx + cw * i as f64, cw),
                    None => (hx, cw * reads.len().max(1) as f64),
                };
                let cfg = c.configs.get(k);
                let ovh = cfg.and_then(|x| x.overhead_pct);
                let rgb = ovh.map_or((238, 238, 238), |v| heat(v, max));
                let mark = if cfg.and_then(|x| x.significant) == Some(true) {
                    "*"
                } else {
                    ""
                };
                body.push_str(&format!(
                    r##"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="rgb({},{},{})" stroke="#fff"/><text x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle" fill="{}">{} · {}</text>"##,
                    width - 2.0,
                    ch - 2.0,
                    rgb.0,
                    rgb.1,
                    rgb.2,
                    x + width / 2.0,
                    y + ch / 2.0 + 4.0,
                    text_on(rgb),
                    ovh.map_or("-".into(), |v| format!("{v:+.1} %{mark}")),
                    c.syscall_rate
                        .map_or("-".into(), |v| format!("{}/s", fmt_rate(v)))
                ));
            }
        }
        y0 += ch * sets.len() as f64 + 34.0;
    }
    y0 = refill_bars(r, &mut body, y0);
    let h = y0 + 10.0;
    format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h:.0}" viewBox="0 0 {W} {h:.0}" font-family="DejaVu Sans, sans-serif"><rect width="100%" height="100%" fill="white"/>{body}</svg>
"#
    )
}

/// Bars of the user-mode refill per page (derived from the guest's timing
/// of its reads: fewest cycles of one iteration, configuration − baseline,
/// over the pages), one group per (working set, reads per call) cell and
/// one bar per compare configuration, in greys (the configuration's
/// shade is in the legend); a refill inside the run-to-run spread is the
/// word `noise`, not a bar. Returns the next free y.
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
    if let RefillVisibility::NotVisible {
        probe_ns_per_page,
        threshold_ns_per_page,
    } = &r.cr3_write_refill
    {
        // No per-page figure here is PTI's: say so instead of drawing an
        // empty chart of "hidden" labels.
        let probe = probe_ns_per_page.map_or("?".into(), |v| format!("{v:.2}"));
        body.push_str(&format!(
            r#"<text x="20" y="{y0}" font-size="14" font-weight="bold">user-mode refill per page: {}</text><text x="20" y="{:.1}" font-size="12">the probe's cr3_write_refill is not visible here ({probe} ns/page, threshold {threshold_ns_per_page}): a guest CR3 write costs user code no TLB refill on this host, so no bars</text>"#,
            RefillVisibility::HIDDEN,
            y0 + 18.0
        ));
        return y0 + 40.0;
    }
    let n = r.configs.len().saturating_sub(1).max(1);
    let shade = |k: usize| ["#222", "#888", "#ccc", "#555"][(k - 1) % 4];
    let refills: Vec<Vec<Refill>> = cells
        .iter()
        .map(|c| {
            c.configs
                .iter()
                .skip(1)
                .map(|x| Refill::user(x, &c.configs[0], r.cr3_write_refill.hidden()))
                .collect()
        })
        .collect();
    let vals: Vec<f64> = refills
        .iter()
        .flatten()
        .filter_map(|v| match v {
            Refill::Value(v) => Some(*v),
            _ => None,
        })
        .collect();
    let lo = vals.iter().copied().fold(0.0f64, f64::min);
    let hi = vals.iter().copied().fold(1.0f64, f64::max);
    let ticks = nice_ticks(lo, hi, 5);
    let (min, max) = (ticks[0], *ticks.last().unwrap_or(&hi));
    body.push_str(&format!(
        r#"<text x="20" y="{y0}" font-size="14" font-weight="bold">user-mode refill: TSC cycles per page walked in again after the CR3 switches (derived, guest-timed reads)</text>"#
    ));
    y0 += 22.0;
    let plot_h = 170.0;
    let left = PLOT_L + 20.0;
    let group_w = ((W - left - 40.0) / cells.len() as f64).min(110.0);
    let bar_w = (group_w - 12.0) / n as f64;
    let py = |v: f64| y0 + plot_h - (v - min) / (max - min) * plot_h;
    for &t in &ticks {
        let y = py(t);
        let stroke = if t == 0.0 { "#555" } else { "#eee" };
        body.push_str(&format!(
            r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{stroke}"/><text x="{}" y="{:.1}" font-size="11" text-anchor="end">{t}</text>"##,
            left + group_w * cells.len() as f64,
            left - 5.0,
            y + 4.0
        ));
    }
    for (ci, c) in cells.iter().enumerate() {
        let gx = left + group_w * ci as f64 + 6.0;
        for (k, v) in refills[ci].iter().enumerate() {
            let x = gx + bar_w * k as f64;
            match *v {
                Refill::Value(v) => {
                    let (top, bottom) = if v >= 0.0 {
                        (py(v), py(0.0))
                    } else {
                        (py(0.0), py(v))
                    };
                    body.push_str(&format!(
                        r#"<rect x="{x:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="{}" stroke="black" stroke-width="0.5"><title>wss {} reads {} {}: {v:.2} cycles/page</title></rect>"#,
                        bar_w - 1.0,
                        (bottom - top).max(0.5),
                        shade(k + 1),
                        fmt_size(c.wss),
                        fmt_count(c.touches),
                        esc(&c.configs[k + 1].config)
                    ));
                }
                Refill::Noise | Refill::HiddenByHost => {
                    let word = if *v == Refill::Noise {
                        "noise"
                    } else {
                        "hidden"
                    };
                    body.push_str(&format!(
                        r##"<text x="{0:.1}" y="{1:.1}" font-size="10" fill="#444" text-anchor="middle" transform="rotate(-90 {0:.1} {1:.1})">{word}</text>"##,
                        x + bar_w / 2.0 + 3.0,
                        py(0.0) - 22.0,
                    ));
                }
                Refill::NotDerived => {}
            }
        }
        body.push_str(&format!(
            r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">{} · {}</text>"#,
            gx + (group_w - 12.0) / 2.0,
            y0 + plot_h + 16.0,
            fmt_size(c.wss),
            fmt_count(c.touches)
        ));
    }
    body.push_str(&format!(
        r#"<text x="{}" y="{:.1}" font-size="12" text-anchor="middle">working set · reads per call</text>"#,
        left + group_w * cells.len() as f64 / 2.0,
        y0 + plot_h + 34.0
    ));
    let mut ly = y0 + plot_h + 56.0;
    for (k, label) in r.configs.iter().enumerate().skip(1) {
        body.push_str(&format!(
            r#"<rect x="{left}" y="{:.1}" width="14" height="11" fill="{}" stroke="black" stroke-width="0.5"/><text x="{}" y="{:.1}" font-size="12">{}</text>"#,
            ly - 10.0,
            shade(k),
            left + 20.0,
            ly,
            esc(&column_name(label))
        ));
        ly += 17.0;
    }
    body.push_str(&format!(
        r#"<text x="{left}" y="{ly:.1}" font-size="12">noise: the difference is inside the runs' spread (half their ranges, summed): no bar</text>"#
    ));
    ly + 14.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::sweep::{Cell, CellConfig};

    fn config(name: &str, samples: &[f64], reads: f64) -> CellConfig {
        CellConfig {
            config: name.into(),
            samples: samples.to_vec(),
            median: crate::report::sweep::median(samples),
            min: samples.iter().copied().fold(f64::MAX, f64::min),
            delta: None,
            overhead_pct: None,
            refill_per_page: None,
            refill_spread_per_page: None,
            tlb_flush_per_call: Some(1.0),
            kvm_pf_taken_per_call: Some(0.0),
            kvm_exits_per_call: Some(2.0),
            cr3_writes_per_call: Some(2.0),
            kernel_instructions_per_call: None,
            insn_mov_cr3_per_call: None,
            read_cycles_per_call: Some(reads),
            read_cycles_min: Some(reads),
            read_cycles_min_spread: Some(reads * 0.01),
            user_refill_cycles_per_page: None,
            significant: None,
            mean_ci95: None,
            welch_p: None,
        }
    }

    /// A sweep shaped like Gregg's: a fixed PTI cost per call, so the
    /// overhead falls as the work between calls grows.
    pub(crate) fn gregg_like() -> SweepReport {
        let mut cells = Vec::new();
        for (wss, pages) in [
            (0u64, 0u64),
            (64 << 10, 16),
            (1 << 20, 256),
            (16 << 20, 4096),
        ] {
            let reads: &[u64] = if wss == 0 {
                &[0]
            } else {
                &[4096, 65536, 2 << 20]
            };
            for &n in reads {
                let base = 50_000.0 + n as f64 * (1.0 + (wss >> 16) as f64 * 0.01);
                let refill = pages as f64 * 3.0;
                let run = |x: f64| [x * 0.98, x, x * 1.02];
                let configs = vec![
                    config("pti=off", &run(base), n as f64 * 2.0),
                    config(
                        "pti=on",
                        &run(base + 30_000.0 + refill),
                        n as f64 * 2.0 + refill,
                    ),
                    config(
                        "pti=on,cmdline=pti_global_text=on",
                        &run(base + 25_000.0 + refill),
                        n as f64 * 2.0 + refill * 0.9,
                    ),
                ];
                cells.push(Cell {
                    wss,
                    touches_spec: if wss == 0 { "-".into() } else { fmt_count(n) },
                    touches: n,
                    pages,
                    guest_words: String::new(),
                    iterations: 1000,
                    syscall_rate: None,
                    configs,
                });
            }
        }
        let mut r = SweepReport {
            host: "Linux 6.18, AMD EPYC, 2 CPUs".into(),
            iterations: 1000,
            runs: 3,
            configs: vec![
                "pti=off".into(),
                "pti=on".into(),
                "pti=on,cmdline=pti_global_text=on".into(),
            ],
            seconds: 1.0,
            cr3_write_refill: crate::report::sweep::RefillVisibility::Unknown {
                reason: "a unit-test fixture".into(),
            },
            ..crate::report::sweep::fixture(cells)
        };
        r.derive();
        r
    }

    #[test]
    fn the_picture_renders_with_a_legend_for_every_mark() {
        let r = gregg_like();
        let s = svg(&r);
        // Title: workload, host, runs.
        assert!(s.contains("getpid, 3 runs per cell"), "{s}");
        assert!(
            s.contains("host: Linux 6.18, AMD EPYC, 2 CPUs; guest: "),
            "{s}"
        );
        // No environment in the fixture: the guest and the basis say so.
        assert!(
            s.contains("guest: guest not recorded; times: unknown"),
            "{s}"
        );
        // One curve per working set and compare configuration with 2+ points.
        assert_eq!(s.matches("<polyline").count(), 3 * 2, "{s}");
        for w in [
            "wss 64K",
            "wss 1M",
            "wss 16M",
            "pti=on,pti_global_text=on",
            "not significant",
        ] {
            assert!(s.contains(&format!(">{w}<")), "legend entry {w}");
        }
        // The rate axis is fitted to 133..20k calls/s, ticked at 1, 2, 5.
        for tick in [">200<", ">500<", ">1.0k<", ">2.0k<", ">10.0k<", ">20.0k<"] {
            assert!(s.contains(tick), "tick {tick}: {s}");
        }
        // Dark heat-map cells get white text.
        assert!(s.contains("fill=\"white\">+"), "{s}");
        crate::report::render_png(&s, "sweep-unit");
    }

    #[test]
    fn log_ticks_are_decades_or_finer_on_short_axes() {
        assert_eq!(log_ticks(1.0, 4.5), vec![10.0, 100.0, 1000.0, 10000.0]);
        assert_eq!(
            log_ticks(2.0, 3.5),
            vec![100.0, 200.0, 500.0, 1000.0, 2000.0]
        );
    }
}
