//! A Linux guest's kernel command line: what every run starts with, what
//! the VMM adds, and the `--append` words refused (a key the init reads,
//! a line too long).

/// The kernel command line every Linux run starts with: the console on the
/// first serial port, boot messages kept out of it (the kernel log still
/// has them), an immediate reboot on panic, which `-no-reboot` turns into
/// QEMU's exit, and no timer check: under TCG on a loaded host Linux's
/// IO-APIC timer test sometimes sees no tick in time and panics ("IO-APIC +
/// timer doesn't work!").
pub const BASE_CMDLINE: &str = "console=ttyS0 quiet panic=-1 no_timer_check";

/// More command line for a Linux guest on ptiscope's VMM: the VMM has no
/// CMOS RTC; unclaimed ports read all ones, so the RTC driver's probe sees
/// its update-in-progress bit set forever and polls ports 0x70/0x71 (every
/// read an exit to the VMM, 40,000 of them) until it gives up, 12 s of a
/// boot under `--backend nested`; not starting the driver skips that.
pub const VMM_CMDLINE: &str = "initcall_blacklist=cmos_init";

/// The `key=` words ptiscope's init reads from the whole kernel command
/// line (`linux-init/src/main.rs`: the companion guest's keys it takes, and
/// its own `ipc`), each with the option that sets it. One of them in
/// `--append` would reach the init beside the one ptiscope wrote (the init
/// then stops: "key given twice", after the whole boot), so it is refused
/// before anything boots.
pub const INIT_KEYS: [(&str, &str); 13] = {
    use ptiscope_abi::cmdline as k;
    [
        (k::PTI, "--pti"),
        (k::ENTRY, "--entry"),
        (k::WORKLOAD, "--workload"),
        (k::ITERATIONS, "--iterations"),
        (k::GROUPS, "--cmdline groups=G"),
        (k::LOOPS, "--cmdline loops=L"),
        (k::MODE, "--cmdline mode=process|thread"),
        (k::WSS, "--cmdline wss=SIZE"),
        (k::STRIDE, "--cmdline stride=N"),
        (k::TOUCHES, "--cmdline touches=N"),
        (k::CPUS, "--cpus"),
        (k::THREADS, "--cmdline threads=N"),
        ("ipc", "--cmdline ipc=socket|pipe"),
    ]
};

/// A kernel command-line word's key and value as Linux reads them
/// (`kernel/params.c`'s `next_arg`): a leading `"` and the `"`s around the
/// value are not part of them, so `"pti=on"` and `pti="on"` are `pti=on`;
/// `None` for a word without `=`.
pub fn param_key_value(word: &str) -> Option<(&str, &str)> {
    let (key, value) = word.strip_prefix('"').unwrap_or(word).split_once('=')?;
    Some((key, value.trim_matches('"')))
}

/// The first `--append` word whose key the init owns, refused with the
/// option to use instead.
pub(super) fn append_refusal(append: &str) -> Option<String> {
    append.split_whitespace().find_map(|w| {
        let key = param_key_value(w)?.0;
        let (_, option) = INIT_KEYS.iter().find(|(k, _)| *k == key)?;
        Some(format!(
            "--append {}: `{key}=` is read by ptiscope's init, which gets its own from ptiscope's \
             options: use {option} instead (--append is for the kernel's own parameters, e.g. \
             nopti, mitigations=off)",
            ptiscope_devices::escape_str(w)
        ))
    })
}

/// Longest kernel command line (x86's COMMAND_LINE_SIZE is 2048 with its NUL).
pub const MAX_CMDLINE: usize = 2047;

#[cfg(test)]
mod tests {
    use super::*;

    /// A quoted word is the parameter Linux reads: `"pti=on"` is refused
    /// as `pti=on` is, not passed by for its quote.
    #[test]
    fn quoted_append_words_are_read_as_linux_reads_them() {
        for w in [
            "\"pti=on\"",
            "pti=\"on\"",
            "\"iterations=5\"",
            "\"workload=getpid",
        ] {
            let why = append_refusal(&format!("quiet {w}")).unwrap_or_else(|| panic!("{w}"));
            assert!(why.contains("is read by ptiscope's init"), "{why}");
        }
        assert_eq!(append_refusal("nopti \"mitigations=off\" quiet"), None);
        assert_eq!(param_key_value("\"pti=on\""), Some(("pti", "on")));
        assert_eq!(param_key_value("nopti"), None);
    }

    /// The keys refused in `--append` are exactly those the init reads:
    /// taken from its source, so a key added there is refused here too.
    #[test]
    fn append_refuses_every_key_the_init_reads_and_only_those() {
        let src = include_str!("../../../../linux-init/src/main.rs");
        let list = src
            .split("fn is_guest_key")
            .nth(1)
            .and_then(|r| r.split(".contains").next())
            .expect("linux-init's is_guest_key");
        let mut read: Vec<String> = list
            .split("k::")
            .skip(1)
            .map(|t| t.split(',').next().unwrap().trim().to_lowercase())
            .collect();
        assert!(src.contains("key == keys::IPC"), "the init's own ipc= key");
        read.push("ipc".into());
        read.sort();
        let mut refused: Vec<String> = INIT_KEYS.iter().map(|(k, _)| k.to_string()).collect();
        refused.sort();
        assert_eq!(read, refused);
        for (key, option) in INIT_KEYS {
            let why = append_refusal(&format!("nopti {key}=1 quiet")).unwrap();
            assert!(
                why.contains(option) && why.contains(&format!("{key}=1")),
                "{why}"
            );
        }
        for ok in [
            "",
            "nopti",
            "pti",
            "mitigations=off panic=1 oops=panic mem=16M",
            "ptiscope=1",
            "xpti=1",
        ] {
            assert_eq!(append_refusal(ok), None, "{ok}");
        }
        // Escaped in the message.
        let why = append_refusal("pti=\x1b[31m").unwrap();
        assert!(!why.contains('\x1b') && why.contains("\\x1b"), "{why}");
    }
}
