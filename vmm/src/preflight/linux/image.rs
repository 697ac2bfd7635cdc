//! What a `--linux` kernel file is: an x86 bzImage (its setup header says
//! whether it has a 64-bit entry) or an ELF64 vmlinux with a PVH entry note,
//! and the kernel's build configuration where one is beside it.

use std::path::{Path, PathBuf};

use crate::input::{read_regular, InputError, READ_TIME_LIMIT};
use crate::machine::bzimage;
use crate::machine::loader::{self, KernelSource, LoadError};

use crate::spec::linux::{ImageFormat, LinuxArch};

/// A kernel image read and recognised.
#[derive(Debug, Clone)]
pub struct KernelImage {
    /// The bytes (read once, size-capped, regular files only).
    pub bytes: Vec<u8>,
    /// bzImage or PVH ELF.
    pub format: ImageFormat,
    /// Architecture, from the setup header (or the ELF class).
    pub arch: LinuxArch,
    /// The setup header's version string (`6.1.0-57-cloud-amd64 (debian-kernel@...) #1 ...`).
    pub version: Option<String>,
    /// Whether the kernel configuration enables page table isolation
    /// ([`PAGE_TABLE_ISOLATION`], under either of its names), where a
    /// config file was found beside the image.
    pub config_pti: Option<bool>,
    /// The configuration beside the image, if one was found.
    pub config: Option<KernelConfig>,
}

impl KernelImage {
    /// The configuration file read, if any.
    pub fn config_path(&self) -> Option<&Path> {
        self.config.as_ref().map(|c| c.path.as_path())
    }
}

/// Errors recognising a kernel image.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The file could not be read (missing, not a regular file, too large).
    #[error(transparent)]
    Read(#[from] LoadError),
    /// The file is neither a bzImage nor an ELF64 vmlinux.
    #[error(
        "{path} is not a Linux kernel: no bzImage setup header (\"HdrS\" at 0x202) and no ELF \
         magic ({what}); give a bzImage (e.g. /boot/vmlinuz-*, arch/x86/boot/bzImage) or an \
         ELF64 vmlinux built with CONFIG_PVH=y"
    )]
    NotAKernel {
        /// The file.
        path: String,
        /// What its first bytes look like.
        what: String,
    },
    /// An ELF that is not a bootable PVH ELF64 (the loader's reason).
    #[error(
        "{path}: an ELF vmlinux must be ELF64 x86_64 with a PVH entry note (CONFIG_PVH=y): {why}"
    )]
    BadElf {
        /// The file.
        path: String,
        /// Why not.
        why: String,
    },
    /// A bzImage whose header disagrees with the file (truncated, an absurd
    /// setup size, a payload outside the kernel): refused before any boot,
    /// on either backend.
    #[error("{path}: {source}")]
    BadBzImage {
        /// The file.
        path: String,
        /// What is wrong.
        #[source]
        source: bzimage::BzImageError,
    },
    /// A configuration file beside the kernel exists but cannot be read
    /// whole (not a regular file, unreadable, larger than
    /// [`MAX_CONFIG_BYTES`], too slow, or a signal came): refused rather
    /// than taken as "no configuration" or as one without the options
    /// past the cap.
    #[error(
        "{source} (it is beside the kernel {kernel}, which ptiscope reads for its page table \
         isolation option: make it a readable regular file, or move it away)"
    )]
    Config {
        /// The kernel beside it.
        kernel: String,
        /// Why it could not be read (it names the file).
        #[source]
        source: InputError,
    },
    /// A bzImage whose boot protocol is too old to say its architecture.
    #[error("{path}: bzImage boot protocol {version:#x} is older than 2.12 (Linux 3.8): too old")]
    OldProtocol {
        /// The file.
        path: String,
        /// The setup header's protocol version.
        version: u16,
    },
}

/// Largest kernel configuration read: an allyesconfig is about 0.4 MiB, a
/// distribution's 0.3 MiB; one over this is refused naming the cap
/// (never read in part: an option past the cut would read as absent).
pub const MAX_CONFIG_BYTES: u64 = 64 << 20;

