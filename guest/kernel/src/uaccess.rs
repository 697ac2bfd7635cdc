//! Checking user addresses before the kernel touches them. Its own module so
//! that the syscall table and the pipes (which the table calls) both use it
//! without importing each other.

use crate::arch::layout::{USER_STACK_TOP, USER_TEXT_BASE};
use crate::task::USER_STACK_LOW;
use core::sync::atomic::Ordering::Relaxed;

/// Whether `[addr, addr + len)` lies in user memory every address space
/// maps: the stacks (writable), or the text (read-only; only if `!write`).
pub fn user_range_ok(addr: u64, len: u64, write: bool) -> bool {
    let (_, text_pages) = crate::arch::user::section();
    let text = (USER_TEXT_BASE, USER_TEXT_BASE + text_pages * 4096);
    let stack = (USER_STACK_LOW.load(Relaxed) as u64, USER_STACK_TOP);
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    let within = |(s, e): (u64, u64)| addr >= s && end <= e;
    within(stack) || (!write && within(text))
}
