//! What can be wrong with a kernel image, and the limits the load holds it to.

use std::path::PathBuf;

use crate::machine::bzimage::BzImageError;

/// Guest memory a 32-bit (3G/1G) guest can map: the VMM's telemetry page
/// at the top of RAM must be inside it.
pub const ELF32_MAX_MEM_MIB: u64 = 768;

/// Largest kernel image accepted (the guest is well under a MiB).
pub const MAX_IMAGE_BYTES: u64 = 256 << 20;

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
