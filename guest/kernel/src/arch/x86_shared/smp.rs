//! What both flavours' SMP code shares: the local APIC (xAPIC, MMIO) and
//! its IPIs, the count of CPUs online, and starting an AP: copying the
//! trampoline, INIT/SIPI with its retry, the AP's first Rust code. The
//! trampoline's real-mode start, its GDT and its handover words are GAS
//! macros here ([`ap_trampoline_macros!`], spliced in by [`smp_asm!`]), and
//! the loops of `init_bsp` and `start_aps` are [`init_bsp_with`] and
//! [`start_aps_with`]; the rest of the trampoline (which brings an AP to its
//! flavour's paging mode), the handover record's values, the LAPIC mapping
//! and `entry_ipi` stay in each flavour's `smp.rs`.
use crate::arch::layout::TELEMETRY_VA;
use core::arch::asm;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use ptiscope_abi::telemetry::Counter;

/// The part of the AP trampolines both flavours share, as GAS macros taking
/// the trampoline's physical address `tp` (Linux: `trampoline_32.S` /
/// `trampoline_64.S`' common start):
/// * `AP_TRAMPOLINE_START tp`: the `ap_trampoline` label in
///   `.rodata.ap_trampoline`; real mode (CS = `tp >> 4`, IP = 0) → `lgdt` of
///   the trampoline's GDT → 32-bit protected mode at `tr_pm32` → flat data
///   segments, CR3 = the handover's `tr_cr3`, CR4.PAE; the flavour goes on
///   from there (EFER, paging, its jump);
/// * `AP_TRAMPOLINE_GDT tp, long`: the trampoline's GDT (null, 32-bit code
///   0x08, data 0x10, with `long` = 1 also 64-bit code 0x18) and its
///   pointer `tr_gdt_ptr`;
/// * `AP_TRAMPOLINE_HANDOVER word, align`: the handover words the BSP
///   fills before each SIPI (`ap_trampoline_handover`: `tr_cr3`, `tr_efer`,
///   `tr_entry`, `tr_stack`, `tr_cpu`, each a `word`, the flavour's
///   `ApHandover`) and `ap_trampoline_end`;
/// * `AP_TRAMPOLINE_END tp, sfx, entry, sp, cpu, long, word, align`: the
///   jump to `ap_start*` (entry, stack and CPU index loaded from the
///   handover words), then the GDT and the handover words.
///
/// [`smp_asm!`] splices them into the flavour's asm block and purges them.
macro_rules! ap_trampoline_macros {
    () => {
        r#"
    .macro AP_TRAMPOLINE_START tp
    .section .rodata.ap_trampoline, "a"
    .balign 16
    .global ap_trampoline
ap_trampoline:
    .code16
    cli
    cld
    movw %cs, %ax
    movw %ax, %ds
    lgdtl (tr_gdt_ptr - ap_trampoline)
    movl %cr0, %eax
    orl $1, %eax
    movl %eax, %cr0
    ljmpl $0x08, $\tp + (tr_pm32 - ap_trampoline)

    .code32
tr_pm32:
    movl $0x10, %eax
    movl %eax, %ds
    movl %eax, %es
    movl %eax, %ss
    movl (\tp + (tr_cr3 - ap_trampoline)), %eax
    movl %eax, %cr3
    movl %cr4, %eax
    orl $0xa0, %eax                 /* PAE | PGE: before paging, see x86/boot.rs */
    movl %eax, %cr4
    .endm

    .macro AP_TRAMPOLINE_GDT tp, long
    .balign 8
tr_gdt:
    .quad 0
    .quad 0x00cf9a000000ffff        /* 0x08: 32-bit code */
    .quad 0x00cf92000000ffff        /* 0x10: data */
    .if \long
    .quad 0x00af9a000000ffff        /* 0x18: 64-bit code */
    .endif
tr_gdt_end:
    .word 0
tr_gdt_ptr:
    .word tr_gdt_end - tr_gdt - 1
    .long \tp + (tr_gdt - ap_trampoline)
    .endm

    /* The trampoline's end: the jump to the flavour's `ap_start*` with the
     * stack and the CPU index from the handover words (`sfx` the load's
     * size, `entry sp cpu` the registers), its GDT and the handover words. */
    .macro AP_TRAMPOLINE_END tp, sfx, entry, sp, cpu, long, word, align
    mov\sfx (\tp + (tr_entry - ap_trampoline)), %\entry
    mov\sfx (\tp + (tr_stack - ap_trampoline)), %\sp
    mov\sfx (\tp + (tr_cpu - ap_trampoline)), %\cpu
    jmp *%\entry
    AP_TRAMPOLINE_GDT \tp, \long
    AP_TRAMPOLINE_HANDOVER \word, \align
    .endm

    .macro AP_TRAMPOLINE_HANDOVER word, align
    .balign \align
    /* Handed over by the BSP before each SIPI (ApHandover). */
    .global ap_trampoline_handover
ap_trampoline_handover:
tr_cr3:   \word 0
tr_efer:  \word 0
tr_entry: \word 0
tr_stack: \word 0
tr_cpu:   \word 0
    .global ap_trampoline_end
ap_trampoline_end:
    .endm
"#
    };
}
pub(crate) use ap_trampoline_macros;

