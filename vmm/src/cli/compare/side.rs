//! One side of a comparison: its `--baseline`/`--compare` options parsed
//! into a run configuration, settled by preflight, run and measured; and
//! the compare table built from both sides' runs.

use crate::backend::{Backend, HostWatch, Summarized};
use crate::cli::command_error::SideError;
use crate::cli::compare::side_key::SideKey;
use crate::cli::exit_code::ExitCode;
use crate::cli::measured_error::MeasuredRunError;
use crate::cli::{ExperimentOpts, TargetOpts};
use crate::machine::loader::KernelSource;
use crate::machine::RunOutcome;
use crate::output::SerialOut;
use crate::report::environment::GuestImage;
use crate::report::rate_name;
use crate::report::stats::CountRuns;
use crate::report::{CompareTable, Metric, RunSummary};
use crate::spec::cmdline::{CpuVuln, EntryChoice};
use crate::spec::guest::GuestKind;
use crate::spec::linux::LinuxRequest;
use crate::spec::{ResolvedRun, RunConfig};
use ptiscope_abi::options::{PtiMode, Switch, Workload};
use ptiscope_devices::escape_str;

/// One side of the comparison.
#[derive(Debug, Clone)]
pub struct SideSpec {
    /// Column label: the options as given (`pti=on,pcid=on`).
    pub label: String,
    /// The run configuration the options make.
    pub config: RunConfig,
}

/// One side, settled for its backend.
#[derive(Debug, Clone)]
pub struct Side {
    /// Column label: the options as given.
    pub label: String,
    /// The run every run of this side boots.
    pub run: ResolvedRun,
}

fn enum_value<T: clap::ValueEnum>(v: &str) -> Result<T, String> {
    T::from_str(v, false).map_err(|_| {
        let names: Vec<String> = T::value_variants()
            .iter()
            .filter_map(|x| x.to_possible_value().map(|p| p.get_name().to_string()))
            .collect();
        format!("{v:?} (possible values: {})", names.join(", "))
    })
}

/// A guest-ABI option value, with the accepted names in the message.
fn abi_value<T: std::str::FromStr>(
    v: &str,
    names: impl IntoIterator<Item = &'static str>,
) -> Result<T, String> {
    v.parse::<T>().map_err(|_| {
        let names: Vec<&str> = names.into_iter().collect();
        format!("{v:?} (possible values: {})", names.join(", "))
    })
}

