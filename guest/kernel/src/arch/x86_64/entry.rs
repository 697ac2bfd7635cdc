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
//! Counters are incremented with one `incq %gs:counter` each: every CPU's
//! GS base is its block of the telemetry page (at the fixed
//! `guest_core::layout::TELEMETRY_VA`), which the kernel copy always maps;
//! the user copy does not, so entry code counts after the switch to the
//! kernel copy and exit code before the switch to the user copy. The other
//! per-CPU words are GS-relative too (`PCPU_KERNEL + offset`, kernel copy
//! only; `PCPU_ENTRY + offset`, entry area): see percpu.rs.
//!
//! CPU 0's descriptor tables and stacks are the statics below; CPUs 1..7
//! have theirs in `entry_cpu_areas` (one page each, see descriptors.rs).

crate::arch::x86_shared::entry::entry_asm!(
    r#"
    /* Counters and per-CPU words: GS-relative (percpu.rs). */
    .set CTR_NOFLUSH, {c_noflush}
    .set PCPU_USER_FLUSH_PENDING, PCPU_KERNEL + {pk_flush}
    .set PCPU_FRAME_ON_ENTRY_STACK, PCPU_KERNEL + {pk_frame_on}
    .set PCPU_SCRATCH_RSP, PCPU_ENTRY + {pe_rsp}
    .set PCPU_SCRATCH_RDI, PCPU_ENTRY + {pe_rdi}
    .set USER_CS, {user_cs}
    .set USER_DS, {user_ds}
    .set PTI_SWITCH_MASK, 0x1800      /* CR3 user page-table bit (12) and user PCID bit (11) */

    .macro COUNT ctr
    incq %gs:\ctr
    .endm

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
    incq %gs:CTR_CR3_ENTRY
    incq %gs:CTR_NOFLUSH
    jmp 92f
91: mov \scratch, %cr3
    incq %gs:CTR_CR3_ENTRY
    incq %gs:CTR_TLB_FLUSH
92:
    .endm

    /* The fast-path CR3 switches (Linux: SWITCH_TO_KERNEL_CR3 and
     * SWITCH_TO_USER_CR3_NOSTACK in arch/x86/entry/calling.h). One variant
     * per configuration, chosen when the stubs are installed, so the paths
     * carry no run-time test of the configuration. `pcid` is 0 or 1. */
    .macro SWITCH_TO_KERNEL_CR3 scratch, pcid
    .if \pcid
    mov %cr3, \scratch
    andq $~PTI_SWITCH_MASK, \scratch
    btsq $63, \scratch              /* NOFLUSH: kernel PCID entries stay */
    mov \scratch, %cr3
    incq %gs:CTR_CR3_ENTRY
    incq %gs:CTR_NOFLUSH
    .else
    SWITCH_TO_KERNEL_CR3_NOPCID \scratch
    .endif
    .endm

    /* Counters first: the user copy does not map them. With PCID a flush
     * of the user PCID requested since the last exit (cpu_user_flush_pending)
     * is done now, by leaving NOFLUSH off, as Linux defers it. */
    .macro SWITCH_TO_USER_CR3 scratch, pcid
    .if \pcid
    mov %cr3, \scratch
    orq $PTI_SWITCH_MASK, \scratch
    btrq $0, %gs:PCPU_USER_FLUSH_PENDING
    jc 93f
    btsq $63, \scratch
    incq %gs:CTR_NOFLUSH
94: incq %gs:CTR_CR3_EXIT
    mov \scratch, %cr3
    /* The rare flushing exit, out of line so the common one falls through. */
    .pushsection .entry.text.cold, "ax"
93: incq %gs:CTR_TLB_FLUSH
    jmp 94b
    .popsection
    .else
    SWITCH_TO_USER_CR3_NOPCID \scratch
    .endif
    .endm

    /* A 64-bit interrupt gate (descriptors::gate) to the handler whose
     * address is lo16 | hi16 << 16 | __idt_hi32 << 32. */
    .macro EXC_GATE n, lo16, hi16
    .word \lo16, {kernel_cs}
    .if \n == 2
    .byte {ist_nmi}
    .elseif \n == 8
    .byte {ist_df}
    .elseif \n == 18
    .byte {ist_mc}
    .else
    .byte 0
    .endif
    .byte 0x8e
    .word \hi16
    .long __idt_hi32, 0
    .endm

    ENTRY_DATA 512, 10, 2
    .skip 1024
    .global ist_df_top
ist_df_top:
    .skip 512
    .global ist_nmi_top
ist_nmi_top:
    .skip 512
    .global ist_mc_top
ist_mc_top:
    ENTRY_CPU_AREAS {cpu_areas}

    ENTRY_TEXT 64

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
1:  incq %gs:CTR_EXCEPTIONS
    mov %rsp, %rdi                  /* the frame: first argument */
    mov %rsp, %rbx                  /* kept across the call (callee-saved) */
    movq %gs:PCPU_FAULT_STACK_TOP, %rsp /* a roomy kernel stack for the report */
    xorl %ebp, %ebp
    call exception_handler
    /* Returns only for a kernel-mode fault it fixed up (rdmsr_safe). */
    mov %rbx, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %r11
    popq %r10
    popq %r9
    popq %r8
    popq %rbp
    popq %rdi
    popq %rsi
    popq %rdx
    popq %rcx
    popq %rbx
    popq %rax
    addq $16, %rsp                  /* vector, error code */
    iretq


    /* ---- System calls ------------------------------------------------
     * Register ABI: rax = number, rdi rsi rdx r10 = arguments, rax = result.
     * rcx and r11 are clobbered, as by SYSCALL (the int paths use rcx as
     * their scratch register and return it zeroed); every other register is
     * preserved. One dispatch (SYSCALL_BODY) and one exit shape for all
     * entries; variants differ only in where the frame is and in the CR3
     * switch.
     *
     * Where the frame lives with PTI (int entries): the CPU pushes it on
     * the per-CPU entry stack (TSS.RSP0), the only stack the user copy maps.
     * Linux copies it to the task stack (sync_regs) and back on exit; here it
     * stays on the entry stack and the context switch saves and restores
     * those 40 bytes per task instead (rare, vs. every syscall), so the
     * fast path only moves RSP: to the task stack after the switch to the
     * kernel copy, back to the frame before the switch to the user copy. */

    /* The registers the dispatch saves around the handler call: the
     * argument registers the C ABI lets it clobber (rdi rsi rdx r8 r9 r10)
     * and r11, which is user RFLAGS after SYSCALL. */
    .macro PUSH_SAVED
    .irp r, rdi, rsi, rdx, r8, r9, r10, r11
    pushq %\r
    .endr
    .endm

    .macro POP_SAVED
    .irp r, r11, r10, r9, r8, rdx, rsi, rdi
    popq %\r
    .endr
    .endm

    .macro SYSCALL_BODY
    PUSH_SAVED
    incq %gs:CTR_SYSCALLS
    cmpq $TABLE_SIZE, %rax
    jae syscall_bad_nr
    movq %r10, %rcx                 /* 4th argument, C ABI */
    call *syscall_table(,%rax,8)
    POP_SAVED
    .endm

    /* int $n through a DPL3 gate, PTI off: TSS.RSP0 is the task stack. */
    .balign 16
    .global entry_int_off
entry_int_off:
    SYSCALL_BODY
    xorl %ecx, %ecx
    iretq

    .macro ENTRY_INT_PTI pcid
    SWITCH_TO_KERNEL_CR3 %rcx, \pcid
    movq %gs:PCPU_KSTACK_TOP, %rsp
    SYSCALL_BODY
    movq %gs:PCPU_ENTRY_FRAME, %rsp
    SWITCH_TO_USER_CR3 %rcx, \pcid
    xorl %ecx, %ecx
    iretq
    .endm

    .balign 16
    .global entry_int_pti
entry_int_pti:
    ENTRY_INT_PTI 0

    .balign 16
    .global entry_int_pti_pcid
entry_int_pti_pcid:
    ENTRY_INT_PTI 1

    /* pti_switch=deferred (the 2020 RFC's "defer CR3 switch to C code"):
     * the entry switch stays here; the exit's kernel->user switch is done
     * by Rust code (pti_deferred.rs), called on the entry stack (mapped in
     * the user copy) after the registers are restored, so it must save the
     * caller-saved ones it may clobber: that is part of its cost. Its text
     * page is mapped in the user copy too: that is its exposure. */
    .balign 16
    .global entry_int_pti_deferred
entry_int_pti_deferred:
    SWITCH_TO_KERNEL_CR3 %rcx, 0
    movq %gs:PCPU_KSTACK_TOP, %rsp
    SYSCALL_BODY
    movq %gs:PCPU_ENTRY_FRAME, %rsp
    pushq %rax
    PUSH_SAVED
    call pti_exit_to_user
    POP_SAVED
    popq %rax
    xorl %ecx, %ecx
    iretq

    /* SYSCALL: CPL0 on the user stack, rcx = user RIP, r11 = user RFLAGS.
     * An iret-shaped frame is built on the task stack so that all entries
     * share the dispatch; the exit prefers SYSRETQ when it is safe: RIP
     * canonical (it came from SYSCALL and is never changed, so only bit 47
     * can be wrong, right after the last user page) and no TF/RF in RFLAGS. */
    .macro ENTRY_SYSCALL pti, pcid, deferred=0
    movq %rsp, %gs:PCPU_SCRATCH_RSP
    .if \pti
    SWITCH_TO_KERNEL_CR3 %rsp, \pcid
    .endif
    movq %gs:PCPU_KSTACK_TOP, %rsp
    pushq $USER_DS
    pushq %gs:PCPU_SCRATCH_RSP
    pushq %r11
    pushq $USER_CS
    pushq %rcx
    SYSCALL_BODY
    movq (%rsp), %rcx
    movq 16(%rsp), %r11
    btq $47, %rcx
    jc 95f
    testl $0x10100, %r11d
    jnz 95f
    .if \deferred
    /* pti_switch=deferred: the user RSP into the entry area (the task
     * stack is not mapped in the user copy), then pti_exit_to_user on the
     * entry stack, saving what the call may clobber (rcx: the user RIP). */
    movq %rdi, %gs:PCPU_SCRATCH_RDI
    movq 24(%rsp), %rdi
    movq %rdi, %gs:PCPU_SCRATCH_RSP
    movq %gs:PCPU_ENTRY_FRAME, %rsp
    movq %gs:PCPU_SCRATCH_RDI, %rdi
    pushq %rax
    pushq %rcx
    PUSH_SAVED
    call pti_exit_to_user
    POP_SAVED
    popq %rcx
    popq %rax
    movq %gs:PCPU_SCRATCH_RSP, %rsp
    .else
    movq 24(%rsp), %rsp
    .if \pti
    movq %rdi, %gs:PCPU_SCRATCH_RDI
    SWITCH_TO_USER_CR3 %rdi, \pcid
    movq %gs:PCPU_SCRATCH_RDI, %rdi
    .endif
    .endif
    sysretq
95: jmp return_to_user_slow
    .endm

    .balign 16
    .global entry_syscall_off
entry_syscall_off:
    ENTRY_SYSCALL 0, 0
    .balign 16
    .global entry_syscall_pti
entry_syscall_pti:
    ENTRY_SYSCALL 1, 0
    .balign 16
    .global entry_syscall_pti_pcid
entry_syscall_pti_pcid:
    ENTRY_SYSCALL 1, 1

    /* pti_switch=deferred on the SYSCALL path (the 2020 RFC's own case:
     * Linux's 64-bit SYSCALL entry): on the SYSRET exit the kernel->user
     * switch is pti_exit_to_user's, called on the entry stack (its
     * epilogue runs after its CR3 write). The rare SYSRET-unsafe exit
     * takes the general path, with the assembly switch. */
    .balign 16
    .global entry_syscall_pti_deferred
entry_syscall_pti_deferred:
    ENTRY_SYSCALL 1, 0, 1

syscall_bad_nr:
    movq $ENOSYS, %rax
    POP_SAVED
    /* Back to user the slow, general way: the frame is on the task stack
     * for every entry but int with PTI, where it is on the entry stack. */
    jmp return_to_user_slow_from_entry_or_task

    /* The general return to user mode, off the fast paths: a new task's
     * first return, SYSRET refused, bad syscall numbers. RSP points at an
     * iret frame on the task stack. Copies the frame to the entry stack and
     * switches CR3 when the current task runs with PTI (cpu_exit_pti: 0
     * none, 1 PTI, 2 PTI with PCID). Caller-saved registers are not leaked:
     * rcx and r11 are cleared; the others hold user values or zero. */
    .global return_to_user_slow
return_to_user_slow:
    cmpq $0, %gs:PCPU_EXIT_PTI
    je 97f
    pushq %rax
    movq %gs:PCPU_ENTRY_FRAME, %rcx /* rcx is cleared before iretq */
    movq 8(%rsp), %rax
    movq %rax, 0(%rcx)
    movq 16(%rsp), %rax
    movq %rax, 8(%rcx)
    movq 24(%rsp), %rax
    movq %rax, 16(%rcx)
    movq 32(%rsp), %rax
    movq %rax, 24(%rcx)
    movq 40(%rsp), %rax
    movq %rax, 32(%rcx)
    popq %rax
    movq %rcx, %rsp
return_to_user_slow_switch:
    cmpq $2, %gs:PCPU_EXIT_PTI
    je 96f
    SWITCH_TO_USER_CR3 %rcx, 0
    jmp 97f
96: SWITCH_TO_USER_CR3 %rcx, 1
97: xorl %ecx, %ecx
    xorl %r11d, %r11d
    iretq

    /* Bad syscall number: RSP is back where the entry had it: at the frame
     * on the task stack, or at the top of the task stack for int entries
     * with PTI, whose frame is on the entry stack (cpu_frame_on_entry_stack). */
return_to_user_slow_from_entry_or_task:
    cmpq $0, %gs:PCPU_FRAME_ON_ENTRY_STACK
    je return_to_user_slow          /* RSP is at the frame on the task stack */
98: movq %gs:PCPU_ENTRY_FRAME, %rsp
    cmpq $0, %gs:PCPU_EXIT_PTI
    jne return_to_user_slow_switch
    jmp 97b

    /* First return of a new task (switch_to "returns" here): the callee-saved
     * registers hold the task's initial user registers; clear the others. */
    .global task_first_return
task_first_return:
    xorl %eax, %eax
    xorl %edx, %edx
    xorl %esi, %esi
    xorl %edi, %edi
    xorl %r8d, %r8d
    xorl %r9d, %r9d
    xorl %r10d, %r10d
    jmp return_to_user_slow

    /* NMI: paranoid entry, on its IST stack. */
    ENTRY_NMI %rax, %rcx, iretq

    FAULT_STACK
    .purgem PUSH_SAVED
    .purgem POP_SAVED
    .purgem SWITCH_TO_KERNEL_CR3_SLOW
    .purgem SWITCH_TO_KERNEL_CR3
    .purgem SWITCH_TO_USER_CR3
"#;
    c_noflush = const ptiscope_abi::telemetry::Counter::Cr3NoFlush.offset_in_block(),
    pk_flush = const super::percpu::kernel::USER_FLUSH_PENDING,
    pk_frame_on = const super::percpu::kernel::FRAME_ON_ENTRY_STACK,
    pe_rsp = const super::percpu::entry::SCRATCH_RSP,
    pe_rdi = const super::percpu::entry::SCRATCH_RDI,
    user_cs = const super::descriptors::USER_CS,
    kernel_cs = const super::descriptors::KERNEL_CS,
    ist_nmi = const super::descriptors::IST_NMI,
    ist_df = const super::descriptors::IST_DF,
    ist_mc = const super::descriptors::IST_MC,
    user_ds = const super::descriptors::USER_DS,
);
