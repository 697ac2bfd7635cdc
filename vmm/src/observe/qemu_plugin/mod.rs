//! The QEMU TCG plugin's output file (`qemu-plugin/`, format in
//! docs/telemetry-abi.md, "The QEMU plugin"), parsed as hostile input: the
//! file is written inside the QEMU process that runs the guest, so it is
//! bounded, every line is validated, and nothing in it can make the parser
//! panic or allocate without bound.
//!
//! The typed result ([`PluginReport`]) holds every vCPU's counters at each
//! snapshot (a kernel-mode `out dx, eax` in the marker ranges; with
//! `umark=`, the Linux init's user-mode marker pair) and at exit;
//! [`PluginReport::companion_phase`] finds the ptiscope guest's measured
//! phase among the snapshots, [`PluginReport::linux_phase`] the init's.

mod counters;
mod parse;
mod phase;
mod ranges;
mod render;
mod report;

pub use counters::{Counts, PluginCounter, VcpuCounts, N_COUNTERS};
pub use ranges::{kernel_ranges, ranges_arg, LINUX_MARK_PORT};
pub use report::{
    CallPcs, Mark, PhaseError, PluginParseError, PluginPhase, PluginReport, Range, FORMAT_VERSION,
    MAX_CALL_PCS, MAX_FILE_BYTES, MAX_MARKS, MAX_SYMBOL_LINES, MAX_VCPUS,
};

