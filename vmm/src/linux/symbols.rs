//! Where a Linux guest's system-call instructions go, by kernel symbol
//! (`--by-symbol`): the QEMU plugin's per-address counts of the phase's
//! undisturbed calls, mapped through the running kernel's own symbol table,
//! which the init read from `/proc/kallsyms` after the phase and sent
//! through QEMU's isa-debugcon (so a distribution kernel needs no debug
//! package, and KASLR's offset is in the addresses already).
//!
//! The symbol lines come from the guest: parsed as hostile input (any line
//! that is not `HEXADDR TYPE NAME[ [MODULE]]` is counted and skipped, the
//! table is sorted here, duplicates resolved the same way every time).
//! Every counted address lands in exactly one row: its containing function
//! (the nearest text symbol at or below it), or `[unknown]` when there is
//! none within [`MAX_FUNCTION_BYTES`]; instructions the plugin could not
//! place at an address are `[unattributed]`. The rows therefore sum to the
//! plugin's count exactly.

use crate::observe::qemu_plugin::CallPcs;
use crate::report::by_symbol::{SymbolCount, UNATTRIBUTED, UNKNOWN};

/// The farthest an address may lie past the symbol it is given to: past
/// that it is `[unknown]` (no kernel function is this long; an address
/// beyond the last symbol of the text, e.g. in a module area without
/// symbols, would otherwise be given to that symbol).
pub const MAX_FUNCTION_BYTES: u64 = 1 << 20;

/// A kernel's text symbols, sorted by address, one name per address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SymbolTable {
    /// (address, name), ascending addresses, no two at one address.
    pub symbols: Vec<(u64, String)>,
    /// Lines that did not parse (skipped).
    pub bad_lines: usize,
    /// Lines of other symbol types (data, absolute), skipped.
    pub other_lines: usize,
    /// Text symbols whose address was 0 (hidden by kptr_restrict), skipped.
    pub hidden: usize,
}

/// Whether `name` is a plausible symbol name (what kallsyms prints).
fn plausible_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 512
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'[' && b != b']')
}

