//! `ptiscope sweep`: PTI's overhead over a grid of (working set, reads per
//! iteration) cells, for several configurations against a baseline, as in
//! Brendan Gregg's 2018 KPTI study (overhead against syscall rate, one
//! curve per working set). This module holds the figures and renders them
//! (text table, JSON, CSV, SVG); `cli::sweep` runs the guests.
//!
//! Per cell and configuration the central value is the **median** of the
//! runs (the host is noisy; a median resists the odd slow run). Derived
//! figures are labelled as such: the overhead against the baseline, the
//! baseline's syscall rate, and the refill cost per page,
//! `((C - B) at wss) - ((C - B) at wss=0)` divided by the pages the loop
//! touches per iteration.
//!
//! Size: the sweep report's model, derived figures, text, JSON and CSV; about
//! 120 lines are tests (the SVG is in sweep_svg.rs).

use serde::Serialize;

/// Schema name of the JSON document.
pub const SCHEMA: &str = "ptiscope.sweep/1";

/// One configuration's figures in one cell.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CellConfig {
    /// The configuration's label (its options, as given).
    pub config: String,
    /// Time per call of every run, in the sweep's time unit.
    pub samples: Vec<f64>,
    /// Median of `samples`.
    pub median: f64,
    /// Smallest of `samples`: on a host where other load only ever adds
    /// time, the least disturbed run.
    pub min: f64,
    /// Median - the baseline's median (`None` for the baseline itself).
    pub delta: Option<f64>,
    /// `delta` as % of the baseline's median (derived).
    pub overhead_pct: Option<f64>,
    /// Derived: (delta here - delta at wss=0) / pages touched per
    /// iteration, in the time unit per page; `None` at wss=0, for the
    /// baseline, or without a wss=0 cell.
    pub refill_per_page: Option<f64>,
    /// Host evidence per call (medians): KVM `tlb_flush`, `pf_taken`,
    /// `exits`; `None` where the source is missing (QEMU).
    pub tlb_flush_per_call: Option<f64>,
    /// KVM `pf_taken` per call (median).
    pub kvm_pf_taken_per_call: Option<f64>,
    /// KVM `exits` per call (median).
    pub kvm_exits_per_call: Option<f64>,
    /// Guest-reported CR3 writes per call (median).
    pub cr3_writes_per_call: Option<f64>,
    /// Host-observed kernel instructions per call (median): KVM's
    /// `insn_emulation` or, under QEMU, the TCG plugin's count.
    pub kernel_instructions_per_call: Option<f64>,
    /// MOV-to-CR3 executions per call the QEMU plugin saw (median; `None`
    /// on KVM and with `--no-plugin`).
    pub insn_mov_cr3_per_call: Option<f64>,
    /// Guest TSC cycles per call spent in the user loop's reads of the
    /// working set (median over runs of each run's mean); `None` at wss=0.
    pub read_cycles_per_call: Option<f64>,
    /// The fewest TSC cycles of one iteration's reads (median over runs):
    /// the least disturbed iteration, so the steadiest figure here.
    pub read_cycles_min: Option<f64>,
    /// Derived, user mode only: (`read_cycles_min` - the baseline's) /
    /// pages touched per call, TSC cycles per page: the TLB refill the
    /// loop's reads pay after the configuration's CR3 switches, without
    /// the system call's time; `None` for the baseline and at wss=0.
    pub user_refill_cycles_per_page: Option<f64>,
    /// Whether the difference to the baseline is statistically
    /// significant. `None`: not assessed (see [`significance`]).
    pub significant: Option<bool>,
    /// Mean of `samples` with its 95 % confidence interval (`None` with
    /// fewer than two runs).
    pub mean_ci95: Option<crate::report::stats::MeanCi>,
    /// Welch's t-test p-value against the baseline's samples (`None` for
    /// the baseline, or where undefined).
    pub welch_p: Option<f64>,
}

/// One (working set, reads per iteration) cell.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Cell {
    /// `wss=` in bytes (0: no working set).
    pub wss: u64,
    /// The reads-per-iteration spec as given (`1x`, `4x`, a number; `-` at wss=0).
    pub touches_spec: String,
    /// Reads per iteration.
    pub touches: u64,
    /// Pages (of the mapping's size) the loop touches per iteration: the
    /// TLB entries a flush makes it walk in again.
    pub pages: u64,
    /// The guest words of this cell (`wss=... stride=... touches=...`).
    pub guest_words: String,
    /// Baseline syscalls per second (1 / its median time per call; derived).
    pub syscall_rate: Option<f64>,
    /// Baseline first, then the other configurations in order.
    pub configs: Vec<CellConfig>,
}

