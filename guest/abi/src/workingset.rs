//! The user working set of the syscall-loop workloads (`wss=`, `stride=`,
//! `touches=`, `wss_pages=`): the TLB half of PTI's cost.
//!
//! Between two system calls the user loop reads `touches` addresses of a
//! buffer of `wss` bytes, `stride` bytes apart, cycling through it, so that
//! every flushing CR3 write makes the next pass walk those pages in again.
//! The spelling of the values and their bounds live here once, for the
//! guest's parser and the VMM's checks before boot.

/// Where the buffer starts in user space: 16 MiB, 2 MiB aligned, above the
/// user text and stack and inside the first GiB (one PDPT entry on x86_64,
/// the user PMD on x86_32 PAE).
pub const BASE: u64 = 0x100_0000;
/// Largest `wss=`: the buffer ends at 1 GiB.
pub const MAX_WSS: u64 = (1 << 30) - BASE;
/// Default `stride=`: one read per 4 KiB page.
pub const DEFAULT_STRIDE: u64 = 4096;
/// Smallest `stride=` (and its granularity): each read is of a machine word
/// that the loop wrote before the measured phase.
pub const MIN_STRIDE: u64 = 8;
/// Largest `touches=` (reads per iteration).
pub const MAX_TOUCHES: u64 = u32::MAX as u64;

/// Largest `kwss=`: the kernel working set's mapping (4 KiB pages just
/// above the telemetry page) stays small, and each call reads all of it.
pub const MAX_KWSS: u64 = 64 << 20;
/// Bytes between two reads of the kernel working set: one word per page.
pub const KWSS_STRIDE: u64 = 4096;

/// The control page, just below the buffer: the kernel writes the loop's
/// parameters, the loop writes what it did (64-bit little-endian words at
/// the offsets below; the 32-bit flavour uses the low word of the inputs).
pub mod control {
    /// User address of the page.
    pub const VA: u64 = super::BASE - 4096;
    /// In: the buffer's size in bytes.
    pub const SIZE: usize = 0;
    /// In: bytes between two reads.
    pub const STRIDE: usize = 8;
    /// In: reads per iteration.
    pub const TOUCHES: usize = 16;
    /// Out: reads done in the measured loop (counted by the loop).
    pub const TOUCHED: usize = 24;
    /// Out: sum of the words read (each slot holds its own offset), a
    /// check that the reads went where they should.
    pub const SUM: usize = 32;
    /// Out: TSC cycles the loop spent in its reads (RDTSC around each
    /// iteration's reads, summed): the user-mode half of the TLB refill
    /// cost, without the system call's.
    pub const READ_CYCLES: usize = 40;
    /// Out: the fewest TSC cycles of one iteration's reads (all ones if
    /// no iteration ran): the least disturbed iteration.
    pub const READ_CYCLES_MIN: usize = 48;
    /// Out, `workload=poundsyscall`: one record per thread, thread `i`'s at
    /// `THREADS + i * THREAD_RECORD`: the reads it did (64 bits, at +0) and
    /// the sum of the words it read (the machine word, at +8). Each thread
    /// writes only its own record, so the threads need no atomics; they do
    /// not time their reads (`READ_CYCLES` stays 0). The records of
    /// `options::MAX_THREADS` threads fit the page (asserted there).
    pub const THREADS: usize = 64;
    /// Bytes of one thread's record.
    pub const THREAD_RECORD: usize = 16;
}

/// Parses a size: decimal or `0x` hex, optionally followed by `K`, `M` or
/// `G` (binary multiples, either case). `None` if not a number or too big.
pub fn parse_size(s: &str) -> Option<u64> {
    let (digits, shift) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 10),
        b'm' | b'M' => (&s[..s.len() - 1], 20),
        b'g' | b'G' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let (digits, radix) = match digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        Some(hex) => (hex, 16),
        None => (digits, 10),
    };
    if digits.is_empty() {
        return None;
    }
    let n = u64::from_str_radix(digits, radix).ok()?;
    n.checked_mul(1 << shift)
}

/// Slots of the buffer the loop reads: offsets 0, stride, 2 stride, ... below `wss`.
pub const fn slots(wss: u64, stride: u64) -> u64 {
    if stride == 0 {
        return 0;
    }
    wss.div_ceil(stride)
}

/// The sum (mod 2^64) of the words `reads` consecutive reads return when
/// they cycle from offset 0 through the slots of the buffer, each slot
/// holding its own offset.
pub const fn expected_sum(reads: u64, wss: u64, stride: u64) -> u64 {
    let p = slots(wss, stride);
    if p == 0 {
        return 0;
    }
    let full = reads / p;
    let rest = reads % p;
    full.wrapping_mul(triangle(p, stride))
        .wrapping_add(triangle(rest, stride))
}

/// `stride * (0 + 1 + ... + (n - 1))`, mod 2^64.
const fn triangle(n: u64, stride: u64) -> u64 {
    let (a, b) = if n.is_multiple_of(2) {
        (n / 2, n.wrapping_sub(1))
    } else {
        (n, n.wrapping_sub(1) / 2)
    };
    a.wrapping_mul(b).wrapping_mul(stride)
}

/// Page size of the buffer's mappings, `wss_pages=`.
pub mod pages {
    /// 4 KiB.
    pub const SMALL: u64 = 4096;
    /// 2 MiB.
    pub const HUGE: u64 = 2 << 20;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64K"), Some(64 << 10));
        assert_eq!(parse_size("1m"), Some(1 << 20));
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(parse_size("0x10k"), Some(16 << 10));
        for bad in [
            "",
            "K",
            "1.5M",
            "-1",
            "1T",
            "0x",
            "99999999999999999999",
            "17179869184G",
        ] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }

    #[test]
    fn sums_match_a_simulation() {
        for (wss, stride) in [
            (4096, 4096),
            (10_000, 64),
            (1 << 20, 4096),
            (100, 8),
            (8, 4096),
        ] {
            for reads in [0, 1, 5, 300, 12_345] {
                let mut sum = 0u64;
                let mut off = 0u64;
                for _ in 0..reads {
                    sum = sum.wrapping_add(off);
                    off += stride;
                    if off >= wss {
                        off = 0;
                    }
                }
                assert_eq!(
                    expected_sum(reads, wss, stride),
                    sum,
                    "{wss} {stride} {reads}"
                );
            }
        }
        assert_eq!(slots(10_000, 64), 157);
        assert_eq!(slots(0, 64), 0);
    }
}
