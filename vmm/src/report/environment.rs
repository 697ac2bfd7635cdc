//! The `environment` block of every report: what a result came from, so
//! that results can be compared across machines and versions later, and a
//! comparison against an earlier result can say what changed.
//!
//! Host facts come from the kernel's own files (`uname`, `/proc/cpuinfo`,
//! `/sys/devices/system/cpu/vulnerabilities/*`, `/sys/module/kvm_*`); what
//! this KVM can run comes from the probe, through the host facts the
//! caller hands over (`crate::probe::host::HostFacts`); the ptiscope revision from `vmm/build.rs`
//! (`PTISCOPE_GIT_REVISION`, absent outside a git checkout); the guest
//! image is named by the SHA-256 of its bytes (`sha2` crate).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::machine::kvm::KvmFlavour;
use crate::probe::host::HostFacts;

/// The host: kernel, CPU, and the kernel's own view of its CPU bugs.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Host {
    /// `uname -s -r -v -m`.
    pub kernel: Option<String>,
    /// `vendor_id` of /proc/cpuinfo (e.g. `GenuineIntel`).
    pub cpu_vendor: Option<String>,
    /// `model name` of /proc/cpuinfo.
    pub cpu_model: Option<String>,
    /// `cpu family`, `model`, `stepping` of /proc/cpuinfo, in decimal.
    pub cpu_family: Option<u32>,
    /// See `cpu_family`.
    pub cpu_model_number: Option<u32>,
    /// See `cpu_family`.
    pub cpu_stepping: Option<u32>,
    /// The loaded microcode revision (`0x...`).
    pub microcode: Option<String>,
    /// Online CPUs (`processor` entries of /proc/cpuinfo).
    pub cpus: usize,
    /// The host CPU flags that matter to PTI: `pcid`, `invpcid`, and `pti`
    /// (the host kernel itself runs with page table isolation).
    pub cpu_flags: BTreeMap<String, bool>,
    /// `/sys/devices/system/cpu/vulnerabilities/<name>`: the host kernel's
    /// verdict and mitigation for each CPU bug it knows.
    pub vulnerabilities: BTreeMap<String, String>,
}

/// Which KVM, and how it pages.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Kvm {
    /// `kvm_pvm`, `kvm_intel`, `kvm_amd`; `None` if no KVM module is loaded
    /// (or it is built in and not visible under /sys/module).
    pub module: Option<String>,
    /// `shadow` (KVM sees guest CR3 writes), `ept` or `npt` (two-dimensional
    /// paging: it does not); `None` when unknown.
    pub paging: Option<String>,
    /// Whether KVM's `tlb_flush` stat follows guest CR3 writes here.
    pub sees_cr3_writes: bool,
}

/// What the probe found this KVM can run (`ptiscope probe` has the detail).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ProbeFindings {
    /// Syscall entries that reach the guest kernel from user mode here.
    pub entries_working: Option<Vec<String>>,
    /// The entry `entry=auto` resolves to.
    pub entry_auto: Option<String>,
    /// Whether the vCPU can enable PCID.
    pub pcid_usable: Option<bool>,
    /// Whether the vCPU can enable 32-bit PAE paging (the i386 guest).
    pub pae_paging_usable: Option<bool>,
    /// Whether a guest CR3 write costs user code a TLB refill on this host
    /// (`visible`, `not_visible`, `unmeasured`): the verdict only, so that
    /// `--against` names it when it differs (the figures are in `ptiscope probe`).
    #[serde(default)]
    pub cr3_write_refill: Option<crate::probe::RefillVerdict>,
    /// Why the probe could not run, if it could not.
    pub error: Option<String>,
}

/// This build of ptiscope.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Build {
    /// The crate version (`CARGO_PKG_VERSION`).
    pub version: String,
    /// The git commit the binary was built from; `None` outside a checkout.
    pub git_revision: Option<String>,
}

/// The guest kernel image.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct GuestImage {
    /// `embedded x86_64`, `embedded i386`, or the `--kernel` path.
    pub name: String,
    /// SHA-256 of the image bytes, lowercase hex; `None` if unreadable.
    pub sha256: Option<String>,
    /// Size of the image, bytes (0 if unreadable).
    pub bytes: u64,
    /// Whether it is an ELF32 image (the i386 guest): `entry=auto` is
    /// chosen per guest width.
    #[serde(default)]
    pub elf32: bool,
}

