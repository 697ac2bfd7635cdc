//! What this host's KVM can deliver, as far as the VMM's defaults care:
//! `entry=auto`, refusing an `--entry` or `--pcid on` the host cannot
//! run before the guest boots, and whether a guest CR3 write costs user
//! code a TLB refill here (what `sweep` and the reports say about it).
//!
//! They are one value, [`HostFacts`], made once at the top of a process
//! (the CLI's) and handed to whatever needs a fact: preflight, the KVM
//! backend, the environment block. Nothing below probes or keeps these
//! facts itself (the environment block's description of the host kernel
//! and CPU is its own, read once by `report::environment`).
//! The cheap facts (which KVM module, how it pages) are read when the value
//! is made; the probed ones come from the probe ([`crate::probe`]), run at
//! most once per value, and kept once per boot of the host in a cache file
//! ([`crate::probe::host_cache`]): a process whose host state matches the
//! file's key runs no probe VM for them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::machine::kvm::KvmFlavour;
use crate::probe::host_cache::{self, CachedRefill};
use crate::probe::{self, ProbeOptions};
use ptiscope_abi::options::Entry;

/// EPT (kvm_intel) or NPT (kvm_amd) in use, from the module parameters;
/// `None` if neither module is loaded.
fn two_dimensional_paging() -> Option<bool> {
    for p in [
        "/sys/module/kvm_intel/parameters/ept",
        "/sys/module/kvm_amd/parameters/npt",
    ] {
        if let Ok(v) = std::fs::read_to_string(p) {
            let v = v.trim();
            return Some(v == "Y" || v == "1");
        }
    }
    None
}

/// The entry probe's findings: which entries reach CPL0 from user mode,
/// with a description of each outcome; or why the probe could not run.
#[derive(Debug, Clone)]
pub struct EntryFindings {
    /// Per entry probed: the entry, what happened, whether it reached CPL0;
    /// `Err` says why the probe could not run.
    pub outcomes: Result<Vec<(Entry, String, bool)>, String>,
}

impl EntryFindings {
    /// The entries that worked, or `None` if the probe could not run.
    pub fn working(&self) -> Option<Vec<Entry>> {
        self.outcomes.as_ref().ok().map(|v| {
            v.iter()
                .filter(|(_, _, w)| *w)
                .map(|(e, _, _)| *e)
                .collect()
        })
    }
}

/// The host facts the VMM acts on, gathered once per process by its top
/// (the CLI) and passed down by reference. The probed facts are measured
/// (or read from the cache file) at their first use, so that a command that
/// needs none (a QEMU run) boots no probe VM; a caller that must not have a
/// probe VM run beside its guest asks for them before the boot.
#[derive(Debug)]
pub struct HostFacts {
    kvm: KvmFlavour,
    two_dimensional_paging: Option<bool>,
    /// Inside `--backend nested`: the KVM is the nested kvm_amd.
    nested: bool,
    /// Inside `--backend nested`: the outer QEMU's plugin's live file
    /// (`observe::outer_plugin`), for the KVM backend.
    outer_plugin: Option<std::path::PathBuf>,
    cache: host_cache::Cache,
    entries: OnceLock<EntryFindings>,
    pcid: OnceLock<Option<(bool, String)>>,
    pae: OnceLock<Option<(bool, String)>>,
    refill: OnceLock<probe::RefillProbe>,
    /// KVM's supported CPUID table, behind a lock rather than a `OnceLock`:
    /// a failure is not kept, and a second caller waits for the answer
    /// being asked instead of asking KVM again.
    cpuid: Mutex<Option<kvm_bindings::CpuId>>,
    /// Set while [`HostFacts::settle_report_facts`] probes: it has said
    /// in one line what it probes, so the probes it runs say nothing more.
    announced: AtomicBool,
}

impl HostFacts {
    /// Reads the cheap facts (the KVM modules loaded and their paging);
    /// the probed ones wait for their first use.
    pub fn read() -> HostFacts {
        // An inner job of `--backend nested` (`nested-batch`) is told so by
        // its environment, read here, once, at the top of the process.
        let inside = crate::spec::nested::inside();
        let plugin = inside
            .then(|| std::env::var_os(crate::spec::nested::OUTER_PLUGIN_ENV))
            .flatten()
            .map(std::path::PathBuf::from);
        Self::read_as(inside, plugin)
    }

