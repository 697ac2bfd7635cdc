//! ptiscope's QEMU TCG plugin: counts, per vCPU, what ptiscope reads from
//! KVM's statistics on the KVM backend, and snapshots all counters each
//! time the guest executes a 32-bit `out dx, eax` in kernel mode (the
//! guest's phase-marker write), so that in-phase counts are exact.
//!
//! Counted per vCPU (see `docs/telemetry-abi.md`, "The QEMU plugin"):
//! instructions executed, split kernel/user by address range; MOV-to-CR3,
//! INVLPG, INVPCID; SYSCALL, SYSENTER, INT n; SYSRET, SYSEXIT, IRET; and the
//! marker writes themselves.
//!
//! Cost: one exec callback per translation block and one per instruction
//! of the kinds above; nothing on other instructions. A block is split into
//! segments at those instructions: the block's callback adds the first
//! segment's instruction counts, each counted instruction's callback adds
//! its own segment (itself up to the next counted one). A marker callback
//! takes its snapshot *before* adding its segment, so a snapshot covers
//! exactly the instructions executed before the marker.
//!
//! Bindings: QEMU's stable plugin C API, looked up with `dlsym` when QEMU
//! installs the plugin (QEMU exports it from its own executable). Built
//! without the `api-v2` feature the plugin declares API version 1 (QEMU 6.0
//! to 8.2, e.g. Debian bookworm's 7.2); with it, version 2 (QEMU 9.0 and
//! later), where `qemu_plugin_insn_data` copies into a buffer from API
//! version 3 on (chosen at install time from the version QEMU reports).
//!
//! Arguments (`-plugin FILE,out=PATH,kernel=LO-HI[:LO-HI...]`): `out` is
//! the file the plugin writes at exit; `kernel` the guest-virtual address
//! ranges (inclusive, hex) whose instructions count as kernel instructions;
//! `marks` (optional, default: `kernel`) the ranges where an `out dx, eax`
//! takes a snapshot (the companion guest's marker writes are in its kernel
//! text; the firmware's PCI configuration writes are not).
//! `umark=PORT` (hex; a Linux guest's init) replaces that rule: a snapshot
//! is taken at exactly the user-mode (outside `kernel`) `out dx, eax` or
//! `mov dword ptr [edi], eax` (`89 07`; `[rdi]` in 64-bit code) whose
//! immediately preceding instruction in the same translation block is
//! `mov edx, PORT` (bytes `BA` + PORT as a little-endian imm32), and at no
//! kernel-mode `out` (Linux's own PCI configuration writes). ptiscope's
//! Linux init writes its phase markers with exactly one of those pairs:
//! the store to its MMIO marker page (mapped from `/dev/mem`, no I/O
//! permission held), or, where the kernel refuses that mapping, the `out`
//! after `ioperm`; API version 1 cannot read registers, so the port is
//! read from the instruction bytes. The snapshot is taken before the
//! store or `out` runs, so what it does (nothing, under TCG) is no part of
//! the counts.
//!
//! System calls apart from everything else: per vCPU the plugin follows
//! the mode of each block it sees run (kernel or user, by address). A
//! user-to-kernel switch right after a SYSCALL, SYSENTER or INT n executed
//! in user mode starts a call; the next kernel-to-user switch ends it, or
//! a SYSRET/SYSEXIT after which kernel code runs at once (an interrupt
//! delivered right after the return, before any user instruction). A
//! call in which an IRET was followed by kernel code (the end of an
//! interrupt or exception taken in kernel mode, or, indistinguishably
//! without reading the stack, an IRET to user mode interrupted at once)
//! is set apart whole, and
//! so is every kernel instruction not inside a call (interrupts and
//! exceptions taken from user mode, boot, idle, kernel threads): those go
//! to `kernel_insns_other` (a subset of `kernel_insns`) and the set-apart
//! calls to `calls_other`, so that `kernel_insns - kernel_insns_other`
//! over `syscalls - calls_other` is the path length of one undisturbed
//! call.
//!
//! A REP string instruction counts once: TCG runs one iteration per
//! execution of a block that starts at the instruction (it jumps back to
//! itself), so a block starting with a REP string instruction that
//! directly follows a block ending at that same instruction is the same
//! instruction's next iteration and does not count it again.
//!
//! Per-address counts (`pcs=1`): the undisturbed system calls' kernel
//! instructions, by address, for the calls that end between the first and
//! the second snapshot (the measured phase). Each segment with kernel
//! instructions gets a slot (its addresses and two counters) at translation;
//! while a call runs, its vCPU appends the slot of every kernel segment it
//! executes to a per-vCPU log (a `Vec` push: no hash lookup per executed
//! instruction), and at the call's end an undisturbed call in the phase adds
//! one to each logged slot (a disturbed call's log is dropped, as its
//! instructions go to `kernel_insns_other`). At exit the slots are expanded
//! into per-address counts; a call whose log overflowed is counted whole as
//! `unattributed`, so the per-address counts and `unattributed` sum to the
//! phase's undisturbed call instructions, never silently less.
//! `syms=PATH` (with `pcs=1`): the file QEMU's `isa-debugcon` wrote the
//! init's copy of `/proc/kallsyms` to; copied, as lines, into the output.
//!
//! Guest mode only (`svm=1`): the machine QEMU runs is itself a KVM host
//! (`--backend nested`: kvm_amd on QEMU's emulated SVM), and what is
//! measured is *its* guest, whose instructions QEMU executes too, between
//! the host's (its Linux, its VMM) on the same vCPU. Then only guest-mode
//! instructions count, and only guest-mode markers snapshot: a vCPU enters
//! guest mode at the VMRUN it executes (`0F 01 D8`, the host's KVM entering
//! its guest) and leaves it at the first block that starts right after
//! that VMRUN, where QEMU resumes the host at every #VMEXIT. Everything in
//! between is the guest's; everything else (the host kernel's exit
//! handling, its interrupts and context switches, the VMM in user mode) is
//! invisible, as if the guest ran alone. `kernel=` is then the guest's
//! kernel half. The host and its guest being the same kernel at the same
//! addresses does not matter: mode, not address, tells them apart. A block
//! translated while no vCPU runs its guest is the host's (QEMU keys its
//! blocks by the mode too) and gets no callback but its VMRUN's.
//!
//! Live snapshots (`live=PATH`): after each snapshot the plugin also
//! writes the whole file as it would be at exit so far (its marks, and
//! every vCPU's counters at that moment as `totals`) into the file at
//! PATH from offset 0, after a header line `ptiscope-live len=N` (N: the
//! bytes of the report that follow), or only the header when the report
//! does not fit the file's size. `--backend nested` maps that file into
//! the machine QEMU runs (an ivshmem device), so that the VMM there reads
//! its guest's counts at its own phase markers while QEMU still runs.
//!
//! Licence: GPL-2.0-or-later (QEMU plugins must be).

