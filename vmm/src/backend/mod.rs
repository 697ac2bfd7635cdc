//! Where a run runs, behind one trait: our VMM on this host's KVM
//! ([`Kvm`]), QEMU's TCG ([`Qemu`]) for what the host's KVM cannot run
//! (every figure guest-reported unless the TCG plugin observes it), a KVM
//! inside QEMU TCG (`nested`), or runs recorded earlier (`replay`). Every
//! backend is named once, in [`registry::BACKENDS`]: the command line's
//! `--backend`, its own options and `reproduce`'s order come from there
//! (docs/backends.md). A run that ran elsewhere or earlier comes back as
//! a typed record ([`record::RunRecord`]), which the reports read as
//! they read a run of their own ([`Observed::Recorded`]).
//!
//! The trait is mechanism only, as cloud-hypervisor's `hypervisor` crate
//! is: a backend starts a run of a resolved guest ([`Backend::run`]) and
//! returns a backend-neutral [`Ran`] whose observer part is its own
//! ([`Observed`]). What a backend *is* for the reports (its time metric,
//! its line in the report header and in `sweep`'s, what it cannot
//! cross-check or see, which default configurations it leaves out) is data,
//! one [`Profile`] the `cli` and `report` layers read: they print what a
//! backend says about itself and never match on which backend it is. The
//! options only one backend takes are that backend's: each declares its
//! own (a clap `Args` type in its registration, merged into every command
//! that takes `--backend`; `kvm::OPTIONS` for `run`'s KVM options and
//! compare sides' keys), [`refusal`] checks every backend the same way
//! against them, and [`Backend::check`] looks only at
//! the backend's own options. Which summary a run gets (companion or Linux
//! guest, host-observed or console-only) is decided once, by
//! [`Ran::summary`].
//!
//! The guest kind (the companion or a Linux kernel,
//! [`crate::spec::ResolvedRun::guest_kind`]) and what it boots from (image,
//! initrd and command line, [`crate::spec::ResolvedRun::boot`]) are the
//! run's, and compose with either backend.
//!
//! Adding a backend: a module here with a type implementing [`Backend`]
//! and its [`registry::Registration`] (its name, help, own options and how
//! it is built), named in [`registry::BACKENDS`]. Nothing in `cli`,
//! `report` or `preflight` names a backend: they go through the registry
//! and this trait (docs/backends.md).

mod kvm;
pub mod nested;
pub mod qemu;
pub mod qemu_options;
pub mod record;
pub mod registration;
pub mod registry;
mod replay;
mod tcg;

pub use kvm::Kvm;
pub use nested::Nested;
pub use tcg::{Qemu, QemuOptions};

use crate::linux::HostPhaseObservation;
use crate::machine::{RunError, RunOutcome};
use crate::observe::live_metrics::LiveMetricsConfig;
use crate::observe::measure::Measurer;
use crate::observe::qemu_plugin::PluginOutput;
use crate::report::RunSummary;
use crate::spec::guest::GuestKind;
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

/// How a run the host did not observe introduces its report (`run`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsoleNote {
    /// After the stop reason: `backend qemu, TCG`.
    pub label: &'static str,
    /// Who measured the figures below.
    pub figures: &'static str,
}

