//! A `--linux` run settled: the one place a Linux guest is made
//! ([`settle`], which [`preflight`](super::preflight) calls for
//! [`GuestKind::Linux`]): the kernel
//! named (a known name's cached image, [`fetch`], or a path), read and
//! recognised ([`image`]), `--arch` checked against it, the entry and the
//! command line written, the PTI request checked against the kernel's
//! configuration, the initramfs packed around the init ([`initramfs`]) as
//! the run's initrd.
//! Its refusals are [`LinuxError`], which [`PreflightError`](super::PreflightError)
//! wraps. What happens to the run later (its checks and summary) is
//! [`crate::linux`], above the report layer.

pub mod fetch;
pub mod image;
pub mod initramfs;

use std::path::PathBuf;
use std::sync::Arc;

use ptiscope_abi::options::{Entry, PtiMode, Workload};

use crate::machine::kvm::KvmFlavour;
use crate::machine::loader::{self, KernelSource, LoadError};
use crate::machine::memory::MemoryLayout;
use crate::probe::host::HostFacts;
use crate::spec::cmdline::{EntryChoice, GuestOptions, ResolvedOptions};
use crate::spec::guest::GuestKind;
use crate::spec::linux::{
    init_parser_words, ImageFormat, LinuxArch, LinuxGuest, LinuxRequest, TickFree,
};
use crate::spec::{BootSource, ResolvedRun, RunConfig, Target};
use image::ImageError;

/// The kernel command line every Linux run starts with: the console on the
/// first serial port, boot messages kept out of it (the kernel log still
/// has them), an immediate reboot on panic, which `-no-reboot` turns into
/// QEMU's exit, and no timer check: under TCG on a loaded host Linux's
/// IO-APIC timer test sometimes sees no tick in time and panics ("IO-APIC +
/// timer doesn't work!").
pub const BASE_CMDLINE: &str = "console=ttyS0 quiet panic=-1 no_timer_check";

/// More command line for a Linux guest on ptiscope's VMM: the VMM has no
/// CMOS RTC; unclaimed ports read all ones, so the RTC driver's probe sees
/// its update-in-progress bit set forever and polls ports 0x70/0x71 (every
/// read an exit to the VMM, 40,000 of them) until it gives up, 12 s of a
/// boot under `--backend nested`; not starting the driver skips that.
pub const VMM_CMDLINE: &str = "initcall_blacklist=cmos_init";

/// The `key=` words ptiscope's init reads from the whole kernel command
/// line (`linux-init/src/main.rs`: the companion guest's keys it takes, and
/// its own `ipc`), each with the option that sets it. One of them in
/// `--append` would reach the init beside the one ptiscope wrote (the init
/// then stops: "key given twice", after the whole boot), so it is refused
/// before anything boots.
pub const INIT_KEYS: [(&str, &str); 13] = {
    use ptiscope_abi::cmdline as k;
    [
        (k::PTI, "--pti"),
        (k::ENTRY, "--entry"),
        (k::WORKLOAD, "--workload"),
        (k::ITERATIONS, "--iterations"),
        (k::GROUPS, "--cmdline groups=G"),
        (k::LOOPS, "--cmdline loops=L"),
        (k::MODE, "--cmdline mode=process|thread"),
        (k::WSS, "--cmdline wss=SIZE"),
        (k::STRIDE, "--cmdline stride=N"),
        (k::TOUCHES, "--cmdline touches=N"),
        (k::CPUS, "--cpus"),
        (k::THREADS, "--cmdline threads=N"),
        ("ipc", "--cmdline ipc=socket|pipe"),
    ]
};

/// A kernel command-line word's key and value as Linux reads them
/// (`kernel/params.c`'s `next_arg`): a leading `"` and the `"`s around the
/// value are not part of them, so `"pti=on"` and `pti="on"` are `pti=on`;
/// `None` for a word without `=`.
pub fn param_key_value(word: &str) -> Option<(&str, &str)> {
    let (key, value) = word.strip_prefix('"').unwrap_or(word).split_once('=')?;
    Some((key, value.trim_matches('"')))
}