/// `smp_asm!(body, iret)`: a flavour's SMP asm block: the trampoline
/// macros, `body` (the trampoline from `AP_TRAMPOLINE_START tp`, `ap_start*`
/// and `entry_ipi`, which may name `tp`, `ctr_interrupts` and `eoi`), then
/// `entry_spurious` (a bare `iret`, the flavour's) and the purges.
macro_rules! smp_asm {
    ($body:expr, $iret:literal $(,)?) => {
        core::arch::global_asm!(
            $crate::arch::x86_shared::smp::ap_trampoline_macros!(),
            $body,
            concat!(
                "
    .balign 16
    .global entry_spurious
entry_spurious:
    ",
                $iret,
                "
    .previous
    .purgem AP_TRAMPOLINE_START
    .purgem AP_TRAMPOLINE_GDT
    .purgem AP_TRAMPOLINE_HANDOVER
    .purgem AP_TRAMPOLINE_END
"
            ),
            tp = const $crate::arch::x86_shared::smp::TRAMPOLINE_PHYS,
            ctr_interrupts = const ptiscope_abi::telemetry::Counter::Interrupts.offset_in_block(),
            eoi = const $crate::arch::x86_shared::smp::LAPIC_VA
                + $crate::arch::x86_shared::smp::LAPIC_EOI,
            options(att_syntax)
        );
    };
}
pub(crate) use smp_asm;

/// Physical page of the real-mode trampoline (SIPI vector 0x08).
pub const TRAMPOLINE_PHYS: u64 = 0x8000;
/// Kernel stack of an AP's idle context (and its boot).
const AP_STACK_PAGES: u64 = 4;
/// Stack for an AP's fatal-exception report.
const AP_FAULT_STACK_PAGES: u64 = 4;

/// The local APIC's physical base (IA32_APIC_BASE default).
pub const LAPIC_PHYS: u64 = 0xfee0_0000;
/// Where the kernel maps the LAPIC: the page after the telemetry page
/// (kernel copy only; uncached).
pub const LAPIC_VA: u64 = TELEMETRY_VA + 0x1000;
/// The wake-up IPI.
pub const IPI_VECTOR: u8 = 0xf0;
/// The LAPIC's spurious-interrupt vector.
pub const SPURIOUS_VECTOR: u8 = 0xff;

/// LAPIC registers (offsets in its MMIO page).
pub const LAPIC_ID: u64 = 0x20;
/// End of interrupt.
pub const LAPIC_EOI: u64 = 0xb0;
const LAPIC_SVR: u64 = 0xf0;
const LAPIC_LVT_LINT0: u64 = 0x350;
const LVT_MASKED: u32 = 1 << 16;
const LAPIC_ICR_LO: u64 = 0x300;
const LAPIC_ICR_HI: u64 = 0x310;
/// ICR: delivery status (send pending).
const ICR_PENDING: u32 = 1 << 12;
/// ICR delivery modes: INIT, start-up (SIPI), fixed vector.
pub const ICR_INIT: u32 = 0x0000_4500;
/// Start-up IPI; the vector is the trampoline's page number.
pub const ICR_SIPI: u32 = 0x0000_4600;
/// A fixed-vector IPI.
pub const ICR_FIXED: u32 = 0x0000_4000;

