//! VM-exit dispatch: every `VcpuExit` maps to one [`ExitAction`] in one
//! function, and is counted by kind in [`ExitCounts`].

use kvm_ioctls::VcpuExit;
use ptiscope_abi::phase::{self, Marker};
use ptiscope_abi::port;
use ptiscope_devices::{DeviceEvent, PioBus, UnknownAccesses};

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::machine::msr::MsrAnswers;

/// Devices the exit counts distinguish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// The COM1 UART ([`port::SERIAL_COM1`]).
    Serial,
    /// The exit device ([`port::EXIT`]).
    Exit,
    /// The phase-marker port ([`port::PHASE`]).
    Phase,
    /// A port no device claims.
    Unknown,
}

impl DeviceKind {
    fn of_base(base: Option<u16>) -> Self {
        match base {
            Some(port::SERIAL_COM1) => DeviceKind::Serial,
            Some(port::EXIT) => DeviceKind::Exit,
            Some(port::PHASE) => DeviceKind::Phase,
            _ => DeviceKind::Unknown,
        }
    }
}

/// Port-I/O exits per device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PortCounts {
    /// Accesses to the COM1 UART.
    pub serial: u64,
    /// Accesses to the exit device.
    pub exit: u64,
    /// Accesses to the phase-marker port (invalid markers included).
    pub phase: u64,
    /// Accesses to ports no device claims.
    pub unknown: u64,
}

impl PortCounts {
    fn bump(&mut self, kind: DeviceKind) {
        match kind {
            DeviceKind::Serial => self.serial += 1,
            DeviceKind::Exit => self.exit += 1,
            DeviceKind::Phase => self.phase += 1,
            DeviceKind::Unknown => self.unknown += 1,
        }
    }

    /// Port-I/O exits to all devices.
    pub fn total(&self) -> u64 {
        self.serial + self.exit + self.phase + self.unknown
    }

    /// Adds `other`'s counts (another vCPU's) to these.
    pub fn add(&mut self, other: &PortCounts) {
        self.serial += other.serial;
        self.exit += other.exit;
        self.phase += other.phase;
        self.unknown += other.unknown;
    }
}

/// Userspace exits (KVM_RUN returns) by kind, as the VMM saw them. Exits KVM
/// handles in the kernel are not here; the KVM stats fd has those.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExitCounts {
    /// KVM_EXIT_IO port reads (`in`), per device.
    pub io_in: PortCounts,
    /// KVM_EXIT_IO port writes (`out`), per device.
    pub io_out: PortCounts,
    /// KVM_EXIT_MMIO reads (no MMIO device exists: all unknown).
    pub mmio_read: u64,
    /// KVM_EXIT_MMIO writes (phase markers at [`phase::MMIO_MARKER`];
    /// all others unknown, ignored).
    pub mmio_write: u64,
    /// KVM_EXIT_HLT (only without an in-kernel irqchip; ends the run).
    pub hlt: u64,
    /// KVM_EXIT_SHUTDOWN: a triple fault.
    pub shutdown: u64,
    /// KVM_EXIT_INTERNAL_ERROR.
    pub internal_error: u64,
    /// KVM_EXIT_FAIL_ENTRY.
    pub fail_entry: u64,
    /// KVM_EXIT_INTR or KVM_RUN failing with EINTR (a kick from the watchdog or a signal).
    pub intr: u64,
    /// KVM_EXIT_X86_RDMSR / KVM_EXIT_X86_WRMSR: guest accesses to MSRs the
    /// VMM answers itself (`--cpu-vuln`).
    pub rdmsr: u64,
    /// KVM_EXIT_X86_WRMSR: guest writes to the trapped (read-only) MSRs.
    pub wrmsr: u64,
    /// Every other exit: system events, IRQ-window and EOI exits, and the
    /// unexpected ones.
    pub other: u64,
    /// Phase-marker writes that did not decode as a marker (a subset of
    /// `io_out.phase` and of `mmio_write`, the writes to
    /// [`phase::MMIO_MARKER`], so not added again by [`ExitCounts::total`]).
    pub invalid_phase_markers: u64,
}