/// Where one configuration's overhead at one working set crosses a threshold.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Crossing {
    /// Working set, bytes.
    pub wss: u64,
    /// The configuration's label.
    pub config: String,
    /// The threshold, % overhead (1 or 5).
    pub threshold_pct: f64,
    /// Syscall rate at the crossing, interpolated (log rate, linear %)
    /// between two measured cells that bracket it.
    pub measured_rate: Option<f64>,
    /// Syscall rate at which `delta × rate` reaches the threshold, with
    /// `delta` this working set's median PTI delta per call (seconds): a
    /// model (the cost per call does not depend on the work between calls
    /// once the working set has been walked in), labelled as one.
    pub model_rate: Option<f64>,
    /// What the measured cells say (e.g. "above at every measured rate").
    pub note: String,
}

/// A configuration left out of the sweep, and why.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Omitted {
    /// The configuration's label.
    pub config: String,
    /// Why it was left out.
    pub reason: String,
}

/// The whole sweep.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SweepReport {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// Kernel release and CPU model of the host.
    pub host: String,
    /// `kvm` or `qemu`.
    pub backend: String,
    /// The guest workload (`workload=`).
    pub workload: String,
    /// Iterations per run (per thread for poundsyscall).
    pub iterations: u64,
    /// vCPUs of every run.
    pub cpus: u32,
    /// Runs per (cell, configuration).
    pub runs: u32,
    /// Bytes between two reads of the working set.
    pub stride: u64,
    /// Page size of the working set's mapping (`4k` or `2m`).
    pub wss_pages: String,
    /// Name of the time figure: `ns_per_call` (host clock) or
    /// `cycles_per_call` (guest RDTSC, under QEMU).
    pub time_metric: String,
    /// Its unit (`ns` or `cycles`) and source (`host-clock` or `guest`).
    pub time_unit: String,
    /// Source of the time figure.
    pub time_source: String,
    /// Baseline first.
    pub configs: Vec<String>,
    /// Configurations left out, with the reason.
    pub omitted: Vec<Omitted>,
    /// The cells, by working set, then reads per iteration.
    pub cells: Vec<Cell>,
    /// Where each configuration's overhead crosses 1 % and 5 %.
    pub crossings: Vec<Crossing>,
    /// Wall-clock seconds the sweep took.
    pub seconds: f64,
    /// Where the sweep came from (as in every JSON report).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub environment: Option<crate::report::environment::Environment>,
}

/// The median of `v` (mean of the middle two for even lengths); NaN if empty.
pub fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Whether `compare` differs significantly from `baseline`, by the rule
/// `compare` marks its table with ([`crate::report::stats::significance`]:
/// mmtests' confidence-interval rule, exact counters as exact). `None` when
/// a side has fewer than two runs.
pub fn significance(baseline: &[f64], compare: &[f64]) -> Option<bool> {
    use crate::report::stats::{self, Verdict};
    match stats::significance(baseline, compare).verdict {
        Verdict::Undefined => None,
        v => Some(v.marked()),
    }
}