    /// [`HostFacts::read`], told whether this KVM is `--backend nested`'s
    /// inner kvm_amd and where the outer QEMU's plugin's live file is (the
    /// inner ptiscope knows both from its command).
    pub fn read_as(nested: bool, outer_plugin: Option<std::path::PathBuf>) -> HostFacts {
        Self::unprobed(
            KvmFlavour::detect(),
            two_dimensional_paging(),
            nested,
            outer_plugin,
            host_cache::Cache::default(),
        )
    }

    /// Facts of which nothing is probed yet: the probed ones come from
    /// `cache` at their first use.
    fn unprobed(
        kvm: KvmFlavour,
        two_dimensional_paging: Option<bool>,
        nested: bool,
        outer_plugin: Option<std::path::PathBuf>,
        cache: host_cache::Cache,
    ) -> HostFacts {
        HostFacts {
            kvm,
            two_dimensional_paging,
            nested,
            outer_plugin,
            cache,
            entries: OnceLock::new(),
            pcid: OnceLock::new(),
            pae: OnceLock::new(),
            refill: OnceLock::new(),
            cpuid: Mutex::new(None),
            announced: AtomicBool::new(false),
        }
    }

    /// The facts of `--backend nested`'s inner kvm_amd as its inner
    /// ptiscope probed them (`known`, asked at the first use of a probed
    /// fact: it boots the nested VM), for the outer process, which settles
    /// runs for that KVM and describes it in its reports but cannot probe
    /// it: nothing is probed or kept here. `nested_paging`: kvm_amd's
    /// paging; `outer_plugin`: the live file of the outer QEMU's plugin as
    /// the inner side names it (whether one counts a Linux guest's CR3
    /// writes). A fact `known` lacks reads as one whose probe could not
    /// run: this process never probes its own KVM for it.
    pub fn of_inner_kvm(
        nested_paging: bool,
        outer_plugin: Option<std::path::PathBuf>,
        known: impl FnOnce() -> host_cache::Facts + Send + 'static,
    ) -> HostFacts {
        let known = move || {
            let mut known = known();
            let why = "not probed inside --backend nested's VM";
            known.entries.get_or_insert_with(|| Err(why.to_string()));
            known.pcid.get_or_insert(None);
            known.pae.get_or_insert(None);
            known.refill.get_or_insert_with(|| {
                host_cache::CachedRefill::from(&probe::RefillProbe::unmeasured(None, why.into()))
            });
            known
        };
        Self::unprobed(
            KvmFlavour::Hardware,
            Some(nested_paging),
            true,
            outer_plugin,
            host_cache::Cache::from_source(known),
        )
    }

    /// The probed facts this value holds, as the cache file keeps them
    /// (what the inner ptiscope of `--backend nested` sends out).
    pub fn known_facts(&self) -> host_cache::Facts {
        self.cache.facts()
    }

