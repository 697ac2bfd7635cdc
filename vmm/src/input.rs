//! Files ptiscope reads (`--kernel` images, `compare --against`, anything
//! added later) are read through [`read_regular`]: only regular files, at
//! most a cap of bytes *actually read* (the metadata's size can say too
//! little: procfs says 0; a file that says more than the cap is refused
//! without reading it), within
//! a time limit, and a termination signal (blocked for the whole process,
//! see `signals`) ends the read at once. The signal is left
//! pending, not taken: a reader whose caller shrugs the error off (the
//! host-facts cache, read on a thread of its own at start-up) must not
//! swallow the user's SIGTERM; whoever ends the command takes it. A FIFO without a writer,
//! `/dev/zero`, `/dev/urandom` or a huge file therefore ends with a message,
//! never a hang or an exhausted memory.

use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::signals;

/// Bytes read per `read(2)` between two looks at the clock and at signals.
const STEP: usize = 1 << 20;

/// How long reading one input file may take by default (a regular file on
/// a local disk takes milliseconds; a network file system may stall).
pub const READ_TIME_LIMIT: Duration = Duration::from_secs(10);

/// Why an input file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// open(2) or read(2) failed.
    #[error("cannot read {what} {path}: {source}")]
    Io {
        /// The option it belongs to (`--kernel`, `--against`).
        what: &'static str,
        /// The path given.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Not a regular file (what it is instead).
    #[error("{what} {path} {kind}, not a regular file; give a regular file")]
    NotRegular {
        /// The option.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// "is a FIFO (named pipe)", ...
        kind: &'static str,
    },
    /// More than the cap was read.
    #[error("{what} {path} is larger than {max} bytes (the most ptiscope reads for it)")]
    TooLarge {
        /// The option.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The cap, bytes.
        max: u64,
    },
    /// The time limit passed first.
    #[error("{what} {path}: reading it took more than {secs:.1} s; gave up")]
    TimedOut {
        /// The option.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The limit, seconds.
        secs: f64,
    },
    /// A termination signal arrived while reading.
    #[error("{} while reading {what} {path}", signals::describe(*signal))]
    Interrupted {
        /// The option.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The signal number.
        signal: i32,
    },
}

impl InputError {
    /// The signal that interrupted the read, if one did.
    pub fn signal(&self) -> Option<i32> {
        match self {
            InputError::Interrupted { signal, .. } => Some(*signal),
            _ => None,
        }
    }
}

/// The termination signal pending for the process (or this thread), if
/// one is: looked at, not taken (see the module's documentation).
fn pending_termination() -> Option<i32> {
    // SAFETY: sigset_t is plain data, initialised by sigpending; the
    // pointer is valid for the call.
    let pending = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        if libc::sigpending(&mut set) != 0 {
            return None;
        }
        set
    };
    signals::TERMINATION_SIGNALS
        .into_iter()
        // SAFETY: a valid, initialised set.
        .find(|&s| unsafe { libc::sigismember(&pending, s) } == 1)
}

/// What a file that is not regular is, for messages.
fn not_regular(kind: std::fs::FileType) -> Option<&'static str> {
    if kind.is_dir() {
        Some("is a directory")
    } else if kind.is_fifo() {
        Some("is a FIFO (named pipe)")
    } else if kind.is_char_device() {
        Some("is a character device")
    } else if kind.is_block_device() {
        Some("is a block device")
    } else if kind.is_socket() {
        Some("is a socket")
    } else {
        None
    }
}

