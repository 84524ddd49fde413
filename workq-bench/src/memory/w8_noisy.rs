//! W8 noisy neighbour: one group adds 100,000 items at once (20,000 with
//! `--quick`); 100 quiet groups each add one item every 100 ms (1,000 items/s in all) for
//! the first 3 s (1 s with `--quick`); [`Workers`] with `count` 16 handle them, the handler
//! sleeping 1 ms (a thread's sleep, as in W7). Items are `"group/..."` keys; the queue
//! groups them by the part before the `/`.
//!
//! Three queues, in the same run:
//! - `workq-fifo`: no groups, one first-in-first-out order within a priority (what every
//!   queue without flow control does): the quiet items wait behind the backlog;
//! - `workq` (ours): `group_by`, groups take turns;
//! - `workq-limited`: `group_by` with `max_in_flight_per_group(8)` and
//!   `max_in_flight(16)`, the limits checked.
//!
//! Figures: `quiet_pickup_p50_ms` / `quiet_pickup_p99_ms` (from the quiet item's add to the
//! start of its handler), `items_per_s` (every item, from the noisy burst to the end of the
//! last handler), and `max_group_in_flight` (the most handlers of one group running at once,
//! counted by the handlers themselves). A run whose limits were exceeded is an error, not a
//! figure: the bench checks them rather than assuming them.
//!
//! Shaped for the servers: the driver runs over any `workq::Queue` (adds through the trait,
//! `Workers::spawn_async`), so Redis and PostgreSQL join once they have flow control.
//!
//! Caveats: the producers, 16 workers and the handlers' sleeping threads share 2 cores with
//! whatever else runs; the quiet producer's ticks are 1 ms thread sleeps, so its rate is
//! slightly under 1,000/s.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use workq::{AddOptions, Queue, WorkQueue, Workers};

use crate::ctx::Ctx;
use crate::report::{OURS, Sample};
use crate::util;

pub(crate) const ID: &str = "W8";
/// No groups.
const FIFO: &str = "workq-fifo";
/// Groups with limits.
const LIMITED: &str = "workq-limited";
/// Workers.
const WORKERS: usize = 16;
/// Quiet groups.
const QUIET_GROUPS: usize = 100;
/// Each quiet group adds one item this often.
const QUIET_EVERY: Duration = Duration::from_millis(100);
/// `workq-limited`'s limits.
const PER_GROUP: usize = 8;
const MAX_IN_FLIGHT: usize = 16;

/// The limits a run is held to.
#[derive(Clone, Copy)]
struct Limits {
    per_group: usize,
    total: usize,
}

/// What one run measured.
struct Measured {
    quiet_us: Vec<i64>,
    items_per_s: f64,
    max_group: usize,
}

