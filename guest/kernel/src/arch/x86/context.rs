//! Kernel context switch (callee-saved registers and ESP, cdecl) and a new
//! task's first kernel stack.
use core::arch::global_asm;

global_asm!(
    r#"
    .section .text.switch_to, "ax"
    .global switch_to
    /* switch_to(save: *mut u64, next_esp: u64), cdecl: save at 4(%esp),
     * next_esp's low word at 8(%esp). Only the low word of *save is
     * written; the high word stays 0. */
switch_to:
    movl 4(%esp), %eax
    movl 8(%esp), %edx
    pushl %ebp
    pushl %ebx
    pushl %esi
    pushl %edi
    movl %esp, (%eax)
    movl %edx, %esp
    popl %edi
    popl %esi
    popl %ebx
    popl %ebp
    ret
"#,
    options(att_syntax)
);

extern "C" {
    /// Saves the current kernel context's ESP at `save` and resumes the one
    /// whose ESP is `next_rsp` (as left by a previous `switch_to`, or built
    /// by [`initial_stack`]).
    pub fn switch_to(save: *mut u64, next_rsp: u64);
    /// Code label in entry.rs; only its address is used.
    static task_first_return: u8;
}

/// Initial user registers of a new task (the callee-saved ones, which the
/// kernel preserves; user programs take their parameters there).
#[derive(Clone, Copy, Default)]
pub struct UserRegs {
    pub ebx: u32,
    pub esi: u32,
    pub edi: u32,
    pub ebp: u32,
}

impl UserRegs {
    /// Initial registers of `user_loop` (see user.rs): ebx = syscall number
    /// | flags << 16, esi = iterations, edi = first argument, ebp = the
    /// kernel address a `fault=kread` run reads.
    pub fn workload(flags: u64, iterations: u64, number: u64, arg0: u64, kread: u64) -> Self {
        UserRegs {
            ebx: (number as u32 & 0xffff) | (flags as u32) << 16,
            esi: iterations as u32,
            edi: arg0 as u32,
            ebp: kread as u32,
        }
    }
}

impl UserRegs {
    /// Initial registers of the sched-messaging programs (user.rs):
    /// ebx, esi, edi, ebp = `p`.
    pub fn params(p: [u64; 4]) -> Self {
        UserRegs {
            ebx: p[0] as u32,
            esi: p[1] as u32,
            edi: p[2] as u32,
            ebp: p[3] as u32,
        }
    }
}

/// Lays out a new task's kernel stack so that `switch_to` to the returned
/// ESP enters user mode at `rip` with stack `rsp` (via task_first_return).
///
/// # Safety
/// `top` must be the 16-byte aligned top of a writable kernel stack of at
/// least 64 bytes that nothing else uses.
pub unsafe fn initial_stack(top: u64, rip: u64, rsp: u64, regs: &UserRegs) -> u64 {
    use super::descriptors::{USER_CS, USER_DS};
    // Interrupts stay off in user mode, as on x86_64.
    const EFLAGS: u32 = 0x2;
    let words: [u32; 10] = [
        regs.edi,
        regs.esi,
        regs.ebx,
        regs.ebp,
        core::ptr::addr_of!(task_first_return) as u32,
        rip as u32,
        USER_CS as u32,
        EFLAGS,
        rsp as u32,
        USER_DS as u32,
    ];
    let base = top - (words.len() as u64) * 4;
    // SAFETY: [base, top) lies inside the stack (caller's guarantee).
    unsafe {
        core::ptr::copy_nonoverlapping(words.as_ptr(), base as usize as *mut u32, words.len())
    };
    base
}
