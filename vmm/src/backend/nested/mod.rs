//! `--backend nested` behind the [`Backend`] trait: ptiscope's VMM on a real
//! kvm_amd inside QEMU TCG. The run is settled here, outside, as for any
//! backend (for the inner KVM: preflight asks [`Backend::facts`], which are
//! the inner ptiscope's probed facts); this backend sends the settled run
//! in ([`wire::WireRun`]), the inner ptiscope runs it with the KVM backend
//! and sends its [`RunRecord`] back, which [`Ran::from_record`] turns into
//! this run.
//!
//! The VM is one [`Session`] per backend value and kind of run (the inner
//! paging, a Linux guest or not, the vCPUs: a [`SessionSpec`]): booted at
//! the first question (the facts, or the first run), kept for every run of
//! its kind after it (compare's 10+ runs, sweep's grid, reproduce's cells),
//! stopped when the backend is dropped. How a session
//! boots and talks (QEMU, the initramfs, the serial channel, the blob
//! window) is the `nested` module's, above the CLI: it hands its
//! [`Starter`] to [`provide_sessions`] when the process starts (`main`).

pub mod wire;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use super::kvm::Kvm;
use super::record::RunRecord;
use super::registration::{LinuxPace, Registration};
use super::{Backend, BackendError, HostWatch, Profile, Ran, Requested};
use crate::probe::host::HostFacts;
use crate::probe::host_cache;
use crate::spec::nested::KvmPaging;
use crate::spec::{ResolvedRun, RunConfig, Target};

/// What a session is started for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionSpec {
    /// The inner kvm_amd's paging.
    pub paging: KvmPaging,
    /// Whether the runs boot a Linux guest (the outer plugin and the
    /// outer vCPUs follow).
    pub linux: bool,
    /// The runs' vCPUs.
    pub cpus: u32,
}

/// One booted VM serving runs.
pub trait Session: Send {
    /// What its inner ptiscope probed of its KVM, and the outer plugin's
    /// live file there, if one counts a Linux guest's CR3 writes.
    fn facts(&self) -> (host_cache::Facts, Option<PathBuf>);
    /// Runs `run` inside: its record, and its console when the run's goes
    /// somewhere (`None` otherwise).
    fn run(&mut self, run: &ResolvedRun) -> Result<(RunRecord, Option<String>), NestedRunError>;
}

/// How this process boots sessions: the `nested` module's, handed to
/// [`provide_sessions`] by `main`.
#[derive(Clone, Copy)]
pub struct Sessions {
    /// The inner kvm_amd's paging for `--nested-paging` (`None`: the
    /// default) and whether the runs boot Linux.
    pub paging: fn(Option<KvmPaging>, bool) -> KvmPaging,
    /// Starts a session, or says why not.
    pub start: Starter,
}

/// Starts a session for a [`SessionSpec`] (the `FnMut` hears its stages).
pub type Starter =
    fn(&SessionSpec, &mut dyn FnMut(&str)) -> Result<Box<dyn Session>, NestedRunError>;

static SESSIONS: OnceLock<Sessions> = OnceLock::new();

/// Hands this process's way to boot sessions to the backend (`main` does,
/// with the `nested` module's); the first one given stays.
pub fn provide_sessions(sessions: Sessions) {
    let _ = SESSIONS.set(sessions);
}

/// Why a nested run could not run.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NestedRunError {
    /// No way to boot sessions in this process (a library caller that did
    /// not provide one).
    #[error("--backend nested is not available here: nothing starts its QEMU session")]
    NoStarter,
    /// The session could not be started or broke.
    #[error("--backend nested: {message}")]
    Session {
        /// What went wrong, in words.
        message: String,
        /// The exit status the CLI gives it.
        exit_code: i32,
    },
    /// The inner ptiscope could not run the run.
    #[error("--backend nested: the inner run failed: {0}")]
    Inner(String),
}

