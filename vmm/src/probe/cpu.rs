//! CPU-feature probes run inside a long-mode guest: PCID (CPUID bit,
//! CR4.PCIDE, CR3 bit 63), IA32_ARCH_CAPABILITIES (what the guest reads,
//! and whether the VMM can change it), RDTSC at CPL3.

use serde::Serialize;

use super::code::{self, report, sel, Asm};
use super::entry::vector_name;
use super::vm::{Kit, ProbeVm, Program, StartMode, Stop, Trace, VmError};
use crate::machine::msr::{ARCH_CAP_RDCL_NO, MSR_IA32_ARCH_CAPABILITIES};

const CR4_PCIDE: u32 = crate::x86::cr4::PCIDE as u32;
const CPUID1_ECX_PCID: u64 = 1 << 17;
const CPUID7_EDX_ARCH_CAPS: u64 = 1 << 29;

/// What the PCID probe found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PcidProbe {
    /// `CPUID.1:ECX[17]` as the guest reads it.
    pub cpuid_bit: Option<bool>,
    /// Whether `mov cr4` with PCIDE succeeded.
    pub pcide: bool,
    /// Whether a CR3 write with bit 63 (NOFLUSH) succeeded, and with which
    /// CR4.PCIDE.
    pub cr3_noflush: bool,
    /// How the three checks went, for the report.
    pub detail: String,
}

impl PcidProbe {
    /// PCID is usable only if the guest sees the bit and both writes work.
    pub fn usable(&self) -> bool {
        self.cpuid_bit == Some(true) && self.pcide && self.cr3_noflush
    }
}

/// Describes how a straight-line probe ended when it did not run through.
fn fault_text(t: &Trace) -> String {
    match t.deliveries().first() {
        Some(d) => format!("{} at rip {:#x}", vector_name(d.vector), d.saved_rip()),
        None => format!("{} at {}", t.stop, t.where_()),
    }
}

/// Kernel code: CPUID.1:ECX → VALUE; stage 1; set CR4.PCIDE (if `pcide`);
/// stage 2; CR3 |= bit 63; stage 3; end.
fn pcid_kernel(pcide: bool) -> Asm {
    let mut k = Asm::new(code::KERNEL_CODE);
    k.mov_eax(1)
        .xor_ecx_ecx()
        .cpuid()
        .mov_eax_ecx()
        .report_eax();
    k.stage(1);
    if pcide {
        k.mov_eax_cr4().or_eax(CR4_PCIDE).mov_cr4_eax();
    }
    k.stage(2);
    k.mov_eax_cr3().bts_rax_63().mov_cr3_eax();
    k.stage(3);
    k.end(0);
    k
}

pub fn probe_pcid(kit: &Kit) -> Result<PcidProbe, VmError> {
    let mut vm = ProbeVm::new(kit)?;
    vm.load(&Program::new(StartMode::Long64, pcid_kernel(true)))?;
    let t = vm.run(kit.timeout)?;
    let cpuid_bit = t
        .values(report::VALUE)
        .first()
        .map(|ecx| ecx & CPUID1_ECX_PCID != 0);
    let stage = t.stage();
    let pcide = stage >= 2;
    if pcide {
        let noflush = stage >= 3 && t.stop == Stop::End(0);
        let detail = if noflush {
            "CR4.PCIDE set; CR3 write with bit 63 accepted".to_string()
        } else {
            format!("CR4.PCIDE set; CR3 write with bit 63: {}", fault_text(&t))
        };
        return Ok(PcidProbe {
            cpuid_bit,
            pcide,
            cr3_noflush: noflush,
            detail,
        });
    }
    let pcide_fault = fault_text(&t);
    // PCIDE refused: still say what a NOFLUSH CR3 write does without it.
    let mut vm = ProbeVm::new(kit)?;
    vm.load(&Program::new(StartMode::Long64, pcid_kernel(false)))?;
    let t2 = vm.run(kit.timeout)?;
    let noflush_text = if t2.stage() >= 3 {
        "accepted".to_string()
    } else {
        fault_text(&t2)
    };
    Ok(PcidProbe {
        cpuid_bit,
        pcide: false,
        cr3_noflush: false,
        detail: format!(
            "mov cr4 with PCIDE: {pcide_fault}; CR3 write with bit 63 (PCIDE=0): {noflush_text}"
        ),
    })
}