/// What a backend can observe of a run, as data (its `Profile` says it,
/// every report's environment records it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Capabilities {
    /// ptiscope's host-side observer watched the runs: KVM's exits and
    /// statistics, the VMM's own exits, the guest's telemetry page.
    pub host_observer: bool,
    /// The host counts the guest's CR3 writes (KVM under shadow paging, a
    /// TCG plugin), so `cr3_writes` need not be the guest's word alone.
    pub host_counts_cr3_writes: bool,
    /// The host counts a Linux guest's kernel instructions by address
    /// (`--by-symbol`).
    pub counts_kernel_by_address: bool,
    /// The host can stream its statistics while a run runs
    /// (`run --metrics-interval`).
    pub live_metrics: bool,
}

/// Which backend a report's runs ran on, as the environment names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendIdentity {
    /// Its name (`kvm`, `qemu`, ...).
    pub name: &'static str,
    /// What a time figure is there.
    pub time_basis: super::time_basis::TimeBasis,
    /// What it can observe.
    pub capabilities: Capabilities,
}

/// Everything a report records about where it came from.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Environment {
    /// The host.
    pub host: Host,
    /// The KVM in use.
    pub kvm: Kvm,
    /// `kvm` (ptiscope's VMM), `qemu` (QEMU TCG) or `nested`.
    pub backend: String,
    /// What a time figure is on that backend (its `Profile` says it; the
    /// reports read it here rather than knowing the backends). `unknown`
    /// in documents written before it was recorded.
    #[serde(default)]
    pub time_basis: super::time_basis::TimeBasis,
    /// What that backend can observe (all `false` in documents written
    /// before it was recorded).
    #[serde(default)]
    pub capabilities: Capabilities,
    /// What `ptiscope probe` found, as far as the run depends on it.
    pub probe: ProbeFindings,
    /// This build of ptiscope.
    pub ptiscope: Build,
    /// The guest image run.
    pub guest_image: GuestImage,
    /// The options of each side (`baseline`, `compare`) or of the run
    /// (`run`), as `key=value` words.
    pub options: BTreeMap<String, Vec<String>>,
    /// The guest kernel in words where the image alone does not say it: a
    /// Linux guest's release (`Linux 6.1.0-... (amd64)`); `None` for the
    /// companion guest (named by its image and hash) and in documents
    /// written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_kernel: Option<String>,
}

/// This build's version and revision.
pub fn build() -> Build {
    Build {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        git_revision: option_env!("PTISCOPE_GIT_REVISION").map(str::to_owned),
    }
}

/// SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl GuestImage {
    /// The record of the image called `name`; `bytes` is its content, `None`
    /// if it could not be read.
    pub fn new(name: impl Into<String>, bytes: Option<&[u8]>) -> Self {
        GuestImage {
            name: name.into(),
            sha256: bytes.map(sha256_hex),
            bytes: bytes.map_or(0, |b| b.len() as u64),
            elf32: bytes.is_some_and(crate::machine::loader::is_elf32),
        }
    }
}

/// The fields of the first CPU of /proc/cpuinfo that the block records,
/// and the number of CPUs listed.
pub fn parse_cpuinfo(text: &str, host: &mut Host) {
    let mut first = true;
    host.cpus = 0;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        if key == "processor" {
            host.cpus += 1;
            first = host.cpus == 1;
            continue;
        }
        if !first {
            continue;
        }
        let num = || value.parse::<u32>().ok();
        match key {
            "vendor_id" => host.cpu_vendor = Some(value.to_owned()),
            "model name" => host.cpu_model = Some(value.to_owned()),
            "cpu family" => host.cpu_family = num(),
            "model" => host.cpu_model_number = num(),
            "stepping" => host.cpu_stepping = num(),
            "microcode" => host.microcode = Some(value.to_owned()),
            "flags" => {
                let flags: Vec<&str> = value.split_whitespace().collect();
                for f in ["pcid", "invpcid", "pti"] {
                    host.cpu_flags.insert(f.to_owned(), flags.contains(&f));
                }
            }
            _ => {}
        }
    }
}

