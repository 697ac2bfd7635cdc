//! `ptiscope probe`: what this host's KVM can run, found by booting tiny probe guests.
//!
//! Every verdict comes from running code: each probe creates its own small
//! VM (64 KiB of RAM, one vCPU with the host's supported CPUID), writes a few
//! bytes of hand-assembled machine code plus page tables, GDT, IDT and TSS
//! into it, runs the vCPU under a watchdog and classifies the exit it sees.
//! The names of loaded kvm modules are reported as information only.
//!
//! Files: [`code`] (machine code and tables), `vm` (the harness), `caps`
//! (KVM API, capabilities, stats fd), `paging`, `entries` (user-mode entry
//! instructions), `cpu` (PCID, ARCH_CAPABILITIES, RDTSC), [`entry`] (the
//! `entry=` values), [`refill`] (whether a guest CR3 write costs user code
//! a TLB refill on this host; its VMs have 4 MiB more RAM for the working set).

mod caps;
pub mod code;
mod cpu;
mod entries;
pub mod entry;
pub mod host;
pub mod host_cache;
mod paging;
pub mod refill;
pub mod trip;
mod vm;

use std::fmt;
use std::time::{Duration, Instant};

use ptiscope_abi::options::Entry;
use serde::Serialize;

pub use caps::{Cap, HostInfo, StatsFdProbe};
pub use cpu::{ArchCapsProbe, PcidProbe, RdtscProbe};
pub use entries::{EntryProbe, IretqProbe};
pub use entry::EntryOutcome;
pub use paging::PagingOutcome;
pub use refill::{RefillProbe, RefillVerdict};
pub use vm::VmError;

/// How to probe.
#[derive(Debug, Clone)]
pub struct ProbeOptions {
    /// Watchdog timeout of each probe VM. Probes take microseconds to a few
    /// milliseconds; this only bounds a probe that would otherwise hang.
    pub timeout: Duration,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        ProbeOptions {
            timeout: Duration::from_millis(250),
        }
    }
}

/// The probe could not run at all (a single probe's failure is a row, not
/// an error).
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// A probe VM could not be set up.
    #[error("probe VM setup failed: {0}")]
    Vm(#[from] VmError),
    /// The trip measurement failed (its message).
    #[error("trip measurement: {0}")]
    Trip(String),
}

/// A probe's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Works.
    Yes,
    /// Does not work.
    No,
    /// Some of it works.
    Partial,
    /// A fact, not a yes/no answer.
    Info,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Yes => "yes",
            Verdict::No => "no",
            Verdict::Partial => "partial",
            Verdict::Info => "info",
        })
    }
}

fn yes_no(b: bool) -> Verdict {
    if b {
        Verdict::Yes
    } else {
        Verdict::No
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    /// What was probed.
    pub probe: String,
    /// Its verdict.
    pub result: Verdict,
    /// What was seen.
    pub detail: String,
}

/// A paging-mode verdict with what was seen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PagingProbe {
    /// The verdict.
    pub outcome: PagingOutcome,
    /// What was seen.
    pub detail: String,
}

/// The three paging modes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PagingProbes {
    /// 4-level paging in long mode.
    pub long_mode: PagingProbe,
    /// 32-bit PAE paging.
    pub pae: PagingProbe,
    /// Legacy 32-bit (non-PAE) paging.
    pub legacy: PagingProbe,
}

/// Everything `ptiscope probe` found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeReport {
    /// Host-level facts and capabilities.
    pub host: HostInfo,
    /// Whether the binary stats fd works on the VM and a vCPU.
    pub stats_fd: StatsFdProbe,
    /// Which paging modes the guest can turn on.
    pub paging: PagingProbes,
    /// User-mode (CPL3, long mode) entry instructions.
    pub entries: Vec<EntryProbe>,
    /// The kernel-to-user IRETQ round trip.
    pub iretq: IretqProbe,
    /// PCID in the guest.
    pub pcid: PcidProbe,
    /// What the guest reads from IA32_ARCH_CAPABILITIES, and whether the VMM can change it.
    pub arch_capabilities: ArchCapsProbe,
    /// RDTSC at CPL3.
    pub rdtsc_user: RdtscProbe,
    /// Whether a guest CR3 write costs user code a TLB refill here.
    pub cr3_write_refill: RefillProbe,
    /// The entry `entry=auto` resolves to.
    pub best_entry: Option<Entry>,
    /// Wall time of the whole probe.
    pub elapsed_ms: f64,
    /// The human table, also for machines.
    pub rows: Vec<Row>,
}