/// Builds one side's run configuration from the common arguments and its options.
pub fn parse_side(
    opts: &str,
    exp: &ExperimentOpts,
    target: &TargetOpts,
    embedded: &'static [u8],
) -> Result<SideSpec, SideError> {
    let kernel = match &exp.kernel {
        Some(p) => KernelSource::Path(p.clone()),
        None => KernelSource::Embedded(embedded),
    };
    let mut c = RunConfig::new(kernel);
    c.mem_mib = exp.mem;
    c.cpus = exp.cpus;
    c.timeout = exp.timeout;
    c.serial_out = SerialOut::Discard;
    c.handle_signals = true;
    c.guest.workload = Some(exp.workload);
    c.guest.iterations = Some(exp.iterations);
    let qemu = target.on.qemu();
    c.qemu_args = qemu.qemu_arg;
    c.guest_kind = target.linux.guest_kind(target.arch);
    c.qemu_plugin = !qemu.no_plugin;
    // `append=` words, applied once the side's guest is known (a `linux=`
    // may come after them).
    let mut append: Vec<String> = Vec::new();
    let words: Vec<&str> = opts
        .split(',')
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .collect();
    // A side that sets nothing has no label and means every default:
    // refused, as `sweep --config ''` is.
    if words.is_empty() {
        return Err(SideError::Empty { opts: opts.into() });
    }
    // The single-valued keys given so far with their values (`pti` also
    // by `append=pti=`): the same value again is harmless, another one is
    // a contradiction (which would win was the order's silent choice).
    let mut given: Vec<(SideKey, String)> = Vec::new();
    let mut once = |key: SideKey, shown: &str, value: &str| {
        if key.accumulates() {
            return Ok(());
        }
        match given.iter().find(|(k, _)| *k == key) {
            Some((_, earlier)) if earlier != value => Err(SideError::Repeated {
                opts: opts.into(),
                key: shown.into(),
            }),
            Some(_) => Ok(()),
            None => {
                given.push((key, value.to_string()));
                Ok(())
            }
        }
    };
    for word in words {
        let Some((k, v)) = word.split_once('=') else {
            return Err(SideError::NotKeyValue {
                opts: opts.into(),
                word: word.into(),
            });
        };
        let (k, v) = (k.trim(), v.trim());
        let bad = |why: String| SideError::BadValue {
            opts: opts.into(),
            key: k.into(),
            why,
        };
        let Some(key) = SideKey::from_name(k) else {
            return Err(SideError::UnknownKey {
                opts: opts.into(),
                key: k.into(),
            });
        };
        // A word that adds nothing (`append=`, `cmdline=`) is a slip, as an
        // empty side is: every other key's own parser refuses "" already.
        if key.accumulates() && v.is_empty() {
            return Err(bad(
                "is empty: give the words to add (or drop the key)".into()
            ));
        }
        once(key, k, v)?;
        match key {
            SideKey::Pti => {
                c.guest.pti =
                    Some(abi_value::<PtiMode>(v, PtiMode::NAMES.iter().copied()).map_err(bad)?)
            }
            SideKey::Pcid => {
                c.guest.pcid =
                    Some(abi_value::<Switch>(v, Switch::NAMES.iter().copied()).map_err(bad)?)
            }
            SideKey::Entry => {
                c.guest.entry = abi_value::<EntryChoice>(v, EntryChoice::names()).map_err(bad)?
            }
            SideKey::CpuVuln => {
                // As --cpu-vuln is: under QEMU a value other than the
                // default would set nothing, and the side's label would
                // claim what was not measured.
                c.cpu_vuln = enum_value::<CpuVuln>(v).map_err(bad)?;
                if c.cpu_vuln != CpuVuln::Host {
                    if let Some(why) =
                        crate::backend::others_option(target.on.options_owner(), "cpu_vuln=")
                    {
                        return Err(bad(why));
                    }
                }
            }
            SideKey::Workload => {
                c.guest.workload =
                    Some(abi_value::<Workload>(v, Workload::NAMES.iter().copied()).map_err(bad)?)
            }
            SideKey::Iterations => {
                c.guest.iterations = Some(
                    v.parse()
                        .map_err(|_| bad(format!("{v:?} is not a count")))?,
                )
            }
            SideKey::Mem => c.mem_mib = crate::cli::parse_mem(v).map_err(bad)?,
            SideKey::Cmdline => c.guest.extra = format!("{} {v}", c.guest.extra).trim().to_string(),
            // The 2020 RFC's strategy; a guest option, passed on its command line.
            SideKey::PtiSwitch => {
                let s: ptiscope_abi::options::PtiSwitch =
                    abi_value(v, ptiscope_abi::options::PtiSwitch::NAMES.iter().copied())
                        .map_err(bad)?;
                c.guest.extra = format!("{} pti_switch={s}", c.guest.extra)
                    .trim()
                    .to_string();
            }
            // A Linux kernel for this side (a known name or a path), as
            // `--linux` gives one to both.
            SideKey::Linux => {
                if v.trim().is_empty() {
                    return Err(bad(format!(
                        "names no kernel ({} or a path)",
                        crate::preflight::linux::fetch::KNOWN
                            .map(|k| k.name)
                            .join(", ")
                    )));
                }
                let append = match &c.guest_kind {
                    GuestKind::Linux(r) => r.append.clone(),
                    GuestKind::Companion => target.linux.append.clone().unwrap_or_default(),
                };
                c.guest_kind = GuestKind::Linux(LinuxRequest {
                    kernel: v.trim().to_string(),
                    append,
                    arch: target.arch.map(crate::cli::Arch::linux_arch),
                    tick_free: target.linux.tick_free,
                });
            }
            // More Linux kernel command line for this side. `pti=` there
            // is Linux's own parameter, which is what this side's `pti=`
            // sets: taken as that.
            SideKey::Append => {
                for w in v.split_whitespace() {
                    // As Linux reads the word: `"pti=on"` is `pti=on`.
                    match crate::preflight::linux::param_key_value(w) {
                        Some(("pti", p)) => {
                            once(SideKey::Pti, "pti (append=pti=)", p.trim())?;
                            c.guest.pti = Some(
                                abi_value::<PtiMode>(p, PtiMode::NAMES.iter().copied())
                                    .map_err(bad)?,
                            )
                        }
                        _ => append.push(w.to_string()),
                    }
                }
            }
            // QEMU's emulated CPU model for this side (`-cpu`).
            SideKey::Cpu => {
                if let Some(why) = crate::backend::others_option(target.on.options_owner(), "cpu=")
                {
                    return Err(bad(format!("chooses QEMU's emulated CPU model: {why}")));
                }
                let model_ok = !v.is_empty()
                    && v.len() <= 128
                    && v.chars()
                        .all(|ch| ch.is_ascii_alphanumeric() || "-_.+=".contains(ch));
                if !model_ok {
                    return Err(bad(format!(
                        "{v:?} is not a CPU model name (letters, digits and -_.+= only; \
                         `qemu-system-x86_64 -cpu help` lists them)"
                    )));
                }
                // Checked against QEMU's own list now, not when the
                // side's first run starts QEMU (after the other side's).
                // x86_64's and i386's emulators list the same models.
                if let Some(why) = crate::backend::qemu::cpu_model_refusal("qemu-system-x86_64", v)
                {
                    return Err(bad(why));
                }
                c.qemu_cpu = Some(v.to_string());
            }
        }
    }
    if !append.is_empty() {
        match &mut c.guest_kind {
            GuestKind::Linux(r) => {
                r.append = format!("{} {}", r.append, append.join(" "))
                    .trim()
                    .to_string();
            }
            GuestKind::Companion => {
                return Err(SideError::BadValue {
                    opts: opts.into(),
                    key: "append".into(),
                    why: "is Linux kernel command line: give the side a Linux guest \
                          (linux=debian-amd64, or --linux); ptiscope's own guest takes cmdline="
                        .into(),
                });
            }
        }
    }
    Ok(SideSpec {
        label: opts.trim().to_string(),
        config: c,
    })
}