/// `uname -s -r -v -m`.
fn uname() -> Option<String> {
    // SAFETY: all-zero bytes are a valid utsname; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid out-pointer for the call.
    if unsafe { libc::uname(&mut u) } != 0 {
        return None;
    }
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    Some(format!(
        "{} {} {} {}",
        field(&u.sysname),
        field(&u.release),
        field(&u.version),
        field(&u.machine)
    ))
}

/// The host facts (no probe), read once per process: what they describe
/// (kernel, CPU, the kernel's view of the CPU's bugs) does not change while
/// it runs. [`warm_host`] reads them early, on another thread.
pub fn host() -> Host {
    HOST.get_or_init(read_host).clone()
}

static HOST: std::sync::OnceLock<Host> = std::sync::OnceLock::new();

/// Reads [`host`]'s facts now (a caller on another thread waits for them).
pub fn warm_host() {
    HOST.get_or_init(read_host);
}

fn read_host() -> Host {
    let mut h = Host {
        kernel: uname(),
        ..Host::default()
    };
    if let Ok(text) = std::fs::read_to_string("/proc/cpuinfo") {
        parse_cpuinfo(&text, &mut h);
    }
    if h.cpus == 0 {
        h.cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    }
    if let Ok(dir) = std::fs::read_dir("/sys/devices/system/cpu/vulnerabilities") {
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Ok(v) = std::fs::read_to_string(e.path()) {
                h.vulnerabilities.insert(name, v.trim().to_owned());
            }
        }
    }
    h
}

/// The KVM module and its paging mode, as `facts` have them.
pub fn kvm(facts: &HostFacts) -> Kvm {
    let flavour = facts.kvm_flavour();
    let module = facts.kvm_module();
    let paging = match (flavour, facts.two_dimensional_paging(), module) {
        (KvmFlavour::Pvm, _, _) | (_, Some(false), _) => Some("shadow"),
        (_, Some(true), Some("kvm_amd")) => Some("npt"),
        (_, Some(true), _) => Some("ept"),
        (_, None, _) => None,
    };
    Kvm {
        module: module.map(str::to_owned),
        paging: paging.map(str::to_owned),
        sees_cr3_writes: facts.sees_cr3_writes(),
    }
}

/// The probe's findings in `facts` (those not known yet are probed here,
/// [`HostFacts::settle_report_facts`]: a caller asks where no guest of its
/// own runs beside the probe VMs).
pub fn probe_findings(facts: &HostFacts, elf32: bool) -> ProbeFindings {
    facts.settle_report_facts();
    let entries = facts.entry_findings();
    ProbeFindings {
        entries_working: entries
            .working()
            .map(|w| w.into_iter().map(|e| e.name().to_owned()).collect()),
        entry_auto: entries
            .working()
            .map(|_| facts.resolve_entry(elf32).0.to_string()),
        pcid_usable: facts.pcid_usable().map(|(usable, _)| usable),
        pae_paging_usable: facts.pae_paging_usable().map(|(usable, _)| usable),
        cr3_write_refill: Some(facts.cr3_write_refill().verdict),
        error: entries.outcomes.as_ref().err().cloned(),
    }
}

impl Host {
    /// `MODEL (family F model M stepping S, microcode U), N CPUs`, `?` for
    /// what is unknown.
    fn cpu_identity(&self) -> String {
        let num = |v: Option<u32>| v.map_or("?".to_owned(), |v| v.to_string());
        format!(
            "{} (family {} model {} stepping {}, microcode {}), {} CPUs",
            opt(&self.cpu_model),
            num(self.cpu_family),
            num(self.cpu_model_number),
            num(self.cpu_stepping),
            opt(&self.microcode),
            self.cpus
        )
    }

    /// The CPU flags as `name=yes|no` words.
    fn flag_words(&self) -> Vec<String> {
        self.cpu_flags
            .iter()
            .map(|(k, v)| format!("{k}={}", if *v { "yes" } else { "no" }))
            .collect()
    }

    /// The host kernel's CPU bugs that are not "Not affected" (space
    /// separated, `none` if there are none) and its meltdown verdict (`?`
    /// if unknown).
    fn bugs(&self) -> (String, &str) {
        let affected: Vec<&str> = self
            .vulnerabilities
            .iter()
            .filter(|(_, v)| !v.starts_with("Not affected"))
            .map(|(k, _)| k.as_str())
            .collect();
        let meltdown = self
            .vulnerabilities
            .get("meltdown")
            .map_or("?", String::as_str);
        let affected = if affected.is_empty() {
            "none".to_owned()
        } else {
            affected.join(" ")
        };
        (affected, meltdown)
    }
}

