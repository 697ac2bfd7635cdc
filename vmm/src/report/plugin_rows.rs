//! The rows of a `--backend qemu` run that ptiscope's TCG plugin observed
//! (source `qemu-plugin`), and their cross-checks against the guest's word.
//!
//! Names follow the KVM backend where the meaning is the same
//! (`kernel_instructions`, per vCPU `kernel_instructions_vcpu<N>`). The
//! plugin's MOV-to-CR3 count is `insn_mov_cr3`, not `cr3_writes`: that name
//! is the guest's row in the same run, and row names are unique in compare
//! tables, `--fail-if`, CSV and SVG.

use crate::observe::qemu_plugin::PluginOutput;
use crate::observe::qemu_plugin::{
    Counts, PhaseError, PluginCounter, PluginPhase, PluginReport, VcpuCounts,
};
use crate::report::note::Note;
use crate::report::{CrossCheck, Metric, RunSummary, Source};

/// Row names of the plugin's counts, with what they add up.
/// `kernel_instructions` counts the system calls' own kernel instructions
/// (calls during which an interrupt or exception was taken excepted);
/// everything else the kernel executed is `kernel_instructions_other`, and
/// the calls set apart are `syscalls_set_apart` (docs/telemetry-abi.md,
/// "System calls apart from everything else").
fn rows(c: &Counts) -> [(&'static str, u64); 28] {
    use PluginCounter::*;
    [
        ("kernel_instructions", c.call_kernel_insns()),
        ("kernel_instructions_other", c.get(KernelInsnsOther)),
        ("syscalls_set_apart", c.get(CallsOther)),
        ("user_instructions", c.get(UserInsns)),
        ("insn_mov_cr3", c.get(Cr3Writes)),
        ("insn_mov_cr3_calls", c.call_cr3_writes()),
        ("insn_invlpg", c.get(Invlpg)),
        ("insn_invpcid", c.get(Invpcid)),
        ("insn_syscall", c.get(Syscall)),
        ("insn_sysenter", c.get(Sysenter)),
        ("insn_int", c.get(Int)),
        ("insn_sysret", c.get(Sysret)),
        ("insn_sysexit", c.get(Sysexit)),
        ("insn_iret", c.get(Iret)),
        ("syscall_entries", c.syscall_entries()),
        ("syscall_returns", c.syscall_returns()),
        // The mitigations' instructions (the ledger's special
        // instructions): every execution in the phase, and (`_calls`)
        // those of the undisturbed calls, as `insn_mov_cr3_calls`.
        ("insn_verw", c.get(Verw)),
        ("insn_verw_calls", c.in_calls(Verw)),
        ("insn_lfence", c.get(Lfence)),
        ("insn_lfence_calls", c.in_calls(Lfence)),
        ("insn_wrmsr", c.get(Wrmsr)),
        ("insn_wrmsr_calls", c.in_calls(Wrmsr)),
        ("insn_wrmsr_spec_ctrl", c.get(WrmsrSpecCtrl)),
        ("insn_wrmsr_spec_ctrl_calls", c.in_calls(WrmsrSpecCtrl)),
        ("insn_wrmsr_pred_cmd", c.get(WrmsrPredCmd)),
        ("insn_wrmsr_pred_cmd_calls", c.in_calls(WrmsrPredCmd)),
        ("insn_wrmsr_flush_cmd", c.get(WrmsrFlushCmd)),
        ("insn_wrmsr_flush_cmd_calls", c.in_calls(WrmsrFlushCmd)),
    ]
}

/// Rows also given per vCPU (`<row>_vcpu<N>`).
const PER_VCPU: [&str; 4] = [
    "kernel_instructions",
    "user_instructions",
    "insn_mov_cr3",
    "syscall_entries",
];

/// Adds the plugin's rows to `s`: over the measured phase when the guest
/// marked one (`guest_phased`), else over the whole run. `guest_cr3` and
/// `guest_syscalls` are the guest's in-phase counts (its `@result` line),
/// checked against the plugin's exactly.
pub fn add_plugin_rows(
    s: &mut RunSummary,
    plugin: &PluginOutput,
    guest_phased: bool,
    guest_cr3: Option<f64>,
    guest_syscalls: Option<f64>,
    loop_workload: bool,
) {
    let Some(total) = phase_rows(s, plugin, guest_phased, PluginReport::companion_phase) else {
        return;
    };
    if !guest_phased {
        return;
    }
    if let Some(g) = guest_cr3 {
        s.cross_checks.push(CrossCheck::new(
            "CR3 writes in the phase (MOV-to-CR3 executions the QEMU plugin saw vs the guest's count)",
            (
                "insn_mov_cr3",
                Source::QemuPlugin,
                total.get(PluginCounter::Cr3Writes) as f64,
            ),
            ("cr3_writes", g),
            0.0,
        ));
    }
    if let (Some(g), true) = (guest_syscalls, loop_workload) {
        s.cross_checks.push(CrossCheck::new(
            "syscalls in the phase (SYSCALL/SYSENTER/INT executions the QEMU plugin saw vs the guest's count)",
            ("syscall_entries", Source::QemuPlugin, total.syscall_entries() as f64),
            ("syscalls", g),
            0.0,
        ));
    }
}

/// The plugin's rows of a Linux guest's run (the init's user-mode phase
/// markers, [`PluginReport::linux_phase`]): the in-phase totals over every
/// vCPU, or `None` (with a note saying why) when there are none.
pub fn add_linux_plugin_rows(s: &mut RunSummary, plugin: &PluginOutput) -> Option<Counts> {
    phase_rows(s, plugin, true, PluginReport::linux_phase)
}

/// Adds the rows: over the phase `phase_of` finds when `phased`, else over
/// the whole run; returns the totals the rows show.
fn phase_rows(
    s: &mut RunSummary,
    plugin: &PluginOutput,
    guest_phased: bool,
    phase_of: fn(&PluginReport) -> Result<PluginPhase, PhaseError>,
) -> Option<Counts> {
    let report = match plugin {
        PluginOutput::Off => {
            s.notes.push(Note::PluginOff);
            return None;
        }
        PluginOutput::Missing(e) => {
            s.notes.push(Note::PluginMissing {
                error: e.to_string(),
            });
            return None;
        }
        PluginOutput::File(bytes) => match PluginReport::parse(bytes) {
            Ok(r) => r,
            Err(e) => {
                s.notes.push(Note::PluginRefused {
                    error: e.to_string(),
                });
                return None;
            }
        },
    };
    let counts: VcpuCounts = if guest_phased {
        match phase_of(&report) {
            Ok(p) => p.delta,
            Err(e) => {
                s.notes.push(Note::PluginNoPhase {
                    error: e.to_string(),
                });
                return None;
            }
        }
    } else {
        report.totals.clone()
    };
    s.notes.push(Note::PluginRows {
        api: report.api,
        phased: guest_phased,
        kernel: crate::observe::qemu_plugin::ranges_arg(&report.kernel),
    });
    let total = counts.total();
    for (name, v) in rows(&total) {
        s.push(Metric::new(name, "count", Source::QemuPlugin), v as f64);
    }
    // The calls set apart are not in `kernel_instructions` nor in
    // `insn_mov_cr3_calls`: their per-call rates divide by the calls that
    // are, so that each is one call's own (the same in every call of a loop;
    // `insn_mov_cr3` keeps every CR3 write of the phase, interrupts' too).
    let apart = total.get(PluginCounter::CallsOther);
    let calls = s.iterations;
    for r in s.rows.iter_mut().filter(|r| {
        (r.metric.name == "kernel_instructions"
            || (r.metric.name.starts_with("insn_") && r.metric.name.ends_with("_calls")))
            && guest_phased
            && apart > 0
    }) {
        r.per_iteration = (calls > apart).then(|| r.total / (calls - apart) as f64);
    }
    if counts.0.len() > 1 {
        for (i, c) in counts.0.iter().enumerate() {
            for (name, v) in rows(c) {
                if PER_VCPU.contains(&name) {
                    s.push(
                        Metric::new(format!("{name}_vcpu{i}"), "count", Source::QemuPlugin),
                        v as f64,
                    );
                }
            }
        }
    }
    Some(total)
}