/// The configuration words of a run (its guest command line without the
/// telemetry address, which is the VMM's business).
pub fn config_words(outcome: &RunOutcome) -> Vec<String> {
    outcome
        .cmdline
        .split_whitespace()
        .filter(|w| !w.starts_with("telemetry="))
        .map(str::to_string)
        .collect()
}

/// One measured run on `backend`, of either guest kind: its summary is
/// the one `backend::Ran::summary` chooses for it.
pub fn run_measured(
    resolved: &ResolvedRun,
    backend: &dyn Backend,
) -> Result<(RunOutcome, RunSummary), MeasuredRunError> {
    let ran = backend.run(resolved, HostWatch::default())?;
    let Summarized { summary: s, host } = ran.summary(resolved, config_words(&ran.outcome));
    let o = ran.outcome;
    if let GuestKind::Linux(l) = &resolved.guest_kind {
        if let Some(end) = crate::cli::linux::diagnose(&o, l, host.as_ref()) {
            return Err(MeasuredRunError::Linux {
                message: end.to_string(),
                code: end.code,
                failure: end.failure,
                end: Box::new(crate::report::end::RunEnd::of(&o)),
            });
        }
        return Ok((o, s));
    }
    if o.exit_code() == 0 && s.phase.is_none() {
        return Err(MeasuredRunError::NoPhase {
            workload: resolved.guest.workload.map_or("-", Workload::name),
        });
    }
    if o.exit_code() != 0 {
        // Guest text: escaped before it reaches the terminal.
        let mut msg = o.stop_description();
        for f in o.faults() {
            msg.push_str(&format!("\n  guest reported: {}", escape_str(f)));
        }
        if !o.console_tail.is_empty() {
            msg.push_str("\n  last console lines:");
            for l in &o.console_tail {
                msg.push_str(&format!("\n    | {}", escape_str(l)));
            }
        }
        return Err(MeasuredRunError::GuestFailed {
            end: Box::new(crate::report::end::RunEnd::of(&o)),
            report: msg,
        });
    }
    Ok((o, s))
}

