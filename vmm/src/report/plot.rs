//! A compare table as a picture, under a title naming the workload, the
//! host, the guest kernel, the runs and what the times are on this backend:
//!
//! 1. the metrics whose baseline mean is not near zero (0.05), relative to
//!    it (100 %), on an axis fitted to the data with round ticks: a bar from
//!    100 % to the compare side's mean (red: more with the compare side,
//!    green: less; the only meaning of colour here), the compare mean's
//!    95 % CI as a black line, every run as a dot (hollow: baseline, filled:
//!    compare), `*` where the verdict (Welch at 95 %, or exact) says
//!    significant; a time's name carries its basis (`[kvm_pvm emulated]`);
//! 2. the counters that differ and start at (near) zero (CR3 writes 0 -> 2,
//!    TLB flushes 0 -> 1), drawn as paired bars on a count axis (outline:
//!    baseline, filled grey: compare), each with its value;
//! 3. rates near zero on both sides (below 0.05), listed as values
//!    only: a percentage or a bar of them would say nothing.
//!
//! Plain SVG written by hand (a few dozen elements; the tests render it
//! with resvg so a picture that does not render fails).

use super::compare::{fig, CompareTable, MetricComparison};
use super::environment::guest_kernel;
use super::stats::{near_zero, Verdict};
use super::time_basis::{is_time, TimeBasis};

const ROW_H: f64 = 34.0;
const LEFT: f64 = 300.0;
const PLOT_W: f64 = 480.0;

/// Escapes text for SVG.
pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Round ticks (1, 2 or 5 times a power of ten apart) covering
/// `lo..=hi`, about `n` of them; always at least two.
pub(crate) fn nice_ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    let (lo, hi) = if lo.is_finite() && hi.is_finite() && hi > lo {
        (lo, hi)
    } else if lo.is_finite() {
        (lo, lo + 1.0)
    } else {
        (0.0, 1.0)
    };
    let raw = (hi - lo) / n.max(1) as f64;
    let p = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p);
    let first = (lo / step).floor() * step;
    let mut out = Vec::new();
    let mut i = 0.0;
    loop {
        // Rounded to the step's precision: 0.30000000000000004 prints as 0.3.
        let decimals = (-step.log10().floor()).max(0.0) as i32;
        let scale = 10f64.powi(decimals);
        let v = ((first + i * step) * scale).round() / scale;
        let v = if v.abs() < step * 1e-9 { 0.0 } else { v };
        out.push(v);
        if v >= hi - step * 1e-9 || out.len() > 100 {
            break;
        }
        i += 1.0;
    }
    if out.len() < 2 {
        out.push(first + step);
    }
    out
}

/// Black or white, whichever contrasts more with the background `rgb`
/// (WCAG relative luminance).
pub(crate) fn text_on(rgb: (u8, u8, u8)) -> &'static str {
    let lin = |c: u8| {
        let c = f64::from(c) / 255.0;
        if c <= 0.039_28 {
            c / 12.92
        } else {
            ((c + 0.055) / 1.055).powf(2.4)
        }
    };
    let l = 0.2126 * lin(rgb.0) + 0.7152 * lin(rgb.1) + 0.0722 * lin(rgb.2);
    // Contrast with black (l + 0.05) / 0.05 against white 1.05 / (l + 0.05).
    if (l + 0.05) / 0.05 >= 1.05 / (l + 0.05) {
        "black"
    } else {
        "white"
    }
}

/// A figure for a label: whole numbers plain, else [`fig`].
fn num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        fig(v)
    }
}

