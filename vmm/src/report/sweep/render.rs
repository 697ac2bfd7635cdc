//! The sweep report rendered: the text table with its crossings, the JSON
//! document and the CSV (the SVG is in `report/sweep_svg.rs`).

use super::*;

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

/// The first columns of every table: working set and reads per call.
fn cell_key(cell: &Cell) -> String {
    let reads = if cell.wss == 0 {
        "-".to_string()
    } else {
        fmt_count(cell.touches)
    };
    format!("{:>6} {:>7}", fmt_size(cell.wss), reads)
}

/// A header over the configurations' columns, each `widths[i]` wide.
fn config_header(r: &SweepReport, widths: &[usize]) -> String {
    let mut s = format!("{:>6} {:>7} |", "wss", "reads");
    for (c, w) in r.configs.iter().zip(widths) {
        s.push_str(&format!(" {:>w$} |", column_name(c)));
    }
    s.push('\n');
    s
}

/// The human tables: time and overhead, the host's evidence, the
/// user-mode reads, and the crossings. Every table names a configuration's
/// column the same way ([`column_name`]) and a cell by the same two keys
/// (working set, reads per call).
pub fn text(r: &SweepReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let unit = &r.time_unit;
    let name_w = |i: usize, min: usize| column_name(&r.configs[i]).chars().count().max(min);
    let _ = writeln!(
        s,
        "{unit} per call [{}], median of {} runs per cell; ovh = overhead against {}, * where \
         significant (Welch, p < 0.05); refill per page derived, noise = inside the run-to-run spread",
        r.time_source,
        r.runs,
        r.configs.first().map_or("-".into(), |c| column_name(c)),
    );
    let widths: Vec<usize> = (0..r.configs.len())
        .map(|i| name_w(i, if i == 0 { 10 } else { 27 }))
        .collect();
    let _ = write!(
        s,
        "{:>6} {:>7} {:>6} {:>6} {:>7} |",
        "wss", "reads", "pages", "calls", "rate/s"
    );
    for (i, c) in r.configs.iter().enumerate() {
        let _ = write!(s, " {:>w$} |", column_name(c), w = widths[i]);
    }
    s.push('\n');
    let _ = write!(
        s,
        "{:>6} {:>7} {:>6} {:>6} {:>7} |",
        "", "/call", "/call", "/run", "(base)"
    );
    for (i, w) in widths.iter().enumerate() {
        if i == 0 {
            let _ = write!(s, " {:>w$} |", format!("{unit}/call"));
        } else {
            let _ = write!(
                s,
                " {:>w$} |",
                format!(
                    "{:>9} {:>7} {:>9}",
                    format!("{unit}/call"),
                    "ovh %",
                    format!("{unit}/page")
                )
            );
        }
    }
    s.push('\n');
    for cell in &r.cells {
        let _ = write!(
            s,
            "{} {:>6} {:>6} {:>7} |",
            cell_key(cell),
            cell.pages,
            cell.iterations,
            cell.syscall_rate.map_or("-".into(), fmt_rate)
        );
        for (i, c) in cell.configs.iter().enumerate() {
            let w = widths[i];
            if i == 0 {
                let _ = write!(s, " {:>w$.1} |", c.median);
            } else {
                // mmtests' mark: `*` after an overhead that is significant.
                let mark = match c.significant {
                    Some(true) => "*",
                    _ => " ",
                };
                let cell_text = format!(
                    "{:>9.1} {:>6}{mark} {:>9}",
                    c.median,
                    opt(c.overhead_pct, 1),
                    Refill::of(c, r.cr3_write_refill.hidden()).text()
                );
                let _ = write!(s, " {cell_text:>w$} |");
            }
        }
        s.push('\n');
    }
    if let RefillVisibility::NotVisible {
        probe_ns_per_page,
        threshold_ns_per_page,
    } = &r.cr3_write_refill
    {
        let _ = writeln!(
            s,
            "\nrefill per page: {} (cr3_write_refill not visible: {} ns/page, threshold {threshold_ns_per_page} ns/page; \
             `ptiscope probe` has the figures): a guest CR3 write costs user code no TLB refill here, \
             so no per-page figure is PTI's; the overheads and syscall rates are this host's",
            RefillVisibility::HIDDEN,
            opt(*probe_ns_per_page, 2),
        );
    }
    if let RefillVisibility::Disputed {
        probe_ns_per_page,
        threshold_ns_per_page,
        direct_cycles_per_page,
        wss,
        config,
    } = &r.cr3_write_refill
    {
        let _ = writeln!(
            s,
            "\nrefill per page: disputed: the probe's cr3_write_refill is not visible ({} ns/page, \
             threshold {threshold_ns_per_page} ns/page), yet this sweep's own user-mode reads of {} \
             took {direct_cycles_per_page:.2} cycles per page more with {} [guest RDTSC, outside the \
             runs' spread]: the per-page figures are shown, not hidden; read them as this host's, \
             and `ptiscope probe` again",
            opt(*probe_ns_per_page, 2),
            fmt_size(*wss),
            column_name(config),
        );
    }
    if r.cells
        .iter()
        .any(|c| c.configs.iter().any(|x| x.tlb_flush_per_call.is_some()))
    {
        let _ = writeln!(
            s,
            "\nhost evidence per call [kvm] (medians): tlb_flush / pf_taken / exits"
        );
        let widths: Vec<usize> = (0..r.configs.len()).map(|i| name_w(i, 20)).collect();
        s.push_str(&config_header(r, &widths));
        for cell in &r.cells {
            let _ = write!(s, "{} |", cell_key(cell));
            for (c, w) in cell.configs.iter().zip(&widths) {
                let t = format!(
                    "{:>5} {:>6} {:>6}",
                    opt(c.tlb_flush_per_call, 2),
                    opt(c.kvm_pf_taken_per_call, 2),
                    opt(c.kvm_exits_per_call, 2)
                );
                let _ = write!(s, " {t:>w$} |");
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
            "\nuser-mode reads of the working set [guest RDTSC]: fewest cycles of one iteration \
             (median of runs) / refill against {} (derived, cycles/page)",
            r.configs.first().map_or("-".into(), |c| column_name(c)),
        );
        let widths: Vec<usize> = (0..r.configs.len()).map(|i| name_w(i, 19)).collect();
        s.push_str(&config_header(r, &widths));
        for cell in r.cells.iter().filter(|c| c.wss > 0) {
            let _ = write!(s, "{} |", cell_key(cell));
            for (i, c) in cell.configs.iter().enumerate() {
                let w = widths[i];
                let t = if i == 0 {
                    opt(c.read_cycles_min, 0)
                } else {
                    format!(
                        "{:>10} {:>8}",
                        opt(c.read_cycles_min, 0),
                        Refill::user(c, &cell.configs[0], r.cr3_write_refill.hidden()).text()
                    )
                };
                let _ = write!(s, " {t:>w$} |");
            }
            s.push('\n');
        }
    }
    if !r.crossings.is_empty() {
        s.push_str(&crossings_table(r));
    }
    if r.crossings.is_empty() && r.time_unit != "ns" {
        let _ = writeln!(
            s,
            "\nno syscall rates and no 1 %/5 % crossings: the time per call is in {} [{}], not host-clock ns",
            r.time_unit, r.time_source
        );
    }
    s
}

/// One crossing as a table cell: the measured rate, or `~model` where no
/// two measured cells bracket the threshold, with `>`/`<` saying that the
/// overhead was above / below it at every measured rate.
fn crossing_cell(x: &Crossing) -> String {
    if let Some(m) = x.measured_rate {
        return fmt_rate(m);
    }
    let side = if x.note.starts_with("above") {
        ">"
    } else if x.note.starts_with("below") {
        "<"
    } else {
        ""
    };
    match x.model_rate {
        Some(m) => format!("{side}~{}", fmt_rate(m)),
        None => format!("{side}-"),
    }
}

/// The crossings as one table: a row per working set, per configuration
/// the 1 % and 5 % rates.
fn crossings_table(r: &SweepReport) -> String {
    let mut s = String::from(
        "\nsyscalls/s where the overhead crosses 1 % / 5 %: measured (interpolated between \
         cells), or ~model (threshold / delta per call) with > (<) where it was above (below) \
         at every measured rate\n",
    );
    let widths: Vec<usize> = (1..r.configs.len())
        .map(|i| column_name(&r.configs[i]).chars().count().max(17))
        .collect();
    s.push_str(&format!("{:>6} |", "wss"));
    for (i, w) in widths.iter().enumerate() {
        s.push_str(&format!(" {:>w$} |", column_name(&r.configs[i + 1])));
    }
    s.push('\n');
    s.push_str(&format!("{:>6} |", ""));
    for w in &widths {
        s.push_str(&format!(" {:>w$} |", format!("{:>8} {:>8}", "1 %", "5 %")));
    }
    s.push('\n');
    for wss in r.working_sets() {
        s.push_str(&format!("{:>6} |", fmt_size(wss)));
        for (i, w) in widths.iter().enumerate() {
            let config = &r.configs[i + 1];
            let at = |t: f64| {
                r.crossings
                    .iter()
                    .find(|x| x.wss == wss && &x.config == config && x.threshold_pct == t)
                    .map_or("-".into(), crossing_cell)
            };
            s.push_str(&format!(
                " {:>w$} |",
                format!("{:>8} {:>8}", at(1.0), at(5.0))
            ));
        }
        s.push('\n');
    }
    if r.cr3_write_refill.hidden() && r.working_sets().iter().any(|&w| w > 0) {
        s.push_str(&format!(
            "  wss > 0: {}; the crossings are this host's, not PTI's refill\n",
            RefillVisibility::HIDDEN
        ));
    }
    s
}

/// The JSON document (schema [`SCHEMA`]).
pub fn json(r: &SweepReport) -> String {
    serde_json::to_string_pretty(r).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
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
