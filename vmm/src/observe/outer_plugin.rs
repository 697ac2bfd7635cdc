//! The outer QEMU's TCG plugin, read from inside `--backend nested`.
//!
//! Under nested paging the inner KVM sees none of its Linux guest's CR3
//! writes, but the outer QEMU executes every one of them: ptiscope's plugin
//! runs there with `svm=1` (it counts only what QEMU's SVM runs in guest
//! mode: the inner guest, none of the inner Linux's or of this VMM's own
//! instructions) and `live=FILE`, rewriting its report so far into FILE at
//! each of the guest's phase markers. FILE is the memory of an ivshmem PCI
//! device of the outer machine, which the nested init finds and names to
//! the inner ptiscope (its `resource2`: the serving process gets it on its
//! command line, a batch job in `spec::nested::OUTER_PLUGIN_ENV`, read once
//! at the top of the process into the host facts, which the KVM backend is
//! built with). The KVM backend reads
//! it before and after a Linux run ([`LiveFile::read`]) and hands the
//! run's own marks on as that run's plugin file ([`run_output`]), which the
//! Linux summary reads as it reads `--backend qemu`'s.
//!
//! The file comes from another program (the plugin, through QEMU): read
//! as hostile input, bounded by the mapping, parsed by the plugin file's
//! own checked parser.

use super::qemu_plugin::{PluginOutput, PluginReport, MAX_FILE_BYTES};

/// The header line before the report in the live file.
const HEADER: &[u8] = b"ptiscope-live len=";

/// The live file, mapped read-only.
pub struct LiveFile {
    map: *const u8,
    len: usize,
}

impl Drop for LiveFile {
    fn drop(&mut self) {
        // SAFETY: the mapping this value made, unmapped once.
        unsafe { libc::munmap(self.map as *mut libc::c_void, self.len) };
    }
}

impl LiveFile {
    /// Maps `path` (a sysfs PCI resource: it can be mapped, not read).
    pub fn open(path: &std::path::Path) -> Result<LiveFile, String> {
        Self::open_bounded(path, MAX_FILE_BYTES + 64)
    }

    /// Maps `path`, of at most `max` bytes (`--backend nested`'s blob
    /// window is larger than a live file).
    pub fn open_bounded(path: &std::path::Path, max: usize) -> Result<LiveFile, String> {
        use std::os::fd::AsRawFd;
        let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let len = f
            .metadata()
            .map_err(|e| format!("{}: {e}", path.display()))?
            .len();
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l > 0 && l <= max)
            .ok_or_else(|| format!("{}: an unexpected size of {len} bytes", path.display()))?;
        // SAFETY: a fresh read-only shared mapping of an open file; the
        // result is checked.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(format!(
                "mapping {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            ));
        }
        Ok(LiveFile {
            map: map as *const u8,
            len,
        })
    }

    /// A copy of `len` bytes at `offset`, if the mapping holds them.
    pub fn copy(&self, offset: u64, len: u64) -> Result<Vec<u8>, String> {
        let (Ok(offset), Ok(len)) = (usize::try_from(offset), usize::try_from(len)) else {
            return Err("a range beyond the mapping".into());
        };
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(format!(
                "{len} bytes at {offset} lie beyond the mapping's {} bytes",
                self.len
            ));
        }
        let mut bytes = vec![0u8; len];
        // SAFETY: `map` is a live mapping of `len` bytes holding the range,
        // checked above.
        unsafe { std::ptr::copy_nonoverlapping(self.map.add(offset), bytes.as_mut_ptr(), len) };
        Ok(bytes)
    }

    /// The report the plugin last wrote; `Ok(None)` before its first
    /// snapshot (the file is still zeros).
    pub fn read(&self) -> Result<Option<PluginReport>, String> {
        // The header first, then only as much as it says (within the
        // mapping): copying all of it each time costs emulated time.
        let copy = |n: usize| {
            let n = n.min(self.len);
            let mut bytes = vec![0u8; n];
            // SAFETY: `map` is a live mapping of `len` bytes and `n <= len`;
            // whatever the bytes hold is parsed as hostile input.
            unsafe { std::ptr::copy_nonoverlapping(self.map, bytes.as_mut_ptr(), n) };
            bytes
        };
        let head = copy(HEADER.len() + 24);
        let len = head
            .strip_prefix(HEADER)
            .and_then(|r| r.iter().position(|&b| b == b'\n').map(|nl| (r, nl)))
            .and_then(|(r, nl)| std::str::from_utf8(&r[..nl]).ok()?.parse::<usize>().ok())
            .map_or(self.len, |len| HEADER.len() + 25 + len);
        parse_live(&copy(len))
    }
}

