//! The contract between the ptiscope VMM and its guest kernel.
//!
//! Everything both sides must agree on lives here, once: I/O ports, exit
//! statuses, phase-marker encoding, the telemetry page layout and syscall
//! numbers. The crate is `no_std` and dependency-free so that the guest (built
//! for `x86_64-unknown-none` and `i586-unknown-linux-gnu`) and the host VMM
//! compile the very same definitions. `docs/telemetry-abi.md` is the prose
//! version of this file; change both together and bump
//! [`telemetry::VERSION`] on any layout change.
#![warn(missing_docs)]
#![no_std]

pub mod options;
pub mod workingset;

/// I/O ports the guest uses to talk to the VMM.
pub mod port {
    /// 16550 UART, COM1: the guest console.
    pub const SERIAL_COM1: u16 = 0x3f8;
    /// Number of registers of the 16550.
    pub const SERIAL_LEN: u16 = 8;
    /// Exit device. A write of the guest's exit status (see [`crate::exit_status`])
    /// stops the VM. It sits where QEMU's `isa-debug-exit` device sits by default
    /// (iobase 0xf4, iosize 4), so the same image also stops QEMU, which then
    /// exits with `(status << 1) | 1`.
    pub const EXIT: u16 = 0xf4;
    /// Width in bytes of the exit device.
    pub const EXIT_LEN: u16 = 4;
    /// Phase markers: a 32-bit write of [`crate::phase::Marker::encode`].
    pub const PHASE: u16 = 0x600;
    /// Width in bytes of the phase-marker port.
    pub const PHASE_LEN: u16 = 4;
    /// ptiscope's Linux init's symbol channel (`--by-symbol` under QEMU):
    /// QEMU's `isa-debugcon` there takes the init's copy of the kernel's
    /// text symbols (`/proc/kallsyms`), one byte per `out dx, al`. Free on
    /// QEMU's pc machine (whose ACPI PM block SeaBIOS puts at 0x600-0x63f,
    /// the PM timer at 0x608).
    pub const SYMBOLS: u16 = 0x6f0;
    /// ptiscope's console-line port (the VMM's own, no PC device): a 32-bit
    /// `in` reads [`CONSOLE_LINE_MAGIC`] where the VMM has it (elsewhere
    /// an unclaimed port reads all ones); a 32-bit `out` of the
    /// guest-physical address (below 4 GiB) of a line record — a `u32`
    /// length, at most [`CONSOLE_LINE_MAX`], then that many bytes — writes
    /// the bytes to COM1 as if the guest had written them to its THR one by
    /// one. One exit per line instead of one per byte where `rep outsb`
    /// exits per byte (kvm_pvm).
    pub const CONSOLE_LINE: u16 = 0x6e0;
    /// What a 32-bit read of [`CONSOLE_LINE`] gives under ptiscope ("PCNL").
    pub const CONSOLE_LINE_MAGIC: u32 = 0x4c4e_4350;
    /// Longest line record, in bytes after the length.
    pub const CONSOLE_LINE_MAX: usize = 1020;
}

/// Statuses the guest writes to [`port::EXIT`]. The VMM exits with the same code.
pub mod exit_status {
    /// The workload ran and its checks passed.
    pub const SUCCESS: u32 = 0;
    /// The workload ran but a check failed (the console says which).
    pub const FAILURE: u32 = 1;
    /// An unexpected CPU exception (the console has vector, error code, RIP, CR2, CR3).
    pub const EXCEPTION: u32 = 2;
    /// A kernel panic (the console has the message).
    pub const PANIC: u32 = 3;
    /// The command line was not understood (the console says which key).
    pub const BAD_CMDLINE: u32 = 4;
    /// An expected fault was requested (`fault=...`) but did not happen.
    pub const FAULT_NOT_RAISED: u32 = 5;
    /// The guest cannot run what was asked on this CPU (e.g. `pcid=on` without PCID).
    pub const UNSUPPORTED: u32 = 6;

    /// A short name for a status, for reports.
    pub fn name(status: u32) -> &'static str {
        match status {
            SUCCESS => "success",
            FAILURE => "failure",
            EXCEPTION => "exception",
            PANIC => "panic",
            BAD_CMDLINE => "bad command line",
            FAULT_NOT_RAISED => "expected fault not raised",
            UNSUPPORTED => "unsupported on this CPU",
            _ => "unknown status",
        }
    }
}

