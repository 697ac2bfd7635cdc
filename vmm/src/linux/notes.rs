//! The notes a Linux run's summary carries from its console: a timeout
//! after the figures, the port fallback of the phase marker, and what
//! became of a tick-free CPU.

use super::console::{line_value, loop_ticks, machine_line, SYMBOLS_WORD};
use crate::machine::RunOutcome;
use crate::spec::linux::LinuxGuest;

/// Whether a run that `--timeout` stopped had measured already: the init
/// printed its `@result` line, every result right (`mismatches=0`), before
/// the deadline, so what ran out was what comes after it (the kernel
/// symbols for `--by-symbol`, the exit). Its figures stand: the note says
/// so; `None` for any other run.
pub fn measured_before_timeout(outcome: &RunOutcome, guest: &LinuxGuest) -> Option<String> {
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
    let symbols = outcome
        .cmdline
        .split_ascii_whitespace()
        .any(|w| w == SYMBOLS_WORD);
    Some(format!(
        "--timeout ({} s) stopped the guest after the init's @result line: the figures are \
         what it measured; its teardown{} did not finish (raise --timeout to let it)",
        after_ms as f64 / 1e3,
        if symbols {
            " (sending the kernel's symbols for --by-symbol, whose table may be missing)"
        } else {
            ""
        }
    ))
}

/// Whether the init had to mark its phase through the phase port with
/// `ioperm` (its `@marker channel=port` line: the kernel refused the
/// `/dev/mem` mapping of the marker page): then every return to user mode
/// of the measured tasks ran the kernel's TSS I/O-bitmap update, which an
/// unmodified process does not, and the note says so with the init's
/// reason (or that it was asked to, `--append ptiscope.marker=port`, or
/// that a 32-bit kernel on KVM keeps the port: linux-init's `marker`).
/// `None` for the marker page (`channel=mmio`, no cost) or no line.
pub(super) fn marker_note(outcome: &RunOutcome) -> Option<String> {
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
        "as asked (--append ptiscope.marker=port), the init".to_string()
    } else if reason.starts_with("kvm-i386") {
        "a 32-bit kernel on KVM: KVM completes an MMIO store by emulating it, and under \
         --backend nested a PAE guest's marker store never completed, so the init"
            .to_string()
    } else {
        format!(
            "the kernel refused the init's /dev/mem mapping of the marker page ({reason}), so it"
        )
    };
    Some(format!(
        "markers: {why} marked the phase through port {:#x} with ioperm: every return to user \
         mode of the measured tasks ran the kernel's I/O-bitmap update (tss_update_io_bitmap), \
         which a process without ioperm does not: it is in every call's kernel instructions \
         and time (not in KVM's exit, TLB-flush or page-fault counts)",
        ptiscope_abi::port::PHASE
    ))
}

/// What became of a tick-free CPU for the system-call loop (`--tick-free`,
/// or the user's own `nohz_full=`): where the init's `@cpu` line says the
/// loop ran. Only its numbers and known words are read (guest text).
pub(super) fn tick_free_note(outcome: &RunOutcome, guest: &LinuxGuest) -> Option<String> {
    let line = machine_line(outcome, "@cpu");
    let value = |key: &str| line_value(line?, key);
    let pinned = value("pinned").and_then(|v| v.parse::<u32>().ok());
    let who = match guest.tick_free_cpu {
        Some(_) => "--tick-free",
        None => "nohz_full= in --append",
    };
    match (line, pinned, value("dynticks")) {
        (None, ..) => guest.tick_free_cpu.map(|cpu| {
            format!(
                "tick-free: asked for CPU {cpu} ({who}), but the init did not say where the loop ran: timer interrupts may be in the counts"
            )
        }),
        (Some(_), Some(cpu), Some("yes")) => Some(match loop_ticks(outcome) {
            Some(0) => format!(
                "tick-free ({who}): the loop ran alone on CPU {cpu}, which the kernel keeps free of the scheduler tick (nohz_full), and the kernel counted no local timer interrupt there across the loop: none added CR3 writes to the calls'; the kernel's context tracking runs at each of its kernel entries"
            ),
            Some(n) => format!(
                "tick-free ({who}): the loop ran alone on CPU {cpu} (nohz_full), but the kernel counted {n} local timer interrupt(s) there across the loop: with PTI, up to {} of the CR3 writes are theirs",
                2 * n
            ),
            None => format!(
                "tick-free ({who}): the loop ran alone on CPU {cpu} (nohz_full); the init did not say how many timer interrupts it took there"
            ),
        }),
        (Some(_), Some(cpu), _) => Some(format!(
            "tick-free ({who}): the loop ran on CPU {cpu}, but the kernel log shows no full dynticks CPU (a kernel without CONFIG_NO_HZ_FULL ignores nohz_full=): timer interrupts may be in the counts"
        )),
        (Some(_), None, _) => Some(format!(
            "tick-free ({who}): the init could not pin the loop (its @cpu line is in the console): timer interrupts may be in the counts"
        )),
    }
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
        let n = tick_free_note(&o, &g).unwrap();
        assert!(n.contains("did not say where"), "{n}");
        o.machine_lines = vec!["@cpu pinned=1 reason=nohz_full dynticks=yes".into()];
        let n = tick_free_note(&o, &g).unwrap();
        assert!(
            n.contains("ran alone on CPU 1") && n.contains("--tick-free"),
            "{n}"
        );
        assert!(n.contains("did not say how many"), "{n}");
        o.machine_lines.push("@ticks cpu=1 local_timer=0".into());
        let n = tick_free_note(&o, &g).unwrap();
        assert!(n.contains("no local timer interrupt"), "{n}");
        o.machine_lines[1] = "@ticks cpu=1 local_timer=3".into();
        let n = tick_free_note(&o, &g).unwrap();
        assert!(n.contains("3 local timer") && n.contains("up to 6"), "{n}");
        o.machine_lines = vec!["@cpu pinned=1 reason=nohz_full dynticks=no".into()];
        let n = tick_free_note(&o, &g).unwrap();
        assert!(n.contains("no full dynticks"), "{n}");
        o.machine_lines = vec!["@cpu pinned=none reason=\x1b[2J".into()];
        let n = tick_free_note(&o, &g).unwrap();
        assert!(n.contains("could not pin") && !n.contains('\x1b'), "{n}");
        g.tick_free_cpu = None;
        o.machine_lines = vec!["@cpu pinned=3 reason=nohz_full dynticks=yes".into()];
        let n = tick_free_note(&o, &g).unwrap();
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
        let n = marker_note(&o).unwrap();
        assert!(
            n.contains("(mmap-dev-mem:12J)") && n.contains("tss_update_io_bitmap"),
            "{n}"
        );
        let s = summary(&o, &PluginOutput::Off, &guest(PtiMode::On), None);
        assert!(s.notes.contains(&n), "{:?}", s.notes);
        o.machine_lines = vec![
            "@marker channel=port port=0x600 io_bitmap=yes reason=asked:ptiscope.marker=port"
                .into(),
        ];
        let n = marker_note(&o).unwrap();
        assert!(
            n.contains("as asked (--append ptiscope.marker=port)"),
            "{n}"
        );
        o.machine_lines = vec![
            "@marker channel=port port=0x600 io_bitmap=yes reason=kvm-i386:mmio-store-emulation"
                .into(),
        ];
        let n = marker_note(&o).unwrap();
        assert!(n.contains("a 32-bit kernel on KVM"), "{n}");
    }
}
