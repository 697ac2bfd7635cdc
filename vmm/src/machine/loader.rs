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
//! Size: two image formats (ELF64 through linux-loader, ELF32 on the object
//! crate), their checks as a dry run of the load, QEMU's own reading of PVH
//! notes (`check_qemu_pvh_note`: QEMU aligns note fields to the segment's
//! `p_align`, linux-loader to 4), and capped reading; about 320 of its
//! lines are tests of hostile images.

use std::io::Cursor;
use std::path::{Path, PathBuf};

use linux_loader::loader::elf::{Elf, PvhBootCapability};
use linux_loader::loader::KernelLoader;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::machine::bzimage::{self, BzImageError, LoadedBzImage};
use crate::machine::memory::MemoryLayout;

/// Guest memory a 32-bit (3G/1G) guest can map: the VMM's telemetry page
/// at the top of RAM must be inside it.
pub const ELF32_MAX_MEM_MIB: u64 = 768;

/// Largest kernel image accepted (the guest is well under a MiB).
pub const MAX_IMAGE_BYTES: u64 = 256 << 20;

const PT_LOAD: u32 = 1;
const PT_NOTE: u32 = 4;
const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;
const EM_X86_64: u16 = 62;
const EM_386: u16 = 3;

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

/// Errors loading the kernel image.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The image file could not be read.
    #[error("cannot read kernel image {path}: {source}")]
    Read {
        /// The image path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A termination signal arrived while the image was read (its number).
    #[error("{} while reading the kernel image", crate::signals::describe(*.0))]
    Interrupted(i32),
    /// The image is over [`MAX_IMAGE_BYTES`] (its name).
    #[error("kernel image {0} is larger than {MAX_IMAGE_BYTES} bytes")]
    TooLarge(String),
    /// No ELF magic (the image's name).
    #[error("kernel image {0} is not an ELF file (no \\x7fELF magic)")]
    NotElf(String),
    /// A 32-bit ELF that could not be parsed (the image's name, what is wrong).
    #[error("kernel image {0}: malformed ELF32 image ({1})")]
    Elf32(String, String),
    /// A 32-bit image with more than [`ELF32_MAX_MEM_MIB`] MiB of guest memory (the image's name).
    #[error(
        "{0} is a 32-bit guest, which maps only the first {ELF32_MAX_MEM_MIB} MiB \
         (the 3G/1G split); use --mem {ELF32_MAX_MEM_MIB} or less"
    )]
    Elf32TooMuchMemory(String),
    /// Not a little-endian x86 ELF (the image's name, ELF class, data encoding, machine).
    #[error("kernel image {0} is not a little-endian x86 ELF (class/data/machine = {1}/{2}/{3})")]
    WrongArch(String, u8, u8, u16),
    /// A malformed 64-bit ELF header or program header table (the image's name, what is wrong).
    #[error("kernel image {0}: malformed ELF header or program headers ({1})")]
    Malformed(String, &'static str),
    /// The image has no PT_LOAD segment (its name).
    #[error("kernel image {0} has no loadable segments")]
    NoSegments(String),
    /// A segment does not fit in usable guest RAM.
    #[error(
        "kernel image {image}: segment at {paddr:#x}..{end:#x} lies outside usable guest RAM \
         [{ram_start:#x}, {ram_end:#x}) with --mem {mem_mib} MiB"
    )]
    SegmentOutsideMemory {
        /// The image's name.
        image: String,
        /// Guest-physical start of the segment.
        paddr: u64,
        /// Guest-physical end of the segment (exclusive, memory size).
        end: u64,
        /// Start of the RAM range the kernel may occupy.
        ram_start: u64,
        /// End of that RAM range (exclusive).
        ram_end: u64,
        /// `--mem`, MiB.
        mem_mib: u64,
    },
    /// No PVH entry note (the image's name).
    #[error(
        "kernel image {0} has no PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY: type 18, name \"Xen\"); \
         ptiscope boots PVH kernels only"
    )]
    NoPvhNote(String),
    /// The PVH entry point lies in no loaded segment.
    #[error("kernel image {image}: PVH entry {entry:#x} is not inside a loaded segment")]
    EntryOutsideImage {
        /// The image's name.
        image: String,
        /// The entry point, guest-physical.
        entry: u64,
    },
    /// A bzImage that cannot be booted (the image's name, why).
    #[error("kernel image {0}: {1}")]
    BzImage(String, #[source] BzImageError),
    /// linux-loader refused the image (the image's name, its error).
    #[error("kernel image {0}: {1}")]
    Loader(String, #[source] linux_loader::loader::Error),
    /// linux-loader and the VMM's own reading of the PVH note disagree on
    /// the entry point (an image loaders could read differently).
    #[error("kernel image {image}: linux-loader found PVH entry {found:?}, the PVH note says {entry:#x}")]
    EntryDisagreement {
        /// The image's name.
        image: String,
        /// linux-loader's PVH entry, if it found one.
        found: Option<u64>,
        /// The entry of the PVH note the VMM read.
        entry: u64,
    },
    /// QEMU's ELF loader would find another PVH entry (or none, or crash)
    /// than linux-loader: it steps over notes aligned to the PT_NOTE's
    /// `p_align`, linux-loader (and the ELF standard) to 4 bytes. The
    /// backends would boot different code, so the image is refused on both.
    #[error(
        "kernel image {image}: a PT_NOTE segment has p_align {align:#x}; QEMU reads its notes \
         aligned to p_align (linux-loader to 4 bytes), so {qemu} instead of the PVH entry \
         {entry:#x} the note gives: the backends would boot different code. Give the note \
         segment p_align 4 (the ELF note alignment)"
    )]
    NoteAlign {
        /// The image's name.
        image: String,
        /// The segment's `p_align`.
        align: u64,
        /// What QEMU would do, in words.
        qemu: String,
        /// The entry linux-loader and ptiscope read.
        entry: u64,
    },
    /// The scratch memory of the dry-run load could not be allocated (the
    /// image's name, why).
    #[error("cannot allocate scratch memory to check kernel image {0}: {1}")]
    Scratch(String, String),
}

