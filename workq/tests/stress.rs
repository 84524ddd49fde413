//! Stress: many producers and consumers, blocking and async mixed, millions of operations on
//! the real clock, with live checks.
//!
//! - **Never in flight twice**: every consumer marks its key as held when it receives a lease
//!   and unmarks it just before dropping the lease; finding the mark already set fails.
//! - **No add is lost**: a producer bumps its key's version before every add; a consumer
//!   reads the version after it receives the item and records the highest version processed.
//!   Once the producers stop, every key's latest version must be processed: an add that came
//!   after the key's last delivery has to bring it back. A lost dirty re-add or delayed add
//!   leaves a version unprocessed when the queue falls idle; a lost wake-up leaves items
//!   queued with every consumer asleep until a deadline. Either fails the test.
//! - **No re-add while processing is lost or doubled**, counted exactly: *chain* keys, which
//!   no producer touches, are re-added by the consumer holding them (by `add`, `add_after` or
//!   `add_rate_limited`, while the lease is out) until they have been delivered
//!   `chain_length` times. Each re-add must bring exactly one more delivery, so a chain that
//!   stops short or overshoots is a lost or doubled re-add. Producer traffic on the other keys
//!   cannot mask a loss here, as it can for the version check.
//! - **FIFO** for one producer and one consumer (blocking, then async): every item arrives
//!   once, in order.
//!
//! Sizes are for a release build (`cargo test -p workq --release --test stress`), where
//! the whole file takes well under a minute on 2 cores; a debug build (the workspace's plain
//! `cargo test`) runs a twentieth of the operations.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use workq::rate_limiter::ExponentialFailure;
use workq::{Lease, TryGetError, WorkQueue};

/// Operations scale: a debug build is about 20 times slower, so it runs a twentieth.
const SCALE: u64 = if cfg!(debug_assertions) { 20 } else { 1 };

/// How long the queue may take to settle after the producers stop. Far above what a correct
/// run needs; it only turns a lost item into a failure instead of a hang.
const SETTLE_DEADLINE: Duration = Duration::from_secs(30);

/// A small xorshift generator: each thread gets its own, seeded by its index.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// What the checks share.
struct Ledger {
    /// Per key: a lease on it is out (as far as the consumers know).
    held: Vec<AtomicBool>,
    /// Per key: bumped before every add.
    version: Vec<AtomicU64>,
    /// Per key: the highest version a consumer read after receiving the key.
    processed: Vec<AtomicU64>,
    /// Set when the producers are done; consumers stop re-adding after it.
    producers_done: AtomicBool,
    /// Per chain key (keys `producer_keys..`): deliveries so far.
    chain_deliveries: Vec<AtomicU64>,
    /// The first chain key.
    producer_keys: u32,
    /// Adds of all kinds, by producers and consumers.
    adds: AtomicU64,
    /// Leases received.
    deliveries: AtomicU64,
}

impl Ledger {
    fn new(producer_keys: u32, chains: u32) -> Self {
        let keys = (producer_keys + chains) as usize;
        Self {
            chain_deliveries: (0..chains).map(|_| AtomicU64::new(0)).collect(),
            producer_keys,
            held: (0..keys).map(|_| AtomicBool::new(false)).collect(),
            version: (0..keys).map(|_| AtomicU64::new(0)).collect(),
            processed: (0..keys).map(|_| AtomicU64::new(0)).collect(),
            producers_done: AtomicBool::new(false),
            adds: AtomicU64::new(0),
            deliveries: AtomicU64::new(0),
        }
    }

    /// Bumps `key`'s version; call it right before adding `key`.
    fn will_add(&self, key: u32) {
        self.version[key as usize].fetch_add(1, Ordering::SeqCst);
        self.adds.fetch_add(1, Ordering::Relaxed);
    }

    /// Checks and records a delivery; returns the key.
    fn received(&self, lease: &Lease<u32>) -> u32 {
        let key = **lease;
        let was_held = self.held[key as usize].swap(true, Ordering::SeqCst);
        assert!(!was_held, "key {key} handed to two consumers at once");
        let seen = self.version[key as usize].load(Ordering::SeqCst);
        self.processed[key as usize].fetch_max(seen, Ordering::SeqCst);
        self.deliveries.fetch_add(1, Ordering::Relaxed);
        key
    }

