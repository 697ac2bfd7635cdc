//! ptiscope's TCG plugin in QEMU: the plugin API a QEMU version takes, the
//! plugin's file, the TCG thread mode it needs, and the in-memory file it
//! writes its counts to.

use std::io::Read;

use super::binary::qemu_support;
use super::error::QemuError;

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
pub(super) struct OutFd(pub(super) std::fs::File);

impl OutFd {
    pub(super) fn new() -> Result<Self, QemuError> {
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
    pub(super) fn read(&mut self) -> std::io::Result<Vec<u8>> {
        use std::io::Seek;
        self.0.seek(std::io::SeekFrom::Start(0))?;
        let mut buf = Vec::new();
        (&mut self.0)
            .take(crate::observe::qemu_plugin::MAX_FILE_BYTES as u64 + 1)
            .read_to_end(&mut buf)?;
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::qemu::binary::parse_qemu_version;

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
