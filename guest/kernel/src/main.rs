//! The ptiscope guest kernel.
//!
//! Boot (PVH, `arch::boot`) → `kmain`: console banner, descriptor tables,
//! command line and memory map from `hvm_start_info`, frame allocator,
//! kernel page tables and telemetry, then the workload chosen on the
//! command line, and the exit status to the exit port.
#![no_std]
#![no_main]

mod arch;
mod console;
mod mm;
mod pipe;
mod pvh;
mod sync;
mod syscall;
mod task;
mod telemetry;
mod uaccess;
mod workingset;

use arch::paging::KernelHalf;
use arch::{cpu, user};
use guest_core::cmdline::{self, Config, Fault, PtiMode, TaskMode, Workload, GROUP_SIZE};
use ptiscope_abi::{exit_status, port, telemetry::flags};

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The banner line, joined at compile time: one piece for the console.
const BANNER: &str = {
    const PARTS: [&str; 6] = [
        ptiscope_abi::BANNER_PREFIX,
        " ",
        arch::NAME,
        " ",
        VERSION,
        "\n",
    ];
    const LEN: usize = {
        let (mut n, mut i) = (0, 0);
        while i < PARTS.len() {
            n += PARTS[i].len();
            i += 1;
        }
        n
    };
    const BYTES: [u8; LEN] = {
        let mut b = [0; LEN];
        let (mut n, mut i) = (0, 0);
        while i < PARTS.len() {
            let part = PARTS[i].as_bytes();
            let mut j = 0;
            while j < part.len() {
                b[n] = part[j];
                n += 1;
                j += 1;
            }
            i += 1;
        }
        b
    };
    match core::str::from_utf8(&BYTES) {
        Ok(s) => s,
        Err(_) => panic!("the banner's parts are UTF-8"),
    }
};

/// Writes `status` to the exit device and stops this CPU for good.
pub fn stop(status: u32) -> ! {
    arch::x86_shared::io::outl(port::EXIT, status);
    // Only reached if nothing listens on the exit port.
    cpu::halt_forever()
}

/// A command line the guest cannot run: says why (for people, and as the
/// `@badcmdline` line the VMM reads) and exits `BAD_CMDLINE`.
fn bad_cmdline(why: impl core::fmt::Display) -> ! {
    println!("bad command line: {why}");
    println!("@badcmdline {why}");
    stop(exit_status::BAD_CMDLINE)
}

