//! `apalis` 1.0 with its Redis storage (`apalis-redis`) and its PostgreSQL storage
//! (`apalis-postgres`).
//!
//! Used as their documentation shows it for throughput: tasks pushed through the storage's
//! sink with `push_all` (its batch insert: the sink buffers the tasks and writes them in one
//! Lua script on Redis, one `INSERT ... SELECT unnest(...)` statement on PostgreSQL), a worker
//! per consumer with the `concurrency` layer set to the workload's workers and the storage's
//! fetch `batch_size` at its default, 10 (see [`BATCH_SIZE`]), acknowledgements batched by
//! apalis's persistence layer (built in: results gathered while the worker runs are written
//! together), on PostgreSQL the storage's `with_pubsub` (`LISTEN`/`NOTIFY`) so that a worker
//! wakes on new tasks, and on both a polling interval of 20 ms (`poll_with_interval`'s, River's
//! bench command's figure, through a strategy of ours that keeps its timer armed, [`Every`]):
//! without it a worker that found its queue empty waits for its next heartbeat (30 s) on
//! Redis, and delayed tasks are promoted only when a worker polls.
//!
//! Delays (`run_after`) are kept in whole seconds by both storages (the run time is a Unix
//! timestamp in seconds), so a delayed task runs up to a second late. The dedup workload uses
//! idempotency keys: on Redis a key, once taken, stays taken for its TTL and is not released
//! when the task completes, so a key is delivered once per TTL whatever happens later. The TTL
//! is set (an hour): with none, apalis-redis 1.0.0 passes a TTL of 0 to its script, whose
//! `EXPIRE key 0` deletes the key at once, so nothing is deduplicated. On PostgreSQL the key
//! is a unique index with no `ON CONFLICT`, so a batch holding a key already present fails as
//! a whole: n/a.
//!
//! Two limits of apalis-redis 1.0.0 decide how it runs here:
//! - **At most 7,999 tasks due at once.** Every task pushed goes to the scheduled set (its run
//!   time is never earlier than the push, in seconds), and each fetch first moves every due
//!   task from there to the active list in one `RPUSH` of Lua's `unpack(ids)`, which Redis's
//!   Lua refuses from 8,000 values on ("too many results to unpack"). From then on every fetch
//!   of every worker fails, the workers end, and the tasks stay where they are: no setting
//!   bounds that move (`batch_size` bounds what a fetch takes from the active list, after it).
//!   A queue drains only while its workers fetch often enough that fewer than 8,000 tasks
//!   become due between two fetches: a flood with workers running does (each fetch moves the
//!   batches of 100 added since the last); a burn-down of a backlog added before the workers
//!   start cannot when the backlog holds 8,000 or more: W7B is n/a for it there
//!   ([`MOST_DUE`]). A worker that ends so ends its W7 process, and the phase fails at once
//!   instead of waiting for its drain limit.
//! - **Locking a task costs a walk of the whole active list.** With `lock_tasks` (on by
//!   default) each task taken sends a lock event whose script runs `LREM` of the task's id on
//!   the active list, a walk of the whole list (the id was already removed by the fetch), so a
//!   backlog of n tasks costs O(n^2): a W7 flood of 100,000 spent 2.4 ms of the server's time
//!   per task in `LREM`, slowed the fetches until more than 8,000 tasks were due at once, and
//!   then stalled (the limit above). `Config::lock_tasks(false)` avoids it, and is set here:
//!   the fetch still records each task in the worker's inflight set, from which a dead
//!   worker's tasks are put back, and the acknowledgement still removes it from there; what it
//!   gives up is the task's `Running` status and `locked_by` in its metadata (for
//!   apalis-board) and their renewal at each heartbeat. A flood of 20,000 at 16 workers ran at
//!   4.5 k tasks/s with it and 29 k without on the same server.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use apalis::prelude::{
    BackendExt, BoxDynError, Data, PollSnapshot, PollStrategy, TaskBuilder, TaskSink,
    WorkerBuilder, WorkerBuilderExt, WorkerError,
};
use apalis_postgres::{PgPool, PostgresStorage};
use apalis_redis::{ConnectionManager, RedisStorage};
use futures::stream;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::peer::{Error, Handler, Job, Peer, Result, Running};

/// The task of every workload: its id.
#[derive(Clone, Debug, Deserialize, Serialize)]
struct Item {
    k: u64,
}

/// How long an idempotency key of apalis-redis is kept.
const IDEMPOTENCY_TTL: Duration = Duration::from_secs(3600);

