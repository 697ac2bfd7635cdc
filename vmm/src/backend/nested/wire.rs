//! What crosses `--backend nested`'s channel between the outer ptiscope and
//! the inner one that serves its runs: a settled run in its wire form
//! ([`WireRun`]: everything of a [`ResolvedRun`] but the bytes it boots,
//! which it names by SHA-256), the messages each way ([`ToInner`],
//! [`FromInner`]), and the boot sources laid out in the blob window (an
//! ivshmem device's memory both sides map: [`BlobAt`]). The messages are
//! JSON in the frames of `nested::frame` (length and SHA-256) on the second
//! serial port; the bytes never go over the emulated UART.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::backend::record::RunRecord;
use crate::machine::loader::KernelSource;
use crate::machine::memory::MemoryLayout;
use crate::output::SerialOut;
use crate::probe::host_cache;
use crate::spec::cmdline::{CpuVuln, GuestOptions, ResolvedOptions};
use crate::spec::guest::GuestKind;
use crate::spec::linux::{LinuxGuest, LinuxRequest, TickFree};
use crate::spec::{BootSource, ResolvedRun, RunConfig};

/// The SHA-256 of `bytes`, in hex: how a boot source is named on the wire.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A boot source (kernel image or initrd) by name: its SHA-256 and length.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BlobRef {
    /// SHA-256, hex.
    pub sha256: String,
    /// Length, bytes.
    pub len: u64,
}

impl BlobRef {
    /// The name of `bytes`.
    pub fn of(bytes: &[u8]) -> BlobRef {
        BlobRef {
            sha256: sha256_hex(bytes),
            len: bytes.len() as u64,
        }
    }
}

/// Where a boot source lies in the blob window for the inner side to take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlobAt {
    /// Which bytes.
    pub blob: BlobRef,
    /// Their offset in the window.
    pub offset: u64,
}

/// A settled run as it crosses the channel: the request's settings the
/// inner VMM reads, and the settled run's, with its image and initrd named
/// by hash. The console of the inner run comes back with its record when
/// `console` is set (the outer writes it where the run's `--serial-out`
/// says).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireRun {
    /// `--mem`, MiB (the layout is made from it again inside).
    pub mem_mib: u64,
    /// The experiment's options as asked.
    pub asked: GuestOptions,
    /// `--timeout`.
    pub timeout: Duration,
    /// `--cpu-vuln`.
    pub cpu_vuln: CpuVuln,
    /// The in-kernel irqchip (`--no-irqchip` clears it).
    pub irqchip: bool,
    /// `--cpus`.
    pub cpus: u32,
    /// Whether the guest's console comes back (it goes somewhere outside).
    pub console: bool,
    /// The kernel image.
    pub image: BlobRef,
    /// How the image is named in messages.
    pub image_name: String,
    /// The initrd.
    pub initrd: Option<BlobRef>,
    /// The kernel command line.
    pub cmdline: String,
    /// The guest's options as settled.
    pub guest: ResolvedOptions,
    /// Whether `entry=auto` was guessed.
    pub entry_guessed: bool,
    /// The settled Linux guest; `None`: the companion.
    pub linux: Option<LinuxGuest>,
}

/// Why a wire run cannot be made into a run.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    /// A boot source the receiving side does not hold.
    #[error("the boot source {0} (SHA-256) is not in this session")]
    MissingBlob(String),
    /// `--mem` out of bounds (the sending side checked it: a damaged message).
    #[error("--mem {0} MiB is not a guest memory size")]
    Memory(u64),
}

