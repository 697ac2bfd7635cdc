//! Files ptiscope reads are bounded: `compare --against` and `--kernel` on a
//! FIFO with no writer, /dev/zero, /dev/urandom or a 1 GiB file end at once
//! with a message and exit 64 (66 for an image that cannot be read, 65 for
//! one too large), never a hang or memory exhausted; `--against` takes the
//! one schema it reads, not anything with its prefix.

mod common;

use std::time::Duration;

use common::*;

fn mkfifo(path: &std::path::Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

/// A sparse regular file of 1 GiB (no disk space used).
fn huge_file(path: &std::path::Path) {
    let f = std::fs::File::create(path).unwrap();
    f.set_len(1 << 30).unwrap();
}

#[test]
fn against_reads_only_a_bounded_regular_file() {
    let dir = scratch("against-hostile");
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    let huge = dir.join("huge.json");
    huge_file(&huge);
    let next_schema = dir.join("next.json");
    std::fs::write(&next_schema, r#"{"schema":"ptiscope.compare/2"}"#).unwrap();
    for (path, needle) in [
        (
            fifo.to_str().unwrap(),
            "is a FIFO (named pipe), not a regular file",
        ),
        ("/dev/zero", "is a character device, not a regular file"),
        ("/dev/urandom", "is a character device, not a regular file"),
        (huge.to_str().unwrap(), "larger than 16 MiB"),
        (
            next_schema.to_str().unwrap(),
            "schema \"ptiscope.compare/2\"",
        ),
    ] {
        let (code, err) = run_within(
            &["compare", "--timeout", "5", "--against", path],
            Duration::from_secs(5),
        );
        assert_eq!(code, Some(64), "{path}: {err}");
        assert!(
            err.contains(&format!("--against {path}: ")) && err.contains(needle),
            "{path}: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn kernel_images_are_bounded_regular_files() {
    let dir = scratch("kernel-hostile");
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    let huge = dir.join("huge.elf");
    huge_file(&huge);
    for (path, code, needle) in [
        (
            fifo.to_str().unwrap(),
            66,
            "is a FIFO (named pipe), not a regular file",
        ),
        ("/dev/zero", 66, "is a character device, not a regular file"),
        (huge.to_str().unwrap(), 65, "is larger than 268435456 bytes"),
    ] {
        let (got, err) = run_within(&["run", "--kernel", path], Duration::from_secs(10));
        assert_eq!(got, Some(code), "{path}: {err}");
        assert!(err.contains(needle), "{path}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
