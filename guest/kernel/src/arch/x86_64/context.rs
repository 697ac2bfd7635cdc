//! Kernel context switch: callee-saved registers and RSP.
crate::arch::x86_shared::context::switch_to_asm!(
    r#"
    /* switch_to(save: *mut u64 (rdi), next_rsp: u64 (rsi)) */
switch_to:
    SWITCH_STACKS %rsp, %rdi, %rsi, %rbp, %rbx, %r12, %r13, %r14, %r15
"#,
);

pub use crate::arch::x86_shared::context::switch_to;

crate::arch::x86_shared::context::user_regs!(u64: rbx, rbp, r12, r13, r14, r15);

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
    let popped = [regs.r15, regs.r14, regs.r13, regs.r12, regs.rbx, regs.rbp].map(|r| r as usize);
    // SAFETY: the caller's guarantee (128 bytes: 12 words).
    unsafe { crate::arch::x86_shared::context::initial_stack_with(top, popped, rip, rsp) }
}
