//! `wq demo --redis URL` and `wq demo --postgres URL`: the demo's controller on a queue on a
//! server, shared by processes. One driver for both servers, over [`Backend`]: the queue, a few
//! calls of the server's own (a batch of adds with their sequence numbers, drained?, fleet
//! shut down), and the checks' bookkeeping, kept on the same server ([`super::on_redis`],
//! [`super::on_postgres`]).
//!
//! Producers emit change events for a set of objects (many duplicates, which the queue
//! merges); workers reconcile with a random latency and fail at `--failure-rate`, retried
//! with the queue's server-side rate limiter and given up after `--max-retries`. Run it once
//! with producers and workers, and as many `--workers-only` processes (on any machine) as you
//! like: they share one queue. Two checks are made across all processes, on the server:
//!
//! - no object was ever reconciled by two workers at once (a claim per item while leased);
//! - every object's last event was reconciled after it arrived (its add's sequence number is
//!   below the fencing token of an accepted `done`), unless the object was given up.
//!
//! The producing process waits for the queue to drain, shuts it down (which ends the
//! `--workers-only` processes) and prints the table; once the `--workers-only` processes
//! have left, it deletes the queue and its bookkeeping, leaving the server as it found it.
//! Exit code 0 if both checks hold.
//!
//! The workers are [`workq::Workers`], the same pool as in memory, over the queue on the
//! server: retries, give-ups and the stop come from it. The checks wrap the queue in
//! [`Checked`], a [`Queue`] that claims each item as it is handed out and records the fencing
//! token of each accepted `done`.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::RngExt;
use rand::rngs::SmallRng;
use workq::{AddOptions, Queue, QueueLease, Workers};

use super::args::DemoArgs;

/// How long a lease lasts on either server: far longer than a reconcile.
pub(super) const LEASE: Duration = Duration::from_secs(10);

/// The retries' backoff on either server: per item, exponential from 5 ms, at most 1 s.
pub(super) const BACKOFF: (Duration, Duration) = (Duration::from_millis(5), Duration::from_secs(1));

/// The queue's error on backend `B`.
pub(super) type Error<B> = <<B as Backend>::Queue as Queue>::Error;

/// The queue's lease on backend `B`.
pub(super) type BackendLease<B> = <<B as Backend>::Queue as Queue>::Lease;

/// What the checks read at the end: per object, the fencing token of its last accepted `done`,
/// and the objects given up.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    /// Item -> the largest token of an accepted `done` (the last recorded, on Redis).
    pub(super) done: HashMap<String, u64>,
    /// Items given up after `--max-retries`.
    pub(super) given_up: HashSet<String>,
}

