//! User programs of the 32-bit flavour, linked into the `.user` section at
//! user addresses (`USER_TEXT_BASE`) and mapped read-only and executable
//! into each process. Self-contained assembly, one copy per entry
//! instruction (2 SYSENTER, 3 `int $0x80`, 4 `int3`, 5 `int $4`: the
//! `ptiscope_abi::telemetry::entry` codes).
//!
//! Register ABI: eax = number, ebx ecx edx esi = arguments, eax = result,
//! all else preserved (see entry.rs). Parameters of `user_loop` arrive in
//! the callee-saved registers: ebx = syscall number | flags << 16 (bit 0:
//! opt out of PTI first, bit 1: read the kernel address in ebp first,
//! bit 2: the loop with a working set, as on x86_64: see workingset.rs),
//! esi = iterations, edi = first argument, ebp = kernel address. The loop's
//! state lives on the user stack (user code runs natively; only kernel
//! paths are measured). `phase_mark(end, cycles_lo, mismatches, cycles_hi)`
//! passes the 64-bit cycle count in two words.
//!
//! Only `user_loop` and the SYSENTER stub are written here; `user_init`, the
//! sched-messaging programs and the poundsyscall worker are written once for
//! both flavours in arch/x86_shared/user.rs and instantiated here with this
//! flavour's register names.
use crate::arch::x86_shared::user::{messaging_asm, pound_asm, program_lookup, user_loop_asm};
pub use crate::arch::x86_shared::user::{section, FLAG_KREAD, FLAG_NOPTI, FLAG_WSS};