/// A loaded kernel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadedKernel {
    /// The 32-bit PVH entry point (a bzImage: its 64-bit entry).
    pub entry: u64,
    /// One past the highest byte any segment occupies.
    pub end: u64,
    /// A 64-bit Linux bzImage (None: a PVH ELF), for its boot_params and entry state.
    pub bzimage: Option<LoadedBzImage>,
}

#[derive(Clone, Copy)]
struct Segment {
    paddr: u64,
    filesz: u64,
    memsz: u64,
}

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(off..off + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(off..off + 8)?.try_into().ok()?))
}

/// The entry of a note segment's `XEN_ELFNOTE_PHYS32_ENTRY` note named
/// "Xen" (the first one, as linux-loader takes it), if it has one.
fn pvh_note_entry(mut notes: &[u8]) -> Option<u64> {
    // Sizes are guest-image data: computed in u64 so no sum can wrap.
    let align4 = |n: u32| u64::from(n).div_ceil(4) * 4;
    while let (Some(namesz), Some(descsz), Some(kind)) =
        (u32_at(notes, 0), u32_at(notes, 4), u32_at(notes, 8))
    {
        let name = notes.get(12..12 + namesz as usize);
        if kind == XEN_ELFNOTE_PHYS32_ENTRY && name == Some(b"Xen\0") && descsz >= 4 {
            let desc = usize::try_from(12 + align4(namesz)).ok()?;
            return u32_at(notes, desc).map(u64::from);
        }
        let next = usize::try_from(12 + align4(namesz) + align4(descsz)).ok()?;
        notes = notes.get(next..)?;
    }
    None
}

