//! KVM API version, the capabilities ptiscope uses, the loaded kvm module
//! (information only) and the binary stats fd.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;

use kvm_bindings::kvm_stats_header;
use serde::Serialize;

use super::vm::{Kit, ProbeVm, VmError};

/// One capability as KVM_CHECK_EXTENSION answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cap {
    /// `KVM_CAP_*` name.
    pub name: &'static str,
    /// Capability number passed to KVM_CHECK_EXTENSION.
    pub number: u32,
    /// 0 = absent; some capabilities return a count or bitmask.
    pub value: i32,
}

/// Host-level facts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostInfo {
    /// KVM_GET_API_VERSION (12 for every KVM in use today).
    pub api_version: i32,
    /// KVM_CAP_MAX_VCPUS.
    pub max_vcpus: usize,
    /// KVM_CAP_NR_VCPUS (recommended maximum).
    pub recommended_vcpus: usize,
    /// The capabilities queried, in probe order.
    pub caps: Vec<Cap>,
    /// Which of kvm_intel / kvm_amd / kvm_pvm are loaded (from /sys/module).
    /// Information only: no verdict is derived from it.
    pub kvm_modules: Vec<String>,
}

impl HostInfo {
    /// The value of the capability called `name`, if it was queried.
    pub fn cap(&self, name: &str) -> Option<i32> {
        self.caps.iter().find(|c| c.name == name).map(|c| c.value)
    }
}

/// The capabilities ptiscope relies on or reports.
const CAPS: [(&str, u32); 8] = [
    ("KVM_CAP_IRQCHIP", kvm_bindings::KVM_CAP_IRQCHIP),
    ("KVM_CAP_USER_MEMORY", kvm_bindings::KVM_CAP_USER_MEMORY),
    (
        "KVM_CAP_IMMEDIATE_EXIT",
        kvm_bindings::KVM_CAP_IMMEDIATE_EXIT,
    ),
    (
        "KVM_CAP_X86_USER_SPACE_MSR",
        kvm_bindings::KVM_CAP_X86_USER_SPACE_MSR,
    ),
    (
        "KVM_CAP_X86_MSR_FILTER",
        kvm_bindings::KVM_CAP_X86_MSR_FILTER,
    ),
    (
        "KVM_CAP_BINARY_STATS_FD",
        kvm_bindings::KVM_CAP_BINARY_STATS_FD,
    ),
    ("KVM_CAP_EXT_CPUID", kvm_bindings::KVM_CAP_EXT_CPUID),
    (
        "KVM_CAP_TSC_DEADLINE_TIMER",
        kvm_bindings::KVM_CAP_TSC_DEADLINE_TIMER,
    ),
];

pub fn host_info(kit: &Kit) -> HostInfo {
    let caps = CAPS
        .iter()
        .map(|&(name, number)| Cap {
            name,
            number,
            value: kit.kvm.check_extension_raw(libc::c_ulong::from(number)),
        })
        .collect();
    let kvm_modules = ["kvm_intel", "kvm_amd", "kvm_pvm"]
        .into_iter()
        .filter(|m| std::path::Path::new("/sys/module").join(m).exists())
        .map(str::to_string)
        .collect();
    HostInfo {
        api_version: kit.kvm.get_api_version(),
        max_vcpus: kit.kvm.get_max_vcpus(),
        recommended_vcpus: kit.kvm.get_nr_vcpus(),
        caps,
        kvm_modules,
    }
}

/// Whether the stats fd works on the VM and on a vCPU, with descriptor counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatsFdProbe {
    /// Descriptors of the VM's stats fd, or `None` if it failed.
    pub vm_descriptors: Option<u32>,
    /// Descriptors of a vCPU's stats fd, or `None` if it failed.
    pub vcpu_descriptors: Option<u32>,
    /// The counts, or the error.
    pub detail: String,
}

impl StatsFdProbe {
    /// Both stats fds open and describe at least one statistic.
    pub fn works(&self) -> bool {
        self.vm_descriptors.is_some_and(|n| n > 0) && self.vcpu_descriptors.is_some_and(|n| n > 0)
    }
}

/// KVM_GET_STATS_FD on `fd` and the descriptor count of its header.
fn stats_descriptors(fd: &impl AsRawFd) -> Result<u32, String> {
    // SAFETY: KVM_GET_STATS_FD takes no argument and returns a new fd or -1;
    // `fd` is a live VM or vCPU fd.
    let r = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            crate::machine::kvm::request::KVM_GET_STATS_FD(),
        )
    };
    if r < 0 {
        return Err(format!(
            "KVM_GET_STATS_FD: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: `r` is a fresh fd that nothing else owns.
    let stats = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(r) });
    let mut buf = [0u8; std::mem::size_of::<kvm_stats_header>()];
    stats
        .read_exact_at(&mut buf, 0)
        .map_err(|e| format!("reading the stats header: {e}"))?;
    // num_desc is the third u32 of the header.
    Ok(u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]))
}

pub fn probe_stats_fd(kit: &Kit) -> Result<StatsFdProbe, VmError> {
    let vm = ProbeVm::new(kit)?;
    let v = stats_descriptors(&vm.vm);
    let c = stats_descriptors(&vm.vcpu);
    let detail = match (&v, &c) {
        (Ok(a), Ok(b)) => format!("VM: {a} descriptors, vCPU: {b} descriptors"),
        (Err(e), _) | (_, Err(e)) => e.clone(),
    };
    Ok(StatsFdProbe {
        vm_descriptors: v.ok(),
        vcpu_descriptors: c.ok(),
        detail,
    })
}
