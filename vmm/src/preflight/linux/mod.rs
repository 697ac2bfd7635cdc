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

mod cmdline;
mod error;
pub mod fetch;
pub mod image;
pub mod initramfs;
mod kernel;
mod kvm_refusal;
mod tick_free;

use std::sync::Arc;

use ptiscope_abi::options::{Entry, PtiMode, Workload};

use self::cmdline::append_refusal;
use self::kvm_refusal::kvm_refusal;
use self::tick_free::{tick_free_plan, TickFreeAsk};
use crate::machine::loader::{self, KernelSource};
use crate::machine::memory::MemoryLayout;
use crate::probe::host::HostFacts;
use crate::spec::cmdline::{EntryChoice, GuestOptions, ResolvedOptions};
use crate::spec::guest::GuestKind;
use crate::spec::linux::{init_parser_words, ImageFormat, LinuxArch, LinuxGuest, LinuxRequest};
use crate::spec::{BootSource, ResolvedRun, RunConfig, Target};
use image::ImageError;

pub use cmdline::{param_key_value, BASE_CMDLINE, INIT_KEYS, MAX_CMDLINE, VMM_CMDLINE};
pub use error::LinuxError;
pub use kernel::{kernel_path, known_path};

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
        i386_nested: image.arch == LinuxArch::I386 && facts.nested(),
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
}