/// The polling interval of a worker, beside the storage's own wake-ups.
const POLL: Duration = Duration::from_millis(20);

/// The most tasks due at once that a fetch of apalis-redis 1.0.0 can move (see the module's
/// docs): from 8,000 on, every fetch of every worker fails.
const MOST_DUE: usize = 7_999;

/// The storage's fetch batch: its default. A larger one (as many as the workers run at a
/// time, 100 in W4 on PostgreSQL) stalled a worker until its next heartbeat, 30 s, in about
/// half the runs of W4 on apalis-postgres 1.0.0.
const BATCH_SIZE: usize = 10;

/// A worker's polling interval, as `poll_with_interval` means it, with its next timer always
/// armed. apalis-core 1.0.0's `IntervalStrategy` replaces a delay that fired with a new one it
/// does not poll, so when the fetch started by that poll comes back empty and no task is in
/// hand, nothing wakes the worker before its heartbeat (30 s), and on Redis the tasks added
/// meanwhile can pass [`MOST_DUE`]. One W7 paced phase (1 process, 1 ms, 5.8 k tasks/s) ended
/// so on the first run with `lock_tasks(false)`, in one of four; a rerun of that shape passed
/// twice, so the lost wake-up is the likely cause, not a proven one.
struct Every {
    interval: Duration,
    next: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Every {
    fn new(interval: Duration) -> Self {
        Self {
            interval,
            next: None,
        }
    }
}

impl PollStrategy for Every {
    fn poll_drive(&mut self, cx: &mut Context<'_>, _: &PollSnapshot) -> Poll<Option<()>> {
        let mut fired = false;
        loop {
            let interval = self.interval;
            let next = self
                .next
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(interval)));
            if next.as_mut().poll(cx).is_pending() {
                // The timer that will wake the worker is registered.
                return if fired {
                    Poll::Ready(Some(()))
                } else {
                    Poll::Pending
                };
            }
            fired = true;
            self.next = None;
        }
    }
}

/// The driver's handler, as the data of a worker (a named type: apalis's handler traits are
/// not general enough over a bare trait object's elided lifetimes).
#[derive(Clone)]
struct Call(Handler);

/// The task function of every worker: passes the id to the driver's handler.
async fn run(item: Item, call: Data<Call>) -> std::result::Result<(), BoxDynError> {
    let Call(handler) = &*call;
    handler(item.k).await;
    Ok(())
}

