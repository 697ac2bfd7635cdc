//! Output files and streams that never hold a run hostage.
//!
//! Every output the VMM writes (the guest console, `--metrics-out`,
//! `--json`, `--csv`, `--svg`) may be a FIFO or a device whose reader stops
//! reading. So:
//!
//! - [`open_output`] opens with `O_NONBLOCK`: a FIFO without a reader is
//!   waited for (its reader may start just after ptiscope) but only until a
//!   deadline, and SIGINT/SIGTERM/SIGHUP end the wait; a device that would
//!   block its opener cannot.
//! - [`OutputFile::write_all_by`] writes a finished document (JSON, CSV,
//!   SVG) with a deadline, polling for room instead of blocking in write(2).
//! - [`OutputQueue`] is for streams written while the guest runs (console,
//!   live metrics): writers append to a bounded in-memory queue and never
//!   wait; a thread of its own writes the queue out. When the reader stalls
//!   the queue fills and further chunks are dropped and counted. At the end
//!   of a run the queue gets [`DRAIN_GRACE`] to empty; whatever is left then
//!   is dropped and counted too, so teardown never waits on a reader.
//!
//! Write *errors* (ENOSPC on /dev/full, EIO, a reader that closed its end)
//! are kept and reported: the command then exits 73 (docs/running.md).
//!
//! The guest console's destination ([`SerialOut`], [`console_output`]) is
//! in `output/console.rs`, the queue of a stream ([`OutputQueue`]) and its
//! record writer in `output/queue.rs`.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::signals;

mod console;
mod queue;
pub use console::{console_output, ConsoleWriter, SerialOut};
pub use queue::{OutputQueue, OutputReport, QueueWriter};

/// How long the queued outputs may keep draining after the guest has
/// stopped. One deadline for all of a run's queues (they drain
/// concurrently), so a run with every output stalled ends this long after
/// its stop, plus [`DOCUMENT_GRACE`] for its `--json`.
pub const DRAIN_GRACE: Duration = Duration::from_secs(1);
/// How long a finished document (`--json`, `--csv`, `--svg`) may take to
/// write. A document that fits in a pipe's buffer (64 KiB; a run summary
/// does) never waits at all, even for a reader that does not read.
pub const DOCUMENT_GRACE: Duration = Duration::from_millis(500);
/// How long a record (queued chunk) whose first bytes reached the reader
/// may take to complete after the drain deadline, so that the stream ends
/// on a whole record unless its reader takes none of it for this long.
const RECORD_GRACE: Duration = Duration::from_millis(200);
/// Bytes an [`OutputQueue`] holds before it drops what it is given.
pub const QUEUE_BYTES: usize = 1 << 20;
/// A [`QueueWriter`] hands its buffer to the queue at every flush, or when
/// it reaches this size (a guest printing without newlines).
const CHUNK_BYTES: usize = 4096;
/// How often a waiting writer or opener looks at its deadline and signals.
const POLL_STEP: Duration = Duration::from_millis(20);
/// At most this much per write(2): after POLLOUT a pipe has room for at
/// least one page, so a write of this size does not block even on a
/// descriptor we did not open non-blocking (stdout, stderr).
const WRITE_STEP: usize = 4096;