/// Phase markers bracket the measured part of a workload.
///
/// The guest writes one 32-bit value to [`port::PHASE`]: bits 0..16 carry the
/// phase id, bit 31 is set on the end marker. The VMM snapshots its counters
/// at both exits and reports the deltas.
pub mod phase {
    /// Set on an end marker.
    pub const END_FLAG: u32 = 1 << 31;
    /// Bits that carry the phase id.
    pub const ID_MASK: u32 = 0xffff;

    /// The guest-physical address where a 32-bit write of
    /// [`Marker::encode`] is a phase marker too, as a write to
    /// [`crate::port::PHASE`] is: ptiscope's Linux init writes its markers
    /// here, through a `/dev/mem` mapping of this page, so that the measured
    /// process holds no I/O permission (with `ioperm`, Linux updates the
    /// TSS I/O bitmap on every return to user mode of the task, which would
    /// be in every measured call). A hole on both of ptiscope's machines:
    /// above the VMM's RAM (at most 1 GiB), and at the bottom of QEMU pc's
    /// PCI hole (its RAM below 4 GiB ends at 3.5 GiB at most; SeaBIOS
    /// places PCI BARs from the top of the hole, 0xfec00000, down).
    pub const MMIO_MARKER: u64 = 0xe000_0000;

    /// The main measured loop of a workload.
    pub const ID_WORKLOAD: u16 = 1;
    /// Warm-up before the measured loop (not reported as the result).
    pub const ID_WARMUP: u16 = 2;

    /// Begin or end of a phase.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Edge {
        /// The phase starts: the VMM takes its first snapshot.
        Begin,
        /// The phase ends: the VMM takes its second snapshot.
        End,
    }

    /// One decoded marker.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Marker {
        /// Phase id ([`ID_WORKLOAD`], [`ID_WARMUP`]); never 0.
        pub id: u16,
        /// Whether the phase begins or ends here.
        pub edge: Edge,
    }

    impl Marker {
        /// The begin marker of phase `id`.
        pub const fn begin(id: u16) -> Self {
            Marker {
                id,
                edge: Edge::Begin,
            }
        }
        /// The end marker of phase `id`.
        pub const fn end(id: u16) -> Self {
            Marker {
                id,
                edge: Edge::End,
            }
        }
        /// The value the guest writes to the port.
        pub const fn encode(self) -> u32 {
            let flag = match self.edge {
                Edge::Begin => 0,
                Edge::End => END_FLAG,
            };
            self.id as u32 | flag
        }
        /// Decodes a port value; `None` if reserved bits are set or the id is 0.
        pub const fn decode(value: u32) -> Option<Self> {
            if value & !(END_FLAG | ID_MASK) != 0 || value & ID_MASK == 0 {
                return None;
            }
            let id = (value & ID_MASK) as u16;
            if value & END_FLAG != 0 {
                Some(Marker::end(id))
            } else {
                Some(Marker::begin(id))
            }
        }
    }
}

/// The guest telemetry region: a header and per-CPU counter blocks that only
/// the guest writes and the host reads, live, at a guest-physical address the
/// VMM reserves (E820 type 2) and passes as `telemetry=0x...` on the command
/// line. All fields are little-endian; counters are naturally aligned `u64`s
/// updated with plain stores by the CPU that owns the block.
pub mod telemetry {
    /// `b"PTISCOPE"` read as a little-endian u64. Written last by the guest.
    pub const MAGIC: u64 = u64::from_le_bytes(*b"PTISCOPE");
    /// Layout version; bump on any change.
    pub const VERSION: u32 = 1;
    /// Size the VMM reserves for the region (one page).
    pub const REGION_SIZE: u64 = 4096;
    /// CPUs that have a counter block.
    pub const MAX_CPUS: usize = 8;
    /// Offset of CPU 0's counter block.
    pub const CPU_BLOCK_OFFSET: usize = 256;
    /// Bytes between two CPUs' blocks.
    pub const CPU_BLOCK_STRIDE: usize = 256;
    /// `u64` slots in a block (only the first [`Counter::COUNT`] are defined).
    pub const CPU_BLOCK_SLOTS: usize = CPU_BLOCK_STRIDE / 8;

