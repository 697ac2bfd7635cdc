//! The phase-marker port: [`ptiscope_abi::port::PHASE`].

use ptiscope_abi::phase::Marker;

use crate::bus::{DeviceEvent, PioDevice};

/// Decodes phase markers. The VMM hands valid ones to its observer; invalid
/// writes are reported as such so the VMM can count them (never fatal: the
/// guest is not trusted to get the encoding right).
#[derive(Debug, Default)]
pub struct PhaseDevice;

impl PioDevice for PhaseDevice {
    fn read(&mut self, _offset: u16, data: &mut [u8]) {
        data.fill(0xff);
    }

    fn write(&mut self, offset: u16, data: &[u8]) -> DeviceEvent {
        let mut bytes = [0u8; 4];
        let n = data.len().min(4);
        bytes[..n].copy_from_slice(&data[..n]);
        let value = u32::from_le_bytes(bytes);
        // The ABI says: one 32-bit write at the base port. Anything else is a
        // guest bug, reported with the value it carried.
        if offset != 0 || data.len() != 4 {
            return DeviceEvent::InvalidPhase(value);
        }
        match Marker::decode(value) {
            Some(m) => DeviceEvent::Phase(m),
            None => DeviceEvent::InvalidPhase(value),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_markers_and_flags_garbage() {
        let mut d = PhaseDevice;
        let m = Marker::end(ptiscope_abi::phase::ID_WORKLOAD);
        assert_eq!(d.write(0, &m.encode().to_le_bytes()), DeviceEvent::Phase(m));
        assert_eq!(
            d.write(0, &0u32.to_le_bytes()),
            DeviceEvent::InvalidPhase(0)
        );
        assert_eq!(d.write(0, &[1, 0]), DeviceEvent::InvalidPhase(1));
        assert_eq!(
            d.write(2, &1u32.to_le_bytes()),
            DeviceEvent::InvalidPhase(1)
        );
    }
}
