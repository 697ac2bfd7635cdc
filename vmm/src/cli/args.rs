//! The options of the experiment commands (`compare`, `sweep` and
//! poundsyscall's table share `ExperimentOpts` and `TargetOpts`), `--linux`,
//! the guest flavour, and `--backend` with the one place its value becomes
//! a [`crate::backend::Backend`].

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::{parse_cpus, parse_mem, parse_timeout, RunArgs};
use crate::backend::registry::BackendName;
use crate::machine::memory::DEFAULT_MEM_MIB;
use crate::spec::guest::GuestKind;
use crate::spec::linux::{LinuxArch, LinuxRequest, TickFree};
use ptiscope_abi::options::Workload;

/// Default iterations of one compare run: sized so that the default compare
/// (5 runs per side, interleaved) takes about 10 s under kvm_pvm, where one
/// getpid round trip costs 30-45 µs (kernel code is emulated).
pub const DEFAULT_COMPARE_ITERATIONS: u64 = 20_000;
/// Default runs per side.
pub const DEFAULT_COMPARE_RUNS: u32 = 5;
use crate::experiment::MIN_AUTO_RUNS;
/// `--runs auto`: default `--max-runs`.
pub const DEFAULT_MAX_RUNS: u32 = 20;
/// `--runs auto`: default `--target-ci`, in % of the mean.
pub const DEFAULT_TARGET_CI_PCT: f64 = 1.0;

/// `--runs`: a fixed count per side, or until the confidence interval is narrow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runs {
    /// Exactly this many runs per side.
    Fixed(u32),
    /// Interleaved pairs until `--target-ci` or `--max-runs`.
    Auto,
}

/// `--runs`: `auto` or a count in 1..=1000.
pub fn parse_runs(s: &str) -> Result<Runs, String> {
    let s = s.trim();
    if s == "auto" {
        return Ok(Runs::Auto);
    }
    match s.parse::<u32>() {
        Ok(n) if (1..=1000).contains(&n) => Ok(Runs::Fixed(n)),
        _ => Err(format!(
            "{s:?}: give a number of runs per side in 1..=1000, or `auto`"
        )),
    }
}

/// `--target-ci`: a percentage in (0, 100].
pub fn parse_target_ci(s: &str) -> Result<f64, String> {
    match s.trim().trim_end_matches('%').parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 100.0 => Ok(v),
        _ => Err(format!(
            "{s:?}: give the confidence interval's half-width in % of the mean, in (0, 100]"
        )),
    }
}

/// A clap value parser for an option typed in the guest ABI: the accepted
/// values (and `--help`'s list) are its names, parsed by its `FromStr`.
pub fn abi_option<T>(
    names: impl IntoIterator<Item = &'static str>,
) -> impl clap::builder::TypedValueParser<Value = T>
where
    T: std::str::FromStr + Clone + Send + Sync + 'static,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(names).try_map(|s| s.parse::<T>())
}

/// Options of `ptiscope compare` (and of the default comparison).
#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Baseline configuration: comma-separated key=value options.
    #[arg(long, value_name = "OPTS", default_value = "pti=off")]
    pub baseline: String,
    /// Compare configuration: comma-separated key=value options.
    #[arg(long, value_name = "OPTS", default_value = "pti=on")]
    pub compare: String,
    /// Runs per configuration (baseline and compare runs are interleaved), or
    /// `auto`: add run pairs until the main time metric's 95 % confidence
    /// interval is within --target-ci of its mean on both sides, or
    /// --max-runs is reached.
    #[arg(long, value_name = "R|auto", default_value = "5", value_parser = parse_runs, allow_negative_numbers = true)]
    pub runs: Runs,
    /// With `--runs auto`: the most runs per side (default 20).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(MIN_AUTO_RUNS as i64..=1000))]
    pub max_runs: Option<u32>,
    /// With `--runs auto`: the target half-width of the 95 % confidence
    /// interval of the main time metric's mean, in % of the mean (default 1).
    #[arg(long, value_name = "PCT", value_parser = parse_target_ci)]
    pub target_ci: Option<f64>,
    /// Run K interleaved pairs first and discard them (warm-up).
    #[arg(long, value_name = "K", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub warmup: u32,
    /// Also compare this run with an earlier `compare --json` result (each
    /// side with the earlier run's same side) and warn when the environments differ.
    #[arg(long, value_name = "FILE.json")]
    pub against: Option<PathBuf>,
    /// What every run runs (shared with `sweep`).
    #[command(flatten)]
    pub exp: ExperimentOpts,
    /// The result's files (shared with `sweep`).
    #[command(flatten)]
    pub out: OutputOpts,
    /// Fail (exit 1) when this condition holds; repeatable. With
    /// --by-symbol also `symbol:NAME[.delta|.baseline|.compare]>N` on a
    /// kernel symbol's per-call instructions (default: the difference).
    #[arg(long = "fail-if", value_name = "COND")]
    pub fail_if: Vec<String>,
    /// Per-call kernel instructions by kernel symbol on both sides and
    /// their difference (--backend qemu, Linux guests: the plugin counts by
    /// address, the init sends the kernel's /proc/kallsyms).
    #[arg(long)]
    pub by_symbol: bool,
    /// With --by-symbol: also write that table as CSV (symbol, baseline,
    /// compare and delta per call; every symbol that ran on either side).
    #[arg(long, value_name = "FILE.csv")]
    pub by_symbol_csv: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Also print the full mmtests compare-kernels table (Min, Amean,
    /// Stddev, CoeffVar, Max, BAmean; negative % = worse) and the duration
    /// table; --json and --csv always have every statistic.
    #[arg(long)]
    pub mmtests: bool,
    /// Where the runs run (shared with `sweep`).
    #[command(flatten)]
    pub target: TargetOpts,
}

