//! `--backend qemu` behind the [`Backend`] trait: QEMU's TCG, observed by
//! ptiscope's TCG plugin (or, with `--no-plugin`, by nothing but the guest).

use super::qemu;
use super::{
    Backend, BackendError, ConsoleNote, HostWatch, Observed, OwnOption, Profile, Ran, Requested,
    TimeMetric,
};
use crate::spec::{ResolvedRun, Target};

/// The options only this backend takes: what they set is QEMU's.
pub const OPTIONS: &[OwnOption] = &[
    OwnOption {
        flag: "--qemu-arg",
        owner: "qemu",
        what: None,
    },
    OwnOption {
        flag: "--no-plugin",
        owner: "qemu",
        what: None,
    },
    // A compare side's option: QEMU's emulated CPU model (`-cpu`).
    OwnOption {
        flag: "cpu=",
        owner: "qemu",
        what: None,
    },
];

/// `--backend qemu`: QEMU's TCG, with ptiscope's TCG plugin (`plugin`) or
/// without (`--no-plugin`: every figure guest-reported).
#[derive(Debug, Clone, Copy)]
pub struct Qemu {
    /// Whether ptiscope's TCG plugin observes the runs.
    pub plugin: bool,
}

/// The `--qemu-arg` words that turn KVM acceleration on (`-enable-kvm`,
/// `-accel kvm`, `accel=kvm` in `-machine`'s options, a `tcg:kvm` list),
/// joined as given; `None` if none does.
pub fn enables_kvm(args: &[String]) -> Option<String> {
    let names_kvm = |list: &str| list.split([':', ',']).any(|a| a.trim() == "kvm");
    for (i, arg) in args.iter().enumerate() {
        let name = arg.trim_start_matches('-');
        let option = arg.starts_with('-');
        if option && name == "enable-kvm" {
            return Some(arg.clone());
        }
        if option && name == "accel" {
            if let Some(next) = args.get(i + 1) {
                let value = next.strip_prefix("accel=").unwrap_or(next);
                if value.split(',').next().is_some_and(names_kvm) {
                    return Some(format!("{arg} {next}"));
                }
            }
        }
        if option {
            if let Some(value) = name.strip_prefix("accel=") {
                if names_kvm(value.split(',').next().unwrap_or("")) {
                    return Some(arg.clone());
                }
            }
        }
        for part in arg.split(',') {
            if let Some(value) = part.trim().strip_prefix("accel=") {
                if names_kvm(value) {
                    return Some(arg.clone());
                }
            }
        }
    }
    None
}

/// The QEMU options ptiscope sets itself (`backend::qemu::run_resolved`),
/// which a `--qemu-arg` would silently replace or contradict, each with
/// what ptiscope gives it and the ptiscope option to use instead.
const SET_BY_PTISCOPE: [(&str, &str); 9] = [
    ("kernel", "the guest image (--kernel, --linux)"),
    ("append", "the command line (--cmdline, --append)"),
    ("initrd", "ptiscope's init for --linux"),
    ("m", "the guest memory (--mem)"),
    ("smp", "the vCPUs (--cpus)"),
    ("cpu", "-cpu max, which the guest's checks assume"),
    (
        "plugin",
        "ptiscope's TCG plugin (--no-plugin leaves it out)",
    ),
    (
        "serial",
        "-serial stdio, the guest's console (--serial-out)",
    ),
    (
        "daemonize",
        "a QEMU in the foreground, which it waits for and stops",
    ),
];

/// Options whose value is a character device: `stdio` there would share
/// the guest's console (QEMU's stdout) and read ptiscope's closed stdin.
const CHARDEV_OPTIONS: [&str; 6] = ["monitor", "qmp", "qmp-pretty", "chardev", "mon", "parallel"];

