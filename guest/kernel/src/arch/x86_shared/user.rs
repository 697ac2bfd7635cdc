//! What the two flavours' user programs share. The programs are assembly in
//! `.user.text` (no call leaves it), one copy per entry instruction; the ones
//! whose shape is the same on both flavours are written here once as GAS
//! macros whose parameters are the flavour's operand-size suffix and register
//! names (`SYS`, `USER_INIT` and `USER_POUND` assemble exactly the
//! instructions each flavour had when they were written twice; the
//! sched-messaging programs are x86_32's, which x86_64 now runs too):
//! * `SYS kind` (`sys_macro!`): the system-call instruction of an entry
//!   (ABI entry code: 1 SYSCALL, 2 SYSENTER through `user_sysenter`,
//!   3 `int $0x80`, 4 `int3`, 5 `int $4`);
//! * `USER_INIT` (`init_program!`): pid 1, reaps its children and exits with
//!   the last status;
//! * `USER_POUND` (`pound_program!`): the poundsyscall worker, getppid in a
//!   loop checking each result;
//! * `USER_POUND_WSS` (`pound_wss_programs!`): the same with a user working
//!   set (`wss=`) read before each call, and the parent that fills it;
//! * `MSG_PROGRAMS` (`messaging_programs!`): the sched-messaging parent,
//!   sender and receiver, their state on the stack in both flavours (x86_32
//!   has too few registers), the end marker a per-flavour `PHASE_END`.
//!
//! What stays per flavour (arch/*/user.rs): `user_loop`, the measured
//! syscall loop and its working-set variant, written for each register ABI
//! (x86_32 passes the loop's parameters packed and keeps its state on the
//! stack; the 64-bit cycle count is one register or two words), the
//! `PHASE_END` macro and, on x86_32, the SYSENTER stub. Their asm block
//! (`user_loop_asm!`: section, purges, operands) and the Rust side (flags,
//! program addresses, the section) are shared below.

/// Flags of `user_loop` (rbx on x86_64, ebx >> 16 on x86_32).
pub const FLAG_NOPTI: u64 = 1;
pub const FLAG_KREAD: u64 = 2;
pub const FLAG_WSS: u64 = 4;
/// Exit status of `user_loop` when its kernel read did not fault.
pub const KREAD_SURVIVED: u64 = 77;

/// `SYS kind`: the syscall instruction of entry method `kind` (the ABI
/// entry code), and `FOR_ENTRIES first, mac, args`, which instantiates a
/// program macro for each of the flavour's entries. Each asm block that
/// splices them in purges them at its end.
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

    /* `FOR_ENTRIES first, mac, args`: `mac kind, args` for each entry of
     * the flavour, `first` (its fast entry) then 3, 4, 5. */
    .macro FOR_ENTRIES first, mac, args:vararg
    .irp kind, \first, 3, 4, 5
    .ifb \args
    \mac \kind
    .else
    \mac \kind, \args
    .endif
    .endr
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