/// Recognises `bytes` (read from `path`).
pub fn recognise(path: &Path, bytes: Vec<u8>) -> Result<KernelImage, ImageError> {
    let name = path.display().to_string();
    // The header the VMM's bzImage loader reads, with its constants.
    let header = bzimage::setup_header_of(&bytes)
        .filter(|h| ({ h.header }, { h.boot_flag }) == (bzimage::HDRS_MAGIC, bzimage::BOOT_FLAG));
    // The boot sector's signature and "HdrS", but too short for the rest
    // of the header: a bzImage cut short, not some other file.
    if header.is_none() && bzimage::is_bzimage(&bytes) {
        return Err(ImageError::BadBzImage {
            path: name,
            source: bzimage::BzImageError::TooShort(bytes.len()),
        });
    }
    if let Some(h) = header {
        let version = h.version;
        if version < bzimage::MIN_PROTOCOL {
            return Err(ImageError::OldProtocol {
                path: name,
                version,
            });
        }
        // The file against its own header: a truncated or corrupt image is
        // refused here, not left to fault inside the emulator.
        if let Err(source) = bzimage::check_lengths(&h, bytes.len()) {
            return Err(ImageError::BadBzImage { path: name, source });
        }
        let arch = if h.xloadflags & bzimage::XLF_KERNEL_64 != 0 {
            LinuxArch::X86_64
        } else {
            LinuxArch::I386
        };
        let kv = version_of(&bytes);
        let config = config_beside(path, kv.as_deref())?;
        return Ok(KernelImage {
            bytes,
            format: ImageFormat::BzImage,
            arch,
            version: kv,
            config_pti: config.as_ref().map(|c| c.enabled(&PAGE_TABLE_ISOLATION)),
            config,
        });
    }
    if bytes.starts_with(b"\x7fELF") {
        if loader::is_elf32(&bytes) {
            return Err(ImageError::BadElf {
                path: name,
                why: "it is an ELF32; boot a 32-bit kernel as its bzImage".into(),
            });
        }
        // The companion guest's own check of a PVH ELF64, at a memory size
        // that fits any kernel it would boot.
        let layout =
            crate::machine::memory::MemoryLayout::new(1024).map_err(|e| ImageError::BadElf {
                path: name.clone(),
                why: e.to_string(),
            })?;
        loader::check_image(&bytes, &name, &layout).map_err(|e| ImageError::BadElf {
            path: name.clone(),
            why: e.to_string(),
        })?;
        let config = config_beside(path, None)?;
        return Ok(KernelImage {
            bytes,
            format: ImageFormat::PvhElf,
            arch: LinuxArch::X86_64,
            version: None,
            config_pti: config.as_ref().map(|c| c.enabled(&PAGE_TABLE_ISOLATION)),
            config,
        });
    }
    let head: String = bytes
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ");
    Err(ImageError::NotAKernel {
        path: name,
        what: if bytes.is_empty() {
            "the file is empty".into()
        } else {
            format!("{} bytes, starting {head}", bytes.len())
        },
    })
}

/// Reads and recognises the kernel at `path` (size-capped, regular files only).
pub fn read(path: &Path) -> Result<KernelImage, ImageError> {
    let bytes = loader::read_image(&KernelSource::Path(path.to_path_buf()))?.into_owned();
    recognise(path, bytes)
}

/// A bzImage's version string (`6.1.0-57-cloud-amd64 (debian-kernel@...) #1
/// ...`), from its setup header's `kernel_version` pointer, if it has one
/// that is printable text.
pub fn version_of(bytes: &[u8]) -> Option<String> {
    let h = bzimage::setup_header_of(bytes)?;
    let p = Some(h.kernel_version).filter(|&p| p != 0)?;
    let start = p as usize + 0x200;
    let rest = bytes.get(start..(start + 256).min(bytes.len()))?;
    let end = rest.iter().position(|&c| c == 0)?;
    let s = std::str::from_utf8(&rest[..end]).ok()?;
    s.chars().all(|c| !c.is_control()).then(|| s.to_string())
}

/// A kernel configuration option under every name it has had: Linux 6.9
/// renamed the x86 mitigation options to `CONFIG_MITIGATION_*` (commit
/// "x86/bugs: Rename CONFIG_* mitigation options"), so a configuration
/// says one or the other depending on the kernel's age.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigOption {
    /// What it is, in words.
    pub concept: &'static str,
    /// Its name before Linux 6.9, if it had one.
    pub old: Option<&'static str>,
    /// Its name since (or its only name).
    pub new: &'static str,
}

