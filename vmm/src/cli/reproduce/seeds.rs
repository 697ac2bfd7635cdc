//! The seeds' tables as cells: for each published table, its rows and
//! columns on every guest asked, with the published figure in the cell's
//! unit and the row its overhead is against.

use super::cell::{Cell, CellGuest};
use crate::cli::Arch;
use ptiscope_abi::options::Workload;

/// The cells of a seed, for the guests asked.
pub(super) fn cells(seed: Seed, guests: &[CellGuest]) -> (String, Vec<Cell>) {
    let mut v: Vec<Cell> = Vec::new();
    let mut push = |c: Cell| {
        v.push(c);
        v.len() - 1
    };
    let title;
    match seed {
        Seed::Roedel2018 => {
            title = "Roedel 2018: perf bench sched messaging -g 20 (published: seconds, shown as ns per \
                     message of its 800,000) against sched-messaging groups=1 loops=10 (4,000 messages) here"
                .to_string();
            // (kernel label, published processes, threads) per PTI state.
            let published = [
                ("32-bit PAE", [(0.28, 0.27), (0.44, 0.42)]),
                ("64-bit", [(0.24, 0.25), (0.30, 0.31)]),
            ];
            for &g in guests {
                for (bits, figures) in published {
                    let matches = matches!(
                        (g.arch, bits),
                        (Arch::I386, "32-bit PAE") | (Arch::X86_64, "64-bit")
                    );
                    if !matches {
                        continue;
                    }
                    for (mode, col, column) in
                        [("process", 0usize, "processes"), ("thread", 1, "threads")]
                    {
                        let mut base = None;
                        for (pti, fig) in [("off", figures[0]), ("on", figures[1])] {
                            let secs = if col == 0 { fig.0 } else { fig.1 };
                            let i = push(Cell {
                                guest: g,
                                row: format!(
                                    "{bits}, {}",
                                    if pti == "on" { "PTI" } else { "no PTI" }
                                ),
                                column: column.into(),
                                opts: Ok(format!(
                                    "pti={pti},cmdline=groups=1 loops=10 mode={mode}"
                                )),
                                workload: Workload::SchedMessaging,
                                iterations: 1,
                                cpus: 1,
                                published: Some(secs / ROEDEL_MESSAGES * 1e9),
                                published_unit: "ns/message",
                                published_text: format!("{secs:.2} s"),
                                baseline: base,
                            });
                            base = Some(i);
                        }
                    }
                }
            }
        }
        Seed::Tarreau2018 => {
            title = "Tarreau 2018: 3 million getppid() (published: ms, shown as ns per call) against \
                     getppid loops here (300,000 calls on the companion guest, 20,000 under Linux/TCG)"
                .to_string();
            for g in guests.iter().copied().filter(|g| g.is_x86_64()) {
                let linux = g.kind.is_linux();
                let iterations = g.calls(20_000, 300_000);
                let rows: [(&str, Result<&str, &'static str>, Workload, f64); 3] = [
                    ("PTI off at boot", Ok("pti=off"), Workload::Getppid, 215.0),
                    (
                        "PTI off for the process",
                        if linux {
                            Err("Linux has no per-process PTI opt-out (the 2018 prctl was not merged)")
                        } else {
                            Ok("pti=on,workload=nopti-getpid")
                        },
                        Workload::Getppid,
                        230.0,
                    ),
                    ("PTI on", Ok("pti=on"), Workload::Getppid, 920.0),
                ];
                let mut base = None;
                for (row, opts, workload, ms) in rows {
                    let i = push(Cell {
                        guest: g,
                        row: row.into(),
                        column: "getppid".into(),
                        opts: opts.map(String::from),
                        workload,
                        iterations,
                        cpus: 1,
                        published: Some(ms * 1e6 / 3e6),
                        published_unit: "ns/call",
                        published_text: format!("{ms:.0} ms"),
                        baseline: base,
                    });
                    if base.is_none() {
                        base = Some(i);
                    }
                }
            }
        }
        Seed::Chartre2020 => {
            title = "Chartre 2020: mmtests poundsyscall, T threads of getppid, pti vs nopti (published: \
                     the overhead only, ~+150 % at 2-4 threads) against poundsyscall on 2 vCPUs here"
                .to_string();
            for g in guests.iter().copied().filter(|g| g.is_x86_64()) {
                let iterations = g.calls(5_000, 100_000);
                for threads in [2u32, 4] {
                    let mut base = None;
                    for pti in ["off", "on"] {
                        let i = push(Cell {
                            guest: g,
                            row: format!("{threads} threads, pti={pti}"),
                            column: "poundsyscall".into(),
                            opts: Ok(format!("pti={pti},cmdline=threads={threads}")),
                            workload: Workload::Poundsyscall,
                            iterations,
                            cpus: 2,
                            published: None,
                            published_unit: "",
                            published_text: if pti == "on" {
                                "~+150 %".into()
                            } else {
                                "baseline".into()
                            },
                            baseline: base,
                        });
                        base = Some(i);
                    }
                }
            }
        }
        Seed::Petkov2015 => {
            title = "Petkov 2015: cycles per getpid by raw SYSCALL (published: ~396.5 cycles, before \
                     PTI existed) against getpid loops here; under TCG the TSC is QEMU's, not cycles"
                .to_string();
            for g in guests.iter().copied().filter(|g| g.is_x86_64()) {
                let iterations = g.calls(20_000, 300_000);
                let base = push(Cell {
                    guest: g,
                    row: "getpid, pti=off".into(),
                    column: "cycles".into(),
                    opts: Ok("pti=off".into()),
                    workload: Workload::Getpid,
                    iterations,
                    cpus: 1,
                    published: Some(396.5),
                    published_unit: "cycles/call",
                    published_text: "396.5 cycles".into(),
                    baseline: None,
                });
                push(Cell {
                    guest: g,
                    row: "getpid, pti=on".into(),
                    column: "cycles".into(),
                    opts: Ok("pti=on".into()),
                    workload: Workload::Getpid,
                    iterations,
                    cpus: 1,
                    published: None,
                    published_unit: "",
                    published_text: "(no PTI in 2015)".into(),
                    baseline: Some(base),
                });
            }
        }
        Seed::Gregg2018 => {
            title = "Gregg 2018: KPTI overhead against working set (published: a figure, overhead \
                     growing with the working set read between calls) against getppid with wss= here"
                .to_string();
            for g in guests.iter().copied().filter(|g| g.is_x86_64()) {
                let iterations = g.calls(5_000, 100_000);
                for wss in ["0", "64K", "1M"] {
                    let mut base = None;
                    for pti in ["off", "on"] {
                        let i = push(Cell {
                            guest: g,
                            row: format!("wss={wss}, pti={pti}"),
                            column: "getppid".into(),
                            opts: Ok(if wss == "0" {
                                format!("pti={pti}")
                            } else {
                                format!("pti={pti},cmdline=wss={wss} stride=64")
                            }),
                            workload: Workload::Getppid,
                            iterations,
                            cpus: 1,
                            published: None,
                            published_unit: "",
                            published_text: "(figure)".into(),
                            baseline: base,
                        });
                        base = Some(i);
                    }
                }
            }
        }
    }
    (title, v)
}

/// The seeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Seed {
    /// Roedel 2018: sched-messaging, 32-bit PAE against 64-bit, PTI off/on.
    #[value(name = "roedel-2018")]
    Roedel2018,
    /// Tarreau 2018: getppid round trip, PTI on, off per process, off at boot.
    #[value(name = "tarreau-2018")]
    Tarreau2018,
    /// Chartre 2020: poundsyscall by thread count, PTI off/on.
    #[value(name = "chartre-2020")]
    Chartre2020,
    /// Petkov 2015: cycles per getpid.
    #[value(name = "petkov-2015")]
    Petkov2015,
    /// Gregg 2018: overhead against working set.
    #[value(name = "gregg-2018")]
    Gregg2018,
}

