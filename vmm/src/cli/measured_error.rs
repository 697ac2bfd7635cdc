//! Why a measured run gave nothing to compare: the error of
//! `compare::side::run_measured`, a leaf of `cli` so that `exit_code` can map
//! it without importing the compare command.

use crate::backend::qemu::QemuError;
use crate::machine::{RunError, StopReason};

/// Why a measured run gave nothing to compare (its exit code is
/// `cli::exit_code`'s).
#[derive(Debug, thiserror::Error)]
pub enum MeasuredRunError {
    /// The VM could not be built or run.
    #[error(transparent)]
    Kvm(#[from] RunError),
    /// QEMU could not be started or failed.
    #[error(transparent)]
    Qemu(#[from] QemuError),
    /// The vCPU threads' seccomp filter could not be made ready.
    #[error(transparent)]
    Sandbox(#[from] crate::sandbox::SandboxError),
    /// The guest ran to a clean exit without marking a workload phase.
    #[error(
        "the guest marked no workload phase, so there is nothing to compare \
         (workload {workload}: use one that measures, e.g. getpid)"
    )]
    NoPhase {
        /// The workload's name (`-`: none).
        workload: &'static str,
    },
    /// The guest did not stop with status 0.
    #[error("{report}")]
    GuestFailed {
        /// How it stopped (boxed: a crash's registers are large).
        stop: Box<StopReason>,
        /// The stop, what the guest reported and its last console lines
        /// (guest text escaped).
        report: String,
    },
    /// A Linux guest's run ended otherwise than with its result (a panic,
    /// no init, an unfinished init, PTI not as asked: `cli::linux::diagnose`).
    #[error("{message}")]
    Linux {
        /// The documented exit code of that end.
        code: i32,
        /// The cause, named.
        message: String,
    },
}

impl From<crate::backend::BackendError> for MeasuredRunError {
    fn from(e: crate::backend::BackendError) -> Self {
        match e {
            crate::backend::BackendError::Kvm(e) => MeasuredRunError::Kvm(e),
            crate::backend::BackendError::Qemu(e) => MeasuredRunError::Qemu(e),
            crate::backend::BackendError::Sandbox(e) => MeasuredRunError::Sandbox(e),
        }
    }
}
