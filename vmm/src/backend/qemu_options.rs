//! QEMU's own command-line grammar, as far as ptiscope needs it to decide
//! whether a `--qemu-arg` collides with what it gives QEMU itself
//! (`qemu::run_resolved`): which words are options and which their values,
//! and the comma-separated `key=value` lists those values are.
//!
//! What QEMU (7.2, `softmmu/vl.c` and `util/keyval.c`) does, and this
//! follows:
//! - An option is `-NAME` or `--NAME` (one dash more is ignored), matched
//!   whole: there is no `-NAME=VALUE` (QEMU says "invalid option"). An
//!   option that takes an argument takes the next word, whatever it looks
//!   like; the others ([`NO_ARGUMENT`]) take none. A word in option
//!   position that does not start with `-` is a disk image.
//! - An argument such as `-machine`'s is a list `key=value,key=value`
//!   (`,,` is a comma inside a value); its first item may leave out its key,
//!   which is then the option's implied key (`type` for `-machine`/`-M`,
//!   `size` for `-m`): `-M q35` is `type=q35`. Repeated `-machine`s merge
//!   key by key, the later winning, so `-machine usb=off,type=q35` replaces
//!   ptiscope's `-M pc` as surely as `-M q35` does.
//! - `-accel` may be given several times: QEMU uses the first that starts
//!   (ptiscope's), and refuses `-enable-kvm` or `-machine accel=` beside any
//!   `-accel`.
//! - `-plugin` may be given several times: QEMU loads each plugin beside
//!   the others.

/// The options of QEMU 7.2 (x86) that take no argument (`qemu-options.hx`:
/// those without `HAS_ARG`), and a few older ones; every other option
/// takes the next word.
const NO_ARGUMENT: &[&str] = &[
    "h",
    "help",
    "version",
    "S",
    "s",
    "daemonize",
    "enable-kvm",
    "enable-sync-profile",
    "full-screen",
    "mem-prealloc",
    "no-acpi",
    "no-fd-bootchk",
    "no-hpet",
    "no-reboot",
    "no-shutdown",
    "no-user-config",
    "nodefaults",
    "nographic",
    "only-migratable",
    "portrait",
    "singlestep",
    "snapshot",
    "usb",
    "win2k-hack",
    "xen-attach",
    "xen-domid-restrict",
    "preconfig",
    "async-teardown",
    "audio-help",
    "semihosting",
    "old-param",
    "no-quit",
    "alt-grab",
    "ctrl-grab",
    "no-frame",
    "enable-fips",
];

/// Whether QEMU's option `name` (without dashes) takes an argument.
pub fn takes_argument(name: &str) -> bool {
    !NO_ARGUMENT.contains(&name)
}

/// One option of a QEMU command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QemuOption<'a> {
    /// The word as given (`--machine`).
    pub word: &'a str,
    /// Its name, without the dashes (`machine`).
    pub name: &'a str,
    /// Its argument, for an option that takes one (`None` also where the
    /// command line ends before it: QEMU's own error then).
    pub value: Option<&'a str>,
}

/// The options of `args` read as QEMU reads them, in order; words that are
/// no option (disk images) are left out.
pub fn options(args: &[String]) -> Vec<QemuOption<'_>> {
    let mut out = Vec::new();
    let mut words = args.iter();
    while let Some(word) = words.next() {
        let Some(dashed) = word.strip_prefix('-') else {
            continue;
        };
        let name = dashed.strip_prefix('-').unwrap_or(dashed);
        let value = if NO_ARGUMENT.contains(&name) {
            None
        } else {
            words.next().map(String::as_str)
        };
        out.push(QemuOption { word, name, value });
    }
    out
}

/// An option argument read as a `key=value` list: `,,` is a comma of the
/// value, an item without `=` is the value of `implied` if it comes first
/// and `implied` is not empty, else a flag (`key=on`, as QEMU's option
/// lists read it).
pub fn key_values(value: &str, implied: &str) -> Vec<(String, String)> {
    let mut items = Vec::new();
    let mut item = String::new();
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ',' {
            if chars.peek() == Some(&',') {
                chars.next();
                item.push(',');
            } else {
                items.push(std::mem::take(&mut item));
            }
        } else {
            item.push(c);
        }
    }
    items.push(item);
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| match item.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None if i == 0 && !implied.is_empty() => (implied.to_string(), item),
            None => (item, "on".to_string()),
        })
        .collect()
}

/// The key QEMU takes an option's first item as when it has no `=`.
pub fn implied_key(option: &str) -> &'static str {
    match option {
        "machine" | "M" => "type",
        "m" => "size",
        "accel" => "accel",
        "smp" => "cpus",
        "plugin" => "file",
        "chardev" => "backend",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options_and_their_arguments_as_qemu_reads_them() {
        let args = words(&[
            "-snapshot",
            "--machine",
            "q35",
            "disk.img",
            "-append",
            "-kernel",
            "-enable-kvm",
            "-name",
        ]);
        let o = options(&args);
        let seen: Vec<(&str, Option<&str>)> = o.iter().map(|o| (o.name, o.value)).collect();
        // `-append -kernel`: -kernel is -append's argument, not an option.
        assert_eq!(
            seen,
            [
                ("snapshot", None),
                ("machine", Some("q35")),
                ("append", Some("-kernel")),
                ("enable-kvm", None),
                ("name", None)
            ]
        );
        assert_eq!(o[1].word, "--machine");
        // No -NAME=VALUE in QEMU: the name keeps its `=`.
        assert_eq!(options(&words(&["-machine=q35"]))[0].name, "machine=q35");
    }

    #[test]
    fn key_value_lists_with_the_implied_key() {
        let kv = |v: &str, i: &str| key_values(v, i);
        let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        assert_eq!(kv("q35", "type"), pairs(&[("type", "q35")]));
        assert_eq!(
            kv("q35,accel=kvm", "type"),
            pairs(&[("type", "q35"), ("accel", "kvm")])
        );
        assert_eq!(
            kv("usb=off,type=q35", "type"),
            pairs(&[("usb", "off"), ("type", "q35")])
        );
        // Only the first item takes the implied key; later bare items are flags.
        assert_eq!(
            kv("usb=off,q35", "type"),
            pairs(&[("usb", "off"), ("q35", "on")])
        );
        // `,,` is a comma inside a value.
        assert_eq!(
            kv("file=a,,b.so,arg=1", "file"),
            pairs(&[("file", "a,b.so"), ("arg", "1")])
        );
        assert_eq!(kv("", "type"), pairs(&[("type", "")]));
        assert_eq!(implied_key("M"), "type");
        assert_eq!(implied_key("m"), "size");
    }
}