    /// The KVM module (`kvm_pvm`, `kvm_intel`, `kvm_amd`; `--backend
    /// nested`'s is kvm_amd, inside), `None` if none is loaded.
    pub fn kvm_module(&self) -> Option<&'static str> {
        match self.kvm {
            KvmFlavour::Pvm => Some("kvm_pvm"),
            KvmFlavour::Hardware if self.nested => Some("kvm_amd"),
            KvmFlavour::Hardware => ["kvm_intel", "kvm_amd"]
                .into_iter()
                .find(|m| std::path::Path::new("/sys/module").join(m).exists()),
        }
    }

    /// Whether this KVM is `--backend nested`'s inner kvm_amd.
    pub fn nested(&self) -> bool {
        self.nested
    }

    /// The outer QEMU's plugin's live file, inside `--backend nested`.
    pub fn outer_plugin(&self) -> Option<&std::path::Path> {
        self.outer_plugin.as_deref()
    }

    /// Reads the cache file's key and the file now (`main` does it on a
    /// thread of its own while it parses the arguments), so that the first
    /// probed fact finds them.
    pub fn warm(&self) {
        self.cache.warm();
    }

    /// Settles every probed fact the report's environment block carries
    /// (the entries, PCID, 32-bit PAE paging, the CR3-refill verdict),
    /// probing those that neither this process nor the cache file knows.
    /// Its callers call it where no guest of theirs runs (`run` once its
    /// guest has stopped, `compare` before its first boot): a probe VM
    /// beside a measured guest would disturb its times, and a run needs
    /// none of these facts to boot unless it asked for what they decide
    /// (`entry=auto` with user code, `pcid=on`, the i386 guest), which
    /// preflight settles itself. It says in one line on stderr what it
    /// probes; the entry, PCID and PAE probes (a few VMs each) run side by
    /// side, the refill probe (some hundreds of ms of timed trips) after
    /// them, alone, so that nothing else of ours runs beside its timing.
    pub fn settle_report_facts(&self) {
        let missing = self.missing_report_facts();
        if missing.is_empty() {
            return;
        }
        let slow = self.refill.get().is_none() && !self.cache.known().refill;
        self.say_probing(
            &missing.join(", "),
            if slow {
                "some hundreds of ms"
            } else {
                "a few ms"
            },
        );
        self.announced.store(true, Ordering::Relaxed);
        std::thread::scope(|s| {
            let side = std::thread::Builder::new()
                .name("probe".into())
                .spawn_scoped(s, || {
                    let _ = self.pcid_usable();
                    let _ = self.pae_paging_usable();
                });
            let _ = self.entry_findings();
            if side.is_err() {
                // No second thread: the same probes, one after the other.
                let _ = self.pcid_usable();
                let _ = self.pae_paging_usable();
            }
        });
        let _ = self.cr3_write_refill();
        self.announced.store(false, Ordering::Relaxed);
    }

    /// The report's probed facts that this process has not settled and the
    /// cache file does not hold (reading the file if nobody has yet), in
    /// words.
    fn missing_report_facts(&self) -> Vec<&'static str> {
        let known = self.cache.known();
        let mut missing = Vec::new();
        if self.entries.get().is_none() && !known.entries {
            missing.push("system-call entries");
        }
        if self.pcid.get().is_none() && !known.pcid {
            missing.push("PCID");
        }
        if self.pae.get().is_none() && !known.pae {
            missing.push("32-bit PAE paging");
        }
        if self.refill.get().is_none() && !known.refill {
            missing.push("the TLB refill after a guest CR3 write");
        }
        missing
    }

    /// Says on stderr, in one line, that this process is about to probe
    /// this host's KVM for `what` (taking about `how_long`) and where the
    /// findings are kept: the probes' VMs take from milliseconds to about a
    /// second, and a command that waits for them says why. Silent while
    /// [`HostFacts::settle_report_facts`] probes (it has said it).
    fn say_probing(&self, what: &str, how_long: &str) {
        if !self.announced.load(Ordering::Relaxed) {
            eprintln!(
                "ptiscope: probing this host's KVM for {what} ({how_long}; {})",
                self.cache.describe()
            );
        }
    }

    /// KVM's supported CPUID table (KVM_GET_SUPPORTED_CPUID), asked once
    /// and handed to every run (`machine::HostSide`); `None` while KVM
    /// cannot be opened or refuses (a failure is not kept: the next caller
    /// asks again, and the run's vCPUs ask KVM themselves). One caller asks
    /// at a time: the main thread reaching the VM's build while the
    /// `host-facts` thread asks waits for its answer (~0.3 ms here, KVM
    /// executes CPUID for every leaf) instead of asking a second time.
    pub fn supported_cpuid(&self) -> Option<kvm_bindings::CpuId> {
        let mut table = self.cpuid.lock().unwrap_or_else(|p| p.into_inner());
        if table.is_none() {
            let kvm = crate::machine::kvm::open_kvm().ok()?;
            *table = crate::machine::cpu_config::supported_cpuid(&kvm).ok();
        }
        table.clone()
    }

    /// Which KVM implementation backs /dev/kvm.
    pub fn kvm_flavour(&self) -> KvmFlavour {
        self.kvm
    }

    /// EPT (kvm_intel) or NPT (kvm_amd) in use; `None` if neither module
    /// is loaded.
    pub fn two_dimensional_paging(&self) -> Option<bool> {
        self.two_dimensional_paging
    }

    /// One line for reports, saying whether KVM sees guest CR3 writes.
    pub fn describe_kvm(&self) -> &'static str {
        match self.kvm {
            KvmFlavour::Pvm => {
                "kvm_pvm (software virtualizer, shadow paging: KVM sees guest CR3 writes)"
            }
            KvmFlavour::Hardware if self.nested => {
                crate::spec::nested::KvmPaging::kvm_description(self.two_dimensional_paging)
            }
            KvmFlavour::Hardware => match self.two_dimensional_paging {
                Some(true) => "hardware KVM with EPT/NPT (KVM does not see guest CR3 writes)",
                Some(false) => "hardware KVM with shadow paging (KVM sees guest CR3 writes)",
                None => "hardware KVM (kvm_intel / kvm_amd)",
            },
        }
    }

    /// Whether KVM intercepts guest CR3 writes (shadow paging), so that its
    /// `tlb_flush` stat follows them. With EPT/NPT the host cannot see them.
    pub fn sees_cr3_writes(&self) -> bool {
        match self.kvm {
            KvmFlavour::Pvm => true,
            KvmFlavour::Hardware => self.two_dimensional_paging == Some(false),
        }
    }

    /// The flavour heuristic, used only when the probe cannot run.
    fn heuristic_entry(&self) -> Entry {
        match self.kvm {
            KvmFlavour::Pvm => Entry::Int3,
            KvmFlavour::Hardware => Entry::Syscall,
        }
    }

    /// The entry probe, run at its first use.
    pub fn entry_findings(&self) -> &EntryFindings {
        self.entries.get_or_init(|| {
            let outcomes = self.cache.cached(
                |f| {
                    let cached = f.entries.clone()?;
                    Some(cached.map(|v| {
                        v.into_iter()
                            .filter_map(|(e, d, w)| Some((e.parse().ok()?, d, w)))
                            .collect()
                    }))
                },
                || {
                    self.say_probing("the system-call entries that reach its kernel", "a few ms");
                    probe::probe_entries(&ProbeOptions::default())
                        .map(|v| {
                            v.into_iter()
                                .map(|(e, o)| {
                                    let works = o.works();
                                    (e, o.to_string(), works)
                                })
                                .collect()
                        })
                        .map_err(|e| e.to_string())
                },
                |f, v: &Result<Vec<(Entry, String, bool)>, String>| {
                    f.entries = Some(v.clone().map(|v| {
                        v.into_iter()
                            .map(|(e, d, w)| (e.name().to_owned(), d, w))
                            .collect()
                    }));
                },
            );
            EntryFindings { outcomes }
        })
    }

    /// Resolves `--entry auto` for a guest of the given width (`elf32`:
    /// the i386 flavour) from the entry probe. See [`choose_auto_entry`];
    /// the flag is true when the entry was guessed, not found.
    pub fn resolve_entry(&self, elf32: bool) -> (Entry, bool) {
        let f = self.entry_findings();
        let working = f.working();
        let (e, guessed) = choose_auto_entry(elf32, working.as_deref(), self.heuristic_entry());
        if guessed {
            match &f.outcomes {
                Ok(_) => log::warn!(
                    "entry=auto: the probe found no entry that reaches CPL0 from user mode; trying {e}"
                ),
                Err(why) => log::warn!(
                    "entry=auto: probing the host's entries failed ({why}); assuming {e} from the KVM module"
                ),
            }
        }
        (e, guessed)
    }

    /// Refuses an explicit entry the probe found does not work here for a
    /// guest of this width. `Ok` when it works, or when the probe could not
    /// run (the guest then says what happens). See [`refuse_entry`].
    pub fn check_entry(&self, elf32: bool, entry: Entry) -> Result<(), String> {
        match &self.entry_findings().outcomes {
            Ok(outcomes) => refuse_entry(elf32, entry, outcomes).map_or(Ok(()), Err),
            Err(_) => Ok(()),
        }
    }

    /// Whether the vCPU can use PCID (probe, run at its first use); `None`
    /// if the probe could not run.
    pub fn pcid_usable(&self) -> Option<(bool, String)> {
        self.pcid
            .get_or_init(|| {
                self.cache.cached(
                    |f| f.pcid.clone(),
                    || {
                        self.say_probing("PCID", "a few ms");
                        probe::probe_pcid(&ProbeOptions::default())
                            .ok()
                            .map(|p| (p.usable(), p.detail))
                    },
                    |f, v| f.pcid = Some(v.clone()),
                )
            })
            .clone()
    }

    /// Whether a guest CR3 write costs user code a TLB refill on this host
    /// (the refill probe, some hundreds of milliseconds, run at its first
    /// use). If the probe cannot run, the verdict is `unmeasured` with the
    /// reason.
    pub fn cr3_write_refill(&self) -> &probe::RefillProbe {
        self.refill.get_or_init(|| {
            self.cache.cached(
                |f| f.refill.as_ref().and_then(CachedRefill::to_probe),
                || {
                    self.say_probing(
                        "whether a guest CR3 write costs user code a TLB refill",
                        "some hundreds of ms",
                    );
                    // The entry probe's findings choose the refill probe's
                    // entry (probed again inside it only if they are unknown).
                    let working = self.entry_findings().working();
                    probe::probe_cr3_write_refill_with(&ProbeOptions::default(), working.as_deref())
                        .unwrap_or_else(|e| {
                            probe::RefillProbe::unmeasured(
                                None,
                                format!("the probe could not run: {e}"),
                            )
                        })
                },
                |f, v| f.refill = Some(CachedRefill::from(v)),
            )
        })
    }

    /// Records what the full probe (`ptiscope probe`) just measured, here
    /// (a refill verdict already settled stays) and in the host facts
    /// cache, replacing what it held: `ptiscope probe` refreshes it.
    pub fn remember_report(&self, r: &probe::ProbeReport) {
        let _ = self.refill.set(r.cr3_write_refill.clone());
        let entries: Vec<(String, String, bool)> = r
            .entries
            .iter()
            .filter_map(|e| {
                Some((
                    e.entry?.name().to_owned(),
                    e.outcome.to_string(),
                    e.outcome.works(),
                ))
            })
            .collect();
        self.cache.record(|f| {
            f.entries = Some(Ok(entries));
            f.pcid = Some(Some((r.pcid.usable(), r.pcid.detail.clone())));
            f.pae = Some(Some((
                r.paging.pae.outcome.works(),
                format!("{}; {}", r.paging.pae.outcome, r.paging.pae.detail),
            )));
            f.refill = Some(CachedRefill::from(&r.cr3_write_refill));
        });
    }

    /// Whether the vCPU can enable 32-bit PAE paging (probe, run at its
    /// first use); `None` if the probe could not run.
    pub fn pae_paging_usable(&self) -> Option<(bool, String)> {
        self.pae
            .get_or_init(|| {
                self.cache.cached(
                    |f| f.pae.clone(),
                    || {
                        self.say_probing("32-bit PAE paging", "a few ms");
                        probe::probe_pae_paging(&ProbeOptions::default()).ok()
                    },
                    |f, v| f.pae = Some(v.clone()),
                )
            })
            .clone()
    }
}