    /// Header byte offsets.
    pub mod header {
        /// u64: [`super::MAGIC`].
        pub const MAGIC: usize = 0;
        /// u32: [`super::VERSION`].
        pub const VERSION: usize = 8;
        /// u32: number of CPUs whose blocks are live.
        pub const CPU_COUNT: usize = 12;
        /// u32: [`super::CPU_BLOCK_OFFSET`] as the guest used it.
        pub const CPU_BLOCK_OFFSET: usize = 16;
        /// u32: [`super::CPU_BLOCK_STRIDE`] as the guest used it.
        pub const CPU_BLOCK_STRIDE: usize = 20;
        /// u32: number of defined counters, [`super::Counter::COUNT`].
        pub const COUNTER_COUNT: usize = 24;
        /// u32: [`super::flags`] describing the running configuration.
        pub const FLAGS: usize = 28;
        /// u32: [`super::arch`] of the guest.
        pub const ARCH: usize = 32;
        /// u32: [`super::entry`] method in use for syscalls.
        pub const ENTRY: usize = 36;
        /// Bytes of header the guest writes.
        pub const SIZE: usize = 40;
    }

    /// Configuration bits in the header's `FLAGS` word.
    pub mod flags {
        /// Page table isolation is active.
        pub const PTI: u32 = 1 << 0;
        /// PCID is in use.
        pub const PCID: u32 = 1 << 1;
        /// Kernel text is mapped global in the user copy (`pti_global_text=on`).
        pub const PTI_GLOBAL_TEXT: u32 = 1 << 2;
        /// The virtual CPU reported ARCH_CAPABILITIES.RDCL_NO (not Meltdown-vulnerable).
        pub const RDCL_NO: u32 = 1 << 3;
    }

    /// Guest flavour in the header's `ARCH` word.
    pub mod arch {
        /// The x86_64 guest (4-level paging).
        pub const X86_64: u32 = 1;
        /// The 32-bit guest with PAE paging.
        pub const I386_PAE: u32 = 2;
    }

    /// Syscall entry method in the header's `ENTRY` word.
    pub mod entry {
        /// The `syscall` instruction.
        pub const SYSCALL: u32 = 1;
        /// The `sysenter` instruction.
        pub const SYSENTER: u32 = 2;
        /// `int $0x80`.
        pub const INT80: u32 = 3;
        /// `int3` (vector 3).
        pub const INT3: u32 = 4;
        /// `int $4` (vector 4).
        pub const INT4: u32 = 5;
    }

