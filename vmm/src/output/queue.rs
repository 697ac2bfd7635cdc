//! The queue of a stream written while the guest runs (console, live
//! metrics): writers append whole records to a bounded in-memory queue and
//! never wait; a thread of its own writes them out ([`drain`]), a pipe's
//! record only once the pipe has room for all of it ([`write_record`]).
//! What became of the stream is its [`OutputReport`].

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use super::{write_all_until, CHUNK_BYTES, DRAIN_GRACE, POLL_STEP, QUEUE_BYTES, RECORD_GRACE};

/// The pipe `fd`'s capacity and the bytes queued in it; `None` if that
/// cannot be told.
fn pipe_fill(fd: BorrowedFd<'_>) -> Option<(usize, usize)> {
    // SAFETY: F_GETPIPE_SZ takes no argument; FIONREAD writes one int.
    unsafe {
        let cap = libc::fcntl(fd.as_raw_fd(), libc::F_GETPIPE_SZ);
        let mut queued: libc::c_int = 0;
        if cap < 0 || libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut queued) < 0 {
            return None;
        }
        Some((cap as usize, queued.max(0) as usize))
    }
}

/// Pipe capacity that surely takes a record of `len` bytes after `queued`
/// bytes: a pipe holds pages, and a write that does not fit in the last
/// page's tail starts a new one, so queued data may take up to about twice
/// its size in pages (every two consecutive pages hold more than one page
/// of data), plus a partly read first page.
fn pipe_needs(queued: usize, len: usize) -> usize {
    const PAGE: usize = 4096;
    2 * (queued + len + 2 * PAGE)
}

/// Writes one record (a queued chunk: console lines, a metrics line or a
/// whole OpenMetrics block) so that a reader does not get part of it: into
/// a pipe, only once the pipe surely has room for all of it
/// ([`pipe_needs`]; the pipe is grown for a large record), and if `abandon`
/// comes before that the record is dropped whole. Other descriptors
/// (files, terminals) are written as they take it; a record once started
/// gets [`RECORD_GRACE`] past `abandon` to complete. Returns the bytes
/// written and the result.
fn write_record(
    fd: BorrowedFd<'_>,
    chunk: &[u8],
    pipe: bool,
    abandon: &AtomicBool,
) -> (usize, io::Result<()>) {
    let raw = fd.as_raw_fd();
    if pipe {
        if pipe_fill(fd).is_some_and(|(cap, _)| cap < pipe_needs(0, chunk.len())) {
            let want =
                libc::c_int::try_from(pipe_needs(0, chunk.len())).unwrap_or(libc::c_int::MAX);
            // SAFETY: F_SETPIPE_SZ takes an int size; on failure the pipe
            // stays as it was (the record then waits for an empty pipe).
            unsafe { libc::fcntl(raw, libc::F_SETPIPE_SZ, want) };
        }
        loop {
            if abandon.load(Ordering::SeqCst) {
                return (0, Err(io::ErrorKind::TimedOut.into()));
            }
            match pipe_fill(fd) {
                Some((cap, queued)) if queued == 0 || pipe_needs(queued, chunk.len()) <= cap => {
                    break
                }
                Some(_) => {}
                None => break,
            }
            let mut pfd = libc::pollfd {
                fd: raw,
                events: libc::POLLOUT,
                revents: 0,
            };
            // SAFETY: one valid pollfd, count 1, no wait.
            let ready = unsafe { libc::poll(&mut pfd, 1, 0) };
            if ready > 0 && pfd.revents & (libc::POLLERR | libc::POLLHUP) != 0 {
                // The reader has gone: the write below reports it.
                break;
            }
            std::thread::sleep(POLL_STEP / 4);
        }
    }
    let mut written = 0;
    let mut late: Option<Instant> = None;
    let r = write_all_until(fd, chunk, &mut written, || {
        if !abandon.load(Ordering::SeqCst) {
            return false;
        }
        // A record under way may finish, briefly.
        let at = *late.get_or_insert_with(Instant::now);
        at.elapsed() >= RECORD_GRACE
    });
    (written, r)
}
/// What became of a queued output.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OutputReport {
    /// The option (`console`, `--serial-out`, `--metrics-out`, ...).
    pub what: String,
    /// Where it went (a path, `stdout`, `stderr`).
    pub target: String,
    /// Bytes written to the target.
    pub written_bytes: u64,
    /// Bytes not written: the queue was full (the reader did not keep up),
    /// the run ended with them still queued, or an error had stopped output.
    pub dropped_bytes: u64,
    /// Chunks (console lines, metrics lines) those bytes were in.
    pub dropped_chunks: u64,
    /// The first write error, if any (the output is then abandoned).
    pub error: Option<String>,
    /// stdout/stderr: an error there (`| head` closing the pipe) is
    /// reported but does not fail the command.
    pub best_effort: bool,
}

