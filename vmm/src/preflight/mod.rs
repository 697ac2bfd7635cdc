//! Settling a run before any VM exists.
//!
//! [`preflight`] turns a [`RunConfig`] (what the user asked for) into a
//! [`ResolvedRun`] (what will run): the memory layout, the image read and
//! checked, `entry=auto` resolved, PCID and 32-bit paging checked against
//! what the host's KVM can do (from the probe, cached per process), and the
//! guest command line written. `run`, `compare`, `pagetables` and `sweep`
//! all go through it once per configuration; the VM layer
//! ([`crate::machine`]) takes only a `ResolvedRun` and never asks the probe.

pub mod cmdline;
pub mod host;
pub mod request;

use std::sync::Arc;

use crate::machine::kvm::{self, KvmOpenError};
use crate::machine::loader::{self, LoadError};
use crate::machine::memory::{MemoryError, MemoryLayout};
use cmdline::{CmdlineError, Entry, EntryChoice, ResolvedOptions, Switch};
pub use request::{RunConfig, SerialOut};

/// The most vCPUs a run can have: the guest telemetry page's CPU blocks.
pub const MAX_CPUS: u32 = ptiscope_abi::telemetry::MAX_CPUS as u32;

/// Where a run will execute: the choice changes what `entry=auto` means
/// and which host limits apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// This host's KVM, through the VMM: limits from the probe.
    Kvm,
    /// QEMU's TCG: every entry works; no probe, no KVM needed.
    QemuTcg,
}

/// A run with everything settled.
#[derive(Debug, Clone)]
pub struct ResolvedRun {
    /// The request as given (timeouts, outputs, backend options).
    pub config: RunConfig,
    /// Where everything goes in guest memory, from `--mem`.
    pub layout: MemoryLayout,
    /// The kernel image, read once (compare boots it many times).
    pub image: Arc<[u8]>,
    /// How the image is named in messages.
    pub image_name: String,
    /// The guest options as the guest gets them.
    pub guest: ResolvedOptions,
    /// The guest command line (with `telemetry=` for the KVM target).
    pub cmdline: String,
    /// Whether `entry=auto` was settled by the flavour heuristic because
    /// the probe could not run (reports say so).
    pub entry_guessed: bool,
    /// A Linux guest (`--linux`): the kernel settled, its initramfs packed;
    /// `None` for ptiscope's own guest.
    pub linux: Option<Arc<crate::linux::LinuxGuest>>,
}

impl ResolvedRun {
    /// Whether the image is the 32-bit (ELF32, PAE) flavour.
    pub fn is_elf32(&self) -> bool {
        loader::is_elf32(&self.image)
    }
}

