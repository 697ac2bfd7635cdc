//! The probe's host facts kept across processes, once per boot of the host.
//!
//! The facts `probe::host` acts on (which entries reach CPL0, PCID, 32-bit
//! PAE paging, the CR3-refill verdict) do not change while the host runs
//! the same kernel, CPU microcode, KVM module and module parameters, and the
//! same ptiscope binary. Probing them costs a default `run` more than the
//! guest itself (a dozen probe VMs, the refill probe some hundreds of ms),
//! so the first process after a boot writes them to
//! `$XDG_CACHE_HOME/ptiscope/host-facts.json` (else `~/.cache/...`) and the
//! next ones read them back.
//!
//! The file is hostile input: read bounded (regular file, 64 KiB, 1 s),
//! parsed strictly, every string and list bounded, every entry name one
//! the guest knows, every figure finite; a file that fails any check, or
//! whose key (the KVM device, boot id, `uname`, the first CPU's vendor/family/
//! model/stepping/microcode, the KVM modules and their parameters, ptiscope's version,
//! revision and executable) differs from this process's, is ignored and
//! probed afresh. `PTISCOPE_HOST_CACHE=off` neither reads nor writes it,
//! `PTISCOPE_HOST_CACHE=refresh` probes afresh and rewrites it, and
//! `ptiscope probe` always measures and rewrites it.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::probe::{self, Entry, RefillProbe, RefillVerdict};

/// The cache file's format; a file of another format is ignored.
const FORMAT: u32 = 1;
/// Longest cache file read.
const MAX_BYTES: u64 = 64 * 1024;
/// Longest string kept from the file.
const MAX_STRING: usize = 4096;

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

/// The file: its format, the key it was written under, the facts.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    format: u32,
    key: String,
    facts: Facts,
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

/// `$XDG_CACHE_HOME/ptiscope/host-facts.json`, else `$HOME/.cache/...`
/// (absolute paths only, as the XDG spec says); `None` without either.
fn path() -> Option<PathBuf> {
    let abs = |v: Option<std::ffi::OsString>| {
        v.map(PathBuf::from)
            .filter(|p| p.is_absolute() && p.as_os_str().len() < 4096)
    };
    let base = abs(std::env::var_os("XDG_CACHE_HOME"))
        .or_else(|| abs(std::env::var_os("HOME")).map(|h| h.join(".cache")))?;
    Some(base.join("ptiscope").join("host-facts.json"))
}

/// What the facts depend on, as one string: the host's boot, kernel, CPU,
/// microcode, KVM modules and their parameters, and this ptiscope binary.
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
    let cpuinfo = read("/proc/cpuinfo");
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
        if !dir.exists() {
            continue;
        }
        k.push_str(module);
        k.push('\n');
        let mut params: Vec<_> = std::fs::read_dir(dir.join("parameters"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect();
        params.sort();
        for p in params {
            let v = std::fs::read_to_string(&p).unwrap_or_default();
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            k.push_str(&format!("{}={}\n", name.unwrap_or_default(), v.trim()));
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

/// Reads and checks the file; `None` (with the reason logged) when it is
/// absent, unreadable, malformed, out of bounds or written under another key.
fn load(path: &std::path::Path, key: &str) -> Option<Facts> {
    let bytes =
        match crate::input::read_regular("host cache", path, MAX_BYTES, Duration::from_secs(1)) {
            Ok(b) => b,
            Err(e) => {
                log::debug!("host facts cache not used: {e}");
                return None;
            }
        };
    let file: File = match serde_json::from_slice(&bytes) {
        Ok(f) => f,
        Err(e) => {
            log::warn!(
                "host facts cache {} is malformed ({e}); probing afresh",
                path.display()
            );
            return None;
        }
    };
    if file.format != FORMAT || file.key != key {
        log::debug!(
            "host facts cache {} is for another host state",
            path.display()
        );
        return None;
    }
    if !file.facts.valid() {
        log::warn!(
            "host facts cache {} holds out-of-bounds values; probing afresh",
            path.display()
        );
        return None;
    }
    Some(file.facts)
}

/// Writes the file (a temporary file renamed into place, so that a reader
/// never sees half of it). Failing is not an error: the next process probes.
fn store(path: &std::path::Path, key: &str, facts: &Facts) {
    let write = || -> std::io::Result<()> {
        let dir = path.parent().ok_or(std::io::ErrorKind::NotFound)?;
        std::fs::create_dir_all(dir)?;
        let text = serde_json::to_vec_pretty(&File {
            format: FORMAT,
            key: key.to_owned(),
            facts: facts.clone(),
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

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn with_state<T>(f: impl FnOnce(&mut State) -> T) -> T {
    let mut guard = STATE.lock().unwrap_or_else(|p| p.into_inner());
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

/// The cached value `get` picks out of the facts, or, if there is none,
/// `probe`'s answer, which `put` records and the file keeps.
pub fn cached<T>(
    get: impl FnOnce(&Facts) -> Option<T>,
    probe: impl FnOnce() -> T,
    put: impl FnOnce(&mut Facts, &T),
) -> T {
    if let Some(v) = with_state(|s| get(&s.facts)) {
        return v;
    }
    // Probe outside the lock: the probes run VMs, some hundreds of ms.
    let v = probe();
    record(|f| put(f, &v));
    v
}

/// Records a fact measured in this process and rewrites the file.
pub fn record(put: impl FnOnce(&mut Facts)) {
    with_state(|s| {
        put(&mut s.facts);
        if let Some(p) = &s.path {
            store(p, &s.key, &s.facts);
        }
    });
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
        std::fs::write(&path, b"{\"format\": 1, \"key\": \"key A\", \"facts\": 7}").unwrap();
        assert_eq!(load(&path, "key A"), None, "malformed");
        std::fs::write(&path, vec![b' '; MAX_BYTES as usize + 1]).unwrap();
        assert_eq!(load(&path, "key A"), None, "too long");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
