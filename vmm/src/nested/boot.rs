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
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{frame, init, Request, Response, INIT_ENV};
use crate::cli::exit_code;
use crate::input::{read_regular, READ_TIME_LIMIT};
use crate::preflight::linux::initramfs::Archive;
use crate::signals;

/// How long the inner Linux gets to boot, load the modules and power off
/// around its jobs (it takes 3-10 s here; QEMU 10 under load, more).
pub const BOOT_ALLOWANCE: Duration = Duration::from_secs(120);

/// Why a nested session gave no response.
#[derive(Debug, thiserror::Error)]
pub enum NestedError {
    /// No fetched kernel, or it has no KVM modules.
    #[error("{0}")]
    NoKernel(String),
    /// QEMU could not be started.
    #[error(
        "cannot start qemu-system-x86_64: {0} (install QEMU: `apt-get install qemu-system-x86`)"
    )]
    NoQemu(std::io::Error),
    /// The inner Linux could not set up KVM.
    #[error("the inner Linux could not set up KVM: {0}")]
    Setup(String),
    /// `--nested-paging shadow`, or a Linux guest on the VMM, under a QEMU
    /// whose SVM breaks it.
    #[error("{0}")]
    QemuBreaksIt(String),
    /// QEMU ended without a response.
    #[error(
        "QEMU ended ({how}) without a result from the inner ptiscope: {why}{}",
        tail_text(console)
    )]
    NoResponse {
        /// How QEMU ended.
        how: String,
        /// What was wrong with the result port.
        why: String,
        /// The console's last lines.
        console: Vec<String>,
    },
    /// The deadline passed.
    #[error("the nested session ran past its deadline of {secs:.0} s (boot allowance {boot} s + the inner commands' bounds) and was stopped{}", tail_text(console))]
    Timeout {
        /// The deadline.
        secs: f64,
        /// The boot allowance.
        boot: u64,
        /// The console's last lines.
        console: Vec<String>,
    },
    /// A termination signal stopped it.
    #[error("{}; QEMU was stopped", signals::describe(*.0))]
    Interrupted(i32),
    /// A file of the kernel cache (the inner Linux's kernel, a module)
    /// could not be read (it names the file).
    #[error("{0}")]
    Input(#[from] crate::input::InputError),
    /// An I/O step failed.
    #[error("{what}: {source}")]
    Io {
        /// What was done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

fn tail_text(console: &[String]) -> String {
    if console.is_empty() {
        String::new()
    } else {
        format!("\ninner console (last lines):\n  {}", console.join("\n  "))
    }
}

impl NestedError {
    /// The exit status this error ends the command with.
    pub fn exit_code(&self) -> i32 {
        match self {
            NestedError::NoKernel(_)
            | NestedError::NoQemu(_)
            | NestedError::Setup(_)
            | NestedError::QemuBreaksIt(_) => exit_code::KVM_UNAVAILABLE,
            NestedError::Timeout { .. } => exit_code::TIMEOUT,
            NestedError::Interrupted(s) => 128 + s,
            NestedError::Input(e) => e.signal().map_or(exit_code::KVM_UNAVAILABLE, |s| 128 + s),
            NestedError::NoResponse { .. } | NestedError::Io { .. } => exit_code::INTERNAL,
        }
    }
}

/// The fetched kernel and its modules.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// vmlinuz.
    pub vmlinuz: PathBuf,
    /// The module files, in load order.
    pub modules: Vec<PathBuf>,
}

/// The `debian-amd64` kernel of the cache, with the modules
/// [`init::MODULES`] names; an error saying how to get them.
pub fn find_kernel() -> Result<Kernel, NestedError> {
    let dir = crate::preflight::linux::fetch::cache_dir()
        .map(|d| d.join("debian-amd64"))
        .ok_or_else(|| {
            NestedError::NoKernel(
                "no kernel cache can be named (set PTISCOPE_LINUX_CACHE or HOME)".into(),
            )
        })?;
    kernel_in(&dir)
}

/// The kernel and modules in `dir` (`vmlinuz`, `modules/*.ko`).
pub fn kernel_in(dir: &Path) -> Result<Kernel, NestedError> {
    let vmlinuz = dir.join("vmlinuz");
    let fetch =
        "run `ptiscope linux fetch --only debian-amd64` (it keeps the kernel's KVM modules)";
    if !vmlinuz.is_file() {
        return Err(NestedError::NoKernel(format!(
            "--backend nested boots Debian's cloud kernel, and {} is missing: {fetch}",
            vmlinuz.display()
        )));
    }
    let modules: Vec<PathBuf> = init::MODULES
        .iter()
        .map(|name| dir.join("modules").join(name))
        .collect();
    let missing: Vec<String> = modules
        .iter()
        .filter(|m| !m.is_file())
        .map(|m| m.display().to_string())
        .collect();
    if !missing.is_empty() {
        return Err(NestedError::NoKernel(format!(
            "the kernel in {} has no KVM modules ({} missing; a fetch by an older ptiscope kept \
             none): {fetch}",
            dir.display(),
            missing.join(", ")
        )));
    }
    Ok(Kernel { vmlinuz, modules })
}

/// The shared objects this process maps (from /proc/self/maps).
fn mapped_libraries() -> Vec<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut libs: Vec<PathBuf> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.starts_with('/') && (p.ends_with(".so") || p.contains(".so.")))
        .map(PathBuf::from)
        .collect();
    libs.sort();
    libs.dedup();
    libs
}

