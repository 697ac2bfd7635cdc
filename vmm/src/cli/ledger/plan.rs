//! Which boots a ledger block needs: the table of Linux's mitigations
//! (each with the vulnerabilities files it answers for and the documented
//! kernel parameter that turns it off), and, from what the default boot's
//! kernel said it enabled, one boot per enabled mitigation with it off.

use crate::report::mitigations::{GuestMitigations, MitigationClass};

/// One mitigation (or group of mitigations sharing one mechanism) the
/// ledger can turn off on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mitigation {
    /// The row's key (JSON, CSV): the first file's name, or the mechanism.
    pub key: &'static str,
    /// What the row is, for the table.
    pub label: &'static str,
    /// The vulnerabilities files this row answers for
    /// (`/sys/devices/system/cpu/vulnerabilities/NAME`).
    pub files: &'static [&'static str],
    /// The kernel command line that turns it off
    /// (Documentation/admin-guide/kernel-parameters.txt).
    pub off: &'static str,
    /// Why several files are measured together, when they are.
    pub group_note: Option<&'static str>,
    /// Enabled only when the file's text says this (a part of a file
    /// another row also reads: spectre_v2's `BHI:`), else by its class.
    pub part: Option<&'static str>,
}

/// Linux's mitigations the ledger knows, in table order. The VERW group:
/// MDS, TAA, MMIO stale data and RFDS all clear CPU buffers with the one
/// VERW on return to user mode, and each keeps it on while another still
/// wants it, so turning one off alone changes nothing: measured together.
pub const MITIGATIONS: &[Mitigation] = &[
    Mitigation {
        key: "meltdown",
        label: "PTI (page table isolation)",
        files: &["meltdown"],
        off: "pti=off",
        group_note: None,
        part: None,
    },
    Mitigation {
        key: "verw",
        label: "VERW buffer clearing",
        files: &[
            "mds",
            "tsx_async_abort",
            "mmio_stale_data",
            "reg_file_data_sampling",
        ],
        off: "mds=off tsx_async_abort=off mmio_stale_data=off reg_file_data_sampling=off",
        group_note: Some(
            "MDS, TAA, MMIO stale data and RFDS share the VERW on return to user: turned off together",
        ),
        part: None,
    },
    Mitigation {
        key: "spectre_v1",
        label: "Spectre v1 (usercopy/swapgs barriers)",
        files: &["spectre_v1"],
        off: "nospectre_v1",
        group_note: None,
        part: None,
    },
    Mitigation {
        key: "spectre_v2",
        label: "Spectre v2 (retpolines/IBRS, RSB filling, IBPB)",
        files: &["spectre_v2"],
        off: "spectre_v2=off",
        group_note: None,
        part: None,
    },
    Mitigation {
        key: "spectre_bhi",
        label: "BHI (branch history clearing)",
        files: &["spectre_v2"],
        off: "spectre_bhi=off",
        group_note: None,
        part: Some("BHI:"),
    },
    Mitigation {
        key: "retbleed",
        label: "Retbleed",
        files: &["retbleed"],
        off: "retbleed=off",
        group_note: None,
        part: None,
    },
    Mitigation {
        key: "indirect_target_selection",
        label: "ITS (indirect target selection)",
        files: &["indirect_target_selection"],
        off: "indirect_target_selection=off",
        group_note: None,
        part: None,
    },
    Mitigation {
        key: "spec_rstack_overflow",
        label: "SRSO (speculative return stack overflow)",
        files: &["spec_rstack_overflow"],
        off: "spec_rstack_overflow=off",
        group_note: None,
        part: None,
    },
    Mitigation {
        key: "spec_store_bypass",
        label: "Speculative store bypass",
        files: &["spec_store_bypass"],
        off: "spec_store_bypass_disable=off",
        group_note: None,
        part: None,
    },
    Mitigation {
        key: "l1tf",
        label: "L1TF (PTE inversion, L1D flush)",
        files: &["l1tf"],
        off: "l1tf=off",
        group_note: None,
        part: None,
    },
    Mitigation {
        key: "srbds",
        label: "SRBDS",
        files: &["srbds"],
        off: "srbds=off",
        group_note: None,
        part: None,
    },
    Mitigation {
        key: "gather_data_sampling",
        label: "GDS (gather data sampling)",
        files: &["gather_data_sampling"],
        off: "gather_data_sampling=off",
        group_note: None,
        part: None,
    },
    Mitigation {
        key: "vmscape",
        label: "VMSCAPE (IBPB before exit to a VMM)",
        files: &["vmscape"],
        off: "vmscape=off",
        group_note: None,
        part: None,
    },
    Mitigation {
        key: "tsa",
        label: "TSA (transient scheduler attacks)",
        files: &["tsa"],
        off: "tsa=off",
        group_note: None,
        part: None,
    },
];

