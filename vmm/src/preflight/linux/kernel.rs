//! Which kernel a `--linux` value names: a known name's cached image, else
//! a path.

use std::path::PathBuf;

use super::error::LinuxError;
use super::fetch;

/// Where a known kernel lives in the cache.
pub fn known_path(name: &str) -> Option<Result<PathBuf, LinuxError>> {
    fetch::KNOWN.iter().find(|k| k.name == name)?;
    Some(
        fetch::cache_dir()
            .map(|d| d.join(name).join("vmlinuz"))
            .ok_or_else(|| LinuxError::NoCache(name.into())),
    )
}

/// The kernel a `--linux` value names: a known name's cached image, else a path.
pub fn kernel_path(spec: &str) -> Result<PathBuf, LinuxError> {
    match known_path(spec) {
        Some(Ok(p)) if !p.exists() => Err(LinuxError::NotFetched {
            name: spec.into(),
            blocker: p
                .parent()
                .and_then(std::path::Path::parent)
                .and_then(fetch::not_a_directory),
            path: p,
        }),
        Some(r) => r,
        // A value with no `/` that names no file is taken for a name (a
        // path given as a path keeps the image reader's "cannot read").
        None if !spec.contains('/') && std::fs::symlink_metadata(spec).is_err() => {
            Err(LinuxError::Unknown {
                name: spec.into(),
                known: fetch::KNOWN.map(|k| k.name).join(", "),
            })
        }
        None => Ok(PathBuf::from(spec)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value that is neither a known name nor a file is said to be so,
    /// with the known names; a path keeps the reader's own message.
    #[test]
    fn unknown_kernel_names_are_named_with_the_known_ones() {
        for name in ["debian-6.12-i386", "debian-amd65", "", "DEBIAN-AMD64"] {
            let e = kernel_path(name).unwrap_err();
            assert!(matches!(e, LinuxError::Unknown { .. }), "{name}: {e:?}");
            let m = e.to_string();
            assert!(m.contains("debian-amd64, debian-686-pae"), "{m}");
        }
        assert_eq!(
            kernel_path("/nonexistent/vmlinuz").unwrap(),
            PathBuf::from("/nonexistent/vmlinuz")
        );
    }
}
