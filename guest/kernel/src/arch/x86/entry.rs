//! The entry area of the 32-bit flavour (Linux x86_32: `.entry.text` plus
//! `cpu_entry_area`): IDT, GDT, TSS and the per-CPU entry stack in
//! `.entry.data`; exception stubs, the `int`/SYSENTER syscall stubs and the
//! counted CR3-switch macros in `.entry.text`. With PTI this is all of the
//! kernel that the user copy maps (plus the text with `pti_global_text=on`).
//!
//! Counters are 64-bit: each increment is `addl $1; adcl $0` FS-relative
//! (FS's base is this CPU's counter block in the telemetry page, see
//! percpu.rs), which the user copy does not map, so entry code counts after
//! the switch to the kernel copy and exit code before the switch to the
//! user copy. The per-CPU words the stubs read (`PCPU_*`, FS-relative too)
//! are kernel data, read only on the kernel copy. There is no PCID: every
//! CR3 write flushes.
//!
//! Register ABI (i386): eax = number, ebx ecx edx esi = arguments, eax =
//! result; every other register is preserved. SYSENTER callers go through
//! the user stub `user_sysenter` (user.rs), as Linux's vDSO
//! `__kernel_vsyscall`: it saves ecx, edx, ebp, puts the user ESP in ebp,
//! and SYSEXIT returns to the fixed `user_sysenter_return`.

