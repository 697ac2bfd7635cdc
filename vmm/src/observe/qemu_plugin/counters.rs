//! The plugin's counters: which it counts per vCPU ([`PluginCounter`], the
//! file's `fields`), one snapshot's values ([`Counts`]) and every vCPU's
//! ([`VcpuCounts`]).

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
pub struct Counts(pub(super) [u64; N_COUNTERS]);

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
