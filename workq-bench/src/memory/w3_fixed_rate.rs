//! W3R, W3 at a fixed consumer rate: W3's 4 producer threads each add the same 1,000 keys
//! over and over, 1,000,000 adds in all (200,000 with `--quick`), while its 2 consumer
//! threads get + done at a fixed rate, 50,000 deliveries a second each. Figures: adds/s (as
//! W3's), deliveries, and deliveries/s (the consumers' rate, which should be the fixed one).
//!
//! Why: W3's adds/s depends on how fast the consumers take items out. An add of a key that is
//! queued is a lookup; an add of a key that was taken out is an insert (or, while it is
//! processed, a dirty mark), several times the work. A queue whose consumers run faster
//! takes more keys out between adds, so its producers do more of the costly adds and it
//! delivers more: in one sitting ours delivered 4.7 times what client-go delivered, and
//! added at 0.67 of its rate. With the consumers held to the same rate, every queue sees
//! the same share of queued keys, so adds/s compares like with like, as long as the queue
//! can deliver at that rate (check deliveries/s).
//!
//! The consumers are paced by a schedule: the n-th delivery of a consumer is not taken before
//! start + n / rate; a consumer ahead of its schedule by a millisecond or more sleeps until
//! it is due (a sleep per item would be shorter than the OS's timer can sleep), so deliveries
//! come in bursts of up to 50 within each millisecond.
//!
//! Implementations:
//! - `workq`: 4 producer threads and 2 consumer threads, as W3 (6 threads on the machine's
//!   cores: a thread that finds the lock held parks in the kernel).
//! - `workq-async`: the same 4 producers and 2 consumers as tasks on a tokio runtime with one
//!   worker thread per core, each producer letting the others run every [`TURN`] adds. This
//!   is the shape a Go program has: goroutines on as many threads as cores (`GOMAXPROCS`),
//!   so no more threads contend for the lock than there are cores.
//!
//! client-go's workqueue is not in this bench: its figures come from a Go port of the
//! workloads that is not in the repository (docs/benchmarks.md, "W3 like with like").

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use workq::WorkQueue;

use crate::ctx::Ctx;
use crate::report::{OURS, OURS_ASYNC, Sample};
use crate::util::{self, Key, Span};

/// The workload's id.
pub(crate) const ID: &str = "W3R";
const KEYS: usize = 1_000;
const PRODUCERS: usize = 4;
const CONSUMERS: usize = 2;
/// Deliveries per second, both consumers together.
pub(crate) const RATE: f64 = 100_000.0;
/// How far ahead of its schedule a consumer may run before it sleeps.
const SLACK: Duration = Duration::from_millis(1);
/// Adds an async producer makes before it lets the other tasks of its worker thread run (an
/// add never awaits, so a producer that did not yield would keep its thread to the end).
const TURN: usize = 256;

pub(crate) fn run(ctx: &Ctx<'_>) -> Vec<Sample> {
    let adds = if ctx.quick { 200_000 } else { 1_000_000 };
    let keys = util::keys(KEYS);
    ctx.step(OURS);
    let mut out = samples(OURS, ours(&keys, adds, RATE));
    ctx.step(OURS_ASYNC);
    out.extend(samples(OURS_ASYNC, ours_async(&keys, adds, RATE)));
    out
}

/// The samples of one implementation's (adds/s, deliveries, deliveries/s).
fn samples(
    name: &'static str,
    (adds_per_s, deliveries, deliveries_per_s): (f64, usize, f64),
) -> Vec<Sample> {
    vec![
        Sample::new(ID, name, "adds_per_s", adds_per_s),
        Sample::new(ID, name, "deliveries", deliveries as f64),
        Sample::new(ID, name, "deliveries_per_s", deliveries_per_s),
    ]
}

/// How long a consumer started at `start` should wait before its `n`-th delivery at `rate`:
/// `None` unless it is ahead of its schedule by more than [`SLACK`].
fn ahead(start: Instant, n: usize, rate: f64) -> Option<Duration> {
    let due = Duration::try_from_secs_f64(n as f64 / rate).unwrap_or(Duration::MAX);
    Some(due.saturating_sub(start.elapsed())).filter(|ahead| *ahead > SLACK)
}

/// Waits until the `n`-th delivery of a consumer started at `start` is due at `rate`.
fn pace(start: Instant, n: usize, rate: f64) {
    if let Some(ahead) = ahead(start, n, rate) {
        thread::sleep(ahead);
    }
}

