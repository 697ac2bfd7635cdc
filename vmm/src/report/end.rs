//! How a run ended, as data: the run document's `stop` (the VM's stop
//! reason, a `code` and its parameters, with its words beside it),
//! `exit_code` (the process's) and `failure` (why a run that stopped well
//! still failed: a Linux guest's end as `cli::linux::diagnose` names it).
//! The words are rendered in one place each (the stop reason's and the
//! failure's `Display`), and copied here so that a reader of the document
//! need not know every code (docs/report-json.md, "How the run ended").

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::machine::{RunOutcome, StopReason};

/// Why the VM stopped, with the vCPU that stopped it and the words.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEnd {
    /// The stop reason: `code` and that code's parameters.
    #[serde(flatten)]
    pub reason: StopReason,
    /// With several vCPUs: the one whose own stop (a guest exit, a fault)
    /// stopped the VM; `None` when the watchdog stopped it, or with one.
    pub vcpu: Option<u32>,
    /// The stop reason in words (as the text summary prints it).
    pub text: String,
    /// The guest's own `@fault` lines (its exception reports: `vector`,
    /// `name`, `rip`, `cr2`, ...), each as its `key=value` fields, in order.
    #[serde(default)]
    pub guest_faults: Vec<BTreeMap<String, String>>,
}

impl RunEnd {
    /// How `outcome` ended.
    pub fn of(outcome: &RunOutcome) -> Self {
        RunEnd {
            reason: outcome.stop.clone(),
            vcpu: outcome.stopped_by,
            text: outcome.stop_description(),
            guest_faults: outcome
                .faults()
                .map(crate::report::guest_result::line_fields)
                .collect(),
        }
    }
}

/// Why a Linux guest's run failed although its VM may have stopped well
/// (`cli::linux::diagnose` decides; its exit code is the CLI's): a `code`
/// and its parameters. Its words are its `Display`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum Failure {
    /// The kernel panicked (its console said `Kernel panic`).
    LinuxPanic {
        /// The panic line (guest text, escaped).
        panic: String,
        /// Whether ptiscope's init had started.
        init_started: bool,
    },
    /// Status 0, but the init printed no `@result` line.
    NoResult,
    /// PTI was not as asked, or the host's count disagreed with the log.
    PtiCheck {
        /// What was found, in words (`linux::check_pti`'s).
        found: String,
    },
    /// The init ended with a status other than 0.
    InitStatus {
        /// The status it wrote.
        status: u32,
        /// Its `@pti-mismatch`/`@badcmdline` line, else the status's name
        /// (guest text, escaped).
        why: String,
    },
    /// `--timeout` fired after the init started, before it finished.
    InitTimeout {
        /// The timeout, in milliseconds.
        after_ms: u64,
    },
    /// `--timeout` fired before the kernel reached ptiscope's init.
    BootTimeout {
        /// The timeout, in milliseconds.
        after_ms: u64,
    },
    /// The guest reset or powered off without the init's exit status.
    Reset {
        /// Whether ptiscope's init had started.
        init_started: bool,
    },
    /// The VM stopped otherwise (the document's `stop` says how).
    VmStopped {
        /// The stop, in words.
        stop: String,
    },
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::LinuxPanic {
                panic,
                init_started,
            } => write!(
                f,
                "the Linux kernel panicked{}: {panic}",
                if *init_started {
                    ""
                } else {
                    " before ptiscope's init ran"
                }
            ),
            Failure::NoResult => write!(
                f,
                "the Linux guest ended with status 0 but ptiscope's init printed no @result line \
                 (QEMU itself may have failed)"
            ),
            Failure::PtiCheck { found } => write!(f, "{found}"),
            Failure::InitStatus { status, why } => {
                write!(f, "ptiscope's init ended with status {status}: {why}")
            }
            Failure::InitTimeout { after_ms } => write!(
                f,
                "ptiscope's init started but did not finish within --timeout ({} s): raise \
                 --timeout or lower iterations (TCG runs Linux slowly)",
                *after_ms as f64 / 1e3
            ),
            Failure::BootTimeout { after_ms } => write!(
                f,
                "the Linux kernel did not reach ptiscope's init within --timeout ({} s): it hangs \
                 in boot, or the timeout is too short for this kernel under TCG",
                *after_ms as f64 / 1e3
            ),
            Failure::Reset { init_started } => write!(
                f,
                "the Linux guest reset or powered off without the init's exit status ({})",
                if *init_started {
                    "the init started"
                } else {
                    "before ptiscope's init ran"
                }
            ),
            Failure::VmStopped { stop } => write!(f, "{stop}"),
        }
    }
}

