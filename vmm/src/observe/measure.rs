//! Per-phase measurement: a [`PhaseObserver`] that snapshots every source at
//! the phase-marker exits, and the run summary built from the deltas.
//!
//! At the begin and end markers of the workload phase (id
//! [`ptiscope_abi::phase::ID_WORKLOAD`]) the observer reads, on the vCPU
//! thread and synchronously with the exit that carried the marker: the VM's
//! and the vCPU's KVM stats fds, the guest telemetry page, the VMM's exit
//! counts, the host monotonic clock and the vCPU's TSC (KVM_GET_MSRS). The
//! phase delta is `end - begin`, so boot and teardown are excluded.
//!
//! Everything the guest controls (marker ids, marker count, the telemetry
//! page) is validated; anything wrong makes the telemetry "invalid" in the
//! summary, never a panic. The observer stops taking snapshots after
//! [`MAX_MEASURED_MARKERS`] markers so a marker flood costs the VMM nothing
//! but a counter.

use std::collections::BTreeMap;
use std::time::Duration;

use ptiscope_abi::phase::{Edge, Marker, ID_WARMUP, ID_WORKLOAD};
use ptiscope_abi::telemetry::Counter;
use vm_memory::GuestAddress;

use crate::machine::exit::ExitCounts;
use crate::machine::{PhaseObserver, RunOutcome, VmContext};
use crate::observe::kvm_stats::{self, KvmStats, StatsSnapshot};
use crate::observe::live_metrics::{LiveMetrics, LiveMetricsConfig};
use crate::observe::telemetry::{self, TelemetryError, TelemetryReader, TelemetrySnapshot};
use crate::output::OutputReport;
use crate::preflight::cmdline::Workload;
use crate::preflight::host::{kvm_flavour, KvmFlavour};
use crate::report::{CrossCheck, Metric, RunRow, RunSummary, Source};

/// Markers after which the observer only counts (a guest that floods the
/// marker port gets its telemetry reported invalid, not the VMM slowed down).
pub const MAX_MEASURED_MARKERS: u64 = 64;

/// Everything observed at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Since the first KVM_RUN.
    pub at: Duration,
    /// Userspace exits by kind of the vCPU that took the marker.
    pub exits: ExitCounts,
    /// The VM's KVM stats (None: no stats fd, or the read failed).
    pub kvm_vm: Option<StatsSnapshot>,
    /// Every vCPU's stats, by index (None where a read failed).
    pub kvm_vcpus: Vec<Option<StatsSnapshot>>,
    /// Userspace exits of each vCPU, by index.
    pub vcpu_exits: Vec<u64>,
    /// The guest telemetry page, or why it could not be read.
    pub telemetry: Result<TelemetrySnapshot, TelemetryError>,
    /// The TSC of the vCPU that took the marker (IA32_TSC through KVM_GET_MSRS).
    pub tsc: Option<u64>,
}

/// The observer. Create one per run.
pub struct Measurer {
    phase_id: u16,
    vm_stats: Option<KvmStats>,
    /// One per vCPU, by index.
    vcpu_stats: Vec<KvmStats>,
    stats_error: Option<String>,
    start: Option<Snapshot>,
    begin: Option<Snapshot>,
    end: Option<Snapshot>,
    stop: Option<Snapshot>,
    markers: u64,
    unknown_ids: BTreeMap<u16, u64>,
    /// Why the guest's telemetry cannot be trusted (empty: valid).
    problems: Vec<String>,
    live_config: Option<LiveMetricsConfig>,
    live: Option<LiveMetrics>,
    live_error: Option<String>,
    /// What became of the live-metrics output.
    live_output: Option<OutputReport>,
}

impl Default for Measurer {
    fn default() -> Self {
        Self::new()
    }
}

impl Measurer {
    /// Measures the workload phase.
    pub fn new() -> Self {
        Measurer {
            phase_id: ID_WORKLOAD,
            vm_stats: None,
            vcpu_stats: Vec::new(),
            stats_error: None,
            start: None,
            begin: None,
            end: None,
            stop: None,
            markers: 0,
            unknown_ids: BTreeMap::new(),
            problems: Vec::new(),
            live_config: None,
            live: None,
            live_error: None,
            live_output: None,
        }
    }

    /// Also stream live metrics (`--metrics-interval`) while the guest runs.
    pub fn with_live_metrics(mut self, config: LiveMetricsConfig) -> Self {
        self.live_config = Some(config);
        self
    }