/// What the demo needs of a queue on a server beside the [`Queue`] its workers run on: the
/// server's own calls for producing and draining, and the bookkeeping of the two checks, kept
/// on the same server so that every process sharing the queue writes to it.
///
/// The bookkeeping of one lease: [`claim`](Self::claim) when it is handed out (a second live
/// claim of an item means two workers at once); [`end_claim`](Self::end_claim) before its
/// `done` or release (so that the next holder can claim); [`ended`](Self::ended) after it,
/// recording the token if the `done` was accepted.
pub(super) trait Backend: Clone + Send + Sync + 'static {
    /// The queue the workers run on.
    type Queue: Queue<Item = String>;

    /// Connects to the server at `url` and opens the queue named `queue` (for `workers`
    /// workers) and its bookkeeping.
    fn open(
        url: &str,
        queue: &str,
        workers: usize,
    ) -> impl Future<Output = Result<Self, Error<Self>>> + Send;

    /// The queue.
    fn queue(&self) -> &Self::Queue;

    /// A lease's fencing token.
    fn token(lease: &BackendLease<Self>) -> u64;

    /// Adds `items` as one batch; returns each add's sequence number (from the counter that
    /// issues fencing tokens), in order.
    fn add_batch(
        &self,
        items: &[String],
    ) -> impl Future<Output = Result<Vec<u64>, Error<Self>>> + Send;

    /// Whether nothing is queued, delayed or in flight in any process, and no lease is still
    /// being ended: one atomic look, so a drained queue is never reported early.
    fn is_drained(&self) -> impl Future<Output = Result<bool, Error<Self>>> + Send;

    /// Shuts the queue down for every process (ends the `--workers-only` ones).
    fn shut_down_fleet(&self) -> impl Future<Output = Result<(), Error<Self>>> + Send;

    /// Deletes the queue and the bookkeeping of a previous run of the same queue.
    fn reset(&self) -> impl Future<Output = Result<(), Error<Self>>> + Send;

    /// Deletes the queue and its bookkeeping at the end, leaving no trace of the queue
    /// (where [`reset`](Self::reset) leaves an empty one).
    fn remove(&self) -> impl Future<Output = Result<(), Error<Self>>> + Send {
        self.reset()
    }

    /// Claims `item` for the lease `token`; `false` if another claim is live.
    fn claim(
        &self,
        item: &str,
        token: u64,
    ) -> impl Future<Output = Result<bool, Error<Self>>> + Send;

    /// Gives the claim of lease `token` back (`claimed`: whether it was taken), before the
    /// lease's `done` or release.
    fn end_claim(
        &self,
        item: &str,
        token: u64,
        claimed: bool,
    ) -> impl Future<Output = Result<(), Error<Self>>> + Send;

    /// The lease `token` has ended; records its token if its `done` was `accepted`.
    fn ended(
        &self,
        item: &str,
        token: u64,
        accepted: bool,
    ) -> impl Future<Output = Result<(), Error<Self>>> + Send;

    /// Records that `item` is given up.
    fn give_up(&self, item: &str) -> impl Future<Output = Result<(), Error<Self>>> + Send;

    /// Reads what the checks need.
    fn ledger(&self) -> impl Future<Output = Result<Ledger, Error<Self>>> + Send;

    /// Registers (`present`) or unregisters the `--workers-only` process `id`, so that the
    /// producing process knows when none is left on the queue.
    fn helper(
        &self,
        id: &str,
        present: bool,
    ) -> impl Future<Output = Result<(), Error<Self>>> + Send;

    /// How many `--workers-only` processes are registered.
    fn helpers(&self) -> impl Future<Output = Result<u64, Error<Self>>> + Send;
}

/// How long the producing process waits for the `--workers-only` ones to see the fleet
/// shut down and leave before it deletes the queue (one that crashed never leaves).
const HELPERS_LEAVE: Duration = Duration::from_secs(30);

#[derive(Default)]
struct Counters {
    reconciles: AtomicU64,
    failures: AtomicU64,
    overlaps: AtomicU64,
    refused: AtomicU64,
}

/// The demo's view of the queue: the backend's queue, plus the two checks' bookkeeping around
/// each lease (a claim while it is held, the token of each accepted `done`). A [`Queue`] of
/// its own, so that the workers are the library's.
#[derive(Clone)]
struct Checked<B> {
    backend: B,
    counters: Arc<Counters>,
}

/// A lease of [`Checked`]: the queue's lease and whether it holds the item's claim.
struct CheckedLease<B: Backend> {
    lease: BackendLease<B>,
    token: u64,
    claimed: bool,
    queue: Checked<B>,
}

impl<B: Backend> fmt::Debug for CheckedLease<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckedLease")
            .field("lease", &self.lease)
            .field("claimed", &self.claimed)
            .finish()
    }
}

impl<B: Backend> CheckedLease<B> {
    /// Gives the claim back (before the lease ends, so that the next holder can claim).
    async fn unclaim(&mut self) -> Result<(), Error<B>> {
        let item = self.lease.item().clone();
        self.queue
            .backend
            .end_claim(&item, self.token, self.claimed)
            .await?;
        self.claimed = false;
        Ok(())
    }
}

impl<B: Backend> Checked<B> {
    /// Claims the item of `lease` for it: a second live claim means two workers at once.
    async fn claim(&self, lease: BackendLease<B>) -> Result<CheckedLease<B>, Error<B>> {
        let token = B::token(&lease);
        let claimed = self.backend.claim(lease.item(), token).await?;
        if !claimed {
            self.counters.overlaps.fetch_add(1, Ordering::Relaxed);
        }
        Ok(CheckedLease {
            lease,
            token,
            claimed,
            queue: self.clone(),
        })
    }