    /// Unmarks `key`; call it right before dropping its lease.
    fn releasing(&self, key: u32) {
        self.held[key as usize].store(false, Ordering::SeqCst);
    }

    /// Chains that have not reached `length` deliveries: (chain key, deliveries).
    fn unfinished_chains(&self, length: u64) -> Vec<(u32, u64)> {
        self.chain_deliveries
            .iter()
            .enumerate()
            .map(|(chain, count)| {
                (
                    self.producer_keys + chain as u32,
                    count.load(Ordering::SeqCst),
                )
            })
            .filter(|&(_, count)| count != length)
            .collect()
    }

    /// Keys whose latest version no consumer has processed.
    fn unprocessed(&self) -> Vec<(usize, u64, u64)> {
        (0..self.version.len())
            .filter_map(|key| {
                let version = self.version[key].load(Ordering::SeqCst);
                let processed = self.processed[key].load(Ordering::SeqCst);
                (processed != version).then_some((key, version, processed))
            })
            .collect()
    }
}

/// One row of the stress table (parking_lot's `run_queue_tests!` idea).
#[derive(Clone, Copy, Debug)]
struct Shape {
    producers: usize,
    blocking_consumers: usize,
    async_consumers: usize,
    /// Consumers that poll with `try_get` and yield when the queue is empty.
    polling_consumers: usize,
    /// Distinct producer keys: few keys means heavy dedup and many adds while processing.
    keys: u32,
    /// Chain keys, re-added only by the consumer holding them.
    chains: u32,
    /// Deliveries each chain must reach.
    chain_length: u64,
    /// Adds per producer (release build).
    adds_per_producer: u64,
    /// One add in this many is an `add_after` of up to 50 µs.
    delayed_one_in: u64,
    /// Work between two adds of a producer, in spin-loop rounds (random, up to this).
    produce_work: u64,
    /// Work while a consumer holds a lease, in spin-loop rounds (random, up to this).
    consume_work: u64,
}

/// Busy work of up to `max` spin-loop rounds: keeps producers from adding far faster than
/// consumers take items (which would turn nearly every add into a dedup hit), and keeps
/// leases out long enough for adds to land while items are being processed.
fn work(rng: &mut Rng, max: u64) {
    for _ in 0..rng.below(max + 1) {
        std::hint::spin_loop();
    }
}

/// What a consumer does with a lease. A producer key is sometimes re-added rate-limited (a
/// failed reconcile) and otherwise forgotten (success). A chain key is re-added, while the
/// lease is out, until its chain is complete.
fn process(
    queue: &WorkQueue<u32>,
    ledger: &Ledger,
    shape: &Shape,
    lease: Lease<u32>,
    rng: &mut Rng,
) {
    let key = ledger.received(&lease);
    work(rng, shape.consume_work);
    if key >= shape.keys {
        let chain = (key - shape.keys) as usize;
        let delivered = ledger.chain_deliveries[chain].fetch_add(1, Ordering::SeqCst) + 1;
        assert!(
            delivered <= shape.chain_length,
            "chain key {key} delivered too often"
        );
        if delivered < shape.chain_length {
            ledger.will_add(key);
            match rng.below(4) {
                0 => queue.add_after(key, Duration::from_micros(rng.below(30))),
                1 => queue.add_rate_limited(key),
                _ => queue.add(key),
            }
        }
    } else if !ledger.producers_done.load(Ordering::SeqCst) && rng.below(8) == 0 {
        ledger.will_add(key);
        queue.add_rate_limited(key);
    } else {
        queue.forget(&key);
    }
    ledger.releasing(key);
    drop(lease);
}

impl Shape {
    /// The shape for this build: a debug build runs a twentieth of the operations.
    fn scaled(self) -> Self {
        Self {
            adds_per_producer: self.adds_per_producer / SCALE,
            chain_length: self.chain_length / SCALE,
            ..self
        }
    }
}