/// The first `--append` word whose key the init owns, refused with the
/// option to use instead.
fn append_refusal(append: &str) -> Option<String> {
    append.split_whitespace().find_map(|w| {
        let key = param_key_value(w)?.0;
        let (_, option) = INIT_KEYS.iter().find(|(k, _)| *k == key)?;
        Some(format!(
            "--append {}: `{key}=` is read by ptiscope's init, which gets its own from ptiscope's \
             options: use {option} instead (--append is for the kernel's own parameters, e.g. \
             nopti, mitigations=off)",
            ptiscope_devices::escape_str(w)
        ))
    })
}

/// Longest kernel command line (x86's COMMAND_LINE_SIZE is 2048 with its NUL).
pub const MAX_CMDLINE: usize = 2047;

/// Errors settling a Linux guest.
#[derive(Debug, thiserror::Error)]
pub enum LinuxError {
    /// A known name whose kernel is not in the cache.
    #[error(
        "--linux {name}: not fetched yet ({path} is missing); {}",
        match blocker {
            Some(b) => format!(
                "the kernel cache cannot hold it: {} exists and is not a directory (set \
                 PTISCOPE_LINUX_CACHE to a directory, then `ptiscope linux fetch`)",
                b.display()
            ),
            None => "run `ptiscope linux fetch` (it uses apt-get download; see \
                     docs/linux-guests.md)"
                .to_string(),
        }
    )]
    NotFetched {
        /// The name.
        name: String,
        /// Where it would be.
        path: PathBuf,
        /// A file where the cache, or a directory above it, should be (a
        /// fetch would fail on it: said now, not after it).
        blocker: Option<PathBuf>,
    },
    /// Neither a known name nor an existing file: a misspelt name is said
    /// so, not reported as a missing kernel image of that name.
    #[error(
        "--linux/linux= {name:?}: neither a kernel ptiscope knows ({known}; `ptiscope linux fetch \
         --only NAME` fetches one) nor a file here: give one of those names, or a kernel \
         image's path"
    )]
    Unknown {
        /// The value given.
        name: String,
        /// The known names, comma-separated.
        known: String,
    },
    /// No cache directory for a known name.
    #[error("--linux {0}: no cache directory (set PTISCOPE_LINUX_CACHE)")]
    NoCache(String),
    /// The image is not a kernel, or not readable.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// `--arch` and the image disagree.
    #[error(
        "{path} is an {image} kernel but --arch {asked} was given: drop --arch (it follows the \
         image) or give a kernel of that architecture"
    )]
    ArchMismatch {
        /// The kernel.
        path: String,
        /// The image's architecture.
        image: &'static str,
        /// `--arch`.
        asked: &'static str,
    },
    /// The backend cannot run a Linux userspace here.
    #[error("{0}")]
    Backend(String),
    /// A ptiscope option that means nothing to a Linux guest, or a bad value.
    #[error("{0}")]
    Option(String),
    /// pti=on for a kernel built without PTI.
    #[error(
        "{path}: pti=on was asked, but its configuration ({config}) has no {}: this kernel \
         cannot isolate page tables, so there is no PTI cost to measure{hint}",
        image::PAGE_TABLE_ISOLATION.either_y()
    )]
    NoPti {
        /// The kernel.
        path: String,
        /// The configuration file.
        config: String,
        /// More on why (a 32-bit kernel without PAE), or empty.
        hint: String,
    },
}

impl LinuxError {
    /// The termination signal that stopped the read of the kernel image
    /// (or of the configuration beside it), if one did (the command then ends with 128 + it, as a signal during a run).
    pub fn signal(&self) -> Option<i32> {
        match self {
            LinuxError::Image(ImageError::Read(LoadError::Interrupted(signal))) => Some(*signal),
            LinuxError::Image(ImageError::Config { source, .. }) => source.signal(),
            _ => None,
        }
    }
}

/// Where a known kernel lives in the cache.
pub fn known_path(name: &str) -> Option<Result<PathBuf, LinuxError>> {
    fetch::KNOWN.iter().find(|k| k.name == name)?;
    Some(
        fetch::cache_dir()
            .map(|d| d.join(name).join("vmlinuz"))
            .ok_or_else(|| LinuxError::NoCache(name.into())),
    )
}

