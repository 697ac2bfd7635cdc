//! GDT, TSS and IDT of the 32-bit flavour, in the entry area
//! (`.entry.data`, defined in entry.rs) like on x86_64.
//!
//! Selectors follow Linux x86_32 (`arch/x86/include/asm/segment.h`), which
//! is also what SYSENTER/SYSEXIT need: SYSENTER_CS = 0x60, SS = 0x68,
//! SYSEXIT CS = 0x73, SS = 0x7b. As Linux, DS and ES hold USER_DS in kernel
//! mode too (flat, DPL 3, usable at CPL 0), so entries reload no segment.
use crate::arch::x86_shared::descriptors::load_gdt_tss;
use core::arch::asm;
use core::ptr::addr_of_mut;

pub const KERNEL_CS: u16 = 0x60;
pub const KERNEL_DS: u16 = 0x68;
pub const USER_CS: u16 = 0x73;
pub const USER_DS: u16 = 0x7b;
pub const TSS_SEL: u16 = 0x80;
/// The per-CPU data segment (Linux x86_32's `__KERNEL_PERCPU` slot, GDT
/// entry 27), held in FS: its base is this CPU's telemetry counter block
/// (`percpu::segment_base`), so the entry code counts with `addl/adcl %fs:off`.
/// DPL 3 (Linux's is DPL 0 and reloaded on every entry): IRET to user mode
/// nulls data segment registers whose DPL is below 3, and this kernel keeps
/// FS loaded in user mode too so that no entry reloads it, as DS/ES hold
/// USER_DS. User code can use it only to reach pages the user copy does not
/// map (or maps kernel-only): the telemetry page and kernel data.
pub const PERCPU_SEL: u16 = 27 << 3 | 3;
const GDT_ENTRIES: usize = 32;
/// The 32-bit TSS as words: ESP0 is word 1, SS0 word 2, the I/O map base
/// the top half of word 25 (Intel SDM vol. 3, 8.2.1).
const TSS_WORDS: usize = 26;

extern "C" {
    static mut entry_gdt: [u64; GDT_ENTRIES];
    static mut entry_tss: [u32; TSS_WORDS];
    static mut entry_idt: [u64; 256];
    static entry_stack_top: u8;
}

/// Bytes of an AP's entry stack (TSS.ESP0 and SYSENTER_ESP with PTI).
const AP_ENTRY_STACK: usize = 4096 - 384;

/// The entry area of CPUs 1..7: one page each.
#[repr(C, align(4096))]
pub struct ApArea {
    gdt: [u64; GDT_ENTRIES],
    tss: [u32; TSS_WORDS],
    _pad: [u8; 128 - TSS_WORDS * 4],
    entry_stack: [u8; AP_ENTRY_STACK],
}
const _: () = assert!(core::mem::size_of::<ApArea>() == 4096);

extern "C" {
    static mut entry_cpu_areas: [ApArea; ptiscope_abi::telemetry::MAX_CPUS - 1];
}

/// CPU `cpu`'s GDT, TSS and entry stack top (CPU 0: the statics of entry.rs).
fn tables(cpu: usize) -> (*mut [u64; GDT_ENTRIES], *mut [u32; TSS_WORDS], u64) {
    if cpu == 0 {
        (
            addr_of_mut!(entry_gdt),
            addr_of_mut!(entry_tss),
            core::ptr::addr_of!(entry_stack_top) as u64,
        )
    } else {
        // SAFETY: only addresses of the statics are taken; callers pass a
        // CPU index below MAX_CPUS (checked by the index).
        unsafe {
            let a = addr_of_mut!(entry_cpu_areas[cpu - 1]);
            (
                addr_of_mut!((*a).gdt),
                addr_of_mut!((*a).tss),
                addr_of_mut!((*a).entry_stack) as u64 + AP_ENTRY_STACK as u64,
            )
        }
    }
}

/// Top of CPU `cpu`'s entry stack (TSS.ESP0 and SYSENTER_ESP with PTI).
pub fn entry_stack_top_of(cpu: usize) -> u64 {
    tables(cpu).2
}

/// CPU 0's GDT and TSS (see [`init_gdt_tss_for`]).
pub fn init_gdt_tss() {
    init_gdt_tss_for(0)
}

