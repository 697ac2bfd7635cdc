//! Control registers, MSRs, CPUID and the like.
use core::arch::asm;

pub const MSR_EFER: u32 = 0xc000_0080;
pub const MSR_STAR: u32 = 0xc000_0081;
pub const MSR_LSTAR: u32 = 0xc000_0082;
pub const MSR_FMASK: u32 = 0xc000_0084;
pub const MSR_ARCH_CAPABILITIES: u32 = 0x10a;
pub const EFER_SCE: u64 = 1 << 0;
pub const CR4_PGE: u64 = 1 << 7;
pub const CR4_PCIDE: u64 = 1 << 17;

pub fn read_cr2() -> u64 {
    let v;
    // SAFETY: reading CR2 has no side effects.
    unsafe { asm!("mov {}, cr2", out(reg) v, options(nomem, nostack, preserves_flags)) }
    v
}

pub fn read_cr4() -> u64 {
    let v;
    // SAFETY: reading CR4 has no side effects.
    unsafe { asm!("mov {}, cr4", out(reg) v, options(nomem, nostack, preserves_flags)) }
    v
}

/// # Safety
/// The caller keeps paging consistent (PGE/PCIDE changes flush the TLB).
pub unsafe fn write_cr4(v: u64) {
    // SAFETY: delegated to the caller.
    unsafe { asm!("mov cr4, {}", in(reg) v, options(nostack, preserves_flags)) }
}

/// # Safety
/// `msr` must exist on this CPU (else #GP).
pub unsafe fn rdmsr(msr: u32) -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: delegated to the caller.
    unsafe {
        asm!("rdmsr", in("ecx") msr, out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags))
    }
    (hi as u64) << 32 | lo as u64
}

/// # Safety
/// `msr` must exist and `v` be a value that keeps the kernel running.
pub unsafe fn wrmsr(msr: u32, v: u64) {
    // SAFETY: delegated to the caller.
    unsafe {
        asm!("wrmsr", in("ecx") msr, in("eax") v as u32, in("edx") (v >> 32) as u32, options(nostack, preserves_flags))
    }
}

/// CPUID leaf/subleaf: (eax, ebx, ecx, edx).
pub fn cpuid(leaf: u32, sub: u32) -> (u32, u32, u32, u32) {
    let r = core::arch::x86_64::__cpuid_count(leaf, sub);
    (r.eax, r.ebx, r.ecx, r.edx)
}

pub fn max_leaf() -> u32 {
    cpuid(0, 0).0
}

/// CPUID.1:ECX[17]
pub fn has_pcid() -> bool {
    cpuid(1, 0).2 & (1 << 17) != 0
}

/// IA32_ARCH_CAPABILITIES, if the MSR exists (CPUID.7.0:EDX[29]).
pub fn arch_capabilities() -> Option<u64> {
    if max_leaf() < 7 || cpuid(7, 0).3 & (1 << 29) == 0 {
        return None;
    }
    // SAFETY: the MSR exists, CPUID says so.
    Some(unsafe { rdmsr(MSR_ARCH_CAPABILITIES) })
}

/// `cli; hlt` for ever.
pub fn halt_forever() -> ! {
    loop {
        // SAFETY: stops the CPU; nothing to break.
        unsafe { asm!("cli", "hlt", options(nomem, nostack)) }
    }
}
