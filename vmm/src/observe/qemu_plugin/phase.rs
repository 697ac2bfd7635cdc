//! Finding the measured phase among the snapshots: the companion's three
//! marker writes, or the Linux init's marker pair.

use super::report::*;

impl PluginReport {
    /// The ptiscope guest's measured phase. Under plugin API version 1 the
    /// plugin cannot read the port or the value an `out` writes, so the
    /// markers are told apart by the guest's protocol: its kernel executes
    /// `out dx, eax` at exactly three places, the phase begin and end
    /// writes (two distinct instructions of its phase-mark syscall) and the
    /// exit-status write, which stops QEMU and so is always the last. The
    /// snapshots must therefore be `[begin, end, exit]` (or `[begin, end]`
    /// when QEMU stopped otherwise), begin and end at different addresses;
    /// any other pattern is refused rather than guessed at. Counts between
    /// the two are exact: each snapshot is taken at the instruction itself.
    pub fn companion_phase(&self) -> Result<PluginPhase, PhaseError> {
        self.complete()?;
        let m = &self.marks;
        let (begin, end) = match m.len() {
            2 | 3 => (&m[0], &m[1]),
            n => return Err(PhaseError::Pattern(n)),
        };
        let distinct =
            begin.pc != end.pc && m.get(2).is_none_or(|x| x.pc != begin.pc && x.pc != end.pc);
        if !distinct {
            return Err(PhaseError::Pattern(m.len()));
        }
        Self::phase(begin, end)
    }
    /// Refuses a file whose marks were dropped (a phase could be missing).
    fn complete(&self) -> Result<(), PhaseError> {
        match self.dropped_marks {
            0 => Ok(()),
            n => Err(PhaseError::Dropped(n)),
        }
    }

    /// The phase from `begin` to `end`; its counts must not go backwards.
    fn phase(begin: &Mark, end: &Mark) -> Result<PluginPhase, PhaseError> {
        let delta = begin
            .counts
            .delta_to(&end.counts)
            .ok_or(PhaseError::Backwards)?;
        Ok(PluginPhase {
            begin: begin.clone(),
            end: end.clone(),
            delta,
        })
    }

    /// ptiscope's Linux init's measured phase, from a plugin run with
    /// `umark=0x600` ([`LINUX_MARK_PORT`]): snapshots are taken only at a
    /// user-mode `mov edx, 0x600; mov [edi], eax` pair (the store to the
    /// init's MMIO marker page, which needs no I/O permission) or
    /// `mov edx, 0x600; out dx, eax` pair (its fallback after `ioperm`),
    /// which the init executes exactly twice (its phase begin and end, two
    /// distinct inlined copies of the pair; its exit-status write goes to
    /// another port). So the snapshots must be exactly `[begin, end]` at
    /// two addresses; anything else is refused rather than guessed at.
    pub fn linux_phase(&self) -> Result<PluginPhase, PhaseError> {
        self.complete()?;
        let [begin, end] = self.marks.as_slice() else {
            return Err(PhaseError::LinuxPattern(self.marks.len()));
        };
        if begin.pc == end.pc {
            return Err(PhaseError::LinuxPattern(2));
        }
        Self::phase(begin, end)
    }
}