/// Runs every probe.
pub fn run(opts: &ProbeOptions) -> Result<ProbeReport, ProbeError> {
    let start = Instant::now();
    let kit = vm::Kit::new(opts.timeout)?;
    let host = caps::host_info(&kit);
    let stats_fd = caps::probe_stats_fd(&kit)?;
    let paging_probe = |m| -> Result<PagingProbe, VmError> {
        let (outcome, detail) = paging::probe(&kit, m)?;
        Ok(PagingProbe { outcome, detail })
    };
    let paging = PagingProbes {
        long_mode: paging_probe(paging::Mode::Long)?,
        pae: paging_probe(paging::Mode::Pae)?,
        legacy: paging_probe(paging::Mode::Legacy)?,
    };
    let entries = entries::probe_all(&kit)?;
    let working: Vec<Entry> = entries
        .iter()
        .filter(|e| e.outcome.works())
        .filter_map(|e| e.entry)
        .collect();
    let iretq = entries::probe_iretq(&kit, &working)?;
    let pcid = cpu::probe_pcid(&kit)?;
    let arch_capabilities = cpu::probe_arch_caps(&kit)?;
    let rdtsc_user = cpu::probe_rdtsc(&kit)?;
    let cr3_write_refill = refill_on(&kit, preferred_entry(&working), rdtsc_user.works);
    let mut report = ProbeReport {
        host,
        stats_fd,
        paging,
        entries,
        iretq,
        pcid,
        arch_capabilities,
        rdtsc_user,
        cr3_write_refill,
        best_entry: None,
        elapsed_ms: 0.0,
        rows: Vec::new(),
    };
    report.best_entry = report.best_entry();
    report.elapsed_ms = start.elapsed().as_secs_f64() * 1e3;
    report.rows = report.build_rows();
    Ok(report)
}

/// Runs only the entry probes (syscall, sysenter, int80, int3, int4): what
/// the VMM needs to resolve `entry=auto`. A few milliseconds.
pub fn probe_entries(opts: &ProbeOptions) -> Result<Vec<(Entry, EntryOutcome)>, ProbeError> {
    let kit = vm::Kit::new(opts.timeout)?;
    Ok(entries::probe_entries(&kit)?)
}

/// Runs only the PCID probe: what the VMM needs to refuse `pcid=on` on a
/// host without PCID. A few milliseconds.
pub fn probe_pcid(opts: &ProbeOptions) -> Result<PcidProbe, ProbeError> {
    let kit = vm::Kit::new(opts.timeout)?;
    Ok(cpu::probe_pcid(&kit)?)
}

/// Runs only the 32-bit PAE paging probe: whether this host's KVM lets a
/// guest turn on PAE paging outside long mode (the i386 flavour needs it).
/// Returns whether it works and what happened. A few milliseconds.
pub fn probe_pae_paging(opts: &ProbeOptions) -> Result<(bool, String), ProbeError> {
    let kit = vm::Kit::new(opts.timeout)?;
    let (outcome, detail) = paging::probe(&kit, paging::Mode::Pae)?;
    Ok((outcome.works(), format!("{outcome}; {detail}")))
}

/// Runs only the refill probe (and the entry probes it needs to choose its
/// entry): whether a guest CR3 write costs user code a TLB refill on this
/// host. Some hundreds of milliseconds.
pub fn probe_cr3_write_refill(opts: &ProbeOptions) -> Result<RefillProbe, ProbeError> {
    probe_cr3_write_refill_with(opts, None)
}