/// Reads the regular file `path` (for the option `what`) whole, if it is
/// at most `max_bytes` long and is read within `time_limit`.
pub fn read_regular(
    what: &'static str,
    path: &Path,
    max_bytes: u64,
    time_limit: Duration,
) -> Result<Vec<u8>, InputError> {
    let io_err = |source| InputError::Io {
        what,
        path: path.to_path_buf(),
        source,
    };
    // O_NONBLOCK: opening a FIFO returns at once instead of waiting for a
    // writer (it is refused just below); no effect on a regular file's reads.
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(io_err)?;
    let meta = file.metadata().map_err(io_err)?;
    if let Some(kind) = not_regular(meta.file_type()) {
        return Err(InputError::NotRegular {
            what,
            path: path.to_path_buf(),
            kind,
        });
    }
    // A regular file that says it is over the cap is refused without
    // reading it (a 100 GB sparse file took seconds to read up to the cap);
    // one that says less is still counted as read.
    if meta.len() > max_bytes {
        return Err(InputError::TooLarge {
            what,
            path: path.to_path_buf(),
            max: max_bytes,
        });
    }
    let deadline = Instant::now() + time_limit;
    // The metadata's size is a hint only (procfs says 0; a file may grow):
    // it saves the doubling copies, the cap still counts bytes read. Each
    // step reads straight into the vector (no zeroed bounce buffer: a 1 MiB
    // one cost every small read a memset and 256 page faults), at most one
    // byte past the cap, so a file over it is refused without reading on.
    let mut bytes = Vec::with_capacity(meta.len().min(max_bytes) as usize);
    loop {
        if let Some(signal) = pending_termination() {
            return Err(InputError::Interrupted {
                what,
                path: path.to_path_buf(),
                signal,
            });
        }
        if Instant::now() >= deadline {
            return Err(InputError::TimedOut {
                what,
                path: path.to_path_buf(),
                secs: time_limit.as_secs_f64(),
            });
        }
        let room = max_bytes
            .saturating_add(1)
            .saturating_sub(bytes.len() as u64);
        match (&mut file)
            .take(room.min(STEP as u64))
            .read_to_end(&mut bytes)
        {
            Ok(0) => return Ok(bytes),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_err(e)),
        }
        if bytes.len() as u64 > max_bytes {
            return Err(InputError::TooLarge {
                what,
                path: path.to_path_buf(),
                max: max_bytes,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ptiscope-input-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_small_regular_file_is_read_whole() {
        let d = dir("small");
        let p = d.join("f");
        std::fs::write(&p, b"hello").unwrap();
        let got = read_regular("--against", &p, 5, READ_TIME_LIMIT).unwrap();
        assert_eq!(got, b"hello");
        let e = read_regular("--against", &p, 4, READ_TIME_LIMIT).unwrap_err();
        assert!(matches!(e, InputError::TooLarge { max: 4, .. }), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_cap_counts_what_is_read_and_what_a_file_says_it_holds() {
        // procfs says 0 bytes: what is read is counted.
        let status = Path::new("/proc/self/status");
        let e = read_regular("--against", status, 10, READ_TIME_LIMIT).unwrap_err();
        assert!(matches!(e, InputError::TooLarge { max: 10, .. }), "{e}");
        let whole = read_regular("--against", status, 1 << 20, READ_TIME_LIMIT).unwrap();
        assert!(whole.starts_with(b"Name:"), "{whole:?}");
        // A sparse file of 1 TiB is refused from what it says it holds
        // (reading it up to a cap of 1 GiB would take seconds).
        let d = dir("sparse");
        let p = d.join("sparse");
        std::fs::File::create(&p).unwrap().set_len(1 << 40).unwrap();
        let e = read_regular("--kernel", &p, 1 << 30, READ_TIME_LIMIT).unwrap_err();
        assert!(matches!(e, InputError::TooLarge { .. }), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A pending termination signal ends a read and stays pending (a
    /// caller that ignores the error must not swallow it).
    #[test]
    fn a_pending_signal_ends_the_read_and_is_left_for_the_command() {
        let d = dir("pending");
        let p = d.join("f");
        std::fs::write(&p, b"x").unwrap();
        // On a thread of its own, with SIGHUP blocked and raised there
        // (thread-directed: the test harness's other threads never see it).
        std::thread::spawn(move || {
            signals::block_termination_signals();
            // SAFETY: raising a blocked signal only makes it pending.
            unsafe { libc::raise(libc::SIGHUP) };
            for _ in 0..2 {
                let e = read_regular("--kernel", &p, 16, READ_TIME_LIMIT).unwrap_err();
                assert_eq!(e.signal(), Some(libc::SIGHUP), "{e}");
            }
            assert_eq!(
                signals::wait_termination(Duration::ZERO),
                Some(libc::SIGHUP)
            );
            assert_eq!(
                read_regular("--kernel", &p, 16, READ_TIME_LIMIT).unwrap(),
                b"x"
            );
        })
        .join()
        .unwrap();
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn devices_fifos_and_directories_are_refused_at_once() {
        let d = dir("kinds");
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let t = Instant::now();
        for (p, kind) in [
            (fifo.as_path(), "FIFO"),
            (Path::new("/dev/zero"), "character device"),
            (d.as_path(), "directory"),
        ] {
            let e = read_regular("--against", p, 1 << 20, READ_TIME_LIMIT).unwrap_err();
            assert!(matches!(e, InputError::NotRegular { .. }), "{e}");
            assert!(e.to_string().contains(kind), "{e}");
        }
        assert!(t.elapsed() < Duration::from_secs(5));
        let _ = std::fs::remove_dir_all(&d);
    }
}
