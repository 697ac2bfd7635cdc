//! What the guest's `@result` line says, and what the VMM asked for: the
//! summary of a run that has only the guest's word (the QEMU backend), the
//! per-call divisor read back from the command line the VMM wrote, and the
//! check of the one against the other.

use std::collections::BTreeMap;

use ptiscope_abi::telemetry::Counter;

use crate::machine::RunOutcome;
use crate::observe::qemu_plugin::PluginOutput;
use crate::report::note::{Divisor, Note};
use crate::report::{CrossCheck, Metric, RunRow, RunSummary, Source};
use ptiscope_abi::options::Workload;

/// `key=value` pairs of the guest's first `@result` line.
pub fn result_fields(outcome: &RunOutcome) -> BTreeMap<String, String> {
    outcome
        .machine_lines
        .iter()
        .find_map(|l| l.strip_prefix(ptiscope_abi::RESULT_PREFIX))
        .map(line_fields)
        .unwrap_or_default()
}

/// The `key=value` words of one of the guest's machine lines (`@result`,
/// `@fault`); other words are left out.
pub fn line_fields(line: &str) -> BTreeMap<String, String> {
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `@result` keys of the guest's phase counters and the report rows (the
/// telemetry counters' names) they fill.
const RESULT_ROWS: [(&str, Counter); 11] = [
    ("cr3_entry", Counter::Cr3Entry),
    ("cr3_exit", Counter::Cr3Exit),
    ("cr3_context_switch", Counter::Cr3ContextSwitch),
    ("cr3_other", Counter::Cr3Other),
    ("cr3_noflush", Counter::Cr3NoFlush),
    ("tlb_flushes", Counter::TlbFlushFull),
    ("invlpg", Counter::Invlpg),
    ("syscalls", Counter::Syscalls),
    ("page_faults", Counter::PageFaults),
    ("exceptions", Counter::Exceptions),
    ("context_switches", Counter::ContextSwitches),
];

/// The rows of a loop with a working set (`wss=`): the guest's TSC cycles
/// in its reads of the working set (RDTSC around each iteration's reads,
/// summed; per call over the N calls of the loop) and the fewest of one
/// iteration (already per call). Their PTI delta is the user-mode half of
/// the TLB refill, without the system call's time.
pub(super) fn working_set_rows(result: &BTreeMap<String, String>, iterations: u64) -> Vec<RunRow> {
    let num = |k: &str| {
        result
            .get(k)
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v >= 0.0)
    };
    let mut rows = Vec::new();
    if let Some(c) = num("read_cycles") {
        rows.push(RunRow {
            metric: Metric::new("read_cycles", "cycles", Source::Guest),
            total: c,
            per_iteration: (iterations > 0).then(|| c / iterations as f64),
        });
    }
    if let Some(m) = num("read_cycles_min") {
        rows.push(RunRow {
            metric: Metric::new("read_cycles_min", "cycles", Source::Guest),
            total: m,
            per_iteration: Some(m),
        });
    }
    rows
}

/// The summary of a run the host could not observe (`--backend qemu`):
/// `note`, the backend's word on its figures, first among the notes;
/// every row comes from the guest's `@result` line, whose counters cover
/// the measured phase (N iterations plus the end-marker call, as on KVM)
/// and whose `cycles` cover the loop alone (N calls).
pub fn summary_from_result(
    outcome: &RunOutcome,
    plugin: &PluginOutput,
    config: Vec<String>,
    note: Note,
) -> RunSummary {
    let result = result_fields(outcome);
    let num = |k: &str| result.get(k).and_then(|v| v.parse::<f64>().ok());
    let asked = requested(&outcome.cmdline);
    let (workload, iterations) = asked.unwrap_or((Workload::None, 0));
    let phased = !result.is_empty();
    let (divisor, iteration_name, divisor_note) = phase_divisor(workload, iterations);
    let calls = if phased && asked.is_some() {
        divisor
    } else {
        0
    };
    let mut s = RunSummary::new(config, phased.then(|| "workload".to_string()), calls);
    s.iteration_name = iteration_name.into();
    s.telemetry_checked = false;
    s.notes.push(note);
    if !phased {
        s.notes.push(Note::NoResultLine);
        super::plugin_rows::add_plugin_rows(&mut s, plugin, false, None, None, false);
        return s;
    }
    s.notes.push(match asked {
        Some(_) => divisor_note,
        None => Note::UnknownRequestedCount,
    });
    if let Some(c) = iterations_check(&result, asked) {
        s.cross_checks.push(c);
    }
    if let Some(c) = num("cycles") {
        s.rows.push(RunRow {
            metric: Metric::new("cycles", "cycles", Source::Guest),
            total: c,
            per_iteration: (calls > 0 && iterations > 0).then(|| c / iterations as f64),
        });
    }
    s.rows.extend(working_set_rows(&result, iterations));
    if let Some(v) = num("cr3_writes") {
        s.push(Metric::new("cr3_writes", "count", Source::Guest), v);
    }
    for (key, counter) in RESULT_ROWS {
        if let Some(v) = num(key) {
            s.push(Metric::new(counter.name(), "count", Source::Guest), v);
        }
    }
    let loop_workload =
        iteration_name == "call" && asked.is_some_and(|(w, _)| w != Workload::Poundsyscall);
    super::plugin_rows::add_plugin_rows(
        &mut s,
        plugin,
        true,
        num("cr3_writes"),
        num("syscalls"),
        loop_workload,
    );
    s
}

