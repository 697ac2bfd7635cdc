//! What both flavours' per-CPU code shares (each flavour's percpu.rs says
//! how its CPUs find their data): the accessors of a CPU's `kernel_percpu`
//! record, a link-time displacement (`PCPU_KERNEL`, linker.ld) away from
//! the per-CPU segment — GS on x86_64, FS on x86_32, chosen below with a
//! local `cfg` as Linux's shared x86 code does with `#ifdef` — whose base
//! is the CPU's counter block in the telemetry page. The record's words are
//! `usize` (8 bytes on x86_64, 4 on x86_32); their offsets are the
//! flavour's `percpu::kernel` (entry.rs names them `PCPU_*`).

use crate::arch::layout::TELEMETRY_VA;
use crate::arch::percpu::{kernel, ENTRY_FRAME_WORDS};
use core::arch::asm;
use ptiscope_abi::telemetry::{CPU_BLOCK_OFFSET, CPU_BLOCK_STRIDE, MAX_CPUS};

/// The per-CPU segment register of the flavour.
#[cfg(target_arch = "x86_64")]
macro_rules! seg {
    () => {
        "gs"
    };
}
#[cfg(target_arch = "x86")]
macro_rules! seg {
    () => {
        "fs"
    };
}

/// `percpu_asm!(body; extra operands)`: a flavour's asm block of per-CPU
/// records: it opens `kernel_percpu` (in `.data.kernel_percpu`), which
/// `body` fills (`{bytes}`: one `CPU_BLOCK_STRIDE` per CPU) and may go on
/// with more records (`PERCPU_RECORDS name, section` opens the 256-aligned
/// global array `name` in `section`); the `extra operands`, each followed
/// by a comma, are the ones only the flavour names.
macro_rules! percpu_asm {
    ($body:expr $(,)?; $($extra:tt)*) => {
        core::arch::global_asm!(
            r#"
    .macro PERCPU_RECORDS name, section
    .section \section, "aw"
    .balign 256
    .global \name
\name:
    .endm
    PERCPU_RECORDS kernel_percpu, .data.kernel_percpu
"#,
            $body,
            "    .previous
    .purgem PERCPU_RECORDS",
            bytes = const ptiscope_abi::telemetry::MAX_CPUS * ptiscope_abi::telemetry::CPU_BLOCK_STRIDE,
            $($extra)*
            options(att_syntax)
        );
    };
}
pub(crate) use percpu_asm;

extern "C" {
    /// The records, one `CPU_BLOCK_STRIDE` apart (defined by the flavour).
    static mut kernel_percpu: [u8; MAX_CPUS * CPU_BLOCK_STRIDE];
    /// The linker's `PCPU_KERNEL` (an absolute displacement, not data).
    #[link_name = "PCPU_KERNEL"]
    pub(crate) static PCPU_KERNEL_SYM: u8;
}

/// CPU `n`'s per-CPU segment base: its telemetry counter block.
pub const fn segment_base(n: usize) -> u64 {
    TELEMETRY_VA + (CPU_BLOCK_OFFSET + n * CPU_BLOCK_STRIDE) as u64
}

/// Address of word `off` of CPU `n`'s kernel record.
fn kernel_word(n: usize, off: usize) -> *mut usize {
    // SAFETY: only the address is taken; `n < MAX_CPUS` is the callers'.
    unsafe { (core::ptr::addr_of_mut!(kernel_percpu) as *mut u8).add(n * CPU_BLOCK_STRIDE + off) }
        .cast()
}

/// Fills CPU `n`'s record: its index, entry stack top, entry-frame slot
/// (the top `ENTRY_FRAME_WORDS` words of the entry stack) and fault stack.
/// The flavour's `init_cpu` calls it on CPU `n`, before anything counts.
pub fn init_record(n: usize, entry_stack_top: u64, fault_stack_top: u64) {
    assert!(n < MAX_CPUS);
    let frame = entry_stack_top - (ENTRY_FRAME_WORDS * size_of::<usize>()) as u64;
    // SAFETY: CPU `n`'s record is written only by CPU `n` (here, before
    // anything reads it) and, for its own fields, by the code running on it.
    unsafe {
        kernel_word(n, kernel::CPU).write_volatile(n);
        kernel_word(n, kernel::ENTRY_STACK_TOP).write_volatile(entry_stack_top as usize);
        kernel_word(n, kernel::ENTRY_FRAME).write_volatile(frame as usize);
        kernel_word(n, kernel::FAULT_STACK_TOP).write_volatile(fault_stack_top as usize);
    }
}

