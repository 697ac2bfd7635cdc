//! `ptiscope linux fetch`: Debian's kernels into the cache.

use crate::cli::exit_code;
use crate::cli::LinuxCommand;
use crate::linux::fetch;

/// Runs a `ptiscope linux` command; returns the exit code.
pub fn run(cmd: &LinuxCommand) -> i32 {
    match cmd {
        LinuxCommand::Fetch(args) => {
            let Some(cache) = fetch::cache_dir() else {
                eprintln!("ptiscope linux fetch: {}", fetch::FetchError::NoCache);
                return exit_code::USAGE;
            };
            let mut failed = false;
            for known in fetch::KNOWN
                .iter()
                .filter(|k| args.only.as_deref().is_none_or(|o| o == k.name))
            {
                let mut say = |s: &str| eprintln!("ptiscope linux fetch: {s}");
                match fetch::fetch(known, &cache, &mut say) {
                    Ok(path) => println!("{} {}", known.name, path.display()),
                    Err(e) => {
                        eprintln!("ptiscope linux fetch: {}: {e}", known.name);
                        failed = true;
                    }
                }
            }
            if failed {
                exit_code::KVM_UNAVAILABLE
            } else {
                0
            }
        }
    }
}
