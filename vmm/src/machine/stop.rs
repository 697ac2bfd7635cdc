//! The run's stop state, one object owned by the run and shared by its
//! vCPU threads and the watchdog (as cloud-hypervisor's `CpuManager` keeps
//! the kill signal and the exit event together): the kill flag, why the
//! watchdog stopped the run, which vCPU stopped it first, which vCPU
//! threads have finished, every vCPU's exit total, and the eventfd that
//! wakes the watchdog.
//!
//! The protocol: the watchdog records its reason ([`StopState::watchdog_stop`])
//! and kills; a vCPU whose guest stopped (an exit, a fault) claims the
//! first stop ([`StopState::guest_stopped`]), which kills the others too;
//! every vCPU thread marks itself finished ([`StopState::finish`]) on its
//! way out, which wakes the watchdog.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use vmm_sys_util::eventfd::EventFd;

use crate::machine::outcome::StopReason;

/// See the module docs.
pub struct StopState {
    /// Set when every vCPU should leave its run loop.
    kill: AtomicBool,
    /// Why the watchdog stopped the run (None: it did not).
    watchdog_reason: Mutex<Option<StopReason>>,
    /// The vCPU whose own stop ended the run (None: the watchdog ended it).
    first_stop: Mutex<Option<usize>>,
    /// Each vCPU's thread has left its run loop (the watchdog stops kicking it).
    finished: Vec<AtomicBool>,
    /// Some vCPU's thread has left its run loop (the watchdog's cue).
    any_finished: AtomicBool,
    /// Each vCPU thread's id, set by the thread itself, for kicks.
    threads: Vec<OnceLock<libc::pthread_t>>,
    /// Userspace exits so far of every vCPU, by index (each vCPU writes
    /// its own slot; observers sum them).
    exit_totals: Vec<AtomicU64>,
    /// Written when a vCPU thread finishes, to wake the watchdog's event loop.
    done: EventFd,
}

impl StopState {
    /// The state of a run of `vcpus` vCPUs; `done` is the eventfd the
    /// watchdog's event loop watches.
    pub fn new(vcpus: usize, done: EventFd) -> Self {
        StopState {
            kill: AtomicBool::new(false),
            watchdog_reason: Mutex::new(None),
            first_stop: Mutex::new(None),
            finished: (0..vcpus).map(|_| AtomicBool::new(false)).collect(),
            any_finished: AtomicBool::new(false),
            threads: (0..vcpus).map(|_| OnceLock::new()).collect(),
            exit_totals: (0..vcpus).map(|_| AtomicU64::new(0)).collect(),
            done,
        }
    }

    /// Asks every vCPU to leave its run loop (they see it at their next
    /// exit; the watchdog's kicks make that exit happen).
    pub fn kill(&self) {
        self.kill.store(true, Ordering::SeqCst);
    }

    /// Whether the vCPUs have been asked to stop.
    pub fn killed(&self) -> bool {
        self.kill.load(Ordering::SeqCst)
    }

    /// The watchdog stops the run, for `reason` (a timeout, a signal).
    /// The caller then kills and kicks every vCPU.
    pub fn watchdog_stop(&self, reason: StopReason) {
        *self
            .watchdog_reason
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(reason);
    }

    /// The guest on vCPU `index` stopped (an exit, a fault): the first
    /// vCPU to say so is the one the run's stop reason names; the whole VM
    /// stops with it.
    pub fn guest_stopped(&self, index: usize) {
        self.first_stop
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(index);
        self.kill();
    }

    /// Why a vCPU that was asked to stop stopped: the watchdog's reason,
    /// or (stopped by another vCPU, or by a failed thread) signal 0.
    pub fn reason_for_killed(&self) -> StopReason {
        self.watchdog_reason()
            .unwrap_or(StopReason::Signal { signal: 0 })
    }

    /// The watchdog's reason, if it stopped the run.
    pub fn watchdog_reason(&self) -> Option<StopReason> {
        self.watchdog_reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The vCPU whose own stop ended the run, if one did.
    pub fn first_stop(&self) -> Option<usize> {
        *self.first_stop.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// vCPU `index`'s thread has left its run loop: marks it and wakes the
    /// watchdog.
    pub fn finish(&self, index: usize) {
        if let Some(f) = self.finished.get(index) {
            f.store(true, Ordering::SeqCst);
        }
        self.any_finished.store(true, Ordering::SeqCst);
        let _ = self.done.write(1);
    }

    /// Whether vCPU `index`'s thread has left its run loop (or never existed).
    pub fn is_finished(&self, index: usize) -> bool {
        self.finished
            .get(index)
            .is_none_or(|f| f.load(Ordering::SeqCst))
    }

    /// Whether some vCPU's thread has left its run loop.
    pub fn any_finished(&self) -> bool {
        self.any_finished.load(Ordering::SeqCst)
    }

    /// Records the calling thread as vCPU `index`'s, for kicks.
    pub fn register_thread(&self, index: usize) {
        if let Some(t) = self.threads.get(index) {
            // SAFETY: pthread_self has no preconditions.
            let _ = t.set(unsafe { libc::pthread_self() });
        }
    }

    /// vCPU `index`'s thread, once it has registered.
    pub fn thread(&self, index: usize) -> Option<libc::pthread_t> {
        self.threads.get(index).and_then(|t| t.get().copied())
    }

    /// Every vCPU's userspace exits so far, by index.
    pub fn exit_totals(&self) -> &[AtomicU64] {
        &self.exit_totals
    }

    /// vCPU `index` has taken `total` userspace exits so far.
    pub fn record_exits(&self, index: usize, total: u64) {
        if let Some(t) = self.exit_totals.get(index) {
            t.store(total, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    #[test]
    fn the_first_guest_stop_wins_and_kills_the_rest() {
        let s = StopState::new(2, EventFd::new(EFD_NONBLOCK).unwrap());
        assert!(!s.killed());
        s.guest_stopped(1);
        s.guest_stopped(0);
        assert!(s.killed());
        assert_eq!(s.first_stop(), Some(1));
        assert_eq!(s.watchdog_reason(), None);
        assert_eq!(s.reason_for_killed(), StopReason::Signal { signal: 0 });
    }

    #[test]
    fn finishing_wakes_the_watchdog() {
        let s = StopState::new(2, EventFd::new(EFD_NONBLOCK).unwrap());
        assert!(!s.any_finished() && !s.is_finished(0));
        s.finish(0);
        assert!(s.any_finished() && s.is_finished(0) && !s.is_finished(1));
        assert_eq!(s.done.read().unwrap(), 1);
        // An index without a vCPU is never waited for.
        assert!(s.is_finished(7));
    }

    #[test]
    fn the_watchdog_reason_names_a_killed_run() {
        let s = StopState::new(1, EventFd::new(EFD_NONBLOCK).unwrap());
        s.watchdog_stop(StopReason::Timeout { after_ms: 5 });
        s.kill();
        assert_eq!(s.first_stop(), None);
        assert_eq!(s.reason_for_killed(), StopReason::Timeout { after_ms: 5 });
    }
}
