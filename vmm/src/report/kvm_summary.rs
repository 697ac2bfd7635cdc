//! The run summary of a KVM run: the measured phase's deltas of every
//! source (KVM's stats, the VMM's exit counts, the host clock, the guest's
//! telemetry page), per-call rates, per-vCPU rows, and the cross-checks of
//! host-observed against guest-reported counts.

use ptiscope_abi::telemetry::Counter;

use super::guest_result::{
    iterations_check, phase_divisor, requested, result_fields, working_set_rows,
};
use crate::machine::kvm::KvmFlavour;
use crate::machine::kvm_stats::{self, StatsSnapshot};
use crate::machine::RunOutcome;
use crate::observe::measure::{Measurer, Snapshot};
use crate::observe::telemetry::{self, TelemetryError, TelemetrySnapshot};
use crate::report::note::Note;
use crate::report::{CrossCheck, Metric, RunRow, RunSummary, Source};
use ptiscope_abi::options::Workload;

/// KiB of kernel the user copy maps, from the guest's `@pti` line.
fn user_copy_kernel_kib(outcome: &RunOutcome) -> Option<f64> {
    let line = outcome
        .machine_lines
        .iter()
        .find_map(|l| l.strip_prefix("@pti "))?;
    let pages: u64 = line
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("user_copy_kernel_pages="))?
        .parse()
        .ok()?;
    Some((pages.min(1 << 20) * 4) as f64)
}

/// A cumulative KVM stat's change between two snapshots.
fn kvm_delta(a: Option<&StatsSnapshot>, b: Option<&StatsSnapshot>, name: &str) -> Option<u64> {
    let d = kvm_stats::delta(a?, b?).ok()?;
    d.get(name)
}

/// A cumulative per-vCPU KVM stat's change, summed over the vCPUs (None if
/// any vCPU's is missing: a partial sum would read as a real total).
fn kvm_vcpus_delta(a: &Snapshot, b: &Snapshot, name: &str) -> Option<u64> {
    if a.kvm_vcpus.is_empty() || a.kvm_vcpus.len() != b.kvm_vcpus.len() {
        return None;
    }
    a.kvm_vcpus
        .iter()
        .zip(&b.kvm_vcpus)
        .map(|(x, y)| kvm_delta(x.as_ref(), y.as_ref(), name))
        .sum()
}

/// KVM's per-reason exit stats (x86's `kvm_vcpu_stat`).
const KVM_EXIT_REASONS: &[&str] = &[
    "io_exits",
    "mmio_exits",
    "halt_exits",
    "irq_exits",
    "irq_window_exits",
    "nmi_window_exits",
    "request_irq_exits",
    "signal_exits",
];

/// One vCPU's change of a cumulative KVM stat.
fn kvm_vcpu_delta(a: &Snapshot, b: &Snapshot, vcpu: usize, name: &str) -> Option<u64> {
    kvm_delta(
        a.kvm_vcpus.get(vcpu)?.as_ref(),
        b.kvm_vcpus.get(vcpu)?.as_ref(),
        name,
    )
}

/// The guest counter names for report rows, with the guest's own word for
/// the full flushes (the KVM one is `tlb_flush`).
const GUEST_ROWS: [Counter; 12] = [
    Counter::Cr3Entry,
    Counter::Cr3Exit,
    Counter::Cr3ContextSwitch,
    Counter::Cr3Other,
    Counter::Cr3NoFlush,
    Counter::TlbFlushFull,
    Counter::Invlpg,
    Counter::Syscalls,
    Counter::PageFaults,
    Counter::Exceptions,
    Counter::Interrupts,
    Counter::ContextSwitches,
];

