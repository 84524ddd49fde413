//! [`RedisAdmin`] as the operator's contract ([`workq::admin::Admin`]): what the dashboard
//! and `wq` see of Redis, with the policy every operator client needs and no client should
//! write again.
//!
//! - A call on a queue with no key answers [`AdminError::NotFound`] and creates nothing: the
//!   queue's figures are read first (one script, which writes nothing), and only a queue that
//!   has a key is acted on.
//! - An item action given a text that is not JSON, a malformed cursor, dead-letter id or
//!   queue name answers [`AdminError::BadRequest`] before the server is asked.
//! - A server that cannot be reached (or refuses the first connection: a wrong password, an
//!   old server) answers [`AdminError::Unavailable`] within the connection's 5 s and the
//!   handles' retry deadline (1 s), and [`Admin::status`] reports it down until a call gets
//!   through again; the connection reconnects by itself.
//! - No message holds a password: every URL in it is redacted, and the passwords of the
//!   admin's URLs are taken out wherever they appear.
//! - A queue that cannot be read (a key of the wrong type under its name) is listed, and
//!   summarised, as [`QueueSummary::broken`], as in a listing.

use std::sync::atomic::Ordering;
use std::time::SystemTime;

use serde::de::IgnoredAny;
use workq::admin::{
    Admin, AdminError, BoxFuture, Capabilities, DeadLetter, End, ItemDetail, MAX_PAGE_LIMIT, Page,
    PageQuery, QueueSummary, Removed, Retried, ServerStatus, Stats,
};
use workq::periodic::{ScheduleInfo, ScheduleUpdate};

use crate::dead_letter::entry_of;
use crate::error::Error;
use crate::inspect::check_cursor;
use crate::listing::RedisAdmin;
use crate::persistence::problems_of;
use crate::queue::RedisQueue;
use crate::units::saturated;

/// The handles the contract's calls use: items are only passed on as their text, so any
/// JSON will do.
type Handle = RedisQueue<serde_json::Value>;

impl RedisAdmin {
    /// The server answered: it is up.
    fn reached(&self) {
        let health = self.health();
        health.up.store(true, Ordering::Relaxed);
        *health.error.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// The server could not be reached: it is down, for `why`.
    fn unreachable(&self, why: &str) -> AdminError {
        let health = self.health();
        health.up.store(false, Ordering::Relaxed);
        *health.error.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.to_owned());
        AdminError::Unavailable(why.to_owned())
    }

    /// `error` as the contract answers it, the server's health noted.
    fn refusal(&self, error: &Error) -> AdminError {
        let text = self.health().scrub(&error.to_string());
        if error.is_connection() {
            return self.unreachable(&text);
        }
        self.reached();
        match error {
            Error::Config(_) | Error::Serialize(_) => AdminError::BadRequest(text),
            Error::ShutDown => AdminError::ShutDown,
            _ => AdminError::Backend(text),
        }
    }

    /// `result`, with its error as the contract answers it; the server's health noted.
    fn answer<T>(&self, result: Result<T, Error>) -> Result<T, AdminError> {
        match result {
            Ok(value) => {
                self.reached();
                Ok(value)
            }
            Err(e) => Err(self.refusal(&e)),
        }
    }

    /// Opens the connection if no call has: whatever keeps it from opening (refused, a
    /// wrong password, an old server) leaves the server down until it is fixed.
    async fn reach(&self) -> Result<(), AdminError> {
        match self.open().await {
            Ok(_) => {
                self.check_settings().await;
                Ok(())
            }
            Err(e) => Err(self.unreachable(&self.health().scrub(&e.to_string()))),
        }
    }

    /// Queue `queue`'s figures: [`AdminError::NotFound`] if it has no key; listed as
    /// broken if the server cannot read them (a key of the wrong type: the queue exists).
    async fn figures(&self, queue: &str) -> Result<QueueSummary, AdminError> {
        self.reach().await?;
        match RedisAdmin::summary(self, queue).await {
            Ok(Some(summary)) => {
                self.reached();
                Ok(summary)
            }
            Ok(None) => {
                self.reached();
                Err(AdminError::NotFound)
            }
            Err(e @ Error::Redis(_)) if !e.is_connection() => {
                self.reached();
                Ok(QueueSummary::broken(
                    queue,
                    self.health().scrub(&e.to_string()),
                ))
            }
            Err(e) => Err(self.refusal(&e)),
        }
    }

