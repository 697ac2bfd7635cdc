//! Control registers, MSRs, CPUID and the like (32-bit). The API matches
//! the x86_64 flavour's (u64 values) so shared code calls both alike.
use core::arch::asm;

pub const MSR_ARCH_CAPABILITIES: u32 = 0x10a;
pub const MSR_SYSENTER_CS: u32 = 0x174;
pub const MSR_SYSENTER_ESP: u32 = 0x175;
pub const MSR_SYSENTER_EIP: u32 = 0x176;
pub const CR4_PGE: u64 = 1 << 7;
/// Never set on this flavour (PAE has no PCID); shared code names it.
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
/// The caller keeps paging consistent (PGE changes flush the TLB).
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
    let r = core::arch::x86::__cpuid_count(leaf, sub);
    (r.eax, r.ebx, r.ecx, r.edx)
}

pub fn max_leaf() -> u32 {
    cpuid(0, 0).0
}

/// CPUID.1:EDX[11]: SYSENTER/SYSEXIT.
pub fn has_sep() -> bool {
    cpuid(1, 0).3 & (1 << 11) != 0
}

/// CPUID.80000001h:EDX[20]: NX (the boot code set EFER.NXE if so).
pub fn has_nx() -> bool {
    cpuid(0x8000_0000, 0).0 >= 0x8000_0001 && cpuid(0x8000_0001, 0).3 & (1 << 20) != 0
}

core::arch::global_asm!(
    r#"
    .section .text.rdmsr_safe, "ax"
    /* rdmsr_safe_raw(msr, out) -> eax: 1 if read, 0 if it faulted (cdecl).
     * On #GP at rdmsr_safe_insn the exception handler skips the RDMSR and
     * clears esi (see exceptions.rs). */
    .global rdmsr_safe_raw
rdmsr_safe_raw:
    pushl %esi
    movl 8(%esp), %ecx
    movl $1, %esi
    .global rdmsr_safe_insn
rdmsr_safe_insn:
    rdmsr
    movl 12(%esp), %ecx
    movl %eax, (%ecx)
    movl %edx, 4(%ecx)
    movl %esi, %eax
    popl %esi
    ret
    .previous
"#,
    options(att_syntax)
);

extern "C" {
    fn rdmsr_safe_raw(msr: u32, out: *mut u64) -> u32;
}

/// RDMSR that returns `None` instead of faulting (Linux: `rdmsrl_safe`).
pub fn rdmsr_safe(msr: u32) -> Option<u64> {
    let mut v = 0;
    // SAFETY: RDMSR has no memory effects; a #GP is fixed up; `v` is valid.
    let ok = unsafe { rdmsr_safe_raw(msr, &mut v) };
    (ok != 0).then_some(v)
}

/// IA32_ARCH_CAPABILITIES, read as on x86_64 (see there).
pub fn arch_capabilities() -> Option<u64> {
    if max_leaf() >= 7 && cpuid(7, 0).3 & (1 << 29) != 0 {
        // SAFETY: the MSR exists, CPUID says so.
        return Some(unsafe { rdmsr(MSR_ARCH_CAPABILITIES) });
    }
    rdmsr_safe(MSR_ARCH_CAPABILITIES)
}

/// A #GP in the kernel (`fault=gp`): loading DS with a selector beyond the
/// GDT limit (there are no non-canonical addresses in 32-bit mode).
pub fn raise_gp() {
    // SAFETY: faults on purpose before DS changes; the handler reports and stops.
    unsafe { asm!("mov ds, {0:x}", in(reg) 0xfff8u32, options(nostack)) }
}

/// `cli; hlt` for ever.
pub fn halt_forever() -> ! {
    loop {
        // SAFETY: stops the CPU; nothing to break.
        unsafe { asm!("cli", "hlt", options(nomem, nostack)) }
    }
}