/// The backend's sessions: one per kind of run it was asked to run (a
/// [`SessionSpec`]: the inner paging, a Linux guest or not, the vCPUs),
/// booted at the first run of that kind and kept for the next ones; and
/// why a kind's session could not boot (not tried again: a compare's later
/// runs fail as its first did).
#[derive(Default)]
struct State {
    sessions: Vec<(SessionSpec, Box<dyn Session>)>,
    /// What the last facts were asked for before any session booted: the
    /// session the profile's questions boot.
    planned: Option<SessionSpec>,
    failed: Vec<(SessionSpec, NestedRunError)>,
}

impl State {
    /// A booted session that can serve runs of `spec`'s kind: the same
    /// inner paging and Linux or not, and no more outer vCPUs than the
    /// runs' guest has (more stalled Linux boots on the VMM; fewer only
    /// share them), so that the session the settling's facts booted (one
    /// vCPU) serves a Linux guest that preflight gave a second, tick-free
    /// vCPU.
    fn session(&mut self, spec: SessionSpec) -> Option<&mut Box<dyn Session>> {
        self.sessions
            .iter_mut()
            .find(|(s, _)| s.paging == spec.paging && s.linux == spec.linux && s.cpus <= spec.cpus)
            .map(|(_, session)| session)
    }

    /// The kind of run the profile describes: the first booted, else the
    /// one planned.
    fn described(&self) -> Option<SessionSpec> {
        self.sessions.first().map(|(s, _)| *s).or(self.planned)
    }
}

/// Starts the session of `spec`'s kind in `state` if there is none.
fn ensure(state: &Mutex<State>, spec: SessionSpec) -> Result<(), NestedRunError> {
    let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
    if s.session(spec).is_some() {
        return Ok(());
    }
    if let Some((_, e)) = s.failed.iter().find(|(f, _)| *f == spec) {
        return Err(e.clone());
    }
    let sessions = SESSIONS.get().ok_or(NestedRunError::NoStarter)?;
    match (sessions.start)(&spec, &mut |m| eprintln!("ptiscope: {m}")) {
        Ok(session) => {
            s.sessions.push((spec, session));
            Ok(())
        }
        Err(e) => {
            s.failed.push((spec, e.clone()));
            Err(e)
        }
    }
}

/// `--backend nested`'s own options.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct NestedOptions {
    /// `--backend nested`: the inner kvm_amd's paging. `npt` (nested
    /// paging, as modern hosts run KVM) or `shadow` (KVM intercepts the
    /// guest's CR3 writes, and its `tlb_flush` counts them: the host-side
    /// CR3 count of a `--linux` guest). Default: `shadow` with `--linux`,
    /// `npt` for ptiscope's own guest (which counts its CR3 writes itself).
    #[arg(long, value_enum, value_name = "PAGING")]
    pub nested_paging: Option<KvmPaging>,
}

/// A Linux guest on the VMM inside QEMU TCG: the inner boot is TCG's.
pub const LINUX_PACE: LinuxPace = LinuxPace {
    boot: std::time::Duration::from_secs(120),
    per_call: std::time::Duration::from_millis(2),
};

/// `--backend nested` in the registry.
pub const REGISTRATION: Registration = Registration {
    name: "nested",
    about: "ptiscope's VMM on a real KVM (kvm_amd) inside QEMU TCG (docs/kvm-hosts.md): \
            real KVM exits and semantics, emulated time",
    options: <NestedOptions as clap::Args>::augment_args,
    build: |c| {
        Ok(Box::new(Nested::new(
            c.options::<NestedOptions>().nested_paging,
        )))
    },
    reproduce_auto: false,
    linux_pace: LINUX_PACE,
};

/// `--backend nested`: the settled run goes into a QEMU-TCG Linux with a
/// real kvm_amd, and comes back as a record.
pub struct Nested {
    paging: Option<KvmPaging>,
    state: Arc<Mutex<State>>,
}

