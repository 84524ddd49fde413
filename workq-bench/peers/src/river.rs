//! `riverqueue`: River's official Rust client, on PostgreSQL.
//!
//! Used with the settings of its own benchmark command (`riverqueue bench`, crate
//! `riverqueue-cli` 0.5.0, `benchmark_client`): the queue's `max_workers` set to the
//! workload's workers, a fetch cooldown of 2 ms and a fetch poll interval of 20 ms (River's
//! defaults are 100 ms and 1 s), jobs added with `insert_many` (its batch insert: one
//! statement per batch), completions written by its batch completer (built in: results
//! coalesce for up to 10 ms and are written in one statement), and a pool of 50 connections,
//! the bench command's, wherever one process works the queue: W7B (River's own shape, up to
//! 2,000 workers in one process), W7's 1-process shapes and the other workloads. Where several
//! worker processes share the server (W7's 4-process shapes) each has 10, sqlx's default: four
//! pools of 50 and the producer's would pass PostgreSQL's default `max_connections` of 100. Delayed jobs use `scheduled_at`: such a job waits for a pass
//! of the leader's scheduler (every 5 s, River's default, kept here), which makes the jobs
//! due within one interval available, and a fetch takes them when due; the workers start
//! once a leader is elected, as in a service that has been running. The dedup workload uses unique jobs
//! by arguments and queue, unique in the states River requires (available, pending, running,
//! scheduled), so that a key is free again once its job completes, as on our side; an add
//! while the job runs is dropped.
//!
//! River keeps one job table for all queues (`river_job`, created by its migrations in the
//! database's current schema); each run uses a queue of its own and deletes its rows.

use std::sync::Arc;
use std::time::{Duration, Instant};

use riverqueue::jiff::{SignedDuration, Timestamp};
use riverqueue::migrate::PostgresMigrator;
use riverqueue::sqlx::PgPool;
use riverqueue::sqlx::postgres::PgPoolOptions;
use riverqueue::{
    BoxError, Client, InsertOpts, JobArgs, JobState, QueueConfig, UniqueOpts, WorkContext,
    WorkOutcome, Workers,
};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::peer::{Handler, Job, Peer, Result, Running};

/// How many times a batch aborted as a deadlock is sent again before the run fails.
const MAX_DEADLOCKS: u32 = 100;

/// The job of every workload: its id.
#[derive(Clone, Debug, Deserialize, JobArgs, Serialize)]
#[river(kind = "wq_bench_item")]
struct Item {
    k: u64,
}

/// Connections of the pool: its bench command's.
const POOL: u32 = 50;
/// Connections of the pool of each worker process where several share the server (W7's
/// 4-process shapes): sqlx's default. Four pools of [`POOL`] would pass PostgreSQL's default
/// `max_connections` of 100.
const POOL_SHARED: u32 = 10;

/// The pool of one of `processes` worker processes working the server at once. (A pool opens
/// connections as they are needed: W7's producer, whose adds and drain checks take turns, holds
/// one or two of its [`POOL`].)
fn pool_size(processes: u32) -> u32 {
    if processes > 1 { POOL_SHARED } else { POOL }
}

/// A handle on one River queue: an insert-only client and its pool.
#[derive(Clone)]
pub(crate) struct River {
    name: String,
    pool: PgPool,
    client: Client,
}

impl River {
    /// Whether a client holds River's leadership (which runs its scheduler).
    async fn has_leader(&self) -> Result<bool> {
        let leaders: i64 = riverqueue::sqlx::query_scalar(
            "SELECT count(*) FROM river_leader WHERE expires_at > now()",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(leaders > 0)
    }
}

impl Peer for River {
    const NAME: &'static str = "riverqueue";
    const URL_VAR: &'static str = "WQ_POSTGRES_URL";

    async fn open(url: &str, name: &str) -> Result<Self> {
        Self::open_shared(url, name, 1).await
    }

    async fn open_shared(url: &str, name: &str, processes: u32) -> Result<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(pool_size(processes))
            .connect(url)
            .await?;
        PostgresMigrator::new(pool.clone()).migrate_up().await?;
        // An insert-only client: no workers, no queues, never the leader.
        let client = Client::builder(pool.clone()).build()?;
        Ok(Self {
            name: name.to_owned(),
            pool,
            client,
        })
    }