impl ConfigOption {
    /// Its names, newest first.
    pub fn names(&self) -> impl Iterator<Item = &'static str> {
        std::iter::once(self.new).chain(self.old)
    }

    /// `NEW=y (Linux 6.9+) or OLD=y (before)`, for messages.
    pub fn either_y(&self) -> String {
        match self.old {
            Some(old) => format!(
                "{}=y (Linux 6.9 and later) or {old}=y (before 6.9)",
                self.new
            ),
            None => format!("{}=y", self.new),
        }
    }
}

/// Page table isolation (x86's Meltdown mitigation).
pub const PAGE_TABLE_ISOLATION: ConfigOption = ConfigOption {
    concept: "page table isolation",
    old: Some("CONFIG_PAGE_TABLE_ISOLATION"),
    new: "CONFIG_MITIGATION_PAGE_TABLE_ISOLATION",
};

/// 32-bit PAE paging: an i386 kernel without it has no PTI (the option
/// depends on it), which the refusal says.
pub const X86_PAE: ConfigOption = ConfigOption {
    concept: "32-bit PAE paging",
    old: None,
    new: "CONFIG_X86_PAE",
};

/// The x86 mitigation options ptiscope knows by both names (page table
/// isolation, and the others renamed with it, read the same way where a
/// report needs them).
pub const MITIGATION_OPTIONS: [ConfigOption; 9] = [
    PAGE_TABLE_ISOLATION,
    ConfigOption {
        concept: "retpolines",
        old: Some("CONFIG_RETPOLINE"),
        new: "CONFIG_MITIGATION_RETPOLINE",
    },
    ConfigOption {
        concept: "return thunks",
        old: Some("CONFIG_RETHUNK"),
        new: "CONFIG_MITIGATION_RETHUNK",
    },
    ConfigOption {
        concept: "untrained return entry",
        old: Some("CONFIG_CPU_UNRET_ENTRY"),
        new: "CONFIG_MITIGATION_UNRET_ENTRY",
    },
    ConfigOption {
        concept: "IBPB on entry",
        old: Some("CONFIG_CPU_IBPB_ENTRY"),
        new: "CONFIG_MITIGATION_IBPB_ENTRY",
    },
    ConfigOption {
        concept: "IBRS on entry",
        old: Some("CONFIG_CPU_IBRS_ENTRY"),
        new: "CONFIG_MITIGATION_IBRS_ENTRY",
    },
    ConfigOption {
        concept: "speculative return stack overflow",
        old: Some("CONFIG_CPU_SRSO"),
        new: "CONFIG_MITIGATION_SRSO",
    },
    ConfigOption {
        concept: "call depth tracking",
        old: Some("CONFIG_CALL_DEPTH_TRACKING"),
        new: "CONFIG_MITIGATION_CALL_DEPTH_TRACKING",
    },
    // Named so from the start in mainline and in the stable backports
    // Debian's 6.1 carries.
    ConfigOption {
        concept: "branch history injection",
        old: None,
        new: "CONFIG_MITIGATION_SPECTRE_BHI",
    },
];

/// An option's setting in a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigValue {
    /// `NAME=VALUE` (`y`, `m`, a number or a quoted string), as bytes.
    Set(Vec<u8>),
    /// `# NAME is not set`.
    NotSet,
}

/// A kernel configuration file (`.config`, Debian's `/boot/config-*`),
/// read whole as bytes: a configuration is ASCII by convention only (a
/// comment or a string option may hold any byte), and one that is not
/// UTF-8 is still this kernel's configuration, not an absent one.
#[derive(Debug, Clone)]
pub struct KernelConfig {
    /// Where it was read.
    pub path: PathBuf,
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// The kernel's version (major, minor), where its image says it: which
    /// of an option's names that kernel reads.
    pub kernel: Option<(u32, u32)>,
}

/// `6.1.0-57-cloud-amd64 (...)` as (6, 1).
pub fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut it = version.split(['.', '-', ' ']);
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

