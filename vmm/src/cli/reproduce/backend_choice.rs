//! Where `reproduce` measures its cells (`--backend`): the backends a cell
//! tries in turn, and how each names itself and its times in the table.

use crate::cli::Backend;
use crate::report::time_basis::TimeBasis;

/// Where `reproduce` measures its cells (`--backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ReproduceBackend {
    /// Per cell: this host's KVM (ptiscope's VMM, for the Linux kernels
    /// too), under QEMU where that KVM refuses the guest before boot (e.g.
    /// 32-bit paging, or Linux, on kvm_pvm).
    #[default]
    Auto,
    /// Every cell on this host's KVM, no fallback: a cell it refuses or
    /// cannot run shows that error in its row.
    Kvm,
    /// Every cell under QEMU TCG.
    Qemu,
    /// Every cell on ptiscope's VMM on a real kvm_amd (nested paging)
    /// inside QEMU TCG, all in one nested boot (docs/kvm-hosts.md).
    Nested,
}

impl ReproduceBackend {
    /// The name `--backend` takes.
    pub fn name(self) -> &'static str {
        match self {
            ReproduceBackend::Auto => "auto",
            ReproduceBackend::Kvm => "kvm",
            ReproduceBackend::Qemu => "qemu",
            ReproduceBackend::Nested => "nested",
        }
    }

    /// The backends a cell is tried on, in order (the next one only where
    /// the host's KVM refused the guest before boot).
    pub(super) fn tries(self) -> &'static [Backend] {
        match self {
            ReproduceBackend::Auto => Backend::preference(),
            ReproduceBackend::Kvm => &[Backend::Kvm],
            ReproduceBackend::Qemu => &[Backend::Qemu],
            // Runs as `--backend kvm` inside the nested boot
            // (`nested::cli::intercept`); nothing is measured out here.
            ReproduceBackend::Nested => &[],
        }
    }
}

/// What a time measured on `b` is: the backend's profile's word (kvm_pvm's
/// emulated kernel, the hardware's under kvm_intel/kvm_amd, QEMU TCG's),
/// as `compare` and `run` record it; `--backend nested` runs its inner
/// command on a KVM inside QEMU TCG.
pub(super) fn backend_basis(b: Backend) -> TimeBasis {
    match b {
        Backend::Nested => TimeBasis::NestedTcg,
        b => b.with_plugin(true).profile().time_basis,
    }
}

/// A backend's name in the table, as [`measure_on`] gives it on success.
pub(super) fn backend_name(b: Backend) -> &'static str {
    match b {
        // No run reaches a backend as `nested` out here (its inner command
        // runs as `kvm`): the cell names what was asked.
        Backend::Nested => "nested",
        b => crate::spec::nested::reported_backend(
            crate::cli::host_facts().nested(),
            b.with_plugin(true).name(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every backend a block can run on states its times' basis (the
    /// backend's own): none is "unknown" because the table built an
    /// environment without it, as every block's header once did.
    #[test]
    fn each_backend_names_its_time_basis() {
        assert_eq!(backend_basis(Backend::Qemu), TimeBasis::QemuTcg);
        assert_eq!(backend_basis(Backend::Nested), TimeBasis::NestedTcg);
        assert_eq!(backend_basis(Backend::Kvm), crate::cli::kvm_identity().1);
        // On a host whose KVM module is known (this one: kvm_pvm), KVM's is too.
        if crate::report::environment::kvm(&crate::cli::host_facts())
            .module
            .is_some_and(|m| m.starts_with("kvm_"))
        {
            assert_ne!(backend_basis(Backend::Kvm), TimeBasis::Unknown);
        }
    }
}
