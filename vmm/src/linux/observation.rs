//! What a host-side observer saw of a Linux run's measured phase: the QEMU
//! plugin's count, or KVM's where it sees the guest's CR3 writes.

use ptiscope_abi::options::Workload;

use super::console::tick_free_cpu;
use crate::machine::RunOutcome;
use crate::observe::qemu_plugin::PluginOutput;
use crate::report::{RunSummary, Source};
use crate::spec::linux::LinuxGuest;

/// What a host-side observer saw during the measured phase: the seam for
/// the QEMU TCG plugin (host-observed CR3 writes and system calls) or
/// KVM's statistics.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct HostPhaseObservation {
    /// Who observed (`qemu-plugin`, `kvm`): one of `SOURCES`.
    pub source: &'static str,
    /// System calls entered in the phase.
    pub syscalls: u64,
    /// MOV-to-CR3 in the phase.
    pub cr3_writes: u64,
    /// Kernel-mode instructions in the phase, if counted.
    pub kernel_instructions: Option<u64>,
}

/// Every observer a [`HostPhaseObservation`] names: what a recorded one
/// (`backend::record`) may say, read back as the same words.
pub const SOURCES: [&str; 4] = [
    "qemu-plugin",
    "kvm tlb_flush of the loop's vCPU, shadow paging",
    "kvm tlb_flush, shadow paging",
    "test",
];

/// A [`HostPhaseObservation`] as a record holds it, its `source` one of
/// [`SOURCES`] by name.
#[derive(serde::Deserialize)]
struct Recorded {
    source: String,
    syscalls: u64,
    cr3_writes: u64,
    kernel_instructions: Option<u64>,
}

// By hand, not derived: a derived one would borrow `source` from its input.
impl<'de> serde::Deserialize<'de> for HostPhaseObservation {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let r = Recorded::deserialize(d)?;
        let source = SOURCES
            .into_iter()
            .find(|k| *k == r.source)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown observer {:?}", r.source)))?;
        Ok(HostPhaseObservation {
            source,
            syscalls: r.syscalls,
            cr3_writes: r.cr3_writes,
            kernel_instructions: r.kernel_instructions,
        })
    }
}

/// The QEMU plugin's view of a Linux run's phase (between the init's two
/// user-mode marker writes, `observe::qemu_plugin::PluginReport::linux_phase`),
/// for the host-side PTI check; `None` without the plugin (`--no-plugin`,
/// the KVM backend), when its file gave no phase (the summary's notes say
/// why), or for sched-messaging, whose context switches between processes
/// write CR3 too (with or without PTI), so that its CR3 writes per system
/// call say nothing exact about PTI: only the system-call loops and
/// poundsyscall (threads of one process) are checked.
pub fn host_observation(plugin: &PluginOutput, guest: &LinuxGuest) -> Option<HostPhaseObservation> {
    use crate::observe::qemu_plugin::{PluginCounter, PluginReport};
    if guest
        .asked()
        .is_none_or(|c| c.workload == Workload::SchedMessaging)
    {
        return None;
    }
    let PluginOutput::File(bytes) = plugin else {
        return None;
    };
    let total = PluginReport::parse(bytes)
        .ok()?
        .linux_phase()
        .ok()?
        .delta
        .total();
    Some(HostPhaseObservation {
        source: SOURCES[0],
        syscalls: total.syscall_entries(),
        cr3_writes: total.get(PluginCounter::Cr3Writes),
        kernel_instructions: Some(total.get(PluginCounter::KernelInsns)),
    })
}

/// The calls a Linux run's phase made, as the init counts them: its
/// iterations, all threads' for poundsyscall, messages for sched-messaging.
pub(super) fn phase_calls(guest: &LinuxGuest) -> u64 {
    guest.asked().as_ref().map_or(0, |c| match c.workload {
        Workload::SchedMessaging => c.messages(),
        Workload::Poundsyscall => c.threads.saturating_mul(c.iterations),
        _ => c.iterations,
    })
}

/// KVM's view of a Linux run's phase on ptiscope's VMM, where KVM sees the
/// guest's CR3 writes: under shadow paging KVM intercepts each one, and
/// without PCID each flushes, so its `tlb_flush` statistic over the phase
/// counts them (ptiscope's own guest, which counts its writes itself, gives
/// exactly as many: 4,002 = 4,002 for 2,001 getpid calls with PTI under
/// `--backend nested --nested-paging shadow`). `vmm` is the host-side
/// observer's summary of the run. `None` under nested paging (NPT/EPT:
/// KVM sees no CR3 write), when the init reports PCID on (a write that
/// keeps the TLB is no flush), without a phase, or for sched-messaging
/// (as [`host_observation`]). The system calls are the init's count of
/// its calls: KVM does not see system calls.
pub fn kvm_observation(
    outcome: &RunOutcome,
    guest: &LinuxGuest,
    vmm: &RunSummary,
    sees_cr3_writes: bool,
) -> Option<HostPhaseObservation> {
    let asked = guest.asked()?;
    if !sees_cr3_writes || asked.workload == Workload::SchedMessaging {
        return None;
    }
    let result = crate::report::result_fields(outcome);
    if result.get("pcid").is_none_or(|p| p != "off") {
        return None;
    }
    vmm.phase.as_ref()?;
    // A loop alone on a tick-free CPU: that vCPU's flushes are its calls'
    // (the other vCPU's, the kernel's housekeeping, are not the loop's).
    let (flushes, source) =
        match tick_free_cpu(outcome).and_then(|cpu| vmm.row(&format!("tlb_flush_vcpu{cpu}"))) {
            Some(r) => (r, SOURCES[1]),
            None => (vmm.row("tlb_flush")?, SOURCES[2]),
        };
    if flushes.metric.source != Source::Kvm {
        return None;
    }
    Some(HostPhaseObservation {
        source,
        syscalls: phase_calls(guest),
        cr3_writes: flushes.total as u64,
        kernel_instructions: None,
    })
}

/// Something that can watch a Linux run from the host and report its
/// measured phase (implemented by the QEMU plugin's parser when it lands).
pub trait HostObserver {
    /// The phase's observation, if the observer saw one.
    fn phase(&self, outcome: &RunOutcome) -> Option<HostPhaseObservation>;
}
