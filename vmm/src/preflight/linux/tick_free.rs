//! A tick-free CPU for the system-call loop (`--tick-free`): whether one is
//! added, and which.

use ptiscope_abi::options::Workload;

use super::cmdline::param_key_value;
use crate::spec::linux::TickFree;

/// What [`tick_free_plan`] decides on.
pub(super) struct TickFreeAsk<'a> {
    /// `--tick-free`.
    pub(super) asked: TickFree,
    /// The init's workload.
    pub(super) workload: Workload,
    /// Whether the host counts every guest CR3 write (KVM with shadow
    /// paging), so that a tick's two make the per-call count inexact.
    pub(super) host_counts_cr3: bool,
    /// `--cpus`.
    pub(super) cpus: u32,
    /// `--append`.
    pub(super) append: &'a str,
    /// An i386 kernel under `--backend nested`, where a second CPU does
    /// not come up ([`kvm_refusal_reasons`]).
    pub(super) i386_nested: bool,
}

/// A tick-free CPU for the system-call loop: the run's vCPUs and the one
/// the loop runs on (the last, given to `nohz_full=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TickFreeCpu {
    /// The run's vCPUs (at least 2: the kernel keeps one for its
    /// housekeeping, the tick among it).
    pub(super) cpus: u32,
    /// The loop's CPU.
    pub(super) cpu: u32,
}

/// Whether the system-call loop gets a tick-free CPU (`--tick-free`); an
/// error for `--tick-free on` where it cannot have one. A `nohz_full=` in
/// `--append` is the user's own choice, left as it is (the init pins the
/// loop to its first CPU all the same).
pub(super) fn tick_free_plan(ask: &TickFreeAsk) -> Result<Option<TickFreeCpu>, String> {
    let is_loop = matches!(
        ask.workload,
        Workload::Getpid | Workload::Getppid | Workload::WriteBadfd
    );
    let wanted = match ask.asked {
        TickFree::Off => false,
        TickFree::On => true,
        TickFree::Auto => ask.host_counts_cr3,
    };
    // `--tick-free on` is about the measured loop: a workload that is not
    // one is refused whatever the command line holds (a `nohz_full=` of the
    // user's own does not make sched-messaging a loop of one thread).
    if !is_loop {
        return match ask.asked {
            TickFree::On => Err(format!(
                "--tick-free on: workload {} is not a system-call loop of one thread (getpid, getppid, write-badfd); drop --tick-free",
                ask.workload
            )),
            _ => Ok(None),
        };
    }
    let own = ask
        .append
        .split_ascii_whitespace()
        .any(|w| param_key_value(w).is_some_and(|(k, _)| k == "nohz_full"));
    if !wanted || own {
        return Ok(None);
    }
    let cpus = ask.cpus.max(2);
    if ask.i386_nested {
        return match ask.asked {
            TickFree::On => Err(
                "--tick-free on needs a second vCPU, which an i386 kernel does not bring up under --backend nested; use --tick-free off, or the x86_64 kernel"
                    .to_string(),
            ),
            _ => Ok(None),
        };
    }
    Ok(Some(TickFreeCpu {
        cpus,
        cpu: cpus - 1,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tick_free_cpu_is_added_where_the_host_counts_every_cr3_write() {
        let ask = |asked, workload, host_counts_cr3, cpus, append, i386_nested| {
            tick_free_plan(&TickFreeAsk {
                asked,
                workload,
                host_counts_cr3,
                cpus,
                append,
                i386_nested,
            })
        };
        let two = Ok(Some(TickFreeCpu { cpus: 2, cpu: 1 }));
        // auto: where KVM counts CR3 writes, for the system-call loops.
        assert_eq!(
            ask(TickFree::Auto, Workload::Getppid, true, 1, "", false),
            two
        );
        assert_eq!(
            ask(TickFree::Auto, Workload::Getppid, false, 1, "", false),
            Ok(None)
        );
        assert_eq!(
            ask(TickFree::Auto, Workload::Poundsyscall, true, 2, "", false),
            Ok(None)
        );
        assert_eq!(
            ask(TickFree::Auto, Workload::Getpid, true, 4, "", false),
            Ok(Some(TickFreeCpu { cpus: 4, cpu: 3 }))
        );
        // The user's own nohz_full=, and off, are left alone.
        assert_eq!(
            ask(
                TickFree::Auto,
                Workload::Getpid,
                true,
                1,
                "nohz_full=2 x",
                false
            ),
            Ok(None)
        );
        assert_eq!(
            ask(TickFree::Off, Workload::Getpid, true, 1, "", false),
            Ok(None)
        );
        // on: everywhere, or refused where it cannot be.
        assert_eq!(
            ask(TickFree::On, Workload::WriteBadfd, false, 1, "", false),
            two
        );
        // A workload that is no loop is refused with or without the
        // user's own nohz_full= (it once passed with one).
        for append in ["", "nohz_full=1", "x nohz_full=1-3 y"] {
            let e = ask(
                TickFree::On,
                Workload::SchedMessaging,
                false,
                1,
                append,
                false,
            )
            .unwrap_err();
            assert!(
                e.contains("sched-messaging") && e.contains("--tick-free"),
                "{append}: {e}"
            );
        }
        assert_eq!(
            ask(
                TickFree::Off,
                Workload::SchedMessaging,
                true,
                1,
                "nohz_full=1",
                false
            ),
            Ok(None)
        );
        let e = ask(TickFree::On, Workload::Getpid, true, 1, "", true).unwrap_err();
        assert!(e.contains("i386"), "{e}");
        assert_eq!(
            ask(TickFree::Auto, Workload::Getpid, true, 1, "", true),
            Ok(None)
        );
    }
}