/// CPUs online: the boot CPU from the start.
pub(crate) static ONLINE: AtomicUsize = AtomicUsize::new(1);
/// CPUs the command line asked for.
pub(crate) static CPUS: AtomicUsize = AtomicUsize::new(1);
/// Wake-up IPIs sent (all CPUs); received ones count as `interrupts`.
pub static IPIS_SENT: AtomicU64 = AtomicU64::new(0);

/// Reads a LAPIC register.
pub fn lapic_read(reg: u64) -> u32 {
    // SAFETY: LAPIC_VA maps the LAPIC's MMIO page (each flavour's
    // init_bsp maps it before any CPU uses it); 32-bit aligned.
    unsafe { ((LAPIC_VA + reg) as usize as *const u32).read_volatile() }
}

/// Writes a LAPIC register.
pub fn lapic_write(reg: u64, v: u32) {
    // SAFETY: as for lapic_read.
    unsafe { ((LAPIC_VA + reg) as usize as *mut u32).write_volatile(v) }
}

/// Enables this CPU's LAPIC (spurious vector, software enable) with LINT0
/// masked. Firmware may leave the BSP in virtual-wire mode (LINT0 = ExtINT
/// from the 8259 PIC, whose IRQ 0 is vector 8 as a BIOS sets it), so a PIT
/// tick pending at the idle `sti; hlt` would arrive as vector 8 and be taken
/// for a double fault (seen under QEMU `-M pc`). The kernel uses no legacy
/// interrupts: masking LINT0 keeps the wake-up IPI the only one.
pub fn lapic_enable() {
    lapic_write(LAPIC_LVT_LINT0, LVT_MASKED);
    lapic_write(LAPIC_SVR, 0x100 | SPURIOUS_VECTOR as u32);
}

/// Sends `icr` to the LAPIC with id `apic_id`, after any pending send.
pub fn send_ipi(apic_id: u32, icr: u32) {
    while lapic_read(LAPIC_ICR_LO) & ICR_PENDING != 0 {
        core::hint::spin_loop();
    }
    lapic_write(LAPIC_ICR_HI, apic_id << 24);
    lapic_write(LAPIC_ICR_LO, icr);
}

/// CPUs online.
pub fn online() -> usize {
    ONLINE.load(Ordering::Acquire)
}

/// CPUs asked for (`cpus=`).
pub fn cpus() -> usize {
    CPUS.load(Ordering::Relaxed)
}

/// Wakes CPU `cpu` from [`idle_wait`] (a no-op for this CPU or one not online).
pub fn wake_cpu(cpu: usize) {
    if cpu == crate::arch::percpu::cpu() || cpu >= online() {
        return;
    }
    IPIS_SENT.fetch_add(1, Ordering::Relaxed);
    send_ipi(cpu as u32, ICR_FIXED | IPI_VECTOR as u32);
}

/// Waits for an interrupt with interrupts enabled for that one instant:
/// `sti; hlt` is atomic with respect to interrupt delivery (STI's shadow),
/// so a wake-up sent after the caller found nothing to do is not lost.
pub fn idle_wait() {
    // SAFETY: the only interrupt source is the wake-up IPI, whose gate
    // (entry_ipi) returns here; IF is cleared again right after.
    unsafe { asm!("sti", "hlt", "cli", options(nostack)) }
}

/// Spins until `n` CPUs are online, at most `spins` times.
pub fn wait_online(n: usize, spins: u64) -> bool {
    for _ in 0..spins {
        if online() >= n {
            return true;
        }
        core::hint::spin_loop();
    }
    online() >= n
}

/// The kernel virtual address just above `pages` pages from `phys` (a stack
/// top in the direct map).
pub fn phys_top(phys: u64, pages: u64) -> u64 {
    match crate::arch::layout::phys_to_virt(phys) {
        Some(v) => v + pages * 4096,
        None => panic!("a stack outside the direct map"),
    }
}