/// Errors opening an output.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The file could not be opened.
    #[error("cannot open {what} {path}: {source}")]
    Open {
        /// The option it belongs to (`--json`, ...).
        what: &'static str,
        /// The path given.
        path: PathBuf,
        /// The open error.
        #[source]
        source: io::Error,
    },
    /// The new file a document is written to, beside its path, cannot be
    /// created (`--json /proc/version`: the file exists, but its file
    /// system takes no new files).
    #[error(
        "cannot write {what} {path}: {why}; ptiscope writes a result to a new file beside \
         its path and renames it into place (so an earlier file survives a failed run), \
         so give a path in a directory where files can be created"
    )]
    NoNewFile {
        /// The option it belongs to.
        what: &'static str,
        /// The path given.
        path: PathBuf,
        /// What failed, in words ([`new_file_failure`]).
        why: String,
    },
    /// A FIFO that no reader opened in time.
    #[error(
        "{what} {path} is a FIFO and no reader opened it within {waited_s:.1} s; \
         start its reader first (e.g. `cat {path} &`) or give a regular file"
    )]
    NoReader {
        /// The option it belongs to.
        what: &'static str,
        /// The FIFO's path.
        path: PathBuf,
        /// Seconds waited.
        waited_s: f64,
    },
    /// Two outputs were given the same file.
    #[error("{first} and {second} are the same file ({path}); give each output its own file")]
    SamePath {
        /// The first option.
        first: &'static str,
        /// The second option.
        second: &'static str,
        /// The path.
        path: PathBuf,
    },
    /// A termination signal arrived while waiting for a FIFO's reader.
    #[error("{} while waiting for a reader of {what} {path}", signals::describe(*signal))]
    Interrupted {
        /// The option it belongs to.
        what: &'static str,
        /// The FIFO's path.
        path: PathBuf,
        /// The signal number.
        signal: i32,
    },
}

/// An opened output file (regular file, FIFO or device), non-blocking.
/// A document opened with [`open_document`] on a regular file (or a path
/// that does not exist yet) is written to a temporary file beside it,
/// renamed into place once complete, removed if never completed.
#[derive(Debug)]
pub struct OutputFile {
    file: File,
    path: PathBuf,
    what: &'static str,
    /// The temporary file being written, until it is renamed to `path`.
    temp: Mutex<Option<PathBuf>>,
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        let temp = self.temp.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = temp.take() {
            let _ = std::fs::remove_file(t);
        }
    }
}

/// Opens each output that was given (`(option, path)` pairs, `None` for an
/// option not given) with [`open_output`], in order, before any run: the
/// first that fails is the error.
pub fn open_outputs<const N: usize>(
    outputs: [(&'static str, Option<&Path>); N],
    wait: Duration,
) -> Result<[Option<OutputFile>; N], OpenError> {
    check_distinct(&outputs)?;
    let mut files: [Option<OutputFile>; N] = std::array::from_fn(|_| None);
    for (slot, (what, path)) in files.iter_mut().zip(outputs) {
        if let Some(p) = path {
            *slot = Some(open_document(what, p, wait)?);
        }
    }
    Ok(files)
}

/// What identifies an output's target: the file's device and inode if it
/// exists, else its absolute path.
fn identity(path: &Path) -> Result<(u64, u64), PathBuf> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(path) {
        Ok(m) => Ok((m.dev(), m.ino())),
        Err(_) => Err(std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())),
    }
}

