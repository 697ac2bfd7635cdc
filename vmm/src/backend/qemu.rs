//! `--backend qemu`: the same guest image, the same command line, run under
//! QEMU's TCG (software emulation) instead of our VMM on KVM.
//!
//! For hosts whose KVM cannot run a flavour (the i386 PAE guest on kvm_pvm,
//! which refuses 32-bit paging) and for paths the host lacks (PCID under a
//! QEMU whose TCG has it). It is slower, and the host sees nothing of the
//! guest: no KVM statistics, no VM exits, no telemetry page (QEMU does not
//! reserve one; the guest keeps its counters in its own memory). Every figure
//! of such a run comes from the guest's console (`@result`), and the reports
//! say so, unless the TCG plugin is loaded (the default, `--no-plugin` to
//! run without): `qemu-plugin/` counts instructions, CR3 writes and the
//! other events per vCPU inside QEMU and writes them to a file that
//! [`crate::observe::qemu_plugin`] parses; those rows are host-observed
//! (source `qemu-plugin`).
//!
//! Size: QEMU's version and plugin checks, the memfds it reads the image,
//! the initramfs and the plugin's file through, its start (everything that
//! can fail done first) and its end (SIGTERM, then SIGKILL; the sockets a
//! `--qemu-arg` made removed), the console with the first kernel panic line
//! kept however long the console after it; about 100 lines are tests.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ptiscope_devices::{ConsoleRecorder, ConsoleSink};

use crate::machine::exit::ExitCounts;
use crate::machine::loader;
use crate::machine::{RunOutcome, StopReason};
use crate::observe::qemu_plugin::PluginOutput;
use crate::output::{OpenError, DRAIN_GRACE};
use crate::preflight::PreflightError;
use crate::spec::guest::GuestKind;
use crate::spec::linux::LinuxArch;
use crate::spec::ResolvedRun;

/// Errors of a QEMU-backed run.
#[derive(Debug, thiserror::Error)]
pub enum QemuError {
    /// Resolving the run failed before QEMU started.
    #[error(transparent)]
    Preflight(#[from] PreflightError),
    /// QEMU could not be started.
    #[error("cannot start {binary}: {source} (install QEMU: `apt-get install qemu-system-x86`)")]
    Spawn {
        /// The QEMU binary tried.
        binary: String,
        /// The spawn error.
        #[source]
        source: std::io::Error,
    },
    /// An I/O step around QEMU failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// An output (`--json`, `--serial-out`, ...) could not be opened.
    #[error(transparent)]
    Output(#[from] OpenError),
    /// The TCG plugin was asked for but cannot be used with this QEMU.
    #[error("{0}")]
    Plugin(String),
    /// A CPU model (a compare side's `cpu=`) this QEMU does not have, or
    /// cannot emulate under TCG (`host`); said before QEMU starts.
    #[error("{0}")]
    CpuModel(String),
    /// QEMU ended before the guest reported its exit status.
    #[error("QEMU failed ({how}) before the guest reported a status{}", if stderr.is_empty() { String::new() } else { format!(": {stderr}") })]
    Qemu {
        /// How QEMU ended (`exit N`, `killed by signal N`).
        how: String,
        /// What QEMU printed on stderr, trimmed.
        stderr: String,
    },
}

/// The QEMU system emulator for an image: i386 for ELF32, x86_64 otherwise.
pub fn binary_for(image: &[u8]) -> &'static str {
    if loader::is_elf32(image) {
        "qemu-system-i386"
    } else {
        "qemu-system-x86_64"
    }
}

/// The QEMU system emulator a run boots in: a Linux guest's by the
/// kernel's architecture, the companion's by its image ([`binary_for`]).
pub fn binary_of(run: &ResolvedRun) -> &'static str {
    match &run.guest_kind {
        GuestKind::Linux(l) => match l.arch {
            LinuxArch::X86_64 => "qemu-system-x86_64",
            LinuxArch::I386 => "qemu-system-i386",
        },
        GuestKind::Companion => binary_for(&run.boot.image),
    }
}

/// What an installed QEMU system emulator is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QemuSupport {
    /// `major.minor.micro` from `--version` (None: not understood).
    pub version: Option<(u32, u32, u32)>,
    /// Whether it was built with TCG plugin support (`-plugin` in `-help`).
    pub plugins: bool,
}

