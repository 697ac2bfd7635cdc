//! The QEMU TCG plugin's output file (`qemu-plugin/`, format in
//! docs/telemetry-abi.md, "The QEMU plugin"), parsed as hostile input: the
//! file is written inside the QEMU process that runs the guest, so it is
//! bounded, every line is validated, and nothing in it can make the parser
//! panic or allocate without bound.
//!
//! The typed result ([`PluginReport`]) holds every vCPU's counters at each
//! snapshot (a kernel-mode `out dx, eax` in the marker ranges; with
//! `umark=`, the Linux init's user-mode marker pair) and at exit;
//! [`PluginReport::companion_phase`] finds the ptiscope guest's measured
//! phase among the snapshots, [`PluginReport::linux_phase`] the init's.

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

/// The QEMU TCG plugin's output file of one run, unparsed: the QEMU
/// backend's own part of what a run left ([`crate::backend::Observed`]),
/// which [`PluginReport::parse`] reads.
#[derive(Debug, Clone, Default)]
pub enum PluginOutput {
    /// Not loaded: `--no-plugin`, or a backend that has no plugin.
    #[default]
    Off,
    /// What the plugin wrote, at most one byte more than the parser takes.
    File(Vec<u8>),
    /// Loaded, but there is no file to read (why).
    Missing(String),
}

/// A counter of the plugin, per vCPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginCounter {
    /// Instructions executed at kernel addresses (the `kernel=` ranges).
    KernelInsns,
    /// Instructions executed elsewhere.
    UserInsns,
    /// MOV to CR3.
    Cr3Writes,
    /// INVLPG.
    Invlpg,
    /// INVPCID.
    Invpcid,
    /// SYSCALL.
    Syscall,
    /// SYSENTER.
    Sysenter,
    /// INT n, INT3, INTO.
    Int,
    /// SYSRET.
    Sysret,
    /// SYSEXIT.
    Sysexit,
    /// IRET.
    Iret,
    /// Marker writes that took a snapshot: kernel-mode `out dx, eax` in
    /// the marker ranges; with `umark=`, the Linux init's user-mode marker
    /// store or `out`.
    Markers,
    /// The subset of [`PluginCounter::KernelInsns`] set apart from system
    /// calls: kernel instructions outside any call (interrupts and
    /// exceptions taken from user mode, boot, idle, kernel threads) and
    /// the whole of every call during which an interrupt or exception was
    /// taken (one that an IRET back to kernel code ended).
    KernelInsnsOther,
    /// System calls whose instructions went to
    /// [`PluginCounter::KernelInsnsOther`].
    CallsOther,
    /// The subset of [`PluginCounter::Cr3Writes`] set apart from system
    /// calls by the same rule as [`PluginCounter::KernelInsnsOther`].
    Cr3WritesOther,
    /// VERW (Linux's CPU-buffer clearing).
    Verw,
    /// The subset of [`PluginCounter::Verw`] set apart from system calls.
    VerwOther,
    /// LFENCE.
    Lfence,
    /// The subset of [`PluginCounter::Lfence`] set apart.
    LfenceOther,
    /// WRMSR, any MSR.
    Wrmsr,
    /// The subset of [`PluginCounter::Wrmsr`] set apart.
    WrmsrOther,
    /// WRMSR of IA32_SPEC_CTRL (0x48, IBRS), known by the `mov ecx, 0x48`
    /// before it in its translation block.
    WrmsrSpecCtrl,
    /// The subset of [`PluginCounter::WrmsrSpecCtrl`] set apart.
    WrmsrSpecCtrlOther,
    /// WRMSR of IA32_PRED_CMD (0x49, IBPB).
    WrmsrPredCmd,
    /// The subset of [`PluginCounter::WrmsrPredCmd`] set apart.
    WrmsrPredCmdOther,
    /// WRMSR of IA32_FLUSH_CMD (0x10b, L1D flush).
    WrmsrFlushCmd,
    /// The subset of [`PluginCounter::WrmsrFlushCmd`] set apart.
    WrmsrFlushCmdOther,
}

