//! The `ptiscope` command line (clap), turned into library calls.
//!
//! Size: the clap argument structs of the commands with their help texts
//! (the experiment commands' shared options are `args.rs`), and the value
//! parsers they share; about 130 lines are tests.

/// `eprintln!` for lines that carry text from the user, a file, QEMU or
/// the guest: every line escaped ([`exit_code::escape_message`]), so that
/// no terminal escape or control byte in that text reaches the terminal.
macro_rules! say {
    ($($t:tt)*) => {
        eprintln!("{}", $crate::cli::exit_code::escape_message(&format!($($t)*)))
    };
}

mod args;
mod command_error;
pub mod compare;
pub mod exit_code;
pub mod ledger;
pub mod linux;
pub mod measured_error;
pub mod pagetables;
mod partial;
pub mod pound;
pub mod probe;
pub mod reproduce;
pub mod run;
pub mod sweep;
pub mod timeout;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

pub use args::*;

use crate::machine::loader::KernelSource;
use crate::machine::memory::{MemoryError, MemoryLayout, DEFAULT_MEM_MIB, MIN_MEM_MIB};
use crate::output::SerialOut;
use crate::probe::host::HostFacts;
use crate::spec::cmdline::{CpuVuln, EntryChoice, GuestOptions};
use crate::spec::RunConfig;
use ptiscope_abi::options::{PtiMode, Switch, Workload};

const EXIT_CODES_HELP: &str = "\
Exit status of `ptiscope run`:
  0..63  the guest's exit status (0 success, 1 check failed, 2 CPU exception,
         3 panic, 4 bad command line, 5 expected fault not raised,
         6 unsupported on this CPU; statuses above 63 are reported as 63)
  64     bad usage or option value (--mem, --pti, --timeout below 1 ms,
         --cmdline too long, ...)
  65     kernel image is not a bootable PVH ELF (64- or 32-bit) for this
         memory size
  66     kernel image missing or unreadable
  69     /dev/kvm missing or not accessible, or this KVM cannot do what was
         asked (e.g. --cpu-vuln none where KVM refuses RDCL_NO)
  70     internal VMM error
  73     an output file (--serial-out, --json, --metrics-out) cannot be
         created or written (a FIFO no reader opened within --timeout, ENOSPC);
         a reader that stops reading costs dropped lines, reported, not 73
  80     guest triple fault (KVM_EXIT_SHUTDOWN); registers are printed
  81     KVM internal error, failed entry or unexpected exit
  124    --timeout fired
  129    SIGHUP, 130 SIGINT, 143 SIGTERM
  159    a VMM thread made a system call its seccomp filter refuses (a bug:
         rerun with --no-seccomp and report it)";

