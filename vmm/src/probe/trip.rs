//! The bare user→kernel→user trip: the floor under every syscall figure.
//!
//! A probe VM's user code runs `int3` in a loop; the gate's handler is a
//! lone `iretq` (optionally preceded by two CR3 writes, the PTI switch pair
//! without anything else). The trip is measured twice, with a short and a
//! long loop, and the difference divided by the difference in iterations,
//! so set-up, reports and teardown cancel out exactly. Time comes from the
//! guest's RDTSC in user mode, kernel instructions from KVM's
//! `insn_emulation` stat (where the host has it: software-virtualizer KVMs
//! emulate guest kernel code and count each instruction).

use serde::Serialize;

use super::code::{self, report, Asm};
use super::entries::kernel_prologue;
use super::vm::{Kit, ProbeVm, Program, StartMode, Stop};
use super::{ProbeError, ProbeOptions};
use crate::machine::kvm_stats::KvmStats;

/// Where the bare handler goes (inside the kernel-code page, after the landings).
const HANDLER: u64 = code::SYSENTER_LANDING + 0x100;

/// What the handler does besides `iretq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TripKind {
    /// `iretq` only.
    Bare,
    /// `mov rax, cr3; mov cr3, rax` twice, then `iretq`: the CR3 writes of a
    /// PTI entry and exit, without anything else.
    Cr3Pair,
}

/// Per-trip figures.
#[derive(Debug, Clone, Serialize)]
pub struct TripMeasurement {
    /// Which round trip.
    pub kind: TripKind,
    /// Trips in the long loop minus trips in the short one.
    pub trips: u32,
    /// Guest TSC cycles per trip (user-mode RDTSC around the loop).
    pub tsc_per_trip: f64,
    /// Guest kernel instructions per trip (KVM `insn_emulation`), if the host counts them.
    pub kernel_instructions_per_trip: Option<f64>,
    /// KVM `exits` per trip, if the host has the stats fd.
    pub exits_per_trip: Option<f64>,
    /// KVM `tlb_flush` per trip, if the host reports it.
    pub tlb_flushes_per_trip: Option<f64>,
}

/// One loop of `n` trips: (TSC delta, stats before, stats after).
struct Loop {
    tsc: u64,
    stats: Option<(u64, u64, u64)>,
}

fn handler(kind: TripKind) -> Asm {
    let mut h = Asm::new(HANDLER);
    if kind == TripKind::Cr3Pair {
        for _ in 0..2 {
            h.mov_eax_cr3().mov_cr3_eax();
        }
    }
    h.iretq();
    h
}

fn user_loop(n: u32) -> Asm {
    let mut u = Asm::new(code::USER_CODE);
    u.mov_ecx(n).rdtsc().report_edx_eax().mov_ecx(n);
    // loop: int3; dec ecx; jnz loop   (cc / ff c9 / 75 fb: back 5 bytes)
    u.int3().raw(&[0xff, 0xc9, 0x75, 0xfb]);
    u.rdtsc().report_edx_eax().end(0);
    u
}

fn run_loop(kit: &Kit, kind: TripKind, n: u32) -> Result<Loop, ProbeError> {
    let mut vm = ProbeVm::new(kit)?;
    let mut p = Program::new(StartMode::Long64, kernel_prologue());
    p.extra.push(user_loop(n));
    p.extra.push(handler(kind));
    p.gate_overrides.push((3, HANDLER));
    vm.load(&p)?;
    let stats = KvmStats::from_vcpu(&vm.vcpu).ok();
    let read = |s: &Option<KvmStats>| {
        s.as_ref().and_then(|s| s.read().ok()).map(|snap| {
            (
                snap.get("insn_emulation").unwrap_or(0),
                snap.get("exits").unwrap_or(0),
                snap.get("tlb_flush").unwrap_or(0),
            )
        })
    };
    let before = read(&stats);
    let t = vm.run(kit.timeout)?;
    let after = read(&stats);
    if t.stop != Stop::End(0) {
        return Err(ProbeError::Trip(format!(
            "the trip loop did not finish: {} at {}",
            t.stop,
            t.where_()
        )));
    }
    let v = t.values(report::VALUE);
    let [lo1, hi1, lo2, hi2] = v[..] else {
        return Err(ProbeError::Trip(format!(
            "the trip loop reported {} TSC halves, not 4",
            v.len()
        )));
    };
    let tsc = ((hi2 << 32) | lo2).wrapping_sub((hi1 << 32) | lo1);
    let stats = match (before, after) {
        (Some(b), Some(a)) => Some((a.0 - b.0, a.1 - b.1, a.2 - b.2)),
        _ => None,
    };
    Ok(Loop { tsc, stats })
}

/// Measures one kind of trip: loops of `short` and `long` trips, differenced.
pub fn measure(
    opts: &ProbeOptions,
    kind: TripKind,
    short: u32,
    long: u32,
) -> Result<TripMeasurement, ProbeError> {
    assert!(long > short, "the long loop must be longer");
    let kit = Kit::new(opts.timeout)?;
    let a = run_loop(&kit, kind, short)?;
    let b = run_loop(&kit, kind, long)?;
    let trips = long - short;
    let per = |x: u64, y: u64| (y as f64 - x as f64) / f64::from(trips);
    let stat = |f: fn(&(u64, u64, u64)) -> u64| match (&a.stats, &b.stats) {
        (Some(x), Some(y)) => Some(per(f(x), f(y))),
        _ => None,
    };
    Ok(TripMeasurement {
        kind,
        trips,
        tsc_per_trip: per(a.tsc, b.tsc),
        kernel_instructions_per_trip: stat(|s| s.0),
        exits_per_trip: stat(|s| s.1),
        tlb_flushes_per_trip: stat(|s| s.2),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn bare_trip_executes_one_kernel_instruction_and_the_cr3_pair_five() {
        if let Err(e) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
        {
            crate::test_support::skip("bare trip", &format!("/dev/kvm is not usable here ({e})"));
            return;
        }
        let opts = ProbeOptions {
            timeout: Duration::from_secs(10),
        };
        let bare = measure(&opts, TripKind::Bare, 10, 110).unwrap();
        let pair = measure(&opts, TripKind::Cr3Pair, 10, 110).unwrap();
        eprintln!("{bare:?}\n{pair:?}");
        assert!(bare.tsc_per_trip > 0.0 && pair.tsc_per_trip > 0.0);
        match (
            bare.kernel_instructions_per_trip,
            pair.kernel_instructions_per_trip,
        ) {
            // A host that emulates kernel code counts exactly the handler.
            (Some(b), Some(p)) if b > 0.0 => {
                assert_eq!(b, 1.0, "iretq only: {bare:?}");
                assert_eq!(p, 5.0, "4 CR3 moves + iretq: {pair:?}");
            }
            _ => crate::test_support::skip(
                "bare trip: kernel instructions per trip",
                "this host does not count emulated kernel instructions (KVM insn_emulation)",
            ),
        }
    }
}