impl PluginCounter {
    /// Every counter, in the file's `fields` order.
    pub const ALL: [PluginCounter; 27] = [
        PluginCounter::KernelInsns,
        PluginCounter::UserInsns,
        PluginCounter::Cr3Writes,
        PluginCounter::Invlpg,
        PluginCounter::Invpcid,
        PluginCounter::Syscall,
        PluginCounter::Sysenter,
        PluginCounter::Int,
        PluginCounter::Sysret,
        PluginCounter::Sysexit,
        PluginCounter::Iret,
        PluginCounter::Markers,
        PluginCounter::KernelInsnsOther,
        PluginCounter::CallsOther,
        PluginCounter::Cr3WritesOther,
        PluginCounter::Verw,
        PluginCounter::VerwOther,
        PluginCounter::Lfence,
        PluginCounter::LfenceOther,
        PluginCounter::Wrmsr,
        PluginCounter::WrmsrOther,
        PluginCounter::WrmsrSpecCtrl,
        PluginCounter::WrmsrSpecCtrlOther,
        PluginCounter::WrmsrPredCmd,
        PluginCounter::WrmsrPredCmdOther,
        PluginCounter::WrmsrFlushCmd,
        PluginCounter::WrmsrFlushCmdOther,
    ];

    /// The field name in the file.
    pub fn field(self) -> &'static str {
        match self {
            PluginCounter::KernelInsns => "kernel_insns",
            PluginCounter::UserInsns => "user_insns",
            PluginCounter::Cr3Writes => "cr3_writes",
            PluginCounter::Invlpg => "invlpg",
            PluginCounter::Invpcid => "invpcid",
            PluginCounter::Syscall => "syscall",
            PluginCounter::Sysenter => "sysenter",
            PluginCounter::Int => "int",
            PluginCounter::Sysret => "sysret",
            PluginCounter::Sysexit => "sysexit",
            PluginCounter::Iret => "iret",
            PluginCounter::Markers => "markers",
            PluginCounter::KernelInsnsOther => "kernel_insns_other",
            PluginCounter::CallsOther => "calls_other",
            PluginCounter::Cr3WritesOther => "cr3_writes_other",
            PluginCounter::Verw => "verw",
            PluginCounter::VerwOther => "verw_other",
            PluginCounter::Lfence => "lfence",
            PluginCounter::LfenceOther => "lfence_other",
            PluginCounter::Wrmsr => "wrmsr",
            PluginCounter::WrmsrOther => "wrmsr_other",
            PluginCounter::WrmsrSpecCtrl => "wrmsr_spec_ctrl",
            PluginCounter::WrmsrSpecCtrlOther => "wrmsr_spec_ctrl_other",
            PluginCounter::WrmsrPredCmd => "wrmsr_pred_cmd",
            PluginCounter::WrmsrPredCmdOther => "wrmsr_pred_cmd_other",
            PluginCounter::WrmsrFlushCmd => "wrmsr_flush_cmd",
            PluginCounter::WrmsrFlushCmdOther => "wrmsr_flush_cmd_other",
        }
    }
}

/// One vCPU's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts([u64; N_COUNTERS]);

/// Counters per vCPU in the file.
pub const N_COUNTERS: usize = PluginCounter::ALL.len();

impl Counts {
    /// Counters in the file's `fields` order.
    pub fn from_array(v: [u64; N_COUNTERS]) -> Counts {
        Counts(v)
    }
    /// One counter.
    pub fn get(&self, c: PluginCounter) -> u64 {
        self.0[c as usize]
    }
    /// `later - self`, counter by counter; `None` if any went backwards.
    pub fn delta_to(&self, later: &Counts) -> Option<Counts> {
        let mut d = [0u64; N_COUNTERS];
        for (i, v) in d.iter_mut().enumerate() {
            *v = later.0[i].checked_sub(self.0[i])?;
        }
        Some(Counts(d))
    }
    /// Syscall entries by instruction: SYSCALL + SYSENTER + INT.
    pub fn syscall_entries(&self) -> u64 {
        self.get(PluginCounter::Syscall)
            .saturating_add(self.get(PluginCounter::Sysenter))
            .saturating_add(self.get(PluginCounter::Int))
    }
    /// Kernel instructions of the system calls not set apart (those during
    /// which no interrupt or exception was taken).
    pub fn call_kernel_insns(&self) -> u64 {
        self.get(PluginCounter::KernelInsns)
            .saturating_sub(self.get(PluginCounter::KernelInsnsOther))
    }
    /// CR3 writes of the system calls not set apart.
    pub fn call_cr3_writes(&self) -> u64 {
        self.get(PluginCounter::Cr3Writes)
            .saturating_sub(self.get(PluginCounter::Cr3WritesOther))
    }
    /// Executions of `c` (one of the counters split like CR3 writes:
    /// VERW, LFENCE, the WRMSRs) inside the system calls not set apart.
    pub fn in_calls(&self, c: PluginCounter) -> u64 {
        use PluginCounter::*;
        let other = match c {
            Cr3Writes => Cr3WritesOther,
            Verw => VerwOther,
            Lfence => LfenceOther,
            Wrmsr => WrmsrOther,
            WrmsrSpecCtrl => WrmsrSpecCtrlOther,
            WrmsrPredCmd => WrmsrPredCmdOther,
            WrmsrFlushCmd => WrmsrFlushCmdOther,
            _ => return 0,
        };
        self.get(c).saturating_sub(self.get(other))
    }
    /// Returns: SYSRET + SYSEXIT + IRET.
    pub fn syscall_returns(&self) -> u64 {
        self.get(PluginCounter::Sysret)
            .saturating_add(self.get(PluginCounter::Sysexit))
            .saturating_add(self.get(PluginCounter::Iret))
    }
}