/// The report in a live file's bytes (module comment).
pub fn parse_live(bytes: &[u8]) -> Result<Option<PluginReport>, String> {
    if bytes.iter().take(HEADER.len()).all(|&b| b == 0) {
        return Ok(None);
    }
    let rest = bytes
        .strip_prefix(HEADER)
        .ok_or("the outer plugin's live file has no `ptiscope-live` header")?;
    let nl = rest
        .iter()
        .take(24)
        .position(|&b| b == b'\n')
        .ok_or("the outer plugin's live header has no end")?;
    let len: usize = std::str::from_utf8(&rest[..nl])
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or("the outer plugin's live header has no length")?;
    let body = &rest[nl + 1..];
    if len > body.len() {
        return Err(format!(
            "the outer plugin's report ({len} bytes) no longer fits its live file ({} bytes): \
             too many phase markers in one nested session",
            bytes.len()
        ));
    }
    PluginReport::parse(&body[..len])
        .map(Some)
        .map_err(|e| format!("the outer plugin's live file: {e}"))
}

/// One run's plugin file: the marks `after` has beyond those of `before`
/// (what the live file held before the run), numbered from 0, with
/// `after`'s counters as the totals. A run during which the plugin dropped
/// marks gets them counted (its phase is then refused).
pub fn run_output(before: Option<&PluginReport>, after: &PluginReport) -> PluginOutput {
    let (skip, dropped) = before.map_or((0, 0), |b| (b.marks.len(), b.dropped_marks));
    let marks = after
        .marks
        .iter()
        .skip(skip)
        .enumerate()
        .map(|(i, m)| {
            let mut m = m.clone();
            m.seq = i as u64;
            m
        })
        .collect();
    let run = PluginReport {
        api: after.api,
        kernel: after.kernel.clone(),
        marks,
        dropped_marks: after.dropped_marks.saturating_sub(dropped),
        totals: after.totals.clone(),
        call_pcs: None,
        symbols: None,
    };
    PluginOutput::File(run.render().into_bytes())
}

/// What a Linux run on the VMM reads of the outer plugin: the live file
/// and its report before the run.
pub struct Watch {
    file: Result<LiveFile, String>,
    before: Result<Option<PluginReport>, String>,
}

impl Watch {
    /// Starts watching the live file at `path`.
    pub fn start(path: &std::path::Path) -> Watch {
        let file = LiveFile::open(path);
        let before = match &file {
            Ok(f) => f.read(),
            Err(e) => Err(e.clone()),
        };
        Watch { file, before }
    }

    /// The run's plugin file, after the run.
    pub fn finish(self) -> PluginOutput {
        let file = match self.file {
            Ok(f) => f,
            Err(e) => return PluginOutput::Missing(format!("the outer QEMU's plugin: {e}")),
        };
        let before = match self.before {
            Ok(b) => b,
            Err(e) => return PluginOutput::Missing(e),
        };
        match file.read() {
            Ok(Some(after)) => run_output(before.as_ref(), &after),
            Ok(None) => PluginOutput::Missing(
                "the outer QEMU's plugin saw no phase marker of this guest".into(),
            ),
            Err(e) => PluginOutput::Missing(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::qemu_plugin::{Counts, Mark, VcpuCounts, N_COUNTERS};

    fn report(marks: u64) -> PluginReport {
        let counts = |n: u64| VcpuCounts(vec![Counts::from_array([n; N_COUNTERS])]);
        PluginReport {
            api: 1,
            kernel: vec![(0xffff_8000_0000_0000, u64::MAX)],
            marks: (0..marks)
                .map(|i| Mark {
                    seq: i,
                    vcpu: 0,
                    pc: 0x40_1000 + 0x10 * (i % 2),
                    counts: counts(10 * i),
                })
                .collect(),
            dropped_marks: 0,
            totals: counts(10 * marks),
            call_pcs: None,
            symbols: None,
        }
    }

    fn live(r: &PluginReport, size: usize) -> Vec<u8> {
        let text = r.render();
        let mut b = format!("ptiscope-live len={}\n", text.len()).into_bytes();
        b.extend_from_slice(text.as_bytes());
        b.resize(size.max(b.len()), 0);
        b
    }

    #[test]
    fn a_run_gets_the_marks_after_those_before_it() {
        assert_eq!(parse_live(&[0u8; 64]), Ok(None));
        let before = parse_live(&live(&report(2), 4096)).unwrap().unwrap();
        let after = parse_live(&live(&report(4), 4096)).unwrap().unwrap();
        let PluginOutput::File(bytes) = run_output(Some(&before), &after) else {
            panic!("no file");
        };
        let run = PluginReport::parse(&bytes).unwrap();
        assert_eq!(run.marks.len(), 2);
        assert_eq!(run.marks[0].seq, 0);
        assert_eq!(run.marks[0].counts, after.marks[2].counts);
        let phase = run.linux_phase().unwrap();
        assert_eq!(
            phase
                .delta
                .total()
                .get(crate::observe::qemu_plugin::PluginCounter::Cr3Writes),
            10
        );
    }

    #[test]
    fn a_damaged_or_overfull_live_file_is_named() {
        let mut b = live(&report(2), 0);
        let e = parse_live(&b[..b.len() - 10]).unwrap_err();
        assert!(e.contains("no longer fits"), "{e}");
        b[0] = b'x';
        assert!(parse_live(&b)
            .unwrap_err()
            .contains("no `ptiscope-live` header"));
        let mut b = live(&report(2), 0);
        let n = b.len() - 8;
        b[n] = b'?';
        assert!(parse_live(&b).unwrap_err().contains("live file"));
    }
}
