//! What both flavours' SMP code shares: the local APIC (xAPIC, MMIO) and
//! its IPIs, and the count of CPUs online. The trampoline that brings an AP
//! to its flavour's paging mode, and the per-CPU set-up, stay in each
//! flavour's `smp.rs`.
use crate::arch::layout::TELEMETRY_VA;
use core::arch::asm;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

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
