//! Kernel context switch: callee-saved registers and RSP.
use core::arch::global_asm;

global_asm!(
    r#"
    .section .text.switch_to, "ax"
    .global switch_to
    /* switch_to(save: *mut u64 (rdi), next_rsp: u64 (rsi)) */
switch_to:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
"#,
    options(att_syntax)
);

extern "C" {
    /// Saves the current kernel context's RSP at `save` and resumes the one
    /// whose RSP is `next_rsp` (as left by a previous `switch_to`, or built
    /// by [`initial_stack`]).
    pub fn switch_to(save: *mut u64, next_rsp: u64);
    /// Code label in entry.rs; only its address is used.
    static task_first_return: u8;
}

/// Initial user registers of a new task (the callee-saved ones: the kernel
/// preserves them, so user programs take their parameters there).
#[derive(Clone, Copy, Default)]
pub struct UserRegs {
    pub rbx: u64,
    pub rbp: u64,
    pub r12: u64,
    pub r13: u64,
    pub r14: u64,
    pub r15: u64,
}

impl UserRegs {
    /// Initial registers of `user_loop` (see user.rs): rbx = flags,
    /// r12 = iterations, r13 = syscall number, r14 = first argument,
    /// r15 = the kernel address a `fault=kread` run reads.
    pub fn workload(flags: u64, iterations: u64, number: u64, arg0: u64, kread: u64) -> Self {
        UserRegs {
            rbx: flags,
            rbp: 0,
            r12: iterations,
            r13: number,
            r14: arg0,
            r15: kread,
        }
    }
}

impl UserRegs {
    /// Initial registers of the sched-messaging programs (user.rs):
    /// r12..r15 = `p`.
    pub fn params(p: [u64; 4]) -> Self {
        UserRegs {
            r12: p[0],
            r13: p[1],
            r14: p[2],
            r15: p[3],
            ..Self::default()
        }
    }
}

/// Lays out a new task's kernel stack so that `switch_to` to the returned
/// RSP enters user mode at `rip` with stack `rsp` (via task_first_return).
///
/// # Safety
/// `top` must be the 16-byte aligned top of a writable kernel stack of at
/// least 128 bytes that nothing else uses.
pub unsafe fn initial_stack(top: u64, rip: u64, rsp: u64, regs: &UserRegs) -> u64 {
    use super::descriptors::{USER_CS, USER_DS};
    // Interrupts stay off in user mode: the guest uses no interrupt sources
    // and has no IRQ vectors in its IDT.
    const RFLAGS: u64 = 0x2;
    let words: [u64; 12] = [
        regs.r15,
        regs.r14,
        regs.r13,
        regs.r12,
        regs.rbx,
        regs.rbp,
        core::ptr::addr_of!(task_first_return) as u64,
        rip,
        USER_CS as u64,
        RFLAGS,
        rsp,
        USER_DS as u64,
    ];
    let base = top - (words.len() as u64) * 8;
    // SAFETY: [base, top) lies inside the stack (caller's guarantee).
    unsafe { core::ptr::copy_nonoverlapping(words.as_ptr(), base as *mut u64, words.len()) };
    base
}