/// The files an experiment's result is written to (`compare`'s help text;
/// `sweep` sets its own with `mut_arg`).
#[derive(Debug, Clone, Args)]
pub struct OutputOpts {
    /// Write the comparison as JSON (schema ptiscope.compare/1, with the environment).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the comparison as CSV.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Write the comparison as an SVG picture (compare relative to baseline, every run a dot).
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
}

impl OutputOpts {
    /// `--json`, `--csv` and `--svg`, opened (created, checked writable, a
    /// FIFO's reader waited for up to `timeout`) before the first boot: a
    /// typo in a path must not cost a whole experiment.
    pub fn open(
        &self,
        timeout: Duration,
    ) -> Result<[Option<crate::output::OutputFile>; 3], crate::output::OpenError> {
        crate::output::open_outputs(
            [
                ("--json", self.json.as_deref()),
                ("--csv", self.csv.as_deref()),
                ("--svg", self.svg.as_deref()),
            ],
            timeout,
        )
    }
}

/// The options of an experiment's runs that `compare` and `sweep` share
/// (`compare`'s help text; `sweep` sets its own with `mut_arg`).
#[derive(Debug, Clone, Args)]
pub struct ExperimentOpts {
    /// Workload for both sides (an OPTS `workload=` overrides it).
    #[arg(long, value_name = "NAME", default_value = "getpid", value_parser = abi_option::<Workload>(Workload::NAMES.iter().copied()))]
    pub workload: Workload,
    /// Iterations per run for both sides (an OPTS `iterations=` overrides it).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_COMPARE_ITERATIONS, allow_negative_numbers = true)]
    pub iterations: u64,
    /// vCPUs of every run (1..=8); e.g. `--workload poundsyscall --cpus 2
    /// --cmdline threads=2` (compare's `cmdline=` option passes threads=).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = parse_cpus)]
    pub cpus: u32,
    /// Boot this PVH kernel instead of the embedded guest: an ELF64, or an
    /// ELF32 (a 32-bit guest such as i386), with a Xen PVH entry note.
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,
    /// Guest memory in MiB (16..=1024).
    #[arg(long, value_name = "MiB", default_value_t = DEFAULT_MEM_MIB, value_parser = parse_mem, allow_negative_numbers = true)]
    pub mem: u64,
    /// Stop a run after this many seconds (default 60; for Linux sides at
    /// least 60 and one that fits the run, as `run --linux`'s).
    #[arg(long, value_name = "SECS", default_value = "60", value_parser = parse_timeout, allow_negative_numbers = true)]
    pub timeout: Duration,
}

/// Where an experiment's runs run: the guest and the backend (shared by
/// `compare` and `sweep`, with `compare`'s help text).
#[derive(Debug, Clone, Args)]
pub struct TargetOpts {
    /// Which embedded guest to compare (default x86_64; with `--kernel` the
    /// image decides; with `--linux` it must match the image).
    #[arg(long, value_enum, conflicts_with = "kernel")]
    pub arch: Option<Arch>,
    /// A Linux kernel as the guest.
    #[command(flatten)]
    pub linux: LinuxArgs,
    /// The backend and its options.
    #[command(flatten)]
    pub on: BackendOpts,
}

/// `--backend` and every backend's own options (shared by every command
/// that boots a guest, with `compare`'s help text; `run` sets its own).
#[derive(Debug, Clone, Default, Args)]
pub struct BackendOpts {
    /// Where to run the guests (ptiscope's VMM on KVM, QEMU's TCG, ...): one
    /// of these (each backend registers itself: docs/backends.md).
    #[arg(long, default_value = "kvm", value_parser = BackendName::parser())]
    pub backend: BackendName,
    /// The registered backends' own options (`--qemu-arg`, `--no-plugin`,
    /// `--nested-paging`, `--replay`).
    #[command(flatten)]
    pub options: crate::backend::registry::BackendOptions,
}

