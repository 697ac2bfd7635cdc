//! Why this host's KVM (through the VMM) cannot run a Linux workload, from
//! the probe's findings and the image, before anything boots.

use ptiscope_abi::options::Entry;

use super::image::{self};
use crate::machine::kvm::KvmFlavour;
use crate::probe::host::HostFacts;
use crate::spec::linux::LinuxArch;

/// Why this host's KVM (through the VMM) cannot run this Linux workload,
/// from the probe's findings and the image; `None`: it can.
pub(super) fn kvm_refusal(
    facts: &HostFacts,
    image: &image::KernelImage,
    cpus: u32,
) -> Option<String> {
    // The PAE probe runs only for an i386 kernel (its first use costs a
    // tiny VM): the 64-bit kernel never pages outside long mode.
    let pae = match image.arch {
        LinuxArch::I386 => facts.pae_paging_usable(),
        LinuxArch::X86_64 => None,
    };
    let why = kvm_refusal_reasons(
        facts.check_entry(false, Entry::Syscall),
        facts.kvm_flavour(),
        pae,
        image.arch,
        cpus,
        facts.nested(),
    );
    (!why.is_empty()).then(|| {
        format!(
            "--linux with --backend kvm: the VMM cannot run this Linux workload here ({}); \
             use --backend qemu",
            why.join("; ")
        )
    })
}

