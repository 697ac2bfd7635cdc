//! The outer half of `--backend nested`: finds the fetched kernel and its
//! KVM modules, packs the initramfs in memory (ptiscope, the shared
//! libraries it maps and their loader, the modules, the request and the
//! jobs' input files), boots it under QEMU TCG, and reads the framed
//! response back from the result port.
//!
//! Everything QEMU reads or writes is a memfd (`/proc/self/fd/N`): nothing
//! is written to the file system, so nothing is left behind however
//! ptiscope ends. QEMU dies with ptiscope (`PR_SET_PDEATHSIG`), and is
//! stopped (SIGTERM, then SIGKILL) at the deadline, on SIGINT/SIGTERM/SIGHUP
//! and on any error.

use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::contract::LIVE_BYTES;
use super::error::NestedError;
use super::payload::{find_kernel, initramfs, Extra};
use super::{frame, Request, Response, INIT_ENV};
use crate::input::{read_regular, READ_TIME_LIMIT};
use crate::signals;

/// How long the inner Linux gets to boot, load the modules and power off
/// around its jobs (it takes 3-10 s here; QEMU 10 under load, more).
pub const BOOT_ALLOWANCE: Duration = Duration::from_secs(120);

/// An anonymous memory file QEMU reads or writes through `/proc/self/fd/N`.
pub(super) fn memfd(name: &std::ffi::CStr, content: &[u8]) -> Result<std::fs::File, NestedError> {
    use std::os::fd::FromRawFd;
    // SAFETY: a valid NUL-terminated name and flags; the result is checked.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(NestedError::Io {
            what: "creating an in-memory file".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: a fresh descriptor owned by nobody else.
    let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
    f.write_all(content).map_err(|source| NestedError::Io {
        what: "writing an in-memory file".into(),
        source,
    })?;
    Ok(f)
}

pub(super) fn read_back(f: &mut std::fs::File, limit: u64) -> Vec<u8> {
    let mut buf = Vec::new();
    if f.seek(std::io::SeekFrom::Start(0)).is_ok() {
        let _ = f.take(limit).read_to_end(&mut buf);
    }
    buf
}

