//! The probe's host facts kept across processes, once per boot of the host.
//!
//! The facts `probe::host` acts on (which entries reach CPL0, PCID, 32-bit
//! PAE paging, the CR3-refill verdict) do not change while the host runs
//! the same kernel, CPU microcode, KVM module and module parameters, and the
//! same ptiscope binary. Probing them costs a default `run` more than the
//! guest itself (a dozen probe VMs, the refill probe some hundreds of ms),
//! so the first process after a boot writes them to
//! `$XDG_CACHE_HOME/ptiscope/host-facts.v2.json` (else `~/.cache/...`) and
//! the next ones read them back. The name carries the format: ptiscope
//! binaries of the one-key format (`host-facts.json`) on the same host keep
//! their own file instead of rewriting this one in turn.
//!
//! The file holds the facts under up to [`MAX_KEYS`] keys (the KVM device,
//! boot id, `uname`, the first CPU's vendor/family/model/stepping/microcode,
//! the KVM modules and their parameters, ptiscope's version, revision and
//! executable), the most recently written last; writing a ninth drops the
//! oldest. So the `ptiscope` binary and the test binaries, whose keys differ
//! (each executable is its own), keep their facts side by side instead of
//! overwriting each other's. A process uses only the facts under its own key;
//! without them it probes afresh. Two processes writing at the same moment:
//! the later rename wins, and the other's facts are probed again next time.
//!
//! The file is hostile input: read bounded (regular file, 256 KiB, 1 s),
//! parsed strictly, at most [`MAX_KEYS`] keys, every key, string and list
//! bounded, every entry name one the guest knows, every figure finite; a
//! file that fails any check is ignored as a whole (and rewritten with this
//! process's facts alone). `PTISCOPE_HOST_CACHE=off` neither reads nor writes it,
//! `PTISCOPE_HOST_CACHE=refresh` probes afresh and rewrites it, and
//! `ptiscope probe` always measures and rewrites it.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::probe::{self, RefillProbe, RefillVerdict};
use ptiscope_abi::options::Entry;

/// The cache file's format; a file of another format is ignored (format 1
/// held one key).
const FORMAT: u32 = 2;
/// Most keys the file holds (the oldest written is dropped first).
pub const MAX_KEYS: usize = 8;
/// Longest cache file read.
const MAX_BYTES: u64 = 256 * 1024;
/// Longest string kept from the file.
const MAX_STRING: usize = 4096;
/// Longest key kept (a host's is about 1 KiB, mostly KVM's parameters).
const MAX_KEY: usize = 16 * 1024;

/// The entry probe's findings as the file holds them: (entry name, outcome,
/// reaches CPL0) per entry, or why the probe could not run.
pub type CachedEntries = Result<Vec<(String, String, bool)>, String>;

/// What is cached: each field `None` until probed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Facts {
    /// The entry probe: (entry name, outcome, reaches CPL0), or why it could not run.
    pub entries: Option<CachedEntries>,
    /// The PCID probe: usable and detail; inner `None` if it could not run.
    pub pcid: Option<Option<(bool, String)>>,
    /// The 32-bit PAE paging probe, likewise.
    pub pae: Option<Option<(bool, String)>>,
    /// The CR3-refill probe.
    pub refill: Option<CachedRefill>,
}

/// Which facts a [`Cache`] holds ([`Cache::known`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Known {
    /// The entry probe's findings.
    pub entries: bool,
    /// The PCID probe's.
    pub pcid: bool,
    /// The 32-bit PAE paging probe's.
    pub pae: bool,
    /// A usable CR3-refill verdict.
    pub refill: bool,
}

/// A [`RefillProbe`] as the file holds it (the entry by name).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CachedRefill {
    verdict: RefillVerdict,
    ns_per_page: Option<f64>,
    ns_per_page_fastest: Option<f64>,
    ns_per_page_range: Option<(f64, f64)>,
    threshold_ns_per_page: f64,
    entry: Option<String>,
    pages: u32,
    trips: u32,
    batches: u32,
    rounds: u32,
    tsc_khz: Option<f64>,
    medians_ns_per_trip: Option<[f64; 4]>,
    elapsed_ms: f64,
    detail: String,
}

