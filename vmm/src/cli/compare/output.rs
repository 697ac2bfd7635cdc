//! The comparison's report from the runner's outcome: the answer, the
//! tables, the notes, `--against`, the files and `--fail-if`.

use super::durations::{render_durations, Durations};
use super::{nonzero_metrics, Against, RunsReport, Side};
use crate::backend::Backend;
use crate::cli::exit_code;
use crate::cli::CompareArgs;
use crate::output::OutputFile;
use crate::report::by_symbol::SymbolDiff;
use crate::report::mitigations::{side_differences, GuestMitigations};
use crate::report::threshold::SymbolCondition;
use crate::report::RunSummary;
use crate::report::{CompareTable, Condition};
use ptiscope_abi::options::Workload;

/// Rows of the by-symbol table in the terminal (--json has all).
const SYMBOL_ROWS: usize = 25;

/// Each side's guest mitigation state (a Linux side's kernel's
/// vulnerabilities files and PTI state, from its first run that reported
/// them) and what differs between the sides.
pub(super) struct SideMitigations {
    /// Baseline's and compare's; `None` for a side that is not Linux (or
    /// whose init said nothing).
    pub sides: [Option<GuestMitigations>; 2],
    /// Whether a side's runs reported different states (a kernel whose
    /// choice changed between boots: the first run's is shown).
    pub varied: [bool; 2],
    /// `meltdown: Not affected vs Mitigation: PTI`, ... (the header's
    /// `differs:` lines, and `sides_differ` in the JSON's environment).
    pub differences: Vec<String>,
}

impl SideMitigations {
    /// From both sides' runs.
    pub fn of(base: &[RunSummary], comp: &[RunSummary]) -> Self {
        let side = |runs: &[RunSummary]| {
            let mut states = runs.iter().filter_map(|r| r.guest_mitigations.as_ref());
            let first = states.next().cloned();
            let varied = states.any(|m| Some(m) != first.as_ref());
            (first, varied)
        };
        let ((b, bv), (c, cv)) = (side(base), side(comp));
        let differences = side_differences(b.as_ref(), c.as_ref());
        SideMitigations {
            sides: [b, c],
            varied: [bv, cv],
            differences,
        }
    }

    /// The header's lines: each side's state (once when both are the
    /// same), and the `differs:` lines; nothing without a Linux side.
    pub fn render_text(&self) -> String {
        let [b, c] = &self.sides;
        if b.is_none() && c.is_none() {
            return String::new();
        }
        let mut out = String::from(
            "  guest mitigations (each side's kernel: its /sys/devices/system/cpu/vulnerabilities, \
             PTI from its log):\n",
        );
        let side = |out: &mut String, label: &str, m: &Option<GuestMitigations>, varied: bool| {
            let mut lines = m.as_ref().map_or_else(
                || vec!["not reported (not a Linux guest, or its init said nothing)".to_string()],
                GuestMitigations::compact_lines,
            );
            if varied {
                lines[0] += " [its runs reported different states: the first run's]";
            }
            for (i, l) in lines.iter().enumerate() {
                let label = if i == 0 { label } else { "" };
                *out += &format!("    {label:<10}{l}\n");
            }
        };
        if b == c && self.varied == [false, false] {
            side(&mut out, "both:", b, false);
        } else {
            side(&mut out, "baseline:", b, self.varied[0]);
            side(&mut out, "compare:", c, self.varied[1]);
        }
        for d in &self.differences {
            out += &format!("  differs:   {d}\n");
        }
        // Guest text: the console made it terminal-safe; escaped again.
        out.lines()
            .map(|l| crate::cli::exit_code::escape_message(l) + "\n")
            .collect()
    }

    /// The JSON: `{"baseline": {...}|null, "compare": ..., "differences":
    /// [...], "varied": [b, c]}`; `None` without a Linux side.
    pub fn to_json(&self) -> Option<serde_json::Value> {
        let [b, c] = &self.sides;
        (b.is_some() || c.is_some()).then(|| {
            serde_json::json!({
                "baseline": b,
                "compare": c,
                "differences": self.differences,
                "varied_between_runs": { "baseline": self.varied[0], "compare": self.varied[1] },
            })
        })
    }
}