impl WireRun {
    /// `run`'s wire form, and the boot sources it names (image, then the
    /// initrd if any).
    pub fn of(run: &ResolvedRun) -> (WireRun, Vec<Arc<[u8]>>) {
        let c = &run.config;
        let mut blobs = vec![run.boot.image.clone()];
        blobs.extend(run.boot.initrd.clone());
        let wire = WireRun {
            mem_mib: c.mem_mib,
            asked: c.guest.clone(),
            timeout: c.timeout,
            cpu_vuln: c.cpu_vuln,
            irqchip: c.irqchip,
            cpus: c.cpus,
            console: !matches!(c.serial_out, SerialOut::Discard),
            image: BlobRef::of(&run.boot.image),
            image_name: run.boot.image_name.clone(),
            initrd: run.boot.initrd.as_deref().map(BlobRef::of),
            cmdline: run.boot.cmdline.clone(),
            guest: run.guest.clone(),
            entry_guessed: run.entry_guessed,
            linux: run.guest_kind.linux().map(|l| LinuxGuest::clone(l)),
        };
        (wire, blobs)
    }

    /// The run again, its boot sources taken from `blob` (by SHA-256), its
    /// console going to `serial_out`. The request's settings no inner run
    /// reads (QEMU's, the kernel's source) are their defaults.
    pub fn resolve(
        self,
        blob: impl Fn(&BlobRef) -> Option<Arc<[u8]>>,
        serial_out: SerialOut,
    ) -> Result<ResolvedRun, WireError> {
        let get = |r: &BlobRef| blob(r).ok_or_else(|| WireError::MissingBlob(r.sha256.clone()));
        let image = get(&self.image)?;
        let initrd = self.initrd.as_ref().map(get).transpose()?;
        let layout =
            MemoryLayout::new(self.mem_mib).map_err(|_| WireError::Memory(self.mem_mib))?;
        let mut config = RunConfig::new(KernelSource::Path(self.image_name.clone().into()));
        config.mem_mib = self.mem_mib;
        config.guest = self.asked;
        config.timeout = self.timeout;
        config.serial_out = serial_out;
        config.cpu_vuln = self.cpu_vuln;
        config.irqchip = self.irqchip;
        config.cpus = self.cpus;
        config.guest_kind = match &self.linux {
            Some(l) => GuestKind::Linux(LinuxRequest {
                kernel: l.path.display().to_string(),
                append: String::new(),
                arch: Some(l.arch),
                tick_free: TickFree::default(),
            }),
            None => GuestKind::Companion,
        };
        Ok(ResolvedRun {
            config,
            layout,
            boot: BootSource {
                image,
                image_name: self.image_name,
                initrd,
                cmdline: self.cmdline,
                preloaded: Default::default(),
            },
            guest: self.guest,
            entry_guessed: self.entry_guessed,
            guest_kind: match self.linux {
                Some(l) => GuestKind::Linux(Arc::new(l)),
                None => GuestKind::Companion,
            },
        })
    }
}

/// What the outer ptiscope sends in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToInner {
    /// Run this run; the boot sources the inner side lacks lie in the blob
    /// window at these places.
    Run {
        /// The run.
        run: WireRun,
        /// New boot sources, in the window.
        blobs: Vec<BlobAt>,
    },
}

