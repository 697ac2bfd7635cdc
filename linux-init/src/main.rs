//! ptiscope's workloads as the init (PID 1) of a real Linux kernel.
//!
//! ptiscope packs this static binary into an initramfs at run time and boots
//! a Linux kernel with it. It reads the experiment from the kernel command
//! line (`/proc/cmdline`) with the companion guest's option names and parser
//! (guest-core), checks from the kernel log whether page table isolation is
//! on, runs the workload between the companion guest's phase markers
//! (written without I/O permission: `marker`), prints the same `@result`
//! line, and ends with the companion guest's exit-status port write (then
//! `reboot(RB_POWER_OFF)` where there is no exit device).
//!
//! The measured loops are Rust around one inline-assembly system call (see
//! `sys::syscall3`): the companion guest's GAS user programs use its own
//! system-call ABI (a phase-marker system call, a `wait` without arguments,
//! SYSENTER through its own stub) and its `.user.text` section, so they
//! cannot run under Linux unchanged.

mod marker;
mod mitigations;
mod sys;
mod work;

use std::io::Write;

use guest_core::cmdline::Config;
use ptiscope_abi::exit_status;
use ptiscope_abi::options::{Entry, PtiMode, Workload};

/// What the kernel log says when PTI is on (arch/x86/mm/pti.c, pti_init()).
const PTI_ENABLED: &str = "Kernel/User page tables isolation: enabled";
/// What the kernel log says when `nohz_full=` took (kernel/time/tick-sched.c).
const FULL_DYNTICKS: &str = "NO_HZ: Full dynticks CPUs:";
/// Bytes of /proc/cmdline read (Linux's x86 COMMAND_LINE_SIZE is 2048).
const CMDLINE_CAP: usize = 4096;
/// Bytes of kernel log read.
const KLOG_CAP: usize = 1 << 20;

/// The word on the kernel command line that asks the init for the
/// kernel's text symbols after the phase (`--by-symbol`; a dotted
/// parameter, which Linux neither passes to the init nor complains about).
const SYMBOLS_WORD: &str = "ptiscope.syms=1";
/// Most bytes of /proc/kallsyms read.
const KALLSYMS_CAP: usize = 64 << 20;

/// The keys of the init's own, besides the companion guest's.
mod keys {
    /// `ipc=socket|pipe` of sched-messaging (perf bench's default is a
    /// socket pair; `-p` is pipes).
    pub const IPC: &str = "ipc";
}

#[cfg(target_arch = "x86_64")]
const ARCH: &str = "x86_64";
#[cfg(target_arch = "x86")]
const ARCH: &str = "i386";

fn main() {
    let status = run();
    stop(status)
}

/// Ends the run: flushes the console, writes the exit-status port (QEMU's
/// isa-debug-exit, the VMM's exit device) and powers off.
fn stop(status: u32) -> ! {
    use ptiscope_abi::port::{EXIT, EXIT_LEN};
    // The exit port is taken only now, after the workload: with I/O
    // permission a task pays the kernel's I/O-bitmap update on every
    // return to user mode (`marker`), and its children inherit it.
    let granted = sys::grant_ports(EXIT, EXIT_LEN);
    if let Err(e) = &granted {
        println!(
            "linux-init: ioperm for the exit port failed ({e}): powering off without a status"
        );
    }
    let _ = std::io::stdout().flush();
    sys::drain_console();
    if granted.is_ok() {
        sys::outl(EXIT, status);
    }
    sys::power_off();
    // Not reached: PID 1 must not return.
    loop {
        std::thread::park();
    }
}

/// The options of the run: the command-line words whose keys are the
/// companion guest's, parsed by its parser, and the init's own.
struct Options {
    config: Config,
    ipc_pipe: bool,
}

fn options(cmdline: &str) -> Result<Options, String> {
    let mut mine = Vec::new();
    let mut ipc_pipe = false;
    for word in cmdline.split_ascii_whitespace() {
        let Some((key, value)) = word.split_once('=') else {
            continue;
        };
        if key == keys::IPC {
            ipc_pipe = match value {
                "pipe" => true,
                "socket" => false,
                _ => {
                    return Err(format!(
                        "bad value `{value}` for `ipc` (expected socket|pipe)"
                    ))
                }
            };
        } else if is_guest_key(key) {
            mine.push(word);
        }
    }
    let line = mine.join(" ");
    let config = guest_core::cmdline::parse(&line).map_err(|e| e.to_string())?;
    Ok(Options { config, ipc_pipe })
}

