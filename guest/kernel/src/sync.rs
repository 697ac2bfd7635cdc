//! Kernel state shared between CPUs, each kind behind the type whose safety
//! argument holds on this SMP kernel:
//!
//! * [`SpinLock`]: a spin lock that owns its data (the scheduler with the
//!   pipes, the frame allocator): the data is reached only through a guard,
//!   and one guard exists at a time, whichever CPU holds it;
//! * [`TakeOnce`]: data handed out once, as `&'static mut` (the memory map
//!   kmain reads from the start info);
//! * [`SyncUnsafeCell`]: a cell whose every access is `unsafe` and says which
//!   protocol makes it exclusive, for the one piece of state on a measured
//!   path (the phase result, written by the phase markers between the VMM's
//!   begin and end, where a lock's instructions would be counted);
//! * per-CPU words live in each CPU's record (`arch::percpu`), reached through
//!   its segment register; single words that any CPU may touch are atomics.
//!
//! Interrupts are off in the kernel and in user mode (RFLAGS = 0x2); the one
//! interrupt, the wake-up IPI, is taken only in the idle wait and its
//! handler takes no lock, so no CPU is ever interrupted by code that wants a
//! lock it holds: a spin lock needs no interrupt masking here.
use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicBool, Ordering};

/// A spin lock that owns its data. `repr(C)`, the data first: a static
/// lock's data then starts at the static's address, laid out as the data
/// alone would be (the measured code indexes it with the same offsets).
#[repr(C)]
pub struct SpinLock<T> {
    value: UnsafeCell<T>,
    locked: AtomicBool,
}

// SAFETY: the value is reached only through a `SpinGuard`, and `acquire`
// lets one guard exist at a time across all CPUs (Acquire on taking the
// lock, Release on giving it back, so each holder sees the previous one's
// writes). `T: Send` because the holder may be any CPU.
unsafe impl<T: Send> Sync for SpinLock<T> {}

impl<T> SpinLock<T> {
    pub const fn new(value: T) -> Self {
        SpinLock {
            value: UnsafeCell::new(value),
            locked: AtomicBool::new(false),
        }
    }

    /// Takes the lock (spinning while another CPU holds it); it is given
    /// back when the guard is dropped.
    #[inline]
    pub fn lock(&self) -> SpinGuard<'_, T> {
        self.acquire();
        SpinGuard { lock: self }
    }

    #[inline]
    fn acquire(&self) {
        // Test-and-test-and-set: spin on a plain load, not on the swap.
        while self.locked.swap(true, Ordering::Acquire) {
            while self.locked.load(Ordering::Relaxed) {
                core::hint::spin_loop();
            }
        }
    }

    #[inline]
    fn release(&self) {
        self.locked.store(false, Ordering::Release);
    }
}

/// The lock of a [`SpinLock`], held: derefs to the data, gives the lock
/// back when dropped.
pub struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: this guard holds the lock: no other reference to the
        // value exists on any CPU.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as for `deref`, and `&mut self` makes it the only one here.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.release()
    }
}

/// A [`SpinLock`] in a static, named by a type, so that its guard
/// ([`StaticGuard`]) can be zero-sized and reach the data at its fixed
/// address. The scheduler's lock is one: its methods are compiled for that
/// address (a guard holding a pointer, passed by reference, would make each
/// of them load it and index from it: more instructions on every context
/// switch, which the measured workloads count).
pub trait StaticLock: 'static {
    type Data: Send + 'static;
    /// The static lock.
    fn get() -> &'static SpinLock<Self::Data>;
}

/// The lock of a [`StaticLock`], held (see [`SpinGuard`]).
pub struct StaticGuard<L: StaticLock> {
    /// Only [`StaticGuard::lock`] makes one.
    held: core::marker::PhantomData<L>,
}

impl<L: StaticLock> StaticGuard<L> {
    /// Takes the lock (spinning while another CPU holds it).
    #[inline]
    pub fn lock() -> Self {
        L::get().acquire();
        StaticGuard {
            held: core::marker::PhantomData,
        }
    }

    /// Gives the lock back while `f` runs and takes it again afterwards:
    /// the scheduler's switch to another context and its idle wait. The
    /// guard is borrowed for the call, so no reference into the data lives
    /// across it; a raw pointer `f` writes through must point at data that
    /// no other CPU touches (the scheduler's: a pinned task's saved stack
    /// pointer, which only its own CPU reads or writes).
    #[inline]
    pub fn unlocked<R>(&mut self, f: impl FnOnce() -> R) -> R {
        L::get().release();
        let r = f();
        L::get().acquire();
        r
    }
}