impl OutputReport {
    /// Whether the output failed (not merely dropped lines of a slow
    /// reader, nor a closed stdout): the command then exits 73.
    pub fn failed(&self) -> bool {
        self.error.is_some() && !self.best_effort
    }
}

#[derive(Default)]
struct QueueState {
    chunks: VecDeque<Vec<u8>>,
    queued_bytes: usize,
    /// No more chunks will come: write what is queued, then stop.
    closing: bool,
    /// The writer thread has finished (or, with nothing queued and no
    /// chunk in its hands, was let go by [`OutputQueue::finish_by`]).
    done: bool,
    /// The writer thread holds a chunk it took and is writing it.
    writing: bool,
    report: OutputReport,
}

struct QueueShared {
    state: Mutex<QueueState>,
    changed: Condvar,
    /// Set when the drain grace has passed: the writer stops mid-chunk.
    abandon: AtomicBool,
}

impl QueueShared {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `chunk`, or drops and counts it if the queue is full, closed
    /// or failed. Never waits for the reader.
    fn push(&self, chunk: Vec<u8>) {
        if chunk.is_empty() {
            return;
        }
        let mut s = self.lock();
        let refused = s.done
            || s.closing
            || s.report.error.is_some()
            || s.queued_bytes + chunk.len() > QUEUE_BYTES;
        if refused {
            s.report.dropped_bytes += chunk.len() as u64;
            s.report.dropped_chunks += 1;
            return;
        }
        s.queued_bytes += chunk.len();
        s.chunks.push_back(chunk);
        drop(s);
        self.changed.notify_all();
    }
}

/// The producer side of an [`OutputQueue`]: a `Write` that never blocks.
/// Bytes are gathered until `flush` (or `CHUNK_BYTES`) and then queued
/// as one chunk.
pub struct QueueWriter {
    shared: Arc<QueueShared>,
    buf: Vec<u8>,
}

impl Write for QueueWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK_BYTES {
            self.shared.push(std::mem::take(&mut self.buf));
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.shared.push(std::mem::take(&mut self.buf));
        Ok(())
    }
}

impl Drop for QueueWriter {
    fn drop(&mut self) {
        self.shared.push(std::mem::take(&mut self.buf));
    }
}

/// A bounded queue in front of an output, written out by its own thread.
pub struct OutputQueue {
    shared: Arc<QueueShared>,
    thread: Option<JoinHandle<()>>,
}

impl OutputQueue {
    /// Starts the writer thread for `file`. `what` and `target` name the
    /// output in reports.
    pub fn start(what: &str, target: &str, file: File) -> io::Result<Self> {
        let shared = Arc::new(QueueShared {
            state: Mutex::new(QueueState {
                report: OutputReport {
                    what: what.to_string(),
                    target: target.to_string(),
                    ..Default::default()
                },
                ..Default::default()
            }),
            changed: Condvar::new(),
            abandon: AtomicBool::new(false),
        });
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name("output".into())
            .spawn(move || drain(&worker, &file))?;
        Ok(OutputQueue {
            shared,
            thread: Some(thread),
        })
    }

