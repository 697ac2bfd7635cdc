//! Does a guest CR3 write cost user code a TLB refill on this host?
//!
//! Hosts differ here: on some (Intel Xeon under kvm_pvm) every guest CR3
//! write makes user code walk its working set in again, ~8-9 ns per 4 KiB
//! page; on others (AMD EPYC under kvm_pvm) the host keeps the translations
//! and the refill never shows. PTI's per-page refill figure means something
//! only where it shows, so the probe measures it directly.
//!
//! The probe guest: user code runs `trips` round trips through the host's
//! working entry (`int3`, `int $4`, `int $0x80` or `syscall`); before each
//! trip it reads one word of each of `W` distinct 4 KiB pages (4 KiB page
//! tables, so each page is its own TLB entry). The handler returns at once
//! (`iretq`/`sysretq`), or first rewrites CR3 with its own value twice (the
//! PTI pair, non-global pages: each write flushes them). Four
//! configurations, W = 0 and W = [`PAGES`], each bare and with the rewrite,
//! run interleaved for [`ROUNDS`] rounds (one VM per configuration, its
//! program reloaded for every run); each run times its
//! trips with RDTSC in user mode after a warm-up. The refill is what the
//! rewrite adds with the working set beyond what it adds without:
//!
//! `((cr3(W) - bare(W)) - (cr3(0) - bare(0))) / W`, from the medians.
//!
//! The same from each configuration's fastest run (other load only adds
//! time). Verdict: `visible` where both reach [`THRESHOLD_NS_PER_PAGE`],
//! else `not visible` (docs/kvm-hosts.md gives the figures behind the
//! threshold).

use std::fmt;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::code::{self, Asm};
use super::entries::kernel_prologue;
use super::vm::{Kit, ProbeVm, Program, StartMode, Stop};
use crate::x86::{efer, pte};
use ptiscope_abi::options::Entry;

/// Pages in the working set (4 MiB): beyond the first-level data TLB of
/// every CPU seen, within the second level of most.
pub const PAGES: u32 = 1024;
/// Trips per timed batch.
pub const TRIPS: u32 = 25;
/// Timed batches per run: a run's figure is its fastest batch, so that a
/// host interrupt or preemption inside one batch does not count.
pub const BATCHES: u32 = 16;
/// Untimed trips first: fault the pages in, warm caches and TLBs.
pub const WARM_TRIPS: u32 = 8;
/// Interleaved rounds of the four configurations.
pub const ROUNDS: u32 = 7;
/// The verdict's threshold. Intel Xeon hosts under kvm_pvm showed 8-9 ns
/// per page, this project's AMD EPYC kvm_pvm host ~0 (within ±0.5 ns per
/// page run to run): 2 ns is 4x below the smallest visible figure and 4x
/// above the hidden host's spread.
pub const THRESHOLD_NS_PER_PAGE: f64 = 2.0;

/// Guest-physical base of the working set (a second RAM slot).
const WS_BASE: u64 = 0x40_0000;
/// The two 4 KiB page tables mapping the working set, right after it.
const WS_PT: u64 = WS_BASE + PAGES as u64 * 0x1000;
/// The second RAM slot: working set plus its page tables.
const WS_SLOT: usize = PAGES as usize * 0x1000 + 2 * 0x1000;
/// Where the user code stores each batch's TSC before and after (16 bytes
/// a batch), in the unused part of the user-stack page (user code never
/// pushes: entries from CPL3 switch to the kernel stack).
const TIMES: u64 = code::USER_STACK_TOP - 0x1000;
/// Where a gate handler goes (inside the kernel-code page, after the landings).
const GATE_HANDLER: u64 = code::SYSENTER_LANDING + 0x100;

/// The verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefillVerdict {
    /// A CR3 write makes user code walk its pages in again, at or above the threshold.
    Visible,
    /// Below the threshold: the host hides the refill.
    NotVisible,
    /// The probe could not measure (no entry works, RDTSC at CPL3 fails, a run failed).
    Unmeasured,
}

impl fmt::Display for RefillVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RefillVerdict::Visible => "visible",
            RefillVerdict::NotVisible => "not visible",
            RefillVerdict::Unmeasured => "unmeasured",
        })
    }
}

/// Medians over the rounds of one configuration's time per trip.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TripMedians {
    /// No working set, bare handler.
    pub bare_0: f64,
    /// No working set, CR3 rewrite in the handler.
    pub cr3_0: f64,
    /// W pages read per trip, bare handler.
    pub bare_w: f64,
    /// W pages read per trip, CR3 rewrite in the handler.
    pub cr3_w: f64,
}