impl SweepReport {
    /// Fills the derived figures of every cell: deltas, overhead, syscall
    /// rate, refill per page, then the crossings.
    pub fn derive(&mut self) {
        let per_second = match self.time_unit.as_str() {
            "ns" => Some(1e9),
            _ => None,
        };
        for cell in &mut self.cells {
            let Some(base) = cell.configs.first().map(|c| (c.median, c.samples.clone())) else {
                continue;
            };
            for c in cell.configs.iter_mut() {
                c.mean_ci95 = crate::report::stats::mean_ci95(&c.samples);
            }
            let base_reads = cell.configs.first().and_then(|c| c.read_cycles_min);
            let pages = cell.pages;
            cell.syscall_rate = per_second
                .filter(|_| base.0 > 0.0 && base.0.is_finite())
                .map(|s| s / base.0);
            for c in cell.configs.iter_mut().skip(1) {
                if let (Some(r), Some(b), true) = (c.read_cycles_min, base_reads, pages > 0) {
                    c.user_refill_cycles_per_page = Some((r - b) / pages as f64);
                }
                c.delta = Some(c.median - base.0);
                c.overhead_pct = (base.0 > 0.0).then(|| (c.median - base.0) / base.0 * 100.0);
                c.significant = significance(&base.1, &c.samples);
                c.welch_p =
                    crate::report::stats::welch_t_test(&base.1, &c.samples).map(|w| w.p_value);
            }
        }
        // Refill per page: against the wss=0 cell of the same configuration.
        let zero: Vec<Option<f64>> = self
            .cells
            .iter()
            .find(|c| c.wss == 0)
            .map(|c| c.configs.iter().map(|x| x.delta).collect())
            .unwrap_or_default();
        for cell in &mut self.cells {
            if cell.wss == 0 || cell.pages == 0 {
                continue;
            }
            for (i, c) in cell.configs.iter_mut().enumerate().skip(1) {
                if let (Some(d), Some(Some(d0))) = (c.delta, zero.get(i)) {
                    c.refill_per_page = Some((d - d0) / cell.pages as f64);
                }
            }
        }
        // Crossings are over syscall rates, which need a time per call
        // in seconds (not the guest's cycles under QEMU).
        self.crossings = if per_second.is_some() {
            self.find_crossings()
        } else {
            Vec::new()
        };
    }

    /// The working sets of the sweep, in order.
    pub fn working_sets(&self) -> Vec<u64> {
        let mut w: Vec<u64> = self.cells.iter().map(|c| c.wss).collect();
        w.dedup();
        w
    }

    /// (syscall rate, overhead %) of configuration `i` at working set
    /// `wss`, sorted by rate; cells without a rate are left out.
    pub fn curve(&self, wss: u64, i: usize) -> Vec<(f64, f64)> {
        let mut pts: Vec<(f64, f64)> = self
            .cells
            .iter()
            .filter(|c| c.wss == wss)
            .filter_map(|c| Some((c.syscall_rate?, c.configs.get(i)?.overhead_pct?)))
            .filter(|(r, o)| r.is_finite() && o.is_finite() && *r > 0.0)
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        pts
    }

    fn find_crossings(&self) -> Vec<Crossing> {
        let mut out = Vec::new();
        for wss in self.working_sets() {
            for (i, config) in self.configs.iter().enumerate().skip(1) {
                let pts = self.curve(wss, i);
                // The model's delta: the median delta over this working
                // set's cells, in seconds.
                let deltas: Vec<f64> = self
                    .cells
                    .iter()
                    .filter(|c| c.wss == wss)
                    .filter_map(|c| c.configs.get(i)?.delta)
                    .collect();
                let delta_s = match self.time_unit.as_str() {
                    "ns" => Some(median(&deltas) * 1e-9),
                    _ => None,
                };
                for threshold in [1.0, 5.0] {
                    let model_rate = delta_s
                        .filter(|d| *d > 0.0 && d.is_finite())
                        .map(|d| threshold / 100.0 / d);
                    let (measured_rate, note) = crossing_on(&pts, threshold);
                    out.push(Crossing {
                        wss,
                        config: config.clone(),
                        threshold_pct: threshold,
                        measured_rate,
                        model_rate,
                        note,
                    });
                }
            }
        }
        out
    }
}

/// Where the curve `pts` (rate ascending) crosses `threshold` %, and what
/// the measured points say.
fn crossing_on(pts: &[(f64, f64)], threshold: f64) -> (Option<f64>, String) {
    if pts.is_empty() {
        return (None, "no measured rate".into());
    }
    for w in pts.windows(2) {
        let ((r0, o0), (r1, o1)) = (w[0], w[1]);
        if (o0 - threshold) * (o1 - threshold) <= 0.0 && o0 != o1 {
            let t = (threshold - o0) / (o1 - o0);
            let rate = (r0.ln() + t * (r1.ln() - r0.ln())).exp();
            return (Some(rate), "between two measured rates".into());
        }
    }
    let lo = pts[0];
    let hi = pts[pts.len() - 1];
    if pts.iter().all(|p| p.1 > threshold) {
        (
            None,
            format!(
                "above at every measured rate (lowest {}/s: {:.1} %)",
                fmt_rate(lo.0),
                lo.1
            ),
        )
    } else if pts.iter().all(|p| p.1 < threshold) {
        (
            None,
            format!(
                "below at every measured rate (highest {}/s: {:.1} %)",
                fmt_rate(hi.0),
                hi.1
            ),
        )
    } else {
        (None, "not monotonic between measured rates".into())
    }
}

