//! What the outer machine boots: the fetched kernel and its KVM modules,
//! and the initramfs packed in memory around the running ptiscope (the
//! shared libraries it maps and their loader, the modules, the request and
//! the jobs' input files).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::error::NestedError;
use super::{contract, Request};
use crate::input::{read_regular, READ_TIME_LIMIT};
use crate::preflight::linux::initramfs::Archive;

/// The fetched kernel and its modules.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// vmlinuz.
    pub vmlinuz: PathBuf,
    /// The module files, in load order.
    pub modules: Vec<PathBuf>,
}

/// The `debian-amd64` kernel of the cache, with the modules
/// [`contract::MODULES`] names; an error saying how to get them.
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
    let modules: Vec<PathBuf> = contract::MODULES
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
    for (m, name) in kernel.modules.iter().zip(contract::MODULES) {
        let bytes = read_regular("KVM module", m, 64 << 20, READ_TIME_LIMIT)?;
        a.file(&format!("{}/{name}", contract::MODULE_DIR), 0o644, &bytes);
    }
    let req = serde_json::to_vec(request).unwrap_or_default();
    a.file(contract::REQUEST_PATH, 0o644, &req);
    for (path, bytes) in inputs {
        a.file(path, 0o644, bytes);
    }
    for (path, bytes) in &extra.executables {
        a.file(path, 0o755, bytes);
    }
    let archive = a.finish().map_err(io("packing the initramfs".into()))?;
    Ok((archive, lib_dirs))
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