/// Whether `key` is one of the companion guest's command-line keys.
fn is_guest_key(key: &str) -> bool {
    use ptiscope_abi::cmdline as k;
    [
        k::PTI,
        k::ENTRY,
        k::WORKLOAD,
        k::ITERATIONS,
        k::GROUPS,
        k::LOOPS,
        k::MODE,
        k::WSS,
        k::STRIDE,
        k::TOUCHES,
        k::CPUS,
        k::THREADS,
    ]
    .contains(&key)
}

/// The measured call's gate for `entry=`.
fn gate(entry: Entry) -> Result<sys::Gate, String> {
    match entry {
        #[cfg(target_arch = "x86_64")]
        Entry::Syscall | Entry::Int3 => Ok(sys::Gate::Syscall),
        #[cfg(target_arch = "x86")]
        Entry::Int80 | Entry::Int3 => Ok(sys::Gate::Int80),
        #[cfg(target_arch = "x86")]
        Entry::Sysenter => sys::vsyscall_address()
            .map(sys::Gate::Vsyscall)
            .ok_or_else(|| "entry=sysenter: the kernel gave no vDSO (AT_SYSINFO)".to_string()),
        other => Err(format!(
            "entry={other} is not a Linux {ARCH} system-call entry here (x86_64: syscall; \
             i386: int80 or sysenter, the vDSO's __kernel_vsyscall)"
        )),
    }
}

