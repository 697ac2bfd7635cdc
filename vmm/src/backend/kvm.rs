//! Our VMM on this host's KVM behind the [`Backend`] trait: the run is
//! `machine::run`, observed from the host by a [`Measurer`] this backend
//! makes (the caller says only what it wants watched: [`HostWatch`]).

use std::path::PathBuf;
use std::sync::Arc;

use super::{
    Backend, BackendError, HostWatch, Observed, OwnOption, Profile, Ran, Requested, TimeMetric,
};
use crate::machine::HostSide;
use crate::observe::measure::{Measurer, ObservedKvm};
use crate::probe::host::HostFacts;
use crate::report::time_basis::TimeBasis;
use crate::spec::{ResolvedRun, Target};

/// The options only this backend takes: what they set is KVM's or the
/// VMM's, which no other backend has.
pub const OPTIONS: &[OwnOption] = &[
    OwnOption {
        flag: "--metrics-interval",
        owner: "kvm",
        what: Some("reads KVM's statistics"),
    },
    OwnOption {
        flag: "--cpu-vuln",
        owner: "kvm",
        what: Some("sets what the KVM vCPU reports"),
    },
    // A compare side's key for the same setting (checked by the side
    // parser as `cpu=` is for QEMU).
    OwnOption {
        flag: "cpu_vuln=",
        owner: "kvm",
        what: Some("sets what the KVM vCPU reports"),
    },
    OwnOption {
        flag: "--no-irqchip",
        owner: "kvm",
        what: Some("is a KVM setting"),
    },
];

/// `--backend kvm` in the registry: its own options are `run`'s
/// ([`OPTIONS`]), as they set what only a run's VMM has.
pub const REGISTRATION: super::registration::Registration = super::registration::Registration {
    name: "kvm",
    about: "ptiscope's own VMM on /dev/kvm (host-observed and guest-reported figures)",
    options: |c| c,
    build: |c| Ok(Box::new(Kvm::new((c.host_facts)()))),
    reproduce_auto: true,
    linux_pace: super::registration::LinuxPace {
        boot: std::time::Duration::from_secs(30),
        per_call: std::time::Duration::from_micros(100),
    },
};

/// Our VMM on this host's KVM, observed from the host (exits, KVM
/// statistics, the guest's telemetry page). It holds the host facts its
/// caller gathered: what it hands `machine::run` and what it says about
/// this KVM come from them.
#[derive(Debug, Clone)]
pub struct Kvm {
    facts: Arc<HostFacts>,
    /// Inside `--backend nested`: the outer QEMU's plugin's live file
    /// (`observe::outer_plugin`), which counts a Linux guest's CR3 writes
    /// where this KVM cannot (nested paging).
    outer_plugin: Option<PathBuf>,
}

impl Kvm {
    /// The backend on the KVM `facts` describe (whether it is
    /// `--backend nested`'s inner kvm_amd is one of them).
    pub fn new(facts: Arc<HostFacts>) -> Self {
        Kvm {
            outer_plugin: facts.outer_plugin().map(Into::into),
            facts,
        }
    }

    /// What a time is on this KVM: the hardware's under kvm_intel/kvm_amd,
    /// an emulated kernel's under kvm_pvm, TCG's inside `--backend nested`.
    pub fn time_basis(&self) -> TimeBasis {
        if self.facts.nested() {
            TimeBasis::NestedTcg
        } else {
            TimeBasis::of_kvm_module(
                crate::report::environment::kvm(&self.facts)
                    .module
                    .as_deref(),
            )
        }
    }
}