impl From<&RefillProbe> for CachedRefill {
    fn from(r: &RefillProbe) -> Self {
        CachedRefill {
            verdict: r.verdict,
            ns_per_page: r.ns_per_page,
            ns_per_page_fastest: r.ns_per_page_fastest,
            ns_per_page_range: r.ns_per_page_range,
            threshold_ns_per_page: r.threshold_ns_per_page,
            entry: r.entry.map(|e| e.name().to_owned()),
            pages: r.pages,
            trips: r.trips,
            batches: r.batches,
            rounds: r.rounds,
            tsc_khz: r.tsc_khz,
            medians_ns_per_trip: r
                .medians_ns_per_trip
                .map(|m| [m.bare_0, m.cr3_0, m.bare_w, m.cr3_w]),
            elapsed_ms: r.elapsed_ms,
            detail: r.detail.clone(),
        }
    }
}

impl CachedRefill {
    /// The probe result, or `None` if a field is out of bounds.
    pub fn to_probe(&self) -> Option<RefillProbe> {
        let finite = |v: Option<f64>| v.is_none_or(f64::is_finite);
        let ok = finite(self.ns_per_page)
            && finite(self.ns_per_page_fastest)
            && self
                .ns_per_page_range
                .is_none_or(|(a, b)| a.is_finite() && b.is_finite())
            && self.threshold_ns_per_page.is_finite()
            && finite(self.tsc_khz)
            && self
                .medians_ns_per_trip
                .is_none_or(|m| m.iter().all(|v| v.is_finite()))
            && self.elapsed_ms.is_finite()
            && self.detail.len() <= MAX_STRING;
        if !ok {
            return None;
        }
        let entry = match &self.entry {
            Some(name) => Some(name.parse::<Entry>().ok()?),
            None => None,
        };
        Some(RefillProbe {
            verdict: self.verdict,
            ns_per_page: self.ns_per_page,
            ns_per_page_fastest: self.ns_per_page_fastest,
            ns_per_page_range: self.ns_per_page_range,
            threshold_ns_per_page: self.threshold_ns_per_page,
            entry,
            pages: self.pages,
            trips: self.trips,
            batches: self.batches,
            rounds: self.rounds,
            tsc_khz: self.tsc_khz,
            medians_ns_per_trip: self.medians_ns_per_trip.map(|[a, b, c, d]| {
                probe::refill::TripMedians {
                    bare_0: a,
                    cr3_0: b,
                    bare_w: c,
                    cr3_w: d,
                }
            }),
            elapsed_ms: self.elapsed_ms,
            detail: self.detail.clone(),
        })
    }
}

/// The file: its format and the facts per key, oldest written first.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    format: u32,
    hosts: Vec<Keyed>,
}

/// The facts written under one key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Keyed {
    key: String,
    facts: Facts,
}

impl File {
    /// Whether the file is within bounds: its format, at most
    /// [`MAX_KEYS`] distinct keys of bounded length, valid facts under each.
    fn valid(&self) -> bool {
        let keys: std::collections::HashSet<&str> =
            self.hosts.iter().map(|h| h.key.as_str()).collect();
        self.format == FORMAT
            && self.hosts.len() <= MAX_KEYS
            && keys.len() == self.hosts.len()
            && self
                .hosts
                .iter()
                .all(|h| h.key.len() <= MAX_KEY && h.facts.valid())
    }
}

impl Facts {
    /// Whether every string and list is within bounds and every entry
    /// name is one the guest knows.
    fn valid(&self) -> bool {
        let short = |s: &str| s.len() <= MAX_STRING;
        let pair = |p: &Option<Option<(bool, String)>>| {
            p.as_ref()
                .is_none_or(|o| o.as_ref().is_none_or(|(_, d)| short(d)))
        };
        let entries = match &self.entries {
            None => true,
            Some(Err(e)) => short(e),
            Some(Ok(v)) => {
                v.len() <= 16
                    && v.iter()
                        .all(|(e, d, _)| e.parse::<Entry>().is_ok() && short(d))
            }
        };
        entries
            && pair(&self.pcid)
            && pair(&self.pae)
            && self.refill.as_ref().is_none_or(|r| r.to_probe().is_some())
    }
}

/// What `PTISCOPE_HOST_CACHE` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Use,
    Refresh,
    Off,
}

fn mode() -> Mode {
    match std::env::var("PTISCOPE_HOST_CACHE").as_deref() {
        Ok("off") | Ok("0") => Mode::Off,
        Ok("refresh") => Mode::Refresh,
        _ => Mode::Use,
    }
}

