//! ptiscope as the init of `--backend nested`'s inner Linux (PID 1): mounts
//! /dev, /proc, /sys and /tmp, loads the KVM modules, runs the jobs of
//! `/nested/request.json` with stdin from /dev/null, sends the results
//! back framed on ttyS1, and powers the machine off. Whatever fails, it
//! still sends a response (with `setup_error`) and powers off: the outer
//! ptiscope never waits for a machine that has nothing more to say.

use std::ffi::CString;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::contract::{self, MODULES, MODULE_DIR, REQUEST_PATH, TRACE_ENV, TRACE_PREFIX};
use super::{frame, JobResult, Request, Response, INIT_ENV};
use crate::spec::nested::{KvmPaging, INNER_ENV};

/// The result port.
const RESULT_TTY: &str = "/dev/ttyS1";

fn cstr(s: &str) -> CString {
    CString::new(s).unwrap_or_default()
}

fn mount(source: &str, target: &str, fstype: &str) -> Result<(), String> {
    let _ = std::fs::create_dir_all(target);
    // SAFETY: NUL-terminated strings that outlive the call; no data argument.
    let r = unsafe {
        libc::mount(
            cstr(source).as_ptr(),
            cstr(target).as_ptr(),
            cstr(fstype).as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EBUSY) {
            return Err(format!("mounting {fstype} on {target}: {e}"));
        }
    }
    Ok(())
}

/// Loads one module file with `finit_module`; an already loaded one is fine.
fn load_module(path: &str, params: &str) -> Result<(), String> {
    let file = std::fs::File::open(path).map_err(|e| format!("opening {path}: {e}"))?;
    let params = cstr(params);
    // SAFETY: finit_module(2) on an open descriptor, a NUL-terminated
    // parameter string and no flags.
    let r = unsafe { libc::syscall(libc::SYS_finit_module, file.as_raw_fd(), params.as_ptr(), 0) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(format!("loading {path}: {e}"));
        }
    }
    Ok(())
}

/// The kernel log's lines that name kvm or SVM (why a module refused).
fn kvm_log_lines() -> String {
    let mut buf = vec![0u8; 1 << 16];
    // SAFETY: syslog(2) SYSLOG_ACTION_READ_ALL (3) into a buffer we own of the given length.
    let n = unsafe { libc::klogctl(3, buf.as_mut_ptr().cast(), buf.len() as libc::c_int) };
    if n <= 0 {
        return String::new();
    }
    String::from_utf8_lossy(&buf[..n as usize])
        .lines()
        .filter(|l| l.contains("kvm") || l.contains("SVM") || l.contains("svm"))
        .map(str::trim)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Prints `step` with the seconds since the inner kernel started (its
/// boot clock) on the console, if the outer asked for a trace.
fn trace(step: &str) {
    if std::env::var_os(TRACE_ENV).is_none() {
        return;
    }
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) into a timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut t) };
    eprintln!(
        "{TRACE_PREFIX}{:.3} s after boot: {step}",
        t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
    );
}

/// Sets up KVM with `paging`: the setup's steps, or why it failed.
fn setup(paging: KvmPaging, steps: &mut Vec<String>) -> Result<(), String> {
    trace("init started");
    mount("devtmpfs", "/dev", "devtmpfs")?;
    mount("proc", "/proc", "proc")?;
    mount("sysfs", "/sys", "sysfs")?;
    mount("tmpfs", "/tmp", "tmpfs")?;
    // Where the jobs' output files are redirected (nested::cli::rewrite).
    std::fs::create_dir_all("/tmp/out").map_err(|e| format!("creating /tmp/out: {e}"))?;
    trace("mounted /dev, /proc, /sys, /tmp");
    for name in MODULES {
        let params = if name == "kvm-amd.ko" {
            paging.module_parameter()
        } else {
            ""
        };
        let path = format!("{MODULE_DIR}/{name}");
        load_module(&path, params).map_err(|e| {
            let log = kvm_log_lines();
            if log.is_empty() {
                e
            } else {
                format!("{e} (kernel log: {log})")
            }
        })?;
        steps.push(format!("loaded {name} {params}").trim_end().to_string());
        trace(&format!("loaded {name}"));
    }
    if !std::path::Path::new("/dev/kvm").exists() {
        // devtmpfs makes it; a kernel without devtmpfs gets the node made here.
        // SAFETY: mknod(2) of a character device (misc 10:232, KVM's) at a NUL-terminated path.
        let r = unsafe {
            libc::mknod(
                c"/dev/kvm".as_ptr(),
                libc::S_IFCHR | 0o666,
                libc::makedev(10, 232),
            )
        };
        if r != 0 {
            return Err(format!(
                "no /dev/kvm after loading the modules, and mknod failed: {}",
                std::io::Error::last_os_error()
            ));
        }
        steps.push("made /dev/kvm (10:232)".into());
    }
    // The parameter as KVM took it: kvm_amd turns NPT off by itself on a
    // CPU without it, and a module loaded before ours keeps its own.
    let npt = std::fs::read_to_string("/sys/module/kvm_amd/parameters/npt").unwrap_or_default();
    let on = matches!(npt.trim(), "1" | "Y");
    if on != (paging == KvmPaging::Npt) {
        return Err(format!(
            "kvm_amd runs with npt={} where {} was asked: /sys/module/kvm_amd/parameters/npt",
            npt.trim(),
            paging.module_parameter()
        ));
    }
    steps.push(format!(
        "kvm_amd {} ({})",
        paging.module_parameter(),
        paging.describe()
    ));
    trace("KVM ready");
    Ok(())
}