#[no_mangle]
extern "C" fn kmain(start_info: usize) -> ! {
    arch::descriptors::init_gdt_tss();
    // Per-CPU data (GS) before anything counts or prints (the console lock
    // asks which CPU this is).
    arch::smp::init_boot_cpu();
    // The boot lines are written without core::fmt (console::Line), in as
    // few pieces as the text allows: the same text for a fraction of the
    // emulated instructions.
    console::Line::start().str(BANNER);
    arch::descriptors::init_idt();

    let info = match pvh::StartInfo::read(start_info as u64) {
        Ok(i) => i,
        Err(e) => panic!("bad hvm_start_info at {start_info:#x}: {e}"),
    };
    let config = match cmdline::parse(info.cmdline) {
        Ok(c) => c,
        Err(e) => bad_cmdline(e),
    };
    // pti=auto: on unless the CPU says it is not Meltdown-vulnerable
    // (ARCH_CAPABILITIES.RDCL_NO, bit 0), as Linux decides.
    let arch_caps = cpu::arch_capabilities();
    let rdcl_no = arch_caps.is_some_and(|v| v & 1 != 0);
    let pti = match config.pti {
        PtiMode::On => true,
        PtiMode::Off => false,
        PtiMode::Auto => !rdcl_no,
    };
    {
        // Constant neighbours joined: each piece costs a dozen emulated
        // instructions on software-KVM hosts.
        let mut line = console::Line::start();
        line.str(if pti {
            "config: pti=on ("
        } else {
            "config: pti=off ("
        })
        .str(match config.pti {
            PtiMode::On => "on",
            PtiMode::Off => "off",
            PtiMode::Auto => "auto",
        })
        .str(" requested, rdcl_no=")
        .str(if rdcl_no {
            "1, arch_capabilities="
        } else {
            "0, arch_capabilities="
        });
        match arch_caps {
            Some(v) => line.hex(v),
            None => line.str("none"),
        };
        line.str(if config.pcid {
            ") pcid=on entry="
        } else {
            ") pcid=off entry="
        })
        .str(config.entry.name())
        .str(" workload=")
        .str(config.workload.name());
        // workload=none runs no loop: an iteration count here would claim
        // a measurement that does not happen.
        if config.workload != Workload::None {
            line.str(" iterations=").dec(config.iterations);
        }
        line.str(" telemetry=").hex(config.telemetry.unwrap_or(0));
        match config.fault {
            Some(f) => line.str(" fault=").str(f.name()).str("\n"),
            None => line.str(" fault=none\n"),
        };
    }

    let map = info.memmap();
    // The RAM and the end of the highest region in one pass over the map.
    let (mut ram, mut mem_end) = (0u64, 0u64);
    for r in map {
        if r.kind == guest_core::memmap::E820_RAM {
            ram += r.size;
        }
        mem_end = mem_end.max(r.end());
    }
    mm::init(map, config.telemetry);
    console::Line::start()
        .str("memory: ")
        .dec(map.len() as u64)
        .str(" map entries, ")
        .dec(ram >> 10)
        .str(" KiB RAM, ")
        .dec(mm::free_bytes() >> 10)
        .str(" KiB allocatable above the image end ")
        .hex(mm::image_end_phys())
        .str("\n");

    if let Some(why) = arch::unsupported(&config) {
        println!("{why}");
        stop(exit_status::UNSUPPORTED)
    }
    let pcid = config.pcid;

    // Map only as much of the first GiB as there is memory: each 2 MiB entry
    // costs a few dozen emulated instructions on software-KVM hosts, and the
    // full GiB (512 entries) used to be most of the boot time.
    if map.is_empty() {
        mem_end = arch::layout::DIRECT_MAP_SIZE;
    }
    let direct_map = mem_end
        .next_multiple_of(2 << 20)
        .min(arch::layout::DIRECT_MAP_SIZE);
    let half = arch::paging::setup_kernel_tables(&config, pti, direct_map);
    if pcid {
        // SAFETY: CR3's PCID bits are 0 (kernel-only root), as PCIDE requires.
        unsafe { cpu::write_cr4(cpu::read_cr4() | cpu::CR4_PCIDE) };
    }
    let mut tflags = 0;
    if pti {
        tflags |= flags::PTI;
    }
    if pcid {
        tflags |= flags::PCID;
    }
    if rdcl_no {
        tflags |= flags::RDCL_NO;
    }
    if pti && config.pti_global_text {
        tflags |= flags::PTI_GLOBAL_TEXT;
    }
    telemetry::write_header(tflags, config.entry.abi_code(), config.cpus as u32);
    start_cpus(&config);

    if let (Some(f), 0) = (config.fault, config.fault_cpu) {
        raise(f);
    }
    // fault=kread is raised by the workload's user program: run_workload
    // puts it on that CPU. Every other fault is raised by the AP itself.
    if config.fault.is_some_and(|f| f != Fault::Kread) && config.fault_cpu > 0 {
        println!(
            "CPU 0 waits while CPU {} raises fault={}",
            config.fault_cpu,
            config.fault.map_or("none", |f| f.name())
        );
        cpu::halt_forever()
    }
    if config.workload == Workload::None && config.fault != Some(Fault::Kread) {
        console::Line::start().str("workload none: nothing to run\n");
        stop(exit_status::SUCCESS)
    }
    if config.workload == Workload::SchedMessaging && config.fault.is_none() {
        run_messaging(&config, pti, pcid, half)
    }
    if config.workload == Workload::Poundsyscall && config.fault.is_none() {
        run_pound(&config, pti, pcid, half)
    }
    run_workload(&config, pti, pcid, half)
}