/// The last `n` lines of a console, escaped for the terminal.
pub(super) fn console_tail(bytes: &[u8], n: usize) -> Vec<String> {
    let mut safe = Vec::new();
    ptiscope_devices::console::escape_for_terminal(bytes, &mut safe);
    let text = String::from_utf8_lossy(&safe).replace('\r', "");
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// The user and system CPU seconds of this process's reaped children (QEMU
/// is the only child of a nested session).
fn children_cpu_secs() -> f64 {
    // SAFETY: getrusage(2) into a struct we own.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_CHILDREN is a valid `who`.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

/// Logs (debug level) where a session's time went: QEMU's wall and CPU
/// time, and the init's trace lines from the console (when each set-up
/// step ended, in seconds after the inner kernel started).
fn log_session(wall: Duration, cpu: f64, console: &[u8]) {
    log::debug!(
        "nested: QEMU ran {:.2} s, {cpu:.2} s of CPU (user + system)",
        wall.as_secs_f64()
    );
    let mut safe = Vec::new();
    ptiscope_devices::console::escape_for_terminal(console, &mut safe);
    for line in String::from_utf8_lossy(&safe).lines() {
        if let Some(step) = line
            .trim_end_matches('\r')
            .strip_prefix(super::contract::TRACE_PREFIX)
        {
            log::debug!("nested: init: {step}");
        }
    }
}

/// Stops QEMU (SIGTERM, SIGKILL after half a second) and reaps it, unless
/// it already ended.
pub(super) struct Qemu(pub(super) std::process::Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            // SAFETY: kill(2) on our own unreaped child.
            unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
            let until = Instant::now() + Duration::from_millis(500);
            while Instant::now() < until {
                if let Ok(Some(_)) = self.0.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The outer QEMU's arguments for its plugin (`observe::outer_plugin`):
/// the plugin counting the SVM guest only (`svm=1`), its markers the Linux
/// init's (`umark=`), its kernel both Linux kernel halves (i386's top
/// gigabyte, x86_64's upper half: the inner guest may be either, and
/// neither runs code in the other's), rewriting `live` at each marker;
/// `live` shared with the outer machine as an ivshmem device's memory.
pub(super) fn outer_plugin_args(plugin: &Path, live: &str) -> Vec<String> {
    use crate::observe::qemu_plugin::{kernel_ranges, ranges_arg, LINUX_MARK_PORT};
    let (mut kernel, _) = kernel_ranges(true, false);
    kernel.extend(kernel_ranges(false, false).0);
    vec![
        "-object".into(),
        format!("memory-backend-file,id=ptiscope-live,size={LIVE_BYTES},mem-path={live},share=on"),
        "-device".into(),
        "ivshmem-plain,memdev=ptiscope-live".into(),
        "-plugin".into(),
        format!(
            "file={},out=/dev/null,kernel={},umark={LINUX_MARK_PORT:#x},svm=1,live={live}",
            // QEMU's option syntax: a comma inside a value is doubled.
            plugin.display().to_string().replace(',', ",,"),
            ranges_arg(&kernel)
        ),
    ]
}

/// What the outer kernel skips that a nested session does not need, each
/// paid under TCG at every session: the crypto API's self-tests of every
/// algorithm it registers (about 0.2 s of the boot), the audit subsystem,
/// and zeroing every page it allocates (the initramfs's page cache, its own
/// tables; user memory, the inner guests' included, is zeroed anyway).
/// Together 0.5 s of QEMU's CPU time of a session that boots, loads the
/// modules and powers off (3.8 s before; docs/results.md).
const OUTER_BOOT_ARGS: &str = "cryptomgr.notests audit=0 init_on_alloc=0";

/// The QEMU binary (`$PTISCOPE_NESTED_QEMU` for a test that names a missing one).
pub(super) fn qemu_binary() -> String {
    std::env::var("PTISCOPE_NESTED_QEMU").unwrap_or_else(|_| "qemu-system-x86_64".into())
}

/// The first QEMU release measured to break shadow paging under its SVM.
const SHADOW_BROKEN_FROM: (u32, u32, u32) = (10, 0, 0);

/// Whether the outer QEMU runs `kvm_amd npt=0` correctly: why not, if it
/// does not. Measured: QEMU 7.2 does (ptiscope's guest's CR3 writes and
/// KVM's `tlb_flush` agree exactly; Linux boots and runs); QEMU 10.0.2
/// does not: a guest's intercepted `mov %cr3, reg` reads back a value that
/// is not its CR3 (ptiscope's guest triple-faults at the CR3 write that
/// follows, at its first switch to user mode; Linux never prints a line),
/// whatever the CPU model or SVM sub-features. Versions between are
/// unmeasured and allowed.
pub fn shadow_paging_works() -> Result<(), String> {
    let binary = qemu_binary();
    let version = crate::backend::qemu::qemu_support(&binary)
        .ok()
        .and_then(|s| s.version);
    match version {
        Some(v) if v >= SHADOW_BROKEN_FROM => Err(format!(
            "--nested-paging shadow: {binary} is QEMU {}.{}.{}, whose SVM breaks KVM's shadow \
             paging (a guest's intercepted CR3 read returns a value that is not its CR3; \
             measured with 10.0.2, docs/kvm-hosts.md): use --nested-paging npt, or QEMU 7.2",
            v.0, v.1, v.2
        )),
        _ => Ok(()),
    }
}

/// Boots the inner Linux with `request` and returns its response: vCPUs
/// `cpus` (the inner guest's, at least 1), the deadline the boot allowance plus the jobs'
/// bounds. `progress` hears each stage.
pub fn run(
    request: &Request,
    inputs: &[(String, Vec<u8>)],
    cpus: u32,
    progress: &mut dyn FnMut(&str),
) -> Result<Response, NestedError> {
    run_with(request, inputs, &Extra::default(), cpus, progress)
}

/// [`run`] with `extra`'s executables, libraries and memory.
pub fn run_with(
    request: &Request,
    inputs: &[(String, Vec<u8>)],
    extra: &Extra,
    cpus: u32,
    progress: &mut dyn FnMut(&str),
) -> Result<Response, NestedError> {
    let kernel = find_kernel()?;
    if request.kvm_paging == super::KvmPaging::Shadow {
        shadow_paging_works().map_err(NestedError::QemuBreaksIt)?;
    }
    // The outer QEMU's plugin counts the inner guests' CR3 writes where
    // the inner KVM cannot (nested paging): without it (a QEMU without
    // plugins) the runs go on, and their reports say they have no count.
    let mut request = request.clone();
    let wanted = request.outer_plugin.unwrap_or_else(|| {
        request.kvm_paging == super::KvmPaging::Npt
            && request.jobs.iter().any(super::Job::boots_linux)
    });
    let plugin = outer_plugin(wanted, progress);
    request.outer_plugin = Some(plugin.is_some());
    let request = &request;
    if let Some(s) = signals::wait_termination(Duration::ZERO) {
        return Err(NestedError::Interrupted(s));
    }
    let packing = Instant::now();
    let (initrd, lib_dirs) = initramfs(&kernel, request, inputs, extra)?;
    log::debug!(
        "nested: packed the initramfs ({:.1} MiB) in {:.2} s",
        initrd.len() as f64 / (1 << 20) as f64,
        packing.elapsed().as_secs_f64()
    );
    // Through the bounded reader, as every input: a FIFO in the cache
    // must not block the open, a signal ends the read.
    let vmlinuz = read_regular(
        "the inner Linux's kernel",
        &kernel.vmlinuz,
        crate::machine::loader::MAX_IMAGE_BYTES,
        READ_TIME_LIMIT,
    )?;
    let kernel_fd = memfd(c"ptiscope-nested-kernel", &vmlinuz)?;
    let initrd_fd = memfd(c"ptiscope-nested-initrd", &initrd)?;
    drop(initrd);
    let mut console_fd = memfd(c"ptiscope-nested-console", &[])?;
    let mut result_fd = memfd(c"ptiscope-nested-result", &[])?;
    let live_fd = match plugin {
        Some(_) => {
            let f = memfd(c"ptiscope-nested-live", &[])?;
            f.set_len(LIVE_BYTES).map_err(|source| NestedError::Io {
                what: "sizing the outer plugin's live file".into(),
                source,
            })?;
            Some(f)
        }
        None => None,
    };
    let mut fds = vec![
        kernel_fd.as_raw_fd(),
        initrd_fd.as_raw_fd(),
        console_fd.as_raw_fd(),
        result_fd.as_raw_fd(),
    ];
    fds.extend(live_fd.as_ref().map(|f| f.as_raw_fd()));
    let cmdline = inner_cmdline(&lib_dirs);
    let mut cmd = machine_command(
        cpus,
        extra.memory_mib.into(),
        [fds[0], fds[1], fds[2]],
        &format!("file:/proc/self/fd/{}", fds[3]),
        &cmdline,
    );
    if let (Some(path), Some(live)) = (&plugin, &live_fd) {
        let live = format!("/proc/self/fd/{}", live.as_raw_fd());
        cmd.args(outer_plugin_args(path, &live));
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        // Its own process group: a Ctrl-C at the terminal reaches ptiscope
        // only, which stops QEMU and says why (rather than QEMU ending
        // first and looking like a crash).
        .process_group(0);
    // QEMU dies with ptiscope, and inherits only these descriptors.
    crate::backend::qemu::die_with_ptiscope_inheriting(&mut cmd, fds.to_vec());
    let bounds: f64 = request.jobs.iter().map(|j| j.timeout_secs).sum();
    let deadline = BOOT_ALLOWANCE + Duration::from_secs_f64(bounds);
    progress(&format!(
        "booting Linux with KVM (kvm_amd, {}) under QEMU TCG, {} job(s), deadline {:.0} s",
        request.kvm_paging.describe(),
        request.jobs.len(),
        deadline.as_secs_f64()
    ));
    let start = Instant::now();
    let cpu_before = children_cpu_secs();
    let mut qemu = Qemu(cmd.spawn().map_err(NestedError::NoQemu)?);
    let stderr = qemu.0.stderr.take();
    let stderr = std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut e) = stderr {
            let _ = (&mut e).take(64 << 10).read_to_end(&mut buf);
        }
        String::from_utf8_lossy(&buf).trim().to_string()
    });
    let status = loop {
        match qemu.0.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) => {}
            Err(source) => {
                return Err(NestedError::Io {
                    what: "waiting for QEMU".into(),
                    source,
                })
            }
        }
        if let Some(s) = signals::wait_termination(Duration::from_millis(50)) {
            drop(qemu);
            return Err(NestedError::Interrupted(s));
        }
        if start.elapsed() >= deadline {
            drop(qemu);
            return Err(NestedError::Timeout {
                secs: deadline.as_secs_f64(),
                boot: BOOT_ALLOWANCE.as_secs(),
                console: console_tail(&read_back(&mut console_fd, 1 << 20), 12),
            });
        }
    };
    // A signal that came as QEMU ended is still the cause.
    if let Some(s) = signals::wait_termination(Duration::ZERO) {
        return Err(NestedError::Interrupted(s));
    }
    let qemu_stderr = stderr.join().unwrap_or_default();
    if log::log_enabled!(log::Level::Debug) {
        log_session(
            start.elapsed(),
            children_cpu_secs() - cpu_before,
            &read_back(&mut console_fd, 1 << 20),
        );
    }
    let port = read_back(&mut result_fd, 256 << 20);
    let decoded = frame::decode(&port).and_then(|p| {
        serde_json::from_slice::<Response>(&p)
            .map_err(|e| format!("the result does not parse: {e}"))
    });
    match decoded {
        Ok(r) => {
            for (i, j) in r.jobs.iter().enumerate() {
                log::debug!(
                    "nested: job {} took {:.2} s inside (status {})",
                    i + 1,
                    j.secs,
                    j.status
                );
            }
            progress(&format!(
                "the nested session took {:.1} s",
                start.elapsed().as_secs_f64()
            ));
            match &r.setup_error {
                Some(e) => Err(NestedError::Setup(e.clone())),
                None => Ok(r),
            }
        }
        Err(why) => {
            use std::os::unix::process::ExitStatusExt;
            let how = match (status.code(), status.signal()) {
                (Some(c), _) => format!("exit {c}"),
                (None, Some(s)) => format!("killed by signal {s}"),
                _ => status.to_string(),
            };
            let why = if qemu_stderr.is_empty() {
                why
            } else {
                format!("{why}; QEMU said: {qemu_stderr}")
            };
            Err(NestedError::NoResponse {
                how,
                why,
                console: console_tail(&read_back(&mut console_fd, 1 << 20), 12),
            })
        }
    }
}

