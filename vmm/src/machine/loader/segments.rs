//! What a load places: the loadable segments, the check that the entry lies
//! in one, and the loaded kernel it yields.

use crate::machine::bzimage::LoadedBzImage;
use crate::machine::memory::MemoryLayout;

use crate::machine::loader::error::LoadError;

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
pub(super) struct Segment {
    pub(super) paddr: u64,
    pub(super) filesz: u64,
    pub(super) memsz: u64,
}

/// Whether the PVH entry lies inside a loaded segment (its memory size,
/// .bss included): checked for every image kind before anything boots, so
/// neither a vCPU nor QEMU is started at an address where no code was loaded.
pub(super) fn check_entry(segs: &[Segment], entry: u64, name: &str) -> Result<(), LoadError> {
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

/// Whether a segment of `memsz` bytes at `paddr` lies in the guest's RAM
/// where a kernel may be loaded (both ELF kinds check every segment so).
pub(super) fn check_in_memory(
    layout: &MemoryLayout,
    name: &str,
    paddr: u64,
    memsz: u64,
) -> Result<(), LoadError> {
    if layout.kernel_range_ok(paddr, memsz) {
        return Ok(());
    }
    let ram = layout.e820()[1];
    Err(LoadError::SegmentOutsideMemory {
        image: name.to_string(),
        paddr,
        end: paddr.saturating_add(memsz),
        ram_start: ram.addr,
        ram_end: ram.end(),
        mem_mib: layout.mem_bytes() >> 20,
    })
}
