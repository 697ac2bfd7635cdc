//! The watchdog: the calling thread's side of a run. It waits on the event
//! loop (vCPU done, SIGINT/SIGTERM/SIGHUP, console input) until a vCPU
//! finishes or the timeout passes; then every vCPU thread is stopped: flag
//! first, then kicks until it acknowledges.

use std::time::{Duration, Instant};

use event_manager::{EventManager, SubscriberId, SubscriberOps};

use crate::machine::control::Control;
use crate::machine::outcome::StopReason;
use crate::machine::stop::StopState;
use crate::signals;

/// Waits for a vCPU thread to finish (any of them), the timeout (counted
/// from this call), or a termination signal; records in `stop` why it
/// stopped the run. Returns the event loop's error, if it failed.
pub fn watch(
    em: &mut EventManager<Control>,
    control_id: SubscriberId,
    timeout: Duration,
    stop: &StopState,
) -> Option<event_manager::Error> {
    let deadline = Instant::now() + timeout;
    let set = |r: StopReason| stop.watchdog_stop(r);
    loop {
        // The signal first: the event loop reads it from the signalfd (it is
        // no longer pending), so a vCPU finishing in the same turn must not
        // hide it, or a sweep or compare would go on with its next run.
        let ctl = em.subscriber_mut(control_id).ok();
        if let Some(sig) = ctl.as_ref().and_then(|c| c.signal) {
            set(StopReason::Signal { signal: sig });
            return None;
        }
        if stop.any_finished() {
            return None;
        }
        if ctl.is_some_and(|c| c.vcpu_done) {
            return None;
        }
        let now = Instant::now();
        if now >= deadline {
            set(StopReason::Timeout {
                after_ms: timeout.as_millis() as u64,
            });
            return None;
        }
        let wait_ms = (deadline - now).as_millis().clamp(1, i32::MAX as u128) as i32;
        if let Err(e) = em.run_with_timeout(wait_ms) {
            set(StopReason::Signal { signal: 0 });
            return Some(e);
        }
    }
}

/// Stops vCPU `index`'s thread if it is still running: kills, then kicks
/// until it has finished (the kick handler's `immediate_exit` makes one
/// kick enough; repeating covers a signal lost to a race).
pub fn stop_vcpu(stop: &StopState, index: usize) {
    stop.kill();
    let mut kicks = 0u32;
    while !stop.is_finished(index) {
        if let Some(tid) = stop.thread(index) {
            // SAFETY: `tid` is the vCPU thread, which is still alive: it
            // cannot be joined before `finished` is set, and the caller
            // joins it only after this returns.
            if let Err(e) = unsafe { signals::kick(tid) } {
                log::warn!("kicking the vCPU thread: {e}");
            }
        }
        kicks += 1;
        if kicks == 1000 {
            log::warn!("the vCPU thread has not stopped after 1000 kicks; still trying");
        }
        std::thread::sleep(Duration::from_micros(if kicks < 100 {
            200
        } else {
            10_000
        }));
    }
}
