//! A vCPU that owns its run loop: KVM_RUN, exit dispatch, phase markers for
//! the observer, and the stop reason. Each vCPU runs on a thread of its own
//! and stops when the guest stops, when another vCPU stopped the VM, or when
//! the watchdog asks (the [`StopState`]'s kill + a kick).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use kvm_ioctls::{VcpuFd, VmFd};
use ptiscope_abi::phase::Edge;
use ptiscope_devices::{PioBus, UnknownAccesses};
use vm_memory::GuestMemoryMmap;

use crate::machine::cpu_config::RegsSnapshot;
use crate::machine::exit::{dispatch, DispatchCtx, ExitAction, ExitCounts, GuestStop};
use crate::machine::memory::MemoryLayout;
use crate::machine::msr::MsrAnswers;
use crate::machine::outcome::{PhaseEvent, StopReason};
use crate::machine::stop::StopState;
use crate::machine::{PhaseObserver, VmContext};
use crate::signals::{KickableVcpu, SignalError};

/// Phase events kept per run; more are counted, not stored.
pub const MAX_PHASE_EVENTS: usize = 1 << 16;

/// What the vCPU's run loop looks at besides the vCPU itself.
pub struct VcpuEnv<'a> {
    /// This vCPU's index (its KVM vCPU id and APIC id); 0 is the boot CPU.
    pub index: usize,
    /// The run's stop state (kill flag, first stop, exit totals).
    pub stop: &'a StopState,
    /// The run's common time origin (just before the first KVM_RUN).
    pub start: Instant,
    /// The VM, for the observer.
    pub vm: &'a VmFd,
    /// Guest memory, for the observer.
    pub mem: &'a GuestMemoryMmap,
    /// The memory layout, for the observer.
    pub layout: &'a MemoryLayout,
    /// The devices that port-I/O exits go to.
    pub bus: &'a PioBus,
    /// The answers to trapped RDMSRs.
    pub msrs: &'a MsrAnswers,
    /// The seccomp filter the thread applies before its first KVM_RUN
    /// (the run's caller's, [`crate::machine::HostSide`]).
    pub filter: Option<&'a seccompiler::BpfProgram>,
}

/// Errors that end a vCPU thread before or outside the guest's own stop.
#[derive(Debug, thiserror::Error)]
pub enum VcpuRunError {
    /// The thread could not register its vCPU for kicks.
    #[error(transparent)]
    Signal(#[from] SignalError),
    /// The kernel refused the thread's seccomp filter.
    #[error(
        "applying the seccomp filter to the vCPU thread: {0} \
         (a kernel without seccomp-bpf? `--no-seccomp` runs without it)"
    )]
    Seccomp(#[source] seccompiler::Error),
}

/// The observer as the vCPU threads share it: each locks it for a call.
pub type SharedObserver<'a> = Mutex<&'a mut (dyn PhaseObserver + Send)>;

/// What one vCPU's run produced.
pub struct VcpuRun {
    /// The vCPU's 0-based index.
    pub index: usize,
    /// Why it stopped: its own reason, or the one it was stopped with.
    pub stop: StopReason,
    /// Whether this vCPU's own exit stopped it (false: it was asked to stop).
    pub stopped_itself: bool,
    /// Its userspace exits.
    pub exits: ExitCounts,
    /// The phase markers it saw, at most [`MAX_PHASE_EVENTS`].
    pub phases: Vec<PhaseEvent>,
    /// Phase markers beyond [`MAX_PHASE_EVENTS`], counted only.
    pub dropped_phases: u64,
    /// Its accesses to ports and MMIO no device claims.
    pub unknown: u64,
    /// From the run's common start to this vCPU's stop.
    pub run_time: Duration,
    /// When the guest stopped (before the observer's `on_stop`): the
    /// outputs' drain deadline counts from here.
    pub stopped_at: Instant,
}

/// One vCPU and its run loop.
pub struct Vcpu {
    fd: VcpuFd,
}

impl Vcpu {
    /// Wraps a configured vCPU; it runs when [`Vcpu::run`] is called on its thread.
    pub fn new(fd: VcpuFd) -> Self {
        Vcpu { fd }
    }

    /// Runs the guest until it stops or the watchdog stops it. Always
    /// marks this vCPU finished in the stop state, also on error.
    pub fn run(
        self,
        env: &VcpuEnv<'_>,
        observer: &SharedObserver<'_>,
    ) -> Result<VcpuRun, VcpuRunError> {
        env.stop.register_thread(env.index);
        let result = self.run_loop(env, observer);
        if result.is_err() {
            // The others must not run on without this vCPU.
            env.stop.kill();
        }
        env.stop.finish(env.index);
        result
    }

