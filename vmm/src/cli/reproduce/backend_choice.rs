//! Where `reproduce` measures its cells (`--backend`): the backends a cell
//! tries in turn, and how each names itself and its times in the table.

use crate::backend::registry::{BackendName, BACKENDS};
use crate::report::time_basis::TimeBasis;

/// Where `reproduce` measures its cells (`--backend`): `auto`, or one
/// registered backend for every cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReproduceBackend {
    /// Per cell: this host's KVM (ptiscope's VMM, for the Linux kernels
    /// too), under QEMU where that KVM refuses the guest before boot (e.g.
    /// 32-bit paging, or Linux, on kvm_pvm): the registered backends that
    /// `reproduce --backend auto` tries, in order.
    #[default]
    Auto,
    /// Every cell on this backend, no fallback: a cell it refuses or
    /// cannot run shows that error in its row. `nested` runs every cell in
    /// one nested boot (docs/kvm-hosts.md).
    On(BackendName),
}

impl ReproduceBackend {
    /// The name `--backend` takes.
    pub fn name(self) -> &'static str {
        match self {
            ReproduceBackend::Auto => "auto",
            ReproduceBackend::On(b) => b.as_str(),
        }
    }

    /// `--backend`'s value parser: `auto` or a registered backend.
    pub fn parser() -> impl clap::builder::TypedValueParser<Value = ReproduceBackend> {
        use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
        let auto = PossibleValue::new("auto").help(
            "per cell, the backends `auto` tries in turn: this host's KVM, then QEMU where \
             that KVM refuses the guest before boot",
        );
        PossibleValuesParser::new(
            std::iter::once(auto).chain(
                BACKENDS
                    .iter()
                    .map(|r| PossibleValue::new(r.name).help(r.about)),
            ),
        )
        .map(|s| BackendName::of(&s).map_or(ReproduceBackend::Auto, ReproduceBackend::On))
    }

    /// The backends a cell is tried on, in order (the next one only where
    /// the host's KVM refused the guest before boot).
    pub(super) fn tries(self) -> Vec<BackendName> {
        match self {
            ReproduceBackend::Auto => BACKENDS
                .iter()
                .filter(|r| r.reproduce_auto)
                .filter_map(|r| BackendName::of(r.name))
                .collect(),
            ReproduceBackend::On(b) => vec![b],
        }
    }
}

/// The backends a reproduction measures on, each built once, at its
/// first cell, and kept for the next ones (a backend may hold a costly
/// state: the nested backend's booted sessions).
#[derive(Default)]
pub(super) struct Backends(
    std::cell::RefCell<Vec<(BackendName, std::rc::Rc<dyn crate::backend::Backend>)>>,
);

impl Backends {
    /// The backend `b`, built at its first use.
    pub(super) fn get(
        &self,
        b: BackendName,
    ) -> Result<std::rc::Rc<dyn crate::backend::Backend>, crate::backend::BackendError> {
        if let Some((_, built)) = self.0.borrow().iter().find(|(n, _)| *n == b) {
            return Ok(built.clone());
        }
        let built: std::rc::Rc<dyn crate::backend::Backend> =
            crate::cli::BackendOpts::on(b.as_str()).backend()?.into();
        self.0.borrow_mut().push((b, built.clone()));
        Ok(built)
    }
}

/// What a time measured on `b` is: the backend's profile's word (kvm_pvm's
/// emulated kernel, the hardware's under kvm_intel/kvm_amd, QEMU TCG's, a
/// KVM inside QEMU TCG's under `nested`), as `compare` and `run` record
/// it; `b` as `backends` built it for the cells.
pub(super) fn backend_basis(b: BackendName, backends: &Backends) -> TimeBasis {
    backends
        .get(b)
        .map_or(TimeBasis::Unknown, |b| b.profile().time_basis)
}

/// A backend's name in the table, as [`measure_on`] gives it on success.
pub(super) fn backend_name(b: BackendName) -> &'static str {
    // No run reaches a backend as `nested` out here (its inner command
    // runs as `kvm`): the cell names what was asked.
    crate::spec::nested::reported_backend(crate::cli::host_facts().nested(), b.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(name: &str) -> BackendName {
        BackendName::of(name).unwrap()
    }

    /// Every backend a block can run on states its times' basis (the
    /// backend's own): none is "unknown" because the table built an
    /// environment without it, as every block's header once did.
    #[test]
    fn each_backend_names_its_time_basis() {
        assert_eq!(
            backend_basis(on("qemu"), &Backends::default()),
            TimeBasis::QemuTcg
        );
        assert_eq!(
            backend_basis(on("nested"), &Backends::default()),
            TimeBasis::NestedTcg
        );
        assert_eq!(
            backend_basis(on("kvm"), &Backends::default()),
            crate::cli::kvm_identity().time_basis
        );
        // On a host whose KVM module is known (this one: kvm_pvm), KVM's is too.
        if crate::report::environment::kvm(&crate::cli::host_facts())
            .module
            .is_some_and(|m| m.starts_with("kvm_"))
        {
            assert_ne!(
                backend_basis(on("kvm"), &Backends::default()),
                TimeBasis::Unknown
            );
        }
    }
}
