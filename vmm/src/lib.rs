//! The ptiscope VMM library: boots the ptiscope guest kernel under KVM and
//! measures what page table isolation costs.
//!
//! A run is two steps: [`preflight()`] settles what was asked (a
//! [`RunConfig`]) into a [`ResolvedRun`], and [`machine::run`] boots and runs
//! it; [`run_vm`] does both in one call. The CLI (`src/main.rs` and [`cli`])
//! is a thin layer over them that resolves once and runs many times
//! (`compare`). `docs/architecture.md` maps the modules.
#![warn(missing_docs)]

pub mod backend;
pub mod cli;
pub mod experiment;
pub mod input;
pub mod linux;
pub mod machine;
pub mod nested;
pub mod observe;
pub mod output;
pub mod preflight;
pub mod probe;
pub mod report;
pub mod sandbox;
pub mod signals;
pub mod spec;
pub mod x86;

pub use machine::{run, NoObserver, PhaseObserver, RunError, RunOutcome, StopReason};
pub use output::SerialOut;
pub use preflight::{preflight, PreflightError};
pub use probe::host::HostFacts;
pub use spec::{ResolvedRun, RunConfig, Target};

/// Errors of [`run_vm`]: the request could not be settled, or the VM could
/// not run.
#[derive(Debug, thiserror::Error)]
pub enum RunVmError {
    /// The request could not be resolved ([`preflight()`]).
    #[error(transparent)]
    Preflight(#[from] PreflightError),
    /// The vCPU threads' seccomp filter could not be made ready.
    #[error(transparent)]
    Sandbox(#[from] sandbox::SandboxError),
    /// The VM could not be built or run ([`machine::run`]).
    #[error(transparent)]
    Run(#[from] RunError),
}

/// Settles `config` for this host's KVM, as `facts` describe it
/// ([`preflight()`]), and runs it ([`machine::run`]) with the vCPU threads
/// confined ([`sandbox::vcpu_filter`]): the one-call entry point of the
/// library. One [`HostFacts`] serves any number of runs (its probes run
/// once).
pub fn run_vm(
    config: &RunConfig,
    facts: &HostFacts,
    observer: &mut (dyn PhaseObserver + Send),
) -> Result<RunOutcome, RunVmError> {
    let resolved = preflight(config, Target::Kvm, facts)?;
    let host = machine::HostSide {
        kvm: facts.kvm_flavour(),
        vcpu_filter: sandbox::vcpu_filter()?,
        supported_cpuid: facts.supported_cpuid(),
        nested: facts.nested(),
    };
    Ok(run(&resolved, &host, observer)?)
}

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

    /// Whether the slow tier runs: `PTISCOPE_SLOW_TESTS` set to anything
    /// but empty or `0` (a CI that passes an empty value means "no").
    pub fn slow_tier() -> bool {
        std::env::var_os("PTISCOPE_SLOW_TESTS").is_some_and(|v| !v.is_empty() && v != "0")
    }
}
