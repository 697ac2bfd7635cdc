//! ELF32 (i386) images, the PAE guest flavour: read with the `object`
//! crate's ELF32 parser, the PT_LOAD segments copied to their physical
//! addresses, the entry taken from the PVH note.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::machine::memory::MemoryLayout;

use crate::machine::loader::elf_fields::{u16_at, EM_386, XEN_ELFNOTE_PHYS32_ENTRY};
use crate::machine::loader::error::{LoadError, ELF32_MAX_MEM_MIB};
use crate::machine::loader::segments::{check_entry, check_in_memory, LoadedKernel, Segment};

/// Whether `image` is a little-endian i386 ELF32 (the PAE guest flavour).
pub fn is_elf32(image: &[u8]) -> bool {
    image.len() > 20
        && &image[..4] == b"\x7fELF"
        && image[4] == 1
        && image[5] == 1
        && u16_at(image, 18) == Some(EM_386)
}

/// An ELF32 image's PT_LOAD segments with their file bytes, and its PVH entry.
pub(super) struct Elf32Image<'a> {
    pub(super) segs: Vec<(Segment, &'a [u8])>,
    pub(super) entry: u64,
}

/// Reads and checks an ELF32 image against the memory layout.
pub(super) fn elf32_segments<'a>(
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
        check_in_memory(layout, name, seg.paddr, seg.memsz)?;
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