/// A backend as the reports describe it: data the `cli` and `report`
/// layers print, so that they need not know which backend ran.
pub struct Profile {
    /// The time figure per call (`--runs auto` watches it; sweep reports it).
    pub time: TimeMetric,
    /// What that time is here (hardware, emulated kernel, TCG): recorded in
    /// every report's environment, where the reports read it.
    pub time_basis: crate::report::time_basis::TimeBasis,
    /// The line the report header gives this backend (`None`: the
    /// environment header says it all).
    pub header_line: Option<&'static str>,
    /// The run-line note `compare` appends for a run (its entry, or the
    /// emulator that ran it).
    pub run_note: Box<dyn Fn(&ResolvedRun) -> String>,
    /// The backend's line in `sweep`'s header: (label, text).
    pub sweep_line: (&'static str, String),
    /// `run`'s introduction of a console-only report (`None` for a backend
    /// whose runs a host-side observer watches: the VMM's own lines say it).
    pub console: Option<ConsoleNote>,
    /// A note for the cross-checks (host-observed vs guest-reported), when
    /// there is nothing to cross-check.
    pub no_cross_checks: Option<&'static str>,
    /// A note about what this backend does not see (printed after the table).
    pub blind_spot: Option<&'static str>,
    /// Why the default `pti=on,pcid=on` configuration is left out, if it
    /// is: asked only when `sweep` picks its default configurations, since
    /// on KVM the answer may take the PCID probe (probe VMs).
    pub omits_pcid: Box<dyn Fn() -> Option<String>>,
    /// Why the KVM refill probe says nothing here, if it does not.
    pub refill_unprobed: Option<&'static str>,
    /// What it can observe, as data: the environment block records it,
    /// and the commands ask it (`--by-symbol` needs `counts_kernel_by_address`).
    pub capabilities: Capabilities,
}

pub use crate::report::environment::{BackendIdentity, Capabilities};

/// How a report's environment names `backend`: its name, what a time is
/// there and what it can observe.
pub fn identity(backend: &dyn Backend) -> BackendIdentity {
    let p = backend.profile();
    BackendIdentity {
        name: backend.name(),
        time_basis: p.time_basis,
        capabilities: p.capabilities,
    }
}

/// What the caller wants watched from the host while a run runs, in terms
/// no backend owns (a backend that cannot watch from the host is never
/// asked: `--metrics-interval` is the KVM backend's option).
#[derive(Default)]
pub struct HostWatch {
    /// `run --metrics-interval`: KVM's statistics sampled while it runs.
    pub live_metrics: Option<LiveMetricsConfig>,
}

/// What observed a run besides its guest: each kind of observer its own
/// variant, so that a backend without one carries no empty one.
pub enum Observed {
    /// The VMM's host-side observer (KVM's exits and statistics, the
    /// telemetry page); boxed, as it is large beside the other variants.
    Host(Box<Measurer>),
    /// The console, and under QEMU the TCG plugin's counts; `note` is what
    /// the backend says of the figures of such a run (who counted them,
    /// what its times are), the first note of the companion's summary.
    Console {
        /// The summary's note on its figures (the backend's own words).
        note: crate::report::note::Note,
        /// What the QEMU backend's TCG plugin wrote (`Off`: none loaded).
        plugin: PluginOutput,
    },
    /// A run that ran elsewhere or earlier, as its record says: its
    /// summary is the one chosen where it ran.
    Recorded(Box<record::Recorded>),
}

/// A run that ran: how it ended, and what observed it.
pub struct Ran {
    /// How the run ended.
    pub outcome: RunOutcome,
    /// What observed it from the host.
    pub observed: Observed,
}

/// A run's summary, and what the host saw of a Linux guest's phase (which
/// `cli::linux::diagnose` weighs against the kernel log).
pub struct Summarized {
    /// The run's summary.
    pub summary: RunSummary,
    /// The host's view of a Linux guest's measured phase, if it had one.
    pub host: Option<HostPhaseObservation>,
}

impl Ran {
    /// The host-side observer, for a backend that has one.
    pub fn observer(&self) -> Option<&Measurer> {
        match &self.observed {
            Observed::Host(m) => Some(m),
            Observed::Console { .. } | Observed::Recorded(_) => None,
        }
    }

    /// The one place a run's summary is chosen: a Linux guest's is the
    /// init's (`linux::summary`), with the VMM's host rows when the VMM ran
    /// it (`linux::summary_on_vmm`) or the TCG plugin's view of the phase
    /// when QEMU did; the companion's is the host observer's
    /// (`Measurer::summary`) or, with none, the guest's word alone. `config`
    /// is the run's configuration words (the companion's summaries carry
    /// them; a Linux guest's come from its init).
    pub fn summary(&self, resolved: &ResolvedRun, config: Vec<String>) -> Summarized {
        let mut s = self.summary_of_kind(resolved, config);
        s.summary.stop = Some(crate::report::end::RunEnd::of(&self.outcome));
        s
    }

