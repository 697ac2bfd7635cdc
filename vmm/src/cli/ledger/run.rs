//! The ledger's boots: the refusals before any boot (unknown CPU models,
//! kernels not fetched, workloads that are no system-call loop), the jobs
//! of every block, run `--jobs` at a time, and the blocks assembled.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::model::{Block, FailedBlock, Measure, Row, Sum};
use super::plan::{self, RowPlan, ALL_OFF};
use super::pool::pool;
use super::render::{self, Ledger};
use super::{LedgerArgs, DEFAULT_CPUS, KVM_CPU};
use crate::cli::exit_code;
use crate::cli::{ExperimentOpts, LinuxArgs, TargetOpts};
use crate::spec::ResolvedRun;
use ptiscope_abi::options::Workload;

/// Why the ledger could not run (before or after its boots).
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// A bad option value.
    #[error("{0}")]
    Usage(String),
    /// A CPU model QEMU does not offer.
    #[error(
        "--cpu {model}: QEMU offers no such CPU model; `qemu-system-x86_64 -cpu help` offers: {offered}"
    )]
    UnknownCpu {
        /// The model given.
        model: String,
        /// The models QEMU lists.
        offered: String,
    },
    /// QEMU's model list could not be read.
    #[error("cannot list QEMU's CPU models (`qemu-system-x86_64 -cpu help`): {0}; install QEMU (qemu-system-x86)")]
    NoQemu(String),
    /// An output file cannot be created.
    #[error(transparent)]
    Output(#[from] crate::output::OpenError),
    /// A boot could not be set up (a kernel not fetched, an unreadable image).
    #[error("{what}: {why}")]
    Setup {
        /// Which block.
        what: String,
        /// Why.
        why: String,
    },
    /// An output file could not be written.
    #[error("{0}")]
    Write(String),
    /// The backend could not be built.
    #[error(transparent)]
    Backend(#[from] crate::backend::BackendError),
    /// The KVM backend cannot run these kernels on this host.
    #[error("--backend kvm: {0} (or `ptiscope ledger --backend nested`: the ledger on a real kvm_amd inside QEMU TCG)")]
    KvmRefuses(String),
}

impl LedgerError {
    fn exit_code(&self) -> i32 {
        match self {
            LedgerError::Usage(_) | LedgerError::UnknownCpu { .. } => exit_code::USAGE,
            LedgerError::NoQemu(_) | LedgerError::KvmRefuses(_) => exit_code::KVM_UNAVAILABLE,
            LedgerError::Output(_) | LedgerError::Write(_) => exit_code::CANT_CREATE,
            LedgerError::Setup { .. } => exit_code::NO_IMAGE,
            LedgerError::Backend(e) => exit_code::ExitCode::exit_code(e),
        }
    }
}

/// `ptiscope ledger`; returns the exit code: 0 every block and row
/// measured, 1 some boot failed (the rest reported), else the error's.
pub fn run(args: &LedgerArgs) -> i32 {
    match ledger(args) {
        Ok(code) => code,
        Err(e) => {
            say!("ptiscope ledger: error: {e}");
            e.exit_code()
        }
    }
}

/// The models `qemu-system-x86_64 -cpu help` lists (the QEMU backend's
/// reader, for every QEMU version's format).
fn qemu_cpu_models() -> Result<Vec<String>, LedgerError> {
    crate::backend::qemu::cpu_models("qemu-system-x86_64")
        .map_err(|e| LedgerError::NoQemu(e.to_string()))
}

/// One boot of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Default,
    /// A second default boot, for a workload that is not exact: the
    /// boot-to-boot spread its rows are read against.
    Repeat,
    AllOff,
    Row(usize),
}

struct Job {
    block: usize,
    kind: Kind,
    /// The parameters it adds (for the progress line).
    append: String,
    run: ResolvedRun,
}

/// One block's setting.
struct Setting {
    kernel: String,
    cpu: String,
    workload: Workload,
}

impl Setting {
    fn name(&self) -> String {
        format!("{} {} {}", self.kernel, self.cpu, self.workload.name())
    }
}

/// The kernels `--linux` names, else every known one in the cache.
fn kernels(args: &LedgerArgs) -> Result<Vec<String>, LedgerError> {
    if !args.linux.is_empty() {
        return Ok(args.linux.clone());
    }
    let fetched: Vec<String> = crate::preflight::linux::fetch::KNOWN
        .iter()
        .filter(|k| {
            crate::preflight::linux::known_path(k.name)
                .and_then(Result::ok)
                .is_some_and(|p| p.exists())
        })
        .map(|k| k.name.to_owned())
        .collect();
    if fetched.is_empty() {
        return Err(LedgerError::Usage(
            "no kernel: give --linux KERNEL, or fetch Debian's with `ptiscope linux fetch`".into(),
        ));
    }
    Ok(fetched)
}