/// `cpus=N`: starts CPUs 1..N (INIT/SIPI); they idle until given work.
fn start_cpus(config: &Config) {
    let cpus = config.cpus as usize;
    if config.fault_cpu >= config.cpus {
        bad_cmdline(format_args!(
            "fault_cpu={} is not below cpus={}",
            config.fault_cpu, config.cpus
        ))
    }
    if cpus <= 1 {
        return;
    }
    if let (Some(f), n @ 1..) = (config.fault, config.fault_cpu) {
        // Raised by that CPU as soon as it is up (task::ap_enter).
        task::AP_FAULT.store(
            (n as usize) << 8 | (f as usize + 1),
            core::sync::atomic::Ordering::Relaxed,
        );
    }
    let root = arch::smp::current_cr3();
    task::AP_KERNEL_CR3.store(root, core::sync::atomic::Ordering::Relaxed);
    task::AP_CR4.store(cpu::read_cr4(), core::sync::atomic::Ordering::Relaxed);
    task::AP_ENTRY.store(
        config.entry.abi_code() as usize,
        core::sync::atomic::Ordering::Relaxed,
    );
    arch::smp::init_bsp(cpus, root & !0xfff);
    let online = arch::smp::start_aps();
    println!("smp: {online} of {cpus} CPUs online (INIT/SIPI)");
    if online < cpus {
        println!("@smp_failed online={online} cpus={cpus}");
        stop(exit_status::UNSUPPORTED)
    }
}

/// `workload=poundsyscall` (mmtests): a parent (pid 1, CPU 0: phase
/// markers, reaps) and `threads` threads of its address space, thread i on
/// CPU i mod `cpus`, each calling getppid `iterations` times; they start
/// together at the begin marker. With `wss=` the parent first fills the
/// shared buffer and each thread reads it before each call (its index in
/// the third parameter: its record in the control page). Then reports and
/// stops.
fn run_pound(config: &Config, pti: bool, pcid: bool, half: KernelHalf) -> ! {
    use arch::context::UserRegs;
    let mut s = task::lock();
    s.init(pti, pcid, config.entry, half);
    let (parent_rip, worker_rip) = if config.wss > 0 {
        user::pound_wss_programs(config.entry.abi_code())
    } else {
        let (parent_rip, _, _) = user::messaging_programs(config.entry.abi_code());
        (parent_rip, user::pound_program(config.entry.abi_code()))
    };
    let cpus = arch::smp::online();
    println!(
        "poundsyscall: {} threads x {} getppid calls on {cpus} CPUs",
        config.threads, config.iterations
    );
    let parent = s
        .spawn_task(None, parent_rip, &UserRegs::default(), None)
        .unwrap_or_else(|e| panic!("cannot create the poundsyscall parent: {e:?}"));
    let ppid = s.tasks[parent].pid;
    setup_working_set(config, s.tasks[parent].pair);
    for i in 0..config.threads as usize {
        let regs = UserRegs::params([config.iterations, ppid, i as u64, 0]);
        let t = s
            .spawn_task(Some(parent), worker_rip, &regs, Some(parent))
            .unwrap_or_else(|e| panic!("cannot create poundsyscall thread {i}: {e:?}"));
        s.pin(t, i % cpus);
    }
    s.run();
    report(config, pti, pcid)
}

