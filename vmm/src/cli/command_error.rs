//! Why `compare`, `sweep` or poundsyscall's table stopped without a
//! result: one typed error the commands return, a leaf of `cli` so that
//! `exit_code` maps it to a number without importing the commands.

use std::path::PathBuf;

use crate::cli::measured_error::MeasuredRunError;
use crate::experiment::{ExperimentError, RunId};
use crate::output::OpenError;
use crate::preflight::PreflightError;

/// Errors in `--baseline`/`--compare` options.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SideError {
    /// A word of the options (`opts`) without `=`.
    #[error("{opts:?}: {word:?} is not key=value")]
    NotKeyValue {
        /// The side's options as given.
        opts: String,
        /// The offending word.
        word: String,
    },
    /// Options that set nothing (empty, or only commas).
    #[error("{opts:?} sets nothing: a side needs at least one key=value (keys: {keys}), e.g. pti=off", keys = crate::cli::compare::side_key::SideKey::list())]
    Empty {
        /// The side's options as given.
        opts: String,
    },
    /// A key that sets one value, given twice.
    #[error("{opts:?}: {key} given twice with different values; give it once (only cmdline= and append= add up)")]
    Repeated {
        /// The side's options as given.
        opts: String,
        /// The key.
        key: String,
    },
    /// A key compare does not know.
    #[error("{opts:?}: unknown key {key:?} (keys: {keys})", keys = crate::cli::compare::side_key::SideKey::list())]
    UnknownKey {
        /// The side's options as given.
        opts: String,
        /// The unknown key.
        key: String,
    },
    /// A known key with a value it does not take.
    #[error("{opts:?}: bad value for {key}: {why}")]
    BadValue {
        /// The side's options as given.
        opts: String,
        /// The key.
        key: String,
        /// What was wrong and what it takes.
        why: String,
    },
}

/// Why an experiment command stopped before its report.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// Options that do not go together, or a value the command refuses.
    #[error("{0}")]
    Usage(String),
    /// `--baseline`/`--compare`/`--config` options that do not parse.
    #[error("{prefix}{source}")]
    Side {
        /// What the options were given as (`--config `, or nothing).
        prefix: &'static str,
        /// What was wrong.
        #[source]
        source: SideError,
    },
    /// `--against FILE` cannot be read or is not a compare result.
    #[error("--against {}: {message}", path.display())]
    Against {
        /// The file.
        path: PathBuf,
        /// Its exit code (no file, bad input, ...).
        code: i32,
        /// What was wrong.
        message: String,
    },
    /// An output file cannot be opened.
    #[error(transparent)]
    Output(#[from] OpenError),
    /// The backend could not say what it runs on (`nested`: its session
    /// did not start).
    #[error(transparent)]
    Backend(#[from] crate::backend::BackendError),
    /// A side cannot be settled (image, entry, host limits).
    #[error("{at}{source}")]
    Settle {
        /// Where in the plan (`pti=on at wss=64K: `, or nothing).
        at: String,
        /// Why.
        #[source]
        source: PreflightError,
    },
    /// A signal arrived before any run.
    #[error("{} {what}; nothing ran", crate::signals::describe(*.signal))]
    Interrupted {
        /// The signal.
        signal: i32,
        /// While doing what.
        what: &'static str,
    },
    /// The experiment stopped without a result.
    #[error("{run}{}", match &**.source {
        ExperimentError::Run { source, .. } => format!(" failed: {source}"),
        ExperimentError::Refused(why) => why.clone(),
    })]
    Experiment {
        /// The failed run, named as the command names it (empty for a
        /// refused sample, whose message says it all).
        run: String,
        /// Why.
        #[source]
        source: Box<ExperimentError<MeasuredRunError>>,
    },
    /// A run measured, but without the figure the report needs.
    #[error("{0}")]
    Missing(String),
}

impl CommandError {
    /// The experiment's error, its failed run named by `name`.
    pub fn experiment(
        source: ExperimentError<MeasuredRunError>,
        name: impl Fn(&RunId) -> String,
    ) -> Self {
        CommandError::Experiment {
            run: match &source {
                ExperimentError::Run { run, .. } => name(run),
                ExperimentError::Refused(_) => String::new(),
            },
            source: Box::new(source),
        }
    }
}

impl From<PreflightError> for CommandError {
    fn from(source: PreflightError) -> Self {
        CommandError::Settle {
            at: String::new(),
            source,
        }
    }
}

impl From<SideError> for CommandError {
    fn from(source: SideError) -> Self {
        CommandError::Side { prefix: "", source }
    }
}
