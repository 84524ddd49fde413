//! What an operator does to one item: pages of the items in one state ([`RedisQueue::page`]),
//! everything about one item ([`RedisQueue::inspect`]), and the single-item actions
//! ([`retry_now`](RedisQueue::retry_now), [`remove`](RedisQueue::remove); the dead-letter
//! ones by id are in `dead_letter.rs`). Each is one script or one command, so each keeps the
//! queue's rules: an item under a lease stays with its holder, a queued item is never queued
//! twice, and a retried item goes through the same add as a worker's.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{FromRedisValue, ParsingError, Script, Value};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::dead_letter::DeadLetter;
use crate::error::Error;
use crate::queue::RedisQueue;
use crate::reply::{self, count, number, parts, parts_ref, span, text};
use crate::scripts::{Oom, script};
use crate::stats::InFlight;

static PAGE: LazyLock<Script> =
    LazyLock::new(|| script(&[include_str!("lua/page.lua")], Oom::Allow));
static INSPECT: LazyLock<Script> =
    LazyLock::new(|| script(&[include_str!("lua/inspect.lua")], Oom::Allow));
static RETRY_NOW: LazyLock<Script> =
    LazyLock::new(|| script(&[include_str!("lua/retry_now.lua")], Oom::Refuse));
static REMOVE: LazyLock<Script> =
    LazyLock::new(|| script(&[include_str!("lua/remove.lua")], Oom::Allow));

/// How many entries one page call looks at, at most, when it searches: a search of a long
/// list runs as many short calls as it needs (each a few milliseconds of the server's time),
/// never one long one.
pub const SEARCH_BUDGET: usize = 10_000;

/// How many of the newest dead letters [`RedisQueue::inspect`] looks through for the item.
const INSPECT_DEAD_SCAN: usize = 1_000;

/// The state of the items a [`Page`] lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ItemState {
    /// Ready to hand out, in hand-out order (highest priority first, FIFO within one).
    Ready,
    /// Waiting for a delay, soonest due first.
    Delayed,
    /// Under a lease, nearest deadline first.
    InFlight,
    /// With a failure count (in the order of the server's hash; `from` does not apply).
    Failing,
    /// Dead letters, oldest first.
    Dead,
}

impl ItemState {
    fn arg(self) -> &'static str {
        match self {
            ItemState::Ready => "ready",
            ItemState::Delayed => "delayed",
            ItemState::InFlight => "in_flight",
            ItemState::Failing => "failing",
            ItemState::Dead => "dead",
        }
    }
}

/// Which end of a state's order a page starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum End {
    /// The first in the state's order: the next out, the soonest due, the oldest dead letter.
    #[default]
    First,
    /// The last: the last queued, the latest due, the newest dead letter.
    Last,
}

/// One item in a [`Page`], with what its state says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PageEntry {
    /// The item as stored (its JSON text).
    pub item: String,
    /// Ready: the priority it is queued at.
    pub priority: Option<i32>,
    /// Delayed: how long until it is due (zero if it is due and not promoted yet).
    pub due_in: Option<Duration>,
    /// In flight: its lease.
    pub lease: Option<InFlight>,
    /// Failing: its failure count.
    pub failures: Option<u64>,
    /// Dead: the dead letter.
    pub dead: Option<DeadLetter>,
}

/// One page of the items in one state ([`RedisQueue::page`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Page {
    /// How many items are in the state (whatever the search).
    pub total: usize,
    /// The entries, in the state's order from the requested end.
    pub entries: Vec<PageEntry>,
    /// Where the next page starts (further from the end), if anything is left to look at.
    /// With a search, a page may hold fewer entries than asked (the call looked at
    /// [`SEARCH_BUDGET`] entries) and still have a next one.
    pub next: Option<String>,
}

impl FromRedisValue for Page {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let p = parts(value)?;
        if p.len() < 4 {
            return Err(format!("short page reply: {} fields", p.len()).into());
        }
        let now = number(&p[0])?;
        let total = count(&p[1])? as usize;
        let next = text(&p[2])?;
        let entries = parts_ref(&p[3])?
            .iter()
            .map(|entry| {
                let f = parts_ref(entry)?;
                let mut e = PageEntry {
                    item: String::new(),
                    priority: None,
                    due_in: None,
                    lease: None,
                    failures: None,
                    dead: None,
                };
                match f {
                    [raw] => {
                        let letter = DeadLetter::from_entry(match raw {
                            Value::BulkString(b) => b.clone(),
                            other => text(other)?.into_bytes(),
                        });
                        e.item = letter.item.clone();
                        e.dead = Some(letter);
                    }
                    [item, a] => {
                        e.item = text(item)?;
                        // Ready entries carry a priority, delayed ones a due time, failing ones a
                        // count: the caller knows which it asked for; all three are numbers.
                        let n = number(a)?;
                        e.priority = i32::try_from(n).ok();
                        e.due_in = Some(span(now, n));
                        e.failures = Some(n.max(0) as u64);
                    }
                    [item, deadline, since, token] => {
                        e.item = text(item)?;
                        e.lease = Some(InFlight {
                            item: e.item.clone(),
                            age: span(number(since)?, now),
                            expires_in: span(now, number(deadline)?),
                            token: count(token)?,
                        });
                    }
                    _ => return Err(ParsingError::from("a malformed page entry".to_owned())),
                }
                Ok(e)
            })
            .collect::<Result<Vec<_>, ParsingError>>()?;
        Ok(Page {
            total,
            entries,
            next: (!next.is_empty()).then_some(next),
        })
    }
}

