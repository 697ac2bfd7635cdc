//! `ptiscope ledger`: what each of a Linux kernel's CPU-bug mitigations
//! costs per system call, per CPU model, exactly (docs/ledger.md).
//!
//! Per kernel, CPU model and workload (a block): one default boot reads
//! which mitigations the kernel enabled (its vulnerabilities files) and
//! measures the default path; one boot per enabled mitigation turned off by
//! its documented parameter (`plan`); one `mitigations=off` boot for the
//! total. Every boot runs under QEMU TCG with ptiscope's plugin, which
//! counts the undisturbed calls' kernel instructions exactly, by symbol and
//! by special instruction (`model`). `run` boots them two at a time,
//! `render` prints and writes the result.

mod model;
mod plan;
mod pool;
mod render;
mod run;
mod svg;

use std::time::Duration;

use clap::Args;
use ptiscope_abi::options::Workload;

use crate::cli::OutputOpts;

pub use run::run;

/// The rows of the ledger's table (the most boots a block can take
/// besides its default, repeat and all-off boots).
pub const ROWS: usize = plan::MITIGATIONS.len();

/// CPU models measured when none is given: an older Intel client part
/// (PTI, VERW, retpolines, ITS), an AMD EPYC part (retbleed's and SRSO's
/// return thunks), and QEMU's `max` (TCG's own, which claims no bug: what
/// the kernel runs on a CPU it believes fixed). A newer Intel server part
/// (`Cascadelake-Server-v4`, `Icelake-Server`) gets the same mitigations
/// as Skylake-Client-v1 under TCG (QEMU 7.2 passes no
/// ARCH_CAPABILITIES), so it would double the Intel boots and show nothing
/// new: `--cpu` adds it.
pub const DEFAULT_CPUS: [&str; 3] = ["Skylake-Client-v1", "EPYC-Rome", "max"];

/// The CPU column of a block on a KVM backend: the KVM's own CPU.
pub const KVM_CPU: &str = "host";

/// Workloads measured when none is given: getppid (the system-call path,
/// exact) and sched-messaging over pipes (context switches between
/// processes: CR3 switches, RSB filling, IBPB; not exact).
pub const DEFAULT_WORKLOADS: [Workload; 2] = [Workload::Getppid, Workload::SchedMessaging];

/// Options of `ptiscope ledger`.
#[derive(Debug, Args)]
#[command(
    mut_arg("json", |a| a.help("Write the ledger as JSON (schema ptiscope.ledger/1, every figure)")),
    mut_arg("csv", |a| a.help("Write the ledger as CSV (one line per block and row)")),
    mut_arg("svg", |a| a.help("Write the ledger as an SVG picture (a stacked bar per block, one \
        segment per mitigation, a mark at the mitigations=off total)")),
)]
pub struct LedgerArgs {
    /// A Linux kernel (repeatable): `debian-amd64`, `debian-6.12-amd64`,
    /// `debian-686-pae`, or a bzImage path. Default: every one of those
    /// `ptiscope linux fetch` has put in the cache.
    #[arg(long, value_name = "KERNEL")]
    pub linux: Vec<String>,
    /// QEMU's CPU model (repeatable; `qemu-system-x86_64 -cpu help` lists
    /// them). Default: Skylake-Client-v1, EPYC-Rome, max.
    #[arg(long, value_name = "MODEL")]
    pub cpu: Vec<String>,
    /// Workload (repeatable): a system-call loop (getppid, getpid,
    /// write-badfd; exact), or sched-messaging (processes passing messages
    /// over pipes: context switches; not exact). Default: getppid and
    /// sched-messaging.
    #[arg(long, value_name = "NAME")]
    pub workload: Vec<String>,
    /// Measure only this mitigation's row (repeatable; its key: meltdown,
    /// verw, spectre_v1, spectre_v2, spectre_bhi, retbleed,
    /// indirect_target_selection, spec_rstack_overflow, spec_store_bypass,
    /// l1tf, srbds, gather_data_sampling, vmscape, tsa). Default: every enabled one.
    #[arg(long, value_name = "KEY")]
    pub mitigation: Vec<String>,
    /// Where the kernels run: `qemu` (QEMU TCG and ptiscope's plugin:
    /// exact kernel instructions per call, by symbol, per CPU model);
    /// `kvm` (ptiscope's VMM on this host's /dev/kvm: host-clock time, KVM
    /// exits and CR3 writes per call, on the host's CPU; refused where that
    /// KVM cannot run Linux, as kvm_pvm cannot); `nested` (the same ledger
    /// inside a QEMU TCG Linux with a real kvm_amd: exits and CR3 writes,
    /// emulated time; give --linux: the kernels are packed into it).
    #[arg(long, value_enum, default_value = "qemu")]
    pub backend: crate::cli::Backend,
    /// Calls per boot (the counts are exact: a thousand is plenty).
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=1_000_000))]
    pub iterations: u64,
    /// Boots run at once (each is one QEMU TCG process, one host CPU).
    /// Default: this host's CPUs.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=16))]
    pub jobs: Option<u32>,
    /// Stop a boot after this many seconds.
    #[arg(long, value_name = "SECS", default_value = "240", value_parser = crate::cli::parse_timeout)]
    pub timeout: Duration,
    /// `--json`, `--csv`, `--svg`: compare's and sweep's output options,
    /// with the ledger's help texts (above).
    #[command(flatten)]
    pub out: OutputOpts,
    /// No progress lines.
    #[arg(long)]
    pub quiet: bool,
}
