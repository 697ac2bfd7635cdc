//! The keys of a compare side's options, a leaf: the side parser
//! (`side.rs`) matches them and the refusals (`command_error.rs`) list
//! them, so neither has to import the other for it.

/// The keys of a side's options (`--baseline`, `--compare`, `sweep
/// --config`, reproduce's sides): the one table of them, which the parser
/// matches exhaustively and the refusals list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SideKey {
    /// `pti=`: the guest's PTI mode.
    Pti,
    /// `pcid=`.
    Pcid,
    /// `entry=`: the system-call entry.
    Entry,
    /// `workload=`.
    Workload,
    /// `iterations=`.
    Iterations,
    /// `cpu_vuln=` (also spelled `cpu-vuln=`).
    CpuVuln,
    /// `mem=` in MiB.
    Mem,
    /// `cmdline=`: more of the companion guest's command line (repeatable).
    Cmdline,
    /// `pti_switch=`: the 2020 RFC's strategy.
    PtiSwitch,
    /// `linux=`: a Linux kernel for this side.
    Linux,
    /// `append=`: more Linux kernel command line (repeatable).
    Append,
    /// `cpu=`: QEMU's emulated CPU model.
    Cpu,
}

impl SideKey {
    /// Every key, in the order the messages list them.
    pub const ALL: [SideKey; 12] = [
        SideKey::Pti,
        SideKey::Pcid,
        SideKey::Entry,
        SideKey::Workload,
        SideKey::Iterations,
        SideKey::CpuVuln,
        SideKey::Mem,
        SideKey::Cmdline,
        SideKey::PtiSwitch,
        SideKey::Linux,
        SideKey::Append,
        SideKey::Cpu,
    ];

    /// The key as written.
    pub fn name(self) -> &'static str {
        match self {
            SideKey::Pti => "pti",
            SideKey::Pcid => "pcid",
            SideKey::Entry => "entry",
            SideKey::Workload => "workload",
            SideKey::Iterations => "iterations",
            SideKey::CpuVuln => "cpu_vuln",
            SideKey::Mem => "mem",
            SideKey::Cmdline => "cmdline",
            SideKey::PtiSwitch => "pti_switch",
            SideKey::Linux => "linux",
            SideKey::Append => "append",
            SideKey::Cpu => "cpu",
        }
    }

    /// The key written `name` (`cpu-vuln` is `cpu_vuln`'s other spelling).
    pub fn from_name(name: &str) -> Option<SideKey> {
        let name = if name == "cpu-vuln" { "cpu_vuln" } else { name };
        SideKey::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether the key adds to what it sets each time it is given
    /// (command-line words); every other key sets one value, once.
    pub fn accumulates(self) -> bool {
        matches!(self, SideKey::Cmdline | SideKey::Append)
    }

    /// Every key, space-separated, for the messages.
    pub fn list() -> String {
        SideKey::ALL.map(SideKey::name).join(" ")
    }
}
