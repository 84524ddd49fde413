//! W1 fifo: one producer thread adds 1,000,000 distinct keys (200,000 with `--quick`); one
//! consumer does get + done until it has seen them all. Figure: items/s, from the moment
//! both threads are released until the consumer has finished with the last item.
//!
//! Implementations, all in the same run and on the same prebuilt keys:
//! - `workq`: `add` on the producer thread, `blocking_get` + lease drop on the consumer.
//!   The producer calls `shut_down` after its last add; the consumer drains until `None`.
//! - `workq-async`: the same, the consumer being a task on a tokio multi-thread runtime
//!   (one worker per core) awaiting `get()`. The producer stays a plain thread: `add` never
//!   blocks, and a task that adds in a tight loop would pin a worker.
//! - `limit-single-thread`: client-go's add / get / done logic on one thread with a
//!   `VecDeque` and two hash sets (`dirty`, `processing`, foldhash), no locks, each key
//!   added then at once got and done. The sets never hold more than one key, so this is
//!   the most one core can do with the cycle: no lock, no second core, no cache misses
//!   but the key's own bytes. Adding all keys first and then draining them runs about ten
//!   times slower (a set of 1,000,000 keys misses the cache on every operation), which is
//!   the regime our queue is in when its producer runs ahead: in this workload the
//!   producer (one lock round per item) outruns the consumer (two), and the queue holds
//!   tens to hundreds of thousands of items.
//! - `limit-fill-drain`: the same logic on one thread, no locks, but all the keys are added
//!   first (to the `dirty` set and the `VecDeque`) and then drained (get + done each). That
//!   is the backlog our queue holds when its producer runs ahead, without the lock or the
//!   second core: what the backlog itself costs (its sets no longer fit in the caches).
//! - `crossbeam-channel`: an unbounded channel moving the same keys from one thread to
//!   another; a good transport that does no dedup.
//!
//! Caveats: on 2 cores the producer, the consumer and anything else running share the
//! cores, so the figures move with the machine's load. How far the producer runs ahead
//! changes how large the queue grows (and so its cache footprint); that is part of what is
//! measured. The channel's consumer does one lock-free operation per item where ours takes
//! the queue's lock twice (get, then done), so the ratio to it is mostly the cost of
//! moving the lock's cache line between cores.

use std::collections::{HashSet, VecDeque};
use std::hint::black_box;
use std::sync::Barrier;
use std::thread;
use std::time::Instant;

use workq::WorkQueue;

use crate::ctx::Ctx;
use crate::report::{CROSSBEAM, LIMIT, LIMIT_FILL_DRAIN, OURS, OURS_ASYNC, Sample};
use crate::util::{self, Key, Span};

const ID: &str = "W1";
const METRIC: &str = "items_per_s";

pub(crate) fn run(ctx: &Ctx<'_>) -> Vec<Sample> {
    let n = if ctx.quick { 200_000 } else { 1_000_000 };
    let keys = util::keys(n);
    let mut out = Vec::new();
    ctx.step(OURS);
    out.push(Sample::new(ID, OURS, METRIC, ours_sync(&keys)));
    ctx.step(OURS_ASYNC);
    out.push(Sample::new(ID, OURS_ASYNC, METRIC, ours_async(&keys)));
    ctx.step(LIMIT);
    out.push(Sample::new(ID, LIMIT, METRIC, limit_single_thread(&keys)));
    ctx.step(LIMIT_FILL_DRAIN);
    out.push(Sample::new(
        ID,
        LIMIT_FILL_DRAIN,
        METRIC,
        limit_fill_drain(&keys),
    ));
    ctx.step(CROSSBEAM);
    out.push(Sample::new(ID, CROSSBEAM, METRIC, crossbeam(&keys)));
    out
}

fn ours_sync(keys: &[Key]) -> f64 {
    let queue: WorkQueue<Key> = WorkQueue::new();
    let barrier = Barrier::new(2);
    thread::scope(|s| {
        let consumer = s.spawn(|| {
            let start = util::go(&barrier);
            let seen = util::drain_blocking(&queue);
            (seen, Span::new(start, Instant::now()))
        });
        let producer = s.spawn(|| {
            let start = util::go(&barrier);
            for key in keys {
                queue.add(key.clone());
            }
            queue.shut_down();
            Span::starting(start)
        });
        let started = producer.join().expect("producer");
        let (seen, span) = consumer.join().expect("consumer");
        assert_eq!(seen, keys.len(), "W1: every key is handed out once");
        util::rate(seen, span.merge(started).elapsed())
    })
}