user_loop_asm!(
    r#"

    /* The 64-bit word at off(%esp) to the control-page word at `dst`, in
     * halves through eax. */
    .macro STORE64 off, dst
    movl \off(%esp), %eax
    movl %eax, \dst
    movl \off+4(%esp), %eax
    movl %eax, \dst+4
    .endm

    /* The cycles since the TSC saved at off(%esp): high word in esi, low
     * word in ecx (edx:eax clobbered). */
    .macro CYCLES_SINCE off
    rdtsc
    subl \off(%esp), %eax
    sbbl \off+4(%esp), %edx
    movl %edx, %esi                 /* cycles, high word */
    movl %eax, %ecx                 /* cycles, low word */
    .endm

    /* The end marker, phase_mark(end, cycles_lo, mismatches, cycles_hi),
     * with the mismatches at off(%esp); then ebx = the mismatches (the
     * exit status). */
    .macro MARK_END kind, off
    movl \off(%esp), %edx           /* mismatches */
    movl ${end}, %ebx
    movl ${phase_mark}, %eax
    SYS \kind
    movl \off(%esp), %ebx
    .endm

    .macro USER_PROGRAMS kind
    .balign 16
    .global user_loop_\kind
user_loop_\kind:
    subl $32, %esp                  /* 0 nr, 4 iterations, 8 arg0, 12 flags, 20 mismatches, 24/28 tsc */
    movl %ebx, %eax
    andl $0xffff, %eax
    movl %eax, 0(%esp)
    shrl $16, %ebx
    movl %ebx, 12(%esp)
    movl %esi, 4(%esp)
    movl %edi, 8(%esp)
    movl $0, 20(%esp)
    testl ${nopti}, 12(%esp)
    jz 1f
    movl ${arch_prctl}, %eax
    movl ${set_nopti}, %ebx
    movl $1, %ecx
    SYS \kind
    testl %eax, %eax
    jnz 9f
1:  testl ${kread}, 12(%esp)
    jz 2f
    movl (%ebp), %eax               /* must fault */
    movl ${survived}, %ebx
    jmp 8f
2:  testl ${wss}, 12(%esp)
    jnz 20f
    movl 0(%esp), %edi              /* number, for the whole loop */
    movl 8(%esp), %ebx              /* first argument */
    xorl %ecx, %ecx
    xorl %edx, %edx
    movl %edi, %eax
    SYS \kind
    movl %eax, %ebp                 /* the expected result */
    movl ${phase_mark}, %eax
    pushl %ebx
    movl ${begin}, %ebx
    SYS \kind
    popl %ebx
    movl 4(%esp), %esi              /* iteration counter */
    rdtsc
    movl %eax, 24(%esp)
    movl %edx, 28(%esp)
    xorl %edx, %edx
    testl %esi, %esi                /* iterations=0: an empty phase */
    jz 5f
3:  movl %edi, %eax
    SYS \kind
    cmpl %eax, %ebp
    je 4f
    incl 20(%esp)
4:  decl %esi
    jnz 3b
5:  CYCLES_SINCE 24
    MARK_END \kind, 20
8:  movl ${exit}, %eax
    SYS \kind
    ud2
9:  movl $99, %ebx                  /* arch_prctl refused */
    jmp 8b

    /* With a working set: 48 more bytes of frame (0/4 reads, 8 sum of the
     * words read, 12 reads per iteration, 16 stride, 20 size, 24/28 cycles
     * spent in the reads, 32 TSC at this iteration's first read, 36/40 the
     * fewest cycles of one iteration; the frame above moves up by 48),
     * esi = offset of the next read, edi = number, ebx = first argument,
     * ebp = the expected result. ecx/edx also reach the syscall as its
     * 2nd/3rd arguments, which the loop's calls ignore. */
20: subl $48, %esp
    movl {ctrl_size}, %eax
    movl %eax, 20(%esp)
    movl {ctrl_stride}, %ecx
    movl %ecx, 16(%esp)
    movl {ctrl_touches}, %edx
    movl %edx, 12(%esp)
    movl $0, 0(%esp)
    movl $0, 4(%esp)
    movl $0, 8(%esp)
    movl $0, 24(%esp)
    movl $0, 28(%esp)
    movl $-1, 36(%esp)
    movl $-1, 40(%esp)
    xorl %edx, %edx                 /* each slot holds its own offset */
21: movl %edx, {base}(%edx)
    addl %ecx, %edx
    cmpl %eax, %edx
    jb 21b
    movl 48(%esp), %edi
    movl 56(%esp), %ebx
    movl %edi, %eax
    SYS \kind
    movl %eax, %ebp
    movl ${phase_mark}, %eax
    pushl %ebx
    movl ${begin}, %ebx
    SYS \kind
    popl %ebx
    rdtsc
    movl %eax, 72(%esp)
    movl %edx, 76(%esp)
    xorl %esi, %esi
    cmpl $0, 52(%esp)               /* iterations=0: an empty phase */
    je 25f
    /* Each iteration: the reads, timed (RDTSC after LFENCE: the reads are
     * done), then the system call. */
22: lfence
    rdtsc
    movl %eax, 32(%esp)
    movl 12(%esp), %ecx
    testl %ecx, %ecx
    jz 24f
    movl 8(%esp), %eax
    xorl %edx, %edx
23: addl {base}(%esi), %eax         /* one read of the working set */
    incl %edx
    addl 16(%esp), %esi
    cmpl 20(%esp), %esi
    jb 26f
    xorl %esi, %esi
26: decl %ecx
    jnz 23b
    movl %eax, 8(%esp)
    addl %edx, 0(%esp)
    adcl $0, 4(%esp)
24: lfence
    rdtsc
    subl 32(%esp), %eax
    addl %eax, 24(%esp)
    adcl $0, 28(%esp)
    cmpl $0, 40(%esp)               /* no iteration yet */
    jne 29f
    cmpl 36(%esp), %eax
    jae 28f
29: movl %eax, 36(%esp)
    movl $0, 40(%esp)
28: movl %edi, %eax
    SYS \kind
    cmpl %eax, %ebp
    je 27f
    incl 68(%esp)
27: decl 52(%esp)
    jnz 22b
25: CYCLES_SINCE 72
    STORE64 0, {ctrl_touched}
    movl 8(%esp), %eax
    movl %eax, {ctrl_sum}
    STORE64 24, {ctrl_tcycles}
    STORE64 36, {ctrl_tmin}
    MARK_END \kind, 68
    jmp 8b

    USER_INIT \kind, l, eax, edi, edi, ebx
    .endm

"#,
    r#"
    /* The SYSENTER call stub (Linux: the vDSO's __kernel_vsyscall): the
     * kernel returns with SYSEXIT to user_sysenter_return, ESP = ebp. */
    .balign 16
    .global user_sysenter
user_sysenter:
    pushl %ecx
    pushl %edx
    pushl %ebp
    movl %esp, %ebp
    sysenter
    .global user_sysenter_return
user_sysenter_return:
    popl %ebp
    popl %edx
    popl %ecx
    ret

    FOR_ENTRIES 2, USER_PROGRAMS
    .purgem STORE64
    .purgem CYCLES_SINCE
    .purgem MARK_END
"#,
);

/* sched-messaging (perf bench sched messaging, pipes), written once in
 * arch/x86_shared/user.rs. Parameters: ebx = group, esi = index in the
 * group, edi = loops. */
messaging_asm!(
    r#"
    /* The end marker: phase_mark(end, cycles_lo, mismatches, cycles_hi). */
    .macro PHASE_END kind
    movl %edx, %esi                 /* cycles, high word */
    movl %eax, %ecx                 /* cycles, low word */
    movl (%esp), %edx               /* mismatches */
    movl ${end}, %ebx
    movl ${phase_mark}, %eax
    SYS \kind
    .endm

"#,
    r#"
    FOR_ENTRIES 2, MSG_PROGRAMS, l, esp, eax, edi, ecx, ebx, ecx, edx, ecx, ebx, esi, edi
"#,
);

// The poundsyscall worker (mmtests, arch/x86_shared/user.rs): ebx = calls,
// esi = the expected getppid result, mismatches counted in edi; with a
// working set, edi arrives as the thread's index (saved before the count).
pound_asm!(
    r#"
    FOR_ENTRIES 2, USER_POUND, l, eax, edi, edi, ebx, esi, ebx
    FOR_ENTRIES 2, USER_POUND_WSS, l, esp, eax, edx, ebp, edi, edi, ebx, esi, edi, ebx
"#,
);

// The entries of this flavour: 2 SYSENTER, 3 `int $0x80`, 4 `int3`, 5 `int $4`.
program_lookup!(2);
