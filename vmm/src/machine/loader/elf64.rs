//! ELF64 images: checked by hand (header, PVH notes, segments against the
//! memory layout), then loaded by linux-loader, whose PVH entry must agree.

use std::io::Cursor;

use linux_loader::loader::elf::{Elf, PvhBootCapability};
use linux_loader::loader::KernelLoader;
use vm_memory::GuestMemoryMmap;

use crate::machine::memory::MemoryLayout;

use crate::machine::loader::elf32::elf32_segments;
use crate::machine::loader::elf_fields::{
    u16_at, u32_at, u64_at, EM_386, EM_X86_64, PT_LOAD, PT_NOTE,
};
use crate::machine::loader::error::LoadError;
use crate::machine::loader::pvh_note::pvh_note_entry;
use crate::machine::loader::segments::{check_entry, check_in_memory, LoadedKernel, Segment};

/// Checks the ELF header and the load segments against the memory layout;
/// returns the segments and the PVH entry (checked to be inside one).
pub(super) fn check_elf(
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
        check_in_memory(layout, name, seg.paddr, seg.memsz)?;
        segs.push(seg);
    }
    if segs.is_empty() {
        return Err(LoadError::NoSegments(name.to_string()));
    }
    check_entry(&segs, entry, name)?;
    Ok((segs, entry))
}

/// Loads a checked ELF64 image through linux-loader; `name` is for messages.
pub(super) fn load_elf64(
    mem: &GuestMemoryMmap,
    layout: &MemoryLayout,
    name: String,
    image: &[u8],
) -> Result<LoadedKernel, LoadError> {
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