extern "C" {
    // The flavour's trampoline (its smp.rs): the bytes copied to
    // TRAMPOLINE_PHYS, and the handover words the BSP fills for each AP.
    static ap_trampoline: u8;
    static ap_trampoline_handover: u8;
    static ap_trampoline_end: u8;
}

/// Copies the flavour's real-mode trampoline to [`TRAMPOLINE_PHYS`].
pub fn copy_trampoline() {
    // SAFETY: the trampoline is a byte range of the kernel's .rodata; the
    // destination is low RAM nothing else uses after boot (free below the
    // VMM's start_info at 0x6000/0x7000; QEMU's firmware is done by then),
    // reached through the direct map.
    unsafe {
        let start = core::ptr::addr_of!(ap_trampoline);
        let len = core::ptr::addr_of!(ap_trampoline_end) as usize - start as usize;
        assert!(len <= 4096);
        let dst = (crate::arch::layout::KERNEL_BASE + TRAMPOLINE_PHYS) as usize as *mut u8;
        core::ptr::copy_nonoverlapping(start, dst, len);
    }
}

/// The top of a new AP's kernel stack (its idle context and its boot).
pub fn ap_stack_top(n: usize) -> u64 {
    let Some(stack) = crate::mm::alloc_contiguous(AP_STACK_PAGES) else {
        panic!("out of memory for CPU {n}'s stack");
    };
    phys_top(stack, AP_STACK_PAGES)
}

/// Starts CPU `n` (its LAPIC id): writes `handover` into the copied
/// trampoline, sends INIT and SIPI, and waits until the CPU is online; a
/// real CPU may miss the first SIPI, so a second one follows (KVM and QEMU
/// ignore it for a CPU that already started). `false` (and a message) if
/// it did not come online.
///
/// # Safety
/// `H` must be the flavour's handover record, laid out as the words at
/// `ap_trampoline_handover`, and [`copy_trampoline`] must have run.
pub unsafe fn start_cpu<H>(n: usize, handover: H) -> bool {
    let off = core::ptr::addr_of!(ap_trampoline_handover) as u64
        - core::ptr::addr_of!(ap_trampoline) as u64;
    let va = crate::arch::layout::KERNEL_BASE + TRAMPOLINE_PHYS + off;
    // SAFETY: the caller guarantees the trampoline page was copied and that
    // `H` is the layout of its handover words, which lie inside that page.
    unsafe { (va as usize as *mut H).write_volatile(handover) };
    let before = online();
    send_ipi(n as u32, ICR_INIT);
    send_ipi(n as u32, ICR_SIPI | (TRAMPOLINE_PHYS >> 12) as u32);
    if wait_online(before + 1, 2_000_000) {
        return true;
    }
    send_ipi(n as u32, ICR_SIPI | (TRAMPOLINE_PHYS >> 12) as u32);
    if wait_online(before + 1, 20_000_000) {
        return true;
    }
    crate::println!("CPU {n} did not come online after INIT/SIPI");
    false
}

/// Starts CPUs 1..cpus one after the other (each flavour's `start_aps`);
/// returns how many are online. After the trampoline is copied,
/// `handovers()` gives the function that makes CPU `n`'s handover record.
///
/// # Safety
/// `H` must be the flavour's handover record, as for [`start_cpu`].
pub unsafe fn start_aps_with<H, F: Fn(usize) -> H>(handovers: impl FnOnce() -> F) -> usize {
    let cpus = cpus();
    if cpus <= 1 {
        return 1;
    }
    copy_trampoline();
    let handover = handovers();
    for n in 1..cpus {
        // SAFETY: the trampoline was copied above; the caller guarantees
        // H's layout.
        if !unsafe { start_cpu(n, handover(n)) } {
            break;
        }
    }
    online()
}

/// The common end of each flavour's `init_bsp`: when the run has more than
/// one CPU (`set_cpus`), maps the LAPIC with `map_lapic` (the flavour's
/// page tables), then installs the gates and enables the BSP's LAPIC.
pub fn init_bsp_with<E: core::fmt::Debug>(cpus: usize, map_lapic: impl FnOnce() -> Result<(), E>) {
    if !set_cpus(cpus) {
        return;
    }
    if let Err(e) = map_lapic() {
        panic!("cannot map the local APIC: {e:?}");
    }
    install_gates_and_enable();
}

