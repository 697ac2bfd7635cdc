//! Pure logic of the ptiscope guest kernel.
//!
//! Everything here is `no_std`, free of `unsafe` and of hardware access, so
//! that it is unit-tested on the host (`cargo test -p guest-core`) and used
//! unchanged by the bare-metal kernel (both flavours): the command-line parser
//! ([`cmdline`]), E820 memory-map handling and the physical frame allocator
//! ([`memmap`]), the page-table entry encoding both paging modes share
//! ([`pte`]), the PTI page-table pair written once over both paging modes
//! ([`pti`]) and the modes themselves: x86_64's 4-level paging ([`paging`],
//! layout in [`layout`]) and x86_32's PAE ([`pae`]), the
//! mapping of the `wss=`/`kwss=` working sets
//! ([`workingset`]), and the pipe ring buffer and message format of
//! `workload=sched-messaging` ([`pipe`]), and integers as text without
//! `core::fmt` for the boot lines ([`numfmt`]).
#![warn(missing_docs)]
#![no_std]
#![forbid(unsafe_code)]

#[cfg(test)]
extern crate std;

#[cfg(test)]
mod both_modes;

pub mod cmdline;
pub mod layout;
pub mod memmap;
pub mod numfmt;
pub mod pae;
pub mod paging;
pub mod pipe;
pub mod pte;
pub mod pti;
pub mod workingset;
