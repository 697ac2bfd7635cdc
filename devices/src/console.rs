//! Console capture: tees the guest's serial output to its destination and
//! splits it into lines, keeping the machine-readable ones (`@result`,
//! `@fault`, `@panic`, ...) for reports.
//!
//! Everything is bounded: a guest printing without end (or without newlines)
//! costs the VMM a fixed amount of memory; what did not fit is counted.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::{Arc, Mutex};

/// Longest line kept; the rest of a longer line is dropped (and counted).
pub const MAX_LINE_BYTES: usize = 4096;
/// Most machine lines kept per run.
pub const MAX_MACHINE_LINES: usize = 10_000;
/// Most bytes of machine lines kept per run.
pub const MAX_MACHINE_BYTES: usize = 4 << 20;
/// Lines of recent console output kept for error reports.
pub const TAIL_LINES: usize = 20;

/// Counts describing what the recorder saw.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ConsoleStats {
    /// Console bytes fed, CRs included.
    pub bytes: u64,
    /// Complete (newline-terminated) lines seen.
    pub lines: u64,
    /// Lines longer than [`MAX_LINE_BYTES`] (kept truncated).
    pub truncated_lines: u64,
    /// Machine lines not kept because the bounds were reached.
    pub dropped_machine_lines: u64,
}

/// Splits console bytes into lines and keeps the ones reports need.
#[derive(Debug, Default)]
pub struct ConsoleRecorder {
    partial: Vec<u8>,
    partial_truncated: bool,
    machine_lines: Vec<String>,
    machine_bytes: usize,
    banner: Option<String>,
    tail: VecDeque<String>,
    stats: ConsoleStats,
}

impl ConsoleRecorder {
    /// An empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds console bytes.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.stats.bytes += bytes.len() as u64;
        for &b in bytes {
            match b {
                b'\n' => self.end_line(),
                // Serial consoles send CRLF; a bare CR carries no information here.
                b'\r' => {}
                _ if self.partial.len() < MAX_LINE_BYTES => self.partial.push(b),
                _ => self.partial_truncated = true,
            }
        }
    }

    /// Ends the current partial line (if any), e.g. when the VM stopped
    /// without a final newline.
    pub fn flush_partial(&mut self) {
        if !self.partial.is_empty() || self.partial_truncated {
            self.end_line();
        }
    }

    fn end_line(&mut self) {
        // Kept lines are what reports print: made terminal-safe here, once
        // (ASCII only; the guest prints ASCII, anything else is shown as
        // `\xNN` exactly as on the escaped console).
        let mut safe = Vec::with_capacity(self.partial.len());
        escape_for_terminal(&self.partial, &mut safe);
        let line = String::from_utf8_lossy(&safe).into_owned();
        self.partial.clear();
        self.stats.lines += 1;
        if std::mem::take(&mut self.partial_truncated) {
            self.stats.truncated_lines += 1;
        }
        if self.banner.is_none() && line.starts_with(ptiscope_abi::BANNER_PREFIX) {
            self.banner = Some(line.clone());
        }
        if line.starts_with('@') {
            if self.machine_lines.len() < MAX_MACHINE_LINES
                && self.machine_bytes + line.len() <= MAX_MACHINE_BYTES
            {
                self.machine_bytes += line.len();
                self.machine_lines.push(line.clone());
            } else {
                self.stats.dropped_machine_lines += 1;
            }
        }
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        self.tail.push_back(line);
    }

    /// Machine lines (starting with `@`) in the order the guest printed them.
    pub fn machine_lines(&self) -> &[String] {
        &self.machine_lines
    }

    /// The guest's banner line, if it printed one.
    pub fn banner(&self) -> Option<&str> {
        self.banner.as_deref()
    }

    /// The last [`TAIL_LINES`] complete lines.
    pub fn tail(&self) -> impl Iterator<Item = &str> {
        self.tail.iter().map(String::as_str)
    }

    /// What the recorder has seen so far.
    pub fn stats(&self) -> ConsoleStats {
        self.stats
    }
}

/// The writer the serial device prints into: the real destination (stdout, a
/// file, or nothing) plus a shared [`ConsoleRecorder`].
pub struct ConsoleSink {
    out: Option<Box<dyn Write + Send>>,
    recorder: Arc<Mutex<ConsoleRecorder>>,
    /// The first error writing to `out`; after it, output is dropped rather
    /// than failing every guest byte (e.g. stdout closed by `| head`).
    out_error: Option<io::ErrorKind>,
    /// Whether the last byte written ended a line. The UART model flushes
    /// after every byte; passing that on would cost a write(2) per guest
    /// byte, so flushes reach the destination only at line ends.
    at_line_end: bool,
}

impl ConsoleSink {
    /// `out = None` records without printing.
    pub fn new(out: Option<Box<dyn Write + Send>>, recorder: Arc<Mutex<ConsoleRecorder>>) -> Self {
        ConsoleSink {
            out,
            recorder,
            out_error: None,
            at_line_end: true,
        }
    }

    /// The first error writing to the destination, if any.
    pub fn out_error(&self) -> Option<io::ErrorKind> {
        self.out_error
    }
}

impl Write for ConsoleSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.recorder
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .feed(buf);
        if let Some(&last) = buf.last() {
            self.at_line_end = last == b'\n';
        }
        if let (Some(out), None) = (self.out.as_mut(), self.out_error) {
            if let Err(e) = out.write_all(buf) {
                log::warn!("console output failed, dropping further output: {e}");
                self.out_error = Some(e.kind());
            }
        }
        // The guest must never stall or fail because of where its output goes.
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.at_line_end {
            return Ok(());
        }
        self.flush_out();
        Ok(())
    }
}

