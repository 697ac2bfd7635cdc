//! The exit device: the guest writes its exit status to [`ptiscope_abi::port::EXIT`].

use crate::bus::{DeviceEvent, PioDevice};

/// Stops the VM with the status the guest writes. Like QEMU's
/// `isa-debug-exit`, any access width is accepted and zero-extended, so the
/// same guest code stops both.
#[derive(Debug, Default)]
pub struct ExitDevice;

impl PioDevice for ExitDevice {
    fn read(&mut self, _offset: u16, data: &mut [u8]) {
        data.fill(0xff);
    }

    fn write(&mut self, offset: u16, data: &[u8]) -> DeviceEvent {
        // Only a write at the base port carries a status; a stray byte write to
        // port 0xf5.. is not an exit request.
        if offset != 0 || data.is_empty() || data.len() > 4 {
            return DeviceEvent::None;
        }
        let mut bytes = [0u8; 4];
        bytes[..data.len()].copy_from_slice(data);
        DeviceEvent::Exit(u32::from_le_bytes(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_is_zero_extended_little_endian() {
        let mut d = ExitDevice;
        assert_eq!(d.write(0, &[2, 0, 0, 0]), DeviceEvent::Exit(2));
        assert_eq!(d.write(0, &[0x34, 0x12]), DeviceEvent::Exit(0x1234));
        assert_eq!(
            d.write(0, &[0x78, 0x56, 0x34, 0x12]),
            DeviceEvent::Exit(0x1234_5678)
        );
        assert_eq!(d.write(1, &[1]), DeviceEvent::None);
    }
}