/// Parses `QEMU emulator version 7.2.22 (Debian ...)`.
pub fn parse_qemu_version(text: &str) -> Option<(u32, u32, u32)> {
    let rest = text.split("version ").nth(1)?;
    let v = rest
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .next()?;
    let mut it = v.split('.').map(|p| p.parse::<u32>().ok());
    Some((
        it.next()??,
        it.next().flatten().unwrap_or(0),
        it.next().flatten().unwrap_or(0),
    ))
}

/// `binary --version` and `binary -help`, once per binary and process.
pub fn qemu_support(binary: &str) -> Result<QemuSupport, QemuError> {
    use std::collections::HashMap;
    static CACHE: Mutex<Option<HashMap<String, QemuSupport>>> = Mutex::new(None);
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = cache.as_ref().and_then(|c| c.get(binary)) {
        return Ok(s.clone());
    }
    let version = qemu_output(binary, &["--version"])?;
    let help = qemu_output(binary, &["-help"])?;
    let s = QemuSupport {
        version: parse_qemu_version(&String::from_utf8_lossy(&version.stdout)),
        plugins: String::from_utf8_lossy(&help.stdout)
            .lines()
            .any(|l| l.starts_with("-plugin")),
    };
    cache
        .get_or_insert_with(HashMap::new)
        .insert(binary.to_string(), s.clone());
    Ok(s)
}

/// What `binary ARGS` prints on stdout (a query that starts no machine).
fn qemu_output(binary: &str, args: &[&str]) -> Result<std::process::Output, QemuError> {
    Command::new(binary)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|source| QemuError::Spawn {
            binary: binary.to_string(),
            source,
        })
}

/// The CPU models `binary -cpu help` lists (`x86 NAME  description`
/// lines), once per binary and process.
pub fn cpu_models(binary: &str) -> Result<Vec<String>, QemuError> {
    use std::collections::HashMap;
    static CACHE: Mutex<Option<HashMap<String, Vec<String>>>> = Mutex::new(None);
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(m) = cache.as_ref().and_then(|c| c.get(binary)) {
        return Ok(m.clone());
    }
    let out = qemu_output(binary, &["-cpu", "help"])?;
    let models = parse_cpu_models(&String::from_utf8_lossy(&out.stdout));
    cache
        .get_or_insert_with(HashMap::new)
        .insert(binary.to_string(), models.clone());
    Ok(models)
}

/// The model names of `-cpu help`'s output: the second word of each line
/// that starts with the architecture (`x86 Skylake-Client-v1 ...`); the
/// feature flags listed after them are indented and left out.
pub fn parse_cpu_models(help: &str) -> Vec<String> {
    // QEMU up to 8.x writes `x86 NAME  description` lines; 9.0 and later an
    // `Available CPUs:` header, then `  NAME  description` lines up to a
    // blank line (then `Recognized CPUID flags:`, indented too, not models).
    let mut in_list = false;
    let mut models = Vec::new();
    for line in help.lines() {
        let name = if let Some(rest) = line.strip_prefix("x86 ") {
            rest.split_whitespace().next()
        } else if line.trim_end() == "Available CPUs:" {
            in_list = true;
            None
        } else if in_list && line.starts_with("  ") {
            line.split_whitespace().next()
        } else {
            in_list = false;
            None
        };
        models.extend(name.map(str::to_string));
    }
    models
}

/// Why `model` cannot be `binary`'s `-cpu` under TCG, `None` if it can:
/// read from QEMU's own list, so that a model name QEMU would refuse
/// (`unable to find CPU model`) is refused before anything boots, with the
/// names it takes. A QEMU that cannot be asked (not installed) is left to
/// the run's own error.
pub fn cpu_model_refusal(binary: &str, model: &str) -> Option<String> {
    let models = cpu_models(binary).ok().filter(|m| !m.is_empty())?;
    if model == "host" {
        return Some(format!(
            "QEMU's host CPU model needs KVM (or HVF), and --backend qemu runs TCG; \
             give an emulated model (e.g. max, Skylake-Client-v1; `{binary} -cpu help` lists them)"
        ));
    }
    if models.iter().any(|m| m == model) {
        return None;
    }
    // The models that share the name's first three letters (a typo's
    // neighbours), else the unversioned ones.
    let stem: String = model
        .chars()
        .take(3)
        .collect::<String>()
        .to_ascii_lowercase();
    let mut close: Vec<&str> = models
        .iter()
        .map(String::as_str)
        .filter(|m| *m != "host" && m.to_ascii_lowercase().starts_with(&stem))
        .take(12)
        .collect();
    if close.is_empty() {
        close = models
            .iter()
            .map(String::as_str)
            .filter(|m| *m != "host" && !m.contains("-v"))
            .take(12)
            .collect();
    }
    Some(format!(
        "{binary} has no CPU model {:?} (its models include {}, ...; \
         `{binary} -cpu help` lists all {}); give one of them",
        ptiscope_devices::escape_str(model),
        close.join(", "),
        models.len()
    ))
}

