//! The PVH entry note, read as linux-loader reads it (notes 4-byte aligned)
//! and as QEMU's ELF loader does (aligned to the segment's `p_align`): an
//! image the two would enter at different places is refused before QEMU
//! starts.

use crate::machine::loader::elf_fields::{
    u16_at, u32_at, u64_at, PT_NOTE, XEN_ELFNOTE_PHYS32_ENTRY,
};
use crate::machine::loader::error::LoadError;

/// The entry of a note segment's `XEN_ELFNOTE_PHYS32_ENTRY` note named
/// "Xen" (the first one, as linux-loader takes it), if it has one.
pub(super) fn pvh_note_entry(mut notes: &[u8]) -> Option<u64> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::loader::test_images::{tiny_elf, tiny_elf32};

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
}
