//! Watching a running guest from the host: KVM's binary statistics (read by
//! [`kvm_stats`], a leaf of the machine layer), the
//! guest's telemetry page, phase-marker snapshots and their deltas, the live
//! metrics stream, and the host-side page-table walker.

/// KVM's binary statistics fds: read here, and by the probe; a leaf of
/// the machine layer.
pub use crate::machine::kvm_stats;
pub mod live_metrics;
pub mod measure;
pub mod pagetables;
pub mod qemu_plugin;
pub mod telemetry;
