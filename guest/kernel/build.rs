//! Passes the linker script of the selected architecture to the linker.
use std::env;
use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let arch = env::var("CARGO_CFG_TARGET_ARCH").expect("set by cargo");
    let script = dir.join("src").join("arch").join(&arch).join("linker.ld");
    println!("cargo:rerun-if-changed={}", script.display());
    println!("cargo:rustc-link-arg-bins=-T{}", script.display());
}
