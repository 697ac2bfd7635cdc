//! The file the plugin writes at exit (format: `docs/telemetry-abi.md`,
//! "The QEMU plugin's file"). Line based, ASCII:
//!
//! ```text
//! ptiscope-tcg-plugin version=2 api=1 vcpus=2
//! kernel 0x0-0x3fffff:0xc0000000-0xffffffff
//! fields kernel_insns user_insns cr3_writes ...
//! mark seq=0 vcpu=0 pc=0xc0101234
//! counts 0 <one number per field>
//! counts 1 ...
//! totals
//! counts 0 ...
//! counts 1 ...
//! dropped_marks 0
//! call_pcs 2 unattributed 0
//! pc 0xffffffff81e00000 2000
//! pc 0xffffffff81e00003 2000
//! symbols 1 dropped 0
//! ffffffff81e00000 T entry_SYSCALL_64
//! end
//! ```
//!
//! `call_pcs` (with `pcs=1`) and `symbols` (with `syms=PATH`) are there
//! only when asked for.

/// Version of this format.
pub const FORMAT_VERSION: u64 = 4;

/// Counter names, in file order.
pub const FIELDS: [&str; 27] = [
    "kernel_insns",
    "user_insns",
    "cr3_writes",
    "invlpg",
    "invpcid",
    "syscall",
    "sysenter",
    "int",
    "sysret",
    "sysexit",
    "iret",
    "markers",
    "kernel_insns_other",
    "calls_other",
    "cr3_writes_other",
    "verw",
    "verw_other",
    "lfence",
    "lfence_other",
    "wrmsr",
    "wrmsr_other",
    "wrmsr_spec_ctrl",
    "wrmsr_spec_ctrl_other",
    "wrmsr_pred_cmd",
    "wrmsr_pred_cmd_other",
    "wrmsr_flush_cmd",
    "wrmsr_flush_cmd_other",
];

/// The counters kept apart for system calls as `cr3_writes` is: each with
/// its `_other` field (the executions outside undisturbed calls), in
/// [`FIELDS`] indices.
pub const CALL_SPLIT: [(usize, usize); 7] = [
    (field::CR3_WRITES, field::CR3_WRITES_OTHER),
    (field::VERW, field::VERW + 1),
    (field::LFENCE, field::LFENCE + 1),
    (field::WRMSR, field::WRMSR + 1),
    (field::WRMSR_SPEC_CTRL, field::WRMSR_SPEC_CTRL + 1),
    (field::WRMSR_PRED_CMD, field::WRMSR_PRED_CMD + 1),
    (field::WRMSR_FLUSH_CMD, field::WRMSR_FLUSH_CMD + 1),
];

/// Indices into [`FIELDS`].
pub mod field {
    /// Instructions at kernel addresses.
    pub const KERNEL_INSNS: usize = 0;
    /// Instructions at other addresses.
    pub const USER_INSNS: usize = 1;
    /// MOV to CR3.
    pub const CR3_WRITES: usize = 2;
    /// INVLPG.
    pub const INVLPG: usize = 3;
    /// INVPCID.
    pub const INVPCID: usize = 4;
    /// SYSCALL.
    pub const SYSCALL: usize = 5;
    /// SYSENTER.
    pub const SYSENTER: usize = 6;
    /// INT n.
    pub const INT: usize = 7;
    /// SYSRET.
    pub const SYSRET: usize = 8;
    /// SYSEXIT.
    pub const SYSEXIT: usize = 9;
    /// IRET.
    pub const IRET: usize = 10;
    /// Marker writes that took a snapshot (kernel-mode OUT DX, EAX in the
    /// marker ranges; with `umark=`, the Linux init's marker store or OUT).
    pub const MARKERS: usize = 11;
    /// The subset of `KERNEL_INSNS` set apart from system calls: kernel
    /// instructions entered without a system-call instruction (interrupts
    /// and exceptions taken from user mode, boot, idle, kernel threads)
    /// and the whole of every call during which an interrupt or exception
    /// was taken.
    pub const KERNEL_INSNS_OTHER: usize = 12;
    /// System calls whose instructions went to `KERNEL_INSNS_OTHER`.
    pub const CALLS_OTHER: usize = 13;
    /// The subset of `CR3_WRITES` set apart from system calls, by the same
    /// rule as `KERNEL_INSNS_OTHER`: what is left is the undisturbed
    /// calls' own CR3 writes, the same in every call of a loop.
    pub const CR3_WRITES_OTHER: usize = 14;
    /// VERW (then `verw_other`, by the same rule as `CR3_WRITES_OTHER`).
    pub const VERW: usize = 15;
    /// LFENCE (then `lfence_other`).
    pub const LFENCE: usize = 17;
    /// WRMSR, any MSR (then `wrmsr_other`).
    pub const WRMSR: usize = 19;
    /// WRMSR after `mov ecx, 0x48` in its block: IA32_SPEC_CTRL (IBRS).
    pub const WRMSR_SPEC_CTRL: usize = 21;
    /// WRMSR after `mov ecx, 0x49`: IA32_PRED_CMD (IBPB).
    pub const WRMSR_PRED_CMD: usize = 23;
    /// WRMSR after `mov ecx, 0x10b`: IA32_FLUSH_CMD (L1D flush).
    pub const WRMSR_FLUSH_CMD: usize = 25;
}

