//! A Linux guest as data: what `--linux`, `--append` and `--arch` asked
//! for ([`LinuxRequest`], the Linux side of the request's
//! [`GuestKind`](super::guest::GuestKind)), and the guest once settled
//! ([`LinuxGuest`], made by `preflight::linux::settle`; its kernel,
//! initramfs and command line are the run's
//! [`BootSource`](super::BootSource)).

use std::path::PathBuf;

use ptiscope_abi::options::PtiMode;

/// A Linux kernel's architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum LinuxArch {
    /// x86_64 (64-bit entry).
    X86_64,
    /// i386 (a 32-bit bzImage; 686-pae and the like).
    I386,
}

impl LinuxArch {
    /// The name `--arch` uses.
    pub fn name(self) -> &'static str {
        match self {
            LinuxArch::X86_64 => "x86_64",
            LinuxArch::I386 => "i386",
        }
    }
}

/// The kind of image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ImageFormat {
    /// A bzImage (Linux/x86 boot protocol; the setup header's "HdrS").
    BzImage,
    /// An ELF64 vmlinux with a PVH entry note.
    PvhElf,
}

/// What `--linux`, `--append`, `--arch` and `--tick-free` asked for.
#[derive(Debug, Clone)]
pub struct LinuxRequest {
    /// A known name (`debian-amd64`, `debian-686-pae`) or a path.
    pub kernel: String,
    /// More kernel command line (`--append`).
    pub append: String,
    /// `--arch`, if given: the image must be of it.
    pub arch: Option<LinuxArch>,
    /// `--tick-free`: whether a system-call loop runs on a CPU without the
    /// scheduler tick.
    pub tick_free: TickFree,
}

/// Whether a Linux system-call loop (getpid, getppid, write-badfd) runs on
/// a CPU the kernel keeps free of the scheduler tick (`nohz_full=`, the
/// init pinned there). With PTI each timer interrupt that arrives in user
/// mode writes CR3 twice, so a host that counts every CR3 write (KVM under
/// shadow paging) counts the loop's calls exactly only where no tick
/// lands; the cost is a second vCPU (the kernel's housekeeping CPU) and
/// the context tracking a `nohz_full` CPU does at each kernel entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum TickFree {
    /// On where the host counts every CR3 write (KVM with shadow paging:
    /// npt=0/ept=0, `--backend nested`'s default for Linux), off elsewhere
    /// (under QEMU the TCG plugin sets interrupted calls apart itself).
    #[default]
    Auto,
    /// Always, for the system-call loops.
    On,
    /// Never: the loop runs where the kernel puts it, ticks and all.
    Off,
}

/// A Linux guest, settled (serialisable: `--backend nested` sends it to
/// the inner VMM with the rest of the settled run).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LinuxGuest {
    /// The kernel file.
    pub path: PathBuf,
    /// The image's architecture.
    pub arch: LinuxArch,
    /// bzImage or PVH ELF.
    pub format: ImageFormat,
    /// The setup header's version string.
    pub version: Option<String>,
    /// Whether a configuration beside the image enables PTI
    /// (`CONFIG_MITIGATION_PAGE_TABLE_ISOLATION`, or
    /// `CONFIG_PAGE_TABLE_ISOLATION` before Linux 6.9); `None` without one.
    pub config_pti: Option<bool>,
    /// The init's words of the command line (its parser's keys).
    pub init_words: String,
    /// What PTI the run asked for.
    pub pti: PtiMode,
    /// The CPU ptiscope keeps free of the tick for the system-call loop
    /// (`--tick-free`: it added `nohz_full=` with it, the init pins the
    /// loop there); `None` when it did not.
    pub tick_free_cpu: Option<u32>,
}

impl LinuxGuest {
    /// The init's options as its parser reads them (`ipc=` is the init's
    /// own word, which the parser does not know).
    pub fn asked(&self) -> Option<guest_core::cmdline::Config> {
        guest_core::cmdline::parse(&init_parser_words(&self.init_words)).ok()
    }
}

/// The init's words without `ipc=`, which only the init reads: what the
/// guest's command-line parser is given.
pub fn init_parser_words(init_words: &str) -> String {
    init_words
        .split_whitespace()
        .filter(|w| !w.starts_with("ipc="))
        .collect::<Vec<_>>()
        .join(" ")
}
