//! The sweep's grid: `--wss` x `--touches` parsed and checked into cells,
//! each with its reads, pages and calls per run.

use ptiscope_abi::workingset as ws;

use super::SweepArgs;
use crate::report::sweep as rs;

/// Default `--wss`.
pub const DEFAULT_WSS: &str = "0,64K,1M,16M";
/// Default `--touches`: 4 Ki, 64 Ki and 2 Mi reads per call, the same for
/// every working set (Gregg's knob: the user work between two calls), so
/// that the syscall rate spans more than two decades (on kvm_pvm: about
/// 9k/s at wss=0 down to about 30/s at 16M x 2M reads).
pub const DEFAULT_TOUCHES: &str = "4K,64K,2M";
/// Default iterations per run (of a cell reading at most
/// [`FULL_ITERATIONS_READS`] per call): with the defaults the sweep takes
/// about a minute under kvm_pvm (a round trip costs 30-120 µs there).
pub const DEFAULT_SWEEP_ITERATIONS: u64 = 1000;
/// [`DEFAULT_SWEEP_ITERATIONS`] as `--iterations`' default text.
pub(super) const DEFAULT_SWEEP_ITERATIONS_STR: &str = "1000";
/// A cell whose calls read more than this many times runs
/// `iterations x FULL_ITERATIONS_READS / reads` calls (at least
/// [`MIN_CELL_ITERATIONS`]): its calls are slow, and a run of a thousand
/// of them would take minutes; per call the figures are the same.
pub const FULL_ITERATIONS_READS: u64 = 4096;
/// The fewest calls per run a slow cell is given (unless `--iterations` is lower).
pub const MIN_CELL_ITERATIONS: u64 = 20;

/// Calls per run of a cell reading `reads` times per call.
pub fn cell_iterations(iterations: u64, reads: u64) -> u64 {
    if reads <= FULL_ITERATIONS_READS {
        return iterations;
    }
    let scaled =
        (u128::from(iterations) * u128::from(FULL_ITERATIONS_READS) / u128::from(reads)) as u64;
    scaled.max(MIN_CELL_ITERATIONS).min(iterations)
}
/// Default runs per (cell, configuration).
pub const DEFAULT_SWEEP_RUNS: u32 = 5;

/// Most cells (working set x reads per iteration) one sweep runs: a grid
/// that size is already hours of runs; a larger one is refused before any
/// work (docs/running.md).
pub const MAX_SWEEP_CELLS: usize = 1024;
/// Most runs one sweep plans (cells x configurations x `--runs`).
pub const MAX_SWEEP_RUNS: u64 = 100_000;

/// A reads-per-iteration spec: passes over the working set, or reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TouchSpec {
    /// `Nx`: N passes over the working set.
    Passes(u64),
    /// A plain number of reads.
    Reads(u64),
}

impl TouchSpec {
    pub(super) fn parse(s: &str) -> Result<TouchSpec, String> {
        let bad = || format!("--touches: {s:?} is not `Nx` (N passes) or a number of reads");
        if let Some(n) = s.strip_suffix(['x', 'X']) {
            let n: u64 = n.parse().map_err(|_| bad())?;
            if n == 0 {
                return Err(format!("--touches: {s:?}: at least one pass (1x)"));
            }
            return Ok(TouchSpec::Passes(n));
        }
        ws::parse_size(s)
            .filter(|n| *n > 0 || s == "0")
            .map(TouchSpec::Reads)
            .ok_or_else(bad)
    }

    pub(super) fn label(self) -> String {
        match self {
            TouchSpec::Passes(n) => format!("{n}x"),
            TouchSpec::Reads(n) => n.to_string(),
        }
    }

    /// Reads per iteration for a working set of `slots` slots.
    pub(super) fn reads(self, slots: u64) -> u64 {
        match self {
            TouchSpec::Passes(n) => n.saturating_mul(slots),
            TouchSpec::Reads(n) => n,
        }
    }
}

/// One cell of the grid, before it runs.
#[derive(Debug, Clone)]
pub(super) struct CellPlan {
    pub wss: u64,
    pub spec: String,
    pub touches: u64,
    pub pages: u64,
    pub iterations: u64,
    pub words: String,
}

/// Pages of `page` bytes a window of `reads` consecutive slots spans at
/// most, capped by the whole buffer.
pub(super) fn pages_touched(wss: u64, stride: u64, reads: u64, page: u64) -> u64 {
    let total = wss.div_ceil(page);
    let slots = ws::slots(wss, stride);
    if reads >= slots {
        return total;
    }
    let span = if stride >= page {
        reads
    } else {
        (reads * stride).div_ceil(page)
    };
    span.min(total)
}

