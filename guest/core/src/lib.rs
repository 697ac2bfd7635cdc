//! Pure logic of the ptiscope guest kernel.
//!
//! Everything here is `no_std`, free of `unsafe` and of hardware access, so
//! that it is unit-tested on the host (`cargo test -p guest-core`) and used
//! unchanged by the bare-metal kernel: the command-line parser, E820 memory-map
//! handling and the physical frame allocator, page-table entry encoding and the
//! builder of the PTI page-table pair, the virtual address-space layout, and
//! the pipe ring buffer and message format of `workload=sched-messaging`.
#![no_std]
#![forbid(unsafe_code)]

#[cfg(test)]
extern crate std;

pub mod cmdline;
pub mod layout;
pub mod memmap;
pub mod pae;
pub mod paging;
pub mod paging_mode;
pub mod pipe;
pub mod workingset;
