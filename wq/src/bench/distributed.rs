//! `wq bench --redis URL`: BENCH.md's W1, W3 and W4 on a queue on Redis (`impl`
//! `workqueue-redis`), beside BullMQ (npm package `bullmq`, `impl` `bullmq`) doing the same adds
//! and completions on the same server in the same run, in the report of `wq bench`.
//!
//! Both sides batch adds by 100 (`add_all` / `addBulk`, one round trip per batch) and complete
//! items one at a time; workqueue-redis completes and takes the next item in one round trip
//! (`done_and_get`), as a BullMQ worker does (`moveToFinished` fetches the next job). W1 runs a
//! second time with the consumer completing and taking 32 items per round trip
//! (`done_and_get_many`, `impl` `workqueue-redis-batch`), which BullMQ's open-source worker
//! has no counterpart for.
//! workqueue-redis does more per item: fenced leases on the server clock, renewed while held,
//! exact client-go dedup (a re-add while processing is delivered once more after `done`).
//!
//! BullMQ runs in `node` (see [`super::bullmq`]); without `node`/`npm` its figures are missing
//! and a note says why.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use workqueue_redis::{DoneAndGetMany, Error, Lease, RedisQueue};

use super::Ctx;
use super::report::{OURS_REDIS, OURS_REDIS_BATCH, Sample};

