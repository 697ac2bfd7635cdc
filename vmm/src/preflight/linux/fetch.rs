//! `ptiscope linux fetch`: Debian's current kernels, downloaded with
//! `apt-get download` and unpacked into the cache.
//!
//! For each flavour the metapackage (`linux-image-cloud-amd64`,
//! `linux-image-686-pae:i386`, `linux-image-6.12-cloud-amd64`) is resolved to its versioned image with
//! `apt-cache depends`, that package is downloaded into a scratch directory
//! inside the cache, and only its `boot/` files (and, for `debian-amd64`,
//! the KVM modules `--backend nested` loads, [`KVM_MODULES`]) are unpacked
//! (`dpkg-deb --fsys-tarfile | tar -x ./boot ...`): `vmlinuz-RELEASE` becomes
//! `NAME/vmlinuz`, `config-RELEASE` `NAME/config`, the modules
//! `NAME/modules/*.ko`, and `NAME/release` says which. The scratch directory is removed whatever happens that ptiscope
//! sees (an error, SIGINT, SIGTERM, SIGHUP); one a SIGKILL left behind
//! (`.fetch-NAME-PID` of a process that no longer exists) is removed by the
//! next fetch.
//!
//! The tools run in a process group of their own, waited for with an eye
//! on the termination signals ptiscope blocks: a signal stops the whole
//! group (apt-get, and dpkg-deb and tar behind `sh`) and ends the fetch
//! with 128 + the signal, at once.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::signals;

/// A kernel ptiscope knows by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Known {
    /// The `--linux` name.
    pub name: &'static str,
    /// The Debian metapackage.
    pub metapackage: &'static str,
    /// The package architecture (`:i386` is appended to foreign ones).
    pub debian_arch: &'static str,
    /// Whether the KVM modules ([`KVM_MODULES`]) are unpacked beside it:
    /// only for the kernel `--backend nested` boots as its inner Linux
    /// (`debian-amd64`); 6.12's are xz-compressed (`kvm.ko.xz`), which the
    /// nested init's `finit_module` does not take.
    pub kvm_modules: bool,
}

/// The kernels `--linux NAME` takes: Debian 12's 6.1 (amd64 cloud and
/// 686-pae) and the 6.12 cloud kernel bookworm-security carries, whose
/// mitigation options have their `CONFIG_MITIGATION_*` names (6.9+).
pub const KNOWN: [Known; 3] = [
    Known {
        name: "debian-amd64",
        metapackage: "linux-image-cloud-amd64",
        debian_arch: "amd64",
        kvm_modules: true,
    },
    Known {
        name: "debian-686-pae",
        metapackage: "linux-image-686-pae",
        debian_arch: "i386",
        kvm_modules: false,
    },
    Known {
        name: "debian-6.12-amd64",
        metapackage: "linux-image-6.12-cloud-amd64",
        debian_arch: "amd64",
        kvm_modules: false,
    },
];

/// The kernel modules `--backend nested` loads into its inner Linux, in
/// load order: (path under `lib/modules/RELEASE/kernel/`, file name kept
/// in `NAME/modules/`). Debian's cloud kernel has no ccp.ko, and its
/// kvm-amd loads without it.
pub const KVM_MODULES: [(&str, &str); 3] = [
    ("virt/lib/irqbypass.ko", "irqbypass.ko"),
    ("arch/x86/kvm/kvm.ko", "kvm.ko"),
    ("arch/x86/kvm/kvm-amd.ko", "kvm-amd.ko"),
];

/// The cache: `$PTISCOPE_LINUX_CACHE`, else `$XDG_CACHE_HOME/ptiscope/linux`,
/// else `$HOME/.cache/ptiscope/linux`.
pub fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("PTISCOPE_LINUX_CACHE")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("ptiscope/linux")))
        .or_else(|| var("HOME").map(|d| d.join(".cache/ptiscope/linux")))
}

