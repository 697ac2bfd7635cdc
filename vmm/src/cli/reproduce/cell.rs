//! One cell of a seed's table: the guest it boots and what it runs, with
//! the published figure it is held against.

use crate::cli::Arch;
use crate::spec::guest::GuestKind;
use ptiscope_abi::options::Workload;

/// Which guest a cell boots: the guest kind (a Linux kernel by its known
/// name) and its architecture, which the companion is built for with
/// `--arch` and a Linux kernel has by its name (the seeds' 32-bit PAE
/// rows go with the i386 guests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CellGuest {
    pub(super) kind: GuestKind<&'static str>,
    pub(super) arch: Arch,
}

impl CellGuest {
    /// The companion guest's two flavours, x86_64 first.
    pub(super) const COMPANIONS: [CellGuest; 2] = [
        CellGuest {
            kind: GuestKind::Companion,
            arch: Arch::X86_64,
        },
        CellGuest {
            kind: GuestKind::Companion,
            arch: Arch::I386,
        },
    ];

    /// A known Linux kernel (`debian-686-pae` is the i386 one).
    pub(super) fn linux(kernel: &'static str) -> Self {
        CellGuest {
            kind: GuestKind::Linux(kernel),
            arch: if kernel == "debian-686-pae" {
                Arch::I386
            } else {
                Arch::X86_64
            },
        }
    }

    /// The 64-bit guests (the seeds that were measured on x86_64 only).
    pub(super) fn is_x86_64(self) -> bool {
        self.arch == Arch::X86_64
    }

    /// Calls per run: `linux` under a Linux kernel (QEMU TCG, slow), else
    /// `companion`.
    pub(super) fn calls(self, linux: u64, companion: u64) -> u64 {
        match self.kind {
            GuestKind::Linux(_) => linux,
            GuestKind::Companion => companion,
        }
    }

    pub(super) fn name(self) -> String {
        match (self.kind, self.arch) {
            (GuestKind::Companion, Arch::X86_64) => "ptiscope guest (x86_64)".into(),
            (GuestKind::Companion, Arch::I386) => "ptiscope guest (i386 PAE)".into(),
            (GuestKind::Linux(k), _) => format!("Linux {k}"),
        }
    }
}

/// One cell of a seed's table.
#[derive(Debug, Clone)]
pub(super) struct Cell {
    pub(super) guest: CellGuest,
    pub(super) row: String,
    pub(super) column: String,
    /// compare's side options (`pti=on,cmdline=...`); `None`: not
    /// measurable on this guest (the reason).
    pub(super) opts: Result<String, &'static str>,
    pub(super) workload: Workload,
    pub(super) iterations: u64,
    pub(super) cpus: u32,
    /// The published figure in this cell's unit, and as published.
    pub(super) published: Option<f64>,
    /// The unit of `published` (`ns/call`, `ns/message`, `cycles/call`);
    /// empty where nothing is published.
    pub(super) published_unit: &'static str,
    pub(super) published_text: String,
    /// The index (in the seed's cells) of the row this one's overhead is against.
    pub(super) baseline: Option<usize>,
}