    fn snapshot(&self, ctx: &VmContext<'_>) -> Snapshot {
        let read = |s: &Option<KvmStats>| s.as_ref().and_then(|s| s.read().ok());
        Snapshot {
            at: ctx.elapsed,
            exits: *ctx.exits,
            kvm_vm: read(&self.vm_stats),
            kvm_vcpus: self.vcpu_stats.iter().map(|s| s.read().ok()).collect(),
            vcpu_exits: ctx
                .exit_totals
                .iter()
                .map(|t| t.load(std::sync::atomic::Ordering::Relaxed))
                .collect(),
            telemetry: TelemetryReader::new(ctx.mem, GuestAddress(ctx.layout.telemetry_addr()))
                .and_then(|r| r.snapshot()),
            tsc: crate::machine::msr::get_msr(ctx.vcpu, crate::machine::msr::MSR_IA32_TSC),
        }
    }

    fn problem(&mut self, p: String) {
        // Bounded: a hostile guest must not grow this without limit.
        if self.problems.len() < 16 && !self.problems.contains(&p) {
            self.problems.push(p);
        }
    }

    /// Reasons the telemetry is invalid (empty: valid).
    pub fn problems(&self) -> &[String] {
        &self.problems
    }

    /// Snapshots at the phase's begin and end markers, if both were seen.
    pub fn phase(&self) -> Option<(&Snapshot, &Snapshot)> {
        Some((self.begin.as_ref()?, self.end.as_ref()?))
    }

    /// What became of the `--metrics-interval` output, once the run is over.
    pub fn live_output(&self) -> Option<&OutputReport> {
        self.live_output.as_ref()
    }

    /// Phase markers seen (valid encodings only; the VMM counts invalid ones).
    pub fn markers(&self) -> u64 {
        self.markers
    }
}

impl PhaseObserver for Measurer {
    fn on_vcpus(&mut self, vm: &kvm_ioctls::VmFd, vcpus: &[kvm_ioctls::VcpuFd]) {
        let opened = KvmStats::from_vm(vm).and_then(|vm| {
            let per_vcpu = vcpus
                .iter()
                .map(KvmStats::from_vcpu)
                .collect::<Result<Vec<_>, _>>()?;
            Ok((vm, per_vcpu))
        });
        match opened {
            Ok((vm, per_vcpu)) => {
                self.vm_stats = Some(vm);
                self.vcpu_stats = per_vcpu;
            }
            Err(e) => self.stats_error = Some(e.to_string()),
        }
    }

    fn on_start(&mut self, ctx: &VmContext<'_>) {
        self.start = Some(self.snapshot(ctx));
        if let Some(cfg) = self.live_config.take() {
            match LiveMetrics::start(cfg, ctx) {
                Ok(l) => self.live = Some(l),
                Err(e) => {
                    log::warn!("--metrics-interval: {e}");
                    self.live_error = Some(e.to_string());
                }
            }
        }
    }

    fn on_phase(&mut self, marker: Marker, ctx: &VmContext<'_>) {
        self.markers += 1;
        if self.markers > MAX_MEASURED_MARKERS {
            if self.markers == MAX_MEASURED_MARKERS + 1 {
                self.problem(format!(
                    "phase-marker flood: more than {MAX_MEASURED_MARKERS} markers; later ones were only counted"
                ));
            }
            return;
        }
        if marker.id == ID_WARMUP {
            return;
        }
        if marker.id != self.phase_id {
            *self.unknown_ids.entry(marker.id).or_default() += 1;
            self.problem(format!("unknown phase id {}", marker.id));
            return;
        }
        match marker.edge {
            Edge::Begin if self.begin.is_some() => {
                self.problem("the workload phase began more than once".into())
            }
            Edge::Begin => {
                let s = self.snapshot(ctx);
                if let Err(e) = &s.telemetry {
                    self.problem(format!("at the phase begin: {e}"));
                }
                self.begin = Some(s);
            }
            Edge::End if self.begin.is_none() => {
                self.problem("the workload phase ended before it began".into())
            }
            Edge::End if self.end.is_some() => {
                self.problem("the workload phase ended more than once".into())
            }
            Edge::End => {
                let s = self.snapshot(ctx);
                if let Err(e) = &s.telemetry {
                    self.problem(format!("at the phase end: {e}"));
                }
                self.end = Some(s);
            }
        }
    }