/// `$XDG_CACHE_HOME/ptiscope/host-facts.v2.json`, else `$HOME/.cache/...`
/// (absolute paths only, as the XDG spec says); `None` without either.
fn path() -> Option<PathBuf> {
    let abs = |v: Option<std::ffi::OsString>| {
        v.map(PathBuf::from)
            .filter(|p| p.is_absolute() && p.as_os_str().len() < 4096)
    };
    let base = abs(std::env::var_os("XDG_CACHE_HOME"))
        .or_else(|| abs(std::env::var_os("HOME")).map(|h| h.join(".cache")))?;
    Some(
        base.join("ptiscope")
            .join(format!("host-facts.v{FORMAT}.json")),
    )
}

/// What the facts depend on, as one string: the host's boot, kernel, CPU,
/// microcode, KVM modules and their parameters, and this ptiscope binary.
/// Every process reads it before its first boot (on the `host-facts`
/// thread), so it is read cheaply: one `read` per file, the parameters
/// opened relative to their directory (a sysfs path walk costs more than
/// the read), and of /proc/cpuinfo only the first CPU's block.
pub fn key() -> String {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    // The device the probes open (`PTISCOPE_KVM_DEVICE` may name another).
    let mut k = format!("device {}\n", crate::machine::kvm::kvm_device_path());
    for p in [
        "/proc/sys/kernel/random/boot_id",
        "/proc/sys/kernel/osrelease",
        "/proc/sys/kernel/version",
    ] {
        k.push_str(read(p).trim());
        k.push('\n');
    }
    // The first CPU's identity (every CPU of a host runs the same microcode).
    let cpuinfo = first_cpu_block();
    for line in cpuinfo.lines().take_while(|l| !l.trim().is_empty()) {
        let name = line.split(':').next().unwrap_or("").trim();
        if matches!(
            name,
            "vendor_id" | "cpu family" | "model" | "model name" | "stepping" | "microcode"
        ) {
            k.push_str(line.trim());
            k.push('\n');
        }
    }
    for module in ["kvm", "kvm_pvm", "kvm_intel", "kvm_amd"] {
        let dir = PathBuf::from("/sys/module").join(module);
        let Ok(params) = std::fs::File::open(dir.join("parameters")) else {
            if dir.exists() {
                // A module without parameters is still part of the key.
                k.push_str(module);
                k.push('\n');
            }
            continue;
        };
        k.push_str(module);
        k.push('\n');
        let mut names: Vec<_> = std::fs::read_dir(dir.join("parameters"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        names.sort();
        for name in names {
            let v = read_attribute(&params, &name).unwrap_or_default();
            k.push_str(&format!("{}={}\n", name.to_string_lossy(), v.trim()));
        }
    }
    k.push_str(&format!(
        "ptiscope {} {}\n",
        env!("CARGO_PKG_VERSION"),
        option_env!("PTISCOPE_GIT_REVISION").unwrap_or("-")
    ));
    if let Some(m) = std::env::current_exe()
        .ok()
        .and_then(|p| std::fs::metadata(p).ok())
    {
        use std::os::unix::fs::MetadataExt;
        k.push_str(&format!(
            "exe {} {} {}.{}\n",
            m.ino(),
            m.len(),
            m.mtime(),
            m.mtime_nsec()
        ));
    }
    k
}

/// /proc/cpuinfo up to the end of its first CPU's block: the kernel
/// formats a block per CPU as it is read, so a host of many CPUs is not
/// asked for all of them (nor, for each, its current frequency).
fn first_cpu_block() -> String {
    use std::io::Read;
    let mut text = Vec::new();
    if let Ok(f) = std::fs::File::open("/proc/cpuinfo") {
        let mut f = f.take(64 * 1024);
        let mut chunk = [0u8; 4096];
        while let Ok(n @ 1..) = f.read(&mut chunk) {
            text.extend_from_slice(&chunk[..n]);
            if text.windows(2).any(|w| w == b"\n\n") {
                break;
            }
        }
    }
    String::from_utf8_lossy(&text).into_owned()
}

/// One sysfs attribute of the directory `dir`, read with one `read` (an
/// attribute's text is at most a page).
fn read_attribute(dir: &std::fs::File, name: &std::ffi::OsStr) -> Option<String> {
    use std::io::Read;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let cname = std::ffi::CString::new(name.as_bytes()).ok()?;
    // SAFETY: `dir` is an open directory descriptor and `cname` a
    // NUL-terminated name; openat returns a new descriptor or -1.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            cname.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let mut page = [0u8; 4096];
    let n = file.read(&mut page).ok()?;
    Some(String::from_utf8_lossy(&page[..n]).into_owned())
}

/// Reads and checks the file: every key's facts, oldest written first;
/// empty (with the reason logged) when it is absent, unreadable, malformed,
/// of another format or out of bounds.
fn load_all(path: &std::path::Path) -> Vec<Keyed> {
    let bytes =
        match crate::input::read_regular("host cache", path, MAX_BYTES, Duration::from_secs(1)) {
            Ok(b) => b,
            Err(e) => {
                log::debug!("host facts cache not used: {e}");
                return Vec::new();
            }
        };
    let file: File = match serde_json::from_slice(&bytes) {
        Ok(f) => f,
        Err(e) => {
            log::warn!(
                "host facts cache {} is malformed ({e}); probing afresh",
                path.display()
            );
            return Vec::new();
        }
    };
    if !file.valid() {
        log::warn!(
            "host facts cache {} is of another format or holds out-of-bounds values; probing \
             afresh",
            path.display()
        );
        return Vec::new();
    }
    file.hosts
}

/// The facts the file holds under `key`; `None` when it holds none (or
/// cannot be used, [`load_all`]).
fn load(path: &std::path::Path, key: &str) -> Option<Facts> {
    let found = load_all(path).into_iter().find(|h| h.key == key);
    if found.is_none() {
        log::debug!(
            "host facts cache {} has no facts for this host state",
            path.display()
        );
    }
    found.map(|h| h.facts)
}

/// Writes `facts` under `key`, keeping the other keys the file holds now
/// (read again here: another process may have written since) and dropping
/// the oldest beyond [`MAX_KEYS`]; a temporary file is renamed into place,
/// so that a reader never sees half of it. Failing is not an error: the
/// next process probes.
fn store(path: &std::path::Path, key: &str, facts: &Facts) {
    let mut hosts = load_all(path);
    hosts.retain(|h| h.key != key);
    hosts.push(Keyed {
        key: key.to_owned(),
        facts: facts.clone(),
    });
    let excess = hosts.len().saturating_sub(MAX_KEYS);
    hosts.drain(..excess);
    let write = || -> std::io::Result<()> {
        let dir = path.parent().ok_or(std::io::ErrorKind::NotFound)?;
        std::fs::create_dir_all(dir)?;
        let text = serde_json::to_vec_pretty(&File {
            format: FORMAT,
            hosts,
        })
        .map_err(std::io::Error::other)?;
        let tmp = dir.join(format!(".host-facts.{}.tmp", std::process::id()));
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, path).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    };
    if let Err(e) = write() {
        log::debug!("host facts cache {} not written: {e}", path.display());
    }
}

/// The process's view of the cache: the facts read at the first use (or
/// none), and where to write them back.
struct State {
    key: String,
    path: Option<PathBuf>,
    facts: Facts,
}

/// The cache as one [`HostFacts`](crate::probe::host::HostFacts) value
/// holds it: the key and the file are read at the first use (or by
/// [`Cache::warm`], on another thread), then kept here, and every fact
/// probed afterwards is written back.
#[derive(Default)]
pub struct Cache {
    state: Mutex<Option<State>>,
    /// For a KVM this process cannot probe (`--backend nested`'s inner
    /// kvm_amd): where its facts come from, asked at their first use
    /// instead of the file.
    #[allow(clippy::type_complexity)]
    source: Mutex<Option<Box<dyn FnOnce() -> Facts + Send>>>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache").finish_non_exhaustive()
    }
}

