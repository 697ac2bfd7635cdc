//! The guest command line: `key=value` words separated by spaces.
//!
//! Every key is known (see `ptiscope_abi::cmdline`); an unknown key, a word
//! without `=`, a repeated key or a bad value is an error that names the word,
//! so the kernel can print it and exit with `BAD_CMDLINE`.

use core::fmt;
use ptiscope_abi::cmdline as keys;

pub use ptiscope_abi::options::{
    Entry, Fault, PtiMode, PtiSwitch, TaskMode, Workload, WssPages, DEFAULT_GROUPS,
    DEFAULT_ITERATIONS, DEFAULT_LOOPS, GROUP_SIZE, MAX_CPUS, MAX_GROUPS, MAX_ITERATIONS, MAX_LOOPS,
    MAX_THREADS,
};
use ptiscope_abi::workingset as ws;

/// The parsed command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// `pti=`: page table isolation on, off, or decided by the CPU (`auto`).
    pub pti: PtiMode,
    /// `pcid=`: tag the two page-table copies with PCIDs.
    pub pcid: bool,
    /// `entry=`: how user mode enters the kernel (`auto` parses as `int3`).
    pub entry: Entry,
    /// `workload=`: what the guest runs.
    pub workload: Workload,
    /// `iterations=`: system calls of the loop workloads (0..=[`MAX_ITERATIONS`]).
    pub iterations: u64,
    /// `telemetry=`: guest-physical address of the telemetry region (page
    /// aligned); `None` when the VMM reserved none.
    pub telemetry: Option<u64>,
    /// `fault=`: a fault to raise on purpose (tests).
    pub fault: Option<Fault>,
    /// `pti_global_text=`: map the kernel text global into the user copy.
    pub pti_global_text: bool,
    /// `groups=` of sched-messaging (1..=[`MAX_GROUPS`]).
    pub groups: u64,
    /// `loops=` of sched-messaging.
    pub loops: u64,
    /// `mode=` of sched-messaging.
    pub mode: TaskMode,
    /// `wss=`: bytes of user working set the loop reads between syscalls.
    pub wss: u64,
    /// `stride=`: bytes between two reads of the working set.
    pub stride: u64,
    /// `touches=`: reads per iteration (`None`: one pass over the buffer).
    pub touches: Option<u64>,
    /// `wss_pages=`: page size of the working set's mappings.
    pub wss_pages: WssPages,
    /// `kwss=`: bytes of kernel memory each call of the loop reads.
    pub kwss: u64,
    /// `cpus=`: CPUs to run on (1..=[`MAX_CPUS`]).
    pub cpus: u64,
    /// `threads=` of poundsyscall (1..=[`MAX_THREADS`]).
    pub threads: u64,
    /// `fault_cpu=`: the CPU that raises `fault=` (0..[`MAX_CPUS`]).
    pub fault_cpu: u64,
    /// `pti_switch=`: where the exit's kernel->user CR3 switch is done.
    pub pti_switch: PtiSwitch,
}

impl Config {
    /// Messages a sched-messaging run delivers: every sender writes `loops`
    /// messages to every receiver of its group.
    pub const fn messages(&self) -> u64 {
        self.groups * GROUP_SIZE * GROUP_SIZE * self.loops
    }

    /// Reads of the working set per iteration: `touches=`, or one pass.
    pub const fn touches_per_iteration(&self) -> u64 {
        match self.touches {
            Some(t) => t,
            None => ws::slots(self.wss, self.stride),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            pti: PtiMode::Auto,
            pcid: false,
            // int3 reaches the kernel on every x86 host, kvm_pvm (software KVM)
            // included; the VMM normally passes an explicit entry.
            entry: Entry::Int3,
            workload: Workload::None,
            iterations: DEFAULT_ITERATIONS,
            telemetry: None,
            fault: None,
            pti_global_text: false,
            groups: DEFAULT_GROUPS,
            loops: DEFAULT_LOOPS,
            mode: TaskMode::Process,
            wss: 0,
            stride: ws::DEFAULT_STRIDE,
            touches: None,
            wss_pages: WssPages::Small,
            kwss: 0,
            cpus: 1,
            threads: 1,
            fault_cpu: 0,
            pti_switch: PtiSwitch::Asm,
        }
    }
}