/// `entry=auto` for a guest width, over the long-mode probe's working
/// entries (`None`: the probe could not run) and the flavour heuristic.
///
/// The 64-bit guest takes the probe's preferred working entry (SYSCALL
/// where it really reaches CPL0, else `int $0x80`, `int3`, `int $4`).
/// The i386 guest runs in 32-bit legacy mode, which the long-mode probe
/// does not test: there SYSCALL is AMD-only (the guest exits 6 on Intel)
/// and SYSENTER works on both vendors (AMD #UDs it only in long mode, which
/// is what the probe saw), so its entry is SYSENTER, its native one,
/// whatever the long-mode probe found.
pub fn choose_auto_entry(
    elf32: bool,
    working: Option<&[Entry]>,
    heuristic: Entry,
) -> (Entry, bool) {
    if elf32 {
        return (Entry::Sysenter, false);
    }
    match working.and_then(probe::preferred_entry) {
        Some(e) => (e, false),
        None => (heuristic, true),
    }
}

/// Why an explicit entry is refused, from the long-mode probe's outcomes
/// (entry, what happened, whether it reached CPL0). The probe's guests run
/// in long mode, so its verdicts bind the 64-bit guest only: the i386 guest
/// (32-bit legacy mode) is never refused from them (SYSENTER #UDs in long
/// mode on AMD and works in legacy mode; 32-bit SYSCALL on Intel is the
/// guest's own exit 6, with its message).
pub fn refuse_entry(
    elf32: bool,
    entry: Entry,
    outcomes: &[(Entry, String, bool)],
) -> Option<String> {
    if elf32 {
        return None;
    }
    let mine: Vec<&(Entry, String, bool)> =
        outcomes.iter().filter(|(e, _, _)| *e == entry).collect();
    if mine.is_empty() || mine.iter().any(|(_, _, w)| *w) {
        return None;
    }
    let working: Vec<&str> = outcomes
        .iter()
        .filter(|(_, _, w)| *w)
        .map(|(e, _, _)| e.name())
        .collect();
    Some(format!(
        "--entry {entry}: this host's KVM does not deliver it from user mode to the kernel \
         (probe: {}); entries that work here: {} (or use --entry auto)",
        mine[0].1,
        if working.is_empty() {
            "none".to_string()
        } else {
            working.join(", ")
        }
    ))
}

