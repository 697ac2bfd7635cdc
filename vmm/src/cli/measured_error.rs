//! Why a measured run gave nothing to compare: the error of
//! `compare::side::run_measured`, a leaf of `cli` so that `exit_code` can map
//! it without importing the compare command.

use crate::backend::qemu::QemuError;
use crate::machine::RunError;
use crate::report::end::{FailedRun, Failure, RunEnd};

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
    /// `--backend nested`'s session could not run it.
    #[error(transparent)]
    Nested(#[from] crate::backend::nested::NestedRunError),
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
        end: Box<RunEnd>,
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
        /// The cause, as data.
        failure: Failure,
        /// How its VM stopped (boxed: a crash's registers are large).
        end: Box<RunEnd>,
        /// The cause, named, with the console's last lines.
        message: String,
    },
}

impl MeasuredRunError {
    /// `run`'s failure as a compare or sweep document records it, with
    /// `exit_code` (this error's, mapped by `cli::exit_code`).
    pub fn failed_run(&self, run: String, exit_code: i32) -> FailedRun {
        let (stop, failure) = match self {
            MeasuredRunError::GuestFailed { end, .. } => (Some((**end).clone()), None),
            MeasuredRunError::Linux { failure, end, .. } => {
                (Some((**end).clone()), Some(failure.into()))
            }
            _ => (None, None),
        };
        FailedRun {
            run,
            exit_code,
            stop,
            failure,
            text: self
                .to_string()
                .lines()
                .next()
                .unwrap_or_default()
                .to_owned(),
        }
    }
}

impl From<crate::backend::BackendError> for MeasuredRunError {
    fn from(e: crate::backend::BackendError) -> Self {
        match e {
            crate::backend::BackendError::Kvm(e) => MeasuredRunError::Kvm(e),
            crate::backend::BackendError::Qemu(e) => MeasuredRunError::Qemu(e),
            crate::backend::BackendError::Sandbox(e) => MeasuredRunError::Sandbox(e),
            crate::backend::BackendError::Nested(e) => MeasuredRunError::Nested(e),
        }
    }
}
