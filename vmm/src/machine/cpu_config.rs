//! vCPU set-up for the PVH boot protocol: CPUID, MSRs, 32-bit protected mode
//! with paging off, `rbx` = `hvm_start_info`. Also the register snapshot used
//! to report crashes.

use std::fmt;

use kvm_bindings::{kvm_fpu, kvm_regs, kvm_sregs, Msrs, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Kvm, MsrFilterRangeFlags, VcpuFd, VmFd};

use crate::machine::memory::START_INFO_ADDR;
use crate::machine::msr::{MsrAnswers, MsrTrapError, ARCH_CAP_RDCL_NO, MSR_IA32_ARCH_CAPABILITIES};
use crate::machine::segments::{set_flat, FlatSelectors};
use crate::spec::cmdline::CpuVuln;
use crate::x86::{cr0, cr4, efer};
/// CPUID.(EAX=7,ECX=0):EDX bit 29: IA32_ARCH_CAPABILITIES exists.
const CPUID_7_EDX_ARCH_CAPABILITIES: u32 = 1 << 29;

/// Errors setting up the vCPU.
#[derive(Debug, thiserror::Error)]
pub enum VcpuSetupError {
    /// KVM_GET_SUPPORTED_CPUID failed.
    #[error("KVM_GET_SUPPORTED_CPUID: {0}")]
    GetCpuid(#[source] kvm_ioctls::Error),
    /// KVM_SET_CPUID2 failed.
    #[error("KVM_SET_CPUID2: {0}")]
    SetCpuid(#[source] kvm_ioctls::Error),
    /// The MSR list for KVM_GET_MSRS/KVM_SET_MSRS could not be built.
    #[error("building the MSR list: {0}")]
    MsrList(String),
    /// Reading IA32_ARCH_CAPABILITIES failed.
    #[error("KVM_GET_MSRS(IA32_ARCH_CAPABILITIES): {0}")]
    GetMsrs(#[source] kvm_ioctls::Error),
    /// KVM did not take the ARCH_CAPABILITIES value `--cpu-vuln` asks for
    /// (no MSR filter on this host, and KVM_SET_MSRS refused or did not
    /// keep it).
    #[error(
        "KVM refused IA32_ARCH_CAPABILITIES = {value:#x} (KVM_SET_MSRS set {set} of 1); \
         --cpu-vuln cannot be honoured on this host"
    )]
    SetMsrs {
        /// The value asked for.
        value: u64,
        /// MSRs KVM_SET_MSRS set (0 also when the read-back differed).
        set: usize,
    },
    /// The KVM_SET_MSRS ioctl failed.
    #[error("KVM_SET_MSRS: {0}")]
    SetMsrsIoctl(#[source] kvm_ioctls::Error),
    /// The MSR filter that makes the guest's ARCH_CAPABILITIES accesses
    /// exit to the VMM could not be installed.
    #[error("routing IA32_ARCH_CAPABILITIES to the VMM: {0}")]
    TrapMsr(#[source] MsrTrapError),
    /// KVM_GET_SREGS failed.
    #[error("KVM_GET_SREGS: {0}")]
    GetSregs(#[source] kvm_ioctls::Error),
    /// KVM_SET_SREGS failed.
    #[error("KVM_SET_SREGS: {0}")]
    SetSregs(#[source] kvm_ioctls::Error),
    /// KVM_SET_REGS failed.
    #[error("KVM_SET_REGS: {0}")]
    SetRegs(#[source] kvm_ioctls::Error),
    /// KVM_SET_FPU failed.
    #[error("KVM_SET_FPU: {0}")]
    SetFpu(#[source] kvm_ioctls::Error),
}

/// What [`configure`] decided about the vCPU's MSRs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VcpuMsrs {
    /// IA32_ARCH_CAPABILITIES as the guest will read it (`None`: absent / #GP).
    pub arch_capabilities: Option<u64>,
    /// MSRs the exit dispatch answers (user-space MSR exits).
    pub answers: MsrAnswers,
}

/// CPUID bits the VMM changes from what KVM supports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuidMask {
    /// Clear CPUID.1:ECX[13] (CX16): kvm_pvm's emulator lacks `lock
    /// cmpxchg16b` at CPL0, which Linux uses once it sees the bit.
    pub hide_cx16: bool,
    /// Set CPUID.1:ECX[31] (a hypervisor is present) for a Linux guest, as
    /// Firecracker and cloud-hypervisor do: only then does Linux read
    /// KVM's paravirtual leaves (0x40000000 "KVMKVMKVM", 0x40000001, which
    /// KVM_GET_SUPPORTED_CPUID already lists) and use kvm-clock. Without
    /// it Linux calibrates the TSC against the PIT, fails under nested
    /// KVM ("tsc: Marking TSC unstable due to could not calculate TSC
    /// khz") and spins on the timer ports.
    pub hypervisor: bool,
    /// Clear PSE and PGE (CPUID.1:EDX and 0x80000001:EDX bits 3 and 13)
    /// and SMEP (CPUID.7.0:EBX[7]): the CR4 bits whose change with PAE
    /// paging on makes KVM reload the PDPTEs (`load_pdptrs`). Under
    /// `--backend nested` QEMU's nested page walker sets bit 5 (accessed)
    /// in the guest's PDPTEs, reserved there for KVM, so an i386 Linux
    /// kernel #GP'd at its first such CR4 write (setting PSE or PGE in
    /// early boot) and halted. Without the features Linux never writes
    /// them (no global pages, no large-page PSE bit in CR4; PAE's 2 MiB
    /// pages need no CR4.PSE).
    pub hide_pdpte_reload_bits: bool,
    /// Give each vCPU its own APIC id in CPUID (leaf 1 EBX[31:24], the
    /// x2APIC id in leaves 0xB and 0x1F EDX, AMD's extended APIC id in
    /// 0x8000001E EAX): its vCPU index, which is KVM's LAPIC id and what
    /// the ACPI MADT lists (`machine::acpi`). KVM_GET_SUPPORTED_CPUID
    /// gives every vCPU the same ids (the host's, or 0); Linux compares the
    /// CPUID id with the LAPIC's and the MADT's. Set for a Linux guest; the
    /// companion guest reads no APIC id from CPUID.
    pub apic_ids: bool,
}

impl CpuidMask {
    /// The default: for a Linux kernel (a bzImage) on kvm_pvm, hide CX16;
    /// otherwise hide nothing (the companion guest never uses CMPXCHG16B).
    pub fn for_kernel(linux: bool, flavour: crate::machine::kvm::KvmFlavour) -> Self {
        CpuidMask {
            hide_cx16: linux && flavour == crate::machine::kvm::KvmFlavour::Pvm,
            hypervisor: linux,
            hide_pdpte_reload_bits: false,
            apic_ids: linux,
        }
    }

    fn apply(self, cpuid: &mut kvm_bindings::CpuId) {
        for e in cpuid.as_mut_slice() {
            if self.hide_cx16 && e.function == 1 {
                e.ecx &= !CPUID_1_ECX_CX16;
            }
            if self.hypervisor && e.function == 1 {
                e.ecx |= CPUID_1_ECX_HYPERVISOR;
            }
            if self.hide_pdpte_reload_bits && (e.function == 1 || e.function == 0x8000_0001) {
                e.edx &= !(CPUID_EDX_PSE | CPUID_EDX_PGE);
            }
            if self.hide_pdpte_reload_bits && e.function == 7 && e.index == 0 {
                e.ebx &= !CPUID_7_EBX_SMEP;
            }
        }
        if self.hypervisor {
            consistent_xsave_leaf(cpuid);
        }
    }
}

/// Leaf 0xD as the rest of CPUID says: an XSAVE component whose feature
/// bit is clear (AVX in CPUID.1:ECX[28], PKU in CPUID.7.0:ECX[3]) is
/// dropped from 0xD.0's EAX with its sub-leaf, and 0xD.0's ECX (the
/// largest area) recomputed. A KVM nested in QEMU TCG listed AVX and PKRU
/// there without the feature bits; Linux then warned "XSAVE consistency
/// problem: size 2696 != kernel_size 576" and turned XSAVE off.
fn consistent_xsave_leaf(cpuid: &mut kvm_bindings::CpuId) {
    let find = |c: &kvm_bindings::CpuId, f: u32, i: u32| {
        c.as_slice()
            .iter()
            .find(|e| e.function == f && e.index == i)
            .copied()
    };
    let avx = find(cpuid, 1, 0).is_some_and(|e| e.ecx & (1 << 28) != 0);
    let pku = find(cpuid, 7, 0).is_some_and(|e| e.ecx & (1 << 3) != 0);
    let mut drop_mask = 0u32;
    if !avx {
        drop_mask |= 1 << 2;
    }
    if !pku {
        drop_mask |= 1 << 9;
    }
    let Some(leaf0) = find(cpuid, 0xd, 0) else {
        return;
    };
    let kept = leaf0.eax & !drop_mask;
    // The legacy area and the XSAVE header: 512 + 64 bytes.
    let mut max = 576u32;
    for e in cpuid.as_slice() {
        if e.function == 0xd && e.index >= 2 && e.index < 32 && kept & (1 << e.index) != 0 {
            max = max.max(e.ebx.saturating_add(e.eax));
        }
    }
    for e in cpuid.as_mut_slice() {
        if e.function != 0xd {
            continue;
        }
        if e.index == 0 {
            e.eax = kept;
            e.ecx = max;
        } else if e.index >= 2 && e.index < 32 && drop_mask & (1 << e.index) != 0 {
            (e.eax, e.ebx, e.ecx, e.edx) = (0, 0, 0, 0);
        }
    }
}

/// CPUID.1:ECX bit 13: CMPXCHG16B.
const CPUID_1_ECX_CX16: u32 = 1 << 13;
/// CPUID.1:EDX (and 0x80000001:EDX) bit 3: PSE.
const CPUID_EDX_PSE: u32 = 1 << 3;
/// CPUID.1:EDX (and 0x80000001:EDX) bit 13: PGE.
const CPUID_EDX_PGE: u32 = 1 << 13;
/// CPUID.(EAX=7,ECX=0):EBX bit 7: SMEP.
const CPUID_7_EBX_SMEP: u32 = 1 << 7;
/// CPUID.1:ECX bit 31: running under a hypervisor.
const CPUID_1_ECX_HYPERVISOR: u32 = 1 << 31;

/// How the boot vCPU starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryState {
    /// PVH: 32-bit protected mode, paging off, `rbx` = `hvm_start_info`.
    Pvh,
    /// The Linux 64-bit boot protocol: long mode on the identity page
    /// tables at `cr3`, the boot GDT, `rsi` = `boot_params`.
    Linux64 {
        /// The PML4's guest-physical address.
        cr3: u64,
        /// `struct boot_params`.
        boot_params: u64,
    },
    /// The Linux 32-bit boot protocol (an i386 kernel): flat 32-bit
    /// protected mode on the boot GDT, paging off, `esi` = `boot_params`.
    Linux32 {
        /// `struct boot_params`.
        boot_params: u64,
    },
}

/// What every vCPU of a run gets alike: the CPU's vulnerabilities as the
/// guest sees them, the CPUID mask, and KVM's supported CPUID table if the
/// run's caller has it (`None`: each vCPU asks KVM).
pub type CpuSetup<'a> = (CpuVuln, CpuidMask, Option<&'a kvm_bindings::CpuId>);

/// Sets CPUID (less `mask`), ARCH_CAPABILITIES (per `cpu_vuln`) and the
/// entry state `how`.
pub fn configure(
    kvm: &Kvm,
    vm: &VmFd,
    vcpu: &VcpuFd,
    entry: u64,
    how: EntryState,
    cpu: CpuSetup<'_>,
) -> Result<VcpuMsrs, VcpuSetupError> {
    let msrs = configure_cpu(kvm, vm, vcpu, 0, cpu)?;

    let mut sregs = vcpu.get_sregs().map_err(VcpuSetupError::GetSregs)?;
    let mut regs = kvm_regs {
        rip: entry,
        // Bit 1 is reserved and must be set; interrupts off.
        rflags: 0x2,
        ..Default::default()
    };
    match how {
        EntryState::Pvh => {
            pvh_sregs(&mut sregs);
            regs.rbx = START_INFO_ADDR;
        }
        EntryState::Linux64 { cr3, boot_params } => {
            linux64_sregs(&mut sregs, cr3);
            regs.rsi = boot_params;
        }
        // boot.rst: %ebp, %edi and %ebx zero, as `regs` starts.
        EntryState::Linux32 { boot_params } => {
            linux32_sregs(&mut sregs);
            regs.rsi = boot_params;
        }
    }
    vcpu.set_sregs(&sregs).map_err(VcpuSetupError::SetSregs)?;
    vcpu.set_regs(&regs).map_err(VcpuSetupError::SetRegs)?;
    Ok(msrs)
}

/// An application processor: CPUID, ARCH_CAPABILITIES and FPU as the boot
/// vCPU's, registers left in KVM's reset state. With the in-kernel irqchip
/// KVM keeps it waiting for INIT/SIPI (mp_state UNINITIALIZED), as a real
/// AP waits; the guest starts it through its LAPIC. `index` is its vCPU id.
pub fn configure_ap(
    kvm: &Kvm,
    vm: &VmFd,
    vcpu: &VcpuFd,
    index: u32,
    cpu: CpuSetup<'_>,
) -> Result<VcpuMsrs, VcpuSetupError> {
    configure_cpu(kvm, vm, vcpu, index, cpu)
}

/// CPUID's APIC ids for vCPU `id` (see [`CpuidMask::apic_ids`]).
fn set_apic_id(cpuid: &mut kvm_bindings::CpuId, id: u32) {
    for e in cpuid.as_mut_slice() {
        match e.function {
            1 => e.ebx = (e.ebx & 0x00ff_ffff) | (id << 24),
            0xb | 0x1f => e.edx = id,
            0x8000_001e => e.eax = id,
            _ => {}
        }
    }
}

/// KVM_GET_SUPPORTED_CPUID. The answer depends on the host CPU and the KVM
/// module only, and asking costs ~0.3 ms here (KVM executes CPUID for every
/// leaf, and CPUID traps when the host is itself a guest), so the host
/// facts keep it (`probe::host::HostFacts::supported_cpuid`) and a run's
/// caller hands it over ([`crate::machine::HostSide`]): every vCPU of every
/// run of a `compare` gets the same table without asking.
pub fn supported_cpuid(kvm: &Kvm) -> Result<kvm_bindings::CpuId, kvm_ioctls::Error> {
    kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
}

/// What every vCPU gets: CPUID, ARCH_CAPABILITIES, the FPU's reset state.
fn configure_cpu(
    kvm: &Kvm,
    vm: &VmFd,
    vcpu: &VcpuFd,
    index: u32,
    (cpu_vuln, mask, supported): CpuSetup<'_>,
) -> Result<VcpuMsrs, VcpuSetupError> {
    // Without CPUID set, the guest's EFER write (long mode) #GPs on some KVMs.
    let mut cpuid = match supported {
        Some(table) => table.clone(),
        None => supported_cpuid(kvm).map_err(VcpuSetupError::GetCpuid)?,
    };
    if cpu_vuln != CpuVuln::Host {
        // Enumerate the MSR so a guest that checks CPUID first (as Linux
        // does) reads it. Some KVMs (kvm_pvm) replace leaf 7 with the host's
        // whatever is set here; the guest then reads the MSR fault-safely.
        for e in cpuid.as_mut_slice() {
            if e.function == 7 && e.index == 0 {
                e.edx |= CPUID_7_EDX_ARCH_CAPABILITIES;
            }
        }
    }
    mask.apply(&mut cpuid);
    if mask.apic_ids {
        set_apic_id(&mut cpuid, index);
    }
    vcpu.set_cpuid2(&cpuid).map_err(VcpuSetupError::SetCpuid)?;

    // After KVM_SET_CPUID2: KVM recomputes the MSR's default when CPUID changes.
    let msrs = set_arch_capabilities(vm, vcpu, cpu_vuln)?;

    let fpu = kvm_fpu {
        // x87 and SSE reset values (FNINIT / power-on MXCSR).
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu).map_err(VcpuSetupError::SetFpu)?;
    Ok(msrs)
}

fn read_arch_capabilities(vcpu: &VcpuFd) -> Result<Option<u64>, VcpuSetupError> {
    let mut msrs = Msrs::from_entries(&[kvm_bindings::kvm_msr_entry {
        index: MSR_IA32_ARCH_CAPABILITIES,
        ..Default::default()
    }])
    .map_err(|e| VcpuSetupError::MsrList(format!("{e:?}")))?;
    let n = vcpu.get_msrs(&mut msrs).map_err(VcpuSetupError::GetMsrs)?;
    Ok((n == 1).then(|| msrs.as_slice()[0].data))
}

/// Makes the guest read the ARCH_CAPABILITIES `how` asks for.
///
/// The portable route first: a user-space MSR exit (MSR filter), answered
/// by the exit dispatch, works on every KVM with KVM_CAP_X86_USER_SPACE_MSR
/// (Linux 5.10+), including kvm_pvm, which refuses KVM_SET_MSRS of 0x10a.
/// Guest writes to the MSR exit too and get #GP, as on hardware (read-only).
/// Without the capability, KVM_SET_MSRS, checked by reading it back.
fn set_arch_capabilities(
    vm: &VmFd,
    vcpu: &VcpuFd,
    how: CpuVuln,
) -> Result<VcpuMsrs, VcpuSetupError> {
    let current = read_arch_capabilities(vcpu)?;
    let value = match (how, current) {
        (CpuVuln::Host, _) => {
            return Ok(VcpuMsrs {
                arch_capabilities: current,
                answers: MsrAnswers::default(),
            })
        }
        (CpuVuln::Meltdown, v) => v.unwrap_or(0) & !ARCH_CAP_RDCL_NO,
        (CpuVuln::None, v) => v.unwrap_or(0) | ARCH_CAP_RDCL_NO,
    };
    match crate::machine::msr::trap_msr(
        vm,
        MSR_IA32_ARCH_CAPABILITIES,
        MsrFilterRangeFlags::READ | MsrFilterRangeFlags::WRITE,
    ) {
        Ok(()) => {
            return Ok(VcpuMsrs {
                arch_capabilities: Some(value),
                answers: MsrAnswers {
                    arch_capabilities: Some(value),
                },
            })
        }
        Err(MsrTrapError::Unsupported) => {}
        Err(e) => return Err(VcpuSetupError::TrapMsr(e)),
    }
    let msrs = Msrs::from_entries(&[kvm_bindings::kvm_msr_entry {
        index: MSR_IA32_ARCH_CAPABILITIES,
        data: value,
        ..Default::default()
    }])
    .map_err(|e| VcpuSetupError::MsrList(format!("{e:?}")))?;
    let set = vcpu.set_msrs(&msrs).map_err(VcpuSetupError::SetMsrsIoctl)?;
    if set != 1 {
        return Err(VcpuSetupError::SetMsrs { value, set });
    }
    // Read back: what matters is what the guest will see.
    match read_arch_capabilities(vcpu)? {
        Some(v) if v == value => Ok(VcpuMsrs {
            arch_capabilities: Some(v),
            answers: MsrAnswers::default(),
        }),
        _ => Err(VcpuSetupError::SetMsrs { value, set: 0 }),
    }
}

/// The PVH entry state: flat 32-bit segments, CR0.PE (+ET), paging off.
pub fn pvh_sregs(sregs: &mut kvm_sregs) {
    // The PVH protocol's selectors (Xen's docs: CS 0x08 code, DS 0x10 data,
    // TR 0x18), the ones the ptiscope guest's boot GDT has too.
    set_flat(
        sregs,
        FlatSelectors {
            code: 0x08,
            data: 0x10,
            tss: 0x18,
            tss_base: 0,
        },
        false,
    );
    sregs.cr0 = cr0::PE | cr0::ET;
    sregs.cr3 = 0;
    sregs.cr4 = 0;
    sregs.efer = 0;
}

/// The flat `__BOOT_CS`/`__BOOT_DS` segments of the Linux boot GDT (64-bit
/// code when `long`), both boot protocols' start.
fn linux_boot_segments(sregs: &mut kvm_sregs, long: bool) {
    use crate::machine::bzimage::{BOOT_CS, BOOT_DS, BOOT_TSS, GDT_ADDR, GDT_LIMIT};
    set_flat(
        sregs,
        FlatSelectors {
            code: BOOT_CS,
            data: BOOT_DS,
            tss: BOOT_TSS,
            tss_base: 0,
        },
        long,
    );
    sregs.gdt.base = GDT_ADDR;
    sregs.gdt.limit = GDT_LIMIT;
}

/// The Linux 64-bit boot protocol's entry state: `__BOOT_CS`/`__BOOT_DS`
/// flat segments of the boot GDT, long mode with paging on `cr3`.
pub fn linux64_sregs(sregs: &mut kvm_sregs, cr3: u64) {
    linux_boot_segments(sregs, true);
    sregs.cr0 = cr0::PE | cr0::ET | cr0::PG;
    sregs.cr3 = cr3;
    sregs.cr4 = cr4::PAE;
    sregs.efer = efer::LME | efer::LMA;
}

/// The Linux 32-bit boot protocol's entry state: `__BOOT_CS`/`__BOOT_DS`
/// 4 GiB flat segments of the boot GDT (32-bit code), protected mode with
/// paging off; the kernel enables PAE paging itself.
pub fn linux32_sregs(sregs: &mut kvm_sregs) {
    linux_boot_segments(sregs, false);
    sregs.cr0 = cr0::PE | cr0::ET;
    sregs.cr3 = 0;
    sregs.cr4 = 0;
    sregs.efer = 0;
}

/// Registers at the moment the VM stopped, for crash reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RegsSnapshot {
    /// Instruction pointer (guest-virtual).
    pub rip: u64,
    /// Stack pointer (guest-virtual).
    pub rsp: u64,
    /// RFLAGS (IF: whether interrupts were on).
    pub rflags: u64,
    /// `rax` (on a syscall path, the syscall number or its result).
    pub rax: u64,
    /// Code segment selector (its low two bits are the CPL).
    pub cs: u16,
    /// CR0 (PE: protected mode, PG: paging).
    pub cr0: u64,
    /// CR2: the last page-fault address.
    pub cr2: u64,
    /// CR3: the page-table root (with PTI, bit 12 tells the user copy).
    pub cr3: u64,
    /// CR4 (PAE, PGE, PCIDE among others).
    pub cr4: u64,
    /// IA32_EFER (LME/LMA: long mode, NXE, SCE).
    pub efer: u64,
}

impl RegsSnapshot {
    /// Reads the vCPU's registers; `None` if KVM refuses (the report then says so).
    pub fn read(vcpu: &VcpuFd) -> Option<Self> {
        let r = vcpu.get_regs().ok()?;
        let s = vcpu.get_sregs().ok()?;
        Some(RegsSnapshot {
            rip: r.rip,
            rsp: r.rsp,
            rflags: r.rflags,
            rax: r.rax,
            cs: s.cs.selector,
            cr0: s.cr0,
            cr2: s.cr2,
            cr3: s.cr3,
            cr4: s.cr4,
            efer: s.efer,
        })
    }

    /// True if these are the vCPU's reset values, not a guest's: what
    /// KVM gives after a triple fault on AMD SVM, where the VMCB is
    /// undefined after the SHUTDOWN intercept and KVM reinitialises the
    /// vCPU before userspace sees the exit.
    pub fn is_reset_state(&self) -> bool {
        // The architectural INIT/RESET values: CS selector 0xf000, RIP
        // 0xfff0, CR0 with only ET (and possibly CD/NW), no paging, no
        // long mode. No guest of ptiscope's runs there at a fault.
        self.rip == 0xfff0
            && self.cs == 0xf000
            && self.cr0 & (cr0::PG | cr0::PE) == 0
            && self.efer & (efer::LME | efer::LMA) == 0
    }

    /// True if the guest was in, or entering, paging outside long mode
    /// (32-bit legacy or PAE paging), which some KVMs (kvm_pvm) refuse.
    pub fn looks_like_32bit_paging(&self) -> bool {
        let pg = self.cr0 & cr0::PG != 0;
        let pae = self.cr4 & cr4::PAE != 0;
        let lme = self.efer & efer::LME != 0;
        let lma = self.efer & efer::LMA != 0;
        (pg && !lma) || (pae && !lme)
    }
}

impl fmt::Display for RegsSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rip={:#x} rsp={:#x} rflags={:#x} rax={:#x} cs={:#x} cr0={:#x} cr2={:#x} cr3={:#x} cr4={:#x} efer={:#x}",
            self.rip, self.rsp, self.rflags, self.rax, self.cs, self.cr0, self.cr2, self.cr3, self.cr4, self.efer
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pvh_state_is_flat_protected_mode_without_paging() {
        let mut s = kvm_sregs::default();
        pvh_sregs(&mut s);
        assert_eq!(s.cr0, 0x11);
        assert_eq!(
            (s.cs.base, s.cs.limit, s.cs.db, s.cs.l),
            (0, 0xffff_ffff, 1, 0)
        );
        assert_eq!(s.ss.type_, 3);
        assert_eq!(s.efer, 0);
    }

    #[test]
    fn linux64_state_is_long_mode_on_the_boot_gdt() {
        let mut s = kvm_sregs::default();
        linux64_sregs(&mut s, 0x9000);
        assert_eq!((s.cs.selector, s.cs.l, s.cs.db), (0x10, 1, 0));
        assert_eq!((s.ds.selector, s.ss.selector), (0x18, 0x18));
        assert_eq!((s.cr3, s.efer), (0x9000, efer::LME | efer::LMA));
        let snap = RegsSnapshot {
            cr0: s.cr0,
            cr4: s.cr4,
            efer: s.efer,
            ..Default::default()
        };
        assert!(!snap.looks_like_32bit_paging());
    }

    #[test]
    fn linux32_state_is_flat_protected_mode_on_the_boot_gdt() {
        let mut s = kvm_sregs::default();
        linux32_sregs(&mut s);
        assert_eq!((s.cs.selector, s.cs.l, s.cs.db), (0x10, 0, 1));
        assert_eq!(
            (s.ds.selector, s.es.selector, s.ss.selector),
            (0x18, 0x18, 0x18)
        );
        assert_eq!(
            (s.cs.base, s.cs.limit, s.ds.limit),
            (0, 0xffff_ffff, 0xffff_ffff)
        );
        assert_eq!((s.cr0, s.cr3, s.cr4, s.efer), (cr0::PE | cr0::ET, 0, 0, 0));
        assert_eq!(s.gdt.base, crate::machine::bzimage::GDT_ADDR);
    }

    #[test]
    fn cx16_mask_clears_only_cpuid_1_ecx_13() {
        let mut c = kvm_bindings::CpuId::new(2).unwrap();
        c.as_mut_slice()[0].function = 1;
        c.as_mut_slice()[0].ecx = 0xffff_ffff;
        c.as_mut_slice()[1].function = 7;
        c.as_mut_slice()[1].ecx = 0xffff_ffff;
        CpuidMask {
            hide_cx16: true,
            ..Default::default()
        }
        .apply(&mut c);
        assert_eq!(c.as_slice()[0].ecx, !(1 << 13));
        assert_eq!(c.as_slice()[1].ecx, 0xffff_ffff);
        CpuidMask::default().apply(&mut c);
        assert_eq!(c.as_slice()[0].ecx, !(1 << 13));
    }

    #[test]
    fn xsave_components_without_their_feature_bit_leave_leaf_0xd() {
        let mut c = kvm_bindings::CpuId::new(5).unwrap();
        let set = |c: &mut kvm_bindings::CpuId, n: usize, f, i, r: [u32; 4]| {
            let e = &mut c.as_mut_slice()[n];
            (e.function, e.index) = (f, i);
            (e.eax, e.ebx, e.ecx, e.edx) = (r[0], r[1], r[2], r[3]);
        };
        // No AVX, no PKU; leaf 0xD lists both (as nested under TCG).
        set(&mut c, 0, 1, 0, [0, 0, 0, 0]);
        set(&mut c, 1, 7, 0, [0, 0, 0, 0]);
        set(&mut c, 2, 0xd, 0, [0x207, 0x240, 0xa88, 0]);
        set(&mut c, 3, 0xd, 2, [0x100, 0x240, 0, 0]);
        set(&mut c, 4, 0xd, 9, [8, 0xa80, 0, 0]);
        consistent_xsave_leaf(&mut c);
        let s = c.as_slice();
        assert_eq!((s[2].eax, s[2].ecx), (3, 576));
        assert_eq!((s[3].eax, s[3].ebx), (0, 0));
        assert_eq!((s[4].eax, s[4].ebx), (0, 0));
        // With AVX: its component stays, the area ends after it.
        set(&mut c, 0, 1, 0, [0, 0, 1 << 28, 0]);
        set(&mut c, 2, 0xd, 0, [0x207, 0x240, 0xa88, 0]);
        set(&mut c, 3, 0xd, 2, [0x100, 0x240, 0, 0]);
        consistent_xsave_leaf(&mut c);
        let s = c.as_slice();
        assert_eq!((s[2].eax, s[2].ecx), (7, 0x340));
    }

    #[test]
    fn the_pdpte_reload_mask_hides_pse_pge_and_smep_only() {
        let mut c = kvm_bindings::CpuId::new(3).unwrap();
        for (n, f) in [1u32, 0x8000_0001, 7].into_iter().enumerate() {
            let e = &mut c.as_mut_slice()[n];
            e.function = f;
            (e.ebx, e.edx) = (0xffff_ffff, 0xffff_ffff);
        }
        CpuidMask {
            hide_pdpte_reload_bits: true,
            ..Default::default()
        }
        .apply(&mut c);
        let s = c.as_slice();
        assert_eq!(s[0].edx, !((1 << 3) | (1 << 13)));
        assert_eq!(s[1].edx, !((1 << 3) | (1 << 13)));
        assert_eq!((s[2].ebx, s[2].edx), (!(1 << 7), 0xffff_ffff));
    }

    /// Each vCPU's CPUID names its own APIC id (the MADT's, KVM's LAPIC
    /// id), leaving the rest of the registers as KVM gave them.
    #[test]
    fn apic_ids_are_the_vcpu_index() {
        let mut c = kvm_bindings::CpuId::new(5).unwrap();
        for (n, (f, i)) in [(1u32, 0u32), (0xb, 0), (0xb, 1), (0x8000_001e, 0), (7, 0)]
            .into_iter()
            .enumerate()
        {
            let e = &mut c.as_mut_slice()[n];
            (e.function, e.index) = (f, i);
            (e.eax, e.ebx, e.edx) = (0x11, 0x0008_0800, 0x99);
        }
        set_apic_id(&mut c, 3);
        let s = c.as_slice();
        assert_eq!((s[0].ebx, s[0].edx), (0x0308_0800, 0x99), "leaf 1");
        assert_eq!(
            (s[1].edx, s[2].edx, s[1].ebx),
            (3, 3, 0x0008_0800),
            "leaf 0xB"
        );
        assert_eq!(s[3].eax, 3, "leaf 0x8000001E");
        assert_eq!((s[4].eax, s[4].ebx, s[4].edx), (0x11, 0x0008_0800, 0x99));
        let m = CpuidMask::for_kernel(false, crate::machine::kvm::KvmFlavour::Hardware);
        assert!(!m.apic_ids, "the companion guest's CPUID is left alone");
        let m = CpuidMask::for_kernel(true, crate::machine::kvm::KvmFlavour::Hardware);
        assert!(m.apic_ids);
    }

    #[test]
    fn a_linux_guest_sees_the_hypervisor_bit() {
        let mut c = kvm_bindings::CpuId::new(1).unwrap();
        c.as_mut_slice()[0].function = 1;
        CpuidMask {
            hypervisor: true,
            ..Default::default()
        }
        .apply(&mut c);
        assert_eq!(c.as_slice()[0].ecx, 1 << 31);
    }

    #[test]
    fn svm_reset_state_after_a_shutdown_is_not_presented_as_the_fault() {
        // What KVM on AMD (nested kvm_amd) returned after a triple fault.
        let reset = RegsSnapshot {
            rip: 0xfff0,
            cs: 0xf000,
            cr0: 0x10,
            rflags: 2,
            ..Default::default()
        };
        assert!(reset.is_reset_state());
        let text = crate::machine::outcome::StopReason::Shutdown { regs: Some(reset) }.to_string();
        assert!(text.contains("faulting registers are lost"), "{text}");
        assert!(!text.contains("registers: rip"), "{text}");
        // A guest's own state (a fault in long mode) is printed as such.
        let guest = RegsSnapshot {
            rip: 0xffff_8000_0010_0000,
            cs: 0x10,
            cr0: cr0::PE | cr0::PG,
            efer: efer::LME | efer::LMA,
            ..Default::default()
        };
        assert!(!guest.is_reset_state());
        let text = crate::machine::outcome::StopReason::Shutdown { regs: Some(guest) }.to_string();
        assert!(text.contains("registers: "), "{text}");
    }

    #[test]
    fn detects_32bit_paging() {
        let long = RegsSnapshot {
            cr0: cr0::PE | cr0::PG,
            cr4: cr4::PAE,
            efer: efer::LME | efer::LMA,
            ..Default::default()
        };
        assert!(!long.looks_like_32bit_paging());
        let pae = RegsSnapshot {
            cr0: cr0::PE,
            cr4: cr4::PAE,
            ..Default::default()
        };
        assert!(pae.looks_like_32bit_paging());
        let legacy = RegsSnapshot {
            cr0: cr0::PE | cr0::PG,
            ..Default::default()
        };
        assert!(legacy.looks_like_32bit_paging());
    }
}