/// `uname -sr` and the host CPU model, for report headers.
pub fn describe_host() -> String {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("Linux {release}, {cpu}, {cpus} CPUs")
}

#[cfg(test)]
mod entry_choice_tests {
    use super::*;

    /// The long-mode probe's outcomes as each KVM gives them: (entry, works).
    fn host(rows: &[(Entry, bool)]) -> Vec<(Entry, String, bool)> {
        rows.iter()
            .map(|&(e, w)| {
                (
                    e,
                    if w {
                        "delivered at CPL0".into()
                    } else {
                        "#UD".into()
                    },
                    w,
                )
            })
            .collect()
    }

    fn working(o: &[(Entry, String, bool)]) -> Vec<Entry> {
        o.iter().filter(|r| r.2).map(|r| r.0).collect()
    }

    /// kvm_pvm: SYSCALL stays at CPL3, SYSENTER #UDs, the INTs work.
    fn kvm_pvm() -> Vec<(Entry, String, bool)> {
        use Entry::*;
        host(&[
            (Syscall, false),
            (Sysenter, false),
            (Int80, true),
            (Int3, true),
            (Int4, true),
        ])
    }
    /// kvm_amd (nested in QEMU TCG, and AMD hardware): SYSENTER #UDs in long mode.
    fn amd() -> Vec<(Entry, String, bool)> {
        use Entry::*;
        host(&[
            (Syscall, true),
            (Sysenter, false),
            (Int80, true),
            (Int3, true),
            (Int4, true),
        ])
    }
    /// kvm_intel: SYSENTER works in long mode too.
    fn intel() -> Vec<(Entry, String, bool)> {
        use Entry::*;
        host(&[
            (Syscall, true),
            (Sysenter, true),
            (Int80, true),
            (Int3, true),
            (Int4, true),
        ])
    }