pub mod decode;
pub mod ffi;
pub mod output;

use std::cell::UnsafeCell;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

use decode::Kind;
use output::{CallPcs, Counts, Mark, Report, CALL_SPLIT, FIELDS};

/// The API version this build declares to QEMU.
#[cfg(not(feature = "api-v2"))]
pub const API_VERSION: c_int = 1;
/// The API version this build declares to QEMU.
#[cfg(feature = "api-v2")]
pub const API_VERSION: c_int = 2;

/// QEMU reads this before calling `qemu_plugin_install`.
#[no_mangle]
#[used]
pub static qemu_plugin_version: c_int = API_VERSION;

/// Most vCPUs counted (QEMU's x86 machines allow more; ptiscope uses <= 8).
const MAX_VCPUS: usize = 64;
/// Most snapshots kept; later markers are counted in `dropped_marks`.
const MAX_MARKS: usize = 4096;
/// Most kernel address ranges.
const MAX_RANGES: usize = 8;
/// Most segments one call's log holds; a longer call is counted whole as
/// `unattributed` (a getppid executes a few dozen segments).
const MAX_CALL_LOG: usize = 1 << 20;
/// Most bytes of the symbol file copied into the output.
const MAX_SYMS_BYTES: u64 = 24 << 20;
/// A log entry's flag: this execution skipped the segment's first
/// instruction (the next iteration of a REP string instruction).
const SKIP_FIRST: u32 = 1 << 31;
/// No slot (a segment without kernel instructions, or `pcs` off).
const NO_SLOT: u32 = u32::MAX;

/// The kernel instructions of one segment, for per-address counts.
struct Slot {
    /// Their addresses, in order.
    pcs: Vec<u64>,
    /// Executions inside undisturbed in-phase calls.
    runs: AtomicU64,
    /// Of those, the ones that skipped the first instruction (REP rule).
    skips: AtomicU64,
}

/// One vCPU's log of the current call's segments (slot index, maybe with
/// [`SKIP_FIRST`]). Only that vCPU's callbacks touch it, never two at once
/// (QEMU runs one vCPU's callbacks on one thread at a time).
struct CallLog(UnsafeCell<(Vec<u32>, bool)>);
// SAFETY: see the type's comment: one vCPU's callbacks, never concurrent.
unsafe impl Sync for CallLog {}

impl CallLog {
    /// The log and whether it overflowed.
    #[allow(clippy::mut_from_ref)]
    fn get(&self) -> &mut (Vec<u32>, bool) {
        // SAFETY: only the owning vCPU's callbacks call this, one at a time,
        // and no reference outlives a callback.
        unsafe { &mut *self.0.get() }
    }
}

/// One vCPU's counters: written only by that vCPU's thread.
struct VcpuCounters([AtomicU64; FIELDS.len()]);

impl VcpuCounters {
    fn add(&self, field: usize, n: u64) {
        // Single writer per vCPU: load + store is enough, and readers
        // (snapshots, exit) see each counter whole.
        let c = &self.0[field];
        c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }
    fn read(&self) -> Counts {
        Counts(std::array::from_fn(|i| self.0[i].load(Ordering::Relaxed)))
    }
}

/// Where one vCPU is, for telling system calls from everything else.
/// Written only by that vCPU's thread (Relaxed atomics: one writer).
struct Track {
    /// The mode of the last block that ran (boot starts in kernel mode).
    prev_kernel: AtomicBool,
    /// One of the `IN_*` values.
    state: AtomicU8,
    /// A SYSCALL/SYSENTER/INT n just ran in user mode.
    entry_pending: AtomicBool,
    /// An IRET just ran in kernel mode.
    iret_pending: AtomicBool,
    /// A SYSRET or SYSEXIT just ran (in kernel mode).
    sysret_pending: AtomicBool,
    /// `kernel_insns` when the current call began.
    call_start: AtomicU64,
    /// The [`output::CALL_SPLIT`] counters when the current call began.
    call_start_split: [AtomicU64; CALL_SPLIT.len()],
    /// The address of the last instruction of the last block that ran.
    last_pc: AtomicU64,
    /// Whether that instruction could reach into the next page, not first
    /// in its block ([`Block::last_cut`]).
    last_cut: AtomicBool,
    /// The current call's segments (`pcs=1`).
    log: CallLog,
    /// `svm=1`: the vCPU runs its guest (a VMRUN ran, no #VMEXIT since).
    in_guest: AtomicBool,
    /// `svm=1`: where the host resumes at a #VMEXIT (the address after
    /// the last VMRUN).
    resume_pc: AtomicU64,
}

