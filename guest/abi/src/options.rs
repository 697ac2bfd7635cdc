//! The experiment's option values, typed once for both sides.
//!
//! The VMM holds these values (never their text) from its command line to
//! the guest's; each is written to the guest command line through
//! [`core::fmt::Display`] and read back by the guest through
//! [`core::str::FromStr`], so the spelling of every value lives here only.

use core::fmt;
use core::str::FromStr;

/// A value that is not one of the names of an option enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownValue {
    /// What the option accepts, e.g. `on|off|auto`.
    pub expected: &'static str,
}

impl core::error::Error for UnknownValue {}

impl fmt::Display for UnknownValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "expected one of {}", self.expected)
    }
}

/// `"a|b|c"` from `"a", "b", "c"`, at compile time.
macro_rules! join_bar {
    ($first:literal $(, $rest:literal)*) => { concat!($first $(, "|", $rest)*) };
}

/// Defines an option enum with its command-line names, `ALL`, `name()`,
/// `Display` and `FromStr` from one table.
macro_rules! option_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident { $( $(#[$vmeta:meta])* $variant:ident => $text:literal ),+ $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
        pub enum $name {
            $( $(#[$vmeta])* #[cfg_attr(feature = "serde", serde(rename = $text))] $variant ),+
        }

        impl $name {
            /// Every value, in documentation order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            /// The names on the command line, in the order of [`Self::ALL`].
            pub const NAMES: &'static [&'static str] = &[$($text),+];
            /// The names, `|`-separated, for messages.
            pub const EXPECTED: &'static str = join_bar!($($text),+);
            /// The name on the command line.
            pub const fn name(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl FromStr for $name {
            type Err = UnknownValue;
            fn from_str(s: &str) -> Result<Self, UnknownValue> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(UnknownValue {
                        expected: Self::EXPECTED,
                    }),
                }
            }
        }
    };
}

option_enum! {
    /// `pti=`: page table isolation.
    pub enum PtiMode {
        /// Isolate: user mode runs on a page-table copy that maps the user half
        /// and, of the kernel, only the entry area.
        On => "on",
        /// One page-table tree for user and kernel, no CR3 switch.
        Off => "off",
        /// On unless the CPU reports ARCH_CAPABILITIES.RDCL_NO.
        Auto => "auto",
    }
}

option_enum! {
    /// An on/off option (`pcid=`, `pti_global_text=`).
    pub enum Switch {
        /// Enabled.
        On => "on",
        /// Disabled.
        Off => "off",
    }
}

impl Switch {
    /// `On` for true.
    pub const fn from_bool(on: bool) -> Switch {
        if on {
            Switch::On
        } else {
            Switch::Off
        }
    }
}

option_enum! {
    /// `entry=`: how user mode enters the kernel for a system call.
    pub enum Entry {
        /// The `syscall` instruction (x86_64 only).
        Syscall => "syscall",
        /// The `sysenter` instruction (the 32-bit flavour; refused on x86_64).
        Sysenter => "sysenter",
        /// `int $0x80`.
        Int80 => "int80",
        /// `int3` (vector 3).
        Int3 => "int3",
        /// `int $4` (vector 4).
        Int4 => "int4",
    }
}

impl Entry {
    /// The [`crate::telemetry::entry`] code.
    pub const fn abi_code(self) -> u32 {
        use crate::telemetry::entry;
        match self {
            Entry::Syscall => entry::SYSCALL,
            Entry::Sysenter => entry::SYSENTER,
            Entry::Int80 => entry::INT80,
            Entry::Int3 => entry::INT3,
            Entry::Int4 => entry::INT4,
        }
    }

    /// The entry with this telemetry code.
    pub fn from_abi_code(code: u32) -> Option<Entry> {
        Entry::ALL.iter().copied().find(|e| e.abi_code() == code)
    }

    /// IDT vector of the `int n` entries.
    pub const fn vector(self) -> Option<u8> {
        match self {
            Entry::Int80 => Some(0x80),
            Entry::Int3 => Some(3),
            Entry::Int4 => Some(4),
            Entry::Syscall | Entry::Sysenter => None,
        }
    }
}

option_enum! {
    /// `workload=`: what the guest runs.
    pub enum Workload {
        /// Boot, report, exit.
        None => "none",
        /// `getpid()` `iterations=` times.
        Getpid => "getpid",
        /// `getppid()` `iterations=` times.
        Getppid => "getppid",
        /// `write(-1, ...)`: fails early in the kernel.
        WriteBadfd => "write-badfd",
        /// getpid after opting the process out of PTI (`arch_prctl(ARCH_SET_NOPTI, 1)`).
        NoptiGetpid => "nopti-getpid",
        /// `perf bench sched messaging` with pipes: `groups=` groups of
        /// [`GROUP_SIZE`] senders and as many receivers, `loops=` messages per
        /// sender and receiver, `mode=process|thread`.
        SchedMessaging => "sched-messaging",
        /// mmtests `poundsyscall`: `threads=` threads of one process, each
        /// calling getppid `iterations` times, spread over the CPUs (`cpus=`).
        Poundsyscall => "poundsyscall",
    }
}

/// Most `threads=` of poundsyscall (the task table also holds the parent).
pub const MAX_THREADS: u64 = 64;
// Each thread's working-set record fits the control page.
const _: () = assert!(
    crate::workingset::control::THREADS
        + crate::workingset::control::THREAD_RECORD * MAX_THREADS as usize
        <= 4096
);
/// Most CPUs (`cpus=`): the telemetry page's CPU blocks.
pub const MAX_CPUS: u64 = crate::telemetry::MAX_CPUS as u64;

impl Workload {
    /// One system call per iteration, `iterations=` of them.
    pub const fn is_syscall_loop(self) -> bool {
        matches!(
            self,
            Workload::Getpid | Workload::Getppid | Workload::WriteBadfd | Workload::NoptiGetpid
        )
    }

    /// Whether a user working set (`wss=`) applies: read by the syscall
    /// loop, or by each poundsyscall thread, between two calls. The kernel
    /// working set (`kwss=`) applies to the syscall loops only.
    pub const fn takes_working_set(self) -> bool {
        self.is_syscall_loop() || matches!(self, Workload::Poundsyscall)
    }

    /// Whether the guest runs user code for it.
    pub const fn runs_user_code(self) -> bool {
        !matches!(self, Workload::None)
    }
}

option_enum! {
    /// `pti_switch=`: where the kernel->user CR3 switch of a syscall's exit
    /// is done (the 2020 "defer CR3 switch to C code" RFC).
    pub enum PtiSwitch {
        /// In the assembly exit stub (as Linux does).
        Asm => "asm",
        /// Late, from Rust code, with that code's text page mapped in the
        /// user copy besides the entry area (int entries, no PCID).
        Deferred => "deferred",
    }
}

option_enum! {
    /// `fault=`: raise this fault on purpose (tests).
    pub enum Fault {
        /// Page fault in the kernel (read of an unmapped address).
        Pf => "pf",
        /// General protection fault in the kernel (non-canonical access).
        Gp => "gp",
        /// Invalid opcode (`ud2`) in the kernel.
        Ud => "ud",
        /// Divide error in the kernel.
        De => "de",
        /// A user program reads a kernel address.
        Kread => "kread",
        /// Spin forever at CPL0 with interrupts off (tests the VMM's timeout).
        Hang => "hang",
        /// `cli; hlt` forever (tests the VMM's timeout while halted).
        Halt => "halt",
    }
}

impl Fault {
    /// Whether the fault is raised from user code.
    pub const fn runs_user_code(self) -> bool {
        matches!(self, Fault::Kread)
    }
}

option_enum! {
    /// `mode=` of `workload=sched-messaging`.
    pub enum TaskMode {
        /// Each sender and receiver is a process with its own address space
        /// (perf bench's default): switching between them writes CR3.
        Process => "process",
        /// All share one address space (perf bench `-t`): no CR3 write.
        Thread => "thread",
    }
}

option_enum! {
    /// `wss_pages=`: page size of the user working set's mappings.
    pub enum WssPages {
        /// 4 KiB pages: one TLB entry per page to refill after a flush.
        Small => "4k",
        /// 2 MiB pages: one TLB entry per 2 MiB.
        Huge => "2m",
    }
}

impl WssPages {
    /// Bytes per page.
    pub const fn bytes(self) -> u64 {
        match self {
            WssPages::Small => crate::workingset::pages::SMALL,
            WssPages::Huge => crate::workingset::pages::HUGE,
        }
    }
}

/// Senders per group of `workload=sched-messaging`, and receivers per group
/// (perf bench sched messaging: 20 of each).
pub const GROUP_SIZE: u64 = 20;
/// Largest `groups=`: the guest's task table holds `MAX_GROUPS * 2 * GROUP_SIZE`
/// workers plus their parent (161 tasks).
pub const MAX_GROUPS: u64 = 4;
/// Default `groups=` (perf's default is 10; one group keeps a run short
/// where kernel code is emulated).
pub const DEFAULT_GROUPS: u64 = 1;
/// Largest `loops=`.
pub const MAX_LOOPS: u64 = 1_000_000;
/// Default `loops=` (perf's default is 100): 4000 messages with one group.
pub const DEFAULT_LOOPS: u64 = 10;
/// Default `iterations=` of the loop workloads.
pub const DEFAULT_ITERATIONS: u64 = 10_000;
/// Largest `iterations=`: the guest counts them in 32 bits plus one.
pub const MAX_ITERATIONS: u64 = 1 << 32;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for w in Workload::ALL {
            assert_eq!(w.name().parse::<Workload>(), Ok(*w));
        }
        for e in Entry::ALL {
            assert_eq!(e.name().parse::<Entry>(), Ok(*e));
            assert_eq!(Entry::from_abi_code(e.abi_code()), Some(*e));
        }
        assert_eq!(
            "maybe".parse::<PtiMode>(),
            Err(UnknownValue {
                expected: "on|off|auto"
            })
        );
    }
}