/// The plugin API version ptiscope's plugin declares for a QEMU version:
/// 1 for QEMU 6.0 to 8.2 (which accept 0..=1), 2 for QEMU 9.0 and later
/// (which accept 2 and up; 10.0 takes 2..=4). Older QEMU: an error.
pub fn plugin_api_for(version: (u32, u32, u32)) -> Result<u32, String> {
    match version {
        (major, ..) if major >= 9 => Ok(2),
        (major, ..) if major >= 6 => Ok(1),
        (major, minor, micro) => Err(format!(
            "QEMU {major}.{minor}.{micro} is too old for ptiscope's TCG plugin (it needs plugin API \
             version 1, QEMU 6.0 or later): install a newer QEMU, or run with --no-plugin \
             (every figure is then guest-reported)"
        )),
    }
}

/// The plugin file for an API version: `$PTISCOPE_QEMU_PLUGIN` if set (a
/// file built for this QEMU), else `libptiscope_tcg_plugin_apiN.so` next
/// to the ptiscope executable, else the one this build made.
pub fn find_plugin(api: u32) -> Result<std::path::PathBuf, String> {
    use std::path::PathBuf;
    if let Some(p) = std::env::var_os("PTISCOPE_QEMU_PLUGIN") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "PTISCOPE_QEMU_PLUGIN names {}, which is not a file",
                p.display()
            ))
        };
    }
    let name = format!("libptiscope_tcg_plugin_api{api}.so");
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join(&name)));
    let built = match api {
        1 => option_env!("PTISCOPE_QEMU_PLUGIN_API1"),
        _ => option_env!("PTISCOPE_QEMU_PLUGIN_API2"),
    }
    .map(PathBuf::from);
    beside
        .into_iter()
        .chain(built)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "ptiscope's QEMU plugin ({name}) was not found next to the ptiscope executable or \
                 where this build put it: rebuild (`cargo build --release`), set PTISCOPE_QEMU_PLUGIN, \
                 or run with --no-plugin (every figure is then guest-reported)"
            )
        })
}

/// QEMU's `-accel` value for a run with `cpus` vCPUs and, if the plugin
/// is loaded, its API version.
///
/// With the plugin and several vCPUs, QEMU before 9.0 (plugin API 1) runs
/// them all in turn on one TCG thread (`thread=single`): a snapshot then
/// sees every vCPU between two of its blocks, so in-phase per-vCPU counts
/// are exact. From QEMU 9.0 (API 2) that mode attributes every callback to
/// the wrong vCPU: without `CF_PARALLEL` QEMU compiles the *translating*
/// vCPU's index into the block as a constant (`gen_cpu_index` in
/// `accel/tcg/plugin-gen.c`), and the round-robin thread shares blocks
/// between vCPUs, so all of vCPU 1's system calls land on vCPU 0. There the
/// plugin needs one thread per vCPU (`thread=multi`), where QEMU loads the
/// index at run time. A snapshot then reads the other vCPUs' counters while
/// they run, so their counts at a marker are exact only to within the
/// blocks they have in flight; the guest's measured work lies wholly
/// between its markers (poundsyscall's threads start after the begin
/// marker and are reaped before the end marker), so the counts of that
/// work are whole (tests/qemu_plugin.rs checks them against the guest's own
/// counts on both QEMUs; the idle loop around them may differ by a block).
pub fn tcg_accel(plugin_api: Option<u32>, cpus: u32) -> &'static str {
    match plugin_api {
        Some(1) if cpus > 1 => "tcg,thread=single",
        Some(_) if cpus > 1 => "tcg,thread=multi",
        _ => "tcg",
    }
}