/// What the ARCH_CAPABILITIES probe found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArchCapsProbe {
    /// `CPUID.(7,0):EDX[29]` as the guest reads it (a guest checks it before
    /// reading the MSR, as Linux does).
    pub cpuid_bit: Option<bool>,
    /// KVM's feature-MSR value (KVM_GET_MSRS on /dev/kvm): what KVM could
    /// offer a guest.
    pub feature_value: Option<u64>,
    /// The vCPU's value from KVM_GET_MSRS before the guest runs.
    pub kvm_value: Option<u64>,
    /// The value the guest reads with RDMSR, by default (None: RDMSR faulted).
    pub guest_value: Option<u64>,
    /// The value the VMM tried to make the guest see (RDCL_NO flipped).
    pub override_value: u64,
    /// KVM_SET_MSRS(0x10a) took effect: the guest read `override_value`.
    pub set_msrs_works: bool,
    /// A user-space MSR exit answered the guest's RDMSR with `override_value`.
    pub msr_exit_works: bool,
    /// What the guest read and how each path went, for the report.
    pub detail: String,
}

impl ArchCapsProbe {
    /// Whether the default vCPU claims not to be Meltdown-vulnerable.
    pub fn rdcl_no(&self) -> Option<bool> {
        self.guest_value.map(|v| v & ARCH_CAP_RDCL_NO != 0)
    }

    /// Whether the VMM can choose what the guest's RDMSR returns.
    pub fn vmm_controls_value(&self) -> bool {
        self.set_msrs_works || self.msr_exit_works
    }
}

/// Kernel code: CPUID.(7,0):EDX → VALUE; rdmsr 0x10a → VALUE (lo, hi); end.
fn arch_caps_kernel() -> Asm {
    let mut k = Asm::new(code::KERNEL_CODE);
    k.mov_eax(7)
        .xor_ecx_ecx()
        .cpuid()
        .mov_eax_edx()
        .report_eax();
    k.stage(1);
    k.mov_ecx(MSR_IA32_ARCH_CAPABILITIES)
        .rdmsr()
        .report_edx_eax();
    k.stage(2);
    k.end(0);
    k
}

/// One run of the ARCH_CAPABILITIES kernel.
struct ArchRead {
    edx7: Option<u64>,
    /// The MSR value, or how the read failed.
    msr: Result<u64, String>,
    kvm_value: Option<u64>,
}

/// How the VMM tries to set what the guest reads.
#[derive(Clone, Copy)]
enum Via {
    Default,
    SetMsrs(u64),
    MsrExit(u64),
}

fn read_arch_caps(kit: &Kit, via: Via) -> Result<ArchRead, VmError> {
    let mut vm = ProbeVm::new(kit)?;
    let kvm_value = vm.get_msr(MSR_IA32_ARCH_CAPABILITIES);
    let mut p = Program::new(StartMode::Long64, arch_caps_kernel());
    match via {
        Via::Default => {}
        Via::SetMsrs(v) => p.msrs.push((MSR_IA32_ARCH_CAPABILITIES, v)),
        Via::MsrExit(v) => p.rdmsr_trap = Some((MSR_IA32_ARCH_CAPABILITIES, v)),
    }
    vm.load(&p)?;
    let t = vm.run(kit.timeout)?;
    let vals = t.values(report::VALUE);
    let msr = if t.stage() >= 2 && vals.len() >= 3 {
        Ok((vals[1] & 0xffff_ffff) | (vals[2] << 32))
    } else {
        Err(fault_text(&t))
    };
    Ok(ArchRead {
        edx7: vals.first().copied(),
        msr,
        kvm_value,
    })
}

/// Runs an override attempt; a refusal by KVM is a finding, not an error.
fn try_override(kit: &Kit, via: Via, wanted: u64) -> (bool, String) {
    match read_arch_caps(kit, via) {
        Ok(ArchRead { msr: Ok(v), .. }) => (v == wanted, format!("guest read {v:#x}")),
        Ok(ArchRead { msr: Err(e), .. }) => (false, format!("guest RDMSR: {e}")),
        Err(e) => (false, format!("refused: {e}")),
    }
}