/// What QEMU's ELF loader (`load_elf`'s `get_elf_note_type` and x86's
/// `read_pvh_start_addr`, QEMU 4.0 to 10.0) takes from one PT_NOTE segment:
/// the first note of type XEN_ELFNOTE_PHYS32_ENTRY (whatever its name),
/// every size rounded up to `p_align`, the entry's low 32 bits (QEMU
/// passes a 32-bit entry to its PVH option ROM). `Err`: `p_align` 0, by
/// which QEMU divides. A walk that leaves the notes finds nothing (QEMU
/// reads on into its buffer; nothing to rely on).
fn qemu_note_entry(notes: &[u8], align: u64) -> Result<Option<u64>, &'static str> {
    if notes.is_empty() {
        return Ok(None);
    }
    if align == 0 {
        return Err("QEMU's ELF loader would divide by that 0 (it crashes)");
    }
    let up = |n: u32| u64::from(n).div_ceil(align).saturating_mul(align);
    let mut at: u64 = 0;
    loop {
        let header = usize::try_from(at).ok();
        let field = |off: u64| header.and_then(|h| u32_at(notes, h.checked_add(off as usize)?));
        let (Some(namesz), Some(descsz), Some(kind)) = (field(0), field(4), field(8)) else {
            return Ok(None);
        };
        if kind == XEN_ELFNOTE_PHYS32_ENTRY {
            let desc = at.saturating_add(12).saturating_add(up(namesz));
            return Ok(usize::try_from(desc)
                .ok()
                .and_then(|d| u32_at(notes, d))
                .map(u64::from));
        }
        let step = 12u64.saturating_add(up(namesz)).saturating_add(up(descsz));
        if step > notes.len() as u64 {
            return Ok(None);
        }
        at += step;
    }
}

/// Checks that QEMU would boot a PVH ELF (64- or 32-bit) at the entry
/// ptiscope (and linux-loader) read from it (notes 4-byte aligned), for an
/// image that has passed [`check_image`]. Called before QEMU starts
/// (`--backend qemu`); the VMM reads notes as linux-loader does and needs
/// no such check. Not an ELF: nothing to check.
pub fn check_qemu_pvh_note(image: &[u8], name: &str) -> Result<(), LoadError> {
    let elf64 = match image.get(..5) {
        Some([0x7f, b'E', b'L', b'F', 2]) => true,
        Some([0x7f, b'E', b'L', b'F', 1]) => false,
        _ => return Ok(()),
    };
    // (e_phoff, e_phentsize, e_phnum) and, per header, (p_offset, p_filesz,
    // p_align) where each class keeps them.
    let (phoff, phentsize, phnum) = if elf64 {
        (u64_at(image, 32), u16_at(image, 54), u16_at(image, 56))
    } else {
        (
            u32_at(image, 28).map(u64::from),
            u16_at(image, 42),
            u16_at(image, 44),
        )
    };
    let (Some(phoff), Some(phentsize), Some(phnum)) = (phoff, phentsize, phnum) else {
        return Ok(());
    };
    let field = |ph: &[u8], at64: usize, at32: usize| {
        if elf64 {
            u64_at(ph, at64)
        } else {
            u32_at(ph, at32).map(u64::from)
        }
    };
    // QEMU takes the entry of the last PT_NOTE segment that has one; so
    // does ptiscope, reading them 4-byte aligned.
    let mut qemu: Option<(u64, u64)> = None;
    let mut ours: Option<u64> = None;
    let mut refusal = None;
    let mut aligns = Vec::new();
    for i in 0..u64::from(phnum) {
        let Some(ph) = phoff
            .checked_add(i * u64::from(phentsize))
            .and_then(|o| usize::try_from(o).ok())
            .and_then(|o| image.get(o..o.checked_add(usize::from(phentsize))?))
        else {
            break;
        };
        if u32_at(ph, 0) != Some(PT_NOTE) {
            continue;
        }
        let (Some(off), Some(size), Some(align)) =
            (field(ph, 8, 4), field(ph, 32, 16), field(ph, 48, 28))
        else {
            continue;
        };
        let Some(notes) = usize::try_from(off)
            .ok()
            .zip(usize::try_from(size).ok())
            .and_then(|(o, n)| image.get(o..o.checked_add(n)?))
        else {
            continue;
        };
        aligns.push(align);
        if let Some(e) = pvh_note_entry(notes) {
            ours = Some(e);
        }
        match qemu_note_entry(notes, align) {
            Ok(Some(e)) => qemu = Some((e, align)),
            Ok(None) => {}
            Err(why) => {
                refusal.get_or_insert((align, why.to_string()));
            }
        }
    }
    // No PVH note of ptiscope's reading: check_image says so.
    let Some(entry) = ours else {
        return Ok(());
    };
    if let Some((align, qemu)) = refusal {
        return Err(LoadError::NoteAlign {
            image: name.to_string(),
            align,
            qemu,
            entry,
        });
    }
    let (qemu, align) = match qemu {
        Some((e, _)) if e == entry & 0xffff_ffff => return Ok(()),
        Some((e, align)) => (format!("QEMU would take PVH entry {e:#x}"), align),
        None => (
            "QEMU would find no PVH entry".to_string(),
            aligns.iter().copied().find(|&a| a != 4).unwrap_or(4),
        ),
    };
    Err(LoadError::NoteAlign {
        image: name.to_string(),
        align,
        qemu,
        entry,
    })
}

