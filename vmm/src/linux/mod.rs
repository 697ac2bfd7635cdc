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

mod console;
pub mod mitigations;
mod notes;
mod observation;
mod pti;
pub mod symbols;

use ptiscope_abi::options::Workload;

use self::console::line_value;
use self::notes::{marker_note, tick_free_note};
use self::observation::phase_calls;
use crate::machine::RunOutcome;
use crate::observe::qemu_plugin::PluginOutput;
use crate::report::note::{LinuxHost, Note, PtiHostCheck};
use crate::report::{Metric, RunSummary, Source};
use crate::spec::linux::LinuxGuest;

pub use console::{init_started, kernel_panic, SYMBOLS_WORD};
pub use notes::measured_before_timeout;
pub use observation::{host_observation, kvm_observation, HostObserver, HostPhaseObservation};
pub use pti::{check_pti, guest_pti, PtiVerdict};

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
        s.notes.push(Note::OuterPluginRows);
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
    s.notes.push(Note::LinuxGuest {
        arch: guest.arch.name().into(),
        version: guest.version.clone(),
        host: LinuxHost::QemuTcg,
        calls,
        iteration_name: s.iteration_name.clone(),
    });
    match check_pti(guest.pti, guest_pti(outcome), host) {
        Ok(v) => s.notes.push(Note::Pti {
            enabled: v.enabled,
            host_check: match (host, v.host_cr3_per_syscall) {
                (Some(h), Some(p)) => PtiHostCheck::Agrees {
                    source: h.source.into(),
                    cr3_per_syscall: p,
                },
                _ if asked
                    .as_ref()
                    .is_some_and(|c| c.workload == Workload::SchedMessaging) =>
                {
                    PtiHostCheck::NoneForSchedMessaging
                }
                _ => PtiHostCheck::NoPluginCount,
            },
        }),
        Err(error) => s.notes.push(Note::PtiCheckFailed { error }),
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
        s.notes.push(Note::InitNoResult);
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
                Err(e) => s.notes.push(Note::BySymbolNone {
                    error: e.to_string(),
                }),
            }
        }
    }
    s
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
    // The figures are the VMM's, not the QEMU plugin's: the notes that
    // said whose they are, and what checked PTI, say so.
    for n in &mut s.notes {
        match n {
            Note::LinuxGuest { host, .. } => *host = LinuxHost::Vmm,
            Note::Pti { host_check, .. } if *host_check == PtiHostCheck::NoPluginCount => {
                *host_check = PtiHostCheck::NoNestedPagingCount
            }
            _ => {}
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ptiscope_abi::options::PtiMode;

    use crate::spec::linux::{ImageFormat, LinuxArch};

    pub(crate) fn obs(syscalls: u64, cr3: u64) -> HostPhaseObservation {
        HostPhaseObservation {
            source: "test",
            syscalls,
            cr3_writes: cr3,
            kernel_instructions: None,
        }
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
            .any(|n| n.to_string().contains("agrees: 2.10 CR3 writes")));
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
            s.notes.iter().any(|n| n.to_string().contains("disagree")),
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
                .any(|n| n.to_string().contains("agrees: 2.00 CR3 writes")),
            "{:?}",
            s.notes
        );
    }
}
