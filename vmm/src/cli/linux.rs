//! `ptiscope linux fetch`: Debian's kernels into the cache.

use crate::cli::exit_code::{self, ExitCode as _};
use crate::cli::LinuxCommand;
use crate::linux::{check_pti, guest_pti, init_started, kernel_panic, HostPhaseObservation};
use crate::machine::RunOutcome;
use crate::preflight::linux::fetch;
use crate::report::end::Failure;
use crate::spec::linux::LinuxGuest;
use ptiscope_devices::escape_str;

/// Runs a `ptiscope linux` command; returns the exit code.
pub fn run(cmd: &LinuxCommand) -> i32 {
    match cmd {
        LinuxCommand::Fetch(args) => {
            let Some(cache) = fetch::cache_dir() else {
                say!("ptiscope linux fetch: {}", fetch::FetchError::NoCache);
                return exit_code::USAGE;
            };
            let mut failed = None;
            for known in fetch::KNOWN
                .iter()
                .filter(|k| args.only.as_deref().is_none_or(|o| o == k.name))
            {
                let mut say = |s: &str| say!("ptiscope linux fetch: {}", escape_str(s));
                match fetch::fetch(known, &cache, &mut say) {
                    Ok(path) => println!("{} {}", known.name, path.display()),
                    Err(e) => {
                        say!(
                            "ptiscope linux fetch: {}: {}",
                            known.name,
                            exit_code::escape_message(&e.to_string())
                        );
                        let code = fetch_exit_code(&e);
                        // A signal ends the whole fetch: the kernels after
                        // this one are not tried.
                        if e.signal().is_some() {
                            return code;
                        }
                        failed.get_or_insert(code);
                    }
                }
            }
            failed.unwrap_or(0)
        }
    }
}

/// The exit code of a failed fetch (docs/running.md): 128 + a signal that
/// stopped it, 73 for a cache that cannot be made or written, 69 for a
/// package source that cannot give the kernel (apt-get, apt-cache, dpkg
/// failing or missing, no i386 packages, no kernel in the package).
pub fn fetch_exit_code(e: &fetch::FetchError) -> i32 {
    use fetch::FetchError;
    match e {
        FetchError::Interrupted(signal) => 128 + signal,
        FetchError::NoCache => exit_code::USAGE,
        FetchError::CacheNotDirectory { .. }
        | FetchError::CacheNotWritable { .. }
        | FetchError::Io { .. } => exit_code::CANT_CREATE,
        FetchError::Tool { .. }
        | FetchError::NoImagePackage(_)
        | FetchError::NoI386
        | FetchError::NoKernel(_) => exit_code::KVM_UNAVAILABLE,
    }
}

/// How a Linux run that did not end well ended: the failure as data, its
/// exit code, and the console's last lines (for stderr, not the document).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinuxEnd {
    /// The documented exit code of that end.
    pub code: i32,
    /// What failed (its words are its `Display`).
    pub failure: Failure,
    /// The console's last lines, escaped, each on a line of its own after
    /// `last console lines:` (empty: none).
    pub tail: String,
}

impl std::fmt::Display for LinuxEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", self.failure, self.tail)
    }
}

