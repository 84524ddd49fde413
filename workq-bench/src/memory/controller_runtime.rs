//! P2-P4: the three benchmarks of controller-runtime's priority queue
//! (`pkg/controller/priorityqueue/priorityqueue_test.go`), the shapes Go controller authors
//! measure, on our in-memory queue of integers (`WorkQueue<u64>`, as `New[int]`):
//!
//! - **P2**, `BenchmarkAddLockContended`: 1,000,000 items (0..1,000,000) are added, then
//!   1,000 workers each get an item, hold it for 1 ms and mark it done, over and over, while
//!   the timed loop adds 0..1,000 again and again. Figures: each add's latency, p50 / p99 /
//!   max (Go's benchmark reports only the mean per 1,000 adds, which is `time/op` here),
//!   and how many get + done cycles the workers completed per second while it was timed
//!   (the contention the adds met). The workers are tasks on a tokio multi-thread runtime
//!   (one worker thread per core) awaiting `get()`, as goroutines are on Go's scheduler;
//!   tokio's `sleep(1 ms)` waits for the timer's next millisecond tick, so an item is held
//!   1-2 ms (Go's `time.Sleep(1 ms)` about 1.1 ms). The adds come from a plain thread. The
//!   timed loop starts once 1,000 items are being processed.
//! - **P3**, `BenchmarkAddGetDone`: on one thread, 1,000 adds (0..1,000), then 1,000 gets
//!   and dones; an op is that round. Figure: time per op.
//! - **P4**, `BenchmarkAddOnly`: on one thread, the same 1,000 adds (0..1,000) over and over
//!   (after the first op each is an add of a queued item). Figure: time per op.
//!
//! controller-runtime's own figures for these shapes, from its PR #3471, were taken on
//! another machine; the report shows them under the table for scale only ([`PUBLISHED`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use workq::WorkQueue;

use crate::ctx::Ctx;
use crate::report::{OURS, Sample};
use crate::util::{self, quantile};

/// `BenchmarkAddLockContended`.
pub(crate) const CONTENDED: &str = "P2";
/// `BenchmarkAddGetDone`.
pub(crate) const ADD_GET_DONE: &str = "P3";
/// `BenchmarkAddOnly`.
pub(crate) const ADD_ONLY: &str = "P4";
/// The three.
pub(crate) const IDS: [&str; 3] = [CONTENDED, ADD_GET_DONE, ADD_ONLY];

/// Items added per op, in every shape.
const PER_OP: u64 = 1_000;
/// Items queued before P2's workers start.
const PRELOADED: u64 = 1_000_000;
/// P2's workers.
const WORKERS: usize = 1_000;
/// How long a P2 worker holds an item.
const HOLD: Duration = Duration::from_millis(1);

/// controller-runtime's figures, for scale only.
pub(crate) const PUBLISHED: &str = "\
For scale only (another machine, another language): controller-runtime's priority queue on \
these shapes, from kubernetes-sigs/controller-runtime PR #3471 (closed unmerged), benchstat of \
10 runs on an Intel Core Ultra 7 165H, 8 threads; time per op of 1,000 adds (P2, P4) or of \
1,000 adds then 1,000 gets and dones (P3). Merged queue (main): P2 AddLockContended 121.87 us, \
P3 AddGetDone 1048.9 us, P4 AddOnly 91.11 us. Proposed in the PR: 45.08 us, 300.1 us, \
26.98 us. Go reports means only, no percentiles.";

/// Ops of P2, P3 and P4.
fn ops(quick: bool) -> (usize, usize, usize) {
    if quick {
        (200, 200, 2_000)
    } else {
        (2_000, 2_000, 20_000)
    }
}

/// P2: adds under contention.
pub(crate) fn run_contended(ctx: &Ctx<'_>) -> Result<Vec<Sample>, String> {
    ctx.step(&format!("{OURS}: {PRELOADED} queued, {WORKERS} workers"));
    let measured = contended(ops(ctx.quick).0);
    let sample = |metric, value| Sample::new(CONTENDED, OURS, metric, value);
    Ok(vec![
        sample("add_p50_us", measured.latency_us(0.50)),
        sample("add_p99_us", measured.latency_us(0.99)),
        sample("add_max_us", measured.latency_us(1.0)),
        sample("us_per_op", measured.us_per_op),
        sample("worker_cycles_per_s", measured.worker_cycles_per_s),
    ])
}

