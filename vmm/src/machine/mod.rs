//! One VM run: KVM VM + memory + irqchip + devices, a vCPU thread running the
//! exit loop, and this thread as watchdog and event loop.
//!
//! [`run_vm`] can be called repeatedly in one process (compare runs many
//! VMs); everything it creates is dropped when it returns.

pub mod control;
pub mod cpu_config;
pub mod exit;
pub mod loader;
pub mod memory;
pub mod msr;
pub mod signals;

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use event_manager::{EventManager, SubscriberOps};
use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use ptiscope_abi::phase::{Edge, Marker};
use ptiscope_abi::port;
use ptiscope_devices::{
    ConsoleRecorder, EventFdTrigger, ExitDevice, PhaseDevice, PioBus, SerialDevice, UnknownAccesses,
};
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::machine::control::{stdin_is_interactive, Control};
use crate::machine::cpu_config::{RegsSnapshot, VcpuSetupError};
use crate::machine::exit::{dispatch, DispatchCtx, ExitAction, ExitCounts};
use crate::machine::loader::{BootParamsError, KernelSource, LoadError};
use crate::machine::memory::{MemoryError, MemoryLayout, DEFAULT_MEM_MIB};
use crate::machine::msr::MsrAnswers;
use crate::machine::signals::{KickableVcpu, SignalError, TerminationSignals};
use crate::preflight::cmdline::{self, CmdlineError, CpuVuln, Entry, GuestOptions, Pcid};

/// Default `--timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Where the TSS for real-mode emulation goes (Intel needs three pages KVM
/// may use, outside guest RAM: just below 4 GiB, as Firecracker does).
const KVM_TSS_ADDRESS: usize = 0xfffb_d000;
/// The UART's ISA interrupt line.
const COM1_IRQ: u32 = 4;
/// Phase events kept per run; more are counted, not stored.
pub const MAX_PHASE_EVENTS: usize = 1 << 16;

/// Where the guest console goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SerialOut {
    Stdout,
    File(PathBuf),
    /// Recorded (machine lines, banner) but not printed.
    Discard,
}

/// Everything one run needs.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub kernel: KernelSource,
    pub mem_mib: u64,
    /// The experiment; `entry: Some(Entry::Auto)` is resolved by [`crate::preflight::host::resolve_entry`].
    pub guest: GuestOptions,
    pub timeout: Duration,
    pub serial_out: SerialOut,
    pub cpu_vuln: CpuVuln,
    /// Forward host stdin to the guest serial (only if stdin is a terminal, pipe or socket).
    pub console_input: bool,
    /// Stop cleanly on SIGINT/SIGTERM. The process must have blocked them
    /// ([`crate::machine::signals::block_termination_signals`]) for this to take effect.
    pub handle_signals: bool,
    /// Extra arguments for QEMU (`--backend qemu` only), e.g. `-icount shift=0`.
    pub qemu_args: Vec<String>,
    /// Create KVM's in-kernel irqchip (PIC, IOAPIC, LAPIC). The ptiscope
    /// guest runs with interrupts off and needs none of it; without it a HLT
    /// exits to the VMM (reported as "halted") instead of waiting in KVM,
    /// the serial port raises no interrupt, and VM teardown is cheaper (on
    /// this workplace's KVM about 4 ms of a 16 ms boot-to-exit).
    pub irqchip: bool,
}

impl RunConfig {
    /// Defaults: 128 MiB, 10 s timeout, console to stdout, `entry=auto`.
    pub fn new(kernel: KernelSource) -> Self {
        RunConfig {
            kernel,
            mem_mib: DEFAULT_MEM_MIB,
            guest: GuestOptions {
                entry: Some(Entry::Auto),
                ..Default::default()
            },
            timeout: DEFAULT_TIMEOUT,
            serial_out: SerialOut::Stdout,
            cpu_vuln: CpuVuln::Host,
            console_input: false,
            handle_signals: false,
            qemu_args: Vec::new(),
            irqchip: true,
        }
    }
}

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

/// A phase marker as the VMM saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PhaseEvent {
    pub id: u16,
    pub end: bool,
    /// Since the first KVM_RUN.
    pub at_ns: u64,
    /// Userspace exits so far.
    pub exits: u64,
}