/// The reasons behind [`kvm_refusal`]: what the probe found (`syscall`:
/// whether user SYSCALL reaches the kernel; the KVM flavour; `pae`: whether
/// the vCPU can turn on 32-bit PAE paging, asked for i386 kernels only,
/// `None` if unknown), what the VMM boots (bzImages, with the initramfs as
/// their initrd) and what it describes to the guest (its ACPI MADT lists
/// up to [`crate::machine::acpi::MAX_CPUS`] CPUs).
pub(super) fn kvm_refusal_reasons(
    syscall: Result<(), String>,
    flavour: KvmFlavour,
    pae: Option<(bool, String)>,
    arch: LinuxArch,
    cpus: u32,
    nested: bool,
) -> Vec<String> {
    let mut why = Vec::new();
    // An i386 kernel's userspace enters by int $0x80 or SYSENTER in
    // legacy mode, which the long-mode probe does not judge.
    if let (Err(e), LinuxArch::X86_64) = (syscall, arch) {
        why.push(format!(
            "Linux x86_64 userspace enters the kernel by SYSCALL: {e}"
        ));
    }
    if flavour == KvmFlavour::Pvm {
        why.push(
            "kvm_pvm emulates guest CPL0 code and lacks instructions Linux runs there \
             (CMPXCHG16B, XRSTOR: Debian's kernel stops in early boot)"
                .to_string(),
        );
    }
    // The VMM enters an i386 bzImage by the 32-bit boot protocol (paging
    // off); the kernel then turns on PAE paging, which some KVMs (kvm_pvm:
    // long-mode paging only) refuse with a #GP. (A PVH vmlinux gets its
    // initramfs as PVH's first module, and the ACPI tables' RSDP.)
    if arch == LinuxArch::I386 {
        if let Some((false, detail)) = pae {
            why.push(format!(
                "an i386 kernel turns on 32-bit PAE paging outside long mode, which this \
                 host's KVM refuses (probe: {detail})"
            ));
        }
    }
    // Under --backend nested an i386 kernel's second CPU triple-faults at
    // its CR0.PG write: KVM loads the PDPTEs of the page tables the boot
    // CPU has walked, where QEMU's nested walker set bit 5 (reserved in a
    // PDPTE). The companion guest clears the bit before each SIPI; Linux
    // does not (docs/kvm-hosts.md).
    if arch == LinuxArch::I386 && nested && cpus > 1 {
        why.push(format!(
            "--cpus {cpus} with an i386 kernel under --backend nested: the second CPU \
             triple-faults at its CR0.PG write (QEMU's nested page walker sets bit 5 of the \
             PDPTEs the boot CPU walked, which KVM's PDPTE load refuses); use --cpus 1, or \
             the x86_64 kernel"
        ));
    }
    // The VMM describes the vCPUs to Linux in an ACPI MADT of xAPIC
    // entries (machine::acpi); --cpus is capped lower for every guest
    // (MAX_CPUS, the telemetry's per-CPU slots), so this holds unless that
    // cap grows past what the MADT can list.
    if cpus > crate::machine::acpi::MAX_CPUS {
        why.push(format!(
            "--cpus {cpus}: the VMM's ACPI MADT lists at most {} CPUs (8-bit xAPIC ids)",
            crate::machine::acpi::MAX_CPUS
        ));
    }
    why
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vmm_refuses_linux_only_for_the_reasons_of_the_host_and_the_image() {
        use KvmFlavour::{Hardware, Pvm};
        // kvm_pvm: no user SYSCALL, CPL0 instructions missing.
        let w = kvm_refusal_reasons(Err("broken".into()), Pvm, None, LinuxArch::X86_64, 1, false);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].contains("SYSCALL: broken") && w[1].contains("CMPXCHG16B"),
            "{w:?}"
        );
        // Hardware KVM with a 64-bit bzImage on one CPU: nothing refused.
        let w = kvm_refusal_reasons(Ok(()), Hardware, None, LinuxArch::X86_64, 1, false);
        assert!(w.is_empty(), "{w:?}");
        // What the VMM cannot boot or describe.
        // An i386 kernel: refused where the probe found PAE paging refused
        // (kvm_pvm), booted by the 32-bit protocol where it works.
        let refused = Some((false, "#GP at the CR0.PG write".to_string()));
        let w = kvm_refusal_reasons(
            Err("broken".into()),
            Pvm,
            refused,
            LinuxArch::I386,
            1,
            false,
        );
        assert_eq!(w.len(), 2, "no SYSCALL reason for i386: {w:?}");
        assert!(w[0].contains("CMPXCHG16B"), "{w:?}");
        assert!(
            w[1].contains("PAE paging") && w[1].contains("#GP at the CR0.PG write"),
            "{w:?}"
        );
        let works = Some((true, "ok".to_string()));
        let w = kvm_refusal_reasons(Ok(()), Hardware, works, LinuxArch::I386, 1, false);
        assert!(w.is_empty(), "{w:?}");
        let w = kvm_refusal_reasons(Ok(()), Hardware, None, LinuxArch::I386, 1, false);
        assert!(w.is_empty(), "an unknown PAE verdict boots: {w:?}");
        let w = kvm_refusal_reasons(Ok(()), Hardware, None, LinuxArch::X86_64, 1, false);
        assert!(
            w.is_empty(),
            "a 64-bit kernel, bzImage or PVH vmlinux, boots: {w:?}"
        );
        // --cpus N: the MADT lists them, up to its 8-bit APIC ids.
        for cpus in [2, crate::spec::MAX_CPUS, crate::machine::acpi::MAX_CPUS] {
            let w = kvm_refusal_reasons(Ok(()), Hardware, None, LinuxArch::X86_64, cpus, false);
            assert!(w.is_empty(), "--cpus {cpus}: {w:?}");
        }
        // An i386 kernel's APs under nested (the PDPTE bit 5), not on hardware.
        let w = kvm_refusal_reasons(Ok(()), Hardware, None, LinuxArch::I386, 2, true);
        assert!(
            w.len() == 1 && w[0].contains("CR0.PG") && w[0].contains("--cpus 2"),
            "{w:?}"
        );
        for (arch, cpus, nested) in [
            (LinuxArch::I386, 2, false),
            (LinuxArch::I386, 1, true),
            (LinuxArch::X86_64, 2, true),
        ] {
            let w = kvm_refusal_reasons(Ok(()), Hardware, None, arch, cpus, nested);
            assert!(
                w.is_empty(),
                "{arch:?} --cpus {cpus} nested={nested}: {w:?}"
            );
        }
        let w = kvm_refusal_reasons(Ok(()), Hardware, None, LinuxArch::I386, 256, false);
        assert!(
            w.len() == 1 && w[0].contains("--cpus 256") && w[0].contains("at most 255"),
            "{w:?}"
        );
    }
}