type Figures = Vec<(&'static str, f64)>;

/// The sizes of a run: W1 items, W3 adds, W4 items.
fn sizes(quick: bool) -> (usize, usize, usize) {
    if quick {
        (3_000, 20_000, 3_000)
    } else {
        (20_000, 80_000, 10_000)
    }
}

async fn open(url: &str, workload: &str) -> Result<RedisQueue<u64>, Error> {
    let queue = RedisQueue::builder(format!("wq-bench-{workload}-{}", std::process::id()))
        .url(url)
        .lease_duration(Duration::from_secs(30))
        .check_persistence(false)
        .build()
        .await?;
    queue.delete().await?;
    Ok(queue)
}

/// Processes items until the queue is shut down, completing the items in hand and taking up to
/// `batch` next ones in one round trip; calls `seen` for every item.
async fn consume(
    queue: RedisQueue<u64>,
    batch: usize,
    mut seen: impl FnMut(&Lease<u64>) + Send,
) -> Result<usize, Error> {
    let mut count = 0;
    let mut current: Vec<Lease<u64>> = queue.get().await?.into_iter().collect();
    while !current.is_empty() {
        for lease in &current {
            seen(lease);
        }
        count += current.len();
        let DoneAndGetMany { done, next, .. } = queue.done_and_get_many(current, batch).await?;
        done.into_iter().collect::<Result<(), Error>>()?;
        current = if next.is_empty() {
            queue.get().await?.into_iter().collect()
        } else {
            next
        };
    }
    Ok(count)
}

/// W1: 1 producer adds `n` distinct keys; 1 consumer gets and completes them.
async fn w1(url: &str, n: usize, batch: usize) -> Result<Figures, Error> {
    let queue = open(url, "w1").await?;
    let started = Instant::now();
    let producer = {
        let queue = queue.clone();
        tokio::spawn(async move {
            let keys: Vec<u64> = (0..n as u64).collect();
            for chunk in keys.chunks(100) {
                queue.add_all(chunk).await?;
            }
            Ok::<_, Error>(())
        })
    };
    let seen = Arc::new(AtomicUsize::new(0));
    let consumer = {
        let (queue, seen) = (queue.clone(), seen.clone());
        tokio::spawn(consume(queue, batch, move |_| {
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

/// W3: 4 producers add the same 1,000 keys over and over (`adds` in all); 2 consumers.
async fn w3(url: &str, adds: usize) -> Result<Figures, Error> {
    let queue = open(url, "w3").await?;
    let started = Instant::now();
    let per_producer = adds / 4;
    let producers: Vec<_> = (0..4_u64)
        .map(|p| {
            let queue = queue.clone();
            tokio::spawn(async move {
                let keys: Vec<u64> = (0..per_producer as u64)
                    .map(|k| (k * 7 + p * 13) % 1000)
                    .collect();
                for chunk in keys.chunks(100) {
                    queue.add_all(chunk).await?;
                }
                Ok::<_, Error>(())
            })
        })
        .collect();
    let consumers: Vec<_> = (0..2)
        .map(|_| tokio::spawn(consume(queue.clone(), 1, |_| {})))
        .collect();
    for producer in producers {
        producer.await.expect("producer")?;
    }
    let adds_per_s = (per_producer * 4) as f64 / started.elapsed().as_secs_f64();
    while queue.len().await? > 0 || queue.processing_len().await? > 0 {
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
async fn w4(url: &str, n: usize) -> Result<Figures, Error> {
    let queue = open(url, "w4").await?;
    let due: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let lateness: Arc<Mutex<Vec<f64>>> = Arc::default();
    let consumers: Vec<_> = (0..2)
        .map(|_| {
            let (due, lateness) = (due.clone(), lateness.clone());
            tokio::spawn(consume(queue.clone(), 1, move |lease| {
                let now = Instant::now();
                let at = due.lock().unwrap().get(lease.item()).copied();
                if let Some(at) = at {
                    let late = now.saturating_duration_since(at).as_secs_f64() * 1000.0;
                    lateness.lock().unwrap().push(late);
                }
            }))
        })
        .collect();
    let started = Instant::now();
    // A fixed seed: every run adds the same delays.
    let mut rng = StdRng::seed_from_u64(42);
    for chunk_start in (0..n as u64).step_by(100) {
        let now = Instant::now();
        let batch: Vec<(u64, Duration)> = {
            let mut due_now = due.lock().unwrap();
            (chunk_start..(chunk_start + 100).min(n as u64))
                .map(|key| {
                    let delay = Duration::from_millis(rng.random_range(0..2000));
                    due_now.insert(key, now + delay);
                    (key, delay)
                })
                .collect()
        };
        queue.add_all_after(batch).await?;
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
    let pct = |p: f64| late[((p / 100.0) * late.len() as f64) as usize % late.len()];
    Ok(vec![
        ("add_after_per_s", adds_per_s),
        ("lateness_p50_ms", pct(50.0)),
        ("lateness_p99_ms", pct(99.0)),
        ("lateness_max_ms", *late.last().unwrap_or(&0.0)),
        ("wall_s", wall.as_secs_f64()),
    ])
}

/// A Redis server to measure on, with what it takes: a runtime for the async client, and
/// BullMQ installed (or why not).
pub(crate) struct Server {
    url: String,
    runtime: tokio::runtime::Runtime,
    /// The BullMQ script, installed, or why BullMQ is not measured.
    bullmq: Result<PathBuf, String>,
    /// The server's persistence settings, for the report.
    pub(crate) description: String,
    /// What could not be measured, for the report.
    pub(crate) notes: Mutex<Vec<String>>,
}

impl Server {
    /// Connects to the server at `url`; installs BullMQ unless `no_bullmq`.
    pub(crate) fn connect(url: String, no_bullmq: bool) -> Result<Self, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start a runtime: {e}"))?;
        let probe: RedisQueue<u64> = runtime
            .block_on(
                RedisQueue::builder("wq-bench-probe")
                    .url(url.as_str())
                    .build(),
            )
            .map_err(|e| e.to_string())?;
        let description = probe
            .persistence()
            .map(ToString::to_string)
            .unwrap_or_default();
        let bullmq = if no_bullmq {
            Err("skipped (--no-bullmq)".to_owned())
        } else {
            super::bullmq::ready()
        };
        Ok(Self {
            url,
            runtime,
            bullmq,
            description,
            notes: Mutex::default(),
        })
    }

    /// The notes, each once, in the order they were made.
    pub(crate) fn notes(&self) -> Vec<String> {
        let mut notes = self.notes.lock().unwrap_or_else(|e| e.into_inner()).clone();
        notes.dedup();
        notes
    }
}

/// Measures `workload` of `size` on workqueue-redis (`ours`), then BullMQ on the same server.
fn measure<F>(
    ctx: &Ctx<'_>,
    workload: &'static str,
    size: usize,
    ours: impl FnOnce(String) -> F,
) -> Result<Vec<Sample>, String>
where
    F: std::future::Future<Output = Result<Figures, Error>>,
{
    let server = ctx.redis.ok_or("no Redis server")?;
    ctx.step(&format!("{OURS_REDIS} ({size})"));
    let figures = server
        .runtime
        .block_on(ours(server.url.clone()))
        .map_err(|e| e.to_string())?;
    let mut samples: Vec<Sample> = figures
        .into_iter()
        .map(|(metric, value)| Sample::new(workload, OURS_REDIS, metric, value))
        .collect();
    let mut notes = server.notes.lock().unwrap_or_else(|e| e.into_inner());
    match &server.bullmq {
        Ok(script) => {
            ctx.step(&format!("bullmq ({size})"));
            match super::bullmq::run(script, &server.url, workload, size) {
                Ok(theirs) => samples.extend(theirs),
                Err(e) => notes.push(format!("{workload} bullmq: {e}")),
            }
        }
        Err(e) => notes.push(format!("bullmq not measured: {e}")),
    }
    Ok(samples)
}

/// W1 on Redis, beside BullMQ; then with the consumer taking items in batches
/// ([`BATCH`] per round trip, `impl` `workqueue-redis-batch`).
pub(crate) fn run_w1(ctx: &Ctx<'_>) -> Result<Vec<Sample>, String> {
    let size = sizes(ctx.quick).0;
    let mut samples = measure(ctx, "W1", size, move |url| async move {
        w1(&url, size, 1).await
    })?;
    let server = ctx.redis.ok_or("no Redis server")?;
    ctx.step(&format!("{OURS_REDIS_BATCH} ({size})"));
    let figures = server
        .runtime
        .block_on(w1(&server.url, size, BATCH))
        .map_err(|e| e.to_string())?;
    samples.extend(
        figures
            .into_iter()
            .map(|(metric, value)| Sample::new("W1", OURS_REDIS_BATCH, metric, value)),
    );
    Ok(samples)
}

/// Items a batched consumer completes and takes per round trip (`done_and_get_many`).
const BATCH: usize = 32;

/// W3 on Redis, beside BullMQ.
pub(crate) fn run_w3(ctx: &Ctx<'_>) -> Result<Vec<Sample>, String> {
    let size = sizes(ctx.quick).1;
    measure(
        ctx,
        "W3",
        size,
        move |url| async move { w3(&url, size).await },
    )
}

/// W4 on Redis, beside BullMQ.
pub(crate) fn run_w4(ctx: &Ctx<'_>) -> Result<Vec<Sample>, String> {
    let size = sizes(ctx.quick).2;
    measure(
        ctx,
        "W4",
        size,
        move |url| async move { w4(&url, size).await },
    )
}
