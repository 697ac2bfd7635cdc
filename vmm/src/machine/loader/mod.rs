//! Loading the guest kernel (linux-loader's ELF loader, PVH entry note); the
//! PVH boot structures are written by [`crate::machine::boot_params`]. A
//! 64-bit Linux bzImage (recognised by its setup header before anything
//! else) goes to [`crate::machine::bzimage`].
//!
//! The image is checked here before linux-loader sees it, because the
//! loader's own errors ("Unable to read kernel image") do not say what is
//! wrong with the file, and because it would happily read an ELF32 header as
//! an ELF64 one.
//!
//! linux-loader reads ELF64 only. The 32-bit PAE flavour of the guest is an
//! ELF32 (i386) image, loaded by [`load_elf32`]: a few lines on top of the
//! `object` crate's ELF32 parser that copy the PT_LOAD segments to their
//! physical addresses and take the entry from the PVH note. That keeps the
//! image the linker produced (no objcopy step to ELF64) and lets `--kernel`
//! take any PVH ELF32 that QEMU would boot.
//!
//! Here: where the image comes from and its capped reading, and the load's
//! dispatch (bzImage, ELF32, ELF64) with its dry run. The concerns under it:
//! `error` (what can be wrong, the limits), `elf64` (checked by hand,
//! loaded by linux-loader), `elf32` (on the object crate), `pvh_note`
//! (the PVH note as linux-loader and as QEMU read it: QEMU aligns note
//! fields to the segment's `p_align`, linux-loader to 4), `segments` (what
//! a load places) and `elf_fields` (the raw fields both classes read).

mod elf32;
mod elf64;
mod elf_fields;
mod error;
mod pvh_note;
mod segments;
#[cfg(test)]
mod test_images;

use std::path::{Path, PathBuf};

use vm_memory::GuestMemoryMmap;

use crate::machine::bzimage;
use crate::machine::memory::MemoryLayout;

pub use elf32::{is_elf32, load_elf32};
pub use error::{LoadError, ELF32_MAX_MEM_MIB, MAX_IMAGE_BYTES};
pub use pvh_note::check_qemu_pvh_note;
pub use segments::LoadedKernel;

/// Where the kernel comes from.
#[derive(Debug, Clone)]
pub enum KernelSource {
    /// An image compiled into the binary (the default guest).
    Embedded(&'static [u8]),
    /// A file given with `--kernel`.
    Path(PathBuf),
}

impl KernelSource {
    /// A name for messages.
    pub fn describe(&self) -> String {
        match self {
            KernelSource::Embedded(_) => "the embedded guest".into(),
            KernelSource::Path(p) => p.display().to_string(),
        }
    }
}

/// Reads the image into memory.
pub fn read_image(src: &KernelSource) -> Result<std::borrow::Cow<'static, [u8]>, LoadError> {
    match src {
        KernelSource::Embedded(b) => Ok(std::borrow::Cow::Borrowed(b)),
        KernelSource::Path(p) => read_file(p).map(std::borrow::Cow::Owned),
    }
}

/// Reads a kernel image file through [`crate::input::read_regular`]: only
/// regular files (a FIFO would block until a writer comes, `/dev/zero` never
/// ends), at most [`MAX_IMAGE_BYTES`] counted as read (the metadata's size
/// can say too little, as procfs files or a growing file do; one that says
/// more is refused unread), within
/// [`crate::input::READ_TIME_LIMIT`], and a termination signal ends it.
fn read_file(path: &Path) -> Result<Vec<u8>, LoadError> {
    use crate::input::{read_regular, InputError, READ_TIME_LIMIT};
    read_regular("--kernel", path, MAX_IMAGE_BYTES, READ_TIME_LIMIT).map_err(|e| {
        let read = |source| LoadError::Read {
            path: path.to_path_buf(),
            source,
        };
        match e {
            InputError::TooLarge { .. } => LoadError::TooLarge(path.display().to_string()),
            InputError::Interrupted { signal, .. } => LoadError::Interrupted(signal),
            InputError::Io { source, .. } => read(source),
            InputError::NotRegular { kind, .. } => read(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{kind}, not a regular file; give the kernel as a file"),
            )),
            e @ InputError::TimedOut { .. } => read(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                e.to_string(),
            )),
        }
    })
}

/// Loads `src` into `mem` at its segments' physical addresses and returns
/// the PVH entry point.
pub fn load_kernel(
    mem: &GuestMemoryMmap,
    layout: &MemoryLayout,
    src: &KernelSource,
) -> Result<LoadedKernel, LoadError> {
    let image = read_image(src)?;
    load_bytes(mem, layout, &src.describe(), &image)
}

/// Checks an image before anything starts (before KVM is opened, before
/// QEMU is started): a dry run of the real load into scratch memory of the
/// same size, so what passes here loads the same way at boot, linux-loader's
/// own checks included (found by fuzzing: a check that only mirrored them
/// let through images the load then refused).
pub fn check_image(image: &[u8], name: &str, layout: &MemoryLayout) -> Result<(), LoadError> {
    check_and_keep(image, name, layout).map(|_| ())
}

