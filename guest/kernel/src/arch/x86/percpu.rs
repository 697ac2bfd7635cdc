//! Per-CPU data of the x86_32 PAE flavour, reached through the FS segment
//! (Linux x86_32 keeps its per-CPU base in FS too).
//!
//! Each CPU has its own GDT (descriptors.rs) whose per-CPU descriptor
//! ([`super::descriptors::PERCPU_SEL`], held in FS) has as its base the
//! CPU's block of counters in the telemetry page (`TELEMETRY_VA +
//! CPU_BLOCK_OFFSET + n * CPU_BLOCK_STRIDE`), so the entry code counts with
//! `addl $1, %fs:ctr; adcl $0, %fs:ctr+4`: as many instructions as the
//! absolute `addl/adcl` of the one-CPU kernel. The CPU's other words are
//! `kernel_percpu[n]` (`.data`, kernel copy only), an array with the same
//! 256-byte stride, so they are one link-time constant (`PCPU_KERNEL`,
//! linker.ld) away from FS on every CPU.
//!
//! Like the x86_64 flavour's GS, FS is never reloaded on entry: the
//! kernel's FS stays loaded in user mode (its descriptor is DPL 3 so that
//! IRET keeps it; see descriptors.rs). The user programs are the kernel's
//! own and never load FS.
use super::layout::TELEMETRY_VA;
use core::arch::{asm, global_asm};
use ptiscope_abi::telemetry::{Counter, CPU_BLOCK_OFFSET, CPU_BLOCK_STRIDE, MAX_CPUS};

/// Words at the top of the entry stack that hold a task's state during an
/// int syscall with PTI: the CPU's 5-word frame and the saved ecx, edx.
/// (Defined here, with the per-CPU entry-stack layout it is part of; the
/// task switch saves and restores these words.)
pub const ENTRY_FRAME_WORDS: usize = 7;

/// Offsets of the 32-bit words in a CPU's `kernel_percpu` record (entry.rs
/// names them `PCPU_*`).
pub mod kernel {
    pub const KSTACK_TOP: usize = 0;
    pub const EXIT_PTI: usize = 4;
    pub const USER_FLUSH_PENDING: usize = 8;
    pub const FRAME_ON_ENTRY_STACK: usize = 12;
    /// Address of the 7-word slot at the top of the entry stack (the int
    /// frame and the saved ecx, edx; also the exit's ESP).
    pub const ENTRY_FRAME: usize = 16;
    pub const ENTRY_STACK_TOP: usize = 20;
    pub const FAULT_STACK_TOP: usize = 24;
    pub const CPU: usize = 28;
    pub const PID: usize = 32;
    pub const PPID: usize = 36;
}

// CPU 0's fault stack is set statically so that a fault before
// init_boot_cpu still finds a stack.
global_asm!(
    r#"
    .section .data.kernel_percpu, "aw"
    .balign 256
    .global kernel_percpu
kernel_percpu:
    .fill {fault}, 1, 0
    .long fault_stack_top
    .fill {bytes} - {fault} - 4, 1, 0
    .previous
"#,
    bytes = const MAX_CPUS * CPU_BLOCK_STRIDE,
    fault = const kernel::FAULT_STACK_TOP,
    options(att_syntax)
);

extern "C" {
    static mut kernel_percpu: [u8; MAX_CPUS * CPU_BLOCK_STRIDE];
    /// The linker's `PCPU_KERNEL` (an absolute displacement, not data).
    #[link_name = "PCPU_KERNEL"]
    static PCPU_KERNEL_SYM: u8;
}

/// CPU `n`'s FS base: its telemetry counter block.
pub const fn fs_base(n: usize) -> u64 {
    TELEMETRY_VA + (CPU_BLOCK_OFFSET + n * CPU_BLOCK_STRIDE) as u64
}

fn kernel_word(n: usize, off: usize) -> *mut u32 {
    // SAFETY: only the address is taken; `n < MAX_CPUS` is the callers'.
    unsafe { (core::ptr::addr_of_mut!(kernel_percpu) as *mut u8).add(n * CPU_BLOCK_STRIDE + off) }
        .cast()
}

/// Sets up CPU `n`'s record. Call on CPU `n` right after its GDT (which
/// loads FS), before anything counts.
pub fn init_cpu(n: usize, entry_stack_top: u64, fault_stack_top: u64) {
    assert!(n < MAX_CPUS);
    let frame = entry_stack_top - (ENTRY_FRAME_WORDS * 4) as u64;
    // SAFETY: CPU `n`'s record is written only by CPU `n` (here, before
    // anything reads it) and, for its own fields, by the code running on it.
    unsafe {
        kernel_word(n, kernel::CPU).write_volatile(n as u32);
        kernel_word(n, kernel::ENTRY_STACK_TOP).write_volatile(entry_stack_top as u32);
        kernel_word(n, kernel::ENTRY_FRAME).write_volatile(frame as u32);
        kernel_word(n, kernel::FAULT_STACK_TOP).write_volatile(fault_stack_top as u32);
    }
    check_layout();
}