fn run(shape: Shape) {
    let shape = shape.scaled();
    let started = Instant::now();
    let queue: WorkQueue<u32> = WorkQueue::builder()
        .rate_limiter(ExponentialFailure::new(
            Duration::from_micros(1),
            Duration::from_micros(100),
        ))
        .build();
    let ledger = Arc::new(Ledger::new(shape.keys, shape.chains));

    let producers: Vec<_> = (0..shape.producers)
        .map(|index| {
            let queue = queue.clone();
            let ledger = ledger.clone();
            thread::spawn(move || {
                let mut rng = Rng::new(index as u64 + 1);
                for _ in 0..shape.adds_per_producer {
                    let key = rng.below(u64::from(shape.keys)) as u32;
                    ledger.will_add(key);
                    if rng.below(shape.delayed_one_in) == 0 {
                        queue.add_after(key, Duration::from_micros(rng.below(50)));
                    } else {
                        queue.add(key);
                    }
                    work(&mut rng, shape.produce_work);
                }
            })
        })
        .collect();

    let blocking: Vec<_> = (0..shape.blocking_consumers)
        .map(|index| {
            let queue = queue.clone();
            let ledger = ledger.clone();
            thread::spawn(move || {
                let mut rng = Rng::new(1000 + index as u64);
                while let Some(lease) = queue.blocking_get() {
                    process(&queue, &ledger, &shape, lease, &mut rng);
                }
            })
        })
        .collect();

    let polling: Vec<_> = (0..shape.polling_consumers)
        .map(|index| {
            let queue = queue.clone();
            let ledger = ledger.clone();
            thread::spawn(move || {
                let mut rng = Rng::new(2000 + index as u64);
                loop {
                    match queue.try_get() {
                        Ok(lease) => process(&queue, &ledger, &shape, lease, &mut rng),
                        Err(TryGetError::Empty) => thread::yield_now(),
                        Err(TryGetError::ShutDown) => break,
                    }
                }
            })
        })
        .collect();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let tasks: Vec<_> = (0..shape.async_consumers)
        .map(|index| {
            let queue = queue.clone();
            let ledger = ledger.clone();
            runtime.spawn(async move {
                let mut rng = Rng::new(3000 + index as u64);
                while let Some(lease) = queue.get().await {
                    process(&queue, &ledger, &shape, lease, &mut rng);
                }
            })
        })
        .collect();

    // Start the chains; from here on only their holders re-add them.
    for chain in 0..shape.chains {
        ledger.will_add(shape.keys + chain);
        queue.add(shape.keys + chain);
    }

    for producer in producers {
        producer.join().unwrap();
    }
    ledger.producers_done.store(true, Ordering::SeqCst);

    // Let the consumers catch up. Only a consumer holding a lease adds now, so once the queue
    // is idle (nothing queued, delayed or out, read under one lock) nothing can change any
    // more: every version must be processed and every chain complete at that point. The
    // deadline only turns a hang (items queued while every consumer sleeps) into a failure.
    let deadline = Instant::now() + SETTLE_DEADLINE;
    loop {
        let stats = queue.stats();
        let idle = stats.len == 0 && stats.delayed == 0 && stats.processing == 0;
        if idle || Instant::now() > deadline {
            let missing = ledger.unprocessed();
            let chains = ledger.unfinished_chains(shape.chain_length);
            assert!(
                idle && missing.is_empty() && chains.is_empty(),
                "{shape:?}: {} after {:?}: {stats:?}; {} keys with unprocessed adds \
                 (key, version, processed): {:?}; {} unfinished chains (key, deliveries): {:?}",
                if idle { "idle" } else { "not idle" },
                started.elapsed(),
                missing.len(),
                &missing[..missing.len().min(10)],
                chains.len(),
                &chains[..chains.len().min(10)],
            );
            break;
        }
        // A poll for completion, not a timing assumption: the deadline above is the bound.
        thread::sleep(Duration::from_millis(1));
    }

    queue.shut_down();
    for consumer in blocking.into_iter().chain(polling) {
        consumer.join().unwrap();
    }
    runtime.block_on(async {
        for task in tasks {
            task.await.unwrap();
        }
    });
    assert_eq!(
        queue.tracked_len(),
        0,
        "the queue keeps nothing once drained"
    );

    let adds = ledger.adds.load(Ordering::Relaxed);
    let deliveries = ledger.deliveries.load(Ordering::Relaxed);
    assert!(
        deliveries <= adds,
        "more deliveries ({deliveries}) than adds ({adds})"
    );
    eprintln!(
        "{shape:?}: {adds} adds, {deliveries} deliveries in {:?}",
        started.elapsed()
    );
}

