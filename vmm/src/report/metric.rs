//! What a reported figure is, in which unit, and who observed it.

use serde::{Deserialize, Serialize};

/// Who observed a figure. Reports print it next to every number, because a
/// count the host saw and a count the guest claims are not equally trustworthy
/// and not always both available (with EPT/NPT the host does not see guest
/// CR3 writes at all).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Host-observed: KVM's binary stats fd (per vCPU or per VM).
    Kvm,
    /// Guest-reported: the telemetry page or an `@result` console line.
    Guest,
    /// Host-observed: counted by the VMM itself (exits to user space by kind).
    Vmm,
    /// Host-observed: the host's monotonic clock around a phase.
    HostClock,
    /// Host-observed: ptiscope's QEMU TCG plugin (`--backend qemu`), which
    /// counts the guest's instructions inside the emulator.
    QemuPlugin,
}

impl Source {
    /// Short tag for tables: `kvm`, `guest`, `vmm`, `host-clock`.
    pub fn tag(self) -> &'static str {
        match self {
            Source::Kvm => "kvm",
            Source::Guest => "guest",
            Source::Vmm => "vmm",
            Source::HostClock => "host-clock",
            Source::QemuPlugin => "qemu-plugin",
        }
    }

    /// Machine key, the same as the JSON value: `kvm`, `guest`, `vmm`, `host_clock`.
    pub fn key(self) -> &'static str {
        match self {
            Source::Kvm => "kvm",
            Source::Guest => "guest",
            Source::Vmm => "vmm",
            Source::HostClock => "host_clock",
            Source::QemuPlugin => "qemu_plugin",
        }
    }

    /// One-line explanation for report footers.
    pub fn describe(self) -> &'static str {
        match self {
            Source::Kvm => "host-observed, KVM stats fd",
            Source::Guest => "guest-reported, telemetry page / @result line",
            Source::Vmm => "host-observed, counted by the VMM",
            Source::HostClock => "host-observed, host monotonic clock",
            Source::QemuPlugin => "host-observed, QEMU TCG instrumentation",
        }
    }

    /// True unless the figure is only the guest's word.
    pub fn host_observed(self) -> bool {
        !matches!(self, Source::Guest)
    }

    /// All sources, in the order footers list them.
    pub const ALL: [Source; 5] = [
        Source::Kvm,
        Source::QemuPlugin,
        Source::Vmm,
        Source::HostClock,
        Source::Guest,
    ];
}

/// Description of one reported figure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metric {
    /// Stable snake_case name used in tables, JSON, CSV and `--fail-if`
    /// (e.g. `cycles_per_call`, `cr3_writes_per_call`, `kvm_exits`).
    pub name: String,
    /// Unit of the values (e.g. `cycles`, `ns`, `s`, `count`, `cycles/call`).
    pub unit: String,
    /// Who observed it.
    pub source: Source,
    /// Direction of "better": decides BAmean's "best" samples and the sign of
    /// the mmtests-style % difference.
    pub lower_is_better: bool,
}

impl Metric {
    /// A lower-is-better metric (costs: time, cycles, exits, flushes).
    pub fn new(name: impl Into<String>, unit: impl Into<String>, source: Source) -> Self {
        Metric {
            name: name.into(),
            unit: unit.into(),
            source,
            lower_is_better: true,
        }
    }

    /// The same metric, but higher is better (throughput).
    pub fn higher_is_better(mut self) -> Self {
        self.lower_is_better = false;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_uses_stable_snake_case_names() {
        let m = Metric::new("tlb_flush_per_call", "count/call", Source::HostClock);
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(v["source"], "host_clock");
        for s in Source::ALL {
            assert_eq!(serde_json::to_value(s).unwrap(), s.key());
        }
        assert_eq!(v["lower_is_better"], true);
        let back: Metric = serde_json::from_value(v).unwrap();
        assert_eq!(back, m);
        assert!(!Source::Guest.host_observed() && Source::Kvm.host_observed());
        assert!(
            !Metric::new("ops", "ops/s", Source::Guest)
                .higher_is_better()
                .lower_is_better
        );
    }
}
