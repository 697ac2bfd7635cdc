//! The two paging modes behind one interface: x86_64's 4-level tables
//! ([`FourLevel`], built by [`crate::paging`]) and x86_32's PAE tables
//! ([`Pae`], built by [`crate::pae`]). The kernel's address-space code and
//! the tests that hold for both flavours are written once over
//! [`PagingMode`]; what differs (table shapes, the kernel half's form, NX
//! being optional with PAE) stays in the two builders.

use crate::layout::DirectMap;
use crate::paging::{FrameSource, MapError, PhysMem, Translation, UserSpec};

/// One paging mode: how an address space's PTI pair is built and walked.
pub trait PagingMode {
    /// What every address space shares of the kernel: the kernel half's
    /// table entries for the kernel copy and for the user copy.
    type KernelHalf: Copy;
    /// The mode's name in messages (`4-level`, `PAE`).
    const NAME: &'static str;
    /// Where the kernel sees physical memory.
    const DIRECT_MAP: DirectMap;

    /// CR3 of an address space: `pair` is its 8 KiB-aligned table pair,
    /// `user` selects the user copy (bit 12); `pcid` and `noflush` must be
    /// 0/false where the mode has no PCID.
    fn cr3_value(pair: u64, user: bool, pcid: u64, noflush: bool) -> u64;

    /// A process's table pair: the user program and stacks of `user` in the
    /// user half, `half` shared. `nx`: whether the CPU has NX (PAE may lack
    /// it; 4-level tables always set it).
    fn build_address_space<M: PhysMem, F: FrameSource>(
        mem: &mut M,
        frames: &mut F,
        half: &Self::KernelHalf,
        user: &UserSpec,
        nx: bool,
    ) -> Result<u64, MapError>;

    /// Maps one user stack page (`va` to `phys`) into the pair.
    fn map_user_stack_page<M: PhysMem, F: FrameSource>(
        mem: &mut M,
        frames: &mut F,
        pair: u64,
        va: u64,
        phys: u64,
        nx: bool,
    ) -> Result<(), MapError>;

    /// `arch_prctl(ARCH_SET_NOPTI, 1)`: both copies map the whole kernel
    /// and the user half executable, so the CR3 switch changes nothing.
    fn opt_out_of_pti<M: PhysMem>(mem: &mut M, pair: u64, half: &Self::KernelHalf);

    /// Undoes [`PagingMode::opt_out_of_pti`].
    fn opt_in_to_pti<M: PhysMem>(mem: &mut M, pair: u64, half: &Self::KernelHalf);

    /// The MMU's walk from `root` (a CR3 without its flag bits) for `va`.
    fn translate<M: PhysMem>(mem: &M, root: u64, va: u64) -> Option<Translation>;
}

/// x86_64 4-level paging (PML4 pairs).
#[derive(Debug, Clone, Copy)]
pub struct FourLevel;

/// x86_32 PAE paging (PDPT pairs, 3G/1G).
#[derive(Debug, Clone, Copy)]
pub struct Pae;

impl PagingMode for FourLevel {
    type KernelHalf = crate::paging::KernelHalf;
    const NAME: &'static str = "4-level";
    const DIRECT_MAP: DirectMap = crate::layout::DIRECT_MAP;

    fn cr3_value(pair: u64, user: bool, pcid: u64, noflush: bool) -> u64 {
        crate::layout::cr3_value(pair, user, pcid, noflush)
    }
    fn build_address_space<M: PhysMem, F: FrameSource>(
        mem: &mut M,
        frames: &mut F,
        half: &Self::KernelHalf,
        user: &UserSpec,
        _nx: bool,
    ) -> Result<u64, MapError> {
        crate::paging::build_address_space(mem, frames, half, user)
    }
    fn map_user_stack_page<M: PhysMem, F: FrameSource>(
        mem: &mut M,
        frames: &mut F,
        pair: u64,
        va: u64,
        phys: u64,
        _nx: bool,
    ) -> Result<(), MapError> {
        crate::paging::map_user_stack_page(mem, frames, pair, va, phys)
    }
    fn opt_out_of_pti<M: PhysMem>(mem: &mut M, pair: u64, half: &Self::KernelHalf) {
        crate::paging::opt_out_of_pti(mem, pair, half)
    }
    fn opt_in_to_pti<M: PhysMem>(mem: &mut M, pair: u64, half: &Self::KernelHalf) {
        crate::paging::opt_in_to_pti(mem, pair, half)
    }
    fn translate<M: PhysMem>(mem: &M, root: u64, va: u64) -> Option<Translation> {
        crate::paging::translate(mem, root, va)
    }
}

impl PagingMode for Pae {
    type KernelHalf = crate::pae::KernelHalf;
    const NAME: &'static str = "PAE";
    const DIRECT_MAP: DirectMap = crate::pae::layout::DIRECT_MAP;

