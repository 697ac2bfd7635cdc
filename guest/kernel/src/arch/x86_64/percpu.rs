//! Per-CPU data, reached through the GS base.
//!
//! Each CPU's GS base points at its own block of counters in the telemetry
//! page (`TELEMETRY_VA + CPU_BLOCK_OFFSET + n * CPU_BLOCK_STRIDE`), so the
//! entry code counts with one `incq %gs:counter`, exactly as many
//! instructions as the absolute `incq` of a one-CPU kernel. The CPU's other
//! per-CPU words sit in two arrays with the same 256-byte stride, so they too
//! are one constant displacement away from GS:
//!
//! * `kernel_percpu` (`.data`, kernel copy only): the words the entry code
//!   reads after switching to the kernel copy (task stack top, exit mode,
//!   deferred user-PCID flush, where the user frame is), this CPU's running
//!   pid/ppid for getpid/getppid, its index and stacks;
//! * `entry_percpu` (`.entry.data`, mapped in the user copy too): the SYSCALL
//!   entry's scratch words, used before the switch to the kernel copy.
//!
//! The displacements are link-time constants (`linker.ld`: `PCPU_KERNEL` and
//! `PCPU_ENTRY`, each array's address minus CPU 0's GS base).
//!
//! Unlike Linux, the kernel never swaps GS (no `swapgs`): the GS base stays
//! the kernel's in user mode. The user programs are the kernel's own and
//! never load GS; a user program that did would redirect the kernel's
//! per-CPU accesses (Linux pays two `swapgs` per round trip to rule that
//! out). See docs/guest.md, "SMP".
use super::cpu;
use super::layout::TELEMETRY_VA;
use core::arch::{asm, global_asm};
use ptiscope_abi::telemetry::{Counter, CPU_BLOCK_OFFSET, CPU_BLOCK_STRIDE, MAX_CPUS};

/// Words at the top of the entry stack that hold a task's user frame (the
/// iret frame of an int entry with PTI); saved and restored per task.
/// (Defined here, with the per-CPU entry-stack layout it is part of; the
/// task switch saves and restores these words.)
pub const ENTRY_FRAME_WORDS: usize = 5;

/// The GS base MSR.
const MSR_GS_BASE: u32 = 0xc000_0101;

/// Offsets in a CPU's `kernel_percpu` record (keep in sync with entry.rs,
/// which names them `PCPU_*`).
pub mod kernel {
    pub const KSTACK_TOP: usize = 0;
    pub const USER_FLUSH_PENDING: usize = 8;
    pub const EXIT_PTI: usize = 16;
    pub const FRAME_ON_ENTRY_STACK: usize = 24;
    /// Address of the 5-word user frame at the top of the entry stack.
    pub const ENTRY_FRAME: usize = 32;
    pub const ENTRY_STACK_TOP: usize = 40;
    pub const FAULT_STACK_TOP: usize = 48;
    pub const CPU: usize = 56;
    pub const PID: usize = 64;
    pub const PPID: usize = 72;
}
/// Offsets in a CPU's `entry_percpu` record.
pub mod entry {
    pub const SCRATCH_RSP: usize = 0;
    pub const SCRATCH_RDI: usize = 8;
}

global_asm!(
    r#"
    .section .data.kernel_percpu, "aw"
    .balign 256
    .global kernel_percpu
kernel_percpu:
    .fill {bytes}, 1, 0

    .section .entry.data.percpu, "aw"
    .balign 256
    .global entry_percpu
entry_percpu:
    .fill {bytes}, 1, 0
    .previous
"#,
    bytes = const MAX_CPUS * CPU_BLOCK_STRIDE,
);

extern "C" {
    static mut kernel_percpu: [u8; MAX_CPUS * CPU_BLOCK_STRIDE];
    static mut entry_percpu: [u8; MAX_CPUS * CPU_BLOCK_STRIDE];
}

/// CPU `n`'s GS base: its telemetry counter block.
pub const fn gs_base(n: usize) -> u64 {
    TELEMETRY_VA + (CPU_BLOCK_OFFSET + n * CPU_BLOCK_STRIDE) as u64
}

/// Address of word `off` of CPU `n`'s kernel record.
fn kernel_word(n: usize, off: usize) -> *mut u64 {
    // SAFETY: only the address is taken; `n < MAX_CPUS` is the callers'.
    unsafe { (core::ptr::addr_of_mut!(kernel_percpu) as *mut u8).add(n * CPU_BLOCK_STRIDE + off) }
        .cast()
}

/// Sets up CPU `n`'s records and loads its GS base. Call first thing on
/// each CPU, before anything counts (after the GDT: loading a null GS
/// selector may clear the base).
pub fn init_cpu(n: usize, entry_stack_top: u64, fault_stack_top: u64) {
    assert!(n < MAX_CPUS);
    // SAFETY: CPU `n`'s record is written only by CPU `n` (here, before
    // anything reads it) and, for its own fields, by the code running on it.
    unsafe {
        kernel_word(n, kernel::CPU).write_volatile(n as u64);
        kernel_word(n, kernel::ENTRY_STACK_TOP).write_volatile(entry_stack_top);
        kernel_word(n, kernel::ENTRY_FRAME)
            .write_volatile(entry_stack_top - (ENTRY_FRAME_WORDS * 8) as u64);
        kernel_word(n, kernel::FAULT_STACK_TOP).write_volatile(fault_stack_top);
        cpu::wrmsr(MSR_GS_BASE, gs_base(n));
    }
    check_layout();
}

