//! The ledger's boots run `--jobs` at a time: on a KVM one after the
//! other on the backend the runs were settled with (whose state, e.g. a
//! nested session, serves them all), under QEMU each worker on a backend
//! of its own (QEMU's holds none).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::model::Measure;
use crate::backend::Backend;

/// One boot's figures (or why none), and how long it took.
pub(super) type Outcome = (Result<Measure, String>, Duration);

/// Measures one job on a backend.
pub(super) type MeasureJob<'a, J> =
    &'a (dyn Fn(&dyn Backend, &J) -> Result<Measure, String> + Sync);

/// What the pool calls as each boot ends (progress).
pub(super) type OnDone<'a, J> = &'a (dyn Fn(&J, &Result<Measure, String>, Duration) + Sync);

/// Runs `jobs` `workers` at a time with `measure`; each result in the
/// job's place. One worker runs them here on `shared`; more each build
/// their own backend named `on`.
pub(super) fn pool<J: Sync>(
    jobs: &[J],
    workers: usize,
    on: crate::cli::Backend,
    shared: &dyn Backend,
    measure: MeasureJob<'_, J>,
    on_done: OnDone<'_, J>,
) -> Vec<Outcome> {
    let timed = |backend: &dyn Backend, job: &J| {
        let started = Instant::now();
        let r = measure(backend, job);
        let took = started.elapsed();
        on_done(job, &r, took);
        (r, took)
    };
    if workers <= 1 {
        return jobs.iter().map(|job| timed(shared, job)).collect();
    }
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Outcome>>> = Mutex::new(jobs.iter().map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..workers.min(jobs.len()) {
            scope.spawn(|| {
                let backend = crate::cli::BackendOpts::on(on.name()).backend();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = jobs.get(i) else { break };
                    let outcome = match &backend {
                        Ok(b) => timed(&**b, job),
                        Err(e) => {
                            let r = Err(e.to_string());
                            on_done(job, &r, Duration::ZERO);
                            (r, Duration::ZERO)
                        }
                    };
                    if let Ok(mut v) = results.lock() {
                        v[i] = Some(outcome);
                    }
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_default()
        .into_iter()
        .map(|r| r.unwrap_or_else(|| (Err("not run".into()), Duration::ZERO)))
        .collect()
}