pub(crate) fn run(ctx: &Ctx<'_>) -> Result<Vec<Sample>, String> {
    let (noisy, quiet_for) = if ctx.quick {
        (20_000, Duration::from_secs(1))
    } else {
        (100_000, Duration::from_secs(3))
    };
    let namespace = |key: &String| key.split_once('/').map_or("", |(g, _)| g).to_owned();
    let runtime = util::runtime();
    let mut samples = Vec::new();
    let shapes: [(&'static str, Option<Limits>); 3] = [
        (FIFO, None),
        (OURS, None),
        (
            LIMITED,
            Some(Limits {
                per_group: PER_GROUP,
                total: MAX_IN_FLIGHT,
            }),
        ),
    ];
    for (imp, limits) in shapes {
        ctx.step(imp);
        let queue: WorkQueue<String> = match (imp, limits) {
            (FIFO, _) => WorkQueue::new(),
            (_, None) => WorkQueue::builder().group_by(namespace).build(),
            (_, Some(limits)) => WorkQueue::builder()
                .group_by(namespace)
                .max_in_flight_per_group(limits.per_group)
                .max_in_flight(limits.total)
                .build(),
        };
        let measured = runtime.block_on(phase(queue, noisy, quiet_for, limits))?;
        let mut quiet = measured.quiet_us;
        quiet.sort_unstable();
        samples.push(Sample::new(
            ID,
            imp,
            "quiet_pickup_p50_ms",
            util::quantile(&quiet, 0.5) as f64 / 1e3,
        ));
        samples.push(Sample::new(
            ID,
            imp,
            "quiet_pickup_p99_ms",
            util::quantile(&quiet, 0.99) as f64 / 1e3,
        ));
        samples.push(Sample::new(ID, imp, "items_per_s", measured.items_per_s));
        samples.push(Sample::new(
            ID,
            imp,
            "max_group_in_flight",
            measured.max_group as f64,
        ));
    }
    Ok(samples)
}

/// One queue's run: the burst, the quiet producer, the workers; `Err` if a limit was
/// exceeded or an item was lost.
async fn phase<Q: Queue<Item = String>>(
    queue: Q,
    noisy: usize,
    quiet_for: Duration,
    limits: Option<Limits>,
) -> Result<Measured, String> {
    #[derive(Default)]
    struct Running {
        per_group: HashMap<String, usize>,
        total: usize,
        worst_group: usize,
        worst_total: usize,
    }
    let start = Instant::now();
    let running = Arc::new(Mutex::new(Running::default()));
    let quiet_us = Arc::new(Mutex::new(Vec::new()));
    let handled = Arc::new(AtomicUsize::new(0));
    let workers = {
        let (running, quiet_us, handled) = (running.clone(), quiet_us.clone(), handled.clone());
        Workers::new(queue.clone())
            .count(WORKERS)
            .spawn_async(move |item: String| {
                let (running, quiet_us, handled) =
                    (running.clone(), quiet_us.clone(), handled.clone());
                async move {
                    let began = start.elapsed();
                    let (group, rest) = item.split_once('/').unwrap_or(("", ""));
                    if group != "noisy" {
                        // Quiet items carry their add time (microseconds since the start).
                        let added: u64 = rest.parse().unwrap_or(0);
                        let waited = began.as_micros() as i64 - added as i64;
                        quiet_us.lock().unwrap().push(waited.max(0));
                    }
                    {
                        let mut r = running.lock().unwrap();
                        let n = r.per_group.entry(group.to_owned()).or_default();
                        *n += 1;
                        let n = *n;
                        r.total += 1;
                        r.worst_group = r.worst_group.max(n);
                        r.worst_total = r.worst_total.max(r.total);
                    }
                    let pause = Duration::from_millis(1);
                    let _ = tokio::task::spawn_blocking(move || std::thread::sleep(pause)).await;
                    {
                        let mut r = running.lock().unwrap();
                        *r.per_group.get_mut(group).expect("counted above") -= 1;
                        r.total -= 1;
                    }
                    handled.fetch_add(1, Ordering::Relaxed);
                }
            })
    };
    // The burst.
    for i in 0..noisy {
        add(&queue, format!("noisy/{i}")).await?;
    }
    // The quiet groups: one add a millisecond, each group in turn (every 100 ms per group).
    let tick = QUIET_EVERY / QUIET_GROUPS as u32;
    let mut quiet = 0usize;
    while start.elapsed() < quiet_for {
        let next = tick * (quiet as u32 + 1);
        let at = start.elapsed().as_micros();
        add(&queue, format!("quiet{}/{at}", quiet % QUIET_GROUPS)).await?;
        quiet += 1;
        if let Some(wait) = next.checked_sub(start.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
    let total = noisy + quiet;
    let deadline = Instant::now() + Duration::from_secs(120);
    while handled.load(Ordering::Relaxed) < total {
        if Instant::now() > deadline {
            return Err(format!(
                "W8: {} of {total} items handled after 2 minutes",
                handled.load(Ordering::Relaxed)
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = start.elapsed();
    let _ = workers.shut_down().await;
    let r = running.lock().unwrap();
    if let Some(limits) = limits
        && (r.worst_group > limits.per_group || r.worst_total > limits.total)
    {
        return Err(format!(
            "W8: limits exceeded: {} of one group at once (limit {}), {} in all (limit {})",
            r.worst_group, limits.per_group, r.worst_total, limits.total
        ));
    }
    let quiet_us = std::mem::take(&mut *quiet_us.lock().unwrap());
    if quiet_us.len() != quiet {
        return Err(format!(
            "W8: {} of {quiet} quiet items handled",
            quiet_us.len()
        ));
    }
    Ok(Measured {
        quiet_us,
        items_per_s: util::rate(total, elapsed),
        max_group: r.worst_group,
    })
}

async fn add<Q: Queue<Item = String>>(queue: &Q, item: String) -> Result<(), String> {
    match queue.add_with(item, AddOptions::default()).await {
        Ok(true) => Ok(()),
        Ok(false) => Err("W8: an add was refused".to_owned()),
        Err(_) => Err("W8: an add failed".to_owned()),
    }
}
