//! The outer half of a `--backend nested` session (the backend's
//! [`Session`]): boots the inner Linux once with `Request::serve`, whose
//! init starts `ptiscope nested-serve` ([`super::serve`]); then each run
//! goes in as a framed [`ToInner`] on the second serial port (QEMU's
//! stdio: both ways) and comes back as a framed [`FromInner`] record. The
//! boot sources (kernel images, initrds: megabytes, which the emulated
//! UART would take minutes over) go through the blob window instead, an
//! ivshmem device whose memory is a memfd here: written here before the
//! run that first needs them, copied and checked (SHA-256) inside, kept
//! there by hash for the session's later runs. QEMU is stopped when the
//! session is dropped (with the backend).

use std::collections::HashSet;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::boot::{self, Qemu};
use super::contract::{self, BLOB_WINDOW_BYTES};
use super::error::NestedError;
use super::payload::{find_kernel, initramfs, Extra};
use super::{frame, Request};
use crate::backend::nested::wire::{BlobAt, FromInner, ToInner, WireRun};
use crate::backend::nested::{NestedRunError, Session, SessionSpec};
use crate::backend::record::RunRecord;
use crate::probe::host_cache;
use crate::signals;
use crate::spec::nested::KvmPaging;
use crate::spec::ResolvedRun;

/// How long the inner ptiscope gets, after the boot, to probe its KVM
/// (the entry, PCID, PAE and refill probes, in TCG time).
const PROBE_ALLOWANCE: Duration = Duration::from_secs(180);

/// How long a run gets beyond its own `--timeout` (its VM's set-up and
/// teardown, the record's way out over the UART).
const RUN_ALLOWANCE: Duration = Duration::from_secs(120);

impl From<NestedError> for NestedRunError {
    fn from(e: NestedError) -> Self {
        NestedRunError::Session {
            message: e.to_string(),
            exit_code: e.exit_code(),
        }
    }
}

/// A booted session.
struct Live {
    qemu: Qemu,
    stdin: std::process::ChildStdin,
    out: mpsc::Receiver<Vec<u8>>,
    buf: Vec<u8>,
    console: std::fs::File,
    window: std::fs::File,
    held: HashSet<String>,
    facts: host_cache::Facts,
    outer_plugin: Option<std::path::PathBuf>,
    // Kept open for QEMU, which maps them by /proc/self/fd.
    _fds: Vec<std::fs::File>,
}

/// Starts a session for `spec` ([`crate::backend::nested::Starter`]).
pub fn start(
    spec: &SessionSpec,
    progress: &mut dyn FnMut(&str),
) -> Result<Box<dyn Session>, NestedRunError> {
    Ok(Box::new(Live::start(spec, progress)?))
}