impl Nested {
    /// The backend with `--nested-paging` (`None`: shadow paging for a
    /// Linux guest where the outer QEMU runs it correctly, else nested
    /// paging).
    pub fn new(paging: Option<KvmPaging>) -> Self {
        Nested {
            paging,
            state: Arc::default(),
        }
    }

    /// The session for runs of this kind (Linux or not, `cpus`).
    fn spec(&self, linux: bool, cpus: u32) -> SessionSpec {
        let paging = match SESSIONS.get() {
            Some(s) => (s.paging)(self.paging, linux),
            None => self.paging.unwrap_or_default(),
        };
        SessionSpec {
            paging,
            linux,
            cpus,
        }
    }

    /// The inner KVM's facts for runs of `spec`: probed inside, asked at
    /// their first use (which boots the session), so that a run refused
    /// before it needs one (a bad image, an option) boots nothing.
    fn facts_for(&self, spec: SessionSpec) -> HostFacts {
        let state = self.state.clone();
        let plugin = {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            s.session(spec).and_then(|s| s.facts().1)
        };
        HostFacts::of_inner_kvm(spec.paging == KvmPaging::Npt, plugin, move || {
            match ensure(&state, spec) {
                Ok(()) => {
                    let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
                    s.session(spec).map(|s| s.facts().0).unwrap_or_default()
                }
                // The run that follows fails with the same error; until
                // then the facts say why they are unknown.
                Err(e) => host_cache::Facts {
                    entries: Some(Err(format!("the nested session did not start ({e})"))),
                    ..Default::default()
                },
            }
        })
    }
}

impl Backend for Nested {
    fn name(&self) -> &'static str {
        "nested"
    }

    fn target(&self) -> Target {
        Target::Kvm
    }

    fn facts(&self, config: &RunConfig) -> Option<Result<Arc<HostFacts>, BackendError>> {
        let spec = self.spec(config.guest_kind.is_linux(), config.cpus);
        {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if s.sessions.is_empty() {
                s.planned = Some(spec);
            }
        }
        Some(Ok(Arc::new(self.facts_for(spec))))
    }

    fn run(&self, resolved: &ResolvedRun, _watch: HostWatch) -> Result<Ran, BackendError> {
        let spec = self.spec(resolved.guest_kind.is_linux(), resolved.config.cpus);
        ensure(&self.state, spec)?;
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let session = s.session(spec).ok_or(NestedRunError::NoStarter)?;
        let (record, console) = session.run(resolved)?;
        drop(s);
        if let Some(text) = console {
            // The inner console goes where the run's would have gone.
            if let Ok((Some(mut w), queue)) =
                crate::output::console_output(&resolved.config.serial_out, resolved.config.timeout)
            {
                let _ = std::io::Write::write_all(&mut w, text.as_bytes());
                drop(w);
                if let Some(q) = queue {
                    let _ = q.finish_by(std::time::Instant::now() + resolved.config.timeout);
                }
            }
        }
        Ok(Ran::from_record(record))
    }

    fn profile(&self) -> Profile {
        // The session's facts (booting it for a question that needs one,
        // e.g. sweep's whether PCID works) once a session is started or
        // planned, else what the inner KVM is without them.
        let started = self
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .described();
        let facts = match started {
            Some(spec) => self.facts_for(spec),
            None => HostFacts::of_inner_kvm(
                self.spec(false, 1).paging == KvmPaging::Npt,
                None,
                Default::default,
            ),
        };
        Kvm::new(Arc::new(facts)).profile()
    }

    fn options_of(&self) -> &'static str {
        "kvm"
    }

    fn check(&self, flag: &str, asked: &Requested) -> Option<String> {
        if flag == "--metrics-interval" {
            return Some(
                "--metrics-interval samples KVM's statistics from the host while the guest runs; \
                 --backend nested's KVM runs inside its VM: not with --backend nested"
                    .into(),
            );
        }
        let facts = HostFacts::of_inner_kvm(true, None, Default::default);
        Kvm::new(Arc::new(facts)).check(flag, asked)
    }
}
