//! The entry area: everything the CPU and the entry code touch while the
//! user copy of the page tables may still be loaded (Linux: `.entry.text`
//! plus `cpu_entry_area`). With PTI this is all of the kernel that the user
//! copy maps.
//!
//! * `.entry.text`: exception stubs, the syscall entry/exit stubs and the
//!   counted CR3-switch macros (`SWITCH_TO_KERNEL_CR3`/`SWITCH_TO_USER_CR3`).
//! * `.entry.data`: IDT, GDT, TSS, the per-CPU entry stack (TSS.RSP0 with PTI),
//!   IST stacks for NMI/#DF/#MC and the per-CPU scratch the entry code needs.
//!
//! Counters are incremented with one `incq abs32` each at the fixed
//! telemetry address (`guest_core::layout::TELEMETRY_VA`), which the kernel
//! copy always maps; the user copy does not, so entry code counts after the
//! switch to the kernel copy and exit code before the switch to the user copy.
//! There is one CPU, so "per-CPU" data is plain static data of CPU 0.

use core::arch::global_asm;
use guest_core::layout::TELEMETRY_VA;
use ptiscope_abi::telemetry::Counter;

/// Absolute address of CPU 0's `c` counter, as the signed disp32 the
/// assembler needs (the telemetry page sits in the top 2 GiB).
const fn ctr(c: Counter) -> i64 {
    (TELEMETRY_VA + c.offset(0) as u64) as i64
}

/// The shared entry macros, prepended to every asm block that uses them.
macro_rules! entry_asm {
    ($($body:literal),* $(,)?) => {
        global_asm!(
            r#"
    .set CTR_CR3_ENTRY, {c_entry}
    .set CTR_CR3_EXIT, {c_exit}
    .set CTR_CR3_OTHER, {c_other}
    .set CTR_NOFLUSH, {c_noflush}
    .set CTR_TLB_FLUSH, {c_flush}
    .set CTR_SYSCALLS, {c_syscalls}
    .set CTR_EXCEPTIONS, {c_exceptions}
    .set CTR_INTERRUPTS, {c_interrupts}
    .set PTI_SWITCH_MASK, 0x1800      /* CR3 user page-table bit (12) and user PCID bit (11) */

    /* Entry from user mode: switch to the kernel copy. Kernel PCID entries
     * are never flushed on entry: with PCID the write carries NOFLUSH
     * (a runtime test here, the syscall fast paths have their own variants). */
    .macro SWITCH_TO_KERNEL_CR3_SLOW scratch
    mov %cr3, \scratch
    andq $~PTI_SWITCH_MASK, \scratch
    cmpb $0, entry_pcid_on
    je 91f
    btsq $63, \scratch
    mov \scratch, %cr3
    incq CTR_CR3_ENTRY
    incq CTR_NOFLUSH
    jmp 92f
91: mov \scratch, %cr3
    incq CTR_CR3_ENTRY
    incq CTR_TLB_FLUSH
92:
    .endm
"#,
            $($body,)*
            ".purgem SWITCH_TO_KERNEL_CR3_SLOW",
            c_entry = const ctr(Counter::Cr3Entry),
            c_exit = const ctr(Counter::Cr3Exit),
            c_other = const ctr(Counter::Cr3Other),
            c_noflush = const ctr(Counter::Cr3NoFlush),
            c_flush = const ctr(Counter::TlbFlushFull),
            c_syscalls = const ctr(Counter::Syscalls),
            c_exceptions = const ctr(Counter::Exceptions),
            c_interrupts = const ctr(Counter::Interrupts),
            options(att_syntax)
        );
    };
}

entry_asm!(
    r#"
    .section .entry.data, "aw"
    .balign 4096
    .global entry_idt
entry_idt:
    .fill 512, 8, 0
    .global entry_gdt
entry_gdt:
    .fill 10, 8, 0
    .balign 16
    .global entry_tss
entry_tss:
    .fill 104, 1, 0
    .balign 8
    /* 1 while PCID is in use (CR4.PCIDE): entry code sets NOFLUSH. */
    .global entry_pcid_on
entry_pcid_on:
    .quad 0
    /* SYSCALL entry scratch: the user RSP until the task stack is loaded. */
    .global entry_scratch_rsp
entry_scratch_rsp:
    .quad 0
    .global entry_scratch_rdi
entry_scratch_rdi:
    .quad 0
    .balign 4096
    .global entry_stack
entry_stack:
    .skip 2048
    .global entry_stack_top
entry_stack_top:
    .skip 1024
    .global ist_df_top
ist_df_top:
    .skip 512
    .global ist_nmi_top
ist_nmi_top:
    .skip 512
    .global ist_mc_top
ist_mc_top:

    .section .entry.text, "ax"
    .code64

    .macro EXC_NOERR n
    .balign 16
exc_\n:
    pushq $0
    pushq $\n
    jmp exc_common
    .endm
    .macro EXC_ERR n
    .balign 16
exc_\n:
    pushq $\n
    jmp exc_common
    .endm

    EXC_NOERR 0
    EXC_NOERR 1
    EXC_NOERR 2
    EXC_NOERR 3
    EXC_NOERR 4
    EXC_NOERR 5
    EXC_NOERR 6
    EXC_NOERR 7
    EXC_ERR 8
    EXC_NOERR 9
    EXC_ERR 10
    EXC_ERR 11
    EXC_ERR 12
    EXC_ERR 13
    EXC_ERR 14
    EXC_NOERR 15
    EXC_NOERR 16
    EXC_ERR 17
    EXC_NOERR 18
    EXC_NOERR 19
    EXC_NOERR 20
    EXC_ERR 21
    EXC_NOERR 22
    EXC_NOERR 23
    EXC_NOERR 24
    EXC_NOERR 25
    EXC_NOERR 26
    EXC_NOERR 27
    EXC_NOERR 28
    EXC_ERR 29
    EXC_ERR 30
    EXC_NOERR 31

    /* Common path of the fatal exceptions. Frame: vector, error code, then
     * what the CPU pushed. Registers are saved first (on the entry stack
     * when coming from user mode with PTI: it is mapped in both copies);
     * CR3 is switched when the user copy is loaded (bit 12), which is how
     * both user-mode entries and the paranoid entries (NMI, #DF, #MC, which
     * can arrive at any point of an entry or exit) find out; the CR3 at
     * the fault is kept for the report. */
exc_common:
    pushq %rax
    pushq %rbx
    pushq %rcx
    pushq %rdx
    pushq %rsi
    pushq %rdi
    pushq %rbp
    pushq %r8
    pushq %r9
    pushq %r10
    pushq %r11
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    mov %cr3, %rsi                  /* CR3 at the fault: second argument */
    btq $12, %rsi
    jnc 1f
    SWITCH_TO_KERNEL_CR3_SLOW %rax
1:  incq CTR_EXCEPTIONS
    mov %rsp, %rdi                  /* the frame: first argument */
    movq $fault_stack_top, %rsp     /* a roomy kernel stack for the report */
    xorl %ebp, %ebp
    call exception_handler
    ud2

    .section .rodata.exception_stubs, "a"
    .balign 8
    .global exception_stubs
exception_stubs:
    .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
    .quad exc_\n
    .endr

    .section .bss.fault_stack, "aw", @nobits
    .balign 16
    .skip 16384
fault_stack_top:
    .previous
"#,
);
