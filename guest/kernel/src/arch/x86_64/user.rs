//! User programs, linked into the `.user` section at user addresses
//! (`USER_TEXT_BASE`) and mapped read-only and executable into each process.
//! They are self-contained assembly: no call leaves `.user.text`, system
//! calls use the instruction of the configured entry, one copy per entry.
//!
//! Parameters arrive in callee-saved registers, which the kernel preserves:
//! * `user_loop`: r12 = iterations, r13 = syscall number, r14 = first
//!   argument, rbx = flags (bit 0: opt out of PTI first, bit 1: read the
//!   kernel address in r15 first). Calls the syscall once for the expected
//!   value, marks the phase begin, loops with RDTSC around, marks the end
//!   with (cycles, mismatches), exits with the number of mismatches.
//! * `user_init`: waits for its children; exits with the last child status.
use core::arch::global_asm;
use ptiscope_abi::syscall as nr;

/// Flags in rbx of `user_loop`.
pub const FLAG_NOPTI: u64 = 1;
pub const FLAG_KREAD: u64 = 2;
/// Exit status of `user_loop` when its kernel read did not fault.
pub const KREAD_SURVIVED: u64 = 77;

global_asm!(
    r#"
    .macro SYS kind
    .if \kind == 1
    syscall
    .elseif \kind == 3
    int $0x80
    .elseif \kind == 4
    int3
    .else
    int $4
    .endif
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
2:  movl %r13d, %eax
    movq %r14, %rdi
    xorl %esi, %esi
    xorl %edx, %edx
    SYS \kind
    movq %rax, %rbp                 /* the expected result */
    xorl %ebx, %ebx                 /* mismatches */
    movl ${phase_mark}, %eax
    movl ${begin}, %edi
    SYS \kind
    rdtsc
    shlq $32, %rdx
    orq %rax, %rdx
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
    movq %rdx, %rsi                 /* cycles */
    movq %rbx, %rdx                 /* mismatches */
    movl ${phase_mark}, %eax
    movl ${end}, %edi
    SYS \kind
    movq %rbx, %rdi
8:  movl ${exit}, %eax
    SYS \kind
    ud2
9:  movl $99, %edi                  /* arch_prctl refused */
    jmp 8b

    .balign 16
    .global user_init_\kind
user_init_\kind:
    xorl %ebx, %ebx
1:  movl ${wait}, %eax
    SYS \kind
    testq %rax, %rax
    js 2f
    movq %rax, %rbx
    jmp 1b
2:  movl ${exit}, %eax
    movq %rbx, %rdi
    SYS \kind
    ud2
    .endm

    .section .user.text, "ax"
    USER_PROGRAMS 1
    USER_PROGRAMS 3
    USER_PROGRAMS 4
    USER_PROGRAMS 5
    .purgem USER_PROGRAMS
    .purgem SYS
    .previous
"#,
    nopti = const FLAG_NOPTI,
    kread = const FLAG_KREAD,
    survived = const KREAD_SURVIVED,
    arch_prctl = const nr::ARCH_PRCTL,
    set_nopti = const nr::ARCH_SET_NOPTI,
    phase_mark = const nr::PHASE_MARK,
    begin = const ptiscope_abi::phase::Marker::begin(ptiscope_abi::phase::ID_WORKLOAD).encode(),
    end = const ptiscope_abi::phase::Marker::end(ptiscope_abi::phase::ID_WORKLOAD).encode(),
    exit = const nr::EXIT,
    wait = const nr::WAIT,
    options(att_syntax)
);

extern "C" {
    static user_loop_1: u8;
    static user_loop_3: u8;
    static user_loop_4: u8;
    static user_loop_5: u8;
    static user_init_1: u8;
    static user_init_3: u8;
    static user_init_4: u8;
    static user_init_5: u8;
    static __user_start: u8;
    static __user_end: u8;
    static __user_phys: u8;
}

/// User addresses of (`user_loop`, `user_init`) for an entry (ABI code).
pub fn programs(entry_code: u32) -> (u64, u64) {
    use core::ptr::addr_of;
    let (l, i) = match entry_code {
        1 => (addr_of!(user_loop_1), addr_of!(user_init_1)),
        3 => (addr_of!(user_loop_3), addr_of!(user_init_3)),
        4 => (addr_of!(user_loop_4), addr_of!(user_init_4)),
        _ => (addr_of!(user_loop_5), addr_of!(user_init_5)),
    };
    (l as u64, i as u64)
}

/// Physical address and page count of the user section.
pub fn section() -> (u64, u64) {
    use core::ptr::addr_of;
    let start = addr_of!(__user_start) as u64;
    let end = addr_of!(__user_end) as u64;
    (addr_of!(__user_phys) as u64, (end - start) / 4096)
}
