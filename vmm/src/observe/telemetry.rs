//! Host-side reader of the guest telemetry region (layout: ptiscope-abi,
//! docs/telemetry-abi.md).
//!
//! The guest owns the region's contents and may write anything there, at any
//! time, including while we read. So: the region's bounds are checked against
//! guest memory once, up front, by the VMM's own address (never by a value read
//! from the guest); every read goes through vm-memory; every header field is
//! validated before it is used; and counters are read with one atomic 64-bit
//! load each, so a value is never torn (the guest updates them with plain
//! naturally aligned stores).
//!
//! Size: about 250 of its lines are tests of hostile telemetry pages.

use std::sync::atomic::Ordering;

use ptiscope_abi::telemetry::{self as abi, header, Counter};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

/// Number of defined counters.
pub const COUNTERS: usize = Counter::COUNT;

/// Errors of locating or reading the telemetry region.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TelemetryError {
    /// The magic is still 0: the guest has not initialised the region yet
    /// (normal early in boot).
    #[error("telemetry region not initialised by the guest yet")]
    NotInitialized,
    /// The magic is neither 0 nor `PTISCOPE`: the guest wrote garbage.
    #[error("telemetry region has bad magic {0:#018x}")]
    BadMagic(u64),
    /// The guest speaks another layout version.
    #[error("telemetry layout version {found}, this VMM reads version {expected}")]
    BadVersion {
        /// The guest's layout version.
        found: u32,
        /// This VMM's [`ptiscope_abi::telemetry::VERSION`].
        expected: u32,
    },
    /// A header field disagrees with the layout this VMM was built with.
    #[error("telemetry header field {field} is {found}, expected {expected}")]
    BadLayout {
        /// The header field.
        field: &'static str,
        /// Its value in guest memory.
        found: u32,
        /// What this VMM expects (a value or range).
        expected: String,
    },
    /// The region does not lie entirely inside guest memory.
    #[error("telemetry region {gpa:#x}+{len:#x} is not inside guest memory")]
    OutOfBounds {
        /// Guest-physical start of the region.
        gpa: u64,
        /// Length of the region, bytes.
        len: u64,
    },
    /// vm-memory refused a read inside the (already checked) region, e.g.
    /// because the memory map changed.
    #[error("reading telemetry at {gpa:#x}: {msg}")]
    Read {
        /// Guest-physical address of the failed read.
        gpa: u64,
        /// vm-memory's message.
        msg: String,
    },
}

/// Errors of differencing two telemetry snapshots.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TelemetryDeltaError {
    /// A counter is smaller in the later snapshot. Counters only grow, so the
    /// guest scribbled over the region (or the snapshots were swapped): the
    /// figures of this interval are invalid.
    #[error("guest counter {counter} on cpu {cpu} went backwards ({before} -> {after}): telemetry invalid")]
    WentBackwards {
        /// The guest CPU.
        cpu: usize,
        /// The counter's name.
        counter: &'static str,
        /// Its value in the earlier snapshot.
        before: u64,
        /// Its value in the later snapshot.
        after: u64,
    },
    /// The number of live CPUs changed between the snapshots.
    #[error("guest cpu_count changed between snapshots ({before} -> {after})")]
    CpuCountChanged {
        /// CPUs in the earlier snapshot.
        before: usize,
        /// CPUs in the later snapshot.
        after: usize,
    },
}

/// Reads one guest's telemetry region.
#[derive(Debug)]
pub struct TelemetryReader<'m> {
    mem: &'m GuestMemoryMmap,
    gpa: GuestAddress,
}

/// Counters of one moment, validated.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TelemetrySnapshot {
    /// `ptiscope_abi::telemetry::flags` bits (PTI, PCID, ...).
    pub flags: u32,
    /// `ptiscope_abi::telemetry::arch` value.
    pub arch: u32,
    /// `ptiscope_abi::telemetry::entry` value.
    pub entry: u32,
    /// One block of counters per live CPU, indexed by `Counter as usize`.
    pub per_cpu: Vec<[u64; COUNTERS]>,
}