/// The kernel a `--linux` value names: a known name's cached image, else a path.
pub fn kernel_path(spec: &str) -> Result<PathBuf, LinuxError> {
    match known_path(spec) {
        Some(Ok(p)) if !p.exists() => Err(LinuxError::NotFetched {
            name: spec.into(),
            blocker: p
                .parent()
                .and_then(std::path::Path::parent)
                .and_then(fetch::not_a_directory),
            path: p,
        }),
        Some(r) => r,
        // A value with no `/` that names no file is taken for a name (a
        // path given as a path keeps the image reader's "cannot read").
        None if !spec.contains('/') && std::fs::symlink_metadata(spec).is_err() => {
            Err(LinuxError::Unknown {
                name: spec.into(),
                known: fetch::KNOWN.map(|k| k.name).join(", "),
            })
        }
        None => Ok(PathBuf::from(spec)),
    }
}

/// Why this host's KVM (through the VMM) cannot run this Linux workload,
/// from the probe's findings and the image; `None`: it can.
fn kvm_refusal(facts: &HostFacts, image: &image::KernelImage, cpus: u32) -> Option<String> {
    // The PAE probe runs only for an i386 kernel (its first use costs a
    // tiny VM): the 64-bit kernel never pages outside long mode.
    let pae = match image.arch {
        LinuxArch::I386 => facts.pae_paging_usable(),
        LinuxArch::X86_64 => None,
    };
    let why = kvm_refusal_reasons(
        facts.check_entry(false, Entry::Syscall),
        facts.kvm_flavour(),
        pae,
        image.arch,
        cpus,
        crate::spec::nested::inside(),
    );
    (!why.is_empty()).then(|| {
        format!(
            "--linux with --backend kvm: the VMM cannot run this Linux workload here ({}); \
             use --backend qemu",
            why.join("; ")
        )
    })
}

/// The reasons behind [`kvm_refusal`]: what the probe found (`syscall`:
/// whether user SYSCALL reaches the kernel; the KVM flavour; `pae`: whether
/// the vCPU can turn on 32-bit PAE paging, asked for i386 kernels only,
/// `None` if unknown), what the VMM boots (bzImages, with the initramfs as
/// their initrd) and what it describes to the guest (its ACPI MADT lists
/// up to [`crate::machine::acpi::MAX_CPUS`] CPUs).
fn kvm_refusal_reasons(
    syscall: Result<(), String>,
    flavour: KvmFlavour,
    pae: Option<(bool, String)>,
    arch: LinuxArch,
    cpus: u32,
    nested: bool,
) -> Vec<String> {
    let mut why = Vec::new();
    // An i386 kernel's userspace enters by int $0x80 or SYSENTER in
    // legacy mode, which the long-mode probe does not judge.
    if let (Err(e), LinuxArch::X86_64) = (syscall, arch) {
        why.push(format!(
            "Linux x86_64 userspace enters the kernel by SYSCALL: {e}"
        ));
    }
    if flavour == KvmFlavour::Pvm {
        why.push(
            "kvm_pvm emulates guest CPL0 code and lacks instructions Linux runs there \
             (CMPXCHG16B, XRSTOR: Debian's kernel stops in early boot)"
                .to_string(),
        );
    }
    // The VMM enters an i386 bzImage by the 32-bit boot protocol (paging
    // off); the kernel then turns on PAE paging, which some KVMs (kvm_pvm:
    // long-mode paging only) refuse with a #GP. (A PVH vmlinux gets its
    // initramfs as PVH's first module, and the ACPI tables' RSDP.)
    if arch == LinuxArch::I386 {
        if let Some((false, detail)) = pae {
            why.push(format!(
                "an i386 kernel turns on 32-bit PAE paging outside long mode, which this \
                 host's KVM refuses (probe: {detail})"
            ));
        }
    }
    // Under --backend nested an i386 kernel's second CPU triple-faults at
    // its CR0.PG write: KVM loads the PDPTEs of the page tables the boot
    // CPU has walked, where QEMU's nested walker set bit 5 (reserved in a
    // PDPTE). The companion guest clears the bit before each SIPI; Linux
    // does not (docs/kvm-hosts.md).
    if arch == LinuxArch::I386 && nested && cpus > 1 {
        why.push(format!(
            "--cpus {cpus} with an i386 kernel under --backend nested: the second CPU \
             triple-faults at its CR0.PG write (QEMU's nested page walker sets bit 5 of the \
             PDPTEs the boot CPU walked, which KVM's PDPTE load refuses); use --cpus 1, or \
             the x86_64 kernel"
        ));
    }
    // The VMM describes the vCPUs to Linux in an ACPI MADT of xAPIC
    // entries (machine::acpi); --cpus is capped lower for every guest
    // (MAX_CPUS, the telemetry's per-CPU slots), so this holds unless that
    // cap grows past what the MADT can list.
    if cpus > crate::machine::acpi::MAX_CPUS {
        why.push(format!(
            "--cpus {cpus}: the VMM's ACPI MADT lists at most {} CPUs (8-bit xAPIC ids)",
            crate::machine::acpi::MAX_CPUS
        ));
    }
    why
}