/// What the runs gave, ready to print and write.
pub(super) struct Report<'a> {
    /// Each side's guest mitigation state.
    pub mitigations: &'a SideMitigations,
    /// `--by-symbol`: the difference, or why there is none.
    pub by_symbol: Option<&'a Result<SymbolDiff, String>>,
    /// `--by-symbol-csv`'s file.
    pub symbol_csv: Option<&'a OutputFile>,
    /// `--fail-if symbol:...`.
    pub symbol_conditions: &'a [SymbolCondition],
    pub table: &'a CompareTable,
    pub dropped: &'a [String],
    pub runs: &'a RunsReport,
    pub durations: &'a [Durations; 2],
    pub disagreements: &'a [String],
    pub banner: Option<&'a str>,
    /// The failed run that made the result partial, if one did.
    pub failed_run: Option<&'a crate::report::end::FailedRun>,
    pub seconds: f64,
}

/// Prints the report, writes the files and evaluates `--fail-if`; returns
/// the exit code (0, [`exit_code::FAILED`] for a condition that holds,
/// [`exit_code::CANT_CREATE`] for a file that cannot be written).
#[allow(clippy::too_many_arguments)]
pub(super) fn print(
    args: &CompareArgs,
    backend: &dyn Backend,
    base: &Side,
    comp: &Side,
    r: &Report,
    earlier: Option<(std::path::PathBuf, CompareTable)>,
    files: &[Option<OutputFile>; 3],
    conditions: &[Condition],
) -> i32 {
    let table = r.table;
    if let Some(b) = r.banner {
        println!("{b}");
    }
    // The sides' mitigation state, known only once they ran: the header's
    // last lines.
    let m = r.mitigations.render_text();
    if !m.is_empty() {
        print!("{m}");
        println!();
    }
    // The answer first, then the compact table; the mmtests table (the
    // metrics non-zero somewhere) and the durations behind --mmtests.
    let per = match base.run.guest.workload {
        Some(Workload::SchedMessaging) => "message".to_owned(),
        w => format!("{} call", w.map_or("-", Workload::name)),
    };
    print!("{}", crate::report::answer::render_answer(table, &per));
    println!();
    print!("{}", crate::report::answer::render_table(table));
    if args.mmtests {
        println!();
        print!("{}", nonzero_metrics(table).render_text());
        println!();
        print!(
            "{}",
            render_durations(&base.label, &comp.label, r.durations)
        );
    }
    println!();
    println!(
        "  {}; {} runs in {:.1} s",
        r.runs.sentence(),
        2 * (r.runs.per_side + args.warmup),
        r.seconds
    );
    match r.by_symbol {
        Some(Ok(d)) => print!("{}", d.render_text(SYMBOL_ROWS)),
        Some(Err(e)) => println!("\n  by symbol: none: {e}"),
        None => {}
    }
    for d in r.dropped {
        println!("  note: metric {d}, left out of the table");
    }
    let profile = backend.profile();
    if let Some(note) = profile.no_cross_checks {
        println!("  {note}");
    } else if r.disagreements.is_empty() {
        println!("  cross-checks (host-observed vs guest-reported): all agree in every run");
    } else {
        println!("  cross-checks that DISAGREE:");
        for d in r.disagreements.iter().take(10) {
            println!("    {d}");
        }
    }
    if let Some(note) = profile.blind_spot {
        println!("  note: {note}");
    }
    let against = earlier.map(|(path, earlier)| {
        let a = Against::new(&path, &earlier, table);
        print!("{}", a.render_text());
        for d in &a.environment_differences {
            say!("ptiscope compare: warning: --against: the environment differs: {d}");
        }
        if a.environment_missing {
            say!(
                "ptiscope compare: warning: --against: {} records no environment; \
                 cannot tell whether it came from the same host and build",
                path.display()
            );
        }
        a
    });

    let [json_file, csv_file, svg_file] = files;
    let mut code = 0;
    if let Some(f) = json_file {
        let mut doc = json_text(
            table,
            r.durations,
            r.runs,
            against.as_ref(),
            r.by_symbol,
            r.mitigations,
        );
        if let Some(b) = r.banner {
            doc = json_with_partial(doc, b, r.failed_run);
        }
        code = code.max(write_file("compare", f, &doc));
    }
    if let Some(f) = svg_file {
        let doc =
            crate::cli::partial::svg_with_banner(crate::report::plot::compare_svg(table), r.banner);
        code = code.max(write_file("compare", f, &doc));
    }
    if let Some(f) = csv_file {
        let doc = crate::cli::partial::csv_with_banner(table.to_csv(), r.banner);
        code = code.max(write_file("compare", f, &doc));
    }
    if let Some(f) = r.symbol_csv {
        match r.by_symbol {
            Some(Ok(d)) => {
                let doc = crate::cli::partial::csv_with_banner(d.to_csv(), r.banner);
                code = code.max(write_file("compare", f, &doc));
            }
            // Why there is no table was said with the report; the file is
            // left as it was opened (empty) rather than written half.
            _ => say!("ptiscope compare: --by-symbol-csv: nothing written (no by-symbol table)"),
        }
    }
    for c in r.symbol_conditions {
        match r.by_symbol {
            Some(Ok(d)) => {
                let (holds, v, row) = c.evaluate(d);
                let sides = row.map_or(" (the symbol ran on neither side)".to_string(), |x| {
                    format!(
                        " (per call: baseline {}, compare {})",
                        x.baseline, x.compare
                    )
                });
                say!(
                    "ptiscope compare: --fail-if {} {} (value {v}){sides}",
                    c.text(),
                    if holds { "holds" } else { "does not hold" }
                );
                if holds {
                    code = code.max(exit_code::FAILED);
                }
            }
            Some(Err(e)) => {
                say!(
                    "ptiscope compare: --fail-if {} cannot be evaluated: {e}",
                    c.text()
                );
                code = code.max(exit_code::FAILED);
            }
            None => {}
        }
    }
    for c in conditions {
        match c.evaluate(table) {
            Ok(ev) if ev.triggered => {
                say!(
                    "ptiscope compare: --fail-if {} holds (value {})",
                    ev.condition,
                    ev.value
                );
                code = code.max(exit_code::FAILED);
            }
            Ok(ev) => say!(
                "ptiscope compare: --fail-if {} does not hold (value {})",
                ev.condition,
                ev.value
            ),
            Err(e) => {
                say!("ptiscope compare: --fail-if cannot be evaluated: {e}");
                code = code.max(exit_code::FAILED);
            }
        }
    }
    code
}