/// What the refill probe found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RefillProbe {
    /// The verdict.
    pub verdict: RefillVerdict,
    /// The refill per page from the medians, ns (`None` if unmeasured).
    pub ns_per_page: Option<f64>,
    /// The refill per page from each configuration's fastest run, ns.
    pub ns_per_page_fastest: Option<f64>,
    /// The lowest and highest per-round estimate, ns per page: the spread.
    pub ns_per_page_range: Option<(f64, f64)>,
    /// The verdict's threshold, ns per page.
    pub threshold_ns_per_page: f64,
    /// The entry the trips used.
    pub entry: Option<Entry>,
    /// Pages of the working set (W).
    pub pages: u32,
    /// Trips per timed batch (a run's figure is its fastest of `batches`).
    pub trips: u32,
    /// Timed batches per run.
    pub batches: u32,
    /// Interleaved rounds.
    pub rounds: u32,
    /// Guest TSC frequency used to turn cycles into ns, kHz, and where it came from.
    pub tsc_khz: Option<f64>,
    /// Medians of the time per trip, ns.
    pub medians_ns_per_trip: Option<TripMedians>,
    /// Wall time of the probe, ms.
    pub elapsed_ms: f64,
    /// The figures behind the verdict, or why there is none.
    pub detail: String,
}

impl RefillProbe {
    /// An unmeasured result saying why.
    pub fn unmeasured(entry: Option<Entry>, why: String) -> Self {
        RefillProbe {
            verdict: RefillVerdict::Unmeasured,
            ns_per_page: None,
            ns_per_page_fastest: None,
            ns_per_page_range: None,
            threshold_ns_per_page: THRESHOLD_NS_PER_PAGE,
            entry,
            pages: PAGES,
            trips: TRIPS,
            batches: BATCHES,
            rounds: 0,
            tsc_khz: None,
            medians_ns_per_trip: None,
            elapsed_ms: 0.0,
            detail: why,
        }
    }
}

/// Which handler ends a trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handler {
    Bare,
    Cr3,
}

/// One timed run: TSC cycles of its fastest batch of [`TRIPS`] trips, all
/// its batches' cycles, and the host's wall time around the whole run (the
/// frequency fallback).
struct Run {
    cycles: u64,
    all_cycles: u64,
    wall_ns: f64,
}

/// The entry instruction's bytes, the handler's address and its return.
fn entry_parts(entry: Entry) -> Option<(&'static [u8], u64, &'static [u8])> {
    const IRETQ: &[u8] = &[0x48, 0xcf];
    const SYSRETQ: &[u8] = &[0x48, 0x0f, 0x07];
    Some(match entry {
        Entry::Int3 => (&[0xcc], GATE_HANDLER, IRETQ),
        Entry::Int4 => (&[0xcd, 0x04], GATE_HANDLER, IRETQ),
        Entry::Int80 => (&[0xcd, 0x80], GATE_HANDLER, IRETQ),
        Entry::Syscall => (&[0x0f, 0x05], code::SYSCALL_LANDING, SYSRETQ),
        _ => return None,
    })
}

/// One trip loop of `trips` trips, reading `pages` pages before each.
/// EBX counts trips, ESI walks the pages, EDX counts them, EAX takes the
/// loads (`syscall` clobbers RCX and R11 only, the gate handlers RAX).
fn trip_loop(u: &mut Asm, trips: u32, pages: u32, insn: &[u8]) {
    u.raw(&[0xbb]).raw(&trips.to_le_bytes()); // mov ebx, imm32
    let top = u.here();
    if pages > 0 {
        u.raw(&[0xbe]).raw(&(WS_BASE as u32).to_le_bytes()); // mov esi, imm32
        u.raw(&[0xba]).raw(&pages.to_le_bytes()); // mov edx, imm32
        let inner = u.here();
        u.raw(&[0x8b, 0x06]); // mov eax, [rsi]
        u.raw(&[0x81, 0xc6, 0x00, 0x10, 0x00, 0x00]); // add esi, 0x1000
        u.raw(&[0xff, 0xca]); // dec edx
        jnz8(u, inner);
    }
    u.raw(insn);
    u.raw(&[0xff, 0xcb]); // dec ebx
    jnz8(u, top);
}

/// `jnz rel8` back to `target`: 75 cb.
fn jnz8(u: &mut Asm, target: u64) {
    let rel = target as i64 - (u.here() as i64 + 2);
    debug_assert!((-128..0).contains(&rel), "short jump out of range");
    u.raw(&[0x75, rel as i8 as u8]);
}