impl Backend for Kvm {
    fn name(&self) -> &'static str {
        "kvm"
    }

    fn target(&self) -> Target {
        Target::Kvm
    }

    fn run(&self, resolved: &ResolvedRun, watch: HostWatch) -> Result<Ran, BackendError> {
        let mut m = Measurer::new();
        if let Some(live) = watch.live_metrics {
            m = m.with_live_metrics(live);
        }
        m.on_kvm(ObservedKvm {
            flavour: self.facts.kvm_flavour(),
            sees_cr3_writes: self.facts.sees_cr3_writes(),
        });
        let host = HostSide {
            kvm: self.facts.kvm_flavour(),
            vcpu_filter: crate::sandbox::vcpu_filter()?,
            supported_cpuid: self.facts.supported_cpuid(),
            nested: self.facts.nested(),
        };
        // Under `--backend nested` a Linux guest's CR3 writes are counted
        // by the outer QEMU's plugin (observe::outer_plugin).
        let outer = match (&resolved.guest_kind, &self.outer_plugin) {
            (crate::spec::guest::GuestKind::Linux(_), Some(path)) => {
                Some(crate::observe::outer_plugin::Watch::start(path))
            }
            _ => None,
        };
        let outcome = crate::machine::run(resolved, &host, &mut m)?;
        if let Some(w) = outer {
            m.outer_plugin = w.finish();
        }
        Ok(Ran {
            outcome,
            observed: Observed::Host(Box::new(m)),
        })
    }

    fn check(&self, flag: &str, asked: &Requested) -> Option<String> {
        if flag == "--no-irqchip" && asked.cpus > 1 {
            return Some(
                "--cpus above 1 needs the in-kernel irqchip (the guest starts its other CPUs \
                 by INIT/SIPI through the LAPIC): drop --no-irqchip"
                    .into(),
            );
        }
        None
    }

    fn profile(&self) -> Profile {
        Profile {
            time: TimeMetric {
                metric: "ns_per_call",
                unit: "ns",
                source: "host-clock",
            },
            time_basis: self.time_basis(),
            header_line: Some(self.facts.describe_kvm()),
            run_note: Box::new(run_note),
            sweep_line: ("KVM", self.facts.describe_kvm().to_owned()),
            console: None,
            no_cross_checks: None,
            blind_spot: (!self.facts.sees_cr3_writes()).then_some(
                if self.outer_plugin.is_some() {
                    // Under --backend nested the outer QEMU's plugin counts
                    // a Linux guest's (observe::outer_plugin).
                    "with EPT/NPT KVM does not see guest CR3 writes; under --backend nested the \
                     outer QEMU's TCG plugin counts a Linux guest's ([qemu-plugin] insn_mov_cr3_*)"
                } else {
                    "with EPT/NPT KVM does not see guest CR3 writes; cr3_writes_* are guest-reported only"
                },
            ),
            omits_pcid: {
                let facts = self.facts.clone();
                Box::new(move || match facts.pcid_usable() {
                    Some((true, _)) => None,
                    Some((false, detail)) => Some(format!(
                        "this host's vCPU has no usable PCID (probe: {detail})"
                    )),
                    None => Some("the PCID probe could not run".into()),
                })
            },
            refill_unprobed: None,
            capabilities: super::Capabilities {
                host_observer: true,
                // Under --backend nested with nested paging, the outer
                // QEMU's plugin counts a Linux guest's.
                host_counts_cr3_writes: self.facts.sees_cr3_writes() || self.outer_plugin.is_some(),
                counts_kernel_by_address: false,
                live_metrics: true,
            },
        }
    }
}

/// `compare`'s run-line note for a run on KVM: how its system-call entry
/// was chosen.
fn run_note(run: &ResolvedRun) -> String {
    use crate::spec::cmdline::EntryChoice;
    let entry = match (run.config.guest.entry, run.guest.entry) {
        (_, None) => "none (the workload runs no user code)".to_string(),
        (EntryChoice::Auto, Some(e)) => {
            let how = if crate::machine::loader::is_elf32(&run.boot.image) {
                // probe::host::choose_auto_entry: not from the long-mode probe.
                "the i386 guest's own: SYSENTER works in 32-bit mode on Intel and AMD"
            } else if run.entry_guessed {
                "guessed from the KVM module: the probe could not run"
            } else {
                "from the probe"
            };
            format!("{e} (entry=auto, {how})")
        }
        (EntryChoice::Fixed(_), Some(e)) => e.to_string(),
    };
    format!("; entry {entry}")
}
