//! The demo's [`Backend`] on PostgreSQL (`wq demo --postgres URL`): the queue is a
//! [`PgQueue`], and the checks' bookkeeping lives in tables of the same database, created if
//! missing and scoped by the queue's name:
//!
//! - `wq_demo_claims`: item -> token of the lease that holds it (a second claim is refused);
//! - `wq_demo_ending`: the leases between giving their claim back and recording their `done`,
//!   so that the drain never sees a queue that is empty while a `done` is still unrecorded;
//! - `wq_demo_done`: item -> the largest token of an accepted `done`;
//! - `wq_demo_given_up`: the items given up;
//! - `wq_demo_helpers`: the `--workers-only` processes on the queue.
//!
//! The drain is one statement over `workqueue_items` (every row of the queue: queued, delayed
//! or leased) and `wq_demo_ending`, so it reads one snapshot of both.

use sqlx::Executor;
use workq_postgres::{Error, Lease, PgQueue};

use super::distributed::{BACKOFF, Backend, LEASE, Ledger};

/// The bookkeeping's tables, created if missing.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS wq_demo_claims (
    queue text NOT NULL, item text NOT NULL, token bigint NOT NULL, PRIMARY KEY (queue, item));
CREATE TABLE IF NOT EXISTS wq_demo_ending (
    queue text NOT NULL, item text NOT NULL, token bigint NOT NULL,
    PRIMARY KEY (queue, item, token));
CREATE TABLE IF NOT EXISTS wq_demo_done (
    queue text NOT NULL, item text NOT NULL, token bigint NOT NULL, PRIMARY KEY (queue, item));
CREATE TABLE IF NOT EXISTS wq_demo_given_up (
    queue text NOT NULL, item text NOT NULL, PRIMARY KEY (queue, item));
CREATE TABLE IF NOT EXISTS wq_demo_helpers (
    queue text NOT NULL, helper text NOT NULL, PRIMARY KEY (queue, helper));
";

/// The advisory lock under which processes starting together create the tables once (one
/// more than the queue's own migration lock).
const SCHEMA_LOCK: i64 = 7_310_550_117_463_005_202;

/// The queue on PostgreSQL; the bookkeeping runs on its pool.
#[derive(Clone, Debug)]
pub(crate) struct OnPostgres {
    queue: PgQueue<String>,
}

/// A statement of the bookkeeping, with its arguments bound.
type Statement<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

impl OnPostgres {
    fn name(&self) -> &str {
        self.queue.name()
    }

    /// `sql` about one item: the queue's name and the item as `$1` and `$2`.
    fn of_item<'q>(&'q self, sql: &'q str, item: &'q str) -> Statement<'q> {
        sqlx::query(sql).bind(self.name()).bind(item)
    }

    /// `sql` about one lease: the queue's name, the item and the token as `$1`, `$2`, `$3`.
    fn of_lease<'q>(&'q self, sql: &'q str, item: &'q str, token: u64) -> Statement<'q> {
        // A token as the tables store it.
        self.of_item(sql, item)
            .bind(i64::try_from(token).unwrap_or(i64::MAX))
    }
}

impl Backend for OnPostgres {
    type Queue = PgQueue<String>;

    async fn open(url: &str, queue: &str, workers: usize) -> Result<Self, Error> {
        let queue: PgQueue<String> = PgQueue::builder(queue)
            .url(url)
            // Every worker's get or done, the producer's batch and the bookkeeping at once.
            .max_connections(u32::try_from(workers + 4).unwrap_or(u32::MAX))
            .lease_duration(LEASE)
            .backoff(BACKOFF.0, BACKOFF.1)
            .token_bucket(None)
            .build()
            .await?;
        let mut tx = queue.pool().begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(SCHEMA_LOCK)
            .execute(&mut *tx)
            .await?;
        (&mut *tx).execute(SCHEMA).await?;
        tx.commit().await?;
        Ok(OnPostgres { queue })
    }

    fn queue(&self) -> &PgQueue<String> {
        &self.queue
    }

    fn token(lease: &Lease<String>) -> u64 {
        lease.token()
    }

    /// One statement and one commit per batch.
    async fn add_batch(&self, items: &[String]) -> Result<Vec<u64>, Error> {
        let added = self.queue.add_all(items).await?;
        Ok(added.iter().map(|a| a.seq).collect())
    }

