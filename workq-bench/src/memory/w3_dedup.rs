//! W3 dedup: 4 producer threads each add the same 1,000 keys over and over, 1,000,000 adds
//! in all (200,000 with `--quick`), while 2 consumer threads get + done. Figures: adds/s
//! (all adds, from the release of the threads until the last producer's last add) and
//! deliveries (how many times an item was handed out: the lower, the more work the dedup
//! saved; at least 1,000, at most the number of adds).
//!
//! Each producer walks the keys in order from its own starting point (a quarter of the key
//! space apart), so producers do not march in lock step on the same key. Consumers drain
//! until `None` after the last producer shuts the queue down.
//!
//! Only `workq` runs here: docs/bench-workloads.md names no reference for W3, and a channel
//! does no dedup (its deliveries would be the number of adds).
//!
//! Caveats: most adds hit an item that is already queued (a no-op under the lock) or being
//! processed (marked dirty); the share of each depends on how the threads are scheduled, so
//! deliveries vary from run to run. 6 busy threads share 2 cores.

use std::sync::Barrier;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::Instant;

use workq::WorkQueue;

use crate::ctx::Ctx;
use crate::report::{OURS, Sample};
use crate::util::{self, Key, Span};

const ID: &str = "W3";
const KEYS: usize = 1_000;
const PRODUCERS: usize = 4;
const CONSUMERS: usize = 2;

pub(crate) fn run(ctx: &Ctx<'_>) -> Vec<Sample> {
    let adds = if ctx.quick { 200_000 } else { 1_000_000 };
    let keys = util::keys(KEYS);
    ctx.step(OURS);
    let (adds_per_s, deliveries) = ours(&keys, adds);
    vec![
        Sample::new(ID, OURS, "adds_per_s", adds_per_s),
        Sample::new(ID, OURS, "deliveries", deliveries as f64),
    ]
}

fn ours(keys: &[Key], adds: usize) -> (f64, usize) {
    let queue: WorkQueue<Key> = WorkQueue::new();
    let per_producer = adds / PRODUCERS;
    let barrier = Barrier::new(PRODUCERS + CONSUMERS);
    let remaining = AtomicUsize::new(PRODUCERS);
    thread::scope(|s| {
        let consumers: Vec<_> = (0..CONSUMERS)
            .map(|_| {
                s.spawn(|| {
                    let start = util::go(&barrier);
                    let seen = util::drain_blocking(&queue);
                    (seen, start)
                })
            })
            .collect();
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let (queue, barrier, remaining) = (&queue, &barrier, &remaining);
                s.spawn(move || {
                    let start = util::go(barrier);
                    let offset = p * keys.len() / PRODUCERS;
                    let mut i = offset;
                    for _ in 0..per_producer {
                        queue.add(keys[i].clone());
                        i += 1;
                        if i == keys.len() {
                            i = 0;
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
        let adding = util::join_producers(producers);
        let (deliveries, adding) = consumers
            .into_iter()
            .map(|c| c.join().expect("consumer"))
            .fold((0, adding), |(n, span), (seen, start)| {
                (n + seen, span.merge(Span::starting(start)))
            });
        assert!(deliveries >= keys.len(), "W3: every key is handed out");
        (
            util::rate(per_producer * PRODUCERS, adding.elapsed()),
            deliveries,
        )
    })
}