/// Every vCPU's counters at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VcpuCounts(pub Vec<Counts>);

impl VcpuCounts {
    /// The sum over vCPUs.
    pub fn total(&self) -> Counts {
        let mut t = [0u64; N_COUNTERS];
        for c in &self.0 {
            for (i, v) in t.iter_mut().enumerate() {
                *v = v.saturating_add(c.0[i]);
            }
        }
        Counts(t)
    }
    /// Per vCPU `later - self`; `None` if the vCPU counts differ or a
    /// counter went backwards.
    pub fn delta_to(&self, later: &VcpuCounts) -> Option<VcpuCounts> {
        if self.0.len() != later.0.len() {
            return None;
        }
        self.0
            .iter()
            .zip(&later.0)
            .map(|(a, b)| a.delta_to(b))
            .collect::<Option<Vec<_>>>()
            .map(VcpuCounts)
    }
}

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

fn bad(line: usize, what: impl Into<String>) -> PluginParseError {
    PluginParseError::BadLine {
        line,
        what: what.into(),
    }
}

fn num(line: usize, t: &str) -> Result<u64, PluginParseError> {
    let ok = !t.is_empty() && t.len() <= 20 && t.bytes().all(|b| b.is_ascii_digit());
    ok.then(|| t.parse::<u64>().ok())
        .flatten()
        .ok_or_else(|| bad(line, format!("{t:?} is not a number")))
}

fn hex(line: usize, t: &str) -> Result<u64, PluginParseError> {
    t.strip_prefix("0x")
        .filter(|h| !h.is_empty() && h.len() <= 16)
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .ok_or_else(|| bad(line, format!("{t:?} is not a hex address")))
}

fn kv<'a>(line: usize, t: Option<&'a str>, key: &str) -> Result<&'a str, PluginParseError> {
    t.and_then(|t| t.strip_prefix(key))
        .and_then(|t| t.strip_prefix('='))
        .ok_or_else(|| bad(line, format!("expected {key}=")))
}