    fn on_stop(&mut self, ctx: &VmContext<'_>) {
        if let Some(l) = self.live.take() {
            let (lines, output) = l.finish(ctx);
            if let Err(e) = lines {
                log::warn!("--metrics-interval: {e}");
                self.live_error = Some(e.to_string());
            }
            self.live_output = Some(output);
        }
        self.stop = Some(self.snapshot(ctx));
    }
}

/// `key=value` pairs of the guest's first `@result` line.
pub fn result_fields(outcome: &RunOutcome) -> BTreeMap<String, String> {
    outcome
        .machine_lines
        .iter()
        .find_map(|l| l.strip_prefix(ptiscope_abi::RESULT_PREFIX))
        .map(|rest| {
            rest.split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .unwrap_or_default()
}

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
/// ... or an absolute excess of KVM flushes over the guest's switches: KVM
/// also flushes when the host preempts the vCPU and reloads it (measured
/// here: the excess follows KVM's `preemption_other` stat, 4 flushes for 7
/// preemptions on an idle host, 137 for 168 with both host CPUs busy), plus
/// a few of its own. The allowance is that many, as KVM itself counts them.
const CR3_HOST_EXCESS_BASE: f64 = 16.0;

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
                None => s.notes.push(NO_REQUESTED_COUNT.into()),
            }
        }
        if let Some(c) = iterations_check(&result, asked) {
            s.cross_checks.push(c);
        }
        s.telemetry_problems = self.problems.clone();
        if outcome.exits.invalid_phase_markers > 0 {
            s.telemetry_problems.push(format!(
                "{} phase-port writes were not valid markers",
                outcome.exits.invalid_phase_markers
            ));
        }
        if phased.is_none() {
            s.notes.push(
                "the guest marked no complete workload phase: figures cover the whole run, boot included"
                    .into(),
            );
        }
        let (Some(a), Some(b)) = (a, b) else {
            s.notes
                .push("no snapshots were taken (the VM did not start)".into());
            return s;
        };

        // Host-observed: KVM.
        let flavour = kvm_flavour();
        let kvm = |name| kvm_vcpus_delta(a, b, name);
        let kvm_exits = kvm("exits");
        if let Some(v) = kvm_exits {
            s.push(Metric::new("kvm_exits", "count", Source::Kvm), v as f64);
        }
        let insn = kvm("insn_emulation");
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
                s.notes.push(
                    "the guest never initialised its telemetry page: no guest counters".into(),
                );
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
            match (tlb_flush, flavour.sees_cr3_writes()) {
                // kvm_pvm's shadow MMU flushes once per kernel/user CR3 round
                // trip (measured: N getpid calls with PTI give 2N CR3 writes
                // and N tlb_flush), so the guest's exit-to-user switches are
                // what KVM's count must match.
                (Some(t), true) if flavour == KvmFlavour::Pvm => {
                    // A context switch to another address space is a new
                    // shadow root for KVM as well: it flushes there too.
                    s.cross_checks.push(CrossCheck::new(
                        "CR3 switches to another table (kvm_pvm shadow paging: one KVM tlb_flush per \
                         kernel->user switch and per context switch)",
                        ("tlb_flush", Source::Kvm, t as f64),
                        (
                            "cr3_writes_exit+context_switch",
                            (d.total(Counter::Cr3Exit) + d.total(Counter::Cr3ContextSwitch)) as f64,
                        ),
                        CR3_TOLERANCE_PCT,
                    )
                    .allowing_host_excess(
                        CR3_HOST_EXCESS_BASE
                            + (kvm("preemption_other").unwrap_or(0)
                                + kvm("preemption_reported").unwrap_or(0))
                                as f64,
                    ));
                }
                (Some(t), true) => {
                    s.cross_checks.push(CrossCheck::new(
                        "flushing CR3 writes (shadow paging: each is a KVM tlb_flush)",
                        ("tlb_flush", Source::Kvm, t as f64),
                        ("cr3_writes", cr3 - d.total(Counter::Cr3NoFlush) as f64),
                        CR3_TOLERANCE_PCT,
                    ));
                }
                (_, false) => s.notes.push(
                    "with EPT/NPT KVM does not intercept guest CR3 writes: cr3_writes are the guest's word only, \
                     and KVM tlb_flush counts KVM's own flushes"
                        .into(),
                ),
                (None, true) => s.notes.push(
                    "this KVM has no tlb_flush stat: guest CR3 writes cannot be cross-checked".into(),
                ),
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
            s.notes.push(format!("KVM stats fd not available: {e}"));
        } else if insn.is_none() {
            s.notes.push(
                "this KVM has no insn_emulation stat (hardware-assisted: kernel code is not emulated), \
                 so kernel instructions are not counted"
                    .into(),
            );
        }
        if flavour == KvmFlavour::Pvm {
            s.notes.push(
                "kvm_pvm: guest kernel code is emulated, so kernel_instructions is the exact \
                 kernel path length and time is dominated by emulation"
                    .into(),
            );
        }
        if let Some(e) = &self.live_error {
            s.notes.push(format!("live metrics stopped: {e}"));
        }
        if !valid {
            s.notes.push(
                "guest telemetry INVALID: guest-reported rows are omitted; host-observed rows stand".into(),
            );
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
                kvm_flavour(),
                kvm_vcpu_delta(a, b, cpu, "tlb_flush"),
            ) {
                let preempted = kvm_vcpu_delta(a, b, cpu, "preemption_other").unwrap_or(0)
                    + kvm_vcpu_delta(a, b, cpu, "preemption_reported").unwrap_or(0);
                s.cross_checks.push(
                    CrossCheck::new(
                        format!(
                            "vCPU {cpu}: CR3 switches to another table on guest CPU {cpu} \
                             (kvm_pvm: one KVM tlb_flush per kernel->user switch and context switch)"
                        ),
                        (&format!("tlb_flush_vcpu{cpu}"), Source::Kvm, t as f64),
                        (
                            &format!("cr3_writes_exit+context_switch_cpu{cpu}"),
                            (c(Counter::Cr3Exit) + c(Counter::Cr3ContextSwitch)) as f64,
                        ),
                        CR3_TOLERANCE_PCT,
                    )
                    .allowing_host_excess(CR3_HOST_EXCESS_BASE + preempted as f64),
                );
            }
        }
    }
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
fn working_set_rows(result: &BTreeMap<String, String>, iterations: u64) -> Vec<RunRow> {
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
/// every row comes from the guest's `@result` line, whose counters cover
/// the measured phase (N iterations plus the end-marker call, as on KVM)
/// and whose `cycles` cover the loop alone (N calls).
pub fn summary_from_result(outcome: &RunOutcome, config: Vec<String>) -> RunSummary {
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
    s.notes.push(
        "backend qemu (TCG): the host observes nothing of the guest; every figure is guest-reported \
         (its @result line), and times are those of software emulation"
            .into(),
    );
    if !phased {
        s.notes
            .push("the guest printed no @result line: nothing was measured".into());
        return s;
    }
    s.notes.push(match asked {
        Some(_) => divisor_note,
        None => NO_REQUESTED_COUNT.into(),
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
    s
}

/// How a workload's measured phase relates to its `iterations`: the
/// divisor of per-iteration rates, what one iteration is called, and the
/// note that says so. The syscall loops (getpid, ...) mark their phase with
/// a syscall whose return and entry lie inside it: N + 1 round trips. For
/// sched-messaging an iteration is a message, and the phase (from before
/// the first sender runs until every worker is reaped) holds many other
/// syscalls and context switches besides: rates are per message.
fn phase_divisor(workload: Workload, iterations: u64) -> (u64, &'static str, String) {
    match workload {
        Workload::Poundsyscall => (
            iterations,
            "call",
            format!(
                "per-call rates divide by the {iterations} getppid calls of all threads \
                 (poundsyscall: the phase also holds each thread's exit, the parent's waits \
                 and the end marker, 2 x threads + 2 syscalls)"
            ),
        ),
        Workload::SchedMessaging => (
            iterations,
            "message",
            format!(
                "per-message rates divide by the {iterations} messages sent (sched-messaging: \
                 each message is a write and a read, plus the workers' own start and exit)"
            ),
        ),
        _ => (
            iterations.saturating_add(1),
            "call",
            format!(
                "per-call rates divide by {} calls: the {iterations} workload iterations plus the \
                 phase-marker syscall whose return and entry bracket the phase",
                iterations.saturating_add(1)
            ),
        ),
    }
}

/// Why a run has no per-call rates although it marked a phase.
const NO_REQUESTED_COUNT: &str = "the command line has words the ptiscope guest's parser does not \
     know, so the VMM cannot tell how many calls it asked for: totals only, no per-call rates";

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
fn iterations_check(
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