    /// A queue for this process's stdout or stderr (a duplicate descriptor,
    /// so that nothing here holds Rust's stdout lock or changes the flags
    /// the shell's open file description has).
    pub fn for_std(what: &str, fd: BorrowedFd<'_>, target: &str) -> io::Result<Self> {
        let file = File::from(fd.try_clone_to_owned()?);
        let q = Self::start(what, target, file)?;
        q.shared.lock().report.best_effort = true;
        Ok(q)
    }

    /// A writer that feeds this queue (any number may exist).
    pub fn writer(&self) -> QueueWriter {
        QueueWriter {
            shared: self.shared.clone(),
            buf: Vec::new(),
        }
    }

    /// Lets the queue drain until `deadline`, then abandons what is left
    /// (counted as dropped) and stops the thread. Writers still alive
    /// after this drop what they are given.
    pub fn finish_by(mut self, deadline: Instant) -> OutputReport {
        self.finish_inner(deadline)
    }

    fn finish_inner(&mut self, deadline: Instant) -> OutputReport {
        {
            let mut s = self.shared.lock();
            s.closing = true;
            self.shared.changed.notify_all();
            if s.chunks.is_empty() && !s.writing && !s.done {
                // Everything queued is written and the writer is between
                // chunks (waiting, or woken and not yet running): the
                // report is final now. The thread sees `closing` when it
                // next runs and ends by itself, unjoined; waiting for it to
                // be scheduled only to say so cost every run a wake-up at
                // its end (milliseconds on a loaded host).
                s.done = true;
                let report = s.report.clone();
                drop(s);
                drop(self.thread.take());
                return report;
            }
            while !s.done {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                s = self
                    .shared
                    .changed
                    .wait_timeout(s, deadline - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        }
        self.shared.abandon.store(true, Ordering::SeqCst);
        self.shared.changed.notify_all();
        if let Some(t) = self.thread.take() {
            // The thread looks at `abandon` at least every POLL_STEP.
            let _ = t.join();
        }
        self.shared.lock().report.clone()
    }
}

impl Drop for OutputQueue {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.finish_inner(Instant::now() + DRAIN_GRACE);
        }
    }
}

/// The writer thread: takes chunks until closed (or abandoned) and writes
/// each with poll(2) steps, so that `abandon` stops it mid-write.
fn drain(shared: &QueueShared, file: &File) {
    use std::os::unix::fs::FileTypeExt;
    let pipe = file.metadata().is_ok_and(|m| m.file_type().is_fifo());
    loop {
        let chunk = {
            let mut s = shared.lock();
            loop {
                if shared.abandon.load(Ordering::SeqCst) {
                    break None;
                }
                if let Some(c) = s.chunks.pop_front() {
                    s.queued_bytes -= c.len();
                    s.writing = true;
                    break Some(c);
                }
                if s.closing {
                    break None;
                }
                s = shared
                    .changed
                    .wait_timeout(s, POLL_STEP)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        };
        let Some(chunk) = chunk else { break };
        let (written, result) = write_record(file.as_fd(), &chunk, pipe, &shared.abandon);
        let mut s = shared.lock();
        s.writing = false;
        // Counted as written: the bytes that reached the descriptor.
        s.report.written_bytes += written as u64;
        match result {
            Ok(()) => {}
            Err(e) => {
                s.report.dropped_bytes += (chunk.len() - written) as u64;
                s.report.dropped_chunks += 1;
                if e.kind() != io::ErrorKind::TimedOut {
                    s.report.error = Some(e.to_string());
                    break;
                }
            }
        }
    }
    let mut s = shared.lock();
    let left: Vec<Vec<u8>> = s.chunks.drain(..).collect();
    for c in left {
        s.report.dropped_bytes += c.len() as u64;
        s.report.dropped_chunks += 1;
    }
    s.queued_bytes = 0;
    s.done = true;
    drop(s);
    shared.changed.notify_all();
}