fn workloads(args: &LedgerArgs) -> Result<Vec<Workload>, LedgerError> {
    if args.workload.is_empty() {
        return Ok(super::DEFAULT_WORKLOADS.to_vec());
    }
    args.workload
        .iter()
        .map(|w| {
            let loops = Workload::NAMES
                .iter()
                .filter(|n| n.parse::<Workload>().is_ok_and(Workload::is_syscall_loop))
                .copied()
                .collect::<Vec<_>>()
                .join(", ");
            match w.parse::<Workload>() {
                Ok(x) if x.is_syscall_loop() || x == Workload::SchedMessaging => Ok(x),
                _ => Err(LedgerError::Usage(format!(
                    "--workload {w:?}: the ledger measures a system-call loop ({loops}) \
                     or the context-switching sched-messaging"
                ))),
            }
        })
        .collect()
}

/// Why a boot could not be set up.
enum SettleError {
    /// The host's KVM refuses this Linux run (kvm_pvm: no user SYSCALL,
    /// CPL0 instructions it lacks): a backend to change, not bad input.
    KvmRefuses(String),
    Other(String),
}

impl SettleError {
    fn into_ledger(self, s: &Setting) -> LedgerError {
        match self {
            SettleError::KvmRefuses(why) => LedgerError::KvmRefuses(why),
            SettleError::Other(why) => LedgerError::Setup {
                what: s.name(),
                why,
            },
        }
    }
}

/// The settled run of one boot: `append` to the kernel command line.
fn settle(
    s: &Setting,
    append: &str,
    args: &LedgerArgs,
    backend: &dyn crate::backend::Backend,
) -> Result<ResolvedRun, SettleError> {
    let on_kvm = args.backend != crate::cli::Backend::Qemu;
    let exp = ExperimentOpts {
        workload: s.workload,
        iterations: args.iterations,
        cpus: 1,
        kernel: None,
        mem: crate::machine::memory::DEFAULT_MEM_MIB,
        timeout: args.timeout,
    };
    let target = TargetOpts {
        arch: None,
        linux: LinuxArgs::default(),
        on: crate::cli::BackendOpts::on(args.backend.name()),
    };
    let mut opts = format!("linux={}", s.kernel);
    if !on_kvm {
        opts.push_str(&format!(",cpu={}", s.cpu));
    }
    if !append.is_empty() {
        opts.push_str(&format!(",append={append}"));
    }
    // perf bench's `-p`: the messages over pipes, the classic
    // context-switch benchmark (a socket pair adds the socket layer).
    if s.workload == Workload::SchedMessaging {
        opts.push_str(",cmdline=ipc=pipe");
    }
    let spec = crate::cli::compare::parse_side(&opts, &exp, &target, crate::GUEST_X86_64)
        .map_err(|e| SettleError::Other(e.to_string()))?;
    // The facts of the KVM the backend runs on (nested: its inner one).
    let facts = crate::cli::facts_for(backend, &spec.config)
        .map_err(|e| SettleError::Other(e.to_string()))?;
    let mut run =
        crate::preflight::preflight(&spec.config, backend.target(), &facts).map_err(|e| {
            if on_kvm && e.host_kvm_refuses() {
                SettleError::KvmRefuses(e.to_string())
            } else {
                SettleError::Other(e.to_string())
            }
        })?;
    // The init sends the kernel's symbols, the plugin counts by address.
    // Not on a KVM: nothing counts by address there, and the init's 2 MB
    // of symbols through a port would be 2 million exits (minutes under
    // --backend nested).
    if !on_kvm {
        run.boot.cmdline = format!("{} {}", run.boot.cmdline, crate::linux::SYMBOLS_WORD);
    }
    Ok(run)
}

/// One boot's figures on `backend`.
fn measure_job(
    backend: &dyn crate::backend::Backend,
    job: &Job,
    on: crate::cli::Backend,
) -> Result<Measure, String> {
    crate::cli::compare::run_measured(&job.run, backend)
        .map_err(|e| e.to_string())
        .and_then(|(_, s)| {
            if on != crate::cli::Backend::Qemu {
                return Measure::of_kvm(&s);
            }
            let per_message = job.run.guest.workload == Some(Workload::SchedMessaging);
            Measure::of(&s, per_message)
        })
}