/// [`probe_cr3_write_refill`] with the entries that work here already
/// known (`Some`: the entry probe's findings, this process's or the host
/// facts cache's), so that the entry probe's VMs do not run a second time.
pub fn probe_cr3_write_refill_with(
    opts: &ProbeOptions,
    working: Option<&[Entry]>,
) -> Result<RefillProbe, ProbeError> {
    let kit = vm::Kit::new(opts.timeout)?;
    let working: Vec<Entry> = match working {
        Some(w) => w.to_vec(),
        None => entries::probe_entries(&kit)?
            .into_iter()
            .filter(|(_, o)| o.works())
            .map(|(e, _)| e)
            .collect(),
    };
    let rdtsc = cpu::probe_rdtsc(&kit)?.works;
    Ok(refill_on(&kit, preferred_entry(&working), rdtsc))
}

fn refill_on(kit: &vm::Kit, entry: Option<Entry>, rdtsc_user: bool) -> RefillProbe {
    if !rdtsc_user {
        return RefillProbe::unmeasured(
            entry,
            "RDTSC at CPL3 does not work here, so user code cannot time its trips".into(),
        );
    }
    refill::probe(kit, entry)
}

/// The preferred entry among `working`: SYSCALL if it really reaches CPL0,
/// else `int $0x80`, else `int3`, else `int $4`. SYSENTER is not chosen for
/// the 64-bit guest (it is the 32-bit flavour's entry).
pub fn preferred_entry(working: &[Entry]) -> Option<Entry> {
    [Entry::Syscall, Entry::Int80, Entry::Int3, Entry::Int4]
        .into_iter()
        .find(|e| working.contains(e))
}

impl ProbeReport {
    /// Entries whose instruction reached the kernel at CPL0.
    pub fn working_entries(&self) -> Vec<Entry> {
        self.entries
            .iter()
            .filter(|p| p.outcome.works())
            .filter_map(|p| p.entry)
            .collect()
    }

    /// See [`preferred_entry`].
    pub fn best_entry(&self) -> Option<Entry> {
        preferred_entry(&self.working_entries())
    }

    /// 4-level paging in long mode, entered from 32-bit protected mode.
    pub fn long_mode_paging(&self) -> bool {
        self.paging.long_mode.outcome.works()
    }

    /// 32-bit PAE paging (the x86_32 flavour's mode).
    pub fn pae_paging(&self) -> bool {
        self.paging.pae.outcome.works()
    }

    /// PCID usable: CPUID bit, CR4.PCIDE and NOFLUSH CR3 writes all work.
    pub fn pcid(&self) -> bool {
        self.pcid.usable()
    }