/// What was wrong with the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmdlineError<'a> {
    /// A word without `=`.
    NotKeyValue(&'a str),
    /// A key not in `ptiscope_abi::cmdline`.
    UnknownKey(&'a str),
    /// A known key whose value is malformed or out of range, or that
    /// contradicts another key (e.g. `touches=` without `wss=`).
    BadValue {
        /// The key as written.
        key: &'a str,
        /// The rejected value.
        value: &'a str,
    },
    /// A key given more than once.
    Repeated(&'a str),
}

impl fmt::Display for CmdlineError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmdlineError::NotKeyValue(w) => write!(f, "`{w}` is not key=value"),
            CmdlineError::UnknownKey(k) => write!(f, "unknown key `{k}`"),
            CmdlineError::BadValue { key, value } => {
                write!(
                    f,
                    "bad value `{value}` for `{key}` (expected {})",
                    expected(key)
                )
            }
            CmdlineError::Repeated(k) => write!(f, "key `{k}` given twice"),
        }
    }
}

fn expected(key: &str) -> &'static str {
    match key {
        keys::PTI => PtiMode::EXPECTED,
        keys::PCID | keys::PTI_GLOBAL_TEXT => "on|off",
        keys::ENTRY => "syscall|sysenter|int80|int3|int4|auto",
        keys::WORKLOAD => Workload::EXPECTED,
        keys::ITERATIONS => "a number from 0 to 2^32",
        keys::TELEMETRY => "a page-aligned physical address, e.g. 0x7fff000",
        keys::FAULT => Fault::EXPECTED,
        keys::RDCL_NO => "0|1",
        keys::GROUPS => {
            "a number from 1 to 4 (each group is 20 senders and 20 receivers; the task table holds 160 of them plus their parent)"
        }
        keys::LOOPS => "a number from 0 to 1000000",
        keys::MODE => TaskMode::EXPECTED,
        keys::WSS => {
            "a size up to 1008M (K/M/G suffixes), for workload getpid, getppid, write-badfd, nopti-getpid or poundsyscall"
        }
        keys::STRIDE => "a multiple of 8 bytes, from 8 to 1008M (K/M/G suffixes)",
        keys::TOUCHES => "a number from 0 to 2^32-1, with wss= above 0",
        keys::WSS_PAGES => WssPages::EXPECTED,
        keys::KWSS => {
            "a size up to 64M (K/M/G suffixes), for workload getpid, getppid, write-badfd or nopti-getpid"
        }
        keys::CPUS => "a number from 1 to 8 (the telemetry page's CPU blocks)",
        keys::THREADS => "a number from 1 to 64",
        keys::FAULT_CPU => "a CPU index from 0 to 7, below cpus=",
        keys::PTI_SWITCH => PtiSwitch::EXPECTED,
        _ => "?",
    }
}