impl PluginReport {
    /// Parses the file's bytes.
    pub fn parse(bytes: &[u8]) -> Result<PluginReport, PluginParseError> {
        if bytes.len() > MAX_FILE_BYTES {
            return Err(PluginParseError::TooLarge(bytes.len()));
        }
        if !bytes.is_ascii() {
            return Err(PluginParseError::NotText);
        }
        let text = std::str::from_utf8(bytes).map_err(|_| PluginParseError::NotText)?;
        let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
        // Header.
        let (_, header) = lines.next().ok_or(PluginParseError::BadHeader)?;
        let mut h = header.split(' ');
        if h.next() != Some("ptiscope-tcg-plugin")
            || h.next() != Some(&format!("version={FORMAT_VERSION}"))
        {
            return Err(PluginParseError::BadHeader);
        }
        let api = num(1, kv(1, h.next(), "api")?)?;
        let vcpus = num(1, kv(1, h.next(), "vcpus")?)? as usize;
        if vcpus == 0 || vcpus > MAX_VCPUS || h.next().is_some() {
            return Err(bad(1, format!("vcpus must be 1..={MAX_VCPUS}, alone")));
        }
        // kernel ranges
        let (n, l) = lines.next().ok_or(PluginParseError::Truncated)?;
        let ranges = l
            .strip_prefix("kernel ")
            .ok_or_else(|| bad(n, "expected kernel LO-HI[:LO-HI...]"))?;
        let mut kernel = Vec::new();
        for r in ranges.split(':') {
            let (lo, hi) = r
                .split_once('-')
                .ok_or_else(|| bad(n, format!("{r:?} is not LO-HI")))?;
            let (lo, hi) = (hex(n, lo)?, hex(n, hi)?);
            if lo > hi || kernel.len() >= 8 {
                return Err(bad(n, format!("bad kernel range {r:?}")));
            }
            kernel.push((lo, hi));
        }
        // fields: exactly ours, in order.
        let (n, l) = lines.next().ok_or(PluginParseError::Truncated)?;
        let want: Vec<&str> = PluginCounter::ALL.iter().map(|c| c.field()).collect();
        if l.strip_prefix("fields ") != Some(&want.join(" ")) {
            return Err(bad(
                n,
                "the fields are not this ptiscope's (plugin and ptiscope from different builds?)",
            ));
        }
        let counts_block = |lines: &mut dyn Iterator<Item = (usize, &str)>| -> Result<VcpuCounts, PluginParseError> {
            let mut v = Vec::with_capacity(vcpus);
            for i in 0..vcpus {
                let (n, l) = lines.next().ok_or(PluginParseError::Truncated)?;
                let mut t = l.split(' ');
                if t.next() != Some("counts") || t.next() != Some(i.to_string().as_str()) {
                    return Err(bad(n, format!("expected `counts {i} ...`")));
                }
                let mut c = [0u64; N_COUNTERS];
                for slot in c.iter_mut() {
                    *slot = num(n, t.next().ok_or_else(|| bad(n, "too few counters"))?)?;
                }
                if t.next().is_some() {
                    return Err(bad(n, "too many counters"));
                }
                v.push(Counts(c));
            }
            Ok(VcpuCounts(v))
        };
        let mut marks = Vec::new();
        let totals = loop {
            let (n, l) = lines.next().ok_or(PluginParseError::Truncated)?;
            if l == "totals" {
                break counts_block(&mut lines)?;
            }
            let rest = l
                .strip_prefix("mark ")
                .ok_or_else(|| bad(n, "expected `mark ...` or `totals`"))?;
            if marks.len() >= MAX_MARKS {
                return Err(bad(n, format!("more than {MAX_MARKS} marks")));
            }
            let mut t = rest.split(' ');
            let seq = num(n, kv(n, t.next(), "seq")?)?;
            let vcpu = num(n, kv(n, t.next(), "vcpu")?)?;
            let pc = hex(n, kv(n, t.next(), "pc")?)?;
            if t.next().is_some() || vcpu >= vcpus as u64 || seq != marks.len() as u64 {
                return Err(bad(
                    n,
                    "bad mark (sequence out of order, vCPU out of range or extra words)",
                ));
            }
            let counts = counts_block(&mut lines)?;
            marks.push(Mark {
                seq,
                vcpu,
                pc,
                counts,
            });
        };
        let (n, l) = lines.next().ok_or(PluginParseError::Truncated)?;
        let dropped_marks = num(
            n,
            l.strip_prefix("dropped_marks ")
                .ok_or_else(|| bad(n, "expected dropped_marks N"))?,
        )?;
        let mut call_pcs = None;
        let mut symbols = None;
        loop {
            let (n, l) = lines.next().ok_or(PluginParseError::Truncated)?;
            if l == "end" {
                break;
            }
            let mut t = l.split(' ');
            match t.next() {
                Some("call_pcs") if call_pcs.is_none() && symbols.is_none() => {
                    let count = num(n, t.next().unwrap_or(""))? as usize;
                    if t.next() != Some("unattributed") {
                        return Err(bad(n, "expected call_pcs N unattributed M"));
                    }
                    let unattributed = num(n, t.next().unwrap_or(""))?;
                    if t.next().is_some() || count > MAX_CALL_PCS {
                        return Err(bad(
                            n,
                            format!("bad call_pcs line (at most {MAX_CALL_PCS})"),
                        ));
                    }
                    let mut pcs: Vec<(u64, u64)> = Vec::with_capacity(count.min(4096));
                    for _ in 0..count {
                        let (n, l) = lines.next().ok_or(PluginParseError::Truncated)?;
                        let mut t = l.split(' ');
                        if t.next() != Some("pc") {
                            return Err(bad(n, "expected `pc 0xADDR N`"));
                        }
                        let pc = hex(n, t.next().unwrap_or(""))?;
                        let c = num(n, t.next().unwrap_or(""))?;
                        if t.next().is_some() || pcs.last().is_some_and(|&(p, _)| p >= pc) {
                            return Err(bad(
                                n,
                                "bad pc line (extra words, or not in ascending order)",
                            ));
                        }
                        pcs.push((pc, c));
                    }
                    call_pcs = Some(CallPcs { pcs, unattributed });
                }
                Some("symbols") if symbols.is_none() => {
                    let count = num(n, t.next().unwrap_or(""))? as usize;
                    if t.next() != Some("dropped") {
                        return Err(bad(n, "expected symbols N dropped M"));
                    }
                    let dropped = num(n, t.next().unwrap_or(""))?;
                    if t.next().is_some() || count > MAX_SYMBOL_LINES {
                        return Err(bad(
                            n,
                            format!("bad symbols line (at most {MAX_SYMBOL_LINES})"),
                        ));
                    }
                    let mut v = Vec::with_capacity(count.min(4096));
                    for _ in 0..count {
                        let (_, l) = lines.next().ok_or(PluginParseError::Truncated)?;
                        v.push(l.to_string());
                    }
                    symbols = Some((v, dropped));
                }
                _ => return Err(bad(n, "expected call_pcs, symbols or end")),
            }
        }
        if let Some((n, _)) = lines.next() {
            return Err(bad(n, "text after end"));
        }
        Ok(PluginReport {
            api,
            kernel,
            marks,
            dropped_marks,
            totals,
            call_pcs,
            symbols,
        })
    }