/// A small KVM VMM that boots its own PTI-capable guest and measures what
/// page table isolation costs.
#[derive(Debug, Parser)]
#[command(
    name = "ptiscope",
    version,
    about,
    long_about = None,
    after_help = "Without a command, runs the default comparison: `ptiscope compare` \
                  (pti=off vs pti=on, getpid, on the embedded guest)."
)]
pub struct Cli {
    /// The command; none runs the default comparison (the README's main job).
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Run the vCPU and metrics threads without their seccomp filters (for
    /// debugging: e.g. under a tracer, or to tell whether a failure is the
    /// filter's). See docs/running.md.
    #[arg(long, global = true)]
    pub no_seccomp: bool,
}

/// The `ptiscope` commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Boot the guest (the embedded one by default) with one configuration.
    #[command(after_help = EXIT_CODES_HELP)]
    Run(RunArgs),
    /// Run a baseline and a compare configuration, repeated and interleaved,
    /// and print what the compare side costs per call (`--mmtests`: the
    /// mmtests compare-kernels table).
    #[command(after_help = COMPARE_HELP)]
    Compare(CompareArgs),
    /// PTI's overhead over a grid of working sets and syscall rates (the
    /// TLB half of its cost), for several configurations against a baseline.
    #[command(after_help = SWEEP_HELP)]
    Sweep(sweep::SweepArgs),
    /// Report what this host's KVM can run, by booting tiny probe guests.
    Probe(ProbeArgs),
    /// Walk the guest's page tables from the host and check what the user
    /// copy maps: the host's own proof of isolation.
    Pagetables(PagetablesArgs),
    /// Real Linux kernels as guests: `ptiscope linux fetch` downloads Debian's
    /// amd64 and 686-pae kernels.
    #[command(subcommand)]
    Linux(LinuxCommand),
    /// One published PTI table (docs/seeds.md) measured here, beside the
    /// published figures, on the companion guest and the Linux kernels.
    Reproduce(reproduce::ReproduceArgs),
    /// What each of a Linux kernel's CPU-bug mitigations costs per system
    /// call, per CPU model, exactly (QEMU TCG; on a KVM in time and exits;
    /// docs/ledger.md).
    Ledger(ledger::LedgerArgs),
    /// `--backend nested`'s batch: many inner commands in one boot (tests).
    #[command(hide = true)]
    NestedBatch(NestedBatchArgs),
    /// Runs host executables (the KVM test binaries) inside one nested boot
    /// (scripts/nested-kvm-tests.sh).
    #[command(hide = true)]
    NestedExec(NestedExecArgs),
    /// The inner ptiscope of a `--backend nested` session (started by the
    /// nested init).
    #[command(hide = true)]
    NestedServe(NestedServeArgs),
}

/// `ptiscope linux ...`.
#[derive(Debug, Subcommand)]
pub enum LinuxCommand {
    /// Download Debian's current linux-image-cloud-amd64 and
    /// linux-image-686-pae (apt-get download) and unpack their kernel and
    /// config into the cache ($PTISCOPE_LINUX_CACHE, else
    /// $XDG_CACHE_HOME/ptiscope/linux, else ~/.cache/ptiscope/linux), where
    /// `--linux debian-amd64` and `--linux debian-686-pae` find them.
    Fetch(LinuxFetchArgs),
}

/// Options of `ptiscope linux fetch`.
#[derive(Debug, Args)]
pub struct LinuxFetchArgs {
    /// Fetch only this kernel (default: every one; a failure of one does
    /// not stop the others, and the exit code is then the first failure's).
    #[arg(long, value_name = "NAME", value_parser = ["debian-amd64", "debian-686-pae", "debian-6.12-amd64"])]
    pub only: Option<String>,
}