/// Why the VM stopped.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StopReason {
    /// The guest wrote this status to the exit device.
    GuestExit {
        status: u32,
    },
    /// `--timeout` fired.
    Timeout {
        after_ms: u64,
    },
    /// SIGINT/SIGTERM.
    Signal {
        signal: i32,
    },
    /// Triple fault.
    Shutdown {
        regs: Option<RegsSnapshot>,
    },
    InternalError {
        suberror: u32,
        data: Vec<u64>,
        regs: Option<RegsSnapshot>,
    },
    FailEntry {
        reason: u64,
        cpu: u32,
        regs: Option<RegsSnapshot>,
    },
    /// HLT reached userspace (no in-kernel irqchip): nothing can wake the guest.
    Halted {
        regs: Option<RegsSnapshot>,
    },
    SystemEvent {
        event: u32,
    },
    Unexpected {
        exit: String,
        regs: Option<RegsSnapshot>,
    },
    /// KVM_RUN itself failed.
    KvmRunFailed {
        errno: i32,
    },
}

/// Process exit codes (the guest's status is passed through when it fits).
pub mod exit_code {
    /// Guest statuses above this are reported as this.
    pub const GUEST_STATUS_MAX: i32 = 63;
    /// Bad command-line usage or option value.
    pub const USAGE: i32 = 64;
    /// The kernel image is not a bootable PVH ELF for this memory size.
    pub const BAD_IMAGE: i32 = 65;
    /// The kernel image file is missing or unreadable.
    pub const NO_IMAGE: i32 = 66;
    /// /dev/kvm is missing, not accessible, or lacks something required.
    pub const KVM_UNAVAILABLE: i32 = 69;
    /// An unexpected failure inside the VMM (an ioctl that should work did not).
    pub const INTERNAL: i32 = 70;
    /// The `--serial-out` file cannot be created.
    pub const CANT_CREATE: i32 = 73;
    /// The guest triple-faulted (KVM_EXIT_SHUTDOWN).
    pub const TRIPLE_FAULT: i32 = 80;
    /// KVM could not run the guest further: internal error, failed entry,
    /// unexpected exit, HLT with nothing to wake it.
    pub const VM_ERROR: i32 = 81;
    /// `--timeout` fired.
    pub const TIMEOUT: i32 = 124;
    /// SIGINT (128 + 2) and SIGTERM (128 + 15).
    pub const SIGINT: i32 = 130;
    pub const SIGTERM: i32 = 143;
}

impl StopReason {
    /// The process exit code for this stop.
    pub fn exit_code(&self) -> i32 {
        match self {
            StopReason::GuestExit { status } => i32::try_from(*status)
                .map_or(exit_code::GUEST_STATUS_MAX, |s| {
                    s.min(exit_code::GUEST_STATUS_MAX)
                }),
            StopReason::Timeout { .. } => exit_code::TIMEOUT,
            StopReason::Signal { signal } => 128 + signal,
            StopReason::Shutdown { .. } => exit_code::TRIPLE_FAULT,
            _ => exit_code::VM_ERROR,
        }
    }

    /// Registers captured at the stop, if this kind of stop has them.
    pub fn regs(&self) -> Option<&RegsSnapshot> {
        match self {
            StopReason::Shutdown { regs }
            | StopReason::InternalError { regs, .. }
            | StopReason::FailEntry { regs, .. }
            | StopReason::Halted { regs }
            | StopReason::Unexpected { regs, .. } => regs.as_ref(),
            _ => None,
        }
    }
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let regs = |f: &mut std::fmt::Formatter<'_>, r: &Option<RegsSnapshot>| match r {
            Some(r) => write!(f, "; registers: {r}"),
            None => write!(f, "; registers unavailable"),
        };
        match self {
            StopReason::GuestExit { status } => write!(
                f,
                "guest exited with status {status} ({})",
                ptiscope_abi::exit_status::name(*status)
            ),
            StopReason::Timeout { after_ms } => {
                write!(f, "timeout: the guest was stopped after {after_ms} ms")
            }
            StopReason::Signal { signal } => write!(f, "stopped by signal {signal}"),
            StopReason::Shutdown { regs: r } => {
                write!(f, "guest triple fault (KVM_EXIT_SHUTDOWN)")?;
                regs(f, r)?;
                if r.is_some_and(|r| r.looks_like_32bit_paging()) {
                    write!(
                        f,
                        "; the guest was using or enabling paging outside long mode \
                         (32-bit or PAE paging): some KVMs (kvm_pvm) refuse that"
                    )?;
                }
                Ok(())
            }
            StopReason::InternalError {
                suberror,
                data,
                regs: r,
            } => {
                write!(
                    f,
                    "KVM internal error (KVM_EXIT_INTERNAL_ERROR) suberror {suberror}, data {data:x?}"
                )?;
                regs(f, r)
            }
            StopReason::FailEntry {
                reason,
                cpu,
                regs: r,
            } => {
                write!(
                    f,
                    "KVM could not enter the guest (KVM_EXIT_FAIL_ENTRY) reason {reason:#x} on cpu {cpu}"
                )?;
                regs(f, r)
            }
            StopReason::Halted { regs: r } => {
                write!(f, "guest halted with nothing to wake it")?;
                regs(f, r)
            }
            StopReason::SystemEvent { event } => write!(f, "guest system event {event}"),
            StopReason::Unexpected { exit, regs: r } => {
                write!(f, "unexpected VM exit {exit}")?;
                regs(f, r)
            }
            StopReason::KvmRunFailed { errno } => write!(
                f,
                "KVM_RUN failed: {}",
                std::io::Error::from_raw_os_error(*errno)
            ),
        }
    }
}