    /// `counters! { doc… Variant => "name", … }`: the [`Counter`] enum (each
    /// variant's index in a block is its place in the list, from 0), its
    /// number, [`Counter::ALL`] and [`Counter::name`], each counter written
    /// once.
    macro_rules! counters {
        ($($(#[$doc:meta])* $v:ident => $name:literal,)+) => {
            /// Per-CPU counters: the index of each in a CPU's block of `u64`s.
            #[derive(Debug, Clone, Copy, PartialEq, Eq)]
            #[repr(usize)]
            pub enum Counter {
                $($(#[$doc])* $v,)+
            }

            impl Counter {
                /// All counters in index order.
                pub const ALL: [Counter; Self::COUNT] = [$(Counter::$v,)+];
                /// Number of defined counters.
                pub const COUNT: usize = [$(Counter::$v,)+].len();
                /// Stable snake_case name used in reports and JSON.
                pub const fn name(self) -> &'static str {
                    match self {
                        $(Counter::$v => $name,)+
                    }
                }
            }
        };
    }

    counters! {
        /// CR3 writes switching to the kernel copy on entry from user mode.
        Cr3Entry => "cr3_writes_entry",
        /// CR3 writes switching to the user copy on exit to user mode.
        Cr3Exit => "cr3_writes_exit",
        /// CR3 writes on a context switch to another address space.
        Cr3ContextSwitch => "cr3_writes_context_switch",
        /// Any other CR3 write (boot, paranoid entries, explicit flushes).
        Cr3Other => "cr3_writes_other",
        /// CR3 writes with bit 63 (NOFLUSH) set; a subset of the four above.
        Cr3NoFlush => "cr3_writes_noflush",
        /// Flushes of all non-global TLB entries (flushing CR3 writes and CR4.PGE toggles).
        TlbFlushFull => "tlb_flushes_full",
        /// INVLPG instructions executed.
        Invlpg => "invlpg",
        /// INVPCID instructions executed.
        Invpcid => "invpcid",
        /// System calls entered.
        Syscalls => "syscalls",
        /// Hardware interrupts taken.
        Interrupts => "interrupts",
        /// CPU exceptions taken (page faults included).
        Exceptions => "exceptions",
        /// Page faults taken.
        PageFaults => "page_faults",
        /// Context switches between tasks.
        ContextSwitches => "context_switches",
    }

    impl Counter {
        /// Byte offset of this counter inside a CPU block.
        pub const fn offset_in_block(self) -> usize {
            self as usize * 8
        }
        /// Byte offset of this counter for `cpu` from the start of the region.
        pub const fn offset(self, cpu: usize) -> usize {
            CPU_BLOCK_OFFSET + cpu * CPU_BLOCK_STRIDE + self.offset_in_block()
        }
    }

    const _: () = assert!(CPU_BLOCK_OFFSET + MAX_CPUS * CPU_BLOCK_STRIDE <= REGION_SIZE as usize);
    const _: () = assert!(Counter::COUNT <= CPU_BLOCK_SLOTS);
    const _: () = assert!(header::SIZE <= CPU_BLOCK_OFFSET);
}

/// Syscall numbers, the same for both guest flavours. They follow Linux
/// x86_64 numbering where Linux has the call, so traces read naturally.
pub mod syscall {
    /// `read(fd, buf, len)`: from a pipe's read end.
    pub const READ: usize = 0;
    /// `write(fd, buf, len)`: fd 1 is the console, other fds >= 0 pipes,
    /// negative fds fail at once with [`EBADF`] (`workload=write-badfd`).
    pub const WRITE: usize = 1;
    /// `close(fd)`; numbered but not implemented by the guest ([`ENOSYS`]).
    pub const CLOSE: usize = 3;
    /// `pipe(fds)`; numbered but not implemented by the guest ([`ENOSYS`]).
    pub const PIPE: usize = 22;
    /// `sched_yield()`: run the next runnable task.
    pub const SCHED_YIELD: usize = 24;
    /// `getpid()`: the measured call of `workload=getpid`.
    pub const GETPID: usize = 39;
    /// `fork()`; numbered but not implemented by the guest ([`ENOSYS`]).
    pub const FORK: usize = 57;
    /// `exit(status)`: end the calling task; its parent reaps the status.
    pub const EXIT: usize = 60;
    /// `wait()`: reap one exited child and return its status (Linux's
    /// `wait4` number, without its arguments); [`ECHILD`] if there is none.
    pub const WAIT: usize = 61;
    /// `getppid()`: the measured call of `workload=getppid` and `poundsyscall`.
    pub const GETPPID: usize = 110;
    /// `arch_prctl(code, arg)`: only [`ARCH_SET_NOPTI`] and [`ARCH_GET_NOPTI`].
    pub const ARCH_PRCTL: usize = 158;
    /// ptiscope: write a phase marker (argument: [`crate::phase::Marker::encode`]).
    pub const PHASE_MARK: usize = 1000;
    /// ptiscope: read the kernel working set (`kwss=`, one word per 4 KiB
    /// page), then perform the workload's own system call with the same
    /// arguments; `-ENOSYS` without `kwss=`. The syscall loops call it
    /// instead of their syscall when `kwss=` is given.
    pub const KWSS_CALL: usize = 1001;
    /// Largest syscall number plus one.
    pub const TABLE_SIZE: usize = 1002;

    /// `arch_prctl` code: arg 1 = opt this process out of PTI (no CR3 switch on
    /// its entries and exits), 0 = opt back in. Mirrors the per-process PTI
    /// opt-out proposed on LKML in January 2018.
    pub const ARCH_SET_NOPTI: usize = 0x5002;
    /// `arch_prctl` code: returns 1 if the calling process runs without PTI.
    pub const ARCH_GET_NOPTI: usize = 0x5003;

    /// Error returned for a bad file descriptor (as Linux: -EBADF).
    pub const EBADF: isize = -9;
    /// Error returned for an unknown syscall (as Linux: -ENOSYS).
    pub const ENOSYS: isize = -38;
    /// Error returned for a bad argument (as Linux: -EINVAL).
    pub const EINVAL: isize = -22;
    /// No child to wait for (Linux -ECHILD).
    pub const ECHILD: isize = -10;
    /// Bad user address (Linux -EFAULT).
    pub const EFAULT: isize = -14;
}

/// Guest command-line keys. Values are documented in docs/design.md.
pub mod cmdline {
    /// `pti=on|off|auto`
    pub const PTI: &str = "pti";
    /// `pcid=on|off`
    pub const PCID: &str = "pcid";
    /// `entry=syscall|sysenter|int80|int3|int4` (the VMM resolves `auto`).
    pub const ENTRY: &str = "entry";
    /// `pti_global_text=on|off`: kernel text global in the user copy (both
    /// flavours; Linux without PCID, and v6 of the 2018 x86_32 series).
    pub const PTI_GLOBAL_TEXT: &str = "pti_global_text";
    /// `workload=`, one of [`crate::options::Workload`].
    pub const WORKLOAD: &str = "workload";
    /// `iterations=N` for the loop workloads.
    pub const ITERATIONS: &str = "iterations";
    /// `telemetry=0xGPA`: where the VMM reserved the telemetry region.
    pub const TELEMETRY: &str = "telemetry";
    /// `fault=pf|gp|ud|de|kread`: raise this fault on purpose (tests).
    pub const FAULT: &str = "fault";
    /// `rdcl_no=0|1`: unused by the guest (it reads the MSR); reserved.
    pub const RDCL_NO: &str = "rdcl_no";
    /// `groups=G` of `workload=sched-messaging` (1..=4; default 1).
    pub const GROUPS: &str = "groups";
    /// `loops=L` of `workload=sched-messaging`: messages each sender writes
    /// to each receiver of its group (default 10).
    pub const LOOPS: &str = "loops";
    /// `mode=process|thread` of `workload=sched-messaging` (default process).
    pub const MODE: &str = "mode";
    /// `wss=SIZE` of the syscall-loop workloads: bytes of user memory the
    /// loop reads between system calls (K/M/G suffixes; default 0). See
    /// [`crate::workingset`].
    pub const WSS: &str = "wss";
    /// `stride=BYTES` between two reads of the working set (default 4096).
    pub const STRIDE: &str = "stride";
    /// `touches=N` reads of the working set per iteration (default: one
    /// pass over it, `wss / stride` rounded up).
    pub const TOUCHES: &str = "touches";
    /// `wss_pages=4k|2m`: page size of the working set's mappings.
    pub const WSS_PAGES: &str = "wss_pages";
    /// `kwss=SIZE`: bytes of kernel memory each system call of the loop
    /// reads (one word per 4 KiB page) before doing its work (default 0).
    pub const KWSS: &str = "kwss";
    /// `cpus=N`: CPUs the VMM (or QEMU `-smp`) created, 1..=8 (default 1);
    /// the guest starts CPUs 1..N by INIT/SIPI.
    pub const CPUS: &str = "cpus";
    /// `threads=T` of `workload=poundsyscall`: threads, each calling getppid
    /// `iterations` times (default 1).
    pub const THREADS: &str = "threads";
    /// `fault_cpu=N`: raise `fault=` on CPU N (0..cpus) instead of the boot
    /// CPU (tests: a fault on another vCPU stops the VM and is named).
    pub const FAULT_CPU: &str = "fault_cpu";
    /// `pti_switch=asm|deferred`, one of [`crate::options::PtiSwitch`].
    pub const PTI_SWITCH: &str = "pti_switch";
}

/// Console lines meant for machines start with this prefix, followed by
/// space-separated `key=value` pairs, e.g.
/// `@result workload=getpid iterations=1000 cycles_per_call=812 ...`.
pub const RESULT_PREFIX: &str = "@result ";
/// The first line the guest prints, followed by its flavour and version.
pub const BANNER_PREFIX: &str = "ptiscope guest";

#[cfg(test)]
mod tests {
    use super::phase::*;
    use super::telemetry::*;

    #[test]
    fn phase_markers_round_trip() {
        for m in [Marker::begin(1), Marker::end(1), Marker::begin(0xffff)] {
            assert_eq!(Marker::decode(m.encode()), Some(m));
        }
        assert_eq!(Marker::decode(0), None, "id 0 is reserved");
        assert_eq!(Marker::decode(1 << 20 | 1), None, "reserved bits set");
    }

    #[test]
    fn counter_names_are_unique_and_indices_dense() {
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
            for d in &Counter::ALL[i + 1..] {
                assert_ne!(c.name(), d.name());
            }
        }
        assert_eq!(Counter::ContextSwitches.offset(1), 256 + 256 + 12 * 8);
        // The block layout is ABI (the host reads counters by index): any
        // change to this order needs a VERSION bump.
        let mut order = [""; Counter::COUNT];
        for (slot, c) in order.iter_mut().zip(Counter::ALL) {
            *slot = c.name();
        }
        assert_eq!(
            order.join(" "),
            "cr3_writes_entry cr3_writes_exit cr3_writes_context_switch cr3_writes_other \
             cr3_writes_noflush tlb_flushes_full invlpg invpcid syscalls interrupts exceptions \
             page_faults context_switches"
        );
    }
}
