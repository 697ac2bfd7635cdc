//! What a time figure is on the backend that measured it. A nanosecond
//! per call is the hardware's only under hardware-assisted KVM; under
//! kvm_pvm the guest's kernel code is emulated (31-44 µs per getpid on an
//! AMD EPYC host, against a few hundred ns on hardware), and under QEMU TCG
//! every CR3 write flushes QEMU's software TLB, so a PTI switch costs what
//! refilling that TLB costs in an emulator (+1095 % per getppid on Linux).
//! Such times are real but not PTI's cost on hardware: every report that
//! prints one says which it is, and puts the counts first.

use serde::{Deserialize, Serialize};

use super::environment::Environment;

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
    /// The basis of a report's times: what the backend that measured it
    /// recorded in its environment (`Environment::time_basis`, from the
    /// backend's `Profile`), so no report needs to know the backends.
    pub fn of(env: Option<&Environment>) -> Self {
        env.map_or(TimeBasis::Unknown, |e| e.time_basis)
    }

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

/// The guest kernel a report's runs booted, for titles: the Linux release
/// when recorded, else the companion guest's image and hash.
pub fn guest_kernel(env: Option<&Environment>) -> String {
    let Some(e) = env else {
        return "guest not recorded".to_owned();
    };
    if let Some(k) = &e.guest_kernel {
        return k.clone();
    }
    let image = &e.guest_image;
    let hash = image
        .sha256
        .as_deref()
        .map_or("?", |s| &s[..s.len().min(12)]);
    if image.name.starts_with("embedded ") {
        format!("ptiscope guest ({}, sha256 {hash})", image.name)
    } else {
        // A --kernel or --linux path: the file's name says what it is.
        format!("{} (sha256 {hash})", image.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorded_basis_is_the_reports_and_the_kvm_module_names_a_vmm_runs() {
        let recorded = Environment {
            time_basis: TimeBasis::NestedTcg,
            ..Environment::default()
        };
        assert_eq!(TimeBasis::of(Some(&recorded)), TimeBasis::NestedTcg);
        // A document written before the basis was recorded says nothing.
        let old: Environment = serde_json::from_value(serde_json::json!({
            "host": {}, "kvm": {}, "backend": "kvm", "probe": {}, "ptiscope": {},
            "guest_image": {}, "options": {}
        }))
        .unwrap_or_default();
        assert_eq!(TimeBasis::of(Some(&old)), TimeBasis::Unknown);
        assert_eq!(TimeBasis::of(None), TimeBasis::Unknown);
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

    #[test]
    fn the_guest_kernel_is_the_linux_release_or_the_image_hash() {
        let mut e = Environment::default();
        e.guest_image.name = "embedded x86_64".into();
        e.guest_image.sha256 = Some("0123456789abcdef0123".into());
        assert_eq!(
            guest_kernel(Some(&e)),
            "ptiscope guest (embedded x86_64, sha256 0123456789ab)"
        );
        e.guest_kernel = Some("Linux 6.1.0-57-cloud-amd64 (amd64)".into());
        assert_eq!(guest_kernel(Some(&e)), "Linux 6.1.0-57-cloud-amd64 (amd64)");
        assert_eq!(guest_kernel(None), "guest not recorded");
        e.guest_kernel = None;
        e.guest_image.name = "/k/vmlinuz-6.1.0-57-cloud-amd64".into();
        assert_eq!(
            guest_kernel(Some(&e)),
            "/k/vmlinuz-6.1.0-57-cloud-amd64 (sha256 0123456789ab)"
        );
    }
}