    /// The ptiscope guest's measured phase. Under plugin API version 1 the
    /// plugin cannot read the port or the value an `out` writes, so the
    /// markers are told apart by the guest's protocol: its kernel executes
    /// `out dx, eax` at exactly three places, the phase begin and end
    /// writes (two distinct instructions of its phase-mark syscall) and the
    /// exit-status write, which stops QEMU and so is always the last. The
    /// snapshots must therefore be `[begin, end, exit]` (or `[begin, end]`
    /// when QEMU stopped otherwise), begin and end at different addresses;
    /// any other pattern is refused rather than guessed at. Counts between
    /// the two are exact: each snapshot is taken at the instruction itself.
    pub fn companion_phase(&self) -> Result<PluginPhase, PhaseError> {
        self.complete()?;
        let m = &self.marks;
        let (begin, end) = match m.len() {
            2 | 3 => (&m[0], &m[1]),
            n => return Err(PhaseError::Pattern(n)),
        };
        let distinct =
            begin.pc != end.pc && m.get(2).is_none_or(|x| x.pc != begin.pc && x.pc != end.pc);
        if !distinct {
            return Err(PhaseError::Pattern(m.len()));
        }
        Self::phase(begin, end)
    }
}

impl PluginReport {
    /// The report as the plugin writes it (what [`PluginReport::parse`]
    /// reads back): `--backend nested` cuts one run's marks out of the
    /// outer plugin's live file and hands them on as that run's file.
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut s = format!(
            "ptiscope-tcg-plugin version={FORMAT_VERSION} api={} vcpus={}\nkernel {}\nfields {}\n",
            self.api,
            self.totals.0.len(),
            ranges_arg(&self.kernel),
            PluginCounter::ALL.map(PluginCounter::field).join(" ")
        );
        let counts = |s: &mut String, v: &VcpuCounts| {
            for (i, c) in v.0.iter().enumerate() {
                let _ = write!(s, "counts {i}");
                for n in c.0 {
                    let _ = write!(s, " {n}");
                }
                s.push('\n');
            }
        };
        for m in &self.marks {
            let _ = writeln!(s, "mark seq={} vcpu={} pc={:#x}", m.seq, m.vcpu, m.pc);
            counts(&mut s, &m.counts);
        }
        s.push_str("totals\n");
        counts(&mut s, &self.totals);
        let _ = writeln!(s, "dropped_marks {}", self.dropped_marks);
        if let Some(c) = &self.call_pcs {
            let _ = writeln!(
                s,
                "call_pcs {} unattributed {}",
                c.pcs.len(),
                c.unattributed
            );
            for (pc, n) in &c.pcs {
                let _ = writeln!(s, "pc {pc:#x} {n}");
            }
        }
        if let Some((lines, dropped)) = &self.symbols {
            let _ = writeln!(s, "symbols {} dropped {dropped}", lines.len());
            for l in lines {
                let _ = writeln!(s, "{l}");
            }
        }
        s.push_str("end\n");
        s
    }

    /// Refuses a file whose marks were dropped (a phase could be missing).
    fn complete(&self) -> Result<(), PhaseError> {
        match self.dropped_marks {
            0 => Ok(()),
            n => Err(PhaseError::Dropped(n)),
        }
    }

    /// The phase from `begin` to `end`; its counts must not go backwards.
    fn phase(begin: &Mark, end: &Mark) -> Result<PluginPhase, PhaseError> {
        let delta = begin
            .counts
            .delta_to(&end.counts)
            .ok_or(PhaseError::Backwards)?;
        Ok(PluginPhase {
            begin: begin.clone(),
            end: end.clone(),
            delta,
        })
    }

    /// ptiscope's Linux init's measured phase, from a plugin run with
    /// `umark=0x600` ([`LINUX_MARK_PORT`]): snapshots are taken only at a
    /// user-mode `mov edx, 0x600; mov [edi], eax` pair (the store to the
    /// init's MMIO marker page, which needs no I/O permission) or
    /// `mov edx, 0x600; out dx, eax` pair (its fallback after `ioperm`),
    /// which the init executes exactly twice (its phase begin and end, two
    /// distinct inlined copies of the pair; its exit-status write goes to
    /// another port). So the snapshots must be exactly `[begin, end]` at
    /// two addresses; anything else is refused rather than guessed at.
    pub fn linux_phase(&self) -> Result<PluginPhase, PhaseError> {
        self.complete()?;
        let [begin, end] = self.marks.as_slice() else {
            return Err(PhaseError::LinuxPattern(self.marks.len()));
        };
        if begin.pc == end.pc {
            return Err(PhaseError::LinuxPattern(2));
        }
        Self::phase(begin, end)
    }
}

