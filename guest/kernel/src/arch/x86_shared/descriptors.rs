//! What both flavours' descriptors.rs share: loading a CPU's GDT, its
//! segment registers and its TSS.
use core::arch::asm;

/// The far return of the CS reload, per flavour: the address of the label
/// `2:` into `{tmp}`, and the return's operand size.
#[cfg(target_arch = "x86_64")]
macro_rules! far_return {
    () => {
        "lea {tmp}, [rip + 2f]\npush {tmp}\nretfq"
    };
}
#[cfg(target_arch = "x86")]
macro_rules! far_return {
    () => {
        "lea {tmp}, [2f]\npush {tmp}\nretf"
    };
}

/// Loads the GDT at `base` with `limit` (its size in bytes minus one),
/// reloads CS with `cs` by a far return, SS with `ss`, DS and ES
/// with `ds`, clears GS and loads the task register with `tss`. FS is the
/// flavour's (x86_32: its per-CPU segment; x86_64: null), loaded after.
///
/// # Safety
/// `base` and `limit` must describe a GDT that stays live while the CPU uses it, in
/// which `cs` is a code segment of the current mode, `ss` and `ds` data
/// segments and `tss` an available TSS.
pub unsafe fn load_gdt_tss(base: usize, limit: u16, cs: u16, ss: u16, ds: u16, tss: u16) {
    // The pseudo-descriptor: the limit, then the base in 16-bit words (the
    // 32-bit LGDT reads only the first two of them).
    let b = base as u64;
    let ptr: [u16; 5] = [
        limit,
        b as u16,
        (b >> 16) as u16,
        (b >> 32) as u16,
        (b >> 48) as u16,
    ];
    // SAFETY: delegated to the caller; the far return lands on `2:`.
    unsafe {
        asm!(
            "lgdt [{ptr}]",
            "push {cs}",
            far_return!(),
            "2:",
            "mov ss, {ss:e}",
            "mov ds, {ds:e}",
            "mov es, {ds:e}",
            "xor {tmp:e}, {tmp:e}",
            "mov gs, {tmp:e}",
            "ltr {tss:x}",
            ptr = in(reg) ptr.as_ptr(),
            cs = in(reg) cs as usize,
            ss = in(reg) ss as u32,
            ds = in(reg) ds as u32,
            tss = in(reg) tss,
            tmp = out(reg) _,
        );
    }
}