/// Everything the queue knows about one item ([`RedisQueue::inspect`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ItemInfo {
    /// The item as asked for (its JSON text).
    pub item: String,
    /// Queued: ready to hand out.
    pub queued: bool,
    /// Its place in the hand-out order when queued (0: next out), if found within the first
    /// 100,000 of its priority.
    pub position: Option<usize>,
    /// The priority it is queued (or delayed, or to be re-added) at.
    pub priority: i32,
    /// When it waits for a delay: how long until it is due.
    pub due_in: Option<Duration>,
    /// Its lease, when it is being processed.
    pub lease: Option<InFlight>,
    /// The priority its current lease was handed out with.
    pub lease_priority: Option<i32>,
    /// Re-added while processing: queued again when its lease ends.
    pub readded: bool,
    /// Its failure count (`add_rate_limited` since the last `forget`).
    pub failures: u64,
    /// Its leases that expired in a row.
    pub stalls: u64,
    /// Its dead letters among the newest 1,000, oldest first.
    pub dead_letters: Vec<DeadLetter>,
}

impl ItemInfo {
    /// Whether the queue knows nothing of the item.
    pub fn is_unknown(&self) -> bool {
        !self.queued
            && !self.readded
            && self.due_in.is_none()
            && self.lease.is_none()
            && self.failures == 0
            && self.stalls == 0
            && self.dead_letters.is_empty()
    }
}

/// An optional number in a reply: `''` means none.
fn maybe(value: &Value) -> Result<Option<i64>, ParsingError> {
    match value {
        Value::BulkString(b) if b.is_empty() => Ok(None),
        Value::Nil => Ok(None),
        other => number(other).map(Some),
    }
}

fn parse_info(item: &str, value: Value) -> Result<ItemInfo, ParsingError> {
    let p = parts(value)?;
    if p.len() < 13 {
        return Err(format!("short inspect reply: {} fields", p.len()).into());
    }
    let now = number(&p[0])?;
    let deadline = maybe(&p[2])?;
    let lease = match deadline {
        Some(deadline) => Some(InFlight {
            item: item.to_owned(),
            age: span(maybe(&p[3])?.unwrap_or(now), now),
            expires_in: span(now, deadline),
            token: maybe(&p[4])?.unwrap_or(0).max(0) as u64,
        }),
        None => None,
    };
    let dirty = number(&p[1])? == 1;
    let given = maybe(&p[6])?;
    let lane = maybe(&p[10])?;
    let position = number(&p[11])?;
    let dead_letters = parts_ref(&p[12])?
        .iter()
        .map(|e| {
            Ok(DeadLetter::from_entry(match e {
                Value::BulkString(b) => b.clone(),
                other => text(other)?.into_bytes(),
            }))
        })
        .collect::<Result<Vec<_>, ParsingError>>()?;
    Ok(ItemInfo {
        item: item.to_owned(),
        queued: dirty && lease.is_none(),
        position: (position >= 0).then_some(position as usize),
        priority: lane.or(given).unwrap_or(0) as i32,
        due_in: maybe(&p[5])?.map(|due| span(now, due)),
        lease_priority: maybe(&p[7])?.map(|p| p as i32),
        readded: dirty && lease.is_some(),
        lease,
        failures: count(&p[8])?,
        stalls: count(&p[9])?,
        dead_letters,
    })
}

/// What [`RedisQueue::retry_now`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Retried {
    /// The item is queued now (its delay, if any, is gone).
    Queued,
    /// The item is being processed: it is queued again when its lease ends.
    Deferred,
    /// It was queued already: nothing changed.
    AlreadyQueued,
    /// It is being processed with no add pending: nothing to bring forward.
    InFlight,
    /// The queue is shut down for every process: nothing changed.
    ShutDown,
    /// The queue does not know the item (not delayed, not failing): nothing changed.
    Unknown,
}

/// What [`RedisQueue::remove`] took out of the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub struct Removed {
    /// It was queued, and left its ready list.
    pub queued: bool,
    /// It waited for a delay, which is gone.
    pub delayed: bool,
    /// It was being processed and re-added meanwhile: the re-add is dropped (the lease stays
    /// with its holder).
    pub readd: bool,
    /// Its failure and stall counts were cleared.
    pub counts: bool,
}

