//! A Linux guest's CPU-bug mitigations as its own kernel reports them: the
//! files of its `/sys/devices/system/cpu/vulnerabilities/` (name -> the
//! file's text), each classified (not affected / vulnerable / mitigated,
//! with the mitigation's name), the kernel command line and PTI's state as
//! its log says. The init reads them (linux-init/src/mitigations.rs);
//! `crate::linux::mitigations` parses its lines into a [`GuestMitigations`],
//! which a run's summary and JSON carry and `compare` shows per side.
//!
//! The text is the guest's: the names are kept as the kernel wrote them
//! (a bug this version has never heard of is kept as-is), everything is
//! bounded where it is parsed.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// What a vulnerabilities file says, in short.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MitigationClass {
    /// `Not affected`: the CPU (model) does not have the bug.
    NotAffected,
    /// `Vulnerable...`: affected and not (fully) mitigated.
    Vulnerable,
    /// `Mitigation: NAME...`: affected and mitigated.
    Mitigated,
    /// Anything else (`Unknown: ...`, an empty or unreadable file).
    Unknown,
}

impl MitigationClass {
    /// The JSON word.
    pub fn name(self) -> &'static str {
        match self {
            MitigationClass::NotAffected => "not_affected",
            MitigationClass::Vulnerable => "vulnerable",
            MitigationClass::Mitigated => "mitigated",
            MitigationClass::Unknown => "unknown",
        }
    }
}

/// One vulnerabilities file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vulnerability {
    /// The file's text as the kernel wrote it (`Mitigation: PTI`).
    pub state: String,
    /// Its class.
    pub class: MitigationClass,
    /// For `mitigated`: the mitigation's name, the text after
    /// `Mitigation: ` up to the first `;` or `,` (`PTI`, `Clear CPU
    /// buffers`, `Retpolines`, `IBRS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mitigation: Option<String>,
}

/// Characters kept of a mitigation's name.
const MITIGATION_NAME_CAP: usize = 80;

impl Vulnerability {
    /// Classifies a file's text.
    pub fn from_state(state: &str) -> Self {
        let text = state.trim();
        // itlb_multihit's says what KVM does: `KVM: Mitigation: VMX disabled`.
        let main = text.strip_prefix("KVM: ").unwrap_or(text);
        let (class, mitigation) = if main.starts_with("Not affected") {
            (MitigationClass::NotAffected, None)
        } else if let Some(rest) = main.strip_prefix("Mitigation:") {
            // 6.1 separates spectre_v2's parts with ", ", later kernels
            // with "; ": the name is the first part either way.
            let name: String = rest
                .split([';', ','])
                .next()
                .unwrap_or("")
                .trim()
                .chars()
                .take(MITIGATION_NAME_CAP)
                .collect();
            (
                MitigationClass::Mitigated,
                (!name.is_empty()).then_some(name),
            )
        } else if main.starts_with("Vulnerable") || main.starts_with("Processor vulnerable") {
            (MitigationClass::Vulnerable, None)
        } else {
            (MitigationClass::Unknown, None)
        };
        Vulnerability {
            state: text.to_owned(),
            class,
            mitigation,
        }
    }

    /// Compact: the mitigation's name, else the state.
    fn short(&self) -> &str {
        self.mitigation.as_deref().unwrap_or(&self.state)
    }
}

/// A Linux guest's mitigation state, as its kernel reported it in one run.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct GuestMitigations {
    /// Each vulnerabilities file by name (`meltdown`, `spectre_v2`, ...).
    pub vulnerabilities: BTreeMap<String, Vulnerability>,
    /// Why there are none, in the init's words
    /// (`no-vulnerabilities-directory:2`: a kernel before 4.15 or without
    /// CONFIG_GENERIC_CPU_VULNERABILITIES; `no-sysfs:N`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub none_reason: Option<String>,
    /// How many files the kernel's directory had (the init's count);
    /// `None` when its count did not arrive (the list may be incomplete).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<u64>,
    /// Lines not taken (beyond the bounds, repeated names, malformed).
    #[serde(default)]
    pub dropped: u64,
    /// PTI as the kernel log says (`on`/`off`), whatever was asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pti: Option<String>,
    /// The `pti=` the run asked for (`on`, `off`, or `auto`: not set, the
    /// kernel's own choice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked_pti: Option<String>,
    /// The command line the kernel booted with (`/proc/cmdline`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_cmdline: Option<String>,
}

impl GuestMitigations {
    /// Names of the files in `class`.
    pub fn names_in(&self, class: MitigationClass) -> Vec<&str> {
        self.vulnerabilities
            .iter()
            .filter(|(_, v)| v.class == class)
            .map(|(k, _)| k.as_str())
            .collect()
    }

