//! One VM run, in the manner of Firecracker's builder and vstate:
//! [`builder`] makes the VM from a [`ResolvedRun`], a [`vcpu::Vcpu`] owns
//! its run loop on a thread of its own, the [`watchdog`] (this thread)
//! waits for it, the timeout or a signal, and [`outcome`] is what is left.
//!
//! [`run`] can be called repeatedly in one process (compare runs many VMs);
//! everything it creates is dropped when it returns. It takes only resolved
//! input: what the host can do was settled by [`crate::preflight`].

pub mod builder;
pub mod control;
pub mod cpu_config;
pub mod exit;
pub mod kvm;
pub mod loader;
pub mod memory;
pub mod msr;
pub mod outcome;
pub mod segments;
pub mod signals;
pub mod vcpu;
pub mod watchdog;

use std::sync::atomic::AtomicBool;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use event_manager::{EventManager, SubscriberOps};
use kvm_ioctls::{VcpuFd, VmFd};
use ptiscope_abi::phase::Marker;
use ptiscope_devices::ConsoleRecorder;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::machine::control::{stdin_is_interactive, Control};
use crate::machine::cpu_config::VcpuSetupError;
use crate::machine::exit::ExitCounts;
use crate::machine::kvm::KvmOpenError;
use crate::machine::loader::{BootParamsError, LoadError};
use crate::machine::memory::{MemoryError, MemoryLayout};
pub use crate::machine::outcome::{PhaseEvent, RunOutcome, StopReason};
use crate::machine::signals::{SignalError, TerminationSignals};
use crate::machine::vcpu::{StopLine, Vcpu, VcpuEnv};
use crate::preflight::{PreflightError, ResolvedRun};

/// What the phase observer may look at, on the vCPU thread, at an exit.
pub struct VmContext<'a> {
    pub vm: &'a VmFd,
    pub vcpu: &'a VcpuFd,
    pub mem: &'a GuestMemoryMmap,
    pub layout: &'a MemoryLayout,
    /// Since the first KVM_RUN.
    pub elapsed: Duration,
    pub exits: &'a ExitCounts,
}

/// Called synchronously on the vCPU thread, so that counters read in
/// `on_phase` belong exactly to the exit that carried the marker.
pub trait PhaseObserver {
    /// Before the first KVM_RUN (e.g. open the stats fds).
    fn on_start(&mut self, _ctx: &VmContext<'_>) {}
    /// A valid phase marker.
    fn on_phase(&mut self, _marker: Marker, _ctx: &VmContext<'_>) {}
    /// After the last exit.
    fn on_stop(&mut self, _ctx: &VmContext<'_>) {}
}

/// An observer that does nothing.
pub struct NoObserver;
impl PhaseObserver for NoObserver {}

/// Errors of [`run`]: everything that keeps a VM from running at all.
/// (How a running guest stopped is a [`StopReason`], not an error.)
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Kvm(#[from] KvmOpenError),
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error(transparent)]
    Preflight(#[from] PreflightError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    BootParams(#[from] BootParamsError),
    #[error("{what}: {source}")]
    VmSetup {
        what: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error(transparent)]
    Vcpu(#[from] VcpuSetupError),
    #[error(transparent)]
    Output(#[from] crate::output::OpenError),
    #[error("{what}: {source}")]
    Host {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Signal(#[from] SignalError),
    #[error(transparent)]
    VcpuRun(#[from] vcpu::VcpuRunError),
    #[error("the event loop failed: {0:?}")]
    EventLoop(event_manager::Error),
    #[error("the vCPU thread panicked")]
    VcpuThreadPanicked,
}

/// Boots the resolved run and runs it until it stops. See the module docs.
pub fn run(
    run: &ResolvedRun,
    observer: &mut (dyn PhaseObserver + Send),
) -> Result<RunOutcome, RunError> {
    let setup_start = Instant::now();
    let config = &run.config;
    let mut built = builder::build(run)?;

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
    signals::install_kick_handler()?;
    let setup_time = setup_start.elapsed();

    let stop_requested = AtomicBool::new(false);
    let finished = AtomicBool::new(false);
    let stop_reason: Mutex<Option<StopReason>> = Mutex::new(None);
    let vcpu_tid: OnceLock<libc::pthread_t> = OnceLock::new();
    let env = VcpuEnv {
        vm: &built.vm,
        mem: &built.mem,
        layout: &run.layout,
        bus: &built.bus,
        msrs: &built.msr_answers,
    };
    let line = StopLine {
        stop_requested: &stop_requested,
        stop_reason: &stop_reason,
        finished: &finished,
        done: &done_evt,
    };
    let vcpu = Vcpu::new(built.vcpu);

    let vcpu_result = std::thread::scope(|s| -> Result<_, RunError> {
        let handle = std::thread::Builder::new()
            .name("vcpu0".into())
            .spawn_scoped(s, || {
                // SAFETY: pthread_self has no preconditions.
                let _ = vcpu_tid.set(unsafe { libc::pthread_self() });
                vcpu.run(&env, observer, &line)
            })
            .map_err(|source| RunError::Host {
                what: "spawning the vCPU thread",
                source,
            })?;
        let loop_error =
            watchdog::watch(&mut em, control_id, config.timeout, &finished, &stop_reason);
        watchdog::stop_vcpu(&vcpu_tid, &stop_requested, &finished);
        let r = handle.join().map_err(|_| RunError::VcpuThreadPanicked)?;
        if let Some(e) = loop_error {
            return Err(RunError::EventLoop(e));
        }
        Ok(r?)
    })?;

    {
        let mut s = built.serial.lock().unwrap_or_else(|p| p.into_inner());
        s.flush();
    }
    // The console's reader gets until a short grace after the guest stopped
    // (the deadline the live metrics had too) to take what is queued; a
    // reader that stalls costs dropped (and counted) bytes, not a hang.
    let drain_deadline = vcpu_result.stopped_at + crate::output::DRAIN_GRACE;
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
        stop: vcpu_result.stop,
        run_time: vcpu_result.run_time,
        setup_time,
        exits: vcpu_result.exits,
        machine_lines: rec.machine_lines().to_vec(),
        banner: rec.banner().map(str::to_string),
        console_tail: rec.tail().map(str::to_string).collect(),
        console_bytes: stats.bytes,
        dropped_machine_lines: stats.dropped_machine_lines,
        phases: vcpu_result.phases,
        dropped_phase_events: vcpu_result.dropped_phases,
        unknown_accesses: vcpu_result.unknown,
        cmdline: run.cmdline.clone(),
        entry: run.guest.entry,
        arch_capabilities: built.arch_capabilities,
        mem_mib: config.mem_mib,
        telemetry_addr: run.layout.telemetry_addr(),
        outputs,
    })
}

/// Settles `config` for this host's KVM ([`crate::preflight::preflight`])
/// and runs it ([`run`]): the one-call entry point of the library.
pub fn run_vm(
    config: &crate::preflight::request::RunConfig,
    observer: &mut (dyn PhaseObserver + Send),
) -> Result<RunOutcome, RunError> {
    let resolved = crate::preflight::preflight(config, crate::preflight::Target::Kvm)?;
    run(&resolved, observer)
}
