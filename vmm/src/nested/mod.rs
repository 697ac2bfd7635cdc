//! `--backend nested`: ptiscope's own VMM on a real KVM (kvm_amd with
//! nested paging) inside QEMU TCG, which emulates AMD SVM.
//!
//! No machine of this project has a hardware KVM (`/dev/kvm` here is
//! kvm_pvm), so the half of the VMM that a workstation's KVM runs (SYSCALL
//! from user mode, the 32-bit PAE guest, SMP and the probe's verdicts on a
//! normal KVM) would otherwise never run. Here it does: the outer ptiscope
//! ([`boot`]) boots the kernel `ptiscope linux fetch` keeps
//! (`debian-amd64`, with its `kvm.ko`, `kvm-amd.ko` and `irqbypass.ko`)
//! under `qemu-system-x86_64 -accel tcg -cpu max,la57=off` with an initramfs built
//! in memory around ptiscope itself (the running binary, the shared
//! libraries it maps and their loader); ptiscope is that Linux's init
//! ([`init`]): it loads the modules (`kvm-amd npt=1` by default), then
//! either serves runs ([`session`] outside, [`serve`] inside: the
//! `backend::Nested` of `run`, `compare` and `sweep`, each settled run sent
//! in and its `RunRecord` sent back) or runs the inner command(s) of the
//! commands [`cli::intercept`] re-runs inside (probe, pagetables,
//! reproduce, ledger, the tests' batches) on the real `/dev/kvm`; either
//! way over the second serial port (ttyS1), framed with length and SHA-256
//! ([`frame`]), never scraped from the console. One boot serves every run
//! of a command (all the runs of a compare; the tests' many checks).
//!
//! What is real there: KVM's exits, its checks of guest state, its
//! statistics. What is not: time (QEMU's TCG clock, not a CPU's).
//!
//! A Linux guest's CR3 writes, which the inner KVM sees only under shadow
//! paging, are counted under nested paging by the outer QEMU: the session
//! loads ptiscope's TCG plugin there, counting only what QEMU's SVM runs in
//! guest mode (`svm=1`), with its live counts on an ivshmem device that
//! the init names to the jobs and the inner VMM reads around each run
//! (`crate::observe::outer_plugin`).

pub mod boot;
pub mod cli;
pub mod contract;
pub mod error;
pub mod init;
pub mod pack;
pub mod payload;
pub mod serve;
pub mod session;

use serde::{Deserialize, Serialize};

/// Set (on the inner kernel's command line, which hands it to init's
/// environment) in the initramfs's init only: ptiscope then acts as init.
pub const INIT_ENV: &str = "PTISCOPE_NESTED_INIT";
use crate::spec::nested::KvmPaging;

/// One inner command: its arguments (after `ptiscope`) and the files it
/// writes that come back.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Job {
    /// The arguments, `--backend kvm` already in place of `nested`.
    pub argv: Vec<String>,
    /// Files (inner paths) whose content comes back after the command.
    #[serde(default)]
    pub collect: Vec<String>,
    /// The command's own bound, in seconds (the init stops it after that).
    pub timeout_secs: f64,
    /// An executable (its inner path) to run in place of ptiscope itself,
    /// with `argv` as its arguments: `nested-exec` runs the KVM test
    /// binaries this way. `None`: the inner ptiscope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exe: Option<String>,
    /// Environment (name, value) set for the command, over the init's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
    /// Its working directory (made if missing); `/` when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

impl Job {
    /// Whether the job boots a Linux guest on the VMM: `--linux`, or
    /// packed Linux kernels (`reproduce`'s, its `PTISCOPE_LINUX_CACHE`).
    pub fn boots_linux(&self) -> bool {
        self.exe.is_none()
            && (self
                .argv
                .iter()
                .any(|a| a == "--linux" || a.starts_with("--linux="))
                || self.env.iter().any(|(k, _)| k == "PTISCOPE_LINUX_CACHE"))
    }
}

/// What the init is asked to do: how to load KVM, then the jobs, in order.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Request {
    /// kvm_amd's paging for the whole boot.
    #[serde(default)]
    pub kvm_paging: KvmPaging,
    /// The inner commands.
    pub jobs: Vec<Job>,
    /// Whether the outer QEMU runs ptiscope's TCG plugin on the inner
    /// guests (`svm=1`, its live file an ivshmem device the init names to
    /// the jobs: `observe::outer_plugin`). `None`: where KVM sees no CR3
    /// write (nested paging) and a job boots Linux ([`boot::run_with`]
    /// decides, and the init reads its decision).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outer_plugin: Option<bool>,
    /// A session (`--backend nested` behind the backend trait): no jobs;
    /// the init starts `nested-serve`, which serves runs over ttyS1 until
    /// the outer ptiscope stops the machine.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub serve: bool,
}

