//! A port-I/O bus: address ranges mapped to devices.

use std::sync::{Arc, Mutex};

use ptiscope_abi::phase::Marker;

/// What a device asks the VMM to do after a guest access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceEvent {
    /// Nothing: keep running.
    None,
    /// The guest wrote its exit status; stop the VM with it.
    Exit(u32),
    /// The guest wrote a valid phase marker.
    Phase(Marker),
    /// The guest wrote something to the phase port that is not a marker
    /// (reserved bits, id 0, or the wrong width). Counted, never fatal.
    InvalidPhase(u32),
}

/// A device on the port-I/O bus. `offset` is relative to the device's base.
pub trait PioDevice: Send {
    /// A guest `in`: fill `data` (its length is the access width).
    fn read(&mut self, offset: u16, data: &mut [u8]);
    /// A guest `out` of `data`.
    fn write(&mut self, offset: u16, data: &[u8]) -> DeviceEvent;
}

/// Errors registering a device on the bus.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    /// The range is empty or runs past port 0xffff.
    #[error("port range {base:#x}+{len:#x} is empty or wraps past 0xffff")]
    BadRange {
        /// First port of the rejected range.
        base: u16,
        /// Number of ports in the rejected range.
        len: u16,
    },
    /// The range overlaps a device already on the bus.
    #[error("port range {base:#x}+{len:#x} overlaps the device at {other:#x}+{other_len:#x}")]
    Overlap {
        /// First port of the rejected range.
        base: u16,
        /// Number of ports in the rejected range.
        len: u16,
        /// First port of the device already there.
        other: u16,
        /// Number of ports of the device already there.
        other_len: u16,
    },
}

struct Entry {
    base: u16,
    len: u16,
    device: Arc<Mutex<dyn PioDevice>>,
}

/// The port-I/O bus of one VM.
#[derive(Default)]
pub struct PioBus {
    // Sorted by base; a handful of entries, so a linear scan beats anything clever.
    entries: Vec<Entry>,
}

impl PioBus {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    /// Maps `[base, base + len)` to `device`.
    pub fn insert(
        &mut self,
        base: u16,
        len: u16,
        device: Arc<Mutex<dyn PioDevice>>,
    ) -> Result<(), BusError> {
        let end = u32::from(base) + u32::from(len);
        if len == 0 || end > 0x1_0000 {
            return Err(BusError::BadRange { base, len });
        }
        if let Some(e) = self.entries.iter().find(|e| {
            u32::from(e.base) < end && u32::from(base) < u32::from(e.base) + u32::from(e.len)
        }) {
            return Err(BusError::Overlap {
                base,
                len,
                other: e.base,
                other_len: e.len,
            });
        }
        self.entries.push(Entry { base, len, device });
        self.entries.sort_by_key(|e| e.base);
        Ok(())
    }

    fn find(&self, port: u16) -> Option<&Entry> {
        self.entries
            .iter()
            .find(|e| port >= e.base && u32::from(port) < u32::from(e.base) + u32::from(e.len))
    }

    /// Base port of the device that owns `port`, if any.
    pub fn device_base(&self, port: u16) -> Option<u16> {
        self.find(port).map(|e| e.base)
    }

    /// A guest `in`. Returns false (and leaves `data` alone) if no device owns `port`.
    pub fn read(&self, port: u16, data: &mut [u8]) -> bool {
        match self.find(port) {
            Some(e) => {
                // A poisoned lock means another thread panicked while holding
                // the device; the device state is still plain data, keep going.
                let mut dev = e.device.lock().unwrap_or_else(|p| p.into_inner());
                dev.read(port - e.base, data);
                true
            }
            None => false,
        }
    }

    /// A guest `out`. Returns `None` if no device owns `port`.
    pub fn write(&self, port: u16, data: &[u8]) -> Option<DeviceEvent> {
        let e = self.find(port)?;
        let mut dev = e.device.lock().unwrap_or_else(|p| p.into_inner());
        Some(dev.write(port - e.base, data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Echo(u8);
    impl PioDevice for Echo {
        fn read(&mut self, offset: u16, data: &mut [u8]) {
            data.fill(self.0.wrapping_add(offset as u8));
        }
        fn write(&mut self, _offset: u16, data: &[u8]) -> DeviceEvent {
            self.0 = data[0];
            DeviceEvent::None
        }
    }

    #[test]
    fn routes_by_range_and_rejects_overlap() {
        let mut bus = PioBus::new();
        bus.insert(0x10, 4, Arc::new(Mutex::new(Echo(1)))).unwrap();
        bus.insert(0x20, 2, Arc::new(Mutex::new(Echo(5)))).unwrap();
        assert_eq!(
            bus.insert(0x13, 2, Arc::new(Mutex::new(Echo(0)))),
            Err(BusError::Overlap {
                base: 0x13,
                len: 2,
                other: 0x10,
                other_len: 4
            })
        );
        assert!(matches!(
            bus.insert(0xffff, 2, Arc::new(Mutex::new(Echo(0)))),
            Err(BusError::BadRange { .. })
        ));
        let mut b = [0u8; 1];
        assert!(bus.read(0x12, &mut b));
        assert_eq!(b[0], 3);
        assert!(!bus.read(0x14, &mut b));
        assert_eq!(bus.write(0x21, &[9]), Some(DeviceEvent::None));
        assert!(bus.read(0x20, &mut b));
        assert_eq!(b[0], 9);
        assert_eq!(bus.write(0x22, &[9]), None);
        assert_eq!(bus.device_base(0x13), Some(0x10));
    }
}