/// Reads this CPU's kernel word at `off`.
#[inline(always)]
fn read<const OFF: usize>() -> usize {
    let v: usize;
    // SAFETY: the segment's base is this CPU's block (init_cpu); the record
    // is kernel data mapped in every kernel page table.
    unsafe {
        asm!(concat!("mov {v}, ", seg!(), ":[{base} + {off}]"), v = out(reg) v, base = sym PCPU_KERNEL_SYM, off = const OFF, options(nostack, readonly, preserves_flags))
    };
    v
}

/// Writes this CPU's kernel word at `off`.
#[inline(always)]
fn write<const OFF: usize>(v: usize) {
    // SAFETY: as for `read`; one writer per record (its CPU).
    unsafe {
        asm!(concat!("mov ", seg!(), ":[{base} + {off}], {v}"), v = in(reg) v, base = sym PCPU_KERNEL_SYM, off = const OFF, options(nostack, preserves_flags))
    };
}

/// Index of the CPU this runs on.
#[inline(always)]
pub fn cpu() -> usize {
    read::<{ kernel::CPU }>()
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

/// Adds `pages` to this CPU's count of kernel working-set pages read
/// (`kwss=`): per CPU, so that any CPU's `KWSS_CALL` may count without a
/// lock, in as many instructions as the absolute add of a one-CPU kernel
/// (one `add` on x86_64, `add`/`adc` on x86_32): it runs on each call of
/// the measured loop.
#[inline(always)]
pub fn add_kwss_reads(pages: usize) {
    // SAFETY: as for `write`; only this CPU writes its count.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        asm!("add qword ptr gs:[{base} + {off}], {n}", n = in(reg) pages, base = sym PCPU_KERNEL_SYM, off = const kernel::KWSS_READS, options(nostack))
    };
    // SAFETY: as above.
    #[cfg(target_arch = "x86")]
    unsafe {
        asm!("add dword ptr fs:[{base} + {off}], {n}", "adc dword ptr fs:[{base} + {off} + 4], 0", n = in(reg) pages, base = sym PCPU_KERNEL_SYM, off = const kernel::KWSS_READS, options(nostack))
    };
}

/// CPU `n`'s count of kernel working-set pages read ([`add_kwss_reads`]).
/// Read once its CPU has stopped counting (every task has exited).
pub fn kwss_reads_of(n: usize) -> u64 {
    // SAFETY: CPU `n`'s record (n < MAX_CPUS, the callers'); a u64 in one
    // word on x86_64, two on x86_32.
    unsafe {
        #[cfg(target_arch = "x86_64")]
        let v = kernel_word(n, kernel::KWSS_READS).read_volatile() as u64;
        #[cfg(target_arch = "x86")]
        let v = kernel_word(n, kernel::KWSS_READS).read_volatile() as u64
            | (kernel_word(n, kernel::KWSS_READS + 4).read_volatile() as u64) << 32;
        v
    }
}

/// What the entry code of this CPU needs about the task it now runs.
pub struct EntryState {
    pub kstack_top: u64,
    /// 0 PTI off, 1 PTI, 2 PTI with PCID (x86_64 only).
    pub exit_pti: u64,
    pub user_flush_pending: u64,
    pub frame_on_entry_stack: bool,
    pub pid: u64,
    pub ppid: u64,
}

/// Installs `s` for this CPU (on x86_32 kernel addresses and pids fit in
/// the 32-bit words).
pub fn set_entry_state(s: &EntryState) {
    write::<{ kernel::KSTACK_TOP }>(s.kstack_top as usize);
    write::<{ kernel::EXIT_PTI }>(s.exit_pti as usize);
    write::<{ kernel::USER_FLUSH_PENDING }>(s.user_flush_pending as usize);
    write::<{ kernel::FRAME_ON_ENTRY_STACK }>(s.frame_on_entry_stack as usize);
    write::<{ kernel::PID }>(s.pid as usize);
    write::<{ kernel::PPID }>(s.ppid as usize);
}

/// This CPU's pending user-PCID flush flag (the exit code clears it; always
/// 0 on x86_32, which has no PCID).
pub fn user_flush_pending() -> u64 {
    read::<{ kernel::USER_FLUSH_PENDING }>() as u64
}

/// This CPU's entry stack top (TSS.RSP0/ESP0, and SYSENTER_ESP, with PTI).
pub fn entry_stack_top() -> u64 {
    read::<{ kernel::ENTRY_STACK_TOP }>() as u64
}

/// The user frame slot at the top of this CPU's entry stack.
pub fn entry_frame_slot() -> *mut [usize; ENTRY_FRAME_WORDS] {
    read::<{ kernel::ENTRY_FRAME }>() as *mut _
}
