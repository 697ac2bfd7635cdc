//! Settling a run before any VM exists: what the host can run (from the
//! probe) and the guest options that follow from it.

pub mod cmdline;
pub mod host;
