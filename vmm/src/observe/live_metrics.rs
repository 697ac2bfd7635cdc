//! `--metrics-interval MS`: a thread that reads the KVM stats fds (VM and
//! vCPU; a stats fd can be read from any thread) and the guest telemetry
//! page every MS milliseconds while the guest runs, and writes one JSON line
//! per interval with the changes since the previous line (as Firecracker's
//! metrics flush does), flushing each line so a FIFO reader sees it at once.
//! Format: docs/report-json.md, "`ptiscope.metrics/1`".
//!
//! With `--metrics-format openmetrics` each interval instead writes one
//! complete OpenMetrics text exposition (the format Prometheus scrapes) of
//! the **cumulative** values, ending in `# EOF`: counters are counts since
//! the VM (KVM stats) or the guest (telemetry) started, as the format wants,
//! so a reader takes the latest block; the last block is the run's final
//! figures. Written by hand: it is a few lines of text, and the Prometheus
//! client crates are built around a registry served over HTTP, which a
//! stream to a file or FIFO does not need.

use std::io::Write;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::machine::kvm_stats::{self, KvmStats, StatType, StatsSnapshot};
use crate::machine::VmContext;
use crate::observe::telemetry::{self, TelemetryReader, TelemetrySnapshot};
use crate::output::{OutputQueue, OutputReport, DRAIN_GRACE};

/// Schema id of every line.
pub const SCHEMA: &str = "ptiscope.metrics/1";
/// Smallest interval accepted (a line per millisecond is already a lot).
pub const MIN_INTERVAL: Duration = Duration::from_millis(1);

/// How each interval is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum MetricsFormat {
    /// One JSON line of changes per interval (`ptiscope.metrics/1`).
    #[default]
    Json,
    /// One OpenMetrics text exposition of cumulative values per interval.
    #[value(name = "openmetrics")]
    OpenMetrics,
}

/// Where, how often, and in which format. The lines go through `out`'s
/// bounded queue: the sampling thread never waits for the reader, and a
/// reader that stalls gets lines dropped (counted in the run's summary)
/// rather than stalling the run or its teardown.
pub struct LiveMetricsConfig {
    /// Time between lines (raised to [`MIN_INTERVAL`] if shorter).
    pub interval: Duration,
    /// The bounded queue the lines go to.
    pub out: OutputQueue,
    /// The format of each line.
    pub format: MetricsFormat,
}

