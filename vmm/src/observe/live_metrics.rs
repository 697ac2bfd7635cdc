//! `--metrics-interval MS`: a thread that reads the KVM stats fds (VM and
//! vCPU; a stats fd can be read from any thread) and the guest telemetry
//! page every MS milliseconds while the guest runs, and writes one JSON line
//! per interval with the changes since the previous line (as Firecracker's
//! metrics flush does), flushing each line so a FIFO reader sees it at once.
//! Format: docs/report-json.md, "`ptiscope.metrics/1`".

use std::io::Write;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::machine::VmContext;
use crate::observe::kvm_stats::{self, KvmStats, StatType, StatsSnapshot};
use crate::observe::telemetry::{self, TelemetryReader, TelemetrySnapshot};

/// Schema id of every line.
pub const SCHEMA: &str = "ptiscope.metrics/1";
/// Smallest interval accepted (a line per millisecond is already a lot).
pub const MIN_INTERVAL: Duration = Duration::from_millis(1);

/// Where and how often.
pub struct LiveMetricsConfig {
    pub interval: Duration,
    pub out: Box<dyn Write + Send>,
}

/// Errors of the live-metrics thread.
#[derive(Debug, thiserror::Error)]
pub enum LiveMetricsError {
    #[error("cannot open the KVM stats fds: {0}")]
    Stats(#[from] kvm_stats::KvmStatsError),
    #[error("cannot start the metrics thread: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("writing a metrics line: {0}")]
    Write(#[source] std::io::Error),
    #[error("the metrics thread panicked")]
    Panicked,
    #[error(transparent)]
    Sandbox(#[from] crate::sandbox::SandboxError),
}

/// A running metrics thread.
pub struct LiveMetrics {
    stop: mpsc::Sender<()>,
    handle: JoinHandle<Result<u64, LiveMetricsError>>,
}

struct State {
    vm: KvmStats,
    vcpu: KvmStats,
    mem: GuestMemoryMmap,
    telemetry_gpa: GuestAddress,
    out: Box<dyn Write + Send>,
    start: Instant,
    seq: u64,
    last_at: Duration,
    last_vm: Option<StatsSnapshot>,
    last_vcpu: Option<StatsSnapshot>,
    last_guest: Option<TelemetrySnapshot>,
}

impl LiveMetrics {
    /// Opens its own stats fds and starts the thread (called from the
    /// observer's `on_start`, before the first KVM_RUN).
    pub fn start(cfg: LiveMetricsConfig, ctx: &VmContext<'_>) -> Result<Self, LiveMetricsError> {
        let mut st = State {
            vm: KvmStats::from_vm(ctx.vm)?,
            vcpu: KvmStats::from_vcpu(ctx.vcpu)?,
            // GuestMemoryMmap is a set of reference-counted mappings: the
            // clone keeps them alive for the thread.
            mem: ctx.mem.clone(),
            telemetry_gpa: GuestAddress(ctx.layout.telemetry_addr()),
            out: cfg.out,
            start: Instant::now(),
            seq: 0,
            last_at: Duration::ZERO,
            last_vm: None,
            last_vcpu: None,
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
        Ok(LiveMetrics { stop, handle })
    }

    /// Stops the thread after a final line; returns the lines written.
    pub fn finish(self, _ctx: &VmContext<'_>) -> Result<u64, LiveMetricsError> {
        let _ = self.stop.send(());
        self.handle.join().map_err(|_| LiveMetricsError::Panicked)?
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
        let vcpu = self.vcpu.read().ok();
        let guest = TelemetryReader::new(&self.mem, self.telemetry_gpa).and_then(|r| r.snapshot());
        if emit {
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
                "kvm_vcpu": [kdelta(&self.last_vcpu, &vcpu)],
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
        if vcpu.is_some() {
            self.last_vcpu = vcpu;
        }
        // Only a valid snapshot becomes the next baseline; an invalid one is
        // reported in its line.
        self.last_guest = guest.ok().or(self.last_guest.take());
        Ok(())
    }
}