/// Errors fetching a kernel.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// No cache directory can be named.
    #[error("no cache directory: set PTISCOPE_LINUX_CACHE (or XDG_CACHE_HOME or HOME)")]
    NoCache,
    /// A tool could not be run, or failed.
    #[error("{what} failed: {detail}")]
    Tool {
        /// The command.
        what: String,
        /// Its error or stderr.
        detail: String,
    },
    /// The metapackage names no versioned image.
    #[error("`apt-cache depends {0}` names no linux-image-* package")]
    NoImagePackage(String),
    /// i386 packages are not available (no foreign architecture, not root).
    #[error(
        "i386 packages are not enabled for apt here; run (as root) \
         `dpkg --add-architecture i386 && apt-get update`, then fetch again"
    )]
    NoI386,
    /// The package held no kernel.
    #[error("{0} holds no boot/vmlinuz-*")]
    NoKernel(String),
    /// The cache path (or a directory above it) exists but is not a
    /// directory.
    #[error(
        "the kernel cache {cache} cannot be used: {blocker} exists and is not a directory; \
         remove it or set PTISCOPE_LINUX_CACHE to a directory"
    )]
    CacheNotDirectory {
        /// The cache directory asked for.
        cache: PathBuf,
        /// The path in the way.
        blocker: PathBuf,
    },
    /// The cache directory cannot be made, or takes no new files.
    #[error(
        "the kernel cache {cache} takes no new files ({source}); set PTISCOPE_LINUX_CACHE to a \
         directory where files can be created"
    )]
    CacheNotWritable {
        /// The cache directory asked for.
        cache: PathBuf,
        /// Why a directory could not be created in it.
        #[source]
        source: std::io::Error,
    },
    /// A termination signal stopped the fetch (its number); the tools were
    /// stopped and the scratch directory removed.
    #[error("{}; the fetch was stopped and its scratch directory removed", signals::describe(*.0))]
    Interrupted(i32),
    /// A file operation in the cache failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl FetchError {
    /// The termination signal that stopped the fetch, if one did.
    pub fn signal(&self) -> Option<i32> {
        match self {
            FetchError::Interrupted(signal) => Some(*signal),
            _ => None,
        }
    }
}

/// How often a running tool is looked at between two waits for a signal.
const POLL: Duration = Duration::from_millis(20);
/// How long a tool stopped by SIGTERM gets before SIGKILL.
const STOP_GRACE: Duration = Duration::from_millis(500);

/// Stops a tool's process group: SIGTERM, then SIGKILL after
/// [`STOP_GRACE`]; the child is reaped.
fn stop_group(child: &mut std::process::Child) {
    let pgid = child.id() as libc::pid_t;
    // SAFETY: kill(2) on our child's own process group (its pid, set by
    // `process_group(0)`); no memory is involved.
    unsafe { libc::kill(-pgid, libc::SIGTERM) };
    let until = std::time::Instant::now() + STOP_GRACE;
    while std::time::Instant::now() < until {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: as above; the group's other members (dpkg-deb, tar behind
    // `sh`) may outlive its leader.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
    let _ = child.wait();
}

/// Runs a tool to its end and returns its stdout; a termination signal
/// meanwhile stops it (its whole process group) and is returned as
/// [`FetchError::Interrupted`].
fn tool(cmd: &mut Command) -> Result<String, FetchError> {
    use std::io::Read;
    let what = format!("{cmd:?}").replace('"', "");
    let spawn_err = |e: std::io::Error| FetchError::Tool {
        what: what.clone(),
        detail: e.to_string(),
    };
    // A signal that came before the tool started ends the fetch too.
    if let Some(signal) = signals::wait_termination(Duration::ZERO) {
        return Err(FetchError::Interrupted(signal));
    }
    // Its own process group: a signal stops the tool's children as well,
    // and a Ctrl-C at the terminal reaches ptiscope only, which stops the
    // group and cleans up (the standard library gives the child an empty
    // signal mask, so the tools themselves take signals normally).
    let mut child = {
        use std::os::unix::process::CommandExt;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(spawn_err)?
    };
    // The pipes are drained on threads so that a chatty tool never blocks.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                // At most 1 MiB kept; the rest is read and dropped.
                let _ = (&mut p).take(1 << 20).read_to_end(&mut buf);
                let _ = std::io::copy(&mut p, &mut std::io::sink());
            }
            buf
        })
    };
    let out = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let err = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => {
                stop_group(&mut child);
                return Err(spawn_err(e));
            }
        }
        if let Some(signal) = signals::wait_termination(POLL) {
            stop_group(&mut child);
            let _ = (out.join(), err.join());
            return Err(FetchError::Interrupted(signal));
        }
    };
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    if !status.success() {
        return Err(FetchError::Tool {
            what,
            detail: format!("{}: {}", status, String::from_utf8_lossy(&stderr).trim()),
        });
    }
    Ok(String::from_utf8_lossy(&stdout).into_owned())
}