/// How one inner command ended.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct JobResult {
    /// Its exit status (124 when the init stopped it at its bound; 128 +
    /// N when a signal N ended it).
    pub status: i32,
    /// Its standard output (UTF-8, lossy).
    pub stdout: String,
    /// Its standard error (UTF-8, lossy).
    pub stderr: String,
    /// The collected files that exist: (inner path, content).
    pub files: Vec<(String, String)>,
    /// Its wall time inside (TCG time), seconds.
    pub secs: f64,
}

/// What the init sends back.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Response {
    /// Why the inner KVM could not be set up (a module that failed to load,
    /// no /dev/kvm): no job ran then.
    pub setup_error: Option<String>,
    /// What the init did to set up KVM (one line per step), for the reports.
    pub setup: Vec<String>,
    /// One result per job, in order.
    pub jobs: Vec<JobResult>,
}

/// Puts the serial port `fd` in raw mode (no echo, no line discipline,
/// every byte as it is): the framed messages cross it as bytes.
pub(crate) fn make_raw(fd: std::os::fd::RawFd) {
    // SAFETY: termios calls on an open descriptor with a struct we own.
    unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        if libc::tcgetattr(fd, &mut t) == 0 {
            libc::cfmakeraw(&mut t);
            libc::tcsetattr(fd, libc::TCSANOW, &t);
        }
    }
}

/// The frame around a response on ttyS1: a header line with the payload's
/// length and SHA-256, the payload, an end line.
pub mod frame {
    use sha2::{Digest, Sha256};

    const MAGIC: &str = "@@PTISCOPE-NESTED";
    const END: &[u8] = b"\n@@PTISCOPE-NESTED-END\n";

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The framed payload.
    pub fn encode(payload: &[u8]) -> Vec<u8> {
        let mut out = format!(
            "\n{MAGIC} len={} sha256={}\n",
            payload.len(),
            hex(&Sha256::digest(payload))
        )
        .into_bytes();
        out.extend_from_slice(payload);
        out.extend_from_slice(END);
        out
    }

    /// The payload of the last whole frame in `bytes`, checked; `Err` says
    /// what is wrong (no frame, a short one, a checksum that differs).
    pub fn decode(bytes: &[u8]) -> Result<Vec<u8>, String> {
        let magic = format!("\n{MAGIC} len=").into_bytes();
        let Some(at) = bytes
            .windows(magic.len())
            .rposition(|w| w == magic.as_slice())
        else {
            return Err("no result frame on the result port".into());
        };
        let rest = &bytes[at + magic.len()..];
        let nl = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or("the result frame's header is cut short")?;
        let header = String::from_utf8_lossy(&rest[..nl]).into_owned();
        let (len, sum) = header
            .split_once(" sha256=")
            .ok_or_else(|| format!("a malformed frame header: {header:?}"))?;
        let len: usize = len
            .parse()
            .map_err(|_| format!("a malformed frame length: {len:?}"))?;
        let body = &rest[nl + 1..];
        if body.len() < len {
            return Err(format!(
                "the result frame is cut short: {} of {len} bytes",
                body.len()
            ));
        }
        let payload = &body[..len];
        let got = hex(&Sha256::digest(payload));
        if got != sum {
            return Err(format!(
                "the result frame's checksum differs (sent {sum}, got {got}): the port garbled it"
            ));
        }
        Ok(payload.to_vec())
    }

    /// The largest payload a frame may declare: a session's messages are a
    /// run's record or request (KiB to a few MiB); a header that declares
    /// more is refused rather than waited for.
    pub const MAX_PAYLOAD: usize = 256 << 20;

    /// The longest header line (`len=... sha256=...`) read before it is
    /// refused as malformed.
    const MAX_HEADER: usize = 128;