/// The value of each byte as a digit (`0`-`9`, `a`-`f`, `A`-`F`), 255 for
/// any other byte.
const DIGITS: [u8; 256] = {
    let mut t = [255; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        t[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

/// Parses a decimal or `0x` hexadecimal number, as `u64::from_str_radix`
/// does after the prefix (a leading `+` allowed, no overflow), in one pass
/// over the digits: the guest parses at boot, where each instruction is
/// emulated on software-KVM hosts, and `from_str_radix` costs about twice
/// as many per digit.
pub fn parse_number(s: &str) -> Option<u64> {
    let (digits, hex) = match s.as_bytes() {
        [b'0', b'x' | b'X', rest @ ..] => (rest, true),
        all => (all, false),
    };
    let digits = match digits {
        [b'+', rest @ ..] if !rest.is_empty() => rest,
        [] => return None,
        d => d,
    };
    let mut v: u64 = 0;
    if hex {
        // At most 16 digits after leading zeros: the shifts cannot overflow.
        let mut digits = digits;
        while let [b'0', rest @ ..] = digits {
            if digits.len() <= 16 {
                break;
            }
            digits = rest;
        }
        if digits.len() > 16 {
            return None;
        }
        for &c in digits {
            let d = DIGITS[c as usize];
            if d >= 16 {
                return None;
            }
            v = v << 4 | d as u64;
        }
    } else {
        for &c in digits {
            let d = DIGITS[c as usize];
            if d >= 10 {
                return None;
            }
            v = v.checked_mul(10)?.checked_add(d as u64)?;
        }
    }
    Some(v)
}

const ONES: u64 = 0x0101_0101_0101_0101;

/// Index of the first `=` of `word`, if any: eight bytes per step (the
/// lowest zero byte of `x ^ "===..."` flagged by the borrow trick is exact,
/// as in [`find_control`]).
fn find_eq(word: &[u8]) -> Option<usize> {
    let mut pos = 0;
    while let Some(chunk) = word.get(pos..pos + 8) {
        let mut w = [0; 8];
        w.copy_from_slice(chunk);
        let x = u64::from_le_bytes(w) ^ (ONES * b'=' as u64);
        let zero = x.wrapping_sub(ONES) & !x & (ONES * 0x80);
        if zero != 0 {
            return Some(pos + (zero.trailing_zeros() / 8) as usize);
        }
        pos += 8;
    }
    let tail = word.get(pos..)?;
    tail.iter().position(|&b| b == b'=').map(|i| pos + i)
}

/// Index of the first byte of `bytes[pos..]` at or below `b' '` (NUL,
/// whitespace or another control byte), or `bytes.len()`: eight bytes per
/// step (the lowest byte flagged by the borrow trick is exact: a borrow only
/// runs upwards, from a byte that is below).
fn find_control(bytes: &[u8], mut pos: usize) -> usize {
    while let Some(chunk) = bytes.get(pos..pos + 8) {
        let mut w = [0; 8];
        w.copy_from_slice(chunk);
        let x = u64::from_le_bytes(w);
        let below = x.wrapping_sub(ONES * 0x21) & !x & (ONES * 0x80);
        if below != 0 {
            return pos + (below.trailing_zeros() / 8) as usize;
        }
        pos += 8;
    }
    while let Some(&b) = bytes.get(pos) {
        if b <= b' ' {
            break;
        }
        pos += 1;
    }
    pos
}

/// The `key=value` words of a command line: split on ASCII whitespace, up
/// to the first NUL, each split at its first `=` (`Err(word)` if it has
/// none), as `split('\0')`, `split_ascii_whitespace` and `split_once('=')`
/// would, with a few instructions per eight bytes.
struct Words<'a> {
    line: &'a str,
    pos: usize,
}

impl<'a> Iterator for Words<'a> {
    type Item = Result<(&'a str, &'a str), &'a str>;

    fn next(&mut self) -> Option<Self::Item> {
        let bytes = self.line.as_bytes();
        let mut pos = self.pos;
        let start = loop {
            match bytes.get(pos) {
                None | Some(0) => {
                    self.pos = pos;
                    return None;
                }
                Some(b) if b.is_ascii_whitespace() => pos += 1,
                Some(_) => break pos,
            }
        };
        // The word ends at NUL or whitespace; other control bytes are part
        // of it.
        let mut end = find_control(bytes, pos);
        while let Some(&b) = bytes.get(end) {
            if b == 0 || b.is_ascii_whitespace() {
                break;
            }
            end = find_control(bytes, end + 1);
        }
        self.pos = end;
        // Every split is at an ASCII byte or the end, so at char
        // boundaries: `get` never fails (and brings no panic path in).
        let word = self.line.get(start..end)?;
        Some(match find_eq(word.as_bytes()) {
            Some(e) => Ok((word.get(..e)?, word.get(e + 1..)?)),
            None => Err(word),
        })
    }
}

fn on_off(v: &str) -> Option<bool> {
    match v {
        "on" | "1" => Some(true),
        "off" | "0" => Some(false),
        _ => None,
    }
}

/// Parses a command line. Words are separated by ASCII whitespace; NUL ends it.
pub fn parse(line: &str) -> Result<Config, CmdlineError<'_>> {
    let mut c = Config::default();
    // The words of the working-set keys, for the checks across keys.
    let mut wss_word = None;
    let mut touches_word = None;
    let mut kwss_word = None;
    // One bit per key, to reject repeats (a typo'd repeat would silently win).
    let mut seen = 0u32;
    for word in (Words { line, pos: 0 }) {
        let (key, value) = word.map_err(CmdlineError::NotKeyValue)?;
        let bad = CmdlineError::BadValue { key, value };
        let bit = match key {
            keys::PTI => {
                c.pti = value.parse().map_err(|_| bad)?;
                0
            }
            keys::PCID => {
                c.pcid = on_off(value).ok_or(bad)?;
                1
            }
            keys::ENTRY => {
                // `auto` is resolved by the VMM; a guest booted without
                // it (QEMU) takes the entry that works on every host.
                c.entry = match value {
                    "auto" => Entry::Int3,
                    _ => value.parse().map_err(|_| bad)?,
                };
                2
            }
            keys::WORKLOAD => {
                c.workload = value.parse().map_err(|_| bad)?;
                3
            }
            keys::ITERATIONS => {
                c.iterations = match parse_number(value) {
                    Some(n) if n <= MAX_ITERATIONS => n,
                    _ => return Err(bad),
                };
                4
            }
            keys::TELEMETRY => {
                c.telemetry = match parse_number(value) {
                    Some(a) if a.is_multiple_of(4096) => Some(a),
                    _ => return Err(bad),
                };
                5
            }
            keys::FAULT => {
                c.fault = Some(value.parse().map_err(|_| bad)?);
                6
            }
            keys::PTI_GLOBAL_TEXT => {
                c.pti_global_text = on_off(value).ok_or(bad)?;
                7
            }
            keys::RDCL_NO => {
                // Reserved: the guest reads the MSR itself; accepted and ignored.
                on_off(value).ok_or(bad)?;
                8
            }
            keys::GROUPS => {
                c.groups = match parse_number(value) {
                    Some(n) if (1..=MAX_GROUPS).contains(&n) => n,
                    _ => return Err(bad),
                };
                9
            }
            keys::LOOPS => {
                c.loops = match parse_number(value) {
                    Some(n) if n <= MAX_LOOPS => n,
                    _ => return Err(bad),
                };
                10
            }
            keys::MODE => {
                c.mode = value.parse().map_err(|_| bad)?;
                11
            }
            keys::WSS => {
                c.wss = match ws::parse_size(value) {
                    Some(n) if n <= ws::MAX_WSS => n,
                    _ => return Err(bad),
                };
                wss_word = Some(value);
                12
            }
            keys::STRIDE => {
                c.stride = match ws::parse_size(value) {
                    Some(n)
                        if (ws::MIN_STRIDE..=ws::MAX_WSS).contains(&n)
                            && n.is_multiple_of(ws::MIN_STRIDE) =>
                    {
                        n
                    }
                    _ => return Err(bad),
                };
                13
            }
            keys::TOUCHES => {
                c.touches = match parse_number(value) {
                    Some(n) if n <= ws::MAX_TOUCHES => Some(n),
                    _ => return Err(bad),
                };
                touches_word = Some(value);
                14
            }
            keys::WSS_PAGES => {
                c.wss_pages = value.parse().map_err(|_| bad)?;
                15
            }
            keys::KWSS => {
                c.kwss = match ws::parse_size(value) {
                    Some(n) if n <= ws::MAX_KWSS => n,
                    _ => return Err(bad),
                };
                kwss_word = Some(value);
                16
            }
            keys::CPUS => {
                c.cpus = match parse_number(value) {
                    Some(n) if (1..=MAX_CPUS).contains(&n) => n,
                    _ => return Err(bad),
                };
                20
            }
            keys::THREADS => {
                c.threads = match parse_number(value) {
                    Some(n) if (1..=MAX_THREADS).contains(&n) => n,
                    _ => return Err(bad),
                };
                21
            }
            keys::FAULT_CPU => {
                c.fault_cpu = match parse_number(value) {
                    Some(n) if n < MAX_CPUS => n,
                    _ => return Err(bad),
                };
                22
            }
            keys::PTI_SWITCH => {
                c.pti_switch = value.parse().map_err(|_| bad)?;
                23
            }
            _ => return Err(CmdlineError::UnknownKey(key)),
        };
        if seen & (1 << bit) != 0 {
            return Err(CmdlineError::Repeated(key));
        }
        seen |= 1 << bit;
    }
    if let (Some(value), 0) = (touches_word, c.wss) {
        return Err(CmdlineError::BadValue {
            key: keys::TOUCHES,
            value,
        });
    }
    if let Some(value) = wss_word.filter(|_| c.wss > 0 && !c.workload.takes_working_set()) {
        return Err(CmdlineError::BadValue {
            key: keys::WSS,
            value,
        });
    }
    if let Some(value) = kwss_word.filter(|_| c.kwss > 0 && !c.workload.is_syscall_loop()) {
        return Err(CmdlineError::BadValue {
            key: keys::KWSS,
            value,
        });
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::ToString;

    /// The hand-written scanners give what the `core` functions they
    /// replace gave (`from_str_radix`; `split('\0')`,
    /// `split_ascii_whitespace`, `split_once('=')`).
    #[test]
    fn scanners_match_core() {
        fn reference_number(s: &str) -> Option<u64> {
            let (digits, radix) = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
                Some(hex) => (hex, 16),
                None => (s, 10),
            };
            if digits.is_empty() {
                return None;
            }
            u64::from_str_radix(digits, radix).ok()
        }
        let mut numbers: std::vec::Vec<std::string::String> = [
            "",
            "0",
            "00",
            "+",
            "+0",
            "++1",
            "-1",
            "0x",
            "0X",
            "0x+",
            "0x+f",
            "0x-1",
            "0xg",
            "0XFf",
            "0x7fff000",
            "4096",
            "18446744073709551615",
            "18446744073709551616",
            "0xffffffffffffffff",
            "0x10000000000000000",
            "0x0000000000000000001",
            "1a",
            "a1",
            " 1",
            "1 ",
            "0b1",
            "0o7",
            "\u{e9}",
            "9\u{e9}",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        numbers
            .extend((0..200u64).map(|i| std::format!("{}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15))));
        numbers.extend(
            (0..200u64).map(|i| std::format!("{:#x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15))),
        );
        for n in &numbers {
            assert_eq!(parse_number(n), reference_number(n), "{n:?}");
        }
        // Random lines over an alphabet of separators, near-separators
        // and word bytes (a fixed LCG: the same lines every run).
        let alphabet = [
            "a", "b", "=", " ", "\t", "\n", "\r", "\x0c", "\x0b", "\x01", "\0", "\u{e9}", "0",
        ];
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut lines: std::vec::Vec<std::string::String> = std::vec::Vec::new();
        for _ in 0..3000 {
            let mut l = std::string::String::new();
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            for _ in 0..(seed >> 58) {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                l.push_str(alphabet[(seed >> 33) as usize % alphabet.len()]);
            }
            lines.push(l);
        }
        for line in lines.iter().map(|l| l.as_str()).chain([
            "",
            " ",
            "a=b",
            "  a=b \t c=d\n",
            "a=b\x0bc=d",
            "a==b =c d= e",
            "word",
            "a=b word c=d",
            "a=b\0c=d",
            "a\0=b",
            "\0",
            "x=\u{e9} \u{e9}=y",
            "\r\x0ca=1\x0c\rb=2\x01c=3",
            "entry=int3 telemetry=0x7fff000",
            "pti=on pcid=on entry=syscall workload=getppid iterations=0x10 telemetry=0x7fff000",
            "a_long_key_name=a_long_value_string\x1f_with_a_control_byte x=y\tz=w",
            "12345678=9abcdef0\u{e9}\u{e9}\u{e9}\u{e9} k=v\0 not=read",
        ]) {
            let words: std::vec::Vec<_> = (Words { line, pos: 0 }).collect();
            let reference: std::vec::Vec<_> = line
                .split('\0')
                .next()
                .unwrap_or("")
                .split_ascii_whitespace()
                .map(|w| w.split_once('=').ok_or(w))
                .collect();
            assert_eq!(words, reference, "{line:?}");
        }
    }

    #[test]
    fn cpus_and_threads() {
        let c = parse("cpus=2 threads=4 workload=poundsyscall").unwrap();
        assert_eq!(
            (c.cpus, c.threads, c.workload),
            (2, 4, Workload::Poundsyscall)
        );
        assert_eq!(Config::default().cpus, 1);
        for bad in ["cpus=0", "cpus=9", "threads=0", "threads=65", "cpus=x"] {
            assert!(
                matches!(parse(bad), Err(CmdlineError::BadValue { .. })),
                "{bad}"
            );
        }
        assert_eq!(parse("cpus=2 cpus=2"), Err(CmdlineError::Repeated("cpus")));
        assert_eq!(parse("fault_cpu=1").unwrap().fault_cpu, 1);
        assert!(parse("fault_cpu=8").is_err());
        assert_eq!(
            parse("pti_switch=deferred").unwrap().pti_switch,
            PtiSwitch::Deferred
        );
        assert!(parse("pti_switch=c").is_err());
    }

    #[test]
    fn empty_line_gives_defaults() {
        assert_eq!(parse(""), Ok(Config::default()));
        assert_eq!(parse("  \0garbage after nul"), Ok(Config::default()));
        assert_eq!(Config::default().workload, Workload::None);
        assert_eq!(Config::default().iterations, DEFAULT_ITERATIONS);
    }

    #[test]
    fn all_keys_parse() {
        let c = parse(
            "pti=on pcid=on entry=syscall workload=getppid iterations=0x10 \
             telemetry=0x7fff000 fault=kread pti_global_text=on rdcl_no=1",
        )
        .unwrap();
        assert_eq!(c.pti, PtiMode::On);
        assert!(c.pcid);
        assert_eq!(c.entry, Entry::Syscall);
        assert_eq!(c.workload, Workload::Getppid);
        assert_eq!(c.iterations, 16);
        assert_eq!(c.telemetry, Some(0x7fff000));
        assert_eq!(c.fault, Some(Fault::Kread));
        assert!(c.pti_global_text);
    }

    #[test]
    fn each_value_of_each_enum() {
        for (s, e) in [
            ("int3", Entry::Int3),
            ("int4", Entry::Int4),
            ("int80", Entry::Int80),
            ("sysenter", Entry::Sysenter),
            ("auto", Entry::Int3),
        ] {
            assert_eq!(parse(&std::format!("entry={s}")).unwrap().entry, e);
        }
        for f in ["pf", "gp", "ud", "de", "kread", "hang", "halt"] {
            let c = parse(&std::format!("fault={f}")).unwrap();
            assert_eq!(c.fault.unwrap().name(), f);
        }
        for w in [
            "none",
            "getpid",
            "getppid",
            "write-badfd",
            "nopti-getpid",
            "sched-messaging",
        ] {
            let c = parse(&std::format!("workload={w}")).unwrap();
            assert_eq!(c.workload.name(), w);
        }
        assert_eq!(parse("pti=off").unwrap().pti, PtiMode::Off);
        assert_eq!(parse("pti=auto").unwrap().pti, PtiMode::Auto);
        assert!(!parse("pcid=off").unwrap().pcid);
    }

    #[test]
    fn errors_name_the_culprit() {
        assert_eq!(parse("bogus=1"), Err(CmdlineError::UnknownKey("bogus")));
        assert_eq!(parse("pti"), Err(CmdlineError::NotKeyValue("pti")));
        assert_eq!(
            parse("pti=maybe"),
            Err(CmdlineError::BadValue {
                key: "pti",
                value: "maybe"
            })
        );
        assert_eq!(parse("pti=on pti=off"), Err(CmdlineError::Repeated("pti")));
        assert_eq!(parse("iterations=0").map(|c| c.iterations), Ok(0));
        assert!(matches!(
            parse("iterations=0x100000001"),
            Err(CmdlineError::BadValue { .. })
        ));
        assert!(matches!(
            parse("iterations=abc"),
            Err(CmdlineError::BadValue { .. })
        ));
        assert!(matches!(
            parse("iterations=0x"),
            Err(CmdlineError::BadValue { .. })
        ));
        assert!(matches!(
            parse("telemetry=0x1001"),
            Err(CmdlineError::BadValue { .. })
        ));
        assert!(matches!(
            parse("entry=sysret"),
            Err(CmdlineError::BadValue { .. })
        ));
        let msg = parse("pti=maybe").unwrap_err().to_string();
        assert!(
            msg.contains("maybe") && msg.contains("on|off|auto"),
            "{msg}"
        );
    }

    #[test]
    fn sched_messaging_keys() {
        let c = parse("workload=sched-messaging").unwrap();
        assert_eq!(c.workload, Workload::SchedMessaging);
        assert_eq!((c.groups, c.loops, c.mode), (1, 10, TaskMode::Process));
        assert_eq!(c.messages(), 4000);
        let c = parse("workload=sched-messaging groups=4 loops=0x10 mode=thread").unwrap();
        assert_eq!((c.groups, c.loops, c.mode), (4, 16, TaskMode::Thread));
        assert_eq!(c.messages(), 4 * 20 * 20 * 16);
        assert_eq!(parse("mode=process").unwrap().mode, TaskMode::Process);
        assert_eq!(parse("loops=0").unwrap().loops, 0);
        assert_eq!(parse("loops=1000000").unwrap().loops, MAX_LOOPS);
        for bad in [
            "groups=0",
            "groups=5",
            "groups=x",
            "loops=1000001",
            "loops=-1",
            "mode=fork",
        ] {
            let e = parse(bad).unwrap_err();
            let (key, _) = bad.split_once('=').unwrap();
            assert!(
                matches!(e, CmdlineError::BadValue { key: k, .. } if k == key),
                "{bad}: {e:?}"
            );
            assert!(e.to_string().contains(key), "{e}");
        }
        let msg = parse("groups=9").unwrap_err().to_string();
        assert!(
            msg.contains("`groups`") && msg.contains("1 to 4") && msg.contains("160"),
            "{msg}"
        );
        assert_eq!(
            parse("groups=1 groups=2"),
            Err(CmdlineError::Repeated("groups"))
        );
        assert_eq!(TaskMode::Thread.name(), "thread");
    }

    #[test]
    fn working_set_keys() {
        let c = parse("workload=getpid wss=1M").unwrap();
        assert_eq!((c.wss, c.stride, c.touches), (1 << 20, 4096, None));
        assert_eq!(c.touches_per_iteration(), 256);
        assert_eq!(c.wss_pages, WssPages::Small);
        let c = parse("workload=write-badfd wss=10000 stride=64 touches=7 wss_pages=2m").unwrap();
        assert_eq!((c.wss, c.stride, c.touches), (10_000, 64, Some(7)));
        assert_eq!(c.touches_per_iteration(), 7);
        assert_eq!(c.wss_pages, WssPages::Huge);
        assert_eq!(
            parse("workload=getppid wss=64k")
                .unwrap()
                .touches_per_iteration(),
            16
        );
        assert_eq!(parse("wss=0 stride=64").unwrap().touches_per_iteration(), 0);
        let c = parse("workload=poundsyscall threads=2 wss=64K touches=3").unwrap();
        assert_eq!((c.wss, c.touches_per_iteration()), (64 << 10, 3));
        for bad in [
            "workload=getpid wss=1T",
            "workload=getpid wss=2G",
            "workload=getpid wss=abc",
            "workload=getpid wss=1M stride=0",
            "workload=getpid wss=1M stride=12",
            "workload=getpid wss=1M stride=2G",
            "workload=getpid wss=1M touches=x",
            "workload=getpid wss=1M touches=0x100000000",
            "workload=getpid wss=1M wss_pages=1g",
            "workload=getpid touches=5",
            "workload=sched-messaging wss=1M",
            "wss=4K",
            "workload=getpid kwss=65M",
            "workload=getpid kwss=x",
            "kwss=64K",
            "workload=poundsyscall kwss=64K",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(matches!(e, CmdlineError::BadValue { .. }), "{bad}: {e:?}");
        }
        assert_eq!(parse("workload=getpid kwss=64M").unwrap().kwss, 64 << 20);
        assert_eq!(parse("workload=getpid").unwrap().kwss, 0);
        let msg = parse("workload=getpid touches=5").unwrap_err().to_string();
        assert!(msg.contains("`touches`") && msg.contains("wss="), "{msg}");
        assert_eq!(parse("wss=1M wss=2M"), Err(CmdlineError::Repeated("wss")));
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_number("0"), Some(0));
        assert_eq!(parse_number("0x1F"), Some(31));
        assert_eq!(parse_number("18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_number("18446744073709551616"), None);
        assert_eq!(parse_number("-1"), None);
        assert_eq!(parse_number(""), None);
    }

    #[test]
    fn every_workload_the_abi_lists_parses() {
        for w in Workload::ALL.iter().map(|w| w.name()) {
            let c = parse(alloc_free_line(w)).unwrap_or_else(|e| panic!("{w}: {e:?}"));
            assert_eq!(c.workload.name(), w);
        }
    }

    /// `workload=NAME` without an allocator (the crate is no_std).
    fn alloc_free_line(w: &str) -> &'static str {
        match w {
            "none" => "workload=none",
            "getpid" => "workload=getpid",
            "getppid" => "workload=getppid",
            "write-badfd" => "workload=write-badfd",
            "nopti-getpid" => "workload=nopti-getpid",
            "sched-messaging" => "workload=sched-messaging",
            "poundsyscall" => "workload=poundsyscall",
            other => panic!("add {other} to this test"),
        }
    }
}
