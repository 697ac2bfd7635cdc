//! Process exit codes: the one place where a run's result becomes the
//! number `ptiscope` exits with (docs/running.md lists them).

use crate::backend::qemu::QemuError;
use crate::cli::command_error::CommandError;
use crate::cli::measured_error::MeasuredRunError;
use crate::experiment::ExperimentError;
use crate::machine::cpu_config::VcpuSetupError;
use crate::machine::loader::LoadError;
use crate::machine::memory::MemoryError;
use crate::machine::{RunError, RunOutcome, StopReason};
use crate::output::OpenError;
use crate::preflight::PreflightError;
use crate::RunVmError;

/// Guest statuses above this are reported as this.
pub const GUEST_STATUS_MAX: i32 = 63;
/// A Linux guest's kernel panicked (`--linux`; the same number as the
/// companion guest's panic status).
pub const LINUX_PANIC: i32 = 3;
/// A Linux guest (`--linux`) asked for `pti=on` whose kernel cannot enable
/// PTI (the same number as the guest status "unsupported on this CPU").
pub const LINUX_NO_PTI: i32 = 6;
/// Bad command-line usage or option value.
pub const USAGE: i32 = 64;
/// The kernel image is not a bootable PVH ELF for this memory size.
pub const BAD_IMAGE: i32 = 65;
/// The kernel image file is missing or unreadable.
pub const NO_IMAGE: i32 = 66;
/// /dev/kvm is missing, not accessible, or lacks something required.
pub const KVM_UNAVAILABLE: i32 = 69;
/// An unexpected failure inside the VMM (an ioctl that should work did not).
pub const INTERNAL: i32 = 70;
/// An output file (`--serial-out`, `--json`, ...) cannot be created or written.
pub const CANT_CREATE: i32 = 73;
/// The guest triple-faulted (KVM_EXIT_SHUTDOWN).
pub const TRIPLE_FAULT: i32 = 80;
/// KVM could not run the guest further: internal error, failed entry,
/// unexpected exit, HLT with nothing to wake it.
pub const VM_ERROR: i32 = 81;
/// `--timeout` fired.
pub const TIMEOUT: i32 = 124;
/// SIGHUP (128 + 1).
pub const SIGHUP: i32 = 129;
/// SIGINT (128 + 2).
pub const SIGINT: i32 = 130;
/// SIGTERM (128 + 15).
pub const SIGTERM: i32 = 143;
/// stdout or stderr was closed under us (`ptiscope compare | head`): the
/// process ends as SIGPIPE would end it (128 + 13), quietly.
pub const CLOSED_STDOUT: i32 = 141;
/// A `--fail-if` held, or a measured run failed with a status that maps to 0.
pub const FAILED: i32 = 1;

/// The exit code of a command whose run failed with `code`: `code`, or
/// [`FAILED`] when it is 0 (a failure never exits 0).
pub fn failed_run(code: i32) -> i32 {
    if code == 0 {
        FAILED
    } else {
        code
    }
}

/// A message for the terminal: every line of `text` through
/// [`ptiscope_devices::escape_str`] (control bytes, ESC above all, shown as
/// `\xNN`), its line breaks kept. Errors carry user text (paths,
/// `--qemu-arg`, `--linux`) and guest or QEMU text.
pub fn escape_message(text: &str) -> String {
    text.split('\n')
        .map(ptiscope_devices::escape_str)
        .collect::<Vec<_>>()
        .join("\n")
}

/// A command's exit code: `result`'s, or the error said on stderr as
/// `ptiscope COMMAND: ...` and its code.
pub fn finish(command: &str, result: Result<i32, CommandError>) -> i32 {
    match result {
        Ok(code) => code,
        Err(e) => {
            // Errors carry user text (paths, --qemu-arg, --linux) and
            // guest or QEMU text: escaped before the terminal sees them.
            eprintln!("ptiscope {command}: {}", escape_message(&e.to_string()));
            e.exit_code()
        }
    }
}

/// The signal that ended a run whose exit code is `code` (128 + a
/// termination signal), if one did.
pub fn terminating_signal(code: i32) -> Option<i32> {
    let sig = code - 128;
    crate::signals::TERMINATION_SIGNALS
        .contains(&sig)
        .then_some(sig)
}

/// The exit code a result maps to.
pub trait ExitCode {
    /// The process exit code (the guest's status is passed through when it fits).
    fn exit_code(&self) -> i32;
}

impl ExitCode for StopReason {
    fn exit_code(&self) -> i32 {
        match self {
            StopReason::GuestExit { status } => {
                i32::try_from(*status).map_or(GUEST_STATUS_MAX, |s| s.min(GUEST_STATUS_MAX))
            }
            StopReason::Timeout { .. } => TIMEOUT,
            StopReason::Signal { signal } => 128 + signal,
            StopReason::Shutdown { .. } | StopReason::Reset => TRIPLE_FAULT,
            _ => VM_ERROR,
        }
    }
}