/// The displacements the assembly uses must be what the arrays are.
fn check_layout() {
    extern "C" {
        static PCPU_KERNEL: u8;
        static PCPU_ENTRY: u8;
    }
    let k = core::ptr::addr_of!(PCPU_KERNEL) as u64;
    let e = core::ptr::addr_of!(PCPU_ENTRY) as u64;
    let (ka, ea) = (
        core::ptr::addr_of!(kernel_percpu) as u64,
        core::ptr::addr_of!(entry_percpu) as u64,
    );
    assert_eq!(k, ka.wrapping_sub(gs_base(0)), "PCPU_KERNEL");
    assert_eq!(e, ea.wrapping_sub(gs_base(0)), "PCPU_ENTRY");
}

/// Reads this CPU's kernel word at `off`.
#[inline(always)]
fn read<const OFF: usize>() -> u64 {
    let v: u64;
    // SAFETY: GS is this CPU's base (init_cpu); the record is kernel data.
    unsafe {
        asm!("mov {v}, qword ptr gs:[{base} + {off}]", v = out(reg) v, base = sym PCPU_KERNEL_SYM, off = const OFF, options(nostack, readonly, preserves_flags))
    };
    v
}

/// Writes this CPU's kernel word at `off`.
#[inline(always)]
fn write<const OFF: usize>(v: u64) {
    // SAFETY: as for `read`.
    unsafe {
        asm!("mov qword ptr gs:[{base} + {off}], {v}", v = in(reg) v, base = sym PCPU_KERNEL_SYM, off = const OFF, options(nostack, preserves_flags))
    };
}

extern "C" {
    /// The linker's `PCPU_KERNEL` (an absolute displacement, not data).
    #[link_name = "PCPU_KERNEL"]
    static PCPU_KERNEL_SYM: u8;
}

/// Index of the CPU this runs on.
#[inline(always)]
pub fn cpu() -> usize {
    read::<{ kernel::CPU }>() as usize
}

/// pid of the task running on this CPU (getpid).
#[inline(always)]
pub fn current_pid() -> u64 {
    read::<{ kernel::PID }>()
}

/// ppid of the task running on this CPU (getppid).
#[inline(always)]
pub fn current_ppid() -> u64 {
    read::<{ kernel::PPID }>()
}

/// What the entry code of this CPU needs about the task it now runs.
pub struct EntryState {
    pub kstack_top: u64,
    /// 0 PTI off, 1 PTI, 2 PTI with PCID.
    pub exit_pti: u64,
    pub user_flush_pending: u64,
    pub frame_on_entry_stack: bool,
    pub pid: u64,
    pub ppid: u64,
}

/// Installs `s` for this CPU.
pub fn set_entry_state(s: &EntryState) {
    write::<{ kernel::KSTACK_TOP }>(s.kstack_top);
    write::<{ kernel::EXIT_PTI }>(s.exit_pti);
    write::<{ kernel::USER_FLUSH_PENDING }>(s.user_flush_pending);
    write::<{ kernel::FRAME_ON_ENTRY_STACK }>(s.frame_on_entry_stack as u64);
    write::<{ kernel::PID }>(s.pid);
    write::<{ kernel::PPID }>(s.ppid);
}

/// This CPU's pending user-PCID flush flag (the exit code clears it).
pub fn user_flush_pending() -> u64 {
    read::<{ kernel::USER_FLUSH_PENDING }>()
}

/// This CPU's entry stack top (TSS.RSP0 with PTI).
pub fn entry_stack_top() -> u64 {
    read::<{ kernel::ENTRY_STACK_TOP }>()
}

/// The 5-word user frame slot at the top of this CPU's entry stack.
pub fn entry_frame_slot() -> *mut [usize; ENTRY_FRAME_WORDS] {
    read::<{ kernel::ENTRY_FRAME }>() as usize as *mut _
}

/// Adds `n` to this CPU's counter `c`.
#[inline(always)]
pub fn counter_add(c: Counter, n: u64) {
    // SAFETY: GS is this CPU's counter block; one writer per block.
    unsafe {
        asm!("add qword ptr gs:[{off}], {n}", off = in(reg) c.offset_in_block(), n = in(reg) n, options(nostack))
    };
}

/// CPU `n`'s counter `c` (any CPU's block can be read: the host does too).
pub fn counter_of(n: usize, c: Counter) -> u64 {
    // SAFETY: the telemetry page is mapped in every kernel page table;
    // naturally aligned u64 reads are atomic on x86.
    unsafe { ((gs_base(n) + c.offset_in_block() as u64) as usize as *const u64).read_volatile() }
}