/// What the inner ptiscope sends out.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum FromInner {
    /// Ready for runs: its KVM's probed facts (entries, PCID, PAE, refill),
    /// which the outer side settles runs with and reports.
    Ready {
        /// The facts (boxed: they are large beside the other messages).
        facts: Box<host_cache::Facts>,
        /// The outer QEMU's plugin's live file inside, if one counts a
        /// Linux guest's CR3 writes.
        outer_plugin: Option<String>,
    },
    /// The inner side cannot serve (its set-up failed): why.
    Unready(String),
    /// A run's result: its record, or why it could not run.
    Ran {
        /// The record (boxed: it is large beside the other messages), or
        /// the error's words.
        record: Result<Box<RunRecord>, String>,
        /// The guest's console, when the run asked for it back (lossy UTF-8).
        console: Option<String>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::linux::{ImageFormat, LinuxArch};
    use ptiscope_abi::options::{Entry, PtiMode, Workload};

    fn settled(linux: bool) -> ResolvedRun {
        let mut config = RunConfig::new(KernelSource::Path("/k/vmlinuz".into()));
        config.mem_mib = 256;
        config.timeout = Duration::from_millis(12_345);
        config.cpus = 2;
        config.irqchip = true;
        config.cpu_vuln = CpuVuln::Meltdown;
        config.serial_out = SerialOut::Discard;
        config.guest.pti = Some(PtiMode::On);
        config.guest.entry = "syscall".parse().unwrap();
        let guest = ResolvedOptions {
            pti: Some(PtiMode::On),
            entry: Some(Entry::Syscall),
            workload: Some(Workload::Getpid),
            iterations: Some(2000),
            extra: "x=1".into(),
            ..Default::default()
        };
        let image: Arc<[u8]> = Arc::from(&b"image bytes"[..]);
        ResolvedRun {
            config,
            layout: MemoryLayout::new(256).unwrap(),
            boot: BootSource {
                image,
                image_name: "/k/vmlinuz".into(),
                initrd: linux.then(|| Arc::from(&b"initrd"[..])),
                cmdline: "console=ttyS0 pti=on".into(),
                preloaded: Default::default(),
            },
            guest,
            entry_guessed: false,
            guest_kind: if linux {
                GuestKind::Linux(Arc::new(LinuxGuest {
                    path: "/k/vmlinuz".into(),
                    arch: LinuxArch::X86_64,
                    format: ImageFormat::BzImage,
                    version: Some("6.1.0".into()),
                    config_pti: Some(true),
                    init_words: "workload=getppid".into(),
                    pti: PtiMode::On,
                    tick_free_cpu: None,
                }))
            } else {
                GuestKind::Companion
            },
        }
    }

    /// A settled run crosses as JSON and comes back as the same run: its
    /// settings, options, command line, Linux guest and boot bytes (by
    /// hash) all kept.
    #[test]
    fn a_settled_run_round_trips_through_its_wire_form() {
        for linux in [false, true] {
            let run = settled(linux);
            let (wire, blobs) = WireRun::of(&run);
            assert_eq!(blobs.len(), 1 + usize::from(linux));
            assert!(!wire.console);
            let text = serde_json::to_string(&ToInner::Run {
                run: wire.clone(),
                blobs: vec![],
            })
            .unwrap();
            let ToInner::Run { run: back, .. } = serde_json::from_str(&text).unwrap();
            assert_eq!(back, wire);
            let by_hash = |r: &BlobRef| blobs.iter().find(|b| BlobRef::of(b) == *r).cloned();
            let again = back.resolve(by_hash, SerialOut::Discard).unwrap();
            assert_eq!(again.boot.image, run.boot.image);
            assert_eq!(again.boot.initrd, run.boot.initrd);
            assert_eq!(again.boot.cmdline, run.boot.cmdline);
            assert_eq!(again.guest, run.guest);
            assert_eq!(again.layout, run.layout);
            assert_eq!(again.config.guest, run.config.guest);
            assert_eq!(again.config.timeout, run.config.timeout);
            assert_eq!(again.config.cpus, 2);
            assert_eq!(again.config.cpu_vuln, CpuVuln::Meltdown);
            assert_eq!(
                again.guest_kind.linux().map(|l| (**l).clone()),
                run.guest_kind.linux().map(|l| (**l).clone())
            );
            // The same run again, as WireRun sees it.
            assert_eq!(WireRun::of(&again).0, wire);
        }
    }

    /// A run naming bytes the session does not hold is refused naming them.
    #[test]
    fn a_missing_boot_source_is_named() {
        let (wire, _) = WireRun::of(&settled(false));
        let sha = wire.image.sha256.clone();
        let e = wire.resolve(|_| None, SerialOut::Discard).unwrap_err();
        assert_eq!(e, WireError::MissingBlob(sha));
    }
}