/// Errors settling a run.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    /// `--mem` gives no usable memory layout.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// The guest options or the command line built from them are invalid.
    #[error(transparent)]
    Cmdline(#[from] CmdlineError),
    /// The kernel image could not be read or would not load.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// `/dev/kvm` could not be opened ([`Target::Kvm`] only).
    #[error(transparent)]
    Kvm(#[from] KvmOpenError),
    /// The host cannot run what was asked (an entry, PCID or paging mode the
    /// probe found missing).
    #[error("{0}")]
    Unsupported(String),
    /// A Linux guest (`--linux`) could not be settled.
    #[error(transparent)]
    Linux(#[from] crate::linux::LinuxError),
}

/// `entry=auto` under QEMU: TCG delivers every entry, so the native one of
/// each flavour (SYSCALL on x86_64, SYSENTER on i386).
fn native_entry(elf32: bool) -> Entry {
    if elf32 {
        Entry::Sysenter
    } else {
        Entry::Syscall
    }
}

/// Guest memory a working set cannot use (kernel image, page tables,
/// stacks, the reserved low memory).
const WORKING_SET_HEADROOM: u64 = 8 << 20;

/// Settles `config` for `target`. Bad input is reported before KVM is
/// touched, so that it reads the same on hosts without KVM.
pub fn preflight(config: &RunConfig, target: Target) -> Result<ResolvedRun, PreflightError> {
    if let crate::linux::GuestKind::Linux(req) = &config.guest_kind {
        return crate::linux::preflight(config, req, target);
    }
    let layout = MemoryLayout::new(config.mem_mib)?;
    let asked = config.guest.absorb_extra()?;
    // The guest's own image, page tables and stacks take a few MiB; the
    // guest checks the exact figure and refuses with its own message.
    let wss = asked
        .working_set_bytes()
        .saturating_add(asked.kernel_working_set_bytes());
    if wss > 0 && wss.saturating_add(WORKING_SET_HEADROOM) > config.mem_mib << 20 {
        return Err(CmdlineError::BadValue {
            key: ptiscope_abi::cmdline::WSS.into(),
            // What the user wrote (`200M`), not the bytes it means.
            value: asked
                .extra_value(ptiscope_abi::cmdline::WSS)
                .or_else(|| asked.extra_value(ptiscope_abi::cmdline::KWSS))
                .map_or_else(|| wss.to_string(), str::to_owned),
            why: format!(
                "{} MiB of working set (wss= and kwss=) do not fit a guest of {} MiB with the \
                 kernel's own {} MiB: raise --mem (up to 1024) or lower wss=/kwss=",
                wss.div_ceil(1 << 20),
                config.mem_mib,
                WORKING_SET_HEADROOM >> 20
            ),
        }
        .into());
    }
    // A guest that runs no user code enters the kernel by no syscall: no
    // entry, and no entry probe spent on a boot-only run.
    let user_code = asked.runs_user_code();
    let mut guest = ResolvedOptions {
        pti: asked.pti,
        pcid: asked.pcid,
        entry: match asked.entry {
            EntryChoice::Fixed(e) => Some(e),
            // Stands in for the check below; settled after the KVM checks.
            EntryChoice::Auto if user_code => Some(Entry::Int3),
            EntryChoice::Auto => None,
        },
        workload: asked.workload,
        iterations: asked.iterations,
        extra: asked.extra.clone(),
    };
    if !(1..=MAX_CPUS).contains(&config.cpus) {
        return Err(CmdlineError::BadValue {
            key: ptiscope_abi::cmdline::CPUS.into(),
            value: config.cpus.to_string(),
            why: format!("the number of vCPUs must be 1..={MAX_CPUS}"),
        }
        .into());
    }
    // The guest learns how many CPUs to start from its command line (there
    // is no ACPI MADT here); one CPU is its default and stays unsaid.
    if config.cpus > 1 {
        let word = format!("{}={}", ptiscope_abi::cmdline::CPUS, config.cpus);
        guest.extra = if guest.extra.is_empty() {
            word
        } else {
            format!("{} {word}", guest.extra)
        };
    }
    cmdline::build(&guest, layout.telemetry_addr())?;

    let image: Arc<[u8]> = loader::read_image(&config.kernel)?.into();
    let image_name = config.kernel.describe();
    loader::check_image(&image, &image_name, &layout)?;
    let elf32 = loader::is_elf32(&image);

    let auto = asked.entry == EntryChoice::Auto && user_code;
    let mut entry_guessed = false;
    match target {
        Target::QemuTcg => {
            if auto {
                guest.entry = Some(native_entry(elf32));
            }
        }
        Target::Kvm => {
            let kvm = kvm::open_kvm()?;
            let recommended = kvm.get_nr_vcpus().max(1);
            if config.cpus as usize > recommended {
                return Err(PreflightError::Unsupported(format!(
                    "--cpus {}: this host's KVM recommends at most {recommended} vCPUs per VM \
                     (KVM_CAP_NR_VCPUS); use --cpus {recommended} or fewer",
                    config.cpus
                )));
            }
            if config.cpus > 1 && !config.irqchip {
                return Err(PreflightError::Unsupported(
                    "more than one vCPU needs the in-kernel irqchip: the guest starts its other \
                     CPUs by INIT/SIPI through the LAPIC"
                        .into(),
                ));
            }
            // The i386 flavour turns on PAE paging outside long mode, which
            // some KVMs (kvm_pvm) refuse with a #GP the guest cannot
            // survive: say so before booting rather than report a triple fault.
            if elf32 {
                if let Some((false, detail)) = host::pae_paging_usable() {
                    return Err(PreflightError::Unsupported(format!(
                        "{image_name} is a 32-bit (i386 PAE) guest, but this host's KVM refuses \
                         32-bit paging outside long mode (probe: {detail}). Run it under QEMU \
                         instead (`ptiscope run --backend qemu`) or on a KVM host with hardware \
                         virtualization"
                    )));
                }
            }
            if auto {
                let (e, guessed) = host::resolve_entry();
                guest.entry = Some(e);
                entry_guessed = guessed;
            } else if let EntryChoice::Fixed(e) = asked.entry {
                host::check_entry(e).map_err(PreflightError::Unsupported)?;
            }
            if guest.pcid == Some(Switch::On) {
                if let Some((false, detail)) = host::pcid_usable() {
                    return Err(PreflightError::Unsupported(format!(
                        "--pcid on: this host's vCPU has no usable PCID (probe: {detail}); \
                         use --pcid off"
                    )));
                }
            }
        }
    }
    let mut cmdline = cmdline::build(&guest, layout.telemetry_addr())?;
    if target == Target::QemuTcg {
        // QEMU has no telemetry region: the guest keeps its counters to itself.
        cmdline = cmdline
            .split_whitespace()
            .filter(|w| !w.starts_with("telemetry="))
            .collect::<Vec<_>>()
            .join(" ");
    }
    Ok(ResolvedRun {
        config: config.clone(),
        layout,
        image,
        image_name,
        guest,
        cmdline,
        entry_guessed,
        linux: None,
    })
}
