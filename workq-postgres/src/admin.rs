//! [`PgAdmin`]'s implementation of the operator's contract, [`workq::admin::Admin`]: the
//! errors as operators read them (a server that is down, a request that is wrong, anything
//! else, never with a password in it), the server's settings that can lose work, and the
//! refusal of a queue the database does not have.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use workq::admin::{
    Admin, AdminError, BoxFuture, Capabilities, DeadLetter, End, ItemDetail, MAX_PAGE_LIMIT, Page,
    PageQuery, QueueSummary, Removed, Retried, ServerStatus, Stats,
};
use workq::periodic::{ScheduleInfo, ScheduleUpdate};

use crate::builder::MAX_NAME_BYTES;
use crate::dead_letter::STEP;
use crate::error::Error;
use crate::listing::{CONNECT_TIMEOUT, PgAdmin, scrub};
use crate::migrate::SCHEMA_VERSION;
use crate::queue::PgQueue;

/// The item type of the admin's handles: it reads and writes items as their stored text, so
/// any JSON will do.
type Any = serde_json::Value;

impl PgAdmin {
    /// The server is down: the status says so, and the settings are read again once it is
    /// up.
    fn down(&self, why: String) -> AdminError {
        self.up.store(false, Ordering::Relaxed);
        self.settings_read.store(false, Ordering::Relaxed);
        *self.error_slot() = Some(why.clone());
        AdminError::Unavailable(why)
    }

    fn error_slot(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An error as operators read it: the server cannot be reached, the request was wrong,
    /// the queue is shut down, or something else went wrong (no password in any).
    fn fail(&self, e: &Error) -> AdminError {
        match e {
            Error::Database(sqlx::Error::PoolTimedOut) => self.down(format!(
                "no connection to the server within {} s (it is down or unreachable, or the \
                 admin's {} connections are all busy)",
                CONNECT_TIMEOUT.as_secs(),
                Self::MAX_CONNECTIONS
            )),
            Error::Database(db) if unreachable(db) => {
                self.down(scrub(&e.to_string(), &self.secrets))
            }
            Error::Database(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42P01") => {
                AdminError::Backend(format!(
                    "the database has no workqueue tables on the search path (install the \
                     schema of workq-postgres, version {SCHEMA_VERSION}): {}",
                    scrub(&db.to_string(), &self.secrets)
                ))
            }
            Error::Database(sqlx::Error::Database(db)) if db.code().as_deref() == Some("57014") => {
                AdminError::Backend(format!(
                    "the server cancelled the statement after the admin's statement timeout \
                     of {} ms: {}",
                    self.statement_timeout.as_millis(),
                    scrub(&db.to_string(), &self.secrets)
                ))
            }
            Error::Database(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42501") => {
                AdminError::Backend(format!(
                    "the admin's role lacks a privilege (see workq-postgres's operator role): {}",
                    scrub(&db.to_string(), &self.secrets)
                ))
            }
            Error::Config(m) => AdminError::BadRequest(scrub(m, &self.secrets)),
            Error::ShutDown => AdminError::ShutDown,
            _ => AdminError::Backend(scrub(&e.to_string(), &self.secrets)),
        }
    }

    /// How long a call waits for the server's answer: the statement timeout and the
    /// connection's wait together (saturating: a timeout of `Duration::MAX` waits as long
    /// as it takes).
    fn answer_wait(&self) -> Duration {
        self.statement_timeout.saturating_add(CONNECT_TIMEOUT)
    }

    /// `call`, failing as [`AdminError::Unavailable`] if it takes longer than the statement
    /// timeout and the connection's wait together (a server that hangs, or a network that
    /// dropped it without a word).
    async fn read<T>(&self, call: impl Future<Output = Result<T, Error>>) -> Result<T, AdminError> {
        let wait = self.answer_wait();
        match tokio::time::timeout(wait, call).await {
            Ok(Ok(answer)) => {
                self.up.store(true, Ordering::Relaxed);
                *self.error_slot() = None;
                Ok(answer)
            }
            Ok(Err(e)) => Err(self.fail(&e)),
            Err(_) => Err(self.down(format!(
                "no answer from the server within {} s",
                wait.as_secs()
            ))),
        }
    }

    /// Reads the server settings that decide whether acknowledged work survives a crash,
    /// once after each time the admin reaches the server.
    async fn read_settings(&self) {
        if self.settings_read.swap(true, Ordering::Relaxed) {
            return;
        }
        let settings: Result<(String, String, String), _> = sqlx::query_as(
            "SELECT current_setting('fsync'), current_setting('synchronous_commit'),
                    current_setting('full_page_writes')",
        )
        .fetch_one(self.pool())
        .await;
        match settings {
            Ok((fsync, commit, pages)) => {
                let line =
                    format!("fsync {fsync}, synchronous_commit {commit}, full_page_writes {pages}");
                *self
                    .settings
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) =
                    (warnings(&fsync, &commit, &pages), Some(line));
            }
            Err(_) => self.settings_read.store(false, Ordering::Relaxed),
        }
    }