/// The port of the Linux init's phase markers, as the plugin's `umark=`:
/// the `mov edx, PORT` that names its marker store (or `out`).
pub const LINUX_MARK_PORT: u16 = ptiscope_abi::port::PHASE;

/// The kernel address ranges to pass as `kernel=`, and the marker ranges
/// (`marks=`), for a guest: `elf32` for a 32-bit image. The kernel half is
/// the architecture's split (x86_64: the upper canonical half; i386: the
/// top gigabyte, 3G/1G, as Linux's default and the ptiscope guest's PAE
/// layout). `companion` (a guest that takes ptiscope's command line): it
/// also runs its boot code and AP trampoline below its user text (4 MiB),
/// and the firmware (SeaBIOS, qboot) runs below 1 MiB, all counted as
/// kernel instructions; markers are looked for from 1 MiB (the kernel's
/// load address) up, never in the firmware, whose PCI configuration
/// accesses are `out dx, eax` too: not below 1 MiB, and (i386) not in the
/// top 16 MiB of the 4 GiB space, where the PC maps the BIOS flash and
/// SeaBIOS runs its first code.
pub fn kernel_ranges(elf32: bool, companion: bool) -> (Vec<Range>, Vec<Range>) {
    let high = if elf32 {
        (0xc000_0000, 0xffff_ffff)
    } else {
        (0xffff_8000_0000_0000, u64::MAX)
    };
    let high_marks = if elf32 {
        (0xc000_0000, 0xfeff_ffff)
    } else {
        high
    };
    let below_user = guest_core::layout::USER_TEXT_BASE - 1;
    if companion {
        (
            vec![(0, below_user), high],
            vec![
                (guest_core::layout::KERNEL_PHYS_BASE, below_user),
                high_marks,
            ],
        )
    } else {
        (vec![high], vec![high_marks])
    }
}

