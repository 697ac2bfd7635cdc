//! `memcpy`, `memmove`, `memset`, `memcmp`, `bcmp`: the i586-unknown-linux-gnu
//! target expects them from libc, which a kernel does not have. String
//! instructions, one each: short, and no loop for LLVM to turn back into a
//! call to the very function.
use core::arch::asm;

/// # Safety
/// As C's `memcpy`.
#[no_mangle]
pub unsafe extern "C" fn memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller passes valid, non-overlapping ranges; DF is clear.
    unsafe {
        // esi is reserved by LLVM on x86: swapped in and out around the copy.
        asm!("xchg esi, {s}", "rep movsb", "xchg esi, {s}", s = inout(reg) src => _,
             inout("ecx") n => _, inout("edi") dst => _, options(nostack, preserves_flags))
    }
    dst
}

/// # Safety
/// As C's `memmove`.
#[no_mangle]
pub unsafe extern "C" fn memmove(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dst as usize).wrapping_sub(src as usize) >= n {
        // SAFETY: dst is below src or past its end: a forward copy is safe.
        return unsafe { memcpy(dst, src, n) };
    }
    // SAFETY: overlapping with dst above src: copy backwards (DF set, then
    // cleared again as the ABI requires).
    unsafe {
        asm!("xchg esi, {s}", "std", "rep movsb", "cld", "xchg esi, {s}",
             s = inout(reg) src.add(n).wrapping_sub(1) => _, inout("ecx") n => _,
             inout("edi") dst.add(n).wrapping_sub(1) => _, options(nostack))
    }
    dst
}

/// # Safety
/// As C's `memset`.
#[no_mangle]
pub unsafe extern "C" fn memset(dst: *mut u8, c: i32, n: usize) -> *mut u8 {
    // SAFETY: the caller passes a valid range; DF is clear.
    unsafe {
        asm!("rep stosb", inout("ecx") n => _, inout("edi") dst => _, in("al") c as u8,
             options(nostack, preserves_flags))
    }
    dst
}

/// # Safety
/// As C's `memcmp`.
#[no_mangle]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    let mut i = 0;
    while i < n {
        // SAFETY: i < n and the caller passes valid ranges of n bytes.
        let (x, y) = unsafe { (a.add(i).read_volatile(), b.add(i).read_volatile()) };
        if x != y {
            return x as i32 - y as i32;
        }
        i += 1;
    }
    0
}

/// # Safety
/// As `memcmp`.
#[no_mangle]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: delegated.
    unsafe { memcmp(a, b, n) }
}