/// The result of one run, for summaries and reports.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunOutcome {
    pub stop: StopReason,
    /// From the first KVM_RUN to the stop.
    pub run_time: Duration,
    /// Creating the VM, loading the kernel, setting up the vCPU.
    pub setup_time: Duration,
    pub exits: ExitCounts,
    /// Console lines starting with `@`, in order.
    pub machine_lines: Vec<String>,
    pub banner: Option<String>,
    /// The last console lines (for error reports).
    pub console_tail: Vec<String>,
    pub console_bytes: u64,
    pub dropped_machine_lines: u64,
    pub phases: Vec<PhaseEvent>,
    pub dropped_phase_events: u64,
    /// Guest accesses to ports/MMIO no device claims.
    pub unknown_accesses: u64,
    /// The command line the guest got.
    pub cmdline: String,
    /// The entry method on it (resolved from `auto`).
    pub entry: Option<Entry>,
    /// IA32_ARCH_CAPABILITIES as the guest reads it (None: the MSR is absent).
    pub arch_capabilities: Option<u64>,
    pub mem_mib: u64,
    pub telemetry_addr: u64,
}

impl RunOutcome {
    pub fn exit_code(&self) -> i32 {
        self.stop.exit_code()
    }

    /// Fault lines (`@fault ...`) the guest printed.
    pub fn faults(&self) -> impl Iterator<Item = &str> {
        self.machine_lines
            .iter()
            .map(String::as_str)
            .filter(|l| l.starts_with("@fault"))
    }
}

/// Errors opening KVM.
#[derive(Debug, thiserror::Error)]
pub enum KvmOpenError {
    #[error(
        "{path} does not exist: KVM is not available on this host \
         (enable virtualization in the firmware and load kvm_intel or kvm_amd, \
         or run on a KVM-enabled machine)"
    )]
    Missing { path: String },
    #[error(
        "permission denied opening {path}: add your user to the kvm group \
         (`sudo usermod -aG kvm $USER`, then log in again) and check `ls -l {path}`"
    )]
    Permission { path: String },
    #[error("cannot open {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error("{path} is not a usable KVM device (KVM_GET_API_VERSION: {detail})")]
    NotKvm { path: String, detail: String },
}