/// A compare document with `"partial": {"reason": banner}`, and the run
/// that failed, if one did (`run`: how it ended, as data).
fn json_with_partial(
    doc: String,
    banner: &str,
    failed_run: Option<&crate::report::end::FailedRun>,
) -> String {
    match serde_json::from_str::<serde_json::Value>(&doc) {
        Ok(serde_json::Value::Object(mut m)) => {
            let mut partial = serde_json::json!({ "reason": banner });
            if let Some(run) = failed_run {
                partial["run"] = serde_json::json!(run);
            }
            m.insert("partial".into(), partial);
            serde_json::to_string_pretty(&m).unwrap_or(doc)
        }
        _ => doc,
    }
}

fn json_text(
    t: &CompareTable,
    durations: &[Durations; 2],
    runs: &RunsReport,
    against: Option<&Against>,
    by_symbol: Option<&Result<SymbolDiff, String>>,
    mitigations: &SideMitigations,
) -> String {
    let mut v = t.to_json();
    if let Some(o) = v.as_object_mut() {
        if let Some(m) = mitigations.to_json() {
            o.insert("guest_mitigations".into(), m);
        }
        match by_symbol {
            Some(Ok(d)) => {
                o.insert(
                    "by_symbol".into(),
                    serde_json::to_value(&d.rows).unwrap_or_default(),
                );
                o.insert(
                    "by_symbol_summary".into(),
                    serde_json::json!({
                        "baseline_kernel_instructions_per_call": d.baseline_total,
                        "compare_kernel_instructions_per_call": d.compare_total,
                        "zero_rows": d.zero_rows,
                        "identical_runs": d.identical_runs,
                        "baseline_runs": d.baseline_runs,
                        "compare_runs": d.compare_runs,
                    }),
                );
            }
            Some(Err(e)) => {
                o.insert("by_symbol_error".into(), serde_json::json!(e));
            }
            None => {}
        }
        o.insert("answer".into(), crate::report::answer::to_json(t));
        // What the times are on this backend (the answer's time lines carry it too).
        let basis = crate::report::environment::time_basis(t.environment.as_ref());
        o.insert(
            "time_basis".into(),
            serde_json::json!({ "key": basis.key(), "label": basis.label() }),
        );
        o.insert(
            "durations".into(),
            serde_json::json!({ "baseline": durations[0], "compare": durations[1] }),
        );
        o.insert(
            "runs".into(),
            serde_json::to_value(runs).unwrap_or_default(),
        );
        if let Some(a) = against {
            o.insert("against".into(), a.to_json());
        }
    }
    serde_json::to_string_pretty(&v).unwrap_or_else(|_| "null".into())
}

