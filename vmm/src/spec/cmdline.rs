//! The guest command line: the experiment's options as `key=value` words
//! (keys from [`ptiscope_abi::cmdline`]), validated before the guest runs.
//!
//! Size: about 140 lines are tests.

use std::fmt;

use ptiscope_abi::cmdline as key;

use crate::machine::memory::CMDLINE_MAX;

use ptiscope_abi::options::{Entry, Fault, PtiMode, Switch, Workload, MAX_ITERATIONS};

/// What the vCPU tells the guest about Meltdown (IA32_ARCH_CAPABILITIES.RDCL_NO).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum CpuVuln {
    /// Report RDCL_NO clear: the CPU is Meltdown-vulnerable, `pti=auto` means on.
    Meltdown,
    /// Report RDCL_NO set: not vulnerable, `pti=auto` means off.
    None,
    /// Leave KVM's value alone.
    #[default]
    Host,
}

/// `--entry`: a guest entry, or `auto` for the one the host delivers
/// (settled by [`crate::preflight::preflight`], never sent to the guest).
// On the wire (`--backend nested`) as its command-line word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum EntryChoice {
    /// Let the host decide: the entry the probe found working.
    #[default]
    Auto,
    /// This entry.
    Fixed(Entry),
}

impl EntryChoice {
    /// Every `--entry` value, `auto` first.
    pub fn names() -> impl Iterator<Item = &'static str> {
        std::iter::once("auto").chain(Entry::NAMES.iter().copied())
    }
}

impl From<EntryChoice> for String {
    fn from(e: EntryChoice) -> String {
        e.to_string()
    }
}

impl TryFrom<String> for EntryChoice {
    type Error = ptiscope_abi::options::UnknownValue;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl fmt::Display for EntryChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EntryChoice::Auto => f.write_str("auto"),
            EntryChoice::Fixed(e) => e.fmt(f),
        }
    }
}

impl std::str::FromStr for EntryChoice {
    type Err = ptiscope_abi::options::UnknownValue;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(EntryChoice::Auto),
            _ => s.parse().map(EntryChoice::Fixed),
        }
    }
}

/// The experiment's options as the user asked for them; `None` leaves the
/// guest's default.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GuestOptions {
    /// `--pti`.
    pub pti: Option<PtiMode>,
    /// `--pcid`.
    pub pcid: Option<Switch>,
    /// `--entry`.
    pub entry: EntryChoice,
    /// `--workload`.
    pub workload: Option<Workload>,
    /// `--iterations`.
    pub iterations: Option<u64>,
    /// Raw extra text (`--cmdline`). Words with a key modelled above are
    /// taken into the typed fields by [`GuestOptions::absorb_extra`].
    pub extra: String,
}

/// The options the guest gets: entry settled (`None`: the guest runs no user
/// code, so no entry is needed), extra words that have no typed field.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResolvedOptions {
    /// `pti=`, if set.
    pub pti: Option<PtiMode>,
    /// `pcid=`, if set.
    pub pcid: Option<Switch>,
    /// `entry=`, settled.
    pub entry: Option<Entry>,
    /// `workload=`, if set.
    pub workload: Option<Workload>,
    /// `iterations=`, if set.
    pub iterations: Option<u64>,
    /// `--cmdline` words without a typed field, passed as they are.
    pub extra: String,
}

/// Errors building the guest command line.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CmdlineError {
    /// The command line does not fit in its page.
    #[error("the guest command line is {len} bytes; at most {max} fit (it lives in a 4 KiB page with its NUL)", max = CMDLINE_MAX - 1)]
    TooLong {
        /// Its length, bytes.
        len: usize,
    },
    /// The command line contains a NUL byte.
    #[error("the guest command line must not contain NUL bytes")]
    Nul,
    /// A byte outside printable ASCII.
    #[error("the guest command line must be printable ASCII (the guest parses bytes); found byte {0:#04x}")]
    NotPrintable(u8),
    /// A typed key's value did not parse.
    #[error("`{key}={value}`: {why}")]
    BadValue {
        /// The key.
        key: String,
        /// The value given.
        value: String,
        /// Why it was refused.
        why: String,
    },
    /// A key the VMM owns (it sets up what the key describes) in `--cmdline`.
    #[error("`{key}=` in --cmdline: the VMM owns it ({why}); {instead}")]
    VmmOwned {
        /// The key.
        key: String,
        /// What the VMM does with it.
        why: &'static str,
        /// What to give instead.
        instead: &'static str,
    },
    /// A key appears twice.
    #[error("`{key}=` is given twice (by an option and in --cmdline, or twice in --cmdline{why}): the guest refuses repeated keys", why = if key == "telemetry" { "; telemetry= is always the VMM's" } else { "" })]
    Repeated {
        /// The key.
        key: String,
    },
}

