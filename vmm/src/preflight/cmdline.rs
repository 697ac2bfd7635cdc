//! The guest command line: the experiment's options as `key=value` words
//! (keys from [`ptiscope_abi::cmdline`]), validated before the guest runs.

use std::fmt;

use ptiscope_abi::cmdline as key;

use crate::machine::memory::CMDLINE_MAX;

/// `pti=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pti {
    On,
    Off,
    Auto,
}

/// `pcid=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pcid {
    On,
    Off,
}

/// The syscall entry the guest's user programs use. `Auto` is resolved by the
/// VMM ([`crate::preflight::host::resolve_entry`]) and never reaches the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Entry {
    Auto,
    Syscall,
    Sysenter,
    Int80,
    Int3,
    Int4,
}

/// What the vCPU tells the guest about Meltdown (IA32_ARCH_CAPABILITIES.RDCL_NO).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
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

impl Pti {
    pub fn as_str(self) -> &'static str {
        match self {
            Pti::On => "on",
            Pti::Off => "off",
            Pti::Auto => "auto",
        }
    }
}

impl Pcid {
    pub fn as_str(self) -> &'static str {
        match self {
            Pcid::On => "on",
            Pcid::Off => "off",
        }
    }
}

impl Entry {
    pub fn as_str(self) -> &'static str {
        match self {
            Entry::Auto => "auto",
            Entry::Syscall => "syscall",
            Entry::Sysenter => "sysenter",
            Entry::Int80 => "int80",
            Entry::Int3 => "int3",
            Entry::Int4 => "int4",
        }
    }
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The experiment's options; `None` leaves the guest's default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuestOptions {
    pub pti: Option<Pti>,
    pub pcid: Option<Pcid>,
    /// Already resolved (not `Auto`).
    pub entry: Option<Entry>,
    pub workload: Option<String>,
    pub iterations: Option<u64>,
    /// Raw extra text (`--cmdline`), appended after the options.
    pub extra: String,
}

/// Errors building the guest command line.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CmdlineError {
    #[error("the guest command line is {len} bytes; at most {max} fit (it lives in a 4 KiB page with its NUL)", max = CMDLINE_MAX - 1)]
    TooLong { len: usize },
    #[error("the guest command line must not contain NUL bytes")]
    Nul,
    #[error("the guest command line must be ASCII (the guest parses bytes)")]
    NotAscii,
    #[error("--workload {0:?}: a workload name is non-empty and has no spaces or '='")]
    BadWorkload(String),
    #[error("--entry auto must be resolved before building the command line")]
    UnresolvedEntry,
    #[error("--workload {0:?} is not a workload of the guest (known: {known})", known = ptiscope_abi::cmdline::WORKLOADS.join(", "))]
    UnknownWorkload(String),
    #[error("`{key}=` is given twice (by an option and in --cmdline, or twice in --cmdline{why}): the guest refuses repeated keys", why = if key == "telemetry" { "; telemetry= is always the VMM's" } else { "" })]
    Repeated { key: String },
}

/// Builds the command line: options in a fixed order, then the raw extra
/// text, then `telemetry=0x<addr>` (last, so it is always the VMM's value).
pub fn build(opts: &GuestOptions, telemetry_addr: u64) -> Result<String, CmdlineError> {
    let mut words: Vec<String> = Vec::new();
    if let Some(p) = opts.pti {
        words.push(format!("{}={}", key::PTI, p.as_str()));
    }
    if let Some(p) = opts.pcid {
        words.push(format!("{}={}", key::PCID, p.as_str()));
    }
    match opts.entry {
        Some(Entry::Auto) => return Err(CmdlineError::UnresolvedEntry),
        Some(e) => words.push(format!("{}={}", key::ENTRY, e.as_str())),
        None => {}
    }
    if let Some(w) = &opts.workload {
        if w.is_empty() || w.contains(|c: char| c.is_whitespace() || c == '=') {
            return Err(CmdlineError::BadWorkload(w.clone()));
        }
        if !ptiscope_abi::cmdline::WORKLOADS.contains(&w.as_str()) {
            return Err(CmdlineError::UnknownWorkload(w.clone()));
        }
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
    if !line.is_ascii() {
        return Err(CmdlineError::NotAscii);
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
    fn options_then_extra_then_telemetry() {
        let o = GuestOptions {
            pti: Some(Pti::On),
            pcid: Some(Pcid::Off),
            entry: Some(Entry::Int3),
            workload: Some("getpid".into()),
            iterations: Some(1000),
            extra: "  fault=pf ".into(),
        };
        assert_eq!(
            build(&o, 0x7fff000).unwrap(),
            "pti=on pcid=off entry=int3 workload=getpid iterations=1000 fault=pf telemetry=0x7fff000"
        );
        assert_eq!(
            build(&GuestOptions::default(), 0x1000).unwrap(),
            "telemetry=0x1000"
        );
    }

    #[test]
    fn rejects_what_the_guest_cannot_take() {
        let mut o = GuestOptions {
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
        assert_eq!(build(&o, 0), Err(CmdlineError::NotAscii));
        let o = GuestOptions {
            workload: Some("a b".into()),
            ..Default::default()
        };
        assert!(matches!(build(&o, 0), Err(CmdlineError::BadWorkload(_))));
        let o = GuestOptions {
            entry: Some(Entry::Auto),
            ..Default::default()
        };
        assert_eq!(build(&o, 0), Err(CmdlineError::UnresolvedEntry));
    }
}