/// Writes one output file; the exit code of the write (0 or
/// [`exit_code::CANT_CREATE`], the error said on stderr under `command`).
pub(crate) fn write_file(command: &str, f: &OutputFile, text: &str) -> i32 {
    match f.write_document(text) {
        Ok(()) => 0,
        Err(e) => {
            say!("ptiscope {command}: {e}");
            exit_code::CANT_CREATE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(lines: &[&str]) -> RunSummary {
        let mut s = RunSummary::new(Vec::new(), Some("workload".into()), 10);
        s.guest_mitigations = crate::linux::mitigations::parse(lines.iter().copied());
        s
    }

    const MAX: &[&str] = &[
        "@linux release=6.1 arch=x86_64 pti=off asked_pti=auto",
        "@vuln meltdown Not affected",
        "@vulns files=1 shown=1",
    ];
    const SKYLAKE: &[&str] = &[
        "@linux release=6.1 arch=x86_64 pti=on asked_pti=auto",
        "@vuln meltdown Mitigation: PTI",
        "@vulns files=1 shown=1",
    ];

    #[test]
    fn each_side_is_shown_with_what_differs() {
        let m = SideMitigations::of(&[run(MAX), run(MAX)], &[run(SKYLAKE)]);
        assert_eq!(
            m.differences,
            [
                "PTI (kernel log): off vs on",
                "meltdown: Not affected vs Mitigation: PTI"
            ]
        );
        let text = m.render_text();
        assert!(
            text.contains(
                "    baseline: PTI off (pti= not set: the kernel's choice); not affected: 1 of 1\n"
            ) && text.contains(
                "    compare:  PTI on (pti= not set: the kernel's choice); not affected: 0 of 1\n"
            ) && text.contains("              mitigated: meltdown (PTI)\n")
                && text.contains("  differs:   meltdown: Not affected vs Mitigation: PTI\n"),
            "{text}"
        );
        let v = m.to_json().unwrap();
        assert_eq!(
            v["compare"]["vulnerabilities"]["meltdown"]["mitigation"],
            "PTI"
        );
        assert_eq!(
            v["differences"][1],
            "meltdown: Not affected vs Mitigation: PTI"
        );

        // The same on both sides: once, nothing differs.
        let same = SideMitigations::of(&[run(MAX)], &[run(MAX)]);
        assert!(same.differences.is_empty());
        assert!(same.render_text().contains("    both:     PTI off"));
        assert!(!same.render_text().contains("differs:"));

        // A side whose runs disagree says so; the first run's is shown.
        let varied = SideMitigations::of(&[run(MAX), run(SKYLAKE)], &[run(MAX)]);
        assert_eq!(varied.varied, [true, false]);
        assert!(varied.render_text().contains("reported different states"));
        assert!(varied.differences.is_empty());

        // No Linux side: nothing printed, no JSON key.
        let none = SideMitigations::of(&[run(&[])], &[run(&[])]);
        assert_eq!(none.render_text(), "");
        assert!(none.to_json().is_none());
    }
}