fn run() -> u32 {
    if let Err(e) = sys::mount_proc() {
        println!("linux-init: cannot mount /proc: {e}");
        return exit_status::FAILURE;
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    println!(
        "{} linux-init {ARCH} {} (Linux {release})",
        ptiscope_abi::BANNER_PREFIX,
        env!("CARGO_PKG_VERSION")
    );
    let cmdline = match read_capped("/proc/cmdline", CMDLINE_CAP) {
        Ok(s) => s,
        Err(e) => {
            println!("linux-init: cannot read /proc/cmdline: {e}");
            return exit_status::FAILURE;
        }
    };
    let marks = match marker::setup(&cmdline) {
        Ok(c) => c,
        Err(e) => {
            println!("linux-init: {e}");
            return exit_status::FAILURE;
        }
    };
    println!("{}", marks.machine_line());
    let opts = match options(&cmdline) {
        Ok(o) => o,
        Err(e) => {
            println!("bad command line: {e}");
            println!("@badcmdline {e}");
            return exit_status::BAD_CMDLINE;
        }
    };
    let c = &opts.config;

    // PTI from the kernel log: /sys/.../vulnerabilities/meltdown says "Not
    // affected" on a CPU model without the bug even when pti=on forces it.
    let log = match sys::kernel_log(KLOG_CAP) {
        Ok(log) => log,
        Err(e) => {
            println!("linux-init: cannot read the kernel log: {e}");
            return exit_status::FAILURE;
        }
    };
    let pti = log.contains(PTI_ENABLED);
    println!(
        "@linux release={release} arch={ARCH} pti={} asked_pti={}",
        on_off(pti),
        c.pti
    );
    // The kernel's own word on its mitigations, before anything is measured.
    mitigations::report(&cmdline);
    match (c.pti, pti) {
        (PtiMode::On, false) => {
            println!(
                "@pti-mismatch asked=on log=off: the kernel was asked for pti=on but its log has no \
                 \"{PTI_ENABLED}\" line (a kernel built without CONFIG_MITIGATION_PAGE_TABLE_ISOLATION, \
                 CONFIG_PAGE_TABLE_ISOLATION before Linux 6.9, or a 32-bit kernel without PAE); nothing is measured"
            );
            return exit_status::UNSUPPORTED;
        }
        (PtiMode::Off, true) => {
            println!("@pti-mismatch asked=off log=on: the kernel log says PTI is enabled although pti=off was asked");
            return exit_status::FAILURE;
        }
        _ => {}
    }
    let gate = match gate(c.entry) {
        Ok(g) => g,
        Err(e) => {
            println!("bad command line: {e}");
            println!("@badcmdline {e}");
            return exit_status::BAD_CMDLINE;
        }
    };
    let outcome = match c.workload {
        Workload::None => None,
        Workload::Getpid | Workload::Getppid | Workload::WriteBadfd => {
            let cpu = pin_to_tick_free_cpu(&cmdline, log.contains(FULL_DYNTICKS));
            let before = cpu.and_then(local_timer_interrupts);
            let outcome = work::syscall_loop(c, gate);
            // The kernel's own count of the tick on the loop's CPU across
            // the loop: 0 where the CPU was tick-free throughout.
            if let (Some(cpu), Some(before)) = (cpu, before) {
                match local_timer_interrupts(cpu) {
                    Some(after) => println!(
                        "@ticks cpu={cpu} local_timer={}",
                        after.saturating_sub(before)
                    ),
                    None => println!("@ticks cpu={cpu} local_timer=unknown"),
                }
            }
            Some(outcome)
        }
        Workload::SchedMessaging => Some(work::messaging(c, opts.ipc_pipe)),
        Workload::Poundsyscall => Some(work::pound(c, gate)),
        Workload::NoptiGetpid => {
            println!("bad command line: workload=nopti-getpid needs the companion guest's per-process PTI opt-out, which Linux does not have");
            println!("@badcmdline workload=nopti-getpid is not a Linux workload");
            return exit_status::BAD_CMDLINE;
        }
    };
    let Some(outcome) = outcome else {
        println!("workload=none: nothing measured");
        return exit_status::SUCCESS;
    };
    let o = match outcome {
        Ok(o) => o,
        Err(e) => {
            println!("linux-init: the workload failed: {e}");
            return exit_status::FAILURE;
        }
    };
    let n = o.calls;
    let tenths = o.cycles.saturating_mul(10).checked_div(n).unwrap_or(0);
    println!(
        "{}workload={} iterations={n} cycles={} cycles_per_call={}.{} ns={} pti={} pcid=off entry={} \
         mismatches={} exit_status=0 kernel=linux release={release}{}",
        ptiscope_abi::RESULT_PREFIX,
        c.workload.name(),
        o.cycles,
        tenths / 10,
        tenths % 10,
        o.ns,
        on_off(pti),
        entry_name(gate),
        o.mismatches,
        o.extra,
    );
    if cmdline.split_ascii_whitespace().any(|w| w == SYMBOLS_WORD) {
        send_symbols();
    }
    if c.workload == Workload::Poundsyscall {
        println!(
            "@smp cpus={} threads={} calls_per_thread={}",
            std::thread::available_parallelism().map_or(1, |n| n.get()),
            c.threads,
            c.iterations
        );
    }
    if o.mismatches != 0 || !o.ok {
        println!(
            "workload failed: {} wrong results{}",
            o.mismatches,
            if o.ok { "" } else { ", a check failed" }
        );
        return exit_status::FAILURE;
    }
    exit_status::SUCCESS
}

/// Moves the system-call loop onto the first CPU of the kernel's
/// `nohz_full=` list, if it was given one: there, with the loop its only
/// task, the kernel stops the scheduler tick, so that no timer interrupt
/// from user mode adds its two CR3 writes (with PTI) to the calls' own and
/// a host that counts every CR3 write (KVM under shadow paging) counts the
/// calls alone. Says where it ran on an `@cpu` line, and with
/// `dynticks=no` when the kernel log shows no full-dynticks CPUs (a kernel
/// without CONFIG_NO_HZ_FULL ignores `nohz_full=`: the tick stays); returns
/// the CPU it pinned to.
///
/// The tick stops only once the CPU has one task (after the migration
/// that pinning is): the init waits, spinning in user mode, until the
/// kernel's count of local timer interrupts there stands still for
/// [`SETTLE_WINDOW`], and says whether it did (`settled=`).
fn pin_to_tick_free_cpu(cmdline: &str, dynticks: bool) -> Option<usize> {
    let list = cmdline
        .split_ascii_whitespace()
        .find_map(|w| w.strip_prefix("nohz_full="))?;
    // A cpulist: "1", "1-3", "2,4-5"; the first CPU it names.
    let first = list
        .split([',', '-'])
        .next()
        .and_then(|n| n.parse::<usize>().ok());
    match first.map(|cpu| (cpu, sys::pin_to_cpu(cpu))) {
        Some((cpu, Ok(()))) => {
            let settled = dynticks && wait_for_tick_to_stop(cpu);
            println!(
                "@cpu pinned={cpu} reason=nohz_full dynticks={} settled={}",
                if dynticks { "yes" } else { "no" },
                if settled { "yes" } else { "no" }
            );
            Some(cpu)
        }
        Some((cpu, Err(e))) => {
            println!(
                "@cpu pinned=none reason=sched_setaffinity-failed:{} cpu={cpu}",
                e.raw_os_error().unwrap_or(0)
            );
            None
        }
        None => {
            println!("@cpu pinned=none reason=bad-nohz_full-list");
            None
        }
    }
}

/// How long the local timer count must stand still for the tick to count
/// as stopped (five ticks at HZ=250, over two at HZ=100).
const SETTLE_WINDOW: std::time::Duration = std::time::Duration::from_millis(20);
/// The longest wait for it.
const SETTLE_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Spins in user mode (the clock read through the vDSO) until `cpu`'s
/// local timer interrupts stand still for [`SETTLE_WINDOW`]; false after
/// [`SETTLE_LIMIT`], or where /proc/interrupts does not say.
fn wait_for_tick_to_stop(cpu: usize) -> bool {
    let start = std::time::Instant::now();
    let Some(mut last) = local_timer_interrupts(cpu) else {
        return false;
    };
    while start.elapsed() < SETTLE_LIMIT {
        let window = std::time::Instant::now();
        while window.elapsed() < SETTLE_WINDOW {
            std::hint::spin_loop();
        }
        let Some(now) = local_timer_interrupts(cpu) else {
            return false;
        };
        if now == last {
            return true;
        }
        last = now;
    }
    false
}

/// The kernel's count of local APIC timer interrupts on `cpu` (the `LOC:`
/// row of /proc/interrupts, one column per online CPU).
fn local_timer_interrupts(cpu: usize) -> Option<u64> {
    let text = read_capped("/proc/interrupts", 1 << 20).ok()?;
    let row = text
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("LOC:"))?;
    row.split_ascii_whitespace().nth(cpu)?.parse().ok()
}