impl BackendOpts {
    /// The backend named by `--backend`, with a named backend's options.
    pub fn on(name: &str) -> BackendOpts {
        BackendOpts {
            backend: BackendName::of(name).unwrap_or_default(),
            ..Default::default()
        }
    }

    /// `--backend`'s backend, built from its options.
    pub fn backend(
        &self,
    ) -> Result<Box<dyn crate::backend::Backend>, crate::backend::BackendError> {
        self.backend.build(&self.options, &super::host_facts)
    }

    /// The QEMU backend's options (`--qemu-arg`, `--no-plugin`): what a
    /// run's request carries for it.
    pub fn qemu(&self) -> crate::backend::QemuOptions {
        self.options.of()
    }

    /// The backend whose options `--backend`'s takes (its own name, or
    /// `kvm` for `nested`, which runs its runs on a KVM): what a compare
    /// side's backend keys (`cpu=`, `cpu_vuln=`) are checked against.
    pub fn options_owner(&self) -> &'static str {
        self.backend()
            .map_or(self.backend.as_str(), |b| b.options_of())
    }

    /// What the experiment commands ask of the backend: the registered
    /// backends' options given (`--qemu-arg`, ...).
    pub fn requested(&self) -> crate::backend::Requested {
        crate::backend::Requested {
            given: self.options.given(),
            qemu_args: self.qemu().qemu_arg,
            ..Default::default()
        }
    }

    /// The options given that `backend::refusal` refuses for the chosen
    /// backend, as a usage error. A backend that cannot be built refuses
    /// nothing here: building it says why, with its own exit code.
    pub fn refusal(&self, asked: &crate::backend::Requested) -> Option<String> {
        let backend = self.backend().ok()?;
        crate::backend::refusal(&*backend, asked)
    }
}

/// The flags of `options` that were given (`(flag, given)`), in order: what
/// `backend::refusal` checks against the backends' own options.
pub fn given(options: &[(&'static str, bool)]) -> Vec<&'static str> {
    options
        .iter()
        .filter(|(_, g)| *g)
        .map(|(f, _)| *f)
        .collect()
}

/// `--linux` and `--append`: a real Linux kernel as the guest, with
/// ptiscope's init (docs/linux-guests.md).
#[derive(Debug, Clone, Default, Args)]
pub struct LinuxArgs {
    /// Boot this Linux kernel with ptiscope's init instead of ptiscope's own
    /// guest: `debian-amd64`, `debian-686-pae` (Debian's 6.1) or
    /// `debian-6.12-amd64` (fetched by `ptiscope linux fetch`), or a path to a bzImage (x86_64 or i386) or a PVH vmlinux.
    /// Needs `--backend qemu` on hosts without hardware KVM.
    #[arg(long, value_name = "KERNEL", conflicts_with = "kernel")]
    pub linux: Option<String>,
    /// More Linux kernel command line (with `--linux`), e.g. `nosmt`.
    #[arg(
        long,
        value_name = "TEXT",
        requires = "linux",
        allow_hyphen_values = true
    )]
    pub append: Option<String>,
    /// With `--linux`, a system-call loop (getpid, getppid, write-badfd)
    /// runs on a CPU without the scheduler tick: ptiscope adds a second
    /// vCPU if there is one only, boots with `nohz_full=` on the last vCPU
    /// and the init pins the loop there, so that no timer interrupt from
    /// user mode adds PTI's two CR3 writes to the calls'. `auto`: where
    /// the host counts every CR3 write (KVM with shadow paging).
    #[arg(
        long,
        value_enum,
        value_name = "WHEN",
        default_value_t,
        requires = "linux"
    )]
    pub tick_free: TickFree,
}

impl LinuxArgs {
    /// The guest kind these arguments choose; `arch` is `--arch` as given.
    pub fn guest_kind(&self, arch: Option<Arch>) -> GuestKind<LinuxRequest> {
        match &self.linux {
            None => GuestKind::Companion,
            Some(k) => GuestKind::Linux(LinuxRequest {
                kernel: k.clone(),
                append: self.append.clone().unwrap_or_default(),
                arch: arch.map(Arch::linux_arch),
                tick_free: self.tick_free,
            }),
        }
    }
}

impl RunArgs {
    /// `--arch`, or x86_64.
    pub fn arch(&self) -> Arch {
        self.arch.unwrap_or(Arch::X86_64)
    }
}

impl CompareArgs {
    /// `--arch`, or x86_64.
    pub fn arch(&self) -> Arch {
        self.target.arch()
    }
}