/// `workload=sched-messaging`: a parent (pid 1: phase markers, reaps the
/// workers) and, per group, 20 receivers (each reading its own pipe, fd 3)
/// and 20 senders (fds 3..23: the group's pipes), as processes or threads
/// of the parent's address space; then reports and stops.
fn run_messaging(config: &Config, pti: bool, pcid: bool, half: KernelHalf) -> ! {
    use arch::context::UserRegs;
    let mut s = task::lock();
    s.init(pti, pcid, config.entry, half);
    let (parent_rip, sender_rip, receiver_rip) = user::messaging_programs(config.entry.abi_code());
    let thread = config.mode == TaskMode::Thread;
    // Workers round-robin over the CPUs online; the parent stays on CPU 0.
    let cpus = arch::smp::online();
    let mut worker = 0usize;
    println!(
        "sched-messaging: {} groups of {GROUP_SIZE} senders and {GROUP_SIZE} receivers, {} loops, {} mode: {} messages of {} bytes",
        config.groups,
        config.loops,
        config.mode.name(),
        config.messages(),
        guest_core::pipe::message::SIZE,
    );
    let spawn = |s: &mut task::Sched, parent, rip, p, pipes| {
        let r = s
            .spawn_task(
                parent,
                rip,
                &UserRegs::params(p),
                if thread { parent } else { None },
            )
            .unwrap_or_else(|e| panic!("cannot create the sched-messaging tasks: {e:?}"));
        s.tasks[r].pipes = pipes;
        r
    };
    let parent = s
        .spawn_task(None, parent_rip, &UserRegs::default(), None)
        .unwrap_or_else(|e| panic!("cannot create the sched-messaging parent: {e:?}"));
    for g in 0..config.groups {
        let mut first = None;
        for _ in 0..GROUP_SIZE {
            let p = s
                .with_guarded(&pipe::PIPES)
                .1
                .create()
                .unwrap_or_else(|| panic!("cannot create a pipe"));
            first.get_or_insert(p);
        }
        let first = first.expect("a group has pipes");
        for r in 0..GROUP_SIZE {
            let fds = task::PipeFds {
                first: first + r as u16,
                count: 1,
                write: false,
            };
            let t = spawn(
                &mut s,
                Some(parent),
                receiver_rip,
                [g, r, config.loops, 0],
                fds,
            );
            worker += 1;
            s.pin(t, worker % cpus);
        }
        for snd in 0..GROUP_SIZE {
            let fds = task::PipeFds {
                first,
                count: GROUP_SIZE as u16,
                write: true,
            };
            let t = spawn(
                &mut s,
                Some(parent),
                sender_rip,
                [g, snd, config.loops, 0],
                fds,
            );
            worker += 1;
            s.pin(t, worker % cpus);
        }
    }
    s.run();
    report(config, pti, pcid)
}

/// Runs the workload: pid 1 (`user_init`) waits for pid 2 (`user_loop`),
/// which runs the measured loop; then reports and stops.
fn run_workload(config: &Config, pti: bool, pcid: bool, half: KernelHalf) -> ! {
    use ptiscope_abi::syscall as nr;
    let mut s = task::lock();
    s.init(pti, pcid, config.entry, half);
    let (loop_rip, init_rip) = user::programs(config.entry.abi_code());
    let (mut number, arg0, mut flags) = match config.workload {
        Workload::Getppid => (nr::GETPPID, 0, 0),
        Workload::WriteBadfd => (nr::WRITE, usize::MAX as u64, 0),
        Workload::NoptiGetpid => (nr::GETPID, 0, user::FLAG_NOPTI),
        Workload::Getpid | Workload::None | Workload::SchedMessaging | Workload::Poundsyscall => {
            (nr::GETPID, 0, 0)
        }
    };
    if config.wss > 0 {
        flags |= user::FLAG_WSS;
    }
    match workingset::setup_kernel(config, &half, pti, number) {
        Ok(true) => {
            println!(
                "kernel working set: {} bytes at {:#x}, read (one word per page) by each call before {}",
                config.kwss,
                workingset::KWSS_VA,
                config.workload.name()
            );
            number = nr::KWSS_CALL;
        }
        Ok(false) => {}
        Err(e) => bad_cmdline(e),
    }
    let kread_target = core::ptr::addr_of!(task::SCHED) as u64;
    if config.fault == Some(Fault::Kread) {
        flags |= user::FLAG_KREAD;
        println!("user program will read kernel address {kread_target:#x}");
    }
    let regs = arch::context::UserRegs::workload(
        flags,
        config.iterations,
        number as u64,
        arg0,
        kread_target,
    );
    let init = s.spawn(0, init_rip, &arch::context::UserRegs::default());
    let init_pid = init.as_ref().map_or(0, |&pid| pid);
    let child = init.and_then(|pid| s.spawn(pid, loop_rip, &regs));
    let child = match child {
        Ok(pid) => pid,
        Err(e) => panic!("cannot create the workload processes: {e:?}"),
    };
    if config.fault == Some(Fault::Kread) && config.fault_cpu > 0 {
        pin_kread_program(&mut s, [init_pid, child], config.fault_cpu as usize);
    }
    let pair = s.tasks.iter().find(|t| t.pid == child).map(|t| t.pair);
    setup_working_set(
        config,
        pair.unwrap_or_else(|| panic!("the workload process vanished")),
    );
    s.run();
    report(config, pti, pcid)
}

