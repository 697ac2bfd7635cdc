//! What a backend declares to the registry ([`Registration`]) and what
//! it is built from ([`Chosen`]): a leaf that each backend and the
//! registry (`super::registry`, which lists the backends) both read.

use std::sync::Arc;
use std::time::Duration;

use super::{Backend, BackendError};
use crate::probe::host::HostFacts;

/// A backend as the command line knows it.
pub struct Registration {
    /// `--backend`'s value, and the reports' `backend` (its
    /// [`Backend::name`]).
    pub name: &'static str,
    /// Its line in `--backend`'s help.
    pub about: &'static str,
    /// Adds the options only this backend takes to a command (a clap
    /// `Args` type's `augment_args`); `|c| c` for none.
    pub options: fn(clap::Command) -> clap::Command,
    /// Builds the backend from the command line's values of its options.
    pub build: fn(&Chosen) -> Result<Box<dyn Backend>, BackendError>,
    /// Whether `reproduce --backend auto` tries it, in this list's order,
    /// the next one where the one before refused the guest before boot.
    pub reproduce_auto: bool,
    /// How long a Linux guest takes here: `--timeout`'s default with
    /// `--linux` is made of it.
    pub linux_pace: LinuxPace,
}

/// How long a Linux guest takes on a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinuxPace {
    /// The boot to the init, with the power-off after it.
    pub boot: Duration,
    /// One call of the measured loop.
    pub per_call: Duration,
}

/// What a backend is built from: its options' values, and the host facts
/// (gathered once per process by the caller, only when a backend asks).
pub struct Chosen<'a> {
    /// The command line's values (`None`: options made in code, every
    /// one at its default).
    pub matches: Option<&'a clap::ArgMatches>,
    /// This host's facts (KVM's module, its probe's findings).
    pub host_facts: &'a dyn Fn() -> Arc<HostFacts>,
}

impl Chosen<'_> {
    /// This backend's options, typed by its own `Args` type (its defaults
    /// where they were not parsed from a command line).
    pub fn options<T: clap::FromArgMatches + Default>(&self) -> T {
        typed(self.matches)
    }
}

/// `T`'s options from a command line's values, or its defaults.
pub(super) fn typed<T: clap::FromArgMatches + Default>(matches: Option<&clap::ArgMatches>) -> T {
    matches
        .and_then(|m| T::from_arg_matches(m).ok())
        .unwrap_or_default()
}
