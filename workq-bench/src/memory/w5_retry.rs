//! W5 retry: a rate-limited queue with `ExponentialFailure(1 ms, 100 ms)` and 20,000 keys
//! (5,000 with `--quick`), added at once; 4 consumer threads fail each key 3 times
//! (`add_rate_limited`, then drop the lease) and succeed on the 4th (`forget`, then drop).
//! Figures: wall (from the first add until the last key has succeeded) and requeues (the
//! `add_rate_limited` calls, which must be 3 per key).
//!
//! A consumer decides with `num_requeues` (the limiter's failure count), as a controller
//! does. The backoffs are 1, 2 and 4 ms, so no schedule can finish in under 7 ms; the rest
//! of the wall is the queue and the limiter handling 80,000 gets and 60,000 delayed adds,
//! and the timer waking consumers when retries come due.
//!
//! Only `workq` runs here: docs/bench-workloads.md names no reference for W5.
//!
//! Caveats: the rate limiter keeps its failure counts behind its own lock, which the 4
//! consumers share with the queue's; with 4 consumer threads, a producer and the timer on
//! 2 cores, preemption while a lock is held shows up in the wall time.

use std::hint::black_box;
use std::sync::Barrier;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use workq::WorkQueue;
use workq::rate_limiter::ExponentialFailure;

use crate::ctx::Ctx;
use crate::report::{OURS, Sample};
use crate::util::{self, Key};

const ID: &str = "W5";
const CONSUMERS: usize = 4;
const FAILURES: usize = 3;

pub(crate) fn run(ctx: &Ctx<'_>) -> Vec<Sample> {
    let n = if ctx.quick { 5_000 } else { 20_000 };
    let keys = util::keys(n);
    ctx.step(OURS);
    let (wall, requeues) = ours(&keys);
    vec![
        Sample::new(ID, OURS, "wall_s", wall.as_secs_f64()),
        Sample::new(ID, OURS, "requeues", requeues as f64),
    ]
}

fn ours(keys: &[Key]) -> (Duration, usize) {
    let n = keys.len();
    let queue: WorkQueue<Key> = WorkQueue::builder()
        .rate_limiter(ExponentialFailure::new(
            Duration::from_millis(1),
            Duration::from_millis(100),
        ))
        .build();
    let succeeded = AtomicUsize::new(0);
    let barrier = Barrier::new(CONSUMERS + 1);
    thread::scope(|s| {
        let consumers: Vec<_> = (0..CONSUMERS)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    let mut requeues = 0usize;
                    while let Some(lease) = queue.blocking_get() {
                        black_box(&*lease);
                        if queue.num_requeues(lease.item()) < FAILURES {
                            queue.add_rate_limited(lease.item().clone());
                            requeues += 1;
                            continue;
                        }
                        queue.forget(lease.item());
                        drop(lease);
                        if succeeded.fetch_add(1, Ordering::AcqRel) + 1 == n {
                            queue.shut_down();
                        }
                    }
                    (requeues, Instant::now())
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        for key in keys {
            queue.add(key.clone());
        }
        let (requeues, end) = consumers
            .into_iter()
            .map(|c| c.join().expect("consumer"))
            .fold((0, start), |(r, e), (q, t)| (r + q, e.max(t)));
        assert_eq!(requeues, FAILURES * n, "W5: three failures per key");
        (end - start, requeues)
    })
}