impl GuestOptions {
    /// Takes `pti=`, `pcid=`, `entry=`, `workload=` and `iterations=` words
    /// out of `extra` into the typed fields, so that `--cmdline entry=int4`
    /// means the same as `--entry int4`. A key set both ways is refused.
    pub fn absorb_extra(&self) -> Result<GuestOptions, CmdlineError> {
        let mut out = GuestOptions {
            extra: String::new(),
            ..self.clone()
        };
        let mut rest: Vec<&str> = Vec::new();
        for word in self.extra.split_ascii_whitespace() {
            let Some((k, v)) = word.split_once('=') else {
                rest.push(word);
                continue;
            };
            let repeated = || CmdlineError::Repeated { key: k.to_string() };
            let bad = |why: String| CmdlineError::BadValue {
                key: k.to_string(),
                value: v.to_string(),
                why,
            };
            if let Some((why, instead)) = vmm_owned(k) {
                return Err(CmdlineError::VmmOwned {
                    key: k.to_string(),
                    why,
                    instead,
                });
            }
            match k {
                key::PTI if out.pti.is_some() => return Err(repeated()),
                key::PTI => out.pti = Some(v.parse().map_err(|e| bad(format!("{e}")))?),
                key::PCID if out.pcid.is_some() => return Err(repeated()),
                key::PCID => out.pcid = Some(v.parse().map_err(|e| bad(format!("{e}")))?),
                key::ENTRY if out.entry != EntryChoice::Auto => return Err(repeated()),
                key::ENTRY => out.entry = v.parse().map_err(|e| bad(format!("{e}")))?,
                key::WORKLOAD if out.workload.is_some() => return Err(repeated()),
                key::WORKLOAD => out.workload = Some(v.parse().map_err(|e| bad(format!("{e}")))?),
                key::ITERATIONS if out.iterations.is_some() => return Err(repeated()),
                key::ITERATIONS => {
                    let n = guest_number(v).ok_or_else(|| bad("not a number".into()))?;
                    out.iterations = Some(n);
                }
                key::WSS | key::STRIDE | key::TOUCHES | key::WSS_PAGES | key::KWSS => {
                    check_working_set_word(k, v).map_err(bad)?;
                    rest.push(word);
                }
                _ => rest.push(word),
            }
        }
        out.extra = rest.join(" ");
        out.check_working_set()?;
        if let Some(n) = out.iterations {
            if n > MAX_ITERATIONS {
                return Err(CmdlineError::BadValue {
                    key: key::ITERATIONS.into(),
                    value: n.to_string(),
                    why: format!(
                        "at most {MAX_ITERATIONS} (2^32) iterations fit the guest's counter"
                    ),
                });
            }
        }
        Ok(out)
    }

    /// `wss=` in bytes, 0 without it. Call on absorbed options (whose
    /// working-set words have been checked).
    pub fn working_set_bytes(&self) -> u64 {
        self.extra_value(key::WSS)
            .and_then(ptiscope_abi::workingset::parse_size)
            .unwrap_or(0)
    }

    /// `kwss=` in bytes, 0 without it (checked words, as above).
    pub fn kernel_working_set_bytes(&self) -> u64 {
        self.extra_value(key::KWSS)
            .and_then(ptiscope_abi::workingset::parse_size)
            .unwrap_or(0)
    }

    /// The value of `key=` among the extra words.
    pub(crate) fn extra_value(&self, k: &str) -> Option<&str> {
        self.extra
            .split_ascii_whitespace()
            .filter_map(|w| w.split_once('='))
            .find(|(wk, _)| *wk == k)
            .map(|(_, v)| v)
    }

