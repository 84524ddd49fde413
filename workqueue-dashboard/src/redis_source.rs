//! Queues on Redis: [`RedisSource`].
//!
//! Queues are found by scanning for their keys: every key of queue `NAME` under prefix `P` is
//! `P:{NAME}:SUFFIX` (the braces are its cluster hash tag), so `SCAN MATCH P:{*}:*` finds every
//! queue that holds anything. A queue with no key at all (empty, never failed) is not listed.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::value::RawValue;
use tokio::sync::Mutex;
use workqueue_redis::RedisQueue;

use crate::{
    Action, DeadLetterView, FailureView, LeaseView, QueueDetail, QueueView, Source, SourceError,
};

/// Items as stored: the raw JSON text is their identity, kept byte for byte.
type Item = Box<RawValue>;

/// At most this many `SCAN` rounds per listing (each asks for 1,000 keys).
const MAX_SCAN_ROUNDS: usize = 10_000;

/// `url` with its password (and user name) replaced by `***`: what may be shown or logged.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((_, host)) => format!("{scheme}://***@{host}{tail}"),
        None => url.to_owned(),
    }
}

/// Every queue under a key prefix on one Redis server, with actions.
pub struct RedisSource {
    url: String,
    prefix: String,
    client: redis::Client,
    con: Mutex<Option<redis::aio::MultiplexedConnection>>,
    queues: Mutex<BTreeMap<String, RedisQueue<Item>>>,
    warnings: parking_lot::Mutex<Vec<String>>,
}

impl std::fmt::Debug for RedisSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSource")
            .field("url", &redact(&self.url))
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisSource {
    /// The queues under `prefix` (`wq` is the queues' default) on the server at `url`.
    ///
    /// # Errors
    ///
    /// A URL that does not parse (the message holds no password).
    pub fn new(url: &str, prefix: &str) -> Result<Self, SourceError> {
        let client = redis::Client::open(url).map_err(|e| {
            SourceError::BadRequest(format!("redis URL {}: {}", redact(url), self_kind(&e)))
        })?;
        Ok(RedisSource {
            url: url.to_owned(),
            prefix: prefix.to_owned(),
            client,
            con: Mutex::new(None),
            queues: Mutex::new(BTreeMap::new()),
            warnings: parking_lot::Mutex::new(Vec::new()),
        })
    }

    fn backend(&self, e: impl std::fmt::Display) -> SourceError {
        let mut text = e.to_string();
        if let Some(password) = self
            .client
            .get_connection_info()
            .redis_settings()
            .password()
            && !password.is_empty()
        {
            text = text.replace(password, "***");
        }
        SourceError::Backend(text.replace(&self.url, &redact(&self.url)))
    }

    async fn con(&self) -> Result<redis::aio::MultiplexedConnection, SourceError> {
        let mut slot = self.con.lock().await;
        if let Some(con) = slot.as_ref() {
            return Ok(con.clone());
        }
        let con = tokio::time::timeout(
            Duration::from_secs(5),
            self.client.get_multiplexed_async_connection(),
        )
        .await
        .map_err(|_| SourceError::Backend("timed out connecting to redis".into()))?
        .map_err(|e| self.backend(e))?;
        *slot = Some(con.clone());
        Ok(con)
    }

    /// The names of the queues under the prefix, sorted.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn names(&self) -> Result<Vec<String>, SourceError> {
        let mut con = self.con().await?;
        // The prefix is matched literally: its glob characters are escaped.
        let literal: String = self
            .prefix
            .chars()
            .flat_map(|c| {
                let escape = matches!(c, '*' | '?' | '[' | ']' | '\\');
                escape.then_some('\\').into_iter().chain([c])
            })
            .collect();
        let pattern = format!("{literal}:{{*}}:*");
        let head = format!("{}:{{", self.prefix);
        let mut names = BTreeSet::new();
        let mut cursor: u64 = 0;
        for _ in 0..MAX_SCAN_ROUNDS {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut con)
                .await
                .map_err(|e| self.backend(e))?;
            for key in keys {
                if let Some(rest) = key.strip_prefix(&head)
                    && let Some((name, _suffix)) = rest.rsplit_once("}:")
                {
                    names.insert(name.to_owned());
                }
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        Ok(names.into_iter().collect())
    }

    /// A handle on queue `name` (made once, then kept).
    async fn handle(&self, name: &str) -> Result<RedisQueue<Item>, SourceError> {
        let mut queues = self.queues.lock().await;
        if let Some(q) = queues.get(name) {
            return Ok(q.clone());
        }
        let queue = RedisQueue::<Item>::builder(name)
            .client(self.client.clone())
            .prefix(self.prefix.clone())
            .auto_renew(false)
            .check_persistence(queues.is_empty())
            .build()
            .await
            .map_err(|e| self.backend(e))?;
        if let Some(p) = queue.persistence() {
            *self.warnings.lock() = p.problems();
        }
        queues.insert(name.to_owned(), queue.clone());
        Ok(queue)
    }

    async fn detail(&self, name: &str, limit: usize) -> Result<QueueDetail, SourceError> {
        let queue = self.handle(name).await?;
        let stats = queue
            .stats(limit.max(1))
            .await
            .map_err(|e| self.backend(e))?;
        let paused = queue.is_paused().await.map_err(|e| self.backend(e))?;
        let counters = queue.counters().await.map_err(|e| self.backend(e))?;
        let dead_letters = queue
            .dead_letters(limit)
            .await
            .map_err(|e| self.backend(e))?;
        let longest = stats.leases.iter().map(|l| l.age).max().unwrap_or_default();
        let unfinished: Duration = stats.leases.iter().map(|l| l.age).sum();
        Ok(QueueDetail {
            view: QueueView {
                name: name.to_owned(),
                depth: stats.depth,
                delayed: stats.delayed,
                in_flight: stats.in_flight,
                failing: stats.failing,
                failures: stats.failures.iter().map(|f| f.1).sum(),
                stalled: stats.stalled,
                dead: stats.dead,
                dead_dropped: stats.dead_dropped,
                paused,
                shut_down: stats.shut_down,
                longest_running_s: longest.as_secs_f64(),
                unfinished_work_s: unfinished.as_secs_f64(),
                adds_total: Some(counters.adds),
                completions_total: Some(counters.completions),
                retries_total: Some(counters.failures),
            },
            leases: stats
                .leases
                .iter()
                .map(|l| LeaseView {
                    item: l.item.clone(),
                    age_s: l.age.as_secs_f64(),
                    expires_in_s: l.expires_in.as_secs_f64(),
                    token: l.token,
                })
                .collect(),
            failure_counts: stats
                .failures
                .iter()
                .map(|(item, failures)| FailureView {
                    item: item.clone(),
                    failures: *failures,
                })
                .collect(),
            dead_letters: dead_letters
                .iter()
                .map(|d| DeadLetterView {
                    item: d.item.clone(),
                    error: d.error.clone(),
                    at_ms: d.at_ms,
                    stalls: d.stalls,
                    failures: d.failures,
                })
                .collect(),
        })
    }

    fn item(text: &str) -> Result<Item, SourceError> {
        serde_json::from_str(text).map_err(|e| SourceError::BadRequest(format!("item: {e}")))
    }
}