/// The title's second and third lines: workload; host and runs; guest
/// kernel and what the times are.
fn subtitle(table: &CompareTable) -> (String, String, String) {
    let workload = table
        .baseline
        .config
        .iter()
        .find_map(|w| w.strip_prefix("workload="))
        .unwrap_or("the workload")
        .to_owned();
    let (nb, nc) = table
        .metrics
        .first()
        .map_or((0, 0), |m| (m.baseline.n(), m.compare.n()));
    let env = table.environment.as_ref();
    let host = env.map_or_else(
        || "host not recorded".to_owned(),
        |e| {
            let kernel = e.host.kernel.as_deref().unwrap_or("?");
            let kernel = kernel.split(" #").next().unwrap_or(kernel);
            let module = e.kvm.module.as_deref().unwrap_or("?");
            let backend = match e.time_basis {
                TimeBasis::Hardware | TimeBasis::KvmPvm => format!("KVM {module}"),
                TimeBasis::NestedTcg => format!("KVM {module} inside QEMU TCG"),
                TimeBasis::QemuTcg => "QEMU TCG".to_owned(),
                TimeBasis::Unknown => format!("backend {}", e.backend),
            };
            format!(
                "host {kernel}, {}, {} CPUs; {backend}",
                e.host.cpu_model.as_deref().unwrap_or("?"),
                e.host.cpus,
            )
        },
    );
    let guest = format!(
        "guest {}; times: {}",
        guest_kernel(env),
        crate::report::environment::time_basis(env).label()
    );
    (
        workload,
        format!("{host}; {nb} + {nc} runs, interleaved"),
        guest,
    )
}

/// Whether `m` goes in the counter panel: a count whose baseline is zero
/// or near it (below 0.05) and whose compare side is not (no ratio to draw).
fn counter_row(m: &MetricComparison) -> bool {
    m.metric.unit.starts_with("count") && near_zero(m.baseline.amean) && !near_zero(m.compare.amean)
}

/// Whether `m` is listed as values only: both sides near zero, and
/// one is not 0.
fn near_zero_row(m: &MetricComparison) -> bool {
    near_zero(m.baseline.amean)
        && near_zero(m.compare.amean)
        && (m.baseline.amean != 0.0 || m.compare.amean != 0.0)
}

