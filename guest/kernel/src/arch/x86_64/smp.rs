//! Application processors: started by INIT/SIPI through the local APIC
//! (xAPIC, MMIO), as on real hardware, so the same image starts its CPUs
//! under our VMM (KVM's in-kernel LAPIC keeps every vCPU but 0 waiting for
//! SIPI), under QEMU (`-smp N`) and on bare metal.
//!
//! The SIPI vector names a real-mode page: the trampoline below is copied
//! to physical [`TRAMPOLINE_PHYS`] (free low RAM: our VMM puts
//! `hvm_start_info` and the memory map at 0x6000/0x7000, QEMU's firmware is
//! done by then). It goes real mode → 32-bit protected mode → long mode on
//! the static boot page tables (identity + higher half), then jumps to
//! [`ap_start64`] in the higher half with the stack the BSP handed over.
//! CPUs are started one at a time; each reports itself online before the
//! next is sent its SIPI.
//!
//! Interrupts: the kernel runs with IF clear everywhere (user mode too)
//! except in [`idle_wait`], the `sti; hlt` of a CPU with nothing to run.
//! The only interrupt is [`IPI_VECTOR`], a wake-up: "your run queue has
//! work". It is counted (`interrupts`) and acknowledged (EOI), nothing else.
use super::cpu;
pub use crate::arch::x86_shared::smp::*;
use crate::mm::{DirectMap, Frames};
use guest_core::paging::{map_4k, KERNEL_TABLE_FLAGS};

crate::arch::x86_shared::smp::smp_asm!(
    r#"
    AP_TRAMPOLINE_START {tp}
    movl $0xc0000080, %ecx
    movl ({tp} + (tr_efer - ap_trampoline)), %eax
    xorl %edx, %edx
    wrmsr                           /* LME (+NXE) as the BSP has it */
    movl %cr0, %eax
    orl $0x80010001, %eax           /* PG | WP | PE */
    movl %eax, %cr0
    ljmpl $0x18, ${tp} + (tr_long - ap_trampoline)

    .code64
tr_long:
    AP_TRAMPOLINE_END {tp}, q, rax, rsp, rdi, 1, .quad, 8

    .section .text.ap_start64, "ax"
    .global ap_start64
ap_start64:
    xorl %eax, %eax                 /* null data selectors work in long mode */
    movl %eax, %ds
    movl %eax, %es
    movl %eax, %ss
    xorl %ebp, %ebp
    call ap_main
    ud2

    /* The wake-up IPI: taken only in idle_wait (IF is clear everywhere
     * else), so always from kernel mode on the kernel copy: no CR3 switch. */
    .balign 16
    .global entry_ipi
entry_ipi:
    pushq %rax
    incq %gs:{ctr_interrupts}
    movabsq ${eoi}, %rax
    movl $0, (%rax)
    popq %rax
    iretq

"#,
    "iretq",
);

extern "C" {
    static boot_pml4: u8;
}

/// What the BSP writes into the trampoline page for the next AP.
#[repr(C)]
struct ApHandover {
    cr3: u64,
    efer: u64,
    entry: u64,
    stack: u64,
    cpu: u64,
}

/// Maps the LAPIC, enables it on the BSP and installs the interrupt gates.
/// Call once on the BSP after the kernel page tables are live, when
/// `cpus > 1` (a one-CPU run touches no LAPIC).
pub fn init_bsp(cpus: usize, kernel_root: u64) {
    init_bsp_with(cpus, || {
        use guest_core::paging::flags::{NO_CACHE, NO_EXECUTE, WRITABLE, WRITE_THROUGH};
        map_4k(
            &mut DirectMap,
            &mut Frames,
            kernel_root,
            LAPIC_VA,
            LAPIC_PHYS,
            WRITABLE | NO_CACHE | WRITE_THROUGH | NO_EXECUTE,
            KERNEL_TABLE_FLAGS,
        )
    });
}

/// Starts CPUs 1..cpus one after the other; returns how many are online.
pub fn start_aps() -> usize {
    let handovers = || {
        // The boot section is identity mapped: the symbol's value is physical.
        let boot_cr3 = core::ptr::addr_of!(boot_pml4) as u64;
        // SAFETY: EFER exists on every x86_64 CPU.
        let efer = unsafe { cpu::rdmsr(cpu::MSR_EFER) } & (EFER_LME | EFER_NXE);
        move |n: usize| ApHandover {
            cr3: boot_cr3,
            efer,
            entry: ap_start64 as *const () as u64,
            stack: ap_stack_top(n),
            cpu: n as u64,
        }
    };
    // SAFETY: ApHandover is laid out as the trampoline's handover words
    // (five quads from tr_cr3).
    unsafe { start_aps_with(handovers) }
}

const EFER_LME: u64 = 1 << 8;
const EFER_NXE: u64 = 1 << 11;

extern "C" {
    fn ap_start64();
}
