//! `linux`: what ptiscope adds to a Linux guest's run. `ptiscope run
//! --backend qemu --linux K` against bare QEMU booting the same kernel, the
//! same initramfs (ptiscope's init, packed by the same library code), the
//! same kernel command line and the same TCG plugin with the same
//! arguments, interleaved (A B, B A, ...) in one invocation. The figure is
//! each run's wall time, start to exit (the init's exit-port write ends
//! both). Target: ptiscope's median wall time within 1.1x of bare QEMU's.
use crate::measure::{self, median};
use crate::Report;
use clap::{Args, Parser as _};
use serde_json::json;
use std::path::Path;
use std::process::Command;

#[derive(Args)]
pub struct LinuxArgs {
    /// The kernel (`debian-amd64`, `debian-686-pae` or a path).
    #[arg(long, default_value = "debian-amd64")]
    kernel: String,
    /// Runs per variant.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// getppid iterations per run.
    #[arg(long, default_value_t = 20_000)]
    iterations: u64,
    /// `--pti` of the runs.
    #[arg(long, default_value = "on")]
    pti: String,
}

/// The target: ptiscope's wall time at most this times bare QEMU's.
const TARGET_RATIO: f64 = 1.1;

fn ptiscope_args(args: &LinuxArgs) -> Vec<String> {
    [
        "run",
        "--backend",
        "qemu",
        "--linux",
        &args.kernel,
        "--workload",
        "getppid",
        "--timeout",
        "300",
        "--pti",
        &args.pti,
        "--iterations",
        &args.iterations.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The bare QEMU command of the same run, and the temporary initramfs it
/// reads (removed by the caller).
fn bare_command(args: &LinuxArgs) -> Result<(Command, Vec<std::path::PathBuf>), String> {
    let argv: Vec<String> = std::iter::once("ptiscope".to_string())
        .chain(ptiscope_args(args))
        .collect();
    let cli = ptiscope::cli::Cli::try_parse_from(&argv).map_err(|e| e.to_string())?;
    let Some(ptiscope::cli::Command::Run(run)) = cli.command else {
        return Err("internal: not a run command".into());
    };
    let config = run.to_config(ptiscope::GUEST_X86_64);
    // Under QEMU preflight reads no host fact: nothing is probed.
    let facts = ptiscope::HostFacts::read();
    let resolved = ptiscope::preflight::preflight(&config, ptiscope::spec::Target::QemuTcg, &facts)
        .map_err(|e| e.to_string())?;
    let linux = resolved.guest_kind.linux().ok_or("not a Linux run")?;
    let initramfs = resolved
        .boot
        .initrd
        .as_ref()
        .ok_or("a Linux run without its initrd")?;
    let i386 = linux.arch == ptiscope::spec::linux::LinuxArch::I386;
    let binary = if i386 {
        "qemu-system-i386"
    } else {
        "qemu-system-x86_64"
    };
    let (plugin, _) = ptiscope::backend::qemu::plugin_for(binary).map_err(|e| e.to_string())?;
    let dir = std::env::temp_dir();
    let initrd = dir.join(format!("ptiscope-bench-linux-{}.cpio", std::process::id()));
    let out = dir.join(format!(
        "ptiscope-bench-linux-{}.plugin",
        std::process::id()
    ));
    std::fs::write(&initrd, &initramfs[..]).map_err(|e| e.to_string())?;
    let (kernel, marks) = ptiscope::observe::qemu_plugin::kernel_ranges(i386, false);
    let mut cmd = Command::new(binary);
    cmd.args(["-M", "pc", "-accel", "tcg", "-cpu", "max"])
        .args(["-m", &format!("{}M", config.mem_mib)])
        .args(["-smp", "1"])
        .args(["-nodefaults", "-no-user-config", "-display", "none"])
        .arg("-no-reboot")
        .args(["-serial", "stdio"])
        .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=4"])
        .arg("-kernel")
        .arg(&linux.path)
        .arg("-initrd")
        .arg(&initrd)
        .args(["-append", &resolved.boot.cmdline])
        .arg("-plugin")
        .arg(format!(
            "file={},out={},kernel={},marks={},umark={:#x}",
            plugin.display(),
            out.display(),
            ptiscope::observe::qemu_plugin::ranges_arg(&kernel),
            ptiscope::observe::qemu_plugin::ranges_arg(&marks),
            ptiscope::observe::qemu_plugin::LINUX_MARK_PORT,
        ));
    Ok((cmd, vec![initrd, out]))
}

pub fn run(ptiscope: &Path, args: &LinuxArgs) -> Result<Report, String> {
    if args.runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    let (mut ours, mut bare) = (Vec::new(), Vec::new());
    for i in 0..args.runs {
        let order = if i % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for with_ptiscope in order {
            if with_ptiscope {
                let s = measure::run(Command::new(ptiscope).args(ptiscope_args(args)))
                    .map_err(|e| format!("running {}: {e}", ptiscope.display()))?;
                if s.code != Some(0) {
                    return Err(format!("ptiscope run --linux exited with {:?}", s.code));
                }
                ours.push(s.wall.as_secs_f64());
            } else {
                let (mut cmd, temps) = bare_command(args)?;
                let s = measure::run(&mut cmd);
                for t in &temps {
                    let _ = std::fs::remove_file(t);
                }
                let s = s.map_err(|e| format!("running QEMU: {e}"))?;
                // isa-debug-exit: status 0 ends QEMU with (0 << 1) | 1.
                if s.code != Some(1) {
                    return Err(format!("bare QEMU exited with {:?}", s.code));
                }
                bare.push(s.wall.as_secs_f64());
            }
        }
    }
    let (mo, mb) = (median(&ours), median(&bare));
    let ratio = mo / mb;
    let verdict = if ratio <= TARGET_RATIO {
        "meets"
    } else {
        "MISSES"
    };
    let text = format!(
        "Linux guest run cost: {} getppid x {} per run, pti={}, {} runs per variant, interleaved\n\
         variant                               wall s/run (median)\n\
         bare QEMU, same kernel/initramfs/plugin  {mb:>8.3}\n\
         ptiscope run --backend qemu --linux      {mo:>8.3}\n\
         ptiscope / bare: {ratio:.3} (target <= {TARGET_RATIO}: {verdict})",
        args.kernel, args.iterations, args.pti, args.runs,
    );
    Ok(Report {
        text,
        json: json!({
            "bench": "linux",
            "kernel": args.kernel,
            "iterations": args.iterations,
            "runs": args.runs,
            "pti": args.pti,
            "ptiscope_wall_s": ours,
            "bare_qemu_wall_s": bare,
            "ratio": ratio,
            "target": TARGET_RATIO,
            "meets": ratio <= TARGET_RATIO,
        }),
    })
}
