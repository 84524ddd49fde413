//! `wq-bench --redis URL` and `wq-bench --postgres URL`: docs/bench-workloads.md's W1, W3 and W4,
//! and W3P (W3 with distinct keys), on our queue on a server (`impl` `workq-redis` or
//! `workq-postgres`), beside the references that live on the same kind of server (`crate::peers`:
//! BullMQ and pg-boss in node; with `--compare` the Rust crates), doing the same adds and
//! completions on the same server in the same run.
//!
//! The drivers of the workloads are written once, over [`Shared`]: what each backend
//! does per batch of adds and how its consumer takes and completes items.
//!
//! **Redis.** Both sides batch adds by 100 (`add_all` / `addBulk`, one round trip per batch)
//! and complete items one at a time; workq-redis completes and takes the next item in one
//! round trip (`done_and_get`), as a BullMQ worker does (`moveToFinished` fetches the next
//! job). W1 runs a second time with the consumer completing and taking 32 items per round trip
//! (`done_and_get_many`, `impl` `workq-redis-batch`), which BullMQ's open-source worker
//! has no counterpart for.
//!
//! **PostgreSQL.** workq-postgres adds batches of 100 in one statement and one commit
//! (`add_all`) and completes items one at a time, completing one and taking the next in one
//! statement and one commit (`done_and_get`, as `Workers` do through `Queue::done_and_next`);
//! getters wake on `LISTEN`/`NOTIFY`. W1 runs a second time with the consumer completing and
//! taking 32 items per statement (`done_and_get_many`, `impl` `workq-postgres-batch`). In
//! W4 each of the two consumers completes and takes up to 100 items per statement: one
//! commit per item (a WAL flush each, with default settings) cannot keep up with items
//! coming due at W4's rate.
//! pg-boss inserts batches of 100 (`insert`, one statement) and completes one job at a time (a
//! worker with `batchSize` 1); see `workq-bench/node/pg-boss/bench.mjs` for its queue policy and
//! polling interval.
//!
//! Our queues do more per item than either reference: fenced leases on the server's clock,
//! renewed while held, exact client-go dedup (a re-add while processing is delivered once more
//! after `done`).
//!
//! W3 uses each reference's unique-job feature where it has one (see each peer's settings in
//! the report); W3P has no dedup in the way, so every implementation adds and runs every item.
//! A reference that is not ready (no `node`, a failed build) is missing from the report with a
//! note saying why; one that cannot run a workload shows n/a with its reason.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use workq::DoneMany;
use workq_postgres::PgQueue;
use workq_redis::{Lease, RedisQueue};

use crate::ctx::Ctx;
use crate::report::Sample;
use crate::server::{Backend, Server};
use crate::util::text;

type Figures = Vec<(&'static str, f64)>;
type Error = String;

/// The sizes of a run: W1 items, W3 adds, W4 items.
fn sizes(quick: bool) -> (usize, usize, usize) {
    if quick {
        (3_000, 20_000, 3_000)
    } else {
        (20_000, 80_000, 10_000)
    }
}

/// Items per batch of adds, on both sides.
const ADD_BATCH: usize = 100;

/// What the workload drivers need of a queue on a server.
trait Shared: Clone + Send + Sync + 'static {
    /// A fresh, empty queue for `workload`.
    fn open(url: &str, workload: &str) -> impl Future<Output = Result<Self, Error>> + Send;
    /// Adds `keys` as one batch.
    fn add_batch(&self, keys: &[u64]) -> impl Future<Output = Result<(), Error>> + Send;
    /// Adds each key after its delay, as one batch.
    fn add_batch_after(
        &self,
        batch: Vec<(u64, Duration)>,
    ) -> impl Future<Output = Result<(), Error>> + Send;
    /// Processes items until the queue is shut down, taking up to `batch` per round trip where
    /// the backend can; calls `seen` for every item; returns how many it processed.
    fn consume(
        self,
        batch: usize,
        seen: impl FnMut(&u64) + Send + 'static,
    ) -> impl Future<Output = Result<usize, Error>> + Send;
    /// Items queued or being processed.
    fn pending(&self) -> impl Future<Output = Result<usize, Error>> + Send;
    /// Shuts this handle down (its getters return `None`).
    fn shut_down(&self) -> impl Future<Output = Result<(), Error>> + Send;
    /// Deletes the queue.
    fn delete(&self) -> impl Future<Output = Result<(), Error>> + Send;
}

