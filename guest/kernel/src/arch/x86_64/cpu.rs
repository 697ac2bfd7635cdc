//! Control registers, MSRs, CPUID and the like.
use core::arch::asm;

pub use crate::arch::x86_shared::cpu::*;

pub const MSR_EFER: u32 = 0xc000_0080;
pub const MSR_STAR: u32 = 0xc000_0081;
pub const MSR_LSTAR: u32 = 0xc000_0082;
pub const MSR_FMASK: u32 = 0xc000_0084;
pub const EFER_SCE: u64 = 1 << 0;

/// CPUID.1:ECX[17]
pub fn has_pcid() -> bool {
    cpuid(1, 0).2 & (1 << 17) != 0
}

// rdmsr_safe_raw(msr: edi, out: rsi); out is kept in r8 (esi is the flag).
crate::arch::x86_shared::cpu::rdmsr_safe_asm!(
    "    movq %rsi, %r8
    movl %edi, %ecx",
    "    shlq $32, %rdx
    movl %eax, %eax
    orq %rdx, %rax
    movq %rax, (%r8)
    movl %esi, %eax",
);

/// A #GP in the kernel (`fault=gp`): a non-canonical access.
pub fn raise_gp() {
    // SAFETY: faults on purpose; the exception handler reports and stops.
    unsafe { asm!("mov {0}, [{0}]", inout(reg) 0x8000_0000_0000u64 => _, options(nostack)) }
}