/// Per-call rates of a run: `(metric, value)` for every row with one.
pub fn rates(s: &RunSummary) -> Vec<(Metric, f64)> {
    s.rows
        .iter()
        .filter_map(|r| {
            let v = r.per_iteration?;
            let mut m = r.metric.clone();
            m.name = rate_name(&r.metric.name, &r.metric.unit);
            if r.metric.unit != "KiB" {
                m.unit = format!("{}/{}", r.metric.unit, s.iteration_name);
            }
            Some((m, v))
        })
        .collect()
}

/// The integer count and calls behind rate `rate_name` of a run, where
/// the rate is one: a `count` row whose total is a whole number and whose
/// rate is that total over the run's calls. `None` for anything else (a
/// time, a size, a rate over another divisor).
pub fn count_of(s: &RunSummary, rate: &str) -> Option<(u64, u64)> {
    let r = s
        .rows
        .iter()
        .find(|r| r.metric.unit == "count" && rate_name(&r.metric.name, &r.metric.unit) == rate)?;
    // Whole, non-negative and exactly representable (below 2^53).
    let whole = r.total.fract() == 0.0 && (0.0..9.007_199_254_740_992e15).contains(&r.total);
    let calls = s.iterations;
    let rate_is_total_over_calls = r.per_iteration == Some(r.total / calls as f64);
    (whole && calls > 0 && rate_is_total_over_calls).then_some((r.total as u64, calls))
}

/// The table from the runs of both sides: every rate present in every run.
pub fn build_table(
    baseline: (&str, &[RunSummary]),
    compare: (&str, &[RunSummary]),
) -> (CompareTable, Vec<String>) {
    let side = |label: &str, runs: &[RunSummary]| crate::report::compare::Side {
        label: label.to_string(),
        config: runs.first().map(|r| r.config.clone()).unwrap_or_default(),
    };
    let mut t = CompareTable::new(side(baseline.0, baseline.1), side(compare.0, compare.1));
    let mut dropped = Vec::new();
    let Some(first) = baseline.1.first() else {
        return (t, dropped);
    };
    for (metric, _) in rates(first) {
        // A count is carried as each run's integers, compared as such.
        let counts = |runs: &[RunSummary]| -> Option<CountRuns> {
            let (c, n): (Vec<u64>, Vec<u64>) = runs
                .iter()
                .map(|r| count_of(r, &metric.name))
                .collect::<Option<Vec<_>>>()?
                .into_iter()
                .unzip();
            CountRuns::new(c, n)
        };
        if let (Some(b), Some(c)) = (counts(baseline.1), counts(compare.1)) {
            if let Err(e) = t.add_counts(metric.clone(), b, c) {
                dropped.push(format!("{}: {e}", metric.name));
            }
            continue;
        }
        let samples = |runs: &[RunSummary]| -> Option<Vec<f64>> {
            runs.iter()
                .map(|r| {
                    rates(r)
                        .into_iter()
                        .find(|(m, _)| m.name == metric.name)
                        .map(|(_, v)| v)
                })
                .collect()
        };
        match (samples(baseline.1), samples(compare.1)) {
            (Some(b), Some(c)) => {
                if let Err(e) = t.add(metric.clone(), &b, &c) {
                    dropped.push(format!("{}: {e}", metric.name));
                }
            }
            _ => dropped.push(format!("{}: missing in some runs", metric.name)),
        }
    }
    (t, dropped)
}

