//! `ptiscope linux fetch`: Debian's current kernels, downloaded with
//! `apt-get download` and unpacked into the cache.
//!
//! For each flavour the metapackage (`linux-image-cloud-amd64`,
//! `linux-image-686-pae:i386`) is resolved to its versioned image with
//! `apt-cache depends`, that package is downloaded into a scratch directory
//! inside the cache, and only its `boot/` files are unpacked
//! (`dpkg-deb --fsys-tarfile | tar -x ./boot`): `vmlinuz-RELEASE` becomes
//! `NAME/vmlinuz`, `config-RELEASE` `NAME/config`, and `NAME/release` says
//! which. The scratch directory is removed whatever happens.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A kernel ptiscope knows by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Known {
    /// The `--linux` name.
    pub name: &'static str,
    /// The Debian metapackage.
    pub metapackage: &'static str,
    /// The package architecture (`:i386` is appended to foreign ones).
    pub debian_arch: &'static str,
}

/// The kernels `--linux NAME` takes.
pub const KNOWN: [Known; 2] = [
    Known {
        name: "debian-amd64",
        metapackage: "linux-image-cloud-amd64",
        debian_arch: "amd64",
    },
    Known {
        name: "debian-686-pae",
        metapackage: "linux-image-686-pae",
        debian_arch: "i386",
    },
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

fn tool(cmd: &mut Command) -> Result<String, FetchError> {
    let what = format!("{cmd:?}").replace('"', "");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| FetchError::Tool {
            what: what.clone(),
            detail: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(FetchError::Tool {
            what,
            detail: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
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
    let package = resolve_metapackage(&qualify(known.metapackage))?;
    say(&format!(
        "{}: {} -> {package}",
        known.name, known.metapackage
    ));
    std::fs::create_dir_all(cache).map_err(io("creating", cache))?;
    let scratch = Scratch(cache.join(format!(".fetch-{}-{}", known.name, std::process::id())));
    let _ = std::fs::remove_dir_all(&scratch.0);
    std::fs::create_dir_all(scratch.0.join("x")).map_err(io("creating", &scratch.0))?;
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
    // Only boot/: the modules are most of the package.
    let x = scratch.0.join("x");
    let script = "dpkg-deb --fsys-tarfile \"$1\" | tar -xf - -C \"$2\" ./boot";
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