/// `USER_POUND_WSS kind, sfx, sp, ax, dx, bp32, acc, acc32, count,
/// expected, index, arg0` defines the poundsyscall programs with a user
/// working set (`wss=`, see workingset.rs):
/// * `user_pound_parent_wss_<kind>`: writes each slot's offset into the
///   buffer (before the phase begins, so the threads find it written),
///   then goes on as the sched-messaging parent (phase markers, reaps);
/// * `user_pound_wss_<kind>`: the worker of `USER_POUND` that reads
///   `touches` slots of the buffer before each getppid, cycling through it
///   from offset 0, and before it exits writes its read count and the sum
///   of what it read into its record of the control page (thread `index`).
///
/// The worker's state is on its stack (x86_32 has too few registers):
/// 0/4 reads (low/high word), 8 sum (machine word), 16 next offset,
/// 24 size, 28 stride, 32 touches, 40 index. `index` may be the same
/// register as `acc` (it is saved first). Needs `SYS`, the operands
/// `getppid`, `exit`, `base`, `ctrl_size`, `ctrl_stride`, `ctrl_touches`,
/// `ctrl_threads`, and `user_msg_parent_<kind>`.
macro_rules! pound_wss_programs {
    () => {
        r#"
    .macro USER_POUND_WSS kind, sfx, sp, ax, dx, bp32, acc, acc32, count, expected, index, arg0
    .balign 16
    .global user_pound_parent_wss_\kind
user_pound_parent_wss_\kind:
    movl {ctrl_size}, %eax
    movl {ctrl_stride}, %ecx
    xorl %edx, %edx                 /* each slot holds its own offset */
1:  mov\sfx %\dx, {base}(%\dx)
    addl %ecx, %edx
    cmpl %eax, %edx
    jb 1b
    jmp user_msg_parent_\kind

    .balign 16
    .global user_pound_wss_\kind
user_pound_wss_\kind:
    sub\sfx $48, %\sp
    mov\sfx %\index, 40(%\sp)
    movl $0, 0(%\sp)
    movl $0, 4(%\sp)
    mov\sfx $0, 8(%\sp)
    movl $0, 16(%\sp)
    movl {ctrl_size}, %eax
    movl %eax, 24(%\sp)
    movl {ctrl_stride}, %eax
    movl %eax, 28(%\sp)
    movl {ctrl_touches}, %eax
    movl %eax, 32(%\sp)
    xorl %\acc32, %\acc32
    test\sfx %\count, %\count
    jz 2f
1:  movl 32(%\sp), %ecx
    testl %ecx, %ecx
    jz 4f
    movl 16(%\sp), %edx
    mov\sfx 8(%\sp), %\ax
    xorl %\bp32, %\bp32
3:  add\sfx {base}(%\dx), %\ax      /* one read of the working set */
    incl %\bp32
    addl 28(%\sp), %edx
    cmpl 24(%\sp), %edx
    jb 5f
    xorl %edx, %edx
5:  decl %ecx
    jnz 3b
    mov\sfx %\ax, 8(%\sp)
    movl %edx, 16(%\sp)
    addl %\bp32, 0(%\sp)
    adcl $0, 4(%\sp)
4:  movl ${getppid}, %eax
    SYS \kind
    cmp\sfx %\ax, %\expected
    je 6f
    inc\sfx %\acc
6:  dec\sfx %\count
    jnz 1b
2:  mov\sfx 40(%\sp), %\dx
    shl\sfx $4, %\dx
    movl 0(%\sp), %eax
    movl %eax, {ctrl_threads}(%\dx)
    movl 4(%\sp), %eax
    movl %eax, {ctrl_threads}+4(%\dx)
    mov\sfx 8(%\sp), %\ax
    mov\sfx %\ax, {ctrl_threads}+8(%\dx)
    mov\sfx %\acc, %\arg0
    movl ${exit}, %eax
    SYS \kind
    ud2
    .endm
"#
    };
}
pub(crate) use pound_wss_programs;

