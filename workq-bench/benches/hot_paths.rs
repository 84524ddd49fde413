//! Criterion micro-benchmarks of the queue's hot paths, one thread, nothing contended:
//!
//! - `add_get_done/uncontended`: `add` of one key, `try_get`, lease drop (a whole cycle on
//!   an otherwise empty queue);
//! - `add_get_done/priority`: the same cycle through `add_with(.., priority(3))`;
//! - `add/dedup_hit`: `add` of a key that is already queued (a no-op under the lock);
//! - `add_after/heap_1m`: `add_after` of a new key into a queue already holding 1,000,000
//!   delayed keys (delays of one to two hours, so none comes due); the keys added are taken
//!   out again between timed batches, so the heap stays at 1,000,000;
//! - `lease/drop`: dropping a lease (client-go's `Done`) of an item not re-added, with
//!   1,024 leases out.
//!
//! Keys are `Arc<str>` shaped like controller keys and built before timing, as in
//! `wq-bench`. Run with `cargo bench -p workq-bench --bench hot_paths`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use workq::{AddOptions, Lease, WorkQueue};

type Key = Arc<str>;

fn key(index: usize) -> Key {
    Arc::from(format!("ns-{}/name-{}", index / 1000, index % 1000))
}

fn add_get_done(c: &mut Criterion) {
    let mut group = c.benchmark_group("add_get_done");
    let queue: WorkQueue<Key> = WorkQueue::new();
    let k = key(7);
    group.bench_function("uncontended", |b| {
        b.iter(|| {
            queue.add(k.clone());
            let lease = queue.try_get().expect("an item");
            black_box(&*lease);
            drop(lease);
        });
    });
    let options = AddOptions::default().priority(3);
    group.bench_function("priority", |b| {
        b.iter(|| {
            queue.add_with(k.clone(), options);
            let lease = queue.try_get().expect("an item");
            black_box(&*lease);
            drop(lease);
        });
    });
    group.finish();
}

fn dedup_hit(c: &mut Criterion) {
    let queue: WorkQueue<Key> = WorkQueue::new();
    // A realistic backlog, the hit key in the middle of it.
    for i in 0..1000 {
        queue.add(key(i));
    }
    let k = key(500);
    c.bench_function("add/dedup_hit", |b| {
        b.iter(|| queue.add(black_box(k.clone())));
    });
}

fn add_after_into_big_heap(c: &mut Criterion) {
    const HEAP: usize = 1_000_000;
    const POOL: usize = 10_000;
    let mut rng = StdRng::seed_from_u64(0x4850);
    let mut delay =
        move || Duration::from_secs(3600) + Duration::from_millis(rng.random_range(0..3_600_000));
    let queue: WorkQueue<Key> = WorkQueue::new();
    for i in 0..HEAP {
        queue.add_after(key(i), delay());
    }
    let pool: Vec<(Key, Duration)> = (0..POOL).map(|i| (key(HEAP + i), delay())).collect();
    c.bench_function("add_after/heap_1m", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            let mut left = iters as usize;
            while left > 0 {
                let batch = &pool[..left.min(POOL)];
                let start = Instant::now();
                for (k, d) in batch {
                    queue.add_after(k.clone(), *d);
                }
                timed += start.elapsed();
                // Take them out again: `add` makes a delayed item ready (leaving the heap),
                // and the drain hands them out and marks them done.
                for (k, _) in batch {
                    queue.add(k.clone());
                }
                while let Ok(lease) = queue.try_get() {
                    drop(lease);
                }
                left -= batch.len();
            }
            debug_assert_eq!(queue.delayed_len(), HEAP);
            timed
        });
    });
}

fn lease_drop(c: &mut Criterion) {
    const OUT: usize = 1024;
    let queue: WorkQueue<Key> = WorkQueue::new();
    let keys: Vec<Key> = (0..OUT).map(key).collect();
    let mut leases: Vec<Lease<Key>> = Vec::with_capacity(OUT);
    c.bench_function("lease/drop", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            let mut left = iters as usize;
            while left > 0 {
                let batch = &keys[..left.min(OUT)];
                for k in batch {
                    queue.add(k.clone());
                }
                while let Ok(lease) = queue.try_get() {
                    leases.push(lease);
                }
                let start = Instant::now();
                for lease in leases.drain(..) {
                    drop(lease);
                }
                timed += start.elapsed();
                left -= batch.len();
            }
            timed
        });
    });
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    add_get_done(&mut c);
    dedup_hit(&mut c);
    add_after_into_big_heap(&mut c);
    lease_drop(&mut c);
    c.final_summary();
}
