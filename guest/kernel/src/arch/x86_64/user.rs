//! User programs, linked into the `.user` section at user addresses
//! (`USER_TEXT_BASE`) and mapped read-only and executable into each process.
//! They are self-contained assembly: no call leaves `.user.text`, system
//! calls use the instruction of the configured entry, one copy per entry.
//!
//! Parameters arrive in callee-saved registers, which the kernel preserves:
//! * `user_loop`: r12 = iterations, r13 = syscall number, r14 = first
//!   argument, rbx = flags (bit 0: opt out of PTI first, bit 1: read the
//!   kernel address in r15 first, bit 2: the loop with a working set).
//!   Calls the syscall once for the expected value, marks the phase begin,
//!   loops with RDTSC around, marks the end with (cycles, mismatches),
//!   exits with the number of mismatches. With a working set (`wss=`, see
//!   workingset.rs) it first writes each slot's offset into the buffer,
//!   reads `touches` slots before each call, and leaves its read count and
//!   the sum of what it read in the control page before the end marker.
//! * `user_init`: waits for its children; exits with the last child status.
//! * `user_msg_parent`, `user_msg_sender`, `user_msg_receiver`: the
//!   sched-messaging workload (see docs/guest.md).
//!
//! Only `user_loop` is written here; `user_init`, the sched-messaging
//! programs and the poundsyscall workers are written once for both
//! flavours in arch/x86_shared/user.rs and instantiated here with this
//! flavour's register names.
use crate::arch::x86_shared::user::{messaging_asm, pound_asm, program_lookup, user_loop_asm};
pub use crate::arch::x86_shared::user::{section, FLAG_KREAD, FLAG_NOPTI, FLAG_WSS};