/// Errors of [`run_vm`]: everything that keeps a VM from running at all.
/// (How a running guest stopped is a [`StopReason`], not an error.)
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Kvm(#[from] KvmOpenError),
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error(transparent)]
    Cmdline(#[from] CmdlineError),
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
    #[error("cannot create --serial-out file {path}: {source}")]
    SerialOut {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Host {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Signal(#[from] SignalError),
    #[error(transparent)]
    Sandbox(#[from] crate::sandbox::SandboxError),
    #[error("the event loop failed: {0:?}")]
    EventLoop(event_manager::Error),
    #[error("the vCPU thread panicked")]
    VcpuThreadPanicked,
    /// The host cannot run what was asked (an entry or PCID the probe found missing).
    #[error("{0}")]
    Unsupported(String),
}

impl RunError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            RunError::Kvm(_)
            | RunError::Unsupported(_)
            | RunError::Vcpu(
                VcpuSetupError::SetMsrs { .. }
                | VcpuSetupError::SetMsrsIoctl(_)
                | VcpuSetupError::TrapMsr(_),
            ) => exit_code::KVM_UNAVAILABLE,
            RunError::Memory(MemoryError::Allocate { .. }) => exit_code::INTERNAL,
            RunError::Memory(_) | RunError::Cmdline(_) => exit_code::USAGE,
            RunError::Load(LoadError::Read { .. }) => exit_code::NO_IMAGE,
            RunError::Load(LoadError::Scratch(..)) => exit_code::INTERNAL,
            RunError::Load(_) => exit_code::BAD_IMAGE,
            RunError::SerialOut { .. } => exit_code::CANT_CREATE,
            _ => exit_code::INTERNAL,
        }
    }
}

/// The KVM device path (`PTISCOPE_KVM_DEVICE` overrides it, for tests of the
/// error paths and for hosts with an unusual device node).
pub fn kvm_device_path() -> String {
    std::env::var("PTISCOPE_KVM_DEVICE").unwrap_or_else(|_| "/dev/kvm".into())
}

/// Opens KVM with messages that say what to do.
pub fn open_kvm() -> Result<Kvm, KvmOpenError> {
    let path = kvm_device_path();
    let cpath = std::ffi::CString::new(path.clone())
        .map_err(|_| KvmOpenError::Missing { path: path.clone() })?;
    let kvm = Kvm::new_with_path(&cpath).map_err(|source| match source.errno() {
        libc::ENOENT | libc::ENODEV | libc::ENXIO => KvmOpenError::Missing { path: path.clone() },
        libc::EACCES | libc::EPERM => KvmOpenError::Permission { path: path.clone() },
        _ => KvmOpenError::Open {
            path: path.clone(),
            source,
        },
    })?;
    // SAFETY-free check that this really is KVM: the ioctl fails on other files.
    let version = kvm.get_api_version();
    if version != kvm_bindings::KVM_API_VERSION as i32 {
        let detail = if version < 0 {
            "the ioctl failed".to_string()
        } else {
            format!(
                "version {version}, expected {}",
                kvm_bindings::KVM_API_VERSION
            )
        };
        return Err(KvmOpenError::NotKvm { path, detail });
    }
    Ok(kvm)
}

fn vm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> RunError {
    move |source| RunError::VmSetup { what, source }
}

/// Creates the VM: memory slots, TSS, in-kernel irqchip.
fn create_vm(kvm: &Kvm, mem: &GuestMemoryMmap, irqchip: bool) -> Result<VmFd, RunError> {
    let vm = kvm.create_vm().map_err(vm_err("KVM_CREATE_VM"))?;
    for (slot, region) in mem.iter().enumerate() {
        let host = mem
            .get_host_address(region.start_addr())
            .map_err(|e| RunError::Host {
                what: "guest memory host address",
                source: std::io::Error::other(e.to_string()),
            })?;
        let r = kvm_userspace_memory_region {
            slot: slot as u32,
            flags: 0,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: host as u64,
        };
        // SAFETY: the region is a live mapping owned by `mem`, which outlives
        // the VM in run_vm (the VM fd is dropped first).
        unsafe { vm.set_user_memory_region(r) }.map_err(vm_err("KVM_SET_USER_MEMORY_REGION"))?;
    }
    vm.set_tss_address(KVM_TSS_ADDRESS)
        .map_err(vm_err("KVM_SET_TSS_ADDR"))?;
    if irqchip {
        vm.create_irq_chip().map_err(vm_err("KVM_CREATE_IRQCHIP"))?;
    }
    Ok(vm)
}

struct VcpuRun {
    stop: StopReason,
    exits: ExitCounts,
    phases: Vec<PhaseEvent>,
    dropped_phases: u64,
    unknown: u64,
    run_time: Duration,
}

struct Shared<'a> {
    stop_requested: &'a AtomicBool,
    finished: &'a AtomicBool,
    done_evt: &'a EventFd,
}

fn internal_error_details(vcpu: &mut VcpuFd) -> (u32, Vec<u64>) {
    let run = vcpu.get_kvm_run();
    // SAFETY: exit_reason is KVM_EXIT_INTERNAL_ERROR, so `internal` is the
    // union member KVM filled in.
    let internal = unsafe { run.__bindgen_anon_1.internal };
    let n = (internal.ndata as usize).min(internal.data.len());
    (internal.suberror, internal.data[..n].to_vec())
}