impl ExitCode for RunOutcome {
    fn exit_code(&self) -> i32 {
        self.stop.exit_code()
    }
}

impl ExitCode for PreflightError {
    fn exit_code(&self) -> i32 {
        match self {
            PreflightError::Kvm(_)
            | PreflightError::TooManyVcpus { .. }
            | PreflightError::SmpWithoutIrqchip
            | PreflightError::PaePagingRefused { .. }
            | PreflightError::EntryRefused(_)
            | PreflightError::PcidUnusable { .. } => KVM_UNAVAILABLE,
            PreflightError::Memory(MemoryError::Allocate { .. }) => INTERNAL,
            PreflightError::Memory(_) | PreflightError::Cmdline(_) => USAGE,
            PreflightError::Load(LoadError::Read { .. }) => NO_IMAGE,
            PreflightError::Load(LoadError::Interrupted(signal)) => 128 + signal,
            PreflightError::Load(LoadError::Scratch(..)) => INTERNAL,
            PreflightError::Load(_) => BAD_IMAGE,
            PreflightError::Linux(e) => e.exit_code(),
        }
    }
}

impl ExitCode for RunError {
    fn exit_code(&self) -> i32 {
        match self {
            RunError::Kvm(_)
            | RunError::Vcpu(
                VcpuSetupError::SetMsrs { .. }
                | VcpuSetupError::SetMsrsIoctl(_)
                | VcpuSetupError::TrapMsr(_),
            ) => KVM_UNAVAILABLE,
            RunError::Memory(MemoryError::Allocate { .. }) => INTERNAL,
            RunError::Memory(_) => USAGE,
            RunError::Load(LoadError::Read { .. }) => NO_IMAGE,
            RunError::Load(LoadError::Interrupted(signal)) => 128 + signal,
            RunError::Load(LoadError::Scratch(..)) => INTERNAL,
            RunError::Load(_) => BAD_IMAGE,
            RunError::Output(e) => e.exit_code(),
            _ => INTERNAL,
        }
    }
}

impl ExitCode for crate::preflight::linux::LinuxError {
    fn exit_code(&self) -> i32 {
        use crate::preflight::linux::image::ImageError;
        use crate::preflight::linux::LinuxError;
        // A termination signal while the kernel image was read ends the
        // command as the signal would, as it does for `--kernel`.
        if let Some(signal) = self.signal() {
            return 128 + signal;
        }
        match self {
            LinuxError::NotFetched { .. } | LinuxError::Unknown { .. } => NO_IMAGE,
            LinuxError::NoCache(_) => NO_IMAGE,
            LinuxError::Image(ImageError::Read(LoadError::Read { .. })) => NO_IMAGE,
            // The configuration beside the kernel cannot be read whole.
            LinuxError::Image(ImageError::Config { .. }) => NO_IMAGE,
            LinuxError::Image(_) => BAD_IMAGE,
            LinuxError::ArchMismatch { .. } | LinuxError::Option(_) => USAGE,
            LinuxError::Backend(_) => KVM_UNAVAILABLE,
            LinuxError::NoPti { .. } => LINUX_NO_PTI,
        }
    }
}

impl ExitCode for RunVmError {
    fn exit_code(&self) -> i32 {
        match self {
            RunVmError::Preflight(e) => e.exit_code(),
            RunVmError::Run(e) => e.exit_code(),
            RunVmError::Sandbox(_) => INTERNAL,
        }
    }
}

impl ExitCode for MeasuredRunError {
    fn exit_code(&self) -> i32 {
        match self {
            MeasuredRunError::Backend(e) => e.exit_code(),
            MeasuredRunError::NoPhase { .. } => VM_ERROR,
            MeasuredRunError::GuestFailed { end, .. } => end.reason.exit_code(),
            MeasuredRunError::Linux { code, .. } => *code,
        }
    }
}

impl ExitCode for OpenError {
    /// 73 (cannot create an output), 64 for two outputs given one file, or
    /// 128 + the signal that interrupted the wait for a FIFO's reader.
    fn exit_code(&self) -> i32 {
        match self {
            OpenError::Interrupted { signal, .. } => 128 + signal,
            OpenError::SamePath { .. } => USAGE,
            _ => CANT_CREATE,
        }
    }
}

impl ExitCode for QemuError {
    fn exit_code(&self) -> i32 {
        match self {
            QemuError::Preflight(e) => e.exit_code(),
            QemuError::Spawn { .. } | QemuError::Plugin(_) => KVM_UNAVAILABLE,
            QemuError::CpuModel(_) => USAGE,
            QemuError::Output(e) => e.exit_code(),
            QemuError::Io { .. } | QemuError::Qemu { .. } => VM_ERROR,
        }
    }
}

