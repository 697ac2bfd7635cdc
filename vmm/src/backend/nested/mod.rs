//! `--backend nested` behind the [`Backend`] trait: ptiscope's VMM on a real
//! kvm_amd inside QEMU TCG. The run is settled here, outside, as for any
//! backend (for the inner KVM: preflight asks [`Backend::facts`], which are
//! the inner ptiscope's probed facts); this backend sends the settled run
//! in ([`wire::WireRun`]), the inner ptiscope runs it with the KVM backend
//! and sends its [`RunRecord`] back, which [`Ran::from_record`] turns into
//! this run.
//!
//! The VM is one [`Session`] per backend value: booted at the first question
//! (the facts, or the first run), kept for every run after it (compare's 10+
//! runs, sweep's grid), stopped when the backend is dropped. How a session
//! boots and talks (QEMU, the initramfs, the serial channel, the blob
//! window) is the `nested` module's, above the CLI: it hands its
//! [`Starter`] to [`provide_sessions`] when the process starts (`main`).

pub mod wire;

use std::sync::{Arc, Mutex, OnceLock};

use super::kvm::Kvm;
use super::record::RunRecord;
use super::{Backend, BackendError, HostWatch, Profile, Ran, Requested};
use crate::probe::host::HostFacts;
use crate::spec::nested::KvmPaging;
use crate::spec::{ResolvedRun, RunConfig, Target};

/// What a session is started for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionSpec {
    /// `--nested-paging`, if given.
    pub paging: Option<KvmPaging>,
    /// Whether the runs boot a Linux guest (the default paging, the outer
    /// plugin and the outer vCPUs follow).
    pub linux: bool,
    /// The runs' vCPUs.
    pub cpus: u32,
}

/// One booted VM serving runs.
pub trait Session: Send {
    /// Its KVM's facts (seeded with what the inner ptiscope probed).
    fn facts(&self) -> Arc<HostFacts>;
    /// Runs `run` inside: its record, and its console when the run's goes
    /// somewhere (`None` otherwise).
    fn run(&mut self, run: &ResolvedRun) -> Result<(RunRecord, Option<String>), NestedRunError>;
}

/// Starts a session (`progress` hears its stages), or says why it could not.
pub type Starter =
    fn(&SessionSpec, &mut dyn FnMut(&str)) -> Result<Box<dyn Session>, NestedRunError>;

static STARTER: OnceLock<Starter> = OnceLock::new();

/// Hands this process's way to start sessions to the backend (`main` does,
/// with `nested::session::start`); the first one given stays.
pub fn provide_sessions(start: Starter) {
    let _ = STARTER.set(start);
}

/// Why a nested run could not run.
#[derive(Debug, thiserror::Error)]
pub enum NestedRunError {
    /// No session starter in this process (a library caller that did not
    /// provide one).
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

/// `--backend nested`: the settled run goes into a QEMU-TCG Linux with a
/// real kvm_amd, and comes back as a record.
pub struct Nested {
    paging: Option<KvmPaging>,
    session: Mutex<Option<Box<dyn Session>>>,
}

impl Nested {
    /// The backend with `--nested-paging` (`None`: shadow paging for a
    /// Linux guest where the outer QEMU runs it correctly, else nested
    /// paging).
    pub fn new(paging: Option<KvmPaging>) -> Self {
        Nested {
            paging,
            session: Mutex::new(None),
        }
    }

    /// The session's facts, starting it for `spec` if there is none.
    fn session_facts(&self, spec: SessionSpec) -> Result<Arc<HostFacts>, NestedRunError> {
        let mut s = self.session.lock().unwrap_or_else(|p| p.into_inner());
        if s.is_none() {
            let start = STARTER.get().ok_or(NestedRunError::NoStarter)?;
            *s = Some(start(&spec, &mut |m| eprintln!("ptiscope: {m}"))?);
        }
        Ok(s.as_ref().map(|s| s.facts()).expect("started above"))
    }

    fn spec(&self, linux: bool, cpus: u32) -> SessionSpec {
        SessionSpec {
            paging: self.paging,
            linux,
            cpus,
        }
    }

    /// The KVM backend on the session's facts (or, before one, facts that
    /// say only what the inner KVM is): what a nested run's profile is.
    fn inner(&self) -> Kvm {
        let s = self.session.lock().unwrap_or_else(|p| p.into_inner());
        let facts = match s.as_ref() {
            Some(s) => s.facts(),
            None => Arc::new(HostFacts::of_inner_kvm(
                self.paging != Some(KvmPaging::Shadow),
                None,
                Default::default(),
            )),
        };
        Kvm::new(facts)
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
        Some(self.session_facts(spec).map_err(BackendError::from))
    }

    fn run(&self, resolved: &ResolvedRun, _watch: HostWatch) -> Result<Ran, BackendError> {
        let spec = self.spec(resolved.guest_kind.is_linux(), resolved.config.cpus);
        self.session_facts(spec)?;
        let mut s = self.session.lock().unwrap_or_else(|p| p.into_inner());
        let session = s.as_mut().ok_or(NestedRunError::NoStarter)?;
        let (record, console) = session.run(resolved)?;
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
        self.inner().profile()
    }

    fn options_of(&self) -> &'static str {
        "kvm"
    }

    fn check(&self, flag: &str, asked: &Requested) -> Option<String> {
        if flag == "--metrics-interval" {
            return Some(
                "--metrics-interval samples KVM's statistics from the host while the guest runs;                  --backend nested's KVM runs inside its VM: not with --backend nested"
                    .into(),
            );
        }
        self.inner().check(flag, asked)
    }
}
