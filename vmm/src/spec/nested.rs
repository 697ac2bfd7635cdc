//! What an inner command of `--backend nested` knows about where it runs:
//! a leaf, so that the probe and the reports below `nested` can say "this
//! KVM is kvm_amd inside QEMU TCG" without importing `nested` (which sits
//! above `cli`).

/// Set for the inner commands: their reports say what this KVM is.
pub const INNER_ENV: &str = "PTISCOPE_NESTED_INNER";

/// What the environment of an inner report says this KVM is.
pub const KVM_DESCRIPTION: &str = "kvm_amd with nested paging, inside QEMU TCG: real KVM exits \
     and semantics, emulated time (KVM does not see guest CR3 writes)";

/// Whether this process is an inner command of `--backend nested`.
pub fn inside() -> bool {
    std::env::var_os(INNER_ENV).is_some()
}