/// In user mode.
const IN_USER: u8 = 0;
/// In a system call, undisturbed so far.
const IN_CALL: u8 = 1;
/// In a system call during which an interrupt or exception was taken.
const IN_DISTURBED_CALL: u8 = 2;
/// In kernel mode outside any system call.
const IN_OTHER: u8 = 3;

impl Track {
    fn new() -> Track {
        Track {
            prev_kernel: AtomicBool::new(true),
            state: AtomicU8::new(IN_OTHER),
            entry_pending: AtomicBool::new(false),
            iret_pending: AtomicBool::new(false),
            sysret_pending: AtomicBool::new(false),
            call_start: AtomicU64::new(0),
            call_start_split: std::array::from_fn(|_| AtomicU64::new(0)),
            last_pc: AtomicU64::new(u64::MAX),
            last_cut: AtomicBool::new(false),
            log: CallLog(UnsafeCell::new((Vec::new(), false))),
            in_guest: AtomicBool::new(false),
            resume_pc: AtomicU64::new(u64::MAX),
        }
    }
}

struct State {
    api: ffi::Api,
    out: String,
    kernel: Vec<(u64, u64)>,
    /// Where a kernel-mode `out dx, eax` takes a snapshot.
    marks_at: Vec<(u64, u64)>,
    /// `umark=PORT`: snapshots at user-mode `mov edx, PORT; out dx, eax`.
    user_mark_port: Option<u32>,
    vcpus: Vec<VcpuCounters>,
    tracks: Vec<Track>,
    /// vCPUs QEMU said the machine has (`-smp`).
    smp_vcpus: usize,
    marks: Mutex<(Vec<Mark>, u64)>,
    /// Marker executions so far (the snapshot's sequence number).
    seq: AtomicU64,
    /// `pcs=1`: per-address counts of the phase's calls.
    pcs: bool,
    /// `syms=PATH`.
    syms: Option<String>,
    /// Every slot made, by index.
    slots: Mutex<Vec<&'static Slot>>,
    /// Kernel instructions of in-phase undisturbed calls whose log overflowed.
    unattributed: AtomicU64,
    /// `svm=1`: count the guest of the machine's SVM only.
    svm: bool,
    /// `live=PATH`: the file each snapshot rewrites, and its size.
    live: Option<(std::fs::File, u64)>,
}

static STATE: OnceLock<State> = OnceLock::new();

/// Instruction counts of one segment of a block.
#[derive(Default, Clone, Copy)]
struct Segment {
    kernel: u64,
    user: u64,
}

/// The user data of a block's callback.
struct Block {
    /// The first segment (up to the first counted instruction).
    seg: Segment,
    /// Whether its first instruction is at a kernel address.
    kernel_mode: bool,
    /// Its first instruction's address.
    pc: u64,
    /// Its last instruction's address.
    last_pc: u64,
    /// Whether its first instruction is a REP string instruction.
    rep_first: bool,
    /// Whether its last instruction is not its first and starts close
    /// enough to the page end to reach into the next page (one QEMU < 8
    /// lists although the block stops before it).
    last_cut: bool,
    /// Its first segment's slot ([`NO_SLOT`]: none).
    slot: u32,
}

/// The user data of a counted instruction's callback.
struct Special {
    kind: Kind,
    pc: u64,
    /// Its length in bytes.
    len: u64,
    /// A marker: without `umark`, a kernel-mode `out dx, eax` inside the
    /// marker ranges; with it, a user-mode `mov edx, PORT; out dx, eax` or
    /// `mov edx, PORT; mov [edi], eax`.
    snapshot: bool,
    /// Whether it is at a kernel address.
    kernel_mode: bool,
    seg: Segment,
    /// Its segment's slot ([`NO_SLOT`]: none).
    slot: u32,
    /// A WRMSR's counter by MSR number (`mov ecx, imm32` earlier in its
    /// block, ECX not written since): the `wrmsr_<msr>` field, if one.
    msr_field: Option<usize>,
}

/// The `wrmsr_<msr>` counter of an MSR number, for the MSRs Linux's
/// mitigations write.
fn msr_field(msr: u32) -> Option<usize> {
    use output::field::*;
    match msr {
        0x48 => Some(WRMSR_SPEC_CTRL),
        0x49 => Some(WRMSR_PRED_CMD),
        0x10b => Some(WRMSR_FLUSH_CMD),
        _ => None,
    }
}

/// The counter of a counted instruction (`None`: VMRUN, which is not one).
fn field_of(kind: Kind) -> Option<usize> {
    use output::field::*;
    Some(match kind {
        Kind::Cr3Write => CR3_WRITES,
        Kind::Invlpg => INVLPG,
        Kind::Invpcid => INVPCID,
        Kind::Syscall => SYSCALL,
        Kind::Sysenter => SYSENTER,
        Kind::IntN => INT,
        Kind::Sysret => SYSRET,
        Kind::Sysexit => SYSEXIT,
        Kind::Iret => IRET,
        Kind::Out32 | Kind::MarkStore => MARKERS,
        Kind::Verw => VERW,
        Kind::Lfence => LFENCE,
        Kind::Wrmsr => WRMSR,
        Kind::Vmrun => return None,
    })
}

