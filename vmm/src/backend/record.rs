//! A run's typed result as data ([`RunRecord`]): how it ended (the
//! machine's [`RunOutcome`]), its summary as the backend that ran it chose
//! it ([`Ran::summary`]), and what a host-side observer saw of a Linux
//! guest's phase. A backend that runs a run somewhere else hands one back
//! (the nested backend, from inside its VM); one recorded earlier can be
//! run again (`run --record FILE`, then a backend that replays it); either
//! way the reports read it as they read a run of their own, through
//! [`Observed::Recorded`].

use serde::{Deserialize, Serialize};

use super::{Observed, Ran, Summarized};
use crate::linux::HostPhaseObservation;
use crate::machine::RunOutcome;
use crate::report::RunSummary;
use crate::spec::ResolvedRun;

/// The record's schema; a reader refuses any other.
pub const SCHEMA: &str = "ptiscope.record/1";

/// One run's typed result, serialisable.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// The backend that ran it (its [`super::Backend::name`]).
    pub backend: String,
    /// Whether a host-side observer watched it (the VMM's, with KVM's
    /// exits and statistics), or only its console (and a TCG plugin).
    pub host_observed: bool,
    /// How the run ended.
    pub outcome: RunOutcome,
    /// Its summary, before a command adds its environment and notes.
    pub summary: RunSummary,
    /// What the host saw of a Linux guest's measured phase.
    pub host: Option<HostPhaseObservation>,
}

/// Why a record could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Not JSON of a run record.
    #[error("not a ptiscope run record ({SCHEMA}): {0}")]
    Parse(#[from] serde_json::Error),
    /// A record of another version.
    #[error("a run record of schema {found:?}; this ptiscope reads {SCHEMA}: record it again")]
    Schema {
        /// The schema the record says it has.
        found: String,
    },
}

impl RunRecord {
    /// Reads a record from its JSON text.
    pub fn parse(text: &str) -> Result<RunRecord, RecordError> {
        // The schema first: a record of another version may differ in shape.
        let v: serde_json::Value = serde_json::from_str(text)?;
        match v.get("schema").and_then(|s| s.as_str()) {
            Some(s) if s != SCHEMA => Err(RecordError::Schema { found: s.into() }),
            _ => Ok(serde_json::from_value(v)?),
        }
    }

    /// The record as JSON text.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|_| "null".into())
    }
}

/// What a recorded run's observer part holds: what [`Ran::summary`] would
/// otherwise compute from the observer itself.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The backend that ran it.
    pub backend: String,
    /// Whether a host-side observer watched it.
    pub host_observed: bool,
    /// Its summary and host observation, as recorded.
    pub summary: RunSummary,
    /// What the host saw of a Linux guest's phase.
    pub host: Option<HostPhaseObservation>,
}

impl Ran {
    /// This run's record: its outcome and the summary [`Ran::summary`]
    /// chooses for it (`config`: the run's configuration words), named
    /// with the backend that ran it.
    pub fn record(&self, backend: &str, resolved: &ResolvedRun, config: Vec<String>) -> RunRecord {
        let Summarized { summary, host } = self.summary(resolved, config);
        RunRecord {
            schema: SCHEMA.into(),
            backend: backend.into(),
            host_observed: self.host_observed(),
            outcome: self.outcome.clone(),
            summary,
            host,
        }
    }

    /// A run as a record says it ran.
    pub fn from_record(r: RunRecord) -> Ran {
        Ran {
            outcome: r.outcome,
            observed: Observed::Recorded(Box::new(Recorded {
                backend: r.backend,
                host_observed: r.host_observed,
                summary: r.summary,
                host: r.host,
            })),
        }
    }

    /// Whether a host-side observer watched this run (directly, or where
    /// it was recorded).
    pub fn host_observed(&self) -> bool {
        match &self.observed {
            Observed::Host(_) => true,
            Observed::Console { .. } => false,
            Observed::Recorded(r) => r.host_observed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_of_another_schema_or_no_record_is_refused_naming_what_it_is() {
        let e = RunRecord::parse("{}").unwrap_err().to_string();
        assert!(
            e.starts_with("not a ptiscope run record (ptiscope.record/1)"),
            "{e}"
        );
        let e = RunRecord::parse("[1, 2]").unwrap_err().to_string();
        assert!(e.starts_with("not a ptiscope run record"), "{e}");
        let e = RunRecord::parse(r#"{"schema": "ptiscope.record/0"}"#).unwrap_err();
        assert!(matches!(e, RecordError::Schema { .. }), "{e}");
    }
}