    /// PTI's state in words: `PTI on (pti=auto: the kernel's choice)`.
    pub fn pti_text(&self) -> String {
        let ran = self.pti.as_deref().unwrap_or("?");
        match self.asked_pti.as_deref() {
            Some("auto") => format!("PTI {ran} (pti= not set: the kernel's choice)"),
            Some(asked) => format!("PTI {ran} (pti={asked} asked)"),
            None => format!("PTI {ran}"),
        }
    }

    /// PTI's state and how many files say `Not affected`, then one line
    /// per other class: mitigated files with the mitigation's name,
    /// vulnerable ones with what follows `Vulnerable` up to its first `;`,
    /// others with their text up to it (the full texts are in the JSON).
    pub fn compact_lines(&self) -> Vec<String> {
        let pti = self.pti_text();
        if let Some(why) = &self.none_reason {
            return vec![format!(
                "{pti}; no vulnerabilities files ({why}): the kernel does not say"
            )];
        }
        let not = self.names_in(MitigationClass::NotAffected).len();
        let mut out = vec![format!(
            "{pti}; not affected: {not} of {}{}",
            self.vulnerabilities.len(),
            match self.files {
                Some(n) if n as usize != self.vulnerabilities.len() => {
                    format!(" (the kernel has {n} files)")
                }
                Some(_) => String::new(),
                None => " (the list may be incomplete)".into(),
            }
        )];
        let first_part = |t: &str| t.split(';').next().unwrap_or("").trim().to_owned();
        for (class, word) in [
            (MitigationClass::Mitigated, "mitigated"),
            (MitigationClass::Vulnerable, "vulnerable"),
            (MitigationClass::Unknown, "other"),
        ] {
            let names: Vec<String> = self
                .vulnerabilities
                .iter()
                .filter(|(_, v)| v.class == class)
                .map(|(k, v)| {
                    let detail = match class {
                        MitigationClass::Mitigated => v.short().to_owned(),
                        MitigationClass::Vulnerable => first_part(
                            v.state
                                .trim_start_matches("Processor vulnerable")
                                .trim_start_matches("Vulnerable")
                                .trim_start_matches([':', ' ']),
                        ),
                        _ => first_part(&v.state),
                    };
                    if detail.is_empty() {
                        k.clone()
                    } else {
                        format!("{k} ({detail})")
                    }
                })
                .collect();
            if !names.is_empty() {
                out.push(format!("{word}: {}", names.join(", ")));
            }
        }
        out
    }

    /// [`GuestMitigations::compact_lines`] on one line.
    pub fn compact(&self) -> String {
        self.compact_lines().join("; ")
    }

    /// What differs between two sides' states, one line each:
    /// `meltdown: Not affected vs Mitigation: PTI`, PTI's state as the
    /// kernel log says, and a side whose kernel does not say.
    pub fn differences(base: &GuestMitigations, comp: &GuestMitigations) -> Vec<String> {
        let mut out = Vec::new();
        if base.pti != comp.pti {
            let s = |m: &GuestMitigations| m.pti.clone().unwrap_or_else(|| "?".into());
            out.push(format!("PTI (kernel log): {} vs {}", s(base), s(comp)));
        }
        if base.none_reason != comp.none_reason {
            let s = |m: &GuestMitigations| {
                m.none_reason
                    .as_ref()
                    .map_or("listed".to_string(), |r| format!("none ({r})"))
            };
            out.push(format!("vulnerabilities files: {} vs {}", s(base), s(comp)));
        }
        let names: BTreeSet<&String> = base
            .vulnerabilities
            .keys()
            .chain(comp.vulnerabilities.keys())
            .collect();
        for name in names {
            let s = |m: &GuestMitigations| {
                m.vulnerabilities
                    .get(name)
                    .map_or("(no such file)", |v| v.state.as_str())
                    .to_owned()
            };
            let (a, b) = (s(base), s(comp));
            if a != b {
                out.push(format!("{name}: {a} vs {b}"));
            }
        }
        out
    }
}

