//! What an inner command of `--backend nested` knows about where it runs:
//! a leaf, so that the probe and the reports below `nested` can say "this
//! KVM is kvm_amd inside QEMU TCG" without importing `nested` (which sits
//! above `cli`).

use serde::{Deserialize, Serialize};

/// Set for the inner commands: their reports say what this KVM is.
pub const INNER_ENV: &str = "PTISCOPE_NESTED_INNER";

/// The environment variable naming the outer QEMU's plugin's live file
/// (the ivshmem device's `resource2` in sysfs), which the nested init sets
/// for the jobs it runs (`nested-batch`): read once, into the host facts.
pub const OUTER_PLUGIN_ENV: &str = "PTISCOPE_NESTED_PLUGIN";

/// What the environment of an inner report says this KVM is (nested paging).
pub const KVM_DESCRIPTION: &str = "kvm_amd with nested paging, inside QEMU TCG: real KVM exits \
     and semantics, emulated time (KVM does not see guest CR3 writes)";

/// The same, with shadow paging (`--nested-paging shadow`).
pub const KVM_SHADOW_DESCRIPTION: &str = "kvm_amd with shadow paging, inside QEMU TCG: real KVM \
     exits and semantics, emulated time (KVM intercepts guest CR3 writes: its tlb_flush counts them)";

/// Whether this process is an inner command of `--backend nested`: read
/// once, at the top of the process (into the host facts, `timeout`'s
/// defaults); everything below is handed what it needs.
pub fn inside() -> bool {
    std::env::var_os(INNER_ENV).is_some()
}

/// The name reports give the backend `name` (a `Backend::name`): on
/// `--backend nested`'s inner KVM (`nested`, from the host facts) the
/// VMM's KVM is the nested kvm_amd, so `kvm` reads `nested` there; every
/// other name is itself.
pub fn reported_backend(nested: bool, name: &'static str) -> &'static str {
    if nested && name == "kvm" {
        "nested"
    } else {
        name
    }
}

/// How the inner kvm_amd maps guest memory (its `npt` parameter), for the
/// whole nested boot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum KvmPaging {
    /// Nested paging (`npt=1`), as modern hosts run KVM: the guest's CR3
    /// writes do not exit, so KVM cannot count them.
    #[default]
    Npt,
    /// Shadow paging (`npt=0`): KVM intercepts every guest CR3 write and
    /// flushes for it, so its `tlb_flush` statistic counts them, the one
    /// host-side CR3 count of a Linux guest on the VMM. Each costs an exit.
    Shadow,
}

impl KvmPaging {
    /// kvm_amd's module parameter for it.
    pub fn module_parameter(self) -> &'static str {
        match self {
            KvmPaging::Npt => "npt=1",
            KvmPaging::Shadow => "npt=0",
        }
    }

    /// A few words for the progress line and the set-up steps.
    pub fn describe(self) -> &'static str {
        match self {
            KvmPaging::Npt => "nested paging",
            KvmPaging::Shadow => "shadow paging",
        }
    }

    /// What the environment block says this KVM is, given whether it runs
    /// nested paging (`/sys/module/kvm_amd/parameters/npt`).
    pub fn kvm_description(npt: Option<bool>) -> &'static str {
        match npt {
            Some(false) => KVM_SHADOW_DESCRIPTION,
            _ => KVM_DESCRIPTION,
        }
    }
}
