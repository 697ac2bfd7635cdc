//! `--backend qemu` behind the [`Backend`] trait: QEMU's TCG, observed by
//! ptiscope's TCG plugin (or, with `--no-plugin`, by nothing but the guest).

use super::qemu;
use super::qemu_options;
use super::{
    Backend, BackendError, ConsoleNote, HostWatch, Observed, OwnOption, Profile, Ran, Requested,
    TimeMetric,
};
use crate::spec::{ResolvedRun, Target};

/// `--backend qemu`'s own command-line options, merged into every
/// command that takes `--backend` (`registry::BackendOptions`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct QemuOptions {
    /// An extra argument for QEMU (`--backend qemu`), repeatable. E.g.
    /// `--qemu-arg=-icount --qemu-arg=shift=0,align=off` makes the guest's
    /// TSC count instructions, so cycles per call become instructions per call;
    /// `--qemu-arg=-plugin --qemu-arg=FILE.so` loads another TCG plugin. What
    /// ptiscope sets itself (the image, command line, memory size, vCPUs, CPU
    /// model, machine type, accelerator, console) is refused, naming it.
    #[arg(long, value_name = "ARG", allow_hyphen_values = true)]
    pub qemu_arg: Vec<String>,
    /// `--backend qemu`: do not load ptiscope's TCG plugin (no host-observed
    /// `[qemu-plugin]` rows; every figure is then guest-reported).
    #[arg(long)]
    pub no_plugin: bool,
}

/// `--backend qemu` in the registry.
pub const REGISTRATION: super::registration::Registration = super::registration::Registration {
    name: "qemu",
    about: "QEMU TCG (qemu-system-x86_64 / qemu-system-i386; software emulation: slower): \
            ptiscope's TCG plugin's [qemu-plugin] rows host-observed, the rest guest-reported",
    options: <QemuOptions as clap::Args>::augment_args,
    build: |c| {
        Ok(Box::new(Qemu {
            plugin: !c.options::<QemuOptions>().no_plugin,
        }))
    },
    reproduce_auto: true,
    linux_pace: super::registration::LinuxPace {
        boot: std::time::Duration::from_secs(60),
        per_call: std::time::Duration::from_micros(250),
    },
};