    fn run_loop(
        self,
        env: &VcpuEnv<'_>,
        observer: &SharedObserver<'_>,
    ) -> Result<VcpuRun, VcpuRunError> {
        let observe = |f: &mut dyn FnMut(&mut (dyn PhaseObserver + Send))| {
            let mut o = observer.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut **o)
        };
        let mut kv = KickableVcpu::new(self.fd)?;
        let mut exits = ExitCounts::default();
        let mut unknown = UnknownAccesses::new();
        let mut phases = Vec::new();
        let mut dropped_phases = 0u64;
        let start = env.start;
        fn ctx<'c>(
            env: &'c VcpuEnv<'_>,
            vcpu: &'c VcpuFd,
            elapsed: Duration,
            exits: &'c ExitCounts,
        ) -> VmContext<'c> {
            VmContext {
                vm: env.vm,
                vcpu,
                vcpu_index: env.index,
                exit_totals: env.stop.exit_totals(),
                mem: env.mem,
                layout: env.layout,
                elapsed,
                exits,
            }
        }
        if env.index == 0 {
            observe(&mut |o| o.on_start(&ctx(env, &kv.vcpu, Duration::ZERO, &exits)));
        }
        // Set-up is done (on_start opened its stats fds): from here the
        // thread handles what the guest does, under its seccomp filter.
        if let Some(filter) = env.filter {
            seccompiler::apply_filter(filter).map_err(VcpuRunError::Seccomp)?;
        }
        let stop = loop {
            if env.stop.killed() {
                break None;
            }
            let action = match kv.vcpu.run() {
                Ok(exit) => dispatch(
                    exit,
                    &mut DispatchCtx {
                        bus: env.bus,
                        mem: Some(env.mem),
                        unknown: &mut unknown,
                        counts: &mut exits,
                        msrs: env.msrs,
                    },
                ),
                Err(e) if e.errno() == libc::EINTR => {
                    exits.intr += 1;
                    ExitAction::Interrupted
                }
                Err(e) if e.errno() == libc::EAGAIN => ExitAction::Continue,
                Err(e) => break Some(StopReason::KvmRunFailed { errno: e.errno() }),
            };
            env.stop.record_exits(env.index, exits.total());
            match action {
                ExitAction::Continue => {}
                ExitAction::Phase(m) => {
                    let elapsed = start.elapsed();
                    if phases.len() < MAX_PHASE_EVENTS {
                        phases.push(PhaseEvent {
                            id: m.id,
                            end: m.edge == Edge::End,
                            at_ns: elapsed.as_nanos() as u64,
                            exits: exits.total(),
                            vcpu: env.index as u32,
                        });
                    } else {
                        dropped_phases += 1;
                    }
                    observe(&mut |o| o.on_phase(m, &ctx(env, &kv.vcpu, elapsed, &exits)));
                }
                ExitAction::Interrupted => {
                    if env.stop.killed() {
                        break None;
                    }
                    // A signal that was not ours (or a stale kick): run on.
                    kv.vcpu.set_kvm_immediate_exit(0);
                }
                ExitAction::Stop(stop) => break Some(stop_for(stop, &mut kv.vcpu)),
            }
        };
        let run_time = start.elapsed();
        let stopped_at = Instant::now();
        let stopped_itself = stop.is_some();
        if stopped_itself {
            // This vCPU's guest stopped: the VM stops with it. The first
            // vCPU to get here is the one the run's stop reason names.
            env.stop.guest_stopped(env.index);
        }
        if env.index == 0 {
            observe(&mut |o| o.on_stop(&ctx(env, &kv.vcpu, run_time, &exits)));
        }
        // None: stopped on request; the watchdog (or another vCPU) said why.
        let stop = stop.unwrap_or_else(|| env.stop.reason_for_killed());
        Ok(VcpuRun {
            index: env.index,
            stop,
            stopped_itself,
            exits,
            phases,
            dropped_phases,
            unknown: unknown.total(),
            run_time,
            stopped_at,
        })
    }
}

/// The stop reason for an exit that ends the run, with the registers where
/// they help explain it.
fn stop_for(stop: GuestStop, vcpu: &mut VcpuFd) -> StopReason {
    let regs = |v: &VcpuFd| RegsSnapshot::read(v);
    match stop {
        GuestStop::GuestExit(status) => StopReason::GuestExit { status },
        GuestStop::Halted => StopReason::Halted { regs: regs(vcpu) },
        GuestStop::Shutdown => StopReason::Shutdown { regs: regs(vcpu) },
        GuestStop::InternalError => {
            let (suberror, data) = internal_error_details(vcpu);
            StopReason::InternalError {
                suberror,
                data,
                regs: regs(vcpu),
            }
        }
        GuestStop::FailEntry { reason, cpu } => StopReason::FailEntry {
            reason,
            cpu,
            regs: regs(vcpu),
        },
        GuestStop::SystemEvent(event) => StopReason::SystemEvent { event },
        GuestStop::Unexpected(exit) => StopReason::Unexpected {
            exit,
            regs: regs(vcpu),
        },
    }
}

fn internal_error_details(vcpu: &mut VcpuFd) -> (u32, Vec<u64>) {
    let run = vcpu.get_kvm_run();
    // SAFETY: exit_reason is KVM_EXIT_INTERNAL_ERROR, so `internal` is the
    // union member KVM filled in.
    let internal = unsafe { run.__bindgen_anon_1.internal };
    let n = (internal.ndata as usize).min(internal.data.len());
    (internal.suberror, internal.data[..n].to_vec())
}