/// Tolerance of the CR3-vs-tlb_flush cross-check: KVM also flushes for its
/// own reasons (a few per phase), so a small excess is agreement.
const CR3_TOLERANCE_PCT: f64 = 1.0;
/// ... or an absolute excess of KVM flushes over the guest's switches.
/// KVM also flushes for its own reasons, each of which it counts: when the
/// host preempts the vCPU and reloads it (`preemption_other` +
/// `preemption_reported`; with PTI's two roots, up to two flushes per
/// preemption) and on shadow-paging faults (`pf_taken`). Measured here with
/// sched-messaging threads, pti=on, 1,682 switches: the excess was 31-36 for
/// 3-4 preemptions and 40 faults, 57-101 for 22-50 preemptions (other work
/// on the host's two cores); 4 flushes for 7 preemptions on an idle host
/// for getpid.
const CR3_HOST_EXCESS_BASE: f64 = 16.0;

/// The KVM flushes beyond the guest's `switches` that still agree: the
/// fixed base, two per preemption and one per fault KVM took, and
/// [`CR3_TOLERANCE_PCT`] of the switches. One-sided: the host may never
/// count fewer. A guest that missed a switch per call, or KVM flushing
/// twice per switch, is still far outside it.
fn cr3_host_excess(switches: f64, preempted: u64, faults: u64) -> f64 {
    CR3_HOST_EXCESS_BASE
        + 2.0 * preempted as f64
        + faults as f64
        + switches * CR3_TOLERANCE_PCT / 100.0
}

