//! GDT, TSS and IDT of the 32-bit flavour, in the entry area
//! (`.entry.data`, defined in entry.rs) like on x86_64.
//!
//! Selectors follow Linux x86_32 (`arch/x86/include/asm/segment.h`), which
//! is also what SYSENTER/SYSEXIT need: SYSENTER_CS = 0x60, SS = 0x68,
//! SYSEXIT CS = 0x73, SS = 0x7b. As Linux, DS and ES hold USER_DS in kernel
//! mode too (flat, DPL 3, usable at CPL 0), so entries reload no segment.
use core::arch::asm;
use core::ptr::addr_of_mut;

pub const KERNEL_CS: u16 = 0x60;
pub const KERNEL_DS: u16 = 0x68;
pub const USER_CS: u16 = 0x73;
pub const USER_DS: u16 = 0x7b;
pub const TSS_SEL: u16 = 0x80;
const GDT_ENTRIES: usize = 32;
/// The 32-bit TSS as words: ESP0 is word 1, SS0 word 2, the I/O map base
/// the top half of word 25 (Intel SDM vol. 3, 8.2.1).
const TSS_WORDS: usize = 26;

extern "C" {
    static mut entry_gdt: [u64; GDT_ENTRIES];
    static mut entry_tss: [u32; TSS_WORDS];
    static mut entry_idt: [u64; 256];
    static entry_stack_top: u8;
    static exception_stubs: [u32; 32];
    static entry_nmi: u8;
}

/// Top of the per-CPU entry stack (TSS.ESP0 and SYSENTER_ESP with PTI).
pub fn entry_stack_top_addr() -> u64 {
    core::ptr::addr_of!(entry_stack_top) as u64
}

/// Loads the GDT, reloads the segment registers and loads the TSS.
pub fn init_gdt_tss() {
    // SAFETY: single CPU, interrupts off, called once at boot before anything
    // else reads these tables; the descriptors are the architectural
    // encodings of flat 32-bit segments and of the TSS.
    unsafe {
        let gdt = &mut *addr_of_mut!(entry_gdt);
        gdt[12] = 0x00cf_9b00_0000_ffff; // 0x60 kernel code
        gdt[13] = 0x00cf_9300_0000_ffff; // 0x68 kernel data
        gdt[14] = 0x00cf_fb00_0000_ffff; // 0x73 user code
        gdt[15] = 0x00cf_f300_0000_ffff; // 0x7b user data
        let tss = addr_of_mut!(entry_tss) as u64;
        gdt[16] = (TSS_WORDS * 4 - 1) as u64
            | (tss & 0xff_ffff) << 16
            | 0x89 << 40 // present, 32-bit available TSS
            | (tss >> 24 & 0xff) << 56;
        let t = &mut *addr_of_mut!(entry_tss);
        t[1] = entry_stack_top_addr() as u32;
        t[2] = KERNEL_DS as u32;
        t[25] = ((TSS_WORDS * 4) as u32) << 16; // no I/O bitmap
        let base = gdt.as_ptr() as u32;
        let ptr: [u16; 3] = [
            (GDT_ENTRIES * 8 - 1) as u16,
            base as u16,
            (base >> 16) as u16,
        ];
        asm!(
            "lgdt [{ptr}]",
            "push {cs}",
            "lea {tmp}, [2f]",
            "push {tmp}",
            "retf",
            "2:",
            "mov ss, {kds:e}",
            "mov ds, {uds:e}",
            "mov es, {uds:e}",
            "xor {tmp:e}, {tmp:e}",
            "mov fs, {tmp:e}",
            "mov gs, {tmp:e}",
            "ltr {tss:x}",
            ptr = in(reg) ptr.as_ptr(),
            cs = in(reg) KERNEL_CS as u32,
            kds = in(reg) KERNEL_DS as u32,
            uds = in(reg) USER_DS as u32,
            tss = in(reg) TSS_SEL,
            tmp = out(reg) _,
        );
    }
}

/// Sets TSS.ESP0, the stack the CPU switches to on an entry from user mode.
pub fn set_rsp0(top: u64) {
    // SAFETY: single CPU; the CPU reads ESP0 only on the next entry from user mode.
    unsafe { (*addr_of_mut!(entry_tss))[1] = top as u32 }
}

/// Writes IDT gate `vector`: a 32-bit interrupt gate (IF cleared on entry)
/// to `handler`, callable from user mode with `int n` if `dpl` is 3. There
/// is no IST on x86; `_ist` keeps the x86_64 signature.
pub fn set_gate(vector: u8, handler: u64, dpl: u8, _ist: u8) {
    let gate = handler & 0xffff
        | (KERNEL_CS as u64) << 16
        | (0x8e | (dpl as u64 & 3) << 5) << 40
        | (handler >> 16 & 0xffff) << 48;
    // SAFETY: single CPU with interrupts off; the gate is written whole.
    unsafe { (*addr_of_mut!(entry_idt))[vector as usize] = gate }
}

/// Fills the 32 exception gates and loads the IDT.
pub fn init_idt() {
    for v in 0..32u8 {
        // SAFETY: the stub table is immutable data emitted by entry.rs.
        let stub = unsafe { exception_stubs[v as usize] };
        set_gate(v, stub as u64, 0, 0);
    }
    // NMI is not fatal: its paranoid stub saves and restores CR3 and returns.
    set_gate(2, core::ptr::addr_of!(entry_nmi) as u64, 0, 0);
    // SAFETY: the IDT is a static in the entry area, valid for ever.
    unsafe {
        let base = addr_of_mut!(entry_idt) as u32;
        let ptr: [u16; 3] = [256 * 8 - 1, base as u16, (base >> 16) as u16];
        asm!("lidt [{}]", in(reg) ptr.as_ptr(), options(nostack));
    }
}
