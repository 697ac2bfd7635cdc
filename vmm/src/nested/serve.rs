//! The inner half of a `--backend nested` session: `ptiscope nested-serve`,
//! started by the init ([`super::init`]) once KVM is loaded. It probes its
//! KVM (the facts the outer side settles runs with), says it is ready, then
//! serves runs until the machine is stopped: each [`ToInner::Run`] is made
//! a run again ([`crate::backend::nested::wire::WireRun::resolve`], its
//! boot sources copied out of the blob window and checked by SHA-256, kept
//! for later runs), run with the
//! KVM backend ([`Kvm`], built with this KVM's facts: nested, and the
//! outer plugin's live file), and its record sent back.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;

use super::frame;
use crate::backend::nested::wire::{sha256_hex, BlobAt, FromInner, ToInner};
use crate::backend::{Backend, HostWatch, Kvm};
use crate::observe::outer_plugin::LiveFile;
use crate::output::SerialOut;
use crate::probe::host::HostFacts;

/// Where a run's console is kept inside when it goes back.
const CONSOLE: &str = "/tmp/nested-console";
/// The most console bytes sent back with a run (the UART is slow).
const MAX_CONSOLE: usize = 256 << 10;

/// Opens `path` (the result port) for reading and writing in raw mode.
fn open_raw(path: &Path) -> Result<std::fs::File, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let fd = tty.as_raw_fd();
    super::make_raw(fd);
    Ok(tty)
}

fn send(tty: &mut std::fs::File, message: &FromInner) {
    let payload = serde_json::to_vec(message).unwrap_or_default();
    let _ = tty.write_all(&frame::encode(&payload));
    // SAFETY: waits until the tty has sent what was written.
    unsafe { libc::tcdrain(tty.as_raw_fd()) };
}

/// Copies `at` out of the blob window, checked.
fn take_blob(window: &LiveFile, at: &BlobAt) -> Result<Arc<[u8]>, String> {
    let bytes = window.copy(at.offset, at.blob.len)?;
    let got = sha256_hex(&bytes);
    if got != at.blob.sha256 {
        return Err(format!(
            "a boot source in the window differs from its SHA-256 (sent {}, got {got})",
            at.blob.sha256
        ));
    }
    Ok(bytes.into())
}

/// Runs `nested-serve` ([`crate::cli::NestedServeArgs`]); returns only when
/// the port fails.
pub fn serve(args: &crate::cli::NestedServeArgs) -> i32 {
    let mut tty = match open_raw(&args.tty) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("ptiscope nested-serve: {e}");
            return 70;
        }
    };
    let window = args
        .blob_window
        .as_deref()
        .map(|p| LiveFile::open_bounded(p, super::contract::BLOB_WINDOW_BYTES as usize));
    let facts = Arc::new(HostFacts::read_as(true, args.outer_plugin.clone()));
    // What the reports carry, probed here once: the outer side settles and
    // reports with these.
    facts.settle_report_facts();
    send(
        &mut tty,
        &FromInner::Ready {
            facts: Box::new(facts.known_facts()),
            outer_plugin: args.outer_plugin.as_ref().map(|p| p.display().to_string()),
        },
    );
    let kvm = Kvm::new(facts.clone());
    let mut held: HashMap<String, Arc<[u8]>> = HashMap::new();
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 4096];
    loop {
        let message = loop {
            if let Some(m) = frame::take(&mut buf) {
                break m;
            }
            match tty.read(&mut chunk) {
                Ok(0) => std::thread::sleep(std::time::Duration::from_millis(10)),
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    eprintln!("ptiscope nested-serve: reading the port: {e}");
                    return 70;
                }
            }
        };
        let reply = match message
            .and_then(|p| serde_json::from_slice::<ToInner>(&p).map_err(|e| e.to_string()))
        {
            Err(e) => FromInner::Ran {
                record: Err(format!("the request: {e}")),
                console: None,
            },
            Ok(ToInner::Run { run, blobs }) => {
                let mut failed = None;
                for at in &blobs {
                    let got = match &window {
                        Some(Ok(w)) => take_blob(w, at),
                        Some(Err(e)) => Err(format!("the blob window: {e}")),
                        None => Err("no blob window in this session".into()),
                    };
                    match got {
                        Ok(b) => {
                            held.insert(at.blob.sha256.clone(), b);
                        }
                        Err(e) => failed = Some(e),
                    }
                }
                let console = run.console;
                let out = if console {
                    let _ = std::fs::remove_file(CONSOLE);
                    SerialOut::File(CONSOLE.into())
                } else {
                    SerialOut::Discard
                };
                let record = match failed {
                    Some(e) => Err(e),
                    None => run
                        .resolve(|r| held.get(&r.sha256).cloned(), out)
                        .map_err(|e| e.to_string())
                        .and_then(|resolved| {
                            let ran = kvm
                                .run(&resolved, HostWatch::default())
                                .map_err(|e| e.to_string())?;
                            let words = crate::cli::compare::config_words(&ran.outcome);
                            Ok(Box::new(ran.record("nested", &resolved, words)))
                        }),
                };
                FromInner::Ran {
                    record,
                    console: console.then(|| {
                        let bytes = std::fs::read(CONSOLE).unwrap_or_default();
                        let tail = &bytes[bytes.len().saturating_sub(MAX_CONSOLE)..];
                        String::from_utf8_lossy(tail).into_owned()
                    }),
                }
            }
        };
        send(&mut tty, &reply);
    }
}