impl Measurer {
    /// The perf-stat-like summary of the measured phase of `outcome`.
    /// `config` labels the run (`pti=on`, `workload=getpid`, ...). Rates
    /// divide by what the VMM asked for ([`requested`], from the command
    /// line it wrote), never by a count the guest reports.
    pub fn summary(&self, outcome: &RunOutcome, config: Vec<String>) -> RunSummary {
        let result = result_fields(outcome);
        let asked = requested(&outcome.cmdline);
        let (workload, iterations) = asked.unwrap_or((Workload::None, 0));
        let phased = self.phase();
        let (a, b) = match phased {
            Some((a, b)) => (Some(a), Some(b)),
            None => (self.start.as_ref(), self.stop.as_ref()),
        };
        // The guest marks the phase with a syscall (PHASE_MARK): the begin
        // marker's return to user and the end marker's entry lie inside the
        // phase, i.e. exactly one more syscall round trip than the loop's
        // N. Rates divide by N + 1 so that counts per call are exact
        // (2 CR3 writes per call with PTI, not 2 + 2/N).
        let (divisor, iteration_name, divisor_note) = phase_divisor(workload, iterations);
        // Without a complete phase (no workload, a timeout, a crash) or
        // without a count the VMM knows it asked for, there is nothing to
        // divide by: totals only, no per-call rates.
        let calls = if phased.is_some() && asked.is_some() {
            divisor
        } else {
            0
        };
        let mut s = RunSummary::new(config, phased.map(|_| "workload".to_string()), calls);
        if phased.is_some() {
            s.iteration_name = iteration_name.into();
            match asked {
                Some(_) => s.notes.push(divisor_note),
                None => s.notes.push(Note::UnknownRequestedCount),
            }
        }
        if let Some(c) = iterations_check(&result, asked) {
            s.cross_checks.push(c);
        }
        s.telemetry_problems = self.problems.clone();
        if outcome.exits.invalid_phase_markers > 0 {
            s.telemetry_problems.push(format!(
                "{} phase-marker writes (port or MMIO page) were not valid markers",
                outcome.exits.invalid_phase_markers
            ));
        }
        if phased.is_none() {
            s.notes.push(Note::NoPhase);
        }
        let (Some(a), Some(b)) = (a, b) else {
            s.notes.push(Note::NoSnapshots);
            return s;
        };

        // Host-observed: KVM.
        let flavour = self.kvm.flavour;
        let kvm = |name| kvm_vcpus_delta(a, b, name);
        let kvm_exits = kvm("exits");
        if let Some(v) = kvm_exits {
            s.push(Metric::new("kvm_exits", "count", Source::Kvm), v as f64);
        }
        // Exits by reason: the stats x86 KVM keeps per exit kind (each a
        // subset of `exits`; KVMs that lack one leave it out).
        for stat in KVM_EXIT_REASONS {
            if let Some(v) = kvm(stat) {
                s.kvm_exits_by_reason.insert((*stat).to_owned(), v);
            }
        }
        // What no per-reason stat names: on kvm_pvm the guest kernel's
        // entries and emulation, on hardware KVM e.g. MSR, CPUID, CR and
        // nested-paging exits.
        if let (Some(all), false) = (kvm_exits, s.kvm_exits_by_reason.is_empty()) {
            let named: u64 = s.kvm_exits_by_reason.values().sum();
            s.kvm_exits_by_reason
                .insert("other_exits".to_owned(), all.saturating_sub(named));
        }
        s.vmm_exits_by_kind = Some(outcome.exits);
        // insn_emulation is the kernel's instruction count only where KVM
        // emulates guest kernel code (kvm_pvm); a hardware-assisted KVM has
        // the same stat but counts only the odd instruction it emulates (an
        // MMIO access), ~0, which is no kernel path length: no row there.
        let insn = kvm("insn_emulation").filter(|_| flavour == KvmFlavour::Pvm);
        if let Some(v) = insn {
            s.push(
                Metric::new("kernel_instructions", "count", Source::Kvm),
                v as f64,
            );
        }
        let tlb_flush = kvm("tlb_flush");
        if let Some(v) = tlb_flush {
            s.push(Metric::new("tlb_flush", "count", Source::Kvm), v as f64);
        }
        if let Some(v) = kvm("pf_taken") {
            s.push(Metric::new("kvm_pf_taken", "count", Source::Kvm), v as f64);
        }
        if let (Some(x), Some(y)) = (a.tsc, b.tsc) {
            if let Some(d) = y.checked_sub(x) {
                s.push(Metric::new("tsc", "cycles", Source::Kvm), d as f64);
            }
        }
        // Host-observed: the VMM and the host clock.
        let all_exits = |x: &Snapshot| x.vcpu_exits.iter().sum::<u64>();
        s.push(
            Metric::new("vmm_exits", "count", Source::Vmm),
            all_exits(b).saturating_sub(all_exits(a)) as f64,
        );
        let ns = b.at.saturating_sub(a.at).as_nanos() as f64;
        s.push(Metric::new("elapsed", "ns", Source::HostClock), ns);

        // Guest-reported: @result cycles (RDTSC around the loop) and the telemetry page.
        if let Some(c) = result.get("cycles").and_then(|v| v.parse::<f64>().ok()) {
            if phased.is_some() && c.is_finite() && c >= 0.0 {
                // The guest's RDTSC brackets its loop only (N calls, no
                // marker): divided by the N the VMM asked for.
                s.rows.push(RunRow {
                    metric: Metric::new("cycles", "cycles", Source::Guest),
                    total: c,
                    per_iteration: (calls > 0 && iterations > 0).then(|| c / iterations as f64),
                });
            }
        }
        if phased.is_some() {
            s.rows.extend(working_set_rows(&result, iterations));
        }
        let guest = match (&a.telemetry, &b.telemetry) {
            (Ok(x), Ok(y)) => match telemetry::delta(x, y) {
                Ok(d) => Some(d),
                Err(e) => {
                    s.telemetry_problems.push(e.to_string());
                    None
                }
            },
            // Whole run: the first snapshot is taken before the guest has
            // booted, so its counters count from zero.
            (Err(TelemetryError::NotInitialized), Ok(y)) if phased.is_none() => Some(y.clone()),
            (_, Err(TelemetryError::NotInitialized)) if phased.is_none() => {
                s.telemetry_initialized = false;
                s.notes.push(Note::TelemetryNotInitialized);
                None
            }
            (Err(e), _) | (_, Err(e)) => {
                let p = e.to_string();
                if !s.telemetry_problems.iter().any(|q| q.contains(&p)) {
                    s.telemetry_problems.push(p);
                }
                None
            }
        };
        let valid = s.telemetry_problems.is_empty();
        // What the user copy maps of the kernel (the guest's @pti line; the
        // host's own walk is `ptiscope pagetables`): the exposure side of a
        // PTI strategy, the same for every call, so its "rate" is itself.
        if let Some(kib) = user_copy_kernel_kib(outcome) {
            s.rows.push(RunRow {
                metric: Metric::new("user_copy_kernel_kib", "KiB", Source::Guest),
                total: kib,
                per_iteration: Some(kib),
            });
        }
        if let Some(d) = guest.as_ref().filter(|_| valid) {
            s.push(
                Metric::new("cr3_writes", "count", Source::Guest),
                d.cr3_writes() as f64,
            );
            for c in GUEST_ROWS {
                s.push(
                    Metric::new(c.name(), "count", Source::Guest),
                    d.total(c) as f64,
                );
            }
        }

        // Cross-checks, over a marked phase only: a whole run includes boot,
        // whose page-table set-up makes KVM flush for reasons of its own.
        if let (Some(d), true, true) = (guest.as_ref(), valid, phased.is_some()) {
            let cr3 = d.cr3_writes() as f64;
            match (tlb_flush, self.kvm.sees_cr3_writes) {
                // kvm_pvm's shadow MMU flushes once per kernel/user CR3 round
                // trip (measured: N getpid calls with PTI give 2N CR3 writes
                // and N tlb_flush), so the guest's exit-to-user switches are
                // what KVM's count must match.
                (Some(t), true) if flavour == KvmFlavour::Pvm => {
                    // A context switch to another address space is a new
                    // shadow root for KVM as well: it flushes there too.
                    let switches =
                        (d.total(Counter::Cr3Exit) + d.total(Counter::Cr3ContextSwitch)) as f64;
                    s.cross_checks.push(CrossCheck::new(
                        "CR3 switches to another table (kvm_pvm shadow paging: one KVM tlb_flush per \
                         kernel->user switch and per context switch)",
                        ("tlb_flush", Source::Kvm, t as f64),
                        ("cr3_writes_exit+context_switch", switches),
                        CR3_TOLERANCE_PCT,
                    )
                    .allowing_host_excess(cr3_host_excess(
                        switches,
                        kvm("preemption_other").unwrap_or(0)
                            + kvm("preemption_reported").unwrap_or(0),
                        kvm("pf_taken").unwrap_or(0),
                    )));
                }
                (Some(t), true) => {
                    s.cross_checks.push(CrossCheck::new(
                        "flushing CR3 writes (shadow paging: each is a KVM tlb_flush)",
                        ("tlb_flush", Source::Kvm, t as f64),
                        ("cr3_writes", cr3 - d.total(Counter::Cr3NoFlush) as f64),
                        CR3_TOLERANCE_PCT,
                    ));
                }
                (_, false) => s.notes.push(Note::Cr3NotIntercepted),
                (None, true) => s.notes.push(Note::NoTlbFlushStat),
            }
            // One syscall per requested iteration plus the end marker's own:
            // the VMM's side is what it asked for, not what the guest says.
            // poundsyscall's phase also holds each thread's exit and the
            // parent's waits: no exact "calls + 1" to check there.
            let loop_workload = asked.is_some_and(|(w, _)| w != Workload::Poundsyscall);
            if let (Some((_, n)), true) = (
                asked,
                phased.is_some() && iteration_name == "call" && loop_workload,
            ) {
                s.cross_checks.push(CrossCheck::new(
                    "syscalls (the requested iterations + the end-marker call)",
                    ("requested_calls", Source::Vmm, n.saturating_add(1) as f64),
                    ("syscalls", d.total(Counter::Syscalls) as f64),
                    0.0,
                ));
            }
        }
        if a.vcpu_exits.len() > 1 {
            self.per_vcpu_rows(
                &mut s,
                a,
                b,
                guest.as_ref().filter(|_| valid),
                phased.is_some(),
            );
        }
        if let Some(e) = &self.stats_error {
            s.notes.push(Note::KvmStatsUnavailable {
                error: e.to_string(),
            });
        } else if insn.is_none() {
            s.notes.push(Note::KernelInstructionsNotCounted);
        }
        if flavour == KvmFlavour::Pvm {
            s.notes.push(Note::KvmPvmEmulatesKernel);
        }
        if let Some(e) = &self.live_error {
            s.notes.push(Note::LiveMetricsStopped {
                error: e.to_string(),
            });
        }
        if !valid {
            s.notes.push(Note::TelemetryInvalid);
        }
        s
    }
}