fn ours_async(keys: &[Key]) -> f64 {
    let rt = util::runtime();
    let queue: WorkQueue<Key> = WorkQueue::new();
    // The consumer waits in `get()` before the producer starts the clock.
    let consumer = {
        let queue = queue.clone();
        rt.spawn(async move {
            let seen = util::drain_async(&queue).await;
            (seen, Instant::now())
        })
    };
    thread::scope(|s| {
        let producer = s.spawn(|| {
            let start = Instant::now();
            for key in keys {
                queue.add(key.clone());
            }
            queue.shut_down();
            start
        });
        let start = producer.join().expect("producer");
        let (seen, end) = rt.block_on(consumer).expect("consumer task");
        assert_eq!(seen, keys.len(), "W1 async: every key is handed out once");
        util::rate(seen, Span::new(start, end).elapsed())
    })
}

/// client-go's `queue.go` on one thread, no lock: each key is added, then got and done.
/// W2's limit too: the same keys, the same work, whatever the number of threads.
pub(super) fn limit_single_thread(keys: &[Key]) -> f64 {
    type Set = HashSet<Key, foldhash::fast::RandomState>;
    let mut queue: VecDeque<Key> = VecDeque::new();
    let mut dirty = Set::default();
    let mut processing = Set::default();
    let mut seen = 0usize;
    let start = Instant::now();
    for key in keys {
        // Add
        if !dirty.insert(key.clone()) {
            continue;
        }
        if processing.contains(key) {
            continue;
        }
        queue.push_back(key.clone());
        while let Some(item) = queue.pop_front() {
            // Get
            dirty.remove(&item);
            processing.insert(item.clone());
            black_box(&item);
            seen += 1;
            // Done
            processing.remove(&item);
            if dirty.contains(&item) {
                queue.push_back(item);
            }
        }
    }
    let elapsed = start.elapsed();
    assert_eq!(seen, keys.len());
    util::rate(seen, elapsed)
}

/// [`limit_single_thread`]'s logic with the backlog held: every key is added first, then the
/// queue is drained (get + done each).
fn limit_fill_drain(keys: &[Key]) -> f64 {
    type Set = HashSet<Key, foldhash::fast::RandomState>;
    let mut queue: VecDeque<Key> = VecDeque::new();
    let mut dirty = Set::default();
    let mut processing = Set::default();
    let mut seen = 0usize;
    let start = Instant::now();
    for key in keys {
        // Add
        if dirty.insert(key.clone()) && !processing.contains(key) {
            queue.push_back(key.clone());
        }
    }
    while let Some(item) = queue.pop_front() {
        // Get
        dirty.remove(&item);
        processing.insert(item.clone());
        black_box(&item);
        seen += 1;
        // Done
        processing.remove(&item);
        if dirty.contains(&item) {
            queue.push_back(item);
        }
    }
    let elapsed = start.elapsed();
    assert_eq!(seen, keys.len());
    util::rate(seen, elapsed)
}

fn crossbeam(keys: &[Key]) -> f64 {
    let (tx, rx) = crossbeam_channel::unbounded::<Key>();
    let barrier = Barrier::new(2);
    thread::scope(|s| {
        let consumer = s.spawn(|| {
            let start = util::go(&barrier);
            let mut seen = 0usize;
            for key in &rx {
                black_box(&key);
                seen += 1;
            }
            (seen, Span::new(start, Instant::now()))
        });
        let producer = s.spawn(|| {
            let start = util::go(&barrier);
            for key in keys {
                tx.send(key.clone()).expect("receiver alive");
            }
            drop(tx);
            Span::starting(start)
        });
        let started = producer.join().expect("producer");
        let (seen, span) = consumer.join().expect("consumer");
        assert_eq!(seen, keys.len());
        util::rate(seen, span.merge(started).elapsed())
    })
}