fn counters(vcpu: c_uint) -> Option<(&'static State, &'static VcpuCounters, &'static Track)> {
    let s = STATE.get()?;
    Some((s, s.vcpus.get(vcpu as usize)?, s.tracks.get(vcpu as usize)?))
}

fn add_segment(c: &VcpuCounters, t: &Track, seg: &Segment, slot: u32) {
    use output::field::*;
    if slot != NO_SLOT && seg.kernel != 0 && t.state.load(Ordering::Relaxed) == IN_CALL {
        let log = t.log.get();
        if log.0.len() < MAX_CALL_LOG {
            log.0.push(slot);
        } else {
            log.1 = true;
        }
    }
    if seg.kernel != 0 {
        c.add(KERNEL_INSNS, seg.kernel);
        // Outside a call kernel instructions are set apart at once; a
        // call's are set apart (or not) when it ends.
        if t.state.load(Ordering::Relaxed) == IN_OTHER {
            c.add(KERNEL_INSNS_OTHER, seg.kernel);
        }
    }
    if seg.user != 0 {
        c.add(USER_INSNS, seg.user);
    }
}

/// Sets a vCPU's flag and returns its old value: a load and a store, not
/// an atomic swap. Only the vCPU's own thread writes its [`Track`], so
/// the two are the swap; `swap` compiles to a locked `xchg`, and four of
/// them in every block's callback were most of a Linux boot's time under
/// the plugin (perf: 60 % of QEMU's for the boot the ledger repeats, over a third
/// of a nested session's CPU time under QEMU 10).
fn replace(flag: &AtomicBool, value: bool) -> bool {
    let old = flag.load(Ordering::Relaxed);
    if old != value {
        flag.store(value, Ordering::Relaxed);
    }
    old
}

