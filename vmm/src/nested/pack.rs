//! The inner command of `--backend nested`, made from the user's: its
//! arguments (`--backend kvm` in place of `nested`, output files redirected
//! inside and copied back), the input files and known kernels packed into
//! the initramfs, and what is refused before the boot.

use std::path::PathBuf;

use super::Request;
use crate::cli::exit_code;
use crate::input::{read_regular, InputError, READ_TIME_LIMIT};
use crate::machine::loader::MAX_IMAGE_BYTES;
use crate::preflight::linux::{image, LinuxError};

/// Options that name a file the inner command writes.
pub(super) const OUTPUT_OPTS: [&str; 5] =
    ["--json", "--csv", "--svg", "--serial-out", "--metrics-out"];
/// Options that name a file the inner command reads, with the most bytes
/// read of it (as the inner command's own reader caps it).
pub(super) const INPUT_OPTS: [(&str, u64); 2] =
    [("--kernel", MAX_IMAGE_BYTES), ("--against", 16 << 20)];
/// Options whose value is a list of side options (`compare --baseline`,
/// `--compare`, `sweep --config`), whose `linux=KERNEL` names a kernel the
/// inner command reads.
pub(super) const SIDE_OPTS: [&str; 3] = ["--baseline", "--compare", "--config"];
/// Options `--backend nested` does not take, with why.
pub(super) const REFUSED_OPTS: [(&str, &str); 2] = [
    ("--qemu-arg", "--qemu-arg is for --backend qemu"),
    ("--no-plugin", "--no-plugin is for --backend qemu"),
];

