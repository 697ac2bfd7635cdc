//! Port I/O. Every access is a VM exit (~9 µs on kvm_pvm, a software KVM).
use core::arch::asm;

/// Not `nomem`: the VMM answers the exit and phase-marker ports by reading
/// guest memory (the telemetry page), so every store before the write must
/// have happened (`readonly` keeps the compiler from sinking one past it).
#[inline(always)]
pub fn outl(port: u16, value: u32) {
    // SAFETY: as for `outb`.
    unsafe {
        asm!("out dx, eax", in("dx") port, in("eax") value, options(readonly, nostack, preserves_flags))
    }
}

/// Writes `bytes` to `port` with one `rep outsb`: one instruction to
/// emulate and one VM exit per string instead of one per byte.
#[inline(always)]
pub fn outsb(port: u16, bytes: &[u8]) {
    // SAFETY: reads `bytes.len()` bytes from `bytes` (DF is clear, as the
    // ABI guarantees in kernel code); the port is ours by the VMM contract.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        asm!("rep outsb", in("dx") port, inout("rsi") bytes.as_ptr() => _,
             inout("rcx") bytes.len() => _, options(nostack, preserves_flags, readonly))
    }
    // SAFETY: as above.
    #[cfg(target_arch = "x86")]
    unsafe {
        // esi is reserved by LLVM on x86: swapped in and out around the string.
        asm!("xchg esi, {s}", "rep outsb", "xchg esi, {s}", s = inout(reg) bytes.as_ptr() => _,
             in("dx") port, inout("ecx") bytes.len() => _, options(nostack, preserves_flags, readonly))
    }
}