impl<'m> TelemetryReader<'m> {
    /// A reader for the region at `gpa`. Fails with `OutOfBounds` unless the
    /// whole `REGION_SIZE` region lies in guest RAM.
    pub fn new(mem: &'m GuestMemoryMmap, gpa: GuestAddress) -> Result<Self, TelemetryError> {
        let len = abi::REGION_SIZE;
        let in_bounds = gpa.0.checked_add(len).is_some()
            && gpa.0.is_multiple_of(8)
            && mem.check_range(gpa, len as usize);
        if !in_bounds {
            return Err(TelemetryError::OutOfBounds { gpa: gpa.0, len });
        }
        Ok(TelemetryReader { mem, gpa })
    }

    /// Guest-physical address of the region.
    pub fn gpa(&self) -> GuestAddress {
        self.gpa
    }

    /// Reads and validates the header, then every live CPU's counters.
    pub fn snapshot(&self) -> Result<TelemetrySnapshot, TelemetryError> {
        let magic = self.load_u64(header::MAGIC)?;
        if magic == 0 {
            return Err(TelemetryError::NotInitialized);
        }
        if magic != abi::MAGIC {
            return Err(TelemetryError::BadMagic(magic));
        }
        let version = self.read_u32(header::VERSION)?;
        if version != abi::VERSION {
            return Err(TelemetryError::BadVersion {
                found: version,
                expected: abi::VERSION,
            });
        }
        let cpu_count = self.read_u32(header::CPU_COUNT)?;
        if cpu_count == 0 || cpu_count as usize > abi::MAX_CPUS {
            return Err(TelemetryError::BadLayout {
                field: "cpu_count",
                found: cpu_count,
                expected: format!("1..={}", abi::MAX_CPUS),
            });
        }
        for (field, off, want) in [
            (
                "cpu_block_offset",
                header::CPU_BLOCK_OFFSET,
                abi::CPU_BLOCK_OFFSET,
            ),
            (
                "cpu_block_stride",
                header::CPU_BLOCK_STRIDE,
                abi::CPU_BLOCK_STRIDE,
            ),
            ("counter_count", header::COUNTER_COUNT, Counter::COUNT),
        ] {
            let found = self.read_u32(off)?;
            if found as usize != want {
                return Err(TelemetryError::BadLayout {
                    field,
                    found,
                    expected: want.to_string(),
                });
            }
        }
        let flags = self.read_u32(header::FLAGS)?;
        let arch = self.read_u32(header::ARCH)?;
        let entry = self.read_u32(header::ENTRY)?;

        // Offsets below come from the ABI constants (validated equal to the
        // header's), never from guest values; the region check in new()
        // covers them (const-asserted in ptiscope-abi).
        let mut per_cpu = Vec::with_capacity(cpu_count as usize);
        for cpu in 0..cpu_count as usize {
            let mut block = [0u64; COUNTERS];
            for c in Counter::ALL {
                block[c as usize] = self.load_u64(c.offset(cpu))?;
            }
            per_cpu.push(block);
        }
        Ok(TelemetrySnapshot {
            flags,
            arch,
            entry,
            per_cpu,
        })
    }

    fn addr(&self, offset: usize) -> GuestAddress {
        // Cannot overflow: offset < REGION_SIZE and new() checked gpa + REGION_SIZE.
        GuestAddress(self.gpa.0 + offset as u64)
    }

    fn read_u32(&self, offset: usize) -> Result<u32, TelemetryError> {
        let addr = self.addr(offset);
        self.mem
            .read_obj::<u32>(addr)
            .map(u32::from_le)
            .map_err(|e| TelemetryError::Read {
                gpa: addr.0,
                msg: e.to_string(),
            })
    }

    /// One atomic 64-bit load: the guest may be storing to this word.
    fn load_u64(&self, offset: usize) -> Result<u64, TelemetryError> {
        let addr = self.addr(offset);
        self.mem
            .load::<u64>(addr, Ordering::Relaxed)
            .map(u64::from_le)
            .map_err(|e| TelemetryError::Read {
                gpa: addr.0,
                msg: e.to_string(),
            })
    }
}

impl TelemetrySnapshot {
    /// Number of live CPUs.
    pub fn cpu_count(&self) -> usize {
        self.per_cpu.len()
    }

