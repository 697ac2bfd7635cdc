//! What both flavours' context switches (`arch/*/context.rs`) share: the
//! switch itself as a GAS macro over the callee-saved registers, and the
//! layout of a new task's first kernel stack.

/// `SWITCH_STACKS sp, save, next, regs…`: pushes `regs` in order, stores
/// the stack pointer `sp` at `(save)`, loads `next` into it and pops `regs`
/// in reverse order (the macro recurses once per register, so each push is
/// paired with its pop). The flavour's `switch_to` loads `save` and `next`
/// from its calling convention, then `ret`s.
macro_rules! switch_stacks_macro {
    () => {
        r#"
    .macro SWITCH_STACKS sp, save, next, reg, rest:vararg
    push \reg
    .ifb \rest
    mov \sp, (\save)
    mov \next, \sp
    .else
    SWITCH_STACKS \sp, \save, \next, \rest
    .endif
    pop \reg
    .endm
"#
    };
}
pub(crate) use switch_stacks_macro;

/// `switch_to_asm!(body)`: the flavour's `switch_to` in `.text.switch_to`:
/// `body` loads `save` and `next` from its calling convention and invokes
/// `SWITCH_STACKS`; then `ret`.
macro_rules! switch_to_asm {
    ($body:expr $(,)?) => {
        core::arch::global_asm!(
            $crate::arch::x86_shared::context::switch_stacks_macro!(),
            "    .section .text.switch_to, \"ax\"
    .global switch_to",
            $body,
            "    ret
    .purgem SWITCH_STACKS",
            options(att_syntax)
        );
    };
}
pub(crate) use switch_to_asm;

/// `user_regs!(attrs… type: regs…)`: the flavour's `UserRegs`, the initial
/// user registers of a new task (the callee-saved ones, which the kernel
/// preserves; user programs take their parameters there), each a `type`.
macro_rules! user_regs {
    ($(#[$m:meta])* $t:ty: $($r:ident),+ $(,)?) => {
        $(#[$m])*
        #[derive(Clone, Copy, Default)]
        pub struct UserRegs {
            $(pub $r: $t,)+
        }
    };
}
pub(crate) use user_regs;

extern "C" {
    /// Saves the current kernel context's stack pointer at `save` and
    /// resumes the one whose stack pointer is `next_rsp` (as left by a
    /// previous `switch_to`, or built by the flavour's `initial_stack`).
    /// Each flavour's context.rs defines it with `SWITCH_STACKS`.
    pub fn switch_to(save: *mut u64, next_rsp: u64);
    /// Code label in entry.rs; only its address is used.
    static task_first_return: u8;
}

/// Lays out a new task's kernel stack below `top` so that `switch_to` to
/// the returned stack pointer pops `popped` (the callee-saved registers, in
/// the order `switch_to` pops them), returns to `task_first_return` and
/// enters user mode at `rip` with stack `rsp` through the iret frame above.
/// Interrupts stay off in user mode (RFLAGS = 0x2): the guest uses no
/// interrupt sources in user mode and has no IRQ vectors but the IPI.
///
/// # Safety
/// `top` must be the 16-byte aligned top of a writable kernel stack with
/// room for `K + 6` words that nothing else uses.
pub unsafe fn initial_stack_with<const K: usize>(
    top: u64,
    popped: [usize; K],
    rip: u64,
    rsp: u64,
) -> u64 {
    use crate::arch::descriptors::{USER_CS, USER_DS};
    const FLAGS: usize = 0x2;
    let frame: [usize; 6] = [
        core::ptr::addr_of!(task_first_return) as usize,
        rip as usize,
        USER_CS as usize,
        FLAGS,
        rsp as usize,
        USER_DS as usize,
    ];
    let words = K + frame.len();
    let base = top - (words * size_of::<usize>()) as u64;
    let p = base as usize as *mut usize;
    // SAFETY: [base, top) lies inside the stack (caller's guarantee).
    unsafe {
        core::ptr::copy_nonoverlapping(popped.as_ptr(), p, K);
        core::ptr::copy_nonoverlapping(frame.as_ptr(), p.add(K), frame.len());
    }
    base
}