/// The run document's `failure`: the [`Failure`]'s code and parameters,
/// with its words.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureData {
    /// The failure: `code` and its parameters.
    #[serde(flatten)]
    pub failure: Failure,
    /// Its words.
    pub text: String,
}

impl From<&Failure> for FailureData {
    fn from(f: &Failure) -> Self {
        FailureData {
            failure: f.clone(),
            text: f.to_string(),
        }
    }
}

/// The run that stopped a `compare` or `sweep` early, as its document's
/// `partial.run` has it: which run, its exit code, and, where its guest
/// ran, how it ended (a run that could not start has only its words).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FailedRun {
    /// Which run (`compare run 3 of 5`, `pti=on at wss=4K touches=1 run 2`).
    pub run: String,
    /// The exit code it maps to (the command's, unless a later one is higher).
    pub exit_code: i32,
    /// How its VM stopped, where it ran.
    pub stop: Option<RunEnd>,
    /// Why it failed although its VM stopped as it did (a Linux guest's end).
    pub failure: Option<FailureData>,
    /// The error in words (its first line: the console's tail is stderr's).
    pub text: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::cpu_config::RegsSnapshot;
    use serde_json::json;

    fn end(reason: StopReason, vcpu: Option<u32>) -> RunEnd {
        RunEnd {
            text: reason.to_string(),
            reason,
            vcpu,
            guest_faults: Vec::new(),
        }
    }

    /// Every stop is `{"code", its parameters, "vcpu", "text"}`, and reads
    /// back as it was written.
    #[test]
    fn a_stop_is_its_code_and_parameters_with_its_words() {
        let v = serde_json::to_value(end(StopReason::Timeout { after_ms: 700 }, None)).unwrap();
        assert_eq!(
            v,
            json!({"code": "timeout", "after_ms": 700, "vcpu": null, "guest_faults": [],
                   "text": "timeout: the guest was stopped after 700 ms"})
        );
        let regs = RegsSnapshot {
            rip: 0x100000,
            cr0: 0x11,
            ..Default::default()
        };
        for reason in [
            StopReason::GuestExit { status: 7 },
            StopReason::Signal { signal: 15 },
            StopReason::Shutdown { regs: Some(regs) },
            StopReason::Reset,
            StopReason::InternalError {
                suberror: 1,
                data: vec![2, 3],
                regs: None,
            },
            StopReason::Halted { regs: Some(regs) },
            StopReason::KvmRunFailed { errno: 4 },
        ] {
            let e = end(reason, Some(1));
            let v = serde_json::to_value(&e).unwrap();
            assert!(v["code"].is_string() && v["text"].is_string(), "{v}");
            assert_eq!(v["vcpu"], 1);
            assert_eq!(serde_json::from_value::<RunEnd>(v).unwrap(), e);
        }
        let v = serde_json::to_value(end(StopReason::Shutdown { regs: Some(regs) }, None)).unwrap();
        assert_eq!(
            (v["code"].as_str(), &v["regs"]["cr0"]),
            (Some("shutdown"), &json!(0x11))
        );
    }

    /// A failure is its code and parameters with the same words stderr says.
    #[test]
    fn a_failure_is_its_code_and_parameters_with_its_words() {
        let f = Failure::BootTimeout { after_ms: 1500 };
        let v = serde_json::to_value(FailureData::from(&f)).unwrap();
        assert_eq!(
            (v["code"].as_str(), &v["after_ms"]),
            (Some("boot_timeout"), &json!(1500))
        );
        assert!(
            v["text"]
                .as_str()
                .unwrap()
                .contains("within --timeout (1.5 s)"),
            "{v}"
        );
        assert_eq!(serde_json::from_value::<FailureData>(v).unwrap().failure, f);
    }
}