impl KernelConfig {
    /// `option` under whichever of its names the configuration has: the
    /// name the kernel reads first (before 6.9 the old one, which a stray
    /// `CONFIG_MITIGATION_*` line beside it must not outvote; since, or
    /// with the version unknown, the new one): the name found and its
    /// setting; `None` when it mentions neither.
    pub fn value(&self, option: &ConfigOption) -> Option<(&'static str, ConfigValue)> {
        let before_rename = self.kernel.is_some_and(|v| v < (6, 9));
        let mut names: Vec<&'static str> = option.names().collect();
        if before_rename {
            names.reverse();
        }
        names
            .into_iter()
            .find_map(|name| config_value(&self.bytes, name).map(|v| (name, v)))
    }

    /// How the configuration sets `option`, for a message: `it says
    /// NAME=VALUE`, `it says # NAME is not set`, or that it has no line
    /// for it under any of its names.
    pub fn describe(&self, option: &ConfigOption) -> String {
        match self.value(option) {
            Some((name, ConfigValue::Set(v))) => {
                format!(
                    "it says {name}={}",
                    String::from_utf8_lossy(&v).escape_debug()
                )
            }
            Some((name, ConfigValue::NotSet)) => format!("it says # {name} is not set"),
            None => format!(
                "it has no line for {}",
                option.names().collect::<Vec<_>>().join(" or ")
            ),
        }
    }

    /// Whether `option` is `=y` under one of its names.
    pub fn enabled(&self, option: &ConfigOption) -> bool {
        matches!(self.value(option), Some((_, ConfigValue::Set(v))) if v == b"y")
    }
}

/// The setting of the option `name` in configuration text: the last line
/// that sets it or says it is not set (Kconfig writes one; a later line
/// wins as it does for `make olddefconfig`).
fn config_value(config: &[u8], name: &str) -> Option<ConfigValue> {
    let name = name.as_bytes();
    config
        .rsplit(|&b| b == b'\n')
        .map(<[u8]>::trim_ascii)
        .find_map(|l| {
            if let Some(v) = l.strip_prefix(name).and_then(|r| r.strip_prefix(b"=")) {
                return Some(ConfigValue::Set(v.trim_ascii().to_vec()));
            }
            let rest = l
                .strip_prefix(b"#")?
                .trim_ascii_start()
                .strip_prefix(name)?;
            (rest.trim_ascii() == b"is not set").then_some(ConfigValue::NotSet)
        })
}

