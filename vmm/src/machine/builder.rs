//! Building a VM from a resolved run: guest memory with the kernel and boot
//! parameters in it, the KVM VM (memory slots, TSS, in-kernel irqchip:
//! the local APICs only for the companion guest, all of it for Linux), the
//! device bus and the vCPUs (the boot vCPU's registers set for the PVH
//! entry, the others left for the guest's INIT/SIPI). Nothing here runs the
//! guest.

use std::sync::{Arc, Mutex};

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use ptiscope_abi::port;
use ptiscope_devices::{
    ConsoleRecorder, EventFdTrigger, ExitDevice, PhaseDevice, PioBus, SerialDevice,
};
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::machine::acpi;
use crate::machine::boot_params;
use crate::machine::bzimage;
use crate::machine::cpu_config::{self, CpuidMask, EntryState};
use crate::machine::kvm::open_kvm;
use crate::machine::loader::{self, LoadError};
use crate::machine::msr::MsrAnswers;
use crate::machine::HostSide;
use crate::machine::RunError;
use crate::spec::guest::GuestKind;
use crate::spec::ResolvedRun;

/// Where the TSS for real-mode emulation goes (Intel needs three pages KVM
/// may use, outside guest RAM: just below 4 GiB, as Firecracker does).
const KVM_TSS_ADDRESS: usize = 0xfffb_d000;
/// The UART's ISA interrupt line (the DSDT's COM1 says the same).
const COM1_IRQ: u32 = acpi::COM1_GSI;

/// A VM ready to run: everything [`crate::machine::run`] needs.
pub struct BuiltVm {
    /// The VM. Declared before `mem` so that it is dropped first (the
    /// memory slots point into `mem`).
    pub vm: VmFd,
    /// Guest memory, with the kernel and the boot structures loaded.
    pub mem: GuestMemoryMmap,
    /// The port I/O bus: COM1, the exit device, the phase-marker port.
    pub bus: PioBus,
    /// The COM1 UART, shared with the event loop that feeds it stdin.
    pub serial: Arc<Mutex<SerialDevice>>,
    /// The queue behind the console's destination (None: discarded).
    pub console_queue: Option<crate::output::OutputQueue>,
    /// What the console printed: machine lines (`@result ...`), the banner
    /// and the tail, for the outcome.
    pub recorder: Arc<Mutex<ConsoleRecorder>>,
    /// The vCPUs by index: 0 (the boot CPU) with its registers set for the
    /// PVH entry; the others in KVM's reset state, waiting for the guest's
    /// INIT/SIPI through the in-kernel LAPIC (docs/guest.md, "SMP").
    pub vcpus: Vec<VcpuFd>,
    /// What the VMM answers for the MSRs it traps (user-space MSR exits).
    pub msr_answers: MsrAnswers,
    /// IA32_ARCH_CAPABILITIES as the guest reads it (None: the MSR is absent).
    pub arch_capabilities: Option<u64>,
}

fn vm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> RunError {
    move |source| RunError::VmSetup { what, source }
}