/// What [`tick_free_plan`] decides on.
struct TickFreeAsk<'a> {
    /// `--tick-free`.
    asked: TickFree,
    /// The init's workload.
    workload: Workload,
    /// Whether the host counts every guest CR3 write (KVM with shadow
    /// paging), so that a tick's two make the per-call count inexact.
    host_counts_cr3: bool,
    /// `--cpus`.
    cpus: u32,
    /// `--append`.
    append: &'a str,
    /// An i386 kernel under `--backend nested`, where a second CPU does
    /// not come up ([`kvm_refusal_reasons`]).
    i386_nested: bool,
}

/// A tick-free CPU for the system-call loop: the run's vCPUs and the one
/// the loop runs on (the last, given to `nohz_full=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TickFreeCpu {
    /// The run's vCPUs (at least 2: the kernel keeps one for its
    /// housekeeping, the tick among it).
    cpus: u32,
    /// The loop's CPU.
    cpu: u32,
}

/// Whether the system-call loop gets a tick-free CPU (`--tick-free`); an
/// error for `--tick-free on` where it cannot have one. A `nohz_full=` in
/// `--append` is the user's own choice, left as it is (the init pins the
/// loop to its first CPU all the same).
fn tick_free_plan(ask: &TickFreeAsk) -> Result<Option<TickFreeCpu>, String> {
    let is_loop = matches!(
        ask.workload,
        Workload::Getpid | Workload::Getppid | Workload::WriteBadfd
    );
    let wanted = match ask.asked {
        TickFree::Off => false,
        TickFree::On => true,
        TickFree::Auto => ask.host_counts_cr3,
    };
    // `--tick-free on` is about the measured loop: a workload that is not
    // one is refused whatever the command line holds (a `nohz_full=` of the
    // user's own does not make sched-messaging a loop of one thread).
    if !is_loop {
        return match ask.asked {
            TickFree::On => Err(format!(
                "--tick-free on: workload {} is not a system-call loop of one thread (getpid, getppid, write-badfd); drop --tick-free",
                ask.workload
            )),
            _ => Ok(None),
        };
    }
    let own = ask
        .append
        .split_ascii_whitespace()
        .any(|w| param_key_value(w).is_some_and(|(k, _)| k == "nohz_full"));
    if !wanted || own {
        return Ok(None);
    }
    let cpus = ask.cpus.max(2);
    if ask.i386_nested {
        return match ask.asked {
            TickFree::On => Err(
                "--tick-free on needs a second vCPU, which an i386 kernel does not bring up under --backend nested; use --tick-free off, or the x86_64 kernel"
                    .to_string(),
            ),
            _ => Ok(None),
        };
    }
    Ok(Some(TickFreeCpu {
        cpus,
        cpu: cpus - 1,
    }))
}

/// The entry the init's measured calls use.
fn entry_for(arch: LinuxArch, asked: EntryChoice) -> Result<Entry, LinuxError> {
    match (arch, asked) {
        (LinuxArch::X86_64, EntryChoice::Auto | EntryChoice::Fixed(Entry::Syscall)) => {
            Ok(Entry::Syscall)
        }
        // The vDSO's __kernel_vsyscall: SYSENTER on this CPU model.
        (LinuxArch::I386, EntryChoice::Auto | EntryChoice::Fixed(Entry::Sysenter)) => {
            Ok(Entry::Sysenter)
        }
        (LinuxArch::I386, EntryChoice::Fixed(Entry::Int80)) => Ok(Entry::Int80),
        (a, EntryChoice::Fixed(e)) => Err(LinuxError::Option(format!(
            "entry={e} is not a Linux {} system-call entry the init has (x86_64: syscall; \
             i386: int80, or sysenter through the vDSO's __kernel_vsyscall)",
            a.name()
        ))),
    }
}

