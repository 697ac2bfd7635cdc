//! `--backend replay`: runs nothing, and each run returns a run recorded
//! earlier (`ptiscope run --record FILE`, [`super::record`]). The reports,
//! thresholds and exit codes of `run`, `compare` and `sweep` are then
//! made again from recorded results: on a machine without KVM or QEMU, in
//! a test of the report layer, or to redo a report from a CI run's
//! records.
//!
//! The first configuration a command runs gets the first `--replay`
//! record, the second configuration the second, and so on (`compare
//! --replay BASELINE.json --replay COMPARE.json`); every run of one
//! configuration returns its record again, so a compare of replayed runs
//! has no spread. A record whose configuration contradicts the run's
//! (`pti=on` recorded, `pti=off` asked) is refused, naming the option.
//!
//! This backend is also the proof that a backend is one module here plus
//! its line in [`super::registry::BACKENDS`]: nothing in `cli`, `report`
//! or `preflight` names it.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::record::{RecordedTime, RunRecord};
use super::registration::Registration;
use super::{Backend, BackendError, ConsoleNote, HostWatch, Profile, Ran, Requested, TimeMetric};
use crate::report::time_basis::TimeBasis;
use crate::spec::{ResolvedRun, Target};

/// The exit codes of this backend's errors (sysexits.h, as
/// `cli::exit_code`'s, which this layer does not import).
const EX_USAGE: i32 = 64;
const EX_DATAERR: i32 = 65;
const EX_NOINPUT: i32 = 66;

/// `--backend replay`'s own options.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ReplayOptions {
    /// `--backend replay`: a run record (`ptiscope run --record FILE`),
    /// repeatable: the first configuration run gets the first record, the
    /// second the second (`compare --replay BASE.json --replay COMP.json`).
    #[arg(long, value_name = "FILE.json")]
    pub replay: Vec<PathBuf>,
}

/// `--backend replay` in the registry.
pub const REGISTRATION: Registration = Registration {
    name: "replay",
    about: "runs nothing: each configuration returns a run recorded earlier \
            (`run --record FILE`, given with --replay FILE)",
    options: <ReplayOptions as clap::Args>::augment_args,
    build: |c| {
        Ok(Box::new(Replay::open(
            &c.options::<ReplayOptions>().replay,
        )?))
    },
    reproduce_auto: false,
    // Nothing runs: the floor of the default applies.
    linux_pace: super::registration::LinuxPace {
        boot: std::time::Duration::ZERO,
        per_call: std::time::Duration::ZERO,
    },
};

/// The records, and which configuration each went to.
pub struct Replay {
    /// Each `--replay` file and its record, in order.
    records: Vec<(PathBuf, RunRecord)>,
    /// The configurations run so far (their command lines), in order: the
    /// Nth distinct one gets the Nth record.
    seen: Mutex<Vec<String>>,
}

impl Replay {
    /// Reads every record, refusing none given, a file it cannot read and
    /// one that is not a record.
    pub fn open(paths: &[PathBuf]) -> Result<Replay, BackendError> {
        if paths.is_empty() {
            return Err(error(
                EX_USAGE,
                "--backend replay needs the records to replay: give --replay FILE \
                 (written by `ptiscope run --record FILE`), once per configuration"
                    .into(),
            ));
        }
        let records = paths
            .iter()
            .map(|p| read(p).map(|r| (p.clone(), r)))
            .collect::<Result<_, _>>()?;
        Ok(Replay {
            records,
            seen: Mutex::new(Vec::new()),
        })
    }

    /// The record of `resolved`'s configuration (the Nth distinct one run
    /// gets the Nth record), checked against it.
    fn record_for(&self, resolved: &ResolvedRun) -> Result<&(PathBuf, RunRecord), BackendError> {
        let key = configuration(&resolved.boot.cmdline).join(" ");
        let index = {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            match seen.iter().position(|k| *k == key) {
                Some(i) => i,
                None => {
                    seen.push(key.clone());
                    seen.len() - 1
                }
            }
        };
        let Some(entry) = self.records.get(index) else {
            return Err(error(
                EX_USAGE,
                format!(
                    "--backend replay: configuration {} ({key}) has no record: {} --replay \
                     file(s) given; give one per configuration, in the order they run",
                    index + 1,
                    self.records.len()
                ),
            ));
        };
        if let Some(why) = contradiction(&key, &entry.1) {
            return Err(error(
                EX_DATAERR,
                format!("--replay {}: {why}", entry.0.display()),
            ));
        }
        Ok(entry)
    }

    /// The first record's time figure: what every replayed run's times are.
    fn time(&self) -> Option<&RecordedTime> {
        self.records.first().and_then(|(_, r)| r.time.as_ref())
    }
}

/// A backend error of this backend.
fn error(code: i32, message: String) -> BackendError {
    BackendError::Other { message, code }
}

/// The most bytes one `--replay` file may have: a record is a few KiB
/// (a Linux run's with its kernel symbols a few MiB); parsing is about 20
/// times its size in memory.
const MAX_RECORD_BYTES: u64 = 64 << 20;