/// Why a Linux run that did not end well ended, as data, with the exit
/// code it maps to. `None` for a run that ended with the init's success.
///
/// `host` is what a host observer saw in the measured phase (the QEMU TCG
/// plugin, when it is there): its CR3 writes per system call must agree
/// with the kernel log, or the run fails.
pub fn diagnose(
    outcome: &RunOutcome,
    guest: &LinuxGuest,
    host: Option<&HostPhaseObservation>,
) -> Option<LinuxEnd> {
    use crate::machine::StopReason;
    let mut tail = String::new();
    if !outcome.console_tail.is_empty() {
        tail.push_str("\n  last console lines:");
        for l in &outcome.console_tail {
            tail.push_str(&format!("\n    | {}", ptiscope_devices::escape_str(l)));
        }
    }
    let end = |code, failure| {
        Some(LinuxEnd {
            code,
            failure,
            tail: tail.clone(),
        })
    };
    let pti = || match check_pti(guest.pti, guest_pti(outcome), host) {
        Ok(_) => None,
        Err(found) => Some(LinuxEnd {
            code: exit_code::VM_ERROR,
            failure: Failure::PtiCheck { found },
            tail: String::new(),
        }),
    };
    if let Some(p) = kernel_panic(outcome) {
        return end(
            exit_code::LINUX_PANIC,
            Failure::LinuxPanic {
                panic: ptiscope_devices::escape_str(p.trim()),
                init_started: init_started(outcome),
            },
        );
    }
    match &outcome.stop {
        StopReason::GuestExit { status: 0 } => {
            let measures = !guest.init_words.contains("workload=none");
            let result = outcome
                .machine_lines
                .iter()
                .any(|l| l.starts_with(ptiscope_abi::RESULT_PREFIX));
            if measures && !result {
                return end(exit_code::VM_ERROR, Failure::NoResult);
            }
            pti()
        }
        StopReason::GuestExit { status } => {
            let why = outcome
                .machine_lines
                .iter()
                .find(|l| l.starts_with("@pti-mismatch") || l.starts_with("@badcmdline"))
                .cloned()
                .unwrap_or_else(|| ptiscope_abi::exit_status::name(*status).to_string());
            end(
                outcome.exit_code(),
                Failure::InitStatus {
                    status: *status,
                    why: ptiscope_devices::escape_str(&why),
                },
            )
        }
        // Stopped after the init had measured (its @result line, every
        // result right): its teardown ran out, not the measurement, whose
        // figures stand with a note (`linux::measured_before_timeout`).
        StopReason::Timeout { .. }
            if crate::linux::measured_before_timeout(outcome, guest).is_some() =>
        {
            pti()
        }
        StopReason::Timeout { after_ms } => end(
            exit_code::TIMEOUT,
            if init_started(outcome) {
                Failure::InitTimeout {
                    after_ms: *after_ms,
                }
            } else {
                Failure::BootTimeout {
                    after_ms: *after_ms,
                }
            },
        ),
        StopReason::Shutdown { .. } | StopReason::Reset => end(
            exit_code::TRIPLE_FAULT,
            Failure::Reset {
                init_started: init_started(outcome),
            },
        ),
        other => end(
            other.exit_code(),
            Failure::VmStopped {
                stop: other.to_string(),
            },
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::exit_code;
    use crate::linux::tests::{guest, obs, outcome};
    use ptiscope_abi::options::PtiMode;

    #[test]
    fn diagnose_names_each_end_and_takes_the_host_observation() {
        use crate::machine::StopReason;
        let ok_lines = [
            "@linux release=6.1 arch=x86_64 pti=on asked_pti=on",
            "@result workload=getppid iterations=10 cycles=1 ns=1 pti=on",
        ];
        let g = guest(PtiMode::On);
        let done = outcome(StopReason::GuestExit { status: 0 }, &ok_lines, &[]);
        assert_eq!(diagnose(&done, &g, None), None);
        assert_eq!(diagnose(&done, &g, Some(&obs(10, 20))), None);
        // The host saw no CR3 writes although the log says PTI is on.
        let end = diagnose(&done, &g, Some(&obs(10, 0))).unwrap();
        assert_eq!(end.code, exit_code::VM_ERROR);
        assert!(
            matches!(&end.failure, Failure::PtiCheck { found } if found.contains("disagree")),
            "{end:?}"
        );
        // Status 0 without a result line is not a success.
        let bare = outcome(StopReason::GuestExit { status: 0 }, &ok_lines[..1], &[]);
        assert_eq!(
            diagnose(&bare, &g, None).unwrap().failure,
            Failure::NoResult
        );
        let panic = outcome(
            StopReason::Reset,
            &[],
            &["[ 0.03] Kernel panic - not syncing: VFS: Unable to mount root fs"],
        );
        let end = diagnose(&panic, &g, None).unwrap();
        assert_eq!(end.code, exit_code::LINUX_PANIC);
        assert!(
            matches!(&end.failure, Failure::LinuxPanic { panic, .. }
                if panic.contains("Unable to mount root fs")),
            "{end:?}"
        );
        assert!(end.to_string().contains("Unable to mount root fs"), "{end}");
    }

    /// A timeout after the init's @result line keeps what was measured
    /// (a note, no error); before it, or with wrong results, it is the
    /// timeout it was.
    #[test]
    fn a_timeout_after_the_result_line_keeps_the_figures() {
        use crate::machine::StopReason;
        let g = guest(PtiMode::On);
        let timeout = StopReason::Timeout { after_ms: 1500 };
        let lines = [
            "@linux release=6.1 arch=x86_64 pti=on asked_pti=on",
            "@result workload=getppid iterations=10 cycles=1 ns=1 pti=on mismatches=0",
        ];
        let late = outcome(timeout.clone(), &lines, &[]);
        assert_eq!(diagnose(&late, &g, None), None);
        let note = crate::linux::measured_before_timeout(&late, &g)
            .unwrap()
            .to_string();
        assert!(
            note.contains("after the init's @result line") && note.contains("1.5 s"),
            "{note}"
        );
        // PTI is still checked.
        let off = outcome(
            timeout.clone(),
            &[
                "@linux release=6.1 arch=x86_64 pti=off asked_pti=on",
                lines[1],
            ],
            &[],
        );
        assert_eq!(diagnose(&off, &g, None).unwrap().code, exit_code::VM_ERROR);
        // No @result yet, or wrong results: the timeout.
        let early = outcome(timeout.clone(), &lines[..1], &[]);
        assert_eq!(diagnose(&early, &g, None).unwrap().code, exit_code::TIMEOUT);
        assert_eq!(crate::linux::measured_before_timeout(&early, &g), None);
        let wrong = outcome(
            timeout,
            &[
                lines[0],
                "@result workload=getppid iterations=10 cycles=1 mismatches=3",
            ],
            &[],
        );
        assert_eq!(diagnose(&wrong, &g, None).unwrap().code, exit_code::TIMEOUT);
        // A run that ended on its own gets no note.
        let done = outcome(StopReason::GuestExit { status: 0 }, &lines, &[]);
        assert_eq!(crate::linux::measured_before_timeout(&done, &g), None);
    }
}