pub(super) fn plan(args: &SweepArgs) -> Result<(Vec<CellPlan>, u64), String> {
    let stride = ws::parse_size(&args.stride)
        .filter(|s| *s >= ws::MIN_STRIDE && s.is_multiple_of(ws::MIN_STRIDE) && *s <= ws::MAX_WSS)
        .ok_or_else(|| {
            format!(
                "--stride {:?}: a multiple of {} bytes from {} to {}M",
                args.stride,
                ws::MIN_STRIDE,
                ws::MIN_STRIDE,
                ws::MAX_WSS >> 20
            )
        })?;
    let mut sizes = Vec::new();
    for w in args.wss.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        let b = ws::parse_size(w)
            .filter(|b| *b <= ws::MAX_WSS)
            .ok_or_else(|| format!("--wss: {w:?} is not a size up to {}M", ws::MAX_WSS >> 20))?;
        sizes.push(b);
    }
    if sizes.is_empty() {
        return Err("--wss: no working set given".into());
    }
    sizes.sort_unstable();
    sizes.dedup();
    // Repeated specs are run once, as repeated sizes are (`1x,1x` is `1x`).
    let mut seen = std::collections::HashSet::new();
    let mut specs: Vec<TouchSpec> = Vec::new();
    for w in args
        .touches
        .split(',')
        .map(str::trim)
        .filter(|w| !w.is_empty())
    {
        let spec = TouchSpec::parse(w)?;
        if seen.insert(spec) {
            specs.push(spec);
        }
    }
    if specs.is_empty() {
        return Err("--touches: no value given".into());
    }
    let nonzero = sizes.iter().filter(|&&w| w > 0).count();
    let count = (sizes.len() - nonzero).saturating_add(nonzero.saturating_mul(specs.len()));
    if count > MAX_SWEEP_CELLS {
        return Err(format!(
            "--wss x --touches: {count} cells ({} working sets x {} reads per iteration); \
             a sweep runs at most {MAX_SWEEP_CELLS} cells (the sweep cell limit): split the grid \
             into several sweeps",
            sizes.len(),
            specs.len()
        ));
    }
    let page = args.wss_pages.bytes();
    let mut cells = Vec::new();
    for &wss in &sizes {
        if wss == 0 {
            cells.push(CellPlan {
                wss,
                spec: "-".into(),
                touches: 0,
                pages: 0,
                iterations: args.exp.iterations,
                words: String::new(),
            });
            continue;
        }
        for spec in &specs {
            let reads = spec.reads(ws::slots(wss, stride));
            if reads > ws::MAX_TOUCHES {
                return Err(format!(
                    "--touches {}: {reads} reads per iteration at wss={} (at most {})",
                    spec.label(),
                    rs::fmt_size(wss),
                    ws::MAX_TOUCHES
                ));
            }
            cells.push(CellPlan {
                wss,
                spec: spec.label(),
                touches: reads,
                pages: pages_touched(wss, stride, reads, page),
                iterations: cell_iterations(args.exp.iterations, reads),
                words: format!(
                    "wss={wss} stride={stride} touches={reads} wss_pages={}",
                    args.wss_pages
                ),
            });
        }
    }
    Ok((cells, stride))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iterations_default_text_is_the_default() {
        assert_eq!(
            DEFAULT_SWEEP_ITERATIONS_STR.parse::<u64>(),
            Ok(DEFAULT_SWEEP_ITERATIONS)
        );
    }

    #[test]
    fn touch_specs() {
        assert_eq!(TouchSpec::parse("1x"), Ok(TouchSpec::Passes(1)));
        assert_eq!(TouchSpec::parse("300"), Ok(TouchSpec::Reads(300)));
        assert!(TouchSpec::parse("0x").is_err());
        assert!(TouchSpec::parse("x").is_err());
        assert!(TouchSpec::parse("-1").is_err());
        assert_eq!(TouchSpec::parse("4K"), Ok(TouchSpec::Reads(4096)));
        assert_eq!(TouchSpec::parse("8M"), Ok(TouchSpec::Reads(8 << 20)));
        // Slow cells run fewer calls, never fewer than 20 nor more than asked.
        assert_eq!(cell_iterations(1000, 4096), 1000);
        assert_eq!(cell_iterations(1000, 64 << 10), 62);
        assert_eq!(cell_iterations(1000, 2 << 20), 20);
        assert_eq!(cell_iterations(10, 8 << 20), 10);
        assert_eq!(TouchSpec::Passes(4).reads(256), 1024);
    }

    #[test]
    fn pages() {
        // 1 MiB, one read per 4 KiB page: all 256 pages.
        assert_eq!(pages_touched(1 << 20, 4096, 256, 4096), 256);
        assert_eq!(pages_touched(1 << 20, 4096, 1024, 4096), 256);
        assert_eq!(pages_touched(1 << 20, 4096, 10, 4096), 10);
        // Cache-line stride: 64 reads per page.
        assert_eq!(pages_touched(1 << 20, 64, 128, 4096), 2);
        // 2 MiB pages: 4 MiB is two TLB entries.
        assert_eq!(pages_touched(4 << 20, 4096, 1024, 2 << 20), 2);
    }
}
