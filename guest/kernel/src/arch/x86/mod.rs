//! The x86 flavour: 32-bit protected mode with PAE paging (3 levels), a
//! 3G/1G split, entered from the same PVH 32-bit entry as x86_64. Syscall
//! entries: `int $0x80` (and `int3`/`int $4`, which share the stub) and
//! SYSENTER; PTI as Linux x86_32 does it since v4.19 (see docs/guest.md).
pub mod boot;
pub mod context;
pub mod cpu;
pub mod descriptors;
pub mod entry;
pub mod exceptions;
pub mod mem;
pub mod paging;
pub mod percpu;
pub mod pti_deferred;
pub mod smp;
pub mod sysentry;
pub mod user;

/// The virtual layout (`guest_core::pae::layout`).
pub mod layout {
    pub use guest_core::pae::layout::*;
}

/// Flavour name in the banner.
pub const NAME: &str = "i386";
/// `ptiscope_abi::telemetry::arch` code of this flavour.
pub const TELEMETRY_ARCH: u32 = ptiscope_abi::telemetry::arch::I386_PAE;

/// Why this flavour cannot run `config`, if it cannot.
pub fn unsupported(config: &guest_core::cmdline::Config) -> Option<&'static str> {
    use guest_core::cmdline::Entry;
    if config.entry == Entry::Syscall {
        return Some("entry=syscall is not available on the 32-bit guest (32-bit SYSCALL is AMD-only); use entry=sysenter or an int entry");
    }
    if config.entry == Entry::Sysenter && !cpu::has_sep() {
        return Some("entry=sysenter but this CPU has no SYSENTER (CPUID.1:EDX[11] clear)");
    }
    if config.pcid {
        return Some("pcid=on: PAE paging has no PCID (CR4.PCIDE needs long mode)");
    }
    None
}
