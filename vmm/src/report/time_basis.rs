//! What a time figure is on the backend that measured it. A nanosecond
//! per call is the hardware's only under hardware-assisted KVM; under
//! kvm_pvm the guest's kernel code is emulated (31-44 µs per getpid on an
//! AMD EPYC host, against a few hundred ns on hardware), and under QEMU TCG
//! every CR3 write flushes QEMU's software TLB, so a PTI switch costs what
//! refilling that TLB costs in an emulator (+1095 % per getppid on Linux).
//! Such times are real but not PTI's cost on hardware: every report that
//! prints one says which it is, and puts the counts first.

use serde::{Deserialize, Serialize};

/// The basis of the times of one report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeBasis {
    /// Hardware-assisted KVM (kvm_intel, kvm_amd): guest code runs on the CPU.
    Hardware,
    /// kvm_pvm: guest user code runs on the CPU, guest kernel code is emulated.
    KvmPvm,
    /// QEMU TCG: all guest code is translated; a CR3 write flushes the
    /// emulator's soft TLB.
    QemuTcg,
    /// `--backend nested`: a real KVM (kvm_amd, nested paging) inside QEMU
    /// TCG: KVM's exits and semantics are real, its clock is TCG's.
    NestedTcg,
    /// Not recorded (a document without an environment or written before
    /// the basis was recorded, or a KVM module ptiscope could not name).
    #[default]
    Unknown,
}

impl TimeBasis {
    /// The basis of a VMM run's times on the KVM module `module`
    /// (`kvm_intel`, `kvm_amd`, `kvm_pvm`; `None`: none could be named).
    pub fn of_kvm_module(module: Option<&str>) -> Self {
        match module {
            Some("kvm_pvm") => TimeBasis::KvmPvm,
            Some("kvm_intel" | "kvm_amd") => TimeBasis::Hardware,
            _ => TimeBasis::Unknown,
        }
    }

    /// Machine key, as in the JSON: `hardware`, `kvm_pvm`, `qemu_tcg`,
    /// `nested_tcg`, `unknown`.
    pub fn key(self) -> &'static str {
        match self {
            TimeBasis::Hardware => "hardware",
            TimeBasis::KvmPvm => "kvm_pvm",
            TimeBasis::QemuTcg => "qemu_tcg",
            TimeBasis::NestedTcg => "nested_tcg",
            TimeBasis::Unknown => "unknown",
        }
    }

    /// What a time figure is here, in a few words.
    pub fn label(self) -> &'static str {
        match self {
            TimeBasis::Hardware => "hardware (KVM, guest code on the CPU)",
            TimeBasis::KvmPvm => "kvm_pvm: guest kernel code emulated",
            TimeBasis::QemuTcg => "QEMU TCG: every CR3 write flushes the soft TLB",
            TimeBasis::NestedTcg => "nested KVM inside QEMU TCG: emulated time",
            TimeBasis::Unknown => "unknown (backend or KVM module not recorded)",
        }
    }

    /// The shortest tag, beside a time's name in tables and pictures.
    pub fn tag(self) -> &'static str {
        match self {
            TimeBasis::Hardware => "hardware",
            TimeBasis::KvmPvm => "kvm_pvm emulated",
            TimeBasis::QemuTcg => "TCG",
            TimeBasis::NestedTcg => "nested TCG",
            TimeBasis::Unknown => "basis unknown",
        }
    }

    /// Whether a time measured here is what the hardware takes.
    pub fn is_hardware(self) -> bool {
        self == TimeBasis::Hardware
    }
}

/// Whether a figure in `unit` (`ns/call`, `cycles`, ...) is a time.
pub fn is_time(unit: &str) -> bool {
    matches!(
        unit.split('/').next().unwrap_or(""),
        "ns" | "us" | "µs" | "ms" | "s" | "cycles"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kvm_module_names_a_vmm_runs_basis() {
        let of = TimeBasis::of_kvm_module;
        assert_eq!(of(Some("kvm_intel")), TimeBasis::Hardware);
        assert_eq!(of(Some("kvm_amd")), TimeBasis::Hardware);
        assert_eq!(of(Some("kvm_pvm")), TimeBasis::KvmPvm);
        assert_eq!(of(None), TimeBasis::Unknown);
        assert!(!TimeBasis::NestedTcg.is_hardware());
        assert!(TimeBasis::Hardware.is_hardware() && !TimeBasis::KvmPvm.is_hardware());
        assert_eq!(
            TimeBasis::KvmPvm.label(),
            "kvm_pvm: guest kernel code emulated"
        );
        assert_eq!(
            TimeBasis::QemuTcg.label(),
            "QEMU TCG: every CR3 write flushes the soft TLB"
        );
        assert_eq!(
            serde_json::to_value(TimeBasis::QemuTcg).unwrap(),
            TimeBasis::QemuTcg.key()
        );
    }

    #[test]
    fn times_are_told_from_counts_by_unit() {
        for u in ["ns/call", "ns", "cycles/call", "cycles/message", "s"] {
            assert!(is_time(u), "{u}");
        }
        for u in ["count/call", "count", "KiB", "ops/s"] {
            assert!(!is_time(u), "{u}");
        }
    }
}
