//! Real Linux kernels as guests (`--linux`).
//!
//! A Linux run boots a kernel the user names (`--linux debian-amd64`,
//! `--linux debian-686-pae` from the cache `ptiscope linux fetch` fills, or
//! `--linux PATH` to a bzImage or PVH vmlinux) with an initramfs packed in
//! memory around ptiscope's static init (`linux-init/`), which runs the
//! workload between the companion guest's phase markers and prints the same
//! `@result` line. The run is settled below the report layer, in
//! [`crate::preflight::linux`] (the image read and recognised, `--arch`
//! checked against it, the entry and the command line written, the PTI
//! request checked against the kernel's configuration), and its items are
//! named from there; the QEMU backend then boots it
//! ([`crate::backend::qemu`]). This module is what comes after: the PTI
//! checks, how far the kernel got, and the run's summary.
//!
//! PTI is checked twice: the init reads the kernel log (the
//! `@linux ... pti=` line, [`guest_pti`]), and a host observer's count of
//! CR3 writes per system call must agree ([`check_pti`], fed by a
//! [`HostPhaseObservation`] from whatever watched the guest: a QEMU TCG
//! plugin, or KVM's tlb_flush under shadow paging). Until such an observer
//! exists the host half is reported as not available, never as agreement.
//!
//! It sits above `report` (its summary is a `RunSummary`) and below
//! `backend` and `cli`; nothing below `report` imports it.

pub mod mitigations;
pub mod symbols;

use ptiscope_abi::options::{PtiMode, Workload};

use crate::machine::RunOutcome;
use crate::observe::qemu_plugin::PluginOutput;
use crate::report::{Metric, RunSummary, Source};
use crate::spec::linux::LinuxGuest;

/// The kernel command-line word that asks the init for the kernel's text
/// symbols after the phase, and the QEMU backend for the plugin's
/// per-address counts and the isa-debugcon they come through
/// (`--by-symbol`; the init has the same word). A dotted parameter: Linux
/// neither passes it to the init's environment nor complains about it.
pub const SYMBOLS_WORD: &str = "ptiscope.syms=1";

/// The phase's undisturbed calls' kernel instructions by symbol, from the
/// plugin's file of a `--by-symbol` run; `Err` says why there are none.
/// The rows sum to the phase's `kernel_instructions` (checked: a run whose
/// per-address counts do not add up, e.g. another vCPU in a call across a
/// phase marker, gives no rows rather than rows that mislead).
pub fn by_symbol(
    outcome: &RunOutcome,
    plugin: &PluginOutput,
    calls: u64,
) -> Result<crate::report::by_symbol::BySymbol, String> {
    use crate::observe::qemu_plugin::PluginReport;
    let PluginOutput::File(bytes) = plugin else {
        return Err("the QEMU plugin wrote no file".into());
    };
    let report = PluginReport::parse(bytes).map_err(|e| e.to_string())?;
    let phase = report.linux_phase().map_err(|e| e.to_string())?;
    let total = phase.delta.total();
    let Some(pcs) = &report.call_pcs else {
        return Err("the plugin counted no addresses (it was not asked to)".into());
    };
    let symbol_line = outcome
        .machine_lines
        .iter()
        .find(|l| l.starts_with("@symbols "));
    let Some((lines, dropped)) = &report.symbols else {
        return Err(format!(
            "no kernel symbols reached the host (the init said: {})",
            symbol_line.map_or("nothing", String::as_str)
        ));
    };
    let table = symbols::SymbolTable::parse(lines.iter().map(String::as_str));
    if table.symbols.is_empty() {
        return Err(format!(
            "the kernel's symbol table is empty ({} lines, {} hidden by kptr_restrict, {} \
             unreadable, {} dropped by the plugin; the init said: {})",
            lines.len(),
            table.hidden,
            table.bad_lines,
            dropped,
            symbol_line.map_or("nothing", String::as_str)
        ));
    }
    let rows = table.attribute(pcs);
    let sum: u64 = rows.iter().map(|r| r.instructions).sum();
    let kernel = total.call_kernel_insns();
    if sum != kernel {
        return Err(format!(
            "the per-address counts sum to {sum} instructions, the phase's kernel_instructions \
             to {kernel} (a system call on another vCPU ran across a phase marker?): not shown"
        ));
    }
    let apart = total.get(crate::observe::qemu_plugin::PluginCounter::CallsOther);
    Ok(crate::report::by_symbol::BySymbol {
        calls: calls.saturating_sub(apart),
        kernel_instructions: kernel,
        symbols: rows,
        table_symbols: table.symbols.len() as u64,
    })
}

