//! Watching a running guest from the host: KVM's binary statistics (read
//! through [`crate::machine::kvm_stats`], a leaf of the machine layer that
//! the probe reads them through too), the guest's telemetry page,
//! phase-marker snapshots and their deltas, the live metrics stream, and
//! the host-side page-table walker.

pub mod live_metrics;
pub mod measure;
pub mod outer_plugin;
pub mod pagetables;
pub mod qemu_plugin;
pub mod telemetry;
