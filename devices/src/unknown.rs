//! Bookkeeping for guest accesses that no device claims.

use std::collections::HashSet;

/// Distinct addresses remembered; beyond this, accesses are still counted but
/// new addresses are no longer logged (a guest sweeping all 64 Ki ports must
/// not cost unbounded memory or log lines).
pub const MAX_DISTINCT: usize = 1024;

/// Logs the first access to each unknown address once and counts all of them.
#[derive(Debug, Default)]
pub struct UnknownAccesses {
    seen: HashSet<u64>,
    total: u64,
    saturated: bool,
}

impl UnknownAccesses {
    /// An empty record.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records an access; returns true if this is the first time `addr` is seen
    /// (and logs it). `what` says which kind ("PIO write", "MMIO read", ...).
    pub fn record(&mut self, what: &str, addr: u64, len: usize) -> bool {
        self.total += 1;
        if self.seen.contains(&addr) {
            return false;
        }
        if self.seen.len() >= MAX_DISTINCT {
            if !self.saturated {
                self.saturated = true;
                log::warn!(
                    "more than {MAX_DISTINCT} distinct unknown guest addresses; not logging further ones"
                );
            }
            return false;
        }
        self.seen.insert(addr);
        if what.starts_with("port") && is_legacy_probe_port(addr) {
            // Every PC operating system probes these (Linux at each boot):
            // no device here is the expected answer, not a guest error.
            log::debug!("guest {what} of {len} byte(s) at unknown address {addr:#x}; ignored");
        } else {
            log::warn!("guest {what} of {len} byte(s) at unknown address {addr:#x}; ignored");
        }
        true
    }

    /// All unknown accesses, repeated ones included.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Distinct unknown addresses remembered (at most [`MAX_DISTINCT`]).
    pub fn distinct(&self) -> usize {
        self.seen.len()
    }
}

/// Ports a PC operating system probes whether or not a device is there: the
/// PCI configuration mechanism (0xcf8..=0xcff), the CMOS/RTC index and data
/// (0x70, 0x71), the DMA page registers (0x81..=0x8f; not the POST
/// port 0x80, which ptiscope's own tests use as the unknown port), the second to fourth serial
/// ports (0x2f8, 0x3e8, 0x2e8, eight each), the i8042 keyboard controller
/// (0x60, 0x64) and the legacy IDE/floppy/parallel/DMA ranges Linux's
/// drivers look at. An access to one that no device claims is logged at
/// debug level; any other unknown access stays a warning.
pub fn is_legacy_probe_port(port: u64) -> bool {
    matches!(
        port,
        0x00..=0x1f        // DMA controller 1
            | 0x60 | 0x64  // i8042
            | 0x70 | 0x71  // CMOS/RTC
            | 0x81..=0x8f  // DMA page registers (0x80, the POST port, stays a warning)
            | 0xc0..=0xdf  // DMA controller 2
            | 0x1f0..=0x1f7 | 0x3f6 | 0x170..=0x177 | 0x376 // IDE
            | 0x278..=0x27f | 0x378..=0x37f | 0x3bc..=0x3bf // parallel ports
            | 0x2e8..=0x2ef | 0x2f8..=0x2ff | 0x3e8..=0x3ef // COM4, COM2, COM3
            | 0x3f0..=0x3f5 | 0x3f7 // floppy
            | 0xcf8..=0xcff // PCI configuration
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_each_address_once_and_stays_bounded() {
        let mut u = UnknownAccesses::new();
        assert!(u.record("PIO write", 0x80, 1));
        assert!(!u.record("PIO write", 0x80, 1));
        for a in 0..(MAX_DISTINCT as u64 * 2) {
            u.record("PIO read", 0x1000 + a, 1);
        }
        assert_eq!(u.distinct(), MAX_DISTINCT);
        assert_eq!(u.total(), 2 + MAX_DISTINCT as u64 * 2);
    }

    #[test]
    fn legacy_probe_ports_are_the_pc_ones() {
        for p in [0xcf8, 0xcfc, 0xcff, 0x70, 0x71, 0x2f9, 0x3e9, 0x2e9, 0x81] {
            assert!(is_legacy_probe_port(p), "{p:#x}");
        }
        // ptiscope's own ports and ones nothing probes stay warnings.
        for p in [0x80, 0x600, 0x6e0, 0xf4, 0x3f8 + 8, 0x1000, 0xcf7, 0xd00] {
            assert!(!is_legacy_probe_port(p), "{p:#x}");
        }
    }
}