pub(crate) const COMPARE_HELP: &str = "\
Options for --baseline/--compare (comma-separated key=value):
  pti=on|off|auto  pcid=on|off  entry=auto|syscall|sysenter|int80|int3|int4
  workload=NAME  iterations=N  cpu_vuln=meltdown|none|host  mem=MiB  cmdline=TEXT
  pti_switch=asm|deferred  linux=KERNEL  append=TEXT (Linux command line)
  cpu=MODEL (QEMU's CPU model, --backend qemu)

Output: the header, then what the compare side cost per call (compare -
baseline, + = more with it: each figure's source, its difference with the 95 %
CI (Welch) and significance), then each metric's mean and 95 % CI per side.
--mmtests adds the mmtests compare-kernels table (Min/Amean/Stddev/CoeffVar/
Max/BAmean, negative % = worse; an Amean difference printed as `*  x.xx%*`
instead of `(  x.xx%)` exceeds both sides' qnorm(0.975) x stddev summed) and
the durations; --json and --csv always have every statistic. `--runs auto [--target-ci PCT] [--max-runs N]` adds interleaved run
pairs (at least 3 per side) until the main time metric's (ns_per_call; under QEMU
cycles_per_call) CI half-width is within PCT % of the mean on both sides, and says
which stop it took. `--against FILE.json` compares each side with the same side of
an earlier `--json` result and warns when the environments differ.

--fail-if COND (repeatable, or comma-separated): fails the command when COND holds.
  COND := metric[.stat][.field] OP number
        | symbol:NAME[.delta|.baseline|.compare] OP number (with --by-symbol: a kernel
          symbol's per-call instructions; default the difference; 0 where it never ran)
  stat  := min|amean|stddev|coeffvar|max|bamean50|bamean95|bamean99 (default amean)
  field := compare|baseline|delta|delta_pct|diff_pct (default compare)
           | welch_p | significant (about the means: no stat; significant is 1 or 0)
  OP    := > >= < <= == !=
  number:= a finite decimal number (2, -0.5, 1e3), one an f64 holds as written
  e.g. 'cr3_writes_per_call!=2'  'ns_per_call.delta_pct>50'  'cycles_per_call.coeffvar.baseline>2'
       'kernel_instructions_per_call.significant==1'  'ns_per_call.welch_p<0.01'
       'symbol:entry_SYSCALL_64>1,symbol:syscall_return_via_sysret>2' (both kinds mix in a list)

Exit status: 0 done and no --fail-if held; 1 a --fail-if condition held or could
not be evaluated; 64 bad usage (also a workload that measures nothing, and a
--fail-if metric the runs do not have, found after the first run); 73 an output
file (--json, --csv, --svg) cannot be created (checked before the first run) or
written; otherwise the exit status of the run that failed
(see `ptiscope run --help`).";

const SWEEP_HELP: &str = "\
Each cell is a working set (--wss) and a number of reads of it per system
call (--touches: Nx = N passes over it, or a count); wss=0 is one cell
without a working set. Every configuration runs --runs times per cell,
interleaved; the table has the median time per call of each, the baseline's
syscall rate, the overhead against the baseline, and the refill cost per page
(derived: the PTI delta at that working set minus the delta at wss=0, over the
pages touched per call; `hidden` where the probe finds that a guest CR3 write
costs user code no TLB refill on this host); then KVM's tlb_flush / pf_taken /
exits per call, and where the overhead crosses 1 % and 5 %.

Exit status: 0 done; 64 bad usage; 73 an output file cannot be written;
otherwise the exit status of the run that failed (see `ptiscope run --help`).";

/// Options of `ptiscope run`.
#[derive(Debug, Args)]
#[command(mut_arg("backend", |a| a.help("Where to run the guest: our VMM on KVM, or QEMU's TCG (software \
    emulation: slower; the TCG plugin's [qemu-plugin] rows are host-observed, the rest guest-reported) \
    for what this host's KVM cannot run")))]
pub struct RunArgs {
    /// Boot this PVH kernel instead of the embedded guest: an ELF64, or an
    /// ELF32 (a 32-bit guest such as i386), with a Xen PVH entry note.
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,
    /// Extra text appended to the guest command line.
    #[arg(long, value_name = "STR", default_value = "")]
    pub cmdline: String,
    /// Guest memory in MiB (16..=1024).
    #[arg(long, value_name = "MiB", default_value_t = DEFAULT_MEM_MIB, value_parser = parse_mem, allow_negative_numbers = true)]
    pub mem: u64,
    /// Stop the guest after this many seconds (fractions allowed; default
    /// 10, and with `--linux` one that fits the run: the backend's boot
    /// (KVM 30 s, QEMU 60 s, nested 120 s) plus the calls (0.1, 0.25, 2 ms
    /// each; x4 and 60 s more with --by-symbol), at least 60 s).
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = parse_timeout, allow_negative_numbers = true)]
    pub timeout: Duration,
    /// Write the guest console to FILE instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub serial_out: Option<PathBuf>,
    /// Page table isolation in the guest (guest default if absent).
    #[arg(long, value_parser = abi_option::<PtiMode>(PtiMode::NAMES.iter().copied()))]
    pub pti: Option<PtiMode>,
    /// PCID in the guest (guest default if absent).
    #[arg(long, value_parser = abi_option::<Switch>(Switch::NAMES.iter().copied()))]
    pub pcid: Option<Switch>,
    /// Syscall entry of the guest's user programs; `auto` picks what this host's KVM delivers.
    #[arg(long, default_value = "auto", value_parser = abi_option::<EntryChoice>(EntryChoice::names()))]
    pub entry: EntryChoice,
    /// Workload to run in the guest. Without it the guest only boots and
    /// nothing is measured per call; `--iterations N` alone runs getpid.
    #[arg(long, value_name = "NAME", value_parser = abi_option::<Workload>(Workload::NAMES.iter().copied()))]
    pub workload: Option<Workload>,
    /// Iterations of the workload's loop (alone, of getpid).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub iterations: Option<u64>,
    /// What the vCPU reports about Meltdown: `meltdown` clears ARCH_CAPABILITIES.RDCL_NO,
    /// `none` sets it, `host` leaves KVM's value.
    #[arg(long, value_enum, default_value = "host")]
    pub cpu_vuln: CpuVuln,
    /// Write the run summary as JSON (schema ptiscope.run/2) to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Also write the run's record (schema ptiscope.record/1): how it ended
    /// and its summary as its backend gave them, which `--backend replay`
    /// runs again (docs/backends.md).
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// Per-call kernel instructions by kernel symbol (--backend qemu with
    /// --linux: the plugin counts by address, the init sends the kernel's
    /// /proc/kallsyms); in --json as `by_symbol`.
    #[arg(long)]
    pub by_symbol: bool,
    /// Every MS milliseconds, write one JSON line of KVM-stat and guest-counter
    /// changes (schema ptiscope.metrics/1) while the guest runs.
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=3_600_000), allow_negative_numbers = true)]
    pub metrics_interval: Option<u64>,
    /// Where the --metrics-interval lines go (a file or FIFO; default stderr).
    #[arg(long, value_name = "FILE_OR_FIFO", requires = "metrics_interval")]
    pub metrics_out: Option<PathBuf>,
    /// Format of the --metrics-interval stream: JSON lines of changes, or one
    /// OpenMetrics (Prometheus) text exposition of cumulative counters per interval.
    #[arg(
        long,
        value_enum,
        default_value = "json",
        requires = "metrics_interval"
    )]
    pub metrics_format: crate::observe::live_metrics::MetricsFormat,
    /// Which embedded guest to boot: the x86_64 flavour (default) or the
    /// 32-bit PAE one (with `--kernel` the image decides; with `--linux` it
    /// must match the image).
    #[arg(long, value_enum, conflicts_with = "kernel")]
    pub arch: Option<Arch>,
    /// A Linux kernel as the guest.
    #[command(flatten)]
    pub linux: LinuxArgs,
    /// Don't create KVM's in-kernel irqchip: the guest runs with interrupts
    /// off and needs none; a HLT then stops the run ("halted") instead of
    /// waiting in KVM, and VM teardown is cheaper.
    #[arg(long)]
    pub no_irqchip: bool,
    /// vCPUs (1..=8, and at most what KVM recommends): one VMM thread per
    /// vCPU; the guest starts the others by INIT/SIPI.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = parse_cpus)]
    pub cpus: u32,
    /// The backend and its options (`--backend` with this command's help).
    #[command(flatten)]
    pub on: BackendOpts,
}