impl Source for RedisSource {
    async fn queues(&self) -> Result<Vec<QueueView>, SourceError> {
        let mut views = Vec::new();
        for name in self.names().await? {
            views.push(self.detail(&name, 100).await?.view);
        }
        Ok(views)
    }

    async fn queue(&self, name: &str, limit: usize) -> Result<QueueDetail, SourceError> {
        if !self.names().await?.iter().any(|n| n == name) {
            return Err(SourceError::NotFound);
        }
        self.detail(name, limit).await
    }

    async fn act(&self, name: &str, action: Action) -> Result<u64, SourceError> {
        if !self.names().await?.iter().any(|n| n == name) {
            return Err(SourceError::NotFound);
        }
        let queue = self.handle(name).await?;
        let e = |e| self.backend(e);
        Ok(match action {
            Action::Pause => u64::from(queue.pause().await.map_err(e)?),
            Action::Resume => u64::from(queue.resume().await.map_err(e)?),
            Action::RequeueDeadLetters => queue.requeue_dead_letters().await.map_err(e)? as u64,
            Action::PurgeDeadLetters => queue.purge_dead_letters().await.map_err(e)? as u64,
            Action::Forget(item) => {
                queue.forget(Self::item(&item)?).await.map_err(e)?;
                1
            }
            Action::RequeueDeadLetter(item) => {
                let letters = queue.dead_letters(100_000).await.map_err(e)?;
                let Some(letter) = letters.iter().find(|d| d.item == item) else {
                    return Ok(0);
                };
                u64::from(queue.requeue_dead_letter(letter).await.map_err(e)?)
            }
        })
    }

    async fn warnings(&self) -> Vec<String> {
        self.warnings.lock().clone()
    }

    fn has_actions(&self) -> bool {
        true
    }
}

/// The kind of a URL error, without the URL (which may hold a password).
fn self_kind(e: &redis::RedisError) -> String {
    format!("{:?}", e.kind())
}