    /// The checks across the working-set keys the guest makes too:
    /// `touches=` needs a working set, and a working set needs a loop
    /// workload.
    fn check_working_set(&self) -> Result<(), CmdlineError> {
        let wss = self.working_set_bytes();
        if let (Some(t), 0) = (self.extra_value(key::TOUCHES), wss) {
            return Err(CmdlineError::BadValue {
                key: key::TOUCHES.into(),
                value: t.into(),
                why: "touches= needs a working set: add wss=SIZE".into(),
            });
        }
        let workload = || self.workload.map_or("none".into(), |w| w.to_string());
        if wss > 0 && !self.workload.is_some_and(Workload::takes_working_set) {
            return Err(CmdlineError::BadValue {
                key: key::WSS.into(),
                value: self.extra_value(key::WSS).unwrap_or_default().into(),
                why: format!(
                    "a working set needs a syscall-loop workload (--workload getpid, getppid, \
                     write-badfd, nopti-getpid or poundsyscall), not {}",
                    workload()
                ),
            });
        }
        if self.kernel_working_set_bytes() > 0
            && !self.workload.is_some_and(Workload::is_syscall_loop)
        {
            return Err(CmdlineError::BadValue {
                key: key::KWSS.into(),
                value: self.extra_value(key::KWSS).unwrap_or_default().into(),
                why: format!(
                    "a kernel working set needs a single-task syscall loop (--workload getpid, \
                     getppid, write-badfd or nopti-getpid), not {}",
                    workload()
                ),
            });
        }
        Ok(())
    }

    /// Whether the guest will run user code (a workload, or a fault raised
    /// from user mode), and so needs a syscall entry. Call on absorbed options.
    pub fn runs_user_code(&self) -> bool {
        self.workload.is_some_and(Workload::runs_user_code)
            || self.extra.split_ascii_whitespace().any(|w| {
                w.strip_prefix("fault=")
                    .and_then(|f| f.parse::<Fault>().ok())
                    .is_some_and(Fault::runs_user_code)
            })
    }
}

/// The keys the VMM owns: what each describes is set up by the VMM (the
/// vCPUs it creates, the telemetry region it reserves, the MSR it answers),
/// so the guest must not be told otherwise through `--cmdline`. Returns why
/// and what to give instead.
fn vmm_owned(k: &str) -> Option<(&'static str, &'static str)> {
    match k {
        key::CPUS => Some((
            "the guest starts the CPUs the VMM created",
            "give --cpus N instead",
        )),
        key::TELEMETRY => Some((
            "it is where the VMM reserved the telemetry page",
            "drop the word: the VMM always writes it",
        )),
        key::RDCL_NO => Some((
            "the guest reads RDCL_NO from the MSR the VMM answers",
            "give --cpu-vuln meltdown|none|host instead",
        )),
        _ => None,
    }
}

