//! The words ptiscope and the init share: the command-line word that asks
//! for the kernel's symbols, and what the console says back: the init's
//! machine lines (`@linux`, `@cpu`, `@ticks`, `@marker`) and their
//! `key=value` words, its banner, and the kernel's panic line.

use crate::machine::RunOutcome;

/// The kernel command-line word that asks the init for the kernel's text
/// symbols after the phase, and the QEMU backend for the plugin's
/// per-address counts and the isa-debugcon they come through
/// (`--by-symbol`; the init has the same word). A dotted parameter: Linux
/// neither passes it to the init's environment nor complains about it.
pub const SYMBOLS_WORD: &str = "ptiscope.syms=1";

/// The words after `tag` of the init's first machine line with that tag
/// (`@linux`, `@cpu`, `@ticks`).
pub(super) fn machine_line<'a>(outcome: &'a RunOutcome, tag: &str) -> Option<&'a str> {
    outcome
        .machine_lines
        .iter()
        .find_map(|l| l.strip_prefix(tag)?.strip_prefix(' '))
}

/// `key=`'s value among a machine line's words.
pub(super) fn line_value<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_ascii_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// The CPU the init's `@cpu` line says the loop ran on alone, without the
/// scheduler tick (`pinned=N ... dynticks=yes`); `None` otherwise.
pub(super) fn tick_free_cpu(outcome: &RunOutcome) -> Option<u32> {
    let line = machine_line(outcome, "@cpu")?;
    (line_value(line, "dynticks") == Some("yes"))
        .then(|| line_value(line, "pinned")?.parse().ok())
        .flatten()
}

/// The local timer interrupts the kernel counted on the loop's CPU across
/// the loop (the init's `@ticks` line).
pub(super) fn loop_ticks(outcome: &RunOutcome) -> Option<u64> {
    line_value(machine_line(outcome, "@ticks")?, "local_timer")?
        .parse()
        .ok()
}

/// The first console line that says the kernel panicked, if one does (the
/// QEMU backend keeps it at the head of the tail when the console went on
/// after it: a panic is found wherever it was).
pub fn kernel_panic(outcome: &RunOutcome) -> Option<&str> {
    outcome
        .console_tail
        .iter()
        .find(|l| l.contains("Kernel panic - not syncing"))
        .map(String::as_str)
}

/// Whether the init started (its banner).
pub fn init_started(outcome: &RunOutcome) -> bool {
    outcome
        .banner
        .as_deref()
        .is_some_and(|b| b.contains("linux-init"))
}