/// Settles a Linux run for `target`: `layout` and `asked` are what
/// [`preflight`](super::preflight) made of `--mem` and the guest options
/// (for either kind of guest, before the kinds part).
pub fn settle(
    config: &RunConfig,
    req: &LinuxRequest,
    target: Target,
    facts: &HostFacts,
    layout: MemoryLayout,
    asked: GuestOptions,
) -> Result<ResolvedRun, LinuxError> {
    if asked.pcid.is_some() {
        return Err(LinuxError::Option(
            "--pcid is an option of ptiscope's guest; for Linux, --append nopcid (QEMU's TCG has \
             no PCID anyway)"
                .into(),
        ));
    }
    // Before the image is read: a contradictory command line costs nothing.
    if let Some(why) = append_refusal(&req.append) {
        return Err(LinuxError::Option(why));
    }
    let path = kernel_path(&req.kernel)?;
    let image = image::read(&path)?;
    let name = path.display().to_string();
    if let Some(a) = req.arch {
        if a != image.arch {
            return Err(LinuxError::ArchMismatch {
                path: name,
                image: image.arch.name(),
                asked: a.name(),
            });
        }
    }
    let workload = asked.workload.unwrap_or(Workload::None);
    let tick_free = tick_free_plan(&TickFreeAsk {
        asked: req.tick_free,
        workload,
        host_counts_cr3: target == Target::Kvm && facts.sees_cr3_writes(),
        cpus: config.cpus,
        append: &req.append,
        i386_nested: image.arch == LinuxArch::I386 && crate::spec::nested::inside(),
    })
    .map_err(LinuxError::Option)?;
    let cpus = tick_free.map_or(config.cpus, |t| t.cpus);
    if target == Target::Kvm {
        if let Some(why) = kvm_refusal(facts, &image, cpus) {
            return Err(LinuxError::Backend(why));
        }
    }
    // QEMU must enter a PVH vmlinux where its note says (it reads the
    // notes aligned to the segment's p_align).
    if image.format == ImageFormat::PvhElf {
        loader::check_qemu_pvh_note(&image.bytes, &name).map_err(|e| {
            LinuxError::Image(ImageError::BadElf {
                path: name.clone(),
                why: e.to_string(),
            })
        })?;
    }
    let pti = asked.pti.unwrap_or(PtiMode::Auto);
    if let (PtiMode::On, Some(config)) = (pti, &image.config) {
        if !config.enabled(&image::PAGE_TABLE_ISOLATION) {
            // 32-bit PTI needs PAE paging: say so where that is why.
            let no_pae = image.arch == LinuxArch::I386 && !config.enabled(&image::X86_PAE);
            return Err(LinuxError::NoPti {
                path: name,
                config: config.path.display().to_string(),
                hint: if no_pae {
                    format!(
                        " ({}; it is a 32-bit kernel without {}=y, which 32-bit PTI \
                         needs)",
                        config.describe(&image::PAGE_TABLE_ISOLATION),
                        image::X86_PAE.new
                    )
                } else {
                    format!(" ({})", config.describe(&image::PAGE_TABLE_ISOLATION))
                },
            });
        }
    }
    if workload == Workload::NoptiGetpid {
        return Err(LinuxError::Option(
            "workload nopti-getpid opts a process out of ptiscope's own PTI (an arch_prctl Linux \
             does not have)"
                .into(),
        ));
    }
    let user_code = workload.runs_user_code();
    let entry = user_code
        .then(|| entry_for(image.arch, asked.entry))
        .transpose()?;
    let mut init = Vec::new();
    if pti != PtiMode::Auto {
        init.push(format!("pti={pti}"));
    }
    if let Some(e) = entry {
        init.push(format!("entry={e}"));
    }
    init.push(format!("workload={workload}"));
    if let Some(n) = asked.iterations {
        init.push(format!("iterations={n}"));
    }
    let extra = asked.extra.trim();
    if !extra.is_empty() {
        init.push(extra.to_string());
    }
    let init_words = init.join(" ");
    // The companion guest's own CR3-switch strategy (the 2020 RFC), which
    // the init's shared parser reads but nothing in a Linux run acts on:
    // a side labelled pti_switch=deferred would measure Linux's own switch.
    if init_words
        .split_whitespace()
        .any(|w| w.starts_with("pti_switch="))
    {
        return Err(LinuxError::Option(
            "pti_switch= chooses where ptiscope's own guest switches CR3 on the way out (the \
             2020 RFC); a Linux kernel switches where its entry code does, so it would change \
             nothing: drop it (or compare ptiscope's guest without --linux/linux=)"
                .into(),
        ));
    }
    // The init's parser, here: bad words stop the run before anything boots.
    if let Err(e) = guest_core::cmdline::parse(&init_parser_words(&init_words)) {
        return Err(LinuxError::Option(format!("the init's command line: {e}")));
    }
    for w in init_words.split_whitespace() {
        if let Some(v) = w.strip_prefix("ipc=") {
            if v != "socket" && v != "pipe" {
                return Err(LinuxError::Option(format!("ipc={v}: expected socket|pipe")));
            }
        }
    }
    let mut cmdline = format!("{BASE_CMDLINE} {init_words}");
    if target == Target::Kvm {
        cmdline = format!("{cmdline} {VMM_CMDLINE}");
    }
    if let Some(t) = tick_free {
        cmdline = format!("{cmdline} nohz_full={}", t.cpu);
    }
    if !req.append.trim().is_empty() {
        cmdline = format!("{cmdline} {}", req.append.trim());
    }
    // x86's COMMAND_LINE_SIZE: a longer line would be cut by the kernel.
    if cmdline.len() > MAX_CMDLINE {
        return Err(LinuxError::Option(format!(
            "the Linux command line is {} bytes; x86 Linux takes at most {MAX_CMDLINE}: shorten \
             --append or --cmdline",
            cmdline.len()
        )));
    }
    let initramfs: Arc<[u8]> = initramfs::build(initramfs::init_for(image.arch)).into();
    let guest = ResolvedOptions {
        pti: asked.pti,
        pcid: None,
        entry,
        workload: asked.workload,
        iterations: asked.iterations,
        extra: asked.extra.clone(),
    };
    let mut config = config.clone();
    config.kernel = KernelSource::Path(path.clone());
    config.cpus = cpus;
    Ok(ResolvedRun {
        config,
        layout,
        guest,
        entry_guessed: false,
        guest_kind: GuestKind::Linux(Arc::new(LinuxGuest {
            path,
            arch: image.arch,
            format: image.format,
            version: image.version,
            config_pti: image.config_pti,
            init_words,
            pti,
            tick_free_cpu: tick_free.map(|t| t.cpu),
        })),
        boot: BootSource {
            image: image.bytes.into(),
            image_name: name,
            initrd: Some(initramfs),
            cmdline,
            preloaded: Default::default(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A quoted word is the parameter Linux reads: `"pti=on"` is refused
    /// as `pti=on` is, not passed by for its quote.
    #[test]
    fn quoted_append_words_are_read_as_linux_reads_them() {
        for w in [
            "\"pti=on\"",
            "pti=\"on\"",
            "\"iterations=5\"",
            "\"workload=getpid",
        ] {
            let why = append_refusal(&format!("quiet {w}")).unwrap_or_else(|| panic!("{w}"));
            assert!(why.contains("is read by ptiscope's init"), "{why}");
        }
        assert_eq!(append_refusal("nopti \"mitigations=off\" quiet"), None);
        assert_eq!(param_key_value("\"pti=on\""), Some(("pti", "on")));
        assert_eq!(param_key_value("nopti"), None);
    }

    /// A value that is neither a known name nor a file is said to be so,
    /// with the known names; a path keeps the reader's own message.
    #[test]
    fn unknown_kernel_names_are_named_with_the_known_ones() {
        for name in ["debian-6.12-i386", "debian-amd65", "", "DEBIAN-AMD64"] {
            let e = kernel_path(name).unwrap_err();
            assert!(matches!(e, LinuxError::Unknown { .. }), "{name}: {e:?}");
            let m = e.to_string();
            assert!(m.contains("debian-amd64, debian-686-pae"), "{m}");
        }
        assert_eq!(
            kernel_path("/nonexistent/vmlinuz").unwrap(),
            PathBuf::from("/nonexistent/vmlinuz")
        );
    }

    #[test]
    fn a_tick_free_cpu_is_added_where_the_host_counts_every_cr3_write() {
        let ask = |asked, workload, host_counts_cr3, cpus, append, i386_nested| {
            tick_free_plan(&TickFreeAsk {
                asked,
                workload,
                host_counts_cr3,
                cpus,
                append,
                i386_nested,
            })
        };
        let two = Ok(Some(TickFreeCpu { cpus: 2, cpu: 1 }));
        // auto: where KVM counts CR3 writes, for the system-call loops.
        assert_eq!(
            ask(TickFree::Auto, Workload::Getppid, true, 1, "", false),
            two
        );
        assert_eq!(
            ask(TickFree::Auto, Workload::Getppid, false, 1, "", false),
            Ok(None)
        );
        assert_eq!(
            ask(TickFree::Auto, Workload::Poundsyscall, true, 2, "", false),
            Ok(None)
        );
        assert_eq!(
            ask(TickFree::Auto, Workload::Getpid, true, 4, "", false),
            Ok(Some(TickFreeCpu { cpus: 4, cpu: 3 }))
        );
        // The user's own nohz_full=, and off, are left alone.
        assert_eq!(
            ask(
                TickFree::Auto,
                Workload::Getpid,
                true,
                1,
                "nohz_full=2 x",
                false
            ),
            Ok(None)
        );
        assert_eq!(
            ask(TickFree::Off, Workload::Getpid, true, 1, "", false),
            Ok(None)
        );
        // on: everywhere, or refused where it cannot be.
        assert_eq!(
            ask(TickFree::On, Workload::WriteBadfd, false, 1, "", false),
            two
        );
        // A workload that is no loop is refused with or without the
        // user's own nohz_full= (it once passed with one).
        for append in ["", "nohz_full=1", "x nohz_full=1-3 y"] {
            let e = ask(
                TickFree::On,
                Workload::SchedMessaging,
                false,
                1,
                append,
                false,
            )
            .unwrap_err();
            assert!(
                e.contains("sched-messaging") && e.contains("--tick-free"),
                "{append}: {e}"
            );
        }
        assert_eq!(
            ask(
                TickFree::Off,
                Workload::SchedMessaging,
                true,
                1,
                "nohz_full=1",
                false
            ),
            Ok(None)
        );
        let e = ask(TickFree::On, Workload::Getpid, true, 1, "", true).unwrap_err();
        assert!(e.contains("i386"), "{e}");
        assert_eq!(
            ask(TickFree::Auto, Workload::Getpid, true, 1, "", true),
            Ok(None)
        );
    }

    /// The keys refused in `--append` are exactly those the init reads:
    /// taken from its source, so a key added there is refused here too.
    #[test]
    fn append_refuses_every_key_the_init_reads_and_only_those() {
        let src = include_str!("../../../../linux-init/src/main.rs");
        let list = src
            .split("fn is_guest_key")
            .nth(1)
            .and_then(|r| r.split(".contains").next())
            .expect("linux-init's is_guest_key");
        let mut read: Vec<String> = list
            .split("k::")
            .skip(1)
            .map(|t| t.split(',').next().unwrap().trim().to_lowercase())
            .collect();
        assert!(src.contains("key == keys::IPC"), "the init's own ipc= key");
        read.push("ipc".into());
        read.sort();
        let mut refused: Vec<String> = INIT_KEYS.iter().map(|(k, _)| k.to_string()).collect();
        refused.sort();
        assert_eq!(read, refused);
        for (key, option) in INIT_KEYS {
            let why = append_refusal(&format!("nopti {key}=1 quiet")).unwrap();
            assert!(
                why.contains(option) && why.contains(&format!("{key}=1")),
                "{why}"
            );
        }
        for ok in [
            "",
            "nopti",
            "pti",
            "mitigations=off panic=1 oops=panic mem=16M",
            "ptiscope=1",
            "xpti=1",
        ] {
            assert_eq!(append_refusal(ok), None, "{ok}");
        }
        // Escaped in the message.
        let why = append_refusal("pti=\x1b[31m").unwrap();
        assert!(!why.contains('\x1b') && why.contains("\\x1b"), "{why}");
    }

    #[test]
    fn entries_follow_the_kernel() {
        use EntryChoice::*;
        assert_eq!(entry_for(LinuxArch::X86_64, Auto).unwrap(), Entry::Syscall);
        assert_eq!(entry_for(LinuxArch::I386, Auto).unwrap(), Entry::Sysenter);
        assert_eq!(
            entry_for(LinuxArch::I386, Fixed(Entry::Int80)).unwrap(),
            Entry::Int80
        );
        assert!(entry_for(LinuxArch::X86_64, Fixed(Entry::Int3)).is_err());
        assert!(entry_for(LinuxArch::X86_64, Fixed(Entry::Sysenter)).is_err());
    }

    #[test]
    fn the_vmm_refuses_linux_only_for_the_reasons_of_the_host_and_the_image() {
        use KvmFlavour::{Hardware, Pvm};
        // kvm_pvm: no user SYSCALL, CPL0 instructions missing.
        let w = kvm_refusal_reasons(Err("broken".into()), Pvm, None, LinuxArch::X86_64, 1, false);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].contains("SYSCALL: broken") && w[1].contains("CMPXCHG16B"),
            "{w:?}"
        );
        // Hardware KVM with a 64-bit bzImage on one CPU: nothing refused.
        let w = kvm_refusal_reasons(Ok(()), Hardware, None, LinuxArch::X86_64, 1, false);
        assert!(w.is_empty(), "{w:?}");
        // What the VMM cannot boot or describe.
        // An i386 kernel: refused where the probe found PAE paging refused
        // (kvm_pvm), booted by the 32-bit protocol where it works.
        let refused = Some((false, "#GP at the CR0.PG write".to_string()));
        let w = kvm_refusal_reasons(
            Err("broken".into()),
            Pvm,
            refused,
            LinuxArch::I386,
            1,
            false,
        );
        assert_eq!(w.len(), 2, "no SYSCALL reason for i386: {w:?}");
        assert!(w[0].contains("CMPXCHG16B"), "{w:?}");
        assert!(
            w[1].contains("PAE paging") && w[1].contains("#GP at the CR0.PG write"),
            "{w:?}"
        );
        let works = Some((true, "ok".to_string()));
        let w = kvm_refusal_reasons(Ok(()), Hardware, works, LinuxArch::I386, 1, false);
        assert!(w.is_empty(), "{w:?}");
        let w = kvm_refusal_reasons(Ok(()), Hardware, None, LinuxArch::I386, 1, false);
        assert!(w.is_empty(), "an unknown PAE verdict boots: {w:?}");
        let w = kvm_refusal_reasons(Ok(()), Hardware, None, LinuxArch::X86_64, 1, false);
        assert!(
            w.is_empty(),
            "a 64-bit kernel, bzImage or PVH vmlinux, boots: {w:?}"
        );
        // --cpus N: the MADT lists them, up to its 8-bit APIC ids.
        for cpus in [2, crate::spec::MAX_CPUS, crate::machine::acpi::MAX_CPUS] {
            let w = kvm_refusal_reasons(Ok(()), Hardware, None, LinuxArch::X86_64, cpus, false);
            assert!(w.is_empty(), "--cpus {cpus}: {w:?}");
        }
        // An i386 kernel's APs under nested (the PDPTE bit 5), not on hardware.
        let w = kvm_refusal_reasons(Ok(()), Hardware, None, LinuxArch::I386, 2, true);
        assert!(
            w.len() == 1 && w[0].contains("CR0.PG") && w[0].contains("--cpus 2"),
            "{w:?}"
        );
        for (arch, cpus, nested) in [
            (LinuxArch::I386, 2, false),
            (LinuxArch::I386, 1, true),
            (LinuxArch::X86_64, 2, true),
        ] {
            let w = kvm_refusal_reasons(Ok(()), Hardware, None, arch, cpus, nested);
            assert!(
                w.is_empty(),
                "{arch:?} --cpus {cpus} nested={nested}: {w:?}"
            );
        }
        let w = kvm_refusal_reasons(Ok(()), Hardware, None, LinuxArch::I386, 256, false);
        assert!(
            w.len() == 1 && w[0].contains("--cpus 256") && w[0].contains("at most 255"),
            "{w:?}"
        );
    }
}