/// Reads one record: a regular file (a FIFO or a device would block or
/// never end) of at most [`MAX_RECORD_BYTES`], read within
/// `input::READ_TIME_LIMIT`, a termination signal ending the read.
fn read(path: &Path) -> Result<RunRecord, BackendError> {
    use crate::input::{read_regular, InputError, READ_TIME_LIMIT};
    let bytes = read_regular("--replay", path, MAX_RECORD_BYTES, READ_TIME_LIMIT).map_err(|e| {
        let code = match &e {
            InputError::Interrupted { signal, .. } => 128 + signal,
            InputError::Io { .. } => EX_NOINPUT,
            _ => EX_USAGE,
        };
        error(
            code,
            format!("{e} (give a file written by `ptiscope run --record FILE`)"),
        )
    })?;
    let text = String::from_utf8_lossy(&bytes);
    RunRecord::parse(&text)
        .map_err(|e| error(EX_DATAERR, format!("--replay {}: {e}", path.display())))
}

/// A guest command line's configuration words: every `key=value` but the
/// telemetry page's address and the entry (which the host settles, and
/// which a record made on another host may have settled otherwise).
fn configuration(cmdline: &str) -> Vec<&str> {
    cmdline
        .split_whitespace()
        .filter(|w| !w.starts_with("telemetry=") && !w.starts_with("entry="))
        .collect()
}

/// The first option the run asks (`key`: its configuration words) with a
/// value other than the record's, in words.
fn contradiction(key: &str, record: &RunRecord) -> Option<String> {
    let recorded = configuration(&record.outcome.cmdline);
    key.split_whitespace().find_map(|w| {
        let (k, v) = w.split_once('=')?;
        let other = recorded
            .iter()
            .filter_map(|r| r.split_once('='))
            .find(|(rk, _)| *rk == k)?
            .1;
        (other != v).then(|| {
            format!(
                "the run asks {k}={v}, the record ran {k}={other}: give the records in the \
                 order the configurations run (compare: baseline first)"
            )
        })
    })
}

/// A string of a record, kept for the process's life: a profile's words
/// are `'static`, and a command reads a handful of records.
fn keep(s: &str) -> &'static str {
    Box::leak(s.to_owned().into_boxed_str())
}

impl Backend for Replay {
    fn name(&self) -> &'static str {
        "replay"
    }

    /// Settled as an emulator's run is: no host limit applies to a run
    /// that does not run here.
    fn target(&self) -> Target {
        Target::QemuTcg
    }

    fn run(&self, resolved: &ResolvedRun, _watch: HostWatch) -> Result<Ran, BackendError> {
        let (_, record) = self.record_for(resolved)?;
        Ok(Ran::from_record(record.clone()))
    }

    fn profile(&self) -> Profile {
        let time = self.time();
        let files: Vec<String> = self
            .records
            .iter()
            .map(|(p, r)| format!("{} ({})", p.display(), r.backend))
            .collect();
        Profile {
            time: TimeMetric {
                metric: time.map_or("ns_per_call", |t| keep(&t.metric)),
                unit: time.map_or("ns", |t| keep(&t.unit)),
                source: time.map_or("recorded", |t| keep(&t.source)),
            },
            time_basis: time.map_or(TimeBasis::Unknown, |t| t.basis),
            header_line: Some(
                "replay: nothing runs here; every run is a recorded one (run --record)",
            ),
            run_note: Box::new(|_| "; replayed from its record".into()),
            sweep_line: ("replay", files.join(", ")),
            console: Some(ConsoleNote {
                label: "backend replay: a recorded run",
                figures: "every figure is the record's",
            }),
            no_cross_checks: None,
            blind_spot: None,
            omits_pcid: Box::new(|| None),
            refill_unprobed: Some("replayed runs: nothing was probed here"),
            // What observed the recorded runs; nothing observes here.
            capabilities: self
                .records
                .first()
                .and_then(|(_, r)| r.capabilities)
                .map(|c| super::Capabilities {
                    live_metrics: false,
                    ..c
                })
                .unwrap_or_default(),
        }
    }

    fn check(&self, _flag: &str, _asked: &Requested) -> Option<String> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_record_an_unreadable_one_and_a_non_record_are_refused_with_their_codes() {
        let code = |r: Result<Replay, BackendError>| match r {
            Err(BackendError::Other { code, message }) => (code, message),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("accepted"),
        };
        let (c, m) = code(Replay::open(&[]));
        assert_eq!(c, EX_USAGE);
        assert!(m.contains("give --replay FILE"), "{m}");
        let (c, m) = code(Replay::open(&["/nonexistent/r.json".into()]));
        assert_eq!(c, EX_NOINPUT);
        assert!(
            m.starts_with("cannot read --replay /nonexistent/r.json"),
            "{m}"
        );
        let dir = std::env::temp_dir().join(format!("ptiscope-replay-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("bad.json");
        std::fs::write(&bad, "{\"schema\": \"ptiscope.run/2\"}").unwrap();
        let (c, m) = code(Replay::open(std::slice::from_ref(&bad)));
        assert_eq!(c, EX_DATAERR);
        assert!(m.contains("ptiscope.record/1"), "{m}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn configuration_words_leave_out_what_the_host_settles() {
        assert_eq!(
            configuration("pti=on entry=syscall telemetry=0x1000 workload=getpid"),
            ["pti=on", "workload=getpid"]
        );
    }
}
