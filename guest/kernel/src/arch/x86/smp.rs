//! Application processors of the x86_32 PAE flavour: started by INIT/SIPI
//! through the local APIC (xAPIC, MMIO), the design of the x86_64 flavour
//! (arch/x86_64/smp.rs): the SIPI vector names a real-mode trampoline
//! copied to physical [`TRAMPOLINE_PHYS`]; it goes real mode → 32-bit
//! protected mode → PAE paging on the static boot tables (identity + the
//! kernel GiB: the instruction after `mov %cr0` runs at its physical
//! address) and jumps to [`ap_start32`] in the kernel GiB with the stack the
//! BSP handed over; `ap_setup` then loads the kernel-only page tables (the
//! same root as the BSP's). CPUs are started one at a time; each reports
//! itself online before the next is sent its SIPI.
//!
//! Interrupts: IF is clear everywhere (user mode too) except in
//! [`idle_wait`]; the only interrupt is the wake-up IPI [`IPI_VECTOR`],
//! counted (`interrupts`) and acknowledged (EOI); the legacy PIC's line
//! (LINT0) is masked (see [`lapic_enable`]).
pub use crate::arch::x86_shared::smp::*;
use crate::mm::{DirectMap, Frames};
use guest_core::pte::PhysMem;

crate::arch::x86_shared::smp::smp_asm!(
    r#"
    AP_TRAMPOLINE_START {tp}
    movl ({tp} + (tr_efer - ap_trampoline)), %eax
    testl %eax, %eax
    jz 1f
    movl $0xc0000080, %ecx          /* EFER.NXE as the BSP has it */
    xorl %edx, %edx
    wrmsr
1:  movl %cr0, %eax
    orl $0x80010001, %eax           /* PG | WP | PE: loads the PDPTEs */
    movl %eax, %cr0
    AP_TRAMPOLINE_END {tp}, l, ecx, esp, eax, 0, .long, 4

    .section .text.ap_start32, "ax"
    .code32
    .global ap_start32
ap_start32:
    xorl %ebp, %ebp
    subl $12, %esp                  /* 16-byte aligned at the call */
    pushl %eax                      /* the CPU index */
    call ap_main
    ud2

    /* The wake-up IPI: taken only in idle_wait (IF is clear everywhere
     * else), so always from kernel mode on the kernel copy: no CR3 switch,
     * no register needed (IRET restores the flags). */
    .balign 16
    .global entry_ipi
entry_ipi:
    addl $1, %fs:{ctr_interrupts}
    adcl $0, %fs:{ctr_interrupts} + 4
    movl $0, {eoi}
    iret

"#,
    "iret",
);

extern "C" {
    static boot_pdpt: u8;
    fn ap_start32();
}

/// What the BSP writes into the trampoline page for the next AP.
#[repr(C)]
struct ApHandover {
    cr3: u32,
    efer: u32,
    entry: u32,
    stack: u32,
    cpu: u32,
}

/// Maps the LAPIC into the kernel PMD (shared by every kernel copy, absent
/// from user copies), enables it on the BSP and installs the interrupt
/// gates. Call once on the BSP after the kernel page tables are live, when
/// `cpus > 1` (a one-CPU run touches no LAPIC).
pub fn init_bsp(cpus: usize, kernel_root: u64) {
    init_bsp_with(cpus, || {
        use guest_core::pte::flags::{NO_CACHE, NO_EXECUTE, PRESENT, WRITABLE, WRITE_THROUGH};
        let kernel_pmd =
            guest_core::pae::Pte(DirectMap.read(kernel_root, guest_core::pae::KERNEL_PDPT_SLOT))
                .addr();
        let nx = if super::cpu::has_nx() { NO_EXECUTE } else { 0 };
        guest_core::workingset::map_range_flags(
            &mut DirectMap,
            &mut Frames,
            guest_core::pte::Tables::PaePmd(kernel_pmd),
            guest_core::workingset::Range::new(LAPIC_VA, LAPIC_PHYS, 4096, 4096),
            WRITABLE | NO_CACHE | WRITE_THROUGH | nx,
            PRESENT | WRITABLE,
        )
    });
}

/// Starts CPUs 1..cpus one after the other; returns how many are online.
pub fn start_aps() -> usize {
    let handovers = || {
        // The boot section is identity mapped: the symbol's value is physical.
        let boot_cr3 = core::ptr::addr_of!(boot_pdpt) as u32;
        let efer = if super::cpu::has_nx() {
            // SAFETY: EFER exists where CPUID reports NX (the boot code set NXE).
            (unsafe { super::cpu::rdmsr(MSR_EFER) } & EFER_NXE) as u32
        } else {
            0
        };
        move |n: usize| {
            // Each AP's CR0.PG write makes KVM load the PDPTEs (load_pdptrs),
            // which #GPs (a triple fault this early) on a reserved bit. Under
            // kvm_amd nested in QEMU TCG, QEMU's page walker sets bit 5
            // (accessed; reserved in a PAE PDPTE) in the entries the BSP and
            // the APs before walked: cleared before every SIPI (a no-op elsewhere).
            for slot in 0..4 {
                let e = DirectMap.read(boot_cr3 as u64, slot);
                if e & PDPTE_ACCESSED != 0 {
                    DirectMap.write(boot_cr3 as u64, slot, e & !PDPTE_ACCESSED);
                }
            }
            ApHandover {
                cr3: boot_cr3,
                efer,
                entry: ap_start32 as *const () as u32,
                stack: ap_stack_top(n) as u32,
                cpu: n as u32,
            }
        }
    };
    // SAFETY: ApHandover is laid out as the trampoline's handover words
    // (five longs from tr_cr3).
    unsafe { start_aps_with(handovers) }
}

const MSR_EFER: u32 = 0xc000_0080;
/// Bit 5 of a PDPTE: reserved under PAE paging (an accessed bit elsewhere).
const PDPTE_ACCESSED: u64 = 1 << 5;
const EFER_NXE: u64 = 1 << 11;
