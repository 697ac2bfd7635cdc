//! Our VMM on this host's KVM behind the [`Backend`] trait: the run is
//! `machine::run`, observed from the host by a [`Measurer`].

use std::sync::Arc;

use super::{Backend, BackendError, Ran, Requested, TimeMetric};
use crate::machine::HostSide;
use crate::observe::measure::{Measurer, ObservedKvm};
use crate::probe::host::HostFacts;
use crate::spec::{ResolvedRun, Target};

/// Our VMM on this host's KVM, observed from the host (exits, KVM
/// statistics, the guest's telemetry page). It holds the host facts its
/// caller gathered: what it hands `machine::run` and what it says about
/// this KVM come from them.
#[derive(Debug, Clone)]
pub struct Kvm {
    facts: Arc<HostFacts>,
}

impl Kvm {
    /// The backend on the KVM `facts` describe.
    pub fn new(facts: Arc<HostFacts>) -> Self {
        Kvm { facts }
    }
}

impl Backend for Kvm {
    fn name(&self) -> &'static str {
        "kvm"
    }

    fn target(&self) -> Target {
        Target::Kvm
    }

    fn run_observed(&self, resolved: &ResolvedRun, mut m: Measurer) -> Result<Ran, BackendError> {
        m.on_kvm(ObservedKvm {
            flavour: self.facts.kvm_flavour(),
            sees_cr3_writes: self.facts.sees_cr3_writes(),
        });
        let host = HostSide {
            kvm: self.facts.kvm_flavour(),
            vcpu_filter: crate::sandbox::vcpu_filter()?,
            supported_cpuid: self.facts.supported_cpuid(),
        };
        let outcome = crate::machine::run(resolved, &host, &mut m)?;
        Ok(Ran {
            outcome,
            observer: Some(m),
        })
    }

    fn time(&self) -> TimeMetric {
        TimeMetric {
            metric: "ns_per_call",
            unit: "ns",
            source: "host-clock",
        }
    }

    fn refuse(&self, asked: &Requested) -> Option<String> {
        if asked.no_irqchip && asked.cpus > 1 {
            return Some(
                "--cpus above 1 needs the in-kernel irqchip (the guest starts its other CPUs \
                 by INIT/SIPI through the LAPIC): drop --no-irqchip"
                    .into(),
            );
        }
        if !asked.qemu_args.is_empty() {
            return Some("--qemu-arg needs --backend qemu".into());
        }
        if asked.no_plugin {
            return Some("--no-plugin needs --backend qemu".into());
        }
        None
    }

    fn describe(&self, run: &ResolvedRun) -> (Option<&'static str>, String) {
        use crate::preflight::cmdline::EntryChoice;
        let entry = match (run.config.guest.entry, run.guest.entry) {
            (_, None) => "none (the workload runs no user code)".to_string(),
            (EntryChoice::Auto, Some(e)) => {
                let how = if crate::machine::loader::is_elf32(&run.image) {
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
        (Some(self.facts.describe_kvm()), format!("; entry {entry}"))
    }

    fn sweep_line(&self) -> (&'static str, String) {
        ("KVM", self.facts.describe_kvm().to_owned())
    }

    fn no_cross_checks(&self) -> Option<&'static str> {
        None
    }

    fn blind_spot(&self) -> Option<&'static str> {
        (!self.facts.sees_cr3_writes()).then_some(
            "with EPT/NPT KVM does not see guest CR3 writes; cr3_writes_* are guest-reported only",
        )
    }

    fn omits_pcid(&self) -> Option<String> {
        match self.facts.pcid_usable() {
            Some((true, _)) => None,
            Some((false, detail)) => Some(format!(
                "this host's vCPU has no usable PCID (probe: {detail})"
            )),
            None => Some("the PCID probe could not run".into()),
        }
    }

    fn refill_unprobed(&self) -> Option<&'static str> {
        None
    }
}