impl<L: StaticLock> Deref for StaticGuard<L> {
    type Target = L::Data;
    #[inline]
    fn deref(&self) -> &L::Data {
        // SAFETY: this guard holds the lock (it exists only between `lock`
        // and its drop, and `unlocked` borrows it mutably).
        unsafe { &*L::get().value.get() }
    }
}

impl<L: StaticLock> DerefMut for StaticGuard<L> {
    #[inline]
    fn deref_mut(&mut self) -> &mut L::Data {
        // SAFETY: as for `deref`, and `&mut self` makes it the only one here.
        unsafe { &mut *L::get().value.get() }
    }
}

impl<L: StaticLock> Drop for StaticGuard<L> {
    #[inline]
    fn drop(&mut self) {
        L::get().release()
    }
}

/// Data guarded by a [`StaticLock`] that lives elsewhere (as Linux's Rust
/// `LockedBy`): reached only with that lock held, through its guard. For
/// data that belongs under another lock but must stay an object of its own
/// (the pipe table under the scheduler lock: in the scheduler's static,
/// the compiler could no longer tell a pipe's wait queue from the task table
/// it links, and the measured pipe paths would grow).
pub struct LockedBy<L: StaticLock, T> {
    value: UnsafeCell<T>,
    owner: core::marker::PhantomData<L>,
}

// SAFETY: the value is reached only through `with_owner`, which needs the
// owner's guard borrowed mutably: one CPU at a time (the lock's holder),
// once at a time on it. `T: Send` because the holder may be any CPU.
unsafe impl<L: StaticLock, T: Send> Sync for LockedBy<L, T> {}

impl<L: StaticLock, T> LockedBy<L, T> {
    pub const fn new(value: T) -> Self {
        LockedBy {
            value: UnsafeCell::new(value),
            owner: core::marker::PhantomData,
        }
    }

    /// The owner's data and this value at once, for as long as the guard
    /// is borrowed.
    #[inline(always)]
    pub fn with_owner<'a>(&'a self, guard: &'a mut StaticGuard<L>) -> (&'a mut L::Data, &'a mut T) {
        // SAFETY: the guard holds `L`'s lock, and borrowing it mutably for
        // 'a makes these the only references to either value (a second
        // call needs the guard again).
        (&mut **guard, unsafe { &mut *self.value.get() })
    }
}

/// Data handed out once as `&'static mut`, to whoever asks first.
pub struct TakeOnce<T> {
    taken: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: `take` hands out the one reference at most once (the swap decides
// which caller gets it); `T: Send` because that caller may be any CPU.
unsafe impl<T: Send> Sync for TakeOnce<T> {}

impl<T> TakeOnce<T> {
    pub const fn new(value: T) -> Self {
        TakeOnce {
            taken: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// The value, the first time; `None` afterwards.
    #[allow(clippy::mut_from_ref, reason = "handed out once: see the swap")]
    pub fn take(&'static self) -> Option<&'static mut T> {
        if self.taken.swap(true, Ordering::AcqRel) {
            return None;
        }
        // SAFETY: the swap above returned false once only: no other
        // reference to the value was or will be handed out.
        Some(unsafe { &mut *self.value.get() })
    }
}

/// A cell without a lock whose accesses are all `unsafe` (as core's
/// unstable `SyncUnsafeCell`): each one must be exclusive by a protocol its
/// static's comment states, with the happens-before edge that orders it
/// after the previous access (a lock taken in between, a Release/Acquire
/// pair). For state on a measured path only, where a lock would add
/// counted instructions.
pub struct SyncUnsafeCell<T>(UnsafeCell<T>);

// SAFETY: sharing the cell only shares the right to call `get`, which is
// `unsafe`: its callers guarantee that accesses do not overlap and are
// ordered. `T: Send` because successive accesses may be on different CPUs.
unsafe impl<T: Send> Sync for SyncUnsafeCell<T> {}

impl<T> SyncUnsafeCell<T> {
    pub const fn new(value: T) -> Self {
        SyncUnsafeCell(UnsafeCell::new(value))
    }

    /// # Safety
    /// No other reference to the value may be live, on this CPU or another,
    /// and the previous access must happen before this one.
    #[allow(clippy::mut_from_ref)]
    #[inline(always)]
    pub unsafe fn get(&self) -> &mut T {
        // SAFETY: delegated to the caller.
        unsafe { &mut *self.0.get() }
    }
}
