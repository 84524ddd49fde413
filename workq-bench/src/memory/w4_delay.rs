//! W4 delay: one producer calls `add_after` for 200,000 distinct keys (50,000 with
//! `--quick`), each with a delay drawn uniformly from [0, 2 s] ([0, 0.5 s] with `--quick`)
//! by a generator with a fixed seed; 2 consumers get + done and record each item's
//! lateness, the time of the get minus the intended ready time. Figures: add_after calls/s
//! (the producer's loop), lateness p50 / p99 / max in ms, and wall (release of the threads
//! until the last item is got).
//!
//! The intended ready time of an item is read on the producer just before its `add_after`
//! (clock read + delay), so the lateness includes nothing the queue is not responsible
//! for except that one clock read; the producer's rate includes it too (about 20 ns).
//!
//! Implementations, same run, same keys and delays:
//! - `workq`: the producer (the bench's main thread) calls `add_after`; 2 consumer
//!   threads `blocking_get`. The consumer that gets the last item shuts the queue down.
//! - `workq-async`: the same producer; 2 consumer tasks awaiting `get()` on a tokio
//!   multi-thread runtime.
//! - `tokio-util-delayqueue`: tokio-util's `DelayQueue`, which is neither `Sync` nor
//!   shared, fed by one task that owns it: the task inserts the keys in batches of 1,024,
//!   draining what has expired and yielding to the runtime between batches, then awaits
//!   the rest. That task is also the consumer, so the "2 consumers" do not apply; its
//!   add_after/s counts the insert calls only (the time spent draining between batches is
//!   left out).
//!
//! Caveats: `DelayQueue` runs on tokio's timer wheel, which rounds deadlines up to the
//! millisecond, so its lateness cannot go below about half a millisecond on average; ours
//! sleeps on a condition variable to the nanosecond and is limited by the OS's wake-up
//! latency. On a loaded machine, lateness tails measure the scheduler more than the queue.
//! Nothing is done per item, so the consumers are idle most of the time and lateness is
//! the queue's (and the OS's) alone.

use std::future::poll_fn;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::task::Poll;
use std::thread;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio_util::time::DelayQueue;
use workq::WorkQueue;

use crate::ctx::Ctx;
use crate::report::{DELAY_QUEUE, OURS, OURS_ASYNC, Sample};
use crate::util::{self, Key};

const ID: &str = "W4";
const CONSUMERS: usize = 2;
const SEED: u64 = 0x5745_3444; // "W4D"
/// Inserts between two drains of the `DelayQueue` task.
const BATCH: usize = 1024;

/// The keys and their delays.
struct Plan {
    keys: Vec<Key>,
    delays: Vec<Duration>,
}

/// What one implementation measured.
struct Outcome {
    add_after_per_s: f64,
    /// Lateness of every item, in nanoseconds (negative: handed out early).
    lateness: Vec<i64>,
    wall: Duration,
}

pub(crate) fn run(ctx: &Ctx<'_>) -> Vec<Sample> {
    let (n, max_delay) = if ctx.quick {
        (50_000, Duration::from_millis(500))
    } else {
        (200_000, Duration::from_secs(2))
    };
    let mut rng = StdRng::seed_from_u64(SEED);
    let max_ns = u64::try_from(max_delay.as_nanos()).expect("a short delay");
    let plan = Plan {
        keys: util::keys(n),
        delays: (0..n)
            .map(|_| Duration::from_nanos(rng.random_range(0..=max_ns)))
            .collect(),
    };
    let mut out = Vec::new();
    ctx.step(OURS);
    report(&mut out, OURS, ours(&plan, false));
    ctx.step(OURS_ASYNC);
    report(&mut out, OURS_ASYNC, ours(&plan, true));
    ctx.step(DELAY_QUEUE);
    report(&mut out, DELAY_QUEUE, delay_queue(&plan));
    out
}

fn report(out: &mut Vec<Sample>, imp: &'static str, mut outcome: Outcome) {
    outcome.lateness.sort_unstable();
    let early = outcome.lateness.iter().take_while(|&&l| l < 0).count();
    if early > 0 {
        eprintln!(
            "W4 {imp}: {early} item(s) handed out before their ready time (earliest by {} ns)",
            -outcome.lateness[0]
        );
    }
    let ms = |ns: i64| ns as f64 / 1e6;
    let l = &outcome.lateness;
    out.extend([
        Sample::new(ID, imp, "add_after_per_s", outcome.add_after_per_s),
        Sample::new(ID, imp, "lateness_p50_ms", ms(util::quantile(l, 0.50))),
        Sample::new(ID, imp, "lateness_p99_ms", ms(util::quantile(l, 0.99))),
        Sample::new(ID, imp, "lateness_max_ms", ms(util::quantile(l, 1.0))),
        Sample::new(ID, imp, "wall_s", outcome.wall.as_secs_f64()),
    ]);
}