/// How a workload's measured phase relates to its `iterations`: the
/// divisor of per-iteration rates, what one iteration is called, and the
/// note that says so. The syscall loops (getpid, ...) mark their phase with
/// a syscall whose return and entry lie inside it: N + 1 round trips. For
/// sched-messaging an iteration is a message, and the phase (from before
/// the first sender runs until every worker is reaped) holds many other
/// syscalls and context switches besides: rates are per message.
pub(super) fn phase_divisor(workload: Workload, iterations: u64) -> (u64, &'static str, Note) {
    let (calls, name, divisor) = match workload {
        Workload::Poundsyscall => (iterations, "call", Divisor::PoundsyscallCalls),
        Workload::SchedMessaging => (iterations, "message", Divisor::Messages),
        _ => (iterations.saturating_add(1), "call", Divisor::Calls),
    };
    (
        calls,
        name,
        Note::RateDivisor {
            divisor,
            iterations,
            calls,
        },
    )
}

/// What the VMM asked the guest to run, read back from the command line it
/// wrote, with the guest's own parser and defaults (guest-core): the
/// workload and its count (iterations, messages for sched-messaging, the
/// calls of all threads for poundsyscall).
/// This, never the guest's `@result` word, divides host-observed counters.
/// `None` when the line is not one the ptiscope guest would accept (a
/// foreign kernel's own keys).
pub fn requested(cmdline: &str) -> Option<(Workload, u64)> {
    let c = guest_core::cmdline::parse(cmdline).ok()?;
    let n = match c.workload {
        Workload::SchedMessaging => c.messages(),
        // `iterations=` is per thread: every thread makes that many calls.
        Workload::Poundsyscall => c.threads.saturating_mul(c.iterations),
        _ => c.iterations,
    };
    Some((c.workload, n))
}

/// The guest's `@result iterations=` against what the VMM asked for: they
/// must be equal; a guest that says otherwise is reported, not believed.
pub(super) fn iterations_check(
    result: &BTreeMap<String, String>,
    asked: Option<(Workload, u64)>,
) -> Option<CrossCheck> {
    let (_, n) = asked?;
    let said = result.get("iterations")?;
    // A value that is not a number is a disagreement too (shown as -1).
    let guest = said.parse::<u64>().map_or(-1.0, |v| v as f64);
    Some(CrossCheck::new(
        "workload iterations (what the VMM asked for vs the guest's @result line)",
        ("requested_iterations", Source::Vmm, n as f64),
        ("iterations", guest),
        0.0,
    ))
}

/// The compare-table name of a run row's per-iteration rate.
pub fn rate_name(row: &str, unit: &str) -> String {
    match (row, unit) {
        ("elapsed", "ns") => "ns_per_call".into(),
        // A per-run size, not a rate (user_copy_kernel_kib).
        (_, "KiB") => row.into(),
        _ => format!("{row}_per_call"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_requested_count_comes_from_the_vmm_command_line() {
        assert_eq!(
            requested("workload=getpid iterations=1000 telemetry=0x7fff000"),
            Some((Workload::Getpid, 1000))
        );
        // The guest's defaults when the VMM gave no count.
        assert_eq!(
            requested("workload=getppid"),
            Some((Workload::Getppid, ptiscope_abi::options::DEFAULT_ITERATIONS))
        );
        assert_eq!(
            requested("workload=sched-messaging groups=2 loops=3"),
            Some((Workload::SchedMessaging, 2 * 20 * 20 * 3))
        );
        assert_eq!(requested("foreign=1"), None);
        let said = |n: &str| BTreeMap::from([("iterations".to_string(), n.to_string())]);
        let asked = Some((Workload::Getpid, 1000));
        assert!(iterations_check(&said("1000"), asked).unwrap().agrees);
        assert!(!iterations_check(&said("1"), asked).unwrap().agrees);
        assert!(!iterations_check(&said("lots"), asked).unwrap().agrees);
        assert!(iterations_check(&BTreeMap::new(), asked).is_none());
    }

    #[test]
    fn rate_names() {
        assert_eq!(rate_name("elapsed", "ns"), "ns_per_call");
        assert_eq!(rate_name("cr3_writes", "count"), "cr3_writes_per_call");
    }
}
