//! The guest's side of the telemetry region (`ptiscope_abi::telemetry`).
//!
//! Counters of CPU 0 live at the fixed virtual address
//! [`guest_core::layout::TELEMETRY_VA`], mapped to the page the VMM reserved
//! (`telemetry=0x...`), or to a page of the kernel image when there is none.
//! The entry code increments them with single `incq` instructions; Rust code
//! uses [`inc`]. Only this CPU writes them; the host reads them live.
use crate::arch::layout::TELEMETRY_VA;
use ptiscope_abi::telemetry::{self as abi, header, Counter};

/// Adds one to this CPU's counter `c`.
#[inline(always)]
pub fn inc(c: Counter) {
    add(c, 1)
}

/// Adds `n` to this CPU's counter `c` (its own block: one writer per block).
#[inline(always)]
pub fn add(c: Counter, n: u64) {
    crate::arch::percpu::counter_add(c, n)
}

/// A copy of all counters (summed over the CPUs), for per-phase deltas.
#[derive(Clone, Copy)]
pub struct Snapshot(pub [u64; Counter::COUNT]);

pub fn snapshot() -> Snapshot {
    // Taken inside the measured phase (between the markers' port writes),
    // so it is part of the phase's fixed cost: the CPU count is read once
    // and each block once, in address order.
    let mut s = [0u64; Counter::COUNT];
    for cpu in 0..crate::arch::smp::online().max(1) {
        for c in Counter::ALL {
            let v = crate::arch::percpu::counter_of(cpu, c);
            s[c as usize] = s[c as usize].wrapping_add(v);
        }
    }
    Snapshot(s)
}

impl Snapshot {
    pub fn delta(&self, since: &Snapshot, c: Counter) -> u64 {
        self.0[c as usize].wrapping_sub(since.0[c as usize])
    }
}

fn write_u32(off: usize, v: u32) {
    // SAFETY: `off` is a header offset inside the mapped telemetry page.
    unsafe { ((TELEMETRY_VA + off as u64) as usize as *mut u32).write_volatile(v) }
}

/// Writes the header, magic last, so a host that sees the magic sees the rest.
/// `cpus`: the CPUs whose blocks count (the others' blocks are still zero).
pub fn write_header(flags: u32, entry: u32, cpus: u32) {
    write_u32(header::VERSION, abi::VERSION);
    write_u32(header::CPU_COUNT, cpus);
    write_u32(header::CPU_BLOCK_OFFSET, abi::CPU_BLOCK_OFFSET as u32);
    write_u32(header::CPU_BLOCK_STRIDE, abi::CPU_BLOCK_STRIDE as u32);
    write_u32(header::COUNTER_COUNT, Counter::COUNT as u32);
    write_u32(header::FLAGS, flags);
    write_u32(header::ARCH, crate::arch::TELEMETRY_ARCH);
    write_u32(header::ENTRY, entry);
    // SAFETY: as above; the magic is 8-byte aligned at offset 0.
    unsafe {
        ((TELEMETRY_VA + header::MAGIC as u64) as usize as *mut u64).write_volatile(abi::MAGIC)
    }
}