/// What the init read from the kernel log: `Some(true)` when it has
/// "Kernel/User page tables isolation: enabled" (its `@linux` line).
pub fn guest_pti(outcome: &RunOutcome) -> Option<bool> {
    line_value(machine_line(outcome, "@linux")?, "pti").map(|v| v == "on")
}

/// What a host-side observer saw during the measured phase: the seam for
/// the QEMU TCG plugin (host-observed CR3 writes and system calls) or
/// KVM's statistics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostPhaseObservation {
    /// Who observed (`qemu-plugin`, `kvm`).
    pub source: &'static str,
    /// System calls entered in the phase.
    pub syscalls: u64,
    /// MOV-to-CR3 in the phase.
    pub cr3_writes: u64,
    /// Kernel-mode instructions in the phase, if counted.
    pub kernel_instructions: Option<u64>,
}

/// The QEMU plugin's view of a Linux run's phase (between the init's two
/// user-mode marker writes, `observe::qemu_plugin::PluginReport::linux_phase`),
/// for the host-side PTI check; `None` without the plugin (`--no-plugin`,
/// the KVM backend), when its file gave no phase (the summary's notes say
/// why), or for sched-messaging, whose context switches between processes
/// write CR3 too (with or without PTI), so that its CR3 writes per system
/// call say nothing exact about PTI: only the system-call loops and
/// poundsyscall (threads of one process) are checked.
pub fn host_observation(plugin: &PluginOutput, guest: &LinuxGuest) -> Option<HostPhaseObservation> {
    use crate::observe::qemu_plugin::{PluginCounter, PluginReport};
    if guest
        .asked()
        .is_none_or(|c| c.workload == Workload::SchedMessaging)
    {
        return None;
    }
    let PluginOutput::File(bytes) = plugin else {
        return None;
    };
    let total = PluginReport::parse(bytes)
        .ok()?
        .linux_phase()
        .ok()?
        .delta
        .total();
    Some(HostPhaseObservation {
        source: "qemu-plugin",
        syscalls: total.syscall_entries(),
        cr3_writes: total.get(PluginCounter::Cr3Writes),
        kernel_instructions: Some(total.get(PluginCounter::KernelInsns)),
    })
}

/// The calls a Linux run's phase made, as the init counts them: its
/// iterations, all threads' for poundsyscall, messages for sched-messaging.
fn phase_calls(guest: &LinuxGuest) -> u64 {
    guest.asked().as_ref().map_or(0, |c| match c.workload {
        Workload::SchedMessaging => c.messages(),
        Workload::Poundsyscall => c.threads.saturating_mul(c.iterations),
        _ => c.iterations,
    })
}