const ROEDEL_MESSAGES: f64 = 20.0 * 400.0 * 100.0;

pub(super) fn seed_name(s: Seed) -> &'static str {
    match s {
        Seed::Roedel2018 => "roedel-2018",
        Seed::Tarreau2018 => "tarreau-2018",
        Seed::Chartre2020 => "chartre-2020",
        Seed::Petkov2015 => "petkov-2015",
        Seed::Gregg2018 => "gregg-2018",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roedels_table_has_its_four_rows_per_column_each_against_its_own_baseline() {
        let guests = [CellGuest::COMPANIONS[0], CellGuest::linux("debian-686-pae")];
        let (_, c) = cells(Seed::Roedel2018, &guests);
        // Per guest: one kernel (64-bit or 32-bit PAE), 2 PTI states x 2 columns.
        assert_eq!(c.len(), 8);
        for (i, cell) in c.iter().enumerate() {
            match cell.baseline {
                Some(b) => {
                    assert_eq!(i, b + 1);
                    assert_eq!(c[b].column, cell.column);
                    assert!(cell.opts.as_ref().unwrap().starts_with("pti=on"));
                }
                None => assert!(cell.opts.as_ref().unwrap().starts_with("pti=off")),
            }
        }
        // The published 32-bit PAE figures go with the 686-pae kernel.
        let pae: Vec<_> = c
            .iter()
            .filter(|x| x.guest == CellGuest::linux("debian-686-pae"))
            .collect();
        assert!(pae.iter().all(|x| x.row.starts_with("32-bit PAE")));
        assert_eq!(pae[1].published_text, "0.44 s");
    }

    #[test]
    fn every_seed_has_cells_for_the_64_bit_kernels() {
        for seed in [
            Seed::Roedel2018,
            Seed::Tarreau2018,
            Seed::Chartre2020,
            Seed::Petkov2015,
            Seed::Gregg2018,
        ] {
            let (_, c) = cells(seed, &[CellGuest::linux("debian-amd64")]);
            assert!(!c.is_empty(), "{seed:?}");
            assert!(c.iter().any(|x| x.baseline.is_some()), "{seed:?}");
        }
    }
}
