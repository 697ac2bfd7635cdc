//! Control registers, MSRs, CPUID and the like: what both flavours share.
//! Values are u64 on both so shared kernel code calls them alike; each
//! flavour's `cpu` module re-exports these and adds its own (SYSCALL or
//! SYSENTER MSRs, the RDMSR fix-up stub, how to raise a #GP).
use core::arch::asm;
#[cfg(target_arch = "x86")]
use core::arch::x86 as arch;
#[cfg(target_arch = "x86_64")]
use core::arch::x86_64 as arch;

pub const MSR_ARCH_CAPABILITIES: u32 = 0x10a;
pub const CR4_PGE: u64 = 1 << 7;
/// Never set on the PAE flavour (PAE has no PCID); shared code names it.
pub const CR4_PCIDE: u64 = 1 << 17;

pub fn read_cr2() -> u64 {
    let v: usize;
    // SAFETY: reading CR2 has no side effects.
    unsafe { asm!("mov {}, cr2", out(reg) v, options(nomem, nostack, preserves_flags)) }
    v as u64
}

pub fn read_cr4() -> u64 {
    let v: usize;
    // SAFETY: reading CR4 has no side effects.
    unsafe { asm!("mov {}, cr4", out(reg) v, options(nomem, nostack, preserves_flags)) }
    v as u64
}

/// # Safety
/// The caller keeps paging consistent (PGE/PCIDE changes flush the TLB).
pub unsafe fn write_cr4(v: u64) {
    // SAFETY: delegated to the caller.
    unsafe { asm!("mov cr4, {}", in(reg) v as usize, options(nostack, preserves_flags)) }
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
    let r = arch::__cpuid_count(leaf, sub);
    (r.eax, r.ebx, r.ecx, r.edx)
}

pub fn max_leaf() -> u32 {
    cpuid(0, 0).0
}

extern "C" {
    /// Each flavour's RDMSR with an exception fix-up (its `cpu` module):
    /// 1 and the value in `out` if the MSR was read, 0 if RDMSR faulted.
    fn rdmsr_safe_raw(msr: u32, out: *mut u64) -> u32;
}

/// RDMSR that returns `None` instead of faulting when the MSR does not
/// exist (Linux: `rdmsrl_safe` and its exception-table entry).
pub fn rdmsr_safe(msr: u32) -> Option<u64> {
    let mut v = 0;
    // SAFETY: RDMSR has no memory effects; a #GP is fixed up by the
    // exception handler; `v` is a valid place for the result.
    let ok = unsafe { rdmsr_safe_raw(msr, &mut v) };
    (ok != 0).then_some(v)
}

/// IA32_ARCH_CAPABILITIES as the (virtual) CPU reports it. CPUID.7.0:EDX[29]
/// says whether it exists, but a VMM may serve the MSR without being able to
/// set that bit (kvm_pvm, a software KVM, passes the host's leaf 7 through, and
/// its AMD hosts lack the bit), so the MSR is read either way, safely.
pub fn arch_capabilities() -> Option<u64> {
    if max_leaf() >= 7 && cpuid(7, 0).3 & (1 << 29) != 0 {
        // SAFETY: the MSR exists, CPUID says so.
        return Some(unsafe { rdmsr(MSR_ARCH_CAPABILITIES) });
    }
    rdmsr_safe(MSR_ARCH_CAPABILITIES)
}

/// `cli; hlt` for ever.
pub fn halt_forever() -> ! {
    loop {
        // SAFETY: stops the CPU; nothing to break.
        unsafe { asm!("cli", "hlt", options(nomem, nostack)) }
    }
}

/// CPUID.80000001h:EDX[20]: NX (both flavours' boot code set EFER.NXE if so).
/// Only the PAE flavour asks: its tables set NX where the CPU has it, while
/// x86_64's 4-level tables always do.
#[cfg(target_arch = "x86")]
pub fn has_nx() -> bool {
    cpuid(0x8000_0000, 0).0 >= 0x8000_0001 && cpuid(0x8000_0001, 0).3 & (1 << 20) != 0
}

/// `rdmsr_safe_asm!(load, store)`: the flavour's `rdmsr_safe_raw(msr, out)
/// -> eax` (1 if read, 0 if it faulted) in `.text.rdmsr_safe`: `load` puts
/// the MSR number in ecx (and keeps `out` where `store` finds it), esi = 1,
/// the RDMSR at `rdmsr_safe_insn` (on #GP there the exception handler skips
/// it and clears esi, see exceptions.rs), `store` writes edx:eax to `out`
/// and leaves esi in eax; then `ret`.
macro_rules! rdmsr_safe_asm {
    ($load:expr, $store:expr $(,)?) => {
        core::arch::global_asm!(
            "    .section .text.rdmsr_safe, \"ax\"
    .global rdmsr_safe_raw
rdmsr_safe_raw:",
            $load,
            "    movl $1, %esi
    .global rdmsr_safe_insn
rdmsr_safe_insn:
    rdmsr",
            $store,
            "    ret
    .previous",
            options(att_syntax)
        );
    };
}
pub(crate) use rdmsr_safe_asm;