    /// Records how the step that ended lease `token` went: its token if the server accepted
    /// it, and a refusal if the lease was lost (then not recorded: the check counts only
    /// dones the server accepted). Hands `result` back.
    async fn ended<T>(
        &self,
        item: &str,
        token: u64,
        result: Result<T, Error<B>>,
    ) -> Result<T, Error<B>> {
        match result {
            Ok(value) => {
                self.backend.ended(item, token, true).await?;
                Ok(value)
            }
            Err(error) => {
                if <B::Queue as Queue>::is_lease_lost(&error) {
                    self.counters.refused.fetch_add(1, Ordering::Relaxed);
                }
                self.backend.ended(item, token, false).await?;
                Err(error)
            }
        }
    }
}

impl<B: Backend> Queue for Checked<B> {
    type Item = String;
    type Lease = CheckedLease<B>;
    type Error = Error<B>;

    fn name(&self) -> Option<&str> {
        Queue::name(self.backend.queue())
    }

    async fn add_with(&self, item: String, options: AddOptions) -> Result<bool, Error<B>> {
        Queue::add_with(self.backend.queue(), item, options).await
    }

    async fn forget(&self, item: &String) -> Result<(), Error<B>> {
        Queue::forget(self.backend.queue(), item).await
    }

    async fn num_requeues(&self, item: &String) -> Result<usize, Error<B>> {
        Queue::num_requeues(self.backend.queue(), item).await
    }

    async fn len(&self) -> Result<usize, Error<B>> {
        Queue::len(self.backend.queue()).await
    }

    /// Hands the next item out and claims it.
    async fn get(&self) -> Result<Option<CheckedLease<B>>, Error<B>> {
        match Queue::get(self.backend.queue()).await? {
            Some(lease) => self.claim(lease).await.map(Some),
            None => Ok(None),
        }
    }

    fn shut_down(&self) -> Vec<String> {
        Queue::shut_down(self.backend.queue())
    }

    async fn shut_down_with_drain(&self) -> Result<(), Error<B>> {
        Queue::shut_down_with_drain(self.backend.queue()).await
    }

    async fn is_shutting_down(&self) -> Result<bool, Error<B>> {
        Queue::is_shutting_down(self.backend.queue()).await
    }

    /// A failed item's re-add and done, as the backend's one fenced step (a stale holder's
    /// failure path changes nothing), with the claim given back first and the token recorded
    /// as [`done`](QueueLease::done) does. A lease the shut-down queue hands back is claimed
    /// again: it is still this worker's.
    async fn retry_and_done(
        &self,
        mut lease: CheckedLease<B>,
        options: AddOptions,
        forget: bool,
    ) -> Result<Option<CheckedLease<B>>, Error<B>> {
        lease.unclaim().await?;
        let (item, token) = (lease.lease.item().clone(), lease.token);
        match Queue::retry_and_done(self.backend.queue(), lease.lease, options, forget).await {
            Ok(Some(kept)) => self.claim(kept).await.map(Some),
            done => self.ended(&item, token, done).await.map(|_| None),
        }
    }

    fn is_lease_lost(error: &Error<B>) -> bool {
        <B::Queue as Queue>::is_lease_lost(error)
    }
}

impl<B: Backend> QueueLease for CheckedLease<B> {
    type Item = String;
    type Error = Error<B>;

    fn item(&self) -> &String {
        self.lease.item()
    }

    fn priority(&self) -> i32 {
        QueueLease::priority(&self.lease)
    }

    /// Marks the item done and, if the server accepted it, records the lease's token.
    async fn done(mut self) -> Result<(), Error<B>> {
        self.unclaim().await?;
        let (item, token) = (self.lease.item().clone(), self.token);
        let done = self.lease.done().await;
        self.queue.ended(&item, token, done).await
    }

    async fn release(mut self) -> Result<bool, Error<B>> {
        self.unclaim().await?;
        let (item, token) = (self.lease.item().clone(), self.token);
        let backend = self.queue.backend.clone();
        let released = QueueLease::release(self.lease).await;
        backend.ended(&item, token, false).await?;
        released
    }
}