    /// `counter` on `cpu`, if that CPU is live.
    pub fn get(&self, cpu: usize, counter: Counter) -> Option<u64> {
        self.per_cpu.get(cpu).map(|b| b[counter as usize])
    }

    /// `counter` summed over all CPUs (saturating: a guest that writes huge
    /// values gets a huge total, not a panic).
    pub fn total(&self, counter: Counter) -> u64 {
        self.per_cpu
            .iter()
            .fold(0u64, |acc, b| acc.saturating_add(b[counter as usize]))
    }

    /// All counters summed over all CPUs.
    pub fn totals(&self) -> [u64; COUNTERS] {
        Counter::ALL.map(|c| self.total(c))
    }

    /// All CR3 writes (the four reasons; NOFLUSH is a subset, not added).
    pub fn cr3_writes(&self) -> u64 {
        [
            Counter::Cr3Entry,
            Counter::Cr3Exit,
            Counter::Cr3ContextSwitch,
            Counter::Cr3Other,
        ]
        .iter()
        .fold(0u64, |acc, &c| acc.saturating_add(self.total(c)))
    }

    /// `(name, total)` for every counter, in ABI order: what reports want.
    pub fn named_totals(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Counter::ALL.into_iter().map(|c| (c.name(), self.total(c)))
    }

    /// Whether a `ptiscope_abi::telemetry::flags` bit is set.
    pub fn has_flag(&self, flag: u32) -> bool {
        self.flags & flag != 0
    }
}