/// The ivshmem device's memory (PCI 1af4:1110, its BAR 2 as sysfs's
/// `resource2`) that shows the outer QEMU's plugin's live file
/// (`observe::outer_plugin`): its path, or why there is none.
fn outer_plugin_file() -> Result<String, String> {
    ivshmem_memory(contract::LIVE_BYTES)
}

/// The memory (`resource2`) of the ivshmem device of `bytes` bytes: a
/// session's machine has two, the plugin's live file and the blob window
/// (`nested::session`), told apart by size.
fn ivshmem_memory(bytes: u64) -> Result<String, String> {
    let dir = "/sys/bus/pci/devices";
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{dir}: {e}"))?;
    for e in entries.flatten() {
        let p = e.path();
        let id = |f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default();
        let size = std::fs::metadata(p.join("resource2")).map_or(0, |m| m.len());
        if id("vendor").trim() == "0x1af4" && id("device").trim() == "0x1110" && size == bytes {
            // The BAR is mapped through sysfs, which needs memory decoding on.
            let _ = std::fs::write(p.join("enable"), "1");
            return Ok(p.join("resource2").display().to_string());
        }
    }
    Err(format!(
        "no ivshmem device (1af4:1110) of {} MiB on the PCI bus",
        bytes >> 20
    ))
}

/// Runs one job: `/init ARGS` (ptiscope itself) or the job's own
/// executable, stdin from /dev/null, stopped at its bound; `env` is set
/// for it before its own.
fn run_job(job: &super::Job, env: &[(String, String)]) -> JobResult {
    let start = Instant::now();
    let exe = job.exe.as_deref().unwrap_or("/init");
    let mut cmd = Command::new(exe);
    cmd.args(&job.argv)
        .env_remove(INIT_ENV)
        .env(INNER_ENV, "1")
        .env("HOME", "/tmp")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .envs(job.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(dir) = &job.cwd {
        // A test binary runs where cargo would run it (its package); the
        // directory need not hold anything.
        let _ = std::fs::create_dir_all(dir);
        cmd.current_dir(dir);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return JobResult {
                status: 70,
                stderr: format!("ptiscope (nested init): cannot start {exe}: {e}"),
                ..Default::default()
            }
        }
    };
    let drain = |p: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = p {
                let _ = (&mut p).take(16 << 20).read_to_end(&mut buf);
                let _ = std::io::copy(&mut p, &mut std::io::sink());
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let err = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let bound = Duration::from_secs_f64(job.timeout_secs.max(1.0));
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if start.elapsed() >= bound => {
                let _ = child.kill();
                timed_out = true;
                break child.wait().ok();
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => break None,
        }
    };
    let stdout = out.join().unwrap_or_default();
    let mut stderr = err.join().unwrap_or_default();
    let status = if timed_out {
        stderr.push_str(&format!(
            "ptiscope (nested init): the inner command ran past its bound of {:.0} s and was stopped\n",
            bound.as_secs_f64()
        ));
        crate::cli::exit_code::TIMEOUT
    } else {
        use std::os::unix::process::ExitStatusExt;
        match status {
            Some(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)),
            None => 70,
        }
    };
    let files = job
        .collect
        .iter()
        .filter_map(|p| {
            std::fs::read(p)
                .ok()
                .map(|b| (p.clone(), String::from_utf8_lossy(&b).into_owned()))
        })
        .collect();
    JobResult {
        status,
        stdout,
        stderr,
        files,
        secs: start.elapsed().as_secs_f64(),
    }
}

