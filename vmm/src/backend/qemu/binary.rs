//! Which QEMU system emulator a run boots in, and what an installed one is
//! (its version, whether it takes plugins).

use std::process::{Command, Stdio};
use std::sync::Mutex;

use crate::machine::loader;
use crate::spec::guest::GuestKind;
use crate::spec::linux::LinuxArch;
use crate::spec::ResolvedRun;

use super::error::QemuError;

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
pub(super) fn qemu_output(binary: &str, args: &[&str]) -> Result<std::process::Output, QemuError> {
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