/// KVM's view of a Linux run's phase on ptiscope's VMM, where KVM sees the
/// guest's CR3 writes: under shadow paging KVM intercepts each one, and
/// without PCID each flushes, so its `tlb_flush` statistic over the phase
/// counts them (ptiscope's own guest, which counts its writes itself, gives
/// exactly as many: 4,002 = 4,002 for 2,001 getpid calls with PTI under
/// `--backend nested --nested-paging shadow`). `vmm` is the host-side
/// observer's summary of the run. `None` under nested paging (NPT/EPT:
/// KVM sees no CR3 write), when the init reports PCID on (a write that
/// keeps the TLB is no flush), without a phase, or for sched-messaging
/// (as [`host_observation`]). The system calls are the init's count of
/// its calls: KVM does not see system calls.
pub fn kvm_observation(
    outcome: &RunOutcome,
    guest: &LinuxGuest,
    vmm: &RunSummary,
    sees_cr3_writes: bool,
) -> Option<HostPhaseObservation> {
    let asked = guest.asked()?;
    if !sees_cr3_writes || asked.workload == Workload::SchedMessaging {
        return None;
    }
    let result = crate::report::result_fields(outcome);
    if result.get("pcid").is_none_or(|p| p != "off") {
        return None;
    }
    vmm.phase.as_ref()?;
    // A loop alone on a tick-free CPU: that vCPU's flushes are its calls'
    // (the other vCPU's, the kernel's housekeeping, are not the loop's).
    let (flushes, source) =
        match tick_free_cpu(outcome).and_then(|cpu| vmm.row(&format!("tlb_flush_vcpu{cpu}"))) {
            Some(r) => (r, "kvm tlb_flush of the loop's vCPU, shadow paging"),
            None => (vmm.row("tlb_flush")?, "kvm tlb_flush, shadow paging"),
        };
    if flushes.metric.source != Source::Kvm {
        return None;
    }
    Some(HostPhaseObservation {
        source,
        syscalls: phase_calls(guest),
        cr3_writes: flushes.total as u64,
        kernel_instructions: None,
    })
}

/// The summary of a Linux run on ptiscope's VMM (`--backend kvm`, and
/// inside `--backend nested`): the init's summary ([`summary`]) with the
/// host observer's rows ([`add_vmm_rows`]), PTI's state checked against
/// KVM's CR3 count where KVM sees CR3 writes ([`kvm_observation`]), which
/// is then the `[kvm]` `cr3_writes` row. Where KVM does not see them,
/// under `--backend nested` the outer QEMU's plugin does (`outer`, its
/// counts of this run's guest: `observe::outer_plugin`): its rows are
/// added as under `--backend qemu` and it is the host side of the PTI
/// check. Also returns the observation, for [`crate::cli::linux`]'s
/// verdict on the run.
pub fn summary_on_vmm(
    outcome: &RunOutcome,
    guest: &LinuxGuest,
    vmm: &RunSummary,
    sees_cr3_writes: bool,
    outer: &PluginOutput,
) -> (RunSummary, Option<HostPhaseObservation>) {
    let kvm = kvm_observation(outcome, guest, vmm, sees_cr3_writes);
    let host = kvm.or_else(|| host_observation(outer, guest));
    let mut s = summary(outcome, outer, guest, host.as_ref());
    if !matches!(outer, PluginOutput::Off) {
        s.notes.push(
            "[qemu-plugin] rows under --backend nested: the outer QEMU's plugin counted only what \
             its SVM ran in guest mode (this Linux), none of the inner Linux's or the VMM's \
             instructions"
                .into(),
        );
    }
    add_vmm_rows(&mut s, vmm);
    if let (Some(h), true) = (&kvm, s.phase.is_some()) {
        s.push(
            Metric::new("cr3_writes", "count", Source::Kvm),
            h.cr3_writes as f64,
        );
    }
    (s, host)
}

/// Something that can watch a Linux run from the host and report its
/// measured phase (implemented by the QEMU plugin's parser when it lands).
pub trait HostObserver {
    /// The phase's observation, if the observer saw one.
    fn phase(&self, outcome: &RunOutcome) -> Option<HostPhaseObservation>;
}

/// The verdict of the PTI checks.
#[derive(Debug, Clone, PartialEq)]
pub struct PtiVerdict {
    /// PTI as the kernel log says.
    pub enabled: bool,
    /// The host's CR3 writes per system call, if a host observer ran.
    pub host_cr3_per_syscall: Option<f64>,
}