    /// A handle on queue `queue`, which must exist ([`AdminError::NotFound`] otherwise):
    /// nothing is done to a queue that has no key, since that would create it.
    async fn known(&self, queue: &str) -> Result<Handle, AdminError> {
        self.figures(queue).await?;
        let handle = self.queue::<serde_json::Value>(queue).build().await;
        self.answer(handle)
    }
}

/// Checks that `item` is JSON text, as every stored item is.
fn json(item: &str) -> Result<(), AdminError> {
    serde_json::from_str::<IgnoredAny>(item)
        .map(|_| ())
        .map_err(|e| AdminError::BadRequest(format!("item: {e}")))
}

/// Checks that `id` is a dead letter's id.
fn letter_id(id: &str) -> Result<(), AdminError> {
    entry_of(id)
        .map(|_| ())
        .ok_or_else(|| AdminError::BadRequest(format!("not a dead-letter id: {id:?}")))
}

impl Admin for RedisAdmin {
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::all()
    }

    /// Up once a call reached the server (down until then, and after a call that could not);
    /// the warnings are the persistence settings' problems, the details the settings
    /// themselves (on a cluster, each primary's, named by its address), read when the
    /// connection opened (a cluster's at the first call) and again at most once per
    /// [`settings_check_interval`](RedisAdmin::settings_check_interval) while the admin is
    /// used.
    fn status(&self) -> ServerStatus {
        let health = self.health();
        let mut status = ServerStatus::new(health.up.load(Ordering::Relaxed), &health.server);
        status.error = health
            .error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if health.indexing.load(Ordering::Relaxed) {
            status.warnings.push(
                "still looking for queues made by a version that kept no index of queue \
                 names: each listing scans some 10,000 more keys of each primary until the \
                 keyspace is scanned once, and such queues may be missing until then \
                 (`wq queue reindex`, RedisAdmin::reindex, scans it all at once)"
                    .to_owned(),
            );
        }
        let readings = self.readings();
        if !readings.is_empty() {
            status.warnings.extend(problems_of(&readings));
            status.details = Some(
                readings
                    .iter()
                    .map(|(node, persistence)| match node {
                        Some(node) => format!("{node}: {persistence}"),
                        None => persistence.to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
            );
        }
        status
    }

    fn queues(&self) -> BoxFuture<'_, Result<Vec<QueueSummary>, AdminError>> {
        Box::pin(async move {
            self.reach().await?;
            let queues = RedisAdmin::queues(self).await;
            self.answer(queues)
        })
    }

    fn summary<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<QueueSummary, AdminError>> {
        Box::pin(self.figures(queue))
    }

    /// One script run, which also tells whether the queue exists.
    fn stats<'a>(
        &'a self,
        queue: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Stats, AdminError>> {
        Box::pin(async move {
            self.reach().await?;
            let handle = self.queue::<serde_json::Value>(queue).build().await;
            let handle = self.answer(handle)?;
            match handle.stats_and_existence(limit).await {
                Ok((stats, true)) => {
                    self.reached();
                    Ok(stats)
                }
                Ok((_, false)) => {
                    self.reached();
                    Err(AdminError::NotFound)
                }
                Err(e @ Error::Redis(_)) if !e.is_connection() => {
                    self.reached();
                    let why = self.health().scrub(&e.to_string());
                    Ok(Stats::new(QueueSummary::broken(queue, why)))
                }
                Err(e) => Err(self.refusal(&e)),
            }
        })
    }

    fn page<'a>(
        &'a self,
        queue: &'a str,
        query: &'a PageQuery,
    ) -> BoxFuture<'a, Result<Page, AdminError>> {
        Box::pin(async move {
            if let Some(cursor) = &query.cursor {
                check_cursor(query.state, cursor)
                    .map_err(|e| AdminError::BadRequest(e.to_string()))?;
            }
            let handle = self.known(queue).await?;
            let page = handle.page(query).await;
            self.answer(page)
        })
    }

    /// The item's text is not checked for JSON: a dead letter's item may be any text.
    fn item_detail<'a>(
        &'a self,
        queue: &'a str,
        item: &'a str,
    ) -> BoxFuture<'a, Result<Option<ItemDetail>, AdminError>> {
        Box::pin(async move {
            let handle = self.known(queue).await?;
            let detail = handle.item_detail(item).await;
            self.answer(detail)
        })
    }

    fn pause<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
        Box::pin(async move {
            let handle = self.known(queue).await?;
            let paused = handle.pause().await;
            self.answer(paused)
        })
    }

    fn resume<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
        Box::pin(async move {
            let handle = self.known(queue).await?;
            let resumed = handle.resume().await;
            self.answer(resumed)
        })
    }

    fn shut_down_fleet<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
        Box::pin(async move {
            let handle = self.known(queue).await?;
            let was_running = handle.shut_down_fleet().await;
            self.answer(was_running)
        })
    }

    fn resume_fleet<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
        Box::pin(async move {
            let handle = self.known(queue).await?;
            let was_shut_down = handle.resume_fleet().await;
            self.answer(was_shut_down)
        })
    }

    fn retry_now<'a>(
        &'a self,
        queue: &'a str,
        item: &'a str,
    ) -> BoxFuture<'a, Result<Retried, AdminError>> {
        Box::pin(async move {
            json(item)?;
            let handle = self.known(queue).await?;
            let retried = handle.retry_now(item).await;
            self.answer(retried)
        })
    }

    fn remove<'a>(
        &'a self,
        queue: &'a str,
        item: &'a str,
    ) -> BoxFuture<'a, Result<Removed, AdminError>> {
        Box::pin(async move {
            json(item)?;
            let handle = self.known(queue).await?;
            let removed = handle.remove(item).await;
            self.answer(removed)
        })
    }

    fn forget<'a>(
        &'a self,
        queue: &'a str,
        item: &'a str,
    ) -> BoxFuture<'a, Result<u32, AdminError>> {
        Box::pin(async move {
            json(item)?;
            let handle = self.known(queue).await?;
            let cleared = handle.forget_counted(item).await.map(saturated);
            self.answer(cleared)
        })
    }

    /// One `HGETALL` of the queue's schedules hash (one field per schedule).
    fn schedules<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ScheduleInfo>, AdminError>> {
        Box::pin(async move {
            let handle = self.known(queue).await?;
            let schedules = handle.schedules().await;
            self.answer(schedules)
        })
    }

    /// The schedule is looked up first (a name the queue does not have is not created),
    /// then one run of the `periodic_upsert` script, with this machine's clock as `now` (a
    /// resume moves the schedule's `since` to it).
    fn pause_schedule<'a>(
        &'a self,
        queue: &'a str,
        schedule: &'a str,
        paused: bool,
    ) -> BoxFuture<'a, Result<bool, AdminError>> {
        Box::pin(async move {
            let handle = self.known(queue).await?;
            let listed = self.answer(handle.schedules().await)?;
            let was = listed
                .iter()
                .find(|s| s.name == schedule)
                .ok_or(AdminError::NotFound)?
                .paused;
            let update = ScheduleUpdate::pause(schedule, paused, SystemTime::now());
            self.answer(handle.upsert_periodic(update).await)?;
            Ok(was != paused)
        })
    }

    /// At most [`MAX_PAGE_LIMIT`] letters, whatever `limit`: a call does bounded work (a
    /// queue without a dead-letter cap may hold millions; page through them with
    /// [`page`](Admin::page)).
    fn dead_letters<'a>(
        &'a self,
        queue: &'a str,
        from: End,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<DeadLetter>, AdminError>> {
        Box::pin(async move {
            let handle = self.known(queue).await?;
            let letters = handle.dead_letters(from, limit.min(MAX_PAGE_LIMIT)).await;
            self.answer(letters)
        })
    }

    /// [`AdminError::ShutDown`] while the queue is shut down for every process: adds are
    /// ignored then, and the letter stays.
    fn requeue_dead_letter_by_id<'a>(
        &'a self,
        queue: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<bool, AdminError>> {
        Box::pin(async move {
            letter_id(id)?;
            let handle = self.known(queue).await?;
            let requeued = handle.requeue_dead_letter_by_id(id).await;
            self.answer(requeued)
        })
    }

    /// 500 letters per script run. [`AdminError::ShutDown`] while the queue is shut down for
    /// every process: adds are ignored then, and the letters stay.
    fn requeue_dead_letters<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<u64, AdminError>> {
        Box::pin(async move {
            let handle = self.known(queue).await?;
            let requeued = handle.requeue_dead_letters().await;
            self.answer(requeued)
        })
    }

    fn delete_dead_letter_by_id<'a>(
        &'a self,
        queue: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<bool, AdminError>> {
        Box::pin(async move {
            letter_id(id)?;
            let handle = self.known(queue).await?;
            let deleted = handle.delete_dead_letter_by_id(id).await;
            self.answer(deleted)
        })
    }

    /// One `UNLINK`: the server frees the list off its main thread.
    fn purge_dead_letters<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u64, AdminError>> {
        Box::pin(async move {
            let handle = self.known(queue).await?;
            let purged = handle.purge_dead_letters().await;
            self.answer(purged)
        })
    }
}
