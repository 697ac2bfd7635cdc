//! Why a `--linux` run cannot be settled.

use std::path::PathBuf;

use super::image::{self, ImageError};
use crate::machine::loader::LoadError;

/// Errors settling a Linux guest.
#[derive(Debug, thiserror::Error)]
pub enum LinuxError {
    /// A known name whose kernel is not in the cache.
    #[error(
        "--linux {name}: not fetched yet ({path} is missing); {}",
        match blocker {
            Some(b) => format!(
                "the kernel cache cannot hold it: {} exists and is not a directory (set \
                 PTISCOPE_LINUX_CACHE to a directory, then `ptiscope linux fetch`)",
                b.display()
            ),
            None => "run `ptiscope linux fetch` (it uses apt-get download; see \
                     docs/linux-guests.md)"
                .to_string(),
        }
    )]
    NotFetched {
        /// The name.
        name: String,
        /// Where it would be.
        path: PathBuf,
        /// A file where the cache, or a directory above it, should be (a
        /// fetch would fail on it: said now, not after it).
        blocker: Option<PathBuf>,
    },
    /// Neither a known name nor an existing file: a misspelt name is said
    /// so, not reported as a missing kernel image of that name.
    #[error(
        "--linux/linux= {name:?}: neither a kernel ptiscope knows ({known}; `ptiscope linux fetch \
         --only NAME` fetches one) nor a file here: give one of those names, or a kernel \
         image's path"
    )]
    Unknown {
        /// The value given.
        name: String,
        /// The known names, comma-separated.
        known: String,
    },
    /// No cache directory for a known name.
    #[error("--linux {0}: no cache directory (set PTISCOPE_LINUX_CACHE)")]
    NoCache(String),
    /// The image is not a kernel, or not readable.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// `--arch` and the image disagree.
    #[error(
        "{path} is an {image} kernel but --arch {asked} was given: drop --arch (it follows the \
         image) or give a kernel of that architecture"
    )]
    ArchMismatch {
        /// The kernel.
        path: String,
        /// The image's architecture.
        image: &'static str,
        /// `--arch`.
        asked: &'static str,
    },
    /// The backend cannot run a Linux userspace here.
    #[error("{0}")]
    Backend(String),
    /// A ptiscope option that means nothing to a Linux guest, or a bad value.
    #[error("{0}")]
    Option(String),
    /// pti=on for a kernel built without PTI.
    #[error(
        "{path}: pti=on was asked, but its configuration ({config}) has no {}: this kernel \
         cannot isolate page tables, so there is no PTI cost to measure{hint}",
        image::PAGE_TABLE_ISOLATION.either_y()
    )]
    NoPti {
        /// The kernel.
        path: String,
        /// The configuration file.
        config: String,
        /// More on why (a 32-bit kernel without PAE), or empty.
        hint: String,
    },
}

impl LinuxError {
    /// The termination signal that stopped the read of the kernel image
    /// (or of the configuration beside it), if one did (the command then ends with 128 + it, as a signal during a run).
    pub fn signal(&self) -> Option<i32> {
        match self {
            LinuxError::Image(ImageError::Read(LoadError::Interrupted(signal))) => Some(*signal),
            LinuxError::Image(ImageError::Config { source, .. }) => source.signal(),
            _ => None,
        }
    }
}