/// `fault=kread fault_cpu=N`: the processes `pids` (init, then the user
/// program that reads kernel memory; both just spawned, queued on CPU 0)
/// move to CPU N, which is woken to run them; CPU 0 idles in
/// [`task::SchedGuard::run`] meanwhile. The fault then stops the VM from CPU N.
fn pin_kread_program(s: &mut task::SchedGuard, pids: [u64; 2], cpu: usize) {
    println!("CPU {cpu} runs the user program that raises fault=kread");
    // The most recently queued first (`pin` moves the tail of a queue).
    for pid in pids.into_iter().rev() {
        if let Some(slot) = s.tasks.iter().position(|t| pid != 0 && t.pid == pid) {
            s.pin(slot, cpu);
        }
    }
    s.kick_other_cpus();
}

/// Maps the user working set (`wss=`, if any) into the address space
/// `pair` and says so; a working set that does not fit is a bad command
/// line.
fn setup_working_set(config: &Config, pair: u64) {
    match workingset::setup(config, pair) {
        Ok(true) => println!(
            "working set: {} bytes at {:#x} ({} pages), stride {}, {} reads per iteration",
            config.wss,
            ptiscope_abi::workingset::BASE,
            config.wss_pages.name(),
            config.stride,
            config.touches_per_iteration()
        ),
        Ok(false) => {}
        Err(e) => bad_cmdline(e),
    }
}

fn report(config: &Config, pti: bool, pcid: bool) -> ! {
    use ptiscope_abi::telemetry::Counter as C;
    // SAFETY: every task has exited (run() saw that under the scheduler
    // lock, after their last writes): no other reference to the result.
    let r = unsafe { syscall::RESULT.get() };
    let status = r.exit_status.unwrap_or(-1);
    if config.fault == Some(Fault::Kread) {
        println!("fault=kread was not raised: the user program read kernel memory (exit status {status})");
        stop(exit_status::FAULT_NOT_RAISED)
    }
    let (Some(b), Some(e)) = (r.begin, r.end) else {
        println!("the workload ended without its phase markers (exit status {status})");
        stop(exit_status::FAILURE)
    };
    let d = |c| e.delta(&b, c);
    let cr3 = d(C::Cr3Entry) + d(C::Cr3Exit) + d(C::Cr3ContextSwitch) + d(C::Cr3Other);
    let messaging = config.workload == Workload::SchedMessaging;
    let pound = config.workload == Workload::Poundsyscall;
    let n = if messaging {
        config.messages()
    } else if pound {
        config.threads * config.iterations
    } else {
        config.iterations
    };
    // An empty phase (iterations=0) has no per-call figure: report 0.
    let tenths = r.cycles.saturating_mul(10).checked_div(n).unwrap_or(0);
    let nopti = task::lock().tasks.iter().any(|t| t.nopti);
    let wss = workingset::result(config);
    println!(
        "{}workload={} iterations={n} cycles={} cycles_per_call={}.{} syscalls={} cr3_writes={cr3} \
         cr3_entry={} cr3_exit={} cr3_context_switch={} cr3_other={} cr3_noflush={} tlb_flushes={} \
         invlpg={} exceptions={} page_faults={} context_switches={} pti={} pcid={} entry={} nopti={} \
         mismatches={} exit_status={status}{}{}{}",
        ptiscope_abi::RESULT_PREFIX,
        config.workload.name(),
        r.cycles,
        tenths / 10,
        tenths % 10,
        d(C::Syscalls),
        d(C::Cr3Entry),
        d(C::Cr3Exit),
        d(C::Cr3ContextSwitch),
        d(C::Cr3Other),
        d(C::Cr3NoFlush),
        d(C::TlbFlushFull),
        d(C::Invlpg),
        d(C::Exceptions),
        d(C::PageFaults),
        d(C::ContextSwitches),
        if pti { "on" } else { "off" },
        if pcid { "on" } else { "off" },
        config.entry.name(),
        nopti as u8,
        r.mismatches,
        Messaging(messaging.then_some(config)),
        WorkingSet(config, wss.as_ref()),
        KernelWorkingSet(config),
    );
    if pound || arch::smp::online() > 1 {
        let ipis = arch::smp::IPIS_SENT.load(core::sync::atomic::Ordering::Relaxed);
        if pound {
            println!(
                "@smp cpus={} threads={} calls_per_thread={} ipis_sent={ipis}",
                arch::smp::online(),
                config.threads,
                config.iterations,
            );
        } else {
            println!("@smp cpus={} ipis_sent={ipis}", arch::smp::online());
        }
    }
    if wss.as_ref().is_some_and(|w| !w.ok()) {
        println!("working set check failed: the loop did not read what it should have");
        stop(exit_status::FAILURE)
    }
    if status != 0 || r.mismatches != 0 {
        println!(
            "workload failed: exit status {status}, {} wrong results",
            r.mismatches
        );
        stop(exit_status::FAILURE)
    }
    stop(exit_status::SUCCESS)
}