/// [`check_image`], keeping what the dry run made: guest memory of the
/// layout's size with the image loaded, exactly what a boot's first step
/// makes (`builder::build`: fresh memory, then [`load_bytes`]), so that the
/// first boot can take it ([`Preloaded`]) instead of loading the image a
/// second time (a copy and a page fault per page of the image).
pub fn check_and_keep(
    image: &[u8],
    name: &str,
    layout: &MemoryLayout,
) -> Result<(GuestMemoryMmap, LoadedKernel), LoadError> {
    // Anonymous memory: only the pages the segments touch are ever allocated.
    let scratch = layout
        .create_guest_memory()
        .map_err(|e| LoadError::Scratch(name.to_string(), e.to_string()))?;
    let loaded = load_bytes(&scratch, layout, name, image)?;
    Ok((scratch, loaded))
}

/// Guest memory with a run's image already loaded ([`check_and_keep`]),
/// for that run's first boot on KVM; the boots after it (compare's, the
/// clones of a resolved run share it) find it taken and load their own.
/// Empty for runs that did not keep their check's memory.
#[derive(Clone, Default)]
pub struct Preloaded(std::sync::Arc<std::sync::Mutex<Option<(GuestMemoryMmap, LoadedKernel)>>>);

impl Preloaded {
    /// Holds `loaded` (memory and what was loaded into it) for the first taker.
    pub fn new(loaded: (GuestMemoryMmap, LoadedKernel)) -> Self {
        Preloaded(std::sync::Arc::new(std::sync::Mutex::new(Some(loaded))))
    }

    /// The memory and its load, once; `None` afterwards or if empty.
    pub fn take(&self) -> Option<(GuestMemoryMmap, LoadedKernel)> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl std::fmt::Debug for Preloaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let held = self.0.lock().map(|g| g.is_some()).unwrap_or_default();
        f.debug_tuple("Preloaded").field(&held).finish()
    }
}

/// Loads an image already in memory; `name` is for messages.
pub fn load_bytes(
    mem: &GuestMemoryMmap,
    layout: &MemoryLayout,
    name: &str,
    image: &[u8],
) -> Result<LoadedKernel, LoadError> {
    let name = name.to_string();
    if bzimage::is_bzimage(image) {
        let k = bzimage::load(mem, layout, image).map_err(|e| LoadError::BzImage(name, e))?;
        return Ok(LoadedKernel {
            entry: k.entry,
            end: k.end,
            bzimage: Some(k),
        });
    }
    if is_elf32(image) {
        return load_elf32(mem, layout, &name, image);
    }
    elf64::load_elf64(mem, layout, name, image)
}

#[cfg(test)]
mod tests {
    use super::elf_fields::{EM_386, PT_NOTE};
    use super::test_images::{put_note, tiny_elf, tiny_elf32};
    use super::*;
    use vm_memory::{Bytes, GuestAddress};

    #[test]
    fn loads_elf32_pvh_images_at_their_physical_addresses() {
        let layout = MemoryLayout::new(16).unwrap();
        let mem = layout.create_guest_memory().unwrap();
        let img = tiny_elf32(0x10_0000, 0x10_0000);
        assert!(is_elf32(&img));
        let k = load_bytes(&mem, &layout, "elf32", &img).unwrap();
        assert_eq!((k.entry, k.end), (0x10_0000, 0x10_2000));
        let mut code = [0u8; 4];
        mem.read_slice(&mut code, GuestAddress(0x10_0000)).unwrap();
        assert_eq!(code, [0xfa, 0xf4, 0xeb, 0xfd]);

        let outside = tiny_elf32(0x200_0000, 0x200_0000);
        assert!(matches!(
            load_bytes(&mem, &layout, "elf32", &outside),
            Err(LoadError::SegmentOutsideMemory { .. })
        ));
        let mut no_note = tiny_elf32(0x10_0000, 0x10_0000);
        no_note[0x188] = 17; // another note type
        assert!(matches!(
            load_bytes(&mem, &layout, "elf32", &no_note),
            Err(LoadError::NoPvhNote(_))
        ));
        let big = MemoryLayout::new(1024).unwrap();
        let big_mem = big.create_guest_memory().unwrap();
        assert!(matches!(
            load_bytes(&big_mem, &big, "elf32", &img),
            Err(LoadError::Elf32TooMuchMemory(_))
        ));
        let mut cut = tiny_elf32(0x10_0000, 0x10_0000);
        cut.truncate(0x60);
        assert!(load_bytes(&mem, &layout, "elf32", &cut).is_err());
    }