crate::arch::x86_shared::entry::entry_asm!(
    r#"
    .set PCPU_ENTRY_STACK_TOP, PCPU_KERNEL + {p_entry_top}

    .macro COUNT ctr
    addl $1, %fs:\ctr
    adcl $0, %fs:\ctr + 4
    .endm

    .set PTI_SWITCH_MASK, 0x1000      /* CR3 user page-table bit (12) */

    /* A 32-bit interrupt gate (descriptors::set_gate) to the handler
     * whose address is lo16 | hi16 << 16. */
    .macro EXC_GATE n, lo16, hi16
    .word \lo16, {kernel_cs}
    .byte 0, 0x8e
    .word \hi16
    .endm

    ENTRY_DATA 256, 32, 1
    ENTRY_CPU_AREAS {cpu_areas}

    ENTRY_TEXT 32

    /* Common path of the fatal exceptions (as on x86_64): registers saved
     * on the stack the CPU chose (the entry stack from user mode with PTI),
     * CR3 switched if the user copy is loaded (bit 12), the CR3 at the
     * fault kept for the report. */
exc_common:
    pushal
    movl %cr3, %esi
    btl $12, %esi
    jnc 1f
    SWITCH_TO_KERNEL_CR3_NOPCID %eax
1:  COUNT CTR_EXCEPTIONS
    movl %esp, %ebx
    movl %fs:PCPU_FAULT_STACK_TOP, %esp
    pushl %esi                      /* cr3 */
    pushl %ebx                      /* frame */
    call exception_handler
    /* Returns only for a kernel-mode fault it fixed up (rdmsr_safe). */
    movl %ebx, %esp
    popal
    addl $8, %esp                   /* vector, error code */
    iret

    /* ---- System calls ------------------------------------------------
     * One dispatch for all entries: push the four argument registers as
     * the cdecl arguments of the handler, count, bounds-check (ENOSYS out
     * of line), call. eax is the result; the handler preserves ebx, esi,
     * edi, ebp; ecx and edx are saved by the stubs. */
    .macro SYSCALL_BODY
    pushl %esi
    pushl %edx
    pushl %ecx
    pushl %ebx
    COUNT CTR_SYSCALLS
    cmpl $TABLE_SIZE, %eax
    jae 80f
    call *syscall_table(,%eax,4)
81:
    .pushsection .entry.text.cold, "ax"
80: movl $ENOSYS, %eax
    jmp 81b
    .popsection
    .endm

    /* int $0x80 (and int3/int $4) through a DPL3 gate, PTI off:
     * TSS.ESP0 is the task stack. */
    .balign 16
    .global entry_int_off
entry_int_off:
    pushl %edx
    pushl %ecx
    SYSCALL_BODY
    addl $16, %esp
    popl %ecx
    popl %edx
    iret

    /* PTI: the CPU pushed the frame on this CPU's entry stack (TSS.ESP0);
     * ecx and edx are saved beside it (there is no free scratch register
     * on x86), and all of it stays there for the whole syscall (the context
     * switch saves those 7 words per task, see task.rs), so the fast path
     * only moves ESP: to the task stack after the switch to the kernel
     * copy, back to the saved registers before the switch to the user copy. */
    .balign 16
    .global entry_int_pti
entry_int_pti:
    pushl %edx
    pushl %ecx
    SWITCH_TO_KERNEL_CR3_NOPCID %edx
    movl 4(%esp), %edx              /* the user's edx: third argument */
    movl %fs:PCPU_KSTACK_TOP, %esp
    SYSCALL_BODY
    movl %fs:PCPU_ENTRY_FRAME, %esp /* the saved ecx, edx and the frame */
    SWITCH_TO_USER_CR3_NOPCID %edx
    popl %ecx
    popl %edx
    iret

    /* pti_switch=deferred (the 2020 RFC's "defer CR3 switch to C code"),
     * as on x86_64: the entry switch stays here; the exit's kernel->user
     * switch is done by Rust code (pti_deferred.rs), called on the entry
     * stack (mapped in the user copy). cdecl lets it clobber eax, ecx and
     * edx: ecx and edx are restored from the entry stack anyway, so only
     * the result is saved around the call. Its text page is mapped in the
     * user copy too: that is its exposure. */
    .balign 16
    .global entry_int_pti_deferred
entry_int_pti_deferred:
    pushl %edx
    pushl %ecx
    SWITCH_TO_KERNEL_CR3_NOPCID %edx
    movl 4(%esp), %edx
    movl %fs:PCPU_KSTACK_TOP, %esp
    SYSCALL_BODY
    movl %fs:PCPU_ENTRY_FRAME, %esp
    pushl %eax
    call pti_exit_to_user
    popl %eax
    popl %ecx
    popl %edx
    iret

    /* SYSENTER: CPL0, IF clear, ESP = SYSENTER_ESP, nothing pushed; ebp is
     * the user ESP (see user_sysenter). The handler preserves ebp, so
     * SYSEXIT gets it back in ecx; edx = the fixed return point. ESP is not
     * restored: SYSEXIT loads it, and the next SYSENTER starts afresh. */
    .balign 16
    .global entry_sysenter_off
entry_sysenter_off:
    SYSCALL_BODY
    movl %ebp, %ecx
    movl $user_sysenter_return, %edx
    sysexit

    /* PTI: SYSENTER_ESP is the per-CPU entry stack, one word of it used to
     * free a scratch register for the switch. */
    .macro ENTRY_SYSENTER_PTI deferred
    pushl %edx
    SWITCH_TO_KERNEL_CR3_NOPCID %edx
    popl %edx
    movl %fs:PCPU_KSTACK_TOP, %esp
    SYSCALL_BODY
    .if \deferred
    /* pti_switch=deferred: the exit's switch done by pti_exit_to_user,
     * called on the entry stack (below where an int entry's frame would
     * be: SYSENTER leaves it unused); ecx and edx are set for SYSEXIT
     * after the call, so only the result is saved around it. */
    movl %fs:PCPU_ENTRY_FRAME, %esp
    pushl %eax
    call pti_exit_to_user
    popl %eax
    .else
    SWITCH_TO_USER_CR3_NOPCID %edx
    .endif
    movl %ebp, %ecx
    movl $user_sysenter_return, %edx
    sysexit
    .endm

    .balign 16
    .global entry_sysenter_pti
entry_sysenter_pti:
    ENTRY_SYSENTER_PTI 0

    .balign 16
    .global entry_sysenter_pti_deferred
entry_sysenter_pti_deferred:
    ENTRY_SYSENTER_PTI 1

    /* First return of a new task (switch_to "returns" here, ESP at an iret
     * frame on the task stack; ebx esi edi ebp hold the initial user
     * registers). With PTI the frame is copied to the entry stack first. */
    .global task_first_return
task_first_return:
    xorl %eax, %eax
    xorl %ecx, %ecx
    xorl %edx, %edx
    cmpl $0, %fs:PCPU_EXIT_PTI
    je 1f
    movl %fs:PCPU_ENTRY_STACK_TOP, %ecx
    movl 0(%esp), %eax
    movl %eax, -20(%ecx)
    movl 4(%esp), %eax
    movl %eax, -16(%ecx)
    movl 8(%esp), %eax
    movl %eax, -12(%ecx)
    movl 12(%esp), %eax
    movl %eax, -8(%ecx)
    movl 16(%esp), %eax
    movl %eax, -4(%ecx)
    leal -20(%ecx), %esp
    xorl %ecx, %ecx
    SWITCH_TO_USER_CR3_NOPCID %eax
    xorl %eax, %eax
1:  iret

    /* NMI: on the current stack (x86 has no IST). */
    ENTRY_NMI %eax, %ecx, iret

    FAULT_STACK
    "#;
    p_entry_top = const super::percpu::kernel::ENTRY_STACK_TOP,
    kernel_cs = const super::descriptors::KERNEL_CS,
);
