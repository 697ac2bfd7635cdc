//! Virtual address-space layout of the x86_64 guest (4-level paging).
//!
//! ```text
//! 0x0000_0000_0040_0000  USER_TEXT_BASE   user programs (the image's .user section)
//! 0x0000_0000_0060_0000  USER_STACK_TOP   top of the per-process user stack
//! 0xffff_ffff_8000_0000  KERNEL_BASE      phys 0..1 GiB (2 MiB pages); the image at +1 MiB
//! 0xffff_ffff_c000_0000  TELEMETRY_VA     the telemetry page (4 KiB), fixed so that the
//!                                         entry code can count with one `incq abs32`
//! ```
//! The kernel half lives in PML4 slot 511; user space is PML4 slot 0.

/// Virtual address of physical address 0 in the kernel's direct map.
pub const KERNEL_BASE: u64 = 0xffff_ffff_8000_0000;
/// Bytes of physical memory reachable through the direct map at [`KERNEL_BASE`].
pub const DIRECT_MAP_SIZE: u64 = 1 << 30;
/// Fixed virtual address of the telemetry page (counters live here).
pub const TELEMETRY_VA: u64 = KERNEL_BASE + DIRECT_MAP_SIZE;
/// Where the user programs' text is linked and mapped.
pub const USER_TEXT_BASE: u64 = 0x40_0000;
/// Top of each process's user stack (the stack grows down from here).
pub const USER_STACK_TOP: u64 = 0x60_0000;
/// Pages of user stack per process.
pub const USER_STACK_PAGES: u64 = 2;
/// Physical address where the kernel image starts (PVH loads it here).
pub const KERNEL_PHYS_BASE: u64 = 0x10_0000;

/// CR3 bit that selects the user copy of a PTI page-table pair (+4 KiB).
pub const PTI_USER_PGTABLE_BIT: u64 = 1 << 12;
/// PCID bit that marks the user copy's address-space id (as Linux, bit 11).
pub const PTI_USER_PCID_BIT: u64 = 1 << 11;
/// CR3 bit 63: do not flush the TLB entries of the new PCID (needs CR4.PCIDE).
pub const CR3_NOFLUSH: u64 = 1 << 63;
/// Mask of the PCID in CR3.
pub const CR3_PCID_MASK: u64 = 0xfff;

/// A flavour's direct map: physical `0..size` at virtual `base`. Both
/// flavours translate through it (x86_64: [`DIRECT_MAP`]; PAE:
/// `crate::pae::layout::DIRECT_MAP`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectMap {
    /// Virtual address of physical 0.
    pub base: u64,
    /// Bytes of physical memory mapped, from 0.
    pub size: u64,
}

impl DirectMap {
    /// Kernel virtual address of a physical address in the direct map, if reachable.
    pub const fn phys_to_virt(self, phys: u64) -> Option<u64> {
        if phys < self.size {
            Some(self.base + phys)
        } else {
            None
        }
    }

    /// Physical address of a direct-map virtual address, if it is one.
    pub const fn virt_to_phys(self, virt: u64) -> Option<u64> {
        if virt >= self.base && virt - self.base < self.size {
            Some(virt - self.base)
        } else {
            None
        }
    }
}

/// The x86_64 direct map.
pub const DIRECT_MAP: DirectMap = DirectMap {
    base: KERNEL_BASE,
    size: DIRECT_MAP_SIZE,
};

/// Kernel virtual address of a physical address in the direct map, if reachable.
pub const fn phys_to_virt(phys: u64) -> Option<u64> {
    DIRECT_MAP.phys_to_virt(phys)
}

/// Physical address of a direct-map virtual address, if it is one.
pub const fn virt_to_phys(virt: u64) -> Option<u64> {
    DIRECT_MAP.virt_to_phys(virt)
}

/// CR3 value for an address space: `pair` is the 8 KiB-aligned physical address
/// of its PML4 pair, `user` selects the user copy, `pcid` is the kernel PCID
/// (0 when PCID is off), `noflush` sets bit 63 (only valid with PCID).
pub const fn cr3_value(pair: u64, user: bool, pcid: u64, noflush: bool) -> u64 {
    let mut v = pair & !0x1fff;
    v |= pcid & CR3_PCID_MASK;
    if user {
        v |= PTI_USER_PGTABLE_BIT;
        if pcid != 0 {
            v |= PTI_USER_PCID_BIT;
        }
    }
    if noflush {
        v |= CR3_NOFLUSH;
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_map_round_trip_and_bounds() {
        assert_eq!(phys_to_virt(0x10_0000), Some(0xffff_ffff_8010_0000));
        assert_eq!(virt_to_phys(0xffff_ffff_8010_0000), Some(0x10_0000));
        assert_eq!(phys_to_virt(DIRECT_MAP_SIZE), None);
        assert_eq!(virt_to_phys(TELEMETRY_VA), None);
        assert_eq!(virt_to_phys(USER_TEXT_BASE), None);
    }

    #[test]
    fn cr3_values_follow_linux_bits() {
        let pair = 0x20_2000;
        assert_eq!(cr3_value(pair, false, 0, false), 0x20_2000);
        assert_eq!(cr3_value(pair, true, 0, false), 0x20_3000);
        // PCID 1 for the kernel, 0x801 for the user copy, NOFLUSH on request.
        assert_eq!(cr3_value(pair, false, 1, true), 0x8000_0000_0020_2001);
        assert_eq!(cr3_value(pair, true, 1, false), 0x20_3801);
        // A misaligned pair address is masked down to the 8 KiB pair base.
        assert_eq!(cr3_value(0x20_3000, false, 0, false), 0x20_2000);
    }

    #[test]
    fn telemetry_va_is_abs32_addressable() {
        // The entry code uses `incq TELEMETRY_VA+off` with a sign-extended disp32.
        assert!(TELEMETRY_VA as i64 >= i32::MIN as i64);
        assert!((TELEMETRY_VA + 4096) as i64 <= 0);
    }
}
