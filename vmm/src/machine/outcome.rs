//! How a run ended and what it left: the stop reason (with registers for
//! crashes), exit counts, the guest's machine lines and the phase markers.

use std::time::Duration;

use crate::machine::cpu_config::RegsSnapshot;
use crate::machine::exit::ExitCounts;
use ptiscope_abi::options::Entry;

/// A phase marker as the VMM saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PhaseEvent {
    /// The phase id ([`ptiscope_abi::phase`]).
    pub id: u16,
    /// Whether this is the phase's end marker (false: its begin).
    pub end: bool,
    /// Since the first KVM_RUN.
    pub at_ns: u64,
    /// Userspace exits so far (of the vCPU that wrote the marker).
    pub exits: u64,
    /// The vCPU that wrote the marker.
    pub vcpu: u32,
}

/// Why the VM stopped. As data (the run document's `stop`,
/// docs/report-json.md) it is `{"code": "<variant>", <its fields>}`; its
/// words are its `Display`, the one place they are written.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum StopReason {
    /// The guest wrote this status to the exit device.
    GuestExit {
        /// The status ([`ptiscope_abi::exit_status`]).
        status: u32,
    },
    /// `--timeout` fired.
    Timeout {
        /// The timeout, in milliseconds.
        after_ms: u64,
    },
    /// SIGINT/SIGTERM/SIGHUP.
    Signal {
        /// The signal number; 0 when none was recorded (the event loop
        /// failed, or a vCPU was stopped with no reason given).
        signal: i32,
    },
    /// Triple fault.
    Shutdown {
        /// The vCPU's registers at the stop (None: they could not be read).
        regs: Option<RegsSnapshot>,
    },
    /// `--backend qemu`: the guest reset the machine (a triple fault, or a
    /// reboot) and QEMU, started with `-no-reboot`, exited on it. QEMU
    /// says which of the two it was to nobody, and gives no registers.
    Reset,
    /// KVM_EXIT_INTERNAL_ERROR: KVM could not handle an exit itself (e.g.
    /// an instruction its emulator does not know).
    InternalError {
        /// KVM's `KVM_INTERNAL_ERROR_*` code.
        suberror: u32,
        /// The words KVM attached (`ndata` of them).
        data: Vec<u64>,
        /// The vCPU's registers at the stop.
        regs: Option<RegsSnapshot>,
    },
    /// KVM_EXIT_FAIL_ENTRY: the hardware refused to enter the guest.
    FailEntry {
        /// kvm_run's `hardware_entry_failure_reason` (vendor-specific).
        reason: u64,
        /// The host CPU the entry failed on.
        cpu: u32,
        /// The vCPU's registers at the stop.
        regs: Option<RegsSnapshot>,
    },
    /// HLT reached userspace (no in-kernel irqchip): nothing can wake the guest.
    Halted {
        /// The vCPU's registers at the stop.
        regs: Option<RegsSnapshot>,
    },
    /// KVM_EXIT_SYSTEM_EVENT: the guest asked for a reset, shutdown or crash.
    SystemEvent {
        /// KVM's `KVM_SYSTEM_EVENT_*` type.
        event: u32,
    },
    /// An exit the VMM does not expect from this guest.
    Unexpected {
        /// The exit, as `Debug` prints it.
        exit: String,
        /// The vCPU's registers at the stop.
        regs: Option<RegsSnapshot>,
    },
    /// KVM_RUN itself failed.
    KvmRunFailed {
        /// The `errno` of the failed ioctl.
        errno: i32,
    },
}

impl StopReason {
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
            StopReason::Signal { signal } => {
                write!(f, "{}", crate::signals::describe(*signal))
            }
            StopReason::Reset => write!(
                f,
                "guest triple fault or reset under QEMU TCG (QEMU exited on it, -no-reboot); \
                 QEMU gives no registers"
            ),
            StopReason::Shutdown { regs: Some(r) } if r.is_reset_state() => write!(
                f,
                "guest triple fault (KVM_EXIT_SHUTDOWN); the faulting registers are lost: this \
                 KVM reset the vCPU before reporting the shutdown (as AMD SVM does: rip=0xfff0 \
                 cs=0xf000 cr0={:#x} are the reset values, not the guest's); the guest's console \
                 and fault report above say where it was",
                r.cr0
            ),
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

/// How one vCPU of the run ended.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct VcpuOutcome {
    /// The vCPU's 0-based index (0: the boot CPU).
    pub index: u32,
    /// This vCPU's userspace exits.
    pub exits: ExitCounts,
    /// Its own stop reason (a vCPU stopped because another one did shows
    /// the run's watchdog reason or `signal 0`).
    pub stop: StopReason,
    /// Whether its own guest exit stopped it.
    pub stopped_itself: bool,
}

/// The result of one run, for summaries and reports.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RunOutcome {
    /// Why the run stopped: the reason of the vCPU that stopped it, else
    /// the watchdog's.
    pub stop: StopReason,
    /// With several vCPUs: the one whose exit (guest exit, fault, hang
    /// detected by KVM) stopped the VM; None when the watchdog stopped it or
    /// with one vCPU.
    pub stopped_by: Option<u32>,
    /// Per vCPU, by index.
    pub vcpus: Vec<VcpuOutcome>,
    /// From the first KVM_RUN to the stop (of the vCPU that stopped last).
    pub run_time: Duration,
    /// Creating the VM, loading the kernel, setting up the vCPU.
    pub setup_time: Duration,
    /// Userspace exits of all vCPUs (per vCPU: [`RunOutcome::vcpus`]).
    pub exits: ExitCounts,
    /// Console lines starting with `@`, in order.
    pub machine_lines: Vec<String>,
    /// The guest's banner line ([`ptiscope_abi::BANNER_PREFIX`]), if it
    /// printed one.
    pub banner: Option<String>,
    /// The last console lines (for error reports).
    pub console_tail: Vec<String>,
    /// Bytes the guest wrote to the console.
    pub console_bytes: u64,
    /// Machine lines not kept because the recorder's bounds were reached.
    pub dropped_machine_lines: u64,
    /// Phase markers of all vCPUs, in time order.
    pub phases: Vec<PhaseEvent>,
    /// Phase markers not kept beyond [`crate::machine::vcpu::MAX_PHASE_EVENTS`]
    /// per vCPU.
    pub dropped_phase_events: u64,
    /// Guest accesses to ports/MMIO no device claims.
    pub unknown_accesses: u64,
    /// The command line the guest got.
    pub cmdline: String,
    /// The entry method on it (resolved from `auto`; None: no user code runs).
    pub entry: Option<Entry>,
    /// IA32_ARCH_CAPABILITIES as the guest reads it (None: the MSR is absent).
    pub arch_capabilities: Option<u64>,
    /// Guest RAM in MiB.
    pub mem_mib: u64,
    /// Guest-physical address of the telemetry region.
    pub telemetry_addr: u64,
    /// What became of the console output (dropped bytes, write errors).
    pub outputs: Vec<crate::output::OutputReport>,
}

impl RunOutcome {
    /// The stop reason, naming the vCPU that stopped the VM when there
    /// were several.
    pub fn stop_description(&self) -> String {
        match self.stopped_by {
            Some(i) => format!("vCPU {i}: {}", self.stop),
            None => self.stop.to_string(),
        }
    }

    /// Fault lines (`@fault ...`) the guest printed.
    pub fn faults(&self) -> impl Iterator<Item = &str> {
        self.machine_lines
            .iter()
            .map(String::as_str)
            .filter(|l| l.starts_with("@fault"))
    }
}