/// One reconcile: a random latency, and a failure at `--failure-rate` (an `Err`, which the
/// workers retry with the queue's rate limiter and give up after `--max-retries`). A failure
/// that will be given up is recorded first, for the check.
async fn reconcile<B: Backend>(
    item: String,
    backend: B,
    max_retries: usize,
    counters: Arc<Counters>,
    (latency, failed): (Duration, bool),
) -> Result<(), String> {
    tokio::time::sleep(latency).await;
    counters.reconciles.fetch_add(1, Ordering::Relaxed);
    if !failed {
        return Ok(());
    }
    counters.failures.fetch_add(1, Ordering::Relaxed);
    let retries = Queue::num_requeues(backend.queue(), &item)
        .await
        .map_err(|e| e.to_string())?;
    if retries >= max_retries {
        backend.give_up(&item).await.map_err(|e| e.to_string())?;
    }
    Err("simulated failure".to_owned())
}

/// The objects whose last event was not reconciled after it arrived: no accepted `done` with
/// a token above the last add's sequence number, and not given up.
pub(super) fn missed<'a>(last_add: &'a HashMap<String, u64>, ledger: &Ledger) -> Vec<&'a str> {
    let mut missed: Vec<&str> = last_add
        .iter()
        .filter(|(item, seq)| {
            !ledger.given_up.contains(*item)
                && ledger.done.get(*item).is_none_or(|token| token <= seq)
        })
        .map(|(item, _)| item.as_str())
        .collect();
    missed.sort_unstable();
    missed
}