/// `user_loop_asm!(programs, instances)`: the asm block of `user_loop` and
/// `user_init`: `SYS`, `USER_INIT`, the flavour's `USER_PROGRAMS kind` macro
/// (`programs`, which defines `user_loop_<kind>` and instantiates
/// `USER_INIT`), then `instances` in `.user.text` (the flavour's
/// `USER_PROGRAMS kind` lines and, on x86_32, the SYSENTER stub), with the
/// operands both flavours' loops name (64-bit control-page words that
/// x86_32 writes in halves are `{ctrl_…}+4` for the high word).
macro_rules! user_loop_asm {
    ($programs:expr, $instances:expr $(,)?) => {
        core::arch::global_asm!(
            $crate::arch::x86_shared::user::sys_macro!(),
            $crate::arch::x86_shared::user::init_program!(),
            $programs,
            "    .section .user.text, \"ax\"",
            $instances,
            "    .purgem USER_PROGRAMS",
            "    .purgem USER_INIT",
            "    .purgem SYS",
            "    .purgem FOR_ENTRIES",
            "    .previous",
            nopti = const $crate::arch::x86_shared::user::FLAG_NOPTI,
            kread = const $crate::arch::x86_shared::user::FLAG_KREAD,
            wss = const $crate::arch::x86_shared::user::FLAG_WSS,
            base = const ptiscope_abi::workingset::BASE,
            ctrl_size = const ptiscope_abi::workingset::control::VA + ptiscope_abi::workingset::control::SIZE as u64,
            ctrl_stride = const ptiscope_abi::workingset::control::VA + ptiscope_abi::workingset::control::STRIDE as u64,
            ctrl_touches = const ptiscope_abi::workingset::control::VA + ptiscope_abi::workingset::control::TOUCHES as u64,
            ctrl_touched = const ptiscope_abi::workingset::control::VA + ptiscope_abi::workingset::control::TOUCHED as u64,
            ctrl_sum = const ptiscope_abi::workingset::control::VA + ptiscope_abi::workingset::control::SUM as u64,
            ctrl_tcycles = const ptiscope_abi::workingset::control::VA + ptiscope_abi::workingset::control::READ_CYCLES as u64,
            ctrl_tmin = const ptiscope_abi::workingset::control::VA + ptiscope_abi::workingset::control::READ_CYCLES_MIN as u64,
            survived = const $crate::arch::x86_shared::user::KREAD_SURVIVED,
            arch_prctl = const ptiscope_abi::syscall::ARCH_PRCTL,
            set_nopti = const ptiscope_abi::syscall::ARCH_SET_NOPTI,
            phase_mark = const ptiscope_abi::syscall::PHASE_MARK,
            begin = const ptiscope_abi::phase::Marker::begin(ptiscope_abi::phase::ID_WORKLOAD).encode(),
            end = const ptiscope_abi::phase::Marker::end(ptiscope_abi::phase::ID_WORKLOAD).encode(),
            exit = const ptiscope_abi::syscall::EXIT,
            wait = const ptiscope_abi::syscall::WAIT,
            options(att_syntax)
        );
    };
}
pub(crate) use user_loop_asm;

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
/// `messaging_programs`, `pound_program`, `pound_wss_programs`) for its entry codes `$first`, 3,
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

        /// User addresses of the poundsyscall programs with a working set
        /// (parent, worker) for an entry (ABI code).
        pub fn pound_wss_programs(entry_code: u32) -> (u64, u64) {
            let (p, w) = $crate::arch::x86_shared::user::by_entry!(
                entry_code,
                $first,
                "user_pound_parent_wss_",
                "user_pound_wss_"
            );
            (p as u64, w as u64)
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

/// `MSG_PROGRAMS kind, sfx, sp, ax, di, cx, a0, a1, a2, p1, grp, idx, lps`
/// defines the sched-messaging programs `user_msg_{parent,sender,receiver}_<kind>`
/// (perf bench sched messaging, pipes; see docs/guest.md). Their state lives
/// on the user stack in 32-bit slots, as x86_32 needs (four of its seven
/// registers carry system-call arguments). Register names: `sfx` the
/// pointer-size suffix, `sp ax di cx` the pointer-size stack, result, string
/// destination and index registers, `a0 a1 a2` the 32-bit names of the first
/// three syscall argument registers and `p1` the pointer-size name of `a1`,
/// `grp idx lps` the 32-bit names of the parameters (group, index in the
/// group, loops), which the kernel preserves. Messages are
/// `guest_core::pipe::message`: 100 bytes, built and checked on the stack.
/// Needs `SYS`, the flavour's `PHASE_END kind` (the end marker with the
/// cycles in edx:eax and the mismatches at 0(sp)) and the operands
/// `phase_mark begin wait exit read write first_fd size tag check check_off
/// group`.
macro_rules! messaging_programs {
    () => {
        r#"
    /* A worker's stack frame: `bytes` reserved, the first `words` 32-bit
     * slots zeroed (rep stosl), the parameter `lps` (loops) stored at
     * `loops_off`; ebp = loops, eax = 0 and ecx = 0 after it. */
    .macro MSG_FRAME sfx, sp, di, lps, bytes, words, loops_off
    sub\sfx $\bytes, %\sp
    movl %\lps, %ebp
    mov\sfx %\sp, %\di
    xorl %eax, %eax
    movl $\words, %ecx
    rep stosl
    movl %ebp, \loops_off(%\sp)
    .endm

    .macro MSG_PROGRAMS kind, sfx, sp, ax, di, cx, a0, a1, a2, p1, grp, idx, lps
    /* The parent: marks the phase, reaps every worker, sums their exit
     * statuses (mismatches), marks the end with (cycles, mismatches).
     * Stack: 0 mismatches, 4/8 TSC at the start. */
    .balign 16
    .global user_msg_parent_\kind
user_msg_parent_\kind:
    sub\sfx $16, %\sp
    movl ${phase_mark}, %eax
    movl ${begin}, %\a0
    SYS \kind
    rdtsc
    movl %eax, 4(%\sp)
    movl %edx, 8(%\sp)
    movl $0, (%\sp)
1:  movl ${wait}, %eax
    SYS \kind
    test\sfx %\ax, %\ax
    js 2f
    addl %eax, (%\sp)
    jmp 1b
2:  rdtsc
    subl 4(%\sp), %eax
    sbbl 8(%\sp), %edx
    PHASE_END \kind
    movl (%\sp), %\a0
    movl ${exit}, %eax
    SYS \kind
    ud2

    /* A sender: `loops` rounds of one message to each receiver of the
     * group (fd 3 + receiver); exits with the number of failed writes.
     * Stack: 0..100 message, 100 failed writes, 104 sequence,
     * 108 receiver, 112 loops. */
    .balign 16
    .global user_msg_sender_\kind
user_msg_sender_\kind:
    MSG_FRAME \sfx, \sp, \di, \lps, 128, 28, 112
    movl %\grp, %eax
    shll $16, %eax
    orl %\idx, %eax
    orl ${tag}, %eax
    movl %eax, (%\sp)               /* word 0 */
    cmpl $0, 112(%\sp)
    je 5f
1:  movl $0, 108(%\sp)
2:  movl 104(%\sp), %eax
    movl %eax, 4(%\sp)
    movl 108(%\sp), %eax
    movl %eax, 8(%\sp)
    movl (%\sp), %eax
    xorl 4(%\sp), %eax
    xorl 8(%\sp), %eax
    xorl ${check}, %eax
    movl %eax, {check_off}(%\sp)
    movl 108(%\sp), %\a0
    addl ${first_fd}, %\a0
    mov\sfx %\sp, %\p1
    movl ${size}, %\a2
    movl ${write}, %eax
    SYS \kind
    cmp\sfx ${size}, %\ax
    je 3f
    incl 100(%\sp)
3:  incl 108(%\sp)
    cmpl ${group}, 108(%\sp)
    jb 2b
    incl 104(%\sp)
    movl 104(%\sp), %eax
    cmpl 112(%\sp), %eax
    jb 1b
5:  movl 100(%\sp), %\a0
    movl ${exit}, %eax
    SYS \kind
    ud2

    /* A receiver: reads group * loops messages from fd 3 (looping on
     * short reads), checks each (tag, group, receiver, check word, and
     * the next sequence number of its sender), then that every sender
     * delivered `loops`; exits with the number of mismatches.
     * Stack: 0..100 message, 112..192 next sequence per sender,
     * 192 mismatches, 196 messages left, 200 bytes so far, 204 loops.
     * ebp = expected high half of word 0. */
    .balign 16
    .global user_msg_receiver_\kind
user_msg_receiver_\kind:
    MSG_FRAME \sfx, \sp, \di, \lps, 208, 52, 204
    imull ${group}, %ebp, %eax
    movl %eax, 196(%\sp)
    movl %\grp, %ebp
    shll $16, %ebp
    orl ${tag}, %ebp
    cmpl $0, 196(%\sp)
    je 7f
1:  movl $0, 200(%\sp)
2:  movl ${read}, %eax
    movl ${first_fd}, %\a0
    movl 200(%\sp), %\a1
    add\sfx %\sp, %\p1
    movl ${size}, %\a2
    subl 200(%\sp), %\a2
    SYS \kind
    test\sfx %\ax, %\ax
    jle 8f                          /* error or end of file */
    addl %eax, 200(%\sp)
    cmpl ${size}, 200(%\sp)
    jb 2b
    movl (%\sp), %eax
    movl %eax, %ecx
    andl $0xffff0000, %ecx
    cmpl %ebp, %ecx
    jne 6f
    movl %eax, %ecx
    andl $0xffff, %ecx              /* sender */
    cmpl ${group}, %ecx
    jae 6f
    cmpl 8(%\sp), %\idx
    jne 6f
    xorl 4(%\sp), %eax
    xorl 8(%\sp), %eax
    xorl ${check}, %eax
    cmpl {check_off}(%\sp), %eax
    jne 6f
    movl 4(%\sp), %eax
    cmpl 112(%\sp,%\cx,4), %eax
    jne 6f
    incl 112(%\sp,%\cx,4)
    jmp 5f
6:  incl 192(%\sp)
5:  decl 196(%\sp)
    jnz 1b
7:  xorl %ecx, %ecx
    movl 204(%\sp), %eax
9:  cmpl 112(%\sp,%\cx,4), %eax
    je 10f
    incl 192(%\sp)
10: incl %ecx
    cmpl ${group}, %ecx
    jb 9b
    movl 192(%\sp), %\a0
    movl ${exit}, %eax
    SYS \kind
    ud2
8:  incl 192(%\sp)
    jmp 7b
    .endm
"#
    };
}
pub(crate) use messaging_programs;

/// `messaging_asm!(phase_end, instances)`: the sched-messaging programs'
/// asm block: `SYS`, `MSG_PROGRAMS`, the flavour's `PHASE_END kind` macro
/// (`phase_end`), then `instances` (the flavour's `MSG_PROGRAMS kind, …`
/// lines, in `.user.text.msg`, which linker.ld places after the
/// `.user.text` of `user_loop`), with the operands the programs name.
macro_rules! messaging_asm {
    ($phase_end:expr, $instances:expr $(,)?) => {
        core::arch::global_asm!(
            $crate::arch::x86_shared::user::sys_macro!(),
            $crate::arch::x86_shared::user::messaging_programs!(),
            $phase_end,
            "    .section .user.text.msg, \"ax\"",
            $instances,
            "    .purgem MSG_PROGRAMS",
            "    .purgem MSG_FRAME",
            "    .purgem PHASE_END",
            "    .purgem SYS",
            "    .purgem FOR_ENTRIES",
            "    .previous",
            phase_mark = const ptiscope_abi::syscall::PHASE_MARK,
            begin = const ptiscope_abi::phase::Marker::begin(ptiscope_abi::phase::ID_WORKLOAD).encode(),
            end = const ptiscope_abi::phase::Marker::end(ptiscope_abi::phase::ID_WORKLOAD).encode(),
            exit = const ptiscope_abi::syscall::EXIT,
            wait = const ptiscope_abi::syscall::WAIT,
            read = const ptiscope_abi::syscall::READ,
            write = const ptiscope_abi::syscall::WRITE,
            first_fd = const guest_core::pipe::FIRST_PIPE_FD,
            size = const guest_core::pipe::message::SIZE,
            tag = const guest_core::pipe::message::TAG,
            check = const guest_core::pipe::message::CHECK,
            check_off = const guest_core::pipe::message::CHECK_OFFSET,
            group = const guest_core::cmdline::GROUP_SIZE,
            options(att_syntax)
        );
    };
}
pub(crate) use messaging_asm;

/// `pound_asm!(instances)`: the poundsyscall programs' asm block: `SYS`,
/// `USER_POUND`, `USER_POUND_WSS`, then `instances` (the flavour's lines, in
/// `.user.text.pound`, last in `.user`), with the operands the programs name.
macro_rules! pound_asm {
    ($instances:expr $(,)?) => {
        core::arch::global_asm!(
            $crate::arch::x86_shared::user::sys_macro!(),
            $crate::arch::x86_shared::user::pound_program!(),
            $crate::arch::x86_shared::user::pound_wss_programs!(),
            "    .section .user.text.pound, \"ax\"",
            $instances,
            "    .purgem USER_POUND",
            "    .purgem USER_POUND_WSS",
            "    .purgem SYS",
            "    .purgem FOR_ENTRIES",
            "    .previous",
            getppid = const ptiscope_abi::syscall::GETPPID,
            exit = const ptiscope_abi::syscall::EXIT,
            base = const ptiscope_abi::workingset::BASE,
            ctrl_size = const ptiscope_abi::workingset::control::VA + ptiscope_abi::workingset::control::SIZE as u64,
            ctrl_stride = const ptiscope_abi::workingset::control::VA + ptiscope_abi::workingset::control::STRIDE as u64,
            ctrl_touches = const ptiscope_abi::workingset::control::VA + ptiscope_abi::workingset::control::TOUCHES as u64,
            ctrl_threads = const ptiscope_abi::workingset::control::VA + ptiscope_abi::workingset::control::THREADS as u64,
            options(att_syntax)
        );
    };
}
pub(crate) use pound_asm;