impl Environment {
    /// Collects everything: host, KVM and probe (from `facts`), build, the
    /// image hash and the given options.
    pub fn collect(
        facts: &HostFacts,
        identity: BackendIdentity,
        guest_image: GuestImage,
        options: BTreeMap<String, Vec<String>>,
    ) -> Self {
        let probe = probe_findings(facts, guest_image.elf32);
        Environment {
            probe,
            ..Self::collect_unprobed(facts, identity, guest_image, options)
        }
    }

    /// [`Environment::collect`] without the probe's findings (left
    /// empty): what can be collected while a guest runs, since it starts
    /// no probe VM; the caller fills `probe` with [`probe_findings`] once
    /// its guest has stopped.
    pub fn collect_unprobed(
        facts: &HostFacts,
        identity: BackendIdentity,
        guest_image: GuestImage,
        options: BTreeMap<String, Vec<String>>,
    ) -> Self {
        Environment {
            host: host(),
            kvm: kvm(facts),
            // Inside `--backend nested` the inner `kvm` is the nested one.
            backend: crate::spec::nested::reported_backend(facts.nested(), identity.name)
                .to_owned(),
            time_basis: identity.time_basis,
            capabilities: identity.capabilities,
            probe: ProbeFindings::default(),
            ptiscope: build(),
            guest_image,
            options,
            guest_kernel: None,
        }
    }

    /// A few header lines for text reports.
    pub fn render_text(&self) -> String {
        let h = &self.host;
        let flags = h.flag_words();
        let mut out = format!(
            "  host:      {}\n  cpu:       {}; {}\n",
            opt(&h.kernel),
            h.cpu_identity(),
            flags.join(" "),
        );
        let (affected, meltdown) = h.bugs();
        out +=
            &format!("  host CPU bugs: meltdown: {meltdown}; not \"Not affected\": {affected}\n");
        let p = &self.probe;
        out += &format!(
            "  kvm:       {} ({} paging); probe: entries {}, PCID {}, 32-bit PAE paging {}, \
             CR3-write refill {}\n",
            opt(&self.kvm.module),
            opt(&self.kvm.paging),
            p.entries_working
                .as_ref()
                .map_or("?".to_owned(), |w| w.join(",")),
            yes_no(p.pcid_usable),
            yes_no(p.pae_paging_usable),
            p.cr3_write_refill.map_or("?".to_owned(), |v| v.to_string()),
        );
        out += &format!(
            "  ptiscope:  {} ({}); guest image {} sha256 {}\n",
            self.ptiscope.version,
            self.ptiscope.git_revision.as_deref().map_or(
                "revision unknown".to_owned(),
                |r| format!("git {}", &r[..r.len().min(12)])
            ),
            self.guest_image.name,
            self.guest_image
                .sha256
                .as_deref()
                .map_or("?", |s| &s[..s.len().min(16)]),
        );
        out
    }

    /// The compact header of `compare`'s default screen: host (kernel, CPU,
    /// its PTI-related flags and bugs), KVM once (`kvm` describes it when
    /// given, else the module and its paging), the probe's findings, and
    /// the build and guest image; four lines.
    pub fn render_header(&self, kvm: Option<&str>) -> String {
        let h = &self.host;
        let flags = h.flag_words();
        let (affected, meltdown) = h.bugs();
        let p = &self.probe;
        let kvm = kvm.map_or_else(
            || {
                format!(
                    "{} ({} paging)",
                    opt(&self.kvm.module),
                    opt(&self.kvm.paging)
                )
            },
            str::to_owned,
        );
        format!(
            "  host:      {}; {}\n\
             \x20 host cpu:  {}; meltdown: {meltdown}; affected: {}\n\
             \x20 kvm:       {kvm}; probe: entries {}, PCID {}, 32-bit PAE paging {}\n\
             \x20 guest:     {} sha256 {}; ptiscope {} ({})\n",
            opt(&h.kernel),
            h.cpu_identity(),
            flags.join(" "),
            affected,
            p.entries_working
                .as_ref()
                .map_or("?".to_owned(), |w| w.join(",")),
            yes_no(p.pcid_usable),
            yes_no(p.pae_paging_usable),
            self.guest_image.name,
            self.guest_image
                .sha256
                .as_deref()
                .map_or("?", |s| &s[..s.len().min(16)]),
            self.ptiscope.version,
            self.ptiscope.git_revision.as_deref().map_or(
                "revision unknown".to_owned(),
                |r| format!("git {}", &r[..r.len().min(12)])
            ),
        )
    }

