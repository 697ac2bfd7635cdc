//! Why a nested session gave no response, and the exit status each cause
//! ends the command with.

use crate::cli::exit_code;
use crate::signals;

/// Why a nested session gave no response.
#[derive(Debug, thiserror::Error)]
pub enum NestedError {
    /// No fetched kernel, or it has no KVM modules.
    #[error("{0}")]
    NoKernel(String),
    /// QEMU could not be started.
    #[error(
        "cannot start qemu-system-x86_64: {0} (install QEMU: `apt-get install qemu-system-x86`)"
    )]
    NoQemu(std::io::Error),
    /// The inner Linux could not set up KVM.
    #[error("the inner Linux could not set up KVM: {0}")]
    Setup(String),
    /// `--nested-paging shadow`, or a Linux guest on the VMM, under a QEMU
    /// whose SVM breaks it.
    #[error("{0}")]
    QemuBreaksIt(String),
    /// QEMU ended without a response.
    #[error(
        "QEMU ended ({how}) without a result from the inner ptiscope: {why}{}",
        tail_text(console)
    )]
    NoResponse {
        /// How QEMU ended.
        how: String,
        /// What was wrong with the result port.
        why: String,
        /// The console's last lines.
        console: Vec<String>,
    },
    /// The deadline passed.
    #[error("the nested session ran past its deadline of {secs:.0} s (boot allowance {boot} s + the inner commands' bounds) and was stopped{}", tail_text(console))]
    Timeout {
        /// The deadline.
        secs: f64,
        /// The boot allowance.
        boot: u64,
        /// The console's last lines.
        console: Vec<String>,
    },
    /// A termination signal stopped it.
    #[error("{}; QEMU was stopped", signals::describe(*.0))]
    Interrupted(i32),
    /// A file of the kernel cache (the inner Linux's kernel, a module)
    /// could not be read (it names the file).
    #[error("{0}")]
    Input(#[from] crate::input::InputError),
    /// An I/O step failed.
    #[error("{what}: {source}")]
    Io {
        /// What was done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

fn tail_text(console: &[String]) -> String {
    if console.is_empty() {
        String::new()
    } else {
        format!("\ninner console (last lines):\n  {}", console.join("\n  "))
    }
}

impl NestedError {
    /// The exit status this error ends the command with.
    pub fn exit_code(&self) -> i32 {
        match self {
            NestedError::NoKernel(_)
            | NestedError::NoQemu(_)
            | NestedError::Setup(_)
            | NestedError::QemuBreaksIt(_) => exit_code::KVM_UNAVAILABLE,
            NestedError::Timeout { .. } => exit_code::TIMEOUT,
            NestedError::Interrupted(s) => 128 + s,
            NestedError::Input(e) => e.signal().map_or(exit_code::KVM_UNAVAILABLE, |s| 128 + s),
            NestedError::NoResponse { .. } | NestedError::Io { .. } => exit_code::INTERNAL,
        }
    }
}