/// Returns adds/s, deliveries and deliveries/s.
fn ours(keys: &[Key], adds: usize, rate: f64) -> (f64, usize, f64) {
    let queue: WorkQueue<Key> = WorkQueue::new();
    let per_producer = adds / PRODUCERS;
    let per_consumer = rate / CONSUMERS as f64;
    let barrier = Barrier::new(PRODUCERS + CONSUMERS);
    let remaining = AtomicUsize::new(PRODUCERS);
    thread::scope(|s| {
        let consumers: Vec<_> = (0..CONSUMERS)
            .map(|_| {
                s.spawn(|| {
                    let start = util::go(&barrier);
                    let mut seen = 0;
                    while let Some(lease) = queue.blocking_get() {
                        drop(lease);
                        seen += 1;
                        pace(start, seen, per_consumer);
                    }
                    (seen, Span::new(start, Instant::now()))
                })
            })
            .collect();
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let (queue, barrier, remaining) = (&queue, &barrier, &remaining);
                s.spawn(move || {
                    let start = util::go(barrier);
                    let mut i = p * keys.len() / PRODUCERS;
                    for _ in 0..per_producer {
                        queue.add(keys[i].clone());
                        i = (i + 1) % keys.len();
                    }
                    let end = Instant::now();
                    if remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                        queue.shut_down();
                    }
                    Span::new(start, end)
                })
            })
            .collect();
        let adding = util::join_producers(producers);
        let (deliveries, consuming) = consumers
            .into_iter()
            .map(|c| c.join().expect("consumer"))
            .fold((0, None::<Span>), |(n, span), (seen, s)| {
                (n + seen, Some(span.map_or(s, |span| span.merge(s))))
            });
        assert!(deliveries >= keys.len(), "W3R: every key is handed out");
        let consuming = consuming.expect("consumers");
        (
            util::rate(per_producer * PRODUCERS, adding.elapsed()),
            deliveries,
            util::rate(deliveries, consuming.elapsed()),
        )
    })
}

/// [`ours`] with the producers and consumers as tasks on a runtime with a worker thread per
/// core. Returns adds/s, deliveries and deliveries/s.
fn ours_async(keys: &[Key], adds: usize, rate: f64) -> (f64, usize, f64) {
    let rt = util::runtime();
    let queue: WorkQueue<Key> = WorkQueue::new();
    let per_producer = adds / PRODUCERS;
    let per_consumer = rate / CONSUMERS as f64;
    let remaining = Arc::new(AtomicUsize::new(PRODUCERS));
    // One copy of the keys for every producer task (the tasks are `'static`, so they cannot
    // borrow them as the threads of `ours` do).
    let keys: Arc<[Key]> = keys.into();
    // Every task waits for the same start, as the threads of `ours` wait at their barrier.
    let (go, _) = tokio::sync::watch::channel(false);
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|_| {
            let (queue, mut started) = (queue.clone(), go.subscribe());
            rt.spawn(async move {
                let _ = started.wait_for(|go| *go).await;
                let start = Instant::now();
                let mut seen = 0;
                while let Some(lease) = queue.get().await {
                    drop(lease);
                    seen += 1;
                    if let Some(ahead) = ahead(start, seen, per_consumer) {
                        tokio::time::sleep(ahead).await;
                    }
                }
                (seen, Span::new(start, Instant::now()))
            })
        })
        .collect();
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let (queue, keys, remaining) = (queue.clone(), keys.clone(), remaining.clone());
            let mut started = go.subscribe();
            rt.spawn(async move {
                let _ = started.wait_for(|go| *go).await;
                let start = Instant::now();
                let mut i = p * keys.len() / PRODUCERS;
                for n in 1..=per_producer {
                    queue.add(keys[i].clone());
                    i = (i + 1) % keys.len();
                    if n % TURN == 0 {
                        tokio::task::yield_now().await;
                    }
                }
                let end = Instant::now();
                if remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                    queue.shut_down();
                }
                Span::new(start, end)
            })
        })
        .collect();
    go.send_replace(true);
    rt.block_on(async {
        let mut adding: Option<Span> = None;
        for producer in producers {
            let span = producer.await.expect("producer task");
            adding = Some(adding.map_or(span, |a| a.merge(span)));
        }
        let mut consuming: Option<Span> = None;
        let mut deliveries = 0;
        for consumer in consumers {
            let (seen, span) = consumer.await.expect("consumer task");
            deliveries += seen;
            consuming = Some(consuming.map_or(span, |c| c.merge(span)));
        }
        assert!(
            deliveries >= keys.len(),
            "W3R async: every key is handed out"
        );
        (
            util::rate(
                per_producer * PRODUCERS,
                adding.expect("producers").elapsed(),
            ),
            deliveries,
            util::rate(deliveries, consuming.expect("consumers").elapsed()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_consumers_keep_to_the_fixed_rate() {
        let keys = util::keys(KEYS);
        // 2,000 deliveries a second: the consumers, not the queue, decide the rate.
        let (adds_per_s, deliveries, deliveries_per_s) = ours(&keys, 40_000, 2_000.0);
        assert!(adds_per_s > 0.0);
        assert!(deliveries >= KEYS);
        assert!(
            deliveries_per_s < 2_000.0 * 1.25,
            "{deliveries_per_s} deliveries/s at a rate of 2,000"
        );
    }

    #[test]
    fn the_async_consumers_keep_to_the_fixed_rate_and_every_key_comes_out() {
        let keys = util::keys(KEYS);
        let (adds_per_s, deliveries, deliveries_per_s) = ours_async(&keys, 40_000, 2_000.0);
        assert!(adds_per_s > 0.0);
        assert!(
            (KEYS..=40_000).contains(&deliveries),
            "{deliveries} deliveries"
        );
        assert!(
            deliveries_per_s < 2_000.0 * 1.25,
            "{deliveries_per_s} deliveries/s at a rate of 2,000"
        );
    }
}