/// The ELF64 program interpreter (`PT_INTERP`) of an executable, if it has one.
fn interpreter(exe: &[u8]) -> Option<String> {
    let u16_at = |o: usize| Some(u16::from_le_bytes(exe.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(exe.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(exe.get(o..o + 8)?.try_into().ok()?));
    if exe.get(..5)? != b"\x7fELF\x02" {
        return None;
    }
    let phoff = u64_at(0x20)? as usize;
    let (phentsize, phnum) = (u16_at(0x36)? as usize, u16_at(0x38)? as usize);
    (0..phnum).find_map(|i| {
        let ph = phoff + i * phentsize;
        if u32_at(ph)? != 3 {
            return None;
        }
        let (off, size) = (u64_at(ph + 8)? as usize, u64_at(ph + 32)? as usize);
        let bytes = exe.get(off..off + size)?;
        Some(
            String::from_utf8_lossy(bytes)
                .trim_end_matches('\0')
                .to_string(),
        )
    })
}

/// What a session carries beyond ptiscope and the jobs' input files:
/// executables of the host (the test binaries of `nested-exec`), the
/// shared libraries they need, and the inner machine's memory.
#[derive(Debug, Clone, Default)]
pub struct Extra {
    /// (inner path, content) of each executable, packed with mode 0755.
    pub executables: Vec<(String, Vec<u8>)>,
    /// Host shared libraries packed at their own paths (beyond those
    /// ptiscope maps).
    pub libraries: Vec<PathBuf>,
    /// The inner machine's memory in MiB (0: 2048). The initramfs is
    /// unpacked into it, so a session carrying many test binaries needs more.
    pub memory_mib: u32,
}

/// The shared libraries and loader an executable of this host needs, as
/// `ldd` resolves them; an error naming the ones it cannot find.
pub fn needed_libraries(exe: &Path) -> Result<Vec<PathBuf>, String> {
    let out = Command::new("ldd")
        .arg(exe)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            format!(
                "cannot run ldd on {}: {e} (it comes with glibc)",
                exe.display()
            )
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    if text.contains("not a dynamic executable") || text.contains("statically linked") {
        return Ok(Vec::new());
    }
    if !out.status.success() {
        return Err(format!(
            "ldd {}: {}",
            exe.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let mut libs = Vec::new();
    for line in text.lines() {
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)`, the loader
        // as `/lib64/ld-linux-x86-64.so.2 (0x...)`, the vDSO without a path.
        let target = line.split_once("=>").map_or(line, |(_, t)| t).trim();
        if target.starts_with("not found") {
            return Err(format!(
                "{} needs {} which ldd cannot find here",
                exe.display(),
                line.trim()
            ));
        }
        if let Some(path) = target
            .split_whitespace()
            .next()
            .filter(|p| p.starts_with('/'))
        {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

/// The initramfs: ptiscope as `/init` with its libraries and loader, the
/// modules, the request, `inputs` (inner path, content) and `extra`'s
/// executables and libraries.
pub fn initramfs(
    kernel: &Kernel,
    request: &Request,
    inputs: &[(String, Vec<u8>)],
    extra: &Extra,
) -> Result<(Vec<u8>, Vec<String>), NestedError> {
    let io = |what: String| move |source| NestedError::Io { what, source };
    let exe = std::fs::read("/proc/self/exe").map_err(io("reading /proc/self/exe".into()))?;
    let mut a = Archive::default();
    for d in ["dev", "proc", "sys", "tmp", "nested"] {
        a.dir(d);
    }
    a.char_device("dev/console", 0o600, (5, 1));
    a.file("init", 0o755, &exe);
    let mut lib_dirs = Vec::new();
    let mut libs = mapped_libraries();
    for l in &extra.libraries {
        if !libs.contains(l) {
            libs.push(l.clone());
        }
    }
    for lib in libs {
        let bytes = std::fs::read(&lib).map_err(io(format!("reading {}", lib.display())))?;
        a.file(&lib.to_string_lossy(), 0o755, &bytes);
        if let Some(d) = lib.parent().map(|d| d.to_string_lossy().into_owned()) {
            if !lib_dirs.contains(&d) {
                lib_dirs.push(d);
            }
        }
    }
    if let Some(interp) = interpreter(&exe) {
        let bytes = std::fs::read(&interp).map_err(io(format!("reading {interp}")))?;
        a.file(&interp, 0o755, &bytes);
    }
    for (m, name) in kernel.modules.iter().zip(init::MODULES) {
        let bytes = read_regular("KVM module", m, 64 << 20, READ_TIME_LIMIT)?;
        a.file(&format!("{}/{name}", init::MODULE_DIR), 0o644, &bytes);
    }
    let req = serde_json::to_vec(request).unwrap_or_default();
    a.file(init::REQUEST_PATH, 0o644, &req);
    for (path, bytes) in inputs {
        a.file(path, 0o644, bytes);
    }
    for (path, bytes) in &extra.executables {
        a.file(path, 0o755, bytes);
    }
    let archive = a.finish().map_err(io("packing the initramfs".into()))?;
    Ok((archive, lib_dirs))
}

/// An anonymous memory file QEMU reads or writes through `/proc/self/fd/N`.
fn memfd(name: &std::ffi::CStr, content: &[u8]) -> Result<std::fs::File, NestedError> {
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

fn read_back(f: &mut std::fs::File, limit: u64) -> Vec<u8> {
    let mut buf = Vec::new();
    if f.seek(std::io::SeekFrom::Start(0)).is_ok() {
        let _ = f.take(limit).read_to_end(&mut buf);
    }
    buf
}

/// The last `n` lines of a console, escaped for the terminal.
fn console_tail(bytes: &[u8], n: usize) -> Vec<String> {
    let mut safe = Vec::new();
    ptiscope_devices::console::escape_for_terminal(bytes, &mut safe);
    let text = String::from_utf8_lossy(&safe).replace('\r', "");
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// Stops QEMU (SIGTERM, SIGKILL after half a second) and reaps it, unless
/// it already ended.
struct Qemu(std::process::Child);

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

/// The size of the outer plugin's live file (and of the ivshmem device's
/// memory that shows it to the inner Linux): a power of two, as a PCI
/// BAR's, room for thousands of phase markers.
const LIVE_BYTES: u64 = 4 << 20;

/// The outer QEMU's arguments for its plugin (`observe::outer_plugin`):
/// the plugin counting the SVM guest only (`svm=1`), its markers the Linux
/// init's (`umark=`), its kernel both Linux kernel halves (i386's top
/// gigabyte, x86_64's upper half: the inner guest may be either, and
/// neither runs code in the other's), rewriting `live` at each marker;
/// `live` shared with the outer machine as an ivshmem device's memory.
fn outer_plugin_args(plugin: &Path, live: &str) -> Vec<String> {
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

/// The QEMU binary (`$PTISCOPE_NESTED_QEMU` for a test that names a missing one).
fn qemu_binary() -> String {
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
    let plugin = if wanted {
        match crate::backend::qemu::plugin_for(&qemu_binary()) {
            Ok((path, _)) => Some(path),
            Err(e) => {
                progress(&format!(
                    "no CR3 count from the outer QEMU for the Linux guests: {e}"
                ));
                None
            }
        }
    } else {
        None
    };
    request.outer_plugin = Some(plugin.is_some());
    let request = &request;
    if let Some(s) = signals::wait_termination(Duration::ZERO) {
        return Err(NestedError::Interrupted(s));
    }
    let (initrd, lib_dirs) = initramfs(&kernel, request, inputs, extra)?;
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
    let cmdline = format!(
        "console=ttyS0 quiet loglevel=4 panic=-1 {INIT_ENV}=1 LD_LIBRARY_PATH={}",
        lib_dirs.join(":")
    );
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
        if extra.memory_mib == 0 {
            2048
        } else {
            extra.memory_mib
        }
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
    .arg(format!("file:/proc/self/fd/{}", fds[3]))
    .args(["-append", &cmdline]);
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
    let port = read_back(&mut result_fd, 256 << 20);
    let decoded = frame::decode(&port).and_then(|p| {
        serde_json::from_slice::<Response>(&p)
            .map_err(|e| format!("the result does not parse: {e}"))
    });
    match decoded {
        Ok(r) => {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_kernel_or_module_names_the_fetch() {
        let dir = std::env::temp_dir().join(format!("ptiscope-nested-k-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("modules")).unwrap();
        let e = kernel_in(&dir).unwrap_err().to_string();
        assert!(
            e.contains("vmlinuz is missing") && e.contains("linux fetch"),
            "{e}"
        );
        std::fs::write(dir.join("vmlinuz"), b"x").unwrap();
        std::fs::write(dir.join("modules/kvm.ko"), b"x").unwrap();
        let e = kernel_in(&dir).unwrap_err().to_string();
        assert!(
            e.contains("no KVM modules") && e.contains("kvm-amd.ko"),
            "{e}"
        );
        assert!(!e.contains("/kvm.ko,"), "kvm.ko is there: {e}");
        std::fs::write(dir.join("modules/kvm-amd.ko"), b"x").unwrap();
        std::fs::write(dir.join("modules/irqbypass.ko"), b"x").unwrap();
        let k = kernel_in(&dir).unwrap();
        let names: Vec<_> = k
            .modules
            .iter()
            .map(|m| m.file_name().unwrap().to_owned())
            .collect();
        assert_eq!(names, ["irqbypass.ko", "kvm.ko", "kvm-amd.ko"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn this_test_binary_names_its_loader_and_libraries() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        // A dynamically linked test binary (the usual glibc build).
        if let Some(i) = interpreter(&exe) {
            assert!(i.contains("ld-linux"), "{i}");
            assert!(mapped_libraries()
                .iter()
                .any(|l| l.to_string_lossy().contains("libc")));
        }
    }
}