/// Checks PTI's state: what was asked, what the kernel log says, and (if a
/// host observer ran) what the host saw. A kernel asked for pti=on without
/// PTI, or a host count that disagrees with the log, is an error: never a
/// PTI result of 0.
pub fn check_pti(
    asked: PtiMode,
    guest_log: Option<bool>,
    host: Option<&HostPhaseObservation>,
) -> Result<PtiVerdict, String> {
    let Some(enabled) = guest_log else {
        return Err("the init did not report PTI's state (no @linux line): the run is not a ptiscope Linux run, or it stopped before the init read the kernel log".into());
    };
    match (asked, enabled) {
        (PtiMode::On, false) => {
            return Err("pti=on was asked, but the kernel log has no \"Kernel/User page tables isolation: enabled\": this kernel did not enable PTI (built without CONFIG_MITIGATION_PAGE_TABLE_ISOLATION, or CONFIG_PAGE_TABLE_ISOLATION before Linux 6.9?)".into())
        }
        (PtiMode::Off, true) => {
            return Err("pti=off was asked, but the kernel log says PTI is enabled".into())
        }
        _ => {}
    }
    let per = host.and_then(|h| (h.syscalls > 0).then(|| h.cr3_writes as f64 / h.syscalls as f64));
    if let (Some(h), Some(p)) = (host, per) {
        // With PTI each system call writes CR3 twice (entry and exit);
        // without it, never. Context switches add a few; the middle is
        // neither.
        let host_on = p >= 1.5;
        let host_off = p < 0.5;
        if (enabled && !host_on) || (!enabled && !host_off) {
            return Err(format!(
                "the kernel log says PTI is {}, but the host ({}) saw {p:.2} CR3 writes per system call ({} / {}): the two checks disagree",
                if enabled { "on" } else { "off" },
                h.source,
                h.cr3_writes,
                h.syscalls
            ));
        }
    }
    Ok(PtiVerdict {
        enabled,
        host_cr3_per_syscall: per,
    })
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

/// The summary of a Linux run, from the init's `@result` line: per-call
/// rates divide by the calls the init made (`iterations`; messages for
/// sched-messaging; all threads' calls for poundsyscall) — its phase is
/// bracketed by port writes, not by a system call.
/// `host` is the host observer's view of the phase, if one ran.
pub fn summary(
    outcome: &RunOutcome,
    plugin: &PluginOutput,
    guest: &LinuxGuest,
    host: Option<&HostPhaseObservation>,
) -> RunSummary {
    let result = crate::report::result_fields(outcome);
    let num = |k: &str| result.get(k).and_then(|v| v.parse::<f64>().ok());
    let asked = guest.asked();
    let calls = phase_calls(guest);
    let mut config: Vec<String> = guest
        .init_words
        .split_whitespace()
        .map(String::from)
        .collect();
    config.push(format!("linux={}", guest.arch.name()));
    if let Some(cpu) = guest.tick_free_cpu {
        config.push(format!("tick_free=cpu{cpu}"));
    }
    if let Some(r) = result.get("release") {
        config.push(format!("release={r}"));
    }
    let phased = !result.is_empty();
    let mut s = RunSummary::new(config, phased.then(|| "workload".to_string()), calls);
    s.iteration_name = if asked
        .as_ref()
        .is_some_and(|c| c.workload == Workload::SchedMessaging)
    {
        "message".into()
    } else {
        "call".into()
    };
    s.telemetry_checked = false;
    s.telemetry_initialized = false;
    s.guest_mitigations = mitigations::guest_mitigations(outcome);
    s.notes.push(format!(
        "Linux guest ({}, {}) under QEMU TCG with ptiscope's init: [guest] figures are the \
         init's @result line, [qemu-plugin] ones counted by ptiscope's TCG plugin; per-call \
         rates divide by the {calls} {}s of the phase, which the init's marker writes bracket",
        guest.arch.name(),
        guest.version.as_deref().unwrap_or("version unknown"),
        s.iteration_name
    ));
    match check_pti(guest.pti, guest_pti(outcome), host) {
        Ok(v) => s.notes.push(format!(
            "PTI {} (the kernel log, read by the init); {}",
            if v.enabled { "enabled" } else { "not enabled" },
            match (host, v.host_cr3_per_syscall) {
                (Some(h), Some(p)) => format!(
                    "the host ({}) agrees: {p:.2} CR3 writes per system call",
                    h.source
                ),
                _ if asked
                    .as_ref()
                    .is_some_and(|c| c.workload == Workload::SchedMessaging) =>
                {
                    "no host-side check for sched-messaging: its context switches between \
                     processes write CR3 with or without PTI"
                        .to_string()
                }
                _ => "no host-side check (CR3 writes per system call seen by the QEMU \
                      plugin): the plugin was off or saw no phase (see its note)"
                    .to_string(),
            }
        )),
        Err(e) => s.notes.push(format!("PTI check failed: {e}")),
    }
    if let Some(note) = tick_free_note(outcome, guest) {
        s.notes.push(note);
    }
    if let Some(note) = marker_note(outcome) {
        s.notes.push(note);
    }
    if let Some(note) = measured_before_timeout(outcome, guest) {
        s.notes.push(note);
    }
    if !phased {
        s.notes
            .push("the init printed no @result line: nothing was measured".into());
        return s;
    }
    if let Some(c) = num("cycles") {
        s.push(Metric::new("cycles", "cycles", Source::Guest), c);
    }
    if let Some(ns) = num("ns") {
        s.push(Metric::new("guest_ns", "ns", Source::Guest), ns);
    }
    if let Some(c) = num("read_cycles") {
        s.push(Metric::new("read_cycles", "cycles", Source::Guest), c);
    }
    if !matches!(plugin, PluginOutput::Off) {
        crate::report::plugin_rows::add_linux_plugin_rows(&mut s, plugin);
        if outcome
            .cmdline
            .split_ascii_whitespace()
            .any(|w| w == SYMBOLS_WORD)
        {
            match by_symbol(outcome, plugin, calls) {
                Ok(b) => s.by_symbol = Some(b),
                Err(e) => s.notes.push(format!("by symbol: none: {e}")),
            }
        }
    }
    s
}

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

/// The CPU the init's `@cpu` line says the loop ran on alone, without the
/// scheduler tick (`pinned=N ... dynticks=yes`); `None` otherwise.
fn tick_free_cpu(outcome: &RunOutcome) -> Option<u32> {
    let line = machine_line(outcome, "@cpu")?;
    (line_value(line, "dynticks") == Some("yes"))
        .then(|| line_value(line, "pinned")?.parse().ok())
        .flatten()
}

/// The local timer interrupts the kernel counted on the loop's CPU across
/// the loop (the init's `@ticks` line).
fn loop_ticks(outcome: &RunOutcome) -> Option<u64> {
    line_value(machine_line(outcome, "@ticks")?, "local_timer")?
        .parse()
        .ok()
}

/// The words after `tag` of the init's first machine line with that tag
/// (`@linux`, `@cpu`, `@ticks`).
fn machine_line<'a>(outcome: &'a RunOutcome, tag: &str) -> Option<&'a str> {
    outcome
        .machine_lines
        .iter()
        .find_map(|l| l.strip_prefix(tag)?.strip_prefix(' '))
}