/// ptiscope's TCG plugin for the outer QEMU, if `wanted` (a Linux guest
/// under nested paging, whose CR3 writes the inner KVM cannot see) and
/// this QEMU loads plugins; without it the runs go on and say they have
/// no count (`progress` hears why).
pub(super) fn outer_plugin(
    wanted: bool,
    progress: &mut dyn FnMut(&str),
) -> Option<std::path::PathBuf> {
    if !wanted {
        return None;
    }
    match crate::backend::qemu::plugin_for(&qemu_binary()) {
        Ok((path, _)) => Some(path),
        Err(e) => {
            progress(&format!(
                "no CR3 count from the outer QEMU for the Linux guests: {e}"
            ));
            None
        }
    }
}

/// The outer QEMU's command line: `cpus` vCPUs, `memory_mib` of RAM (0:
/// 2048), the kernel, initrd and console memfds (`fds`), the result port
/// (the second serial port: a memfd for a batch, stdio for a session)
/// and the inner kernel's command line. One command for batches and
/// sessions.
pub(super) fn machine_command(
    cpus: u32,
    memory_mib: u64,
    fds: [std::os::fd::RawFd; 3],
    result_port: &str,
    cmdline: &str,
) -> Command {
    // As many vCPUs as the inner guest has, not more: with two under a
    // one-vCPU Linux guest on the VMM, about half of the boots stalled
    // (in alternatives patching, in clocksource_done_booting, in
    // blkcg_init...); with one, 6 of 6 reached the init, in half the time
    // (docs/linux-guests.md).
    let cpus = cpus.max(1);
    let mut cmd = Command::new(qemu_binary());
    // thread=single: MTTCG (`thread=multi`) stalled one two-vCPU boot in
    // seven here; round-robin never did.
    // la57=off: QEMU's `max` has 5-level paging, which Linux then uses
    // inside and out (and KVM's nested page tables with it): every TLB
    // fill of the inner guest walks deeper. Without it an inner Linux run
    // took 16 % less CPU (QEMU 10.0.2, 2 x 2 sessions); most hardware has
    // 4 levels too.
    cmd.args([
        "-accel",
        "tcg,thread=single",
        "-M",
        "q35",
        "-cpu",
        "max,la57=off",
    ])
    .args(["-smp", &cpus.to_string(), "-m"])
    .arg(format!(
        "{}M",
        if memory_mib == 0 { 2048 } else { memory_mib }
    ))
    .args([
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
    ])
    .arg("-kernel")
    .arg(format!("/proc/self/fd/{}", fds[0]))
    .arg("-initrd")
    .arg(format!("/proc/self/fd/{}", fds[1]))
    .arg("-serial")
    .arg(format!("file:/proc/self/fd/{}", fds[2]))
    .arg("-serial")
    .arg(result_port)
    .args(["-append", cmdline]);
    cmd
}

/// The inner kernel's command line: ptiscope is its init, finding its
/// libraries in `lib_dirs`.
pub(super) fn inner_cmdline(lib_dirs: &[String]) -> String {
    let mut cmdline = format!(
        "console=ttyS0 quiet loglevel=4 panic=-1 {OUTER_BOOT_ARGS} {INIT_ENV}=1 LD_LIBRARY_PATH={}",
        lib_dirs.join(":")
    );
    // At debug level the init says on the console when each set-up step
    // ended (logged with each job's time).
    if log::log_enabled!(log::Level::Debug) {
        cmdline.push_str(&format!(" {}=1", super::contract::TRACE_ENV));
        // And the inner commands log as the outer does (the kernel hands
        // an unknown `NAME=VALUE` to the init's environment; a value with
        // a space or quote would not survive the command line).
        if let Ok(v) = std::env::var("RUST_LOG") {
            if !v.is_empty() && v.chars().all(|c| c.is_ascii_graphic() && c != '"') {
                cmdline.push_str(&format!(" RUST_LOG={v}"));
            }
        }
    }
    cmdline
}
