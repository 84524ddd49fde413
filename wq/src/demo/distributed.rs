//! `wq demo --redis URL`: the demo's controller on a queue on Redis, shared by processes.
//!
//! Producers emit change events for a set of objects (many duplicates, which the queue
//! merges); workers reconcile with a random latency and fail at `--failure-rate`, retried
//! with the queue's server-side rate limiter and given up after `--max-retries`. Run it once
//! with producers and workers, and as many `--workers-only` processes (on any machine) as you
//! like: they share one queue. Two checks are made across all processes, on the server:
//!
//! - no object was ever reconciled by two workers at once (a claim hash next to the queue);
//! - every object's last event was reconciled after it arrived (its add's sequence number is
//!   below the token of an accepted `done`), unless the object was given up.
//!
//! The producing process waits for the queue to drain, shuts it down (which ends the
//! `--workers-only` processes) and prints the table. Exit code 0 if both checks hold.
//!
//! The workers are [`workqueue::Workers`], the same pool as in memory, over the queue on
//! Redis: retries, give-ups and the stop come from it. The checks wrap the queue in
//! [`Checked`], a [`Queue`] that claims each item as it is handed out and records the fencing
//! token of each accepted `done`.

use std::collections::HashMap;
use std::fmt;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::RngExt;
use rand::rngs::SmallRng;
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use workqueue::{AddOptions, Queue, QueueLease, Workers};
use workqueue_redis::{Error, Lease, RateLimit, RedisQueue};

/// Options of the demo on Redis (`wq demo --redis URL`, and the deprecated `wq redis demo`).
#[derive(Debug, clap::Args)]
pub(crate) struct DemoArgs {
    /// The server: `redis://[user:password@]host:port[/db]`, or rediss:// for TLS. Default
    /// $WQ_REDIS_URL; put a URL with a password there, not on the command line, where every
    /// user of the machine can read it.
    #[arg(long, env = "WQ_REDIS_URL", hide_env_values = true)]
    pub(crate) url: String,
    /// The queue's name (all processes of one demo use the same).
    #[arg(long, default_value = "demo")]
    pub(crate) queue: String,
    /// How many objects the simulated cluster holds.
    #[arg(long, default_value_t = 200)]
    pub(crate) objects: u64,
    /// How many change events the producers emit in all.
    #[arg(long, default_value_t = 5000)]
    pub(crate) events: u64,
    /// How many workers this process runs.
    #[arg(long, default_value_t = 8)]
    pub(crate) workers: usize,
    /// The fraction of reconciles that fail and are retried with backoff.
    #[arg(long, default_value_t = 0.05)]
    pub(crate) failure_rate: f64,
    /// Give an object up after this many failed reconciles in a row.
    #[arg(long, default_value_t = 5)]
    pub(crate) max_retries: usize,
    /// How long the producers emit events, in seconds.
    #[arg(long, default_value_t = 5.0)]
    pub(crate) duration: f64,
    /// Runs only workers, on a queue another `wq demo --redis` process produces into; ends when
    /// that process shuts the queue down.
    #[arg(long)]
    pub(crate) workers_only: bool,
}

#[derive(Default)]
struct Counters {
    reconciles: AtomicU64,
    failures: AtomicU64,
    overlaps: AtomicU64,
    refused: AtomicU64,
}

fn key(name: &str, suffix: &str) -> String {
    format!("wq-demo:{{{name}}}:{suffix}")
}

/// The demo's view of the queue: the queue on Redis, plus the two checks' bookkeeping around
/// each lease (a claim while it is held, the token of each accepted `done`). A [`Queue`] of
/// its own, so that the workers are the library's.
#[derive(Clone)]
struct Checked {
    queue: RedisQueue<String>,
    con: ConnectionManager,
    /// The claims hash: item -> token of the lease that holds it.
    claims: Arc<str>,
    /// Item -> token of its last accepted `done`.
    done_tokens: Arc<str>,
    counters: Arc<Counters>,
}

/// A lease of [`Checked`]: the queue's lease and whether it holds the item's claim.
struct CheckedLease {
    lease: Lease<String>,
    claimed: bool,
    queue: Checked,
}