/// P3: a round of 1,000 adds then 1,000 gets and dones, on one thread.
pub(crate) fn run_add_get_done(ctx: &Ctx<'_>) -> Result<Vec<Sample>, String> {
    ctx.step(OURS);
    let ops = ops(ctx.quick).1;
    let queue: WorkQueue<u64> = WorkQueue::new();
    let start = Instant::now();
    for _ in 0..ops {
        for i in 0..PER_OP {
            queue.add(i);
        }
        for _ in 0..PER_OP {
            let lease = queue.try_get().map_err(|e| format!("P3: {e:?}"))?;
            drop(lease);
        }
    }
    let elapsed = start.elapsed();
    Ok(vec![
        Sample::new(ADD_GET_DONE, OURS, "us_per_op", per_op_us(elapsed, ops)),
        Sample::new(
            ADD_GET_DONE,
            OURS,
            "cycles_per_s",
            util::rate(ops * PER_OP as usize, elapsed),
        ),
    ])
}

/// P4: the same 1,000 adds over and over, on one thread.
pub(crate) fn run_add_only(ctx: &Ctx<'_>) -> Result<Vec<Sample>, String> {
    ctx.step(OURS);
    let ops = ops(ctx.quick).2;
    let queue: WorkQueue<u64> = WorkQueue::new();
    let start = Instant::now();
    for _ in 0..ops {
        for i in 0..PER_OP {
            queue.add(i);
        }
    }
    let elapsed = start.elapsed();
    if queue.len() != PER_OP as usize {
        return Err(format!("P4: {} items queued, not {PER_OP}", queue.len()));
    }
    Ok(vec![
        Sample::new(ADD_ONLY, OURS, "us_per_op", per_op_us(elapsed, ops)),
        Sample::new(
            ADD_ONLY,
            OURS,
            "adds_per_s",
            util::rate(ops * PER_OP as usize, elapsed),
        ),
    ])
}

fn per_op_us(elapsed: Duration, ops: usize) -> f64 {
    elapsed.as_secs_f64() * 1e6 / ops as f64
}

/// What P2 measured.
struct Contended {
    /// Every timed add's latency, in ns, sorted.
    latencies: Vec<i64>,
    us_per_op: f64,
    worker_cycles_per_s: f64,
}

impl Contended {
    fn latency_us(&self, q: f64) -> f64 {
        quantile(&self.latencies, q) as f64 / 1e3
    }
}

/// P2 with `ops` timed ops.
fn contended(ops: usize) -> Contended {
    let runtime = util::runtime();
    let queue: WorkQueue<u64> = WorkQueue::new();
    for i in 0..PRELOADED {
        queue.add(i);
    }
    let cycles = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (queue, cycles) = (queue.clone(), cycles.clone());
            runtime.spawn(async move {
                while let Some(lease) = queue.get().await {
                    tokio::time::sleep(HOLD).await;
                    drop(lease);
                    cycles.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    // Every worker holds an item before the clock starts, as Go's goroutines do by the time
    // its timed loop has run a while.
    let warm = Instant::now();
    while queue.processing_len() < WORKERS && warm.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut latencies = Vec::with_capacity(ops * PER_OP as usize);
    let cycles_before = cycles.load(Ordering::Relaxed);
    let start = Instant::now();
    for _ in 0..ops {
        for i in 0..PER_OP {
            let before = Instant::now();
            queue.add(i);
            latencies.push(before.elapsed().as_nanos() as i64);
        }
    }
    let elapsed = start.elapsed();
    let worker_cycles = cycles.load(Ordering::Relaxed) - cycles_before;
    // A shut-down queue still hands out what it holds (client-go's rule), nearly a million
    // items here: the workers are stopped instead.
    for worker in &workers {
        worker.abort();
    }
    runtime.block_on(async {
        for worker in workers {
            let _ = worker.await;
        }
    });
    latencies.sort_unstable();
    Contended {
        latencies,
        us_per_op: per_op_us(elapsed, ops),
        worker_cycles_per_s: worker_cycles as f64 / elapsed.as_secs_f64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p2_times_every_add_while_the_workers_cycle() {
        let measured = contended(5);
        assert_eq!(measured.latencies.len(), 5 * PER_OP as usize);
        assert!(measured.latencies.windows(2).all(|w| w[0] <= w[1]));
        assert!(measured.latency_us(0.5) <= measured.latency_us(1.0));
        assert!(measured.us_per_op > 0.0);
    }
}