/// Options of `ptiscope pagetables`.
#[derive(Debug, Args)]
pub struct PagetablesArgs {
    /// Page table isolation in the guest (guest default if absent).
    #[arg(long, value_parser = abi_option::<PtiMode>(PtiMode::NAMES.iter().copied()))]
    pub pti: Option<PtiMode>,
    /// Which embedded guest (with `--kernel`, the image decides).
    #[arg(long, value_enum, default_value = "x86_64", conflicts_with = "kernel")]
    pub arch: Arch,
    /// Inspect this PVH kernel instead of the embedded guest (it must mark
    /// a phase and keep the telemetry page, as the ptiscope guest does).
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,
    /// Extra text appended to the guest command line (e.g. `pti_global_text=on`).
    #[arg(long, value_name = "STR", default_value = "")]
    pub cmdline: String,
    /// Guest memory in MiB.
    #[arg(long, value_name = "MiB", default_value_t = DEFAULT_MEM_MIB, value_parser = parse_mem, allow_negative_numbers = true)]
    pub mem: u64,
    /// Write the walk and the verdict as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// `kvm`: this host's KVM; `nested`: kvm_amd inside QEMU TCG.
    #[arg(long, value_enum, default_value = "kvm")]
    pub backend: Backend,
}

/// Options of `ptiscope probe`.
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// `kvm`: this host's KVM; `nested`: kvm_amd inside QEMU TCG.
    #[arg(long, value_enum, default_value = "kvm")]
    pub backend: Backend,
}

