//! Reading the plugin's file, line by line, as hostile input: every line
//! validated, every count bounded ([`PluginReport::parse`]).

use super::counters::{Counts, PluginCounter, VcpuCounts, N_COUNTERS};
use super::report::*;

fn bad(line: usize, what: impl Into<String>) -> PluginParseError {
    PluginParseError::BadLine {
        line,
        what: what.into(),
    }
}

fn num(line: usize, t: &str) -> Result<u64, PluginParseError> {
    let ok = !t.is_empty() && t.len() <= 20 && t.bytes().all(|b| b.is_ascii_digit());
    ok.then(|| t.parse::<u64>().ok())
        .flatten()
        .ok_or_else(|| bad(line, format!("{t:?} is not a number")))
}

fn hex(line: usize, t: &str) -> Result<u64, PluginParseError> {
    t.strip_prefix("0x")
        .filter(|h| !h.is_empty() && h.len() <= 16)
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .ok_or_else(|| bad(line, format!("{t:?} is not a hex address")))
}

fn kv<'a>(line: usize, t: Option<&'a str>, key: &str) -> Result<&'a str, PluginParseError> {
    t.and_then(|t| t.strip_prefix(key))
        .and_then(|t| t.strip_prefix('='))
        .ok_or_else(|| bad(line, format!("expected {key}=")))
}

