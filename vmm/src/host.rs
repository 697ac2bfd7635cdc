//! What this host's KVM can deliver, as far as the VMM's defaults care.

use std::path::Path;

use crate::cmdline::Entry;

/// Which KVM implementation backs /dev/kvm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvmFlavour {
    /// `kvm_pvm`: a software virtualizer (no guest SYSCALL, no 32-bit paging, no PCID).
    Pvm,
    /// Hardware-assisted KVM (kvm_intel / kvm_amd) or anything else.
    Hardware,
}

/// Detects the KVM flavour from the loaded modules.
pub fn kvm_flavour() -> KvmFlavour {
    if Path::new("/sys/module/kvm_pvm").exists() {
        KvmFlavour::Pvm
    } else {
        KvmFlavour::Hardware
    }
}

/// Resolves `--entry auto` to the entry the host can deliver.
///
/// The one place the default is decided: `ptiscope probe` measures what
/// actually works and can replace this heuristic. Under kvm_pvm, user SYSCALL
/// never reaches CPL0 and `int $0x80` raises #UD, but `int3` through a DPL3
/// gate works (see docs/kvm-hosts.md); elsewhere SYSCALL is what Linux uses.
pub fn resolve_entry() -> Entry {
    match kvm_flavour() {
        KvmFlavour::Pvm => Entry::Int3,
        KvmFlavour::Hardware => Entry::Syscall,
    }
}