/// Nanoseconds from `origin` to now.
fn since(origin: Instant) -> u64 {
    u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// What the producer and the consumers of our queue share.
struct Shared {
    queue: WorkQueue<Key>,
    /// Intended ready time of each key, in nanoseconds since `origin`. Written by the
    /// producer before each `add_after`, read by a consumer after its get, which the
    /// queue's lock orders after the add.
    deadlines: Vec<AtomicU64>,
    origin: Instant,
    /// Items got so far.
    got: AtomicUsize,
}

impl Shared {
    /// The lateness of `key`, got now.
    fn lateness(&self, key: &str) -> i64 {
        let now = since(self.origin);
        let due = self.deadlines[util::key_index(key)].load(Ordering::Relaxed);
        now as i64 - due as i64
    }

    /// Counts one item done; the consumer of the last one shuts the queue down.
    fn done_one(&self) {
        if self.got.fetch_add(1, Ordering::AcqRel) + 1 == self.deadlines.len() {
            self.queue.shut_down();
        }
    }

    fn produce(&self, plan: &Plan) -> f64 {
        let start = Instant::now();
        for (i, (key, &delay)) in plan.keys.iter().zip(&plan.delays).enumerate() {
            let at = since(self.origin) + u64::try_from(delay.as_nanos()).unwrap_or(0);
            self.deadlines[i].store(at, Ordering::Relaxed);
            self.queue.add_after(key.clone(), delay);
        }
        util::rate(plan.keys.len(), start.elapsed())
    }
}

fn ours(plan: &Plan, async_consumers: bool) -> Outcome {
    let n = plan.keys.len();
    let shared = Arc::new(Shared {
        queue: WorkQueue::new(),
        deadlines: (0..n).map(|_| AtomicU64::new(u64::MAX)).collect(),
        origin: Instant::now(),
        got: AtomicUsize::new(0),
    });
    let shared = &shared;
    let (add_after_per_s, late, wall) = if async_consumers {
        let rt = util::runtime();
        let consumers: Vec<_> = (0..CONSUMERS)
            .map(|_| {
                let shared = Arc::clone(shared);
                rt.spawn(async move {
                    let mut late = Vec::with_capacity(n);
                    while let Some(lease) = shared.queue.get().await {
                        late.push(shared.lateness(&lease));
                        black_box(&*lease);
                        drop(lease);
                        shared.done_one();
                    }
                    (late, Instant::now())
                })
            })
            .collect();
        let start = Instant::now();
        let add_after_per_s = shared.produce(plan);
        let (late, end) = rt.block_on(async {
            let mut all = Vec::with_capacity(n);
            let mut end = start;
            for c in consumers {
                let (late, t) = c.await.expect("consumer task");
                all.extend(late);
                end = end.max(t);
            }
            (all, end)
        });
        (add_after_per_s, late, end - start)
    } else {
        let barrier = Barrier::new(CONSUMERS + 1);
        thread::scope(|s| {
            let consumers: Vec<_> = (0..CONSUMERS)
                .map(|_| {
                    let barrier = &barrier;
                    s.spawn(move || {
                        let mut late = Vec::with_capacity(n);
                        barrier.wait();
                        while let Some(lease) = shared.queue.blocking_get() {
                            late.push(shared.lateness(&lease));
                            black_box(&*lease);
                            drop(lease);
                            shared.done_one();
                        }
                        (late, Instant::now())
                    })
                })
                .collect();
            barrier.wait();
            let start = Instant::now();
            let add_after_per_s = shared.produce(plan);
            let mut all = Vec::with_capacity(n);
            let mut end = start;
            for c in consumers {
                let (late, t) = c.join().expect("consumer");
                all.extend(late);
                end = end.max(t);
            }
            (add_after_per_s, all, end - start)
        })
    };
    assert_eq!(late.len(), n, "W4: every key is handed out once");
    Outcome {
        add_after_per_s,
        lateness: late,
        wall,
    }
}

fn delay_queue(plan: &Plan) -> Outcome {
    let n = plan.keys.len();
    let rt = util::runtime();
    let keys = plan.keys.clone();
    let delays = plan.delays.clone();
    let task = rt.spawn(async move {
        let mut queue: DelayQueue<Key> = DelayQueue::with_capacity(n);
        let mut deadlines = vec![0u64; n];
        let mut late = Vec::with_capacity(n);
        let origin = Instant::now();
        let record = |key: Key, deadlines: &[u64], late: &mut Vec<i64>| {
            let now = since(origin);
            late.push(now as i64 - deadlines[util::key_index(&key)] as i64);
            black_box(key);
        };
        let mut inserting = Duration::ZERO;
        for (batch, chunk) in keys.chunks(BATCH).enumerate() {
            let first = batch * BATCH;
            let t = Instant::now();
            for (j, key) in chunk.iter().enumerate() {
                let delay = delays[first + j];
                deadlines[first + j] = since(origin) + u64::try_from(delay.as_nanos()).unwrap_or(0);
                queue.insert(key.clone(), delay);
            }
            inserting += t.elapsed();
            while let Poll::Ready(Some(expired)) =
                poll_fn(|cx| Poll::Ready(queue.poll_expired(cx))).await
            {
                record(expired.into_inner(), &deadlines, &mut late);
            }
            tokio::task::yield_now().await;
        }
        while let Some(expired) = poll_fn(|cx| queue.poll_expired(cx)).await {
            record(expired.into_inner(), &deadlines, &mut late);
        }
        (util::rate(n, inserting), late, origin.elapsed())
    });
    let (add_after_per_s, late, wall) = rt.block_on(task).expect("delay queue task");
    assert_eq!(late.len(), n, "W4 DelayQueue: every key expires once");
    Outcome {
        add_after_per_s,
        lateness: late,
        wall,
    }
}