/// The configuration beside the image at `path`: `config` in the same
/// directory (ptiscope's cache), or Debian's `/boot/config-RELEASE`
/// beside `/boot/vmlinuz-RELEASE` (the release from the file name or from
/// the image's `version`). A candidate that does not exist is passed
/// over; one that exists but cannot be read whole (a FIFO, a device, over
/// [`MAX_CONFIG_BYTES`], unreadable) is an error naming it, never taken as
/// "no configuration". Read through [`read_regular`]: a FIFO never blocks
/// the open, a signal ends the read.
pub fn config_beside(
    path: &Path,
    version: Option<&str>,
) -> Result<Option<KernelConfig>, ImageError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let mut candidates = vec![dir.join("config")];
    if let Some(release) = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("vmlinuz-"))
    {
        candidates.push(dir.join(format!("config-{release}")));
    }
    if let Some(release) = version.and_then(|v| v.split_whitespace().next()) {
        candidates.push(dir.join(format!("config-{release}")));
    }
    for c in candidates {
        match read_regular(
            "kernel configuration",
            &c,
            MAX_CONFIG_BYTES,
            READ_TIME_LIMIT,
        ) {
            Ok(bytes) => {
                return Ok(Some(KernelConfig {
                    path: c,
                    bytes,
                    kernel: version.and_then(major_minor),
                }))
            }
            Err(InputError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            }
            Err(source) => {
                return Err(ImageError::Config {
                    kernel: path.display().to_string(),
                    source,
                })
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bz(xloadflags: u16, protocol: u16) -> Vec<u8> {
        use bzimage::SETUP_HEADER_OFFSET as AT;
        use linux_loader::loader::bootparam::setup_header;
        let mut b = vec![0u8; 0x1000];
        let h = setup_header {
            boot_flag: bzimage::BOOT_FLAG,
            header: bzimage::HDRS_MAGIC,
            version: protocol,
            xloadflags,
            // kernel_version points at 0x400 (+0x200).
            kernel_version: 0x200,
            // setup_sects 0 (4): 0xa00 bytes of setup, then 0x600 of kernel.
            syssize: 0x60,
            payload_length: 0x100,
            ..Default::default()
        };
        let h = vm_memory::ByteValued::as_slice(&h);
        b[AT..AT + h.len()].copy_from_slice(h);
        b[0x400..0x40c].copy_from_slice(b"6.1.0-test \0");
        b
    }

    #[test]
    fn bzimage_arch_comes_from_xloadflags() {
        let p = Path::new("/nonexistent/vmlinuz");
        let k = recognise(p, bz(bzimage::XLF_KERNEL_64 | 2, 0x020f)).unwrap();
        assert_eq!(
            (k.format, k.arch),
            (ImageFormat::BzImage, LinuxArch::X86_64)
        );
        assert_eq!(k.version.as_deref(), Some("6.1.0-test "));
        let k = recognise(p, bz(0, 0x020f)).unwrap();
        assert_eq!(k.arch, LinuxArch::I386);
        assert!(matches!(
            recognise(p, bz(1, 0x0206)),
            Err(ImageError::OldProtocol { .. })
        ));
    }

    #[test]
    fn other_files_are_not_kernels() {
        let p = Path::new("/x");
        for bytes in [
            Vec::new(),
            b"#!/bin/sh\necho hi\n".to_vec(),
            vec![0u8; 4096],
        ] {
            let e = recognise(p, bytes).unwrap_err();
            assert!(matches!(e, ImageError::NotAKernel { .. }), "{e}");
            assert!(e.to_string().contains("not a Linux kernel"), "{e}");
        }
        let e = recognise(p, crate::GUEST_I386.to_vec()).unwrap_err();
        assert!(e.to_string().contains("ELF32"), "{e}");
    }

    /// A configuration is read as bytes: one with bytes that are not UTF-8
    /// still says whether the kernel has PTI (it is never "absent").
    #[test]
    fn a_configuration_that_is_not_utf8_is_still_read() {
        let d = std::env::temp_dir().join(format!("ptiscope-config-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let k = d.join("vmlinuz");
        for (text, pti) in [
            (
                &b"# \xff\xfe latin-1 \xe9\nCONFIG_PAGE_TABLE_ISOLATION=y\r\n"[..],
                true,
            ),
            (
                &b"CONFIG_X=\"\xc3\x28\"\n# CONFIG_PAGE_TABLE_ISOLATION is not set\n"[..],
                false,
            ),
            (&b"\x80\x81\x82"[..], false),
        ] {
            std::fs::write(d.join("config"), text).unwrap();
            let c = config_beside(&k, None).unwrap().unwrap();
            assert_eq!(c.enabled(&PAGE_TABLE_ISOLATION), pti, "{text:?}");
            assert_eq!(c.path, d.join("config"));
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A configuration naming an option under both names is read under
    /// the one its kernel reads: the old name before 6.9, the new one
    /// since (or with the version unknown); the message says what it has.
    #[test]
    fn both_names_are_read_as_the_kernel_reads_them() {
        let config = |text: &str, kernel| KernelConfig {
            path: PathBuf::from("config"),
            bytes: text.as_bytes().to_vec(),
            kernel,
        };
        let pti = &PAGE_TABLE_ISOLATION;
        let old_n = "CONFIG_PAGE_TABLE_ISOLATION=n\nCONFIG_MITIGATION_PAGE_TABLE_ISOLATION=y\n";
        let old_y = "CONFIG_PAGE_TABLE_ISOLATION=y\nCONFIG_MITIGATION_PAGE_TABLE_ISOLATION=n\n";
        assert!(!config(old_n, Some((6, 1))).enabled(pti));
        assert!(config(old_y, Some((6, 1))).enabled(pti));
        assert!(config(old_n, Some((6, 12))).enabled(pti));
        assert!(!config(old_y, Some((6, 9))).enabled(pti));
        assert!(config(old_n, None).enabled(pti));
        // Only one name: read whatever the version.
        assert!(config("CONFIG_MITIGATION_PAGE_TABLE_ISOLATION=y\n", Some((6, 1))).enabled(pti));
        assert!(config("CONFIG_PAGE_TABLE_ISOLATION=y\n", Some((6, 12))).enabled(pti));
        assert_eq!(
            major_minor("6.1.0-57-cloud-amd64 (debian@x) #1"),
            Some((6, 1))
        );
        assert_eq!(major_minor("6.12.3"), Some((6, 12)));
        assert_eq!(major_minor("junk"), None);
        for (text, says) in [
            (
                "CONFIG_PAGE_TABLE_ISOLATION=m\n",
                "it says CONFIG_PAGE_TABLE_ISOLATION=m",
            ),
            (
                "# CONFIG_PAGE_TABLE_ISOLATION is not set\n",
                "it says # CONFIG_PAGE_TABLE_ISOLATION is not set",
            ),
            ("#CONFIG_PAGE_TABLE_ISOLATION=y\n", "it has no line for"),
        ] {
            let d = config(text, None).describe(pti);
            assert!(d.starts_with(says), "{text:?}: {d}");
        }
    }

    /// Each option is read under its name before Linux 6.9 and its
    /// `CONFIG_MITIGATION_*` name since; `is not set`, `=m`, a longer
    /// name sharing the prefix and an absent option are told apart.
    #[test]
    fn options_are_read_under_every_name_they_have_had() {
        let config = |text: &str| KernelConfig {
            path: PathBuf::from("config"),
            bytes: text.as_bytes().to_vec(),
            kernel: None,
        };
        let pti = &PAGE_TABLE_ISOLATION;
        // 6.1 and 6.12 as Debian ships them.
        assert!(config("CONFIG_PAGE_TABLE_ISOLATION=y\n").enabled(pti));
        assert!(config("CONFIG_MITIGATION_PAGE_TABLE_ISOLATION=y\n").enabled(pti));
        assert_eq!(
            config("  CONFIG_MITIGATION_PAGE_TABLE_ISOLATION=y \r\n").value(pti),
            Some((
                "CONFIG_MITIGATION_PAGE_TABLE_ISOLATION",
                ConfigValue::Set(b"y".to_vec())
            ))
        );
        for text in [
            "",
            "# CONFIG_MITIGATION_PAGE_TABLE_ISOLATION is not set\n",
            "# CONFIG_PAGE_TABLE_ISOLATION is not set\n",
            "CONFIG_PAGE_TABLE_ISOLATION=m\n",
            "CONFIG_PAGE_TABLE_ISOLATION_X=y\n# CONFIG_PAGE_TABLE_ISOLATION_Y is not set\n",
            "#CONFIG_PAGE_TABLE_ISOLATION=y\n",
        ] {
            assert!(!config(text).enabled(pti), "{text:?}");
        }
        assert_eq!(
            config("# CONFIG_PAGE_TABLE_ISOLATION is not set\n").value(pti),
            Some(("CONFIG_PAGE_TABLE_ISOLATION", ConfigValue::NotSet))
        );
        assert_eq!(config("CONFIG_PAGE_TABLE_ISOLATION_X=y\n").value(pti), None);
        // Every renamed option reads both ways, and its message names both.
        for o in MITIGATION_OPTIONS {
            for name in o.names() {
                assert!(config(&format!("{name}=y\n")).enabled(&o), "{name}");
                assert!(o.either_y().contains(&format!("{name}=y")), "{name}");
            }
        }
        assert!(MITIGATION_OPTIONS
            .iter()
            .all(|o| o.new.starts_with("CONFIG_MITIGATION_")));
        // A non-PAE 686 kernel: no PTI under either name.
        let c = config("CONFIG_X86_32=y\n# CONFIG_X86_PAE is not set\n");
        assert!(!c.enabled(pti) && !c.enabled(&X86_PAE));
        assert_eq!(
            c.value(&X86_PAE),
            Some(("CONFIG_X86_PAE", ConfigValue::NotSet))
        );
    }

    /// A configuration is read whole: an option past 4 MiB (the old cap)
    /// is found; one over [`MAX_CONFIG_BYTES`] is an error naming it and
    /// the cap, never "no PTI"; a FIFO or a directory named `config` is an
    /// error at once (never a blocked open); a missing one is no config.
    #[test]
    fn a_configuration_is_read_whole_or_refused_naming_it() {
        let d = std::env::temp_dir().join(format!("ptiscope-config-big-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let k = d.join("vmlinuz");
        assert!(config_beside(&k, None).unwrap().is_none());
        let mut big = "# padding\n".repeat((5 << 20) / 10).into_bytes();
        big.extend_from_slice(b"CONFIG_PAGE_TABLE_ISOLATION=y\n");
        assert!(big.len() > 5 << 20);
        std::fs::write(d.join("config"), &big).unwrap();
        let c = config_beside(&k, None).unwrap().unwrap();
        assert!(c.enabled(&PAGE_TABLE_ISOLATION));
        // Over the cap (sparse: no disk used).
        let f = std::fs::File::create(d.join("config")).unwrap();
        f.set_len(MAX_CONFIG_BYTES + 1).unwrap();
        let e = config_beside(&k, None).unwrap_err().to_string();
        assert!(
            e.contains(&d.join("config").display().to_string())
                && e.contains(&MAX_CONFIG_BYTES.to_string())
                && e.contains(&k.display().to_string()),
            "{e}"
        );
        std::fs::remove_file(d.join("config")).unwrap();
        // Debian's /boot/config-RELEASE beside /boot/vmlinuz-RELEASE.
        let boot = d.join("vmlinuz-6.12.0-test");
        std::fs::write(
            d.join("config-6.12.0-test"),
            "CONFIG_MITIGATION_PAGE_TABLE_ISOLATION=y\n",
        )
        .unwrap();
        let c = config_beside(&boot, None).unwrap().unwrap();
        assert_eq!(c.path, d.join("config-6.12.0-test"));
        assert!(c.enabled(&PAGE_TABLE_ISOLATION));
        // The release from the image's version string.
        let c = config_beside(&k, Some("6.12.0-test (x@y) #1"))
            .unwrap()
            .unwrap();
        assert_eq!(c.path, d.join("config-6.12.0-test"));
        // A FIFO, then a directory.
        let fifo = std::ffi::CString::new(d.join("config").to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let t = std::time::Instant::now();
        let e = config_beside(&k, None).unwrap_err().to_string();
        assert!(t.elapsed() < std::time::Duration::from_secs(2));
        assert!(e.contains("FIFO") && e.contains("/config"), "{e}");
        std::fs::remove_file(d.join("config")).unwrap();
        std::fs::create_dir(d.join("config")).unwrap();
        let e = config_beside(&k, None).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Every cut of a bzImage shorter than its header says is refused as
    /// truncated, and every header that contradicts itself is refused
    /// naming the field, before any boot.
    #[test]
    fn a_bzimage_is_checked_against_its_own_header() {
        let p = Path::new("/k/vmlinuz");
        let whole = bz(bzimage::XLF_KERNEL_64 | 2, 0x020f);
        assert!(recognise(p, whole.clone()).is_ok());
        // Longer is fine (a signed kernel carries its signature at the end).
        let mut signed = whole.clone();
        signed.extend_from_slice(&[0xa5; 700]);
        assert!(recognise(p, signed).is_ok());
        // Every length from just past the header to one byte short.
        for len in (0x270..whole.len()).step_by(7).chain([whole.len() - 1]) {
            let e = recognise(p, whole[..len].to_vec()).unwrap_err();
            assert!(
                matches!(e, ImageError::BadBzImage { .. }) && e.to_string().contains("truncated"),
                "{len}: {e}"
            );
        }
        let field = |at: usize, bytes: &[u8]| {
            let mut b = whole.clone();
            b[at..at + bytes.len()].copy_from_slice(bytes);
            recognise(p, b).unwrap_err().to_string()
        };
        for sects in [65u8, 100, 255] {
            let e = field(0x1f1, &[sects]);
            assert!(e.contains(&format!("setup_sects {sects}")), "{e}");
        }
        // A setup size that is legal but leaves the kernel past the end.
        assert!(field(0x1f1, &[6]).contains("truncated"));
        assert!(field(0x1f4, &0u32.to_le_bytes()).contains("syssize is 0"));
        assert!(field(0x1f4, &u32::MAX.to_le_bytes()).contains("truncated"));
        for (off, len) in [(0x600u32, 1u32), (0, 0x601), (u32::MAX, u32::MAX), (0, 0)] {
            let mut b = whole.clone();
            b[0x248..0x24c].copy_from_slice(&off.to_le_bytes());
            b[0x24c..0x250].copy_from_slice(&len.to_le_bytes());
            let e = recognise(p, b).unwrap_err().to_string();
            assert!(e.contains("payload_offset"), "{off:#x}+{len:#x}: {e}");
        }
    }
}