    fn build_rows(&self) -> Vec<Row> {
        let mut rows = Vec::new();
        let mut row = |probe: &str, result: Verdict, detail: String| {
            rows.push(Row {
                probe: probe.to_string(),
                result,
                detail,
            })
        };
        let h = &self.host;
        row(
            "KVM API version",
            yes_no(h.api_version == 12),
            format!("{} (12 is the stable API)", h.api_version),
        );
        for c in &h.caps {
            row(
                c.name,
                yes_no(c.value > 0),
                format!("KVM_CHECK_EXTENSION({}) = {}", c.number, c.value),
            );
        }
        row(
            "vCPUs",
            Verdict::Info,
            format!("max {}, recommended {}", h.max_vcpus, h.recommended_vcpus),
        );
        row(
            "kvm module",
            Verdict::Info,
            if h.kvm_modules.is_empty() {
                "none of kvm_intel/kvm_amd/kvm_pvm in /sys/module (information only)".into()
            } else {
                format!("{} (information only)", h.kvm_modules.join(", "))
            },
        );
        row(
            "binary stats fd",
            yes_no(self.stats_fd.works()),
            self.stats_fd.detail.clone(),
        );
        for (name, p) in [
            ("64-bit long-mode paging", &self.paging.long_mode),
            ("32-bit PAE paging", &self.paging.pae),
            ("32-bit legacy paging", &self.paging.legacy),
        ] {
            row(
                name,
                yes_no(p.outcome.works()),
                format!("{}: {}", p.outcome, p.detail),
            );
        }
        for e in &self.entries {
            row(
                &format!("user {} ({})", e.instruction, e.bytes),
                yes_no(e.outcome.works()),
                format!("{}; {}", e.outcome, e.detail),
            );
        }
        let to_user = self.entries.iter().any(|e| e.reached_user);
        let iret = match (to_user, self.iretq.works) {
            (true, true) => Verdict::Yes,
            (false, false) => Verdict::No,
            _ => Verdict::Partial,
        };
        row(
            "IRETQ to CPL3",
            iret,
            format!(
                "kernel→user IRETQ {}; {}",
                if to_user { "works" } else { "failed" },
                self.iretq.detail
            ),
        );
        let p = &self.pcid;
        let pcid_verdict = if p.usable() {
            Verdict::Yes
        } else if p.cpuid_bit == Some(true) || p.pcide || p.cr3_noflush {
            Verdict::Partial
        } else {
            Verdict::No
        };
        row(
            "PCID",
            pcid_verdict,
            format!(
                "CPUID.1:ECX[17] {}; {}",
                match p.cpuid_bit {
                    Some(true) => "set",
                    Some(false) => "clear",
                    None => "unread",
                },
                p.detail
            ),
        );
        let a = &self.arch_capabilities;
        row(
            "ARCH_CAPABILITIES",
            yes_no(a.guest_value.is_some()),
            a.detail.clone(),
        );
        let control = if a.set_msrs_works {
            Verdict::Yes
        } else if a.msr_exit_works {
            Verdict::Partial
        } else {
            Verdict::No
        };
        row(
            "ARCH_CAPABILITIES set by VMM",
            control,
            format!(
                "{:#x} via KVM_SET_MSRS: {}; via user-space MSR exit: {}{}",
                a.override_value,
                if a.set_msrs_works {
                    "seen by the guest"
                } else {
                    "no"
                },
                if a.msr_exit_works {
                    "seen by the guest"
                } else {
                    "no"
                },
                if a.cpuid_bit == Some(false) {
                    "; CPUID.7:EDX[29] clear, so a guest that checks it first never reads the MSR"
                } else {
                    ""
                }
            ),
        );
        row(
            "RDTSC at CPL3",
            yes_no(self.rdtsc_user.works),
            self.rdtsc_user.detail.clone(),
        );
        let r = &self.cr3_write_refill;
        row(
            "cr3_write_refill",
            Verdict::Info,
            format!("{}: {}", r.verdict, r.detail),
        );
        row(
            "entry=auto",
            Verdict::Info,
            match self.best_entry {
                Some(e) => format!(
                    "{} (working: {})",
                    e,
                    self.working_entries()
                        .iter()
                        .map(|e| e.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                None => "no entry reaches CPL0 from user mode".into(),
            },
        );
        row(
            "probe time",
            Verdict::Info,
            format!("{:.1} ms", self.elapsed_ms),
        );
        rows
    }
}

impl fmt::Display for ProbeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = self
            .rows
            .iter()
            .map(|r| r.probe.chars().count())
            .max()
            .unwrap_or(5)
            .max(5);
        writeln!(f, "{:<w$}  {:<7}  detail", "probe", "result")?;
        writeln!(f, "{:-<w$}  {:-<7}  {:-<6}", "", "", "")?;
        for r in &self.rows {
            writeln!(
                f,
                "{:<w$}  {:<7}  {}",
                r.probe,
                r.result.to_string(),
                r.detail
            )?;
        }
        let r = &self.cr3_write_refill;
        match (r.ns_per_page, r.ns_per_page_fastest) {
            (Some(ns), Some(fastest)) => writeln!(
                f,
                "\ncr3_write_refill: {} ({ns:.2} ns/page from the medians, {fastest:.2} from the fastest runs; \
                 threshold {} ns/page)",
                r.verdict, r.threshold_ns_per_page
            ),
            _ => writeln!(f, "\ncr3_write_refill: {} ({})", r.verdict, r.detail),
        }
    }
}

#[cfg(test)]
mod tests;