    /// A handle on queue `name`: [`AdminError::NotFound`] if the database has none,
    /// [`AdminError::BadRequest`] for a name no handle can open.
    async fn handle(&self, name: &str) -> Result<PgQueue<Any>, AdminError> {
        if let Some(why) = unopenable(name) {
            return Err(AdminError::BadRequest(format!("queue {name:?}: {why}")));
        }
        match self.read(self.queue::<Any>(name)).await {
            Ok(queue) => Ok(queue),
            // The build found no queue of that name (the admin never creates one).
            Err(AdminError::BadRequest(_)) => Err(AdminError::NotFound),
            Err(other) => Err(other),
        }
    }

    /// `call` on the handle of queue `name`.
    async fn on<'a, R, F, Fut>(&'a self, name: &'a str, call: F) -> Result<R, AdminError>
    where
        F: FnOnce(PgQueue<Any>) -> Fut,
        Fut: Future<Output = Result<R, Error>>,
    {
        let queue = self.handle(name).await?;
        self.read(call(queue)).await
    }

    /// Runs `step` on queue `name` until it answers 0 (or, once some steps were taken,
    /// [`Error::ShutDown`]: the queue was shut down meanwhile), each step a statement with
    /// its own deadline, so a bulk action of any size goes on as long as the server answers;
    /// the total the steps answered.
    async fn in_steps<'a, F, Fut>(&'a self, name: &'a str, step: F) -> Result<u64, AdminError>
    where
        F: Fn(PgQueue<Any>) -> Fut,
        Fut: Future<Output = Result<u64, Error>>,
    {
        let queue = self.handle(name).await?;
        let mut total = 0u64;
        loop {
            match tokio::time::timeout(self.answer_wait(), step(queue.clone())).await {
                Ok(Ok(0)) => break,
                Ok(Ok(n)) => total = total.saturating_add(n),
                Ok(Err(Error::ShutDown)) if total > 0 => break,
                Ok(Err(e)) => return Err(self.fail(&e)),
                Err(_) => {
                    return Err(self.down(format!(
                        "no answer from the server within {} s (after {total} done)",
                        self.answer_wait().as_secs()
                    )));
                }
            }
        }
        self.up.store(true, Ordering::Relaxed);
        *self.error_slot() = None;
        Ok(total)
    }
}

impl Admin for PgAdmin {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::all()
    }

    fn status(&self) -> ServerStatus {
        let mut status = ServerStatus::new(self.up.load(Ordering::Relaxed), self.server.clone());
        status.error.clone_from(&self.error_slot());
        let settings = self
            .settings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        status.warnings.clone_from(&settings.0);
        status.details.clone_from(&settings.1);
        status
    }

    fn queues(&self) -> BoxFuture<'_, Result<Vec<QueueSummary>, AdminError>> {
        Box::pin(async move {
            let mut all = self.read(PgAdmin::queues(self)).await?;
            self.read_settings().await;
            for queue in &mut all {
                if let Some(why) = unopenable(&queue.name) {
                    queue.broken = Some(why);
                }
            }
            Ok(all)
        })
    }

    fn summary<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<QueueSummary, AdminError>> {
        Box::pin(async move {
            let mut summary = self
                .read(PgAdmin::summary(self, queue))
                .await?
                .ok_or(AdminError::NotFound)?;
            summary.broken = unopenable(queue);
            Ok(summary)
        })
    }

    fn stats<'a>(
        &'a self,
        queue: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Stats, AdminError>> {
        let cap = self.count_cap;
        Box::pin(self.on(
            queue,
            move |q| async move { q.stats_capped(limit, cap).await },
        ))
    }

    fn page<'a>(
        &'a self,
        queue: &'a str,
        query: &'a PageQuery,
    ) -> BoxFuture<'a, Result<Page, AdminError>> {
        let cap = self.count_cap;
        Box::pin(self.on(
            queue,
            move |q| async move { q.page_capped(query, cap).await },
        ))
    }

    fn item_detail<'a>(
        &'a self,
        queue: &'a str,
        item: &'a str,
    ) -> BoxFuture<'a, Result<Option<ItemDetail>, AdminError>> {
        Box::pin(self.on(queue, move |q| async move {
            crate::inspect::json(item)?;
            q.item_detail(item).await
        }))
    }

    fn pause<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
        Box::pin(self.on(queue, |q| async move { q.pause().await }))
    }

    fn resume<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
        Box::pin(self.on(queue, |q| async move { q.resume().await }))
    }

    fn shut_down_fleet<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
        Box::pin(self.on(queue, |q| async move { q.shut_down_fleet().await }))
    }

    fn resume_fleet<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
        Box::pin(self.on(queue, |q| async move { q.resume_fleet().await }))
    }

    fn retry_now<'a>(
        &'a self,
        queue: &'a str,
        item: &'a str,
    ) -> BoxFuture<'a, Result<Retried, AdminError>> {
        Box::pin(self.on(queue, move |q| async move { q.retry_now(item).await }))
    }

    fn remove<'a>(
        &'a self,
        queue: &'a str,
        item: &'a str,
    ) -> BoxFuture<'a, Result<Removed, AdminError>> {
        Box::pin(self.on(queue, move |q| async move { q.remove(item).await }))
    }

    fn forget<'a>(
        &'a self,
        queue: &'a str,
        item: &'a str,
    ) -> BoxFuture<'a, Result<u32, AdminError>> {
        Box::pin(self.on(queue, move |q| async move { q.forget_raw(item).await }))
    }

    /// One read of `workqueue_schedules`.
    fn schedules<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ScheduleInfo>, AdminError>> {
        Box::pin(self.on(queue, |q| async move { q.schedules().await }))
    }

    /// The schedule is looked up first (a name the queue does not have is not created),
    /// then one call of `workqueue_periodic_upsert`, with this machine's clock as `now` (a
    /// resume moves the schedule's `since` to it).
    fn pause_schedule<'a>(
        &'a self,
        queue: &'a str,
        schedule: &'a str,
        paused: bool,
    ) -> BoxFuture<'a, Result<bool, AdminError>> {
        Box::pin(async move {
            let was = self
                .on(queue, |q| async move {
                    let listed = q.schedules().await?;
                    let Some(was) = listed.iter().find(|s| s.name == schedule).map(|s| s.paused)
                    else {
                        return Ok(None);
                    };
                    let update = ScheduleUpdate::pause(schedule, paused, SystemTime::now());
                    q.upsert_periodic(update).await?;
                    Ok(Some(was))
                })
                .await?;
            Ok(was.ok_or(AdminError::NotFound)? != paused)
        })
    }

    fn dead_letters<'a>(
        &'a self,
        queue: &'a str,
        from: End,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<DeadLetter>, AdminError>> {
        let limit = limit.min(MAX_PAGE_LIMIT);
        Box::pin(self.on(
            queue,
            move |q| async move { q.dead_letters(from, limit).await },
        ))
    }

    fn requeue_dead_letter_by_id<'a>(
        &'a self,
        queue: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<bool, AdminError>> {
        Box::pin(self.on(queue, move |q| async move {
            q.requeue_dead_letter_by_id(id).await
        }))
    }

    fn requeue_dead_letters<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<u64, AdminError>> {
        Box::pin(self.in_steps(
            queue,
            |q| async move { q.requeue_dead_step(None, STEP).await },
        ))
    }

    fn delete_dead_letter_by_id<'a>(
        &'a self,
        queue: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<bool, AdminError>> {
        Box::pin(self.on(queue, move |q| async move {
            q.delete_dead_letter_by_id(id).await
        }))
    }

    fn purge_dead_letters<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<u64, AdminError>> {
        Box::pin(self.in_steps(queue, |q| async move { q.purge_dead_step().await }))
    }
}

