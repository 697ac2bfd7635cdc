//! MSR helpers shared by the VMM and the probe: reading one MSR of a vCPU,
//! and making the guest's accesses to an MSR exit to user space
//! (KVM_CAP_X86_USER_SPACE_MSR + KVM_X86_SET_MSR_FILTER), so the VMM can
//! answer them where KVM refuses KVM_SET_MSRS (kvm_pvm and IA32_ARCH_CAPABILITIES).

use kvm_bindings::{kvm_enable_cap, kvm_msr_entry, Msrs};
use kvm_ioctls::{MsrFilterDefaultAction, MsrFilterRange, MsrFilterRangeFlags, VcpuFd, VmFd};

/// IA32_TIME_STAMP_COUNTER.
pub const MSR_IA32_TSC: u32 = 0x10;
/// IA32_ARCH_CAPABILITIES.
pub const MSR_IA32_ARCH_CAPABILITIES: u32 = 0x10a;
/// ARCH_CAPABILITIES bit 0: the CPU is not vulnerable to Meltdown (rogue data cache load).
pub const ARCH_CAP_RDCL_NO: u64 = 1 << 0;

/// Errors of routing an MSR to user space.
#[derive(Debug, thiserror::Error)]
pub enum MsrTrapError {
    /// KVM lacks the capabilities to route MSR accesses to user space.
    #[error("this KVM has no KVM_CAP_X86_USER_SPACE_MSR / KVM_CAP_X86_MSR_FILTER")]
    Unsupported,
    /// Enabling user-space MSR exits failed.
    #[error("KVM_ENABLE_CAP(KVM_CAP_X86_USER_SPACE_MSR): {0}")]
    EnableCap(#[source] kvm_ioctls::Error),
    /// Installing the MSR filter failed.
    #[error("KVM_X86_SET_MSR_FILTER: {0}")]
    SetFilter(#[source] kvm_ioctls::Error),
}

impl MsrTrapError {
    /// The underlying ioctl error and the ioctl's name, for callers with their own error types.
    pub fn ioctl(&self) -> Option<(&'static str, kvm_ioctls::Error)> {
        match self {
            MsrTrapError::Unsupported => None,
            MsrTrapError::EnableCap(e) => Some(("KVM_ENABLE_CAP(KVM_CAP_X86_USER_SPACE_MSR)", *e)),
            MsrTrapError::SetFilter(e) => Some(("KVM_X86_SET_MSR_FILTER", *e)),
        }
    }
}

/// Whether this VM can route MSR accesses to user space.
pub fn user_space_msr_supported(vm: &VmFd) -> bool {
    let cap = |c: u32| vm.check_extension_raw(libc::c_ulong::from(c)) > 0;
    cap(kvm_bindings::KVM_CAP_X86_USER_SPACE_MSR) && cap(kvm_bindings::KVM_CAP_X86_MSR_FILTER)
}

/// Makes the guest's accesses (`flags`: READ and/or WRITE) to MSR `index`
/// exit to user space as KVM_EXIT_X86_RDMSR / KVM_EXIT_X86_WRMSR. Every
/// other MSR stays with KVM. Must be called before the first KVM_RUN.
pub fn trap_msr(vm: &VmFd, index: u32, flags: MsrFilterRangeFlags) -> Result<(), MsrTrapError> {
    if !user_space_msr_supported(vm) {
        return Err(MsrTrapError::Unsupported);
    }
    let cap = kvm_enable_cap {
        cap: kvm_bindings::KVM_CAP_X86_USER_SPACE_MSR,
        args: [u64::from(kvm_bindings::KVM_MSR_EXIT_REASON_FILTER), 0, 0, 0],
        ..Default::default()
    };
    vm.enable_cap(&cap).map_err(MsrTrapError::EnableCap)?;
    // A 0 bit denies the access in KVM, which then exits to user space.
    let bitmap = [0u8; 1];
    let range = MsrFilterRange {
        flags,
        base: index,
        msr_count: 1,
        bitmap: &bitmap,
    };
    vm.set_msr_filter(MsrFilterDefaultAction::ALLOW, &[range])
        .map_err(MsrTrapError::SetFilter)
}

/// KVM_GET_MSRS of one MSR; `None` if KVM does not know it.
pub fn get_msr(vcpu: &VcpuFd, index: u32) -> Option<u64> {
    let mut m = Msrs::from_entries(&[kvm_msr_entry {
        index,
        ..Default::default()
    }])
    .ok()?;
    match vcpu.get_msrs(&mut m) {
        Ok(1) => m.as_slice().first().map(|e| e.data),
        _ => None,
    }
}

/// MSRs whose guest accesses the VMM answers itself (through [`trap_msr`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MsrAnswers {
    /// The IA32_ARCH_CAPABILITIES value the guest's RDMSR returns.
    pub arch_capabilities: Option<u64>,
}

impl MsrAnswers {
    /// The value of a trapped RDMSR; `None` means the guest gets #GP, as for
    /// an MSR that does not exist.
    pub fn read(&self, index: u32) -> Option<u64> {
        match index {
            MSR_IA32_ARCH_CAPABILITIES => self.arch_capabilities,
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_only_what_was_chosen() {
        let a = MsrAnswers {
            arch_capabilities: Some(ARCH_CAP_RDCL_NO),
        };
        assert_eq!(a.read(MSR_IA32_ARCH_CAPABILITIES), Some(1));
        assert_eq!(a.read(MSR_IA32_TSC), None);
        assert_eq!(MsrAnswers::default().read(MSR_IA32_ARCH_CAPABILITIES), None);
    }
}