#[allow(clippy::too_many_arguments)]
fn vcpu_thread(
    vcpu: VcpuFd,
    vm: &VmFd,
    mem: &GuestMemoryMmap,
    layout: &MemoryLayout,
    bus: &PioBus,
    msrs: &MsrAnswers,
    observer: &mut (dyn PhaseObserver + Send),
    shared: Shared<'_>,
    stop_kind: &Mutex<Option<StopReason>>,
) -> Result<VcpuRun, RunError> {
    let result = (|| {
        let mut kv = KickableVcpu::new(vcpu)?;
        let mut exits = ExitCounts::default();
        let mut unknown = UnknownAccesses::new();
        let mut phases = Vec::new();
        let mut dropped_phases = 0u64;
        let start = Instant::now();
        observer.on_start(&VmContext {
            vm,
            vcpu: &kv.vcpu,
            mem,
            layout,
            elapsed: Duration::ZERO,
            exits: &exits,
        });
        // Set-up is done (on_start opened its stats fds): from here the
        // thread handles what the guest does, under its seccomp filter.
        crate::sandbox::confine(crate::sandbox::ThreadKind::Vcpu)?;
        let stop = loop {
            if shared.stop_requested.load(Ordering::SeqCst) {
                break None;
            }
            let action = match kv.vcpu.run() {
                Ok(exit) => dispatch(
                    exit,
                    &mut DispatchCtx {
                        bus,
                        unknown: &mut unknown,
                        counts: &mut exits,
                        msrs,
                    },
                ),
                Err(e) if e.errno() == libc::EINTR => {
                    exits.intr += 1;
                    ExitAction::Interrupted
                }
                Err(e) if e.errno() == libc::EAGAIN => ExitAction::Continue,
                Err(e) => break Some(StopReason::KvmRunFailed { errno: e.errno() }),
            };
            let regs = |v: &VcpuFd| RegsSnapshot::read(v);
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
                        });
                    } else {
                        dropped_phases += 1;
                    }
                    observer.on_phase(
                        m,
                        &VmContext {
                            vm,
                            vcpu: &kv.vcpu,
                            mem,
                            layout,
                            elapsed,
                            exits: &exits,
                        },
                    );
                }
                ExitAction::Interrupted => {
                    if shared.stop_requested.load(Ordering::SeqCst) {
                        break None;
                    }
                    // A signal that was not ours (or a stale kick): run on.
                    kv.vcpu.set_kvm_immediate_exit(0);
                }
                ExitAction::GuestExit(status) => break Some(StopReason::GuestExit { status }),
                ExitAction::Halted => {
                    break Some(StopReason::Halted {
                        regs: regs(&kv.vcpu),
                    })
                }
                ExitAction::Shutdown => {
                    break Some(StopReason::Shutdown {
                        regs: regs(&kv.vcpu),
                    })
                }
                ExitAction::InternalError => {
                    let (suberror, data) = internal_error_details(&mut kv.vcpu);
                    break Some(StopReason::InternalError {
                        suberror,
                        data,
                        regs: regs(&kv.vcpu),
                    });
                }
                ExitAction::FailEntry { reason, cpu } => {
                    break Some(StopReason::FailEntry {
                        reason,
                        cpu,
                        regs: regs(&kv.vcpu),
                    })
                }
                ExitAction::SystemEvent(event) => break Some(StopReason::SystemEvent { event }),
                ExitAction::Unexpected(exit) => {
                    break Some(StopReason::Unexpected {
                        exit,
                        regs: regs(&kv.vcpu),
                    })
                }
            }
        };
        let run_time = start.elapsed();
        observer.on_stop(&VmContext {
            vm,
            vcpu: &kv.vcpu,
            mem,
            layout,
            elapsed: run_time,
            exits: &exits,
        });
        // None: stopped on request; the watchdog knows why.
        let stop = stop.unwrap_or_else(|| {
            stop_kind
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
                .unwrap_or(StopReason::Signal { signal: 0 })
        });
        Ok(VcpuRun {
            stop,
            exits,
            phases,
            dropped_phases,
            unknown: unknown.total(),
            run_time,
        })
    })();
    shared.finished.store(true, Ordering::SeqCst);
    let _ = shared.done_evt.write(1);
    result
}

/// Whether a guest command line makes the guest run user code: any
/// workload but `none`, or a fault raised from user mode.
fn runs_user_code(cmdline: &str) -> bool {
    cmdline
        .split_whitespace()
        .any(|kv| match kv.split_once('=') {
            Some(("workload", w)) => w != "none",
            Some(("fault", f)) => f == "kread",
            _ => false,
        })
}