/// `1.2M`, `35k`, `800`.
pub fn fmt_rate(r: f64) -> String {
    if !r.is_finite() {
        return "-".into();
    }
    if r >= 1e6 {
        format!("{:.2}M", r / 1e6)
    } else if r >= 1e3 {
        format!("{:.1}k", r / 1e3)
    } else {
        format!("{r:.0}")
    }
}

/// `0`, `64K`, `1M`, `1.5M`.
pub fn fmt_size(b: u64) -> String {
    if b == 0 {
        "0".into()
    } else if b.is_multiple_of(1 << 30) {
        format!("{}G", b >> 30)
    } else if b.is_multiple_of(1 << 20) {
        format!("{}M", b >> 20)
    } else if b.is_multiple_of(1 << 10) {
        format!("{}K", b >> 10)
    } else {
        b.to_string()
    }
}

fn opt(v: Option<f64>, prec: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.prec$}"),
        _ => "-".into(),
    }
}

/// The human table.
pub fn text(r: &SweepReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let unit = &r.time_unit;
    let _ = writeln!(
        s,
        "{} per call [{}], median of {} runs per cell; overhead and refill are derived; \
         * marks an overhead significant by mmtests' rule (docs/report-json.md)",
        unit, r.time_source, r.runs
    );
    let _ = write!(
        s,
        "{:>6} {:>8} {:>6} {:>9} |",
        "wss", "touches", "pages", "rate/s"
    );
    for (i, c) in r.configs.iter().enumerate() {
        if i == 0 {
            let _ = write!(s, " {:>12} |", trunc(c, 12));
        } else {
            let _ = write!(s, " {:>29} |", trunc(c, 29));
        }
    }
    s.push('\n');
    let _ = write!(
        s,
        "{:>6} {:>8} {:>6} {:>9} |",
        "", "/iter", "/iter", "(base)"
    );
    for i in 0..r.configs.len() {
        if i == 0 {
            let _ = write!(s, " {:>12} |", format!("{unit}/call"));
        } else {
            let _ = write!(
                s,
                " {:>10} {:>8} {:>9} |",
                format!("{unit}/call"),
                "ovh % ",
                format!("{unit}/page")
            );
        }
    }
    s.push('\n');
    for cell in &r.cells {
        let _ = write!(
            s,
            "{:>6} {:>8} {:>6} {:>9} |",
            fmt_size(cell.wss),
            if cell.wss == 0 {
                "-".to_string()
            } else {
                format!("{}", cell.touches)
            },
            cell.pages,
            cell.syscall_rate.map_or("-".into(), fmt_rate)
        );
        for (i, c) in cell.configs.iter().enumerate() {
            if i == 0 {
                let _ = write!(s, " {:>12.1} |", c.median);
            } else {
                // mmtests' mark: `*` after an overhead that is significant.
                let mark = match c.significant {
                    Some(true) => "*",
                    _ => " ",
                };
                let _ = write!(
                    s,
                    " {:>10.1} {:>7}{mark} {:>9} |",
                    c.median,
                    opt(c.overhead_pct, 1),
                    opt(c.refill_per_page, 2)
                );
            }
        }
        s.push('\n');
    }
    if r.cells
        .iter()
        .any(|c| c.configs.iter().any(|x| x.tlb_flush_per_call.is_some()))
    {
        let _ = writeln!(
            s,
            "\nhost evidence per call [kvm] (medians): tlb_flush / pf_taken / exits"
        );
        for cell in &r.cells {
            let _ = write!(s, "{:>6} {:>8} |", fmt_size(cell.wss), cell.touches_spec);
            for c in &cell.configs {
                let _ = write!(
                    s,
                    " {:>5} {:>8} {:>6} |",
                    opt(c.tlb_flush_per_call, 2),
                    opt(c.kvm_pf_taken_per_call, 2),
                    opt(c.kvm_exits_per_call, 2)
                );
            }
            s.push('\n');
        }
    }
    if r.cells
        .iter()
        .any(|c| c.configs.iter().any(|x| x.read_cycles_min.is_some()))
    {
        let _ = writeln!(
            s,
            "\nuser-mode reads of the working set [guest RDTSC]: fewest cycles of one iteration (median of runs), and per configuration the refill per page against the baseline (derived, cycles/page)"
        );
        for cell in r.cells.iter().filter(|c| c.wss > 0) {
            let _ = write!(s, "{:>6} {:>8} |", fmt_size(cell.wss), cell.touches_spec);
            for (i, c) in cell.configs.iter().enumerate() {
                if i == 0 {
                    let _ = write!(s, " {:>10} |", opt(c.read_cycles_min, 0));
                } else {
                    let _ = write!(
                        s,
                        " {:>10} {:>8} |",
                        opt(c.read_cycles_min, 0),
                        opt(c.user_refill_cycles_per_page, 2)
                    );
                }
            }
            s.push('\n');
        }
    }
    if !r.crossings.is_empty() {
        let _ = writeln!(
            s,
            "\nwhere the overhead crosses 1 % and 5 % (syscalls/s; measured = interpolated between cells, model = threshold / delta per call)"
        );
        for x in &r.crossings {
            let _ = writeln!(
                s,
                "  wss {:>5} {:<28} {:>2.0} %: measured {:>8}  model {:>8}  ({})",
                fmt_size(x.wss),
                trunc(&x.config, 28),
                x.threshold_pct,
                x.measured_rate.map_or("-".into(), fmt_rate),
                x.model_rate.map_or("-".into(), fmt_rate),
                x.note
            );
        }
    }
    if r.crossings.is_empty() && r.time_unit != "ns" {
        let _ = writeln!(
            s,
            "\nno syscall rates and no 1 %/5 % crossings: the time per call is in {} [{}], not host-clock ns",
            r.time_unit, r.time_source
        );
    }
    for o in &r.omitted {
        let _ = writeln!(s, "\nleft out: {}: {}", o.config, o.reason);
    }
    s
}

