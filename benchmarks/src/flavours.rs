//! The 32-bit PAE flavour beside the 64-bit one: getpid round trip with PTI
//! off and on, in instructions per call.
//!
//! kvm_pvm (software KVM) cannot run 32-bit paging, so both flavours also run
//! under QEMU TCG with `-icount shift=0`: the guest's TSC then advances by
//! one per instruction, so its RDTSC-measured "cycles per call" are exactly
//! the instructions per call (user loop and kernel). The x86_64 flavour also
//! runs on KVM, whose `insn_emulation` counts the kernel's instructions
//! alone: the two agree up to the user loop's few instructions, a cross-check
//! of the method. TCG's wall time says nothing about hardware, so none is
//! reported.
use crate::compare;
use crate::Report;
use clap::Args;
use serde_json::json;
use std::path::Path;

#[derive(Args)]
pub struct FlavoursArgs {
    /// Runs per configuration.
    #[arg(long, default_value_t = 3)]
    runs: u32,
    /// getpid calls per run.
    #[arg(long, default_value_t = 2000)]
    iterations: u32,
}

const ICOUNT: [&str; 2] = ["--qemu-arg=-icount", "--qemu-arg=shift=0,align=off"];

struct Row {
    what: String,
    off: Option<f64>,
    on: Option<f64>,
}

pub fn run(ptiscope: &Path, args: &FlavoursArgs) -> Result<Report, String> {
    if args.runs == 0 || args.iterations == 0 {
        return Err("--runs and --iterations must be at least 1".into());
    }
    let (runs, n) = (args.runs.to_string(), args.iterations.to_string());
    let common = ["--workload", "getpid", "--runs", &runs, "--iterations", &n];
    let mut rows = Vec::new();

    // x86_64 on this host's KVM: kernel instructions (insn_emulation), if counted.
    let kvm = compare::run(ptiscope, &common)?;
    rows.push(Row {
        what: "x86_64, KVM (insn_emulation: kernel only)".into(),
        off: kvm.median("kernel_instructions_per_call", "baseline"),
        on: kvm.median("kernel_instructions_per_call", "compare"),
    });
    for (arch, entries) in [
        ("x86_64", &["int3", "syscall"][..]),
        ("i386", &["int80", "sysenter"][..]),
    ] {
        for entry in entries {
            let base = format!("pti=off,entry={entry}");
            let comp = format!("pti=on,entry={entry}");
            let mut a: Vec<&str> = common.to_vec();
            a.extend([
                "--arch",
                arch,
                "--backend",
                "qemu",
                "--baseline",
                &base,
                "--compare",
                &comp,
            ]);
            a.extend(ICOUNT);
            let c = compare::run(ptiscope, &a)?;
            rows.push(Row {
                what: format!("{arch} {entry}, QEMU -icount (user + kernel)"),
                off: c.median("cycles_per_call", "baseline"),
                on: c.median("cycles_per_call", "compare"),
            });
        }
    }

    let fmt = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.1}"));
    let mut text = format!(
        "getpid round trip, instructions per call, {} runs x {} calls per configuration (medians)\n\
         {:<46} {:>9} {:>9} {:>10}\n",
        args.runs, args.iterations, "flavour, entry, counted by", "pti=off", "pti=on", "PTI adds"
    );
    for r in &rows {
        let added = r.off.zip(r.on).map(|(a, b)| b - a);
        text += &format!(
            "{:<46} {:>9} {:>9} {:>10}\n",
            r.what,
            fmt(r.off),
            fmt(r.on),
            fmt(added)
        );
    }
    text += "(QEMU rows include the user loop's instructions; the PTI column is kernel-only in every row)";
    let json = json!({
        "benchmark": "flavours",
        "runs": args.runs,
        "iterations": args.iterations,
        "rows": rows.iter().map(|r| json!({"what": r.what, "pti_off": r.off, "pti_on": r.on})).collect::<Vec<_>>(),
    });
    Ok(Report { text, json })
}