impl ExitCounts {
    /// All userspace exits.
    pub fn total(&self) -> u64 {
        self.io_in.total()
            + self.io_out.total()
            + self.mmio_read
            + self.mmio_write
            + self.hlt
            + self.shutdown
            + self.internal_error
            + self.fail_entry
            + self.intr
            + self.rdmsr
            + self.wrmsr
            + self.other
    }

    /// Adds `other`'s counts (another vCPU's) to these: the VM's totals.
    pub fn add(&mut self, other: &ExitCounts) {
        self.io_in.add(&other.io_in);
        self.io_out.add(&other.io_out);
        self.mmio_read += other.mmio_read;
        self.mmio_write += other.mmio_write;
        self.hlt += other.hlt;
        self.shutdown += other.shutdown;
        self.internal_error += other.internal_error;
        self.fail_entry += other.fail_entry;
        self.intr += other.intr;
        self.rdmsr += other.rdmsr;
        self.wrmsr += other.wrmsr;
        self.other += other.other;
        self.invalid_phase_markers += other.invalid_phase_markers;
    }
}

/// What the run loop does next (as Firecracker's `VcpuEmulation`: handled,
/// interrupted, or stopped, the stops kept apart in [`GuestStop`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitAction {
    /// Re-enter the guest.
    Continue,
    /// Hand this marker to the phase observer, then re-enter.
    Phase(Marker),
    /// KVM_EXIT_INTR: a signal interrupted the vCPU; the run loop checks why.
    Interrupted,
    /// The guest's run on this vCPU is over.
    Stop(GuestStop),
}

/// An exit that ends the run: what the guest did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestStop {
    /// The guest wrote its exit status.
    GuestExit(u32),
    /// KVM_EXIT_HLT reached userspace (only without an in-kernel irqchip):
    /// nothing can wake the vCPU, so the run ends.
    Halted,
    /// Triple fault (KVM_EXIT_SHUTDOWN).
    Shutdown,
    /// KVM_EXIT_INTERNAL_ERROR (details are in kvm_run; the run loop reads them).
    InternalError,
    /// KVM_EXIT_FAIL_ENTRY.
    FailEntry {
        /// kvm_run's `hardware_entry_failure_reason` (vendor-specific).
        reason: u64,
        /// The host CPU the entry failed on.
        cpu: u32,
    },
    /// KVM_EXIT_SYSTEM_EVENT (reset, shutdown, crash requested by the guest).
    SystemEvent(u32),
    /// An exit the VMM does not expect from this guest.
    Unexpected(String),
}

/// What [`dispatch`] works on.
pub struct DispatchCtx<'a> {
    /// The devices that port I/O goes to.
    pub bus: &'a PioBus,
    /// Guest memory, where the console-line records are read (None: the
    /// console-line port is not offered and reads all ones).
    pub mem: Option<&'a GuestMemoryMmap>,
    /// Where accesses no device claims are logged and counted.
    pub unknown: &'a mut UnknownAccesses,
    /// This vCPU's exit counts, bumped by each dispatch.
    pub counts: &'a mut ExitCounts,
    /// The answers to trapped RDMSRs.
    pub msrs: &'a MsrAnswers,
}

/// A console-line record ([`port::CONSOLE_LINE`]): its bytes go to COM1's
/// THR one by one, exactly as the guest's own `outb`s would (the serial
/// device's output, recorder and interrupts alike). The record is hostile
/// input: a write that is not 32 bits, a record outside guest memory or
/// longer than [`port::CONSOLE_LINE_MAX`] is logged as an unknown access
/// and ignored.
fn console_line(data: &[u8], ctx: &mut DispatchCtx<'_>) {
    let record = <[u8; 4]>::try_from(data)
        .ok()
        .map(|a| u64::from(u32::from_le_bytes(a)));
    let mut bytes = [0u8; port::CONSOLE_LINE_MAX];
    let line = record.zip(ctx.mem).and_then(|(gpa, mem)| {
        let mut len = [0u8; 4];
        mem.read_slice(&mut len, GuestAddress(gpa)).ok()?;
        let line = bytes.get_mut(..u32::from_le_bytes(len) as usize)?;
        mem.read_slice(line, GuestAddress(gpa + 4)).ok()?;
        Some(&*line)
    });
    let Some(line) = line else {
        ctx.unknown.record(
            "console-line record",
            record.unwrap_or(u64::from(port::CONSOLE_LINE)),
            data.len(),
        );
        return;
    };
    for b in line {
        ctx.bus.write(port::SERIAL_COM1, std::slice::from_ref(b));
    }
}