/// The image a run booted, named and hashed for the environment: the bytes
/// preflight read (so the hash is of what ran, not of the file read again).
pub fn guest_image_of(kernel: &KernelSource, bytes: Option<&[u8]>) -> GuestImage {
    let name = match kernel {
        KernelSource::Embedded(b) if std::ptr::eq(*b, crate::GUEST_I386) => {
            "embedded i386".to_owned()
        }
        KernelSource::Embedded(_) => "embedded x86_64".to_owned(),
        KernelSource::Path(p) => p.display().to_string(),
    };
    GuestImage::new(name, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    /// One side's options parsed as `compare --backend qemu` parses them.
    fn side(opts: &str) -> Result<SideSpec, SideError> {
        let cli = Cli::try_parse_from(["ptiscope", "compare", "--backend", "qemu"]).unwrap();
        let Some(Command::Compare(a)) = cli.command else {
            panic!("not compare")
        };
        parse_side(opts, &a.exp, &a.target, crate::GUEST_I386)
    }

    /// Every key of the table parses (so none is listed that the parser
    /// does not take), and an unknown key's refusal lists them all.
    #[test]
    fn every_key_parses_and_an_unknown_one_lists_them_all() {
        for key in SideKey::ALL {
            let value = match key {
                SideKey::Pti | SideKey::Pcid => "on",
                SideKey::Entry => "auto",
                SideKey::Workload => "getpid",
                SideKey::Iterations => "10",
                SideKey::CpuVuln => "none",
                SideKey::Mem => "64",
                SideKey::Cmdline => "x=1",
                SideKey::PtiSwitch => "asm",
                SideKey::Linux => "debian-amd64",
                SideKey::Append => "quiet",
                SideKey::Cpu => "max",
            };
            let opts = match key {
                SideKey::Append => "linux=debian-amd64,append=quiet".to_string(),
                _ => format!("{}={value}", key.name()),
            };
            let r = side(&opts);
            assert!(
                !matches!(r, Err(SideError::UnknownKey { .. })),
                "{opts}: {r:?}"
            );
            assert_eq!(SideKey::from_name(key.name()), Some(key));
        }
        let e = side("pti=on,colour=blue").unwrap_err().to_string();
        for key in SideKey::ALL {
            assert!(
                e.split(['(', ' ', ')']).any(|w| w == key.name()),
                "{} missing: {e}",
                key.name()
            );
        }
        assert!(
            e.contains("linux") && e.contains("append") && e.contains("cpu"),
            "{e}"
        );
        assert_eq!(SideKey::from_name("cpu-vuln"), Some(SideKey::CpuVuln));
        // `compare --help` describes every key too.
        for key in SideKey::ALL {
            assert!(
                crate::cli::COMPARE_HELP.contains(&format!(" {}=", key.name())),
                "compare --help lacks {}=",
                key.name()
            );
        }
    }

    /// A side that sets nothing is refused with a reason, as `sweep
    /// --config ''` is; empty words between commas are skipped.
    #[test]
    fn an_empty_side_is_refused() {
        for opts in ["", ",,,", " , ", "   "] {
            let e = side(opts).unwrap_err();
            assert!(matches!(e, SideError::Empty { .. }), "{opts:?}: {e:?}");
            let m = e.to_string();
            assert!(m.contains("sets nothing") && m.contains("pti=off"), "{m}");
        }
        assert_eq!(side("pti=on,,").unwrap().label, "pti=on,,");
    }

    /// A key that sets one value is given one value (`pti=` also counts
    /// through `append=pti=`); the same value again passes; values and keys
    /// are read trimmed.
    #[test]
    fn a_single_valued_key_given_two_values_is_refused() {
        for opts in [
            "pti=on,pti=off",
            "linux=debian-amd64,pti=on,append=pti=off",
            "linux=debian-amd64,append=pti=on quiet,append=pti=auto",
            "mem=64,mem=128",
            "cpu=max,cpu=qemu64",
            // (cpu_vuln= is --backend kvm's: this helper's sides are QEMU's.)
            "workload=getpid,workload=getppid",
            "linux=debian-amd64,linux=/k/bzImage",
        ] {
            let e = side(opts).unwrap_err();
            assert!(matches!(e, SideError::Repeated { .. }), "{opts}: {e:?}");
            assert!(e.to_string().contains("given twice"), "{e}");
        }
        for opts in [
            "pti=on,pti=on",
            "linux=debian-amd64,pti=on,append=pti=on",
            "mem=64, mem=64",
        ] {
            assert!(side(opts).is_ok(), "{opts}");
        }
        // cpu_vuln= under both spellings, on the backend that takes it.
        let cli = Cli::try_parse_from(["ptiscope", "compare"]).unwrap();
        let Some(Command::Compare(a)) = cli.command else {
            panic!("not compare")
        };
        let e = parse_side("cpu_vuln=none,cpu-vuln=host", &a.exp, &a.target, &[]).unwrap_err();
        assert!(matches!(e, SideError::Repeated { .. }), "{e:?}");
        let s = side("cmdline=a=1,cmdline=b=2").unwrap();
        assert_eq!(s.config.guest.extra, "a=1 b=2");
        let s = side(" pti = on , pcid= off").unwrap();
        assert_eq!(s.config.guest.pti, Some(PtiMode::On));
        assert_eq!(s.config.guest.pcid, Some(Switch::Off));
    }
}
