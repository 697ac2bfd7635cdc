//! The default `--timeout` of a run that boots Linux: it fits the run
//! (the backend's boot, the calls asked for, `--by-symbol`'s slower
//! counting and its symbol table), where one fixed 60 s killed honest
//! TCG runs that had printed their `@result` line. An explicit `--timeout`
//! is always kept as given; the companion guest's defaults (10 s for `run`,
//! 60 s for `compare`/`sweep`) are unchanged.
//!
//! The allowances are measured here (2 shared cores, debug and release
//! builds, 2026-12): a Linux boot to the init takes 10-30 s under QEMU TCG
//! and 60-120 s for a whole nested run; a getppid with PTI 15-40 µs under
//! TCG with the plugin, several times that when it counts by address
//! (`--by-symbol`), whose kernel symbol table (200,000 lines of
//! /proc/kallsyms through a debug port) then takes tens of seconds more;
//! 640 µs a call on a KVM with shadow paging inside TCG. Each allowance is
//! a few times what was measured, for a busy host.

use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches};

use super::{Cli, Command};
use crate::backend::registry::{BackendName, LinuxPace, NESTED_PACE};

/// The shortest default for a Linux run: the fixed default it replaces, so
/// that no default became shorter.
pub const LINUX_FLOOR: Duration = Duration::from_secs(60);

/// How long a Linux guest takes on the backend asked for (by name): its
/// registration's pace; the inner command of `--backend nested` (a `kvm`
/// run inside it) gets the nested pace, as the outer command that bounds
/// its session does.
pub fn pace(backend: &str) -> LinuxPace {
    match BackendName::of(backend) {
        Some(b) if b.as_str() == "kvm" && crate::cli::host_facts().nested() => NESTED_PACE,
        Some(b) => b.registration().linux_pace,
        None => NESTED_PACE,
    }
}

/// `--by-symbol` counts every instruction by address: each call costs this
/// many times more, and the kernel's symbols are sent after the result.
const BY_SYMBOL_FACTOR: u32 = 4;
/// Sending /proc/kallsyms after the result (`--by-symbol`).
const BY_SYMBOL_SYMBOLS: Duration = Duration::from_secs(60);

/// The default `--timeout` of one Linux run of `iterations` calls on
/// `at`: its boot, plus the calls (times [`BY_SYMBOL_FACTOR`] and plus the
/// symbols with `--by-symbol`), at least [`LINUX_FLOOR`], at most a day.
pub fn linux_default(at: LinuxPace, iterations: u64, by_symbol: bool) -> Duration {
    let factor = if by_symbol { BY_SYMBOL_FACTOR } else { 1 };
    let calls = at
        .per_call
        .checked_mul(u32::try_from(iterations).unwrap_or(u32::MAX))
        .and_then(|d| d.checked_mul(factor))
        .unwrap_or(super::MAX_TIMEOUT);
    let symbols = if by_symbol {
        BY_SYMBOL_SYMBOLS
    } else {
        Duration::ZERO
    };
    (at.boot + symbols)
        .saturating_add(calls)
        .clamp(LINUX_FLOOR, super::MAX_TIMEOUT)
}

/// Whether a compare side's options give it a Linux kernel (`linux=`).
fn side_boots_linux(opts: &str) -> bool {
    opts.split(',')
        .any(|w| w.split_once('=').is_some_and(|(k, _)| k.trim() == "linux"))
}

/// Parses the command line as `main` does and settles the `--timeout`
/// defaults that depend on other options ([`linux_default`] for a run that
/// boots Linux: `run --linux`, a `compare` with `--linux` or a `linux=`
/// side, a `sweep --linux`).
pub fn parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let matches = Cli::command().try_get_matches_from(args)?;
    let mut cli = Cli::from_arg_matches(&matches)?;
    settle(&mut cli, &matches);
    Ok(cli)
}

/// [`parse_from`] of the process's arguments.
pub fn parse() -> Result<Cli, clap::Error> {
    parse_from(std::env::args_os())
}