/// The first `--qemu-arg` that would replace or contradict what ptiscope
/// gives QEMU (an option from [`SET_BY_PTISCOPE`], `-M`/`-machine` with a
/// machine type, `-nographic`, a character device on `stdio`), as a
/// refusal naming it; `None` if none does.
pub fn overrides(args: &[String]) -> Option<String> {
    for (i, arg) in args.iter().enumerate() {
        let Some(name) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            continue;
        };
        let next = args.get(i + 1).map(String::as_str).unwrap_or("");
        let shown = |a: &str| ptiscope_devices::escape_str(a);
        if let Some((_, what)) = SET_BY_PTISCOPE.iter().find(|(o, _)| *o == name) {
            return Some(format!(
                "--qemu-arg {}: ptiscope sets -{name} itself ({what}); drop that --qemu-arg",
                shown(arg)
            ));
        }
        if name == "M" || name == "machine" {
            let first = next.split(',').next().unwrap_or("");
            if !first.is_empty() && (!first.contains('=') || first.starts_with("type=")) {
                return Some(format!(
                    "--qemu-arg {} {}: ptiscope chooses the machine type (microvm for the \
                     64-bit companion guest, pc otherwise); give only properties \
                     (-machine KEY=VALUE)",
                    shown(arg),
                    shown(next)
                ));
            }
        }
        if name == "nographic" {
            return Some(format!(
                "--qemu-arg {}: it puts QEMU's monitor on stdio, which is the guest's console \
                 here; drop it (ptiscope already runs QEMU without a display)",
                shown(arg)
            ));
        }
        if CHARDEV_OPTIONS.contains(&name) && next.split([',', ':']).any(|p| p == "stdio") {
            return Some(format!(
                "--qemu-arg {} {}: QEMU's stdio is the guest's console here (and its stdin is \
                 closed); use another character device, e.g. unix:PATH,server=on,wait=off",
                shown(arg),
                shown(next)
            ));
        }
    }
    None
}

