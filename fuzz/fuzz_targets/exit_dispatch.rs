//! Exit dispatch on the port-I/O bus and MMIO, with the devices a run has
//! (serial, exit, phase): the guest chooses every port, size and byte.
#![no_main]

use std::sync::{Arc, Mutex};

use kvm_ioctls::{MsrExitReason, ReadMsrExit, VcpuExit, WriteMsrExit};
use libfuzzer_sys::fuzz_target;
use ptiscope::machine::exit::{dispatch, DispatchCtx, ExitCounts};
use ptiscope::machine::msr::MsrAnswers;
use ptiscope_abi::port;
use ptiscope_devices::{
    EventFdTrigger, ExitDevice, PhaseDevice, PioBus, SerialDevice, UnknownAccesses,
};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

fuzz_target!(|data: &[u8]| {
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    let (serial, recorder) = SerialDevice::with_output(EventFdTrigger(irq), None);
    let mut bus = PioBus::new();
    bus.insert(
        port::SERIAL_COM1,
        port::SERIAL_LEN,
        Arc::new(Mutex::new(serial)),
    )
    .unwrap();
    bus.insert(port::EXIT, port::EXIT_LEN, Arc::new(Mutex::new(ExitDevice)))
        .unwrap();
    bus.insert(
        port::PHASE,
        port::PHASE_LEN,
        Arc::new(Mutex::new(PhaseDevice)),
    )
    .unwrap();
    let mut unknown = UnknownAccesses::new();
    let mut counts = ExitCounts::default();
    let msrs = MsrAnswers {
        arch_capabilities: Some(0x0c00_e16d),
    };
    let mut ctx = DispatchCtx {
        bus: &bus,
        unknown: &mut unknown,
        counts: &mut counts,
        msrs: &msrs,
    };
    // Each record: kind, a 16-bit port (or the low bits of an MMIO
    // address or MSR index), a length 1..=8, then that many bytes.
    let mut rest = data;
    let mut exits = 0u64;
    while rest.len() >= 4 {
        let kind = rest[0] % 6;
        let addr = u16::from_le_bytes([rest[1], rest[2]]);
        let len = usize::from(rest[3] % 8) + 1;
        let Some(bytes) = rest.get(4..4 + len) else {
            break;
        };
        rest = &rest[4 + len..];
        let mut buf = [0u8; 8];
        buf[..len].copy_from_slice(bytes);
        let mmio = 0xfee0_0000u64 + u64::from(addr);
        let _ = match kind {
            0 => dispatch(VcpuExit::IoOut(addr, &buf[..len]), &mut ctx),
            1 => dispatch(VcpuExit::IoIn(addr, &mut buf[..len]), &mut ctx),
            2 => dispatch(VcpuExit::MmioWrite(mmio, &buf[..len]), &mut ctx),
            3 => dispatch(VcpuExit::MmioRead(mmio, &mut buf[..len]), &mut ctx),
            // A trapped RDMSR/WRMSR: the index's high half from the data,
            // so the one trapped MSR (0x10a) and any other are both seen.
            4 | 5 => {
                let index = (u32::from(buf[0]) << 16) | u32::from(addr);
                let (mut error, mut data) = (0u8, u64::from_le_bytes(buf));
                let action = if kind == 4 {
                    dispatch(
                        VcpuExit::X86Rdmsr(ReadMsrExit {
                            error: &mut error,
                            reason: MsrExitReason::Filter,
                            index,
                            data: &mut data,
                        }),
                        &mut ctx,
                    )
                } else {
                    dispatch(
                        VcpuExit::X86Wrmsr(WriteMsrExit {
                            error: &mut error,
                            reason: MsrExitReason::Filter,
                            index,
                            data,
                        }),
                        &mut ctx,
                    )
                };
                // Only the trapped MSR reads without #GP; writes always #GP.
                assert_eq!(error == 0, kind == 4 && index == 0x10a, "MSR {index:#x}");
                action
            }
            _ => unreachable!("kind is below 6"),
        };
        exits += 1;
    }
    assert_eq!(ctx.counts.total(), exits, "every exit is counted once");
    let mut rec = recorder.lock().unwrap();
    rec.flush_partial();
    let _ = rec.machine_lines().len();
});