/// Replaces a defaulted `--timeout` of a Linux run by [`linux_default`].
fn settle(cli: &mut Cli, matches: &ArgMatches) {
    let defaulted = |name: &str| {
        matches
            .subcommand_matches(name)
            .is_some_and(|m| m.value_source("timeout") == Some(ValueSource::DefaultValue))
    };
    match &mut cli.command {
        Some(Command::Run(a)) if defaulted("run") && a.linux.linux.is_some() => {
            let iterations = a
                .iterations
                .unwrap_or(ptiscope_abi::options::DEFAULT_ITERATIONS);
            a.timeout = linux_default(pace(a.on.backend.as_str()), iterations, a.by_symbol);
        }
        Some(Command::Compare(a))
            if defaulted("compare")
                && (a.target.linux.linux.is_some()
                    || side_boots_linux(&a.baseline)
                    || side_boots_linux(&a.compare)) =>
        {
            a.exp.timeout = a.exp.timeout.max(linux_default(
                pace(a.target.on.backend.as_str()),
                a.exp.iterations,
                a.by_symbol,
            ));
        }
        Some(Command::Sweep(a)) if defaulted("sweep") && a.target.linux.linux.is_some() => {
            a.exp.timeout = a.exp.timeout.max(linux_default(
                pace(a.target.on.backend.as_str()),
                a.exp.iterations,
                false,
            ));
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The formula: boot + calls (x4 and + the symbols with --by-symbol),
    /// at least 60 s, at most a day.
    #[test]
    fn the_linux_default_is_boot_plus_calls_at_least_the_old_60_s() {
        let s = |d: Duration| d.as_secs_f64();
        // Few calls: the floor.
        assert_eq!(s(linux_default(pace("kvm"), 10_000, false)), 60.0);
        assert_eq!(s(linux_default(pace("qemu"), 0, false)), 60.0);
        // TCG: 60 s + 20000 x 0.25 ms; with --by-symbol x4 and + 60 s.
        assert_eq!(s(linux_default(pace("qemu"), 20_000, false)), 65.0);
        assert_eq!(s(linux_default(pace("qemu"), 20_000, true)), 140.0);
        // Nested: 120 s + 20000 x 2 ms.
        assert_eq!(s(linux_default(pace("nested"), 20_000, false)), 160.0);
        // Absurd counts end at a day, not in an overflow.
        assert_eq!(
            linux_default(pace("qemu"), u64::MAX, true),
            super::super::MAX_TIMEOUT
        );
        // It grows with every input.
        assert!(
            linux_default(pace("qemu"), 400_000, false)
                > linux_default(pace("qemu"), 200_000, false)
        );
        assert!(linux_default(pace("nested"), 1, false) > linux_default(pace("qemu"), 1, false));
    }

    fn timeout(argv: &[&str]) -> f64 {
        let cli = parse_from([&["ptiscope"][..], argv].concat()).unwrap();
        match cli.command {
            Some(Command::Run(a)) => a.timeout,
            Some(Command::Compare(a)) => a.exp.timeout,
            Some(Command::Sweep(a)) => a.exp.timeout,
            _ => panic!("{argv:?}"),
        }
        .as_secs_f64()
    }

    /// Defaults settle by the command's options; a --timeout given is kept.
    #[test]
    fn a_defaulted_timeout_fits_the_linux_run_and_a_given_one_is_kept() {
        // The companion guest's defaults are unchanged.
        assert_eq!(timeout(&["run"]), 10.0);
        assert_eq!(timeout(&["compare"]), 60.0);
        assert_eq!(
            timeout(&["run", "--backend", "qemu", "--iterations", "2000000"]),
            10.0
        );
        // Linux: by backend, iterations and --by-symbol.
        let qemu_linux = ["run", "--backend", "qemu", "--linux", "debian-amd64"];
        // The init's default 10000 calls: 60 s + 10000 x 0.25 ms.
        assert_eq!(timeout(&qemu_linux), 62.5);
        assert_eq!(timeout(&["run", "--linux", "debian-amd64"]), 60.0);
        let many = [&qemu_linux[..], &["--iterations", "200000", "--by-symbol"]].concat();
        assert_eq!(timeout(&many), 60.0 + 60.0 + 200.0);
        assert_eq!(
            timeout(&[
                "compare",
                "--backend",
                "qemu",
                "--by-symbol",
                "--linux",
                "debian-amd64"
            ]),
            140.0
        );
        // A side's linux= is a Linux run too.
        assert_eq!(
            timeout(&[
                "compare",
                "--backend",
                "nested",
                "--compare",
                "pti=on, linux=debian-amd64"
            ]),
            160.0
        );
        assert_eq!(
            timeout(&[
                "sweep",
                "--backend",
                "qemu",
                "--linux",
                "debian-amd64",
                "--iterations",
                "400000"
            ]),
            160.0
        );
        // Given, it is what was given, however short.
        assert_eq!(timeout(&[&many[..], &["--timeout", "5"]].concat()), 5.0);
        assert_eq!(
            timeout(&[
                "compare",
                "--linux",
                "debian-amd64",
                "--by-symbol",
                "--timeout",
                "60"
            ]),
            60.0
        );
    }
}
