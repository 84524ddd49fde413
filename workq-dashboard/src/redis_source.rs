//! Queues on Redis: [`RedisSource`].
//!
//! Queues are found by scanning every primary for their keys: every key of queue `NAME` under
//! prefix `P` is `P:{NAME}:SUFFIX` (the braces are its cluster hash tag), so `SCAN MATCH
//! P:{*}:*` finds every queue that holds anything. A queue with no key at all (empty, never
//! used) is not listed. Everything goes through one [`Admin`] connection, which reconnects by
//! itself after the server restarts; the queues' handles share it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use serde_json::value::RawValue;
use tokio::sync::Mutex;
use workq::admin::{DeadLetter, LeaseInfo, PageQuery, QueueSummary, Retried};
use workq_redis::{RedisAdmin as Admin, RedisQueue};

use crate::redact;
use crate::source::{
    Action, DeadLetterView, End, ItemDetail, ItemPage, ItemState, ItemView, LeaseView, Outcome,
    PageRequest, QueueView, Source, SourceError, SourceStatus,
};

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
    admin: Mutex<Option<Arc<Admin>>>,
    up: AtomicBool,
    warnings: parking_lot::Mutex<Vec<String>>,
}

impl std::fmt::Debug for RedisSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSource")
            .field(
                "urls",
                &self.urls.iter().map(|u| redact(u)).collect::<Vec<_>>(),
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
    pub fn new(url: &str, prefix: &str) -> Result<Self, SourceError> {
        let client = redis::Client::open(url).map_err(|e| {
            SourceError::BadRequest(format!("redis URL {}: {:?}", redact(url), e.kind()))
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
    fn clean(&self, text: String) -> String {
        let mut text = text;
        for url in &self.urls {
            if let Ok(info) = redis::IntoConnectionInfo::into_connection_info(url.as_str())
                && let Some(password) = info.redis_settings().password()
                && !password.is_empty()
            {
                text = text.replace(password, "***");
            }
            text = text.replace(url.as_str(), &redact(url));
        }
        text
    }

    /// A Redis error as the page shows it: the server is down (the connection failed or
    /// timed out), or something else went wrong.
    fn error(&self, e: &workq_redis::Error) -> SourceError {
        let text = self.clean(e.to_string());
        if e.is_connection() {
            self.up.store(false, Ordering::Relaxed);
            SourceError::Unavailable(text)
        } else {
            SourceError::Backend(text)
        }
    }

    async fn admin(&self) -> Result<Arc<Admin>, SourceError> {
        let mut slot = self.admin.lock().await;
        if let Some(admin) = slot.as_ref() {
            return Ok(admin.clone());
        }
        let connect = async {
            match &self.target {
                Target::Single(client) => Admin::connect((**client).clone(), &self.prefix).await,
                #[cfg(feature = "redis-cluster")]
                Target::Cluster(nodes) => Admin::connect_cluster(nodes.clone(), &self.prefix).await,
            }
        };
        let admin = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Err(_) => {
                self.up.store(false, Ordering::Relaxed);
                return Err(SourceError::Unavailable(
                    "timed out connecting to redis".into(),
                ));
            }
            Ok(Err(e)) => {
                self.up.store(false, Ordering::Relaxed);
                // Whatever stops the first connection (refused, a wrong password, an old
                // server) leaves the dashboard without this source until it is fixed.
                return Err(SourceError::Unavailable(self.clean(e.to_string())));
            }
            Ok(Ok(admin)) => Arc::new(admin),
        };
        if let Some(p) = admin.persistence() {
            *self.warnings.lock() = p.problems();
        }
        *slot = Some(admin.clone());
        Ok(admin)
    }

    /// A handle on queue `name` over the shared connection (no round trip).
    async fn handle(&self, name: &str) -> Result<RedisQueue<Item>, SourceError> {
        let admin = self.admin().await?;
        admin
            .queue::<Item>(name)
            .build()
            .await
            .map_err(|e| SourceError::BadRequest(e.to_string()))
    }

    /// Queue `name`'s summary; [`SourceError::NotFound`] if it has no key.
    async fn summary(&self, name: &str) -> Result<QueueSummary, SourceError> {
        let admin = self.admin().await?;
        match admin.summary(name).await {
            Ok(Some(s)) => {
                self.up.store(true, Ordering::Relaxed);
                Ok(s)
            }
            Ok(None) => Err(SourceError::NotFound),
            Err(workq_redis::Error::Config(_)) => Err(SourceError::NotFound),
            Err(e) => Err(self.error(&e)),
        }
    }

    fn item(text: &str) -> Result<Item, SourceError> {
        serde_json::from_str(text).map_err(|e| SourceError::BadRequest(format!("item: {e}")))
    }
}

/// A count as the views hold it.
fn size(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

fn view(name: &str, s: &QueueSummary) -> QueueView {
    if let Some(why) = &s.broken {
        return QueueView::broken(name, why.clone());
    }
    QueueView {
        depth: size(s.depth),
        delayed: size(s.delayed),
        in_flight: size(s.in_flight),
        failing: size(s.failing),
        failures: s.failures,
        stalled: size(s.stalled),
        dead: size(s.dead),
        dead_dropped: s.dead_dropped,
        paused: s.paused,
        shut_down: s.shut_down,
        longest_running_s: s.longest_lease.as_secs_f64(),
        unfinished_work_s: s.lease_age_sum.as_secs_f64(),
        adds_total: s.counters.map(|c| c.adds),
        completions_total: s.counters.map(|c| c.completions),
        retries_total: s.counters.map(|c| c.retries),
        ..QueueView::named(name)
    }
}

fn letter(d: &DeadLetter) -> DeadLetterView {
    DeadLetterView {
        id: d.id.clone(),
        item: d.item.clone(),
        error: d.error.clone(),
        at_ms: d
            .at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        stalls: u64::from(d.stalls),
        failures: u64::from(d.failures),
    }
}

fn lease(l: &LeaseInfo) -> LeaseView {
    LeaseView {
        age_s: l.age.as_secs_f64(),
        expires_in_s: l.expires_in.as_secs_f64(),
        token: l.token,
        holder: None,
    }
}

fn state_arg(state: ItemState) -> workq::admin::ItemState {
    match state {
        ItemState::Ready => workq::admin::ItemState::Ready,
        ItemState::Delayed => workq::admin::ItemState::Delayed,
        ItemState::InFlight => workq::admin::ItemState::InFlight,
        ItemState::Failing => workq::admin::ItemState::Failing,
        ItemState::Dead => workq::admin::ItemState::Dead,
    }
}

impl Source for RedisSource {
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn has_actions(&self) -> bool {
        true
    }

    fn has_items(&self) -> bool {
        true
    }

    async fn status(&self) -> SourceStatus {
        SourceStatus {
            up: self.up.load(Ordering::Relaxed),
            error: None,
            server: self
                .urls
                .iter()
                .map(|u| redact(u))
                .collect::<Vec<_>>()
                .join(", "),
            warnings: self.warnings.lock().clone(),
        }
    }

    async fn queues(&self) -> Result<Vec<QueueView>, SourceError> {
        let admin = self.admin().await?;
        let all = admin.queues().await.map_err(|e| self.error(&e))?;
        self.up.store(true, Ordering::Relaxed);
        Ok(all.iter().map(|s| view(&s.name, s)).collect())
    }

    async fn queue(&self, name: &str) -> Result<QueueView, SourceError> {
        match self.summary(name).await {
            Ok(s) => Ok(view(name, &s)),
            // A queue with a key of the wrong type exists, broken.
            Err(SourceError::Backend(why)) => Ok(QueueView::broken(name, why)),
            Err(e) => Err(e),
        }
    }

    async fn items(&self, name: &str, request: &PageRequest) -> Result<ItemPage, SourceError> {
        self.summary(name).await?;
        let queue = self.handle(name).await?;
        let from = match request.from {
            End::First => workq::admin::End::First,
            End::Last => workq::admin::End::Last,
        };
        let query = PageQuery::new(state_arg(request.state), request.limit)
            .from(from)
            .cursor(request.cursor.clone())
            .search(request.search.clone());
        let page = queue.page(&query).await.map_err(|e| match e {
            workq_redis::Error::Protocol(m) => SourceError::BadRequest(m),
            e => self.error(&e),
        })?;
        // Offsets go back by a page (the backend says where); a search or a hash scan
        // cannot (the page keeps the cursors it came through).
        let items = page
            .items
            .into_iter()
            .map(|e| ItemView {
                priority: e.priority,
                due_in_s: e.due_in.map(|d| d.as_secs_f64()),
                lease: e.lease.as_ref().map(lease),
                failures: e.failures.map(u64::from),
                dead: e.dead.as_ref().map(letter),
                ..ItemView::new(e.item, request.state)
            })
            .collect();
        Ok(ItemPage {
            items,
            total: page.total,
            next: page.next,
            prev: page.prev,
        })
    }

    async fn item(&self, name: &str, item: &str) -> Result<ItemDetail, SourceError> {
        self.summary(name).await?;
        let queue = self.handle(name).await?;
        let info = queue
            .item_detail(item)
            .await
            .map_err(|e| self.error(&e))?
            .ok_or(SourceError::NotFound)?;
        let states = info
            .states
            .iter()
            .map(|s| match s {
                workq::admin::ItemState::Ready => ItemState::Ready,
                workq::admin::ItemState::Delayed => ItemState::Delayed,
                workq::admin::ItemState::InFlight => ItemState::InFlight,
                workq::admin::ItemState::Failing => ItemState::Failing,
                _ => ItemState::Dead,
            })
            .collect();
        Ok(ItemDetail {
            item: info.item.clone(),
            states,
            priority: info.priority,
            position: info.position,
            due_in_s: info.due_in.map(|d| d.as_secs_f64()),
            lease: info.lease.as_ref().map(lease),
            readded: info.readded,
            failures: u64::from(info.failures),
            stalls: u64::from(info.stalls),
            dead_letters: info.dead_letters.iter().map(letter).collect(),
        })
    }

    async fn act(&self, name: &str, action: &Action) -> Result<Outcome, SourceError> {
        // An action on a queue that does not exist would create keys: refuse it.
        self.summary(name).await?;
        let queue = self.handle(name).await?;
        let e = |e: workq_redis::Error| match e {
            workq_redis::Error::Protocol(m) => SourceError::BadRequest(m),
            e => self.error(&e),
        };
        Ok(match action {
            Action::Pause => match queue.pause().await.map_err(e)? {
                true => Outcome::new(1, "paused"),
                false => Outcome::new(0, "already paused"),
            },
            Action::Resume => match queue.resume().await.map_err(e)? {
                true => Outcome::new(1, "resumed"),
                false => Outcome::new(0, "already running"),
            },
            Action::RequeueDeadLetters => match queue.requeue_dead_letters().await {
                Ok(n) => Outcome::new(n, format!("requeued {n} dead letters")),
                Err(workq_redis::Error::ShutDown) => Outcome::new(
                    0,
                    "the queue is shut down: no dead letter was requeued (resume it first)",
                ),
                Err(err) => return Err(e(err)),
            },
            Action::PurgeDeadLetters => {
                let n = queue.purge_dead_letters().await.map_err(e)?;
                Outcome::new(n, format!("purged {n} dead letters"))
            }
            Action::RequeueDeadLetter { id } => match queue.requeue_dead_letter_by_id(id).await {
                Ok(true) => Outcome::new(1, "requeued the dead letter"),
                Ok(false) => Outcome::new(0, "no such dead letter (requeued or deleted already)"),
                Err(workq_redis::Error::ShutDown) => Outcome::new(
                    0,
                    "the queue is shut down: the dead letter stays (resume it first)",
                ),
                Err(err) => return Err(e(err)),
            },
            Action::DeleteDeadLetter { id } => {
                match queue.delete_dead_letter_by_id(id).await.map_err(e)? {
                    true => Outcome::new(1, "deleted the dead letter"),
                    false => Outcome::new(0, "no such dead letter (requeued or deleted already)"),
                }
            }
            Action::RetryNow { item } => {
                Self::item(item)?;
                match queue.retry_now(item).await.map_err(e)? {
                    Retried::Queued => Outcome::new(1, "queued now"),
                    Retried::Deferred => {
                        Outcome::new(1, "queued again when its current lease ends")
                    }
                    Retried::AlreadyQueued => Outcome::new(0, "already queued"),
                    Retried::InFlight => Outcome::new(0, "being processed; nothing to retry"),
                    Retried::ShutDown => Outcome::new(0, "the queue is shut down"),
                    _ => Outcome::new(0, "not delayed or failing in this queue"),
                }
            }
            Action::Remove { item } => {
                Self::item(item)?;
                let removed = queue.remove(item).await.map_err(e)?;
                let mut parts = Vec::new();
                if removed.queued {
                    parts.push("left the ready list");
                }
                if removed.delayed {
                    parts.push("its delay is dropped");
                }
                if removed.readd {
                    parts.push("its pending re-add is dropped (the lease stays with its holder)");
                }
                if removed.counts {
                    parts.push("its failure and stall counts are cleared");
                }
                if parts.is_empty() {
                    Outcome::new(0, "not in the queue")
                } else {
                    Outcome::new(1, parts.join("; "))
                }
            }
            Action::Forget { item } => {
                let parsed = Self::item(item)?;
                let n = queue.num_requeues(&parsed).await.map_err(e)?;
                queue.forget(parsed).await.map_err(e)?;
                if n > 0 {
                    Outcome::new(1, format!("cleared {n} failures"))
                } else {
                    Outcome::new(0, "no failures to clear")
                }
            }
        })
    }
}