impl Live {
    fn start(spec: &SessionSpec, progress: &mut dyn FnMut(&str)) -> Result<Live, NestedError> {
        let paging = spec.paging;
        if paging == KvmPaging::Shadow {
            boot::shadow_paging_works().map_err(NestedError::QemuBreaksIt)?;
        }
        let kernel = find_kernel()?;
        // As a batch decides (boot::run_with): the outer plugin counts a
        // Linux guest's CR3 writes where the inner KVM cannot.
        let plugin = boot::outer_plugin(spec.linux && paging == KvmPaging::Npt, progress);
        let request = Request {
            kvm_paging: paging,
            jobs: Vec::new(),
            outer_plugin: Some(plugin.is_some()),
            serve: true,
        };
        let (initrd, lib_dirs) = initramfs(&kernel, &request, &[], &Extra::default())?;
        let vmlinuz = crate::input::read_regular(
            "the inner Linux's kernel",
            &kernel.vmlinuz,
            crate::machine::loader::MAX_IMAGE_BYTES,
            crate::input::READ_TIME_LIMIT,
        )?;
        let kernel_fd = boot::memfd(c"ptiscope-nested-kernel", &vmlinuz)?;
        let initrd_fd = boot::memfd(c"ptiscope-nested-initrd", &initrd)?;
        drop(initrd);
        let console = boot::memfd(c"ptiscope-nested-console", &[])?;
        let sized = |name: &std::ffi::CStr, len: u64| {
            let f = boot::memfd(name, &[])?;
            f.set_len(len).map_err(|source| NestedError::Io {
                what: "sizing a shared memory file of the outer machine".into(),
                source,
            })?;
            Ok::<_, NestedError>(f)
        };
        let window = sized(c"ptiscope-nested-blobs", BLOB_WINDOW_BYTES)?;
        let live = match plugin {
            Some(_) => Some(sized(c"ptiscope-nested-live", contract::LIVE_BYTES)?),
            None => None,
        };
        let mut fds = vec![
            kernel_fd.as_raw_fd(),
            initrd_fd.as_raw_fd(),
            console.as_raw_fd(),
            window.as_raw_fd(),
        ];
        fds.extend(live.as_ref().map(|f| f.as_raw_fd()));
        // One outer vCPU under a Linux guest (as for a batch: two stalled
        // boots, docs/linux-guests.md).
        let cpus = if spec.linux { 1 } else { spec.cpus };
        let mut cmd = boot::machine_command(
            cpus,
            0,
            [fds[0], fds[1], fds[2]],
            "stdio",
            &boot::inner_cmdline(&lib_dirs),
        );
        cmd.args([
            "-object".to_string(),
            format!(
                "memory-backend-file,id=ptiscope-blobs,size={BLOB_WINDOW_BYTES},mem-path=/proc/self/fd/{},share=on",
                fds[3]
            ),
            "-device".to_string(),
            "ivshmem-plain,memdev=ptiscope-blobs".to_string(),
        ]);
        if let (Some(path), Some(live)) = (&plugin, &live) {
            let live = format!("/proc/self/fd/{}", live.as_raw_fd());
            cmd.args(boot::outer_plugin_args(path, &live));
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        crate::backend::qemu::die_with_ptiscope_inheriting(&mut cmd, fds.clone());
        progress(&format!(
            "booting Linux with KVM (kvm_amd, {}) under QEMU TCG: one session for this command's runs",
            paging.describe()
        ));
        let start = Instant::now();
        let mut child = cmd.spawn().map_err(NestedError::NoQemu)?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let qemu = Qemu(child);
        let stdin = stdin.ok_or_else(|| NestedError::Io {
            what: "QEMU's standard input".into(),
            source: std::io::Error::other("not piped"),
        })?;
        let (tx, out) = mpsc::channel();
        if let Some(mut o) = stdout {
            std::thread::spawn(move || {
                let mut chunk = vec![0u8; 1 << 16];
                while let Ok(n) = o.read(&mut chunk) {
                    if n == 0 || tx.send(chunk[..n].to_vec()).is_err() {
                        break;
                    }
                }
            });
        }
        // QEMU's complaints are read (and dropped) so that it never blocks
        // on a full pipe; its console says what went wrong inside.
        if let Some(mut e) = stderr {
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut e, &mut std::io::sink());
            });
        }
        let mut keep = vec![kernel_fd, initrd_fd];
        keep.extend(live);
        let mut session = Live {
            qemu,
            stdin,
            out,
            buf: Vec::new(),
            console,
            window,
            held: HashSet::new(),
            facts: host_cache::Facts::default(),
            outer_plugin: None,
            _fds: keep,
        };
        let deadline = start + boot::BOOT_ALLOWANCE + PROBE_ALLOWANCE;
        match session.receive(deadline)? {
            FromInner::Ready {
                facts,
                outer_plugin,
            } => {
                session.facts = *facts;
                session.outer_plugin = outer_plugin.map(Into::into);
            }
            FromInner::Unready(why) => return Err(NestedError::Setup(why)),
            FromInner::Ran { .. } => {
                return Err(session.broken("a run's result before any run was asked"))
            }
        }
        progress(&format!(
            "the nested session is ready after {:.1} s",
            start.elapsed().as_secs_f64()
        ));
        Ok(session)
    }

    /// The session as broken: why, with the console's last lines.
    fn broken(&self, why: &str) -> NestedError {
        let mut console = self.console.try_clone().ok();
        NestedError::NoResponse {
            how: "the session".into(),
            why: why.into(),
            console: console
                .as_mut()
                .map(|c| boot::console_tail(&boot::read_back(c, 1 << 20), 12))
                .unwrap_or_default(),
        }
    }

    /// The next message from inside, by `deadline`.
    fn receive(&mut self, deadline: Instant) -> Result<FromInner, NestedError> {
        loop {
            if let Some(frame) = frame::take(&mut self.buf) {
                let payload = frame.map_err(|why| self.broken(&why))?;
                return serde_json::from_slice(&payload)
                    .map_err(|e| self.broken(&format!("a message that does not parse: {e}")));
            }
            if let Some(s) = signals::wait_termination(Duration::ZERO) {
                return Err(NestedError::Interrupted(s));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(NestedError::Timeout {
                    secs: 0.0,
                    boot: boot::BOOT_ALLOWANCE.as_secs(),
                    console: self
                        .console
                        .try_clone()
                        .map(|mut c| boot::console_tail(&boot::read_back(&mut c, 1 << 20), 12))
                        .unwrap_or_default(),
                });
            }
            match self
                .out
                .recv_timeout((deadline - now).min(Duration::from_millis(50)))
            {
                Ok(bytes) => self.buf.extend(bytes),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let _ = self.qemu.0.wait();
                    return Err(self.broken("QEMU ended"));
                }
            }
        }
    }

    fn send(&mut self, message: &ToInner) -> Result<(), NestedError> {
        let payload = serde_json::to_vec(message).unwrap_or_default();
        self.stdin
            .write_all(&frame::encode(&payload))
            .and_then(|()| self.stdin.flush())
            .map_err(|source| NestedError::Io {
                what: "sending a run to the nested session".into(),
                source,
            })
    }

    fn run_one(
        &mut self,
        run: &ResolvedRun,
    ) -> Result<(RunRecord, Option<String>), NestedRunError> {
        let (wire, bytes) = WireRun::of(run);
        // The boot sources the inner side lacks, laid out in the window.
        let mut blobs = Vec::new();
        let mut offset = 0u64;
        for b in &bytes {
            let blob = crate::backend::nested::wire::BlobRef::of(b);
            if self.held.contains(&blob.sha256) || blobs.iter().any(|a: &BlobAt| a.blob == blob) {
                continue;
            }
            if offset + blob.len > BLOB_WINDOW_BYTES {
                return Err(NestedError::Setup(format!(
                    "the run's boot sources take more than the session's window of {} MiB",
                    BLOB_WINDOW_BYTES >> 20
                ))
                .into());
            }
            self.window
                .write_all_at(b, offset)
                .map_err(|source| NestedError::Io {
                    what: "writing a boot source to the session's window".into(),
                    source,
                })?;
            blobs.push(BlobAt { blob, offset });
            offset = (offset + b.len() as u64).next_multiple_of(4096);
        }
        let sent: Vec<String> = blobs.iter().map(|b| b.blob.sha256.clone()).collect();
        self.send(&ToInner::Run { run: wire, blobs })?;
        let deadline = Instant::now() + run.config.timeout + RUN_ALLOWANCE;
        match self.receive(deadline)? {
            FromInner::Ran { record, console } => {
                self.held.extend(sent);
                record.map(|r| (*r, console)).map_err(NestedRunError::Inner)
            }
            _ => Err(self.broken("a message that is not a run's result").into()),
        }
    }
}