    /// The first whole frame in a stream's bytes `buf`, taken out of it
    /// (with what came before it: console noise, dropped); `None` while the
    /// frame is not yet whole, `Some(Err)` for one whose header is
    /// malformed or declares more than [`MAX_PAYLOAD`], or whose checksum
    /// differs (taken out too). A session's messages each way are read
    /// this way. The stream is the other side's, so `buf` never holds more
    /// than one frame's worth: noise without a frame is dropped as it
    /// comes, and no length it declares is trusted.
    pub fn take(buf: &mut Vec<u8>) -> Option<Result<Vec<u8>, String>> {
        let magic = format!("\n{MAGIC} len=").into_bytes();
        let Some(at) = buf.windows(magic.len()).position(|w| w == magic.as_slice()) else {
            // Keep only what may be the start of a frame's first line.
            let keep = magic.len() - 1;
            if buf.len() > keep {
                buf.drain(..buf.len() - keep);
            }
            return None;
        };
        let rest = &buf[at + magic.len()..];
        let Some(nl) = rest.iter().take(MAX_HEADER + 1).position(|&b| b == b'\n') else {
            if rest.len() > MAX_HEADER {
                buf.drain(..at + magic.len());
                return Some(Err("a frame header without its end of line".into()));
            }
            return None;
        };
        let header = String::from_utf8_lossy(&rest[..nl]).into_owned();
        let parsed = header
            .split_once(" sha256=")
            .and_then(|(len, sum)| Some((len.parse::<usize>().ok()?, sum.to_string())))
            .filter(|(len, _)| *len <= MAX_PAYLOAD);
        let Some((len, sum)) = parsed else {
            buf.drain(..at + magic.len());
            return Some(Err(format!(
                "a malformed frame header (or a payload over {MAX_PAYLOAD} bytes): {header:?}"
            )));
        };
        let body = at + magic.len() + nl + 1;
        if buf.len() < body + len + END.len() {
            return None;
        }
        let payload = buf[body..body + len].to_vec();
        buf.drain(..body + len + END.len());
        let got = hex(&Sha256::digest(&payload));
        Some(if got == sum {
            Ok(payload)
        } else {
            Err(format!(
                "a frame's checksum differs (sent {sum}, got {got}): the port garbled it"
            ))
        })
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// A hostile stream cannot make the reader hold what it declares:
        /// a length beyond the cap, an endless header line, and endless
        /// noise are each refused or dropped as they come.
        #[test]
        fn a_hostile_stream_is_bounded() {
            let mut huge = format!("\n{MAGIC} len={} sha256=00\n", usize::MAX).into_bytes();
            assert!(take(&mut huge).unwrap().unwrap_err().contains("malformed"));
            let mut over = format!("\n{MAGIC} len={} sha256=00\n", MAX_PAYLOAD + 1).into_bytes();
            assert!(take(&mut over).is_some_and(|r| r.is_err()));
            let mut endless = format!("\n{MAGIC} len=").into_bytes();
            endless.extend(std::iter::repeat_n(b'7', 4096));
            assert!(take(&mut endless)
                .unwrap()
                .unwrap_err()
                .contains("end of line"));
            let mut noise = vec![b'x'; 1 << 20];
            assert!(take(&mut noise).is_none());
            assert!(noise.len() < 64, "{}", noise.len());
            // A frame split across the dropped noise's edge still arrives.
            let framed = encode(b"after noise");
            noise.extend(&framed[..5]);
            assert!(take(&mut noise).is_none());
            noise.extend(&framed[5..]);
            assert_eq!(take(&mut noise).unwrap().unwrap(), b"after noise");
        }

        /// A stream's frames come out one at a time, in order, whatever
        /// the pieces they arrive in, with the noise between them dropped.
        #[test]
        fn frames_are_taken_from_a_stream_in_order() {
            let mut stream = b"boot noise".to_vec();
            stream.extend(encode(b"first"));
            stream.extend(b"more noise");
            stream.extend(encode(b"second \n\x00"));
            let mut buf = Vec::new();
            let mut got = Vec::new();
            for piece in stream.chunks(7) {
                buf.extend_from_slice(piece);
                while let Some(p) = take(&mut buf) {
                    got.push(p.unwrap());
                }
            }
            assert_eq!(got, vec![b"first".to_vec(), b"second \n\x00".to_vec()]);
            assert!(buf.is_empty(), "{buf:?}");
            // A damaged frame is named and taken out; the next one still comes.
            let mut bad = encode(b"payload");
            let n = bad.len() - END.len() - 1;
            bad[n] ^= 1;
            bad.extend(encode(b"next"));
            assert!(take(&mut bad).unwrap().unwrap_err().contains("checksum"));
            assert_eq!(take(&mut bad).unwrap().unwrap(), b"next");
            assert!(take(&mut bad).is_none());
        }

        #[test]
        fn a_frame_round_trips_and_damage_is_named() {
            let payload = b"{\"jobs\":[]}\n\r\x00binary";
            let mut port = b"noise before\n".to_vec();
            port.extend(encode(payload));
            assert_eq!(decode(&port).unwrap(), payload);
            // Cut short.
            let cut = &port[..port.len() - END.len() - 3];
            assert!(decode(cut).unwrap_err().contains("cut short"));
            // One byte changed.
            let mut bad = port.clone();
            let n = bad.len() - END.len() - 1;
            bad[n] ^= 1;
            assert!(decode(&bad).unwrap_err().contains("checksum"));
            assert!(decode(b"console only")
                .unwrap_err()
                .contains("no result frame"));
        }
    }
}