/// The first path from `cache` upwards that exists and is not a directory
/// (a file given as the cache, or a file where one of its parents should
/// be), if there is one.
pub fn not_a_directory(cache: &Path) -> Option<PathBuf> {
    cache
        .ancestors()
        .find_map(|p| match std::fs::metadata(p) {
            Ok(m) => Some((!m.is_dir()).then(|| p.to_path_buf())),
            Err(_) => None,
        })
        .flatten()
}

/// Removes the scratch directories (`.fetch-NAME-PID`) that fetches
/// stopped by SIGKILL left in `cache`: those whose process no longer
/// exists. A scratch directory of a fetch still running is left alone.
pub fn remove_stale_scratch(cache: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(cache) else {
        return removed;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(".fetch-"))
            .and_then(|n| n.rsplit_once('-'))
            .and_then(|(_, pid)| pid.parse::<libc::pid_t>().ok())
            .filter(|&p| p > 0)
        else {
            continue;
        };
        // SAFETY: signal 0 only checks whether the process exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone && std::fs::remove_dir_all(e.path()).is_ok() {
            removed.push(e.path());
        }
    }
    removed
}

/// The versioned image package a metapackage depends on.
pub fn resolve_metapackage(spec: &str) -> Result<String, FetchError> {
    let text = tool(Command::new("apt-cache").args(["depends", spec]))?;
    parse_depends(&text).ok_or_else(|| FetchError::NoImagePackage(spec.into()))
}

/// The first `Depends: linux-image-…` of `apt-cache depends` output.
fn parse_depends(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let dep = l.trim().strip_prefix("Depends:")?.trim();
        let name = dep.split(':').next()?.trim();
        (name.starts_with("linux-image-") && !name.contains(' ')).then(|| name.to_string())
    })
}

fn i386_enabled() -> bool {
    tool(Command::new("dpkg").arg("--print-foreign-architectures"))
        .map(|t| t.lines().any(|l| l.trim() == "i386"))
        .unwrap_or(false)
        || tool(Command::new("dpkg").arg("--print-architecture"))
            .map(|t| t.trim() == "i386")
            .unwrap_or(false)
}

/// Makes i386 packages available: as root, `dpkg --add-architecture i386`
/// and `apt-get update`; otherwise an error saying what to run.
fn ensure_i386(say: &mut dyn FnMut(&str)) -> Result<(), FetchError> {
    if i386_enabled() {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(FetchError::NoI386);
    }
    say("enabling i386 packages: dpkg --add-architecture i386 && apt-get update");
    tool(Command::new("dpkg").args(["--add-architecture", "i386"]))?;
    tool(Command::new("apt-get").args(["update", "-qq"]))?;
    Ok(())
}

