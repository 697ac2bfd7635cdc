//! What a `--linux` kernel file is: an x86 bzImage (its setup header says
//! whether it has a 64-bit entry) or an ELF64 vmlinux with a PVH entry note,
//! and the kernel's build configuration where one is beside it.

use std::path::{Path, PathBuf};

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
    /// The kernel configuration's `CONFIG_PAGE_TABLE_ISOLATION`, where a
    /// config file was found beside the image.
    pub config_pti: Option<bool>,
    /// The configuration file read, if any.
    pub config_path: Option<PathBuf>,
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
    /// A bzImage whose boot protocol is too old to say its architecture.
    #[error("{path}: bzImage boot protocol {version:#x} is older than 2.12 (Linux 3.8): too old")]
    OldProtocol {
        /// The file.
        path: String,
        /// The setup header's protocol version.
        version: u16,
    },
}

/// Largest kernel configuration read.
const MAX_CONFIG_BYTES: u64 = 4 << 20;

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
        let kv = Some(h.kernel_version).filter(|&p| p != 0).and_then(|p| {
            let start = p as usize + 0x200;
            let rest = bytes.get(start..(start + 256).min(bytes.len()))?;
            let end = rest.iter().position(|&c| c == 0)?;
            let s = std::str::from_utf8(&rest[..end]).ok()?;
            s.chars().all(|c| !c.is_control()).then(|| s.to_string())
        });
        let (config_pti, config_path) = config_beside(path, kv.as_deref());
        return Ok(KernelImage {
            bytes,
            format: ImageFormat::BzImage,
            arch,
            version: kv,
            config_pti,
            config_path,
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
        let (config_pti, config_path) = config_beside(path, None);
        return Ok(KernelImage {
            bytes,
            format: ImageFormat::PvhElf,
            arch: LinuxArch::X86_64,
            version: None,
            config_pti,
            config_path,
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

/// `CONFIG_PAGE_TABLE_ISOLATION` of a configuration beside the image: `config`
/// in the same directory (ptiscope's cache), or Debian's
/// `/boot/config-RELEASE` beside `/boot/vmlinuz-RELEASE`.
fn config_beside(path: &Path, version: Option<&str>) -> (Option<bool>, Option<PathBuf>) {
    let dir = path.parent().unwrap_or(Path::new("."));
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
        if let Ok(bytes) = read_config(&c) {
            return (Some(config_has_pti(&bytes)), Some(c));
        }
    }
    (None, None)
}

/// Whether a kernel configuration sets `CONFIG_PAGE_TABLE_ISOLATION=y`,
/// read as bytes: a configuration is ASCII by convention only (a comment
/// or a string option may hold any byte), and one that is not UTF-8 is
/// still this kernel's configuration, not an absent one.
fn config_has_pti(config: &[u8]) -> bool {
    config
        .split(|&b| b == b'\n')
        .any(|l| l.trim_ascii() == b"CONFIG_PAGE_TABLE_ISOLATION=y")
}

fn read_config(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let f = std::fs::File::open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut bytes = Vec::new();
    f.take(MAX_CONFIG_BYTES).read_to_end(&mut bytes)?;
    Ok(bytes)
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
            let (got, path) = config_beside(&k, None);
            assert_eq!(got, Some(pti), "{text:?}");
            assert_eq!(path, Some(d.join("config")));
        }
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
