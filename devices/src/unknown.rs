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
        log::warn!("guest {what} of {len} byte(s) at unknown address {addr:#x}; ignored");
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
}