/// `key=`'s value among a machine line's words.
fn line_value<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_ascii_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// Whether the init had to mark its phase through the phase port with
/// `ioperm` (its `@marker channel=port` line: the kernel refused the
/// `/dev/mem` mapping of the marker page): then every return to user mode
/// of the measured tasks ran the kernel's TSS I/O-bitmap update, which an
/// unmodified process does not, and the note says so with the init's
/// reason (or that it was asked to, `--append ptiscope.marker=port`, or
/// that a 32-bit kernel on KVM keeps the port: linux-init's `marker`).
/// `None` for the marker page (`channel=mmio`, no cost) or no line.
fn marker_note(outcome: &RunOutcome) -> Option<String> {
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
fn tick_free_note(outcome: &RunOutcome, guest: &LinuxGuest) -> Option<String> {
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

/// A Linux run on ptiscope's VMM (`--backend kvm`, and inside
/// `--backend nested`): `s` is the run's own summary ([`summary`]) and
/// `vmm` the host-side observer's (the KVM stats fds, the VMM's exits and
/// the host clock around the init's phase markers), whose host rows are
/// added here with the Linux run's own divisor. The guest's rows (the
/// telemetry page) are not taken: a Linux guest has none.
pub fn add_vmm_rows(s: &mut RunSummary, vmm: &RunSummary) {
    s.kvm_exits_by_reason = vmm.kvm_exits_by_reason.clone();
    s.vmm_exits_by_kind = vmm.vmm_exits_by_kind;
    for r in &vmm.rows {
        if matches!(
            r.metric.source,
            Source::Kvm | Source::Vmm | Source::HostClock
        ) {
            s.push(r.metric.clone(), r.total);
        }
    }
    if let Some(n) = s.notes.iter_mut().find(|n| n.starts_with("Linux guest (")) {
        *n = n
            .replace(
                "under QEMU TCG with ptiscope's init",
                "on ptiscope's VMM (KVM) with ptiscope's init",
            )
            .replace(
                "[qemu-plugin] ones counted by ptiscope's TCG plugin",
                "[kvm] ones KVM's stats fds, [vmm] the VMM's exits to user space, [host-clock] \
                 the host's clock (hardware time on a hardware KVM host; under --backend nested \
                 the KVM is emulated by QEMU TCG, so every time is emulated time)",
            );
    }
    for n in &mut s.notes {
        if n.contains("no host-side check (CR3 writes per system call seen by the QEMU plugin)") {
            *n = n.replace(
                "no host-side check (CR3 writes per system call seen by the QEMU plugin): the \
                 plugin was off or saw no phase (see its note)",
                "no host-side CR3 count: under nested paging (NPT/EPT) KVM does not intercept \
                 the guest's CR3 writes (under shadow paging, and without PCID, its tlb_flush \
                 counts them: `--backend nested --nested-paging shadow`), so the kernel log's \
                 PTI state is the check",
            );
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::spec::linux::{ImageFormat, LinuxArch};

    pub(crate) fn obs(syscalls: u64, cr3: u64) -> HostPhaseObservation {
        HostPhaseObservation {
            source: "test",
            syscalls,
            cr3_writes: cr3,
            kernel_instructions: None,
        }
    }

    #[test]
    fn pti_checks_fail_on_every_disagreement() {
        assert!(check_pti(PtiMode::On, Some(false), None).is_err());
        assert!(check_pti(PtiMode::Off, Some(true), None).is_err());
        assert!(check_pti(PtiMode::On, None, None).is_err());
        let v = check_pti(PtiMode::On, Some(true), Some(&obs(1000, 2002))).unwrap();
        assert!(v.enabled);
        assert!((v.host_cr3_per_syscall.unwrap() - 2.002).abs() < 1e-9);
        // The log says on, the host saw no CR3 writes: an error, not a 0.
        let e = check_pti(PtiMode::On, Some(true), Some(&obs(1000, 0))).unwrap_err();
        assert!(e.contains("disagree"), "{e}");
        assert!(check_pti(PtiMode::Auto, Some(false), Some(&obs(1000, 2000))).is_err());
        assert!(check_pti(PtiMode::Auto, Some(false), Some(&obs(1000, 3))).is_ok());
    }

    pub(crate) fn outcome(
        stop: crate::machine::StopReason,
        lines: &[&str],
        tail: &[&str],
    ) -> RunOutcome {
        RunOutcome {
            stop,
            stopped_by: None,
            vcpus: Vec::new(),
            run_time: std::time::Duration::ZERO,
            setup_time: std::time::Duration::ZERO,
            exits: Default::default(),
            machine_lines: lines.iter().map(|l| l.to_string()).collect(),
            banner: Some("ptiscope guest linux-init x86_64 0.1.0 (Linux 6.1)".into()),
            console_tail: tail.iter().map(|l| l.to_string()).collect(),
            console_bytes: 1,
            dropped_machine_lines: 0,
            phases: Vec::new(),
            dropped_phase_events: 0,
            unknown_accesses: 0,
            cmdline: String::new(),
            entry: None,
            arch_capabilities: None,
            mem_mib: 128,
            telemetry_addr: 0,
            outputs: Vec::new(),
        }
    }

    pub(crate) fn guest(pti: PtiMode) -> LinuxGuest {
        LinuxGuest {
            path: "/k".into(),
            arch: LinuxArch::X86_64,
            format: ImageFormat::BzImage,
            version: None,
            config_pti: None,
            init_words: format!("pti={pti} workload=getppid iterations=10"),
            pti,
            tick_free_cpu: None,
        }
    }

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

    #[test]
    fn kvm_counts_cr3_writes_only_where_it_sees_them_and_pcid_is_off() {
        let lines = |pcid: &str| {
            [
                "@linux release=6.1 arch=x86_64 pti=on asked_pti=on".to_string(),
                format!("@result workload=getppid iterations=10 cycles=1 ns=1 pti=on pcid={pcid}"),
            ]
        };
        let g = guest(PtiMode::On);
        let run = |pcid: &str| {
            let l = lines(pcid);
            let l: Vec<&str> = l.iter().map(String::as_str).collect();
            outcome(crate::machine::StopReason::GuestExit { status: 0 }, &l, &[])
        };
        let mut vmm = RunSummary::new(Vec::new(), Some("workload".into()), 10);
        vmm.push(Metric::new("tlb_flush", "count", Source::Kvm), 21.0);
        let o = run("off");
        let h = kvm_observation(&o, &g, &vmm, true).expect("shadow paging, no PCID");
        assert_eq!((h.syscalls, h.cr3_writes), (10, 21));
        let (s, host) = summary_on_vmm(&o, &g, &vmm, true, &PluginOutput::Off);
        assert_eq!(host, Some(h));
        let row = s.row("cr3_writes").expect("a [kvm] cr3_writes row");
        assert_eq!((row.metric.source, row.total), (Source::Kvm, 21.0));
        assert!(s
            .notes
            .iter()
            .any(|n| n.contains("agrees: 2.10 CR3 writes")));
        // The loop alone on a tick-free vCPU: that vCPU's flushes.
        let mut pinned = o.clone();
        pinned
            .machine_lines
            .push("@cpu pinned=1 reason=nohz_full dynticks=yes".into());
        let mut two = vmm.clone();
        two.push(Metric::new("tlb_flush_vcpu0", "count", Source::Kvm), 1.0);
        two.push(Metric::new("tlb_flush_vcpu1", "count", Source::Kvm), 20.0);
        let h = kvm_observation(&pinned, &g, &two, true).expect("the loop's vCPU");
        assert_eq!((h.cr3_writes, h.source.contains("loop's vCPU")), (20, true));
        // Not tick-free (the kernel ignored nohz_full=): every vCPU's.
        pinned.machine_lines[2] = "@cpu pinned=1 reason=nohz_full dynticks=no".into();
        assert_eq!(
            kvm_observation(&pinned, &g, &two, true).unwrap().cr3_writes,
            21
        );
        // Nested paging: KVM sees no CR3 write; PCID: a write need not flush.
        assert_eq!(kvm_observation(&o, &g, &vmm, false), None);
        assert_eq!(kvm_observation(&run("on"), &g, &vmm, true), None);
        let (s, host) = summary_on_vmm(&o, &g, &vmm, false, &PluginOutput::Off);
        assert!(host.is_none() && s.row("cr3_writes").is_none());
        // No phase: nothing to divide.
        let whole = RunSummary::new(Vec::new(), None, 10);
        assert_eq!(kvm_observation(&o, &g, &whole, true), None);
        // KVM's count disagreeing with the log is the run's failure.
        vmm.rows.clear();
        vmm.push(Metric::new("tlb_flush", "count", Source::Kvm), 0.0);
        let (s, _) = summary_on_vmm(&o, &g, &vmm, true, &PluginOutput::Off);
        assert!(
            s.notes.iter().any(|n| n.contains("disagree")),
            "{:?}",
            s.notes
        );
    }

    #[test]
    fn the_summary_notes_that_log_and_host_agree() {
        let ok_lines = [
            "@linux release=6.1 arch=x86_64 pti=on asked_pti=on",
            "@result workload=getppid iterations=10 cycles=1 ns=1 pti=on",
        ];
        let g = guest(PtiMode::On);
        let done = outcome(
            crate::machine::StopReason::GuestExit { status: 0 },
            &ok_lines,
            &[],
        );
        let s = summary(&done, &PluginOutput::Off, &g, Some(&obs(10, 20)));
        assert!(
            s.notes
                .iter()
                .any(|n| n.contains("agrees: 2.00 CR3 writes")),
            "{:?}",
            s.notes
        );
    }
}