/// Whether the PVH entry lies inside a loaded segment (its memory size,
/// .bss included): checked for every image kind before anything boots, so
/// neither a vCPU nor QEMU is started at an address where no code was loaded.
fn check_entry(segs: &[Segment], entry: u64, name: &str) -> Result<(), LoadError> {
    if segs
        .iter()
        .any(|s| entry >= s.paddr && entry - s.paddr < s.memsz)
    {
        Ok(())
    } else {
        Err(LoadError::EntryOutsideImage {
            image: name.to_string(),
            entry,
        })
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

/// Checks the ELF header and the load segments against the memory layout;
/// returns the segments and the PVH entry (checked to be inside one).
fn check_elf(
    image: &[u8],
    name: &str,
    layout: &MemoryLayout,
) -> Result<(Vec<Segment>, u64), LoadError> {
    let malformed = |what| LoadError::Malformed(name.to_string(), what);
    if image.len() < 4 || &image[..4] != b"\x7fELF" {
        return Err(LoadError::NotElf(name.to_string()));
    }
    let class = *image.get(4).ok_or(malformed("truncated header"))?;
    let data = *image.get(5).ok_or(malformed("truncated header"))?;
    let machine = u16_at(image, 18).ok_or(malformed("truncated header"))?;
    if class == 1 && data == 1 && machine == EM_386 {
        let img = elf32_segments(image, name, layout)?;
        let segs: Vec<Segment> = img.segs.into_iter().map(|(seg, _)| seg).collect();
        check_entry(&segs, img.entry, name)?;
        return Ok((segs, img.entry));
    }
    if class != 2 || data != 1 || machine != EM_X86_64 {
        return Err(LoadError::WrongArch(name.to_string(), class, data, machine));
    }
    let phoff = u64_at(image, 32).ok_or(malformed("truncated header"))?;
    let phentsize = u16_at(image, 54).ok_or(malformed("truncated header"))?;
    let phnum = u16_at(image, 56).ok_or(malformed("truncated header"))?;
    if phentsize != 56 {
        return Err(malformed("program header size is not 56"));
    }
    // Look for the PVH note first: "not a PVH kernel" is the more useful
    // message for an arbitrary ELF (e.g. a host program) than where its
    // segments happen to be.
    // Every PT_NOTE segment's PVH entry (None: the segment has none), in
    // header order. linux-loader takes the answer of the last PT_NOTE
    // segment only, and another loader (QEMU's) may take the first: an
    // image on which they could disagree is refused.
    let mut note_segments: Vec<Option<u64>> = Vec::new();
    for i in 0..u64::from(phnum) {
        let Some(ph) = phoff
            .checked_add(i * 56)
            .and_then(|o| usize::try_from(o).ok())
            .and_then(|o| image.get(o..o.checked_add(56)?))
        else {
            return Err(malformed("program headers past the end of the file"));
        };
        if u32_at(ph, 0) == Some(PT_NOTE) {
            let off = u64_at(ph, 8).unwrap_or(0);
            let size = u64_at(ph, 32).unwrap_or(0);
            let notes = usize::try_from(off)
                .ok()
                .zip(usize::try_from(size).ok())
                .and_then(|(o, n)| image.get(o..o.checked_add(n)?));
            note_segments.push(notes.and_then(pvh_note_entry));
        }
    }
    let mut entries = note_segments.iter().flatten();
    let Some(&entry) = entries.next() else {
        return Err(LoadError::NoPvhNote(name.to_string()));
    };
    if entries.any(|&other| other != entry) {
        return Err(malformed(
            "PT_NOTE segments give different PVH entry points",
        ));
    }
    if note_segments.last().is_some_and(Option::is_none) {
        return Err(malformed(
            "the PVH note is not in the last PT_NOTE segment, the one linux-loader reads",
        ));
    }

    let mut segs = Vec::new();
    for i in 0..u64::from(phnum) {
        let off = phoff
            .checked_add(i * 56)
            .and_then(|o| usize::try_from(o).ok())
            .ok_or(malformed("program header offset overflows"))?;
        let ph = off
            .checked_add(56)
            .and_then(|end| image.get(off..end))
            .ok_or(malformed("program headers past the end of the file"))?;
        let p_type = u32_at(ph, 0).unwrap_or(0);
        if p_type != PT_LOAD {
            continue;
        }
        let p_offset = u64_at(ph, 8).unwrap_or(0);
        let seg = Segment {
            paddr: u64_at(ph, 24).unwrap_or(0),
            filesz: u64_at(ph, 32).unwrap_or(0),
            memsz: u64_at(ph, 40).unwrap_or(0),
        };
        if p_offset
            .checked_add(seg.filesz)
            .is_none_or(|end| end > image.len() as u64)
        {
            return Err(malformed("segment data past the end of the file"));
        }
        if seg.filesz > seg.memsz {
            return Err(malformed("segment file size larger than its memory size"));
        }
        if seg.memsz == 0 {
            continue;
        }
        if !layout.kernel_range_ok(seg.paddr, seg.memsz) {
            let ram = layout.e820()[1];
            return Err(LoadError::SegmentOutsideMemory {
                image: name.to_string(),
                paddr: seg.paddr,
                end: seg.paddr.saturating_add(seg.memsz),
                ram_start: ram.addr,
                ram_end: ram.end(),
                mem_mib: layout.mem_bytes() >> 20,
            });
        }
        segs.push(seg);
    }
    if segs.is_empty() {
        return Err(LoadError::NoSegments(name.to_string()));
    }
    check_entry(&segs, entry, name)?;
    Ok((segs, entry))
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
    let (segs, entry) = check_elf(image, &name, layout)?;
    let result = Elf::load(mem, None, &mut Cursor::new(image), None)
        .map_err(|e| LoadError::Loader(name.clone(), e))?;
    // check_elf refused images whose notes linux-loader could read
    // differently; this is the guard that they agree.
    let found = match result.pvh_boot_cap {
        PvhBootCapability::PvhEntryPresent(addr) => Some(addr.0),
        _ => None,
    };
    if found != Some(entry) {
        return Err(LoadError::EntryDisagreement {
            image: name,
            found,
            entry,
        });
    }
    // Segments with filesz < memsz: linux-loader copies file bytes only; the
    // rest (.bss) is already zero because guest memory is fresh anonymous
    // memory. check_elf checked the note's entry; this is linux-loader's.
    check_entry(&segs, entry, &name)?;
    let end = segs.iter().map(|s| s.paddr + s.memsz).max().unwrap_or(0);
    Ok(LoadedKernel {
        entry,
        end,
        bzimage: None,
    })
}

/// Whether `image` is a little-endian i386 ELF32 (the PAE guest flavour).
pub fn is_elf32(image: &[u8]) -> bool {
    image.len() > 20
        && &image[..4] == b"\x7fELF"
        && image[4] == 1
        && image[5] == 1
        && u16_at(image, 18) == Some(EM_386)
}

/// An ELF32 image's PT_LOAD segments with their file bytes, and its PVH entry.
struct Elf32Image<'a> {
    segs: Vec<(Segment, &'a [u8])>,
    entry: u64,
}

/// Reads and checks an ELF32 image against the memory layout.
fn elf32_segments<'a>(
    image: &'a [u8],
    name: &str,
    layout: &MemoryLayout,
) -> Result<Elf32Image<'a>, LoadError> {
    use object::elf::{PT_LOAD, PT_NOTE};
    use object::read::elf::{ElfFile32, FileHeader, ProgramHeader};
    use object::LittleEndian;

    let bad = |what: String| LoadError::Elf32(name.to_string(), what);
    if layout.mem_bytes() > ELF32_MAX_MEM_MIB << 20 {
        return Err(LoadError::Elf32TooMuchMemory(name.to_string()));
    }
    let file = ElfFile32::<LittleEndian>::parse(image).map_err(|e| bad(e.to_string()))?;
    let endian = file.endian();
    let headers = file
        .elf_header()
        .program_headers(endian, image)
        .map_err(|e| bad(e.to_string()))?;
    let mut entry = None;
    for ph in headers {
        if ph.p_type(endian) != PT_NOTE {
            continue;
        }
        let Ok(Some(mut notes)) = ph.notes(endian, image) else {
            continue;
        };
        while let Ok(Some(note)) = notes.next() {
            if note.name() == b"Xen" && note.n_type(endian).0 == XEN_ELFNOTE_PHYS32_ENTRY {
                if let Some(d) = note.desc().get(..4) {
                    entry = Some(u64::from(u32::from_le_bytes([d[0], d[1], d[2], d[3]])));
                }
            }
        }
    }
    let Some(entry) = entry else {
        return Err(LoadError::NoPvhNote(name.to_string()));
    };
    let mut segs = Vec::new();
    for ph in headers {
        if ph.p_type(endian) != PT_LOAD || ph.p_memsz(endian) == 0 {
            continue;
        }
        let seg = Segment {
            paddr: u64::from(ph.p_paddr(endian)),
            filesz: u64::from(ph.p_filesz(endian)),
            memsz: u64::from(ph.p_memsz(endian)),
        };
        if seg.filesz > seg.memsz {
            return Err(LoadError::Malformed(
                name.to_string(),
                "segment file size larger than its memory size",
            ));
        }
        let bytes = ph
            .data(endian, image)
            .map_err(|()| bad("segment data past the end of the file".into()))?;
        if !layout.kernel_range_ok(seg.paddr, seg.memsz) {
            let ram = layout.e820()[1];
            return Err(LoadError::SegmentOutsideMemory {
                image: name.to_string(),
                paddr: seg.paddr,
                end: seg.paddr.saturating_add(seg.memsz),
                ram_start: ram.addr,
                ram_end: ram.end(),
                mem_mib: layout.mem_bytes() >> 20,
            });
        }
        segs.push((seg, bytes));
    }
    if segs.is_empty() {
        return Err(LoadError::NoSegments(name.to_string()));
    }
    Ok(Elf32Image { segs, entry })
}

