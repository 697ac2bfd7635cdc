//! The ledger as text (one block per kernel, CPU model and workload, rows
//! the mitigations), JSON (every figure) and CSV (one line per row).

use serde::Serialize;

use super::model::{special_columns, Block, FailedBlock, Figure, Measure, Row, RowOutcome};

/// Everything one `ptiscope ledger` measured.
#[derive(Debug, Serialize)]
pub struct Ledger {
    /// `ptiscope.ledger/1`.
    pub schema: &'static str,
    /// Calls per boot.
    pub iterations: u64,
    /// The command's wall time, boots and all.
    pub wall_seconds: f64,
    /// The blocks measured.
    pub blocks: Vec<Block>,
    /// The blocks whose default boot failed.
    pub failed: Vec<FailedBlock>,
}

/// A per-call figure: whole numbers as such, else two decimals.
fn num(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        format!("{v:.2}")
    }
}

/// A difference, signed.
fn signed(v: f64) -> String {
    let n = num(v);
    if v > 0.0 && !n.starts_with('+') {
        format!("+{n}")
    } else {
        n
    }
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(n.saturating_sub(3)).collect();
        t.push_str("...");
        t
    }
}

/// The special instructions of a measure, per call, non-zero only.
fn specials(m: &Measure) -> String {
    let v: Vec<String> = m
        .special_names()
        .into_iter()
        .filter(|c| m.special_per_call(c) != 0.0)
        .map(|c| format!("{c} {}", num(m.special_per_call(c))))
        .collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// The kernel's words for a row, shortened.
fn states(r: &Row) -> String {
    let s: Vec<String> = r
        .states
        .iter()
        .map(|(f, t)| {
            if r.states.len() > 1 {
                format!("{f}: {t}")
            } else {
                t.clone()
            }
        })
        .collect();
    s.join(" | ")
}

fn row_line(r: &Row) -> (String, String, String, String, String) {
    let label = match r.group_note {
        Some(_) => format!("{} (group)", r.label),
        None => r.label.to_owned(),
    };
    let state = clip(&states(r), 44);
    match &r.outcome {
        RowOutcome::Measured { delta, .. } => {
            let syms: Vec<String> = delta
                .symbols
                .iter()
                .take(3)
                .map(|(s, d)| format!("{s} {}", signed(*d)))
                .collect();
            let more = delta.symbols.len().saturating_sub(3);
            let mut syms = syms.join(", ");
            if more > 0 {
                syms.push_str(&format!(" (+{more} more)"));
            }
            let sp: Vec<String> = delta
                .specials
                .iter()
                .map(|(c, d)| format!("{c} {}", signed(*d)))
                .collect();
            (
                label,
                state,
                signed(delta.kernel_instructions),
                syms,
                if sp.is_empty() {
                    "-".into()
                } else {
                    sp.join(", ")
                },
            )
        }
        RowOutcome::NoChange { .. } => (
            label,
            state,
            "0".into(),
            format!("{} changes nothing here", r.off),
            "-".into(),
        ),
        RowOutcome::NotEnabled => (
            label,
            state,
            "not enabled".into(),
            String::new(),
            String::new(),
        ),
        RowOutcome::NotMeasured => (
            label,
            state,
            "enabled".into(),
            "not measured (--mitigation)".into(),
            String::new(),
        ),
        RowOutcome::NoFile => (
            label,
            "(no vulnerabilities file)".into(),
            "-".into(),
            String::new(),
            String::new(),
        ),
        RowOutcome::Failed { error } => (
            label,
            state,
            "FAILED".into(),
            clip(error.lines().next().unwrap_or(""), 60),
            String::new(),
        ),
    }
}

/// One block's text.
fn block_text(b: &Block, out: &mut String) {
    let release = b.release.as_deref().unwrap_or("release unknown");
    let what = match (b.default.figure, b.default.exact) {
        (Figure::HostNs, _) => {
            "host-clock ns per call (or message) over the phase, with KVM's exits and the CR3 \
             writes it saw per call: NOT exact (the time is that KVM's: hardware time on a \
             hardware KVM, QEMU TCG's emulated time under --backend nested)"
        }
        (_, true) => "kernel instructions per call, exact",
        (_, false) => {
            "kernel instructions of the undisturbed system calls (context switches inside) per \
             message: NOT exact, they differ from boot to boot"
        }
    };
    let on = match b.default.figure {
        Figure::HostNs => format!("ptiscope's VMM on {}", b.kvm.as_deref().unwrap_or("KVM")),
        Figure::KernelInstructions => format!("QEMU TCG -cpu {}", b.cpu),
    };
    out.push_str(&format!(
        "Linux {release} ({}) on {on}, {}: {what}\n",
        b.kernel, b.workload
    ));
    let total = match &b.all_off {
        Ok(off) => format!(
            "{} with {}, so the mitigations cost {} per call",
            num(off.per_call()),
            super::plan::ALL_OFF,
            signed(b.default.per_call() - off.per_call())
        ),
        Err(e) => format!("the {} boot failed: {}", super::plan::ALL_OFF, clip(e, 80)),
    };
    out.push_str(&format!(
        "  default: {} per call ({} calls; special: {}); {total}\n",
        num(b.default.per_call()),
        b.default.calls,
        specials(&b.default),
    ));
    match &b.noise {
        Some(Ok(n)) => out.push_str(&format!(
            "  boot to boot: a second default boot differed by {} per call (the spread is at \
             least that); a row no larger (marked ~) is noise: read its special figures instead\n",
            num(*n)
        )),
        Some(Err(e)) => out.push_str(&format!(
            "  boot to boot: unknown (the second default boot failed: {}): read no row as exact\n",
            clip(e, 80)
        )),
        None => {}
    }
    let lines: Vec<_> = b
        .rows
        .iter()
        .map(|r| {
            let mut l = row_line(r);
            if let Some(c) = r.cost() {
                if c != 0.0 && b.within_noise(c) {
                    l.2 = format!("~{}", l.2);
                }
            }
            l
        })
        .collect();
    let w = |f: fn(&(String, String, String, String, String)) -> &String, min: usize| {
        lines
            .iter()
            .map(|l| f(l).chars().count())
            .max()
            .unwrap_or(0)
            .max(min)
    };
    let (w0, w1, w2, w3) = (
        w(|l| &l.0, 10),
        w(|l| &l.1, 11),
        w(|l| &l.2, 10),
        w(|l| &l.3, 11),
    );
    out.push_str(&format!(
        "  {:<w0$}  {:<w1$}  {:>w2$}  {:<w3$}  {}\n",
        "mitigation",
        "kernel says",
        match b.default.figure {
            Figure::HostNs => "ns/call",
            Figure::KernelInstructions => "insns/call",
        },
        "top symbols",
        "special/call"
    ));
    for l in &lines {
        out.push_str(
            format!(
                "  {:<w0$}  {:<w1$}  {:>w2$}  {:<w3$}  {}",
                l.0, l.1, l.2, l.3, l.4
            )
            .trim_end(),
        );
        out.push('\n');
    }
    if let Some(s) = &b.sum {
        let incomplete = if s.incomplete {
            " (a row failed or was not measured: the sum is incomplete)"
        } else {
            ""
        };
        if s.adds_up() {
            out.push_str(&format!(
                "  rows sum to {} = the {} total{incomplete}\n",
                signed(s.rows),
                super::plan::ALL_OFF
            ));
        } else {
            out.push_str(&format!(
                "  rows sum to {}, the {} total is {}: interaction {} per call \
                 (mitigations that share or add work together, or cost no row turns off){incomplete}\n",
                signed(s.rows),
                super::plan::ALL_OFF,
                signed(s.total),
                signed(s.interaction)
            ));
            if !b.default.exact {
                out.push_str("    (not exact: read it against the boot-to-boot line above)\n");
            }
            for (sym, keys) in &s.shared {
                out.push_str(&format!(
                    "    {sym} is removed by each of: {} (counted once in the total)\n",
                    keys.join(", ")
                ));
            }
        }
    }
    for r in &b.rows {
        if let (Some(note), RowOutcome::Measured { .. } | RowOutcome::NoChange { .. }) =
            (r.group_note, &r.outcome)
        {
            out.push_str(&format!("  note: {note} ({})\n", r.off));
        }
    }
    for u in &b.uncovered {
        out.push_str(&format!(
            "  not in the ledger's table (not measured): {u}\n"
        ));
    }
    out.push('\n');
}

/// The terminal text.
pub fn text(l: &Ledger) -> String {
    let mut out = String::new();
    out.push('\n');
    for b in &l.blocks {
        block_text(b, &mut out);
    }
    for f in &l.failed {
        out.push_str(&format!(
            "{} on -cpu {}, {}: the default boot FAILED: {}\n\n",
            f.kernel,
            f.cpu,
            f.workload,
            clip(&f.error, 200)
        ));
    }
    if l.blocks.iter().all(|b| b.default.figure == Figure::HostNs) && !l.blocks.is_empty() {
        out.push_str(&format!(
            "On a KVM nothing is exact: the host clock over the phase, and KVM's exits and the \
             CR3 writes it saw (shadow paging only) per call, interrupts included; `ns/call` is \
             the default boot minus the boot with that mitigation off, read against the \
             boot-to-boot line. {:.0} s wall.\n",
            l.wall_seconds
        ));
        return crate::cli::exit_code::escape_message(&out);
    }
    out.push_str(&format!(
        "A system-call loop's counts are exact (QEMU TCG plugin: the undisturbed calls of {} \
         per boot); sched-messaging's are per message and NOT exact (how many context switches \
         a message takes varies with the timer); `insns/call` is the default boot minus the \
         boot with that mitigation off; no time is shown (TCG's times are not a CPU's). \
         {:.0} s wall.\n",
        l.iterations, l.wall_seconds
    ));
    crate::cli::exit_code::escape_message(&out)
}

/// The JSON document.
pub fn json(l: &Ledger) -> String {
    serde_json::to_string_pretty(l).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}")) + "\n"
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// The CSV: one line per block and row (the block's default and total as
/// rows `default` and `all_off`), every special instruction a column.
pub fn csv(l: &Ledger) -> String {
    let mut out = String::from(
        "kernel,release,cpu,workload,row,status,off_params,kernel_says,calls,kernel_instructions_per_call,delta_per_call",
    );
    for c in special_columns() {
        out.push_str(&format!(",{c}_per_call,{c}_delta"));
    }
    out.push_str(",top_symbols,exact,noise_per_call\n");
    for b in &l.blocks {
        let head = [
            b.kernel.clone(),
            b.release.clone().unwrap_or_default(),
            b.cpu.clone(),
            b.workload.clone(),
        ];
        // Whether the block's figures are exact, and its boot-to-boot
        // spread where they are not (empty when unknown).
        let tail = [
            b.default.exact.to_string(),
            match &b.noise {
                Some(Ok(n)) => n.to_string(),
                _ if b.default.exact => "0".into(),
                _ => String::new(),
            },
        ];
        let mut line = |row: &str,
                        status: &str,
                        off: &str,
                        says: &str,
                        m: Option<&Measure>,
                        delta: Option<&super::model::Delta>,
                        syms: String| {
            let mut f: Vec<String> = head.to_vec();
            f.push(row.into());
            f.push(status.into());
            f.push(off.into());
            f.push(says.into());
            f.push(m.map_or(String::new(), |m| m.calls.to_string()));
            f.push(m.map_or(String::new(), |m| m.per_call().to_string()));
            f.push(delta.map_or(String::new(), |d| d.kernel_instructions.to_string()));
            for c in special_columns() {
                f.push(m.map_or(String::new(), |m| m.special_per_call(c).to_string()));
                f.push(delta.map_or(String::new(), |d| {
                    d.specials.get(c).copied().unwrap_or(0.0).to_string()
                }));
            }
            f.push(syms);
            f.extend(tail.iter().cloned());
            out.push_str(&f.iter().map(|x| csv_field(x)).collect::<Vec<_>>().join(","));
            out.push('\n');
        };
        line(
            "default",
            "measured",
            "",
            "",
            Some(&b.default),
            None,
            String::new(),
        );
        match &b.all_off {
            Ok(off) => {
                let d = super::model::Delta::between(&b.default, off);
                line(
                    "all_off",
                    "measured",
                    super::plan::ALL_OFF,
                    "",
                    Some(off),
                    Some(&d),
                    String::new(),
                );
            }
            Err(e) => line(
                "all_off",
                "failed",
                super::plan::ALL_OFF,
                e,
                None,
                None,
                String::new(),
            ),
        }
        for r in &b.rows {
            let says = states(r);
            match &r.outcome {
                RowOutcome::Measured { delta, off } => {
                    let syms: Vec<String> = delta
                        .symbols
                        .iter()
                        .map(|(s, d)| format!("{s}:{d}"))
                        .collect();
                    line(
                        r.key,
                        "measured",
                        r.off,
                        &says,
                        Some(off),
                        Some(delta),
                        syms.join(" "),
                    )
                }
                RowOutcome::NoChange { off } => line(
                    r.key,
                    "no_change",
                    r.off,
                    &says,
                    Some(off),
                    None,
                    String::new(),
                ),
                RowOutcome::NotMeasured => line(
                    r.key,
                    "not_measured",
                    r.off,
                    &says,
                    None,
                    None,
                    String::new(),
                ),
                RowOutcome::NotEnabled => line(
                    r.key,
                    "not_enabled",
                    r.off,
                    &says,
                    None,
                    None,
                    String::new(),
                ),
                RowOutcome::NoFile => line(r.key, "no_file", r.off, "", None, None, String::new()),
                RowOutcome::Failed { error } => {
                    line(r.key, "failed", r.off, error, None, None, String::new())
                }
            }
        }
    }
    out
}
