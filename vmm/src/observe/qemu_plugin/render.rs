//! Writing a report back in the plugin's own format (`--backend nested`
//! hands one run's marks on as that run's file).

use super::counters::{PluginCounter, VcpuCounts};
use super::ranges::ranges_arg;
use super::report::*;

impl PluginReport {
    /// The report as the plugin writes it (what [`PluginReport::parse`]
    /// reads back): `--backend nested` cuts one run's marks out of the
    /// outer plugin's live file and hands them on as that run's file.
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut s = format!(
            "ptiscope-tcg-plugin version={FORMAT_VERSION} api={} vcpus={}\nkernel {}\nfields {}\n",
            self.api,
            self.totals.0.len(),
            ranges_arg(&self.kernel),
            PluginCounter::ALL.map(PluginCounter::field).join(" ")
        );
        let counts = |s: &mut String, v: &VcpuCounts| {
            for (i, c) in v.0.iter().enumerate() {
                let _ = write!(s, "counts {i}");
                for n in c.0 {
                    let _ = write!(s, " {n}");
                }
                s.push('\n');
            }
        };
        for m in &self.marks {
            let _ = writeln!(s, "mark seq={} vcpu={} pc={:#x}", m.seq, m.vcpu, m.pc);
            counts(&mut s, &m.counts);
        }
        s.push_str("totals\n");
        counts(&mut s, &self.totals);
        let _ = writeln!(s, "dropped_marks {}", self.dropped_marks);
        if let Some(c) = &self.call_pcs {
            let _ = writeln!(
                s,
                "call_pcs {} unattributed {}",
                c.pcs.len(),
                c.unattributed
            );
            for (pc, n) in &c.pcs {
                let _ = writeln!(s, "pc {pc:#x} {n}");
            }
        }
        if let Some((lines, dropped)) = &self.symbols {
            let _ = writeln!(s, "symbols {} dropped {dropped}", lines.len());
            for l in lines {
                let _ = writeln!(s, "{l}");
            }
        }
        s.push_str("end\n");
        s
    }
}