/// A worker name no other worker of this process uses (apalis registers each by name).
fn worker_name(queue: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{queue}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs a worker (`run`: its `run_until` on the signal `stop` resolves) on a task of its own;
/// [`Running::stop`] resolves the signal and waits for it, and [`Running::ended`] reports an
/// error that ends it first (a failed fetch: see the module's docs).
fn start(
    stop: oneshot::Sender<()>,
    run: impl Future<Output = std::result::Result<(), WorkerError>> + Send + 'static,
) -> Running {
    let (ended, ending) = oneshot::channel();
    let task = tokio::spawn(async move {
        let result = run.await;
        if let Err(e) = &result {
            let _ = ended.send(e.to_string());
        }
        Ok::<_, Error>(result?)
    });
    Running::new(move || {
        Box::pin(async move {
            let _ = stop.send(());
            task.await??;
            Ok(())
        })
    })
    .ending(ending)
}

/// The signal `run_until` waits for.
async fn signal(stop: oneshot::Receiver<()>) -> std::result::Result<(), std::io::Error> {
    let _ = stop.await;
    Ok(())
}

/// A handle on one apalis queue on Redis.
#[derive(Clone)]
pub(crate) struct ApalisRedis {
    name: String,
    conn: ConnectionManager,
}

impl ApalisRedis {
    fn storage(&self) -> RedisStorage<Item> {
        RedisStorage::new(self.conn.clone()).with_config(
            apalis_redis::Config::default()
                .queue(&self.name)
                .batch_size(BATCH_SIZE)
                .lock_tasks(false)
                .idempotency_ttl(Some(IDEMPOTENCY_TTL)),
        )
    }
}

impl Peer for ApalisRedis {
    const NAME: &'static str = "apalis-redis";
    const URL_VAR: &'static str = "WQ_REDIS_URL";

    async fn open(url: &str, name: &str) -> Result<Self> {
        Ok(Self {
            name: name.to_owned(),
            conn: apalis_redis::connect(url).await?,
        })
    }

    async fn add(&self, jobs: &[Job]) -> Result<()> {
        let tasks: Vec<_> = jobs
            .iter()
            .map(|job| {
                let mut task = TaskBuilder::new(Item { k: job.id });
                if !job.delay.is_zero() {
                    task = task.run_after(job.delay);
                }
                if job.unique {
                    task = task.idempotency_key(format!("key-{}", job.id));
                }
                task.build()
            })
            .collect();
        self.storage().push_all(stream::iter(tasks)).await?;
        Ok(())
    }

    async fn work(&self, concurrency: usize, handler: Handler) -> Result<Running> {
        let (stop, stopped) = oneshot::channel();
        let worker = WorkerBuilder::new(worker_name(&self.name))
            .backend(self.storage().poll_with_strategy(Every::new(POLL)))
            .data(Call(handler))
            .concurrency(concurrency)
            .build(run);
        Ok(start(stop, worker.run_until(signal(stopped))))
    }

    async fn pending(&self) -> Result<u64> {
        let config = self.storage().get_config().clone();
        let mut conn = self.conn.clone();
        // The waiting tasks, the scheduled ones (every task goes through that set first) and
        // those in the inflight set of each registered worker, `QUEUE:inflight:WORKER`:
        // fetched, running or in the worker's buffer.
        let script = redis::Script::new(
            "local n = redis.call('LLEN', KEYS[1]) + redis.call('ZCARD', KEYS[2]) \
             for _, worker in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do \
               n = n + redis.call('SCARD', ARGV[1] .. ':' .. worker) end \
             return n",
        );
        let n: u64 = script
            .key(config.active_jobs_list())
            .key(config.scheduled_jobs_set())
            .key(config.workers_set())
            .arg(config.inflight_jobs_set())
            .invoke_async(&mut conn)
            .await?;
        Ok(n)
    }

    async fn delete(&self) -> Result<()> {
        // Every key of the queue is `NAME:...`; SCAN, not KEYS, so that a shared server is not
        // blocked while a large keyspace is walked.
        let mut conn = self.conn.clone();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{}:*", self.name))
                .arg("COUNT")
                .arg(1_000)
                .query_async(&mut conn)
                .await?;
            if !keys.is_empty() {
                let _: () = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await?;
            }
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }

    fn backlog_not_applicable(items: usize) -> Option<String> {
        (items > MOST_DUE).then(|| {
            format!(
                "a backlog of {items} due tasks: apalis-redis 1.0.0's fetch moves every due task \
                 in one Lua unpack, which fails from 8,000 on, so no worker ever fetches (at \
                 most {MOST_DUE})"
            )
        })
    }

    fn settings() -> String {
        format!(
            "push_all of each batch (one script); a worker per consumer with .concurrency(the \
             workload's workers), Config::batch_size 10 (its default), lock_tasks(false) (a \
             task's lock walks the whole active list: quadratic in the backlog) and \
             a poll every 20 ms (poll_with_strategy: poll_with_interval's, its timer kept \
             armed); acknowledgements batched by the persistence layer \
             (built in); idempotency keys with a TTL of an hour for the dedup workload (a key \
             is delivered once per TTL); a burn-down of at most {MOST_DUE} tasks (a fetch \
             cannot move 8,000 due tasks at once)"
        )
    }
}

/// A handle on one apalis queue on PostgreSQL.
#[derive(Clone)]
pub(crate) struct ApalisPostgres {
    name: String,
    pool: PgPool,
}

impl ApalisPostgres {
    fn storage(&self) -> PostgresStorage<Item> {
        PostgresStorage::new(&self.pool).with_config(
            apalis_postgres::Config::default()
                .queue(&self.name)
                .batch_size(BATCH_SIZE),
        )
    }
}

impl Peer for ApalisPostgres {
    const NAME: &'static str = "apalis-postgres";
    const URL_VAR: &'static str = "WQ_POSTGRES_URL";

    async fn open(url: &str, name: &str) -> Result<Self> {
        let pool = PgPool::connect(url).await?;
        PostgresStorage::setup(&pool).await?;
        Ok(Self {
            name: name.to_owned(),
            pool,
        })
    }

    async fn add(&self, jobs: &[Job]) -> Result<()> {
        let tasks: Vec<_> = jobs
            .iter()
            .map(|job| {
                let mut task = TaskBuilder::new(Item { k: job.id });
                if !job.delay.is_zero() {
                    task = task.run_after(job.delay);
                }
                task.build()
            })
            .collect();
        self.storage().push_all(stream::iter(tasks)).await?;
        Ok(())
    }

    async fn work(&self, concurrency: usize, handler: Handler) -> Result<Running> {
        let (stop, stopped) = oneshot::channel();
        let worker = WorkerBuilder::new(worker_name(&self.name))
            .backend(
                self.storage()
                    .with_pubsub()
                    .poll_with_strategy(Every::new(POLL)),
            )
            .data(Call(handler))
            .concurrency(concurrency)
            .build(run);
        Ok(start(stop, worker.run_until(signal(stopped))))
    }

    async fn pending(&self) -> Result<u64> {
        let count: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM apalis.jobs WHERE job_type = $1 \
             AND status IN ('Pending', 'Queued', 'Running')",
        )
        .bind(&self.name)
        .fetch_one(&self.pool)
        .await?;
        Ok(count as u64)
    }

    async fn delete(&self) -> Result<()> {
        for table in [
            "DELETE FROM apalis.jobs WHERE job_type = $1",
            "DELETE FROM apalis.workers WHERE worker_type = $1",
        ] {
            sqlx::query(table)
                .bind(&self.name)
                .execute(&self.pool)
                .await?;
        }
        Ok(())
    }

    fn not_applicable(workload: &str) -> Option<&'static str> {
        (workload == "W3").then_some(
            "its dedup (idempotency keys) is a unique index without ON CONFLICT: a batch \
             holding a key already queued fails as a whole",
        )
    }

    fn settings() -> String {
        "push_all of each batch (one INSERT ... unnest); a worker per consumer on \
         with_pubsub() (LISTEN/NOTIFY) and a poll every 20 ms (poll_with_interval's, its timer \
         kept armed), with .concurrency(the \
         workload's workers) and Config::batch_size 10 (its default; larger stalled a worker for \
         its 30 s heartbeat); acknowledgements batched by the persistence layer (built in)"
            .to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apalis_redis_burns_down_at_most_the_tasks_one_fetch_can_unpack() {
        assert_eq!(ApalisRedis::backlog_not_applicable(5_000), None);
        assert_eq!(ApalisRedis::backlog_not_applicable(7_999), None);
        let refused = ApalisRedis::backlog_not_applicable(8_000).unwrap();
        assert!(refused.contains("8000 due tasks") && refused.contains("unpack"));
        assert_eq!(ApalisPostgres::backlog_not_applicable(50_000), None);
    }

    /// Counts the wake-ups of a worker.
    struct Wakes(AtomicUsize);

    impl futures::task::ArcWake for Wakes {
        fn wake_by_ref(wakes: &std::sync::Arc<Self>) {
            wakes.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Whether `strategy`, polled once when its timer has fired and not again, still wakes
    /// the worker an interval later.
    async fn wakes_again(mut strategy: impl PollStrategy) -> bool {
        let wakes = std::sync::Arc::new(Wakes(AtomicUsize::new(0)));
        let waker = futures::task::waker(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        let snapshot = PollSnapshot::default();
        assert!(strategy.poll_drive(&mut cx, &snapshot).is_pending());
        tokio::time::sleep(POLL * 2).await;
        assert_eq!(
            wakes.0.load(Ordering::SeqCst),
            1,
            "the first timer wakes it"
        );
        // The poll that sees the timer fire: the fetch it starts comes back empty, and nothing
        // polls the strategy again.
        let _ = strategy.poll_drive(&mut cx, &snapshot);
        tokio::time::sleep(POLL * 2).await;
        wakes.0.load(Ordering::SeqCst) == 2
    }

    #[tokio::test(start_paused = true)]
    async fn the_poll_timer_is_armed_again_in_the_poll_that_sees_it_fire() {
        assert!(wakes_again(Every::new(POLL)).await);
    }

    #[tokio::test]
    async fn a_worker_that_fails_before_it_is_stopped_is_reported_with_its_error() {
        let (stop, stopped) = oneshot::channel();
        let mut running = start(stop, async {
            Err(WorkerError::BackendError(
                "too many results to unpack".into(),
            ))
        });
        assert!(running.ended().await.contains("too many results to unpack"));
        assert!(running.stop().await.is_err());
        drop(stopped);
        // One stopped by its signal ends without an error.
        let (stop, stopped) = oneshot::channel();
        let running = start(stop, async move {
            let _ = stopped.await;
            Ok(())
        });
        running.stop().await.unwrap();
    }
}