    /// Where `self` and `earlier` differ, as `path: earlier -> now` lines,
    /// over every field (host, KVM, probe, build, image, options).
    pub fn differences(&self, earlier: &Environment) -> Vec<String> {
        let mut now = BTreeMap::new();
        let mut then = BTreeMap::new();
        flatten(
            "",
            &serde_json::to_value(self).unwrap_or_default(),
            &mut now,
        );
        flatten(
            "",
            &serde_json::to_value(earlier).unwrap_or_default(),
            &mut then,
        );
        let keys: std::collections::BTreeSet<&String> = now.keys().chain(then.keys()).collect();
        keys.into_iter()
            .filter_map(|k| {
                let (a, b) = (then.get(k), now.get(k));
                (a != b).then(|| {
                    let show = |v: Option<&String>| v.cloned().unwrap_or_else(|| "(absent)".into());
                    format!("{k}: {} -> {}", show(a), show(b))
                })
            })
            .collect()
    }
}

/// Leaf values of a JSON value by dotted path (arrays as one value).
/// An optional fact as text: `?` when unknown.
fn opt(v: &Option<String>) -> String {
    v.clone().unwrap_or_else(|| "?".into())
}

/// A probe's yes/no finding: `?` when it did not run.
fn yes_no(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "yes",
        Some(false) => "no",
        None => "?",
    }
}

fn flatten(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, String>) {
    match v {
        serde_json::Value::Object(o) => {
            for (k, v) in o {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&path, v, out);
            }
        }
        other => {
            out.insert(prefix.to_owned(), other.to_string());
        }
    }
}

/// The basis of a report's times: what the backend that measured it
/// recorded in its environment (`Environment::time_basis`, from the
/// backend's `Profile`), so no report needs to know the backends;
/// `Unknown` without an environment.
pub fn time_basis(env: Option<&Environment>) -> super::time_basis::TimeBasis {
    env.map_or(super::time_basis::TimeBasis::Unknown, |e| e.time_basis)
}

