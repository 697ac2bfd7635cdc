//! `compare`'s header: what is compared, on which host, how many runs, and
//! what differs between the two sides' settled runs.

use std::collections::BTreeMap;

use super::side::{self, Side};
use crate::backend::Backend;
use crate::cli::CompareArgs;
use crate::experiment::{RunCount, MIN_AUTO_RUNS};
use crate::report::environment::Environment;
use crate::spec::guest::GuestKind;
use crate::spec::linux::LinuxGuest;
use crate::spec::ResolvedRun;
use ptiscope_abi::options::Workload;

/// The header: what is compared, on which host, how many runs; returns the
/// environment (probed once per process) for the report.
pub(super) fn print_header(
    args: &CompareArgs,
    backend: &dyn Backend,
    facts: &crate::probe::host::HostFacts,
    base: &Side,
    comp: &Side,
    count: RunCount,
    watched: &str,
) -> Environment {
    let differences = side_differences(&base.run, &comp.run);
    let linux_name = |l: &LinuxGuest| {
        format!(
            "Linux ({}, {})",
            l.arch.name(),
            l.version.as_deref().unwrap_or("version unknown")
        )
    };
    let two_images = base.run.boot.image != comp.run.boot.image;
    match (&base.run.guest_kind, &comp.run.guest_kind) {
        (GuestKind::Linux(b), GuestKind::Linux(c)) if two_images => println!(
            "{}",
            crate::cli::exit_code::escape_message(&format!(
                "ptiscope compare: two kernels on this host: {} against {}",
                linux_name(b),
                linux_name(c)
            ))
        ),
        (GuestKind::Linux(l), _) => println!(
            "{}",
            crate::cli::exit_code::escape_message(&format!(
                "ptiscope compare: what PTI costs in {} on this host",
                linux_name(l)
            ))
        ),
        (GuestKind::Companion, _) => {
            println!("ptiscope compare: what PTI costs in the ptiscope guest on this host")
        }
    }
    // Probed once per process (the entry probe also resolves entry=auto).
    // What differs between the sides goes into the environment too, so
    // that `--against` and readers of the JSON see it.
    let mut extra = BTreeMap::new();
    if !differences.is_empty() {
        extra.insert("sides_differ".to_owned(), differences.clone());
    }
    let mut environment = Environment::collect(
        facts,
        crate::backend::identity(backend),
        side::guest_image_of(&base.run.config.kernel, Some(&base.run.boot.image)),
        extra,
    );
    // A Linux guest is named by its release (pictures say which kernel's
    // PTI they show, not only the host's); the companion by its image hash.
    let release_of = |l: &LinuxGuest| {
        let release = l
            .version
            .as_deref()
            .and_then(|v| v.split_whitespace().next())
            .unwrap_or("version unknown");
        format!("Linux {release} ({})", l.arch.name())
    };
    environment.guest_kernel = match (&base.run.guest_kind, &comp.run.guest_kind) {
        // Two kernels: a picture names both.
        (GuestKind::Linux(b), GuestKind::Linux(c)) if two_images => {
            Some(format!("{} vs {}", release_of(b), release_of(c)))
        }
        (GuestKind::Linux(b), _) => Some(release_of(b)),
        (GuestKind::Companion, _) => None,
    };
    let profile = backend.profile();
    let (kvm_line, entry_text) = (profile.header_line, (profile.run_note)(&base.run));
    print!("{}", environment.render_header(kvm_line));
    let runs_text = match count {
        RunCount::Fixed(1) => "1 run per side".to_string(),
        RunCount::Fixed(n) => format!("{n} runs per side"),
        RunCount::Auto {
            max_runs,
            target_ci_pct,
        } => format!(
            "runs per side: auto, until the 95 % CI of {watched} is within {target_ci_pct} % of its mean \
             (at least {MIN_AUTO_RUNS}, at most {max_runs})"
        ),
    };
    let warmup_text = if args.warmup > 0 {
        format!(", after {} discarded warm-up pair(s)", args.warmup)
    } else {
        String::new()
    };
    let workload = base.run.guest.workload.map_or("-", Workload::name);
    if base.run.guest.workload == Some(Workload::SchedMessaging) {
        // Its size comes from groups=/loops= (cmdline=...), not --iterations.
        println!(
            "  runs:      sched-messaging (perf bench sched messaging, pipes), {runs_text}, \
             interleaved{warmup_text}; rates are per message{entry_text}"
        );
    } else {
        println!(
            "  runs:      {workload} x {} iterations per run, {runs_text}, interleaved{warmup_text}{entry_text}",
            base.run.guest.iterations.unwrap_or(0),
        );
    }
    println!(
        "  sides:     baseline {}, compare {}",
        base.label, comp.label
    );
    for d in &differences {
        // Paths and command-line words from the user: escaped.
        println!(
            "{}",
            crate::cli::exit_code::escape_message(&format!("  differs:   {d}"))
        );
    }
    println!();
    environment
}

/// What differs between the two sides' settled runs, one line per kind:
/// the guest image, the command line the guest boots with, QEMU's CPU
/// model, vCPUs and memory. Empty when the sides boot the same thing.
pub(super) fn side_differences(base: &ResolvedRun, comp: &ResolvedRun) -> Vec<String> {
    let mut out = Vec::new();
    // Compared as bytes (the same shared image is equal at once); hashed
    // for the text only when they differ.
    if base.boot.image != comp.boot.image {
        let image = |r: &ResolvedRun| {
            let g = side::guest_image_of(&r.config.kernel, Some(&r.boot.image));
            let release = r
                .guest_kind
                .linux()
                .and_then(|l| l.version.as_deref())
                .and_then(|v| v.split_whitespace().next())
                .map(|v| format!(" (Linux {v})"))
                .unwrap_or_default();
            let sha = g.sha256.unwrap_or_default();
            format!("{}{release} sha256 {sha:.16}", g.name)
        };
        out.push(format!("guest image: {} vs {}", image(base), image(comp)));
    }
    let words = |r: &ResolvedRun| -> Vec<String> {
        r.boot
            .cmdline
            .split_whitespace()
            .filter(|w| !w.starts_with("telemetry="))
            .map(str::to_string)
            .collect()
    };
    let (bw, cw) = (words(base), words(comp));
    let only = |a: &[String], b: &[String]| -> Vec<String> {
        a.iter().filter(|w| !b.contains(w)).cloned().collect()
    };
    let (gone, added) = (only(&bw, &cw), only(&cw, &bw));
    if !gone.is_empty() || !added.is_empty() {
        let mut parts = Vec::new();
        if !gone.is_empty() {
            parts.push(format!("baseline only: {}", gone.join(" ")));
        }
        if !added.is_empty() {
            parts.push(format!("compare only: {}", added.join(" ")));
        }
        out.push(format!("command line: {}", parts.join("; ")));
    }
    let cpu = |r: &ResolvedRun| r.config.qemu_cpu.clone().unwrap_or_else(|| "max".into());
    if base.config.qemu_cpu != comp.config.qemu_cpu {
        out.push(format!("QEMU CPU model: {} vs {}", cpu(base), cpu(comp)));
    }
    if base.config.cpus != comp.config.cpus {
        out.push(format!(
            "vCPUs: {} vs {}",
            base.config.cpus, comp.config.cpus
        ));
    }
    if base.config.mem_mib != comp.config.mem_mib {
        out.push(format!(
            "memory: {} vs {} MiB",
            base.config.mem_mib, comp.config.mem_mib
        ));
    }
    out
}