/// Errors of the live-metrics thread.
#[derive(Debug, thiserror::Error)]
pub enum LiveMetricsError {
    /// The stats fds could not be opened.
    #[error("cannot open the KVM stats fds: {0}")]
    Stats(#[from] kvm_stats::KvmStatsError),
    /// The thread could not be started.
    #[error("cannot start the metrics thread: {0}")]
    Spawn(#[source] std::io::Error),
    /// A line could not be written.
    #[error("writing a metrics line: {0}")]
    Write(#[source] std::io::Error),
    /// The thread panicked.
    #[error("the metrics thread panicked")]
    Panicked,
    /// The thread's seccomp filter could not be installed.
    #[error(transparent)]
    Sandbox(#[from] crate::sandbox::SandboxError),
}

/// A running metrics thread.
pub struct LiveMetrics {
    stop: mpsc::Sender<()>,
    handle: JoinHandle<Result<u64, LiveMetricsError>>,
    out: OutputQueue,
}

struct State {
    vm: KvmStats,
    /// Every vCPU's stats, by index.
    vcpus: Vec<KvmStats>,
    mem: GuestMemoryMmap,
    telemetry_gpa: GuestAddress,
    out: crate::output::QueueWriter,
    format: MetricsFormat,
    start: Instant,
    seq: u64,
    last_at: Duration,
    last_vm: Option<StatsSnapshot>,
    last_vcpus: Vec<Option<StatsSnapshot>>,
    last_guest: Option<TelemetrySnapshot>,
}

impl LiveMetrics {
    /// Opens its own VM stats fd and starts the thread (called from the
    /// observer's `on_start`, before the first KVM_RUN). `vcpus` are stats
    /// fds of every vCPU opened for this thread; empty, it reads the vCPU
    /// of `ctx` alone.
    pub fn start(
        cfg: LiveMetricsConfig,
        ctx: &VmContext<'_>,
        vcpus: Vec<KvmStats>,
    ) -> Result<Self, LiveMetricsError> {
        let vcpus = if vcpus.is_empty() {
            vec![KvmStats::from_vcpu(ctx.vcpu)?]
        } else {
            vcpus
        };
        let mut st = State {
            vm: KvmStats::from_vm(ctx.vm)?,
            last_vcpus: vec![None; vcpus.len()],
            vcpus,
            // GuestMemoryMmap is a set of reference-counted mappings: the
            // clone keeps them alive for the thread.
            mem: ctx.mem.clone(),
            telemetry_gpa: GuestAddress(ctx.layout.telemetry_addr()),
            out: cfg.out.writer(),
            format: cfg.format,
            start: Instant::now(),
            seq: 0,
            last_at: Duration::ZERO,
            last_vm: None,
            last_guest: None,
        };
        st.sample(false)?;
        let interval = cfg.interval.max(MIN_INTERVAL);
        let (stop, rx) = mpsc::channel::<()>();
        let handle = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                // Its fds are open: the rest reads guest memory and writes
                // lines, under the thread's seccomp filter.
                crate::sandbox::confine(crate::sandbox::ThreadKind::Metrics)?;
                let mut next = Instant::now() + interval;
                loop {
                    let wait = next.saturating_duration_since(Instant::now());
                    match rx.recv_timeout(wait) {
                        Err(RecvTimeoutError::Timeout) => {
                            st.sample(true)?;
                            next += interval;
                            // After a stall, do not burst to catch up.
                            if next < Instant::now() {
                                next = Instant::now() + interval;
                            }
                        }
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                            // A final line covers the tail of the run.
                            st.sample(true)?;
                            return Ok(st.seq);
                        }
                    }
                }
            })
            .map_err(LiveMetricsError::Spawn)?;
        Ok(LiveMetrics {
            stop,
            handle,
            out: cfg.out,
        })
    }

    /// Stops the thread after a final line (it never waits on the reader,
    /// so this is quick), then lets the output drain for [`DRAIN_GRACE`]
    /// (the run's other queues drain meanwhile, to about the same deadline).
    /// Returns the lines produced and what became of them.
    pub fn finish(self, _ctx: &VmContext<'_>) -> (Result<u64, LiveMetricsError>, OutputReport) {
        let deadline = Instant::now() + DRAIN_GRACE;
        let _ = self.stop.send(());
        let lines = self
            .handle
            .join()
            .map_err(|_| LiveMetricsError::Panicked)
            .and_then(|r| r);
        (lines, self.out.finish_by(deadline))
    }
}

/// Cumulative scalars of `d` as a JSON object (instant values and
/// histograms are left out: a per-interval delta of them means nothing).
fn cumulative(d: &StatsSnapshot) -> Map<String, Value> {
    d.iter()
        .filter(|(desc, v)| desc.stat_type == StatType::Cumulative && v.len() == 1)
        .map(|(desc, v)| (desc.name.clone(), json!(v[0])))
        .collect()
}

impl State {
    /// Reads everything; with `emit`, writes the line of changes since the
    /// previous sample.
    fn sample(&mut self, emit: bool) -> Result<(), LiveMetricsError> {
        let at = self.start.elapsed();
        let vm = self.vm.read().ok();
        let vcpus: Vec<Option<StatsSnapshot>> = self.vcpus.iter().map(|v| v.read().ok()).collect();
        let guest = TelemetryReader::new(&self.mem, self.telemetry_gpa).and_then(|r| r.snapshot());
        if emit && self.format == MetricsFormat::OpenMetrics {
            let refs: Vec<Option<&StatsSnapshot>> = vcpus.iter().map(Option::as_ref).collect();
            let text = openmetrics(at, vm.as_ref(), &refs, guest.as_ref().ok());
            self.out
                .write_all(text.as_bytes())
                .map_err(LiveMetricsError::Write)?;
            self.out.flush().map_err(LiveMetricsError::Write)?;
            self.seq += 1;
        } else if emit {
            let kdelta = |a: &Option<StatsSnapshot>, b: &Option<StatsSnapshot>| match (a, b) {
                (Some(a), Some(b)) => kvm_stats::delta(a, b)
                    .map(|d| Value::Object(cumulative(&d)))
                    .unwrap_or(Value::Null),
                _ => Value::Null,
            };
            let named = |d: &TelemetrySnapshot| {
                Value::Object(
                    d.named_totals()
                        .map(|(k, v)| (k.to_string(), json!(v)))
                        .chain([("cr3_writes".to_string(), json!(d.cr3_writes()))])
                        .collect(),
                )
            };
            let (guest_v, guest_err) = match (&self.last_guest, &guest) {
                (Some(a), Ok(b)) => match telemetry::delta(a, b) {
                    Ok(d) => (named(&d), Value::Null),
                    Err(e) => (Value::Null, json!(e.to_string())),
                },
                // First valid read: the guest's counters start at zero at boot.
                (None, Ok(b)) => (named(b), Value::Null),
                (_, Err(e)) => (Value::Null, json!(e.to_string())),
            };
            let line = json!({
                "schema": SCHEMA,
                "seq": self.seq,
                "t_ms": at.as_secs_f64() * 1e3,
                "interval_ms": (at - self.last_at).as_secs_f64() * 1e3,
                "kvm_vm": kdelta(&self.last_vm, &vm),
                "kvm_vcpu": self
                    .last_vcpus
                    .iter()
                    .zip(&vcpus)
                    .map(|(a, b)| kdelta(a, b))
                    .collect::<Vec<_>>(),
                "guest": guest_v,
                "guest_error": guest_err,
            });
            writeln!(self.out, "{line}").map_err(LiveMetricsError::Write)?;
            self.out.flush().map_err(LiveMetricsError::Write)?;
            self.seq += 1;
        }
        self.last_at = at;
        if vm.is_some() {
            self.last_vm = vm;
        }
        for (last, now) in self.last_vcpus.iter_mut().zip(vcpus) {
            if now.is_some() {
                *last = now;
            }
        }
        // Only a valid snapshot becomes the next baseline; an invalid one is
        // reported in its line.
        self.last_guest = guest.ok().or(self.last_guest.take());
        Ok(())
    }
}

/// `[a-zA-Z0-9_]` only (OpenMetrics metric names; KVM's are already so).
fn metric_name(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// One counter family: `# TYPE`, `# HELP` and its `_total` samples.
fn counter_family(out: &mut String, name: &str, help: &str, samples: &[(String, u64)]) {
    out.push_str(&format!("# TYPE {name} counter\n# HELP {name} {help}\n"));
    for (labels, v) in samples {
        out.push_str(&format!("{name}_total{labels} {v}\n"));
    }
}

/// One OpenMetrics exposition of the cumulative values: KVM's VM and vCPU
/// stats (cumulative scalars only, as in the JSON lines), the guest's
/// telemetry counters summed over its CPUs, and the time since the metrics
/// thread started. Ends in `# EOF`.
pub fn openmetrics(
    at: Duration,
    vm: Option<&StatsSnapshot>,
    vcpus: &[Option<&StatsSnapshot>],
    guest: Option<&TelemetrySnapshot>,
) -> String {
    let mut out = String::new();
    out.push_str(
        "# TYPE ptiscope_metrics_elapsed_seconds gauge\n\
         # HELP ptiscope_metrics_elapsed_seconds Time since the metrics thread started.\n",
    );
    out.push_str(&format!(
        "ptiscope_metrics_elapsed_seconds {}\n",
        at.as_secs_f64()
    ));
    let scalars = |d: &StatsSnapshot| -> Vec<(String, u64)> {
        d.iter()
            .filter(|(desc, v)| desc.stat_type == StatType::Cumulative && v.len() == 1)
            .map(|(desc, v)| (desc.name.clone(), v[0]))
            .collect()
    };
    if let Some(vm) = vm {
        for (name, v) in scalars(vm) {
            counter_family(
                &mut out,
                &format!("ptiscope_kvm_vm_{}", metric_name(&name)),
                &format!("KVM VM stat {name}, cumulative since the VM was created."),
                &[(String::new(), v)],
            );
        }
    }
    // Families keyed by stat name, one sample per vCPU.
    let mut families: std::collections::BTreeMap<String, Vec<(String, u64)>> =
        std::collections::BTreeMap::new();
    for (i, vcpu) in vcpus.iter().enumerate() {
        let Some(vcpu) = vcpu else { continue };
        for (name, v) in scalars(vcpu) {
            families
                .entry(name)
                .or_default()
                .push((format!("{{vcpu=\"{i}\"}}"), v));
        }
    }
    for (name, samples) in families {
        counter_family(
            &mut out,
            &format!("ptiscope_kvm_{}", metric_name(&name)),
            &format!("KVM vCPU stat {name}, cumulative since the vCPU was created."),
            &samples,
        );
    }
    if let Some(g) = guest {
        let named = g.named_totals().chain([("cr3_writes", g.cr3_writes())]);
        for (name, v) in named {
            counter_family(
                &mut out,
                &format!("ptiscope_guest_{}", metric_name(name)),
                &format!(
                    "Guest-reported telemetry counter {name} (docs/telemetry-abi.md), summed over the guest's CPUs, since boot."
                ),
                &[(String::new(), v)],
            );
        }
    }
    out.push_str("# EOF\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_exposition_without_sources() {
        let text = openmetrics(Duration::from_millis(1500), None, &[None], None);
        assert_eq!(
            text,
            "# TYPE ptiscope_metrics_elapsed_seconds gauge\n\
             # HELP ptiscope_metrics_elapsed_seconds Time since the metrics thread started.\n\
             ptiscope_metrics_elapsed_seconds 1.5\n\
             # EOF\n"
        );
        let mut fam = String::new();
        counter_family(
            &mut fam,
            "ptiscope_kvm_exits",
            "help",
            &[("{vcpu=\"0\"}".into(), 7)],
        );
        assert_eq!(
            fam,
            "# TYPE ptiscope_kvm_exits counter\n# HELP ptiscope_kvm_exits help\nptiscope_kvm_exits_total{vcpu=\"0\"} 7\n"
        );
        assert_eq!(metric_name("a-b.c"), "a_b_c");
    }
}