/// Refuses two outputs given the same file (they would interleave or
/// overwrite each other: `--json r --csv r` left neither readable).
/// `/dev/null` may take any number.
pub fn check_distinct(outputs: &[(&'static str, Option<&Path>)]) -> Result<(), OpenError> {
    let given: Vec<(&'static str, &Path)> = outputs
        .iter()
        .filter_map(|(w, p)| p.map(|p| (*w, p)))
        .filter(|(_, p)| *p != Path::new("/dev/null"))
        .collect();
    for (i, (first, a)) in given.iter().enumerate() {
        for (second, b) in &given[i + 1..] {
            if identity(a) == identity(b) {
                return Err(OpenError::SamePath {
                    first,
                    second,
                    path: b.to_path_buf(),
                });
            }
        }
    }
    Ok(())
}

/// Opens a finished document's output (`--json`, `--csv`, `--svg`): a FIFO
/// or device is opened as [`open_output`] does; a regular file, or a path
/// that does not exist yet, gets a temporary file beside it (same
/// directory, so the rename is atomic) which [`OutputFile::write_document`]
/// renames into place: an earlier result at `path` survives a run that
/// fails, is interrupted, or never writes.
pub fn open_document(
    what: &'static str,
    path: &Path,
    wait: Duration,
) -> Result<OutputFile, OpenError> {
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => return open_output(what, path, wait),
        _ => {}
    }
    let open_err = |source| OpenError::Open {
        what,
        path: path.to_path_buf(),
        source,
    };
    let name = path.file_name().ok_or_else(|| {
        open_err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a file name",
        ))
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let temp = dir.join(format!(
        ".{}.ptiscope-{}-{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temp)
        .map_err(|source| OpenError::NoNewFile {
            what,
            path: path.to_path_buf(),
            why: new_file_failure(&dir, &temp, &source),
        })?;
    Ok(OutputFile {
        file,
        path: path.to_path_buf(),
        what,
        temp: Mutex::new(Some(temp)),
    })
}

/// Why `temp` could not be created in `dir`, in words: the bare error
/// would say "No such file or directory" of a path that exists (its
/// directory's file system, such as /proc, creates no files) or name the
/// temporary file, which the user never gave.
fn new_file_failure(dir: &Path, temp: &Path, source: &io::Error) -> String {
    let shown = dir.display();
    match std::fs::metadata(dir) {
        Err(_) => format!("its directory {shown} does not exist"),
        Ok(m) if !m.is_dir() => format!("{shown} is not a directory"),
        Ok(_) => match source.raw_os_error() {
            Some(libc::ENOENT) => format!(
                "its directory {shown} takes no new files (its file system refused to create {})",
                temp.display()
            ),
            Some(libc::EACCES | libc::EPERM) => {
                format!("creating a file in {shown} is not permitted ({source})")
            }
            Some(libc::EROFS) => format!("{shown} is on a read-only file system"),
            _ => format!("creating {} failed: {source}", temp.display()),
        },
    }
}

/// Opens `path` for writing (created or truncated) as the output `what`
/// (`--json`, `--serial-out`, ...). A FIFO with no reader yet is retried
/// until `wait` has passed; a termination signal ends the wait at once.
pub fn open_output(
    what: &'static str,
    path: &Path,
    wait: Duration,
) -> Result<OutputFile, OpenError> {
    let deadline = Instant::now() + wait;
    let started = Instant::now();
    loop {
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            // Never block in open(2): a FIFO without a reader gives ENXIO
            // instead, which is retried below with a deadline.
            .custom_flags(libc::O_NONBLOCK)
            .open(path);
        match opened {
            Ok(file) => {
                return Ok(OutputFile {
                    file,
                    path: path.to_path_buf(),
                    what,
                    temp: Mutex::new(None),
                })
            }
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                let now = Instant::now();
                if now >= deadline {
                    return Err(OpenError::NoReader {
                        what,
                        path: path.to_path_buf(),
                        waited_s: started.elapsed().as_secs_f64(),
                    });
                }
                if let Some(signal) = signals::wait_termination((deadline - now).min(POLL_STEP)) {
                    return Err(OpenError::Interrupted {
                        what,
                        path: path.to_path_buf(),
                        signal,
                    });
                }
            }
            Err(source) => {
                return Err(OpenError::Open {
                    what,
                    path: path.to_path_buf(),
                    source,
                })
            }
        }
    }
}

impl OutputFile {
    /// Which option this output belongs to (`--json`, ...).
    pub fn what(&self) -> &'static str {
        self.what
    }

    /// The path given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes all of `buf` unless `deadline` passes first (a reader that
    /// does not read), in which case the error kind is `TimedOut`.
    pub fn write_all_by(&self, buf: &[u8], deadline: Instant) -> io::Result<()> {
        write_all_until(self.file.as_fd(), buf, &mut 0, || {
            Instant::now() >= deadline
        })
    }

    /// Writes a finished document, giving the reader [`DOCUMENT_GRACE`],
    /// and renames it into place if it was written to a temporary file; the
    /// message names the option and the path.
    pub fn write_document(&self, text: &str) -> Result<(), String> {
        self.write_all_by(text.as_bytes(), Instant::now() + DOCUMENT_GRACE)
            .and_then(|()| self.commit())
            .map_err(|e| {
                let why = if e.kind() == io::ErrorKind::TimedOut {
                    format!(
                        "its reader did not take it within {:.1} s",
                        DOCUMENT_GRACE.as_secs_f64()
                    )
                } else {
                    e.to_string()
                };
                format!("cannot write {} {}: {why}", self.what, self.path.display())
            })
    }

    /// Renames the temporary file (if any) to the target: the document is
    /// complete. Later writes go to the same (now renamed) file.
    fn commit(&self) -> io::Result<()> {
        let mut temp = self.temp.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = temp.as_ref() {
            std::fs::rename(t, &self.path)?;
            *temp = None;
        }
        Ok(())
    }

    /// A second descriptor for the same open file (for a writer thread).
    pub fn try_clone_file(&self) -> io::Result<File> {
        self.file.try_clone()
    }
}

/// Writes `buf` to `fd`, waiting for room with poll(2) in short steps so
/// that `give_up` is consulted at least every [`POLL_STEP`]. Works on
/// blocking and non-blocking descriptors alike. `written` counts the bytes
/// that reached the descriptor, whatever the result.
fn write_all_until(
    fd: BorrowedFd<'_>,
    mut buf: &[u8],
    written_total: &mut usize,
    mut give_up: impl FnMut() -> bool,
) -> io::Result<()> {
    while !buf.is_empty() {
        if give_up() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one valid pollfd, count 1; the timeout is a small int.
        let ready = unsafe { libc::poll(&mut pfd, 1, POLL_STEP.as_millis() as libc::c_int) };
        if ready < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if ready == 0 {
            continue;
        }
        // POLLERR/POLLHUP too: the write below then reports the error.
        let n = buf.len().min(WRITE_STEP);
        // SAFETY: writes at most `n` bytes from `buf`, which holds at least `n`.
        let written = unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), n) };
        if written < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock => continue,
                _ => return Err(e),
            }
        }
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        *written_total += written as usize;
        buf = &buf[written as usize..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::io::Write;
    use std::os::fd::FromRawFd;

    fn pipe() -> (File, File) {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 returns.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both descriptors are fresh and owned by us from here on.
        unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
    }

    /// A document whose new file cannot be created beside it says why:
    /// not "No such file or directory" of /proc/version, which exists.
    #[test]
    fn a_document_that_cannot_be_placed_says_what_failed() {
        let wait = Duration::from_millis(10);
        let e = open_document("--by-symbol-csv", Path::new("/proc/version"), wait).unwrap_err();
        let m = e.to_string();
        assert!(matches!(e, OpenError::NoNewFile { .. }), "{e:?}");
        assert!(
            m.contains("/proc takes no new files") && !m.contains("No such file"),
            "{m}"
        );
        let e = open_document("--json", Path::new("/nonexistent-ptiscope/r.json"), wait)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("its directory /nonexistent-ptiscope does not exist"),
            "{e}"
        );
        let e = open_document("--json", Path::new("/proc/version/r.json"), wait)
            .unwrap_err()
            .to_string();
        assert!(e.contains("/proc/version is not a directory"), "{e}");
    }

    #[test]
    fn a_reader_that_reads_gets_everything() {
        let (mut r, w) = pipe();
        let q = OutputQueue::start("test", "pipe", w).unwrap();
        let reader = std::thread::spawn(move || {
            let mut s = String::new();
            r.read_to_string(&mut s).unwrap();
            s
        });
        let mut wr = q.writer();
        for i in 0..1000 {
            writeln!(wr, "line {i}").unwrap();
            wr.flush().unwrap();
        }
        drop(wr);
        let rep = q.finish_by(Instant::now() + Duration::from_secs(5));
        assert_eq!(rep.dropped_bytes, 0, "{rep:?}");
        assert!(rep.error.is_none());
        let text = reader.join().unwrap();
        assert_eq!(text.lines().count(), 1000);
        assert_eq!(rep.written_bytes, text.len() as u64);
    }

    #[test]
    fn a_stalled_reader_costs_drops_not_time() {
        // The read end stays open and unread: the pipe fills (64 KiB), then
        // the queue (1 MiB), then chunks are dropped, all without blocking.
        let (_r, w) = pipe();
        let q = OutputQueue::start("test", "pipe", w).unwrap();
        let mut wr = q.writer();
        let line = vec![b'x'; 1000];
        let t = Instant::now();
        for _ in 0..3000 {
            wr.write_all(&line).unwrap();
            wr.flush().unwrap();
        }
        assert!(t.elapsed() < Duration::from_secs(2), "writers blocked");
        let t = Instant::now();
        let rep = q.finish_by(Instant::now() + Duration::from_millis(200));
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "finish waited {:?}",
            t.elapsed()
        );
        assert!(rep.dropped_chunks > 0 && rep.error.is_none(), "{rep:?}");
        assert_eq!(rep.written_bytes + rep.dropped_bytes, 3_000_000, "{rep:?}");
    }

    /// A stalled pipe reader gets whole records only, and `written` is
    /// exactly what it can read (records larger than PIPE_BUF used to be
    /// cut when the drain deadline came mid-record).
    #[test]
    fn a_stalled_pipe_gets_whole_records_and_exact_counts() {
        let (mut r, w) = pipe();
        // SAFETY: F_GETPIPE_SZ on a pipe we own.
        let cap = unsafe { libc::fcntl(w.as_raw_fd(), libc::F_GETPIPE_SZ) } as usize;
        let q = OutputQueue::start("test", "pipe", w).unwrap();
        let mut wr = q.writer();
        // 10000-byte records (over PIPE_BUF), each ending in a newline.
        let mut record = vec![b'r'; 9999];
        record.push(b'\n');
        for _ in 0..20 {
            wr.write_all(&record).unwrap();
            wr.flush().unwrap();
        }
        drop(wr);
        let rep = q.finish_by(Instant::now() + Duration::from_millis(300));
        assert_eq!(rep.written_bytes + rep.dropped_bytes, 200_000, "{rep:?}");
        let mut got = Vec::new();
        // SAFETY: make the read end non-blocking to read what is there.
        unsafe { libc::fcntl(r.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
        let mut buf = [0u8; 8192];
        loop {
            match r.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(_) => break,
            }
        }
        assert_eq!(got.len() as u64, rep.written_bytes, "{rep:?}");
        assert_eq!(
            got.len() % 10_000,
            0,
            "a torn record: {} bytes (pipe {cap})",
            got.len()
        );
        assert!(
            got.len() >= 10_000 && got.len() <= cap,
            "{} of {cap}",
            got.len()
        );
    }

    #[test]
    fn a_write_error_is_kept() {
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full");
        let Ok(full) = full else {
            crate::test_support::skip("a_write_error_is_kept", "no /dev/full");
            return;
        };
        let q = OutputQueue::start("test", "/dev/full", full).unwrap();
        let mut wr = q.writer();
        wr.write_all(b"hello\n").unwrap();
        wr.flush().unwrap();
        drop(wr);
        let rep = q.finish_by(Instant::now() + Duration::from_secs(5));
        assert!(rep.failed(), "{rep:?}");
        assert!(rep.error.as_deref().unwrap().contains("space"), "{rep:?}");
    }

    #[test]
    fn a_fifo_without_reader_is_refused_after_the_wait() {
        let dir = std::env::temp_dir().join(format!("ptiscope-output-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("f");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let t = Instant::now();
        let e = open_output("--json", &fifo, Duration::from_millis(100)).unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(2));
        assert!(matches!(e, OpenError::NoReader { .. }), "{e}");
        assert_eq!(crate::cli::exit_code::ExitCode::exit_code(&e), 73);
        assert!(e.to_string().contains("no reader opened it"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