    async fn add(&self, jobs: &[Job]) -> Result<()> {
        let now = Timestamp::now();
        let mut batch = Vec::with_capacity(jobs.len());
        for job in jobs {
            let mut opts = InsertOpts::default().with_queue(self.name.clone());
            if !job.delay.is_zero() {
                opts =
                    opts.with_scheduled_at(now.checked_add(SignedDuration::try_from(job.delay)?)?);
            }
            if job.unique {
                opts = opts.with_unique(
                    UniqueOpts::new()
                        .with_by_args(true)
                        .with_by_queue(true)
                        .with_by_state(JobState::UNIQUE_REQUIRED.iter().copied()),
                );
            }
            batch.push((Item { k: job.id }, opts));
        }
        // Producers that insert unique jobs of the same keys at once, in different orders,
        // can deadlock in PostgreSQL (W3: four producers over 1,000 keys; River's unique
        // insert locks each key's row in the batch's order). PostgreSQL aborts one of them
        // (40P01) and the application sends that batch again, as any program would.
        let mut deadlocks = 0;
        loop {
            match self.client.insert_many(batch.clone()).await {
                Ok(_) => return Ok(()),
                Err(riverqueue::Error::Database(riverqueue::sqlx::Error::Database(e)))
                    if e.code().as_deref() == Some("40P01") && deadlocks < MAX_DEADLOCKS =>
                {
                    deadlocks += 1;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    async fn work(&self, concurrency: usize, handler: Handler) -> Result<Running> {
        let mut workers = Workers::new();
        workers.add_fn(move |_context: WorkContext, job: riverqueue::Job<Item>| {
            let handler = handler.clone();
            async move {
                handler(job.args.k).await;
                Ok::<_, BoxError>(WorkOutcome::Complete)
            }
        })?;
        let client = Client::builder(self.pool.clone())
            .workers(workers)
            .queue(
                self.name.clone(),
                QueueConfig::new(concurrency)
                    .with_fetch_cooldown(Duration::from_millis(2))
                    .with_fetch_poll_interval(Duration::from_millis(20)),
            )
            .build()?;
        let mut run = client.start()?;
        run.wait_ready().await?;
        // Scheduled jobs are made available by the leader alone: measure a client that runs
        // as a long-running service's would, with a leader elected.
        let elected = Instant::now();
        while !self.has_leader().await? {
            if elected.elapsed() > Duration::from_secs(60) {
                return Err("no River leader was elected in 60 s".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let run = Arc::new(Mutex::new(run));
        Ok(Running::new(move || {
            Box::pin(async move {
                run.lock().await.stop().await?;
                Ok(())
            })
        }))
    }

    async fn pending(&self) -> Result<u64> {
        let count: i64 = riverqueue::sqlx::query_scalar(
            "SELECT count(*) FROM river_job WHERE queue = $1 \
             AND state IN ('available', 'pending', 'retryable', 'running', 'scheduled')",
        )
        .bind(&self.name)
        .fetch_one(&self.pool)
        .await?;
        Ok(count as u64)
    }

    async fn delete(&self) -> Result<()> {
        // Its jobs, and the queue's record, which every client that works it keeps.
        for statement in [
            "DELETE FROM river_job WHERE queue = $1",
            "DELETE FROM river_queue WHERE name = $1",
        ] {
            riverqueue::sqlx::query(statement)
                .bind(&self.name)
                .execute(&self.pool)
                .await?;
        }
        Ok(())
    }

    fn settings() -> String {
        format!(
            "insert_many of each batch; QueueConfig max_workers = the workload's workers, fetch \
             cooldown 2 ms, fetch poll interval 20 ms (its bench command's); batch completer \
             (built in); a pool of {POOL} connections (its bench command's), {POOL_SHARED} in each \
             worker process where several share the server (W7's 4-process shapes); scheduler interval 5 s (its \
             default), workers started once a leader is elected; unique jobs by args and queue \
             in the required states (available, pending, running, scheduled) for the dedup \
             workload, a batch aborted as a deadlock (40P01: producers inserting the same \
             unique keys at once) sent again, up to {MAX_DEADLOCKS} times"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_process_has_the_bench_commands_pool_and_several_share_the_server() {
        assert_eq!(pool_size(1), 50);
        assert_eq!(pool_size(4), 10);
        // Four worker processes stay under PostgreSQL's default of 100 with room for the
        // producer's connections.
        assert!(4 * pool_size(4) + 2 < 100);
    }
}