/// Maps one exit to an action. Guest-controlled values never make this
/// fail: unknown ports and MMIO are logged once per address and ignored
/// (reads see all ones, as on an empty ISA bus).
pub fn dispatch(exit: VcpuExit<'_>, ctx: &mut DispatchCtx<'_>) -> ExitAction {
    match exit {
        VcpuExit::IoOut(port::CONSOLE_LINE, data) => {
            ctx.counts.io_out.bump(DeviceKind::Serial);
            console_line(data, ctx);
            ExitAction::Continue
        }
        VcpuExit::IoIn(port::CONSOLE_LINE, data) => {
            ctx.counts.io_in.bump(DeviceKind::Serial);
            // Only a 32-bit read finds the port; else it reads as unclaimed.
            if data.len() == 4 && ctx.mem.is_some() {
                data.copy_from_slice(&port::CONSOLE_LINE_MAGIC.to_le_bytes());
            } else {
                data.fill(0xff);
            }
            ExitAction::Continue
        }
        VcpuExit::IoOut(p, data) => {
            let kind = DeviceKind::of_base(ctx.bus.device_base(p));
            ctx.counts.io_out.bump(kind);
            match ctx.bus.write(p, data) {
                Some(DeviceEvent::None) => ExitAction::Continue,
                Some(DeviceEvent::Exit(status)) => ExitAction::Stop(GuestStop::GuestExit(status)),
                Some(DeviceEvent::Phase(m)) => ExitAction::Phase(m),
                Some(DeviceEvent::InvalidPhase(v)) => {
                    ctx.counts.invalid_phase_markers += 1;
                    log::debug!("invalid phase marker {v:#x}");
                    ExitAction::Continue
                }
                None => {
                    ctx.unknown.record("port write", u64::from(p), data.len());
                    ExitAction::Continue
                }
            }
        }
        VcpuExit::IoIn(p, data) => {
            let kind = DeviceKind::of_base(ctx.bus.device_base(p));
            ctx.counts.io_in.bump(kind);
            if !ctx.bus.read(p, data) {
                ctx.unknown.record("port read", u64::from(p), data.len());
                data.fill(0xff);
            }
            ExitAction::Continue
        }
        VcpuExit::MmioRead(addr, data) => {
            ctx.counts.mmio_read += 1;
            ctx.unknown.record("MMIO read", addr, data.len());
            data.fill(0xff);
            ExitAction::Continue
        }
        VcpuExit::MmioWrite(phase::MMIO_MARKER, data) => {
            // ptiscope's Linux init's phase markers (no I/O permission
            // needed): the same 32-bit value as at the phase port.
            ctx.counts.mmio_write += 1;
            let value = <[u8; 4]>::try_from(data).ok().map(u32::from_le_bytes);
            match value.map(|v| (v, Marker::decode(v))) {
                Some((_, Some(m))) => ExitAction::Phase(m),
                other => {
                    ctx.counts.invalid_phase_markers += 1;
                    log::debug!(
                        "invalid MMIO phase marker {:?} ({} bytes)",
                        other.map(|(v, _)| v),
                        data.len()
                    );
                    ExitAction::Continue
                }
            }
        }
        VcpuExit::MmioWrite(addr, data) => {
            ctx.counts.mmio_write += 1;
            ctx.unknown.record("MMIO write", addr, data.len());
            ExitAction::Continue
        }
        VcpuExit::Hlt => {
            ctx.counts.hlt += 1;
            ExitAction::Stop(GuestStop::Halted)
        }
        VcpuExit::Shutdown => {
            ctx.counts.shutdown += 1;
            ExitAction::Stop(GuestStop::Shutdown)
        }
        VcpuExit::InternalError => {
            ctx.counts.internal_error += 1;
            ExitAction::Stop(GuestStop::InternalError)
        }
        VcpuExit::FailEntry(reason, cpu) => {
            ctx.counts.fail_entry += 1;
            ExitAction::Stop(GuestStop::FailEntry { reason, cpu })
        }
        VcpuExit::Intr => {
            ctx.counts.intr += 1;
            ExitAction::Interrupted
        }
        VcpuExit::X86Rdmsr(exit) => {
            ctx.counts.rdmsr += 1;
            match ctx.msrs.read(exit.index) {
                Some(v) => {
                    *exit.data = v;
                    *exit.error = 0;
                }
                // Not one of ours: the #GP the guest would get for a missing MSR.
                None => *exit.error = 1,
            }
            ExitAction::Continue
        }
        VcpuExit::X86Wrmsr(exit) => {
            // The trapped MSRs are read-only (ARCH_CAPABILITIES): #GP, as on hardware.
            ctx.counts.wrmsr += 1;
            *exit.error = 1;
            ExitAction::Continue
        }
        VcpuExit::SystemEvent(kind, _) => {
            ctx.counts.other += 1;
            ExitAction::Stop(GuestStop::SystemEvent(kind))
        }
        // With the in-kernel irqchip these should not reach userspace; re-entering is harmless.
        VcpuExit::IrqWindowOpen | VcpuExit::IoapicEoi(_) => {
            ctx.counts.other += 1;
            ExitAction::Continue
        }
        other => {
            ctx.counts.other += 1;
            ExitAction::Stop(GuestStop::Unexpected(format!("{other:?}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    use ptiscope_devices::{ExitDevice, PhaseDevice};

    fn bus() -> PioBus {
        let mut b = PioBus::new();
        b.insert(port::EXIT, port::EXIT_LEN, Arc::new(Mutex::new(ExitDevice)))
            .unwrap();
        b.insert(
            port::PHASE,
            port::PHASE_LEN,
            Arc::new(Mutex::new(PhaseDevice)),
        )
        .unwrap();
        b
    }

    /// What a dispatch context borrows besides the bus and memory.
    #[derive(Default)]
    struct Tallies {
        unknown: UnknownAccesses,
        counts: ExitCounts,
        msrs: MsrAnswers,
    }

    impl Tallies {
        fn ctx<'a>(
            &'a mut self,
            bus: &'a PioBus,
            mem: Option<&'a GuestMemoryMmap>,
        ) -> DispatchCtx<'a> {
            DispatchCtx {
                bus,
                mem,
                unknown: &mut self.unknown,
                counts: &mut self.counts,
                msrs: &self.msrs,
            }
        }
    }

    #[test]
    fn every_exit_maps_to_an_action_and_is_counted() {
        let bus = bus();
        let mut t = Tallies::default();
        let mut ctx = t.ctx(&bus, None);
        assert_eq!(
            dispatch(VcpuExit::IoOut(port::EXIT, &[3, 0, 0, 0]), &mut ctx),
            ExitAction::Stop(GuestStop::GuestExit(3))
        );
        let m = Marker::begin(1);
        assert_eq!(
            dispatch(
                VcpuExit::IoOut(port::PHASE, &m.encode().to_le_bytes()),
                &mut ctx
            ),
            ExitAction::Phase(m)
        );
        assert_eq!(
            dispatch(VcpuExit::IoOut(port::PHASE, &[0, 0, 0, 0]), &mut ctx),
            ExitAction::Continue
        );
        let mut d = [0u8; 2];
        assert_eq!(
            dispatch(VcpuExit::IoIn(0x80, &mut d), &mut ctx),
            ExitAction::Continue
        );
        assert_eq!(d, [0xff, 0xff]);
        // The MMIO marker page: the same markers, nothing else.
        let m = Marker::end(1);
        assert_eq!(
            dispatch(
                VcpuExit::MmioWrite(phase::MMIO_MARKER, &m.encode().to_le_bytes()),
                &mut ctx
            ),
            ExitAction::Phase(m)
        );
        assert_eq!(
            dispatch(VcpuExit::MmioWrite(phase::MMIO_MARKER, &[0; 4]), &mut ctx),
            ExitAction::Continue
        );
        assert_eq!(
            dispatch(
                VcpuExit::MmioWrite(phase::MMIO_MARKER, &m.encode().to_le_bytes()[..2]),
                &mut ctx
            ),
            ExitAction::Continue
        );
        assert_eq!(
            dispatch(
                VcpuExit::MmioWrite(phase::MMIO_MARKER + 4, &m.encode().to_le_bytes()),
                &mut ctx
            ),
            ExitAction::Continue
        );
        let mut d = [0u8; 4];
        dispatch(VcpuExit::MmioRead(0xfee0_0000, &mut d), &mut ctx);
        assert_eq!(d, [0xff; 4]);
        assert_eq!(
            dispatch(VcpuExit::Shutdown, &mut ctx),
            ExitAction::Stop(GuestStop::Shutdown)
        );
        assert_eq!(
            dispatch(VcpuExit::FailEntry(7, 0), &mut ctx),
            ExitAction::Stop(GuestStop::FailEntry { reason: 7, cpu: 0 })
        );
        assert_eq!(dispatch(VcpuExit::Intr, &mut ctx), ExitAction::Interrupted);
        assert!(matches!(
            dispatch(VcpuExit::Unknown, &mut ctx),
            ExitAction::Stop(GuestStop::Unexpected(_))
        ));
        assert_eq!(t.counts.io_out.exit, 1);
        assert_eq!(t.counts.io_out.phase, 2);
        assert_eq!(t.counts.mmio_write, 4);
        assert_eq!(t.counts.invalid_phase_markers, 3);
        assert_eq!(t.counts.io_in.unknown, 1);
        assert_eq!(t.counts.total(), 13);
        assert_eq!(t.unknown.distinct(), 3);
    }

    /// A console-line record reaches COM1 as the same bytes written to THR;
    /// a bad record (too long, outside memory, not 32 bits) is ignored and
    /// logged; the port reads the magic only where guest memory is offered.
    #[test]
    fn console_lines_go_to_com1_and_bad_records_are_ignored() {
        use ptiscope_devices::{EventFdTrigger, SerialDevice};
        use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
        let mut bus = bus();
        let irq = EventFdTrigger(EventFd::new(EFD_NONBLOCK).unwrap());
        let (serial, recorder) = SerialDevice::with_output(irq, None);
        bus.insert(
            port::SERIAL_COM1,
            port::SERIAL_LEN,
            Arc::new(Mutex::new(serial)),
        )
        .unwrap();
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let line = b"@result workload=none\n";
        mem.write_slice(&(line.len() as u32).to_le_bytes(), GuestAddress(0x1000))
            .unwrap();
        mem.write_slice(line, GuestAddress(0x1004)).unwrap();
        let too_long = (port::CONSOLE_LINE_MAX as u32 + 1).to_le_bytes();
        mem.write_slice(&too_long, GuestAddress(0x2000)).unwrap();
        let mut t = Tallies::default();
        let mut ctx = t.ctx(&bus, Some(&mem));
        let mut d = [0u8; 4];
        dispatch(VcpuExit::IoIn(port::CONSOLE_LINE, &mut d), &mut ctx);
        assert_eq!(u32::from_le_bytes(d), port::CONSOLE_LINE_MAGIC);
        for gpa in [0x1000u32, 0x2000, 0xfffe, 0xffff_fff0] {
            let out = VcpuExit::IoOut(port::CONSOLE_LINE, &gpa.to_le_bytes()[..]);
            assert_eq!(dispatch(out, &mut ctx), ExitAction::Continue);
        }
        dispatch(VcpuExit::IoOut(port::CONSOLE_LINE, &[0, 0x10]), &mut ctx);
        assert_eq!(t.counts.io_out.serial, 5);
        assert_eq!(t.counts.io_in.serial, 1);
        assert_eq!(t.unknown.distinct(), 4, "each bad record logged");
        let rec = recorder.lock().unwrap();
        assert_eq!(rec.machine_lines(), ["@result workload=none"]);

        let mut t = Tallies::default();
        let mut ctx = t.ctx(&bus, None);
        dispatch(VcpuExit::IoIn(port::CONSOLE_LINE, &mut d), &mut ctx);
        assert_eq!(d, [0xff; 4]);
    }
}
