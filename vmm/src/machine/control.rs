//! The VMM's own event loop (event-manager): host stdin → guest serial, the
//! vCPU-finished eventfd, and SIGINT/SIGTERM through a signalfd. It runs on
//! the thread that called `run_vm`, which is also the watchdog.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};

use event_manager::{EventOps, Events, MutEventSubscriber};
use ptiscope_devices::SerialDevice;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;

use crate::signals::TerminationSignals;

const TOKEN_DONE: u32 = 1;
const TOKEN_SIGNAL: u32 = 2;
const TOKEN_STDIN: u32 = 3;

/// Whether stdin is worth watching: a terminal, a pipe or a socket. Regular
/// files and /dev/null cannot be polled (epoll refuses them) and would only
/// ever read EOF; a test harness that gives no stdin must not be blocked.
pub fn stdin_is_interactive() -> bool {
    let fd = libc::STDIN_FILENO;
    // SAFETY: isatty on a descriptor number has no memory effects.
    if unsafe { libc::isatty(fd) } == 1 {
        return true;
    }
    // SAFETY: `st` is plain data written by fstat; we check the result.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to `st`.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return false;
    }
    matches!(st.st_mode & libc::S_IFMT, libc::S_IFIFO | libc::S_IFSOCK)
}

/// The subscriber driving all of the VMM's host-side events.
pub struct Control {
    done: EventFd,
    signals: Option<TerminationSignals>,
    stdin: Option<Arc<Mutex<SerialDevice>>>,
    /// Set when the vCPU thread reported that it finished.
    pub vcpu_done: bool,
    /// The first termination signal received.
    pub signal: Option<i32>,
}

impl Control {
    /// Watches `done` (written by the vCPU thread when it finishes), the
    /// termination signals and, when `stdin` is given, the process's stdin,
    /// whose bytes go to that serial device.
    pub fn new(
        done: EventFd,
        signals: Option<TerminationSignals>,
        stdin: Option<Arc<Mutex<SerialDevice>>>,
    ) -> Self {
        Control {
            done,
            signals,
            stdin,
            vcpu_done: false,
            signal: None,
        }
    }

    fn read_stdin(&mut self, ops: &mut EventOps) {
        let mut buf = [0u8; 64];
        // SAFETY: reading at most buf.len() bytes into buf.
        let n = unsafe { libc::read(libc::STDIN_FILENO, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            // EOF or error: stop watching stdin rather than spin on it.
            let _ = ops.remove(Events::with_data_raw(
                libc::STDIN_FILENO,
                TOKEN_STDIN,
                EventSet::IN,
            ));
            self.stdin = None;
            return;
        }
        if let Some(serial) = &self.stdin {
            let mut s = serial.lock().unwrap_or_else(|p| p.into_inner());
            match s.enqueue_input(&buf[..n as usize]) {
                Ok(k) if k < n as usize => {
                    log::debug!("serial input FIFO full; dropped {} byte(s)", n as usize - k)
                }
                Ok(_) => {}
                Err(e) => log::debug!("{e}"),
            }
        }
    }
}

impl MutEventSubscriber for Control {
    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::with_data(&self.done, TOKEN_DONE, EventSet::IN)) {
            log::error!("watching the vCPU eventfd: {e:?}");
        }
        if let Some(s) = &self.signals {
            if let Err(e) = ops.add(Events::with_data(s, TOKEN_SIGNAL, EventSet::IN)) {
                log::warn!("watching SIGINT/SIGTERM: {e:?}");
            }
        }
        if self.stdin.is_some() {
            let fd: RawFd = libc::STDIN_FILENO;
            if let Err(e) = ops.add(Events::with_data_raw(fd, TOKEN_STDIN, EventSet::IN)) {
                log::debug!("not forwarding stdin to the guest: {e:?}");
                self.stdin = None;
            }
        }
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        match events.data() {
            TOKEN_DONE => {
                let _ = self.done.read();
                self.vcpu_done = true;
            }
            TOKEN_SIGNAL => {
                if let Some(sig) = self.signals.as_ref().and_then(|s| s.read()) {
                    self.signal.get_or_insert(sig);
                }
            }
            TOKEN_STDIN => {
                if events
                    .event_set()
                    .intersects(EventSet::HANG_UP | EventSet::ERROR)
                    && !events.event_set().contains(EventSet::IN)
                {
                    let _ = ops.remove(events);
                    self.stdin = None;
                } else {
                    self.read_stdin(ops);
                }
            }
            _ => {}
        }
    }
}

impl AsRawFd for Control {
    fn as_raw_fd(&self) -> RawFd {
        self.done.as_raw_fd()
    }
}