impl Shared for RedisQueue<u64> {
    async fn open(url: &str, workload: &str) -> Result<Self, Error> {
        let queue = RedisQueue::builder(format!("wq-bench-{workload}-{}", std::process::id()))
            .url(url)
            .lease_duration(Duration::from_secs(30))
            .check_persistence(false)
            .build()
            .await
            .map_err(text)?;
        queue.delete().await.map_err(text)?;
        Ok(queue)
    }

    async fn add_batch(&self, keys: &[u64]) -> Result<(), Error> {
        self.add_all(keys).await.map(drop).map_err(text)
    }

    async fn add_batch_after(&self, batch: Vec<(u64, Duration)>) -> Result<(), Error> {
        self.add_all_after(batch).await.map(drop).map_err(text)
    }

    /// Completes the items in hand and takes up to `batch` next ones in one round trip.
    async fn consume(
        self,
        batch: usize,
        mut seen: impl FnMut(&u64) + Send + 'static,
    ) -> Result<usize, Error> {
        let mut count = 0;
        let mut current: Vec<Lease<u64>> = self.get().await.map_err(text)?.into_iter().collect();
        while !current.is_empty() {
            for lease in &current {
                seen(lease.item());
            }
            count += current.len();
            let finished = current.into_iter().map(|lease| (lease, false)).collect();
            let DoneMany { done, next, .. } = self
                .done_and_get_many(finished, batch)
                .await
                .map_err(text)?;
            done.into_iter().collect::<Result<(), _>>().map_err(text)?;
            current = if next.is_empty() {
                self.get().await.map_err(text)?.into_iter().collect()
            } else {
                next
            };
        }
        Ok(count)
    }

    async fn pending(&self) -> Result<usize, Error> {
        Ok(self.len().await.map_err(text)? + self.processing_len().await.map_err(text)?)
    }

    async fn shut_down(&self) -> Result<(), Error> {
        RedisQueue::shut_down(self);
        Ok(())
    }

    async fn delete(&self) -> Result<(), Error> {
        RedisQueue::delete(self).await.map_err(text)
    }
}

impl Shared for PgQueue<u64> {
    async fn open(url: &str, workload: &str) -> Result<Self, Error> {
        let queue = PgQueue::builder(format!("wq-bench-{workload}-{}", std::process::id()))
            .url(url)
            .lease_duration(Duration::from_secs(30))
            .build()
            .await
            .map_err(text)?;
        queue.delete().await.map_err(text)?;
        Ok(queue)
    }

    /// One statement and one commit per batch.
    async fn add_batch(&self, keys: &[u64]) -> Result<(), Error> {
        self.add_all(keys).await.map(drop).map_err(text)
    }

    /// One statement and one commit per batch.
    async fn add_batch_after(&self, batch: Vec<(u64, Duration)>) -> Result<(), Error> {
        self.add_all_after(batch).await.map(drop).map_err(text)
    }

    /// Completes the items in hand and takes up to `batch` next ones in one statement and one
    /// commit (`done_and_get_many`; with `batch` 1 it is `done_and_get`, as `Workers` step),
    /// and a waiting `get` when nothing was ready.
    async fn consume(
        self,
        batch: usize,
        mut seen: impl FnMut(&u64) + Send + 'static,
    ) -> Result<usize, Error> {
        let mut count = 0;
        let mut current: Vec<workq_postgres::Lease<u64>> =
            self.get().await.map_err(text)?.into_iter().collect();
        while !current.is_empty() {
            for lease in &current {
                seen(lease.item());
            }
            count += current.len();
            let leases = current.into_iter().map(|lease| (lease, false)).collect();
            let out = self.done_and_get_many(leases, batch).await.map_err(text)?;
            out.done
                .into_iter()
                .collect::<Result<(), _>>()
                .map_err(text)?;
            current = if out.next.is_empty() {
                self.get().await.map_err(text)?.into_iter().collect()
            } else {
                out.next
            };
        }
        Ok(count)
    }