/// Builds the VM for `run` on the host its caller describes.
pub fn build(run: &ResolvedRun, host: &HostSide) -> Result<BuiltVm, RunError> {
    let config = &run.config;
    let kvm = open_kvm()?;
    let boot = &run.boot;
    // The memory preflight's check loaded the image into, if this is the
    // run's first boot (the same steps as below, done once instead of twice).
    let (mem, loaded) = match boot.preloaded.take() {
        Some(preloaded) => preloaded,
        None => {
            let mem = run.layout.create_guest_memory()?;
            let loaded = loader::load_bytes(&mem, &run.layout, &boot.image_name, &boot.image)?;
            (mem, loaded)
        }
    };
    let entry_state = match &loaded.bzimage {
        Some(k) => {
            // The initrd (a `--linux` run's initramfs with ptiscope's init):
            // boot_params' ramdisk_image/ramdisk_size, below the image's
            // initrd_addr_max, in RAM the E820 map gives the guest.
            let initrd = boot.initrd.as_deref();
            // ACPI tables: the MADT is how Linux learns of the vCPUs
            // (--cpus N); written for one vCPU too, so that a Linux boot
            // sees the same machine (IOAPIC, no 8259) whatever --cpus says.
            let bz_err = |e| LoadError::BzImage(boot.image_name.clone(), e);
            let tables = acpi::write_tables(&mem, config.cpus)
                .map_err(|e| bz_err(bzimage::BzImageError::Acpi(e)))?;
            bzimage::write_boot_params(&mem, &run.layout, k, &boot.cmdline, initrd, Some(&tables))
                .map_err(bz_err)?;
            match k.mode {
                bzimage::BootMode::Long64 => EntryState::Linux64 {
                    cr3: bzimage::PML4_ADDR,
                    boot_params: bzimage::ZERO_PAGE_ADDR,
                },
                bzimage::BootMode::Protected32 => EntryState::Linux32 {
                    boot_params: bzimage::ZERO_PAGE_ADDR,
                },
            }
        }
        None => {
            // A Linux vmlinux booted by PVH: its initramfs as the first
            // module, and the same ACPI tables a bzImage gets (its CPUs).
            let linux = match &run.guest_kind {
                GuestKind::Linux(_) => {
                    let tables = acpi::write_tables(&mem, config.cpus)
                        .map_err(boot_params::BootParamsError::Acpi)?;
                    Some(boot_params::PvhLinux {
                        initrd: boot.initrd.as_deref(),
                        kernel_end: loaded.end,
                        rsdp: tables.rsdp,
                    })
                }
                GuestKind::Companion => None,
            };
            boot_params::write_boot_params(&mem, &run.layout, &boot.cmdline, linux.as_ref())?;
            EntryState::Pvh
        }
    };
    let mut mask = CpuidMask::for_kernel(
        loaded.bzimage.is_some() || run.guest_kind.is_linux(),
        host.kvm,
    );
    // An i386 kernel under --backend nested: see the field (QEMU's nested
    // walker marks PDPTEs accessed, which KVM's PDPTE reload refuses).
    mask.hide_pdpte_reload_bits = host.nested
        && loaded
            .bzimage
            .is_some_and(|k| k.mode == bzimage::BootMode::Protected32);
    let cpu = (config.cpu_vuln, mask, host.supported_cpuid.as_ref());
    let chip = match (
        config.irqchip,
        run.guest_kind.is_linux() || loaded.bzimage.is_some(),
    ) {
        (false, _) => IrqChip::None,
        (true, true) => IrqChip::Full,
        (true, false) => IrqChip::Split,
    };
    let vm = create_vm(&kvm, &mem, chip)?;

    let (out, console_queue) = crate::output::console_output(&config.serial_out, config.timeout)?;
    let irq = EventFd::new(EFD_NONBLOCK).map_err(|source| RunError::Host {
        what: "creating the serial interrupt eventfd",
        source,
    })?;
    // Only the full irqchip has the IOAPIC pin the UART's line goes to.
    if chip == IrqChip::Full {
        vm.register_irqfd(&irq, COM1_IRQ)
            .map_err(vm_err("KVM_IRQFD (serial)"))?;
    }
    let (serial, recorder) = SerialDevice::with_output(EventFdTrigger(irq), out);
    let serial = Arc::new(Mutex::new(serial));
    let bus = device_bus(&serial)?;

    let vcpu = vm.create_vcpu(0).map_err(vm_err("KVM_CREATE_VCPU"))?;
    let vcpu_msrs = cpu_config::configure(&kvm, &vm, &vcpu, loaded.entry, entry_state, cpu)?;
    let mut vcpus = vec![vcpu];
    for id in 1..u64::from(config.cpus) {
        let ap = vm.create_vcpu(id).map_err(vm_err("KVM_CREATE_VCPU"))?;
        cpu_config::configure_ap(&kvm, &vm, &ap, id as u32, cpu)?;
        vcpus.push(ap);
    }
    Ok(BuiltVm {
        vm,
        mem,
        bus,
        serial,
        console_queue,
        recorder,
        vcpus,
        msr_answers: vcpu_msrs.answers,
        arch_capabilities: vcpu_msrs.arch_capabilities,
    })
}