    /// [`Ran::summary`]'s choice of summary, before the stop is set.
    fn summary_of_kind(&self, resolved: &ResolvedRun, config: Vec<String>) -> Summarized {
        let o = &self.outcome;
        match (&resolved.guest_kind, &self.observed) {
            (GuestKind::Linux(l), Observed::Host(m)) => {
                let (summary, host) = crate::linux::summary_on_vmm(
                    o,
                    l,
                    &m.summary(o, config),
                    m.sees_cr3_writes(),
                    &m.outer_plugin,
                );
                Summarized { summary, host }
            }
            (GuestKind::Linux(l), Observed::Console { plugin, .. }) => {
                let host = crate::linux::host_observation(plugin, l);
                Summarized {
                    summary: crate::linux::summary(o, plugin, l, host.as_ref()),
                    host,
                }
            }
            (GuestKind::Companion, Observed::Host(m)) => Summarized {
                summary: m.summary(o, config),
                host: None,
            },
            (_, Observed::Recorded(r)) => Summarized {
                summary: r.summary.clone(),
                host: r.host,
            },
            (GuestKind::Companion, Observed::Console { note, plugin }) => Summarized {
                summary: crate::report::summary_from_result(o, plugin, config, note.clone()),
                host: None,
            },
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
    /// `--backend nested`'s session could not run the run.
    #[error(transparent)]
    Nested(#[from] nested::NestedRunError),
    /// Any other backend's error: its words, and the process exit code it
    /// chose (one of `cli::exit_code`'s, e.g. 66 for an input it cannot
    /// read), so that a backend added later needs no variant here.
    #[error("{message}")]
    Other {
        /// What went wrong and what to do.
        message: String,
        /// The exit code.
        code: i32,
    },
}

/// A command-line option that only one backend takes, declared once, by
/// that backend (its module's `OPTIONS`): [`refusal`] refuses it under
/// every other backend.
#[derive(Debug, Clone, Copy)]
pub struct OwnOption {
    /// The option (`--qemu-arg`).
    pub flag: &'static str,
    /// The backend that takes it (its [`Backend::name`]).
    pub owner: &'static str,
    /// What it does that the others cannot (`reads KVM's statistics`),
    /// for the refusal; `None`: the refusal says only which backend it
    /// needs.
    pub what: Option<&'static str>,
}

/// The options of one backend that are not declared with its registration
/// (`run`'s KVM options, compare sides' keys); those declared there
/// ([`registry::declared_options`]) join them in [`own_options`].
const OPTIONS: [&[OwnOption]; 2] = [kvm::OPTIONS, tcg::OPTIONS];

/// Every backend's own options, each with its owner.
pub fn own_options() -> impl Iterator<Item = &'static OwnOption> {
    OPTIONS
        .iter()
        .flat_map(|o| o.iter())
        .chain(registry::declared_options())
}

/// What the command line asked of the backends: which backend-specific
/// options it gave (by flag, in the order they are checked) and the values
/// the backends' own checks ([`Backend::check`]) read.
#[derive(Debug, Clone, Default)]
pub struct Requested {
    /// The backend-specific options given (`--qemu-arg`, `--no-irqchip`).
    pub given: Vec<&'static str>,
    /// `--qemu-arg`s (the QEMU backend checks what they would override).
    pub qemu_args: Vec<String>,
    /// `--cpus` (the KVM backend checks it against `--no-irqchip`).
    pub cpus: u32,
}

/// The first option `asked` gives that `backend` does not take or whose
/// value it refuses, as a usage error naming the option (and the backend
/// it needs); `None` if it takes them all. One check for every backend, in
/// the order the options are given: one another backend declares is
/// refused here, one of `backend`'s own is `backend`'s to check.
pub fn refusal(backend: &dyn Backend, asked: &Requested) -> Option<String> {
    for flag in &asked.given {
        // A backend takes its own options and those of the backend it
        // runs its runs with (`nested`: KVM's).
        let own = own_options().any(|o| o.flag == *flag && o.owner == backend.name());
        let why = (!own)
            .then(|| others_option(backend.options_of(), flag))
            .flatten()
            .or_else(|| backend.check(flag, asked));
        if why.is_some() {
            return why;
        }
    }
    None
}

/// Why `flag` (a command-line option, or a compare side's `key=`) is not
/// for `backend` (its [`Backend::name`]): another backend declared it as its
/// own; `None` when no other backend owns it.
pub fn others_option(backend: &str, flag: &str) -> Option<String> {
    let owner = own_options().find(|o| o.flag == flag && o.owner != backend)?;
    Some(match owner.what {
        Some(what) => format!("{flag} {what}: not with --backend {backend}"),
        None => format!("{flag} needs --backend {}", owner.owner),
    })
}

/// One way to run a resolved run and observe it.
pub trait Backend {
    /// `kvm` or `qemu` (the reports' `backend`).
    fn name(&self) -> &'static str;
    /// Where preflight settles a run for this backend.
    fn target(&self) -> Target;
    /// Runs one resolved run, with what the caller wants watched from the
    /// host, observing it as this backend can.
    fn run(&self, resolved: &ResolvedRun, watch: HostWatch) -> Result<Ran, BackendError>;
    /// This backend as the reports describe it.
    fn profile(&self) -> Profile;
    /// Whether this backend refuses the value of `flag`, one of its own
    /// options that `asked` gives, with why (a usage error); options of
    /// other backends are [`refusal`]'s.
    fn check(&self, flag: &str, asked: &Requested) -> Option<String>;
    /// Whose declared options ([`OwnOption::owner`]) this backend takes:
    /// its own name, or the backend it runs its runs with (`nested` runs
    /// KVM's, and checks their values itself).
    fn options_of(&self) -> &'static str {
        self.name()
    }
    /// The facts of the KVM this backend runs its runs on, when they are
    /// not this host's (`None`: the caller's host facts): preflight settles
    /// `config` with them and the reports describe them. `nested`'s are
    /// its inner kvm_amd's, which starts its session.
    fn facts(
        &self,
        _config: &crate::spec::RunConfig,
    ) -> Option<Result<std::sync::Arc<crate::probe::host::HostFacts>, BackendError>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend that declares no options of its own: what every other
    /// backend's options look like to a backend added later.
    struct Other;

    impl Backend for Other {
        fn name(&self) -> &'static str {
            "other"
        }
        fn target(&self) -> Target {
            Target::QemuTcg
        }
        fn run(&self, _: &ResolvedRun, _: HostWatch) -> Result<Ran, BackendError> {
            unreachable!("the refusal tests run nothing")
        }
        fn profile(&self) -> Profile {
            unreachable!("the refusal tests read no profile")
        }
        fn check(&self, flag: &str, _: &Requested) -> Option<String> {
            panic!("{flag} is not this backend's to check")
        }
    }