/// The process's host facts ([`HostFacts`]): gathered once, here at the
/// top, and handed down by the commands to preflight, the KVM backend and
/// the environment block, which keep none of their own.
pub fn host_facts() -> Arc<HostFacts> {
    static FACTS: OnceLock<Arc<HostFacts>> = OnceLock::new();
    FACTS.get_or_init(|| Arc::new(HostFacts::read())).clone()
}

/// The facts of the KVM `backend` runs `config` on, for preflight and the
/// reports: the backend's own (`nested`'s inner kvm_amd, which starts its
/// session), else this host's.
pub fn facts_for(
    backend: &dyn crate::backend::Backend,
    config: &crate::spec::RunConfig,
) -> Result<Arc<HostFacts>, crate::backend::BackendError> {
    backend.facts(config).unwrap_or_else(|| Ok(host_facts()))
}

/// How a report of a KVM-only command (`probe`, `pagetables`) names its
/// backend in its environment: `kvm`, and what a time is on this KVM.
pub fn kvm_identity() -> crate::backend::BackendIdentity {
    crate::backend::identity(&crate::backend::Kvm::new(host_facts()))
}

/// Reads, on a thread of its own, the host facts a measuring command needs
/// before and after its first boot: KVM's supported CPUID table (the first
/// boot's vCPU needs it), the probe cache's key and file (~40 sysfs files;
/// a default `run` needs them only for its report, after its guest), and
/// the environment block's CPU and vulnerability facts. `main` starts it
/// before parsing the arguments, so the reads overlap the parsing, the
/// image read, the VM's set-up and the guest instead of adding ~1 ms to a
/// 14 ms run; whoever needs a fact first waits for it (each is behind a
/// lock or a `OnceLock`). It runs unconfined by seccomp and ends once they
/// are read.
pub fn warm_host_facts() {
    let facts = host_facts();
    let _ = facts.supported_cpuid();
    facts.warm();
    crate::report::environment::warm_host();
}

/// `ptiscope compare`: poundsyscall's table per thread count when the sides
/// ask for several (`threads=1,2,4`), else the comparison. Chosen here,
/// above both commands, because the table reuses compare's side parsing.
pub fn compare_command(args: &CompareArgs) -> i32 {
    if pound::wants_sweep(args) {
        if args.by_symbol {
            say!(
                "ptiscope compare: error: --by-symbol compares two sides; poundsyscall's \
                 thread-count table (threads=) has none: drop --by-symbol or threads="
            );
            return exit_code::USAGE;
        }
        pound::run(args)
    } else {
        compare::run(args)
    }
}

/// `--mem`: a number of MiB within the bounds, with messages naming them.
pub fn parse_mem(s: &str) -> Result<u64, String> {
    let mib: u64 = match s.trim().parse::<i128>() {
        // A negative size gets the bound, like any other out-of-range one.
        Ok(n) if n < 0 => {
            return Err(format!(
                "--mem {n} MiB is negative: at least {MIN_MEM_MIB} MiB are needed"
            ))
        }
        Ok(n) => u64::try_from(n).map_err(|_| MemoryError::TooLarge(u64::MAX).to_string())?,
        Err(_) => return Err(format!("{s:?} is not a number of MiB")),
    };
    MemoryLayout::new(mib).map_err(|e| e.to_string())?;
    Ok(mib)
}

