//! Errors of a QEMU-backed run.

use crate::output::OpenError;
use crate::preflight::PreflightError;

/// Errors of a QEMU-backed run.
#[derive(Debug, thiserror::Error)]
pub enum QemuError {
    /// Resolving the run failed before QEMU started.
    #[error(transparent)]
    Preflight(#[from] PreflightError),
    /// QEMU could not be started.
    #[error("cannot start {binary}: {source} (install QEMU: `apt-get install qemu-system-x86`)")]
    Spawn {
        /// The QEMU binary tried.
        binary: String,
        /// The spawn error.
        #[source]
        source: std::io::Error,
    },
    /// An I/O step around QEMU failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// An output (`--json`, `--serial-out`, ...) could not be opened.
    #[error(transparent)]
    Output(#[from] OpenError),
    /// The TCG plugin was asked for but cannot be used with this QEMU.
    #[error("{0}")]
    Plugin(String),
    /// A CPU model (a compare side's `cpu=`) this QEMU does not have, or
    /// cannot emulate under TCG (`host`); said before QEMU starts.
    #[error("{0}")]
    CpuModel(String),
    /// QEMU ended before the guest reported its exit status.
    #[error("QEMU failed ({how}) before the guest reported a status{}", if stderr.is_empty() { String::new() } else { format!(": {stderr}") })]
    Qemu {
        /// How QEMU ended (`exit N`, `killed by signal N`).
        how: String,
        /// What QEMU printed on stderr, trimmed.
        stderr: String,
    },
}
