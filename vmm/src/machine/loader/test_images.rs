//! Minimal hand-made kernel images for the loader's tests.

use crate::machine::loader::elf_fields::{
    EM_386, EM_X86_64, PT_LOAD, PT_NOTE, XEN_ELFNOTE_PHYS32_ENTRY,
};

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
pub(crate) fn put_note(f: &mut [u8], at: usize, kind: u32, entry: u32) {
    f[at..at + 4].copy_from_slice(&4u32.to_le_bytes()); // namesz
    f[at + 4..at + 8].copy_from_slice(&4u32.to_le_bytes()); // descsz
    f[at + 8..at + 12].copy_from_slice(&kind.to_le_bytes());
    f[at + 12..at + 16].copy_from_slice(b"Xen\0");
    f[at + 16..at + 20].copy_from_slice(&entry.to_le_bytes());
}

/// A minimal ELF32 (i386) image: one PT_LOAD of 4 bytes at `paddr`
/// (memsz 0x2000), a PVH note with `entry`.
pub(crate) fn tiny_elf32(paddr: u32, entry: u32) -> Vec<u8> {
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
