//! Settling a run before any VM exists.
//!
//! [`preflight`] turns a [`RunConfig`] (what the user asked for) into a
//! [`ResolvedRun`] (what will run): the memory layout, the image read and
//! checked, `entry=auto` resolved, PCID and 32-bit paging checked against
//! what the host's KVM can do (from the probe, cached per process), and the
//! guest command line written. `run`, `compare`, `pagetables` and `sweep`
//! all go through it once per configuration; the VM layer
//! ([`crate::machine`]) takes only a `ResolvedRun` and never asks the probe.
//! A Linux guest (`--linux`) is settled by [`linux::settle`], with its own
//! error type ([`linux::LinuxError`]) that [`PreflightError::Linux`] wraps.

pub mod linux;

use std::sync::Arc;

use crate::machine::kvm::{self, KvmOpenError};
use crate::machine::loader::{self, LoadError};
use crate::machine::memory::{MemoryError, MemoryLayout};
use crate::probe::host::HostFacts;
use crate::spec::cmdline::{self, CmdlineError, EntryChoice, ResolvedOptions};
use crate::spec::guest::GuestKind;
use crate::spec::{BootSource, ResolvedRun, RunConfig, Target, MAX_CPUS};
use ptiscope_abi::options::{Entry, Switch};

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
    /// More vCPUs than this host's KVM recommends per VM (KVM_CAP_NR_VCPUS).
    #[error(
        "--cpus {cpus}: this host's KVM recommends at most {recommended} vCPUs per VM \
         (KVM_CAP_NR_VCPUS); use --cpus {recommended} or fewer"
    )]
    TooManyVcpus {
        /// What was asked (`--cpus`).
        cpus: u32,
        /// KVM's recommended maximum.
        recommended: usize,
    },
    /// More than one vCPU without the in-kernel irqchip (`--no-irqchip`).
    #[error(
        "more than one vCPU needs the in-kernel irqchip: the guest starts its other \
         CPUs by INIT/SIPI through the LAPIC"
    )]
    SmpWithoutIrqchip,
    /// A 32-bit (PAE) image on a KVM the probe found refusing 32-bit paging
    /// outside long mode (kvm_pvm).
    #[error(
        "{image} is a 32-bit (i386 PAE) guest, but this host's KVM refuses \
         32-bit paging outside long mode (probe: {detail}). Run it under QEMU \
         instead (`ptiscope run --backend qemu`) or on a KVM host with hardware \
         virtualization"
    )]
    PaePagingRefused {
        /// How the image is named.
        image: String,
        /// What the probe saw.
        detail: String,
    },
    /// An explicit `--entry` the probe found this host does not deliver
    /// (the probe's words, with the entries that do work).
    #[error("{0}")]
    EntryRefused(String),
    /// `--pcid on` where the probe found no usable PCID.
    #[error("--pcid on: this host's vCPU has no usable PCID (probe: {detail}); use --pcid off")]
    PcidUnusable {
        /// What the probe saw.
        detail: String,
    },
    /// A Linux guest (`--linux`) could not be settled.
    #[error(transparent)]
    Linux(#[from] linux::LinuxError),
}