/// User code: warm-up trips, then [`BATCHES`] timed batches (R8D counts
/// them, R9 points at the batch's record in [`TIMES`]): RDTSC, stored as
/// start low and high; the batch's trips; RDTSC, stored as end low and
/// high. Plain stores to RAM, so nothing exits to the VMM until the end.
fn user_code(pages: u32, insn: &[u8]) -> Asm {
    let mut u = Asm::new(code::USER_CODE);
    trip_loop(&mut u, WARM_TRIPS, pages, insn);
    u.raw(&[0x41, 0xb8]).raw(&BATCHES.to_le_bytes()); // mov r8d, imm32
    u.raw(&[0x41, 0xb9]).raw(&(TIMES as u32).to_le_bytes()); // mov r9d, imm32
    let batch = u.here();
    u.rdtsc();
    u.raw(&[0x41, 0x89, 0x01, 0x41, 0x89, 0x51, 0x04]); // mov [r9], eax; mov [r9+4], edx
    trip_loop(&mut u, TRIPS, pages, insn);
    u.rdtsc();
    u.raw(&[0x41, 0x89, 0x41, 0x08, 0x41, 0x89, 0x51, 0x0c]); // mov [r9+8], eax; mov [r9+12], edx
    u.raw(&[0x41, 0x83, 0xc1, 0x10]); // add r9d, 16
    u.raw(&[0x41, 0xff, 0xc8]); // dec r8d
                                // jnz rel32 back to the batch: 0F 85 cd.
    let rel = batch as i64 - (u.here() as i64 + 6);
    u.raw(&[0x0f, 0x85]).raw(&(rel as i32).to_le_bytes());
    u.end(0);
    u
}

fn handler(at: u64, h: Handler, ret: &[u8]) -> Asm {
    let mut a = Asm::new(at);
    if h == Handler::Cr3 {
        for _ in 0..2 {
            a.mov_eax_cr3().mov_cr3_eax();
        }
    }
    a.raw(ret);
    a
}

/// One configuration's VM and program, kept over the rounds: each round
/// reloads the program and registers and runs it again (a fresh VM per run
/// would spend most of the probe creating VMs and faulting their 4 MiB in).
struct Config {
    vm: ProbeVm,
    program: Program,
}

fn prepare(kit: &Kit, entry: Entry, pages: u32, h: Handler) -> Result<Config, String> {
    let (insn, at, ret) =
        entry_parts(entry).ok_or_else(|| format!("entry {entry} is not one the probe drives"))?;
    let vm = ProbeVm::with_extra_ram(kit, Some((WS_BASE, WS_SLOT))).map_err(|e| e.to_string())?;
    let mut p = Program::new(StartMode::Long64, kernel_prologue());
    p.extra.push(user_code(pages, insn));
    p.extra.push(handler(at, h, ret));
    if at == GATE_HANDLER {
        let vector = match entry {
            Entry::Int4 => 4,
            Entry::Int80 => 0x80,
            _ => 3,
        };
        p.gate_overrides.push((vector, GATE_HANDLER));
    } else {
        p.efer_extra = efer::SCE;
        p.msrs = code::syscall_msrs().to_vec();
    }
    Ok(Config { vm, program: p })
}

fn run_one(kit: &Kit, c: &mut Config) -> Result<Run, String> {
    let vm = &mut c.vm;
    vm.load(&c.program).map_err(|e| e.to_string())?;
    vm.write(TIMES, &[0u8; 16 * BATCHES as usize])
        .map_err(|e| e.to_string())?;
    // The working set's tables: PD entries 2 and 3 (4-6 MiB, 6-8 MiB) point
    // at two 4 KiB page tables whose 1024 entries map the pages in order.
    let flags = pte::PRESENT | pte::WRITABLE | pte::USER;
    let mut pts = Vec::with_capacity(PAGES as usize * 8);
    for i in 0..u64::from(PAGES) {
        pts.extend_from_slice(&((WS_BASE + i * 0x1000) | flags).to_le_bytes());
    }
    vm.write(WS_PT, &pts).map_err(|e| e.to_string())?;
    for (i, pt) in [WS_PT, WS_PT + 0x1000].into_iter().enumerate() {
        let pde = code::PD + 8 * (WS_BASE / 0x20_0000 + i as u64);
        vm.write(pde, &(pt | flags).to_le_bytes())
            .map_err(|e| e.to_string())?;
    }
    let start = Instant::now();
    let t = vm.run(kit.timeout).map_err(|e| e.to_string())?;
    let wall_ns = start.elapsed().as_secs_f64() * 1e9;
    if t.stop != Stop::End(0) {
        return Err(format!(
            "a trip loop did not finish: {} at {}",
            t.stop,
            t.where_()
        ));
    }
    let mut raw = vec![0u8; 16 * BATCHES as usize];
    vm.read(TIMES, &mut raw).map_err(|e| e.to_string())?;
    let batches: Vec<u64> = raw
        .chunks_exact(16)
        .map(|b| {
            let at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
            at(8).wrapping_sub(at(0))
        })
        .collect();
    if let Some(bad) = batches.iter().find(|&&c| c == 0 || c > u64::from(u32::MAX)) {
        return Err(format!(
            "a timed batch took an implausible {bad} TSC cycles"
        ));
    }
    let cycles = batches.iter().copied().min().unwrap_or(0);
    let all_cycles = batches.iter().sum();
    Ok(Run {
        cycles,
        all_cycles,
        wall_ns,
    })
}