impl Backend for Qemu {
    fn name(&self) -> &'static str {
        "qemu"
    }

    fn target(&self) -> Target {
        Target::QemuTcg
    }

    fn run(&self, resolved: &ResolvedRun, _watch: HostWatch) -> Result<Ran, BackendError> {
        // Nothing to watch from the host: what could be (KVM's statistics)
        // is the KVM backend's option, refused here by `refusal`.
        let (outcome, plugin) = qemu::run_resolved(resolved)?;
        Ok(Ran {
            outcome,
            observed: Observed::Console {
                plugin,
                note: if self.plugin {
                    "backend qemu (TCG): [guest] figures are the guest's @result line, \
                     [qemu-plugin] ones are counted by ptiscope's TCG plugin inside QEMU; times \
                     are those of software emulation"
                } else {
                    "backend qemu (TCG): the host observes nothing of the guest; every figure \
                     is guest-reported (its @result line), and times are those of software \
                     emulation"
                },
            },
        })
    }

    fn check(&self, flag: &str, asked: &Requested) -> Option<String> {
        if flag != "--qemu-arg" {
            return None;
        }
        // KVM acceleration first: its message says what to do (--no-plugin).
        if self.plugin {
            if let Some(arg) = enables_kvm(asked.qemu_args) {
                return Some(format!(
                    "--qemu-arg {} turns on KVM acceleration, under which ptiscope's TCG \
                     plugin counts nothing (TCG plugins see only TCG-translated code): \
                     add --no-plugin, or drop that --qemu-arg",
                    ptiscope_devices::escape_str(&arg)
                ));
            }
        }
        overrides(asked.qemu_args)
    }

    fn profile(&self) -> Profile {
        let plugin = self.plugin;
        Profile {
            time: TimeMetric {
                metric: "cycles_per_call",
                unit: "cycles",
                source: "guest",
            },
            time_basis: crate::report::time_basis::TimeBasis::QemuTcg,
            header_line: None,
            run_note: Box::new(move |run: &ResolvedRun| {
                let binary = qemu::binary_of(run);
                format!(
                    "; backend QEMU TCG ({binary}): software emulation, {}",
                    if plugin {
                        "[qemu-plugin] figures host-observed, the others guest-reported"
                    } else {
                        "every figure guest-reported"
                    }
                )
            }),
            sweep_line: (
                "backend",
                format!(
                    "QEMU TCG: software emulation, guest-reported cycles per call{}",
                    if plugin {
                        "; kernel instructions and MOV CR3 host-observed by ptiscope's TCG plugin"
                    } else {
                        " (--no-plugin)"
                    }
                ),
            ),
            console: Some(ConsoleNote {
                label: "backend qemu, TCG",
                figures: if plugin {
                    "[qemu-plugin] figures are host-observed (ptiscope's TCG plugin), the others \
                     guest-reported"
                } else {
                    "every figure below is guest-reported (--no-plugin)"
                },
            }),
            no_cross_checks: (!plugin).then_some(
                "backend qemu --no-plugin: no host-observed figures, so nothing to cross-check",
            ),
            blind_spot: None,
            omits_pcid: Box::new(|| {
                Some(
                    "not probed under QEMU (TCG before QEMU 8 has no PCID); add it with --config"
                        .into(),
                )
            }),
            refill_unprobed: Some(
                "not probed under QEMU TCG: its soft TLB is flushed whole on every CR3 write",
            ),
            counts_by_address: plugin,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{enables_kvm, overrides};

    /// Every option ptiscope sets, in either spelling, is refused naming
    /// it; stdio character devices and machine types too; properties and
    /// options ptiscope leaves alone pass.
    #[test]
    fn qemu_args_that_replace_what_ptiscope_sets_are_refused() {
        for v in [
            &["-kernel", "/boot/vmlinuz"][..],
            &["--append", "init=/bin/sh"],
            &["-initrd", "/tmp/x"],
            &["-m", "2G"],
            &["-smp", "4"],
            &["-cpu", "qemu64"],
            &["-plugin", "file=x.so"],
            &["-serial", "unix:/tmp/s,server=on,wait=off"],
            &["-daemonize"],
            &["-M", "q35"],
            &["-machine", "type=pc,accel=tcg"],
            &["-nographic"],
            &["-monitor", "stdio"],
            &["-qmp", "stdio"],
            &["-chardev", "stdio,id=c0"],
            &["-icount", "shift=0", "-kernel", "x"],
        ] {
            let why = overrides(&words(v)).unwrap_or_else(|| panic!("{v:?} accepted"));
            assert!(why.starts_with("--qemu-arg "), "{why}");
        }
        for v in [
            &[][..],
            &["-icount", "shift=0,align=off"],
            &["-machine", "accel=tcg"],
            &["-M", "accel=tcg:kvm"],
            &["-monitor", "unix:/tmp/m,server=on,wait=off"],
            &["-d", "int"],
            &["-name", "kernel"],
            &["-accel", "kvm"],
        ] {
            assert_eq!(overrides(&words(v)), None, "{v:?}");
        }
        // The refusal is escaped: a --qemu-arg is user text.
        let why = overrides(&words(&["-kernel\x1b]0;x\x07"])).unwrap_or_default();
        assert_eq!(why, "");
        let why = overrides(&words(&["-M", "q35\x1b[2J"])).unwrap();
        assert!(!why.contains('\x1b') && why.contains("\\x1b"), "{why}");
    }

    fn words(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn kvm_acceleration_is_recognised_in_every_spelling() {
        for v in [
            &["-enable-kvm"][..],
            &["--enable-kvm"],
            &["-accel", "kvm"],
            &["-accel", "kvm,kernel-irqchip=on"],
            &["-accel", "accel=kvm"],
            &["-machine", "q35,accel=kvm"],
            &["-M", "accel=tcg:kvm"],
            &["-icount", "shift=0", "-machine", "accel=kvm"],
        ] {
            assert!(enables_kvm(&words(v)).is_some(), "{v:?}");
        }
        for v in [
            &[][..],
            &["-accel", "tcg"],
            &["-machine", "accel=tcg"],
            &["-icount", "shift=0,align=off"],
            &["-append", "kvm"],
            &["-name", "kvm"],
        ] {
            assert_eq!(enables_kvm(&words(v)), None, "{v:?}");
        }
    }
}