/// Loads an ELF32 PVH image: copies each PT_LOAD segment's file bytes to its
/// physical address (the rest of `memsz`, .bss, is already zero: guest
/// memory is fresh anonymous memory) and returns the PVH entry.
pub fn load_elf32(
    mem: &GuestMemoryMmap,
    layout: &MemoryLayout,
    name: &str,
    image: &[u8],
) -> Result<LoadedKernel, LoadError> {
    let Elf32Image { segs, entry } = elf32_segments(image, name, layout)?;
    let bare: Vec<Segment> = segs.iter().map(|(seg, _)| *seg).collect();
    check_entry(&bare, entry, name)?;
    for (seg, bytes) in &segs {
        mem.write_slice(bytes, GuestAddress(seg.paddr))
            .map_err(|e| {
                LoadError::Elf32(
                    name.to_string(),
                    format!("writing a segment at {:#x}: {e}", seg.paddr),
                )
            })?;
    }
    let end = bare.iter().map(|s| s.paddr + s.memsz).max().unwrap_or(0);
    Ok(LoadedKernel {
        entry,
        end,
        bzimage: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 image: one PT_LOAD at `paddr`, optionally a PVH note.
    pub(crate) fn tiny_elf(paddr: u64, entry: u32, pvh: bool) -> Vec<u8> {
        let mut f = vec![0u8; 0x200];
        f[..4].copy_from_slice(b"\x7fELF");
        f[4] = 2;
        f[5] = 1;
        f[6] = 1;
        f[16..18].copy_from_slice(&2u16.to_le_bytes());
        f[18..20].copy_from_slice(&EM_X86_64.to_le_bytes());
        f[24..32].copy_from_slice(&u64::from(entry).to_le_bytes());
        f[32..40].copy_from_slice(&64u64.to_le_bytes());
        f[52..54].copy_from_slice(&64u16.to_le_bytes());
        f[54..56].copy_from_slice(&56u16.to_le_bytes());
        let phnum: u16 = if pvh { 2 } else { 1 };
        f[56..58].copy_from_slice(&phnum.to_le_bytes());
        // PT_LOAD: file offset 0x100, 0x10 bytes.
        let ph = 64;
        f[ph..ph + 4].copy_from_slice(&PT_LOAD.to_le_bytes());
        f[ph + 8..ph + 16].copy_from_slice(&0x100u64.to_le_bytes());
        f[ph + 16..ph + 24].copy_from_slice(&paddr.to_le_bytes());
        f[ph + 24..ph + 32].copy_from_slice(&paddr.to_le_bytes());
        f[ph + 32..ph + 40].copy_from_slice(&0x10u64.to_le_bytes());
        f[ph + 40..ph + 48].copy_from_slice(&0x1000u64.to_le_bytes());
        f[0x100] = 0xf4; // hlt
        if pvh {
            let ph = 64 + 56;
            f[ph..ph + 4].copy_from_slice(&4u32.to_le_bytes()); // PT_NOTE
            f[ph + 8..ph + 16].copy_from_slice(&0x180u64.to_le_bytes());
            f[ph + 32..ph + 40].copy_from_slice(&20u64.to_le_bytes());
            put_note(&mut f, 0x180, XEN_ELFNOTE_PHYS32_ENTRY, entry);
        }
        f
    }

    /// Writes at `at` one ELF note named "Xen" of type `kind` whose 4-byte
    /// descriptor is `entry` (20 bytes).
    fn put_note(f: &mut [u8], at: usize, kind: u32, entry: u32) {
        f[at..at + 4].copy_from_slice(&4u32.to_le_bytes()); // namesz
        f[at + 4..at + 8].copy_from_slice(&4u32.to_le_bytes()); // descsz
        f[at + 8..at + 12].copy_from_slice(&kind.to_le_bytes());
        f[at + 12..at + 16].copy_from_slice(b"Xen\0");
        f[at + 16..at + 20].copy_from_slice(&entry.to_le_bytes());
    }

    /// A minimal ELF32 (i386) image: one PT_LOAD of 4 bytes at `paddr`
    /// (memsz 0x2000), a PVH note with `entry`.
    fn tiny_elf32(paddr: u32, entry: u32) -> Vec<u8> {
        let mut f = vec![0u8; 0x200];
        f[..4].copy_from_slice(b"\x7fELF");
        f[4] = 1; // ELFCLASS32
        f[5] = 1;
        f[6] = 1;
        f[16..18].copy_from_slice(&2u16.to_le_bytes());
        f[18..20].copy_from_slice(&EM_386.to_le_bytes());
        f[20..24].copy_from_slice(&1u32.to_le_bytes());
        f[24..28].copy_from_slice(&entry.to_le_bytes());
        f[28..32].copy_from_slice(&52u32.to_le_bytes()); // e_phoff
        f[40..42].copy_from_slice(&52u16.to_le_bytes());
        f[42..44].copy_from_slice(&32u16.to_le_bytes());
        f[44..46].copy_from_slice(&2u16.to_le_bytes());
        let ph = 52;
        f[ph..ph + 4].copy_from_slice(&PT_LOAD.to_le_bytes());
        f[ph + 4..ph + 8].copy_from_slice(&0x100u32.to_le_bytes());
        f[ph + 8..ph + 12].copy_from_slice(&(0xc000_0000 + paddr).to_le_bytes());
        f[ph + 12..ph + 16].copy_from_slice(&paddr.to_le_bytes());
        f[ph + 16..ph + 20].copy_from_slice(&4u32.to_le_bytes());
        f[ph + 20..ph + 24].copy_from_slice(&0x2000u32.to_le_bytes());
        f[0x100..0x104].copy_from_slice(&[0xfa, 0xf4, 0xeb, 0xfd]); // cli; hlt; jmp
        let ph = 52 + 32;
        f[ph..ph + 4].copy_from_slice(&PT_NOTE.to_le_bytes());
        f[ph + 4..ph + 8].copy_from_slice(&0x180u32.to_le_bytes());
        f[ph + 16..ph + 20].copy_from_slice(&20u32.to_le_bytes());
        put_note(&mut f, 0x180, XEN_ELFNOTE_PHYS32_ENTRY, entry);
        f
    }

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

    /// QEMU steps over notes by the PT_NOTE's p_align (and divides by
    /// it); an image it would enter elsewhere than linux-loader, or not at
    /// all, is refused before QEMU starts, for either ELF class, with the
    /// alignment named. What QEMU reads as the VMM does passes.
    #[test]
    fn qemu_must_read_the_pvh_note_where_the_vmm_does() {
        // Where each class keeps the PT_NOTE's p_align (its second header).
        let with_align = |mut img: Vec<u8>, align: u64| {
            if img[4] == 2 {
                img[64 + 56 + 48..64 + 56 + 56].copy_from_slice(&align.to_le_bytes());
            } else {
                img[52 + 32 + 28..52 + 32 + 32].copy_from_slice(&(align as u32).to_le_bytes());
            }
            img
        };
        let images = [
            tiny_elf(0x10_0000, 0x10_0000, true),
            tiny_elf32(0x10_0000, 0x10_0000),
        ];
        for img in images {
            for ok in [1, 2, 4] {
                check_qemu_pvh_note(&with_align(img.clone(), ok), "k").unwrap();
            }
            for (bad, says) in [
                (0, "divide"),
                (8, "no PVH entry"),
                (0x1000, "no PVH entry"),
                (u64::from(u32::MAX), "no PVH entry"),
            ] {
                let e = check_qemu_pvh_note(&with_align(img.clone(), bad), "k").unwrap_err();
                assert!(matches!(e, LoadError::NoteAlign { .. }), "{bad}: {e}");
                let text = e.to_string();
                assert!(
                    text.contains(says) && text.contains(&format!("p_align {bad:#x}")),
                    "{bad}: {text}"
                );
            }
        }
        // A note QEMU finds at another place: it takes another entry.
        let mut img = with_align(tiny_elf(0x10_0000, 0x10_0000, true), 8);
        // namesz 4 rounded to 8: QEMU reads the descriptor 4 bytes later.
        img[0x180 + 20..0x180 + 24].copy_from_slice(&0x10_0004u32.to_le_bytes());
        img[64 + 56 + 32..64 + 56 + 40].copy_from_slice(&24u64.to_le_bytes());
        let e = check_qemu_pvh_note(&img, "k").unwrap_err().to_string();
        assert!(e.contains("QEMU would take PVH entry 0x100004"), "{e}");
        // The embedded guests are read alike by both.
        check_qemu_pvh_note(crate::GUEST_I386, "i386").unwrap();
        check_qemu_pvh_note(crate::GUEST_X86_64, "x86_64").unwrap();
        // Not an ELF: nothing to check here.
        check_qemu_pvh_note(b"MZ", "pe").unwrap();
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
