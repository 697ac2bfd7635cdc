//! The guest console's destination: where `--serial-out` says it goes
//! ([`SerialOut`]) and the writer and queue it prints through.

use std::io::{self, Write};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::{open_output, OpenError, OutputFile, OutputQueue};

/// What the console sink prints into.
pub type ConsoleWriter = Box<dyn Write + Send>;

/// Where the guest console goes.
#[derive(Debug, Clone)]
pub enum SerialOut {
    /// The terminal (or whatever stdout is): control bytes are escaped.
    Stdout,
    /// A file the VMM opens when it builds the VM (raw bytes); a FIFO is
    /// waited for up to the run's timeout ([`open_output`]).
    File(PathBuf),
    /// A file the caller opened already (the CLI opens its outputs before
    /// the first boot); raw bytes.
    Opened(Arc<OutputFile>),
    /// Recorded (machine lines, banner) but not printed.
    Discard,
}

/// The guest console's destination for `serial_out`: the writer its
/// [`ptiscope_devices::ConsoleSink`] prints into (None: recorded only) and
/// the queue behind it, to [`OutputQueue::finish_by`] when the run is over.
/// On stdout, control bytes are escaped (it is usually a terminal); files
/// get the guest's bytes raw.
pub fn console_output(
    serial_out: &SerialOut,
    wait: Duration,
) -> Result<(Option<ConsoleWriter>, Option<OutputQueue>), OpenError> {
    const WHAT: &str = "--serial-out";
    let queue_for = |file: &OutputFile| {
        file.try_clone_file()
            .and_then(|f| OutputQueue::start(WHAT, &file.path.display().to_string(), f))
            .map_err(|source| OpenError::Open {
                what: WHAT,
                path: file.path.clone(),
                source,
            })
    };
    let queue = match serial_out {
        SerialOut::Discard => return Ok((None, None)),
        SerialOut::Stdout => {
            // stdout is best effort (as `| head` is): without a usable
            // descriptor the console is recorded, not printed.
            return Ok(
                match OutputQueue::for_std("console", io::stdout().as_fd(), "stdout") {
                    Ok(q) => {
                        let w = ptiscope_devices::TerminalEscaper::new(q.writer());
                        (Some(Box::new(w)), Some(q))
                    }
                    Err(e) => {
                        log::warn!("not printing the guest console: stdout: {e}");
                        (None, None)
                    }
                },
            );
        }
        SerialOut::File(path) => queue_for(&open_output(WHAT, path, wait)?)?,
        SerialOut::Opened(file) => queue_for(file)?,
    };
    Ok((Some(Box::new(queue.writer())), Some(queue)))
}