/// The displacement the assembly uses must be what the array is.
fn check_layout() {
    let k = core::ptr::addr_of!(PCPU_KERNEL_SYM) as u32;
    let ka = core::ptr::addr_of!(kernel_percpu) as u32;
    assert_eq!(k, ka.wrapping_sub(fs_base(0) as u32), "PCPU_KERNEL");
}

#[inline(always)]
fn read<const OFF: usize>() -> u32 {
    let v: u32;
    // SAFETY: FS is this CPU's per-CPU segment (init_gdt_tss_for); the
    // record is kernel data mapped in every kernel page table.
    unsafe {
        asm!("mov {v}, dword ptr fs:[{base} + {off}]", v = out(reg) v, base = sym PCPU_KERNEL_SYM, off = const OFF, options(nostack, readonly, preserves_flags))
    };
    v
}

#[inline(always)]
fn write<const OFF: usize>(v: u32) {
    // SAFETY: as for `read`; one writer per record (its CPU).
    unsafe {
        asm!("mov dword ptr fs:[{base} + {off}], {v}", v = in(reg) v, base = sym PCPU_KERNEL_SYM, off = const OFF, options(nostack, preserves_flags))
    };
}

/// Index of the CPU this runs on.
#[inline(always)]
pub fn cpu() -> usize {
    read::<{ kernel::CPU }>() as usize
}

/// pid of the task running on this CPU (getpid).
#[inline(always)]
pub fn current_pid() -> u64 {
    read::<{ kernel::PID }>() as u64
}

/// ppid of the task running on this CPU (getppid).
#[inline(always)]
pub fn current_ppid() -> u64 {
    read::<{ kernel::PPID }>() as u64
}

/// What the entry code of this CPU needs about the task it now runs.
pub struct EntryState {
    pub kstack_top: u64,
    pub exit_pti: u64,
    pub user_flush_pending: u64,
    pub frame_on_entry_stack: bool,
    pub pid: u64,
    pub ppid: u64,
}

/// Installs `s` for this CPU (kernel addresses and pids fit in 32 bits).
pub fn set_entry_state(s: &EntryState) {
    write::<{ kernel::KSTACK_TOP }>(s.kstack_top as u32);
    write::<{ kernel::EXIT_PTI }>(s.exit_pti as u32);
    write::<{ kernel::USER_FLUSH_PENDING }>(s.user_flush_pending as u32);
    write::<{ kernel::FRAME_ON_ENTRY_STACK }>(s.frame_on_entry_stack as u32);
    write::<{ kernel::PID }>(s.pid as u32);
    write::<{ kernel::PPID }>(s.ppid as u32);
}

/// This CPU's pending user flush flag (always 0: PAE has no PCID).
pub fn user_flush_pending() -> u64 {
    read::<{ kernel::USER_FLUSH_PENDING }>() as u64
}

/// This CPU's entry stack top (TSS.ESP0 and SYSENTER_ESP with PTI).
pub fn entry_stack_top() -> u64 {
    read::<{ kernel::ENTRY_STACK_TOP }>() as u64
}

/// The user frame slot at the top of this CPU's entry stack.
pub fn entry_frame_slot() -> *mut [usize; ENTRY_FRAME_WORDS] {
    read::<{ kernel::ENTRY_FRAME }>() as usize as *mut _
}

/// Adds `n` to this CPU's counter `c`. Rust callers (context switches,
/// boot) go through the block's linear address: i386 has too few registers
/// for an FS-relative 64-bit add in inline assembly with frame pointers on;
/// the entry stubs count FS-relative.
#[inline(always)]
pub fn counter_add(c: Counter, n: u64) {
    let p = (fs_base(cpu()) + c.offset_in_block() as u64) as usize as *mut u64;
    // SAFETY: this CPU's block of the telemetry page, mapped in every
    // kernel page table; only this CPU writes it. Volatile: the host reads it.
    unsafe { p.write_volatile(p.read_volatile().wrapping_add(n)) }
}

/// CPU `n`'s counter `c` (any CPU's block can be read: the host does too).
pub fn counter_of(n: usize, c: Counter) -> u64 {
    let p = (fs_base(n) + c.offset_in_block() as u64) as usize as *const u32;
    // SAFETY: the telemetry page is mapped in every kernel page table. The
    // two halves are read apart (no 64-bit atomic load without SSE/x87
    // here); readers of another CPU's block read a counter that may be
    // moving, as the host does.
    unsafe {
        let lo = p.read_volatile() as u64;
        let hi = p.add(1).read_volatile() as u64;
        hi << 32 | lo
    }
}
