//! The phase markers, written so that the measured process holds no I/O
//! permission.
//!
//! A task that has called `ioperm` (or `iopl`) has TIF_IO_BITMAP set, and
//! since Linux 5.5 every return to user mode of that task runs
//! `tss_update_io_bitmap` (arch/x86/include/asm/entry-common.h,
//! `arch_exit_to_user_mode_prepare`): 54 instructions of
//! `native_tss_update_io_bitmap` in every getppid on Debian's 6.1, which an
//! unmodified process does not pay. The permission is per task and is
//! inherited by the threads and processes the task starts, so a marker
//! written with `out` from the measuring task puts that cost into every
//! measured call.
//!
//! The init therefore writes its markers as a 32-bit store to a page of
//! guest-physical memory that no RAM or device backs
//! ([`ptiscope_abi::phase::MMIO_MARKER`]), mapped from `/dev/mem`: under
//! ptiscope's VMM the store exits to it as MMIO (the same value as at the
//! phase port); under QEMU TCG the plugin recognises the store by its bytes
//! (`mov edx, 0x600; mov [edi], eax`, its `umark=` rule) and takes its
//! snapshot before the store runs, which then goes nowhere. A mapping needs
//! CAP_SYS_RAWIO once, at the `open`, and nothing afterwards: no flag on
//! the task, nothing on its exit path.
//!
//! Where the kernel refuses that mapping (no CONFIG_DEVMEM, a lockdown, a
//! STRICT_DEVMEM that claims the page), for a 32-bit kernel on KVM
//! ([`KVM_I386`]), or when asked to ([`PORT_WORD`]),
//! the init falls back to the port marker with `ioperm`, and says so on its
//! `@marker` line: the host's note then says the counts include the
//! I/O-bitmap update.

use std::sync::atomic::{AtomicPtr, Ordering};

use ptiscope_abi::phase::MMIO_MARKER;
use ptiscope_abi::port::{PHASE, PHASE_LEN};

use crate::sys;

/// The mapped marker page; null: the port marker (the fallback).
static PAGE: AtomicPtr<u32> = AtomicPtr::new(core::ptr::null_mut());

/// How the markers are written.
pub enum Channel {
    /// A store to the mapped marker page.
    Mmio,
    /// `out` to the phase port after `ioperm`; why not the page (the
    /// `@marker` line's `reason=`).
    Port(String),
}

impl Channel {
    /// The `@marker` machine line.
    pub fn machine_line(&self) -> String {
        match self {
            Channel::Mmio => format!("@marker channel=mmio addr={MMIO_MARKER:#x}"),
            Channel::Port(why) => {
                format!("@marker channel=port port={PHASE:#x} io_bitmap=yes reason={why}")
            }
        }
    }
}

/// The kernel command-line word that asks for the port marker with
/// `ioperm` (`--append ptiscope.marker=port`): what the markers cost the
/// measured calls when they are written that way, measured against the
/// default. A dotted parameter, as `ptiscope.syms=1`.
pub const PORT_WORD: &str = "ptiscope.marker=port";

/// What Linux logs when it finds KVM's CPUID signature
/// (arch/x86/kernel/cpu/hypervisor.c, `init_hypervisor_platform`).
const KVM_DETECTED: &str = "Hypervisor detected: KVM";

/// Whether the kernel says it runs on KVM. From its log, not from CPUID:
/// a CPUID in user mode makes KVM skip the instruction, which without
/// SVM's next-RIP assist means fetching it through the guest's page
/// tables, the very walk that fails for a PAE guest under `--backend
/// nested` (KVM_EXIT_INTERNAL_ERROR, emulation, at the init's CPUID).
fn on_kvm() -> bool {
    sys::kernel_log(1 << 20).is_ok_and(|log| log.contains(KVM_DETECTED))
}

/// The `@marker` reason of a 32-bit kernel on KVM, which keeps the port
/// marker ([`setup`]).
pub const KVM_I386: &str = "kvm-i386:mmio-store-emulation";

/// Maps the marker page, or else (or when `cmdline` has [`PORT_WORD`])
/// takes the phase port with `ioperm`; an error when neither works (no
/// phase can be marked).
pub fn setup(cmdline: &str) -> Result<Channel, String> {
    let asked_port = cmdline.split_ascii_whitespace().any(|w| w == PORT_WORD);
    let mapped = if asked_port {
        Err(format!("asked:{PORT_WORD}"))
    } else if cfg!(target_arch = "x86") && on_kvm() {
        // KVM completes an MMIO store by emulating it, which means walking
        // the guest's page tables to fetch it; under `--backend nested`
        // (QEMU's SVM model) a 32-bit PAE guest's walk fails and the store
        // never completed (the run hung at its begin marker). The init
        // cannot tell that KVM from a hardware one, so a 32-bit kernel on
        // any KVM keeps the port: there the I/O-bitmap update costs time,
        // not an event KVM counts (an exit, a TLB flush, a page fault).
        Err(KVM_I386.to_string())
    } else {
        sys::map_device_page(MMIO_MARKER)
    };
    let why = match mapped {
        Ok(page) => {
            PAGE.store(page, Ordering::Relaxed);
            return Ok(Channel::Mmio);
        }
        Err(why) => why,
    };
    sys::grant_ports(PHASE, PHASE_LEN).map_err(|e| {
        format!(
            "cannot map the marker page ({why}) and ioperm for port {PHASE:#x} failed ({e}): \
             cannot mark phases"
        )
    })?;
    Ok(Channel::Port(why))
}

/// One phase marker (`value`: `Marker::encode`). Inlined: each caller
/// gets its own copy of the marker instructions, as the plugin's phase
/// pattern (begin and end at two addresses) asks.
#[inline(always)]
pub fn mark(value: u32) {
    let page = PAGE.load(Ordering::Relaxed);
    if page.is_null() {
        sys::phase_mark(value);
    } else {
        sys::phase_mark_mmio(page, value);
    }
}
