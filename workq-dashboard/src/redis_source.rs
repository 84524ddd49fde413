//! Queues on Redis: [`RedisSource`], the dashboard's [`Admin`] over `workq-redis`'s
//! operator calls until that crate implements the contract itself (`RedisAdmin`).
//!
//! Queues are found by scanning every primary for their keys: every key of queue `NAME` under
//! prefix `P` is `P:{NAME}:SUFFIX` (the braces are its cluster hash tag), so `SCAN MATCH
//! P:{*}:*` finds every queue that holds anything. A queue with no key at all (empty, never
//! used) is not listed. Everything goes through one [`RedisAdmin`] connection, which
//! reconnects by itself after the server restarts; the queues' handles share it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use serde_json::value::RawValue;
use tokio::sync::Mutex;
use workq::admin::{
    Admin, AdminError, BoxFuture, Capabilities, Counters, DeadLetter, End, InFlight, ItemDetail,
    ItemState, LeaseInfo, Page, PageEntry, PageQuery, QueueSummary, Removed, Retried, ServerStatus,
    Stats, redact_url,
};
use workq_redis::{Admin as RedisAdmin, RedisQueue, Summary};

/// Items as stored: the raw JSON text is their identity, kept byte for byte.
type Item = Box<RawValue>;

/// How long connecting may take before the server counts as down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the source connects.
enum Target {
    Single(Box<redis::Client>),
    #[cfg(feature = "redis-cluster")]
    Cluster(Vec<String>),
}

/// Every queue under a key prefix on one Redis server or cluster, with actions.
pub struct RedisSource {
    /// The URLs, for messages: passwords are taken out of errors by them.
    urls: Vec<String>,
    prefix: String,
    target: Target,
    /// Made on first use and kept: it reconnects by itself.
    admin: Mutex<Option<Arc<RedisAdmin>>>,
    up: AtomicBool,
    warnings: parking_lot::Mutex<Vec<String>>,
}