impl Removed {
    /// Whether anything was removed.
    pub fn any(&self) -> bool {
        self.queued || self.delayed || self.readd || self.counts
    }
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> RedisQueue<T> {
    /// A page of the items in `state`, starting `cursor` (a page's [`Page::next`], or `None`
    /// for the first page) from `from`'s end, at most `limit` entries, and only those whose
    /// item text (or dead letter) contains `search`, compared in lower case. Reads only: each
    /// call is one script that looks at no more than `limit` entries without a search and
    /// [`SEARCH_BUDGET`] with one, so even a million dead letters are paged without blocking
    /// the server, from either end.
    ///
    /// # Errors
    ///
    /// A connection error, or [`Error::Protocol`] for a cursor this queue did not give.
    pub async fn page(
        &self,
        state: ItemState,
        from: End,
        cursor: Option<&str>,
        limit: usize,
        search: Option<&str>,
    ) -> Result<Page, Error> {
        let cursor = cursor.unwrap_or("");
        if state != ItemState::Failing && !cursor.is_empty() && cursor.parse::<u64>().is_err() {
            return Err(Error::Protocol(format!("not a page cursor: {cursor:?}")));
        }
        let needle = search.unwrap_or("").to_lowercase();
        let from = match from {
            End::First => "first",
            End::Last => "last",
        };
        let limit = limit.clamp(1, 1000);
        let value: Value = self
            .inner
            .call("page", |mut con| {
                let needle = needle.clone();
                async move {
                    self.inner
                        .invocation(&PAGE)
                        .arg(state.arg())
                        .arg(from)
                        .arg(cursor)
                        .arg(limit)
                        .arg(needle)
                        .arg(SEARCH_BUDGET)
                        .invoke_async(&mut con)
                        .await
                }
            })
            .await?;
        let mut page: Page = reply::parse("page", value)?;
        for entry in &mut page.entries {
            // Keep only what the state says (the reply's pairs are read all three ways).
            if state != ItemState::Ready {
                entry.priority = None;
            }
            if state != ItemState::Delayed {
                entry.due_in = None;
            }
            if state != ItemState::Failing {
                entry.failures = None;
            }
        }
        Ok(page)
    }

    /// Everything the queue knows about `item`: queued (and where), delayed (and until when),
    /// under a lease (its token, age and deadline), re-added meanwhile, its failure and stall
    /// counts and its recent dead letters. Reads only.
    ///
    /// # Errors
    ///
    /// A serialization or connection error.
    pub async fn inspect(&self, item: &T) -> Result<ItemInfo, Error> {
        let raw = serde_json::to_string(item).map_err(Error::Serialize)?;
        self.inspect_raw(&raw).await
    }

    /// [`inspect`](Self::inspect) of an item given as its stored JSON text.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn inspect_raw(&self, raw: &str) -> Result<ItemInfo, Error> {
        let value: Value = self
            .inner
            .call("inspect", |mut con| async move {
                self.inner
                    .invocation(&INSPECT)
                    .arg(raw)
                    .arg(INSPECT_DEAD_SCAN)
                    .invoke_async(&mut con)
                    .await
            })
            .await?;
        parse_info(raw, value).map_err(|e| Error::Protocol(format!("inspect: {e}")))
    }

    /// An operator's "run it now" for an item that waits for a delay or has a failure count:
    /// it is added as [`add`](Self::add) would add it (a delayed item is queued at once, one
    /// under a lease is queued again when the lease ends). Its failure count stays (use
    /// [`forget`](Self::forget)). Idempotent: a second call finds it queued. The item is
    /// given as its stored JSON text.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn retry_now(&self, raw: &str) -> Result<Retried, Error> {
        let outcome: String = self
            .inner
            .call("retry_now", |mut con| async move {
                self.inner
                    .invocation(&RETRY_NOW)
                    .arg(raw)
                    .invoke_async(&mut con)
                    .await
            })
            .await?;
        Ok(match outcome.as_str() {
            "queued" => Retried::Queued,
            "deferred" => Retried::Deferred,
            "already_queued" => Retried::AlreadyQueued,
            "in_flight" => Retried::InFlight,
            "shut_down" => Retried::ShutDown,
            "unknown" => Retried::Unknown,
            other => return Err(Error::Protocol(format!("retry_now: {other:?}"))),
        })
    }

    /// Takes an item (its stored JSON text) out of the queue: out of its ready list or its
    /// delay; if it is being processed its lease stays with the holder, and only a re-add
    /// pending for when the lease ends is dropped. An item no longer leased also loses its
    /// failure and stall counts. Its dead letters are not touched. Idempotent.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn remove(&self, raw: &str) -> Result<Removed, Error> {
        let (queued, delayed, readd, counts): (i64, i64, i64, i64) = self
            .inner
            .call("remove", |mut con| async move {
                self.inner
                    .invocation(&REMOVE)
                    .arg(raw)
                    .invoke_async(&mut con)
                    .await
            })
            .await?;
        Ok(Removed {
            queued: queued > 0,
            delayed: delayed > 0,
            readd: readd > 0,
            counts: counts > 0,
        })
    }
}
