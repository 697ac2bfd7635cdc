//! `ptiscope-bench`: benchmarks that run the `ptiscope` binary (and peers such
//! as QEMU) side by side, interleaved, in one run, and report medians and
//! ratios. Absolute times on a shared, noisy machine mean little; ratios
//! measured in the same run do.
//!
//! Usage: `cargo build --release && cargo run --release -p ptiscope-benchmarks -- boot`.

mod boot;
mod compare;
mod flavours;
mod ledger;
mod linux;
mod linux_nested;
mod measure;
mod nested;
mod plugin;
mod syscall;
mod telemetry;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(about = "ptiscope benchmarks: side-by-side medians and ratios")]
struct Cli {
    /// The ptiscope binary to measure (default: target/release/ptiscope of this workspace).
    #[arg(long, global = true)]
    ptiscope: Option<PathBuf>,
    /// Write the results as JSON to this file as well.
    #[arg(long, global = true)]
    json: Option<PathBuf>,
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// Boot-to-exit wall time and peak RSS: ptiscope vs QEMU microvm (qboot) on the same guest ELF.
    Boot(boot::BootArgs),
    /// Telemetry overhead: getpid cycles/call with `--metrics-interval` vs without, interleaved.
    Telemetry(telemetry::TelemetryArgs),
    /// Repeatability: CoeffVar of getpid cycles/call over identical runs.
    Repeat(telemetry::RepeatArgs),
    /// Syscall round trip: getpid with PTI off and on beside the bare int3/iretq trip
    /// (cycles and guest kernel instructions per call).
    Syscall(syscall::SyscallArgs),
    /// x86_32 PAE beside x86_64: getpid instructions per call with PTI off and on
    /// (QEMU -icount for both flavours, KVM insn_emulation for x86_64).
    Flavours(flavours::FlavoursArgs),
    /// QEMU TCG plugin cost: getpid under `--backend qemu` with the plugin vs `--no-plugin`,
    /// interleaved; speed ratio (target >= 0.75).
    Plugin(plugin::PluginArgs),
    /// Linux guest cost: `ptiscope run --backend qemu --linux` against bare QEMU booting the
    /// same kernel, initramfs and plugin, interleaved; wall-time ratio (target <= 1.1).
    Linux(linux::LinuxArgs),
    /// `--backend nested` cost: the default compare on kvm_amd inside QEMU TCG (boot
    /// included) beside the same compare under `--backend qemu`; target under 60 s.
    Nested(nested::NestedArgs),
    /// Linux on ptiscope's VMM under `--backend nested` (nested and shadow paging) beside
    /// the same Linux compare under `--backend qemu`, rotated; wall-time ratios (target <= 1.5x).
    LinuxNested(linux_nested::LinuxNestedArgs),
    /// `ptiscope ledger`'s wall time (the default ledger unless `--ledger-arg`s say
    /// otherwise) beside its boots one after another; target under 15 minutes.
    Ledger(ledger::LedgerArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let ptiscope = cli.ptiscope.unwrap_or_else(default_ptiscope);
    if !ptiscope.is_file() {
        eprintln!(
            "ptiscope-bench: {} not found; build it first with `cargo build --release`, or pass --ptiscope PATH",
            ptiscope.display()
        );
        return ExitCode::from(2);
    }
    let result = match cli.bench {
        Bench::Boot(args) => boot::run(&ptiscope, &args),
        Bench::Telemetry(args) => telemetry::run_overhead(&ptiscope, &args),
        Bench::Repeat(args) => telemetry::run_repeat(&ptiscope, &args),
        Bench::Syscall(args) => syscall::run(&ptiscope, &args),
        Bench::Flavours(args) => flavours::run(&ptiscope, &args),
        Bench::Plugin(args) => plugin::run(&ptiscope, &args),
        Bench::Linux(args) => linux::run(&ptiscope, &args),
        Bench::Nested(args) => nested::run(&ptiscope, &args),
        Bench::LinuxNested(args) => linux_nested::run(&ptiscope, &args),
        Bench::Ledger(args) => ledger::run(&ptiscope, &args),
    };
    match result {
        Ok(report) => {
            println!("{}", report.text);
            if let Some(path) = cli.json {
                if let Err(e) = std::fs::write(&path, report.json.to_string()) {
                    eprintln!("ptiscope-bench: cannot write {}: {e}", path.display());
                    return ExitCode::from(2);
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ptiscope-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `target/release/ptiscope` next to this workspace.
fn default_ptiscope() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
        .join("release")
        .join("ptiscope")
}

/// What a benchmark prints and what it stores as JSON.
pub struct Report {
    pub text: String,
    pub json: serde_json::Value,
}