impl fmt::Debug for CheckedLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckedLease")
            .field("lease", &self.lease)
            .field("claimed", &self.claimed)
            .finish()
    }
}

impl CheckedLease {
    /// Gives the claim back (before the lease ends, so that the next holder can claim).
    async fn unclaim(&mut self) -> Result<(), Error> {
        if self.claimed {
            let _: () = self
                .queue
                .con
                .clone()
                .hdel(&*self.queue.claims, self.lease.item())
                .await?;
            self.claimed = false;
        }
        Ok(())
    }
}

impl Queue for Checked {
    type Item = String;
    type Lease = CheckedLease;
    type Error = Error;

    fn name(&self) -> Option<&str> {
        Queue::name(&self.queue)
    }

    async fn add_with(&self, item: String, options: AddOptions) -> Result<bool, Error> {
        Queue::add_with(&self.queue, item, options).await
    }

    async fn forget(&self, item: &String) -> Result<(), Error> {
        Queue::forget(&self.queue, item).await
    }

    async fn num_requeues(&self, item: &String) -> Result<usize, Error> {
        Queue::num_requeues(&self.queue, item).await
    }

    async fn len(&self) -> Result<usize, Error> {
        Queue::len(&self.queue).await
    }

    /// Hands the next item out and claims it: a second live claim means two workers at once.
    async fn get(&self) -> Result<Option<CheckedLease>, Error> {
        let Some(lease) = Queue::get(&self.queue).await? else {
            return Ok(None);
        };
        let claimed: bool = self
            .con
            .clone()
            .hset_nx(&*self.claims, lease.item(), lease.token())
            .await?;
        if !claimed {
            self.counters.overlaps.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Some(CheckedLease {
            lease,
            claimed,
            queue: self.clone(),
        }))
    }

    fn shut_down(&self) -> Vec<String> {
        Queue::shut_down(&self.queue)
    }

    async fn shut_down_with_drain(&self) -> Result<(), Error> {
        Queue::shut_down_with_drain(&self.queue).await
    }

    async fn is_shutting_down(&self) -> Result<bool, Error> {
        Queue::is_shutting_down(&self.queue).await
    }
}

impl QueueLease for CheckedLease {
    type Item = String;
    type Error = Error;

    fn item(&self) -> &String {
        self.lease.item()
    }

    fn priority(&self) -> i32 {
        QueueLease::priority(&self.lease)
    }

    /// Marks the item done and, if the server accepted it, records the lease's token.
    async fn done(mut self) -> Result<(), Error> {
        self.unclaim().await?;
        let (item, token) = (self.lease.item().clone(), self.lease.token());
        match self.lease.done().await {
            Ok(()) => {
                let _: () = self
                    .queue
                    .con
                    .clone()
                    .hset(&*self.queue.done_tokens, &item, token)
                    .await?;
                Ok(())
            }
            Err(error) => {
                if error.is_lease_lost() {
                    self.queue.counters.refused.fetch_add(1, Ordering::Relaxed);
                }
                Err(error)
            }
        }
    }

    async fn release(mut self) -> Result<bool, Error> {
        self.unclaim().await?;
        QueueLease::release(self.lease).await
    }
}

/// One reconcile: a random latency, and a failure at `--failure-rate` (an `Err`, which the
/// workers retry with the queue's rate limiter and give up after `--max-retries`). A failure
/// that will be given up is recorded first, for the check.
async fn reconcile(
    item: String,
    queue: RedisQueue<String>,
    mut con: ConnectionManager,
    args: Arc<DemoArgs>,
    counters: Arc<Counters>,
    (latency, failed): (Duration, bool),
) -> Result<(), String> {
    tokio::time::sleep(latency).await;
    counters.reconciles.fetch_add(1, Ordering::Relaxed);
    if !failed {
        return Ok(());
    }
    counters.failures.fetch_add(1, Ordering::Relaxed);
    let retries = queue.num_requeues(&item).await.map_err(|e| e.to_string())?;
    if retries >= args.max_retries {
        let _: () = con
            .sadd(key(&args.queue, "given-up"), &item)
            .await
            .map_err(|e| e.to_string())?;
    }
    Err("simulated failure".to_owned())
}