/// The guest TSC frequency: KVM_GET_TSC_KHZ, else cycles over the host's
/// wall time of the longest run (which includes VM entry, so a slight
/// underestimate of the frequency).
fn tsc_khz(kit: &Kit, longest: Option<&Run>) -> Option<(f64, &'static str)> {
    if let Ok(vm) = ProbeVm::new(kit) {
        if let Ok(khz) = vm.vcpu.get_tsc_khz() {
            if khz > 0 {
                return Some((f64::from(khz), "KVM_GET_TSC_KHZ"));
            }
        }
    }
    longest
        .filter(|r| r.wall_ns > 0.0)
        .map(|r| (r.all_cycles as f64 / r.wall_ns * 1e6, "host clock"))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The per-page refill from four per-trip times (any unit): what the CR3
/// rewrite adds with the working set beyond what it adds without, per page.
pub fn refill_per_page(m: &TripMedians, pages: u32) -> f64 {
    ((m.cr3_w - m.bare_w) - (m.cr3_0 - m.bare_0)) / f64::from(pages)
}

/// The verdict for a refill of `ns_per_page`.
pub fn verdict_for(ns_per_page: f64) -> RefillVerdict {
    if ns_per_page >= THRESHOLD_NS_PER_PAGE {
        RefillVerdict::Visible
    } else {
        RefillVerdict::NotVisible
    }
}

/// Runs the refill probe through `entry` (the host's working entry).
pub fn probe(kit: &Kit, entry: Option<Entry>) -> RefillProbe {
    let start = Instant::now();
    let mut r = match entry {
        Some(e) => measure(kit, e).unwrap_or_else(|why| RefillProbe::unmeasured(Some(e), why)),
        None => RefillProbe::unmeasured(
            None,
            "no user-mode entry reaches CPL0 here, so there is no trip to time".into(),
        ),
    };
    r.elapsed_ms = start.elapsed().as_secs_f64() * 1e3;
    r
}

fn measure(kit: &Kit, entry: Entry) -> Result<RefillProbe, String> {
    let configs = [
        (0, Handler::Bare),
        (0, Handler::Cr3),
        (PAGES, Handler::Bare),
        (PAGES, Handler::Cr3),
    ];
    // cycles per trip, [config][round]
    let mut per_trip: [Vec<f64>; 4] = Default::default();
    let mut longest: Option<Run> = None;
    let mut prepared = configs
        .iter()
        .map(|&(pages, h)| prepare(kit, entry, pages, h))
        .collect::<Result<Vec<_>, _>>()?;
    for _ in 0..ROUNDS {
        for (i, c) in prepared.iter_mut().enumerate() {
            let run = run_one(kit, c)?;
            per_trip[i].push(run.cycles as f64 / f64::from(TRIPS));
            if longest.as_ref().is_none_or(|l| run.wall_ns > l.wall_ns) {
                longest = Some(run);
            }
        }
    }
    let (khz, khz_source) = tsc_khz(kit, longest.as_ref())
        .ok_or_else(|| "the guest TSC frequency is unknown (no KVM_GET_TSC_KHZ)".to_string())?;
    let ns = |cycles: f64| cycles / khz * 1e6;
    // Per-round estimates: the spread.
    let rounds: Vec<f64> = (0..ROUNDS as usize)
        .map(|k| {
            let m = TripMedians {
                bare_0: per_trip[0][k],
                cr3_0: per_trip[1][k],
                bare_w: per_trip[2][k],
                cr3_w: per_trip[3][k],
            };
            ns(refill_per_page(&m, PAGES))
        })
        .collect();
    let lo = rounds.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = rounds.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    // The fastest run of each configuration: other load only ever adds
    // time, so these are the least disturbed figures.
    let fastest = |v: &[f64]| ns(v.iter().copied().fold(f64::INFINITY, f64::min));
    let f = TripMedians {
        bare_0: fastest(&per_trip[0]),
        cr3_0: fastest(&per_trip[1]),
        bare_w: fastest(&per_trip[2]),
        cr3_w: fastest(&per_trip[3]),
    };
    let fastest_per_page = refill_per_page(&f, PAGES);
    let [a, b, c, d] = &mut per_trip;
    let m = TripMedians {
        bare_0: ns(median(a)),
        cr3_0: ns(median(b)),
        bare_w: ns(median(c)),
        cr3_w: ns(median(d)),
    };
    let per_page = refill_per_page(&m, PAGES);
    // A refill that is real costs the fastest runs as much as the typical
    // ones; a figure that only the medians show is other load.
    let verdict = verdict_for(per_page.min(fastest_per_page));
    let detail = format!(
        "{per_page:.2} ns/page from the medians, {fastest_per_page:.2} from the fastest runs \
         (rounds {lo:.2}..{hi:.2}; threshold {THRESHOLD_NS_PER_PAGE} ns/page, both must reach it); \
         CR3 rewrite adds {:.0} ns/trip with {PAGES} pages, {:.0} without \
         (ns/trip medians: bare {:.0} / {:.0}, CR3 {:.0} / {:.0} at 0 / {PAGES} pages); \
         {entry} trips, fastest of {BATCHES} batches of {TRIPS} per run, {ROUNDS} interleaved rounds, \
         TSC {:.0} MHz ({khz_source})",
        m.cr3_w - m.bare_w,
        m.cr3_0 - m.bare_0,
        m.bare_0,
        m.bare_w,
        m.cr3_0,
        m.cr3_w,
        khz / 1e3,
    );
    Ok(RefillProbe {
        verdict,
        ns_per_page: Some(per_page),
        ns_per_page_fastest: Some(fastest_per_page),
        ns_per_page_range: Some((lo, hi)),
        threshold_ns_per_page: THRESHOLD_NS_PER_PAGE,
        entry: Some(entry),
        pages: PAGES,
        trips: TRIPS,
        batches: BATCHES,
        rounds: ROUNDS,
        tsc_khz: Some(khz),
        medians_ns_per_trip: Some(m),
        elapsed_ms: 0.0,
        detail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refill_is_the_rewrites_growth_per_page() {
        let m = TripMedians {
            bare_0: 1000.0,
            cr3_0: 2800.0,
            bare_w: 4000.0,
            cr3_w: 4000.0 + 1800.0 + 9216.0,
        };
        assert_eq!(refill_per_page(&m, 1024), 9.0);
        assert_eq!(verdict_for(9.0), RefillVerdict::Visible);
        assert_eq!(verdict_for(THRESHOLD_NS_PER_PAGE), RefillVerdict::Visible);
        assert_eq!(verdict_for(0.06), RefillVerdict::NotVisible);
        assert_eq!(verdict_for(-0.4), RefillVerdict::NotVisible);
    }

    #[test]
    fn the_user_loop_reads_every_page_and_fits_its_slot() {
        let u = user_code(PAGES, &[0xcc]);
        assert!(u.here() <= TIMES, "{:#x}", u.here());
        // mov esi, WS_BASE; mov edx, PAGES; then the load and the stride.
        let b = u.bytes();
        let needle = [0x8b, 0x06, 0x81, 0xc6, 0x00, 0x10, 0x00, 0x00];
        assert_eq!(b.windows(needle.len()).filter(|w| *w == needle).count(), 2);
        // Without a working set there are no loads.
        let u0 = user_code(0, &[0xcc]);
        assert_eq!(
            u0.bytes().windows(2).filter(|w| *w == [0x8b, 0x06]).count(),
            0
        );
        // The working set and its tables lie in the second slot, whose PD
        // entries (2 and 3) do not touch the low 2 MiB page at entry 0.
        assert_eq!(WS_BASE % 0x20_0000, 0);
        assert!(WS_PT + 0x2000 <= WS_BASE + WS_SLOT as u64);
    }

    #[test]
    fn only_entries_the_probe_can_drive_are_used() {
        assert!(entry_parts(Entry::Int3).is_some());
        assert!(entry_parts(Entry::Syscall).is_some());
        assert!(entry_parts(Entry::Sysenter).is_none());
    }
}