/// The kernel parameter of the all-off boot (the total).
pub const ALL_OFF: &str = "mitigations=off";

/// Whether a file's text says the kernel may run the mitigation:
/// `Mitigation: ...`, or a `Vulnerable: WHAT` that names what it still
/// does (`Vulnerable: Clear CPU buffers attempted, no microcode`: the
/// kernel runs VERW all the same; 6.12's `Vulnerable: Safe RET, no
/// microcode`: it runs the safe RET thunk). A bare `Vulnerable` or
/// `Vulnerable, no microcode` names nothing. Measuring one that turns out
/// to do nothing costs a boot and says `changes nothing`; missing one
/// would hide its cost in the interaction.
pub fn runs_mitigation(state: &str, class: MitigationClass) -> bool {
    match class {
        MitigationClass::Mitigated => true,
        MitigationClass::Vulnerable => state
            .trim()
            .strip_prefix("Vulnerable:")
            .map(str::trim)
            .is_some_and(|what| {
                !what.is_empty() && !what.to_ascii_lowercase().starts_with("no microcode")
            }),
        MitigationClass::NotAffected | MitigationClass::Unknown => false,
    }
}

/// Whether a `part` (`BHI:`) of a file's text names a mitigation: the
/// words after it are neither `Not affected` nor `Vulnerable`.
fn part_enabled(state: &str, part: &str) -> bool {
    state.split([';', ',']).map(str::trim).any(|p| {
        p.strip_prefix(part).is_some_and(|rest| {
            let rest = rest.trim();
            !rest.is_empty() && !rest.starts_with("Not affected") && !rest.starts_with("Vulnerable")
        })
    })
}

/// What the ledger does with one mitigation on one kernel and CPU model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowPlan {
    /// Enabled: boot once with it off (`Mitigation::off`).
    Measure,
    /// The kernel does not run it here (its files' texts say so).
    NotEnabled,
    /// The kernel has none of its files (too old, or not built in).
    NoFile,
}

/// One row of a block's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedRow {
    /// The mitigation.
    pub mitigation: &'static Mitigation,
    /// Its files as the default boot's kernel wrote them (name, text).
    pub states: Vec<(String, String)>,
    /// What to do.
    pub plan: RowPlan,
}

/// The rows of one block from what the default boot's kernel said.
pub fn plan(m: &GuestMitigations) -> Vec<PlannedRow> {
    MITIGATIONS
        .iter()
        .map(|mit| {
            let states: Vec<(String, String)> = mit
                .files
                .iter()
                .filter_map(|f| {
                    m.vulnerabilities
                        .get(*f)
                        .map(|v| ((*f).to_owned(), v.state.clone()))
                })
                .collect();
            let enabled = mit.files.iter().any(|f| {
                m.vulnerabilities.get(*f).is_some_and(|v| match mit.part {
                    Some(part) => part_enabled(&v.state, part),
                    None => runs_mitigation(&v.state, v.class),
                })
            });
            let plan = if states.is_empty() {
                RowPlan::NoFile
            } else if enabled {
                RowPlan::Measure
            } else {
                RowPlan::NotEnabled
            };
            PlannedRow {
                mitigation: mit,
                states,
                plan,
            }
        })
        .collect()
}

