//! Device models on the ptiscope VMM's PIO bus.
//!
//! The bus is deliberately small: a sorted list of port ranges, each backed by
//! one device behind a mutex (the vCPU thread writes, the console thread may
//! feed serial input). Devices report what the VMM must act on (the guest's
//! exit status, a phase marker) as a [`DeviceEvent`] returned from the write,
//! so that the VMM decides what to do on the vCPU thread, synchronously with
//! the exit that caused it.
#![warn(missing_docs)]

pub mod bus;
pub mod console;
pub mod exit;
pub mod phase;
pub mod serial;
pub mod unknown;

pub use bus::{BusError, DeviceEvent, PioBus, PioDevice};
pub use console::{escape_str, ConsoleRecorder, ConsoleSink, ConsoleStats, TerminalEscaper};
pub use exit::ExitDevice;
pub use phase::PhaseDevice;
pub use serial::{EventFdTrigger, SerialDevice, SerialError};
pub use unknown::UnknownAccesses;