user_loop_asm!(
    r#"

    /* The workload's begin marker: phase_mark(begin). */
    .macro PHASE_BEGIN kind
    movl ${phase_mark}, %eax
    movl ${begin}, %edi
    SYS \kind
    .endm

    /* The TSC as one 64-bit value in rdx (rax clobbered). */
    .macro RDTSC64
    rdtsc
    shlq $32, %rdx
    orq %rax, %rdx
    .endm

    /* The end marker, phase_mark(end, cycles (rdx), mismatches (rbx));
     * then rdi = the mismatches (the exit status). */
    .macro MARK_END kind
    movq %rdx, %rsi                 /* cycles */
    movq %rbx, %rdx                 /* mismatches */
    movl ${phase_mark}, %eax
    movl ${end}, %edi
    SYS \kind
    movq %rbx, %rdi
    .endm

    .macro USER_PROGRAMS kind
    .balign 16
    .global user_loop_\kind
user_loop_\kind:
    testq ${nopti}, %rbx
    jz 1f
    movl ${arch_prctl}, %eax
    movl ${set_nopti}, %edi
    movl $1, %esi
    SYS \kind
    testq %rax, %rax
    jnz 9f
1:  testq ${kread}, %rbx
    jz 2f
    movq (%r15), %rax               /* must fault */
    movl ${survived}, %edi
    jmp 8f
2:  testq ${wss}, %rbx
    jnz 20f
    movl %r13d, %eax
    movq %r14, %rdi
    xorl %esi, %esi
    xorl %edx, %edx
    SYS \kind
    movq %rax, %rbp                 /* the expected result */
    xorl %ebx, %ebx                 /* mismatches */
    PHASE_BEGIN \kind
    RDTSC64
    movq %rdx, %r15
    testq %r12, %r12                /* iterations=0: an empty phase */
    jz 5f
3:  movl %r13d, %eax
    movq %r14, %rdi
    SYS \kind
    cmpq %rax, %rbp
    je 4f
    incq %rbx
4:  decq %r12
    jnz 3b
5:  rdtsc
    shlq $32, %rdx
    orq %rax, %rdx
    subq %r15, %rdx
    MARK_END \kind
8:  movl ${exit}, %eax
    SYS \kind
    ud2
9:  movl $99, %edi                  /* arch_prctl refused */
    jmp 8b

    /* With a working set: rdx = size, rsi = stride, r9 = reads per
     * iteration, r8 = offset of the next read, r10 = reads, rbp = sum of
     * the words read; on the stack the expected result, the cycles spent
     * in the reads, the fewest in one iteration, the size. rsi/rdx also reach
     * the syscall as its 2nd/3rd arguments, which the loop's calls ignore
     * (write(-1) fails on the descriptor first). */
20: movq {ctrl_size}, %rdx
    movq {ctrl_stride}, %rsi
    movq {ctrl_touches}, %r9
    xorl %eax, %eax                 /* each slot holds its own offset */
21: movq %rax, {base}(%rax)
    addq %rsi, %rax
    cmpq %rdx, %rax
    jb 21b
    movl %r13d, %eax
    movq %r14, %rdi
    SYS \kind
    subq $32, %rsp
    movq %rax, 0(%rsp)              /* the expected result */
    movq $0, 8(%rsp)                /* cycles spent in the reads */
    movq $-1, 16(%rsp)              /* the fewest in one iteration */
    movq %rdx, 24(%rsp)             /* size */
    xorl %ebx, %ebx                 /* mismatches */
    xorl %ebp, %ebp
    xorl %r8d, %r8d
    xorl %r10d, %r10d
    PHASE_BEGIN \kind
    RDTSC64
    movq %rdx, %r15
    testq %r12, %r12
    jz 25f
    /* Each iteration: the reads, timed (RDTSC after LFENCE: the reads are
     * done), then the system call. */
22: lfence
    RDTSC64
    movq %rdx, %r11
    movq 24(%rsp), %rdx
    movq %r9, %rcx
    testq %rcx, %rcx
    jz 24f
23: addq {base}(%r8), %rbp          /* one read of the working set */
    incq %r10
    addq %rsi, %r8
    cmpq %rdx, %r8
    jb 26f
    xorl %r8d, %r8d
26: decq %rcx
    jnz 23b
24: lfence
    RDTSC64
    subq %r11, %rdx
    addq %rdx, 8(%rsp)
    cmpq 16(%rsp), %rdx
    jae 28f
    movq %rdx, 16(%rsp)
28: movl %r13d, %eax
    movq %r14, %rdi
    SYS \kind
    cmpq %rax, (%rsp)
    je 27f
    incq %rbx
27: decq %r12
    jnz 22b
25: rdtsc
    shlq $32, %rdx
    orq %rax, %rdx
    subq %r15, %rdx
    movq %r10, {ctrl_touched}
    movq %rbp, {ctrl_sum}
    movq 8(%rsp), %rax
    movq %rax, {ctrl_tcycles}
    movq 16(%rsp), %rax
    movq %rax, {ctrl_tmin}
    MARK_END \kind
    jmp 8b

    USER_INIT \kind, q, rax, rbx, ebx, rdi
    .endm

"#,
    r#"
    FOR_ENTRIES 1, USER_PROGRAMS
    .purgem PHASE_BEGIN
    .purgem RDTSC64
    .purgem MARK_END
"#,
);

/* sched-messaging (perf bench sched messaging, pipes), written once in
 * arch/x86_shared/user.rs. Parameters: r12 = group, r13 = index in the
 * group, r14 = loops. */
messaging_asm!(
    r#"
    /* The end marker: phase_mark(end, cycles, mismatches). */
    .macro PHASE_END kind
    shlq $32, %rdx
    orq %rax, %rdx
    movq %rdx, %rsi                 /* cycles */
    movl (%rsp), %edx               /* mismatches */
    movl ${end}, %edi
    movl ${phase_mark}, %eax
    SYS \kind
    .endm

"#,
    r#"
    FOR_ENTRIES 1, MSG_PROGRAMS, q, rsp, rax, rdi, rcx, edi, esi, edx, rsi, r12d, r13d, r14d
"#,
);

// The poundsyscall worker (mmtests, arch/x86_shared/user.rs): r12 = calls,
// r13 = the expected getppid result, mismatches counted in rbx; with a
// working set also r14 = the thread's index. One copy per entry
// instruction.
pound_asm!(
    r#"
    FOR_ENTRIES 1, USER_POUND, q, rax, rbx, ebx, r12, r13, rdi
    FOR_ENTRIES 1, USER_POUND_WSS, q, rsp, rax, rdx, ebp, rbx, ebx, r12, r13, r14, rdi
"#,
);

// The entries of this flavour: 1 SYSCALL, 3 `int $0x80`, 4 `int3`, 5 `int $4`.
program_lookup!(1);
