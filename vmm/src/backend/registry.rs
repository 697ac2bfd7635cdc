//! Every backend ptiscope knows, in one list ([`BACKENDS`]): its name for
//! `--backend`, its help line, the command-line options only it takes
//! (declared by the backend as a clap `Args` type and merged into every
//! command that takes `--backend`: [`BackendOptions`]), how it is built
//! from them, and whether `reproduce --backend auto` tries it.
//!
//! The CLI knows no backend by name: `--backend`'s values and help come
//! from here ([`BackendName`]), the backend is built here
//! ([`BackendName::build`]), an option of one backend given with another
//! is refused here ([`BackendOptions::given`] with `backend::refusal`), and
//! what a backend is for the reports is its [`super::Profile`]. Adding a
//! backend is a module under `backend/` and its line in [`BACKENDS`].

use std::sync::{Arc, OnceLock};

pub use super::registration::{Chosen, LinuxPace, Registration};
use super::{Backend, BackendError, OwnOption};
use crate::probe::host::HostFacts;

/// Every backend, in `reproduce --backend auto`'s order of preference.
pub static BACKENDS: &[Registration] = &[
    super::kvm::REGISTRATION,
    super::tcg::REGISTRATION,
    super::nested::REGISTRATION,
    super::replay::REGISTRATION,
];

/// A Linux guest's pace inside `--backend nested` (its inner `kvm` runs'
/// too).
pub const NESTED_PACE: LinuxPace = super::nested::LINUX_PACE;

/// A backend's name on the command line: one of [`BACKENDS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendName(&'static str);

impl BackendName {
    /// The registered backend called `name`.
    pub fn of(name: &str) -> Option<BackendName> {
        BACKENDS
            .iter()
            .find(|r| r.name == name)
            .map(|r| BackendName(r.name))
    }

    /// The name.
    pub fn as_str(self) -> &'static str {
        self.0
    }

    /// Its registration.
    pub fn registration(self) -> &'static Registration {
        BACKENDS
            .iter()
            .find(|r| r.name == self.0)
            .expect("a BackendName is made only from a registered name")
    }

    /// The backend, built from the options given.
    pub fn build(
        self,
        options: &BackendOptions,
        host_facts: &dyn Fn() -> Arc<HostFacts>,
    ) -> Result<Box<dyn Backend>, BackendError> {
        (self.registration().build)(&Chosen {
            matches: options.matches.as_ref(),
            host_facts,
        })
    }

    /// `--backend`'s value parser: the registered names, each with its
    /// help line.
    pub fn parser() -> impl clap::builder::TypedValueParser<Value = BackendName> {
        use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
        PossibleValuesParser::new(
            BACKENDS
                .iter()
                .map(|r| PossibleValue::new(r.name).help(r.about)),
        )
        .map(|s| BackendName::of(&s).expect("clap accepted only a registered name"))
    }
}

impl Default for BackendName {
    /// This host's KVM, through ptiscope's VMM.
    fn default() -> Self {
        BackendName(BACKENDS[0].name)
    }
}

impl std::fmt::Display for BackendName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// An option a registered backend declares: its clap id and the option.
struct Declared {
    id: &'static str,
    option: OwnOption,
}

/// Every registered backend's options, read once from their clap
/// declarations.
fn declared() -> &'static [Declared] {
    static DECLARED: OnceLock<Vec<Declared>> = OnceLock::new();
    DECLARED.get_or_init(|| {
        let mut all = Vec::new();
        for r in BACKENDS {
            let cmd = (r.options)(clap::Command::new(r.name));
            for a in cmd.get_arguments() {
                let Some(long) = a.get_long() else { continue };
                // Once per process, for the life of the process.
                let flag: &'static str = Box::leak(format!("--{long}").into_boxed_str());
                let id: &'static str = Box::leak(a.get_id().as_str().to_owned().into_boxed_str());
                all.push(Declared {
                    id,
                    option: OwnOption {
                        flag,
                        owner: r.name,
                        what: None,
                    },
                });
            }
        }
        all
    })
}

/// The options the registered backends declare, for `backend::refusal`.
pub fn declared_options() -> impl Iterator<Item = &'static OwnOption> {
    declared().iter().map(|d| &d.option)
}

/// The values of every registered backend's options, as one command
/// line gave them: flattened into each command that takes `--backend`
/// (`#[command(flatten)]`), each backend reading its own
/// ([`BackendOptions::of`]).
#[derive(Clone, Default)]
pub struct BackendOptions {
    /// The command's matches (`None`: built in code, every option unset).
    matches: Option<clap::ArgMatches>,
}

impl BackendOptions {
    /// A backend's options, typed by its own `Args` type (its defaults
    /// where the options were not parsed from a command line).
    pub fn of<T: clap::FromArgMatches + Default>(&self) -> T {
        super::registration::typed(self.matches.as_ref())
    }

    /// The registered backends' options given on the command line, by
    /// flag, in the registry's order.
    pub fn given(&self) -> Vec<&'static str> {
        let Some(m) = &self.matches else {
            return Vec::new();
        };
        declared()
            .iter()
            .filter(|d| {
                matches!(
                    m.try_get_raw(d.id),
                    Ok(Some(_)) if m.value_source(d.id) == Some(clap::parser::ValueSource::CommandLine)
                )
            })
            .map(|d| d.option.flag)
            .collect()
    }
}

impl std::fmt::Debug for BackendOptions {
    /// The options given, with their values: two sets of options that
    /// read alike are alike, however they were made.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut list = f.debug_map();
        if let Some(m) = &self.matches {
            for d in declared() {
                if self.given().contains(&d.option.flag) {
                    let values: Vec<String> = m
                        .get_raw(d.id)
                        .into_iter()
                        .flatten()
                        .map(|v| v.to_string_lossy().into_owned())
                        .collect();
                    list.entry(&d.option.flag, &values);
                }
            }
        }
        list.finish()
    }
}

impl clap::FromArgMatches for BackendOptions {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        Ok(BackendOptions {
            matches: Some(m.clone()),
        })
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        self.matches = Some(m.clone());
        Ok(())
    }
}

impl clap::Args for BackendOptions {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        BACKENDS.iter().fold(cmd, |c, r| (r.options)(c))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cmd {
        #[arg(long, default_value = "kvm", value_parser = BackendName::parser())]
        backend: BackendName,
        #[command(flatten)]
        options: BackendOptions,
    }

    #[test]
    fn names_are_unique_and_each_builds_from_its_name() {
        for (i, r) in BACKENDS.iter().enumerate() {
            assert!(BACKENDS[..i].iter().all(|o| o.name != r.name), "{}", r.name);
            assert_eq!(
                BackendName::of(r.name).map(BackendName::as_str),
                Some(r.name)
            );
        }
        assert_eq!(BackendName::of("vmware"), None);
    }

    #[test]
    fn a_backends_options_are_on_the_command_line_and_given_ones_are_listed() {
        use clap::Parser;
        let c = Cmd::try_parse_from(["x", "--backend", "qemu", "--no-plugin"]).unwrap();
        assert_eq!(c.backend.as_str(), "qemu");
        assert_eq!(c.options.given(), vec!["--no-plugin"]);
        let c = Cmd::try_parse_from(["x"]).unwrap();
        assert_eq!(c.backend, BackendName::default());
        assert!(c.options.given().is_empty());
        let e = Cmd::try_parse_from(["x", "--backend", "vmware"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("possible values: kvm, qemu, nested, replay"),
            "{e}"
        );
    }
}
