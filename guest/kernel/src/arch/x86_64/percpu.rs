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
pub use crate::arch::x86_shared::percpu::*;
use core::arch::asm;
use ptiscope_abi::telemetry::Counter;

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
    /// Pages of the kernel working set this CPU's `KWSS_CALL`s read (u64).
    pub const KWSS_READS: usize = 80;
}
/// Offsets in a CPU's `entry_percpu` record.
pub mod entry {
    pub const SCRATCH_RSP: usize = 0;
    pub const SCRATCH_RDI: usize = 8;
}

crate::arch::x86_shared::percpu::percpu_asm!(
    r#"
    .fill {bytes}, 1, 0
    PERCPU_RECORDS entry_percpu, .entry.data.percpu
    .fill {bytes}, 1, 0
"#;
);

extern "C" {
    static kernel_percpu: u8;
    static entry_percpu: u8;
}

/// Sets up CPU `n`'s records and loads its GS base. Call first thing on
/// each CPU, before anything counts (after the GDT: loading a null GS
/// selector may clear the base).
pub fn init_cpu(n: usize, entry_stack_top: u64, fault_stack_top: u64) {
    init_record(n, entry_stack_top, fault_stack_top);
    // SAFETY: CPU `n`'s GS base is its own counter block (its record is
    // PCPU_KERNEL away); nothing GS-relative ran on this CPU before.
    unsafe { cpu::wrmsr(MSR_GS_BASE, segment_base(n)) };
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
    assert_eq!(k, ka.wrapping_sub(segment_base(0)), "PCPU_KERNEL");
    assert_eq!(e, ea.wrapping_sub(segment_base(0)), "PCPU_ENTRY");
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
    unsafe {
        ((segment_base(n) + c.offset_in_block() as u64) as usize as *const u64).read_volatile()
    }
}