    fn asking(flags: &[&'static str]) -> Requested {
        Requested {
            given: flags.to_vec(),
            ..Default::default()
        }
    }

    /// Each option has one owner, and under any other backend the one
    /// generic check refuses it naming the option and its backend (or the
    /// backend that does not take it).
    #[test]
    fn every_backend_option_is_refused_elsewhere_naming_it() {
        let all: Vec<&OwnOption> = own_options().collect();
        for o in &all {
            assert_eq!(
                all.iter().filter(|p| p.flag == o.flag).count(),
                1,
                "{}",
                o.flag
            );
            let why = refusal(&Other, &asking(&[o.flag])).expect(o.flag);
            assert!(why.starts_with(o.flag), "{why}");
            match o.what {
                Some(_) => assert!(why.ends_with(": not with --backend other"), "{why}"),
                None => assert_eq!(why, format!("{} needs --backend {}", o.flag, o.owner)),
            }
        }
        assert_eq!(refusal(&Other, &asking(&[])), None);
    }

    /// The first option refused is the first given: a KVM option before
    /// the QEMU backend's own check of its `--qemu-arg`s, and that check
    /// reached when nothing foreign was given.
    #[test]
    fn options_are_checked_in_the_order_given() {
        let qemu = Qemu { plugin: true };
        let mut asked = asking(&["--no-irqchip", "--qemu-arg"]);
        asked.qemu_args = vec!["-enable-kvm".to_string()];
        assert_eq!(
            refusal(&qemu, &asked).as_deref(),
            Some("--no-irqchip is a KVM setting: not with --backend qemu")
        );
        asked.given = vec!["--qemu-arg", "--no-plugin"];
        let why = refusal(&qemu, &asked).unwrap_or_default();
        assert!(why.contains("turns on KVM acceleration"), "{why}");
        // ptiscope gives QEMU -accel tcg with or without its plugin: QEMU
        // would refuse -enable-kvm beside it, so it is refused either way.
        let why = refusal(&Qemu { plugin: false }, &asked).unwrap_or_default();
        assert!(why.contains("sets QEMU's accelerator itself"), "{why}");
    }
}