/// The `@result` keys only sched-messaging has.
struct Messaging<'a>(Option<&'a Config>);
impl core::fmt::Display for Messaging<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.0 {
            Some(c) => write!(
                f,
                " groups={} loops={} mode={} tasks={}",
                c.groups,
                c.loops,
                c.mode.name(),
                c.groups * 2 * GROUP_SIZE + 1
            ),
            None => Ok(()),
        }
    }
}

/// The `@result` keys of a run with a working set (`wss=`).
struct WorkingSet<'a>(&'a Config, Option<&'a workingset::Outcome>);
impl core::fmt::Display for WorkingSet<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let (c, Some(w)) = (self.0, self.1) else {
            return Ok(());
        };
        write!(
            f,
            " wss={} stride={} touches={} wss_pages={} touched={} touch_check={}",
            c.wss,
            c.stride,
            c.touches_per_iteration(),
            c.wss_pages.name(),
            w.touched,
            if w.ok() { "ok" } else { "bad" },
        )?;
        if let Some(r) = w.read_cycles {
            write!(f, " read_cycles={r}")?;
        }
        match w.read_cycles_min {
            Some(m) => write!(f, " read_cycles_min={m}"),
            None => Ok(()),
        }
    }
}

/// The `@result` keys of a run with a kernel working set (`kwss=`): its
/// size and the pages the calls read (each call of the loop, and the one
/// before the phase that gets the expected result).
struct KernelWorkingSet<'a>(&'a Config);
impl core::fmt::Display for KernelWorkingSet<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.0.kwss == 0 {
            return Ok(());
        }
        write!(
            f,
            " kwss={} kernel_touched={}",
            self.0.kwss,
            workingset::kernel_reads()
        )
    }
}

/// `fault=...`: raise the requested fault in the kernel (of this CPU).
pub fn raise(f: Fault) {
    println!("raising fault={} on purpose", f.name());
    match f {
        // SAFETY (all arms): deliberately faulting is the point; the
        // exception handler reports and stops the VM.
        Fault::Pf => unsafe {
            let unmapped = (arch::layout::TELEMETRY_VA + 0x10_0000) as usize as *const u64;
            core::ptr::read_volatile(unmapped);
        },
        Fault::Gp => cpu::raise_gp(),
        Fault::Ud => unsafe { core::arch::asm!("ud2", options(nostack)) },
        Fault::De => unsafe {
            core::arch::asm!("div {0:e}", in(reg) 0u32, inout("eax") 1u32 => _, inout("edx") 0u32 => _, options(nostack));
        },
        Fault::Hang => {
            println!("spinning for ever with interrupts off");
            // SAFETY: an endless loop at CPL0; only the VMM can stop it.
            unsafe { core::arch::asm!("cli", "2: jmp 2b", options(noreturn)) }
        }
        Fault::Halt => {
            println!("halting for ever with interrupts off");
            cpu::halt_forever()
        }
        Fault::Kread => return, // raised by the workload's user program
    }
    println!("fault={} was not raised", f.name());
    stop(exit_status::FAULT_NOT_RAISED)
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    println!("kernel panic: {info}");
    println!("@panic {}", info.message());
    stop(exit_status::PANIC)
}