/// Runs the demo on backend `B`, on the server at `url`.
pub(super) async fn run<B: Backend>(args: DemoArgs, url: String) -> Result<ExitCode, Error<B>> {
    let backend = B::open(&url, &args.queue, args.workers).await?;
    let started = Instant::now();
    let helper = format!("{}-{}", std::process::id(), rand::random::<u64>());
    if args.workers_only {
        backend.helper(&helper, true).await?;
        // Wait for a producing process to (re)open the queue (this handle is not shut down
        // by itself: the answer is the fleet's).
        while Queue::is_shutting_down(backend.queue()).await? {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    } else {
        backend.reset().await?;
    }
    let counters = Arc::new(Counters::default());
    let checked = Checked {
        backend: backend.clone(),
        counters: counters.clone(),
    };
    // Seeded from the operating system: processes sharing the queue draw differently.
    let rng = Arc::new(Mutex::new(rand::make_rng::<SmallRng>()));
    let workers = Workers::new(checked)
        .count(args.workers)
        .max_retries(args.max_retries)
        .spawn_async({
            let (backend, counters) = (backend.clone(), counters.clone());
            let (failure_rate, max_retries) = (args.failure_rate, args.max_retries);
            move |item: String| {
                let draw = {
                    let mut rng = rng.lock().unwrap_or_else(|e| e.into_inner());
                    (
                        Duration::from_micros(rng.random_range(200..2200)),
                        rng.random::<f64>() < failure_rate,
                    )
                };
                reconcile(item, backend.clone(), max_retries, counters.clone(), draw)
            }
        });
    let mut last_add: HashMap<String, u64> = HashMap::new();
    let mut adds = 0_u64;
    if args.workers_only {
        eprintln!(
            "wq demo: {} workers on queue {} until it is shut down",
            args.workers, args.queue
        );
    } else {
        let mut rng = rand::make_rng::<SmallRng>();
        let per_event = args.duration.div_f64(args.events.max(1) as f64);
        let mut batch = Vec::new();
        for n in 0..args.events {
            // A few hot objects get most events.
            let object = if rng.random_bool(0.5) {
                rng.random_range(0..(args.objects / 10).max(1))
            } else {
                rng.random_range(0..args.objects.max(1))
            };
            batch.push(format!("default/object-{object}"));
            if batch.len() == 50 || n + 1 == args.events {
                for (item, seq) in batch.iter().zip(backend.add_batch(&batch).await?) {
                    last_add.insert(item.clone(), seq);
                }
                adds += batch.len() as u64;
                batch.clear();
                let due = per_event.saturating_mul(u32::try_from(n + 1).unwrap_or(u32::MAX));
                tokio::time::sleep(due.saturating_sub(started.elapsed())).await;
            }
        }
        // Drain: nothing queued, delayed or in flight in any process.
        while !backend.is_drained().await? {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Stops the workers of every process, including --workers-only ones.
        backend.shut_down_fleet().await?;
    }
    let summary = workers.wait().await;
    if args.workers_only {
        backend.helper(&helper, false).await?;
    }
    let elapsed = started.elapsed();
    let c = &counters;
    println!(
        "queue            {} ({})",
        args.queue,
        if args.workers_only {
            "workers only"
        } else {
            "producers and workers"
        }
    );
    if !args.workers_only {
        println!("events added     {adds} for {} objects", last_add.len());
    }
    println!(
        "reconciles       {} by this process's {} workers",
        c.reconciles.load(Ordering::Relaxed),
        args.workers
    );
    println!(
        "failures         {} (given up: {})",
        c.failures.load(Ordering::Relaxed),
        summary.given_up
    );
    println!(
        "refused dones    {} (leases lost)",
        c.refused.load(Ordering::Relaxed)
    );
    println!("elapsed          {:.1} s", elapsed.as_secs_f64());
    // A check's line: `ok`, or `FAILED (what)`.
    let check = |check: &str, ok: bool, what: String| {
        let verdict = if ok {
            "ok".to_owned()
        } else {
            format!("FAILED ({what})")
        };
        println!("check            {check}: {verdict}");
        ok
    };
    let overlaps = c.overlaps.load(Ordering::Relaxed);
    let mut ok = check(
        "never two workers at once",
        overlaps == 0,
        overlaps.to_string(),
    );
    if !args.workers_only {
        let missed = missed(&last_add, &backend.ledger().await?);
        ok &= check(
            "every last event reconciled after it arrived",
            missed.is_empty(),
            format!("{} objects", missed.len()),
        );
        leave_as_found(&backend).await?;
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Deletes the queue and its bookkeeping, once the `--workers-only` processes have seen
/// the fleet shut down and left (or [`HELPERS_LEAVE`] has passed): the server is left as
/// the demo found it, with no queue shut down for ever on it.
async fn leave_as_found<B: Backend>(backend: &B) -> Result<(), Error<B>> {
    let deadline = Instant::now() + HELPERS_LEAVE;
    let mut left = backend.helpers().await?;
    while left > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = backend.helpers().await?;
    }
    if left > 0 {
        eprintln!("wq demo: {left} --workers-only processes did not leave; deleting the queue");
    }
    backend.remove().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adds(pairs: &[(&str, u64)]) -> HashMap<String, u64> {
        pairs.iter().map(|&(k, v)| (k.to_owned(), v)).collect()
    }

    /// The control of the second check: made-up ledgers where an object's last event was
    /// missed are reported, and only those.
    #[test]
    fn the_check_reports_an_object_whose_last_event_no_done_followed() {
        let last_add = adds(&[("a", 10), ("b", 20), ("c", 30), ("d", 40)]);
        let ledger = Ledger {
            done: adds(&[
                // Reconciled after its last add: fine.
                ("a", 11),
                // Reconciled, but by a lease handed out before the last add: missed.
                ("b", 19),
                // A token equal to the add's sequence number is not "after" it.
                ("c", 30),
            ]),
            // "d": never reconciled at all.
            given_up: HashSet::new(),
        };
        assert_eq!(missed(&last_add, &ledger), ["b", "c", "d"]);

        // Every object reconciled after its last add, or given up ("d"): nothing missed.
        let ledger = Ledger {
            done: adds(&[("a", 11), ("b", 21), ("c", 31)]),
            given_up: ["d".to_owned()].into_iter().collect(),
        };
        assert!(missed(&last_add, &ledger).is_empty());
        // A give-up covers its own object only: "c", never reconciled, is missed.
        let ledger = Ledger {
            done: adds(&[("a", 11), ("b", 21)]),
            given_up: ["d".to_owned()].into_iter().collect(),
        };
        assert_eq!(missed(&last_add, &ledger), ["c"]);
    }
}
