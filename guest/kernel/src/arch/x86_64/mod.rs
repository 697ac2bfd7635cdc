//! The x86_64 flavour: 4-level paging, entered from PVH's 32-bit entry.
pub mod boot;
pub mod context;
pub mod cpu;
pub mod descriptors;
pub mod entry;
pub mod exceptions;
pub mod paging;
pub mod percpu;
pub mod pti_deferred;
pub mod smp;
pub mod sysentry;
pub mod user;

/// The virtual layout (`guest_core::layout`).
pub mod layout {
    pub use guest_core::layout::*;
}

/// Flavour name in the banner.
pub const NAME: &str = "x86_64";
/// `ptiscope_abi::telemetry::arch` code of this flavour.
pub const TELEMETRY_ARCH: u32 = ptiscope_abi::telemetry::arch::X86_64;

/// Why this flavour cannot run `config`, if it cannot.
pub fn unsupported(config: &guest_core::cmdline::Config) -> Option<&'static str> {
    if config.entry == guest_core::cmdline::Entry::Sysenter {
        return Some("entry=sysenter is not available in 64-bit mode on this guest (64-bit SYSENTER is Intel-only); use entry=syscall or an int entry");
    }
    if config.pti_switch == guest_core::cmdline::PtiSwitch::Deferred && config.pcid {
        return Some("pti_switch=deferred is built without PCID (pcid=off)");
    }
    if config.pcid && !cpu::has_pcid() {
        return Some("pcid=on but this CPU has no PCID (CPUID.1:ECX[17] clear)");
    }
    None
}
