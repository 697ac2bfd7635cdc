//! Per-phase measurement: a [`PhaseObserver`] that snapshots every source at
//! the phase-marker exits. The run summary built from the deltas is the
//! report's ([`crate::report`]: `Measurer::summary`, in `report/kvm_summary.rs`).
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
use vm_memory::GuestAddress;

use crate::machine::exit::ExitCounts;
use crate::machine::kvm::KvmFlavour;
use crate::machine::kvm_stats::{KvmStats, StatsSnapshot};
use crate::machine::{PhaseObserver, VmContext};
use crate::observe::live_metrics::{LiveMetrics, LiveMetricsConfig};
use crate::observe::telemetry::{TelemetryError, TelemetryReader, TelemetrySnapshot};
use crate::output::OutputReport;

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

/// The KVM a measured run ran on, as its summary reads it: the KVM
/// backend hands it over from the host facts ([`Measurer::on_kvm`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ObservedKvm {
    /// Which KVM (kvm_pvm's `insn_emulation` counts the guest kernel's
    /// instructions).
    pub flavour: KvmFlavour,
    /// Whether KVM's `tlb_flush` follows guest CR3 writes (shadow paging).
    pub sees_cr3_writes: bool,
}

/// The observer. Create one per run.
pub struct Measurer {
    /// The KVM the run runs on.
    pub(crate) kvm: ObservedKvm,
    phase_id: u16,
    vm_stats: Option<KvmStats>,
    /// One per vCPU, by index.
    vcpu_stats: Vec<KvmStats>,
    /// Why KVM's stats fds could not be opened or read (read by the report).
    pub(crate) stats_error: Option<String>,
    /// At the boot vCPU's first KVM_RUN.
    pub(crate) start: Option<Snapshot>,
    begin: Option<Snapshot>,
    end: Option<Snapshot>,
    /// After the boot vCPU's last exit.
    pub(crate) stop: Option<Snapshot>,
    markers: u64,
    unknown_ids: BTreeMap<u16, u64>,
    /// Why the guest's telemetry cannot be trusted (empty: valid).
    pub(crate) problems: Vec<String>,
    live_config: Option<LiveMetricsConfig>,
    /// Stats fds of every vCPU for the live-metrics thread (its own: the
    /// thread reads them while the vCPU threads read theirs).
    live_vcpu_stats: Vec<KvmStats>,
    live: Option<LiveMetrics>,
    /// Why the live-metrics thread failed (read by the report).
    pub(crate) live_error: Option<String>,
    /// What became of the live-metrics output.
    live_output: Option<OutputReport>,
    /// Under `--backend nested`, a Linux run's counts from the outer
    /// QEMU's TCG plugin (`observe::outer_plugin`); `Off` elsewhere.
    pub outer_plugin: crate::observe::qemu_plugin::PluginOutput,
}

impl Default for Measurer {
    fn default() -> Self {
        Self::new()
    }
}

impl Measurer {
    /// Whether the KVM it observes sees the guest's CR3 writes (shadow
    /// paging: its `tlb_flush` follows them).
    pub fn sees_cr3_writes(&self) -> bool {
        self.kvm.sees_cr3_writes
    }

    /// Measures the workload phase.
    pub fn new() -> Self {
        Measurer {
            kvm: ObservedKvm::default(),
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
            live_vcpu_stats: Vec::new(),
            live: None,
            live_error: None,
            live_output: None,
            outer_plugin: Default::default(),
        }
    }

    /// Says which KVM the run runs on (the KVM backend does, before the
    /// boot), for the summary's KVM rows and cross-checks.
    pub fn on_kvm(&mut self, kvm: ObservedKvm) {
        self.kvm = kvm;
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
        if self.live_config.is_some() {
            match vcpus
                .iter()
                .map(KvmStats::from_vcpu)
                .collect::<Result<Vec<_>, _>>()
            {
                Ok(v) => self.live_vcpu_stats = v,
                Err(e) => log::warn!("--metrics-interval: per-vCPU stats: {e}"),
            }
        }
    }

    fn on_start(&mut self, ctx: &VmContext<'_>) {
        self.start = Some(self.snapshot(ctx));
        if let Some(cfg) = self.live_config.take() {
            let vcpus = std::mem::take(&mut self.live_vcpu_stats);
            match LiveMetrics::start(cfg, ctx, vcpus) {
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