impl Session for Live {
    fn facts(&self) -> (host_cache::Facts, Option<std::path::PathBuf>) {
        (self.facts.clone(), self.outer_plugin.clone())
    }

    fn run(&mut self, run: &ResolvedRun) -> Result<(RunRecord, Option<String>), NestedRunError> {
        self.run_one(run)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The session's messages cross the port as frames, each way: a
    /// stream holding the ready message and a run's result (after console
    /// noise) gives them back in order and whole, without a boot.
    #[test]
    fn session_messages_cross_the_port_framed() {
        let ready = FromInner::Ready {
            facts: Box::new(host_cache::Facts {
                pcid: Some(Some((false, "no PCID".into()))),
                ..Default::default()
            }),
            outer_plugin: Some("/sys/bus/pci/devices/x/resource2".into()),
        };
        let failed = FromInner::Ran {
            record: Err("the boot source abc is not in this session".into()),
            console: Some("@result workload=getpid\n".into()),
        };
        let mut port = b"[    0.000000] Linux version 6.1\n".to_vec();
        for m in [&ready, &failed] {
            port.extend(frame::encode(&serde_json::to_vec(m).unwrap()));
        }
        let mut buf = Vec::new();
        let mut got = Vec::new();
        for piece in port.chunks(16) {
            buf.extend_from_slice(piece);
            while let Some(p) = frame::take(&mut buf) {
                got.push(serde_json::from_slice::<FromInner>(&p.unwrap()).unwrap());
            }
        }
        assert_eq!(got.len(), 2);
        match &got[0] {
            FromInner::Ready {
                facts,
                outer_plugin,
            } => {
                assert_eq!(facts.pcid, Some(Some((false, "no PCID".into()))));
                assert!(outer_plugin.as_deref().unwrap().ends_with("resource2"));
            }
            other => panic!("{other:?}"),
        }
        match &got[1] {
            FromInner::Ran { record, console } => {
                assert!(record.as_ref().unwrap_err().contains("not in this session"));
                assert_eq!(console.as_deref(), Some("@result workload=getpid\n"));
            }
            other => panic!("{other:?}"),
        }
        // And inwards: a run request, blobs placed in the window.
        let run = ToInner::Run {
            run: serde_json::from_value(serde_json::json!({
                "mem_mib": 128, "asked": {"pti": null, "pcid": null, "entry": "auto",
                "workload": null, "iterations": null, "extra": ""},
                "timeout": {"secs": 10, "nanos": 0}, "cpu_vuln": "host", "irqchip": true,
                "cpus": 1, "console": false, "image": {"sha256": "ab", "len": 2},
                "image_name": "embedded", "initrd": null, "cmdline": "pti=on",
                "guest": {"pti": null, "pcid": null, "entry": null, "workload": null,
                "iterations": null, "extra": ""}, "entry_guessed": false, "linux": null
            }))
            .unwrap(),
            blobs: vec![BlobAt {
                blob: crate::backend::nested::wire::BlobRef {
                    sha256: "ab".into(),
                    len: 2,
                },
                offset: 0,
            }],
        };
        let mut buf = frame::encode(&serde_json::to_vec(&run).unwrap());
        let back: ToInner =
            serde_json::from_slice(&frame::take(&mut buf).unwrap().unwrap()).unwrap();
        assert_eq!(back, run);
    }
}
