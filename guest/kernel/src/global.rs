//! A static cell for kernel state that the boot sets up, shared by the
//! modules that keep such state (its own module, so that none of them
//! imports another just for the cell).
use core::cell::UnsafeCell;

/// A cell for boot-initialised kernel state. There is one CPU and no
/// interrupt handler touches these, so accesses never overlap.
pub struct Global<T>(UnsafeCell<T>);
// SAFETY: one CPU, no preemption; see the type's comment.
unsafe impl<T> Sync for Global<T> {}
impl<T> Global<T> {
    pub const fn new(v: T) -> Self {
        Global(UnsafeCell::new(v))
    }
    /// # Safety
    /// No other reference to the value may be live.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn get(&self) -> &mut T {
        // SAFETY: delegated to the caller.
        unsafe { &mut *self.0.get() }
    }
}
