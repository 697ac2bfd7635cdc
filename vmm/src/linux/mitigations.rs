//! The init's lines on the guest kernel's mitigations (`@kcmdline`,
//! `@vuln NAME STATE`, `@vuln none reason=...`, `@vulns files=N`,
//! linux-init/src/mitigations.rs) and its `@linux ... pti= asked_pti=`
//! line, parsed into a [`GuestMitigations`]. Guest text: every bound is
//! applied here, nothing panics, a name this version does not know is kept
//! as the kernel wrote it.

use crate::machine::RunOutcome;
use crate::report::mitigations::{GuestMitigations, Vulnerability};

/// Most vulnerabilities files kept (Debian's 6.1 and 6.12 have 17).
const MAX_FILES: usize = 64;
/// Characters kept of a file's name.
const NAME_CAP: usize = 64;
/// Characters kept of a file's text (the init prints at most 512 and `...`).
const STATE_CAP: usize = 520;
/// Characters kept of the kernel command line.
const CMDLINE_CAP: usize = 2100;
/// Characters kept of a `reason=`.
const REASON_CAP: usize = 100;

/// The run's guest mitigation state; `None` when the init said nothing
/// about it (not a Linux run, or it stopped before it read the kernel log).
pub fn guest_mitigations(outcome: &RunOutcome) -> Option<GuestMitigations> {
    parse(outcome.machine_lines.iter().map(String::as_str))
}

/// At most `cap` characters of `s`.
fn capped(s: &str, cap: usize) -> String {
    s.chars().take(cap).collect()
}