/// The QEMU TCG plugin's output file of one run, unparsed: the QEMU
/// backend's own part of what a run left ([`crate::backend::Observed`]),
/// which [`PluginReport::parse`] reads.
#[derive(Debug, Clone, Default)]
pub enum PluginOutput {
    /// Not loaded: `--no-plugin`, or a backend that has no plugin.
    #[default]
    Off,
    /// What the plugin wrote, at most one byte more than the parser takes.
    File(Vec<u8>),
    /// Loaded, but there is no file to read (why).
    Missing(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plugin file with a mark (its pc and counts) per entry of `marks`.
    fn file(marks: &[(u64, [u64; N_COUNTERS])], totals: [u64; N_COUNTERS]) -> String {
        let fields: Vec<&str> = PluginCounter::ALL.iter().map(|c| c.field()).collect();
        let mut s = format!(
            "ptiscope-tcg-plugin version=4 api=1 vcpus=1\nkernel 0x0-0x3fffff:0xc0000000-0xffffffff\nfields {}\n",
            fields.join(" ")
        );
        let line = |c: [u64; N_COUNTERS]| {
            format!(
                "counts 0 {}\n",
                c.iter().map(u64::to_string).collect::<Vec<_>>().join(" ")
            )
        };
        for (i, (pc, c)) in marks.iter().enumerate() {
            s.push_str(&format!("mark seq={i} vcpu=0 pc={pc:#x}\n"));
            s.push_str(&line(*c));
        }
        s.push_str("totals\n");
        s.push_str(&line(totals));
        s.push_str("dropped_marks 0\nend\n");
        s
    }

    /// [`file`] parsed.
    fn report(marks: &[(u64, [u64; N_COUNTERS])], totals: [u64; N_COUNTERS]) -> PluginReport {
        PluginReport::parse(file(marks, totals).as_bytes()).unwrap()
    }

    fn c(kernel: u64, cr3: u64) -> [u64; N_COUNTERS] {
        let mut a = [0; N_COUNTERS];
        a[0] = kernel;
        a[2] = cr3;
        a
    }

    /// Kernel and user addresses of the marks.
    const K1: u64 = 0xc000_1000;
    const K2: u64 = 0xc000_2000;
    const U1: u64 = 0x40_1000;
    const U2: u64 = 0x40_1040;

    /// `good` with `from` replaced by `to` (which must change it) is
    /// refused by the parser, never accepted nor a panic.
    fn assert_refused(good: &str, from: &str, to: &str) {
        let bad = good.replacen(from, to, 1);
        assert_ne!(bad, good, "{from} not in the file");
        assert!(
            PluginReport::parse(bad.as_bytes()).is_err(),
            "{from} -> {to} accepted"
        );
    }

    #[test]
    fn parses_a_phase() {
        let marks = [
            (K1, c(100, 10)),
            (K2, c(500, 12)),
            (0xc000_3000, c(600, 13)),
        ];
        let r = report(&marks, c(700, 13));
        assert_eq!(r.kernel, vec![(0, 0x3f_ffff), (0xc000_0000, 0xffff_ffff)]);
        assert_eq!(r.totals.total().get(PluginCounter::KernelInsns), 700);
        let p = r.companion_phase().unwrap();
        assert_eq!(p.delta.total().get(PluginCounter::KernelInsns), 400);
        assert_eq!(p.delta.total().get(PluginCounter::Cr3Writes), 2);
    }

    #[test]
    fn refuses_other_marker_patterns() {
        for (marks, want) in [
            (vec![(K1, c(1, 1))], PhaseError::Pattern(1)),
            (vec![(K1, c(1, 1)), (K1, c(2, 2))], PhaseError::Pattern(2)),
            (vec![(K1, c(5, 1)), (K2, c(2, 2))], PhaseError::Backwards),
        ] {
            assert_eq!(
                report(&marks, c(9, 2)).companion_phase(),
                Err(want),
                "{marks:?}"
            );
        }
    }

    #[test]
    fn the_linux_phase_is_exactly_two_user_marks() {
        let p = report(&[(U1, c(100, 10)), (U2, c(700, 2010))], c(900, 2012))
            .linux_phase()
            .unwrap();
        assert_eq!(p.delta.total().get(PluginCounter::Cr3Writes), 2000);
        assert_eq!(p.delta.total().get(PluginCounter::KernelInsns), 600);
        for (marks, want) in [
            // The companion's [begin, end, exit] is not the init's pattern.
            (vec![(U1, c(1, 1)), (U2, c(2, 2)), (0x40_1080, c(3, 3))], 3),
            (vec![(U1, c(1, 1)), (U1, c(2, 2))], 2),
            (vec![], 0),
        ] {
            let got = report(&marks, c(3, 3)).linux_phase();
            assert_eq!(got, Err(PhaseError::LinuxPattern(want)), "{marks:?}");
        }
    }

    #[test]
    fn hostile_files_are_errors_not_panics() {
        let good = file(&[(K1, c(1, 1)), (K2, c(2, 2))], c(3, 3));
        assert!(PluginReport::parse(good.as_bytes()).is_ok());
        // Every truncation of a good file is refused (never a panic).
        for cut in 0..good.len() - 1 {
            assert!(
                PluginReport::parse(&good.as_bytes()[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        for (from, to) in [
            ("version=4", "version=3"),
            ("vcpus=1", "vcpus=0"),
            ("vcpus=1", "vcpus=65"),
            ("vcpus=1", "vcpus=2"),
            ("seq=1", "seq=7"),
            ("vcpu=0 pc=0xc0002000", "vcpu=3 pc=0xc0002000"),
            ("pc=0xc0002000", "pc=0xzz"),
            ("pc=0xc0002000", "pc=0x11112222333344445"),
            ("counts 0 2 ", "counts 0 -2 "),
            ("counts 0 2 ", "counts 0 99999999999999999999999 "),
            ("counts 0 3 ", "counts 1 3 "),
            ("fields kernel_insns", "fields user_insns"),
            ("0x0-0x3fffff", "0x3fffff-0x0"),
            ("dropped_marks 0", "dropped_marks x"),
            ("end\n", "end\nmore\n"),
            ("totals\n", ""),
        ] {
            assert_refused(&good, from, to);
        }
        assert_eq!(
            PluginReport::parse("é".as_bytes()),
            Err(PluginParseError::NotText)
        );
        let huge = vec![b'a'; MAX_FILE_BYTES + 1];
        assert_eq!(
            PluginReport::parse(&huge),
            Err(PluginParseError::TooLarge(MAX_FILE_BYTES + 1))
        );
        // A counter line with an extra counter, or one too few.
        let extra = good.replacen("\ndropped_marks", " 7\ndropped_marks", 1);
        assert_ne!(extra, good);
        assert!(PluginReport::parse(extra.as_bytes()).is_err());
        let fewer = good.replacen(" 0\ndropped_marks", "\ndropped_marks", 1);
        assert_ne!(fewer, good);
        assert!(PluginReport::parse(fewer.as_bytes()).is_err());
    }

    #[test]
    fn per_address_counts_and_symbols() {
        let good = file(&[(U1, c(1, 1)), (U2, c(2, 2))], c(3, 3)).replacen(
            "end\n",
            "call_pcs 2 unattributed 5\npc 0xffffffff81000000 300\npc 0xffffffff81000004 300\n\
             symbols 2 dropped 1\nffffffff81000000 T entry_SYSCALL_64\nnot a symbol line\nend\n",
            1,
        );
        let r = PluginReport::parse(good.as_bytes()).unwrap();
        assert_eq!(
            r.call_pcs,
            Some(CallPcs {
                pcs: vec![(0xffff_ffff_8100_0000, 300), (0xffff_ffff_8100_0004, 300)],
                unattributed: 5
            })
        );
        let (lines, dropped) = r.symbols.unwrap();
        assert_eq!((lines.len(), dropped), (2, 1));
        // Without the sections: none.
        let plain = PluginReport::parse(file(&[], c(1, 1)).as_bytes()).unwrap();
        assert_eq!((plain.call_pcs, plain.symbols), (None, None));
        // Hostile sections are refused, never a panic.
        for (from, to) in [
            ("call_pcs 2", "call_pcs 3"),
            ("call_pcs 2", "call_pcs 99999999999"),
            ("call_pcs 2", "call_pcs x"),
            ("unattributed 5", "unattributed"),
            ("unattributed 5", "unattributed 5 6"),
            ("pc 0xffffffff81000004", "pc 0xffffffff81000000"),
            ("pc 0xffffffff81000004 300", "pc 0xffffffff81000004 -1"),
            ("pc 0xffffffff81000004 300", "pc 0xffffffff81000004 300 1"),
            ("pc 0xffffffff81000004", "pq 0xffffffff81000004"),
            ("symbols 2", "symbols 3"),
            ("symbols 2", "symbols 2000000000"),
            ("dropped 1", "dropped"),
            ("end\n", "end\nx\n"),
        ] {
            assert_refused(&good, from, to);
        }
        // Two call_pcs sections, or call_pcs after symbols: refused.
        let twice = good.replacen("symbols 2", "call_pcs 0 unattributed 0\nsymbols 2", 1);
        assert!(PluginReport::parse(twice.as_bytes()).is_err());
        let after = good.replacen("end\n", "call_pcs 0 unattributed 0\nend\n", 1);
        assert!(PluginReport::parse(after.as_bytes()).is_err());
        for cut in 0..good.len() - 1 {
            assert!(
                PluginReport::parse(&good.as_bytes()[..cut]).is_err(),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn ranges_for_the_companion_and_others() {
        let (k, m) = kernel_ranges(true, true);
        assert_eq!(ranges_arg(&k), "0x0-0x3fffff:0xc0000000-0xffffffff");
        assert_eq!(ranges_arg(&m), "0x100000-0x3fffff:0xc0000000-0xfeffffff");
        let (k, _) = kernel_ranges(false, false);
        assert_eq!(ranges_arg(&k), "0xffff800000000000-0xffffffffffffffff");
    }
}