/// Boots `config.kernel` and runs it until it stops. See the module docs.
pub fn run_vm(
    config: &RunConfig,
    observer: &mut (dyn PhaseObserver + Send),
) -> Result<RunOutcome, RunError> {
    let setup_start = Instant::now();
    let layout = MemoryLayout::new(config.mem_mib)?;

    let mut guest = config.guest.clone();
    // Validate the command line before touching KVM (an unresolved entry
    // stands in as int3 for the check): bad input is reported the same way
    // on hosts without KVM.
    let runs_user_code = {
        let mut probe_guest = guest.clone();
        if probe_guest.entry == Some(Entry::Auto) {
            probe_guest.entry = Some(Entry::Int3);
        }
        let line = cmdline::build(&probe_guest, layout.telemetry_addr())?;
        runs_user_code(&line)
    };
    // A guest that runs no user code enters the kernel by no syscall: don't
    // spend the entry probe's few milliseconds on a boot-only run.
    if guest.entry == Some(Entry::Auto) && !runs_user_code {
        guest.entry = None;
    }

    // Read and check the image before touching KVM, for the same reason.
    let image = loader::read_image(&config.kernel)?;
    let image_name = config.kernel.describe();
    loader::check_image(&image, &image_name, &layout)?;

    let kvm = open_kvm()?;
    // The i386 flavour turns on PAE paging outside long mode, which some
    // KVMs (kvm_pvm) refuse with a #GP the guest cannot survive: say so
    // before booting rather than report a triple fault.
    if loader::is_elf32(&image) {
        if let Some((false, detail)) = crate::preflight::host::pae_paging_usable() {
            return Err(RunError::Unsupported(format!(
                "{image_name} is a 32-bit (i386 PAE) guest, but this host's KVM refuses 32-bit \
                 paging outside long mode (probe: {detail}). Run it under QEMU instead \
                 (`ptiscope run --backend qemu`) or on a KVM host with hardware virtualization"
            )));
        }
    }
    // What the host can deliver, from the (cached) probe: resolve
    // entry=auto, refuse what cannot run before the guest boots.
    match guest.entry {
        Some(Entry::Auto) => guest.entry = Some(crate::preflight::host::resolve_entry()),
        Some(e) => crate::preflight::host::check_entry(e).map_err(RunError::Unsupported)?,
        None => {}
    }
    if guest.pcid == Some(Pcid::On) {
        if let Some((false, detail)) = crate::preflight::host::pcid_usable() {
            return Err(RunError::Unsupported(format!(
                "--pcid on: this host's vCPU has no usable PCID (probe: {detail}); use --pcid off"
            )));
        }
    }
    let cmdline = cmdline::build(&guest, layout.telemetry_addr())?;
    let mem = layout.create_guest_memory()?;
    let loaded = loader::load_bytes(&mem, &layout, &image_name, &image)?;
    loader::write_boot_params(&mem, &layout, &cmdline)?;
    let vm = create_vm(&kvm, &mem, config.irqchip)?;

    // Devices.
    let out: Option<Box<dyn std::io::Write + Send>> = match &config.serial_out {
        SerialOut::Stdout => Some(Box::new(std::io::stdout())),
        SerialOut::Discard => None,
        SerialOut::File(path) => Some(Box::new(File::create(path).map_err(|source| {
            RunError::SerialOut {
                path: path.clone(),
                source,
            }
        })?)),
    };
    let irq = EventFd::new(EFD_NONBLOCK).map_err(|source| RunError::Host {
        what: "creating the serial interrupt eventfd",
        source,
    })?;
    if config.irqchip {
        vm.register_irqfd(&irq, COM1_IRQ)
            .map_err(vm_err("KVM_IRQFD (serial)"))?;
    }
    let (serial, recorder) = SerialDevice::with_output(EventFdTrigger(irq), out);
    let serial = Arc::new(Mutex::new(serial));
    let mut bus = PioBus::new();
    let bus_err = |e: ptiscope_devices::BusError| RunError::Host {
        what: "building the device bus",
        source: std::io::Error::other(e.to_string()),
    };
    bus.insert(port::SERIAL_COM1, port::SERIAL_LEN, serial.clone())
        .map_err(bus_err)?;
    bus.insert(port::EXIT, port::EXIT_LEN, Arc::new(Mutex::new(ExitDevice)))
        .map_err(bus_err)?;
    bus.insert(
        port::PHASE,
        port::PHASE_LEN,
        Arc::new(Mutex::new(PhaseDevice)),
    )
    .map_err(bus_err)?;

    // vCPU.
    let vcpu = vm.create_vcpu(0).map_err(vm_err("KVM_CREATE_VCPU"))?;
    let vcpu_msrs = cpu_config::configure(&kvm, &vm, &vcpu, loaded.entry, config.cpu_vuln)?;
    let arch_capabilities = vcpu_msrs.arch_capabilities;
    let msr_answers = vcpu_msrs.answers;

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
    let stdin = (config.console_input && stdin_is_interactive()).then(|| serial.clone());
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
    crate::machine::signals::install_kick_handler()?;
    let setup_time = setup_start.elapsed();

    let stop_requested = AtomicBool::new(false);
    let finished = AtomicBool::new(false);
    let stop_kind: Mutex<Option<StopReason>> = Mutex::new(None);
    let vcpu_tid: std::sync::OnceLock<libc::pthread_t> = std::sync::OnceLock::new();

    let vcpu_result = std::thread::scope(|s| -> Result<_, RunError> {
        let handle = std::thread::Builder::new()
            .name("vcpu0".into())
            .spawn_scoped(s, || {
                // SAFETY: pthread_self has no preconditions.
                let _ = vcpu_tid.set(unsafe { libc::pthread_self() });
                vcpu_thread(
                    vcpu,
                    &vm,
                    &mem,
                    &layout,
                    &bus,
                    &msr_answers,
                    observer,
                    Shared {
                        stop_requested: &stop_requested,
                        finished: &finished,
                        done_evt: &done_evt,
                    },
                    &stop_kind,
                )
            })
            .map_err(|source| RunError::Host {
                what: "spawning the vCPU thread",
                source,
            })?;

        let deadline = Instant::now() + config.timeout;
        let mut loop_error = None;
        loop {
            if finished.load(Ordering::SeqCst) {
                break;
            }
            let ctl = em.subscriber_mut(control_id).ok();
            if let Some(sig) = ctl.as_ref().and_then(|c| c.signal) {
                *stop_kind.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(StopReason::Signal { signal: sig });
                break;
            }
            if ctl.is_some_and(|c| c.vcpu_done) {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                *stop_kind.lock().unwrap_or_else(|p| p.into_inner()) = Some(StopReason::Timeout {
                    after_ms: config.timeout.as_millis() as u64,
                });
                break;
            }
            let wait_ms = (deadline - now).as_millis().clamp(1, i32::MAX as u128) as i32;
            if let Err(e) = em.run_with_timeout(wait_ms) {
                loop_error = Some(e);
                *stop_kind.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(StopReason::Signal { signal: 0 });
                break;
            }
        }

        // Stop the vCPU if it is still running: flag first, then kick until
        // it acknowledges (the handler's immediate_exit makes one kick
        // enough; repeating covers any signal lost to a race).
        stop_requested.store(true, Ordering::SeqCst);
        let mut kicks = 0u32;
        while !finished.load(Ordering::SeqCst) {
            if let Some(&tid) = vcpu_tid.get() {
                // SAFETY: `tid` is the vCPU thread, which is still alive: it
                // cannot be joined before `finished` is set, and it is joined
                // only below.
                let rc = unsafe { libc::pthread_kill(tid, crate::machine::signals::kick_signal()) };
                if rc != 0 {
                    log::warn!(
                        "kicking the vCPU thread: {}",
                        std::io::Error::from_raw_os_error(rc)
                    );
                }
            }
            kicks += 1;
            if kicks == 1000 {
                log::warn!("the vCPU thread has not stopped after 1000 kicks; still trying");
            }
            std::thread::sleep(Duration::from_micros(if kicks < 100 {
                200
            } else {
                10_000
            }));
        }
        let r = handle.join().map_err(|_| RunError::VcpuThreadPanicked)?;
        if let Some(e) = loop_error {
            return Err(RunError::EventLoop(e));
        }
        r
    })?;

    {
        let mut s = serial.lock().unwrap_or_else(|p| p.into_inner());
        s.flush();
    }
    let mut rec = recorder.lock().unwrap_or_else(|p| p.into_inner());
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
        cmdline,
        entry: guest.entry,
        arch_capabilities,
        mem_mib: config.mem_mib,
        telemetry_addr: layout.telemetry_addr(),
    })
}
