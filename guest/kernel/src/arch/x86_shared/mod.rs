//! Code shared by the x86_64 and the 32-bit PAE flavour.
pub mod boot;
pub mod context;
pub mod cpu;
pub mod descriptors;
pub mod entry;
pub mod exceptions;
pub mod io;
pub mod paging;
pub mod percpu;
pub mod sections;
pub mod serial;
pub mod smp;
pub mod user;
