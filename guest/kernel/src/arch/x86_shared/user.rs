//! What the two flavours' user programs share. The programs are assembly in
//! `.user.text` (no call leaves it), one copy per entry instruction; the ones
//! whose shape is the same on both flavours are written here once as GAS
//! macros whose parameters are the flavour's operand-size suffix and register
//! names, so each flavour assembles exactly the instructions it had when they
//! were written twice:
//! * `SYS kind` (`sys_macro!`): the system-call instruction of an entry
//!   (ABI entry code: 1 SYSCALL, 2 SYSENTER through `user_sysenter`,
//!   3 `int $0x80`, 4 `int3`, 5 `int $4`);
//! * `USER_INIT` (`init_program!`): pid 1, reaps its children and exits with
//!   the last status;
//! * `USER_POUND` (`pound_program!`): the poundsyscall worker, getppid in a
//!   loop checking each result.
//!
//! What stays per flavour (arch/*/user.rs): `user_loop` (the measured loop,
//! written for each register ABI) and the sched-messaging parent, sender and
//! receiver, which on x86_32 keep their state on the stack because four of
//! its seven registers carry system-call arguments. The Rust side (flags,
//! program addresses, the section) is shared below.

/// Flags of `user_loop` (rbx on x86_64, ebx >> 16 on x86_32).
pub const FLAG_NOPTI: u64 = 1;
pub const FLAG_KREAD: u64 = 2;
pub const FLAG_WSS: u64 = 4;
/// Exit status of `user_loop` when its kernel read did not fault.
pub const KREAD_SURVIVED: u64 = 77;

/// `SYS kind`: the syscall instruction of entry method `kind` (the ABI
/// entry code). Each asm block that splices it in purges it at its end.
macro_rules! sys_macro {
    () => {
        r#"
    .macro SYS kind
    .if \kind == 1
    syscall
    .elseif \kind == 2
    call user_sysenter
    .elseif \kind == 3
    int $0x80
    .elseif \kind == 4
    int3
    .else
    int $4
    .endif
    .endm
"#
    };
}
pub(crate) use sys_macro;

/// `USER_INIT kind, sfx, ax, acc, acc32, arg0` defines `user_init_<kind>`:
/// waits for children until `wait` fails, keeping the last status in `acc`
/// (a register the kernel preserves), then exits with it (`arg0` = the first
/// syscall argument). Needs `SYS` and the operands `wait`, `exit`.
macro_rules! init_program {
    () => {
        r#"
    .macro USER_INIT kind, sfx, ax, acc, acc32, arg0
    .balign 16
    .global user_init_\kind
user_init_\kind:
    xorl %\acc32, %\acc32
1:  movl ${wait}, %eax
    SYS \kind
    test\sfx %\ax, %\ax
    js 2f
    mov\sfx %\ax, %\acc
    jmp 1b
2:  movl ${exit}, %eax
    mov\sfx %\acc, %\arg0
    SYS \kind
    ud2
    .endm
"#
    };
}
pub(crate) use init_program;

/// `USER_POUND kind, sfx, ax, acc, acc32, count, expected, arg0` defines
/// `user_pound_<kind>`, the poundsyscall worker (mmtests): calls getppid
/// `count` times, counts results other than `expected` in `acc`, exits with
/// the count. All named registers are preserved by the kernel. Needs `SYS`
/// and the operands `getppid`, `exit`.
macro_rules! pound_program {
    () => {
        r#"
    .macro USER_POUND kind, sfx, ax, acc, acc32, count, expected, arg0
    .balign 16
    .global user_pound_\kind
user_pound_\kind:
    xorl %\acc32, %\acc32
    test\sfx %\count, %\count
    jz 2f
1:  movl ${getppid}, %eax
    SYS \kind
    cmp\sfx %\ax, %\expected
    je 3f
    inc\sfx %\acc
3:  dec\sfx %\count
    jnz 1b
2:  mov\sfx %\acc, %\arg0
    movl ${exit}, %eax
    SYS \kind
    ud2
    .endm
"#
    };
}
pub(crate) use pound_program;

/// A pointer to the `.user.text` symbol named `$name`.
macro_rules! user_symbol {
    ($name:expr) => {{
        extern "C" {
            #[link_name = $name]
            static SYMBOL: u8;
        }
        core::ptr::addr_of!(SYMBOL)
    }};
}
pub(crate) use user_symbol;

/// Pointers to the programs named by the prefixes for an entry code, as a
/// tuple; `$first` is the flavour's fast entry (1 SYSCALL on x86_64,
/// 2 SYSENTER on x86_32), any code above 4 means `int $4` (5).
macro_rules! by_entry {
    ($code:expr, $first:literal, $($prefix:literal),+) => {
        match $code {
            $first => ($($crate::arch::x86_shared::user::user_symbol!(concat!($prefix, $first)),)+),
            3 => ($($crate::arch::x86_shared::user::user_symbol!(concat!($prefix, 3)),)+),
            4 => ($($crate::arch::x86_shared::user::user_symbol!(concat!($prefix, 4)),)+),
            _ => ($($crate::arch::x86_shared::user::user_symbol!(concat!($prefix, 5)),)+),
        }
    };
}
pub(crate) use by_entry;

/// Defines the flavour's program look-ups (`programs`,
/// `messaging_programs`, `pound_program`) for its entry codes `$first`, 3,
/// 4, 5.
macro_rules! program_lookup {
    ($first:literal) => {
        /// User addresses of (`user_loop`, `user_init`) for an entry (ABI code).
        pub fn programs(entry_code: u32) -> (u64, u64) {
            let (l, i) = $crate::arch::x86_shared::user::by_entry!(
                entry_code,
                $first,
                "user_loop_",
                "user_init_"
            );
            (l as u64, i as u64)
        }

        /// User addresses of the sched-messaging programs (parent, sender,
        /// receiver) for an entry (ABI code).
        pub fn messaging_programs(entry_code: u32) -> (u64, u64, u64) {
            let (p, s, r) = $crate::arch::x86_shared::user::by_entry!(
                entry_code,
                $first,
                "user_msg_parent_",
                "user_msg_sender_",
                "user_msg_receiver_"
            );
            (p as u64, s as u64, r as u64)
        }

        /// User address of the poundsyscall worker for an entry (ABI code).
        pub fn pound_program(entry_code: u32) -> u64 {
            let (p,) = $crate::arch::x86_shared::user::by_entry!(entry_code, $first, "user_pound_");
            p as u64
        }
    };
}
pub(crate) use program_lookup;

/// Physical address and page count of the user section.
pub fn section() -> (u64, u64) {
    use core::ptr::addr_of;
    extern "C" {
        static __user_start: u8;
        static __user_end: u8;
        static __user_phys: u8;
    }
    let start = addr_of!(__user_start) as u64;
    let end = addr_of!(__user_end) as u64;
    (addr_of!(__user_phys) as u64, (end - start) / 4096)
}