/// [`guest_mitigations`] from the machine lines.
pub fn parse<'a>(lines: impl IntoIterator<Item = &'a str>) -> Option<GuestMitigations> {
    let mut m = GuestMitigations::default();
    let mut seen = false;
    let (mut linux_seen, mut cmdline_seen) = (false, false);
    for line in lines {
        if let Some(rest) = line.strip_prefix("@linux ") {
            if std::mem::replace(&mut linux_seen, true) {
                continue;
            }
            seen = true;
            let value = |key: &str| super::line_value(rest, key);
            m.pti = value("pti")
                .filter(|v| matches!(*v, "on" | "off"))
                .map(str::to_owned);
            m.asked_pti = value("asked_pti")
                .filter(|v| matches!(*v, "on" | "off" | "auto"))
                .map(str::to_owned);
        } else if let Some(rest) = line.strip_prefix("@kcmdline") {
            if std::mem::replace(&mut cmdline_seen, true) {
                continue;
            }
            seen = true;
            m.kernel_cmdline = Some(capped(rest.trim(), CMDLINE_CAP));
        } else if let Some(rest) = line.strip_prefix("@vulns ") {
            seen = true;
            m.files = super::line_value(rest, "files").and_then(|v| v.parse().ok());
        } else if let Some(rest) = line.strip_prefix("@vuln ") {
            seen = true;
            let (name, state) = rest.split_once(' ').unwrap_or((rest, ""));
            if name == "none" {
                if let Some(why) = super::line_value(state, "reason") {
                    m.none_reason = Some(capped(why, REASON_CAP));
                    continue;
                }
            }
            if name.is_empty()
                || m.vulnerabilities.len() >= MAX_FILES
                || m.vulnerabilities.contains_key(&capped(name, NAME_CAP))
            {
                m.dropped += 1;
                continue;
            }
            m.vulnerabilities.insert(
                capped(name, NAME_CAP),
                Vulnerability::from_state(&capped(state, STATE_CAP)),
            );
        }
    }
    seen.then_some(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::mitigations::MitigationClass;

    /// What the init printed under `-cpu Skylake-Client-v1` (Debian 6.1).
    const SKYLAKE: &[&str] = &[
        "@linux release=6.1.0-41-cloud-amd64 arch=x86_64 pti=on asked_pti=auto",
        "@kcmdline console=ttyS0 pti=auto workload=getppid iterations=10",
        "@vuln itlb_multihit KVM: Mitigation: VMX unsupported",
        "@vuln mds Mitigation: Clear CPU buffers; SMT Host state unknown",
        "@vuln meltdown Mitigation: PTI",
        "@vuln spectre_v2 Mitigation: Retpolines, IBPB: conditional, IBRS_FW, STIBP: disabled, RSB filling, PBRSB-eIBRS: Not affected",
        "@vuln srbds Not affected",
        "@vulns files=5 shown=5",
        "@result workload=getppid iterations=10",
    ];

    #[test]
    fn the_inits_lines_give_each_file_its_class() {
        let m = parse(SKYLAKE.iter().copied()).expect("lines");
        assert_eq!(m.pti.as_deref(), Some("on"));
        assert_eq!(m.asked_pti.as_deref(), Some("auto"));
        assert_eq!(m.files, Some(5));
        assert_eq!(m.dropped, 0);
        assert!(m.kernel_cmdline.as_deref().unwrap().contains("pti=auto"));
        let melt = &m.vulnerabilities["meltdown"];
        assert_eq!(
            (melt.class, melt.mitigation.as_deref()),
            (MitigationClass::Mitigated, Some("PTI"))
        );
        assert_eq!(
            m.vulnerabilities["mds"].mitigation.as_deref(),
            Some("Clear CPU buffers")
        );
        assert_eq!(
            m.vulnerabilities["spectre_v2"].mitigation.as_deref(),
            Some("Retpolines")
        );
        assert_eq!(
            m.vulnerabilities["srbds"].class,
            MitigationClass::NotAffected
        );
        assert_eq!(m.names_in(MitigationClass::NotAffected), ["srbds"]);
    }

    #[test]
    fn both_backends_summaries_carry_the_state() {
        use crate::linux::tests::{guest, outcome};
        use crate::observe::qemu_plugin::PluginOutput;
        use ptiscope_abi::options::PtiMode;
        let o = outcome(
            crate::machine::StopReason::GuestExit { status: 0 },
            SKYLAKE,
            &[],
        );
        let g = guest(PtiMode::Auto);
        let want = parse(SKYLAKE.iter().copied());
        assert!(want.is_some());
        // QEMU's console.
        let s = crate::linux::summary(&o, &PluginOutput::Off, &g, None);
        assert_eq!(s.guest_mitigations, want);
        // The VMM's.
        let vmm = crate::report::RunSummary::new(Vec::new(), Some("workload".into()), 10);
        let (s, _) = crate::linux::summary_on_vmm(&o, &g, &vmm, false, &PluginOutput::Off);
        assert_eq!(s.guest_mitigations, want);
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(
            json["guest_mitigations"]["vulnerabilities"]["meltdown"]["mitigation"],
            "PTI"
        );
        assert!(s
            .render_text()
            .contains("mitigated: itlb_multihit (VMX unsupported)"));
    }

    #[test]
    fn a_kernel_without_the_directory_says_why() {
        let m = parse([
            "@linux release=4.9 arch=x86_64 pti=off asked_pti=off",
            "@vuln none reason=no-vulnerabilities-directory:2",
        ])
        .unwrap();
        assert_eq!(
            m.none_reason.as_deref(),
            Some("no-vulnerabilities-directory:2")
        );
        assert!(m.vulnerabilities.is_empty());
        assert!(m.compact().contains("no vulnerabilities files"));
        // Nothing from the init about mitigations: no state at all.
        assert_eq!(parse(["@result workload=getpid iterations=1"]), None);
    }

    #[test]
    fn hostile_lines_are_bounded_and_kept_as_is() {
        let long_name = "n".repeat(10_000);
        let long_state = format!("Mitigation: {}", "y".repeat(100_000));
        let mut lines = vec![
            "@linux pti=\x1b[2J asked_pti=maybe".to_string(),
            "@vuln".into(),
            "@vuln ".into(),
            "@vuln  leading-space".into(),
            format!("@vuln {long_name} {long_state}"),
            "@vuln brand_new_bug Some future text; with: colons, commas".into(),
            "@vuln brand_new_bug repeated".into(),
            "@vuln none notareason".into(),
            "@vulns files=notanumber".into(),
            format!("@kcmdline {}", "c".repeat(100_000)),
        ];
        for i in 0..1000 {
            lines.push(format!("@vuln bug{i} Not affected"));
        }
        let m = parse(lines.iter().map(String::as_str)).unwrap();
        assert_eq!((m.pti, m.asked_pti), (None, None));
        assert_eq!(m.files, None);
        assert_eq!(m.vulnerabilities.len(), MAX_FILES);
        assert!(m
            .vulnerabilities
            .keys()
            .all(|k| k.chars().count() <= NAME_CAP));
        assert!(m
            .vulnerabilities
            .values()
            .all(|v| v.state.chars().count() <= STATE_CAP));
        assert_eq!(
            m.vulnerabilities["brand_new_bug"].state,
            "Some future text; with: colons, commas"
        );
        assert_eq!(
            m.vulnerabilities["brand_new_bug"].class,
            MitigationClass::Unknown
        );
        // A file called `none` without a reason is a file.
        assert!(m.vulnerabilities.contains_key("none"));
        assert!(m.dropped > 900, "{}", m.dropped);
        assert!(m.kernel_cmdline.unwrap().chars().count() <= CMDLINE_CAP);
    }
}