/// Makes a QEMU child die with ptiscope, however ptiscope ends (a SIGKILL,
/// a panic, an exit that runs no code of ours), and inherit exactly `fds`
/// besides its standard streams (their close-on-exec flag cleared in the
/// child). The nested backend starts its QEMU the same way.
pub fn die_with_ptiscope_inheriting(cmd: &mut Command, fds: Vec<libc::c_int>) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec and calls
    // only async-signal-safe functions (prctl, getppid, fcntl), touching
    // no memory of the parent's other threads (`fds` was moved in before
    // the fork).
    unsafe {
        cmd.pre_exec(move || {
            // QEMU dies with the thread that spawned it (the main thread of
            // `run`/`compare`).
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // ptiscope died before the prctl: the signal will never come.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("ptiscope exited while starting QEMU"));
            }
            for &fd in &fds {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// The plugin this QEMU can load, checked before anything boots.
pub fn plugin_for(binary: &str) -> Result<(std::path::PathBuf, u32), QemuError> {
    let s = qemu_support(binary)?;
    if !s.plugins {
        return Err(QemuError::Plugin(format!(
            "{binary} was built without TCG plugin support (no -plugin option): install a QEMU \
             built with plugins (Debian's is), or run with --no-plugin (every figure is then \
             guest-reported)"
        )));
    }
    let Some(v) = s.version else {
        return Err(QemuError::Plugin(format!(
            "cannot tell {binary}'s version from `{binary} --version`: run with --no-plugin"
        )));
    };
    let api = plugin_api_for(v).map_err(QemuError::Plugin)?;
    let path = find_plugin(api).map_err(QemuError::Plugin)?;
    Ok((path, api))
}

/// A memfd (see [`ImageFd`]) the plugin writes its counts to through
/// `/proc/self/fd/N`, read back after QEMU has exited.
struct OutFd(std::fs::File);

impl OutFd {
    fn new() -> Result<Self, QemuError> {
        use std::os::fd::FromRawFd;
        // SAFETY: a valid NUL-terminated name and flags; the result is checked.
        let fd = unsafe { libc::memfd_create(c"ptiscope-plugin".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(QemuError::Io {
                what: "creating an in-memory file for the plugin's counts",
                source: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: `fd` is a fresh descriptor owned by nobody else.
        Ok(OutFd(unsafe { std::fs::File::from_raw_fd(fd) }))
    }

    /// What the plugin wrote (at most one byte more than the parser takes).
    fn read(&mut self) -> std::io::Result<Vec<u8>> {
        use std::io::Seek;
        self.0.seek(std::io::SeekFrom::Start(0))?;
        let mut buf = Vec::new();
        (&mut self.0)
            .take(crate::observe::qemu_plugin::MAX_FILE_BYTES as u64 + 1)
            .read_to_end(&mut buf)?;
        Ok(buf)
    }
}

/// The image for QEMU, in an anonymous memory file (memfd): QEMU reads
/// `-kernel` from a path, and `/proc/self/fd/N` of a descriptor it inherits
/// is one. Nothing is written to the file system, so nothing is left behind
/// however ptiscope ends (SIGKILL included), and no other user can swap the
/// file between our write and QEMU's read.
struct ImageFd(std::os::fd::OwnedFd);

impl ImageFd {
    fn new(image: &[u8]) -> Result<Self, QemuError> {
        use std::os::fd::FromRawFd;
        let io_err = |source| QemuError::Io {
            what: "creating an in-memory file for the image",
            source,
        };
        // SAFETY: a valid NUL-terminated name and flags; the result is checked.
        let fd = unsafe { libc::memfd_create(c"ptiscope-guest".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io_err(std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a fresh descriptor owned by nobody else.
        let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let mut file = std::fs::File::from(owned);
        std::io::Write::write_all(&mut file, image).map_err(io_err)?;
        Ok(ImageFd(file.into()))
    }
}

/// How long QEMU gets to quit on SIGTERM (it then removes the sockets it
/// listens on) before SIGKILL.
const QEMU_STOP_GRACE: Duration = Duration::from_millis(500);

/// The QEMU child, stopped and reaped on drop unless it already ended:
/// SIGTERM first, so that QEMU cleans up after itself (a `--qemu-arg`
/// socket's file), SIGKILL after [`QEMU_STOP_GRACE`].
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            // SAFETY: kill(2) on our own child's pid, not yet reaped (so
            // not reused); no memory is involved.
            unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
            let until = Instant::now() + QEMU_STOP_GRACE;
            while Instant::now() < until {
                if let Ok(Some(_)) = self.0.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The Unix socket paths a `--qemu-arg` may make QEMU listen on
/// (`unix:PATH` of a character device, `path=PATH` of `-chardev socket`).
fn socket_paths(args: &[String]) -> Vec<std::path::PathBuf> {
    let mut paths = Vec::new();
    for arg in args {
        let socket_chardev = arg.starts_with("socket,");
        for part in arg.split(',') {
            let p = part
                .strip_prefix("unix:")
                .or_else(|| part.strip_prefix("path=").filter(|_| socket_chardev));
            if let Some(p) = p.filter(|p| !p.is_empty()) {
                paths.push(std::path::PathBuf::from(p));
            }
        }
    }
    paths
}

/// Removes the sockets QEMU made for `--qemu-arg`s: the paths of
/// [`socket_paths`] that did not exist before it started and are sockets
/// now (QEMU leaves them behind when the guest ends it through
/// isa-debug-exit, which exits without QEMU's cleanup).
fn remove_new_sockets(fresh: &[std::path::PathBuf]) {
    use std::os::unix::fs::FileTypeExt;
    for p in fresh {
        if std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket()) {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// What marks a Linux kernel panic on its console.
const PANIC_MARK: &[u8] = b"Kernel panic - not syncing";

/// Keeps the first console line that says the kernel panicked, however
/// much the console says after it (a panic's backtrace scrolls it out of
/// the recorder's tail): bounded, one line of at most
/// [`ptiscope_devices::console::MAX_LINE_BYTES`] at a time.
#[derive(Default)]
struct PanicScan {
    line: Vec<u8>,
    first: Option<String>,
}

impl PanicScan {
    fn feed(&mut self, bytes: &[u8]) {
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

    fn end_line(&mut self) {
        if self.line.windows(PANIC_MARK.len()).any(|w| w == PANIC_MARK) {
            // Escaped as the recorder escapes the lines it keeps.
            let mut safe = Vec::with_capacity(self.line.len());
            ptiscope_devices::console::escape_for_terminal(&self.line, &mut safe);
            self.first = Some(String::from_utf8_lossy(&safe).into_owned());
        }
        self.line.clear();
    }

    /// The first panic line, the unfinished last line included.
    fn finish(mut self) -> Option<String> {
        if self.first.is_none() {
            self.end_line();
        }
        self.first
    }
}

/// The console tail of a run, with the first panic line at its head when
/// it scrolled out of the tail (so that a panic is found wherever it was).
fn tail_with_panic(tail: Vec<String>, panic: Option<String>) -> Vec<String> {
    let marked = |l: &String| l.contains("Kernel panic - not syncing");
    match panic {
        Some(p) if !tail.iter().any(marked) => std::iter::once(p).chain(tail).collect(),
        _ => tail,
    }
}

/// SIGINT, SIGTERM or SIGHUP, if one is pending. `ptiscope` blocks them
/// for the KVM backend's signalfd; here they are taken with a zero-timeout
/// `sigtimedwait` so that a QEMU run stops as cleanly as a KVM one.
fn pending_termination() -> Option<i32> {
    crate::signals::wait_termination(Duration::ZERO)
}

/// Boots a run resolved for [`Target::QemuTcg`](crate::spec::Target::QemuTcg) under QEMU and waits for it
/// (or the timeout, or SIGINT/SIGTERM): how it ended, and what the TCG
/// plugin wrote.
pub fn run_resolved(run: &ResolvedRun) -> Result<(RunOutcome, PluginOutput), QemuError> {
    let setup_start = Instant::now();
    let config = &run.config;
    let boot = &run.boot;
    let image = &boot.image;
    let cmdline = boot.cmdline.clone();
    let entry = run.guest.entry;
    let linux = run.guest_kind.is_linux();

    // Everything that can fail is done before QEMU starts, so that no
    // error leaves it running.
    let (out, console_queue) = crate::output::console_output(&config.serial_out, config.timeout)?;
    let image_fd = ImageFd::new(image)?;
    let image_raw = image_fd.0.as_raw_fd();
    // The initrd (a Linux guest's initramfs), in a memfd of its own.
    let initrd_fd = boot.initrd.as_deref().map(ImageFd::new).transpose()?;
    let initrd_raw = initrd_fd.as_ref().map(|f| f.0.as_raw_fd());

    let binary = binary_of(run);
    // The plugin is checked before QEMU starts: a QEMU too old or built
    // without plugins is said so, and nothing boots.
    let plugin = if config.qemu_plugin {
        let (path, api) = plugin_for(binary)?;
        Some((path, api, OutFd::new()?))
    } else {
        None
    };
    let plugin_raw = plugin.as_ref().map(|(_, _, f)| f.0.as_raw_fd());
    // A CPU model QEMU does not have would end QEMU at once (`unable to
    // find CPU model`), or `help` would print its list and exit as if the
    // guest had: refused here, before QEMU starts.
    if let Some(why) = config
        .qemu_cpu
        .as_deref()
        .and_then(|m| cpu_model_refusal(binary, m))
    {
        return Err(QemuError::CpuModel(format!(
            "cpu={}: {why}",
            ptiscope_devices::escape_str(config.qemu_cpu.as_deref().unwrap_or_default())
        )));
    }
    // `--by-symbol` (the init's symbol word on a Linux command line, with
    // the plugin): QEMU's isa-debugcon takes the init's kernel symbols into
    // a memfd of its own, which the plugin copies into its file at exit,
    // and the plugin counts the phase's calls by address.
    let symbols = if linux
        && plugin.is_some()
        && cmdline
            .split_ascii_whitespace()
            .any(|w| w == crate::linux::SYMBOLS_WORD)
    {
        Some(OutFd::new()?)
    } else {
        None
    };
    let symbols_raw = symbols.as_ref().map(|f| f.0.as_raw_fd());
    // Linux 6.1 under QEMU 7.2's microvm never gets a working timer in TCG
    // (it stops after "tsc: Marking TSC unstable"): Linux guests boot on pc.
    let machine = if loader::is_elf32(image) || linux {
        "pc"
    } else {
        "microvm"
    };
    let mut cmd = Command::new(binary);
    let accel = tcg_accel(plugin.as_ref().map(|(_, api, _)| *api), config.cpus);
    let cpu_model = config.qemu_cpu.as_deref().unwrap_or("max");
    cmd.args(["-M", machine, "-accel", accel, "-cpu", cpu_model])
        .args(["-m", &format!("{}M", config.mem_mib)])
        .args(["-smp", &config.cpus.to_string()])
        .args(["-nodefaults", "-no-user-config", "-display", "none"])
        // A triple fault resets the machine; without this QEMU would boot
        // the guest again instead of stopping.
        .arg("-no-reboot")
        .args(["-serial", "stdio"])
        .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=4"])
        .arg("-kernel")
        .arg(format!("/proc/self/fd/{image_raw}"))
        .args(["-append", &cmdline]);
    if let Some(fd) = initrd_raw {
        cmd.arg("-initrd").arg(format!("/proc/self/fd/{fd}"));
    }
    if let (Some((path, _, _)), Some(fd)) = (&plugin, plugin_raw) {
        // A Linux guest: kernel = the architecture's kernel half, and the
        // init's user-mode marker pair (`umark=`) instead of kernel-mode
        // markers (Linux's own `out dx, eax` are PCI configuration writes).
        let (kernel, marks, umark) = match &run.guest_kind {
            GuestKind::Linux(l) => {
                let (kernel, marks) =
                    crate::observe::qemu_plugin::kernel_ranges(l.arch == LinuxArch::I386, false);
                let port = crate::observe::qemu_plugin::LINUX_MARK_PORT;
                (kernel, marks, format!(",umark={port:#x}"))
            }
            GuestKind::Companion => {
                let companion = crate::report::requested(&cmdline).is_some();
                let (kernel, marks) =
                    crate::observe::qemu_plugin::kernel_ranges(loader::is_elf32(image), companion);
                (kernel, marks, String::new())
            }
        };
        // QEMU's option syntax: a comma inside a value is doubled.
        let file = path.display().to_string().replace(',', ",,");
        let by_pc = match symbols_raw {
            Some(s) => format!(",pcs=1,syms=/proc/self/fd/{s}"),
            None => String::new(),
        };
        cmd.arg("-plugin").arg(format!(
            "file={file},out=/proc/self/fd/{fd},kernel={},marks={}{umark}{by_pc}",
            crate::observe::qemu_plugin::ranges_arg(&kernel),
            crate::observe::qemu_plugin::ranges_arg(&marks),
        ));
    }
    if let Some(s) = symbols_raw {
        cmd.args([
            "-chardev",
            &format!("file,id=ptiscope-symbols,path=/proc/self/fd/{s}"),
            "-device",
            &format!(
                "isa-debugcon,iobase={:#x},chardev=ptiscope-symbols",
                ptiscope_abi::port::SYMBOLS
            ),
        ]);
    }
    cmd.args(&config.qemu_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // The descriptors of the image, the initrd, the plugin's file and the
    // symbols' memfd are the only things QEMU inherits.
    let inherited: Vec<libc::c_int> = std::iter::once(image_raw)
        .chain(initrd_raw)
        .chain(plugin_raw)
        .chain(symbols_raw)
        .collect();
    die_with_ptiscope_inheriting(&mut cmd, inherited);
    // Sockets a --qemu-arg names that QEMU will make: removed when it ends.
    let fresh_sockets: Vec<_> = socket_paths(&config.qemu_args)
        .into_iter()
        .filter(|p| std::fs::symlink_metadata(p).is_err())
        .collect();
    let mut child = Child(cmd.spawn().map_err(|source| QemuError::Spawn {
        binary: binary.to_string(),
        source,
    })?);
    let setup_time = setup_start.elapsed();
    let run_start = Instant::now();

    let recorder = Arc::new(Mutex::new(ConsoleRecorder::new()));
    let mut sink = ConsoleSink::new(out, recorder.clone());
    let mut stdout = child.0.stdout.take();
    let mut stderr = child.0.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        let mut panic = PanicScan::default();
        while let Some(Ok(n @ 1..)) = stdout.as_mut().map(|s| s.read(&mut buf)) {
            panic.feed(&buf[..n]);
            let _ = std::io::Write::write_all(&mut sink, &buf[..n]);
        }
        sink.flush_out();
        panic.finish()
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = stderr.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    });

    let deadline = run_start + config.timeout;
    enum End {
        Exited(std::process::ExitStatus),
        Timeout,
        Signal(i32),
    }
    let end = loop {
        match child.0.try_wait() {
            Ok(Some(status)) => break End::Exited(status),
            Ok(None) => {
                if let Some(sig) = pending_termination() {
                    break End::Signal(sig);
                }
                if Instant::now() >= deadline {
                    break End::Timeout;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(source) => {
                return Err(QemuError::Io {
                    what: "waiting for QEMU",
                    source,
                })
            }
        }
    };
    // Stops QEMU if it is still running (timeout, signal).
    drop(child);
    remove_new_sockets(&fresh_sockets);
    drop(image_fd);
    drop(initrd_fd);
    // The plugin has copied it into its own file.
    drop(symbols);
    let run_time = run_start.elapsed();
    // QEMU is gone, so its stdout ends: the reader only forwards what is
    // left into the console queue, which never blocks.
    let panic_line = reader.join().ok().flatten();
    let qemu_stderr = err_reader.join().unwrap_or_default();
    let outputs: Vec<_> = console_queue
        .map(|q| q.finish_by(Instant::now() + DRAIN_GRACE))
        .into_iter()
        .collect();

    let mut rec = recorder.lock().unwrap_or_else(|p| p.into_inner());
    rec.flush_partial();
    let stats = rec.stats();
    // QEMU's own failures (bad options, no image) exit 1 with a message on
    // stderr before the guest ran: only a run where the guest printed, or
    // QEMU said nothing, is the guest's.
    let guest_ran = stats.bytes > 0 || qemu_stderr.trim().is_empty();
    let stop = match end {
        End::Timeout => StopReason::Timeout {
            after_ms: config.timeout.as_millis() as u64,
        },
        End::Signal(signal) => StopReason::Signal { signal },
        // isa-debug-exit: QEMU exits with (status << 1) | 1. QEMU's own
        // failures exit 1 too, before the guest has printed anything.
        End::Exited(s) => match s.code() {
            Some(c) if c & 1 == 1 && guest_ran => StopReason::GuestExit {
                status: (c as u32) >> 1,
            },
            // With -no-reboot, a guest reset (triple fault) ends QEMU with 0.
            Some(0) if guest_ran => StopReason::Reset,
            code => {
                use std::os::unix::process::ExitStatusExt;
                let how = match (code, s.signal()) {
                    (Some(c), _) => format!("exit {c}"),
                    (None, Some(sig)) => format!("killed by signal {sig}"),
                    (None, None) => "no exit status".into(),
                };
                return Err(QemuError::Qemu {
                    how,
                    stderr: qemu_stderr.trim().to_string(),
                });
            }
        },
    };
    let plugin_output = match plugin {
        None => PluginOutput::Off,
        Some((_, _, mut f)) => match f.read() {
            Ok(b) if b.is_empty() => PluginOutput::Missing(
                "the plugin wrote nothing (QEMU did not exit normally: timeout or signal?)".into(),
            ),
            Ok(b) => PluginOutput::File(b),
            Err(e) => PluginOutput::Missing(format!("reading the plugin's file: {e}")),
        },
    };
    let outcome = RunOutcome {
        stop,
        stopped_by: None,
        vcpus: Vec::new(),
        run_time,
        setup_time,
        exits: ExitCounts::default(),
        machine_lines: rec.machine_lines().to_vec(),
        banner: rec.banner().map(str::to_string),
        console_tail: tail_with_panic(rec.tail().map(str::to_string).collect(), panic_line),
        console_bytes: stats.bytes,
        dropped_machine_lines: stats.dropped_machine_lines,
        phases: Vec::new(),
        dropped_phase_events: 0,
        unknown_accesses: 0,
        cmdline,
        entry,
        arch_capabilities: None,
        mem_mib: config.mem_mib,
        telemetry_addr: 0,
        outputs,
    };
    Ok((outcome, plugin_output))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `-cpu help`'s model lines are read, its feature list is not.
    #[test]
    fn cpu_models_from_qemu_help() {
        let help =
            "Available CPUs:\nx86 486                   (alias configured by machine type)\n\
                    x86 Skylake-Client-v1     Intel Core Processor (Skylake)\n\
                    x86 host                  processor with all supported host features\n\
                    x86 max                   Enables all features supported by the accelerator\n\
                    \nRecognized CPUID flags:\n  3dnow 3dnowext\n  xsave xtpr\n";
        assert_eq!(
            parse_cpu_models(help),
            ["486", "Skylake-Client-v1", "host", "max"]
        );
    }

    /// QEMU 9.0 and later: no `x86 ` prefix, the list indented under its
    /// header, and the CPUID flags after a blank line are no models.
    #[test]
    fn cpu_models_from_qemu_10_help() {
        let help = "Available CPUs:\n  486                   (alias configured by machine type)\n  \
                    486-v1                \n  Skylake-Client-v1     Intel Core Processor (Skylake)\n  \
                    max                   Enables all features supported by the accelerator\n\
                    \nRecognized CPUID flags:\n  3dnow 3dnowext 3dnowprefetch\n  xsave xtpr\n";
        assert_eq!(
            parse_cpu_models(help),
            ["486", "486-v1", "Skylake-Client-v1", "max"]
        );
    }

    /// A model this QEMU lacks, `help` and `host` are refused before QEMU
    /// starts, naming what it has; its own models pass.
    #[test]
    fn cpu_models_qemu_lacks_are_refused_before_it_starts() {
        let binary = "qemu-system-x86_64";
        if cpu_models(binary).map_or(true, |m| m.is_empty()) {
            println!("SKIP cpu_models_qemu_lacks_are_refused_before_it_starts: no {binary}");
            return;
        }
        for ok in ["max", "Skylake-Client-v1", "qemu64"] {
            assert_eq!(cpu_model_refusal(binary, ok), None, "{ok}");
        }
        for (bad, says) in [
            ("bogus", "no CPU model \"bogus\""),
            ("help", "no CPU model \"help\""),
            ("max=1", "no CPU model \"max=1\""),
            ("skylake-client-v1", "Skylake-Client-v1"),
            ("host", "needs KVM"),
        ] {
            let why = cpu_model_refusal(binary, bad).unwrap_or_else(|| panic!("{bad} accepted"));
            assert!(
                why.contains(says) && why.contains("-cpu help"),
                "{bad}: {why}"
            );
        }
    }

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

    #[test]
    fn several_vcpus_with_plugin_api_2_get_a_thread_each() {
        // API 1 (QEMU < 9): one round-robin thread, exact snapshots.
        assert_eq!(tcg_accel(Some(1), 2), "tcg,thread=single");
        // API 2 (QEMU >= 9): round-robin would attribute every callback to
        // the translating vCPU.
        assert_eq!(tcg_accel(Some(2), 2), "tcg,thread=multi");
        assert_eq!(tcg_accel(Some(2), 1), "tcg");
        assert_eq!(tcg_accel(None, 4), "tcg");
    }

    #[test]
    fn qemu_versions_and_plugin_api() {
        assert_eq!(
            parse_qemu_version("QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)\n"),
            Some((7, 2, 22))
        );
        assert_eq!(
            parse_qemu_version("QEMU emulator version 10.0.2\n"),
            Some((10, 0, 2))
        );
        assert_eq!(
            parse_qemu_version("QEMU emulator version 9.1"),
            Some((9, 1, 0))
        );
        assert_eq!(parse_qemu_version("something else"), None);
        assert_eq!(parse_qemu_version("version x.y"), None);
        assert_eq!(plugin_api_for((7, 2, 22)), Ok(1));
        assert_eq!(plugin_api_for((8, 2, 0)), Ok(1));
        assert_eq!(plugin_api_for((9, 0, 0)), Ok(2));
        assert_eq!(plugin_api_for((10, 0, 2)), Ok(2));
        let old = plugin_api_for((5, 2, 0)).unwrap_err();
        assert!(
            old.contains("too old") && old.contains("--no-plugin"),
            "{old}"
        );
    }
}
