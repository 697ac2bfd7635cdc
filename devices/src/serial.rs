//! The 16550 UART at COM1, modelled by vm-superio.

use std::io;
use std::sync::{Arc, Mutex};

use vm_superio::serial::NoEvents;
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use crate::bus::{DeviceEvent, PioDevice};
use crate::console::{ConsoleRecorder, ConsoleSink};

/// Raises the UART's interrupt by writing an eventfd registered as an irqfd
/// with the in-kernel irqchip.
pub struct EventFdTrigger(pub EventFd);

impl Trigger for EventFdTrigger {
    type E = io::Error;

    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

/// Errors feeding the serial device.
#[derive(Debug, thiserror::Error)]
pub enum SerialError {
    /// vm-superio refused the input bytes (its message).
    #[error("serial input: {0}")]
    Input(String),
}

/// COM1: a vm-superio 16550 whose output goes through a [`ConsoleSink`].
pub struct SerialDevice {
    serial: Serial<EventFdTrigger, NoEvents, ConsoleSink>,
}

impl SerialDevice {
    /// A 16550 raising its interrupt through `irq` and printing into `sink`.
    pub fn new(irq: EventFdTrigger, sink: ConsoleSink) -> Self {
        SerialDevice {
            serial: Serial::new(irq, sink),
        }
    }

    /// Convenience: a device printing to `out` (or nowhere) and recording into a new recorder.
    pub fn with_output(
        irq: EventFdTrigger,
        out: Option<Box<dyn io::Write + Send>>,
    ) -> (Self, Arc<Mutex<ConsoleRecorder>>) {
        let rec = Arc::new(Mutex::new(ConsoleRecorder::new()));
        (Self::new(irq, ConsoleSink::new(out, rec.clone())), rec)
    }

    /// Queues host input for the guest; returns how many bytes fit in the FIFO
    /// (the rest is for the caller to retry or drop).
    pub fn enqueue_input(&mut self, bytes: &[u8]) -> Result<usize, SerialError> {
        if self.serial.fifo_capacity() == 0 {
            return Ok(0);
        }
        self.serial
            .enqueue_raw_bytes(bytes)
            .map_err(|e| SerialError::Input(e.to_string()))
    }

    /// Flushes the output destination, a partial last line included (end
    /// of a run).
    pub fn flush(&mut self) {
        self.serial.writer_mut().flush_out();
    }
}

impl PioDevice for SerialDevice {
    fn read(&mut self, offset: u16, data: &mut [u8]) {
        // The UART has byte-wide registers: a wider access carries the
        // register in its first byte and zeros above it.
        data.fill(0);
        if let (Some(first), Ok(off)) = (data.first_mut(), u8::try_from(offset)) {
            *first = self.serial.read(off);
        }
    }

    fn write(&mut self, offset: u16, data: &[u8]) -> DeviceEvent {
        let Ok(off) = u8::try_from(offset) else {
            return DeviceEvent::None;
        };
        // The 16550's registers are bytes. Several bytes at THR come from
        // string I/O (`rep outsb`, one exit for a whole string): each is
        // one transmitted byte. Elsewhere only the first byte counts.
        let bytes = if off == 0 {
            data
        } else {
            data.get(..1).unwrap_or(&[])
        };
        for &value in bytes {
            if let Err(e) = self.serial.write(off, value) {
                // An interrupt that could not be raised or output that could
                // not be written must not stop the guest.
                log::debug!("serial write at offset {off}: {e}");
            }
        }
        DeviceEvent::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_recorded_and_input_is_readable() {
        let irq = EventFdTrigger(EventFd::new(libc_nonblock()).unwrap());
        let (mut dev, rec) = SerialDevice::with_output(irq, None);
        for b in b"@result ok=1\n" {
            dev.write(0, &[*b]);
        }
        assert_eq!(rec.lock().unwrap().machine_lines(), ["@result ok=1"]);
        // String I/O: one exit carries a whole line.
        dev.write(0, b"@fault vector=14\n");
        assert_eq!(rec.lock().unwrap().machine_lines()[1], "@fault vector=14");
        assert_eq!(dev.enqueue_input(b"ab").unwrap(), 2);
        let mut lsr = [0u8];
        dev.read(5, &mut lsr);
        assert_eq!(lsr[0] & 1, 1, "data ready");
        let mut b = [0u8];
        dev.read(0, &mut b);
        assert_eq!(b[0], b'a');
    }

    fn libc_nonblock() -> i32 {
        // EFD_NONBLOCK, spelled out to avoid a libc dependency for one constant.
        0o4000
    }
}