/// A block of mode `kernel` starts running: follows the vCPU's mode
/// switches (module comment).
fn block_start(s: &State, c: &VcpuCounters, t: &Track, kernel: bool) {
    use output::field::*;
    let prev = replace(&t.prev_kernel, kernel);
    let entry = replace(&t.entry_pending, false);
    let iret = replace(&t.iret_pending, false);
    let sysret = replace(&t.sysret_pending, false);
    let state = t.state.load(Ordering::Relaxed);
    let now = |f: usize| c.0[f].load(Ordering::Relaxed);
    let end_call = || {
        if state == IN_DISTURBED_CALL {
            let start = t.call_start.load(Ordering::Relaxed);
            c.add(KERNEL_INSNS_OTHER, now(KERNEL_INSNS).wrapping_sub(start));
            for (k, &(f, other)) in CALL_SPLIT.iter().enumerate() {
                let start = t.call_start_split[k].load(Ordering::Relaxed);
                c.add(other, now(f).wrapping_sub(start));
            }
            c.add(CALLS_OTHER, 1);
        }
        if s.pcs {
            let log = t.log.get();
            // Only the calls that end inside the measured phase (after the
            // first snapshot, before the second) and were not set apart.
            if state == IN_CALL && s.seq.load(Ordering::Relaxed) == 1 {
                if log.1 {
                    let start = t.call_start.load(Ordering::Relaxed);
                    s.unattributed
                        .fetch_add(now(KERNEL_INSNS).wrapping_sub(start), Ordering::Relaxed);
                } else {
                    let slots = s.slots.lock().unwrap_or_else(|p| p.into_inner());
                    for &e in &log.0 {
                        if let Some(sl) = slots.get((e & !SKIP_FIRST) as usize) {
                            sl.runs.fetch_add(1, Ordering::Relaxed);
                            if e & SKIP_FIRST != 0 {
                                sl.skips.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
            }
            log.0.clear();
            log.1 = false;
        }
    };
    match (prev, kernel) {
        (false, true) if entry => {
            t.call_start.store(now(KERNEL_INSNS), Ordering::Relaxed);
            for (k, &(f, _)) in CALL_SPLIT.iter().enumerate() {
                t.call_start_split[k].store(now(f), Ordering::Relaxed);
            }
            t.state.store(IN_CALL, Ordering::Relaxed);
            if s.pcs {
                let log = t.log.get();
                log.0.clear();
                log.1 = false;
            }
        }
        // Kernel mode entered without a system-call instruction: an
        // interrupt or exception taken from user mode.
        (false, true) => t.state.store(IN_OTHER, Ordering::Relaxed),
        // A SYSRET/SYSEXIT returned to user mode, but an interrupt came
        // before the first user instruction (TCG delivers one pending
        // while the exit path ran with interrupts off right after the
        // return): the call ended at the return, the rest is the
        // interrupt's, taken from user mode.
        (true, true) if sysret && matches!(state, IN_CALL | IN_DISTURBED_CALL) => {
            end_call();
            t.state.store(IN_OTHER, Ordering::Relaxed);
        }
        // An IRET followed by kernel code: either it went back to kernel
        // code, ending an interrupt or exception taken inside the call, or
        // it returned to user mode and an interrupt came before the first
        // user instruction (as above). The plugin cannot tell which (it
        // cannot read the stack), so the call is set apart either way.
        (true, true) if iret && state == IN_CALL => {
            t.state.store(IN_DISTURBED_CALL, Ordering::Relaxed)
        }
        (true, false) => {
            end_call();
            t.state.store(IN_USER, Ordering::Relaxed);
        }
        _ => {}
    }
}

extern "C" fn on_tb_exec(vcpu: c_uint, udata: *mut c_void) {
    let Some((s, c, t)) = counters(vcpu) else {
        return;
    };
    // SAFETY: `udata` is a leaked `Box<Block>` made at translation; it
    // lives as long as the process.
    let b = unsafe { &*(udata as *const Block) };
    if s.svm && !still_in_guest(t, b.pc) {
        return;
    }
    block_start(s, c, t, b.kernel_mode);
    let mut seg = b.seg;
    let mut slot = b.slot;
    // The next iteration of the REP string instruction the last block
    // ended with, or the page-crossing instruction QEMU < 8 listed at the
    // end of the last block although that block stopped before it: the
    // same instruction, already counted.
    let again = b.rep_first || t.last_cut.load(Ordering::Relaxed);
    if again && t.last_pc.load(Ordering::Relaxed) == b.pc {
        if b.kernel_mode {
            seg.kernel = seg.kernel.saturating_sub(1);
            if slot != NO_SLOT {
                slot |= SKIP_FIRST;
            }
        } else {
            seg.user = seg.user.saturating_sub(1);
        }
    }
    t.last_pc.store(b.last_pc, Ordering::Relaxed);
    t.last_cut.store(b.last_cut, Ordering::Relaxed);
    add_segment(c, t, &seg, slot);
}

/// `svm=1`, at a block's start: whether the vCPU runs its guest. A block
/// that starts where the host resumes after its last VMRUN is the host's
/// (QEMU ends guest mode there at every #VMEXIT), and so is every block
/// until the next VMRUN.
fn still_in_guest(t: &Track, pc: u64) -> bool {
    if !t.in_guest.load(Ordering::Relaxed) {
        return false;
    }
    if pc == t.resume_pc.load(Ordering::Relaxed) {
        t.in_guest.store(false, Ordering::Relaxed);
        return false;
    }
    true
}

extern "C" fn on_special_exec(vcpu: c_uint, udata: *mut c_void) {
    let Some((s, c, t)) = counters(vcpu) else {
        return;
    };
    // SAFETY: `udata` is a leaked `Box<Special>` made at translation.
    let sp = unsafe { &*(udata as *const Special) };
    if s.svm {
        if sp.kind == Kind::Vmrun {
            // The host's own instruction (not counted): its guest runs
            // from the next block on, until a block starts after it.
            t.resume_pc
                .store(sp.pc.wrapping_add(sp.len), Ordering::Relaxed);
            t.in_guest.store(true, Ordering::Relaxed);
            return;
        }
        if !t.in_guest.load(Ordering::Relaxed) {
            return;
        }
    }
    match sp.kind {
        Kind::Syscall | Kind::Sysenter | Kind::IntN if !sp.kernel_mode => {
            t.entry_pending.store(true, Ordering::Relaxed)
        }
        Kind::Iret if sp.kernel_mode => t.iret_pending.store(true, Ordering::Relaxed),
        Kind::Sysret | Kind::Sysexit => t.sysret_pending.store(true, Ordering::Relaxed),
        _ => {}
    }
    if matches!(sp.kind, Kind::Out32 | Kind::MarkStore) {
        if !sp.snapshot {
            // Not a marker: a user-mode OUT of the companion guest faults
            // (IOPL 0), and OUTs outside the marker ranges are firmware's
            // (or, with `umark`, Linux's) PCI accesses.
            add_segment(c, t, &sp.seg, sp.slot);
            return;
        }
        let seq = s.seq.fetch_add(1, Ordering::Relaxed);
        let counts: Vec<Counts> = s.vcpus[..s.smp_vcpus].iter().map(|v| v.read()).collect();
        let mut m = s.marks.lock().unwrap_or_else(|p| p.into_inner());
        if m.0.len() < MAX_MARKS {
            m.0.push(Mark {
                seq,
                vcpu: vcpu as u64,
                pc: sp.pc,
                counts: counts.clone(),
            });
        } else {
            m.1 += 1;
        }
        if let Some((file, size)) = &s.live {
            write_live(s, file, *size, &m.0, m.1, counts);
        }
    }
    // A CR3 write (VERW, WRMSR ...) outside any call is set apart at
    // once, as its instructions are; a call's are set apart (or not) when
    // it ends.
    let outside = t.state.load(Ordering::Relaxed) == IN_OTHER;
    for f in field_of(sp.kind).into_iter().chain(sp.msr_field) {
        c.add(f, 1);
        if let (true, Some(&(_, other))) = (outside, CALL_SPLIT.iter().find(|(x, _)| *x == f)) {
            c.add(other, 1);
        }
    }
    add_segment(c, t, &sp.seg, sp.slot);
}

/// Rewrites the live file (`live=PATH`, module comment): a header line,
/// then the report so far, `totals` being `now`; only the header when the
/// report does not fit. A write that fails is said once.
fn write_live(
    s: &State,
    file: &std::fs::File,
    size: u64,
    marks: &[Mark],
    dropped: u64,
    now: Vec<Counts>,
) {
    use std::os::unix::fs::FileExt;
    static SAID: AtomicBool = AtomicBool::new(false);
    let text = Report {
        api: API_VERSION as u64,
        kernel: s.kernel.clone(),
        marks: marks.to_vec(),
        dropped_marks: dropped,
        totals: now,
        call_pcs: None,
        symbols: None,
    }
    .render();
    let header = format!("ptiscope-live len={}\n", text.len());
    let mut buf = header.into_bytes();
    if (buf.len() + text.len()) as u64 <= size {
        buf.extend_from_slice(text.as_bytes());
    }
    if let Err(e) = file.write_all_at(&buf, 0) {
        if !SAID.swap(true, Ordering::Relaxed) {
            s.api.say(&format!(
                "ptiscope-tcg-plugin: cannot write the live file: {e}\n"
            ));
        }
    }
}

/// The offset bits of a 4 KiB page.
const PAGE_MASK_LOW: u64 = 0xfff;
/// The longest x86 instruction, in bytes.
const MAX_INSN_LEN: u64 = 15;

extern "C" fn on_tb_trans(_id: ffi::PluginId, tb: *mut ffi::Tb) {
    let Some(s) = STATE.get() else { return };
    let api = &s.api;
    // SAFETY: `tb` is the block QEMU is translating, valid during this
    // callback; the API functions were resolved from QEMU itself.
    let n = unsafe { (api.tb_n_insns)(tb) };
    if s.svm && !s.tracks.iter().any(|t| t.in_guest.load(Ordering::Relaxed)) {
        host_block(s, tb, n);
        return;
    }
    let in_kernel = |pc: u64| s.kernel.iter().any(|&(lo, hi)| pc >= lo && pc <= hi);
    let mut first = Segment::default();
    let mut block = Block {
        seg: Segment::default(),
        kernel_mode: false,
        pc: 0,
        last_pc: 0,
        rep_first: false,
        last_cut: false,
        slot: NO_SLOT,
    };
    // The kernel addresses of the first segment (`pcs=1`).
    let mut first_pcs: Vec<u64> = Vec::new();
    let mut current: Option<(*mut ffi::Insn, Box<Special>, Vec<u64>)> = None;
    let mut pending: Vec<(*mut ffi::Insn, Box<Special>, Vec<u64>)> = Vec::new();
    let mut buf = [0u8; 16];
    // Whether the previous instruction of this block was `mov edx, PORT`.
    let mut after_port_mov = false;
    // The MSR number in ECX, as this block's instructions so far set it.
    let mut ecx_msr: Option<u32> = None;
    for i in 0..n {
        // SAFETY: `i < n`, the block's instruction count.
        let insn = unsafe { (api.tb_get_insn)(tb, i) };
        if insn.is_null() {
            continue;
        }
        // SAFETY: `insn` belongs to `tb`.
        let pc = unsafe { (api.insn_vaddr)(insn) };
        let kernel_mode = in_kernel(pc);
        // SAFETY: `insn` belongs to `tb`, in its translation callback.
        let bytes = unsafe { api.insn_bytes(insn, &mut buf) };
        // The last instruction (not the first) may reach into the next
        // page: x86 TCG then ends the block before it and translates it
        // again as the next block's first, but QEMU before 8.0 still lists
        // it here (with only its first byte). Whether it did shows at run
        // time: the next block starts at its address (`on_tb_exec`).
        block.last_cut = i > 0 && (pc & PAGE_MASK_LOW) > PAGE_MASK_LOW - MAX_INSN_LEN;
        if i == 0 {
            block.kernel_mode = kernel_mode;
            block.pc = pc;
            block.rep_first = decode::is_rep_string(bytes);
        }
        block.last_pc = pc;
        let port_mov = after_port_mov;
        after_port_mov = s
            .user_mark_port
            .is_some_and(|p| decode::is_mov_edx_imm(bytes, p));
        // `port_mov` is only ever true with `umark`.
        let msr_here = ecx_msr;
        ecx_msr = match decode::mov_ecx_imm(bytes) {
            Some(m) => Some(m),
            None if decode::keeps_ecx(bytes) => ecx_msr,
            None => None,
        };
        let kind = decode::classify(bytes)
            .or_else(|| {
                (port_mov && !kernel_mode && decode::is_mark_store(bytes))
                    .then_some(Kind::MarkStore)
            })
            .or_else(|| (s.svm && decode::is_vmrun(bytes)).then_some(Kind::Vmrun));
        if let Some(kind) = kind {
            let snapshot = match kind {
                Kind::MarkStore => true,
                Kind::Out32 => match s.user_mark_port {
                    Some(_) => !kernel_mode && port_mov,
                    None => kernel_mode && s.marks_at.iter().any(|&(lo, hi)| pc >= lo && pc <= hi),
                },
                _ => false,
            };
            if let Some(prev) = current.take() {
                pending.push(prev);
            }
            current = Some((
                insn,
                Box::new(Special {
                    kind,
                    pc,
                    len: bytes.len() as u64,
                    snapshot,
                    kernel_mode,
                    seg: Segment::default(),
                    slot: NO_SLOT,
                    msr_field: (kind == Kind::Wrmsr)
                        .then(|| msr_here.and_then(msr_field))
                        .flatten(),
                }),
                Vec::new(),
            ));
        }
        let (seg, pcs) = match current.as_mut() {
            Some((_, sp, pcs)) => (&mut sp.seg, pcs),
            None => (&mut first, &mut first_pcs),
        };
        if kernel_mode {
            seg.kernel += 1;
            if s.pcs {
                pcs.push(pc);
            }
        } else {
            seg.user += 1;
        }
    }
    if let Some(prev) = current.take() {
        pending.push(prev);
    }
    // Every block gets its callback, even one that starts with a counted
    // instruction (an empty first segment): mode switches are followed
    // at block starts.
    if n > 0 {
        block.seg = first;
        block.slot = new_slot(s, first_pcs);
        let udata = Box::into_raw(Box::new(block)) as *mut c_void;
        // SAFETY: `tb` is being translated; `udata` is never freed (a block
        // can run until the process ends).
        unsafe { (api.register_tb_exec)(tb, on_tb_exec, ffi::CB_NO_REGS, udata) };
    }
    for (insn, mut sp, pcs) in pending {
        sp.slot = new_slot(s, pcs);
        let udata = Box::into_raw(sp) as *mut c_void;
        // SAFETY: as above, for an instruction of `tb`.
        unsafe { (api.register_insn_exec)(insn, on_special_exec, ffi::CB_NO_REGS, udata) };
    }
}

/// `svm=1`: a block translated while no vCPU runs its guest, so one of
/// the host's (its Linux, its VMM): QEMU translates a block for the mode
/// it runs in (SVM's guest mode is part of a block's flags), so this one
/// never runs in guest mode, where alone anything counts. It gets no
/// callback but its VMRUNs', which enter guest mode: the callback at every
/// host block's start cost 12 % of QEMU's CPU time in a nested session's
/// Linux run (perf), though it returned at once there. A block translated
/// in guest mode, or on the host before the block where it resumes after a
/// #VMEXIT has run (that block is translated then too), keeps its callbacks.
fn host_block(s: &'static State, tb: *mut ffi::Tb, n: usize) {
    let api = &s.api;
    let mut buf = [0u8; 16];
    for i in 0..n {
        // SAFETY: `i < n`, the block's instruction count.
        let insn = unsafe { (api.tb_get_insn)(tb, i) };
        if insn.is_null() {
            continue;
        }
        // SAFETY: `insn` belongs to `tb`, in its translation callback.
        let bytes = unsafe { api.insn_bytes(insn, &mut buf) };
        if !decode::is_vmrun(bytes) {
            continue;
        }
        // SAFETY: as above.
        let pc = unsafe { (api.insn_vaddr)(insn) };
        let sp = Box::new(Special {
            kind: Kind::Vmrun,
            pc,
            len: bytes.len() as u64,
            snapshot: false,
            kernel_mode: s.kernel.iter().any(|&(lo, hi)| pc >= lo && pc <= hi),
            seg: Segment::default(),
            slot: NO_SLOT,
            msr_field: None,
        });
        let udata = Box::into_raw(sp) as *mut c_void;
        // SAFETY: as in `on_tb_trans`, for an instruction of `tb`; never freed.
        unsafe { (api.register_insn_exec)(insn, on_special_exec, ffi::CB_NO_REGS, udata) };
    }
}

/// A slot for a segment's kernel addresses; [`NO_SLOT`] for none (or when
/// the slot indices would run into [`SKIP_FIRST`]).
fn new_slot(s: &State, pcs: Vec<u64>) -> u32 {
    if pcs.is_empty() {
        return NO_SLOT;
    }
    let mut slots = s.slots.lock().unwrap_or_else(|p| p.into_inner());
    let i = slots.len();
    if i as u64 >= u64::from(SKIP_FIRST) {
        return NO_SLOT;
    }
    slots.push(Box::leak(Box::new(Slot {
        pcs,
        runs: AtomicU64::new(0),
        skips: AtomicU64::new(0),
    })));
    i as u32
}

/// The per-address counts of the phase's calls, from the slots.
fn call_pcs(s: &State) -> CallPcs {
    let mut by_pc = std::collections::BTreeMap::<u64, u64>::new();
    for sl in s.slots.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        let (runs, skips) = (
            sl.runs.load(Ordering::Relaxed),
            sl.skips.load(Ordering::Relaxed),
        );
        if runs == 0 {
            continue;
        }
        for (k, &pc) in sl.pcs.iter().enumerate() {
            let n = if k == 0 { runs - skips.min(runs) } else { runs };
            if n > 0 {
                *by_pc.entry(pc).or_default() += n;
            }
        }
    }
    CallPcs {
        pcs: by_pc.into_iter().collect(),
        unattributed: s.unattributed.load(Ordering::Relaxed),
    }
}

/// The symbol file's lines: printable ASCII only (anything else in a line
/// drops the line, counted), at most [`MAX_SYMS_BYTES`] read.
fn symbol_lines(path: &str) -> Result<(Vec<String>, u64), String> {
    use std::io::Read;
    let mut buf = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_SYMS_BYTES).read_to_end(&mut buf))
        .map_err(|e| format!("cannot read {path}: {e}"))?;
    let mut lines = Vec::new();
    let mut dropped = 0;
    for l in buf.split(|&b| b == b'\n') {
        if l.is_empty() {
            continue;
        }
        if l.iter().all(|&b| (0x20..0x7f).contains(&b)) {
            lines.push(String::from_utf8_lossy(l).into_owned());
        } else {
            dropped += 1;
        }
    }
    Ok((lines, dropped))
}

extern "C" fn on_exit(_id: ffi::PluginId, _udata: *mut c_void) {
    let Some(s) = STATE.get() else { return };
    let (marks, dropped) = {
        let m = s.marks.lock().unwrap_or_else(|p| p.into_inner());
        (m.0.clone(), m.1)
    };
    let report = Report {
        api: API_VERSION as u64,
        kernel: s.kernel.clone(),
        marks,
        dropped_marks: dropped,
        totals: s.vcpus[..s.smp_vcpus].iter().map(|v| v.read()).collect(),
        call_pcs: s.pcs.then(|| call_pcs(s)),
        symbols: None,
    };
    let mut report = report;
    if let Some(path) = &s.syms {
        match symbol_lines(path) {
            Ok(l) => report.symbols = Some(l),
            Err(e) => s.api.say(&format!("ptiscope-tcg-plugin: {e}\n")),
        }
    }
    if let Err(e) = std::fs::write(&s.out, report.render()) {
        s.api.say(&format!(
            "ptiscope-tcg-plugin: cannot write {}: {e}\n",
            s.out
        ));
    }
}

/// Parses `kernel=LO-HI[:LO-HI...]` (hex, inclusive).
pub fn parse_ranges(v: &str) -> Result<Vec<(u64, u64)>, String> {
    let hex = |t: &str| {
        let t = t.trim();
        u64::from_str_radix(t.strip_prefix("0x").unwrap_or(t), 16)
            .map_err(|_| format!("kernel range bound {t:?} is not a hex number"))
    };
    let mut out = Vec::new();
    for part in v.split(':').filter(|p| !p.is_empty()) {
        let (lo, hi) = part
            .split_once('-')
            .ok_or_else(|| format!("kernel range {part:?} is not LO-HI"))?;
        let (lo, hi) = (hex(lo)?, hex(hi)?);
        if lo > hi {
            return Err(format!("kernel range {part:?} ends before it starts"));
        }
        out.push((lo, hi));
    }
    if out.is_empty() || out.len() > MAX_RANGES {
        return Err(format!("kernel= takes 1 to {MAX_RANGES} ranges"));
    }
    Ok(out)
}

/// Called by QEMU once, when it loads the plugin.
///
/// # Safety
/// QEMU passes a valid `info` and `argc` NUL-terminated strings in `argv`.
#[no_mangle]
pub unsafe extern "C" fn qemu_plugin_install(
    id: ffi::PluginId,
    info: *const ffi::QemuInfo,
    argc: c_int,
    argv: *const *const c_char,
) -> c_int {
    let api = match ffi::Api::resolve() {
        Ok(a) => a,
        Err(missing) => {
            eprintln!("ptiscope-tcg-plugin: this QEMU lacks the plugin function {missing}");
            return -1;
        }
    };
    // SAFETY: QEMU's contract for `info`.
    let info = unsafe { &*info };
    let mut api = api;
    api.set_qemu_version(info.version_cur);
    if !info.system_emulation {
        api.say("ptiscope-tcg-plugin: system emulation only\n");
        return -1;
    }
    let mut out = None;
    let mut kernel = None;
    let mut marks_at = None;
    let mut user_mark_port = None;
    let mut pcs = false;
    let mut syms = None;
    let mut svm = false;
    let mut live = None;
    for i in 0..argc.max(0) as usize {
        // SAFETY: QEMU's contract for `argv`.
        let arg = unsafe { CStr::from_ptr(*argv.add(i)) }.to_string_lossy();
        match arg.split_once('=') {
            Some(("out", v)) if !v.is_empty() => out = Some(v.to_string()),
            Some(("pcs", "1")) => pcs = true,
            Some(("pcs", "0")) => pcs = false,
            Some(("syms", v)) if !v.is_empty() => syms = Some(v.to_string()),
            Some(("svm", "1")) => svm = true,
            Some(("svm", "0")) => svm = false,
            Some(("live", v)) if !v.is_empty() => {
                let opened = std::fs::OpenOptions::new()
                    .write(true)
                    .open(v)
                    .and_then(|f| Ok((f.metadata()?.len(), f)));
                match opened {
                    Ok((size, f)) => live = Some((f, size)),
                    Err(e) => {
                        api.say(&format!("ptiscope-tcg-plugin: live={v}: {e}\n"));
                        return -1;
                    }
                }
            }
            Some(("umark", v)) => {
                match u32::from_str_radix(v.trim().trim_start_matches("0x"), 16) {
                    Ok(p) if p <= 0xffff => user_mark_port = Some(p),
                    _ => {
                        api.say(&format!(
                            "ptiscope-tcg-plugin: umark={v:?} is not a hex port\n"
                        ));
                        return -1;
                    }
                }
            }
            Some((key @ ("kernel" | "marks"), v)) => match parse_ranges(v) {
                Ok(r) if key == "kernel" => kernel = Some(r),
                Ok(r) => marks_at = Some(r),
                Err(e) => {
                    api.say(&format!("ptiscope-tcg-plugin: {e}\n"));
                    return -1;
                }
            },
            _ => {
                api.say(&format!(
                    "ptiscope-tcg-plugin: unknown argument {arg:?} (takes out=PATH,kernel=LO-HI[:LO-HI...],marks=LO-HI[:...],umark=PORT,pcs=0|1,syms=PATH,svm=0|1,live=PATH)\n"
                ));
                return -1;
            }
        }
    }
    let (Some(out), Some(kernel)) = (out, kernel) else {
        api.say("ptiscope-tcg-plugin: needs out=PATH and kernel=LO-HI[:LO-HI...]\n");
        return -1;
    };
    // SAFETY: system emulation, so the union holds the `system` member.
    let (smp, max) = (info.smp_vcpus, info.max_vcpus);
    let n = (max.max(smp).max(1) as usize).min(MAX_VCPUS);
    let smp_vcpus = (smp.max(1) as usize).min(n);
    let state = State {
        api,
        out,
        marks_at: marks_at.unwrap_or_else(|| kernel.clone()),
        user_mark_port,
        kernel,
        vcpus: (0..n)
            .map(|_| VcpuCounters(std::array::from_fn(|_| AtomicU64::new(0))))
            .collect(),
        tracks: (0..n).map(|_| Track::new()).collect(),
        smp_vcpus,
        marks: Mutex::new((Vec::new(), 0)),
        seq: AtomicU64::new(0),
        pcs,
        syms,
        slots: Mutex::new(Vec::new()),
        unattributed: AtomicU64::new(0),
        svm,
        live,
    };
    if STATE.set(state).is_err() {
        return -1;
    }
    let Some(s) = STATE.get() else { return -1 };
    // SAFETY: the functions come from this QEMU; `id` is ours.
    unsafe {
        (s.api.register_tb_trans)(id, on_tb_trans);
        (s.api.register_atexit)(id, on_exit, std::ptr::null_mut());
    }
    0
}
