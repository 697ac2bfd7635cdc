//! Guest-physical memory: size bounds, the fixed layout of boot structures,
//! the E820 map and the telemetry reservation (docs/design.md).

use vm_memory::{GuestAddress, GuestMemoryMmap};

/// `hvm_start_info`.
pub const START_INFO_ADDR: u64 = 0x6000;
/// A Linux guest's PVH module list (`hvm_modlist_entry`: its initramfs).
pub const MODLIST_ADDR: u64 = 0x6800;
/// The E820 memory map (`hvm_memmap_table_entry` array).
pub const MEMMAP_ADDR: u64 = 0x7000;
/// The guest command line.
pub const CMDLINE_ADDR: u64 = 0x2_0000;
/// Largest command line, terminating NUL included.
pub const CMDLINE_MAX: usize = 4096;
/// End of conventional low memory.
pub const LOW_RAM_END: u64 = 640 << 10;
/// Start of RAM above the legacy hole; the kernel is linked here.
pub const HIGH_RAM_START: u64 = 1 << 20;
/// Smallest `--mem` (MiB): kernel, page tables, stacks and workloads need room.
pub const MIN_MEM_MIB: u64 = 16;
/// Largest `--mem` (MiB): the guest maps only the first GiB of physical memory.
pub const MAX_MEM_MIB: u64 = 1024;
/// Default `--mem` (MiB).
pub const DEFAULT_MEM_MIB: u64 = 128;

/// E820 types used here.
pub const E820_RAM: u32 = 1;
/// E820 type 2: reserved, not usable by the guest.
pub const E820_RESERVED: u32 = 2;

// Boot structures sit in low RAM and do not overlap each other
// (hvm_start_info is 56 bytes, a module list entry 32, a memmap entry 24;
// the map has 4 entries with the ACPI tables' reservation).
const _: () = assert!(START_INFO_ADDR + 56 <= MODLIST_ADDR);
const _: () = assert!(MODLIST_ADDR + 32 <= MEMMAP_ADDR);
const _: () = assert!(MEMMAP_ADDR + 4 * 24 <= CMDLINE_ADDR);
const _: () = assert!(CMDLINE_ADDR + CMDLINE_MAX as u64 <= LOW_RAM_END);

/// One E820 range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct E820Entry {
    /// Guest-physical start.
    pub addr: u64,
    /// Length, bytes.
    pub size: u64,
    /// E820 type ([`E820_RAM`] or [`E820_RESERVED`]).
    pub kind: u32,
}

impl E820Entry {
    /// First guest-physical address past the range.
    pub fn end(&self) -> u64 {
        self.addr + self.size
    }
}

/// Errors choosing the memory size or creating guest memory.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// `--mem` below [`MIN_MEM_MIB`] (the value asked, MiB).
    #[error("--mem {0} MiB is too small: at least {MIN_MEM_MIB} MiB are needed")]
    TooSmall(u64),
    /// `--mem` above [`MAX_MEM_MIB`] (the value asked, MiB).
    #[error(
        "--mem {0} MiB is too large: at most {MAX_MEM_MIB} MiB (the guest maps only the first GiB)"
    )]
    TooLarge(u64),
    /// The host refused the guest memory mapping.
    #[error("could not allocate {mib} MiB of guest memory: {source}")]
    Allocate {
        /// Size asked, MiB.
        mib: u64,
        /// The allocation error.
        #[source]
        source: vm_memory::mmap::FromRangesError,
    },
}

/// Where everything goes for a given memory size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLayout {
    mem_bytes: u64,
}

impl MemoryLayout {
    /// Validates `mib` against [`MIN_MEM_MIB`]..=[`MAX_MEM_MIB`].
    pub fn new(mib: u64) -> Result<Self, MemoryError> {
        if mib < MIN_MEM_MIB {
            return Err(MemoryError::TooSmall(mib));
        }
        if mib > MAX_MEM_MIB {
            return Err(MemoryError::TooLarge(mib));
        }
        Ok(MemoryLayout {
            mem_bytes: mib << 20,
        })
    }

    /// Total guest memory in bytes.
    pub fn mem_bytes(&self) -> u64 {
        self.mem_bytes
    }

