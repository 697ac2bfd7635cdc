//! A process's page tables in either paging mode: the operations the task
//! code needs, written once over [`guest_core::paging_mode::PagingMode`]
//! (each flavour's `paging::Mode` says which).

use crate::arch::cpu::has_nx;
use crate::arch::paging::Mode;
use crate::mm::{DirectMap, Frames};
use guest_core::paging::{MapError, UserSpec};
use guest_core::paging_mode::PagingMode;

/// What every address space shares of the kernel, in this flavour's form.
pub type KernelHalf = <Mode as PagingMode>::KernelHalf;

/// A process's table pair (PML4 or PDPT pair) for `user`, kernel half shared.
pub fn new_address_space(half: &KernelHalf, user: &UserSpec) -> Result<u64, MapError> {
    Mode::build_address_space(&mut DirectMap, &mut Frames, half, user, has_nx())
}

/// `arch_prctl(ARCH_SET_NOPTI, 1)` on the page tables of `pair`.
pub fn opt_out_of_pti(pair: u64, half: &KernelHalf) {
    Mode::opt_out_of_pti(&mut DirectMap, pair, half)
}

/// Maps a thread's stack page into the shared address space `pair`.
pub fn map_user_stack_page(pair: u64, va: u64, frame: u64) -> Result<(), MapError> {
    Mode::map_user_stack_page(&mut DirectMap, &mut Frames, pair, va, frame, has_nx())
}
