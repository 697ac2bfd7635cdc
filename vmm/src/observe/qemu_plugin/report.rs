//! The plugin's file as data: its snapshots ([`Mark`]), the parsed file
//! ([`PluginReport`]), a measured phase ([`PluginPhase`]), the limits the
//! parser holds a file to, and why a file or a phase is refused.

use super::counters::VcpuCounts;

/// The format version this parser reads.
pub const FORMAT_VERSION: u64 = 4;
/// Largest file accepted (a distribution kernel's text symbols, when the
/// file carries them, are about 4 MiB).
pub const MAX_FILE_BYTES: usize = 32 << 20;
/// Most `pc` lines accepted.
pub const MAX_CALL_PCS: usize = 1 << 20;
/// Most symbol lines accepted.
pub const MAX_SYMBOL_LINES: usize = 1 << 20;
/// Most vCPUs accepted.
pub const MAX_VCPUS: usize = 64;
/// Most snapshots accepted.
pub const MAX_MARKS: usize = 4096;

/// A snapshot at a marker candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    /// Order of the marker executions (0, 1, ...).
    pub seq: u64,
    /// The vCPU that executed it.
    pub vcpu: u64,
    /// Its guest-virtual address.
    pub pc: u64,
    /// Every vCPU's counters just before it executed.
    pub counts: VcpuCounts,
}

/// An inclusive guest-virtual address range, `(first, last)`.
pub type Range = (u64, u64);

/// The parsed file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginReport {
    /// The plugin API version the plugin declared to QEMU.
    pub api: u64,
    /// The kernel address ranges it used.
    pub kernel: Vec<Range>,
    /// The snapshots, in order.
    pub marks: Vec<Mark>,
    /// Snapshots the plugin did not keep (beyond its own bound).
    pub dropped_marks: u64,
    /// Every vCPU's counters at QEMU's exit.
    pub totals: VcpuCounts,
    /// With `pcs=1`: the phase's undisturbed calls' kernel instructions by
    /// address (summed over vCPUs).
    pub call_pcs: Option<CallPcs>,
    /// With `syms=PATH`: the guest's symbol lines as the init sent them
    /// (unparsed: `crate::linux::symbols` reads them), and how many lines
    /// the plugin dropped for not being printable ASCII.
    pub symbols: Option<(Vec<String>, u64)>,
}

/// Kernel instructions by address (`call_pcs` in the file).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallPcs {
    /// (address, instructions executed there), ascending addresses.
    pub pcs: Vec<(u64, u64)>,
    /// Instructions of calls too long for the plugin's per-call log:
    /// counted, but at no address.
    pub unattributed: u64,
}

/// Why a plugin file was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginParseError {
    /// The file is larger than [`MAX_FILE_BYTES`].
    #[error("the plugin file is {0} bytes, more than the {MAX_FILE_BYTES} accepted")]
    TooLarge(usize),
    /// The file is not ASCII text.
    #[error("the plugin file is not ASCII text")]
    NotText,
    /// The first line is not the plugin's header or names another version.
    #[error("the plugin file has no `ptiscope-tcg-plugin version={FORMAT_VERSION}` header")]
    BadHeader,
    /// A line did not parse.
    #[error("plugin file line {line}: {what}")]
    BadLine {
        /// 1-based line number.
        line: usize,
        /// What was wrong.
        what: String,
    },
    /// The file ended before its `end` line (QEMU killed, disk full).
    #[error("the plugin file is truncated (no `end` line)")]
    Truncated,
}

/// Why the companion guest's phase could not be found among the snapshots.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PhaseError {
    /// The plugin dropped snapshots.
    #[error("the plugin dropped {0} snapshots")]
    Dropped(u64),
    /// Not the ptiscope guest's pattern.
    #[error(
        "the marker writes do not follow the ptiscope guest's pattern (begin, end, exit: {0} writes)"
    )]
    Pattern(usize),
    /// Not the Linux init's pattern (with `umark=`).
    #[error(
        "the user-mode marker writes do not follow ptiscope's Linux init's pattern (begin, end at two addresses: {0} writes)"
    )]
    LinuxPattern(usize),
    /// A counter went backwards between the two snapshots.
    #[error("a counter went backwards between the phase markers")]
    Backwards,
}

/// The measured phase: the counters between the begin and end markers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginPhase {
    /// The begin marker.
    pub begin: Mark,
    /// The end marker.
    pub end: Mark,
    /// Per vCPU, end minus begin.
    pub delta: VcpuCounts,
}
