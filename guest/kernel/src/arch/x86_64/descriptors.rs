//! GDT, TSS and IDT. They live in the entry area (`.entry.data`, defined in
//! `entry.rs`) because the CPU reads them on every entry from user mode,
//! while the user copy of the page tables is still loaded when PTI is on.
//!
//! Selectors follow Linux (`arch/x86/include/asm/segment.h`) so that
//! SYSCALL/SYSRET work with STAR[47:32] = 0x10 and STAR[63:48] = 0x23.
use crate::arch::x86_shared::descriptors::load_gdt_tss;
use core::arch::asm;
use core::ptr::addr_of_mut;

pub const KERNEL_CS: u16 = 0x10;
pub const KERNEL_DS: u16 = 0x18;
pub const USER32_CS: u16 = 0x23;
pub const USER_DS: u16 = 0x2b;
pub const USER_CS: u16 = 0x33;
pub const TSS_SEL: u16 = 0x40;
const GDT_ENTRIES: usize = 10;

/// IST slots (1-based as in the IDT gate).
pub const IST_DF: u8 = 1;
pub const IST_NMI: u8 = 2;
pub const IST_MC: u8 = 3;

/// The 64-bit TSS (Intel SDM vol. 3, 8.7).
#[repr(C, packed(4))]
pub struct Tss {
    _reserved0: u32,
    pub rsp: [u64; 3],
    _reserved1: u64,
    pub ist: [u64; 7],
    _reserved2: u64,
    _reserved3: u16,
    pub iomap_base: u16,
}
const _: () = assert!(core::mem::size_of::<Tss>() == 104);

extern "C" {
    static mut entry_gdt: [u64; GDT_ENTRIES];
    static mut entry_tss: Tss;
    static mut entry_idt: [[u64; 2]; 256];
    static entry_stack_top: u8;
    static ist_df_top: u8;
    static ist_nmi_top: u8;
    static ist_mc_top: u8;
}

/// The entry area of CPUs 1..7: one page each.
#[repr(C, align(4096))]
pub struct ApArea {
    pub gdt: [u64; GDT_ENTRIES],
    _pad0: [u8; 128 - GDT_ENTRIES * 8],
    pub tss: Tss,
    _pad1: [u8; 256 - 128 - 104],
    /// Entry stack (TSS.RSP0 with PTI); its top is `ist_df`'s bottom.
    pub entry_stack: [u8; 1792],
    pub ist_df: [u8; 1024],
    pub ist_nmi: [u8; 512],
    pub ist_mc: [u8; 512],
}
const _: () = assert!(core::mem::size_of::<ApArea>() == 4096);

extern "C" {
    static mut entry_cpu_areas: [ApArea; ptiscope_abi::telemetry::MAX_CPUS - 1];
}

/// The descriptor tables and stacks of one CPU.
struct CpuTables {
    gdt: *mut [u64; GDT_ENTRIES],
    tss: *mut Tss,
    entry_stack_top: u64,
    ist: [u64; 3],
}

fn tables(cpu: usize) -> CpuTables {
    if cpu == 0 {
        CpuTables {
            gdt: addr_of_mut!(entry_gdt),
            tss: addr_of_mut!(entry_tss),
            entry_stack_top: core::ptr::addr_of!(entry_stack_top) as u64,
            ist: [
                core::ptr::addr_of!(ist_df_top) as u64,
                core::ptr::addr_of!(ist_nmi_top) as u64,
                core::ptr::addr_of!(ist_mc_top) as u64,
            ],
        }
    } else {
        // SAFETY: only addresses of the statics are taken (cpu - 1 < 7:
        // callers pass an online CPU's index).
        unsafe {
            let a = addr_of_mut!(entry_cpu_areas[cpu - 1]);
            let end = |p: *mut u8, len: usize| p as u64 + len as u64;
            CpuTables {
                gdt: addr_of_mut!((*a).gdt),
                tss: addr_of_mut!((*a).tss),
                entry_stack_top: end(addr_of_mut!((*a).entry_stack).cast(), 1792),
                ist: [
                    end(addr_of_mut!((*a).ist_df).cast(), 1024),
                    end(addr_of_mut!((*a).ist_nmi).cast(), 512),
                    end(addr_of_mut!((*a).ist_mc).cast(), 512),
                ],
            }
        }
    }
}

/// Top of CPU `cpu`'s entry stack (TSS.RSP0 when PTI is on).
pub fn entry_stack_top_of(cpu: usize) -> u64 {
    tables(cpu).entry_stack_top
}

/// Top of this CPU's entry stack (TSS.RSP0 when PTI is on).
pub fn entry_stack_top_addr() -> u64 {
    super::percpu::entry_stack_top()
}

