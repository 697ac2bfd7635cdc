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
pub use crate::arch::x86_shared::percpu::*;
use ptiscope_abi::telemetry::Counter;

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
    /// Pages of the kernel working set this CPU's `KWSS_CALL`s read: a u64
    /// in two words, low first.
    pub const KWSS_READS: usize = 40;
}

// CPU 0's fault stack is set statically so that a fault before
// init_boot_cpu still finds a stack.
crate::arch::x86_shared::percpu::percpu_asm!(
    r#"
    .fill {fault}, 1, 0
    .long fault_stack_top
    .fill {bytes} - {fault} - 4, 1, 0
"#;
    fault = const kernel::FAULT_STACK_TOP,
);

extern "C" {
    static kernel_percpu: u8;
}

/// Sets up CPU `n`'s record. Call on CPU `n` right after its GDT (which
/// loads FS), before anything counts.
pub fn init_cpu(n: usize, entry_stack_top: u64, fault_stack_top: u64) {
    init_record(n, entry_stack_top, fault_stack_top);
    check_layout();
}

/// The displacement the assembly uses must be what the array is.
fn check_layout() {
    let k = core::ptr::addr_of!(PCPU_KERNEL_SYM) as u32;
    let ka = core::ptr::addr_of!(kernel_percpu) as u32;
    assert_eq!(k, ka.wrapping_sub(segment_base(0) as u32), "PCPU_KERNEL");
}

/// Adds `n` to this CPU's counter `c`. Rust callers (context switches,
/// boot) go through the block's linear address: i386 has too few registers
/// for an FS-relative 64-bit add in inline assembly with frame pointers on;
/// the entry stubs count FS-relative.
#[inline(always)]
pub fn counter_add(c: Counter, n: u64) {
    let p = (segment_base(cpu()) + c.offset_in_block() as u64) as usize as *mut u64;
    // SAFETY: this CPU's block of the telemetry page, mapped in every
    // kernel page table; only this CPU writes it. Volatile: the host reads it.
    unsafe { p.write_volatile(p.read_volatile().wrapping_add(n)) }
}

/// CPU `n`'s counter `c` (any CPU's block can be read: the host does too).
pub fn counter_of(n: usize, c: Counter) -> u64 {
    let p = (segment_base(n) + c.offset_in_block() as u64) as usize as *const u32;
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