/// Removes a directory tree on drop.
struct Scratch(PathBuf);
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Fetches one known kernel into `cache/NAME/`; returns the kernel's path.
pub fn fetch(
    known: &Known,
    cache: &Path,
    say: &mut dyn FnMut(&str),
) -> Result<PathBuf, FetchError> {
    let io = |what, path: &Path| {
        let path = path.to_path_buf();
        move |source| FetchError::Io { what, path, source }
    };
    let foreign = known.debian_arch != "amd64";
    if foreign {
        ensure_i386(say)?;
    }
    let qualify = |p: &str| {
        if foreign {
            format!("{p}:{}", known.debian_arch)
        } else {
            p.to_string()
        }
    };
    if let Some(blocker) = not_a_directory(cache) {
        return Err(FetchError::CacheNotDirectory {
            cache: cache.to_path_buf(),
            blocker,
        });
    }
    // The cache is made and written to (its scratch directory) before
    // apt is asked anything: a cache where no file can be created (/proc,
    // a read-only mount) is said so at once, not after the download.
    let unwritable = |source| FetchError::CacheNotWritable {
        cache: cache.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(cache).map_err(unwritable)?;
    for stale in remove_stale_scratch(cache) {
        say(&format!(
            "removed {}, left by a fetch that was killed",
            stale.display()
        ));
    }
    let scratch = Scratch(cache.join(format!(".fetch-{}-{}", known.name, std::process::id())));
    let _ = std::fs::remove_dir_all(&scratch.0);
    std::fs::create_dir_all(scratch.0.join("x")).map_err(unwritable)?;
    let package = resolve_metapackage(&qualify(known.metapackage))?;
    say(&format!(
        "{}: {} -> {package}",
        known.name, known.metapackage
    ));
    tool(Command::new("apt-get").current_dir(&scratch.0).args([
        "download",
        "-qq",
        &qualify(&package),
    ]))?;
    let deb = std::fs::read_dir(&scratch.0)
        .map_err(io("reading", &scratch.0))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or_else(|| FetchError::NoKernel(package.clone()))?;
    // Only boot/ and the few modules `--backend nested` loads (KVM_MODULES,
    // for the kernel that has them): the other modules are most of the
    // package (tar fails on a pattern that matches nothing, so they are
    // asked for only where they are).
    let x = scratch.0.join("x");
    let script = if known.kvm_modules {
        "dpkg-deb --fsys-tarfile \"$1\" | tar -xf - -C \"$2\" --wildcards ./boot \
         './lib/modules/*/kernel/arch/x86/kvm/kvm.ko' \
         './lib/modules/*/kernel/arch/x86/kvm/kvm-amd.ko' \
         './lib/modules/*/kernel/virt/lib/irqbypass.ko'"
    } else {
        "dpkg-deb --fsys-tarfile \"$1\" | tar -xf - -C \"$2\" ./boot"
    };
    tool(
        Command::new("sh")
            .args(["-c", script, "sh"])
            .arg(&deb)
            .arg(&x),
    )?;
    let boot = x.join("boot");
    let vmlinuz = std::fs::read_dir(&boot)
        .map_err(io("reading", &boot))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
        .ok_or_else(|| FetchError::NoKernel(package.clone()))?;
    let release = vmlinuz
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("vmlinuz-"))
        .unwrap_or("?")
        .to_string();
    let staged = scratch.0.join("out");
    std::fs::create_dir_all(&staged).map_err(io("creating", &staged))?;
    std::fs::rename(&vmlinuz, staged.join("vmlinuz")).map_err(io("moving", &vmlinuz))?;
    let config = boot.join(format!("config-{release}"));
    if config.is_file() {
        std::fs::rename(&config, staged.join("config")).map_err(io("moving", &config))?;
    }
    // The KVM modules (if this package has them) beside the kernel: `NAME/modules/*.ko`.
    let modules = x.join("lib/modules").join(&release).join("kernel");
    for (rel, name) in KVM_MODULES {
        let from = modules.join(rel);
        if from.is_file() {
            let dir = staged.join("modules");
            std::fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
            std::fs::rename(&from, dir.join(name)).map_err(io("moving", &from))?;
        }
    }
    std::fs::write(staged.join("release"), format!("{release}\n{package}\n"))
        .map_err(io("writing", &staged))?;
    let dest = cache.join(known.name);
    let _ = std::fs::remove_dir_all(&dest);
    std::fs::rename(&staged, &dest).map_err(io("installing", &dest))?;
    Ok(dest.join("vmlinuz"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apt_cache_depends_output_names_the_image() {
        let text = "linux-image-686-pae:i386\n  Depends: linux-image-6.1.0-57-686-pae:i386\n";
        assert_eq!(
            parse_depends(text).as_deref(),
            Some("linux-image-6.1.0-57-686-pae")
        );
        let text = "linux-image-cloud-amd64\n  Depends: linux-image-6.1.0-57-cloud-amd64\n";
        assert_eq!(
            parse_depends(text).as_deref(),
            Some("linux-image-6.1.0-57-cloud-amd64")
        );
        assert_eq!(parse_depends("foo\n  Depends: libc6\n"), None);
    }
}