/// Runs the demo on Redis.
pub(crate) async fn run(args: DemoArgs) -> Result<ExitCode, Error> {
    let args = Arc::new(args);
    let queue: RedisQueue<String> = RedisQueue::builder(args.queue.as_str())
        .url(args.url.as_str())
        .lease_duration(Duration::from_secs(10))
        .rate_limit(RateLimit::exponential(
            Duration::from_millis(5),
            Duration::from_secs(1),
        ))
        .build()
        .await?;
    let client = redis::Client::open(args.url.as_str())?;
    let mut con = client.get_connection_manager().await?;
    let started = Instant::now();
    if args.workers_only {
        // Wait for a producing process to (re)open the queue.
        while queue.is_fleet_shut_down().await? {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    } else {
        queue.delete().await?;
        let _: () = con
            .del(&[
                key(&args.queue, "claims"),
                key(&args.queue, "done"),
                key(&args.queue, "given-up"),
            ])
            .await?;
    }
    let counters = Arc::new(Counters::default());
    let checked = Checked {
        queue: queue.clone(),
        con: con.clone(),
        claims: key(&args.queue, "claims").into(),
        done_tokens: key(&args.queue, "done").into(),
        counters: counters.clone(),
    };
    // Seeded from the operating system: processes sharing the queue draw differently.
    let rng = Arc::new(Mutex::new(rand::make_rng::<SmallRng>()));
    let workers = Workers::new(checked)
        .count(args.workers)
        .max_retries(args.max_retries)
        .spawn_async({
            let (queue, con, args, counters) =
                (queue.clone(), con.clone(), args.clone(), counters.clone());
            move |item: String| {
                let draw = {
                    let mut rng = rng.lock().unwrap_or_else(|e| e.into_inner());
                    (
                        Duration::from_micros(rng.random_range(200..2200)),
                        rng.random::<f64>() < args.failure_rate,
                    )
                };
                reconcile(
                    item,
                    queue.clone(),
                    con.clone(),
                    args.clone(),
                    counters.clone(),
                    draw,
                )
            }
        });
    let mut last_add: HashMap<String, u64> = HashMap::new();
    let mut adds = 0_u64;
    if !args.workers_only {
        let mut rng = rand::make_rng::<SmallRng>();
        let per_event = Duration::from_secs_f64(args.duration.max(0.0) / args.events.max(1) as f64);
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
                for (item, added) in batch.iter().zip(queue.add_all(&batch).await?) {
                    last_add.insert(item.clone(), added.seq);
                }
                adds += batch.len() as u64;
                batch.clear();
                let due = started + per_event * (n + 1) as u32;
                tokio::time::sleep_until(due.into()).await;
            }
        }
        // Drain: nothing queued, delayed or in flight in any process.
        loop {
            let stats = queue.stats(1).await?;
            if stats.depth == 0 && stats.delayed == 0 && stats.in_flight == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Stops the workers of every process, including --workers-only ones.
        queue.shut_down_fleet().await?;
    }
    let summary = workers.wait().await;
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
    let overlaps = c.overlaps.load(Ordering::Relaxed);
    println!(
        "check            never two workers at once: {}",
        if overlaps == 0 {
            "ok".to_string()
        } else {
            format!("FAILED ({overlaps})")
        }
    );
    let mut ok = overlaps == 0;
    if !args.workers_only {
        let done: HashMap<String, u64> = con.hgetall(key(&args.queue, "done")).await?;
        let given_up: Vec<String> = con.smembers(key(&args.queue, "given-up")).await?;
        let missed: Vec<&String> = last_add
            .iter()
            .filter(|(item, seq)| {
                !given_up.contains(item) && done.get(*item).is_none_or(|token| token <= seq)
            })
            .map(|(item, _)| item)
            .collect();
        println!(
            "check            every last event reconciled after it arrived: {}",
            if missed.is_empty() {
                "ok".to_string()
            } else {
                format!("FAILED ({} objects)", missed.len())
            }
        );
        ok &= missed.is_empty();
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
