//! Which guest a run boots, as one type for every stage: the request
//! (`GuestKind<LinuxRequest>` in [`RunConfig`](super::RunConfig)), the
//! settled run (`GuestKind<Arc<LinuxGuest>>` in
//! [`ResolvedRun`](super::ResolvedRun)) and `reproduce`'s cells (a known
//! kernel's name). The Linux side says how far it is settled; the
//! companion (ptiscope's own guest) needs nothing beyond the boot source.

/// Which guest a run boots: ptiscope's own guest kernel or a Linux kernel
/// with ptiscope's init, `L` being what is known of the Linux kernel at
/// that stage.
// Default (the companion) asks nothing of `L`: an enum's derived Default
// adds no bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GuestKind<L> {
    /// ptiscope's own guest kernel (embedded, or `--kernel FILE`).
    #[default]
    Companion,
    /// A Linux kernel with ptiscope's init.
    Linux(L),
}

impl<L> GuestKind<L> {
    /// The Linux side, if this is a Linux guest.
    pub fn linux(&self) -> Option<&L> {
        match self {
            GuestKind::Linux(l) => Some(l),
            GuestKind::Companion => None,
        }
    }

    /// Whether this is a Linux guest.
    pub fn is_linux(&self) -> bool {
        matches!(self, GuestKind::Linux(_))
    }

    /// Whether this is ptiscope's own guest.
    pub fn is_companion(&self) -> bool {
        matches!(self, GuestKind::Companion)
    }

    /// The same kind, borrowing the Linux side.
    pub fn as_ref(&self) -> GuestKind<&L> {
        match self {
            GuestKind::Linux(l) => GuestKind::Linux(l),
            GuestKind::Companion => GuestKind::Companion,
        }
    }

    /// The same kind with the Linux side carried one stage on.
    pub fn map<M>(self, f: impl FnOnce(L) -> M) -> GuestKind<M> {
        match self {
            GuestKind::Linux(l) => GuestKind::Linux(f(l)),
            GuestKind::Companion => GuestKind::Companion,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::GuestKind;

    #[test]
    fn the_helpers_agree_with_the_variant() {
        let linux: GuestKind<u8> = GuestKind::Linux(7);
        let companion: GuestKind<u8> = GuestKind::default();
        assert_eq!(companion, GuestKind::Companion);
        assert_eq!(linux.linux(), Some(&7));
        assert_eq!(companion.linux(), None);
        assert!(linux.is_linux() && !linux.is_companion());
        assert!(companion.is_companion() && !companion.is_linux());
        assert_eq!(linux.as_ref(), GuestKind::Linux(&7));
        assert_eq!(linux.map(|n| n * 2), GuestKind::Linux(14));
        assert_eq!(companion.map(|n| n * 2), GuestKind::Companion);
        // The default asks nothing of the Linux side.
        struct NoDefault;
        assert!(GuestKind::<NoDefault>::default().is_companion());
    }
}
