//! PTI's state checked twice: the kernel log as the init read it, and the
//! host's count of CR3 writes per system call, which must agree.

use ptiscope_abi::options::PtiMode;

use super::console::{line_value, machine_line};
use super::observation::HostPhaseObservation;
use crate::machine::RunOutcome;

/// What the init read from the kernel log: `Some(true)` when it has
/// "Kernel/User page tables isolation: enabled" (its `@linux` line).
pub fn guest_pti(outcome: &RunOutcome) -> Option<bool> {
    line_value(machine_line(outcome, "@linux")?, "pti").map(|v| v == "on")
}

/// The verdict of the PTI checks.
#[derive(Debug, Clone, PartialEq)]
pub struct PtiVerdict {
    /// PTI as the kernel log says.
    pub enabled: bool,
    /// The host's CR3 writes per system call, if a host observer ran.
    pub host_cr3_per_syscall: Option<f64>,
}

/// Checks PTI's state: what was asked, what the kernel log says, and (if a
/// host observer ran) what the host saw. A kernel asked for pti=on without
/// PTI, or a host count that disagrees with the log, is an error: never a
/// PTI result of 0.
pub fn check_pti(
    asked: PtiMode,
    guest_log: Option<bool>,
    host: Option<&HostPhaseObservation>,
) -> Result<PtiVerdict, String> {
    let Some(enabled) = guest_log else {
        return Err("the init did not report PTI's state (no @linux line): the run is not a ptiscope Linux run, or it stopped before the init read the kernel log".into());
    };
    match (asked, enabled) {
        (PtiMode::On, false) => {
            return Err("pti=on was asked, but the kernel log has no \"Kernel/User page tables isolation: enabled\": this kernel did not enable PTI (built without CONFIG_MITIGATION_PAGE_TABLE_ISOLATION, or CONFIG_PAGE_TABLE_ISOLATION before Linux 6.9?)".into())
        }
        (PtiMode::Off, true) => {
            return Err("pti=off was asked, but the kernel log says PTI is enabled".into())
        }
        _ => {}
    }
    let per = host.and_then(|h| (h.syscalls > 0).then(|| h.cr3_writes as f64 / h.syscalls as f64));
    if let (Some(h), Some(p)) = (host, per) {
        // With PTI each system call writes CR3 twice (entry and exit);
        // without it, never. Context switches add a few; the middle is
        // neither.
        let host_on = p >= 1.5;
        let host_off = p < 0.5;
        if (enabled && !host_on) || (!enabled && !host_off) {
            return Err(format!(
                "the kernel log says PTI is {}, but the host ({}) saw {p:.2} CR3 writes per system call ({} / {}): the two checks disagree",
                if enabled { "on" } else { "off" },
                h.source,
                h.cr3_writes,
                h.syscalls
            ));
        }
    }
    Ok(PtiVerdict {
        enabled,
        host_cr3_per_syscall: per,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linux::tests::obs;
    use ptiscope_abi::options::PtiMode;

    #[test]
    fn pti_checks_fail_on_every_disagreement() {
        assert!(check_pti(PtiMode::On, Some(false), None).is_err());
        assert!(check_pti(PtiMode::Off, Some(true), None).is_err());
        assert!(check_pti(PtiMode::On, None, None).is_err());
        let v = check_pti(PtiMode::On, Some(true), Some(&obs(1000, 2002))).unwrap();
        assert!(v.enabled);
        assert!((v.host_cr3_per_syscall.unwrap() - 2.002).abs() < 1e-9);
        // The log says on, the host saw no CR3 writes: an error, not a 0.
        let e = check_pti(PtiMode::On, Some(true), Some(&obs(1000, 0))).unwrap_err();
        assert!(e.contains("disagree"), "{e}");
        assert!(check_pti(PtiMode::Auto, Some(false), Some(&obs(1000, 2000))).is_err());
        assert!(check_pti(PtiMode::Auto, Some(false), Some(&obs(1000, 3))).is_ok());
    }
}