/// Files the kernel says it mitigates that no row of the table covers
/// (a bug newer than this table): said under the block, never dropped.
pub fn uncovered(m: &GuestMitigations) -> Vec<String> {
    m.vulnerabilities
        .iter()
        .filter(|(name, v)| {
            runs_mitigation(&v.state, v.class)
                && !MITIGATIONS.iter().any(|x| x.files.contains(&name.as_str()))
        })
        .map(|(name, v)| format!("{name}: {}", v.state))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::mitigations::Vulnerability;

    fn guest(files: &[(&str, &str)]) -> GuestMitigations {
        GuestMitigations {
            vulnerabilities: files
                .iter()
                .map(|(n, s)| ((*n).to_owned(), Vulnerability::from_state(s)))
                .collect(),
            ..Default::default()
        }
    }

    fn measured(p: &[PlannedRow]) -> Vec<&str> {
        p.iter()
            .filter(|r| r.plan == RowPlan::Measure)
            .map(|r| r.mitigation.key)
            .collect()
    }

    #[test]
    fn skylake_client_on_6_1() {
        // What Debian's 6.1 says on QEMU's Skylake-Client-v1 (TCG).
        let g = guest(&[
            ("meltdown", "Mitigation: PTI"),
            ("mds", "Vulnerable: Clear CPU buffers attempted, no microcode; SMT Host state unknown"),
            ("tsx_async_abort", "Not affected"),
            ("mmio_stale_data", "Unknown: No mitigations"),
            ("spectre_v1", "Mitigation: usercopy/swapgs barriers and __user pointer sanitization"),
            ("spectre_v2", "Mitigation: Retpolines, IBPB: conditional, STIBP: disabled, RSB filling, PBRSB-eIBRS: Not affected, BHI: Not affected"),
            ("retbleed", "Vulnerable"),
            ("indirect_target_selection", "Mitigation: Aligned branch/return thunks"),
            ("spec_store_bypass", "Vulnerable"),
            ("l1tf", "Mitigation: PTE Inversion"),
            ("itlb_multihit", "KVM: Mitigation: VMX unsupported"),
        ]);
        let p = plan(&g);
        assert_eq!(
            measured(&p),
            [
                "meltdown",
                "verw",
                "spectre_v1",
                "spectre_v2",
                "indirect_target_selection",
                "l1tf"
            ]
        );
        let row = |k: &str| p.iter().find(|r| r.mitigation.key == k).unwrap();
        assert_eq!(row("retbleed").plan, RowPlan::NotEnabled);
        // BHI: Not affected is not a BHI mitigation.
        assert_eq!(row("spectre_bhi").plan, RowPlan::NotEnabled);
        assert_eq!(row("spec_rstack_overflow").plan, RowPlan::NoFile);
        // The VERW row carries every file of its group the kernel has.
        assert_eq!(row("verw").states.len(), 3);
        // itlb_multihit (KVM's) is in no row: said, not dropped.
        assert_eq!(
            uncovered(&g),
            ["itlb_multihit: KVM: Mitigation: VMX unsupported"]
        );
    }

    #[test]
    fn bhi_is_its_own_row_where_the_kernel_clears_the_history() {
        let g = guest(&[(
            "spectre_v2",
            "Mitigation: Enhanced / Automatic IBRS; IBPB: conditional; RSB filling; PBRSB-eIBRS: SW sequence; BHI: SW loop, KVM: SW loop",
        )]);
        assert_eq!(measured(&plan(&g)), ["spectre_v2", "spectre_bhi"]);
        let g = guest(&[("spectre_v2", "Vulnerable; BHI: Vulnerable")]);
        assert!(measured(&plan(&g)).is_empty());
    }

    #[test]
    fn a_vulnerable_that_names_what_it_still_does_is_measured() {
        for (state, measured) in [
            ("Vulnerable: Safe RET, no microcode", true),
            (
                "Vulnerable: Clear CPU buffers attempted, no microcode; SMT Host state unknown",
                true,
            ),
            ("Vulnerable, no microcode", false),
            ("Vulnerable: No microcode", false),
            ("Vulnerable", false),
        ] {
            let g = guest(&[("spec_rstack_overflow", state)]);
            assert_eq!(!measured_keys(&g).is_empty(), measured, "{state}");
        }
    }

    fn measured_keys(g: &GuestMitigations) -> Vec<&'static str> {
        plan(g)
            .into_iter()
            .filter(|r| r.plan == RowPlan::Measure)
            .map(|r| r.mitigation.key)
            .collect()
    }

    #[test]
    fn nothing_to_turn_off_where_nothing_is_affected() {
        let g = guest(&[
            ("meltdown", "Not affected"),
            ("mds", "Not affected"),
            ("spectre_v2", "Not affected"),
        ]);
        let p = plan(&g);
        assert!(measured(&p).is_empty());
        assert!(p.iter().all(|r| r.plan != RowPlan::Measure));
        assert!(uncovered(&g).is_empty());
    }

    #[test]
    fn the_table_is_consistent() {
        for m in MITIGATIONS {
            assert!(!m.files.is_empty() && !m.off.is_empty(), "{}", m.key);
            // Every off word is a kernel parameter, one word per `=`.
            assert!(m.off.split_whitespace().all(|w| !w.contains(',')));
            assert_eq!(m.group_note.is_some(), m.files.len() > 1, "{}", m.key);
        }
        let keys: std::collections::BTreeSet<_> = MITIGATIONS.iter().map(|m| m.key).collect();
        assert_eq!(keys.len(), MITIGATIONS.len());
    }
}