/// Loads CPU 0's GDT, reloads the segment registers and loads its TSS.
pub fn init_gdt_tss() {
    init_gdt_tss_for(0)
}

/// Loads CPU `cpu`'s GDT (its own: the TSS descriptor is per CPU),
/// reloads the segment registers and loads its TSS.
pub fn init_gdt_tss_for(cpu: usize) {
    let tbl = tables(cpu);
    // SAFETY: called once per CPU at its boot, interrupts off, before
    // anything else reads this CPU's tables; the descriptors written are the
    // architectural encodings of flat 64-bit segments and of the TSS.
    unsafe {
        let gdt = &mut *tbl.gdt;
        gdt[1] = 0x00cf_9b00_0000_ffff; // 0x08 kernel 32-bit code (unused, as Linux)
        gdt[2] = 0x00af_9b00_0000_ffff; // 0x10 kernel code, L=1
        gdt[3] = 0x00cf_9300_0000_ffff; // 0x18 kernel data
        gdt[4] = 0x00cf_fb00_0000_ffff; // 0x23 user 32-bit code
        gdt[5] = 0x00cf_f300_0000_ffff; // 0x2b user data
        gdt[6] = 0x00af_fb00_0000_ffff; // 0x33 user code, L=1
        let tss = tbl.tss as u64;
        let limit = (core::mem::size_of::<Tss>() - 1) as u64;
        gdt[8] = limit & 0xffff
            | (tss & 0xff_ffff) << 16
            | 0x89 << 40 // present, 64-bit available TSS
            | (tss >> 24 & 0xff) << 56;
        gdt[9] = tss >> 32;
        let t = &mut *tbl.tss;
        t.ist[(IST_DF - 1) as usize] = tbl.ist[0];
        t.ist[(IST_NMI - 1) as usize] = tbl.ist[1];
        t.ist[(IST_MC - 1) as usize] = tbl.ist[2];
        t.iomap_base = core::mem::size_of::<Tss>() as u16; // no I/O bitmap
        t.rsp[0] = tbl.entry_stack_top;

        let (base, limit) = (gdt.as_ptr() as usize, (GDT_ENTRIES * 8 - 1) as u16);
        load_gdt_tss(base, limit, KERNEL_CS, KERNEL_DS, KERNEL_DS, TSS_SEL);
        // A null FS (its base is unused on x86_64).
        asm!("mov fs, {:e}", in(reg) 0u32, options(nostack, preserves_flags));
    }
}

/// Sets this CPU's TSS.RSP0, the stack it switches to on an entry from user mode.
pub fn set_rsp0(top: u64) {
    let tss = tables(super::percpu::cpu()).tss;
    // SAFETY: this CPU's own TSS; it reads RSP0 only on the next entry from user mode.
    unsafe { (*tss).rsp[0] = top }
}

/// Loads the (shared) IDT on this CPU.
pub fn load_idt() {
    // SAFETY: the IDT is a static in the entry area; the pointer is valid
    // for the whole life of the kernel.
    unsafe {
        let base = addr_of_mut!(entry_idt) as u64;
        let ptr: [u16; 5] = [
            4095,
            base as u16,
            (base >> 16) as u16,
            (base >> 32) as u16,
            (base >> 48) as u16,
        ];
        asm!("lidt [{}]", in(reg) ptr.as_ptr(), options(nostack));
    }
}

/// IDT gate descriptor: a 64-bit interrupt gate (IF cleared on entry) to
/// `handler`, callable from user mode with `int n` if `dpl` is 3.
const fn gate(handler: u64, dpl: u8, ist: u8) -> [u64; 2] {
    let lo = handler & 0xffff
        | (KERNEL_CS as u64) << 16
        | (ist as u64 & 7) << 32
        | (0x8e | (dpl as u64 & 3) << 5) << 40
        | (handler >> 16 & 0xffff) << 48;
    [lo, handler >> 32]
}

/// Writes IDT gate `vector`: [`gate`]`(handler, dpl, ist)`.
pub fn set_gate(vector: u8, handler: u64, dpl: u8, ist: u8) {
    // SAFETY: single CPU with interrupts off; the gate is written whole
    // before any user code could raise the vector.
    unsafe { (*addr_of_mut!(entry_idt))[vector as usize] = gate(handler, dpl, ist) }
}

/// Loads the IDT. Its 32 exception gates are written at link time
/// (entry.rs: `ENTRY_DATA`, `EXC_GATE`; the linker script splits the
/// handlers' addresses into the gates' pieces), NMI's to its paranoid stub
/// (it is not fatal: it saves and restores CR3 and returns): no loop at
/// boot, where each instruction is emulated on software-KVM hosts.
pub fn init_idt() {
    load_idt();
}
