//! The notes a Linux run's summary carries from its console: a timeout
//! after the figures, the port fallback of the phase marker, and what
//! became of a tick-free CPU.

use super::console::{line_value, loop_ticks, machine_line, SYMBOLS_WORD};
use crate::machine::RunOutcome;
use crate::report::note::{Note, PortMarkerReason};
use crate::spec::linux::LinuxGuest;

// Whether a run that `--timeout` stopped had measured already: the init
/// printed its `@result` line, every result right (`mismatches=0`), before
/// the deadline, so what ran out was what comes after it (the kernel
/// symbols for `--by-symbol`, the exit). Its figures stand: the note says
/// so; `None` for any other run.
pub fn measured_before_timeout(outcome: &RunOutcome, guest: &LinuxGuest) -> Option<Note> {
    let crate::machine::StopReason::Timeout { after_ms } = outcome.stop else {
        return None;
    };
    if guest.init_words.contains("workload=none") {
        return None;
    }
    let result = machine_line(outcome, ptiscope_abi::RESULT_PREFIX.trim_end())?;
    if line_value(result, "mismatches").is_some_and(|m| m != "0") {
        return None;
    }
    let by_symbol = outcome
        .cmdline
        .split_ascii_whitespace()
        .any(|w| w == SYMBOLS_WORD);
    Some(Note::MeasuredBeforeTimeout {
        after_ms,
        by_symbol,
    })
}

/// Whether the init had to mark its phase through the phase port with
/// `ioperm` (its `@marker channel=port` line: the kernel refused the
/// `/dev/mem` mapping of the marker page): then every return to user mode
/// of the measured tasks ran the kernel's TSS I/O-bitmap update, which an
/// unmodified process does not, and the note says so with the init's
/// reason (or that it was asked to, `--append ptiscope.marker=port`, or
/// that a 32-bit kernel on KVM keeps the port: linux-init's `marker`).
/// `None` for the marker page (`channel=mmio`, no cost) or no line.
pub(super) fn marker_note(outcome: &RunOutcome) -> Option<Note> {
    let line = machine_line(outcome, "@marker")?;
    if line_value(line, "channel")? != "port" {
        return None;
    }
    // Guest text: only a short reason of the init's own characters.
    let reason: String = line_value(line, "reason")
        .unwrap_or("unknown")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | ':' | '_' | '.' | '='))
        .take(48)
        .collect();
    let why = if reason.starts_with("asked:") {
        PortMarkerReason::Asked
    } else if reason.starts_with("kvm-i386") {
        PortMarkerReason::KvmI386
    } else {
        PortMarkerReason::MappingRefused { reason }
    };
    Some(Note::PortMarkers {
        why,
        port: ptiscope_abi::port::PHASE,
    })
}

/// What became of a tick-free CPU for the system-call loop (`--tick-free`,
/// or the user's own `nohz_full=`): where the init's `@cpu` line says the
/// loop ran. Only its numbers and known words are read (guest text).
pub(super) fn tick_free_note(outcome: &RunOutcome, guest: &LinuxGuest) -> Option<Note> {
    let line = machine_line(outcome, "@cpu");
    let value = |key: &str| line_value(line?, key);
    let pinned = value("pinned").and_then(|v| v.parse::<u32>().ok());
    let who = match guest.tick_free_cpu {
        Some(_) => "--tick-free",
        None => "nohz_full= in --append",
    };
    if line.is_none() && guest.tick_free_cpu.is_none() {
        return None;
    }
    Some(Note::TickFree {
        asked_by: who.into(),
        asked_cpu: guest.tick_free_cpu,
        cpu: pinned,
        reported: line.is_some(),
        dynticks: value("dynticks") == Some("yes"),
        ticks: loop_ticks(outcome),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linux::summary;
    use crate::linux::tests::{guest, outcome};
    use crate::observe::qemu_plugin::PluginOutput;
    use ptiscope_abi::options::PtiMode;

    #[test]
    fn the_tick_free_note_reads_the_inits_cpu_line() {
        let mut g = guest(PtiMode::On);
        let mut o = outcome(
            crate::machine::StopReason::GuestExit { status: 0 },
            &[],
            &[],
        );
        assert_eq!(tick_free_note(&o, &g), None, "neither asked nor pinned");
        g.tick_free_cpu = Some(1);
        let n = tick_free_note(&o, &g).unwrap().to_string();
        assert!(n.contains("did not say where"), "{n}");
        o.machine_lines = vec!["@cpu pinned=1 reason=nohz_full dynticks=yes".into()];
        let n = tick_free_note(&o, &g).unwrap().to_string();
        assert!(
            n.contains("ran alone on CPU 1") && n.contains("--tick-free"),
            "{n}"
        );
        assert!(n.contains("did not say how many"), "{n}");
        o.machine_lines.push("@ticks cpu=1 local_timer=0".into());
        let n = tick_free_note(&o, &g).unwrap().to_string();
        assert!(n.contains("no local timer interrupt"), "{n}");
        o.machine_lines[1] = "@ticks cpu=1 local_timer=3".into();
        let n = tick_free_note(&o, &g).unwrap().to_string();
        assert!(n.contains("3 local timer") && n.contains("up to 6"), "{n}");
        o.machine_lines = vec!["@cpu pinned=1 reason=nohz_full dynticks=no".into()];
        let n = tick_free_note(&o, &g).unwrap().to_string();
        assert!(n.contains("no full dynticks"), "{n}");
        o.machine_lines = vec!["@cpu pinned=none reason=\x1b[2J".into()];
        let n = tick_free_note(&o, &g).unwrap().to_string();
        assert!(n.contains("could not pin") && !n.contains('\x1b'), "{n}");
        g.tick_free_cpu = None;
        o.machine_lines = vec!["@cpu pinned=3 reason=nohz_full dynticks=yes".into()];
        let n = tick_free_note(&o, &g).unwrap().to_string();
        assert!(
            n.contains("nohz_full= in --append") && n.contains("CPU 3"),
            "{n}"
        );
    }

    #[test]
    fn the_marker_note_names_the_port_fallback_only() {
        let mut o = outcome(
            crate::machine::StopReason::GuestExit { status: 0 },
            &[],
            &[],
        );
        assert_eq!(marker_note(&o), None, "no @marker line");
        o.machine_lines = vec!["@marker channel=mmio addr=0xe0000000".into()];
        assert_eq!(marker_note(&o), None, "the marker page costs nothing");
        o.machine_lines = vec![
            "@marker channel=port port=0x600 io_bitmap=yes reason=mmap-dev-mem:1\x1b[2J".into(),
        ];
        let n = marker_note(&o).unwrap().to_string();
        assert!(
            n.contains("(mmap-dev-mem:12J)") && n.contains("tss_update_io_bitmap"),
            "{n}"
        );
        let s = summary(&o, &PluginOutput::Off, &guest(PtiMode::On), None);
        assert!(s.notes.iter().any(|m| m.to_string() == n), "{:?}", s.notes);
        o.machine_lines = vec![
            "@marker channel=port port=0x600 io_bitmap=yes reason=asked:ptiscope.marker=port"
                .into(),
        ];
        let n = marker_note(&o).unwrap().to_string();
        assert!(
            n.contains("as asked (--append ptiscope.marker=port)"),
            "{n}"
        );
        o.machine_lines = vec![
            "@marker channel=port port=0x600 io_bitmap=yes reason=kvm-i386:mmio-store-emulation"
                .into(),
        ];
        let n = marker_note(&o).unwrap().to_string();
        assert!(n.contains("a 32-bit kernel on KVM"), "{n}");
    }
}
