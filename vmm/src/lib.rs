//! The ptiscope VMM library: boots the ptiscope guest kernel under KVM and
//! measures what page table isolation costs.

pub mod kvm_stats;
pub mod probe;
pub mod report;
pub mod telemetry;

/// The embedded default guest image, x86_64 flavour (built by `vmm/build.rs`).
pub static GUEST_X86_64: &[u8] = include_bytes!(env!("PTISCOPE_GUEST_X86_64"));
