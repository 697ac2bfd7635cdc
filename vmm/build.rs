//! Builds the guest kernel for its bare-metal target(s) and hands the image
//! paths to the `ptiscope` crate, which embeds them as the default guests.
//!
//! The guest is its own cargo workspace (`guest/kernel`) built with the same
//! pinned toolchain into `target/guest`, a target directory of its own so the
//! inner cargo never waits on the outer one's lock. Environment that the outer
//! cargo sets for *this* build (flags, wrappers, target overrides) is removed
//! so that it cannot leak into the guest build.
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// (target triple, env var naming the built ELF, file name inside the target dir)
const FLAVOURS: &[(&str, &str)] = &[
    ("x86_64-unknown-none", "PTISCOPE_GUEST_X86_64"),
    // The 32-bit PAE flavour: an ELF32 image (`ptiscope::GUEST_I386`).
    ("i586-unknown-linux-gnu", "PTISCOPE_GUEST_I386"),
];

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = manifest_dir
        .parent()
        .expect("vmm/ has a parent")
        .to_path_buf();
    let guest_dir = root.join("guest");
    let target_dir = env::var_os("PTISCOPE_GUEST_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target").join("guest"));

    println!("cargo:rerun-if-changed={}", guest_dir.display());
    println!("cargo:rerun-if-env-changed=PTISCOPE_GUEST_TARGET_DIR");
    emit_git_revision(&root);

    for (triple, var) in FLAVOURS {
        // `<VAR>_ELF=path` embeds a prebuilt image instead of building one
        // (used while developing the VMM against a known-good guest).
        let prebuilt_var = format!("{var}_ELF");
        println!("cargo:rerun-if-env-changed={prebuilt_var}");
        let elf = match env::var_os(&prebuilt_var) {
            Some(path) => {
                let path = PathBuf::from(path);
                println!("cargo:rerun-if-changed={}", path.display());
                path
            }
            None => build_guest(&guest_dir.join("kernel"), &target_dir, triple),
        };
        println!("cargo:rustc-env={var}={}", elf.display());
    }

    // The static init of `--linux` runs, one per Linux architecture.
    let init_dir = root.join("linux-init");
    for watched in ["src", "Cargo.toml", "Cargo.lock"] {
        println!(
            "cargo:rerun-if-changed={}",
            init_dir.join(watched).display()
        );
    }
    for (triple, var) in INIT_FLAVOURS {
        let prebuilt_var = format!("{var}_ELF");
        println!("cargo:rerun-if-env-changed={prebuilt_var}");
        let elf = match env::var_os(&prebuilt_var) {
            Some(path) => PathBuf::from(path),
            None => build_crate(&init_dir, &target_dir, triple, "ptiscope-linux-init"),
        };
        println!("cargo:rustc-env={var}={}", elf.display());
    }
    build_qemu_plugins(&root);
}

/// The QEMU TCG plugin (`qemu-plugin/`, GPL-2.0-or-later), built twice with
/// rustc directly (it has no dependencies): for plugin API version 1 (QEMU
/// 6.0 to 8.2) and version 2 (QEMU 9.0 on), into this build's OUT_DIR.
/// `PTISCOPE_QEMU_PLUGIN_API1`/`_API2` name the files; ptiscope loads one
/// into QEMU by path (it never links the plugin). A build without a working
/// rustc for them leaves the variables unset: `--backend qemu` then says the
/// plugin is missing instead of the build failing.
fn build_qemu_plugins(root: &Path) {
    let src = root.join("qemu-plugin").join("src");
    println!("cargo:rerun-if-changed={}", src.display());
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo"));
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    for (var, file, cfg) in [
        (
            "PTISCOPE_QEMU_PLUGIN_API1",
            "libptiscope_tcg_plugin_api1.so",
            None,
        ),
        (
            "PTISCOPE_QEMU_PLUGIN_API2",
            "libptiscope_tcg_plugin_api2.so",
            Some("feature=\"api-v2\""),
        ),
    ] {
        let out = out_dir.join(file);
        let mut cmd = Command::new(&rustc);
        cmd.args([
            "--edition",
            "2021",
            "--crate-type",
            "cdylib",
            "--crate-name",
            "ptiscope_tcg_plugin",
            "-C",
            "opt-level=3",
            "-C",
            "panic=abort",
        ])
        .arg("-o")
        .arg(&out)
        .arg(src.join("lib.rs"));
        if let Some(cfg) = cfg {
            cmd.args(["--cfg", cfg]);
        }
        match cmd.status() {
            Ok(s) if s.success() => println!("cargo:rustc-env={var}={}", out.display()),
            Ok(s) => println!("cargo:warning=building the QEMU plugin ({file}) failed: {s}"),
            Err(e) => println!("cargo:warning=could not run {rustc} for the QEMU plugin: {e}"),
        }
    }
}

