//! `--backend qemu` behind the [`Backend`] trait: QEMU's TCG, observed by
//! ptiscope's TCG plugin (or, with `--no-plugin`, by nothing but the guest).

use super::qemu;
use super::{Backend, BackendError, Ran, Requested, TimeMetric};
use crate::spec::{ResolvedRun, Target};

/// `--backend qemu`: QEMU's TCG, with ptiscope's TCG plugin (`plugin`) or
/// without (`--no-plugin`: every figure guest-reported).
#[derive(Debug, Clone, Copy)]
pub struct Qemu {
    /// Whether ptiscope's TCG plugin observes the runs.
    pub plugin: bool,
}

/// The `--qemu-arg` words that turn KVM acceleration on (`-enable-kvm`,
/// `-accel kvm`, `accel=kvm` in `-machine`'s options, a `tcg:kvm` list),
/// joined as given; `None` if none does.
pub fn enables_kvm(args: &[String]) -> Option<String> {
    let names_kvm = |list: &str| list.split([':', ',']).any(|a| a.trim() == "kvm");
    for (i, arg) in args.iter().enumerate() {
        let name = arg.trim_start_matches('-');
        let option = arg.starts_with('-');
        if option && name == "enable-kvm" {
            return Some(arg.clone());
        }
        if option && name == "accel" {
            if let Some(next) = args.get(i + 1) {
                let value = next.strip_prefix("accel=").unwrap_or(next);
                if value.split(',').next().is_some_and(names_kvm) {
                    return Some(format!("{arg} {next}"));
                }
            }
        }
        if option {
            if let Some(value) = name.strip_prefix("accel=") {
                if names_kvm(value.split(',').next().unwrap_or("")) {
                    return Some(arg.clone());
                }
            }
        }
        for part in arg.split(',') {
            if let Some(value) = part.trim().strip_prefix("accel=") {
                if names_kvm(value) {
                    return Some(arg.clone());
                }
            }
        }
    }
    None
}

impl Backend for Qemu {
    fn name(&self) -> &'static str {
        "qemu"
    }

    fn target(&self) -> Target {
        Target::QemuTcg
    }

    fn run_observed(
        &self,
        resolved: &ResolvedRun,
        _observer: crate::observe::measure::Measurer,
    ) -> Result<Ran, BackendError> {
        Ok(Ran {
            outcome: qemu::run_resolved(resolved)?,
            observer: None,
        })
    }

    fn time(&self) -> TimeMetric {
        TimeMetric {
            metric: "cycles_per_call",
            unit: "cycles",
            source: "guest",
        }
    }

    fn refuse(&self, asked: &Requested) -> Option<String> {
        if asked.metrics_interval {
            return Some(
                "--metrics-interval reads KVM's statistics: not with --backend qemu".into(),
            );
        }
        if asked.cpu_vuln {
            return Some(
                "--cpu-vuln sets what the KVM vCPU reports: not with --backend qemu".into(),
            );
        }
        if asked.no_irqchip {
            return Some("--no-irqchip is a KVM setting: not with --backend qemu".into());
        }
        if self.plugin {
            if let Some(arg) = enables_kvm(asked.qemu_args) {
                return Some(format!(
                    "--qemu-arg {arg} turns on KVM acceleration, under which ptiscope's TCG \
                     plugin counts nothing (TCG plugins see only TCG-translated code): \
                     add --no-plugin, or drop that --qemu-arg"
                ));
            }
        }
        None
    }

    fn describe(&self, run: &ResolvedRun) -> (Option<&'static str>, String) {
        let binary = match run.linux.as_ref().map(|l| l.arch) {
            Some(crate::linux::LinuxArch::X86_64) => "qemu-system-x86_64",
            Some(crate::linux::LinuxArch::I386) => "qemu-system-i386",
            None => qemu::binary_for(&run.image),
        };
        (
            None,
            format!(
                "; backend QEMU TCG ({binary}): software emulation, {}",
                if self.plugin {
                    "[qemu-plugin] figures host-observed, the others guest-reported"
                } else {
                    "every figure guest-reported"
                }
            ),
        )
    }

    fn sweep_line(&self) -> (&'static str, String) {
        (
            "backend",
            format!(
                "QEMU TCG: software emulation, guest-reported cycles per call{}",
                if self.plugin {
                    "; kernel instructions and MOV CR3 host-observed by ptiscope's TCG plugin"
                } else {
                    " (--no-plugin)"
                }
            ),
        )
    }

    fn no_cross_checks(&self) -> Option<&'static str> {
        (!self.plugin).then_some(
            "backend qemu --no-plugin: no host-observed figures, so nothing to cross-check",
        )
    }

    fn blind_spot(&self) -> Option<&'static str> {
        None
    }

    fn omits_pcid(&self) -> Option<String> {
        Some("not probed under QEMU (TCG before QEMU 8 has no PCID); add it with --config".into())
    }

    fn refill_unprobed(&self) -> Option<&'static str> {
        Some("not probed under QEMU TCG: its soft TLB is flushed whole on every CR3 write")
    }
}

#[cfg(test)]
mod tests {
    use super::enables_kvm;

    fn words(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn kvm_acceleration_is_recognised_in_every_spelling() {
        for v in [
            &["-enable-kvm"][..],
            &["--enable-kvm"],
            &["-accel", "kvm"],
            &["-accel", "kvm,kernel-irqchip=on"],
            &["-accel", "accel=kvm"],
            &["-machine", "q35,accel=kvm"],
            &["-M", "accel=tcg:kvm"],
            &["-icount", "shift=0", "-machine", "accel=kvm"],
        ] {
            assert!(enables_kvm(&words(v)).is_some(), "{v:?}");
        }
        for v in [
            &[][..],
            &["-accel", "tcg"],
            &["-machine", "accel=tcg"],
            &["-icount", "shift=0,align=off"],
            &["-append", "kvm"],
            &["-name", "kvm"],
        ] {
            assert_eq!(enables_kvm(&words(v)), None, "{v:?}");
        }
    }
}