/// Both sides' mitigation differences where both sides reported them;
/// a side without (not a Linux guest, or its init said nothing) gives
/// none.
pub fn side_differences(
    base: Option<&GuestMitigations>,
    comp: Option<&GuestMitigations>,
) -> Vec<String> {
    match (base, comp) {
        (Some(b), Some(c)) => GuestMitigations::differences(b, c),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_state_is_classified() {
        let c = |s: &str| {
            let v = Vulnerability::from_state(s);
            (v.class, v.mitigation)
        };
        use MitigationClass::*;
        assert_eq!(c("Not affected"), (NotAffected, None));
        assert_eq!(c("Mitigation: PTI"), (Mitigated, Some("PTI".into())));
        assert_eq!(
            c("Mitigation: Clear CPU buffers; SMT Host state unknown"),
            (Mitigated, Some("Clear CPU buffers".into()))
        );
        // 6.1's commas and later kernels' semicolons.
        assert_eq!(
            c("Mitigation: Retpolines, IBPB: conditional, IBRS_FW, STIBP: disabled, RSB filling"),
            (Mitigated, Some("Retpolines".into()))
        );
        assert_eq!(
            c("Mitigation: Enhanced / Automatic IBRS; IBPB: conditional; RSB filling"),
            (Mitigated, Some("Enhanced / Automatic IBRS".into()))
        );
        assert_eq!(
            c("Mitigation: usercopy/swapgs barriers and __user pointer sanitization"),
            (
                Mitigated,
                Some("usercopy/swapgs barriers and __user pointer sanitization".into())
            )
        );
        assert_eq!(
            c("KVM: Mitigation: VMX unsupported"),
            (Mitigated, Some("VMX unsupported".into()))
        );
        assert_eq!(c("Vulnerable"), (Vulnerable, None));
        assert_eq!(
            c("Vulnerable: Clear CPU buffers attempted, no microcode; SMT Host state unknown"),
            (Vulnerable, None)
        );
        assert_eq!(c("Processor vulnerable"), (Vulnerable, None));
        assert_eq!(c("Unknown: No mitigations"), (Unknown, None));
        assert_eq!(c(""), (Unknown, None));
        assert_eq!(c("Mitigation: "), (Mitigated, None));
        let long = format!("Mitigation: {}", "x".repeat(500));
        assert_eq!(
            Vulnerability::from_state(&long)
                .mitigation
                .unwrap()
                .chars()
                .count(),
            MITIGATION_NAME_CAP
        );
    }

    fn side(pti: &str, states: &[(&str, &str)]) -> GuestMitigations {
        GuestMitigations {
            vulnerabilities: states
                .iter()
                .map(|(k, v)| (k.to_string(), Vulnerability::from_state(v)))
                .collect(),
            files: Some(states.len() as u64),
            pti: Some(pti.into()),
            asked_pti: Some("auto".into()),
            ..Default::default()
        }
    }

    #[test]
    fn differences_name_each_file_that_differs_and_pti() {
        let max = side(
            "off",
            &[
                ("meltdown", "Not affected"),
                ("spectre_v1", "Mitigation: usercopy/swapgs barriers"),
            ],
        );
        let sky = side(
            "on",
            &[
                ("meltdown", "Mitigation: PTI"),
                ("spectre_v1", "Mitigation: usercopy/swapgs barriers"),
                (
                    "mds",
                    "Mitigation: Clear CPU buffers; SMT Host state unknown",
                ),
            ],
        );
        let d = GuestMitigations::differences(&max, &sky);
        assert_eq!(
            d,
            [
                "PTI (kernel log): off vs on",
                "mds: (no such file) vs Mitigation: Clear CPU buffers; SMT Host state unknown",
                "meltdown: Not affected vs Mitigation: PTI",
            ]
        );
        assert!(GuestMitigations::differences(&sky, &sky).is_empty());
        assert!(side_differences(Some(&max), None).is_empty());
        let none = GuestMitigations {
            none_reason: Some("no-vulnerabilities-directory:2".into()),
            pti: Some("off".into()),
            ..Default::default()
        };
        let d = GuestMitigations::differences(&none, &max);
        assert!(
            d.contains(
                &"vulnerabilities files: none (no-vulnerabilities-directory:2) vs listed".into()
            ),
            "{d:?}"
        );
    }

    #[test]
    fn the_compact_line_shows_what_is_not_not_affected() {
        let sky = side(
            "on",
            &[
                ("meltdown", "Mitigation: PTI"),
                ("l1tf", "Not affected"),
                ("spec_store_bypass", "Vulnerable"),
                ("retbleed", "Unknown: dunno"),
            ],
        );
        assert_eq!(
            sky.compact_lines(),
            [
                "PTI on (pti= not set: the kernel's choice); not affected: 1 of 4",
                "mitigated: meltdown (PTI)",
                "vulnerable: spec_store_bypass",
                "other: retbleed (Unknown: dunno)"
            ]
        );
        let mut mds = sky.clone();
        mds.vulnerabilities.insert(
            "mds".into(),
            Vulnerability::from_state(
                "Vulnerable: Clear CPU buffers attempted, no microcode; SMT Host state unknown",
            ),
        );
        assert_eq!(
            mds.compact_lines()[2],
            "vulnerable: mds (Clear CPU buffers attempted, no microcode), spec_store_bypass"
        );
        let mut partial = sky.clone();
        partial.files = None;
        assert!(partial.compact_lines()[0].ends_with("(the list may be incomplete)"));
        partial.asked_pti = Some("on".into());
        assert!(partial.pti_text().contains("pti=on asked"));
        let none = GuestMitigations {
            none_reason: Some("no-sysfs:19".into()),
            ..Default::default()
        };
        assert!(none
            .compact()
            .contains("no vulnerabilities files (no-sysfs:19)"));
    }
}
