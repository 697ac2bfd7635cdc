//! What a run is, as data: what the user asked ([`request`]: `RunConfig`),
//! the guest's options and the command line written from them
//! ([`cmdline`]), and a run with everything settled ([`ResolvedRun`],
//! made by [`crate::preflight`](mod@crate::preflight)) for a [`Target`]
//! with what it boots ([`BootSource`]), which guest it is ([`guest`]: the
//! one guest kind, companion or Linux, for the request, the settled run
//! and `reproduce`'s cells), and a Linux guest as data ([`linux`]: the
//! `--linux` request, the settled Linux guest).
//! A leaf: the machine layer, the backends and the CLI all read it; it
//! imports only the machine layer's leaves (memory layout, image source)
//! and `output`'s `SerialOut`.

pub mod cmdline;
pub mod guest;
pub mod linux;
pub mod nested;
pub mod request;

use std::sync::Arc;

use crate::machine::loader;
use crate::machine::memory::MemoryLayout;
use cmdline::ResolvedOptions;
use guest::GuestKind;
pub use request::RunConfig;

/// The most vCPUs a run can have: the guest telemetry page's CPU blocks.
pub const MAX_CPUS: u32 = ptiscope_abi::telemetry::MAX_CPUS as u32;
// The ACPI tables (machine::acpi) describe every vCPU a run may have.
const _: () = assert!(MAX_CPUS <= crate::machine::acpi::MAX_CPUS);

/// Where a run will execute: the choice changes what `entry=auto` means
/// and which host limits apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// This host's KVM, through the VMM: limits from the probe.
    Kvm,
    /// QEMU's TCG: every entry works; no probe, no KVM needed.
    QemuTcg,
}

/// What a run boots, read and written once (compare boots it many times):
/// the kernel image, the initrd and the command line, as Firecracker's
/// boot source has them. Every backend boots from it: the VMM writes
/// the image, initrd and command line into guest memory, QEMU gets them as
/// `-kernel`, `-initrd` and `-append`.
#[derive(Debug, Clone)]
pub struct BootSource {
    /// The kernel image (the companion's ELF, a Linux bzImage or PVH ELF).
    pub image: Arc<[u8]>,
    /// How the image is named in messages.
    pub image_name: String,
    /// The initrd: a Linux guest's initramfs with ptiscope's init; `None`
    /// for the companion, which needs none.
    pub initrd: Option<Arc<[u8]>>,
    /// The kernel command line (with `telemetry=` for the companion on
    /// the KVM target).
    pub cmdline: String,
    /// Guest memory with `image` loaded by preflight's check, for the
    /// first KVM boot (empty otherwise; it holds the image as loaded, never
    /// the command line or boot parameters, which each boot writes).
    pub preloaded: loader::Preloaded,
}

/// A run with everything settled.
#[derive(Debug, Clone)]
pub struct ResolvedRun {
    /// The request as given (timeouts, outputs, backend options).
    pub config: RunConfig,
    /// Where everything goes in guest memory, from `--mem`.
    pub layout: MemoryLayout,
    /// What the run boots: image, initrd, command line.
    pub boot: BootSource,
    /// The guest options as the guest gets them.
    pub guest: ResolvedOptions,
    /// Whether `entry=auto` was settled by the flavour heuristic because
    /// the probe could not run (reports say so).
    pub entry_guessed: bool,
    /// Which guest: the companion, or a Linux kernel (`--linux`) settled
    /// (its architecture, version, PTI configuration, the init's words).
    pub guest_kind: GuestKind<Arc<linux::LinuxGuest>>,
}

impl ResolvedRun {
    /// Whether the image is the 32-bit (ELF32, PAE) flavour.
    pub fn is_elf32(&self) -> bool {
        loader::is_elf32(&self.boot.image)
    }
}