impl Cache {
    /// A cache whose facts `source` gives at their first use, keeping
    /// nothing: the facts of a KVM this process cannot probe itself
    /// (`--backend nested`'s inner kvm_amd, as its inner ptiscope probed
    /// them: asking boots its VM, so a command refused before it needs a
    /// fact boots nothing).
    pub fn from_source(source: impl FnOnce() -> Facts + Send + 'static) -> Cache {
        Cache {
            state: Mutex::new(None),
            source: Mutex::new(Some(Box::new(source))),
        }
    }

    /// The facts this process holds (read from the file or probed).
    pub fn facts(&self) -> Facts {
        self.with_state(|s| s.facts.clone())
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            let source = self.source.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(source) = source {
                *guard = Some(State {
                    key: String::new(),
                    path: None,
                    facts: source(),
                });
            }
        }
        let state = guard.get_or_insert_with(|| {
            let mode = mode();
            let path = if mode == Mode::Off { None } else { path() };
            let key = if path.is_some() { key() } else { String::new() };
            let facts = match (&path, mode) {
                (Some(p), Mode::Use) => load(p, &key).unwrap_or_default(),
                _ => Facts::default(),
            };
            State { key, path, facts }
        });
        f(state)
    }

    /// Reads the key and the cache file now, so that the first
    /// [`Cache::cached`] finds them (a caller on another thread blocks
    /// until they are read).
    pub fn warm(&self) {
        self.with_state(|_| ());
    }

    /// Which facts the cache holds for this process (reading the key and
    /// the file now if nobody has yet).
    pub fn known(&self) -> Known {
        self.with_state(|s| Known {
            entries: s.facts.entries.is_some(),
            pcid: s.facts.pcid.is_some(),
            pae: s.facts.pae.is_some(),
            refill: s
                .facts
                .refill
                .as_ref()
                .is_some_and(|r| r.to_probe().is_some()),
        })
    }

    /// Where what this process probes is kept, in words, for the line
    /// that says a probe runs.
    pub fn describe(&self) -> String {
        match (mode(), self.with_state(|s| s.path.clone())) {
            (Mode::Off, _) => "PTISCOPE_HOST_CACHE=off: not kept".into(),
            (_, None) => "not kept: neither XDG_CACHE_HOME nor HOME is set".into(),
            (Mode::Refresh, Some(p)) => {
                format!("PTISCOPE_HOST_CACHE=refresh: kept in {}", p.display())
            }
            (Mode::Use, Some(p)) => format!(
                "once per host boot and ptiscope build: kept in {}",
                p.display()
            ),
        }
    }

    /// The cached value `get` picks out of the facts, or, if there is none,
    /// `probe`'s answer, which `put` records and the file keeps.
    pub fn cached<T>(
        &self,
        get: impl FnOnce(&Facts) -> Option<T>,
        probe: impl FnOnce() -> T,
        put: impl FnOnce(&mut Facts, &T),
    ) -> T {
        if let Some(v) = self.with_state(|s| get(&s.facts)) {
            return v;
        }
        // Probe outside the lock: the probes run VMs, some hundreds of ms.
        let v = probe();
        self.record(|f| put(f, &v));
        v
    }

    /// Records a fact measured in this process and rewrites the file.
    pub fn record(&self, put: impl FnOnce(&mut Facts)) {
        self.with_state(|s| {
            put(&mut s.facts);
            if let Some(p) = &s.path {
                store(p, &s.key, &s.facts);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refill() -> RefillProbe {
        RefillProbe::unmeasured(Some(Entry::Int3), "why".into())
    }

    #[test]
    fn a_refill_survives_the_round_trip() {
        let r = refill();
        assert_eq!(CachedRefill::from(&r).to_probe(), Some(r));
    }

    #[test]
    fn out_of_bounds_facts_are_refused() {
        let mut f = Facts {
            entries: Some(Ok(vec![("int3".into(), "delivered".into(), true)])),
            pcid: Some(Some((false, "no".into()))),
            pae: Some(None),
            refill: Some(CachedRefill::from(&refill())),
        };
        assert!(f.valid());
        f.entries = Some(Ok(vec![("rm -rf".into(), "x".into(), true)]));
        assert!(!f.valid(), "an unknown entry name");
        f.entries = None;
        f.pcid = Some(Some((true, "x".repeat(MAX_STRING + 1))));
        assert!(!f.valid(), "an overlong string");
        f.pcid = None;
        let mut r = CachedRefill::from(&refill());
        r.ns_per_page = Some(f64::NAN);
        f.refill = Some(r);
        assert!(!f.valid(), "a figure that is not finite");
    }

    #[test]
    fn a_file_is_used_only_under_its_own_key() {
        let dir = std::env::temp_dir().join(format!("ptiscope-host-cache-{}", std::process::id()));
        let path = dir.join("host-facts.json");
        let facts = Facts {
            pae: Some(Some((true, "ok".into()))),
            ..Facts::default()
        };
        store(&path, "key A", &facts);
        assert_eq!(load(&path, "key A"), Some(facts));
        assert_eq!(load(&path, "key B"), None);
        std::fs::write(
            &path,
            b"{\"format\": 2, \"hosts\": [{\"key\": \"key A\", \"facts\": 7}]}",
        )
        .unwrap();
        assert_eq!(load(&path, "key A"), None, "malformed");
        std::fs::write(&path, b"{\"format\": 1, \"key\": \"key A\", \"facts\": {}}").unwrap();
        assert_eq!(load(&path, "key A"), None, "the one-key format");
        std::fs::write(&path, vec![b' '; MAX_BYTES as usize + 1]).unwrap();
        assert_eq!(load(&path, "key A"), None, "too long");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A scratch cache file, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let dir = std::env::temp_dir()
                .join(format!("ptiscope-host-cache-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            Scratch(dir)
        }
        fn path(&self) -> PathBuf {
            self.0.join("host-facts.json")
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn facts(n: u32) -> Facts {
        Facts {
            pae: Some(Some((n.is_multiple_of(2), format!("facts {n}")))),
            ..Facts::default()
        }
    }

    /// The key's one-read, directory-relative reads say what plain whole-file
    /// reads say (the key of a host must not depend on how it was read).
    #[test]
    fn the_keys_cheap_reads_match_plain_reads() {
        let mut plain = String::new();
        for module in ["kvm", "kvm_pvm", "kvm_intel", "kvm_amd"] {
            let dir = PathBuf::from("/sys/module").join(module);
            if !dir.exists() {
                continue;
            }
            plain.push_str(&format!("{module}\n"));
            let mut params: Vec<_> = std::fs::read_dir(dir.join("parameters"))
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .collect();
            params.sort();
            for p in params {
                let v = std::fs::read_to_string(&p).unwrap_or_default();
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                plain.push_str(&format!("{name}={}\n", v.trim()));
            }
        }
        assert!(key().contains(&plain), "{}\n---\n{plain}", key());
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let first: Vec<&str> = cpuinfo
            .lines()
            .take_while(|l| !l.trim().is_empty())
            .collect();
        let block = first_cpu_block();
        let got: Vec<&str> = block.lines().take_while(|l| !l.trim().is_empty()).collect();
        assert_eq!(got, first);
    }

    #[test]
    fn keys_live_side_by_side_and_the_oldest_is_dropped() {
        let scratch = Scratch::new("keys");
        let path = scratch.path();
        // The binary and a test binary in turn: neither loses its facts.
        store(&path, "ptiscope", &facts(0));
        store(&path, "test binary", &facts(1));
        store(&path, "ptiscope", &facts(2));
        assert_eq!(load(&path, "ptiscope"), Some(facts(2)));
        assert_eq!(load(&path, "test binary"), Some(facts(1)));
        // Rewriting a key moves it to the end: "test binary" is now oldest.
        let keys = |p: &std::path::Path| -> Vec<String> {
            load_all(p).into_iter().map(|h| h.key).collect()
        };
        assert_eq!(keys(&path), ["test binary", "ptiscope"]);
        for n in 0..MAX_KEYS as u32 - 1 {
            store(&path, &format!("other {n}"), &facts(n));
        }
        assert_eq!(load_all(&path).len(), MAX_KEYS);
        assert_eq!(load(&path, "test binary"), None, "the oldest was dropped");
        assert_eq!(load(&path, "ptiscope"), Some(facts(2)));
        assert_eq!(load(&path, "other 6"), Some(facts(6)));
    }

    #[test]
    fn a_file_out_of_bounds_is_ignored_as_a_whole() {
        let scratch = Scratch::new("bounds");
        let path = scratch.path();
        let write = |hosts: Vec<Keyed>| {
            let text = serde_json::to_vec(&File {
                format: FORMAT,
                hosts,
            })
            .unwrap();
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap();
        };
        let keyed = |k: &str, f: Facts| Keyed {
            key: k.into(),
            facts: f,
        };
        // Too many keys, a key twice, an overlong key, bad facts under
        // another key: none of the file is used, not even "mine".
        let many: Vec<Keyed> = (0..=MAX_KEYS)
            .map(|n| keyed(&format!("k{n}"), facts(1)))
            .chain([keyed("mine", facts(0))])
            .collect();
        let mut bad = facts(0);
        bad.pcid = Some(Some((true, "x".repeat(MAX_STRING + 1))));
        for hosts in [
            many,
            vec![keyed("mine", facts(0)), keyed("mine", facts(1))],
            vec![
                keyed(&"k".repeat(MAX_KEY + 1), facts(1)),
                keyed("mine", facts(0)),
            ],
            vec![keyed("other", bad), keyed("mine", facts(0))],
        ] {
            write(hosts);
            assert_eq!(load(&path, "mine"), None);
            // Storing replaces such a file with this process's facts alone.
            store(&path, "mine", &facts(4));
            assert_eq!(load_all(&path), vec![keyed("mine", facts(4))]);
        }
    }
}
