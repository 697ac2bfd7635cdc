//! 16550 UART on COM1, transmit only.
//!
//! Both our VMM (vm-superio) and QEMU transmit a byte written to THR at once,
//! whatever the divisor and FIFO settings, so the driver neither initialises
//! the line nor polls LSR.THRE: each port access is a VM exit, and on real
//! hardware a console this chatty would want the polling back. Strings go
//! out with one `rep outsb`: one exit per string, not one per byte.
use super::io::outsb;
use ptiscope_abi::port::SERIAL_COM1;

const THR: u16 = SERIAL_COM1;

pub fn write_bytes(bytes: &[u8]) {
    // Plain '\n' line ends: the consoles are pipes and files, not terminals,
    // and a '\r' would cost one more exit per line.
    outsb(THR, bytes);
}