impl SymbolTable {
    /// Parses kallsyms lines (`ffffffff81000000 T _stext`, optionally
    /// `\t[module]` after the name). Text symbols (`t`, `T`, `w`, `W`) are
    /// kept; at one address the global one wins over a local one, then the
    /// shorter name, then the first in byte order (aliases: the same
    /// address gives the same name in every run).
    pub fn parse<'a>(lines: impl IntoIterator<Item = &'a str>) -> SymbolTable {
        let mut t = SymbolTable::default();
        // (address, rank, name): the lowest rank wins at an address.
        let mut all: Vec<(u64, (u8, usize), String)> = Vec::new();
        for line in lines {
            let mut w = line.split_ascii_whitespace();
            let (Some(addr), Some(kind), Some(name)) = (w.next(), w.next(), w.next()) else {
                t.bad_lines += 1;
                continue;
            };
            let module = match w.next() {
                None => None,
                Some(m) if m.len() > 2 && m.starts_with('[') && m.ends_with(']') => {
                    Some(&m[1..m.len() - 1])
                }
                Some(_) => {
                    t.bad_lines += 1;
                    continue;
                }
            };
            let Some(addr) = (addr.len() <= 16)
                .then(|| u64::from_str_radix(addr, 16).ok())
                .flatten()
            else {
                t.bad_lines += 1;
                continue;
            };
            if w.next().is_some()
                || kind.len() != 1
                || !plausible_name(name)
                || module.is_some_and(|m| !plausible_name(m))
            {
                t.bad_lines += 1;
                continue;
            }
            let local = match kind {
                "T" | "W" => 0,
                "t" | "w" => 1,
                _ => {
                    t.other_lines += 1;
                    continue;
                }
            };
            if addr == 0 {
                t.hidden += 1;
                continue;
            }
            let name = match module {
                Some(m) => format!("{name} [{m}]"),
                None => name.to_string(),
            };
            all.push((addr, (local, name.len()), name));
        }
        all.sort();
        all.dedup_by_key(|(a, _, _)| *a);
        t.symbols = all.into_iter().map(|(a, _, n)| (a, n)).collect();
        t
    }

    /// The function containing `pc`: the nearest symbol at or below it,
    /// if within [`MAX_FUNCTION_BYTES`].
    pub fn lookup(&self, pc: u64) -> Option<&str> {
        let i = self.symbols.partition_point(|(a, _)| *a <= pc);
        let (a, name) = self.symbols.get(i.checked_sub(1)?)?;
        (pc - a < MAX_FUNCTION_BYTES).then_some(name.as_str())
    }

    /// The per-address counts by symbol, sorted by name; `[unknown]` for
    /// addresses no symbol covers and `[unattributed]` for the plugin's
    /// instructions at no address. The rows sum to the counts exactly.
    pub fn attribute(&self, counts: &CallPcs) -> Vec<SymbolCount> {
        let mut by = std::collections::BTreeMap::<String, u64>::new();
        for &(pc, n) in &counts.pcs {
            let name = self.lookup(pc).unwrap_or(UNKNOWN);
            let e = by.entry(name.to_string()).or_default();
            *e = e.saturating_add(n);
        }
        if counts.unattributed > 0 {
            *by.entry(UNATTRIBUTED.to_string()).or_default() += counts.unattributed;
        }
        by.into_iter()
            .map(|(symbol, instructions)| SymbolCount {
                symbol,
                instructions,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> SymbolTable {
        SymbolTable::parse(text.lines())
    }

    #[test]
    fn parses_sorts_and_resolves_aliases() {
        let t = table(
            "ffffffff81000200 t b_local\n\
             ffffffff81000100 T a\n\
             ffffffff81000200 T b_global_longer\n\
             ffffffff81000200 T b_glob\n\
             ffffffff81000100 T a\n\
             ffffffff81000300 D some_data\n\
             ffffffffc0000000 t mod_fn\t[ext4]\n",
        );
        assert_eq!(
            t.symbols,
            vec![
                (0xffff_ffff_8100_0100, "a".to_string()),
                (0xffff_ffff_8100_0200, "b_glob".to_string()),
                (0xffff_ffff_c000_0000, "mod_fn [ext4]".to_string()),
            ]
        );
        assert_eq!((t.bad_lines, t.other_lines, t.hidden), (0, 1, 0));
    }

    #[test]
    fn garbage_empty_and_hidden_input() {
        let t = table(
            "\n\
             not a line\n\
             zzzz T x\n\
             ffffffff81000000 TT x\n\
             ffffffff81000000 T\n\
             11112222333344445 T too_long\n\
             ffffffff81000000 T x extra words\n\
             ffffffff81000000 T x [unclosed\n\
             ffffffff81000000 T bad[name\n\
             0000000000000000 T hidden\n\
             0000000000000000 t hidden2\n",
        );
        assert!(t.symbols.is_empty());
        assert_eq!((t.bad_lines, t.hidden), (9, 2));
        assert_eq!(table("").symbols, vec![]);
        assert_eq!(table("").lookup(5), None);
    }

    #[test]
    fn maps_addresses_to_the_containing_function() {
        let t = table(
            "ffffffff81000100 T entry_SYSCALL_64\n\
             ffffffff81000180 T entry_SYSCALL_64_after_hwframe\n\
             ffffffff81200000 T do_syscall_64\n",
        );
        assert_eq!(t.lookup(0xffff_ffff_8100_00ff), None);
        assert_eq!(t.lookup(0xffff_ffff_8100_0100), Some("entry_SYSCALL_64"));
        assert_eq!(t.lookup(0xffff_ffff_8100_017f), Some("entry_SYSCALL_64"));
        assert_eq!(
            t.lookup(0xffff_ffff_8100_0180),
            Some("entry_SYSCALL_64_after_hwframe")
        );
        assert_eq!(t.lookup(0xffff_ffff_8120_0005), Some("do_syscall_64"));
        // Far past the last symbol: unknown, not the last symbol's.
        assert_eq!(t.lookup(0xffff_ffff_c000_0000), None);
        let counts = CallPcs {
            pcs: vec![
                (0xffff_ffff_8100_0000, 3),
                (0xffff_ffff_8100_0100, 2000),
                (0xffff_ffff_8100_0104, 2000),
                (0xffff_ffff_8120_0000, 7),
                (0xffff_ffff_c000_0000, 1),
            ],
            unattributed: 11,
        };
        let rows = t.attribute(&counts);
        let get = |s: &str| rows.iter().find(|r| r.symbol == s).map(|r| r.instructions);
        assert_eq!(get("entry_SYSCALL_64"), Some(4000));
        assert_eq!(get("do_syscall_64"), Some(7));
        assert_eq!(get(UNKNOWN), Some(4));
        assert_eq!(get(UNATTRIBUTED), Some(11));
        // Nothing dropped: the rows sum to the counts.
        let sum: u64 = rows.iter().map(|r| r.instructions).sum();
        assert_eq!(sum, 3 + 4000 + 7 + 1 + 11);
        // No symbols at all: everything is unknown, still counted.
        let none = SymbolTable::default().attribute(&counts);
        assert_eq!(none.iter().map(|r| r.instructions).sum::<u64>(), sum);
    }
}