/// Serves a session ([`Request::serve`]): `ptiscope nested-serve` on the
/// result port, told where the plugin's live file and the blob window
/// are; its end ends the machine. Why it could not start, if it could not.
fn serve(outer_plugin: Option<&str>) -> Result<(), String> {
    let window = ivshmem_memory(contract::BLOB_WINDOW_BYTES)?;
    let mut cmd = Command::new("/init");
    cmd.args([
        "nested-serve",
        "--tty",
        RESULT_TTY,
        "--blob-window",
        &window,
    ])
    .env_remove(INIT_ENV)
    .env("HOME", "/tmp")
    .stdin(Stdio::null());
    if let Some(p) = outer_plugin {
        cmd.args(["--outer-plugin", p]);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start nested-serve: {e}"))?;
    let _ = child.wait();
    Ok(())
}

/// Writes the framed response to ttyS1 (raw mode: no newline translation)
/// and waits until the port has sent it.
fn send(response: &Response) {
    let payload = serde_json::to_vec(response).unwrap_or_default();
    send_payload(&payload);
}

/// Writes a framed payload to ttyS1 (raw mode) and waits until it is sent.
fn send_payload(payload: &[u8]) {
    let framed = frame::encode(payload);
    let Ok(mut tty) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags_noctty()
        .open(RESULT_TTY)
    else {
        eprintln!("ptiscope (nested init): cannot open {RESULT_TTY}");
        return;
    };
    let fd = tty.as_raw_fd();
    super::make_raw(fd);
    let _ = std::io::Write::write_all(&mut tty, &framed);
    // SAFETY: waits until the tty has transmitted what was written.
    unsafe { libc::tcdrain(fd) };
}

trait NoCtty {
    fn custom_flags_noctty(&mut self) -> &mut Self;
}
impl NoCtty for std::fs::OpenOptions {
    fn custom_flags_noctty(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NOCTTY)
    }
}

/// PID 1's whole life: never returns.
pub fn main() -> ! {
    let mut response = Response::default();
    // The request first: it says how KVM is to be loaded.
    let request: Result<Request, String> = std::fs::read(REQUEST_PATH)
        .map_err(|e| format!("reading {REQUEST_PATH}: {e}"))
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()));
    match request {
        Err(e) => response.setup_error = Some(format!("the request: {e}")),
        Ok(r) => match setup(r.kvm_paging, &mut response.setup) {
            Err(e) => response.setup_error = Some(e),
            Ok(()) => {
                let mut env = Vec::new();
                let mut plugin = None;
                if r.outer_plugin == Some(true) {
                    // Not fatal: the runs then say they have no CR3 count.
                    match outer_plugin_file() {
                        Ok(path) => {
                            response
                                .setup
                                .push(format!("the outer QEMU's plugin counts at {path}"));
                            plugin = Some(path.clone());
                            env.push((crate::spec::nested::OUTER_PLUGIN_ENV.to_string(), path));
                        }
                        Err(e) => response
                            .setup
                            .push(format!("no counts from the outer QEMU's plugin: {e}")),
                    }
                }
                if r.serve {
                    // The session's messages are nested-serve's; the init
                    // says only why it could not start it.
                    if let Err(e) = serve(plugin.as_deref()) {
                        let m = crate::backend::nested::wire::FromInner::Unready(e);
                        send_payload(&serde_json::to_vec(&m).unwrap_or_default());
                    }
                    power_off();
                }
                response.jobs = r.jobs.iter().map(|j| run_job(j, &env)).collect();
            }
        },
    }
    if request_serves() && response.setup_error.is_some() {
        let m = crate::backend::nested::wire::FromInner::Unready(
            response.setup_error.clone().unwrap_or_default(),
        );
        send_payload(&serde_json::to_vec(&m).unwrap_or_default());
    } else {
        send(&response);
    }
    power_off()
}

/// Whether the request asks for a session (read again: the set-up failed).
fn request_serves() -> bool {
    std::fs::read(REQUEST_PATH)
        .ok()
        .and_then(|b| serde_json::from_slice::<Request>(&b).ok())
        .is_some_and(|r| r.serve)
}

/// Powers the machine off (QEMU exits); never returns.
fn power_off() -> ! {
    // SAFETY: sync(2) and reboot(2): the machine powers off (QEMU exits).
    unsafe {
        libc::sync();
        libc::reboot(libc::RB_POWER_OFF);
    }
    // reboot failed (not PID 1?): nothing else to do.
    std::process::exit(70)
}