impl ConsoleSink {
    /// Flushes the destination whatever was written last (end of a run).
    pub fn flush_out(&mut self) {
        if let (Some(out), None) = (self.out.as_mut(), self.out_error) {
            if let Err(e) = out.flush() {
                log::warn!("console output failed, dropping further output: {e}");
                self.out_error = Some(e.kind());
            }
        }
    }
}

impl Drop for ConsoleSink {
    fn drop(&mut self) {
        // A guest that stopped mid-line still has its last bytes shown.
        self.flush_out();
    }
}

/// Appends `bytes` to `out` made safe for a terminal: printable ASCII,
/// newline and tab pass; every other byte (ESC and the other C0 controls,
/// DEL, and all bytes above 0x7f, which include the 8-bit C1 controls such
/// as CSI 0x9b) is shown as `\xNN`. A CR is dropped (consoles send CRLF; a
/// bare CR would let the guest overwrite what the terminal shows). The
/// guest is not trusted to print only text: without this, an OSC sequence
/// could set the window title or write the clipboard.
pub fn escape_for_terminal(bytes: &[u8], out: &mut Vec<u8>) {
    for &b in bytes {
        match b {
            b'\n' | b'\t' | 0x20..=0x7e => out.push(b),
            b'\r' => {}
            _ => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
        }
    }
}

/// [`escape_for_terminal`] for text the VMM prints about the guest (console
/// tails, `@fault` lines): the same rule per character, so `\x1b` reads
/// the same in both places; other non-ASCII characters become `\u{..}`.
pub fn escape_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\t' | ' '..='~' => out.push(c),
            '\r' => {}
            c if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
    out
}

/// A writer that passes guest console bytes on through
/// [`escape_for_terminal`]: for the console when it goes to the user's
/// terminal (stdout), never for `--serial-out` files, which stay raw.
pub struct TerminalEscaper<W: Write> {
    inner: W,
    scratch: Vec<u8>,
}

impl<W: Write> TerminalEscaper<W> {
    /// Wraps `inner`, which receives the escaped bytes.
    pub fn new(inner: W) -> Self {
        TerminalEscaper {
            inner,
            scratch: Vec::new(),
        }
    }
}

impl<W: Write> Write for TerminalEscaper<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.scratch.clear();
        escape_for_terminal(buf, &mut self.scratch);
        self.inner.write_all(&self.scratch)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_lines_are_terminal_safe() {
        let mut r = ConsoleRecorder::new();
        r.feed(b"@fault x=\x1b[2J\xff\n");
        assert_eq!(r.machine_lines(), ["@fault x=\\x1b[2J\\xff"]);
    }

    #[test]
    fn terminal_escapes_are_shown_not_obeyed() {
        let mut out = Vec::new();
        escape_for_terminal(b"\x1b]0;pwned\x07ok\r\n\t\x9b2J\x7f", &mut out);
        assert_eq!(out, b"\\x1b]0;pwned\\x07ok\n\t\\x9b2J\\x7f");
        assert_eq!(
            escape_str("a\u{1b}[2Jb\u{9b}c\u{fffd}"),
            "a\\x1b[2Jb\\x9bc\\u{fffd}"
        );
        let mut w = TerminalEscaper::new(Vec::new());
        w.write_all(b"\x1b]52;c;aGk=\x07\n").unwrap();
        assert_eq!(w.inner, b"\\x1b]52;c;aGk=\\x07\n");
    }

    #[test]
    fn splits_lines_and_keeps_machine_lines() {
        let mut r = ConsoleRecorder::new();
        r.feed(b"ptiscope guest x86_64 0.1\r\nhello\n@result a=1");
        assert_eq!(r.machine_lines().len(), 0, "no newline yet");
        r.feed(b" b=2\n@fault vector=14\nlast");
        r.flush_partial();
        assert_eq!(r.machine_lines(), ["@result a=1 b=2", "@fault vector=14"]);
        assert_eq!(r.banner(), Some("ptiscope guest x86_64 0.1"));
        assert_eq!(r.tail().last(), Some("last"));
        assert_eq!(r.stats().lines, 5);
    }

    #[test]
    fn bounded_against_floods() {
        let mut r = ConsoleRecorder::new();
        let long = vec![b'x'; MAX_LINE_BYTES * 3];
        r.feed(&long);
        r.feed(b"\n");
        assert_eq!(r.stats().truncated_lines, 1);
        assert_eq!(r.tail().next().map(str::len), Some(MAX_LINE_BYTES));
        for _ in 0..MAX_MACHINE_LINES + 5 {
            r.feed(b"@result x=1\n");
        }
        assert_eq!(r.machine_lines().len(), MAX_MACHINE_LINES);
        assert_eq!(r.stats().dropped_machine_lines, 5);
        assert_eq!(r.tail().count(), TAIL_LINES);
    }

    #[test]
    fn sink_tees_and_survives_a_broken_destination() {
        struct Broken;
        impl Write for Broken {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let rec = Arc::new(Mutex::new(ConsoleRecorder::new()));
        let mut sink = ConsoleSink::new(Some(Box::new(Broken)), rec.clone());
        sink.write_all(b"@panic oops\n").unwrap();
        assert_eq!(sink.out_error(), Some(io::ErrorKind::BrokenPipe));
        assert_eq!(rec.lock().unwrap().machine_lines(), ["@panic oops"]);
    }
}