    fn cr3_value(pair: u64, user: bool, pcid: u64, noflush: bool) -> u64 {
        crate::pae::layout::cr3_value(pair, user, pcid, noflush)
    }
    fn build_address_space<M: PhysMem, F: FrameSource>(
        mem: &mut M,
        frames: &mut F,
        half: &Self::KernelHalf,
        user: &UserSpec,
        nx: bool,
    ) -> Result<u64, MapError> {
        crate::pae::build_address_space(mem, frames, half, user, nx)
    }
    fn map_user_stack_page<M: PhysMem, F: FrameSource>(
        mem: &mut M,
        frames: &mut F,
        pair: u64,
        va: u64,
        phys: u64,
        nx: bool,
    ) -> Result<(), MapError> {
        crate::pae::map_user_stack_page(mem, frames, pair, va, phys, nx)
    }
    fn opt_out_of_pti<M: PhysMem>(mem: &mut M, pair: u64, half: &Self::KernelHalf) {
        crate::pae::opt_out_of_pti(mem, pair, half)
    }
    fn opt_in_to_pti<M: PhysMem>(mem: &mut M, pair: u64, half: &Self::KernelHalf) {
        crate::pae::opt_in_to_pti(mem, pair, half)
    }
    fn translate<M: PhysMem>(mem: &M, root: u64, va: u64) -> Option<Translation> {
        crate::pae::translate(mem, root, va)
    }
}

#[cfg(test)]
mod tests {
    //! Properties that hold for both modes, written once over the trait.
    use super::*;
    use crate::layout::{USER_STACK_TOP, USER_TEXT_BASE};
    use std::collections::BTreeMap;

    #[derive(Default)]
    struct FakeMem(BTreeMap<(u64, usize), u64>);
    impl PhysMem for FakeMem {
        fn read(&self, table: u64, index: usize) -> u64 {
            *self.0.get(&(table, index)).unwrap_or(&0)
        }
        fn write(&mut self, table: u64, index: usize, value: u64) {
            self.0.insert((table, index), value);
        }
    }

    struct Bump(u64);
    impl FrameSource for Bump {
        fn frame(&mut self) -> Option<u64> {
            self.0 += 4096;
            Some(self.0 - 4096)
        }
        fn pair(&mut self) -> Option<u64> {
            self.0 = (self.0 + 8191) & !8191;
            let p = self.frame()?;
            self.frame()?;
            Some(p)
        }
    }

    const ENTRY: (u64, u64) = (0x10_2000, 0x10_5000);
    const ENTRY_TEXT_END: u64 = 0x10_3000;
    const KDATA: u64 = 0x11_8000;
    const TELEMETRY: u64 = 0x7ff_f000;

    fn user() -> UserSpec {
        UserSpec {
            text_phys: 0x12_0000,
            text_pages: 2,
            stack: [0x13_0000, 0x13_1000],
        }
    }

    /// With PTI the user copy maps the user half and the entry area but no
    /// other kernel data; the kernel copy maps both; opting out of PTI makes
    /// the copies alike, opting back in restores the isolation.
    fn isolation_holds<P: PagingMode>(mem: &mut FakeMem, frames: &mut Bump, half: P::KernelHalf) {
        let pair = P::build_address_space(mem, frames, &half, &user(), true).unwrap();
        let kernel_root = P::cr3_value(pair, false, 0, false) & !0xfff;
        let user_root = P::cr3_value(pair, true, 0, false) & !0xfff;
        let kdata = P::DIRECT_MAP.phys_to_virt(KDATA).unwrap();
        let entry = P::DIRECT_MAP.phys_to_virt(ENTRY.0).unwrap();
        let stack = USER_STACK_TOP - 4096;
        for root in [kernel_root, user_root] {
            assert!(
                P::translate(mem, root, USER_TEXT_BASE).is_some(),
                "{}",
                P::NAME
            );
            assert!(P::translate(mem, root, stack).is_some(), "{}", P::NAME);
            assert!(P::translate(mem, root, entry).is_some(), "{}", P::NAME);
        }
        assert!(
            P::translate(mem, kernel_root, kdata).is_some(),
            "{}",
            P::NAME
        );
        assert!(P::translate(mem, user_root, kdata).is_none(), "{}", P::NAME);
        P::opt_out_of_pti(mem, pair, &half);
        assert!(P::translate(mem, user_root, kdata).is_some(), "{}", P::NAME);
        P::opt_in_to_pti(mem, pair, &half);
        assert!(P::translate(mem, user_root, kdata).is_none(), "{}", P::NAME);
    }

    #[test]
    fn both_modes_isolate_alike() {
        let (mut mem, mut frames) = (FakeMem::default(), Bump(0x20_0000));
        let half = crate::paging::build_kernel_half(
            &mut mem,
            &mut frames,
            &crate::paging::KernelSpec {
                pti: true,
                entry_area: ENTRY,
                entry_text_end: ENTRY_TEXT_END,
                telemetry: TELEMETRY,
                direct_map: 64 << 20,
                deferred_text: (0, 0),
            },
        )
        .unwrap();
        isolation_holds::<FourLevel>(&mut mem, &mut frames, half);

        let (mut mem, mut frames) = (FakeMem::default(), Bump(0x20_0000));
        let half = crate::pae::build_kernel_half(
            &mut mem,
            &mut frames,
            &crate::pae::KernelSpec {
                pti: true,
                entry_area: ENTRY,
                entry_text_end: ENTRY_TEXT_END,
                text: (0x10_5000, 0x11_0000),
                global_text: false,
                nx: true,
                telemetry: TELEMETRY,
                direct_map: 64 << 20,
                deferred_text: (0, 0),
            },
        )
        .unwrap();
        isolation_holds::<Pae>(&mut mem, &mut frames, half);
    }
}
