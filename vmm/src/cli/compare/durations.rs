//! The mmtests duration table: user, system and elapsed seconds per side.

use std::time::Instant;

/// CPU time of this process and its reaped children (QEMU under
/// `--backend qemu`), and the host clock.
pub(super) struct CpuTimes {
    user: f64,
    system: f64,
    at: Instant,
}

impl CpuTimes {
    pub(super) fn now() -> Self {
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        let (mut user, mut system) = (0.0, 0.0);
        for who in [libc::RUSAGE_SELF, libc::RUSAGE_CHILDREN] {
            // SAFETY: all-zero bytes are a valid rusage; getrusage fills it.
            let mut u: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: `u` is a valid out-pointer for the call.
            if unsafe { libc::getrusage(who, &mut u) } == 0 {
                user += secs(u.ru_utime);
                system += secs(u.ru_stime);
            }
        }
        CpuTimes {
            user,
            system,
            at: Instant::now(),
        }
    }
}

/// The mmtests duration table's figures for one side: seconds summed over
/// its runs (boot and teardown included). KVM's guest time counts as
/// system time of the VMM.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub(super) struct Durations {
    user_s: f64,
    system_s: f64,
    elapsed_s: f64,
}

impl Durations {
    pub(super) fn add(&mut self, before: &CpuTimes, after: &CpuTimes) {
        self.user_s += (after.user - before.user).max(0.0);
        self.system_s += (after.system - before.system).max(0.0);
        self.elapsed_s += after.at.duration_since(before.at).as_secs_f64();
    }
}

/// `Duration User/System/Elapsed`, as mmtests compare-kernels prints it.
pub(super) fn render_durations(base: &str, comp: &str, d: &[Durations; 2]) -> String {
    let w = base.len().max(comp.len()).max(10);
    let mut s = format!("\n{:<18} {base:>w$} {comp:>w$}\n", "");
    for (name, f) in [
        (
            "Duration User",
            (|x: &Durations| x.user_s) as fn(&Durations) -> f64,
        ),
        ("Duration System", |x| x.system_s),
        ("Duration Elapsed", |x| x.elapsed_s),
    ] {
        s += &format!("{name:<18} {:>w$.2} {:>w$.2}\n", f(&d[0]), f(&d[1]));
    }
    s += "\n";
    s
}