impl PreflightError {
    /// Whether this is the host's KVM refusing what another backend can run
    /// (32-bit paging, an entry or PCID the probe found missing, a Linux
    /// userspace): a reason to try the next backend, not bad input.
    pub fn host_kvm_refuses(&self) -> bool {
        matches!(
            self,
            PreflightError::PaePagingRefused { .. }
                | PreflightError::EntryRefused(_)
                | PreflightError::PcidUnusable { .. }
                | PreflightError::Linux(linux::LinuxError::Backend(_))
        )
    }
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

/// What to do about a working set that does not fit `config.mem_mib`:
/// raise `--mem` as far as the image allows (1024 MiB; 768 for a 32-bit
/// guest, known before the image is read for the embedded one), unless
/// even that is too small.
fn working_set_advice(config: &RunConfig, image: Option<&[u8]>, wss: u64) -> String {
    let elf32 = match (&config.kernel, image) {
        (_, Some(i)) => Some(loader::is_elf32(i)),
        (loader::KernelSource::Embedded(b), None) => Some(loader::is_elf32(b)),
        _ => None,
    };
    let max = match elf32 {
        Some(true) => loader::ELF32_MAX_MEM_MIB,
        _ => crate::machine::memory::MAX_MEM_MIB,
    };
    let needed = (wss + WORKING_SET_HEADROOM).div_ceil(1 << 20);
    match elf32 {
        _ if needed <= max => {
            format!("raise --mem (to {needed} or more, up to {max}) or lower wss=/kwss=")
        }
        Some(true) => format!("lower wss=/kwss=: a 32-bit guest has at most {max} MiB"),
        _ => format!(
            "lower wss=/kwss=: a guest has at most {max} MiB (a 32-bit one {})",
            loader::ELF32_MAX_MEM_MIB
        ),
    }
}

/// Settles `config` for `target`. Bad input is reported before KVM is
/// touched, so that it reads the same on hosts without KVM. Under KVM the
/// host's limits come from `facts` (the caller's, gathered once); their
/// probes run here, before any VM of the run exists.
pub fn preflight(
    config: &RunConfig,
    target: Target,
    facts: &HostFacts,
) -> Result<ResolvedRun, PreflightError> {
    preflight_with_image(config, target, facts, None)
}

/// [`preflight`] with the image already read (`Some`: an earlier
/// [`BootSource::image`](crate::spec::BootSource::image) of the same `config.kernel`, shared instead of
/// read and copied again; `sweep` settles every cell of a configuration so).
pub fn preflight_with_image(
    config: &RunConfig,
    target: Target,
    facts: &HostFacts,
    image: Option<Arc<[u8]>>,
) -> Result<ResolvedRun, PreflightError> {
    let layout = MemoryLayout::new(config.mem_mib)?;
    let asked = config.guest.absorb_extra()?;
    if let GuestKind::Linux(req) = &config.guest_kind {
        return Ok(linux::settle(config, req, target, facts, layout, asked)?);
    }
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
                 kernel's own {} MiB: {}",
                wss.div_ceil(1 << 20),
                config.mem_mib,
                WORKING_SET_HEADROOM >> 20,
                working_set_advice(config, image.as_deref(), wss)
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

    // Whether this run keeps its check's loaded memory for its first boot:
    // on KVM, and not when the image is shared (`sweep` settles every cell
    // of a configuration up front; each would hold its own copy until its
    // turn).
    let keep = target == Target::Kvm && image.is_none();
    let image: Arc<[u8]> = match image {
        Some(shared) => shared,
        None => loader::read_image(&config.kernel)?.into(),
    };
    let image_name = config.kernel.describe();
    let preloaded = if keep {
        loader::Preloaded::new(loader::check_and_keep(&image, &image_name, &layout)?)
    } else {
        loader::check_image(&image, &image_name, &layout)?;
        loader::Preloaded::default()
    };
    let elf32 = loader::is_elf32(&image);

    let auto = asked.entry == EntryChoice::Auto && user_code;
    let mut entry_guessed = false;
    match target {
        Target::QemuTcg => {
            // QEMU reads PVH notes its own way: an image it would enter
            // elsewhere than the VMM is refused before it starts.
            loader::check_qemu_pvh_note(&image, &image_name)?;
            if auto {
                guest.entry = Some(native_entry(elf32));
            }
        }
        Target::Kvm => {
            let kvm = kvm::open_kvm()?;
            let recommended = kvm.get_nr_vcpus().max(1);
            if config.cpus as usize > recommended {
                return Err(PreflightError::TooManyVcpus {
                    cpus: config.cpus,
                    recommended,
                });
            }
            if config.cpus > 1 && !config.irqchip {
                return Err(PreflightError::SmpWithoutIrqchip);
            }
            // The i386 flavour turns on PAE paging outside long mode, which
            // some KVMs (kvm_pvm) refuse with a #GP the guest cannot
            // survive: say so before booting rather than report a triple fault.
            if elf32 {
                if let Some((false, detail)) = facts.pae_paging_usable() {
                    return Err(PreflightError::PaePagingRefused {
                        image: image_name,
                        detail,
                    });
                }
            }
            if auto {
                let (e, guessed) = facts.resolve_entry(elf32);
                guest.entry = Some(e);
                entry_guessed = guessed;
            } else if let EntryChoice::Fixed(e) = asked.entry {
                facts
                    .check_entry(elf32, e)
                    .map_err(PreflightError::EntryRefused)?;
            }
            if guest.pcid == Some(Switch::On) {
                if let Some((false, detail)) = facts.pcid_usable() {
                    return Err(PreflightError::PcidUnusable { detail });
                }
            }
            // The facts only the report's environment block carries (the
            // refill verdict among them) are not asked here: the command
            // settles them where no guest of its runs
            // (`HostFacts::settle_report_facts`), so that a boot waits for
            // no probe (nor the cache file) it does not need.
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
        boot: BootSource {
            image,
            image_name,
            initrd: None,
            cmdline,
            preloaded,
        },
        guest,
        entry_guessed,
        guest_kind: GuestKind::Companion,
    })
}