    /// No row of the queue (queued, delayed, leased) and no lease still ending, in one
    /// snapshot.
    async fn is_drained(&self) -> Result<bool, Error> {
        Ok(sqlx::query_scalar(
            "SELECT NOT EXISTS (SELECT 1 FROM workqueue_items i
                                JOIN workqueue_queues s ON s.id = i.queue WHERE s.name = $1)
                AND NOT EXISTS (SELECT 1 FROM wq_demo_ending WHERE queue = $1)",
        )
        .bind(self.name())
        .fetch_one(self.queue.pool())
        .await?)
    }

    async fn shut_down_fleet(&self) -> Result<(), Error> {
        self.queue.shut_down_fleet().await.map(drop)
    }

    async fn reset(&self) -> Result<(), Error> {
        self.queue.delete().await?;
        let mut tx = self.queue.pool().begin().await?;
        for sql in [
            "DELETE FROM wq_demo_claims WHERE queue = $1",
            "DELETE FROM wq_demo_ending WHERE queue = $1",
            "DELETE FROM wq_demo_done WHERE queue = $1",
            "DELETE FROM wq_demo_given_up WHERE queue = $1",
        ] {
            sqlx::query(sql).bind(self.name()).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// An emptied queue keeps its row (a handle stays usable): the row goes too, so that no
    /// listing shows the demo's queue after it.
    async fn remove(&self) -> Result<(), Error> {
        self.reset().await?;
        sqlx::query(
            "DELETE FROM workqueue_queues q WHERE name = $1
                AND NOT EXISTS (SELECT 1 FROM workqueue_items WHERE queue = q.id)
                AND NOT EXISTS (SELECT 1 FROM workqueue_failures WHERE queue = q.id)
                AND NOT EXISTS (SELECT 1 FROM workqueue_dead WHERE queue = q.id)",
        )
        .bind(self.name())
        .execute(self.queue.pool())
        .await?;
        Ok(())
    }

    async fn claim(&self, item: &str, token: u64) -> Result<bool, Error> {
        let sql = "INSERT INTO wq_demo_claims (queue, item, token) VALUES ($1, $2, $3)
                   ON CONFLICT DO NOTHING";
        let rows = self
            .of_lease(sql, item, token)
            .execute(self.queue.pool())
            .await?;
        Ok(rows.rows_affected() == 1)
    }

    /// Drops this lease's claim (a claim of another lease stays) and marks the lease as
    /// ending, in one statement.
    async fn end_claim(&self, item: &str, token: u64, _claimed: bool) -> Result<(), Error> {
        let sql = "WITH unclaimed AS (
                DELETE FROM wq_demo_claims WHERE queue = $1 AND item = $2 AND token = $3
             )
             INSERT INTO wq_demo_ending (queue, item, token) VALUES ($1, $2, $3)
             ON CONFLICT DO NOTHING";
        self.of_lease(sql, item, token)
            .execute(self.queue.pool())
            .await?;
        Ok(())
    }

    /// Ends the lease's ending mark and records its token if accepted, in one statement: a
    /// token never replaces a larger one.
    async fn ended(&self, item: &str, token: u64, accepted: bool) -> Result<(), Error> {
        let sql = "WITH ended AS (
                DELETE FROM wq_demo_ending WHERE queue = $1 AND item = $2 AND token = $3
             )
             INSERT INTO wq_demo_done (queue, item, token) SELECT $1, $2, $3 WHERE $4
             ON CONFLICT (queue, item)
                DO UPDATE SET token = greatest(wq_demo_done.token, excluded.token)";
        self.of_lease(sql, item, token)
            .bind(accepted)
            .execute(self.queue.pool())
            .await?;
        Ok(())
    }

    async fn give_up(&self, item: &str) -> Result<(), Error> {
        let sql =
            "INSERT INTO wq_demo_given_up (queue, item) VALUES ($1, $2) ON CONFLICT DO NOTHING";
        self.of_item(sql, item).execute(self.queue.pool()).await?;
        Ok(())
    }

    async fn ledger(&self) -> Result<Ledger, Error> {
        let done: Vec<(String, i64)> =
            sqlx::query_as("SELECT item, token FROM wq_demo_done WHERE queue = $1")
                .bind(self.name())
                .fetch_all(self.queue.pool())
                .await?;
        let given_up: Vec<String> =
            sqlx::query_scalar("SELECT item FROM wq_demo_given_up WHERE queue = $1")
                .bind(self.name())
                .fetch_all(self.queue.pool())
                .await?;
        Ok(Ledger {
            done: done
                .into_iter()
                .map(|(item, token)| (item, token.unsigned_abs()))
                .collect(),
            given_up: given_up.into_iter().collect(),
        })
    }

    async fn helper(&self, id: &str, present: bool) -> Result<(), Error> {
        let sql = if present {
            "INSERT INTO wq_demo_helpers (queue, helper) VALUES ($1, $2) ON CONFLICT DO NOTHING"
        } else {
            "DELETE FROM wq_demo_helpers WHERE queue = $1 AND helper = $2"
        };
        self.of_item(sql, id).execute(self.queue.pool()).await?;
        Ok(())
    }

    async fn helpers(&self) -> Result<u64, Error> {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM wq_demo_helpers WHERE queue = $1")
            .bind(self.name())
            .fetch_one(self.queue.pool())
            .await?;
        Ok(n.unsigned_abs())
    }
}

