//! Control registers, MSRs, CPUID and the like (32-bit). The API matches
//! the x86_64 flavour's (u64 values) so shared code calls both alike.
use core::arch::asm;

pub use crate::arch::x86_shared::cpu::*;

pub const MSR_SYSENTER_CS: u32 = 0x174;
pub const MSR_SYSENTER_ESP: u32 = 0x175;
pub const MSR_SYSENTER_EIP: u32 = 0x176;

/// CPUID.1:EDX[11]: SYSENTER/SYSEXIT.
pub fn has_sep() -> bool {
    cpuid(1, 0).3 & (1 << 11) != 0
}

// rdmsr_safe_raw(msr, out), cdecl: msr at 8(%esp) and out at 12(%esp)
// once esi is saved.
crate::arch::x86_shared::cpu::rdmsr_safe_asm!(
    "    pushl %esi
    movl 8(%esp), %ecx",
    "    movl 12(%esp), %ecx
    movl %eax, (%ecx)
    movl %edx, 4(%ecx)
    movl %esi, %eax
    popl %esi",
);

/// A #GP in the kernel (`fault=gp`): loading DS with a selector beyond the
/// GDT limit (there are no non-canonical addresses in 32-bit mode).
pub fn raise_gp() {
    // SAFETY: faults on purpose before DS changes; the handler reports and stops.
    unsafe { asm!("mov ds, {0:x}", in(reg) 0xfff8u32, options(nostack)) }
}