#[test]
fn many_keys_mixed_consumers() {
    run(Shape {
        producers: 4,
        blocking_consumers: 2,
        async_consumers: 4,
        polling_consumers: 1,
        keys: 10_000,
        chains: 64,
        chain_length: 2_000,
        adds_per_producer: 500_000,
        delayed_one_in: 16,
        produce_work: 100,
        consume_work: 50,
    });
}

#[test]
fn few_keys_heavy_dedup_and_readds_while_processing() {
    run(Shape {
        producers: 4,
        blocking_consumers: 3,
        async_consumers: 3,
        polling_consumers: 0,
        keys: 8,
        chains: 64,
        chain_length: 2_000,
        adds_per_producer: 200_000,
        delayed_one_in: 8,
        produce_work: 500,
        consume_work: 100,
    });
}

#[test]
fn one_key_many_hands() {
    run(Shape {
        producers: 3,
        blocking_consumers: 2,
        async_consumers: 2,
        polling_consumers: 1,
        keys: 1,
        chains: 64,
        chain_length: 2_000,
        adds_per_producer: 100_000,
        delayed_one_in: 4,
        produce_work: 500,
        consume_work: 100,
    });
}

// ===== FIFO =====

/// Items one producer adds once each, in order.
const FIFO_ITEMS: u64 = 1_000_000;

/// Checks that `next` returns 0, 1, 2, ... `items - 1`, then `None`.
fn check_in_order(items: u64, mut next: impl FnMut() -> Option<Lease<u64>>) {
    let mut expected = 0;
    while let Some(lease) = next() {
        assert_eq!(*lease, expected, "FIFO broken");
        expected += 1;
    }
    assert_eq!(expected, items, "items lost");
}

fn fifo_producer(queue: &WorkQueue<u64>, items: u64) -> thread::JoinHandle<()> {
    let queue = queue.clone();
    thread::spawn(move || {
        for item in 0..items {
            queue.add(item);
        }
        // Queued items are still handed out after shut down; then getters see `None`.
        queue.shut_down();
    })
}

#[test]
fn fifo_one_producer_one_blocking_consumer() {
    let items = FIFO_ITEMS / SCALE;
    let queue = WorkQueue::new();
    let producer = fifo_producer(&queue, items);
    check_in_order(items, || queue.blocking_get());
    producer.join().unwrap();
}

#[test]
fn fifo_one_producer_one_async_consumer() {
    let items = FIFO_ITEMS / SCALE;
    let queue = WorkQueue::new();
    let producer = fifo_producer(&queue, items);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut expected = 0;
        while let Some(lease) = queue.get().await {
            assert_eq!(*lease, expected, "FIFO broken");
            expected += 1;
        }
        assert_eq!(expected, items, "items lost");
    });
    producer.join().unwrap();
}

/// FIFO with the re-add rule in play: the consumer re-adds every third item while holding
/// it, so that item goes to the tail once its lease drops. The producer's items still come
/// out in order among themselves, and every re-added item comes back exactly once.
#[test]
fn fifo_holds_for_fresh_items_when_readds_go_to_the_tail() {
    let items = FIFO_ITEMS / 4 / SCALE;
    let queue: WorkQueue<u64> = WorkQueue::new();
    let producer = {
        let queue = queue.clone();
        thread::spawn(move || {
            for item in 0..items {
                queue.add(item);
            }
        })
    };
    let mut next_fresh = 0;
    let mut readded = std::collections::HashSet::new();
    while next_fresh < items {
        let lease = queue.blocking_get().unwrap();
        let item = *lease;
        if readded.remove(&item) {
            continue; // the second delivery of a re-added item
        }
        assert_eq!(item, next_fresh, "FIFO broken among the producer's items");
        next_fresh += 1;
        if item.is_multiple_of(3) {
            queue.add(item); // while processing: queued again when the lease drops
            readded.insert(item);
        }
    }
    producer.join().unwrap();
    // Every lease is dropped, so the re-added items still missing are all queued.
    while let Ok(lease) = queue.try_get() {
        assert!(readded.remove(&*lease), "{} delivered twice", *lease);
    }
    assert!(
        readded.is_empty(),
        "{} re-added items never came back",
        readded.len()
    );
    assert_eq!(queue.tracked_len(), 0);
}