impl TargetOpts {
    /// `--arch`, or x86_64.
    pub fn arch(&self) -> Arch {
        self.arch.unwrap_or(Arch::X86_64)
    }
}

/// Guest flavour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Arch {
    /// 64-bit, 4-level paging.
    #[value(name = "x86_64")]
    X86_64,
    /// 32-bit, PAE paging (3G/1G).
    #[value(name = "i386")]
    I386,
}

impl Arch {
    /// The Linux architecture a `--linux` image of this flavour must have.
    pub fn linux_arch(self) -> LinuxArch {
        match self {
            Arch::X86_64 => LinuxArch::X86_64,
            Arch::I386 => LinuxArch::I386,
        }
    }
}

impl Arch {
    /// The embedded guest image of this flavour.
    pub fn embedded_image(self) -> &'static [u8] {
        match self {
            Arch::X86_64 => crate::GUEST_X86_64,
            Arch::I386 => crate::GUEST_I386,
        }
    }
}

/// `--backend` of the commands that take only `kvm` or `nested` (`probe`,
/// `pagetables`, `ledger` with `qemu` too): which of the VMM's hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// ptiscope's own VMM on /dev/kvm (host-observed and guest-reported figures).
    Kvm,
    /// QEMU TCG (`qemu-system-x86_64` / `qemu-system-i386`): the TCG plugin's
    /// `[qemu-plugin]` rows host-observed, the rest guest-reported.
    Qemu,
    /// ptiscope's VMM on a real KVM (kvm_amd, nested paging) inside QEMU TCG
    /// (docs/kvm-hosts.md): real KVM exits and semantics, emulated time.
    Nested,
}

impl Backend {
    /// Its registered name.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Kvm => "kvm",
            Backend::Qemu => "qemu",
            Backend::Nested => "nested",
        }
    }
}

/// `nested-serve` (hidden): the inner ptiscope of a `--backend nested`
/// session, started by the nested init; `nested::serve::serve` runs it.
#[derive(Debug, Clone, Args)]
pub struct NestedServeArgs {
    /// The port the session's messages come and go on.
    #[arg(long, default_value = "/dev/ttyS1")]
    pub tty: PathBuf,
    /// The outer QEMU's plugin's live file (an ivshmem device's memory).
    #[arg(long)]
    pub outer_plugin: Option<PathBuf>,
    /// The blob window the boot sources come through (an ivshmem device's memory).
    #[arg(long)]
    pub blob_window: Option<PathBuf>,
}

/// `ptiscope nested-batch [--cpus N] REQUEST.json`: runs a request's jobs
/// in one boot of `--backend nested` and prints the response as JSON (the
/// tests' batch; `nested::cli::batch` runs it).
#[derive(Debug, clap::Args)]
pub struct NestedBatchArgs {
    /// vCPUs of the inner Linux (what the inner guests need: 2 for a
    /// two-vCPU guest).
    #[arg(long, default_value_t = 2)]
    pub cpus: u32,
    /// The request (schema: `nested::Request`).
    pub request: std::path::PathBuf,
}

/// `ptiscope nested-exec [OPTIONS] EXE...`: runs executables of this host
/// (the KVM test binaries, `scripts/nested-kvm-tests.sh`) one after the
/// other inside one nested boot, on its real KVM, and prints what each
/// wrote. Each lies inside at its own absolute path, with the libraries
/// `ldd` names for it; `--place` puts further files at their own paths (the
/// `ptiscope` binary the tests were compiled to run).
#[derive(Debug, clap::Args)]
pub struct NestedExecArgs {
    /// vCPUs of the inner Linux (what the inner guests need: 2 for a
    /// two-vCPU guest).
    #[arg(long, default_value_t = 2)]
    pub cpus: u32,
    /// Memory of the inner Linux in MiB: the initramfs with every
    /// executable is unpacked into it.
    #[arg(long, default_value_t = 6144)]
    pub memory_mib: u32,
    /// Each executable's bound in seconds (the init stops it after that).
    #[arg(long, default_value_t = 900.0)]
    pub timeout: f64,
    /// A further file of this host placed at the same absolute path inside,
    /// executable (repeatable).
    #[arg(long)]
    pub place: Vec<std::path::PathBuf>,
    /// NAME=VALUE set for every executable (repeatable).
    #[arg(long)]
    pub env: Vec<String>,
    /// The executables' working directory inside (made there).
    #[arg(long)]
    pub cwd: Option<String>,
    /// An argument given to every executable (repeatable; `--arg=--nocapture`).
    #[arg(long = "arg", allow_hyphen_values = true)]
    pub args: Vec<String>,
    /// Writes the inner response (every job's status, output and time) as JSON here.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// The executables, each one job, in this order.
    #[arg(required = true)]
    pub exes: Vec<std::path::PathBuf>,
}
