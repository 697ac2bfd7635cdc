//! Kernel context switch (callee-saved registers and ESP, cdecl) and a new
//! task's first kernel stack.
crate::arch::x86_shared::context::switch_to_asm!(
    r#"
    /* switch_to(save: *mut u64, next_esp: u64), cdecl: save at 4(%esp),
     * next_esp's low word at 8(%esp). Only the low word of *save is
     * written; the high word stays 0. */
switch_to:
    movl 4(%esp), %eax
    movl 8(%esp), %edx
    SWITCH_STACKS %esp, %eax, %edx, %ebp, %ebx, %esi, %edi
"#,
);

pub use crate::arch::x86_shared::context::switch_to;

crate::arch::x86_shared::context::user_regs!(u32: ebx, esi, edi, ebp);

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
    let popped = [regs.edi, regs.esi, regs.ebx, regs.ebp].map(|r| r as usize);
    // SAFETY: the caller's guarantee (64 bytes: 10 words).
    unsafe { crate::arch::x86_shared::context::initial_stack_with(top, popped, rip, rsp) }
}