/// An AP's first Rust code (called by the flavour's `ap_start*`), on the
/// boot page tables and the stack the BSP handed over: its GDT/TSS, its
/// per-CPU record, the IDT, then the scheduler's AP entry.
#[no_mangle]
extern "C" fn ap_main(n: usize) -> ! {
    use crate::arch::{descriptors, percpu};
    descriptors::init_gdt_tss_for(n);
    let Some(fault) = crate::mm::alloc_contiguous(AP_FAULT_STACK_PAGES) else {
        crate::stop(ptiscope_abi::exit_status::PANIC)
    };
    percpu::init_cpu(
        n,
        descriptors::entry_stack_top_of(n),
        phys_top(fault, AP_FAULT_STACK_PAGES),
    );
    descriptors::load_idt();
    crate::task::ap_enter(n)
}

extern "C" {
    static entry_ipi: u8;
    static entry_spurious: u8;
    static fault_stack_top: u8;
}

/// Records how many CPUs the run has (`cpus=`, at most `MAX_CPUS`) and
/// that the BSP is online; whether the LAPIC is needed (more than one CPU:
/// a one-CPU run touches no LAPIC). The first step of each flavour's
/// `init_bsp`.
pub fn set_cpus(cpus: usize) -> bool {
    CPUS.store(
        cpus.clamp(1, ptiscope_abi::telemetry::MAX_CPUS),
        Ordering::Relaxed,
    );
    ONLINE.store(1, Ordering::Release);
    cpus > 1
}

/// Installs the gates of the wake-up IPI and the spurious vector (each
/// flavour's smp.rs has `entry_ipi` and `entry_spurious`) and enables the
/// LAPIC of the CPU that calls it (the BSP; APs enable theirs in
/// [`ap_setup`]).
pub fn install_gates_and_enable() {
    let (ipi, spurious) = (
        core::ptr::addr_of!(entry_ipi) as u64,
        core::ptr::addr_of!(entry_spurious) as u64,
    );
    crate::arch::descriptors::set_gate(IPI_VECTOR, ipi, 0, 0);
    crate::arch::descriptors::set_gate(SPURIOUS_VECTOR, spurious, 0, 0);
    lapic_enable();
}

/// The rest of an AP's set-up once the scheduler's state is known: control
/// registers as the BSP's (`cr4`), the kernel-only page tables, its LAPIC;
/// then it is online.
pub fn ap_setup(kernel_cr3: u64, cr4: u64) {
    // SAFETY: the same CR4 bits the BSP runs with (x86_64: PGE, PCIDE only
    // if the BSP checked the CPU has it, and CR3's PCID bits are 0 here;
    // x86_32: PAE and PGE, already set by the trampoline).
    unsafe { crate::arch::cpu::write_cr4(cr4) };
    crate::arch::paging::write_cr3(kernel_cr3, crate::arch::paging::Cr3Reason::Other);
    // The trampoline's load of the boot tables happened before the per-CPU
    // segment (GS / FS) was set.
    crate::telemetry::inc(Counter::Cr3Other);
    crate::telemetry::inc(Counter::TlbFlushFull);
    lapic_enable();
    let _ = lapic_read(LAPIC_ID);
    ONLINE.fetch_add(1, Ordering::AcqRel);
}

/// The kernel-only page-table root now in CR3 (what APs load).
pub fn current_cr3() -> u64 {
    let v: usize;
    // SAFETY: reading CR3 has no side effects.
    unsafe { asm!("mov {}, cr3", out(reg) v, options(nostack, nomem, preserves_flags)) };
    v as u64
}

/// The boot CPU's per-CPU set-up (see percpu.rs): its entry stack and the
/// static fault stack of entry.rs.
pub fn init_boot_cpu() {
    let fault = core::ptr::addr_of!(fault_stack_top) as u64;
    crate::arch::percpu::init_cpu(0, crate::arch::descriptors::entry_stack_top_of(0), fault);
}
