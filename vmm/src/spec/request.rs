//! What the user asks of one run, before anything is settled.

use std::time::Duration;

use crate::machine::loader::KernelSource;
use crate::machine::memory::DEFAULT_MEM_MIB;
use crate::output::SerialOut;
use crate::spec::cmdline::{CpuVuln, GuestOptions};
use crate::spec::guest::GuestKind;
use crate::spec::linux::LinuxRequest;

/// Default `--timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything one run needs.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The guest image: the embedded one or `--kernel FILE`.
    pub kernel: KernelSource,
    /// Guest RAM in MiB (`--mem`).
    pub mem_mib: u64,
    /// The experiment; `entry=auto` is settled by [`crate::preflight::preflight`].
    pub guest: GuestOptions,
    /// How long the guest may run before it is stopped (`--timeout`).
    pub timeout: Duration,
    /// Where the guest console goes.
    pub serial_out: SerialOut,
    /// What the vCPU reports about Meltdown (`--cpu-vuln`).
    pub cpu_vuln: CpuVuln,
    /// Forward host stdin to the guest serial (only if stdin is a terminal, pipe or socket).
    pub console_input: bool,
    /// Stop cleanly on SIGINT/SIGTERM/SIGHUP. The process must have blocked them
    /// ([`crate::signals::block_termination_signals`]) for this to take effect.
    pub handle_signals: bool,
    /// Extra arguments for QEMU (`--backend qemu` only), e.g. `-icount shift=0`.
    pub qemu_args: Vec<String>,
    /// `--backend qemu`: QEMU's emulated CPU model (`cpu=` in a compare
    /// side), instead of `max`; e.g. an Intel model whose bug list makes
    /// Linux choose its mitigations by itself.
    pub qemu_cpu: Option<String>,
    /// `--backend qemu`: load ptiscope's TCG plugin (host-observed counts;
    /// `--no-plugin` turns it off).
    pub qemu_plugin: bool,
    /// Create KVM's in-kernel irqchip (PIC, IOAPIC, LAPIC). A one-vCPU
    /// ptiscope guest runs with interrupts off and needs none of it (more
    /// vCPUs need the LAPIC for INIT/SIPI and wake-up IPIs); without it a HLT
    /// exits to the VMM (reported as "halted") instead of waiting in KVM,
    /// the serial port raises no interrupt, and VM teardown is cheaper (on
    /// kvm_pvm (software KVM) about 4 ms of a 16 ms boot-to-exit).
    pub irqchip: bool,
    /// vCPUs (`--cpus`), 1..=[`crate::spec::MAX_CPUS`]; the guest
    /// learns the count from `cpus=` on its command line.
    pub cpus: u32,
    /// Which guest: ptiscope's own kernel, or a Linux kernel with
    /// ptiscope's init (`--linux`), settled by [`crate::preflight::preflight`].
    pub guest_kind: GuestKind<LinuxRequest>,
}

impl RunConfig {
    /// Defaults: 128 MiB, 10 s timeout, console to stdout, `entry=auto`.
    pub fn new(kernel: KernelSource) -> Self {
        RunConfig {
            kernel,
            mem_mib: DEFAULT_MEM_MIB,
            guest: GuestOptions::default(),
            timeout: DEFAULT_TIMEOUT,
            serial_out: SerialOut::Stdout,
            cpu_vuln: CpuVuln::Host,
            console_input: false,
            handle_signals: false,
            qemu_args: Vec::new(),
            qemu_cpu: None,
            qemu_plugin: true,
            irqchip: true,
            cpus: 1,
            guest_kind: GuestKind::Companion,
        }
    }
}
