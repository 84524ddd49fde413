//! Periodic schedules in the database ([`workq::periodic`]): one row of
//! `workqueue_schedules` per schedule of a queue (schema version 6), and a tick taken and
//! its item added in one transaction (`workqueue_periodic_claim`, then the add), so that
//! runners of one schedule in any number of processes add one item per tick between them.
//!
//! Instants in the rows are the runners' wall clock (milliseconds since the Unix epoch): the
//! functions store and compare what they are sent and never read the server's clock for
//! them, so a tick names the same time in every process.

use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde::de::DeserializeOwned;
use workq::periodic::{ScheduleInfo, ScheduleUpdate, TickClaim, TickOutcome};
use workq::{AddKind, AddOptions};

use crate::error::Error;
use crate::queue::PgQueue;

/// A row of `workqueue_schedules` as the statements here select it: name, spec, since_ms,
/// last_tick_ms, next_tick_ms, paused.
type Row = (String, String, i64, Option<i64>, Option<i64>, bool);

/// A row as the contract has it.
fn into_info((name, spec, since, last, next, paused): Row) -> ScheduleInfo {
    let mut info = ScheduleInfo::new(name, instant(since));
    info.spec = spec;
    info.last_tick = last.map(instant);
    info.next_tick = next.map(instant);
    info.paused = paused;
    info
}

/// Milliseconds since the Unix epoch as the rows keep them (0 before it).
fn ms(at: SystemTime) -> i64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The instant `ms` milliseconds after the Unix epoch (the epoch for a negative number).
fn instant(ms: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> PgQueue<T> {
    /// [`Queue::upsert_schedule`](workq::Queue::upsert_schedule): one call of
    /// `workqueue_periodic_upsert`.
    pub(crate) async fn upsert_periodic(
        &self,
        update: ScheduleUpdate,
    ) -> Result<ScheduleInfo, Error> {
        let row: Row = sqlx::query_as(
            "SELECT name, spec, since_ms, last_tick_ms, next_tick_ms, paused \
             FROM workqueue_periodic_upsert($1, $2, $3, $4, $5, $6)",
        )
        .bind(self.inner.id)
        .bind(&update.name)
        .bind(ms(update.now))
        .bind(update.spec.as_deref())
        .bind(update.next_tick.map(ms))
        .bind(update.paused)
        .fetch_one(&self.inner.pool)
        .await
        .map_err(Error::Database)?;
        Ok(into_info(row))
    }

    /// [`Queue::add_on_tick`](workq::Queue::add_on_tick): `workqueue_periodic_claim` and the
    /// add in one transaction; a claim whose add the queue refuses is rolled back. A
    /// shut-down handle takes nothing (no round trip).
    pub(crate) async fn add_on_periodic_tick(
        &self,
        claim: TickClaim,
        item: &T,
        options: AddOptions,
    ) -> Result<TickOutcome, Error> {
        if self.is_closed() {
            return Ok(TickOutcome::ShutDown);
        }
        let mut tx = self.inner.pool.begin().await.map_err(Error::Database)?;
        let code: i16 =
            sqlx::query_scalar("SELECT workqueue_periodic_claim($1, $2, $3, $4, $5, $6)")
                .bind(self.inner.id)
                .bind(&claim.schedule)
                .bind(&claim.spec)
                .bind(ms(claim.tick))
                .bind(claim.next_tick.map(ms))
                .bind(ms(claim.now))
                .fetch_one(&mut *tx)
                .await
                .map_err(Error::Database)?;
        let outcome = match code {
            0 => return Ok(TickOutcome::ShutDown),
            1 => {
                let added = self.add_with_in(&mut tx, item, options).await?;
                if added.kind == AddKind::Ignored {
                    // Shut down in the meantime: the claim goes with the transaction.
                    return Ok(TickOutcome::ShutDown);
                }
                TickOutcome::Added
            }
            2 => return Ok(TickOutcome::AlreadyTaken),
            3 => TickOutcome::Paused,
            other => {
                return Err(Error::Protocol(format!(
                    "workqueue_periodic_claim answered {other}"
                )));
            }
        };
        tx.commit().await.map_err(Error::Database)?;
        Ok(outcome)
    }

    /// The queue's periodic schedules, by name: what an operator's listing shows (`wq
    /// queue ... stats`, the dashboard). One read of `workqueue_schedules`.
    ///
    /// # Errors
    ///
    /// A database error.
    pub async fn schedules(&self) -> Result<Vec<ScheduleInfo>, Error> {
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT name, spec, since_ms, last_tick_ms, next_tick_ms, paused \
             FROM workqueue_schedules WHERE queue = $1 ORDER BY name",
        )
        .bind(self.inner.id)
        .fetch_all(&self.inner.pool)
        .await
        .map_err(Error::Database)?;
        Ok(rows.into_iter().map(into_info).collect())
    }
}