/// The SVG of `table`.
pub fn compare_svg(table: &CompareTable) -> String {
    let (workload, host, guest) = subtitle(table);
    let basis = crate::report::environment::time_basis(table.environment.as_ref());
    let time_views = super::answer::OTHER_TIME_VIEWS;
    let time_shown = time_views.into_iter().find(|n| table.metric(n).is_some());
    let ratio_rows: Vec<&MetricComparison> = table
        .metrics
        .iter()
        .filter(|m| !near_zero(m.baseline.amean) && m.baseline.amean.is_finite())
        .filter(|m| {
            !time_views.contains(&m.metric.name.as_str())
                || Some(m.metric.name.as_str()) == time_shown
        })
        .filter(|m| !counter_row(m))
        .collect();
    let counters: Vec<&MetricComparison> =
        table.metrics.iter().filter(|m| counter_row(m)).collect();
    let small: Vec<&MetricComparison> = table.metrics.iter().filter(|m| near_zero_row(m)).collect();
    let rel = |m: &MetricComparison, v: f64| v / m.baseline.amean * 100.0;
    let mut lo = 100.0f64;
    let mut hi = 100.0f64;
    for m in &ratio_rows {
        for v in m.baseline.samples.iter().chain(&m.compare.samples) {
            lo = lo.min(rel(m, *v));
            hi = hi.max(rel(m, *v));
        }
    }
    // Fitted to the runs; a confidence interval wider than that (two runs
    // give Student's t 12.7) runs to the axis' edge, with an arrow head.
    let ticks = nice_ticks(lo, hi, 6);
    let (a0, a1) = (ticks[0], *ticks.last().unwrap_or(&hi));
    let x = |pct: f64| LEFT + (pct.clamp(a0, a1) - a0) / (a1 - a0) * PLOT_W;
    let top = 136.0;
    let panel1_h = ROW_H * ratio_rows.len() as f64;
    let counter_top = top + panel1_h + 96.0;
    let small_top = counter_top + 30.0 + ROW_H * counters.len() as f64 + 20.0;
    let small_h = if small.is_empty() {
        0.0
    } else {
        24.0 + 18.0 * small.len() as f64
    };
    let height = small_top + small_h + 20.0;
    let width = (LEFT + PLOT_W + 150.0).max(900.0);
    let (b, c) = (esc(&table.baseline.label), esc(&table.compare.label));

    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         viewBox=\"0 0 {width} {height}\" font-family=\"DejaVu Sans, sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"16\" y=\"24\" font-size=\"16\" font-weight=\"bold\">What {c} costs against {b}, per {} call</text>\n\
         <text x=\"16\" y=\"44\" fill=\"#333\">{}</text>\n\
         <text x=\"16\" y=\"62\" fill=\"#333\">{}</text>\n",
        esc(&workload),
        esc(&host),
        esc(&guest),
    );
    // Legend of panel 1.
    let ly = 84.0;
    s += &format!(
        "<rect x=\"16\" y=\"{0}\" width=\"18\" height=\"10\" fill=\"#d62728\" opacity=\"0.7\"/>\
         <text x=\"38\" y=\"{1}\">more with {c}</text>\
         <rect x=\"150\" y=\"{0}\" width=\"18\" height=\"10\" fill=\"#2ca02c\" opacity=\"0.7\"/>\
         <text x=\"172\" y=\"{1}\">less</text>\
         <circle cx=\"226\" cy=\"{2}\" r=\"3\" fill=\"white\" stroke=\"#000\"/><text x=\"234\" y=\"{1}\">a {b} run</text>\
         <circle cx=\"338\" cy=\"{2}\" r=\"3\" fill=\"#000\"/><text x=\"346\" y=\"{1}\">a {c} run</text>\
         <line x1=\"440\" y1=\"{2}\" x2=\"470\" y2=\"{2}\" stroke=\"#000\" stroke-width=\"3\"/>\
         <text x=\"476\" y=\"{1}\">95 % CI of the {c} mean (arrow: beyond the axis); * Welch p &lt; 0.05</text>\n",
        ly - 9.0,
        ly,
        ly - 4.0,
    );
    s += &format!(
        "<text x=\"16\" y=\"{}\" font-size=\"13\" font-weight=\"bold\">relative to the {b} mean (= 100 %)</text>\n",
        top - 24.0
    );
    for &t in &ticks {
        let gx = x(t);
        let colour = if t == 100.0 { "#000" } else { "#ddd" };
        s += &format!(
            "<line x1=\"{gx:.1}\" y1=\"{}\" x2=\"{gx:.1}\" y2=\"{}\" stroke=\"{colour}\"/>\n\
             <text x=\"{gx:.1}\" y=\"{}\" text-anchor=\"middle\" fill=\"#333\">{t}%</text>\n",
            top - 4.0,
            top + panel1_h,
            top + panel1_h + 16.0,
        );
    }
    for (i, m) in ratio_rows.iter().enumerate() {
        let y = top + ROW_H * i as f64;
        let mid = y + ROW_H / 2.0;
        let mean = rel(m, m.compare.amean);
        let fill = if (mean - 100.0).abs() < 0.05 {
            "#999"
        } else if mean > 100.0 {
            "#d62728"
        } else {
            "#2ca02c"
        };
        let time = if is_time(&m.metric.unit) {
            format!(" [{}]", basis.tag())
        } else {
            String::new()
        };
        s += &format!(
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{} [{}]{}</text>\n",
            LEFT - 8.0,
            mid + 4.0,
            esc(&m.metric.name),
            m.metric.source.tag(),
            esc(&time),
        );
        let (x0, x1) = (x(100.0).min(x(mean)), x(100.0).max(x(mean)));
        s += &format!(
            "<rect x=\"{x0:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{fill}\" opacity=\"0.7\"/>\n",
            y + 9.0,
            (x1 - x0).max(1.0),
            ROW_H - 18.0
        );
        if let Some(ci) = m.compare.ci95 {
            let (l, h) = (rel(m, ci.low), rel(m, ci.high));
            s += &format!(
                "<line x1=\"{:.1}\" y1=\"{mid:.1}\" x2=\"{:.1}\" y2=\"{mid:.1}\" stroke=\"#000\" stroke-width=\"3\"/>\n",
                x(l),
                x(h).max(x(l) + 1.0),
            );
            for (end, out, dir) in [(x(l), l < a0, -1.0), (x(h), h > a1, 1.0)] {
                if out {
                    s += &format!(
                        "<polygon points=\"{:.1},{mid:.1} {:.1},{:.1} {:.1},{:.1}\" fill=\"#000\"/>\n",
                        end + 7.0 * dir,
                        end,
                        mid - 5.0,
                        end,
                        mid + 5.0
                    );
                }
            }
        }
        for v in &m.baseline.samples {
            s += &format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"white\" stroke=\"#000\"/>\n",
                x(rel(m, *v)),
                mid - 9.0
            );
        }
        for v in &m.compare.samples {
            s += &format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"#000\"/>\n",
                x(rel(m, *v)),
                mid + 9.0
            );
        }
        let marked = m.significance.is_some_and(|s| s.verdict.marked());
        s += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\">{mean:.1}%{}</text>\n",
            LEFT + PLOT_W + 10.0,
            mid + 4.0,
            if marked { " *" } else { "" }
        );
    }
    // Panel 2: counters per call, drawn.
    s += &format!(
        "<text x=\"16\" y=\"{}\" font-size=\"13\" font-weight=\"bold\">counts per call that {c} changes \
         (outline: {b}, grey: {c})</text>\n",
        counter_top - 30.0
    );
    if counters.is_empty() {
        s += &format!(
            "<text x=\"16\" y=\"{counter_top}\">none: every counter is the same on both sides</text>\n"
        );
    } else {
        let cmax = counters
            .iter()
            .map(|m| m.baseline.amean.max(m.compare.amean))
            .fold(1.0f64, f64::max);
        // Counts: whole-number ticks while they are few.
        let cticks = if cmax <= 8.0 {
            (0..=cmax.ceil() as u32).map(f64::from).collect()
        } else {
            nice_ticks(0.0, cmax, 4)
        };
        let c1 = *cticks.last().unwrap_or(&cmax);
        let cx = |v: f64| LEFT + v.clamp(0.0, c1) / c1 * PLOT_W;
        let bottom = counter_top + ROW_H * counters.len() as f64;
        for &t in &cticks {
            s += &format!(
                "<line x1=\"{0:.1}\" y1=\"{1}\" x2=\"{0:.1}\" y2=\"{bottom}\" stroke=\"#ddd\"/>\
                 <text x=\"{0:.1}\" y=\"{2}\" text-anchor=\"middle\" fill=\"#333\">{3}</text>\n",
                cx(t),
                counter_top - 4.0,
                bottom + 16.0,
                num(t)
            );
        }
        for (i, m) in counters.iter().enumerate() {
            let y = counter_top + ROW_H * i as f64;
            let exact = m
                .significance
                .is_some_and(|s| matches!(s.verdict, Verdict::ExactDifferent));
            s += &format!(
                "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{} [{}]</text>\n",
                LEFT - 8.0,
                y + ROW_H / 2.0 + 4.0,
                esc(&m.metric.name),
                m.metric.source.tag()
            );
            for (k, v) in [m.baseline.amean, m.compare.amean].into_iter().enumerate() {
                let by = y + 5.0 + 12.0 * k as f64;
                let (fill, stroke) = if k == 0 {
                    ("white", "#000")
                } else {
                    ("#888", "#000")
                };
                s += &format!(
                    "<rect x=\"{LEFT}\" y=\"{by:.1}\" width=\"{:.1}\" height=\"10\" fill=\"{fill}\" stroke=\"{stroke}\"/>\
                     <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\">{}</text>\n",
                    (cx(v) - LEFT).max(1.0),
                    cx(v) + 5.0,
                    by + 9.0,
                    num(v)
                );
            }
            s += &format!(
                "<text x=\"{:.1}\" y=\"{:.1}\">{} → {}{}</text>\n",
                LEFT + PLOT_W + 26.0,
                y + ROW_H / 2.0 + 4.0,
                num(m.baseline.amean),
                num(m.compare.amean),
                if exact { " exact" } else { "" }
            );
        }
    }
    if !small.is_empty() {
        s += &format!(
            "<text x=\"16\" y=\"{small_top}\" font-size=\"13\" font-weight=\"bold\">near zero on \
             both sides (no percentage, no bar: {b} → {c})</text>\n"
        );
        for (i, m) in small.iter().enumerate() {
            s += &format!(
                "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{} [{}]</text>\
                 <text x=\"{LEFT}\" y=\"{:.1}\">{} → {}</text>\n",
                LEFT - 8.0,
                small_top + 22.0 + 18.0 * i as f64,
                esc(&m.metric.name),
                m.metric.source.tag(),
                small_top + 22.0 + 18.0 * i as f64,
                num(m.baseline.amean),
                num(m.compare.amean),
            );
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
    fn ticks_are_round_and_cover_the_data() {
        assert_eq!(nice_ticks(0.0, 8.1, 5), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(
            nice_ticks(96.0, 148.0, 6),
            vec![90.0, 100.0, 110.0, 120.0, 130.0, 140.0, 150.0]
        );
        assert_eq!(
            nice_ticks(-0.3, 0.2, 5),
            vec![-0.3, -0.2, -0.1, 0.0, 0.1, 0.2]
        );
        assert!(nice_ticks(2.0, 2.0, 4).len() >= 2);
    }

    #[test]
    fn text_contrasts_with_its_cell() {
        assert_eq!(text_on((250, 250, 250)), "black");
        assert_eq!(text_on((50, 50, 50)), "white");
        assert_eq!(text_on((139, 0, 0)), "white", "dark red");
        assert_eq!(text_on((255, 220, 200)), "black");
    }

    #[test]
    fn plots_ratios_and_draws_the_counters() {
        let side = |l: &str| Side {
            label: l.into(),
            config: vec![l.into(), "workload=getpid".into()],
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
        // A ratio of two near-zero rates (the 838 % bar): listed
        // with its values, no percentage, no bar.
        t.add(
            Metric::new("insn_iret_per_call", "count/call", Source::QemuPlugin),
            &[0.0012, 0.0013],
            &[0.0113, 0.0112],
        )
        .unwrap();
        let mut e = crate::report::Environment {
            backend: "qemu".into(),
            time_basis: TimeBasis::QemuTcg,
            ..Default::default()
        };
        e.host.kernel = Some("Linux 6.18.44-fc #1 SMP x86_64".into());
        e.guest_kernel = Some("Linux 6.1.0-57-cloud-amd64 (amd64)".into());
        t.environment = Some(e);
        let svg = compare_svg(&t);
        assert!(svg.contains("host Linux 6.18.44-fc,"), "{svg}");
        assert!(
            svg.contains(
                "guest Linux 6.1.0-57-cloud-amd64 (amd64); times: QEMU TCG: every CR3 write \
                 flushes the soft TLB"
            ),
            "{svg}"
        );
        assert!(svg.contains("ns_per_call [host-clock] [TCG]<"), "{svg}");
        assert!(svg.contains(">0.00125 → 0.0112<"), "{svg}");
        assert!(
            !svg.contains("838") && !svg.contains("insn_iret_per_call [qemu-plugin]</text><rect")
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("per getpid call"), "the workload in the title");
        // 145 / 105 = 138.1 % of the baseline's mean; significant by
        // Welch's test (t = 40 / 7.07 = 5.66, df 2, p = 0.030): marked.
        assert!(svg.contains(">138.1% *<"), "{svg}");
        // The counter is drawn: two bars and its values.
        assert!(svg.contains(">0 → 2 exact<"), "{svg}");
        assert_eq!(svg.matches("height=\"10\" fill=\"#888\"").count(), 1);
        // One dot per run, plus the two in the legend.
        assert_eq!(svg.matches("<circle").count(), 4 + 2);
        crate::report::render_png(&svg, "compare-unit");
    }
}