fn trunc(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let t: String = s.chars().take(n - 1).collect();
        format!("{t}…")
    }
}

/// The JSON document (schema [`SCHEMA`]).
pub fn json(r: &SweepReport) -> String {
    serde_json::to_string_pretty(r).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// CSV quoting: fields with a comma, quote or newline are quoted.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// One line per (cell, configuration).
pub fn csv(r: &SweepReport) -> String {
    let mut s = String::from(
        "wss,touches_spec,touches,pages,syscall_rate,config,median,unit,delta,overhead_pct,refill_per_page,tlb_flush_per_call,kvm_pf_taken_per_call,kvm_exits_per_call,cr3_writes_per_call,read_cycles_per_call,read_cycles_min,user_refill_cycles_per_page,runs,mean,ci95_half_width,welch_p,significant,kernel_instructions_per_call,insn_mov_cr3_per_call\n",
    );
    let f = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x}"));
    for cell in &r.cells {
        for c in &cell.configs {
            s.push_str(&format!(
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
                cell.wss,
                csv_field(&cell.touches_spec),
                cell.touches,
                cell.pages,
                f(cell.syscall_rate),
                csv_field(&c.config),
                c.median,
                r.time_unit,
                f(c.delta),
                f(c.overhead_pct),
                f(c.refill_per_page),
                f(c.tlb_flush_per_call),
                f(c.kvm_pf_taken_per_call),
                f(c.kvm_exits_per_call),
                f(c.cr3_writes_per_call),
                f(c.read_cycles_per_call),
                f(c.read_cycles_min),
                f(c.user_refill_cycles_per_page),
                c.samples.len(),
                f(c.mean_ci95.map(|m| m.mean)),
                f(c.mean_ci95.map(|m| m.half_width)),
                f(c.welch_p),
                c.significant.map_or(String::new(), |b| b.to_string()),
                f(c.kernel_instructions_per_call),
                f(c.insn_mov_cr3_per_call),
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cc(config: &str, median: f64) -> CellConfig {
        CellConfig {
            config: config.into(),
            samples: vec![median],
            median,
            min: median,
            delta: None,
            overhead_pct: None,
            refill_per_page: None,
            tlb_flush_per_call: Some(1.0),
            kvm_pf_taken_per_call: None,
            kvm_exits_per_call: None,
            cr3_writes_per_call: None,
            kernel_instructions_per_call: None,
            insn_mov_cr3_per_call: None,
            read_cycles_per_call: None,
            read_cycles_min: Some(median),
            user_refill_cycles_per_page: None,
            significant: None,
            mean_ci95: None,
            welch_p: None,
        }
    }

    fn cell(wss: u64, spec: &str, pages: u64, base: f64, pti: f64) -> Cell {
        Cell {
            wss,
            touches_spec: spec.into(),
            touches: pages,
            pages,
            guest_words: String::new(),
            syscall_rate: None,
            configs: vec![cc("pti=off", base), cc("pti=on", pti)],
        }
    }

    fn report(cells: Vec<Cell>) -> SweepReport {
        SweepReport {
            schema: SCHEMA.into(),
            host: "h".into(),
            backend: "kvm".into(),
            workload: "getpid".into(),
            iterations: 1,
            cpus: 1,
            runs: 1,
            stride: 4096,
            wss_pages: "4k".into(),
            time_metric: "ns_per_call".into(),
            time_unit: "ns".into(),
            time_source: "host-clock".into(),
            configs: vec!["pti=off".into(), "pti=on".into()],
            omitted: vec![],
            cells,
            crossings: vec![],
            seconds: 0.0,
            environment: None,
        }
    }

    #[test]
    fn derived_figures() {
        let mut r = report(vec![
            cell(0, "-", 0, 1000.0, 1100.0),
            cell(1 << 20, "1x", 256, 2000.0, 2356.0),
            cell(1 << 20, "4x", 256, 8000.0, 8356.0),
        ]);
        r.derive();
        let c = &r.cells[1];
        assert_eq!(c.syscall_rate, Some(500_000.0));
        assert_eq!(c.configs[1].delta, Some(356.0));
        assert!((c.configs[1].overhead_pct.unwrap() - 17.8).abs() < 1e-9);
        // (356 - 100) / 256 pages.
        assert_eq!(c.configs[1].refill_per_page, Some(1.0));
        assert_eq!(r.cells[0].configs[1].refill_per_page, None);
        // read_cycles_min stands in as the medians in this test: (2356 - 2000) / 256.
        let u = c.configs[1].user_refill_cycles_per_page.unwrap();
        assert!((u - 356.0 / 256.0).abs() < 1e-9, "{u}");
        assert_eq!(r.cells[0].configs[1].user_refill_cycles_per_page, None);
        assert_eq!(r.cells[0].configs[0].delta, None);
        // 1M: 4.45 % at 125k/s, 17.8 % at 500k/s: 5 % crossed in between.
        let x5 = r
            .crossings
            .iter()
            .find(|x| x.wss == 1 << 20 && x.threshold_pct == 5.0)
            .unwrap();
        let rate = x5.measured_rate.unwrap();
        assert!((125_000.0..500_000.0).contains(&rate), "{rate}");
        // model: 0.05 / 356e-9 s.
        assert!((x5.model_rate.unwrap() - 0.05 / 356e-9).abs() < 1e-6);
        let x1 = r
            .crossings
            .iter()
            .find(|x| x.wss == 1 << 20 && x.threshold_pct == 1.0)
            .unwrap();
        assert_eq!(x1.measured_rate, None);
        assert!(
            x1.note.starts_with("above at every measured rate"),
            "{}",
            x1.note
        );
        let t = text(&r);
        assert!(
            t.contains("pti=on") && t.contains("17.8") && t.contains("1.00"),
            "{t}"
        );
        let c = csv(&r);
        assert_eq!(c.lines().count(), 1 + 3 * 2);
        let j: serde_json::Value = serde_json::from_str(&json(&r)).unwrap();
        assert_eq!(j["schema"], SCHEMA);
        assert_eq!(j["cells"][1]["configs"][1]["refill_per_page"], 1.0);
    }

    #[test]
    fn medians_and_formats() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        assert_eq!(fmt_size(64 << 10), "64K");
        assert_eq!(fmt_size(16 << 20), "16M");
        assert_eq!(fmt_size(10_000), "10000");
        assert_eq!(fmt_rate(1_500_000.0), "1.50M");
        assert_eq!(fmt_rate(35_000.0), "35.0k");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
    }
}
