//! One VM run, in the manner of Firecracker's builder and vstate:
//! `builder` makes the VM from a [`ResolvedRun`], a `vcpu::Vcpu` owns its
//! run loop on a thread of its own, the `watchdog` (this thread) waits for
//! it, the timeout or a signal, all of them sharing the run's one
//! `stop::StopState`; what is left is a [`RunOutcome`].
//!
//! [`run`] can be called repeatedly in one process (compare runs many VMs);
//! everything it creates is dropped when it returns. It takes only resolved
//! input: what the host can do was settled by [`crate::preflight`](mod@crate::preflight),
//! above this layer, which this layer never calls ([`crate::run_vm`] does both).

pub mod acpi;
pub mod boot_params;
mod builder;
pub mod bzimage;
mod control;
pub mod cpu_config;
pub mod exit;
pub mod kvm;
pub mod kvm_stats;
pub mod loader;
pub mod memory;
pub mod msr;
mod outcome;
pub(crate) mod segments;
mod stop;
mod vcpu;
mod watchdog;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use event_manager::{EventManager, SubscriberOps};
use kvm_ioctls::{VcpuFd, VmFd};
use ptiscope_abi::phase::Marker;
use ptiscope_devices::ConsoleRecorder;
use seccompiler::BpfProgram;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::machine::boot_params::BootParamsError;
use crate::machine::control::{stdin_is_interactive, Control};
use crate::machine::cpu_config::VcpuSetupError;
use crate::machine::exit::ExitCounts;
use crate::machine::kvm::{KvmFlavour, KvmOpenError};
use crate::machine::loader::LoadError;
use crate::machine::memory::{MemoryError, MemoryLayout};
pub use crate::machine::outcome::{PhaseEvent, RunOutcome, StopReason, VcpuOutcome};
use crate::machine::stop::StopState;
use crate::machine::vcpu::{SharedObserver, Vcpu, VcpuEnv};
use crate::signals::{SignalError, TerminationSignals};
use crate::spec::ResolvedRun;

/// What the phase observer may look at, on the vCPU thread, at an exit.
pub struct VmContext<'a> {
    /// The VM.
    pub vm: &'a VmFd,
    /// The vCPU whose exit this is.
    pub vcpu: &'a VcpuFd,
    /// Its index (0: the boot CPU).
    pub vcpu_index: usize,
    /// Userspace exits so far of every vCPU, by index.
    pub exit_totals: &'a [std::sync::atomic::AtomicU64],
    /// Guest memory, e.g. to read the telemetry page.
    pub mem: &'a GuestMemoryMmap,
    /// Where things are in guest memory (the telemetry region among them).
    pub layout: &'a MemoryLayout,
    /// Since the first KVM_RUN.
    pub elapsed: Duration,
    /// This vCPU's userspace exits.
    pub exits: &'a ExitCounts,
}

impl VmContext<'_> {
    /// Userspace exits of all vCPUs so far.
    pub fn all_exits(&self) -> u64 {
        self.exit_totals
            .iter()
            .map(|t| t.load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    }
}

