//! W8, noisy neighbour, the way `wq-bench` runs it on our queues
//! (`workq-bench/src/noisy/`): one group's burst of NOISY jobs in batches of 100, each as
//! soon as the last is added, then QUIET jobs of 100 quiet groups at 1,000 a second (every
//! millisecond, the ones due by then in one batch); workers with the workload's concurrency
//! in this process, the handler sleeping HANDLER_MS. None of the peers has groups in its open
//! edition, so every figure here is plain FIFO: the quiet jobs wait behind the burst.
//!
//! Figures: the quiet jobs' pickup (from the acknowledgement of the add to the start of the
//! handler, the closest a peer shows to a hand-out; 0 if it came first), and items/s, every
//! job's and the noisy group's, from the burst's first add to the last handler's end (a peer
//! does not say when it has recorded a completion). Job ids: the noisy ones `0..NOISY`, the
//! quiet ones after.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::drive::{ADD_BATCH, Figures, add, quantile_ms, queue_name, wait_until};
use crate::peer::{Handler, Job, Peer, Result};

/// Quiet jobs a second, in all.
const QUIET_PER_S: f64 = 1_000.0;
/// How often the quiet producer adds what is due.
const TICK: Duration = Duration::from_millis(1);

/// What the handlers record, in nanoseconds since the phase's start (0: not yet).
struct Log {
    start: Instant,
    noisy: u64,
    /// When each quiet job's add was acknowledged.
    acked: Box<[AtomicU64]>,
    /// When each quiet job's handler started.
    handed: Box<[AtomicU64]>,
    ended: AtomicUsize,
    last_end: AtomicU64,
    last_noisy_end: AtomicU64,
}

impl Log {
    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

/// W8 with `noisy` and `quiet` jobs, `workers` at a time, each handler sleeping `handler_ms`.
pub(crate) async fn w8<P: Peer>(
    url: &str,
    noisy: usize,
    quiet: usize,
    workers: usize,
    handler_ms: u64,
) -> Result<Figures> {
    let queue = P::open(url, &queue_name("w8")).await?;
    queue.delete().await?;
    let zeros = || (0..quiet).map(|_| AtomicU64::new(0)).collect();
    let log = Arc::new(Log {
        start: Instant::now(),
        noisy: noisy as u64,
        acked: zeros(),
        handed: zeros(),
        ended: AtomicUsize::new(0),
        last_end: AtomicU64::new(0),
        last_noisy_end: AtomicU64::new(0),
    });
    let handler: Handler = {
        let log = log.clone();
        Arc::new(move |id| {
            let log = log.clone();
            Box::pin(async move {
                let quiet = id.checked_sub(log.noisy).map(|q| q as usize);
                if let Some(slot) = quiet.and_then(|q| log.handed.get(q)) {
                    let _ =
                        slot.compare_exchange(0, log.now(), Ordering::Relaxed, Ordering::Relaxed);
                }
                if handler_ms > 0 {
                    // A thread's sleep, as our workers' handler.
                    let pause = Duration::from_millis(handler_ms);
                    let _ = tokio::task::spawn_blocking(move || std::thread::sleep(pause)).await;
                }
                let now = log.now();
                log.last_end.fetch_max(now, Ordering::Relaxed);
                if quiet.is_none() {
                    log.last_noisy_end.fetch_max(now, Ordering::Relaxed);
                }
                log.ended.fetch_add(1, Ordering::Release);
            })
        })
    };
    let running = queue.work(workers, handler).await?;
    let ids: Vec<Job> = (0..(noisy + quiet) as u64).map(Job::now).collect();
    // Throughput counts from the burst's first add, as ours does, not from the workers' start.
    let first_add = log.now();
    for chunk in ids[..noisy].chunks(ADD_BATCH) {
        add(&queue, chunk).await?;
    }
    let started = Instant::now();
    let mut added = 0;
    while added < quiet {
        let due = ((started.elapsed().as_secs_f64() * QUIET_PER_S) as usize + 1).min(quiet);
        if due > added {
            add(&queue, &ids[noisy + added..noisy + due]).await?;
            let now = log.now();
            for slot in &log.acked[added..due] {
                slot.store(now, Ordering::Relaxed);
            }
            added = due;
        }
        tokio::time::sleep(TICK).await;
    }
    wait_until("W8's drain", Duration::from_millis(5), async || {
        Ok(log.ended.load(Ordering::Acquire) >= noisy + quiet)
    })
    .await?;
    running.stop().await?;
    queue.delete().await?;
    let mut pickups = Vec::with_capacity(quiet);
    for (acked, handed) in log.acked.iter().zip(log.handed.iter()) {
        let handed = handed.load(Ordering::Relaxed);
        if handed == 0 {
            return Err("a quiet job never ran".into());
        }
        let pickup = handed.saturating_sub(acked.load(Ordering::Relaxed));
        pickups.push(i64::try_from(pickup).unwrap_or(i64::MAX));
    }
    pickups.sort_unstable();
    let quantile = |q: f64| quantile_ms(&pickups, q);
    let per_s = |count: usize, ns: &AtomicU64| {
        let elapsed = ns.load(Ordering::Relaxed).saturating_sub(first_add).max(1);
        count as f64 / (elapsed as f64 / 1e9)
    };
    Ok(vec![
        ("quiet_pickup_p50_ms", quantile(0.50)),
        ("quiet_pickup_p99_ms", quantile(0.99)),
        ("quiet_pickup_max_ms", quantile(1.0)),
        ("items_per_s", per_s(noisy + quiet, &log.last_end)),
        ("noisy_items_per_s", per_s(noisy, &log.last_noisy_end)),
    ])
}
