//! Running a command and measuring its wall time and peak RSS.
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One measured run of a child process.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub wall: Duration,
    /// Peak resident set size of the child, in KiB (`ru_maxrss`).
    pub max_rss_kib: u64,
    /// Exit code, or `None` if killed by a signal.
    pub code: Option<i32>,
    /// User + system CPU time of the child and the children it reaped
    /// (QEMU under `ptiscope --backend qemu`).
    pub cpu: Duration,
}

/// Spawns `cmd` with output discarded, waits with `wait4` to get the child's
/// own rusage (RUSAGE_CHILDREN would mix all children), and times it.
pub fn run(cmd: &mut Command) -> std::io::Result<Sample> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let start = Instant::now();
    let child = cmd.spawn()?;
    let pid = child.id() as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: all-zero bytes are a valid `rusage` (plain integers).
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our own un-reaped child; `status` and `usage` are valid
    // out-pointers for the duration of the call.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall = start.elapsed();
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // The child is reaped; forgetting the handle avoids a second wait.
    std::mem::forget(child);
    let code = if libc::WIFEXITED(status) {
        Some(libc::WEXITSTATUS(status))
    } else {
        None
    };
    let tv = |t: libc::timeval| {
        Duration::new(
            t.tv_sec.max(0) as u64,
            (t.tv_usec.clamp(0, 999_999) * 1000) as u32,
        )
    };
    Ok(Sample {
        wall,
        max_rss_kib: usage.ru_maxrss as u64,
        code,
        cpu: tv(usage.ru_utime) + tv(usage.ru_stime),
    })
}

/// Median of a non-empty slice (mean of the two middle values for even lengths).
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Reads a `ptiscope run --json` document (and removes the file).
pub fn take_run_json(path: &std::path::Path) -> Result<serde_json::Value, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let _ = std::fs::remove_file(path);
    serde_json::from_str(&text).map_err(|e| format!("run JSON: {e}"))
}

/// The per-iteration rate of the summary row `name` of a run document.
pub fn per_iteration(v: &serde_json::Value, name: &str) -> Option<f64> {
    v["rows"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["name"] == name))
        .and_then(|r| r["per_iteration"].as_f64())
}

/// A distribution-free 95 % confidence interval of the median of `values`
/// (independent draws of one distribution): the order statistics
/// `x(k)` and `x(n+1-k)` for the largest `k` with P(Binomial(n, 1/2) < k)
/// at most 2.5 %. `None` below 6 values, where no such `k` exists.
pub fn median_ci95(values: &[f64]) -> Option<(f64, f64)> {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    // P(B < k) for k = 1, 2, ...: the sum of C(n, i) / 2^n for i < k.
    let mut below = 0.0;
    let mut term = 0.5f64.powi(n as i32); // C(n, 0) / 2^n
    let mut k = 0;
    for i in 0..n {
        if below + term > 0.025 {
            break;
        }
        below += term;
        k = i + 1;
        term *= (n - i) as f64 / (i + 1) as f64;
    }
    (k >= 1 && 2 * k <= n).then(|| (v[k - 1], v[n - k]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn measures_a_real_child() {
        let s = run(&mut Command::new("true")).expect("spawn true");
        assert_eq!(s.code, Some(0));
        assert!(s.max_rss_kib > 0);
        let s = run(Command::new("sh").args(["-c", "exit 3"])).expect("spawn sh");
        assert_eq!(s.code, Some(3));
    }

    #[test]
    fn the_median_interval_takes_the_order_statistics_of_the_binomial() {
        // n = 15: P(B <= 3) = 0.0176 and P(B <= 4) = 0.0592, so k = 4 and
        // the interval is [x(4), x(12)] (the textbook table's 4th and 12th).
        let v: Vec<f64> = (1..=15).map(f64::from).collect();
        assert_eq!(median_ci95(&v), Some((4.0, 12.0)));
        // n = 6: P(B = 0) = 1/64 = 0.0156: [x(1), x(6)].
        assert_eq!(
            median_ci95(&[6.0, 1.0, 5.0, 2.0, 4.0, 3.0]),
            Some((1.0, 6.0))
        );
        assert_eq!(median_ci95(&[1.0, 2.0, 3.0, 4.0, 5.0]), None);
    }
}