/// What the guest counted between two snapshots, per CPU. The header fields
/// (flags, arch, entry) are those of `after`.
///
/// A counter that is smaller in `after` is an error: it cannot happen for an
/// honest guest, and wrapping it would invent a huge count.
pub fn delta(
    before: &TelemetrySnapshot,
    after: &TelemetrySnapshot,
) -> Result<TelemetrySnapshot, TelemetryDeltaError> {
    if before.per_cpu.len() != after.per_cpu.len() {
        return Err(TelemetryDeltaError::CpuCountChanged {
            before: before.per_cpu.len(),
            after: after.per_cpu.len(),
        });
    }
    let mut per_cpu = Vec::with_capacity(after.per_cpu.len());
    for (cpu, (b, a)) in before.per_cpu.iter().zip(&after.per_cpu).enumerate() {
        let mut block = [0u64; COUNTERS];
        for c in Counter::ALL {
            let i = c as usize;
            block[i] = a[i]
                .checked_sub(b[i])
                .ok_or(TelemetryDeltaError::WentBackwards {
                    cpu,
                    counter: c.name(),
                    before: b[i],
                    after: a[i],
                })?;
        }
        per_cpu.push(block);
    }
    Ok(TelemetrySnapshot {
        flags: after.flags,
        arch: after.arch,
        entry: after.entry,
        per_cpu,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEM: usize = 0x10000;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM)]).unwrap()
    }

    /// Writes a valid header for `cpus` CPUs at `gpa`, as the guest does.
    fn write_header(m: &GuestMemoryMmap, gpa: u64, cpus: u32) {
        let put32 = |off: usize, v: u32| {
            m.write_obj(v.to_le(), GuestAddress(gpa + off as u64))
                .unwrap()
        };
        put32(header::VERSION, abi::VERSION);
        put32(header::CPU_COUNT, cpus);
        put32(header::CPU_BLOCK_OFFSET, abi::CPU_BLOCK_OFFSET as u32);
        put32(header::CPU_BLOCK_STRIDE, abi::CPU_BLOCK_STRIDE as u32);
        put32(header::COUNTER_COUNT, Counter::COUNT as u32);
        put32(header::FLAGS, abi::flags::PTI);
        put32(header::ARCH, abi::arch::X86_64);
        put32(header::ENTRY, abi::entry::INT3);
        m.write_obj(abi::MAGIC.to_le(), GuestAddress(gpa)).unwrap();
    }

    fn set(m: &GuestMemoryMmap, gpa: u64, cpu: usize, c: Counter, v: u64) {
        m.write_obj(v.to_le(), GuestAddress(gpa + c.offset(cpu) as u64))
            .unwrap();
    }

    const GPA: u64 = (MEM as u64) - abi::REGION_SIZE;

    #[test]
    fn round_trip() {
        let m = mem();
        write_header(&m, GPA, 2);
        for (i, c) in Counter::ALL.into_iter().enumerate() {
            set(&m, GPA, 0, c, 100 + i as u64);
            set(&m, GPA, 1, c, 1000 * (i as u64 + 1));
        }
        // A counter of a CPU beyond cpu_count must not be read.
        set(&m, GPA, 2, Counter::Syscalls, 777);
        let r = TelemetryReader::new(&m, GuestAddress(GPA)).unwrap();
        let s = r.snapshot().unwrap();
        assert_eq!(s.cpu_count(), 2);
        assert_eq!(
            (s.flags, s.arch, s.entry),
            (abi::flags::PTI, abi::arch::X86_64, abi::entry::INT3)
        );
        assert!(s.has_flag(abi::flags::PTI) && !s.has_flag(abi::flags::PCID));
        assert_eq!(s.get(0, Counter::Syscalls), Some(108));
        assert_eq!(s.get(1, Counter::Syscalls), Some(9000));
        assert_eq!(s.get(2, Counter::Syscalls), None);
        assert_eq!(s.total(Counter::Syscalls), 9108);
        // cr3: cpu0 100+101+102+103, cpu1 1000+2000+3000+4000
        assert_eq!(s.cr3_writes(), 406 + 10_000);
        assert_eq!(s.totals()[Counter::Cr3NoFlush as usize], 104 + 5000);
        assert_eq!(s.named_totals().next(), Some(("cr3_writes_entry", 1100)));
    }

    #[test]
    fn not_initialised_and_bad_header_fields() {
        let m = mem();
        let r = TelemetryReader::new(&m, GuestAddress(GPA)).unwrap();
        assert_eq!(r.snapshot(), Err(TelemetryError::NotInitialized));

        write_header(&m, GPA, 1);
        m.write_obj(0x1234u64, GuestAddress(GPA)).unwrap();
        assert_eq!(r.snapshot(), Err(TelemetryError::BadMagic(0x1234)));

        write_header(&m, GPA, 1);
        m.write_obj(abi::VERSION + 1, GuestAddress(GPA + header::VERSION as u64))
            .unwrap();
        assert_eq!(
            r.snapshot(),
            Err(TelemetryError::BadVersion {
                found: abi::VERSION + 1,
                expected: abi::VERSION
            })
        );

        for (cpus, ok) in [
            (0u32, false),
            (abi::MAX_CPUS as u32, true),
            (abi::MAX_CPUS as u32 + 1, false),
            (u32::MAX, false),
        ] {
            write_header(&m, GPA, cpus);
            match r.snapshot() {
                Ok(s) => assert!(ok && s.cpu_count() == cpus as usize),
                Err(e) => assert!(
                    !ok && matches!(
                        e,
                        TelemetryError::BadLayout {
                            field: "cpu_count",
                            ..
                        }
                    ),
                    "{cpus}: {e}"
                ),
            }
        }

        for (field, off) in [
            ("cpu_block_offset", header::CPU_BLOCK_OFFSET),
            ("cpu_block_stride", header::CPU_BLOCK_STRIDE),
            ("counter_count", header::COUNTER_COUNT),
        ] {
            write_header(&m, GPA, 1);
            m.write_obj(0xffff_fff0u32, GuestAddress(GPA + off as u64))
                .unwrap();
            assert!(
                matches!(r.snapshot(), Err(TelemetryError::BadLayout { field: f, found: 0xffff_fff0, .. }) if f == field),
                "{field}"
            );
        }
    }

    #[test]
    fn random_garbage_never_panics() {
        let m = mem();
        let r = TelemetryReader::new(&m, GuestAddress(GPA)).unwrap();
        // xorshift64: deterministic pseudo-random bytes without a dependency.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut accepted = 0;
        for round in 0..2000 {
            let mut page = vec![0u8; abi::REGION_SIZE as usize];
            for chunk in page.chunks_exact_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                chunk.copy_from_slice(&x.to_le_bytes());
            }
            // Every few rounds keep the header valid but the counters random,
            // so the accept path is exercised with garbage counters too.
            m.write_slice(&page, GuestAddress(GPA)).unwrap();
            if round % 4 == 0 {
                write_header(&m, GPA, 1 + (round as u32 / 4) % abi::MAX_CPUS as u32);
            }
            if let Ok(s) = r.snapshot() {
                accepted += 1;
                assert!(s.cpu_count() >= 1 && s.cpu_count() <= abi::MAX_CPUS);
                let _ = s.totals();
                let _ = s.cr3_writes();
            }
        }
        assert_eq!(accepted, 500, "exactly the rounds with a valid header pass");
    }

    #[test]
    fn region_bounds() {
        let m = mem();
        // Exactly at the end of memory: fine.
        assert!(TelemetryReader::new(&m, GuestAddress(GPA)).is_ok());
        // One byte (well, one u64) further: the last 8 bytes fall outside.
        for gpa in [
            GPA + 8,
            MEM as u64,
            u64::MAX - 100,
            u64::MAX - abi::REGION_SIZE + 1,
        ] {
            assert!(
                matches!(
                    TelemetryReader::new(&m, GuestAddress(gpa)),
                    Err(TelemetryError::OutOfBounds { .. })
                ),
                "{gpa:#x}"
            );
        }
        // Misaligned: counters could not be loaded atomically.
        assert!(TelemetryReader::new(&m, GuestAddress(4)).is_err());
        // Straddling a hole between two regions.
        let holey = GuestMemoryMmap::<()>::from_ranges(&[
            (GuestAddress(0), 0x1000),
            (GuestAddress(0x3000), 0x1000),
        ])
        .unwrap();
        assert!(TelemetryReader::new(&holey, GuestAddress(0x800)).is_err());
        assert!(TelemetryReader::new(&holey, GuestAddress(0x3000)).is_ok());
    }

    fn snap(per_cpu: Vec<[u64; COUNTERS]>) -> TelemetrySnapshot {
        TelemetrySnapshot {
            flags: 0,
            arch: abi::arch::X86_64,
            entry: abi::entry::SYSCALL,
            per_cpu,
        }
    }

    #[test]
    fn deltas() {
        let mut b = [0u64; COUNTERS];
        let mut a = [0u64; COUNTERS];
        b[Counter::Syscalls as usize] = 10;
        a[Counter::Syscalls as usize] = 1010;
        b[Counter::Cr3Entry as usize] = 3;
        a[Counter::Cr3Entry as usize] = 1003;
        a[Counter::Cr3Exit as usize] = 1000;
        let d = delta(&snap(vec![b, b]), &snap(vec![a, b])).unwrap();
        assert_eq!(d.get(0, Counter::Syscalls), Some(1000));
        assert_eq!(d.get(1, Counter::Syscalls), Some(0));
        assert_eq!(d.cr3_writes(), 2000);
        assert_eq!(
            delta(&snap(vec![b]), &snap(vec![a, a])),
            Err(TelemetryDeltaError::CpuCountChanged {
                before: 1,
                after: 2
            })
        );
    }

    #[test]
    fn counter_going_backwards_is_invalid_not_wrapped() {
        let mut b = [0u64; COUNTERS];
        let a = [0u64; COUNTERS];
        b[Counter::PageFaults as usize] = 5;
        assert_eq!(
            delta(&snap(vec![a, b]), &snap(vec![a, a])),
            Err(TelemetryDeltaError::WentBackwards {
                cpu: 1,
                counter: "page_faults",
                before: 5,
                after: 0
            })
        );
    }

    #[test]
    fn live_update_between_snapshots() {
        let m = mem();
        write_header(&m, GPA, 1);
        let r = TelemetryReader::new(&m, GuestAddress(GPA)).unwrap();
        let s0 = r.snapshot().unwrap();
        set(&m, GPA, 0, Counter::Syscalls, 42);
        set(&m, GPA, 0, Counter::Cr3Entry, 42);
        set(&m, GPA, 0, Counter::Cr3Exit, 42);
        let s1 = r.snapshot().unwrap();
        let d = delta(&s0, &s1).unwrap();
        assert_eq!(d.total(Counter::Syscalls), 42);
        assert_eq!(d.cr3_writes(), 84);
    }
}