fn ledger(args: &LedgerArgs) -> Result<i32, LedgerError> {
    let kernels = kernels(args)?;
    if let Some(bad) = args
        .mitigation
        .iter()
        .find(|k| !plan::MITIGATIONS.iter().any(|m| m.key == k.as_str()))
    {
        return Err(LedgerError::Usage(format!(
            "--mitigation {bad:?}: not a row of the ledger (rows: {})",
            plan::MITIGATIONS
                .iter()
                .map(|m| m.key)
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let workloads = workloads(args)?;
    let on_kvm = args.backend != crate::cli::Backend::Qemu;
    if on_kvm && !args.cpu.is_empty() {
        return Err(LedgerError::Usage(
            "--cpu is QEMU TCG's CPU model: on --backend kvm (and nested) the guest runs on \
             the KVM's CPU; drop --cpu, or use --backend qemu"
                .into(),
        ));
    }
    let cpus: Vec<String> = if on_kvm {
        vec![KVM_CPU.to_owned()]
    } else if args.cpu.is_empty() {
        DEFAULT_CPUS.iter().map(|c| (*c).to_owned()).collect()
    } else {
        args.cpu.clone()
    };
    // Every model checked before anything boots.
    if !on_kvm {
        let offered = qemu_cpu_models()?;
        if let Some(bad) = cpus.iter().find(|c| !offered.contains(c)) {
            return Err(LedgerError::UnknownCpu {
                model: bad.clone(),
                offered: offered.join(" "),
            });
        }
    }
    let [json, csv, svg] = args.out.open(args.timeout)?;
    let mut settings = Vec::new();
    for k in &kernels {
        for c in &cpus {
            for w in &workloads {
                settings.push(Setting {
                    kernel: k.clone(),
                    cpu: c.clone(),
                    workload: *w,
                });
            }
        }
    }
    // One QEMU per host CPU: TCG runs a single-vCPU guest on one thread.
    // On a KVM a Linux boot takes two vCPUs (the loop's tick-free one and
    // the rest): one boot at a time.
    let jobs = args.jobs.unwrap_or_else(|| {
        if on_kvm {
            1
        } else {
            std::thread::available_parallelism().map_or(2, |n| n.get().min(16) as u32)
        }
    });
    let on = args.backend;
    // The backend the runs are settled with, and (one boot at a time on a
    // KVM) run on: built once, so that a nested one boots one session.
    let shared = crate::cli::BackendOpts::on(on.name()).backend()?;
    let started = Instant::now();
    let boots_done = AtomicUsize::new(0);
    let quiet = args.quiet;
    let progress = |job: &Job, r: &Result<Measure, String>, took: Duration, s: &[Setting]| {
        let n = boots_done.fetch_add(1, Ordering::Relaxed) + 1;
        if quiet {
            return;
        }
        let what = match job.kind {
            Kind::Default => "default".to_owned(),
            Kind::Repeat => "default again (boot-to-boot spread)".to_owned(),
            _ => job.append.clone(),
        };
        let result = match r {
            Ok(m) => format!(
                "{:.2} {}/call",
                m.per_call(),
                match m.figure {
                    super::model::Figure::KernelInstructions => "kernel instructions",
                    super::model::Figure::HostNs => "host-clock ns",
                }
            ),
            Err(e) => format!("FAILED: {}", e.lines().next().unwrap_or("")),
        };
        say!(
            "ledger: boot {n} [{:>5.0} s] {}: {what}: {result} ({:.1} s)",
            started.elapsed().as_secs_f64(),
            s[job.block].name(),
            took.as_secs_f64()
        );
    };
    // Stage 1: every block's default and all-off boots (and a second
    // default boot where the counts are not exact).
    let mut first = Vec::new();
    for (b, s) in settings.iter().enumerate() {
        let repeat = (on_kvm || !s.workload.is_syscall_loop()).then_some((Kind::Repeat, ""));
        for (kind, append) in [(Kind::Default, ""), (Kind::AllOff, ALL_OFF)]
            .into_iter()
            .chain(repeat)
        {
            let run = settle(s, append, args, &*shared).map_err(|e| e.into_ledger(s))?;
            first.push(Job {
                block: b,
                kind,
                append: append.to_owned(),
                run,
            });
        }
    }
    if !quiet {
        say!(
            "ptiscope ledger: {} block(s) (kernel x CPU model x workload), {} calls per boot, {} boots at a time; \
             first the default and {ALL_OFF} boots ({}), then one per enabled mitigation",
            settings.len(),
            args.iterations,
            jobs,
            first.len()
        );
    }
    let workers = jobs as usize;
    let measure = |b: &dyn crate::backend::Backend, j: &Job| measure_job(b, j, on);
    let stage1 = pool(&first, workers, on, &*shared, &measure, &|j, r, t| {
        progress(j, r, t, &settings)
    });
    // Stage 2: one boot per enabled mitigation of every block whose
    // default boot ran.
    let mut defaults: Vec<Option<Result<Measure, String>>> =
        settings.iter().map(|_| None).collect();
    let mut all_off: Vec<Option<Result<Measure, String>>> = settings.iter().map(|_| None).collect();
    let mut repeats: Vec<Option<Result<Measure, String>>> = settings.iter().map(|_| None).collect();
    let mut seconds = vec![0.0f64; settings.len()];
    for (job, (r, took)) in first.iter().zip(stage1) {
        seconds[job.block] += took.as_secs_f64();
        match job.kind {
            Kind::Default => defaults[job.block] = Some(r),
            Kind::Repeat => repeats[job.block] = Some(r),
            _ => all_off[job.block] = Some(r),
        }
    }
    let mut plans = Vec::new();
    let mut second = Vec::new();
    for (b, s) in settings.iter().enumerate() {
        let p = match &defaults[b] {
            Some(Ok(m)) => match &m.mitigations {
                Some(g) => plan::plan(g),
                None => Vec::new(),
            },
            _ => Vec::new(),
        };
        for (i, row) in p.iter().enumerate() {
            let asked = args.mitigation.is_empty()
                || args.mitigation.iter().any(|k| k == row.mitigation.key);
            if row.plan == RowPlan::Measure && asked {
                let run =
                    settle(s, row.mitigation.off, args, &*shared).map_err(|e| e.into_ledger(s))?;
                second.push(Job {
                    block: b,
                    kind: Kind::Row(i),
                    append: row.mitigation.off.to_owned(),
                    run,
                });
            }
        }
        plans.push(p);
    }
    if !quiet {
        say!(
            "ptiscope ledger: {} boot(s) with one mitigation off",
            second.len()
        );
    }
    let stage2 = pool(&second, workers, on, &*shared, &measure, &|j, r, t| {
        progress(j, r, t, &settings)
    });
    let mut offs: Vec<Vec<Option<Result<Measure, String>>>> = plans
        .iter()
        .map(|p| p.iter().map(|_| None).collect())
        .collect();
    for (job, (r, took)) in second.iter().zip(stage2) {
        seconds[job.block] += took.as_secs_f64();
        if let Kind::Row(i) = job.kind {
            offs[job.block][i] = Some(r);
        }
    }
    let mut blocks = Vec::new();
    let mut failed = Vec::new();
    for (b, s) in settings.iter().enumerate() {
        let default = match defaults[b].take() {
            Some(Ok(m)) => m,
            other => {
                failed.push(FailedBlock {
                    kernel: s.kernel.clone(),
                    cpu: s.cpu.clone(),
                    workload: s.workload.name().to_owned(),
                    error: match other {
                        Some(Err(e)) => e,
                        _ => "not run".into(),
                    },
                });
                continue;
            }
        };
        let rows: Vec<Row> = plans[b]
            .iter()
            .zip(offs[b].drain(..))
            .map(|(p, off)| Row::new(p, &default, off))
            .collect();
        let all_off = all_off[b].take().unwrap_or_else(|| Err("not run".into()));
        let sum = all_off
            .as_ref()
            .ok()
            .map(|off| Sum::of(&rows, default.per_call() - off.per_call()));
        let uncovered = default
            .mitigations
            .as_ref()
            .map(plan::uncovered)
            .unwrap_or_default();
        let release = first
            .iter()
            .find(|j| j.block == b)
            .and_then(|j| j.run.guest_kind.linux())
            .and_then(|l| l.version.as_deref())
            .and_then(|v| v.split_whitespace().next())
            .map(str::to_owned);
        let noise = repeats[b]
            .take()
            .map(|r| r.map(|again| (default.per_call() - again.per_call()).abs()));
        blocks.push(Block {
            kernel: s.kernel.clone(),
            release,
            cpu: s.cpu.clone(),
            workload: s.workload.name().to_owned(),
            default,
            all_off,
            rows,
            sum,
            uncovered,
            noise,
            kvm: on_kvm
                .then(|| shared.profile().header_line.map(str::to_owned))
                .flatten(),
            boot_seconds: seconds[b],
        });
    }
    let ledger = Ledger {
        schema: "ptiscope.ledger/1",
        iterations: args.iterations,
        wall_seconds: started.elapsed().as_secs_f64(),
        blocks,
        failed,
    };
    print!("{}", render::text(&ledger));
    for (file, body) in [
        (json.as_ref(), render::json(&ledger)),
        (csv.as_ref(), render::csv(&ledger)),
        (svg.as_ref(), super::svg::svg(&ledger)),
    ] {
        if let Some(f) = file {
            f.write_document(&body).map_err(|e| {
                LedgerError::Write(format!("{} {}: {e}", f.what(), f.path().display()))
            })?;
        }
    }
    // A row not measured because --mitigation named others is no failure.
    let any_failed = !ledger.failed.is_empty()
        || ledger.blocks.iter().any(|b| {
            b.all_off.is_err()
                || b.rows
                    .iter()
                    .any(|r| matches!(r.outcome, super::model::RowOutcome::Failed { .. }))
        });
    Ok(if any_failed { exit_code::FAILED } else { 0 })
}