pub fn probe_arch_caps(kit: &Kit) -> Result<ArchCapsProbe, VmError> {
    let first = read_arch_caps(kit, Via::Default)?;
    let cpuid_bit = first.edx7.map(|e| e & CPUID7_EDX_ARCH_CAPS != 0);
    let feature_value = system_msr(kit, MSR_IA32_ARCH_CAPABILITIES);
    let guest_value = first.msr.as_ref().ok().copied();
    let base = guest_value.or(feature_value).unwrap_or(0);
    let wanted = base ^ ARCH_CAP_RDCL_NO;
    let (set_msrs_works, set_text) = try_override(kit, Via::SetMsrs(wanted), wanted);
    let (msr_exit_works, exit_text) = try_override(kit, Via::MsrExit(wanted), wanted);
    let read_text = match &first.msr {
        Ok(v) => format!(
            "guest reads {v:#x} (RDCL_NO {})",
            if v & ARCH_CAP_RDCL_NO != 0 {
                "set"
            } else {
                "clear"
            }
        ),
        Err(e) => format!("guest RDMSR 0x10a: {e}"),
    };
    let bit_text = match cpuid_bit {
        Some(true) => "set",
        Some(false) => "clear",
        None => "unread",
    };
    let feature_text = feature_value.map_or("unreadable".to_string(), |v| format!("{v:#x}"));
    let detail = format!(
        "{read_text}; CPUID.7:EDX[29] {bit_text}; KVM feature MSR {feature_text}; \
         VMM sets {wanted:#x} by KVM_SET_MSRS: {set_text}; by user-space MSR exit: {exit_text}"
    );
    Ok(ArchCapsProbe {
        cpuid_bit,
        feature_value,
        kvm_value: first.kvm_value,
        guest_value,
        override_value: wanted,
        set_msrs_works,
        msr_exit_works,
        detail,
    })
}

/// KVM_GET_MSRS on /dev/kvm (feature MSRs).
fn system_msr(kit: &Kit, index: u32) -> Option<u64> {
    let mut m = kvm_bindings::Msrs::from_entries(&[kvm_bindings::kvm_msr_entry {
        index,
        ..Default::default()
    }])
    .ok()?;
    match kit.kvm.get_msrs(&mut m) {
        Ok(1) => m.as_slice().first().map(|e| e.data),
        _ => None,
    }
}

/// What the RDTSC probe found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RdtscProbe {
    /// Whether user-mode RDTSC ran and reported a value.
    pub works: bool,
    /// What was seen, for the report.
    pub detail: String,
}

/// User code at CPL3: two RDTSCs, each reported as EAX then EDX.
pub fn probe_rdtsc(kit: &Kit) -> Result<RdtscProbe, VmError> {
    let mut k = Asm::new(code::KERNEL_CODE);
    // IRETQ to CPL3 as the entry probes do (IOPL 3 for `out`).
    k.push_imm8(sel::USER_DS as u8)
        .push_imm32(code::USER_STACK_TOP as u32)
        .push_imm32(0x3002)
        .push_imm8(sel::USER_CS as u8)
        .push_imm32(code::USER_CODE as u32)
        .iretq();
    let mut u = Asm::new(code::USER_CODE);
    u.report_cs(report::USER_CS);
    u.rdtsc().report_edx_eax();
    u.rdtsc().report_edx_eax();
    u.end(0);
    let mut p = Program::new(StartMode::Long64, k);
    p.extra.push(u);
    let mut vm = ProbeVm::new(kit)?;
    vm.load(&p)?;
    let t = vm.run(kit.timeout)?;
    let v = t.values(report::VALUE);
    let cpl3 = t.last(report::USER_CS).is_some_and(|cs| cs & 3 == 3);
    if t.stop == Stop::End(0) && v.len() == 4 && cpl3 {
        let a = (v[0] & 0xffff_ffff) | (v[1] << 32);
        let b = (v[2] & 0xffff_ffff) | (v[3] << 32);
        let works = b > a;
        return Ok(RdtscProbe {
            works,
            detail: format!(
                "two reads at CPL3: {a} then {b} ({})",
                if works {
                    "increasing"
                } else {
                    "not increasing"
                }
            ),
        });
    }
    Ok(RdtscProbe {
        works: false,
        detail: format!("RDTSC at CPL3: {}", fault_text(&t)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcid_usable_needs_all_three() {
        let mut p = PcidProbe {
            cpuid_bit: Some(true),
            pcide: true,
            cr3_noflush: true,
            detail: String::new(),
        };
        assert!(p.usable());
        p.cr3_noflush = false;
        assert!(!p.usable());
        p.cr3_noflush = true;
        p.cpuid_bit = Some(false);
        assert!(!p.usable());
    }

    #[test]
    fn rdcl_no_follows_bit_0() {
        let mut a = ArchCapsProbe {
            cpuid_bit: Some(true),
            feature_value: None,
            kvm_value: None,
            guest_value: Some(0x0c00_e16d),
            override_value: 0x0c00_e16c,
            set_msrs_works: false,
            msr_exit_works: false,
            detail: String::new(),
        };
        assert!(!a.vmm_controls_value());
        assert_eq!(a.rdcl_no(), Some(true));
        a.guest_value = Some(0x0c00_e16c);
        assert_eq!(a.rdcl_no(), Some(false));
        a.guest_value = None;
        assert_eq!(a.rdcl_no(), None);
    }
}