/// Why the inner command cannot be made: refused before the boot.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// An option `--backend nested` does not take.
    #[error("--backend nested: {0}")]
    Refused(String),
    /// An input file that cannot be read (it names the file).
    #[error(transparent)]
    Input(#[from] InputError),
    /// A Linux kernel that cannot be named or read, or the configuration
    /// beside it.
    #[error(transparent)]
    Linux(#[from] LinuxError),
}

impl PackError {
    /// The termination signal that ended a read, if one did.
    pub fn signal(&self) -> Option<i32> {
        match self {
            PackError::Input(e) => e.signal(),
            PackError::Linux(e) => e.signal(),
            PackError::Refused(_) => None,
        }
    }

    /// 64 (docs/running.md, "Under nested"), or 128 + a termination
    /// signal that ended a read.
    pub fn exit_code(&self) -> i32 {
        self.signal().map_or(exit_code::USAGE, |s| 128 + s)
    }
}

/// The inner command: its arguments, the files it writes (inner path,
/// the user's path) and the files it reads (inner path, content).
#[derive(Debug, Default, PartialEq)]
pub struct Inner {
    /// The arguments after `ptiscope`.
    pub argv: Vec<String>,
    /// (inner path, outer path) of each output file.
    pub outputs: Vec<(String, PathBuf)>,
    /// (inner path, content) of each input file.
    pub inputs: Vec<(String, Vec<u8>)>,
    /// Whether known kernels were packed as the inner kernel cache (the
    /// inner command then gets `PTISCOPE_LINUX_CACHE`).
    pub linux_cache: bool,
    /// Whether a Linux kernel was packed (`--linux`, a side's `linux=`):
    /// the inner command boots Linux on the VMM.
    pub boots_linux: bool,
}

/// The Linux kernels packed for the inner command, each once: a known
/// name into the inner kernel cache (the inner command keeps the name, so
/// its report says `debian-amd64`), a path under `/nested/in/kernel-N/`;
/// each with the configuration the inner preflight would find beside it,
/// packed as `config` beside the copy.
#[derive(Debug, Default)]
pub(super) struct Packer {
    /// (the user's value, what the inner command is given).
    packed: Vec<(String, String)>,
    /// Files packed so far.
    pub(super) inputs: Vec<(String, Vec<u8>)>,
    /// Whether a known name was packed.
    pub(super) cache: bool,
}

impl Packer {
    /// Packs the kernel `v` names (once; `what` is the option, for
    /// messages) and returns what the inner command's `--linux`/`linux=`
    /// is then given.
    fn linux(&mut self, what: &'static str, v: &str) -> Result<String, PackError> {
        if let Some((_, inner)) = self.packed.iter().find(|(k, _)| k == v) {
            return Ok(inner.clone());
        }
        let known = crate::preflight::linux::known_path(v).is_some();
        let path = crate::preflight::linux::kernel_path(v)?;
        let (dir, kernel, given) = if known {
            let dir = format!("{INNER_LINUX_CACHE}/{v}");
            let kernel = format!("{dir}/vmlinuz");
            (dir, kernel, v.to_string())
        } else {
            let leaf = path
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_else(|| "vmlinuz".into());
            // Its own directory (not `/nested/in/N-NAME`, where the
            // `--kernel`/`--against` files go: a file named `linux` there
            // must not be this directory).
            let dir = format!("/nested/in/kernel-{}", self.packed.len());
            let kernel = format!("{dir}/{leaf}");
            (dir, kernel.clone(), kernel)
        };
        self.pack_kernel(what, &path, &dir, &kernel)?;
        self.cache |= known;
        self.packed.push((v.to_string(), given.clone()));
        Ok(given)
    }

    /// Reads the kernel at `path` and the configuration beside it (as the
    /// inner preflight will: `config`, or `config-RELEASE` beside
    /// `vmlinuz-RELEASE`) and packs them as `kernel` and `dir/config`.
    fn pack_kernel(
        &mut self,
        what: &'static str,
        path: &std::path::Path,
        dir: &str,
        kernel: &str,
    ) -> Result<(), PackError> {
        let bytes = read_regular(what, path, MAX_IMAGE_BYTES, READ_TIME_LIMIT)?;
        let version = image::version_of(&bytes);
        let config = image::config_beside(path, version.as_deref()).map_err(LinuxError::Image)?;
        if let Some(config) = config {
            self.inputs.push((format!("{dir}/config"), config.bytes));
        }
        self.inputs.push((kernel.to_string(), bytes));
        Ok(())
    }

    /// A side's options with each `linux=KERNEL` packed and named as the
    /// inner command will find it; the other words as they are.
    fn side(&mut self, opts: &str) -> Result<String, PackError> {
        let words = opts
            .split(',')
            .map(|w| match w.split_once('=') {
                Some((k, v)) if k.trim() == "linux" && !v.trim().is_empty() => {
                    Ok(format!("{k}={}", self.linux("linux=", v.trim())?))
                }
                _ => Ok(w.to_string()),
            })
            .collect::<Result<Vec<_>, PackError>>()?;
        Ok(words.join(","))
    }
}

/// Rewrites the user's arguments for the inner ptiscope. `json_is_flag`:
/// the command's `--json` takes no file (`probe`). Every file the inner
/// command reads is read here, through [`read_regular`] (regular files
/// only, never a blocked open on a FIFO, capped, a signal ends it), so a
/// file that cannot be read is refused before the boot, named.
pub fn rewrite(raw: &[String], json_is_flag: bool) -> Result<Inner, PackError> {
    let mut inner = Inner::default();
    let mut packer = Packer::default();
    let mut it = raw.iter().peekable();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        if let Some((_, why)) = REFUSED_OPTS.iter().find(|(o, _)| *o == name) {
            return Err(PackError::Refused(why.to_string()));
        }
        if name == "--nested-paging" {
            // The outer ptiscope's: it loads the inner KVM so.
            if inline.is_none() {
                it.next();
            }
            continue;
        }
        let input_cap = INPUT_OPTS.iter().find(|(o, _)| *o == name).map(|(_, c)| *c);
        let takes_file = (OUTPUT_OPTS.contains(&name) && !(json_is_flag && name == "--json"))
            || input_cap.is_some();
        if name == "--backend" {
            let v = inline.or_else(|| it.next().cloned()).unwrap_or_default();
            let v = if v == "nested" { "kvm".to_string() } else { v };
            inner.argv.push(format!("--backend={v}"));
        } else if name == "--linux" {
            let Some(v) = inline.or_else(|| it.next().cloned()) else {
                inner.argv.push(arg.clone());
                continue;
            };
            let kernel = packer.linux("--linux", &v)?;
            inner.argv.push(format!("--linux={kernel}"));
        } else if SIDE_OPTS.contains(&name) {
            let Some(v) = inline.or_else(|| it.next().cloned()) else {
                inner.argv.push(arg.clone());
                continue;
            };
            let side = packer.side(&v)?;
            inner.argv.push(format!("{name}={side}"));
        } else if takes_file {
            let Some(v) = inline.or_else(|| it.next().cloned()) else {
                inner.argv.push(arg.clone());
                continue;
            };
            let n = inner.outputs.len() + inner.inputs.len();
            let leaf = std::path::Path::new(&v)
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_else(|| "file".into());
            if OUTPUT_OPTS.contains(&name) {
                let path = format!("/tmp/out/{n}-{leaf}");
                inner.outputs.push((path.clone(), PathBuf::from(&v)));
                inner.argv.push(format!("{name}={path}"));
            } else {
                let what = INPUT_OPTS
                    .iter()
                    .find(|(o, _)| *o == name)
                    .map_or("input", |(o, _)| *o);
                let cap = input_cap.unwrap_or(MAX_IMAGE_BYTES);
                let bytes = read_regular(what, std::path::Path::new(&v), cap, READ_TIME_LIMIT)?;
                let path = format!("/nested/in/{n}-{leaf}");
                inner.inputs.push((path.clone(), bytes));
                inner.argv.push(format!("{name}={path}"));
            }
        } else {
            inner.argv.push(arg.clone());
        }
    }
    inner.inputs.append(&mut packer.inputs);
    inner.linux_cache = packer.cache;
    inner.boots_linux = !packer.packed.is_empty();
    Ok(inner)
}

