//! W2 contended: 4 producer threads add 1,000,000 distinct keys in all (200,000 with
//! `--quick`), each a quarter of them; 4 consumers get + done until all are seen. Figure:
//! items/s, from the release of all threads until the last consumer is finished.
//!
//! Implementations, same run, same keys:
//! - `workq`: 4 producer threads (`add`), 4 consumer threads (`blocking_get`, lease
//!   drop); the last producer to finish calls `shut_down` and consumers drain until `None`.
//! - `workq-async`: the same producers; 4 consumer tasks awaiting `get()` on a tokio
//!   multi-thread runtime with one worker per core.
//! - `limit-single-thread`: W1's, on the same keys: one thread doing client-go's add / get /
//!   done with no lock, the most one core can do with the cycle (the goal for W2 is a share of
//!   it, as for W1).
//! - `crossbeam-channel`: one unbounded channel, 4 sending threads, 4 receiving threads.
//!
//! Caveats: 8 busy threads on a 2-core machine spend much of their time preempted; a
//! thread preempted while it holds the queue's lock stalls the others (crossbeam's channel
//! is lock-free and does not suffer this). The figure is as much about the scheduler as
//! about the queue, which is why it is only compared within one run.

use std::hint::black_box;
use std::sync::Barrier;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::Instant;

use workq::WorkQueue;

use crate::ctx::Ctx;
use crate::report::{CROSSBEAM, LIMIT, OURS, OURS_ASYNC, Sample};
use crate::util::{self, Key, Span};

const ID: &str = "W2";
const METRIC: &str = "items_per_s";
const PRODUCERS: usize = 4;
const CONSUMERS: usize = 4;

pub(crate) fn run(ctx: &Ctx<'_>) -> Vec<Sample> {
    let n = if ctx.quick { 200_000 } else { 1_000_000 };
    let keys = util::keys(n);
    let mut out = Vec::new();
    ctx.step(OURS);
    out.push(Sample::new(ID, OURS, METRIC, ours_sync(&keys)));
    ctx.step(OURS_ASYNC);
    out.push(Sample::new(ID, OURS_ASYNC, METRIC, ours_async(&keys)));
    ctx.step(LIMIT);
    out.push(Sample::new(
        ID,
        LIMIT,
        METRIC,
        super::w1_fifo::limit_single_thread(&keys),
    ));
    ctx.step(CROSSBEAM);
    out.push(Sample::new(ID, CROSSBEAM, METRIC, crossbeam(&keys)));
    out
}

/// Each producer's share of the keys.
fn shares(keys: &[Key]) -> impl Iterator<Item = &[Key]> {
    keys.chunks(keys.len().div_ceil(PRODUCERS))
}

/// Starts the producers on `queue`; the last one to finish shuts the queue down. Each
/// returns its start time.
fn spawn_producers<'s>(
    s: &'s thread::Scope<'s, '_>,
    keys: &'s [Key],
    queue: &'s WorkQueue<Key>,
    barrier: &'s Barrier,
    remaining: &'s AtomicUsize,
) -> Vec<thread::ScopedJoinHandle<'s, Span>> {
    shares(keys)
        .map(|share| {
            s.spawn(move || {
                let start = util::go(barrier);
                for key in share {
                    queue.add(key.clone());
                }
                if remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                    queue.shut_down();
                }
                Span::starting(start)
            })
        })
        .collect()
}

/// Joins threads that return (items seen, span); adds up the items, merges the spans.
fn join_all<'s>(
    handles: impl IntoIterator<Item = thread::ScopedJoinHandle<'s, (usize, Span)>>,
) -> (usize, Option<Span>) {
    handles
        .into_iter()
        .map(|h| h.join().expect("a bench thread"))
        .fold((0, None), |(n, span), (seen, s)| {
            (n + seen, Some(span.map_or(s, |span: Span| span.merge(s))))
        })
}

fn ours_sync(keys: &[Key]) -> f64 {
    let queue: WorkQueue<Key> = WorkQueue::new();
    let producers = shares(keys).count();
    let barrier = Barrier::new(producers + CONSUMERS);
    let remaining = AtomicUsize::new(producers);
    thread::scope(|s| {
        let consumers: Vec<_> = (0..CONSUMERS)
            .map(|_| {
                s.spawn(|| {
                    let start = util::go(&barrier);
                    let seen = util::drain_blocking(&queue);
                    (seen, Span::new(start, Instant::now()))
                })
            })
            .collect();
        let producers = spawn_producers(s, keys, &queue, &barrier, &remaining);
        let started = util::join_producers(producers);
        let (seen, span) = join_all(consumers);
        assert_eq!(seen, keys.len(), "W2: every key is handed out once");
        util::rate(seen, started.merge(span.expect("consumers")).elapsed())
    })
}

fn ours_async(keys: &[Key]) -> f64 {
    let rt = util::runtime();
    let queue: WorkQueue<Key> = WorkQueue::new();
    // The consumers wait in `get()` before the producers start the clock.
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|_| {
            let queue = queue.clone();
            rt.spawn(async move {
                let seen = util::drain_async(&queue).await;
                (seen, Instant::now())
            })
        })
        .collect();
    let producers = shares(keys).count();
    let barrier = Barrier::new(producers);
    let remaining = AtomicUsize::new(producers);
    thread::scope(|s| {
        let producers = spawn_producers(s, keys, &queue, &barrier, &remaining);
        let started = util::join_producers(producers);
        let (seen, end) = rt.block_on(async {
            let mut total = (0, started);
            for c in consumers {
                let (seen, end) = c.await.expect("consumer task");
                total = (total.0 + seen, total.1.merge(Span::new(end, end)));
            }
            total
        });
        assert_eq!(seen, keys.len(), "W2 async: every key is handed out once");
        util::rate(seen, end.elapsed())
    })
}

fn crossbeam(keys: &[Key]) -> f64 {
    let (tx, rx) = crossbeam_channel::unbounded::<Key>();
    let producers = shares(keys).count();
    let barrier = Barrier::new(producers + CONSUMERS);
    thread::scope(|s| {
        let consumers: Vec<_> = (0..CONSUMERS)
            .map(|_| {
                let rx = rx.clone();
                let barrier = &barrier;
                s.spawn(move || {
                    let start = util::go(barrier);
                    let mut seen = 0usize;
                    for key in &rx {
                        black_box(&key);
                        seen += 1;
                    }
                    (seen, Span::new(start, Instant::now()))
                })
            })
            .collect();
        drop(rx);
        let producers: Vec<_> = shares(keys)
            .map(|share| {
                let tx = tx.clone();
                let barrier = &barrier;
                s.spawn(move || {
                    let start = util::go(barrier);
                    for key in share {
                        tx.send(key.clone()).expect("receivers alive");
                    }
                    Span::starting(start)
                })
            })
            .collect();
        drop(tx);
        let started = util::join_producers(producers);
        let (seen, span) = join_all(consumers);
        assert_eq!(seen, keys.len());
        util::rate(seen, started.merge(span.expect("consumers")).elapsed())
    })
}