    /// The telemetry region: the last page of RAM, reserved in the E820 map.
    pub fn telemetry_addr(&self) -> u64 {
        self.mem_bytes - ptiscope_abi::telemetry::REGION_SIZE
    }

    /// Where a Linux initrd of `size` bytes goes (both boot paths): as
    /// high as it fits below `limit` (the end of usable RAM, or lower where
    /// the kernel says so), on a page boundary, not below `kernel_end`;
    /// `None` when it does not fit.
    pub fn initrd_address(&self, size: u64, kernel_end: u64, limit: u64) -> Option<u64> {
        limit
            .min(self.telemetry_addr())
            .checked_sub(size)
            .map(|a| a & !0xfff)
            .filter(|a| *a >= kernel_end)
    }

    /// The E820 map handed to the guest.
    pub fn e820(&self) -> [E820Entry; 3] {
        let tele = self.telemetry_addr();
        [
            E820Entry {
                addr: 0,
                size: LOW_RAM_END,
                kind: E820_RAM,
            },
            E820Entry {
                addr: HIGH_RAM_START,
                size: tele - HIGH_RAM_START,
                kind: E820_RAM,
            },
            E820Entry {
                addr: tele,
                size: ptiscope_abi::telemetry::REGION_SIZE,
                kind: E820_RESERVED,
            },
        ]
    }

    /// Whether `[addr, addr + size)` may hold kernel segments: inside usable
    /// RAM above 1 MiB (low memory holds the boot structures the VMM writes).
    pub fn kernel_range_ok(&self, addr: u64, size: u64) -> bool {
        let ram = self.e820()[1];
        match addr.checked_add(size) {
            Some(end) => addr >= ram.addr && end <= ram.end(),
            None => false,
        }
    }

    /// Anonymous, zero-filled guest memory covering `[0, mem)`. The legacy
    /// hole is backed too (it is simply not advertised as RAM), which keeps
    /// the memory a single KVM slot.
    pub fn create_guest_memory(&self) -> Result<GuestMemoryMmap, MemoryError> {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), self.mem_bytes as usize)]).map_err(
            |source| MemoryError::Allocate {
                mib: self.mem_bytes >> 20,
                source,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_name_the_limit() {
        let e = MemoryLayout::new(15).unwrap_err().to_string();
        assert!(e.contains("at least 16 MiB"), "{e}");
        let e = MemoryLayout::new(1025).unwrap_err().to_string();
        assert!(e.contains("at most 1024 MiB"), "{e}");
        assert!(MemoryLayout::new(16).is_ok());
        assert!(MemoryLayout::new(1024).is_ok());
    }

    #[test]
    fn e820_and_telemetry_for_128_mib() {
        let l = MemoryLayout::new(128).unwrap();
        assert_eq!(l.telemetry_addr(), 0x7fff000);
        let m = l.e820();
        assert_eq!(
            m,
            [
                E820Entry {
                    addr: 0,
                    size: 0xa0000,
                    kind: E820_RAM
                },
                E820Entry {
                    addr: 0x100000,
                    size: 0x7fff000 - 0x100000,
                    kind: E820_RAM
                },
                E820Entry {
                    addr: 0x7fff000,
                    size: 0x1000,
                    kind: E820_RESERVED
                },
            ]
        );
    }

    #[test]
    fn kernel_ranges() {
        let l = MemoryLayout::new(16).unwrap();
        assert!(l.kernel_range_ok(0x100000, 0x1000));
        assert!(
            !l.kernel_range_ok(0x9f000, 0x1000),
            "low memory is for boot data"
        );
        assert!(
            !l.kernel_range_ok(l.telemetry_addr() - 0x800, 0x1000),
            "telemetry page"
        );
        assert!(!l.kernel_range_ok(u64::MAX - 1, 4), "overflow");
    }

    #[test]
    fn guest_memory_is_zeroed() {
        use vm_memory::Bytes;
        let l = MemoryLayout::new(16).unwrap();
        let m = l.create_guest_memory().unwrap();
        let v: u64 = m.read_obj(GuestAddress(l.telemetry_addr())).unwrap();
        assert_eq!(v, 0);
    }
}