/// Where the inner command finds the kernels [`pack_linux_cache`] packs
/// (its `PTISCOPE_LINUX_CACHE`).
pub(super) const INNER_LINUX_CACHE: &str = "/nested/linux-cache";

/// Packs known kernels (name, cached image) as the inner command's kernel
/// cache: each image with the configuration beside it, under
/// [`INNER_LINUX_CACHE`]`/NAME/`.
pub(super) fn pack_linux_cache(
    kernels: &[(&str, PathBuf)],
    inputs: &mut Vec<(String, Vec<u8>)>,
) -> Result<(), PackError> {
    let mut packer = Packer::default();
    for (name, image) in kernels {
        let dir = format!("{INNER_LINUX_CACHE}/{name}");
        packer.pack_kernel("kernel", image, &dir, &format!("{dir}/vmlinuz"))?;
    }
    inputs.append(&mut packer.inputs);
    Ok(())
}

/// The batch's jobs with each `--linux VALUE` packed (once per value) and
/// named as the inner command finds it: the packer holds the files to
/// pack and whether known kernels went into the inner cache.
pub(super) fn pack_batch_linux(request: &mut Request) -> Result<Packer, PackError> {
    let mut packer = Packer::default();
    for job in &mut request.jobs {
        let mut argv = Vec::with_capacity(job.argv.len());
        let mut it = std::mem::take(&mut job.argv).into_iter();
        while let Some(a) = it.next() {
            let v = match a.strip_prefix("--linux=") {
                Some(v) => v.to_string(),
                None if a == "--linux" => it.next().unwrap_or_default(),
                None => {
                    argv.push(a);
                    continue;
                }
            };
            argv.push(format!("--linux={}", packer.linux("--linux", &v)?));
        }
        job.argv = argv;
    }
    Ok(packer)
}
