//! Where a run runs, behind one trait: our VMM on this host's KVM
//! ([`Kvm`]), or QEMU's TCG ([`Qemu`]) for what the host's KVM cannot
//! run, with every figure marked guest-reported unless the TCG plugin
//! observes it.
//!
//! What differs per backend lives here and nowhere else: how a run starts
//! ([`Backend::run`]), what it can observe (its time metric, whether it
//! cross-checks), what it refuses and why ([`Backend::refuse`]), how the
//! report header describes it, and which default configurations it leaves
//! out. The guest kind (the companion image or a Linux kernel with its
//! initramfs) is the run's ([`crate::spec::ResolvedRun::linux`]) and composes
//! with either backend.

mod kvm;
pub mod qemu;
mod tcg;

pub use kvm::Kvm;
pub use tcg::{enables_kvm, Qemu};

use crate::machine::{RunError, RunOutcome};
use crate::observe::measure::Measurer;
use crate::report::RunSummary;
use crate::spec::{ResolvedRun, Target};

/// The time figure a backend measures per call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeMetric {
    /// The rate's name (`ns_per_call`).
    pub metric: &'static str,
    /// Its unit (`ns`).
    pub unit: &'static str,
    /// Who measures it (`host-clock`, `guest`).
    pub source: &'static str,
}

/// A run that ran: how it ended, and what observed it.
pub struct Ran {
    /// How the run ended.
    pub outcome: RunOutcome,
    /// The host-side observer of a KVM run (none under QEMU, whose figures
    /// come with the outcome).
    observer: Option<Measurer>,
}

impl Ran {
    /// The host-side observer, for a backend that has one.
    pub fn observer(&self) -> Option<&Measurer> {
        self.observer.as_ref()
    }

    /// How the run ended, and the host-side observer if there was one.
    pub fn into_parts(self) -> (RunOutcome, Option<Measurer>) {
        (self.outcome, self.observer)
    }

    /// The run's summary, its configuration words given.
    pub fn summary(&self, config: Vec<String>) -> RunSummary {
        match &self.observer {
            Some(m) => m.summary(&self.outcome, config),
            None => crate::report::summary_from_result(&self.outcome, config),
        }
    }
}

/// Why a backend could not run a run.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The VM could not be built or run.
    #[error(transparent)]
    Kvm(#[from] RunError),
    /// QEMU could not be started or failed.
    #[error(transparent)]
    Qemu(#[from] qemu::QemuError),
    /// The vCPU threads' seccomp filter could not be made ready.
    #[error(transparent)]
    Sandbox(#[from] crate::sandbox::SandboxError),
}

/// The options a backend may refuse (what the command line asked for that
/// only one backend understands).
#[derive(Debug, Clone, Copy, Default)]
pub struct Requested<'a> {
    /// `--qemu-arg`s.
    pub qemu_args: &'a [String],
    /// `--no-plugin` (`run` only: the others take it as the QEMU backend's setting).
    pub no_plugin: bool,
    /// `--no-irqchip`.
    pub no_irqchip: bool,
    /// `--cpus`.
    pub cpus: u32,
    /// `--metrics-interval`.
    pub metrics_interval: bool,
    /// A `--cpu-vuln` other than `host`.
    pub cpu_vuln: bool,
}

/// One way to run a resolved run and observe it.
pub trait Backend {
    /// `kvm` or `qemu` (the reports' `backend`).
    fn name(&self) -> &'static str;
    /// Where preflight settles a run for this backend.
    fn target(&self) -> Target;
    /// Runs one resolved run, observing it as this backend can.
    fn run(&self, resolved: &ResolvedRun) -> Result<Ran, BackendError> {
        self.run_observed(resolved, Measurer::new())
    }
    /// [`Backend::run`] with a host-side observer set up by the caller
    /// (`run --metrics-interval`); a backend that cannot observe from the
    /// host drops it.
    fn run_observed(&self, resolved: &ResolvedRun, observer: Measurer)
        -> Result<Ran, BackendError>;
    /// The time figure per call (`--runs auto` watches it; sweep reports it).
    fn time(&self) -> TimeMetric;
    /// Options this backend does not take, with why (a usage error).
    fn refuse(&self, asked: &Requested) -> Option<String>;
    /// The line the report header gives this backend (`None`: the
    /// environment header says it all) and the run-line note (`compare`).
    fn describe(&self, run: &ResolvedRun) -> (Option<&'static str>, String);
    /// The backend's line in `sweep`'s header: (label, text).
    fn sweep_line(&self) -> (&'static str, String);
    /// A note for the cross-checks (host-observed vs guest-reported), when
    /// there is nothing to cross-check.
    fn no_cross_checks(&self) -> Option<&'static str>;
    /// A note about what this backend does not see (printed after the table).
    fn blind_spot(&self) -> Option<&'static str>;
    /// Why the default `pti=on,pcid=on` configuration is left out, if it is.
    fn omits_pcid(&self) -> Option<String>;
    /// Why the KVM refill probe says nothing here, if it does not.
    fn refill_unprobed(&self) -> Option<&'static str>;
}