#[cfg(test)]
use workq_conformance::servers::postgres as pg_server;

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::demo::distributed::missed;

    /// The bookkeeping on a real server, driven by hand: a second live claim is refused (what
    /// the first check counts), a lease still ending keeps the queue from being drained, a
    /// `done` that was not accepted leaves its object missed (the control of the second
    /// check), a give-up excuses it, and a smaller token never hides a larger one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_bookkeeping_on_postgres_sees_two_claims_an_unfinished_done_and_a_missed_event() {
        let Some(server) = pg_server::PgServer::start() else {
            return;
        };
        let pg = OnPostgres::open(&server.url(), "ledger", 2)
            .await
            .expect("open");
        pg.reset().await.expect("reset");
        let (a, b) = ("default/a".to_owned(), "default/b".to_owned());
        let batch = [a.clone(), b.clone(), a.clone()];
        let seqs = pg.add_batch(&batch).await.expect("add");
        assert!(
            seqs[0] > 0 && seqs[1] > seqs[0] && seqs[2] > seqs[1],
            "{seqs:?}"
        );
        // The last add of each object, as the producer keeps it.
        let last_add: HashMap<String, u64> = batch.iter().cloned().zip(seqs).collect();

        // a: its claim is taken; a second live claim is refused: two workers at once.
        let lease = pg.queue().get().await.expect("get").expect("a lease");
        assert_eq!(lease.item(), &a);
        let token_a = lease.token();
        assert!(token_a > last_add[&a], "handed out after its last add");
        assert!(pg.claim(&a, token_a).await.expect("claim"));
        assert!(!pg.claim(&a, token_a + 1).await.expect("claim"));
        pg.end_claim(&a, token_a, true).await.expect("end claim");
        lease.done().await.expect("done");
        pg.ended(&a, token_a, true).await.expect("ended");
        // A slower process recording an older token does not hide the newer one.
        pg.ended(&a, 1, true).await.expect("ended");

        // b: accepted by the queue, not yet recorded: the queue is empty, yet not drained.
        let lease = pg.queue().get().await.expect("get").expect("a lease");
        assert_eq!(lease.item(), &b);
        let token_b = lease.token();
        assert!(pg.claim(&b, token_b).await.expect("claim"));
        pg.end_claim(&b, token_b, true).await.expect("end claim");
        lease.done().await.expect("done");
        let queue = pg.queue();
        assert_eq!(queue.len().await.expect("len"), 0);
        assert_eq!(queue.processing_len().await.expect("processing"), 0);
        assert_eq!(queue.delayed_len().await.expect("delayed"), 0);
        assert!(!pg.is_drained().await.expect("drained?"));
        // Recorded as not accepted (a refused done): b's last event counts as missed.
        pg.ended(&b, token_b, false).await.expect("ended");
        assert!(pg.is_drained().await.expect("drained?"));
        let ledger = pg.ledger().await.expect("ledger");
        assert_eq!(ledger.done.get(&a), Some(&token_a));
        assert_eq!(missed(&last_add, &ledger), [b.as_str()]);
        // Given up, it is not.
        pg.give_up(&b).await.expect("give up");
        assert!(missed(&last_add, &pg.ledger().await.expect("ledger")).is_empty());

        // A new run starts from nothing; claims of the last one are gone too.
        pg.reset().await.expect("reset");
        let ledger = pg.ledger().await.expect("ledger");
        assert!(ledger.done.is_empty() && ledger.given_up.is_empty());
        assert!(pg.claim(&a, token_a + 1).await.expect("claim"));
    }
}
