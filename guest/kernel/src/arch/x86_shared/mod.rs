//! Code shared by the x86_64 and the (future) 32-bit PAE flavour.
pub mod io;
pub mod serial;