fn entry_name(gate: sys::Gate) -> &'static str {
    match gate {
        #[cfg(target_arch = "x86_64")]
        sys::Gate::Syscall => Entry::Syscall.name(),
        #[cfg(target_arch = "x86")]
        sys::Gate::Int80 => Entry::Int80.name(),
        #[cfg(target_arch = "x86")]
        sys::Gate::Vsyscall(_) => Entry::Sysenter.name(),
    }
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// A file's text, at most `cap` bytes.
fn read_capped(path: &str, cap: usize) -> std::io::Result<String> {
    use std::io::Read;
    let mut s = String::new();
    std::fs::File::open(path)?
        .take(cap as u64)
        .read_to_string(&mut s)?;
    Ok(s)
}

/// Sends the kernel's text symbols (the `t`/`T`/`w`/`W` lines of
/// /proc/kallsyms: the running kernel's own table, KASLR offset included,
/// no debug package needed) to the host through the symbol port, after the
/// phase, and says on an `@symbols` line how many, or why none.
/// kptr_restrict hides the addresses (all zero) from a reader without
/// CAP_SYSLOG, and from everyone at 2: PID 1 sets it to 0 first.
fn send_symbols() {
    use ptiscope_abi::port::SYMBOLS;
    if let Err(e) = sys::grant_ports(SYMBOLS, 1) {
        println!(
            "@symbols none reason=ioperm-failed:{}",
            e.raw_os_error().unwrap_or(0)
        );
        return;
    }
    let restrict = std::fs::write("/proc/sys/kernel/kptr_restrict", "0\n");
    let text = match read_capped("/proc/kallsyms", KALLSYMS_CAP) {
        Ok(t) => t,
        Err(e) => {
            // A kernel built without CONFIG_KALLSYMS has no such file.
            println!(
                "@symbols none reason=no-kallsyms:{}",
                e.raw_os_error().unwrap_or(0)
            );
            return;
        }
    };
    let mut out = String::with_capacity(text.len() / 2);
    let (mut lines, mut hidden) = (0u64, 0u64);
    for l in text.lines() {
        let mut w = l.split_ascii_whitespace();
        let (Some(addr), Some(kind)) = (w.next(), w.next()) else {
            continue;
        };
        if !matches!(kind, "t" | "T" | "w" | "W") {
            continue;
        }
        if addr.bytes().all(|b| b == b'0') {
            hidden += 1;
            continue;
        }
        out.push_str(l);
        out.push('\n');
        lines += 1;
    }
    if lines == 0 {
        println!(
            "@symbols none reason={} hidden={hidden}",
            if hidden > 0 {
                if restrict.is_err() {
                    "kptr_restrict-hides-addresses-and-cannot-be-set"
                } else {
                    "addresses-hidden"
                }
            } else {
                "no-text-symbols"
            }
        );
        return;
    }
    sys::out_bytes(SYMBOLS, out.as_bytes());
    println!("@symbols lines={lines} bytes={} hidden={hidden}", out.len());
}
