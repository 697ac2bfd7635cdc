//! The x86_64 flavour: 4-level paging, entered from PVH's 32-bit entry.
pub mod boot;
pub mod context;
pub mod cpu;
pub mod descriptors;
pub mod entry;
pub mod exceptions;
pub mod paging;