/// Checks one working-set word as the guest will parse it
/// (`ptiscope_abi::workingset`), so that a bad value is refused before boot.
fn check_working_set_word(k: &str, v: &str) -> Result<(), String> {
    use ptiscope_abi::options::WssPages;
    use ptiscope_abi::workingset::{parse_size, MAX_KWSS, MAX_TOUCHES, MAX_WSS, MIN_STRIDE};
    let size = || {
        parse_size(v).ok_or_else(|| "not a size (a number, optionally with K, M or G)".to_string())
    };
    match k {
        key::WSS => {
            if size()? > MAX_WSS {
                return Err(format!(
                    "at most {}M: the working set must end below 1 GiB of user space",
                    MAX_WSS >> 20
                ));
            }
        }
        key::STRIDE => {
            let s = size()?;
            if s < MIN_STRIDE || !s.is_multiple_of(MIN_STRIDE) || s > MAX_WSS {
                return Err(format!("a multiple of {MIN_STRIDE} bytes from {MIN_STRIDE} to {}M (each read is of a word the loop wrote)", MAX_WSS >> 20));
            }
        }
        key::KWSS => {
            if size()? > MAX_KWSS {
                return Err(format!("at most {}M of kernel working set", MAX_KWSS >> 20));
            }
        }
        key::TOUCHES => match guest_number(v) {
            Some(n) if n <= MAX_TOUCHES => {}
            _ => {
                return Err(format!(
                    "a number of reads per iteration from 0 to {MAX_TOUCHES}"
                ))
            }
        },
        _ => {
            v.parse::<WssPages>().map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// A number as the guest reads it (decimal or `0x` hex).
fn guest_number(s: &str) -> Option<u64> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Builds the command line: options in a fixed order, then the raw extra
/// text, then `telemetry=0x<addr>` (last, so it is always the VMM's value).
/// This is the one place the host writes guest options as text.
pub fn build(opts: &ResolvedOptions, telemetry_addr: u64) -> Result<String, CmdlineError> {
    let mut words: Vec<String> = Vec::new();
    if let Some(p) = opts.pti {
        words.push(format!("{}={p}", key::PTI));
    }
    if let Some(p) = opts.pcid {
        words.push(format!("{}={p}", key::PCID));
    }
    if let Some(e) = opts.entry {
        words.push(format!("{}={e}", key::ENTRY));
    }
    if let Some(w) = opts.workload {
        words.push(format!("{}={w}", key::WORKLOAD));
    }
    if let Some(n) = opts.iterations {
        words.push(format!("{}={n}", key::ITERATIONS));
    }
    let extra = opts.extra.trim();
    if !extra.is_empty() {
        words.push(extra.to_string());
    }
    words.push(format!("{}={telemetry_addr:#x}", key::TELEMETRY));
    let line = words.join(" ");
    let mut seen: Vec<&str> = Vec::new();
    for key in line
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, _)| k)
    {
        if seen.contains(&key) {
            return Err(CmdlineError::Repeated {
                key: key.to_string(),
            });
        }
        seen.push(key);
    }
    validate(&line)?;
    Ok(line)
}

/// Checks a finished command line against what the guest can take.
pub fn validate(line: &str) -> Result<(), CmdlineError> {
    if line.contains('\0') {
        return Err(CmdlineError::Nul);
    }
    // Printable ASCII and the space: the guest splits words on ASCII
    // whitespace, and a control byte is never part of a valid value.
    if let Some(b) = line.bytes().find(|&b| !(b == b' ' || b.is_ascii_graphic())) {
        return Err(CmdlineError::NotPrintable(b));
    }
    if line.len() + 1 > CMDLINE_MAX {
        return Err(CmdlineError::TooLong { len: line.len() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_the_vmm_owns_are_refused_in_the_extra_text() {
        for (word, instead) in [
            ("cpus=2", "--cpus N"),
            ("telemetry=0x1000", "the VMM always writes it"),
            ("rdcl_no=1", "--cpu-vuln"),
        ] {
            let o = GuestOptions {
                extra: format!("threads=2 {word}"),
                ..Default::default()
            };
            let e = o.absorb_extra().unwrap_err();
            assert!(matches!(e, CmdlineError::VmmOwned { .. }), "{word}: {e:?}");
            let text = e.to_string();
            assert!(text.contains(word.split('=').next().unwrap()), "{text}");
            assert!(text.contains(instead), "{text}");
        }
    }

    #[test]
    fn options_then_extra_then_telemetry() {
        let o = ResolvedOptions {
            pti: Some(PtiMode::On),
            pcid: Some(Switch::Off),
            entry: Some(Entry::Int3),
            workload: Some(Workload::Getpid),
            iterations: Some(1000),
            extra: "  fault=pf ".into(),
        };
        assert_eq!(
            build(&o, 0x7fff000).unwrap(),
            "pti=on pcid=off entry=int3 workload=getpid iterations=1000 fault=pf telemetry=0x7fff000"
        );
        assert_eq!(
            build(&ResolvedOptions::default(), 0x1000).unwrap(),
            "telemetry=0x1000"
        );
    }

    #[test]
    fn rejects_what_the_guest_cannot_take() {
        let mut o = ResolvedOptions {
            extra: "x".repeat(CMDLINE_MAX),
            ..Default::default()
        };
        assert!(matches!(build(&o, 0), Err(CmdlineError::TooLong { .. })));
        // The limit counts the telemetry word and the NUL.
        let fixed = "telemetry=0x0".len() + 1;
        o.extra = "x".repeat(CMDLINE_MAX - 1 - fixed);
        assert!(build(&o, 0).is_ok());
        o.extra.push('x');
        assert!(build(&o, 0).is_err());
        o.extra = "a\0b".into();
        assert_eq!(build(&o, 0), Err(CmdlineError::Nul));
        o.extra = "é".into();
        assert_eq!(build(&o, 0), Err(CmdlineError::NotPrintable(0xc3)));
        o.extra = "a=\x1b[2J".into();
        assert_eq!(build(&o, 0), Err(CmdlineError::NotPrintable(0x1b)));
        o.extra = "a=b\tc=d".into();
        assert_eq!(build(&o, 0), Err(CmdlineError::NotPrintable(b'\t')));
    }

    #[test]
    fn extra_words_with_typed_keys_are_absorbed() {
        let o = GuestOptions {
            extra: "entry=int4 fault=kread workload=getppid iterations=0x10".into(),
            ..Default::default()
        };
        let a = o.absorb_extra().unwrap();
        assert_eq!(a.entry, EntryChoice::Fixed(Entry::Int4));
        assert_eq!(a.workload, Some(Workload::Getppid));
        assert_eq!(a.iterations, Some(16));
        assert_eq!(a.extra, "fault=kread");
        assert!(a.runs_user_code());
        let twice = GuestOptions {
            entry: EntryChoice::Fixed(Entry::Int3),
            extra: "entry=int4".into(),
            ..Default::default()
        };
        assert_eq!(
            twice.absorb_extra(),
            Err(CmdlineError::Repeated {
                key: "entry".into()
            })
        );
        let too_many = GuestOptions {
            iterations: Some(MAX_ITERATIONS + 1),
            ..Default::default()
        };
        assert!(matches!(
            too_many.absorb_extra(),
            Err(CmdlineError::BadValue { .. })
        ));
        let bad = GuestOptions {
            extra: "workload=nope".into(),
            ..Default::default()
        };
        assert!(matches!(
            bad.absorb_extra(),
            Err(CmdlineError::BadValue { .. })
        ));
        assert!(!GuestOptions::default().runs_user_code());
    }

    #[test]
    fn working_set_words_are_checked_before_boot() {
        let with = |extra: &str| GuestOptions {
            workload: Some(Workload::Getpid),
            extra: extra.into(),
            ..Default::default()
        };
        let ok = with("wss=1M stride=64 touches=10 wss_pages=2m")
            .absorb_extra()
            .unwrap();
        assert_eq!(ok.working_set_bytes(), 1 << 20);
        assert_eq!(ok.extra, "wss=1M stride=64 touches=10 wss_pages=2m");
        for bad in [
            "wss=1T",
            "wss=2G",
            "wss=lots",
            "wss=1M stride=0",
            "wss=1M stride=12",
            "wss=1M touches=-1",
            "wss=1M wss_pages=1g",
            "touches=10",
            "kwss=65M",
            "kwss=big",
        ] {
            let e = with(bad).absorb_extra().unwrap_err();
            assert!(matches!(e, CmdlineError::BadValue { .. }), "{bad}: {e:?}");
        }
        let messaging = GuestOptions {
            workload: Some(Workload::SchedMessaging),
            extra: "wss=1M".into(),
            ..Default::default()
        };
        let e = messaging.absorb_extra().unwrap_err().to_string();
        assert!(e.contains("syscall-loop workload"), "{e}");
        let kernel_only = GuestOptions {
            workload: None,
            extra: "kwss=64K".into(),
            ..Default::default()
        };
        let e = kernel_only.absorb_extra().unwrap_err().to_string();
        assert!(e.contains("kwss=64K") && e.contains("syscall loop"), "{e}");
        // poundsyscall's threads take a user working set, not a kernel one.
        let pound = |extra: &str| GuestOptions {
            workload: Some(Workload::Poundsyscall),
            extra: extra.into(),
            ..Default::default()
        };
        assert_eq!(
            pound("threads=2 wss=1M")
                .absorb_extra()
                .unwrap()
                .working_set_bytes(),
            1 << 20
        );
        let e = pound("kwss=64K").absorb_extra().unwrap_err().to_string();
        assert!(e.contains("single-task syscall loop"), "{e}");
        assert_eq!(
            with("kwss=64K")
                .absorb_extra()
                .unwrap()
                .kernel_working_set_bytes(),
            64 << 10
        );
    }
}