/// Called synchronously on a vCPU thread, so that counters read in
/// `on_phase` belong exactly to the exit that carried the marker. With
/// several vCPUs the calls are serialised (the observer is behind a lock).
pub trait PhaseObserver {
    /// On the VMM's thread, once every vCPU exists and before any runs
    /// (e.g. open a stats fd per vCPU). `vcpus` is indexed like
    /// [`VmContext::vcpu_index`].
    fn on_vcpus(&mut self, _vm: &VmFd, _vcpus: &[VcpuFd]) {}
    /// On the boot vCPU's thread, before its first KVM_RUN.
    fn on_start(&mut self, _ctx: &VmContext<'_>) {}
    /// A valid phase marker, on whichever vCPU wrote it.
    fn on_phase(&mut self, _marker: Marker, _ctx: &VmContext<'_>) {}
    /// On the boot vCPU's thread after its last exit.
    fn on_stop(&mut self, _ctx: &VmContext<'_>) {}
}

/// An observer that does nothing.
pub struct NoObserver;
impl PhaseObserver for NoObserver {}

/// Errors of [`run`]: everything that keeps a VM from running at all.
/// (How a running guest stopped is a [`StopReason`], not an error.)
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// `/dev/kvm` could not be opened.
    #[error(transparent)]
    Kvm(#[from] KvmOpenError),
    /// The memory size is unusable or guest memory could not be mapped.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// The kernel image could not be loaded into guest memory.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The boot structures (PVH start info, E820 map, command line) could
    /// not be written.
    #[error(transparent)]
    BootParams(#[from] BootParamsError),
    /// A KVM ioctl on the VM failed while building it.
    #[error("{what}: {source}")]
    VmSetup {
        /// The ioctl, e.g. `KVM_CREATE_VCPU`.
        what: &'static str,
        /// KVM's error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// A vCPU's registers, CPUID or MSRs could not be set.
    #[error(transparent)]
    Vcpu(#[from] VcpuSetupError),
    /// The console's destination (`--serial-out`) could not be opened.
    #[error(transparent)]
    Output(#[from] crate::output::OpenError),
    /// A host resource (eventfd, thread, device bus) could not be set up.
    #[error("{what}: {source}")]
    Host {
        /// What was being set up.
        what: &'static str,
        /// The host's error.
        #[source]
        source: std::io::Error,
    },
    /// A device could not be placed on the port I/O bus.
    #[error("building the device bus: {0}")]
    DeviceBus(#[source] ptiscope_devices::BusError),
    /// A guest memory region has no host address to give KVM.
    #[error("guest memory host address: {0}")]
    GuestMemoryAddress(#[source] vm_memory::GuestMemoryError),
    /// The kick handler or the termination signalfd could not be set up.
    #[error(transparent)]
    Signal(#[from] SignalError),
    /// A vCPU thread failed before or outside the guest's own stop.
    #[error(transparent)]
    VcpuRun(#[from] vcpu::VcpuRunError),
    /// The watchdog's event loop failed.
    #[error("the event loop failed: {0:?}")]
    EventLoop(event_manager::Error),
    /// The thread of the vCPU with this 0-based index panicked.
    #[error("the vCPU {0} thread panicked")]
    VcpuThreadPanicked(usize),
}

/// What a run's caller settles about the host and hands to [`run`]: the
/// machine reads no host fact and picks no policy of its own (the CLI
/// gathers the facts, `sandbox` compiles the filter), as Firecracker's
/// `Vcpu::start_threaded` is handed its seccomp filter.
#[derive(Debug, Clone, Default)]
pub struct HostSide {
    /// Which KVM backs /dev/kvm (on kvm_pvm a Linux guest's CPUID hides
    /// CMPXCHG16B, see [`cpu_config::CpuidMask`]).
    pub kvm: KvmFlavour,
    /// The seccomp filter every vCPU thread applies just before its first
    /// KVM_RUN (`None`: unconfined, `--no-seccomp`). Its SIGSYS handler is
    /// the caller's to install before the run.
    pub vcpu_filter: Option<Arc<BpfProgram>>,
    /// KVM's supported CPUID table, which every vCPU starts from
    /// ([`cpu_config::supported_cpuid`]; `None`: each vCPU asks KVM).
    pub supported_cpuid: Option<kvm_bindings::CpuId>,
    /// Whether this KVM is `--backend nested`'s inner kvm_amd (an i386
    /// Linux guest's CPUID then hides what QEMU's nested walker breaks).
    pub nested: bool,
}

/// Boots the resolved run and runs it until it stops. See the module docs.
pub fn run(
    run: &ResolvedRun,
    host: &HostSide,
    observer: &mut (dyn PhaseObserver + Send),
) -> Result<RunOutcome, RunError> {
    let setup_start = Instant::now();
    let config = &run.config;
    let mut built = builder::build(run, host)?;

    // Host events.
    let done_evt = EventFd::new(EFD_NONBLOCK).map_err(|source| RunError::Host {
        what: "creating the vCPU eventfd",
        source,
    })?;
    let signals = if config.handle_signals {
        Some(TerminationSignals::new()?)
    } else {
        None
    };
    let stdin = (config.console_input && stdin_is_interactive()).then(|| built.serial.clone());
    let control = Control::new(
        done_evt.try_clone().map_err(|source| RunError::Host {
            what: "cloning the vCPU eventfd",
            source,
        })?,
        signals,
        stdin,
    );
    let mut em: EventManager<Control> = EventManager::new().map_err(RunError::EventLoop)?;
    let control_id = em.add_subscriber(control);
    crate::signals::install_kick_handler()?;
    let setup_time = setup_start.elapsed();

    let count = built.vcpus.len();
    let stop_state = StopState::new(count, done_evt);
    observer.on_vcpus(&built.vm, &built.vcpus);
    let observer: SharedObserver<'_> = Mutex::new(observer);
    let start = Instant::now();
    let vcpus: Vec<Vcpu> = built.vcpus.into_iter().map(Vcpu::new).collect();

    let results = std::thread::scope(|s| -> Result<Vec<_>, RunError> {
        let mut handles = Vec::with_capacity(count);
        for (index, vcpu) in vcpus.into_iter().enumerate() {
            let (observer, stop) = (&observer, &stop_state);
            let (vm, mem, bus, msrs, layout, filter) = (
                &built.vm,
                &built.mem,
                &built.bus,
                &built.msr_answers,
                &run.layout,
                host.vcpu_filter.as_deref(),
            );
            let spawned = std::thread::Builder::new()
                .name(format!("vcpu{index}"))
                .spawn_scoped(s, move || {
                    let env = VcpuEnv {
                        index,
                        stop,
                        start,
                        vm,
                        mem,
                        layout,
                        bus,
                        msrs,
                        filter,
                    };
                    vcpu.run(&env, observer)
                });
            match spawned {
                Ok(h) => handles.push(h),
                Err(source) => {
                    // Stop the vCPUs already running before reporting.
                    for (i, _) in handles.iter().enumerate() {
                        watchdog::stop_vcpu(&stop_state, i);
                    }
                    return Err(RunError::Host {
                        what: "spawning a vCPU thread",
                        source,
                    });
                }
            }
        }
        let loop_error = watchdog::watch(&mut em, control_id, config.timeout, &stop_state);
        // One vCPU stopping stops them all.
        for i in 0..count {
            watchdog::stop_vcpu(&stop_state, i);
        }
        let mut results = Vec::with_capacity(count);
        for (i, h) in handles.into_iter().enumerate() {
            results.push(h.join().map_err(|_| RunError::VcpuThreadPanicked(i))?);
        }
        if let Some(e) = loop_error {
            return Err(RunError::EventLoop(e));
        }
        results
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(RunError::from)
    })?;
    let first = stop_state.first_stop();
    let watchdog_reason = stop_state.watchdog_reason();
    let lead = first
        .and_then(|i| results.iter().find(|r| r.index == i && r.stopped_itself))
        .unwrap_or(&results[0]);
    let stop = match (first, watchdog_reason) {
        (Some(_), _) => lead.stop.clone(),
        (None, Some(r)) => r,
        (None, None) => lead.stop.clone(),
    };
    let stopped_by = first.filter(|_| count > 1).map(|i| i as u32);
    let mut exits = ExitCounts::default();
    for r in &results {
        exits.add(&r.exits);
    }
    let mut phases: Vec<PhaseEvent> = results.iter().flat_map(|r| r.phases.clone()).collect();
    phases.sort_by_key(|p| p.at_ns);
    let vcpu_outcomes: Vec<VcpuOutcome> = results
        .iter()
        .map(|r| VcpuOutcome {
            index: r.index as u32,
            exits: r.exits,
            stop: r.stop.clone(),
            stopped_itself: r.stopped_itself,
        })
        .collect();
    let run_time = results.iter().map(|r| r.run_time).max().unwrap_or_default();

    {
        let mut s = built.serial.lock().unwrap_or_else(|p| p.into_inner());
        s.flush();
    }
    // The console's reader gets until a short grace after the guest stopped
    // (the deadline the live metrics had too) to take what is queued; a
    // reader that stalls costs dropped (and counted) bytes, not a hang.
    let stopped_at = results
        .iter()
        .map(|r| r.stopped_at)
        .max()
        .unwrap_or_else(Instant::now);
    let drain_deadline = stopped_at + crate::output::DRAIN_GRACE;
    let outputs: Vec<_> = built
        .console_queue
        .take()
        .map(|q| q.finish_by(drain_deadline))
        .into_iter()
        .collect();
    let mut rec = built.recorder.lock().unwrap_or_else(|p| p.into_inner());
    rec.flush_partial();
    let rec: &ConsoleRecorder = &rec;
    let stats = rec.stats();
    Ok(RunOutcome {
        stop,
        stopped_by,
        vcpus: vcpu_outcomes,
        run_time,
        setup_time,
        exits,
        machine_lines: rec.machine_lines().to_vec(),
        banner: rec.banner().map(str::to_string),
        console_tail: rec.tail().map(str::to_string).collect(),
        console_bytes: stats.bytes,
        dropped_machine_lines: stats.dropped_machine_lines,
        phases,
        dropped_phase_events: results.iter().map(|r| r.dropped_phases).sum(),
        unknown_accesses: results.iter().map(|r| r.unknown).sum(),
        cmdline: run.boot.cmdline.clone(),
        entry: run.guest.entry,
        arch_capabilities: built.arch_capabilities,
        mem_mib: config.mem_mib,
        telemetry_addr: run.layout.telemetry_addr(),
        outputs,
    })
}
