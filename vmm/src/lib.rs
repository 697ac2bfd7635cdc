//! The ptiscope VMM library: boots the ptiscope guest kernel under KVM and
//! measures what page table isolation costs.
//!
//! The entry point for one run is [`vm::run_vm`]; the CLI (`src/main.rs`)
//! is a thin layer over it.

pub mod cli;
pub mod cmdline;
pub mod compare_cmd;
pub mod console;
pub mod exit;
pub mod host;
pub mod kvm_stats;
pub mod live_metrics;
pub mod loader;
pub mod measure;
pub mod memory;
pub mod msr;
pub mod pagetables;
pub mod probe;
pub mod qemu;
pub mod report;
pub mod signals;
pub mod telemetry;
pub mod vcpu;
pub mod vm;

pub use vm::{run_vm, NoObserver, PhaseObserver, RunConfig, RunError, RunOutcome, StopReason};

/// The embedded default guest image, x86_64 flavour (built by `vmm/build.rs`).
pub static GUEST_X86_64: &[u8] = include_bytes!(env!("PTISCOPE_GUEST_X86_64"));

/// The embedded guest image, 32-bit PAE flavour (an ELF32, built by `vmm/build.rs`).
pub static GUEST_I386: &[u8] = include_bytes!(env!("PTISCOPE_GUEST_I386"));

/// Helpers for this crate's tests and the integration tests in `tests/`.
#[doc(hidden)]
pub mod test_support {
    use std::io::Write;

    /// Says why a test does not run here. Written straight to the stderr
    /// file descriptor, not through `eprintln!`, which `cargo test` captures
    /// and hides for tests that pass: a skip must never be silently green.
    pub fn skip(test: &str, reason: &str) {
        let _ = writeln!(std::io::stderr(), "SKIP {test}: {reason}");
    }
}
