//! The ELF fields the loader reads by hand (both classes): little-endian
//! readers at an offset and the constants they are compared with.

pub(super) const PT_LOAD: u32 = 1;
pub(super) const PT_NOTE: u32 = 4;
pub(super) const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;
pub(super) const EM_X86_64: u16 = 62;
pub(super) const EM_386: u16 = 3;

pub(super) fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(off..off + 2)?.try_into().ok()?))
}
pub(super) fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}
pub(super) fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(off..off + 8)?.try_into().ok()?))
}