impl PluginReport {
    /// Parses the file's bytes.
    pub fn parse(bytes: &[u8]) -> Result<PluginReport, PluginParseError> {
        if bytes.len() > MAX_FILE_BYTES {
            return Err(PluginParseError::TooLarge(bytes.len()));
        }
        if !bytes.is_ascii() {
            return Err(PluginParseError::NotText);
        }
        let text = std::str::from_utf8(bytes).map_err(|_| PluginParseError::NotText)?;
        let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
        // Header.
        let (_, header) = lines.next().ok_or(PluginParseError::BadHeader)?;
        let mut h = header.split(' ');
        if h.next() != Some("ptiscope-tcg-plugin")
            || h.next() != Some(&format!("version={FORMAT_VERSION}"))
        {
            return Err(PluginParseError::BadHeader);
        }
        let api = num(1, kv(1, h.next(), "api")?)?;
        let vcpus = num(1, kv(1, h.next(), "vcpus")?)? as usize;
        if vcpus == 0 || vcpus > MAX_VCPUS || h.next().is_some() {
            return Err(bad(1, format!("vcpus must be 1..={MAX_VCPUS}, alone")));
        }
        // kernel ranges
        let (n, l) = lines.next().ok_or(PluginParseError::Truncated)?;
        let ranges = l
            .strip_prefix("kernel ")
            .ok_or_else(|| bad(n, "expected kernel LO-HI[:LO-HI...]"))?;
        let mut kernel = Vec::new();
        for r in ranges.split(':') {
            let (lo, hi) = r
                .split_once('-')
                .ok_or_else(|| bad(n, format!("{r:?} is not LO-HI")))?;
            let (lo, hi) = (hex(n, lo)?, hex(n, hi)?);
            if lo > hi || kernel.len() >= 8 {
                return Err(bad(n, format!("bad kernel range {r:?}")));
            }
            kernel.push((lo, hi));
        }
        // fields: exactly ours, in order.
        let (n, l) = lines.next().ok_or(PluginParseError::Truncated)?;
        let want: Vec<&str> = PluginCounter::ALL.iter().map(|c| c.field()).collect();
        if l.strip_prefix("fields ") != Some(&want.join(" ")) {
            return Err(bad(
                n,
                "the fields are not this ptiscope's (plugin and ptiscope from different builds?)",
            ));
        }
        let counts_block = |lines: &mut dyn Iterator<Item = (usize, &str)>| -> Result<VcpuCounts, PluginParseError> {
            let mut v = Vec::with_capacity(vcpus);
            for i in 0..vcpus {
                let (n, l) = lines.next().ok_or(PluginParseError::Truncated)?;
                let mut t = l.split(' ');
                if t.next() != Some("counts") || t.next() != Some(i.to_string().as_str()) {
                    return Err(bad(n, format!("expected `counts {i} ...`")));
                }
                let mut c = [0u64; N_COUNTERS];
                for slot in c.iter_mut() {
                    *slot = num(n, t.next().ok_or_else(|| bad(n, "too few counters"))?)?;
                }
                if t.next().is_some() {
                    return Err(bad(n, "too many counters"));
                }
                v.push(Counts(c));
            }
            Ok(VcpuCounts(v))
        };
        let mut marks = Vec::new();
        let totals = loop {
            let (n, l) = lines.next().ok_or(PluginParseError::Truncated)?;
            if l == "totals" {
                break counts_block(&mut lines)?;
            }
            let rest = l
                .strip_prefix("mark ")
                .ok_or_else(|| bad(n, "expected `mark ...` or `totals`"))?;
            if marks.len() >= MAX_MARKS {
                return Err(bad(n, format!("more than {MAX_MARKS} marks")));
            }
            let mut t = rest.split(' ');
            let seq = num(n, kv(n, t.next(), "seq")?)?;
            let vcpu = num(n, kv(n, t.next(), "vcpu")?)?;
            let pc = hex(n, kv(n, t.next(), "pc")?)?;
            if t.next().is_some() || vcpu >= vcpus as u64 || seq != marks.len() as u64 {
                return Err(bad(
                    n,
                    "bad mark (sequence out of order, vCPU out of range or extra words)",
                ));
            }
            let counts = counts_block(&mut lines)?;
            marks.push(Mark {
                seq,
                vcpu,
                pc,
                counts,
            });
        };
        let (n, l) = lines.next().ok_or(PluginParseError::Truncated)?;
        let dropped_marks = num(
            n,
            l.strip_prefix("dropped_marks ")
                .ok_or_else(|| bad(n, "expected dropped_marks N"))?,
        )?;
        let mut call_pcs = None;
        let mut symbols = None;
        loop {
            let (n, l) = lines.next().ok_or(PluginParseError::Truncated)?;
            if l == "end" {
                break;
            }
            let mut t = l.split(' ');
            match t.next() {
                Some("call_pcs") if call_pcs.is_none() && symbols.is_none() => {
                    let count = num(n, t.next().unwrap_or(""))? as usize;
                    if t.next() != Some("unattributed") {
                        return Err(bad(n, "expected call_pcs N unattributed M"));
                    }
                    let unattributed = num(n, t.next().unwrap_or(""))?;
                    if t.next().is_some() || count > MAX_CALL_PCS {
                        return Err(bad(
                            n,
                            format!("bad call_pcs line (at most {MAX_CALL_PCS})"),
                        ));
                    }
                    let mut pcs: Vec<(u64, u64)> = Vec::with_capacity(count.min(4096));
                    for _ in 0..count {
                        let (n, l) = lines.next().ok_or(PluginParseError::Truncated)?;
                        let mut t = l.split(' ');
                        if t.next() != Some("pc") {
                            return Err(bad(n, "expected `pc 0xADDR N`"));
                        }
                        let pc = hex(n, t.next().unwrap_or(""))?;
                        let c = num(n, t.next().unwrap_or(""))?;
                        if t.next().is_some() || pcs.last().is_some_and(|&(p, _)| p >= pc) {
                            return Err(bad(
                                n,
                                "bad pc line (extra words, or not in ascending order)",
                            ));
                        }
                        pcs.push((pc, c));
                    }
                    call_pcs = Some(CallPcs { pcs, unattributed });
                }
                Some("symbols") if symbols.is_none() => {
                    let count = num(n, t.next().unwrap_or(""))? as usize;
                    if t.next() != Some("dropped") {
                        return Err(bad(n, "expected symbols N dropped M"));
                    }
                    let dropped = num(n, t.next().unwrap_or(""))?;
                    if t.next().is_some() || count > MAX_SYMBOL_LINES {
                        return Err(bad(
                            n,
                            format!("bad symbols line (at most {MAX_SYMBOL_LINES})"),
                        ));
                    }
                    let mut v = Vec::with_capacity(count.min(4096));
                    for _ in 0..count {
                        let (_, l) = lines.next().ok_or(PluginParseError::Truncated)?;
                        v.push(l.to_string());
                    }
                    symbols = Some((v, dropped));
                }
                _ => return Err(bad(n, "expected call_pcs, symbols or end")),
            }
        }
        if let Some((n, _)) = lines.next() {
            return Err(bad(n, "text after end"));
        }
        Ok(PluginReport {
            api,
            kernel,
            marks,
            dropped_marks,
            totals,
            call_pcs,
            symbols,
        })
    }
}