/// The guest kernel a report's runs booted, for titles: the Linux release
/// when recorded, else the companion guest's image and hash.
pub fn guest_kernel(env: Option<&Environment>) -> String {
    let Some(e) = env else {
        return "guest not recorded".to_owned();
    };
    if let Some(k) = &e.guest_kernel {
        return k.clone();
    }
    let image = &e.guest_image;
    let hash = image
        .sha256
        .as_deref()
        .map_or("?", |s| &s[..s.len().min(12)]);
    if image.name.starts_with("embedded ") {
        format!("ptiscope guest ({}, sha256 {hash})", image.name)
    } else {
        // A --kernel or --linux path: the file's name says what it is.
        format!("{} (sha256 {hash})", image.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CPUINFO: &str = "processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 85
model name\t: Intel(R) Xeon(R) Platinum 8269CY CPU @ 2.50GHz
stepping\t: 7
microcode\t: 0x5003604
flags\t\t: fpu vme pcid sse invpcid_single md_clear
bugs\t\t: spectre_v1

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Another CPU
microcode\t: 0x1
";

    #[test]
    fn cpuinfo_fields_come_from_the_first_cpu() {
        let mut h = Host::default();
        parse_cpuinfo(CPUINFO, &mut h);
        assert_eq!(h.cpus, 2);
        assert_eq!(h.cpu_vendor.as_deref(), Some("GenuineIntel"));
        assert_eq!(
            h.cpu_model.as_deref(),
            Some("Intel(R) Xeon(R) Platinum 8269CY CPU @ 2.50GHz")
        );
        assert_eq!(
            (h.cpu_family, h.cpu_model_number, h.cpu_stepping),
            (Some(6), Some(85), Some(7))
        );
        assert_eq!(h.microcode.as_deref(), Some("0x5003604"));
        // Whole words only: `invpcid_single` is not `invpcid`.
        assert!(h.cpu_flags["pcid"]);
        assert!(!h.cpu_flags["invpcid"]);
        assert!(!h.cpu_flags["pti"]);
    }

    /// SHA-256 test vector (FIPS 180-2, "abc").
    #[test]
    fn image_hash() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let g = GuestImage::new("embedded x86_64", Some(b"abc"));
        assert_eq!(g.bytes, 3);
    }

    #[test]
    fn differences_name_the_changed_fields() {
        let mut a = Environment::default();
        a.host.microcode = Some("0x1".into());
        a.host
            .vulnerabilities
            .insert("meltdown".into(), "Not affected".into());
        a.options.insert("baseline".into(), vec!["pti=off".into()]);
        let mut b = a.clone();
        assert!(b.differences(&a).is_empty());
        b.host.microcode = Some("0x2".into());
        b.host
            .vulnerabilities
            .insert("meltdown".into(), "Mitigation: PTI".into());
        b.options.insert("baseline".into(), vec!["pti=on".into()]);
        a.probe.cr3_write_refill = Some(crate::probe::RefillVerdict::Visible);
        b.probe.cr3_write_refill = Some(crate::probe::RefillVerdict::NotVisible);
        let d = b.differences(&a);
        assert_eq!(
            d,
            vec![
                "host.microcode: \"0x1\" -> \"0x2\"".to_owned(),
                "host.vulnerabilities.meltdown: \"Not affected\" -> \"Mitigation: PTI\"".to_owned(),
                "options.baseline: [\"pti=off\"] -> [\"pti=on\"]".to_owned(),
                "probe.cr3_write_refill: \"visible\" -> \"not_visible\"".to_owned(),
            ]
        );
    }

    #[test]
    fn this_host_and_build() {
        let h = host();
        assert!(h.cpus >= 1);
        assert!(h.kernel.as_deref().is_some_and(|k| k.starts_with("Linux ")));
        assert_eq!(build().version, env!("CARGO_PKG_VERSION"));
        let env = Environment {
            host: h,
            ..Environment::default()
        };
        let back: Environment =
            serde_json::from_value(serde_json::to_value(&env).unwrap()).unwrap();
        assert_eq!(back, env);
        assert!(env.render_text().contains("  host:      Linux "));
    }

    #[test]
    fn the_recorded_basis_is_the_reports() {
        use super::super::time_basis::TimeBasis;
        let recorded = Environment {
            time_basis: TimeBasis::NestedTcg,
            ..Environment::default()
        };
        assert_eq!(time_basis(Some(&recorded)), TimeBasis::NestedTcg);
        // A document written before the basis was recorded says nothing.
        let old: Environment = serde_json::from_value(serde_json::json!({
            "host": {}, "kvm": {}, "backend": "kvm", "probe": {}, "ptiscope": {},
            "guest_image": {}, "options": {}
        }))
        .unwrap_or_default();
        assert_eq!(time_basis(Some(&old)), TimeBasis::Unknown);
        assert_eq!(time_basis(None), TimeBasis::Unknown);
    }

    #[test]
    fn the_guest_kernel_is_the_linux_release_or_the_image_hash() {
        let mut e = Environment::default();
        e.guest_image.name = "embedded x86_64".into();
        e.guest_image.sha256 = Some("0123456789abcdef0123".into());
        assert_eq!(
            guest_kernel(Some(&e)),
            "ptiscope guest (embedded x86_64, sha256 0123456789ab)"
        );
        e.guest_kernel = Some("Linux 6.1.0-57-cloud-amd64 (amd64)".into());
        assert_eq!(guest_kernel(Some(&e)), "Linux 6.1.0-57-cloud-amd64 (amd64)");
        assert_eq!(guest_kernel(None), "guest not recorded");
        e.guest_kernel = None;
        e.guest_image.name = "/k/vmlinuz-6.1.0-57-cloud-amd64".into();
        assert_eq!(
            guest_kernel(Some(&e)),
            "/k/vmlinuz-6.1.0-57-cloud-amd64 (sha256 0123456789ab)"
        );
    }
}