/// The options only this backend takes besides [`QemuOptions`]: what they
/// set is QEMU's.
pub const OPTIONS: &[OwnOption] = &[
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

/// The QEMU options ptiscope gives whole (`qemu::run_resolved`), which a
/// `--qemu-arg` would replace or contradict, each with what ptiscope gives
/// it and the ptiscope option to use instead. Options it gives only some
/// keys of (`-machine`'s `type`, `-m`'s `size`) are [`SET_KEYS`]; options
/// that may be given beside ptiscope's (`-plugin`: QEMU loads every plugin;
/// `-serial`: a second port) are not here.
const SET_BY_PTISCOPE: [(&str, &str); 6] = [
    ("kernel", "the guest image (--kernel, --linux)"),
    ("append", "the command line (--cmdline, --append)"),
    ("initrd", "ptiscope's init for --linux"),
    ("smp", "the vCPUs and their topology (--cpus)"),
    (
        "cpu",
        "-cpu max, which the guest's checks assume; a compare side takes cpu=MODEL",
    ),
    (
        "daemonize",
        "a QEMU in the foreground, which it waits for and stops",
    ),
];

/// The keys of QEMU's `-machine`/`-M` and `-m` lists that ptiscope sets
/// (`-M pc`/`microvm`, `-m NM`): `(option, key, what ptiscope gives it)`.
/// The other keys of those options are properties a `--qemu-arg` may set.
const SET_KEYS: [(&str, &str, &str); 3] = [
    (
        "machine",
        "type",
        "microvm for the 64-bit companion guest, pc otherwise",
    ),
    ("machine", "accel", "-accel tcg"),
    ("m", "size", "the guest memory: --mem"),
];

/// Options whose value is a character device: `stdio` there would share
/// the guest's console (QEMU's stdout) and read ptiscope's closed stdin.
const CHARDEV_OPTIONS: [&str; 9] = [
    "monitor",
    "qmp",
    "qmp-pretty",
    "chardev",
    "mon",
    "parallel",
    "serial",
    "debugcon",
    "gdb",
];

/// Whether a part of a character device's value is QEMU's stdio under
/// any name: `stdio`, or a path (bare, `file:PATH`, `path=PATH`) that is
/// the process's own stdin, stdout or stderr, where the monitor's banner
/// and prompt landed in the guest's console (`(qemu) ptiscope guest ...`).
fn names_stdio(part: &str) -> bool {
    let path = part.strip_prefix("path=").unwrap_or(part);
    part == "stdio"
        || matches!(
            path,
            "/dev/stdin" | "/dev/stdout" | "/dev/stderr" | "/dev/tty" | "/dev/console"
        )
        || ["/dev/fd/", "/proc/self/fd/", "/proc/thread-self/fd/"]
            .iter()
            .any(|dir| {
                path.strip_prefix(dir)
                    .is_some_and(|fd| ["0", "1", "2"].contains(&fd))
            })
}

/// Why an accelerator a `--qemu-arg` chooses (`accel`: its value, `kvm`,
/// `tcg`, `tcg:kvm`) cannot be: ptiscope gives QEMU `-accel tcg` itself.
fn accel_refusal(shown: &str, accel: &str) -> String {
    let kvm = accel.split([':', ',']).any(|a| a.trim() == "kvm");
    format!(
        "--qemu-arg {shown}: {}ptiscope sets QEMU's accelerator itself (-accel tcg: --backend qemu \
         measures QEMU's TCG, which ptiscope's TCG plugin observes; QEMU refuses -enable-kvm and \
         -machine accel= beside -accel, and uses the first -accel that starts, so another is \
         ignored); drop that --qemu-arg{}",
        if kvm {
            "it turns on KVM acceleration, but "
        } else {
            ""
        },
        if kvm {
            " (--backend kvm runs on KVM)"
        } else {
            ""
        }
    )
}

/// Why the option `o` would keep QEMU from running the guest ptiscope
/// gives it, `None` if it does not: a request for QEMU's help or version
/// (`-h`, `-version`, a value of `help` or `?`, e.g. `-device help`), which
/// QEMU prints and exits as if the guest had ended; an option that makes
/// QEMU wait for a monitor command ptiscope never sends (`-S`,
/// `-incoming`, `--preconfig`); `-readconfig`, whose file may set any
/// option (the machine type, the accelerator) where this check cannot see.
fn no_guest_run(o: &qemu_options::QemuOption<'_>) -> Option<String> {
    let asks_help = match o.name {
        "h" | "help" | "version" | "audio-help" => true,
        _ => o.value.is_some_and(|v| {
            qemu_options::key_values(v, qemu_options::implied_key(o.name))
                .iter()
                .any(|(k, v)| k == "help" || k == "?" || v == "help" || v == "?")
        }),
    };
    if asks_help {
        return Some(
            "it asks QEMU for its help or version, which QEMU prints and then exits without \
             running the guest; run qemu-system-x86_64 with it yourself"
                .into(),
        );
    }
    match o.name {
        "S" | "incoming" | "preconfig" => Some(
            "QEMU would wait for a monitor command (cont, migrate-incoming, x-exit-preconfig) \
             that ptiscope never sends, until --timeout; drop it"
                .into(),
        ),
        "readconfig" => Some(
            "its file may set any QEMU option (the machine type, the accelerator, the CPU) \
             where ptiscope cannot check it against its own; give the options as --qemu-args"
                .into(),
        ),
        _ => None,
    }
}

/// The first `--qemu-arg` that would replace or contradict what ptiscope
/// gives QEMU, read on QEMU's own grammar ([`qemu_options`]): an option of
/// [`SET_BY_PTISCOPE`], a key of [`SET_KEYS`] (`-M q35`, `-machine
/// usb=off,type=q35`), an accelerator (`-accel`, `-enable-kvm`, `-machine
/// accel=`), `-nographic`, a character device on `stdio`, and the
/// `-NAME=VALUE` QEMU does not read; as a refusal naming the option and
/// the key. `None` if none does.
pub fn overrides(args: &[String]) -> Option<String> {
    let shown = |a: &str| ptiscope_devices::escape_str(a);
    for o in qemu_options::options(args) {
        let whole = match o.value {
            Some(v) => format!("{} {}", shown(o.word), shown(v)),
            None => shown(o.word),
        };
        if let Some((name, _)) = o.name.split_once('=') {
            return Some(format!(
                "--qemu-arg {}: QEMU reads no -OPTION=VALUE (it would say \"invalid option\"): \
                 give the value as the next --qemu-arg (--qemu-arg=-{name} --qemu-arg=VALUE)",
                shown(o.word)
            ));
        }
        // Only for the options read here: one QEMU does not know is QEMU's
        // to refuse ("invalid option").
        let inspected = ["machine", "M", "m", "accel", "plugin", "readconfig"].contains(&o.name)
            || CHARDEV_OPTIONS.contains(&o.name)
            || SET_BY_PTISCOPE.iter().any(|(n, _)| *n == o.name);
        if o.value.is_none() && inspected && qemu_options::takes_argument(o.name) {
            return Some(format!(
                "--qemu-arg {whole}: -{} takes a value, and none follows (QEMU would say \
                 \"requires an argument\"): give it as the next --qemu-arg",
                o.name
            ));
        }
        if let Some(why) = no_guest_run(&o) {
            return Some(format!("--qemu-arg {whole}: {why}"));
        }
        if let Some((name, what)) = SET_BY_PTISCOPE.iter().find(|(n, _)| *n == o.name) {
            return Some(format!(
                "--qemu-arg {whole}: ptiscope sets -{name} itself ({what}); drop that --qemu-arg"
            ));
        }
        match o.name {
            "enable-kvm" => return Some(accel_refusal(&whole, "kvm")),
            "accel" => {
                let keys = qemu_options::key_values(o.value.unwrap_or(""), "accel");
                let accel = keys
                    .iter()
                    .find(|(k, _)| k == "accel")
                    .map_or("", |(_, v)| v);
                return Some(accel_refusal(&whole, accel));
            }
            "nographic" => {
                return Some(format!(
                    "--qemu-arg {whole}: it puts QEMU's monitor on stdio, which is the guest's \
                     console here; drop it (ptiscope already runs QEMU without a display)"
                ))
            }
            _ => {}
        }
        let option = if o.name == "M" { "machine" } else { o.name };
        let value = o.value.unwrap_or("");
        let keys = qemu_options::key_values(value, qemu_options::implied_key(o.name));
        for (key, given) in &keys {
            let Some((_, _, what)) = SET_KEYS
                .iter()
                .find(|(opt, k, _)| *opt == option && k == key)
            else {
                continue;
            };
            if option == "machine" && key == "accel" {
                return Some(accel_refusal(&whole, given));
            }
            return Some(format!(
                "--qemu-arg {whole}: ptiscope sets -{option}'s {key}= itself ({what}); give \
                 only the other keys (-{option} KEY=VALUE without {key}=)"
            ));
        }
        if CHARDEV_OPTIONS.contains(&o.name) && value.split([',', ':']).any(names_stdio) {
            return Some(format!(
                "--qemu-arg {whole}: QEMU's stdio is the guest's console here (and its stdin is \
                 closed); use another character device, e.g. unix:PATH,server=on,wait=off"
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
                note: crate::report::note::Note::Backend {
                    backend: self.name().into(),
                    says: if self.plugin {
                        "backend qemu (TCG): [guest] figures are the guest's @result line, \
                     [qemu-plugin] ones are counted by ptiscope's TCG plugin inside QEMU; times \
                     are those of software emulation"
                    } else {
                        "backend qemu (TCG): the host observes nothing of the guest; every figure \
                     is guest-reported (its @result line), and times are those of software \
                     emulation"
                    }
                    .into(),
                },
            },
        })
    }

    fn check(&self, flag: &str, asked: &Requested) -> Option<String> {
        if flag != "--qemu-arg" {
            return None;
        }
        overrides(&asked.qemu_args)
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
            capabilities: super::Capabilities {
                host_observer: false,
                host_counts_cr3_writes: plugin,
                counts_kernel_by_address: plugin,
                live_metrics: false,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::overrides;

    fn words(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// Every option ptiscope sets, in either spelling, is refused naming
    /// it; the keys it sets in `-machine`/`-M`/`-m` in any place of their
    /// lists, accelerators, stdio character devices too (with what the
    /// refusal must name); properties, other plugins and options ptiscope
    /// leaves alone pass.
    #[test]
    fn qemu_args_that_replace_what_ptiscope_sets_are_refused() {
        for (v, names) in [
            (&["-kernel", "/boot/vmlinuz"][..], "-kernel"),
            (&["--append", "init=/bin/sh"], "-append"),
            (&["-initrd", "/tmp/x"], "-initrd"),
            (&["-m", "2G"], "-m's size="),
            (&["-m", "size=2G,maxmem=4G"], "-m's size="),
            (&["-smp", "4"], "-smp"),
            (&["-smp", "cores=2"], "-smp"),
            (&["-cpu", "qemu64"], "-cpu"),
            (&["-daemonize"], "-daemonize"),
            (&["-M", "q35"], "-machine's type="),
            (&["-machine", "q35"], "-machine's type="),
            (&["--machine", "q35"], "-machine's type="),
            (&["-machine", "type=q35"], "-machine's type="),
            (&["-machine", "usb=off,type=q35"], "-machine's type="),
            (&["-machine", "type=pc,accel=tcg"], "-machine's type="),
            (&["-machine", "accel=tcg,type=q35"], "accelerator"),
            (&["-machine", "accel=tcg"], "accelerator"),
            (&["-M", "accel=tcg:kvm"], "KVM acceleration"),
            (&["-machine", "q35,accel=kvm"], "-machine's type="),
            (&["-machine", "usb=off,accel=kvm"], "KVM acceleration"),
            (&["-accel", "kvm"], "KVM acceleration"),
            (&["-accel", "tcg,tb-size=64"], "accelerator"),
            (&["--accel", "accel=kvm"], "KVM acceleration"),
            (&["-enable-kvm"], "KVM acceleration"),
            (&["--enable-kvm"], "KVM acceleration"),
            (&["-icount", "shift=0", "-machine", "accel=kvm"], "KVM"),
            (&["-nographic"], "-nographic"),
            (&["-monitor", "stdio"], "stdio"),
            (&["-qmp", "stdio"], "stdio"),
            (&["-chardev", "stdio,id=c0"], "stdio"),
            (&["-serial", "mon:stdio"], "stdio"),
            (&["-gdb", "stdio"], "stdio"),
            // stdio by another name: the monitor's banner joined the console.
            (&["-monitor", "/dev/stdout"], "stdio"),
            (&["-monitor", "file:/proc/self/fd/1"], "stdio"),
            (&["-serial", "file:/dev/fd/2"], "stdio"),
            (&["-chardev", "file,id=c,path=/dev/stderr"], "stdio"),
            (&["-icount", "shift=0", "-kernel", "x"], "-kernel"),
            (&["-machine=q35"], "no -OPTION=VALUE"),
            (&["--plugin=x.so"], "no -OPTION=VALUE"),
            // Options the check reads, with no value after them.
            (&["-machine"], "takes a value"),
            (&["-m"], "takes a value"),
            (&["-icount", "shift=0", "-serial"], "takes a value"),
            // QEMU prints and exits without running the guest.
            (&["-version"], "help or version"),
            (&["--version"], "help or version"),
            (&["-h"], "help or version"),
            (&["-M", "help"], "help or version"),
            (&["-machine", "?"], "help or version"),
            (&["-device", "help"], "help or version"),
            (&["-device", "isa-serial,help"], "help or version"),
            (&["-accel", "help"], "help or version"),
            // QEMU waits for a monitor command nobody sends.
            (&["-S"], "monitor command"),
            (&["-incoming", "tcp:0:4444"], "monitor command"),
            (&["--preconfig"], "monitor command"),
            // A file of options the check cannot see.
            (&["-readconfig", "/tmp/q.cfg"], "-readconfig"),
        ] {
            let why = overrides(&words(v)).unwrap_or_else(|| panic!("{v:?} accepted"));
            assert!(why.starts_with("--qemu-arg "), "{why}");
            assert!(why.contains(names), "{v:?}: {why}");
        }
        for v in [
            &[][..],
            &["-icount", "shift=0,align=off"],
            &["-machine", "usb=off"],
            &["-M", "usb=off,dump-guest-core=off"],
            &["-m", "slots=2,maxmem=4G"],
            &["-monitor", "unix:/tmp/m,server=on,wait=off"],
            &["-serial", "unix:/tmp/s,server=on,wait=off"],
            &["-d", "int"],
            &["-name", "kernel"],
            // A value that looks like an option is the option's argument.
            &["-name", "-kernel"],
            &["-D", "-M"],
            // QEMU loads several plugins side by side.
            &["-plugin", "libexeclog.so"],
            &["-plugin", "file=/x/libinsn.so,inline=on", "-d", "plugin"],
            &["--plugin", "/x/a.so", "-plugin", "/x/b.so"],
            &["-chardev", "socket,id=stdio,path=/tmp/s"],
            &["-serial", "file:/tmp/serial.log"],
            &["-monitor", "file:/proc/self/fd/10"],
        ] {
            assert_eq!(overrides(&words(v)), None, "{v:?}");
        }
        // The refusal is escaped: a --qemu-arg is user text.
        let why = overrides(&words(&["-kernel\x1b]0;x\x07"])).unwrap_or_default();
        assert_eq!(why, "");
        let why = overrides(&words(&["-M", "q35\x1b[2J"])).unwrap();
        assert!(!why.contains('\x1b') && why.contains("\\x1b"), "{why}");
    }
}