/// (target triple, env var naming the built init) of `linux-init`.
const INIT_FLAVOURS: &[(&str, &str)] = &[
    ("x86_64-unknown-linux-musl", "PTISCOPE_LINUX_INIT_X86_64"),
    ("i686-unknown-linux-musl", "PTISCOPE_LINUX_INIT_I386"),
];

/// `PTISCOPE_GIT_REVISION`: the checkout's commit (`git rev-parse HEAD`),
/// for the `environment` block of reports. Absent when this is not a git
/// checkout or git is missing (a crate tarball, a container without git): a
/// build must never fail for it. Cargo reruns this script when HEAD or the
/// branch it points to moves; uncommitted edits are not tracked (the
/// revision names the commit the build started from).
fn emit_git_revision(root: &Path) {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .current_dir(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())?;
        let text = String::from_utf8(out.stdout).ok()?;
        let text = text.trim();
        (!text.is_empty()).then(|| text.to_owned())
    };
    let Some(revision) = git(&["rev-parse", "HEAD"]) else {
        return;
    };
    println!("cargo:rustc-env=PTISCOPE_GIT_REVISION={revision}");
    // HEAD itself, the branch ref it names and packed-refs (a worktree's
    // HEAD lives in its own git dir, refs in the common one: --git-path
    // resolves both).
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for name in watched {
        // Only files that exist: cargo reruns a script on every build
        // while a file it watches is missing (packed-refs often is).
        if let Some(path) = git(&["rev-parse", "--git-path", &name]) {
            let path = root.join(path);
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
}

/// Makes sure the standard library for `triple` is installed in the active
/// toolchain. rustup installs `rust-toolchain.toml`'s `targets` only when it
/// installs the toolchain itself; a machine that already had 1.95.0 lacks
/// them, and the README promises that `cargo run --release` sets up
/// everything. So when the target's library directory is missing and rustup
/// is there, add the target and say so.
fn ensure_target(triple: &str) {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let sysroot = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let Some(sysroot) = sysroot else { return };
    if sysroot
        .join("lib/rustlib")
        .join(triple)
        .join("lib")
        .is_dir()
    {
        return;
    }
    println!(
        "cargo:warning=the guest target {triple} is not installed; running `rustup target add {triple}`"
    );
    let mut cmd = Command::new("rustup");
    cmd.args(["target", "add", triple]);
    if let Ok(toolchain) = env::var("RUSTUP_TOOLCHAIN") {
        cmd.args(["--toolchain", &toolchain]);
    }
    match cmd.status() {
        Ok(s) if s.success() => {}
        Ok(s) => println!("cargo:warning=`rustup target add {triple}` failed ({s})"),
        Err(e) => println!("cargo:warning=could not run rustup ({e}); install the target by hand"),
    }
}

fn build_guest(kernel_dir: &Path, target_dir: &Path, triple: &str) -> PathBuf {
    build_crate(kernel_dir, target_dir, triple, "ptiscope-guest")
}

/// Builds the binary `bin` of the cargo workspace in `dir` for `triple`.
fn build_crate(dir: &Path, target_dir: &Path, triple: &str, bin: &str) -> PathBuf {
    ensure_target(triple);
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(dir)
        .args(["build", "--release", "--locked", "--target", triple])
        .arg("--target-dir")
        .arg(target_dir);
    for (key, _) in env::vars_os() {
        let key = key.to_string_lossy();
        let leaks = (key.starts_with("CARGO_") && key != "CARGO_HOME")
            || key.starts_with("RUSTC")
            || key == "RUSTFLAGS"
            || key == "RUSTDOCFLAGS";
        if leaks {
            cmd.env_remove(key.as_ref());
        }
    }
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("could not run cargo to build {bin}: {e}"));
    if !status.success() {
        panic!(
            "building {bin} for {triple} failed (see the errors above); \
             is the target installed? `rustup target add {triple}`"
        );
    }
    let elf = target_dir.join(triple).join("release").join(bin);
    assert!(
        elf.is_file(),
        "{bin} build succeeded but {} is missing",
        elf.display()
    );
    elf
}
