//! QEMU's console as a run keeps it: the first kernel panic line, however
//! long the console after it.

/// What marks a Linux kernel panic on its console.
pub(super) const PANIC_MARK: &[u8] = b"Kernel panic - not syncing";

/// Keeps the first console line that says the kernel panicked, however
/// much the console says after it (a panic's backtrace scrolls it out of
/// the recorder's tail): bounded, one line of at most
/// [`ptiscope_devices::console::MAX_LINE_BYTES`] at a time.
#[derive(Default)]
pub(super) struct PanicScan {
    line: Vec<u8>,
    first: Option<String>,
}

impl PanicScan {
    pub(super) fn feed(&mut self, bytes: &[u8]) {
        if self.first.is_some() {
            return;
        }
        for &b in bytes {
            match b {
                b'\n' => {
                    self.end_line();
                    if self.first.is_some() {
                        return;
                    }
                }
                b'\r' => {}
                _ if self.line.len() < ptiscope_devices::console::MAX_LINE_BYTES => {
                    self.line.push(b)
                }
                _ => {}
            }
        }
    }

    pub(super) fn end_line(&mut self) {
        if self.line.windows(PANIC_MARK.len()).any(|w| w == PANIC_MARK) {
            // Escaped as the recorder escapes the lines it keeps.
            let mut safe = Vec::with_capacity(self.line.len());
            ptiscope_devices::console::escape_for_terminal(&self.line, &mut safe);
            self.first = Some(String::from_utf8_lossy(&safe).into_owned());
        }
        self.line.clear();
    }

    /// The first panic line, the unfinished last line included.
    pub(super) fn finish(mut self) -> Option<String> {
        if self.first.is_none() {
            self.end_line();
        }
        self.first
    }
}

/// The console tail of a run, with the first panic line at its head when
/// it scrolled out of the tail (so that a panic is found wherever it was).
pub(super) fn tail_with_panic(tail: Vec<String>, panic: Option<String>) -> Vec<String> {
    let marked = |l: &String| l.contains("Kernel panic - not syncing");
    match panic {
        Some(p) if !tail.iter().any(marked) => std::iter::once(p).chain(tail).collect(),
        _ => tail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panic line is kept wherever it is in the console: split across
    /// reads, followed by any number of lines, at the very end without a
    /// newline; only the first is kept, escaped; other text is no panic.
    #[test]
    fn the_first_panic_line_is_found_anywhere_in_the_console() {
        let panic = b"[ 1.0] Kernel panic - not syncing: System is deadlocked on memory\r\n";
        let mut console = b"[ 0.0] Linux version 6.1\r\n".to_vec();
        console.extend_from_slice(panic);
        for i in 0..5000 {
            console.extend_from_slice(format!("[ 1.1] backtrace line {i}\r\n").as_bytes());
        }
        console.extend_from_slice(b"[ 2.0] Kernel panic - not syncing: a second one\r\n");
        for chunk in [1usize, 7, 4096] {
            let mut scan = PanicScan::default();
            for c in console.chunks(chunk) {
                scan.feed(c);
            }
            assert_eq!(
                scan.finish().as_deref(),
                Some("[ 1.0] Kernel panic - not syncing: System is deadlocked on memory"),
                "{chunk}"
            );
        }
        let mut last = PanicScan::default();
        last.feed(b"ok\n\x1b[31mKernel panic - not syncing: no newline");
        assert_eq!(
            last.finish().as_deref(),
            Some("\\x1b[31mKernel panic - not syncing: no newline")
        );
        let mut none = PanicScan::default();
        none.feed(b"Kernel panic\nnot syncing\n");
        assert_eq!(none.finish(), None);
        // The tail gets it at its head only when it scrolled out.
        let tail = vec!["a".to_string(), "b".to_string()];
        let p = Some("Kernel panic - not syncing: x".to_string());
        assert_eq!(
            tail_with_panic(tail.clone(), p.clone())[0],
            p.clone().unwrap()
        );
        let with = vec!["Kernel panic - not syncing: x".to_string()];
        assert_eq!(tail_with_panic(with.clone(), p), with);
        assert_eq!(tail_with_panic(tail.clone(), None), tail);
    }
}