/// Shortest `--timeout`: below a millisecond the watchdog's own latency
/// (tens to hundreds of µs to stop a vCPU) is the whole run, and such a
/// value is almost certainly a typo. Refused rather than rounded.
pub const MIN_TIMEOUT: Duration = Duration::from_millis(1);
/// Longest `--timeout`: a day.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(86_400);

/// `--timeout`: seconds in [1 ms, 1 day], fractions allowed.
pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(secs >= MIN_TIMEOUT.as_secs_f64() && secs <= MAX_TIMEOUT.as_secs_f64()) {
        return Err(format!(
            "{s}: the timeout must be from 0.001 (1 ms) to 86400 seconds"
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// `--cpus`: 1..=the telemetry ABI's CPU blocks (KVM's own limit is checked
/// by preflight).
pub fn parse_cpus(s: &str) -> Result<u32, String> {
    let max = ptiscope_abi::telemetry::MAX_CPUS as u32;
    match s.parse::<u32>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!(
            "{s}: the number of vCPUs must be 1..={max} (the guest's telemetry page has {max} CPU blocks)"
        )),
    }
}

impl RunArgs {
    /// Options that only one backend understands, given to the other (a
    /// usage error rather than silently ignored), or that its backend
    /// refuses (a `--qemu-arg` setting what ptiscope sets).
    pub fn backend_mismatch(&self) -> Option<String> {
        // In the order they are checked (the first refused is named): this
        // command's KVM options, then the registered backends' own.
        let mut given = args::given(&[
            ("--metrics-interval", self.metrics_interval.is_some()),
            ("--cpu-vuln", self.cpu_vuln != CpuVuln::Host),
            ("--no-irqchip", self.no_irqchip),
        ]);
        given.extend(self.on.options.given());
        self.on.refusal(&crate::backend::Requested {
            given,
            qemu_args: self.on.qemu().qemu_arg,
            cpus: self.cpus,
        })
    }

    /// `--workload`, or, when only a count was given (`--iterations N`,
    /// no `--workload` and no `workload=` in `--cmdline`), the default
    /// workload getpid: N iterations of nothing would measure nothing.
    pub fn implied_workload(&self) -> Option<Workload> {
        let named_in_cmdline = self
            .cmdline
            .split_ascii_whitespace()
            .any(|w| w.starts_with("workload="));
        match self.workload {
            None if self.iterations.is_some() && !named_in_cmdline => Some(Workload::Getpid),
            w => w,
        }
    }

    /// The library configuration for these arguments.
    pub fn to_config(&self, embedded: &'static [u8]) -> RunConfig {
        let kernel = match &self.kernel {
            Some(p) => KernelSource::Path(p.clone()),
            None => KernelSource::Embedded(embedded),
        };
        RunConfig {
            kernel,
            mem_mib: self.mem,
            guest: GuestOptions {
                pti: self.pti,
                pcid: self.pcid,
                entry: self.entry,
                workload: self.implied_workload(),
                iterations: self.iterations,
                extra: self.cmdline.clone(),
            },
            timeout: self.timeout,
            serial_out: match &self.serial_out {
                Some(p) => SerialOut::File(p.clone()),
                None => SerialOut::Stdout,
            },
            cpu_vuln: self.cpu_vuln,
            console_input: true,
            handle_signals: true,
            qemu_args: self.on.qemu().qemu_arg,
            qemu_cpu: None,
            qemu_plugin: !self.on.qemu().no_plugin,
            irqchip: !self.no_irqchip,
            cpus: self.cpus,
            guest_kind: self.linux.guest_kind(self.arch),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn compare_sides_take_a_kernel_a_command_line_and_a_cpu_model() {
        let sides = |args: &[&str]| {
            let cli = Cli::try_parse_from([&["ptiscope", "compare"][..], args].concat()).unwrap();
            let Some(Command::Compare(a)) = cli.command else {
                panic!("not compare")
            };
            crate::cli::compare::parse_sides(&a).map_err(|e| e.to_string())
        };
        let linux = |c: &RunConfig| match &c.guest_kind {
            crate::spec::guest::GuestKind::Linux(r) => (r.kernel.clone(), r.append.clone()),
            crate::spec::guest::GuestKind::Companion => panic!("not a Linux side"),
        };
        let (b, c) = sides(&[
            "--backend",
            "qemu",
            "--baseline",
            "linux=debian-amd64",
            "--compare",
            "append=pti=on nosmt,linux=/k/bzImage,cpu=Skylake-Client-v4",
        ])
        .unwrap();
        assert_eq!(linux(&b.config), ("debian-amd64".into(), String::new()));
        // `pti=` in append= is the side's pti=; other words stay Linux's,
        // even when linux= comes after them.
        assert_eq!(linux(&c.config), ("/k/bzImage".into(), "nosmt".into()));
        assert_eq!(c.config.guest.pti, Some(PtiMode::On));
        assert_eq!(c.config.qemu_cpu.as_deref(), Some("Skylake-Client-v4"));
        assert_eq!(b.config.qemu_cpu, None);
        // --linux and --append give both sides a kernel; a side adds to them.
        let (b, c) = sides(&[
            "--backend",
            "qemu",
            "--linux",
            "debian-686-pae",
            "--append",
            "quiet",
            "--compare",
            "append=mitigations=off",
        ])
        .unwrap();
        assert_eq!(linux(&b.config), ("debian-686-pae".into(), "quiet".into()));
        assert_eq!(
            linux(&c.config),
            ("debian-686-pae".into(), "quiet mitigations=off".into())
        );
        // Refused, each naming why: append= without a Linux guest, cpu=
        // off QEMU, a model name that is not one, an empty linux=.
        for (args, why) in [
            (
                &["--backend", "qemu", "--compare", "append=nosmt"][..],
                "Linux kernel command line",
            ),
            (&["--compare", "cpu=max"], "needs --backend qemu"),
            (
                &["--backend", "qemu", "--compare", "cpu=max;rm"],
                "not a CPU model name",
            ),
            (
                &["--backend", "qemu", "--compare", "linux="],
                "names no kernel",
            ),
            (&["--compare", "append="], "is empty"),
            (
                &["--backend", "qemu", "--compare", "cpu_vuln=meltdown"],
                "cpu_vuln= sets what the KVM vCPU reports: not with --backend qemu",
            ),
            (&["--compare", "pti=on,cmdline= "], "is empty"),
            (
                &[
                    "--linux",
                    "debian-amd64",
                    "--compare",
                    "pti=off,append=\"pti=on\"",
                ],
                "given twice with different values",
            ),
        ] {
            let e = sides(args).unwrap_err();
            assert!(e.contains(why), "{args:?}: {e}");
        }
    }

    #[test]
    fn iterations_alone_imply_getpid() {
        let workload = |args: &[&str]| {
            let cli = Cli::try_parse_from([&["ptiscope", "run"][..], args].concat()).unwrap();
            let Some(Command::Run(a)) = cli.command else {
                panic!("not run")
            };
            a.to_config(crate::GUEST_X86_64).guest.workload
        };
        assert_eq!(workload(&["--iterations", "2000"]), Some(Workload::Getpid));
        assert_eq!(workload(&[]), None, "a plain run only boots");
        assert_eq!(
            workload(&["--iterations", "9", "--workload", "getppid"]),
            Some(Workload::Getppid)
        );
        // A workload named on the guest command line is not overridden.
        assert_eq!(
            workload(&["--iterations", "9", "--cmdline", "workload=write-badfd"]),
            None
        );
    }

    #[test]
    fn run_options_reach_the_config() {
        let cli = Cli::try_parse_from([
            "ptiscope",
            "run",
            "--pti",
            "on",
            "--entry",
            "int3",
            "--mem",
            "64",
            "--timeout",
            "0.5",
            "--cmdline",
            "fault=pf",
            "--cpu-vuln",
            "meltdown",
        ])
        .unwrap();
        let Some(Command::Run(args)) = cli.command else {
            panic!("not run")
        };
        let c = args.to_config(b"");
        assert_eq!(c.mem_mib, 64);
        assert_eq!(c.timeout, Duration::from_millis(500));
        assert_eq!(c.guest.pti, Some(PtiMode::On));
        assert_eq!(
            c.guest.entry,
            crate::spec::cmdline::EntryChoice::Fixed(ptiscope_abi::options::Entry::Int3)
        );
        assert_eq!(c.guest.extra, "fault=pf");
        assert_eq!(c.cpu_vuln, CpuVuln::Meltdown);
    }

    #[test]
    fn runs_and_target_ci() {
        assert_eq!(parse_runs("auto"), Ok(Runs::Auto));
        assert_eq!(parse_runs(" 7 "), Ok(Runs::Fixed(7)));
        for bad in ["0", "1001", "-1", "many", ""] {
            assert!(parse_runs(bad).unwrap_err().contains("or `auto`"), "{bad}");
        }
        assert_eq!(parse_target_ci("1"), Ok(1.0));
        assert_eq!(parse_target_ci("2.5%"), Ok(2.5));
        for bad in ["0", "-1", "101", "NaN", "x"] {
            assert!(parse_target_ci(bad).is_err(), "{bad}");
        }
        let cli = Cli::try_parse_from(["ptiscope", "compare", "--runs", "auto", "--warmup", "2"])
            .unwrap();
        let Some(Command::Compare(args)) = cli.command else {
            panic!("not compare")
        };
        assert_eq!((args.runs, args.warmup), (Runs::Auto, 2));
        assert_eq!((args.max_runs, args.target_ci), (None, None));
        let cli = Cli::try_parse_from(["ptiscope", "compare"]).unwrap();
        let Some(Command::Compare(args)) = cli.command else {
            panic!("not compare")
        };
        assert_eq!(args.runs, Runs::Fixed(DEFAULT_COMPARE_RUNS));
    }

    #[test]
    fn compare_and_sweep_share_their_options_with_their_own_defaults() {
        let Some(Command::Compare(c)) = Cli::try_parse_from(["ptiscope", "compare"])
            .unwrap()
            .command
        else {
            panic!("not compare")
        };
        let Some(Command::Sweep(s)) = Cli::try_parse_from(["ptiscope", "sweep"]).unwrap().command
        else {
            panic!("not sweep")
        };
        assert_eq!(c.exp.iterations, DEFAULT_COMPARE_ITERATIONS);
        assert_eq!(s.exp.iterations, sweep::DEFAULT_SWEEP_ITERATIONS);
        assert_eq!((c.exp.mem, s.exp.mem), (DEFAULT_MEM_MIB, DEFAULT_MEM_MIB));
        // compare takes a negative count to its parser (a message naming
        // the value); sweep, as before, sees an unknown argument.
        for (cmd, ok) in [("compare", true), ("sweep", false)] {
            let e = Cli::try_parse_from(["ptiscope", cmd, "--mem", "-1"]).unwrap_err();
            assert_eq!(e.to_string().contains("at least 16 MiB"), ok, "{cmd}: {e}");
        }
    }

    #[test]
    fn bad_values_are_rejected_with_their_bound() {
        for (args, needle) in [
            (&["--pti", "maybe"][..], "possible values: on, off, auto"),
            (&["--mem", "abc"][..], "not a number of MiB"),
            (&["--mem", "8"][..], "at least 16 MiB"),
            (&["--mem", "4096"][..], "at most 1024 MiB"),
            (&["--entry", "int81"][..], "possible values"),
            (&["--timeout", "0"][..], "timeout must be"),
            (&["--timeout", "1e-9"][..], "from 0.001 (1 ms)"),
            (&["--timeout", "NaN"][..], "timeout must be"),
            (&["--mem", "-1"][..], "at least 16 MiB"),
        ] {
            let mut v = vec!["ptiscope", "run"];
            v.extend_from_slice(args);
            let e = Cli::try_parse_from(v).unwrap_err().to_string();
            assert!(e.contains(needle), "{args:?}: {e}");
        }
    }
}