    async fn pending(&self) -> Result<usize, Error> {
        Ok(self.len().await.map_err(text)? + self.processing_len().await.map_err(text)?)
    }

    async fn shut_down(&self) -> Result<(), Error> {
        PgQueue::shut_down(self);
        Ok(())
    }

    async fn delete(&self) -> Result<(), Error> {
        PgQueue::delete(self).await.map_err(text)
    }
}

/// W1: 1 producer adds `n` distinct keys; 1 consumer gets and completes them.
async fn w1<Q: Shared>(url: &str, n: usize, batch: usize) -> Result<Figures, Error> {
    let queue = Q::open(url, "w1").await?;
    let started = Instant::now();
    let producer = {
        let queue = queue.clone();
        tokio::spawn(async move {
            let keys: Vec<u64> = (0..n as u64).collect();
            for chunk in keys.chunks(ADD_BATCH) {
                queue.add_batch(chunk).await?;
            }
            Ok::<_, Error>(())
        })
    };
    let seen = Arc::new(AtomicUsize::new(0));
    let consumer = {
        let seen = seen.clone();
        tokio::spawn(queue.clone().consume(batch, move |_| {
            seen.fetch_add(1, Ordering::Relaxed);
        }))
    };
    producer.await.expect("producer")?;
    while seen.load(Ordering::Relaxed) < n {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = started.elapsed();
    queue.shut_down().await?;
    consumer.await.expect("consumer")?;
    queue.delete().await?;
    Ok(vec![("items_per_s", n as f64 / elapsed.as_secs_f64())])
}

/// W3 (`repeated`): 4 producers add the same 1,000 keys over and over (`adds` in all) while 2
/// consumers take them; adds/s, then deliveries and wall once drained. W3P: the same with
/// distinct keys, every add an item; adds/s only, nothing drained.
async fn w3<Q: Shared>(url: &str, adds: usize, repeated: bool) -> Result<Figures, Error> {
    let queue = Q::open(url, if repeated { "w3" } else { "w3p" }).await?;
    let started = Instant::now();
    let per_producer = adds / 4;
    let producers: Vec<_> = (0..4_u64)
        .map(|p| {
            let queue = queue.clone();
            tokio::spawn(async move {
                let keys: Vec<u64> = (0..per_producer as u64)
                    .map(|k| {
                        if repeated {
                            (k * 7 + p * 13) % 1000
                        } else {
                            p * per_producer as u64 + k
                        }
                    })
                    .collect();
                for chunk in keys.chunks(ADD_BATCH) {
                    queue.add_batch(chunk).await?;
                }
                Ok::<_, Error>(())
            })
        })
        .collect();
    let consumers: Vec<_> = (0..2)
        .map(|_| tokio::spawn(queue.clone().consume(1, |_| {})))
        .collect();
    for producer in producers {
        producer.await.expect("producer")?;
    }
    let adds_per_s = (per_producer * 4) as f64 / started.elapsed().as_secs_f64();
    if !repeated {
        // W3P times the adds alone: the consumers stop where they are.
        for consumer in &consumers {
            consumer.abort();
        }
        queue.delete().await?;
        return Ok(vec![("adds_per_s", adds_per_s)]);
    }
    while queue.pending().await? > 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let wall = started.elapsed();
    queue.shut_down().await?;
    let mut deliveries = 0;
    for consumer in consumers {
        deliveries += consumer.await.expect("consumer")?;
    }
    queue.delete().await?;
    Ok(vec![
        ("adds_per_s", adds_per_s),
        ("deliveries", deliveries as f64),
        ("wall_s", wall.as_secs_f64()),
    ])
}

/// W4: 1 producer adds `n` distinct keys with a random delay in [0, 2 s]; 2 consumers record
/// lateness (time of get minus intended ready time).
async fn w4<Q: Shared>(url: &str, n: usize, batch: usize) -> Result<Figures, Error> {
    let queue = Q::open(url, "w4").await?;
    let due: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let lateness: Arc<Mutex<Vec<f64>>> = Arc::default();
    let consumers: Vec<_> = (0..2)
        .map(|_| {
            let (due, lateness) = (due.clone(), lateness.clone());
            tokio::spawn(queue.clone().consume(batch, move |item| {
                let now = Instant::now();
                let at = due.lock().unwrap().get(item).copied();
                if let Some(at) = at {
                    // Signed: a job may start before its time.
                    let late = if now >= at {
                        (now - at).as_secs_f64() * 1000.0
                    } else {
                        -((at - now).as_secs_f64() * 1000.0)
                    };
                    lateness.lock().unwrap().push(late);
                }
            }))
        })
        .collect();
    let started = Instant::now();
    // A fixed seed: every run adds the same delays.
    let mut rng = StdRng::seed_from_u64(42);
    for chunk_start in (0..n as u64).step_by(ADD_BATCH) {
        let now = Instant::now();
        let batch: Vec<(u64, Duration)> = {
            let mut due_now = due.lock().unwrap();
            (chunk_start..(chunk_start + ADD_BATCH as u64).min(n as u64))
                .map(|key| {
                    let delay = Duration::from_millis(rng.random_range(0..2000));
                    due_now.insert(key, now + delay);
                    (key, delay)
                })
                .collect()
        };
        queue.add_batch_after(batch).await?;
    }
    let adds_per_s = n as f64 / started.elapsed().as_secs_f64();
    while lateness.lock().unwrap().len() < n {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let wall = started.elapsed();
    queue.shut_down().await?;
    for consumer in consumers {
        consumer.await.expect("consumer")?;
    }
    queue.delete().await?;
    let mut late = std::mem::take(&mut *lateness.lock().unwrap());
    late.sort_by(f64::total_cmp);
    // Early starts count as on time in the percentiles, and give the earliest start.
    let early_max = late.first().map_or(0.0, |first| (-first).max(0.0));
    let pct = |p: f64| late[((p / 100.0) * late.len() as f64) as usize % late.len()].max(0.0);
    Ok(vec![
        ("add_after_per_s", adds_per_s),
        ("lateness_p50_ms", pct(50.0)),
        ("lateness_p99_ms", pct(99.0)),
        (
            "lateness_max_ms",
            late.last().map_or(0.0, |last| last.max(0.0)),
        ),
        ("early_max_ms", early_max),
        ("wall_s", wall.as_secs_f64()),
    ])
}

// The workloads' side of a server, beside the workloads.
impl Server {
    /// Runs workload driver `redis` or `postgres`, whichever fits the server.
    fn drive<R, P>(&self, redis: R, postgres: P) -> Result<Figures, Error>
    where
        R: Future<Output = Result<Figures, Error>>,
        P: Future<Output = Result<Figures, Error>>,
    {
        match self.backend {
            Backend::Redis => self.runtime.block_on(redis),
            Backend::Postgres => self.runtime.block_on(postgres),
        }
    }
}

/// Measures `workload` of `size` on our queue (`ours`), then every reference on the same
/// server (its program given `extra` arguments after the size).
fn measure(
    ctx: &Ctx<'_>,
    workload: &'static str,
    size: usize,
    extra: &[String],
    ours: impl FnOnce(&Server) -> Result<Figures, Error>,
) -> Result<Vec<Sample>, String> {
    let server = ctx.server.ok_or("no server")?;
    let imp = server.backend.ours();
    ctx.step(&format!("{imp} ({size})"));
    let figures = ours(server)?;
    let metrics: Vec<&'static str> = figures.iter().map(|(metric, _)| *metric).collect();
    let mut samples: Vec<Sample> = figures
        .into_iter()
        .map(|(metric, value)| Sample::new(workload, imp, metric, value))
        .collect();
    for peer in &server.peers {
        ctx.step(&format!("{} ({size})", peer.name));
        let mut args = vec![workload.to_owned(), size.to_string()];
        args.extend_from_slice(extra);
        samples.extend(server.run_peer(peer, workload, &args, &metrics));
    }
    Ok(samples)
}

/// W1 on the server, beside the references; then with our consumer taking items in batches
/// ([`BATCH`] per round trip, `impl` `workq-redis-batch` or `workq-postgres-batch`).
pub(crate) fn run_w1(ctx: &Ctx<'_>) -> Result<Vec<Sample>, String> {
    let size = sizes(ctx.quick).0;
    let mut samples = measure(ctx, "W1", size, &[], |s| {
        s.drive(
            w1::<RedisQueue<u64>>(&s.url, size, 1),
            w1::<PgQueue<u64>>(&s.url, size, 1),
        )
    })?;
    let server = ctx.server.ok_or("no server")?;
    let batched = server.backend.ours_batched();
    ctx.step(&format!("{batched} ({size})"));
    let figures = server.drive(
        w1::<RedisQueue<u64>>(&server.url, size, BATCH),
        w1::<PgQueue<u64>>(&server.url, size, BATCH),
    )?;
    samples.extend(
        figures
            .into_iter()
            .map(|(metric, value)| Sample::new("W1", batched, metric, value)),
    );
    Ok(samples)
}

/// Items each W4 consumer on PostgreSQL completes and takes per statement: one commit a
/// batch lets two consumers keep up with 100,000 items coming due a second, which one
/// commit per item (a flush of the WAL each) cannot.
const W4_POSTGRES_BATCH: usize = 100;

/// Items a batched consumer completes and takes per round trip (`done_and_get_many`).
const BATCH: usize = 32;

/// The id of W3 with distinct keys: plain adds, every add an item.
pub(crate) const W3P: &str = "W3P";

/// W3 on the server, beside the references (their unique-job feature, where they have one).
pub(crate) fn run_w3(ctx: &Ctx<'_>) -> Result<Vec<Sample>, String> {
    let size = sizes(ctx.quick).1;
    measure(ctx, "W3", size, &[], |s| {
        s.drive(
            w3::<RedisQueue<u64>>(&s.url, size, true),
            w3::<PgQueue<u64>>(&s.url, size, true),
        )
    })
}

/// W3P on the server, beside the references: W3's producers and consumers with distinct
/// keys, so that every add of every implementation is an insert (its batch insert, with no
/// dedup in the way, beside consumers taking items); adds/s only.
pub(crate) fn run_w3p(ctx: &Ctx<'_>) -> Result<Vec<Sample>, String> {
    let size = sizes(ctx.quick).1;
    measure(ctx, W3P, size, &[], |s| {
        s.drive(
            w3::<RedisQueue<u64>>(&s.url, size, false),
            w3::<PgQueue<u64>>(&s.url, size, false),
        )
    })
}

/// W4 on the server, beside the references, whose two consumers each run as many jobs at a
/// time as ours take per round trip (one on Redis, [`W4_POSTGRES_BATCH`] on PostgreSQL).
pub(crate) fn run_w4(ctx: &Ctx<'_>) -> Result<Vec<Sample>, String> {
    let size = sizes(ctx.quick).2;
    // The references' consumers run as many jobs at a time as ours take per round trip.
    let batch = match ctx.server.ok_or("no server")?.backend {
        Backend::Redis => 1,
        Backend::Postgres => W4_POSTGRES_BATCH,
    };
    measure(ctx, "W4", size, &[batch.to_string()], |s| {
        s.drive(
            w4::<RedisQueue<u64>>(&s.url, size, 1),
            w4::<PgQueue<u64>>(&s.url, size, W4_POSTGRES_BATCH),
        )
    })
}