impl std::fmt::Debug for RedisSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSource")
            .field(
                "urls",
                &self.urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>(),
            )
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisSource {
    /// The queues under `prefix` (`wq` is the queues' default) on the server at `url`. Does
    /// not connect yet: a server that is down shows as down on the page until it is up.
    ///
    /// # Errors
    ///
    /// A URL that does not parse (the message holds no password).
    pub fn new(url: &str, prefix: &str) -> Result<Self, AdminError> {
        let client = redis::Client::open(url).map_err(|e| {
            AdminError::BadRequest(format!("redis URL {}: {:?}", redact_url(url), e.kind()))
        })?;
        Ok(Self::with_target(
            vec![url.to_owned()],
            prefix,
            Target::Single(Box::new(client)),
        ))
    }

    /// The queues under `prefix` on a Redis Cluster, by the URLs of some of its nodes
    /// (feature `redis-cluster`). Listings scan every primary.
    #[cfg(feature = "redis-cluster")]
    pub fn cluster(nodes: Vec<String>, prefix: &str) -> Self {
        Self::with_target(nodes.clone(), prefix, Target::Cluster(nodes))
    }

    fn with_target(urls: Vec<String>, prefix: &str, target: Target) -> Self {
        RedisSource {
            urls,
            prefix: prefix.to_owned(),
            target,
            admin: Mutex::new(None),
            up: AtomicBool::new(false),
            warnings: parking_lot::Mutex::new(Vec::new()),
        }
    }

    /// An error's text without any password of the URLs.
    fn clean(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for url in &self.urls {
            if let Ok(info) = redis::IntoConnectionInfo::into_connection_info(url.as_str())
                && let Some(password) = info.redis_settings().password()
                && !password.is_empty()
            {
                text = text.replace(password, "***");
            }
            text = text.replace(url.as_str(), &redact_url(url));
        }
        text
    }

    /// A Redis error as the contract tells it: the server is down (the connection failed
    /// or timed out), the request was wrong, or something else went wrong.
    fn error(&self, e: &workq_redis::Error) -> AdminError {
        let text = self.clean(&e.to_string());
        if e.is_connection() {
            self.up.store(false, Ordering::Relaxed);
            AdminError::Unavailable(text)
        } else if let workq_redis::Error::Protocol(m) = e {
            AdminError::BadRequest(self.clean(m))
        } else {
            AdminError::Backend(text)
        }
    }

    async fn admin(&self) -> Result<Arc<RedisAdmin>, AdminError> {
        let mut slot = self.admin.lock().await;
        if let Some(admin) = slot.as_ref() {
            return Ok(admin.clone());
        }
        let connect = async {
            match &self.target {
                Target::Single(client) => {
                    RedisAdmin::connect((**client).clone(), &self.prefix).await
                }
                #[cfg(feature = "redis-cluster")]
                Target::Cluster(nodes) => {
                    RedisAdmin::connect_cluster(nodes.clone(), &self.prefix).await
                }
            }
        };
        let admin = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Err(_) => {
                self.up.store(false, Ordering::Relaxed);
                return Err(AdminError::Unavailable(
                    "timed out connecting to redis".into(),
                ));
            }
            Ok(Err(e)) => {
                self.up.store(false, Ordering::Relaxed);
                // Whatever stops the first connection (refused, a wrong password, an old
                // server) leaves the dashboard without this source until it is fixed.
                return Err(AdminError::Unavailable(self.clean(&e.to_string())));
            }
            Ok(Ok(admin)) => Arc::new(admin),
        };
        if let Some(p) = admin.persistence() {
            *self.warnings.lock() = p.problems();
        }
        *slot = Some(admin.clone());
        Ok(admin)
    }

    /// Queue `name`'s summary; [`AdminError::NotFound`] if it has no key (an action on it
    /// would create keys).
    async fn find(&self, name: &str) -> Result<Summary, AdminError> {
        let admin = self.admin().await?;
        match admin.summary(name).await {
            Ok(s) if s.exists => {
                self.up.store(true, Ordering::Relaxed);
                Ok(s)
            }
            Ok(_) => Err(AdminError::NotFound),
            Err(workq_redis::Error::Config(m)) => Err(AdminError::BadRequest(self.clean(&m))),
            Err(e) => Err(self.error(&e)),
        }
    }

    /// A handle on queue `name`, which exists, over the shared connection.
    async fn handle(&self, name: &str) -> Result<RedisQueue<Item>, AdminError> {
        self.find(name).await?;
        let admin = self.admin().await?;
        admin
            .queue::<Item>(name)
            .build()
            .await
            .map_err(|e| AdminError::BadRequest(self.clean(&e.to_string())))
    }

    fn item(text: &str) -> Result<Item, AdminError> {
        serde_json::from_str(text).map_err(|e| AdminError::BadRequest(format!("item: {e}")))
    }

    /// `call` on the handle of queue `name`, its errors told as the contract tells them.
    async fn on<T, F>(
        &self,
        name: &str,
        call: impl FnOnce(RedisQueue<Item>) -> F,
    ) -> Result<T, AdminError>
    where
        F: Future<Output = Result<T, workq_redis::Error>>,
    {
        let queue = self.handle(name).await?;
        call(queue).await.map_err(|e| self.error(&e))
    }
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn small(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn summary_of(name: &str, s: &Summary) -> QueueSummary {
    let mut q = QueueSummary::named(name);
    q.depth = count(s.depth);
    q.delayed = count(s.delayed);
    q.in_flight = count(s.in_flight);
    q.in_flight_dirty = count(s.in_flight_dirty);
    q.failing = count(s.failing);
    q.failures = s.failures;
    q.stalled = count(s.stalled);
    q.dead = count(s.dead);
    q.dead_dropped = s.dead_dropped;
    q.paused = s.paused;
    q.shut_down = s.shut_down;
    q.longest_lease = s.longest_lease;
    q.lease_age_sum = s.lease_age_sum;
    q.counters = Some(Counters::new(
        s.counters.adds,
        s.counters.completions,
        s.counters.failures,
    ));
    q
}

fn letter(d: &workq_redis::DeadLetter) -> DeadLetter {
    let mut l = DeadLetter::new(d.id(), d.item.clone());
    l.error.clone_from(&d.error);
    l.at = SystemTime::UNIX_EPOCH + Duration::from_millis(d.at_ms);
    l.stalls = small(d.stalls);
    l.failures = small(d.failures);
    l.token = Some(d.token);
    l
}

fn lease(l: &workq_redis::InFlight) -> LeaseInfo {
    LeaseInfo::new(l.age, l.expires_in, l.token)
}

fn state_arg(state: ItemState) -> workq_redis::ItemState {
    match state {
        ItemState::Ready => workq_redis::ItemState::Ready,
        ItemState::Delayed => workq_redis::ItemState::Delayed,
        ItemState::InFlight => workq_redis::ItemState::InFlight,
        ItemState::Failing => workq_redis::ItemState::Failing,
        _ => workq_redis::ItemState::Dead,
    }
}

fn end_arg(end: End) -> workq_redis::End {
    match end {
        End::First => workq_redis::End::First,
        End::Last => workq_redis::End::Last,
    }
}

impl Admin for RedisSource {
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::all()
    }

    fn status(&self) -> ServerStatus {
        let server = self
            .urls
            .iter()
            .map(|u| redact_url(u))
            .collect::<Vec<_>>()
            .join(", ");
        let mut status = ServerStatus::new(self.up.load(Ordering::Relaxed), server);
        status.warnings = self.warnings.lock().clone();
        status
    }

    fn queues(&self) -> BoxFuture<'_, Result<Vec<QueueSummary>, AdminError>> {
        Box::pin(async move {
            let admin = self.admin().await?;
            let all = admin.overview().await.map_err(|e| self.error(&e))?;
            self.up.store(true, Ordering::Relaxed);
            Ok(all
                .into_iter()
                .map(|(name, summary)| match summary {
                    Ok(s) => summary_of(&name, &s),
                    Err(e) => QueueSummary::broken(name, self.clean(&e.to_string())),
                })
                .collect())
        })
    }

    fn summary<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<QueueSummary, AdminError>> {
        Box::pin(async move {
            match self.find(queue).await {
                Ok(s) => Ok(summary_of(queue, &s)),
                // A queue with a key of the wrong type exists, broken.
                Err(AdminError::Backend(why)) => Ok(QueueSummary::broken(queue, why)),
                Err(e) => Err(e),
            }
        })
    }

    fn stats<'a>(
        &'a self,
        queue: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Stats, AdminError>> {
        Box::pin(async move {
            let summary = summary_of(queue, &self.find(queue).await?);
            let s = self
                .on(queue, |q| async move { q.stats(limit).await })
                .await?;
            let mut stats = Stats::new(summary);
            stats.next_delayed_in = s.next_delayed_in;
            stats.leases = s
                .leases
                .iter()
                .map(|l| InFlight::new(l.item.clone(), lease(l)))
                .collect();
            stats.failures = s
                .failures
                .iter()
                .map(|(item, n)| (item.clone(), small(*n)))
                .collect();
            Ok(stats)
        })
    }

    fn page<'a>(
        &'a self,
        queue: &'a str,
        query: &'a PageQuery,
    ) -> BoxFuture<'a, Result<Page, AdminError>> {
        Box::pin(async move {
            let limit = query.effective_limit();
            let page = self
                .on(queue, |q| async move {
                    q.page(
                        state_arg(query.state),
                        end_arg(query.from),
                        query.cursor.as_deref(),
                        limit,
                        query.search.as_deref(),
                    )
                    .await
                })
                .await?;
            let items = page
                .entries
                .into_iter()
                .map(|e| {
                    let mut entry = PageEntry::new(e.item, query.state);
                    entry.priority = e.priority;
                    entry.due_in = e.due_in;
                    entry.lease = e.lease.as_ref().map(lease);
                    entry.failures = e.failures.map(small);
                    entry.dead = e.dead.as_ref().map(letter);
                    entry
                })
                .collect();
            let mut out = Page::new(items, count(page.total));
            out.next = page.next;
            // Offsets go back by a page; a search or a hash scan cannot (the page keeps the
            // cursors it came through).
            out.prev = match (&query.search, query.state, query.cursor.as_deref()) {
                (None, s, Some(c)) if s != ItemState::Failing => c
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n > 0)
                    .map(|n| n.saturating_sub(limit).to_string()),
                _ => None,
            };
            Ok(out)
        })
    }

    fn item_detail<'a>(
        &'a self,
        queue: &'a str,
        item: &'a str,
    ) -> BoxFuture<'a, Result<Option<ItemDetail>, AdminError>> {
        Box::pin(async move {
            let info = self
                .on(queue, |q| async move { q.inspect_raw(item).await })
                .await?;
            if info.is_unknown() {
                return Ok(None);
            }
            let mut d = ItemDetail::new(info.item.clone());
            if info.queued {
                d.states.push(ItemState::Ready);
            }
            if info.due_in.is_some() {
                d.states.push(ItemState::Delayed);
            }
            if info.lease.is_some() {
                d.states.push(ItemState::InFlight);
            }
            if info.failures > 0 {
                d.states.push(ItemState::Failing);
            }
            if !info.dead_letters.is_empty() {
                d.states.push(ItemState::Dead);
            }
            d.priority = Some(info.priority);
            d.position = info.position.map(count);
            d.due_in = info.due_in;
            d.lease = info.lease.as_ref().map(lease);
            d.lease_priority = info.lease_priority;
            d.readded = info.readded;
            d.failures = small(info.failures);
            d.stalls = small(info.stalls);
            d.dead_letters = info.dead_letters.iter().map(letter).collect();
            Ok(Some(d))
        })
    }

    fn pause<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
        Box::pin(self.on(queue, |q| async move { q.pause().await }))
    }

    fn resume<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
        Box::pin(self.on(queue, |q| async move { q.resume().await }))
    }

    fn shut_down_fleet<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
        Box::pin(self.on(queue, |q| async move {
            let was = q.is_fleet_shut_down().await?;
            q.shut_down_fleet().await?;
            Ok(!was)
        }))
    }

    fn resume_fleet<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
        Box::pin(self.on(queue, |q| async move { q.resume_fleet().await }))
    }

    fn retry_now<'a>(
        &'a self,
        queue: &'a str,
        item: &'a str,
    ) -> BoxFuture<'a, Result<Retried, AdminError>> {
        Box::pin(async move {
            Self::item(item)?;
            let retried = self
                .on(queue, |q| async move { q.retry_now(item).await })
                .await?;
            Ok(match retried {
                workq_redis::Retried::Queued => Retried::Queued,
                workq_redis::Retried::Deferred => Retried::Deferred,
                workq_redis::Retried::AlreadyQueued => Retried::AlreadyQueued,
                workq_redis::Retried::InFlight => Retried::InFlight,
                workq_redis::Retried::ShutDown => Retried::ShutDown,
                _ => Retried::Unknown,
            })
        })
    }

    fn remove<'a>(
        &'a self,
        queue: &'a str,
        item: &'a str,
    ) -> BoxFuture<'a, Result<Removed, AdminError>> {
        Box::pin(async move {
            Self::item(item)?;
            let r = self
                .on(queue, |q| async move { q.remove(item).await })
                .await?;
            let mut removed = Removed::default();
            removed.queued = r.queued;
            removed.delayed = r.delayed;
            removed.readd = r.readd;
            removed.counts = r.counts;
            Ok(removed)
        })
    }

    fn forget<'a>(
        &'a self,
        queue: &'a str,
        item: &'a str,
    ) -> BoxFuture<'a, Result<u32, AdminError>> {
        Box::pin(async move {
            let parsed = Self::item(item)?;
            self.on(queue, |q| async move {
                let n = q.num_requeues(&parsed).await?;
                q.forget(parsed).await?;
                Ok(u32::try_from(n).unwrap_or(u32::MAX))
            })
            .await
        })
    }

    fn dead_letters<'a>(
        &'a self,
        queue: &'a str,
        from: End,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<DeadLetter>, AdminError>> {
        Box::pin(async move {
            let query = PageQuery::new(ItemState::Dead, limit).from(from);
            let page = self.page(queue, &query).await?;
            Ok(page.items.into_iter().filter_map(|e| e.dead).collect())
        })
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
        Box::pin(self.on(queue, |q| async move {
            q.requeue_dead_letters().await.map(count)
        }))
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
        Box::pin(self.on(
            queue,
            |q| async move { q.purge_dead_letters().await.map(count) },
        ))
    }
}