impl<E: ExitCode + std::error::Error> ExitCode for ExperimentError<E> {
    /// A failed run's code (never 0), or 64 for a sample the command
    /// refused (a `--fail-if` naming no metric of the runs).
    fn exit_code(&self) -> i32 {
        match self {
            ExperimentError::Run { source, .. } => failed_run(source.exit_code()),
            ExperimentError::Refused(_) => USAGE,
        }
    }
}

impl ExitCode for crate::backend::nested::NestedRunError {
    fn exit_code(&self) -> i32 {
        use crate::backend::nested::NestedRunError as E;
        match self {
            E::NoStarter | E::Inner(_) => INTERNAL,
            E::Session { exit_code, .. } => *exit_code,
        }
    }
}

impl ExitCode for crate::backend::BackendError {
    fn exit_code(&self) -> i32 {
        match self {
            crate::backend::BackendError::Kvm(e) => e.exit_code(),
            crate::backend::BackendError::Qemu(e) => e.exit_code(),
            crate::backend::BackendError::Sandbox(_) => INTERNAL,
            crate::backend::BackendError::Other { code, .. } => *code,
            crate::backend::BackendError::Nested(e) => e.exit_code(),
        }
    }
}

impl ExitCode for CommandError {
    fn exit_code(&self) -> i32 {
        match self {
            CommandError::Usage(_) | CommandError::Side { .. } => USAGE,
            CommandError::Backend(e) => e.exit_code(),
            CommandError::Against { code, .. } => *code,
            CommandError::Output(e) => e.exit_code(),
            CommandError::Settle { source, .. } => source.exit_code(),
            CommandError::Interrupted { signal, .. } => 128 + signal,
            CommandError::Experiment { source, .. } => source.exit_code(),
            CommandError::Missing(_) => VM_ERROR,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_run_never_exits_zero() {
        assert_eq!(failed_run(0), FAILED);
        assert_eq!(failed_run(TIMEOUT), TIMEOUT);
        assert_eq!(failed_run(SIGINT), SIGINT);
    }

    #[test]
    fn messages_are_escaped_line_by_line() {
        assert_eq!(
            escape_message("a \x1b[2J b\n  c\x07\r\n"),
            "a \\x1b[2J b\n  c\\x07\n"
        );
    }

    /// QEMU's reset (a triple fault it does not tell apart from a reboot)
    /// is a triple fault's exit code, in words that never name KVM.
    #[test]
    fn a_reset_under_qemu_is_80_and_names_no_kvm_exit() {
        assert_eq!(StopReason::Reset.exit_code(), TRIPLE_FAULT);
        let text = StopReason::Reset.to_string();
        assert!(!text.contains("KVM") && text.contains("QEMU TCG"), "{text}");
    }

    /// A termination signal while an image is read ends every command with
    /// 128 + the signal, whichever reader was reading (the companion's
    /// `--kernel`, a `--linux` kernel) and however the error reached the
    /// command (preflight, a QEMU run, a settled side of compare or sweep).
    #[test]
    fn a_signal_while_an_image_is_read_ends_with_128_plus_it_everywhere() {
        use crate::preflight::linux::image::ImageError;
        use crate::preflight::linux::LinuxError;
        for signal in crate::signals::TERMINATION_SIGNALS {
            let load = || LoadError::Interrupted(signal);
            let linux = || LinuxError::Image(ImageError::Read(load()));
            let preflights = [PreflightError::Load(load()), PreflightError::Linux(linux())];
            for p in preflights {
                assert_eq!(p.exit_code(), 128 + signal, "{p}");
                let settle = CommandError::Settle {
                    at: String::new(),
                    source: p,
                };
                assert_eq!(settle.exit_code(), 128 + signal, "{settle}");
                assert_eq!(terminating_signal(settle.exit_code()), Some(signal));
            }
            let qemu = QemuError::Preflight(PreflightError::Linux(linux()));
            assert_eq!(qemu.exit_code(), 128 + signal, "{qemu}");
            let measured = MeasuredRunError::Backend(qemu.into());
            assert_eq!(measured.exit_code(), 128 + signal, "{measured}");
            assert_eq!(RunError::Load(load()).exit_code(), 128 + signal);
            assert_eq!(linux().signal(), Some(signal));
        }
        // Other image errors keep their codes.
        let missing = LinuxError::Image(ImageError::Read(LoadError::Read {
            path: "/x".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        }));
        assert_eq!(missing.exit_code(), NO_IMAGE);
        assert_eq!(missing.signal(), None);
    }
}