    #[test]
    fn auto_for_the_64_bit_guest_follows_the_long_mode_probe() {
        assert_eq!(
            choose_auto_entry(false, Some(&working(&kvm_pvm())), Entry::Int3),
            (Entry::Int80, false)
        );
        assert_eq!(
            choose_auto_entry(false, Some(&working(&amd())), Entry::Syscall),
            (Entry::Syscall, false)
        );
        assert_eq!(
            choose_auto_entry(false, Some(&working(&intel())), Entry::Syscall),
            (Entry::Syscall, false)
        );
        // No probe: the flavour heuristic, said to be a guess.
        assert_eq!(
            choose_auto_entry(false, None, Entry::Int3),
            (Entry::Int3, true)
        );
        assert_eq!(
            choose_auto_entry(false, Some(&[]), Entry::Syscall),
            (Entry::Syscall, true)
        );
    }

    #[test]
    fn auto_for_the_i386_guest_is_sysenter_on_every_host() {
        // Never SYSCALL from a 64-bit probe (32-bit SYSCALL is AMD-only:
        // the guest exited 6 on nested kvm_amd's `entry=syscall` pick).
        for (name, o) in [
            ("kvm_pvm", kvm_pvm()),
            ("kvm_amd", amd()),
            ("kvm_intel", intel()),
        ] {
            assert_eq!(
                choose_auto_entry(true, Some(&working(&o)), Entry::Syscall),
                (Entry::Sysenter, false),
                "{name}"
            );
        }
        assert_eq!(
            choose_auto_entry(true, None, Entry::Syscall),
            (Entry::Sysenter, false)
        );
    }

    #[test]
    fn explicit_entries_are_refused_from_the_probe_of_their_width_only() {
        // AMD (nested or hardware): SYSENTER #UDs in long mode: refused for
        // the 64-bit guest, accepted for the i386 one (legacy mode).
        let msg = refuse_entry(false, Entry::Sysenter, &amd()).expect("refused for x86_64");
        assert!(
            msg.contains("--entry sysenter")
                && msg.contains("#UD")
                && msg.contains("syscall, int80"),
            "{msg}"
        );
        assert_eq!(refuse_entry(true, Entry::Sysenter, &amd()), None);
        assert_eq!(refuse_entry(false, Entry::Syscall, &amd()), None);
        // Intel: both work in long mode.
        assert_eq!(refuse_entry(false, Entry::Sysenter, &intel()), None);
        assert_eq!(refuse_entry(true, Entry::Sysenter, &intel()), None);
        // kvm_pvm: SYSCALL is refused for the 64-bit guest.
        assert!(refuse_entry(false, Entry::Syscall, &kvm_pvm()).is_some());
        assert_eq!(refuse_entry(false, Entry::Int80, &kvm_pvm()), None);
        assert_eq!(refuse_entry(true, Entry::Int80, &kvm_pvm()), None);
    }
}
