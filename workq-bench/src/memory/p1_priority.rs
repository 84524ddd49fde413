//! P1 priorities: 1,000 keys spread over 5 priorities (key `i` gets priority
//! `i % 5`) are added with `add_with(key, AddOptions::default().priority(p))`, then all are
//! got (`try_get`) and done, and this repeats: 1,000 rounds (200 with `--quick`), on
//! one thread. Figure: cycles/s, a cycle being one item's add + get + done, so it reads
//! beside W1's items/s.
//!
//! Beside it, `workq-no-priority` runs the very same rounds with plain `add` (every
//! item at priority 0), so the ratio is the price of priorities.
//!
//! Caveats: single-threaded, so no lock is ever contended; this isolates the cost of the
//! priority ready queues, not of handing items across threads. Keys are 1,000 and the queue
//! never holds more, so everything stays in cache.

use std::hint::black_box;
use std::time::Instant;

use workq::{AddOptions, WorkQueue};

use crate::ctx::Ctx;
use crate::report::{OURS, Sample};
use crate::util::{self, Key};

const ID: &str = "P1";
const METRIC: &str = "cycles_per_s";
/// The same rounds with plain `add`.
const NO_PRIORITY: &str = "workq-no-priority";
const KEYS: usize = 1_000;
const PRIORITIES: i32 = 5;

pub(crate) fn run(ctx: &Ctx<'_>) -> Vec<Sample> {
    let rounds = if ctx.quick { 200 } else { 1_000 };
    let keys = util::keys(KEYS);
    ctx.step(OURS);
    let ours = cycle(&keys, rounds, true);
    ctx.step(NO_PRIORITY);
    let plain = cycle(&keys, rounds, false);
    vec![
        Sample::new(ID, OURS, METRIC, ours),
        Sample::new(ID, NO_PRIORITY, METRIC, plain),
    ]
}

fn cycle(keys: &[Key], rounds: usize, priorities: bool) -> f64 {
    let queue: WorkQueue<Key> = WorkQueue::new();
    let options: Vec<AddOptions> = (0..keys.len())
        .map(|i| AddOptions::default().priority(i as i32 % PRIORITIES))
        .collect();
    let start = Instant::now();
    let mut seen = 0usize;
    for _ in 0..rounds {
        if priorities {
            for (key, options) in keys.iter().zip(&options) {
                queue.add_with(key.clone(), *options);
            }
        } else {
            for key in keys {
                queue.add(key.clone());
            }
        }
        while let Ok(lease) = queue.try_get() {
            black_box(&*lease);
            seen += 1;
        }
    }
    let elapsed = start.elapsed();
    assert_eq!(
        seen,
        keys.len() * rounds,
        "P1: every add is handed out once"
    );
    util::rate(seen, elapsed)
}