/// Fills CPU `cpu`'s GDT and TSS, loads them, reloads the segment
/// registers (FS = this CPU's per-CPU segment) and loads the TSS. Runs on
/// that CPU, first thing, with interrupts off.
pub fn init_gdt_tss_for(cpu: usize) {
    let (gdt, tss, stack_top) = tables(cpu);
    let fs_base = super::percpu::segment_base(cpu);
    // SAFETY: CPU `cpu`'s tables are written only here, by that CPU, before
    // it loads them; the descriptors are the architectural encodings of flat
    // 32-bit segments, of a based data segment and of the TSS.
    unsafe {
        let gdt = &mut *gdt;
        gdt[12] = 0x00cf_9b00_0000_ffff; // 0x60 kernel code
        gdt[13] = 0x00cf_9300_0000_ffff; // 0x68 kernel data
        gdt[14] = 0x00cf_fb00_0000_ffff; // 0x73 user code
        gdt[15] = 0x00cf_f300_0000_ffff; // 0x7b user data
        let t = tss as u64;
        gdt[16] = (TSS_WORDS * 4 - 1) as u64
            | (t & 0xff_ffff) << 16
            | 0x89 << 40 // present, 32-bit available TSS
            | (t >> 24 & 0xff) << 56;
        // 0xdb: data, writable, DPL 3, 4 GiB limit (offsets wrap around
        // the base, as Linux's per-CPU offsets do), base = fs_base.
        gdt[27] =
            0x00cf_f300_0000_ffff | (fs_base & 0xff_ffff) << 16 | (fs_base >> 24 & 0xff) << 56;
        let t = &mut *tss;
        t[1] = stack_top as u32;
        t[2] = KERNEL_DS as u32;
        t[25] = ((TSS_WORDS * 4) as u32) << 16; // no I/O bitmap
        let (base, limit) = (gdt.as_ptr() as usize, (GDT_ENTRIES * 8 - 1) as u16);
        // SS the kernel's data segment, DS/ES the flat user one (as Linux
        // x86_32 keeps them).
        load_gdt_tss(base, limit, KERNEL_CS, KERNEL_DS, USER_DS, TSS_SEL);
        // FS, the per-CPU segment, apart: the shared load leaves it to the
        // flavour.
        asm!("mov fs, {:e}", in(reg) PERCPU_SEL as u32, options(nostack, preserves_flags));
    }
}

/// Sets this CPU's TSS.ESP0, the stack the CPU switches to on an entry
/// from user mode.
pub fn set_rsp0(top: u64) {
    let tss = tables(super::percpu::cpu()).1;
    // SAFETY: this CPU's TSS, written only by this CPU; it reads ESP0 only
    // on the next entry from user mode.
    unsafe { (*tss)[1] = top as u32 }
}

/// Writes IDT gate `vector`: a 32-bit interrupt gate (IF cleared on entry)
/// to `handler`, callable from user mode with `int n` if `dpl` is 3. There
/// is no IST on x86; `_ist` keeps the x86_64 signature.
pub fn set_gate(vector: u8, handler: u64, dpl: u8, _ist: u8) {
    let gate = handler & 0xffff
        | (KERNEL_CS as u64) << 16
        | (0x8e | (dpl as u64 & 3) << 5) << 40
        | (handler >> 16 & 0xffff) << 48;
    // SAFETY: interrupts are off; the IDT is shared, and with several CPUs
    // a gate is rewritten only with the value it already has (the run's
    // entry mode) except by the one-CPU PTI opt-out, so a CPU reading it
    // meanwhile never sees a mix of two different gates.
    unsafe { (*addr_of_mut!(entry_idt))[vector as usize] = gate }
}

/// Loads the IDT. Its 32 exception gates are written at link time
/// (entry.rs: `ENTRY_DATA`, `EXC_GATE`), NMI's to its paranoid stub (not
/// fatal: it saves and restores CR3 and returns).
pub fn init_idt() {
    load_idt();
}

/// Loads the (shared) IDT on this CPU.
pub fn load_idt() {
    // SAFETY: the IDT is a static in the entry area, valid for ever.
    unsafe {
        let base = addr_of_mut!(entry_idt) as u32;
        let ptr: [u16; 3] = [256 * 8 - 1, base as u16, (base >> 16) as u16];
        asm!("lidt [{}]", in(reg) ptr.as_ptr(), options(nostack));
    }
}
