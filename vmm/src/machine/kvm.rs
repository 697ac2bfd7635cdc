//! Opening /dev/kvm, with messages that say what to do. A leaf module:
//! the probe and the VM builder both open KVM through it.

use kvm_ioctls::Kvm;

/// Errors opening KVM.
#[derive(Debug, thiserror::Error)]
pub enum KvmOpenError {
    /// The device node does not exist.
    #[error(
        "{path} does not exist: KVM is not available on this host \
         (enable virtualization in the firmware and load kvm_intel or kvm_amd, \
         or run on a KVM-enabled machine)"
    )]
    Missing {
        /// The device path tried.
        path: String,
    },
    /// The user may not open the device node.
    #[error(
        "permission denied opening {path}: add your user to the kvm group \
         (`sudo usermod -aG kvm $USER`, then log in again) and check `ls -l {path}`"
    )]
    Permission {
        /// The device path tried.
        path: String,
    },
    /// Opening the device failed for another reason.
    #[error("cannot open {path}: {source}")]
    Open {
        /// The device path tried.
        path: String,
        /// The error of the open.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// The device opened but does not answer KVM_GET_API_VERSION as KVM does.
    #[error("{path} is not a usable KVM device (KVM_GET_API_VERSION: {detail})")]
    NotKvm {
        /// The device path tried.
        path: String,
        /// What the ioctl returned.
        detail: String,
    },
}

/// Which KVM implementation backs /dev/kvm. Read from the loaded modules
/// by the host facts (`probe::host::HostFacts`) once, and handed to a run by
/// its caller: the VM builder hides CMPXCHG16B from a Linux guest on
/// kvm_pvm, the report reads kvm_pvm's emulated instructions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvmFlavour {
    /// `kvm_pvm`: a software virtualizer (no guest SYSCALL, no 32-bit paging, no PCID).
    Pvm,
    /// Hardware-assisted KVM (kvm_intel / kvm_amd) or anything else.
    #[default]
    Hardware,
}

impl KvmFlavour {
    /// The flavour of the loaded KVM modules (`/sys/module/kvm_pvm`).
    pub fn detect() -> KvmFlavour {
        if std::path::Path::new("/sys/module/kvm_pvm").exists() {
            KvmFlavour::Pvm
        } else {
            KvmFlavour::Hardware
        }
    }
}

/// The KVM device path (`PTISCOPE_KVM_DEVICE` overrides it, for tests of the
/// error paths and for hosts with an unusual device node).
pub fn kvm_device_path() -> String {
    std::env::var("PTISCOPE_KVM_DEVICE").unwrap_or_else(|_| "/dev/kvm".into())
}

/// Opens KVM with messages that say what to do.
pub fn open_kvm() -> Result<Kvm, KvmOpenError> {
    let path = kvm_device_path();
    let cpath = std::ffi::CString::new(path.clone())
        .map_err(|_| KvmOpenError::Missing { path: path.clone() })?;
    let kvm = Kvm::new_with_path(&cpath).map_err(|source| match source.errno() {
        libc::ENOENT | libc::ENODEV | libc::ENXIO => KvmOpenError::Missing { path: path.clone() },
        libc::EACCES | libc::EPERM => KvmOpenError::Permission { path: path.clone() },
        _ => KvmOpenError::Open {
            path: path.clone(),
            source,
        },
    })?;
    // SAFETY-free check that this really is KVM: the ioctl fails on other files.
    let version = kvm.get_api_version();
    if version != kvm_bindings::KVM_API_VERSION as i32 {
        let detail = if version < 0 {
            "the ioctl failed".to_string()
        } else {
            format!(
                "version {version}, expected {}",
                kvm_bindings::KVM_API_VERSION
            )
        };
        return Err(KvmOpenError::NotKvm { path, detail });
    }
    Ok(kvm)
}

/// KVM request numbers the VMM uses by number (kvm-ioctls does not export
/// them): `KVM_GET_STATS_FD`, which kvm-ioctls does not wrap at all, and the
/// requests the seccomp filter of the vCPU thread allows.
pub(crate) mod request {
    use kvm_bindings::{kvm_msrs, kvm_regs, kvm_sregs, KVMIO};
    use vmm_sys_util::{ioctl_io_nr, ioctl_ior_nr, ioctl_iowr_nr};

    ioctl_io_nr!(KVM_RUN, KVMIO, 0x80);
    ioctl_ior_nr!(KVM_GET_REGS, KVMIO, 0x81, kvm_regs);
    ioctl_ior_nr!(KVM_GET_SREGS, KVMIO, 0x83, kvm_sregs);
    ioctl_iowr_nr!(KVM_GET_MSRS, KVMIO, 0x88, kvm_msrs);
    ioctl_io_nr!(KVM_CHECK_EXTENSION, KVMIO, 0x03);
    ioctl_io_nr!(KVM_GET_STATS_FD, KVMIO, 0xce);
}