/// One vCPU's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts(pub [u64; FIELDS.len()]);

/// A snapshot at a kernel-mode `out dx, eax`.
#[derive(Debug, Clone)]
pub struct Mark {
    /// Order among marks (0, 1, ...).
    pub seq: u64,
    /// The vCPU that executed it.
    pub vcpu: u64,
    /// Its guest-virtual address.
    pub pc: u64,
    /// Every vCPU's counters before it executed.
    pub counts: Vec<Counts>,
}

/// The phase's undisturbed calls' kernel instructions, by address.
#[derive(Debug, Clone, Default)]
pub struct CallPcs {
    /// (address, executions), ascending addresses, counts > 0.
    pub pcs: Vec<(u64, u64)>,
    /// Instructions of calls whose segment log overflowed.
    pub unattributed: u64,
}

/// Everything the file holds.
pub struct Report {
    /// The API version the plugin declared.
    pub api: u64,
    /// The kernel ranges it used.
    pub kernel: Vec<(u64, u64)>,
    /// The snapshots.
    pub marks: Vec<Mark>,
    /// Marks not kept (beyond the plugin's bound).
    pub dropped_marks: u64,
    /// Every vCPU's counters at exit.
    pub totals: Vec<Counts>,
    /// `pcs=1`: the per-address counts.
    pub call_pcs: Option<CallPcs>,
    /// `syms=PATH`: the symbol file's lines, and how many were dropped
    /// (not printable ASCII).
    pub symbols: Option<(Vec<String>, u64)>,
}

fn counts_lines(out: &mut String, counts: &[Counts]) {
    for (i, c) in counts.iter().enumerate() {
        out.push_str(&format!("counts {i}"));
        for v in c.0 {
            out.push_str(&format!(" {v}"));
        }
        out.push('\n');
    }
}

impl Report {
    /// The file's text.
    pub fn render(&self) -> String {
        let mut s = format!(
            "ptiscope-tcg-plugin version={FORMAT_VERSION} api={} vcpus={}\n",
            self.api,
            self.totals.len()
        );
        let ranges: Vec<String> = self
            .kernel
            .iter()
            .map(|(lo, hi)| format!("{lo:#x}-{hi:#x}"))
            .collect();
        s.push_str(&format!("kernel {}\n", ranges.join(":")));
        s.push_str(&format!("fields {}\n", FIELDS.join(" ")));
        for m in &self.marks {
            s.push_str(&format!(
                "mark seq={} vcpu={} pc={:#x}\n",
                m.seq, m.vcpu, m.pc
            ));
            counts_lines(&mut s, &m.counts);
        }
        s.push_str("totals\n");
        counts_lines(&mut s, &self.totals);
        s.push_str(&format!("dropped_marks {}\n", self.dropped_marks));
        if let Some(c) = &self.call_pcs {
            s.push_str(&format!(
                "call_pcs {} unattributed {}\n",
                c.pcs.len(),
                c.unattributed
            ));
            for (pc, n) in &c.pcs {
                s.push_str(&format!("pc {pc:#x} {n}\n"));
            }
        }
        if let Some((lines, dropped)) = &self.symbols {
            s.push_str(&format!("symbols {} dropped {dropped}\n", lines.len()));
            for l in lines {
                s.push_str(l);
                s.push('\n');
            }
        }
        s.push_str("end\n");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_documented_lines() {
        let r = Report {
            api: 1,
            kernel: vec![(0, 0x3f_ffff), (0xc000_0000, 0xffff_ffff)],
            marks: vec![Mark {
                seq: 0,
                vcpu: 0,
                pc: 0xc010_0000,
                counts: vec![Counts([1; FIELDS.len()])],
            }],
            dropped_marks: 0,
            totals: vec![Counts([2; FIELDS.len()])],
            call_pcs: None,
            symbols: None,
        };
        let t = r.render();
        assert!(t.starts_with("ptiscope-tcg-plugin version=4 api=1 vcpus=1\n"));
        assert!(t.contains("kernel 0x0-0x3fffff:0xc0000000-0xffffffff\n"));
        assert!(t.contains("mark seq=0 vcpu=0 pc=0xc0100000\ncounts 0 1 1 1"));
        assert!(t.ends_with(&format!(
            "totals\ncounts 0{}\ndropped_marks 0\nend\n",
            " 2".repeat(FIELDS.len())
        )));
        let r = Report {
            call_pcs: Some(CallPcs {
                pcs: vec![(0xffff_ffff_8100_0000, 7)],
                unattributed: 3,
            }),
            symbols: Some((vec!["ffffffff81000000 T f".into()], 0)),
            ..r
        };
        assert!(r.render().ends_with(
            "dropped_marks 0\ncall_pcs 1 unattributed 3\npc 0xffffffff81000000 7\nsymbols 1 dropped 0\nffffffff81000000 T f\nend\n"
        ));
    }
}