/// The port I/O bus: console, exit device, phase markers.
fn device_bus(serial: &Arc<Mutex<SerialDevice>>) -> Result<PioBus, RunError> {
    let mut bus = PioBus::new();
    let bus_err = RunError::DeviceBus;
    bus.insert(port::SERIAL_COM1, port::SERIAL_LEN, serial.clone())
        .map_err(bus_err)?;
    bus.insert(port::EXIT, port::EXIT_LEN, Arc::new(Mutex::new(ExitDevice)))
        .map_err(bus_err)?;
    bus.insert(
        port::PHASE,
        port::PHASE_LEN,
        Arc::new(Mutex::new(PhaseDevice)),
    )
    .map_err(bus_err)?;
    Ok(bus)
}

/// Which interrupt controllers KVM emulates in the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IrqChip {
    /// `--no-irqchip`: none (HLT exits to the VMM; one vCPU only).
    None,
    /// The local APICs only (`KVM_CAP_SPLIT_IRQCHIP`, as cloud-hypervisor
    /// uses): what the companion guest needs (INIT/SIPI, IPIs, the LAPIC
    /// timer, HLT in the kernel). It never programs a PIC or an IOAPIC, and
    /// without them the kernel has no PIC/IOAPIC devices to unregister when
    /// the VM is torn down, each unregistration an expedited SRCU grace
    /// period: on kvm_pvm that teardown was ~10 ms of a ~30 ms boot-to-exit.
    Split,
    /// LAPICs, PIC and IOAPIC (`KVM_CREATE_IRQCHIP`): a Linux kernel
    /// (`--linux`, a bzImage) sets up the PIC and IOAPIC and routes the
    /// UART's interrupt through them.
    Full,
}

/// IOAPIC pins KVM reserves routes for under the split irqchip (the
/// IOAPIC's own count, so an MSI route never collides with a pin's GSI).
const SPLIT_IRQCHIP_IOAPIC_PINS: u64 = 24;

/// Creates the VM: memory slots, TSS, in-kernel irqchip.
fn create_vm(kvm: &Kvm, mem: &GuestMemoryMmap, chip: IrqChip) -> Result<VmFd, RunError> {
    let vm = kvm.create_vm().map_err(vm_err("KVM_CREATE_VM"))?;
    for (slot, region) in mem.iter().enumerate() {
        let host = mem
            .get_host_address(region.start_addr())
            .map_err(RunError::GuestMemoryAddress)?;
        let r = kvm_userspace_memory_region {
            slot: slot as u32,
            flags: 0,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: host as u64,
        };
        // SAFETY: the region is a live mapping owned by `mem`, which outlives
        // the VM: `BuiltVm` declares `vm` before `mem`, so the VM fd is
        // dropped first.
        unsafe { vm.set_user_memory_region(r) }.map_err(vm_err("KVM_SET_USER_MEMORY_REGION"))?;
    }
    vm.set_tss_address(KVM_TSS_ADDRESS)
        .map_err(vm_err("KVM_SET_TSS_ADDR"))?;
    match chip {
        IrqChip::None => {}
        IrqChip::Split => {
            let mut cap = kvm_bindings::kvm_enable_cap {
                cap: kvm_bindings::KVM_CAP_SPLIT_IRQCHIP,
                ..Default::default()
            };
            cap.args[0] = SPLIT_IRQCHIP_IOAPIC_PINS;
            vm.enable_cap(&cap)
                .map_err(vm_err("KVM_ENABLE_CAP(KVM_CAP_SPLIT_IRQCHIP)"))?;
        }
        IrqChip::Full => {
            vm.create_irq_chip().map_err(vm_err("KVM_CREATE_IRQCHIP"))?;
            // The i8254 in the kernel beside the PIC and IOAPIC: Linux
            // calibrates the LAPIC timer against it and its IO-APIC timer
            // check routes IRQ 0 from it; without one, ports 0x40-0x43 exit
            // to the VMM (unclaimed) on every read of a loop that never ends.
            let pit = kvm_bindings::kvm_pit_config {
                flags: kvm_bindings::KVM_PIT_SPEAKER_DUMMY,
                ..Default::default()
            };
            vm.create_pit2(pit).map_err(vm_err("KVM_CREATE_PIT2"))?;
        }
    }
    Ok(vm)
}