/// `LO-HI[:LO-HI...]` in hex, as the plugin's arguments take them.
pub fn ranges_arg(ranges: &[Range]) -> String {
    ranges
        .iter()
        .map(|(lo, hi)| format!("{lo:#x}-{hi:#x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plugin file with a mark (its pc and counts) per entry of `marks`.
    fn file(marks: &[(u64, [u64; N_COUNTERS])], totals: [u64; N_COUNTERS]) -> String {
        let fields: Vec<&str> = PluginCounter::ALL.iter().map(|c| c.field()).collect();
        let mut s = format!(
            "ptiscope-tcg-plugin version=4 api=1 vcpus=1\nkernel 0x0-0x3fffff:0xc0000000-0xffffffff\nfields {}\n",
            fields.join(" ")
        );
        let line = |c: [u64; N_COUNTERS]| {
            format!(
                "counts 0 {}\n",
                c.iter().map(u64::to_string).collect::<Vec<_>>().join(" ")
            )
        };
        for (i, (pc, c)) in marks.iter().enumerate() {
            s.push_str(&format!("mark seq={i} vcpu=0 pc={pc:#x}\n"));
            s.push_str(&line(*c));
        }
        s.push_str("totals\n");
        s.push_str(&line(totals));
        s.push_str("dropped_marks 0\nend\n");
        s
    }

    /// [`file`] parsed.
    fn report(marks: &[(u64, [u64; N_COUNTERS])], totals: [u64; N_COUNTERS]) -> PluginReport {
        PluginReport::parse(file(marks, totals).as_bytes()).unwrap()
    }

    fn c(kernel: u64, cr3: u64) -> [u64; N_COUNTERS] {
        let mut a = [0; N_COUNTERS];
        a[0] = kernel;
        a[2] = cr3;
        a
    }

    /// Kernel and user addresses of the marks.
    const K1: u64 = 0xc000_1000;
    const K2: u64 = 0xc000_2000;
    const U1: u64 = 0x40_1000;
    const U2: u64 = 0x40_1040;

    #[test]
    fn parses_a_phase() {
        let marks = [
            (K1, c(100, 10)),
            (K2, c(500, 12)),
            (0xc000_3000, c(600, 13)),
        ];
        let r = report(&marks, c(700, 13));
        assert_eq!(r.kernel, vec![(0, 0x3f_ffff), (0xc000_0000, 0xffff_ffff)]);
        assert_eq!(r.totals.total().get(PluginCounter::KernelInsns), 700);
        let p = r.companion_phase().unwrap();
        assert_eq!(p.delta.total().get(PluginCounter::KernelInsns), 400);
        assert_eq!(p.delta.total().get(PluginCounter::Cr3Writes), 2);
    }

    #[test]
    fn refuses_other_marker_patterns() {
        for (marks, want) in [
            (vec![(K1, c(1, 1))], PhaseError::Pattern(1)),
            (vec![(K1, c(1, 1)), (K1, c(2, 2))], PhaseError::Pattern(2)),
            (vec![(K1, c(5, 1)), (K2, c(2, 2))], PhaseError::Backwards),
        ] {
            assert_eq!(
                report(&marks, c(9, 2)).companion_phase(),
                Err(want),
                "{marks:?}"
            );
        }
    }

    #[test]
    fn the_linux_phase_is_exactly_two_user_marks() {
        let p = report(&[(U1, c(100, 10)), (U2, c(700, 2010))], c(900, 2012))
            .linux_phase()
            .unwrap();
        assert_eq!(p.delta.total().get(PluginCounter::Cr3Writes), 2000);
        assert_eq!(p.delta.total().get(PluginCounter::KernelInsns), 600);
        for (marks, want) in [
            // The companion's [begin, end, exit] is not the init's pattern.
            (vec![(U1, c(1, 1)), (U2, c(2, 2)), (0x40_1080, c(3, 3))], 3),
            (vec![(U1, c(1, 1)), (U1, c(2, 2))], 2),
            (vec![], 0),
        ] {
            let got = report(&marks, c(3, 3)).linux_phase();
            assert_eq!(got, Err(PhaseError::LinuxPattern(want)), "{marks:?}");
        }
    }

    #[test]
    fn hostile_files_are_errors_not_panics() {
        let good = file(&[(K1, c(1, 1)), (K2, c(2, 2))], c(3, 3));
        assert!(PluginReport::parse(good.as_bytes()).is_ok());
        // Every truncation of a good file is refused (never a panic).
        for cut in 0..good.len() - 1 {
            assert!(
                PluginReport::parse(&good.as_bytes()[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        for (from, to) in [
            ("version=4", "version=3"),
            ("vcpus=1", "vcpus=0"),
            ("vcpus=1", "vcpus=65"),
            ("vcpus=1", "vcpus=2"),
            ("seq=1", "seq=7"),
            ("vcpu=0 pc=0xc0002000", "vcpu=3 pc=0xc0002000"),
            ("pc=0xc0002000", "pc=0xzz"),
            ("pc=0xc0002000", "pc=0x11112222333344445"),
            ("counts 0 2 ", "counts 0 -2 "),
            ("counts 0 2 ", "counts 0 99999999999999999999999 "),
            ("counts 0 3 ", "counts 1 3 "),
            ("fields kernel_insns", "fields user_insns"),
            ("0x0-0x3fffff", "0x3fffff-0x0"),
            ("dropped_marks 0", "dropped_marks x"),
            ("end\n", "end\nmore\n"),
            ("totals\n", ""),
        ] {
            let bad = good.replacen(from, to, 1);
            assert_ne!(bad, good, "{from} not in the file");
            assert!(
                PluginReport::parse(bad.as_bytes()).is_err(),
                "{from} -> {to} accepted"
            );
        }
        assert_eq!(
            PluginReport::parse("é".as_bytes()),
            Err(PluginParseError::NotText)
        );
        let huge = vec![b'a'; MAX_FILE_BYTES + 1];
        assert_eq!(
            PluginReport::parse(&huge),
            Err(PluginParseError::TooLarge(MAX_FILE_BYTES + 1))
        );
        // A counter line with an extra counter, or one too few.
        let extra = good.replacen("\ndropped_marks", " 7\ndropped_marks", 1);
        assert_ne!(extra, good);
        assert!(PluginReport::parse(extra.as_bytes()).is_err());
        let fewer = good.replacen(" 0\ndropped_marks", "\ndropped_marks", 1);
        assert_ne!(fewer, good);
        assert!(PluginReport::parse(fewer.as_bytes()).is_err());
    }

    #[test]
    fn per_address_counts_and_symbols() {
        let good = file(&[(U1, c(1, 1)), (U2, c(2, 2))], c(3, 3)).replacen(
            "end\n",
            "call_pcs 2 unattributed 5\npc 0xffffffff81000000 300\npc 0xffffffff81000004 300\n\
             symbols 2 dropped 1\nffffffff81000000 T entry_SYSCALL_64\nnot a symbol line\nend\n",
            1,
        );
        let r = PluginReport::parse(good.as_bytes()).unwrap();
        assert_eq!(
            r.call_pcs,
            Some(CallPcs {
                pcs: vec![(0xffff_ffff_8100_0000, 300), (0xffff_ffff_8100_0004, 300)],
                unattributed: 5
            })
        );
        let (lines, dropped) = r.symbols.unwrap();
        assert_eq!((lines.len(), dropped), (2, 1));
        // Without the sections: none.
        let plain = PluginReport::parse(file(&[], c(1, 1)).as_bytes()).unwrap();
        assert_eq!((plain.call_pcs, plain.symbols), (None, None));
        // Hostile sections are refused, never a panic.
        for (from, to) in [
            ("call_pcs 2", "call_pcs 3"),
            ("call_pcs 2", "call_pcs 99999999999"),
            ("call_pcs 2", "call_pcs x"),
            ("unattributed 5", "unattributed"),
            ("unattributed 5", "unattributed 5 6"),
            ("pc 0xffffffff81000004", "pc 0xffffffff81000000"),
            ("pc 0xffffffff81000004 300", "pc 0xffffffff81000004 -1"),
            ("pc 0xffffffff81000004 300", "pc 0xffffffff81000004 300 1"),
            ("pc 0xffffffff81000004", "pq 0xffffffff81000004"),
            ("symbols 2", "symbols 3"),
            ("symbols 2", "symbols 2000000000"),
            ("dropped 1", "dropped"),
            ("end\n", "end\nx\n"),
        ] {
            let bad = good.replacen(from, to, 1);
            assert_ne!(bad, good, "{from} not in the file");
            assert!(
                PluginReport::parse(bad.as_bytes()).is_err(),
                "{from} -> {to} accepted"
            );
        }
        // Two call_pcs sections, or call_pcs after symbols: refused.
        let twice = good.replacen("symbols 2", "call_pcs 0 unattributed 0\nsymbols 2", 1);
        assert!(PluginReport::parse(twice.as_bytes()).is_err());
        let after = good.replacen("end\n", "call_pcs 0 unattributed 0\nend\n", 1);
        assert!(PluginReport::parse(after.as_bytes()).is_err());
        for cut in 0..good.len() - 1 {
            assert!(
                PluginReport::parse(&good.as_bytes()[..cut]).is_err(),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn ranges_for_the_companion_and_others() {
        let (k, m) = kernel_ranges(true, true);
        assert_eq!(ranges_arg(&k), "0x0-0x3fffff:0xc0000000-0xffffffff");
        assert_eq!(ranges_arg(&m), "0x100000-0x3fffff:0xc0000000-0xfeffffff");
        let (k, _) = kernel_ranges(false, false);
        assert_eq!(ranges_arg(&k), "0xffff800000000000-0xffffffffffffffff");
    }
}