impl Measurer {
    /// With several vCPUs: each one's share of the host-observed figures
    /// (`<row>_vcpu<N>`), the guest's per-CPU counters (`<counter>_cpu<N>`:
    /// guest CPU N runs on vCPU N) and, on kvm_pvm, the CR3 cross-check per
    /// vCPU (each vCPU's KVM tlb_flush against the switches its guest CPU made).
    fn per_vcpu_rows(
        &self,
        s: &mut RunSummary,
        a: &Snapshot,
        b: &Snapshot,
        guest: Option<&TelemetrySnapshot>,
        phased: bool,
    ) {
        for (i, (x, y)) in a.vcpu_exits.iter().zip(&b.vcpu_exits).enumerate() {
            s.push(
                Metric::new(format!("vmm_exits_vcpu{i}"), "count", Source::Vmm),
                y.saturating_sub(*x) as f64,
            );
            for (stat, row) in [
                ("exits", "kvm_exits"),
                ("insn_emulation", "kernel_instructions"),
                ("tlb_flush", "tlb_flush"),
                ("halt_exits", "kvm_halt_exits"),
            ] {
                // As the whole-run row: kernel instructions on kvm_pvm only.
                if stat == "insn_emulation" && self.kvm.flavour != KvmFlavour::Pvm {
                    continue;
                }
                if let Some(v) = kvm_vcpu_delta(a, b, i, stat) {
                    s.push(
                        Metric::new(format!("{row}_vcpu{i}"), "count", Source::Kvm),
                        v as f64,
                    );
                }
            }
        }
        let Some(d) = guest else { return };
        for cpu in 0..d.cpu_count() {
            let c = |k| d.get(cpu, k).unwrap_or(0);
            let cr3 = c(Counter::Cr3Entry)
                + c(Counter::Cr3Exit)
                + c(Counter::Cr3ContextSwitch)
                + c(Counter::Cr3Other);
            s.push(
                Metric::new(format!("cr3_writes_cpu{cpu}"), "count", Source::Guest),
                cr3 as f64,
            );
            for k in [
                Counter::Syscalls,
                Counter::ContextSwitches,
                Counter::Interrupts,
            ] {
                s.push(
                    Metric::new(format!("{}_cpu{cpu}", k.name()), "count", Source::Guest),
                    c(k) as f64,
                );
            }
            if let (true, KvmFlavour::Pvm, Some(t)) = (
                phased,
                self.kvm.flavour,
                kvm_vcpu_delta(a, b, cpu, "tlb_flush"),
            ) {
                let preempted = kvm_vcpu_delta(a, b, cpu, "preemption_other").unwrap_or(0)
                    + kvm_vcpu_delta(a, b, cpu, "preemption_reported").unwrap_or(0);
                let faults = kvm_vcpu_delta(a, b, cpu, "pf_taken").unwrap_or(0);
                let switches = (c(Counter::Cr3Exit) + c(Counter::Cr3ContextSwitch)) as f64;
                s.cross_checks.push(
                    CrossCheck::new(
                        format!(
                            "vCPU {cpu}: CR3 switches to another table on guest CPU {cpu} \
                             (kvm_pvm: one KVM tlb_flush per kernel->user switch and context switch)"
                        ),
                        (&format!("tlb_flush_vcpu{cpu}"), Source::Kvm, t as f64),
                        (&format!("cr3_writes_exit+context_switch_cpu{cpu}"), switches),
                        CR3_TOLERANCE_PCT,
                    )
                    .allowing_host_excess(cr3_host_excess(switches, preempted, faults)),
                );
            }
        }
    }
}