/// Whether a connection error says the server cannot be reached (or refuses this client: a
/// wrong password, no such database), rather than that a statement failed.
fn unreachable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_) => true,
        // 08: connection exceptions; 57P: shutting down, starting up; 28: authentication;
        // 3D000: no such database.
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08")
                || code.starts_with("57P")
                || code.starts_with("28")
                || code == "3D000"
        }),
        _ => false,
    }
}

/// Why no handle can open queue `name` (a name the library refuses, written by hand into the
/// table), if none can.
fn unopenable(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("its name is empty".into());
    }
    if name.len() > MAX_NAME_BYTES {
        return Some(format!(
            "its name is {} bytes long, over the {MAX_NAME_BYTES} a queue may have",
            name.len(),
        ));
    }
    name.chars()
        .find(|c| c.is_control())
        .map(|c| format!("its name holds the control character {c:?}"))
}

/// The warnings of the server's settings that can lose acknowledged work (as this role's
/// sessions see them).
fn warnings(fsync: &str, synchronous_commit: &str, full_page_writes: &str) -> Vec<String> {
    let mut out = Vec::new();
    if fsync == "off" {
        out.push(
            "fsync is off: a crash of the server's machine can lose or corrupt acknowledged \
             work (set fsync = on)"
                .to_owned(),
        );
    }
    if synchronous_commit == "off" {
        out.push(
            "synchronous_commit is off: a crash loses the last acknowledged adds and dones \
             (set synchronous_commit = on)"
                .to_owned(),
        );
    }
    if full_page_writes == "off" {
        out.push(
            "full_page_writes is off: a crash can corrupt the queues' tables (set \
             full_page_writes = on)"
                .to_owned(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{unopenable, warnings};

    #[test]
    fn names_the_library_refuses_are_told_apart() {
        assert_eq!(unopenable("pods"), None);
        assert!(unopenable("a\u{1}b").unwrap().contains("control character"));
        assert!(unopenable(&"x".repeat(300)).unwrap().contains("300 bytes"));
    }

    #[test]
    fn settings_that_lose_work_are_warned_of() {
        assert!(warnings("on", "on", "on").is_empty());
        assert!(warnings("on", "local", "on").is_empty());
        let all = warnings("off", "off", "off");
        assert_eq!(all.len(), 3);
        assert!(all[0].starts_with("fsync is off"));
    }
}