    /// The entry is checked against the segments by `check_image` (what
    /// both backends call before anything starts), for ELF64 and ELF32.
    #[test]
    fn check_image_refuses_an_entry_outside_the_segments_of_either_class() {
        let layout = MemoryLayout::new(16).unwrap();
        for img in [
            tiny_elf(0x10_0000, 0x30_0000, true),
            tiny_elf32(0x10_0000, 0x30_0000),
        ] {
            assert!(matches!(
                check_image(&img, "img", &layout),
                Err(LoadError::EntryOutsideImage {
                    entry: 0x30_0000,
                    ..
                })
            ));
        }
        // One byte past the segment's memory size is outside; its last byte is inside.
        assert!(check_image(&tiny_elf(0x10_0000, 0x10_1000, true), "img", &layout).is_err());
        assert!(check_image(&tiny_elf(0x10_0000, 0x10_0fff, true), "img", &layout).is_ok());
        assert!(check_image(&tiny_elf32(0x10_0000, 0x10_1fff), "img", &layout).is_ok());
    }

    /// The cap counts bytes read (`crate::input` tests it at its edge): a
    /// regular file whose metadata says 0 bytes (procfs) is read whole.
    #[test]
    fn image_reads_count_bytes_read_not_metadata() {
        let maps = read_file(Path::new("/proc/self/maps")).unwrap();
        assert!(!maps.is_empty());
    }

    /// `tiny_elf` with a third program header: a PT_NOTE at 0x1a0 holding
    /// one note of type `kind` whose descriptor is `entry`.
    fn tiny_elf_with_second_note(entry: u32, kind: u32) -> Vec<u8> {
        let mut f = tiny_elf(0x10_0000, 0x10_0000, true);
        f[56..58].copy_from_slice(&3u16.to_le_bytes());
        let ph = 64 + 2 * 56;
        f[ph..ph + 4].copy_from_slice(&PT_NOTE.to_le_bytes());
        f[ph + 8..ph + 16].copy_from_slice(&0x1a0u64.to_le_bytes());
        f[ph + 32..ph + 40].copy_from_slice(&20u64.to_le_bytes());
        put_note(&mut f, 0x1a0, kind, entry);
        f
    }

    /// Found by the `loader` fuzz target: a PVH note followed by another
    /// PT_NOTE segment passed `check_image`, then linux-loader (which reads
    /// only the last PT_NOTE segment) found no PVH note. Now what passes
    /// the check loads, and images whose notes disagree are refused.
    #[test]
    fn check_image_and_the_load_agree_on_images_with_several_note_segments() {
        let layout = MemoryLayout::new(16).unwrap();
        let mem = layout.create_guest_memory().unwrap();
        // PVH note first, another note last: refused by both, clearly.
        let img = tiny_elf_with_second_note(0, 17);
        for result in [
            check_image(&img, "img", &layout),
            load_bytes(&mem, &layout, "img", &img).map(|_| ()),
        ] {
            let e = result.unwrap_err();
            assert!(
                e.to_string().contains("not in the last PT_NOTE segment"),
                "{e}"
            );
        }
        // Two PVH notes that disagree.
        let img = tiny_elf_with_second_note(0x10_0800, 18);
        let e = check_image(&img, "img", &layout).unwrap_err();
        assert!(e.to_string().contains("different PVH entry points"), "{e}");
        // Two that agree: checked and loaded.
        let img = tiny_elf_with_second_note(0x10_0000, 18);
        check_image(&img, "img", &layout).unwrap();
        assert_eq!(
            load_bytes(&mem, &layout, "img", &img).unwrap().entry,
            0x10_0000
        );
    }

    fn load(img: Vec<u8>, mib: u64) -> Result<LoadedKernel, LoadError> {
        let layout = MemoryLayout::new(mib).unwrap();
        let mem = layout.create_guest_memory().unwrap();
        let img: &'static [u8] = Box::leak(img.into_boxed_slice());
        load_kernel(&mem, &layout, &KernelSource::Embedded(img))
    }

    #[test]
    fn loads_pvh_entry() {
        let k = load(tiny_elf(0x100000, 0x100000, true), 16).unwrap();
        assert_eq!(k.entry, 0x100000);
        assert_eq!(k.end, 0x101000);
    }

    #[test]
    fn rejects_bad_images() {
        assert!(matches!(
            load(tiny_elf(0x100000, 0x100000, false), 16),
            Err(LoadError::NoPvhNote(_))
        ));
        assert!(matches!(
            load(b"#!/bin/sh\n".to_vec(), 16),
            Err(LoadError::NotElf(_))
        ));
        let e = load(tiny_elf(0x2000000, 0x2000000, true), 16).unwrap_err();
        assert!(matches!(e, LoadError::SegmentOutsideMemory { .. }), "{e}");
        assert!(e.to_string().contains("--mem 16 MiB"), "{e}");
        assert!(matches!(
            load(tiny_elf(0x100000, 0x300000, true), 16),
            Err(LoadError::EntryOutsideImage { .. })
        ));
        let mut elf32 = tiny_elf(0x100000, 0x100000, true);
        elf32[4] = 1;
        elf32[18..20].copy_from_slice(&EM_386.to_le_bytes());
        assert!(matches!(load(elf32, 16), Err(LoadError::Elf32(..))));
        let mut trunc = tiny_elf(0x100000, 0x100000, true);
        trunc.truncate(0x60);
        assert!(matches!(load(trunc, 16), Err(LoadError::Malformed(..))));
    }
}
