//! What an operator does to one item: pages of the items in one state ([`RedisQueue::page`]),
//! everything about one item ([`RedisQueue::item_detail`]), and the single-item actions
//! ([`retry_now`](RedisQueue::retry_now), [`remove`](RedisQueue::remove); the dead-letter
//! ones by id are in `dead_letter.rs`). Each is one script or one command, so each keeps the
//! queue's rules: an item under a lease stays with its holder, a queued item is never queued
//! twice, and a retried item goes through the same add as a worker's. The answers are the
//! core's operator types ([`workq::admin`]).

use std::sync::LazyLock;

use redis::{ParsingError, Script, Value};
use serde::Serialize;
use serde::de::DeserializeOwned;
use workq::admin::{
    DeadLetter, End, ItemDetail, ItemState, LeaseInfo, Page, PageEntry, PageQuery, Removed, Retried,
};

use crate::dead_letter::letter_of;
use crate::error::Error;
use crate::queue::RedisQueue;
use crate::reply::{count, number, parts, parts_ref, span, text};
use crate::scripts::{Oom, script};
use crate::units::saturated;

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

/// How many of the newest dead letters [`RedisQueue::item_detail`] looks through for the
/// item.
const INSPECT_DEAD_SCAN: usize = 1_000;

/// Checks that `cursor` is one a page of `state` gives: an offset, or for
/// [`ItemState::Failing`] a scan position (digits, perhaps followed by `:` and an item).
pub(crate) fn check_cursor(state: ItemState, cursor: &str) -> Result<(), Error> {
    let position = match state {
        ItemState::Failing => cursor.split_once(':').map_or(cursor, |(at, _)| at),
        _ => cursor,
    };
    if cursor.is_empty() || position.parse::<u64>().is_ok() {
        Ok(())
    } else {
        Err(Error::Protocol(format!("not a page cursor: {cursor:?}")))
    }
}

/// A stored dead-letter entry in a reply.
fn entry(value: &Value) -> Result<DeadLetter, ParsingError> {
    Ok(match value {
        Value::BulkString(b) => letter_of(b),
        other => letter_of(text(other)?.as_bytes()),
    })
}

/// A priority in a reply.
fn priority(value: &Value) -> Result<i32, ParsingError> {
    let n = number(value)?;
    i32::try_from(n).map_err(|_| ParsingError::from(format!("priority {n} out of range")))
}

/// Reads the reply of the `page` script for a page of `state` (see `page.lua`).
fn parse_page(state: ItemState, value: Value) -> Result<Page, ParsingError> {
    let p = parts(value)?;
    if p.len() < 4 {
        return Err(format!("short page reply: {} fields", p.len()).into());
    }
    let now = number(&p[0])?;
    let total = count(&p[1])?;
    let next = text(&p[2])?;
    let items = parts_ref(&p[3])?
        .iter()
        .map(|e| {
            let fields = parts_ref(e)?;
            if let (ItemState::Dead, [raw]) = (state, fields) {
                let letter = entry(raw)?;
                let mut entry = PageEntry::new(letter.item.clone(), state);
                entry.dead = Some(letter);
                return Ok(entry);
            }
            let Some(item) = fields.first() else {
                return Err(ParsingError::from("an empty page entry".to_owned()));
            };
            let mut entry = PageEntry::new(text(item)?, state);
            match (state, &fields[1..]) {
                (ItemState::Ready, [p]) => entry.priority = Some(priority(p)?),
                (ItemState::Delayed, [due, p]) => {
                    entry.due_in = Some(span(now, number(due)?));
                    entry.priority = Some(priority(p)?);
                }
                (ItemState::InFlight, [deadline, since, token]) => {
                    entry.lease = Some(LeaseInfo::new(
                        span(number(since)?, now),
                        span(now, number(deadline)?),
                        count(token)?,
                    ));
                }
                (ItemState::Failing, [n]) => entry.failures = Some(saturated(count(n)?)),
                _ => return Err(ParsingError::from("a malformed page entry".to_owned())),
            }
            Ok(entry)
        })
        .collect::<Result<Vec<_>, ParsingError>>()?;
    let mut page = Page::new(items, total);
    page.next = (!next.is_empty()).then_some(next);
    Ok(page)
}

/// The cursor of the page before the one `query` asks for, where cursors are offsets (every
/// state but [`ItemState::Failing`], without a search): its offset less a page.
fn previous(query: &PageQuery) -> Option<String> {
    if query.search.is_some() || query.state == ItemState::Failing {
        return None;
    }
    let at = query.cursor.as_deref()?.parse::<u64>().ok()?;
    let limit = u64::try_from(query.effective_limit()).unwrap_or(u64::MAX);
    (at > 0).then(|| at.saturating_sub(limit).to_string())
}

/// An optional number in a reply: `''` means none.
fn maybe(value: &Value) -> Result<Option<i64>, ParsingError> {
    match value {
        Value::BulkString(b) if b.is_empty() => Ok(None),
        Value::Nil => Ok(None),
        other => number(other).map(Some),
    }
}

/// Reads the reply of the `inspect` script (see `inspect.lua`); `None` if the queue knows
/// nothing of `item`.
fn parse_detail(item: &str, value: Value) -> Result<Option<ItemDetail>, ParsingError> {
    let p = parts(value)?;
    if p.len() < 13 {
        return Err(format!("short inspect reply: {} fields", p.len()).into());
    }
    let now = number(&p[0])?;
    let lease = match maybe(&p[2])? {
        Some(deadline) => Some(LeaseInfo::new(
            span(maybe(&p[3])?.unwrap_or(now), now),
            span(now, deadline),
            u64::try_from(maybe(&p[4])?.unwrap_or(0)).unwrap_or(0),
        )),
        None => None,
    };
    let dirty = number(&p[1])? == 1;
    let due_in = maybe(&p[5])?.map(|due| span(now, due));
    let given = maybe(&p[6])?;
    let lane = maybe(&p[10])?;
    let queued = dirty && lease.is_none();
    let readded = dirty && lease.is_some();
    let mut detail = ItemDetail::new(item);
    detail.dead_letters = parts_ref(&p[12])?
        .iter()
        .map(entry)
        .collect::<Result<Vec<_>, ParsingError>>()?;
    detail.failures = saturated(count(&p[8])?);
    detail.stalls = saturated(count(&p[9])?);
    let states = [
        (ItemState::Ready, queued),
        (ItemState::Delayed, due_in.is_some()),
        (ItemState::InFlight, lease.is_some()),
        (ItemState::Failing, detail.failures > 0),
        (ItemState::Dead, !detail.dead_letters.is_empty()),
    ];
    detail.states = states
        .into_iter()
        .filter_map(|(state, is)| is.then_some(state))
        .collect();
    if detail.states.is_empty() && detail.stalls == 0 && !readded {
        return Ok(None);
    }
    // Queued: the priority of its ready list; delayed or re-added while leased: the one its
    // adds gave (none given: 0); otherwise no add is pending.
    let pending = if queued {
        lane.or(given)
    } else if due_in.is_some() || readded {
        Some(given.unwrap_or(0))
    } else {
        None
    };
    detail.priority = pending
        .map(i32::try_from)
        .transpose()
        .map_err(|_| ParsingError::from(format!("priority {pending:?} out of range")))?;
    let position = number(&p[11])?;
    detail.position = u64::try_from(position).ok();
    detail.due_in = due_in;
    detail.lease_priority = maybe(&p[7])?.and_then(|p| i32::try_from(p).ok());
    detail.readded = readded;
    detail.lease = lease;
    Ok(Some(detail))
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> RedisQueue<T> {
    /// A page of the items in `query.state`, from `query.from`'s end, starting at
    /// `query.cursor` (a page's [`Page::next`] or [`Page::prev`], or `None` for the end
    /// itself), at most [`query.effective_limit()`](PageQuery::effective_limit) entries,
    /// and only those whose item text (dead letters: or error) contains `query.search`, in
    /// any case. Reads only: each call is one script that looks at no more than the limit
    /// without a search and [`SEARCH_BUDGET`] entries with one, so even a million dead letters
    /// are paged without blocking the server, from either end.
    ///
    /// Cursors are offsets from the end, so a page without a search has a [`Page::prev`];
    /// [`ItemState::Failing`] is listed in the server's hash order (`from` does not apply)
    /// with scan cursors, which only go forward.
    ///
    /// # Errors
    ///
    /// A connection error, or [`Error::Protocol`] for a cursor no page of that state gave.
    pub async fn page(&self, query: &PageQuery) -> Result<Page, Error> {
        let state = query.state;
        let cursor = query.cursor.as_deref().unwrap_or("");
        check_cursor(state, cursor)?;
        let needle = query.search.as_deref().unwrap_or("").to_lowercase();
        let needle = needle.as_str();
        let from = match query.from {
            End::First => "first",
            End::Last => "last",
        };
        let limit = query.effective_limit();
        let value: Value = self
            .inner
            .call("page", |mut con| async move {
                self.inner
                    .invocation(&PAGE)
                    .arg(state.name())
                    .arg(from)
                    .arg(cursor)
                    .arg(limit)
                    .arg(needle)
                    .arg(SEARCH_BUDGET)
                    .invoke_async(&mut con)
                    .await
            })
            .await?;
        let mut page =
            parse_page(state, value).map_err(|e| Error::Protocol(format!("page: {e}")))?;
        page.prev = previous(query);
        Ok(page)
    }

    /// Everything the queue knows about an item, given as its stored JSON text: every state
    /// it is in, where it is queued (its place in the hand-out order, if within the first
    /// 100,000 of its priority) and at which priority, when it is due, its lease (token, age,
    /// deadline) and the priority it was handed out with, whether it was re-added meanwhile,
    /// its failure and stall counts and its dead letters among the newest 1,000. `None` if
    /// the queue knows nothing of it. Reads only.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn item_detail(&self, raw: &str) -> Result<Option<ItemDetail>, Error> {
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
        parse_detail(raw, value).map_err(|e| Error::Protocol(format!("inspect: {e}")))
    }

    /// [`item_detail`](Self::item_detail) of `item`; an item the queue does not know has a
    /// detail with no state.
    ///
    /// # Errors
    ///
    /// A serialization or connection error.
    #[deprecated(since = "0.1.0", note = "use `item_detail` with the item's JSON text")]
    pub async fn inspect(&self, item: &T) -> Result<ItemDetail, Error> {
        let raw = serde_json::to_string(item).map_err(Error::Serialize)?;
        Ok(self
            .item_detail(&raw)
            .await?
            .unwrap_or_else(|| ItemDetail::new(raw)))
    }

    /// [`item_detail`](Self::item_detail); an item the queue does not know has a detail with
    /// no state.
    ///
    /// # Errors
    ///
    /// A connection error.
    #[deprecated(since = "0.1.0", note = "use `item_detail`")]
    pub async fn inspect_raw(&self, raw: &str) -> Result<ItemDetail, Error> {
        Ok(self
            .item_detail(raw)
            .await?
            .unwrap_or_else(|| ItemDetail::new(raw)))
    }

    /// An operator's "run it now" for an item that waits for a delay or has a failure count:
    /// it is added as [`add`](Self::add) would add it (a delayed item is queued at once, one
    /// under a lease is queued again when the lease ends). Its failure count stays (use
    /// [`forget`](Self::forget)). Idempotent: a second call finds it queued. The item is
    /// given as its stored JSON text. Nothing changes while the queue is shut down for every
    /// process ([`Retried::ShutDown`]). With flow control, the item stays in the group the
    /// queue holds it in; one the queue knows only by its failure count joins the group this
    /// handle's group function gives it (`""` for a handle without one, as an operator's).
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn retry_now(&self, raw: &str) -> Result<Retried, Error> {
        // With flow control, an item known only by its failure count has no group on the
        // server: this handle's group function gives it one if it reads the item.
        let group = match self.group {
            Some(_) => serde_json::from_str::<T>(raw)
                .map(|item| self.group_arg(&item))
                .unwrap_or_default(),
            None => String::new(),
        };
        let group = &group;
        let outcome: String = self
            .inner
            .call("retry_now", |mut con| async move {
                self.inner
                    .invocation(&RETRY_NOW)
                    .arg(raw)
                    .arg(group)
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
    /// delay; if it is being processed its lease stays with the holder
    /// ([`Removed::leased`]), and only a re-add pending for when the lease ends is dropped.
    /// An item not under a lease also loses its failure and stall counts. Its dead letters
    /// are not touched. Idempotent: a second call finds nothing ([`Removed::any`] is
    /// `false`).
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn remove(&self, raw: &str) -> Result<Removed, Error> {
        let (queued, delayed, readd, counts, leased): (i64, i64, i64, i64, i64) = self
            .inner
            .call("remove", |mut con| async move {
                self.inner
                    .invocation(&REMOVE)
                    .arg(raw)
                    .invoke_async(&mut con)
                    .await
            })
            .await?;
        let mut removed = Removed::default();
        removed.queued = queued > 0;
        removed.delayed = delayed > 0;
        removed.readd = readd > 0;
        removed.counts = counts > 0;
        removed.leased = leased > 0;
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_are_checked_before_the_server_sees_them() {
        assert!(check_cursor(ItemState::Ready, "").is_ok());
        assert!(check_cursor(ItemState::Dead, "120").is_ok());
        assert!(check_cursor(ItemState::Dead, "nonsense").is_err());
        assert!(check_cursor(ItemState::Ready, "12:\"a\"").is_err());
        assert!(check_cursor(ItemState::Failing, "12:\"a:b\"").is_ok());
        assert!(check_cursor(ItemState::Failing, "x:\"a\"").is_err());
    }

    #[test]
    fn offsets_go_back_a_page_and_scans_do_not() {
        let query = |state, cursor: &str| {
            PageQuery::new(state, 10).cursor((!cursor.is_empty()).then(|| cursor.to_owned()))
        };
        assert_eq!(previous(&query(ItemState::Ready, "25")), Some("15".into()));
        assert_eq!(previous(&query(ItemState::Dead, "4")), Some("0".into()));
        assert_eq!(previous(&query(ItemState::Dead, "0")), None);
        assert_eq!(previous(&query(ItemState::Dead, "")), None);
        assert_eq!(previous(&query(ItemState::Failing, "25")), None);
        let search = query(ItemState::Ready, "25").search(Some("x".into()));
        assert_eq!(previous(&search), None);
    }

    #[test]
    fn a_page_reply_is_read_by_the_state_asked_for() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = |entries: Vec<Value>| {
            Value::Array(vec![
                Value::Int(1_000_000),
                Value::Int(2),
                bulk(""),
                Value::Array(entries),
            ])
        };
        let delayed = parse_page(
            ItemState::Delayed,
            reply(vec![Value::Array(vec![
                bulk("\"a\""),
                bulk("3000000"),
                bulk("4"),
            ])]),
        )
        .unwrap();
        let entry = &delayed.items[0];
        assert_eq!(entry.state, ItemState::Delayed);
        assert_eq!(
            (entry.due_in, entry.priority, entry.failures),
            (Some(std::time::Duration::from_secs(2)), Some(4), None)
        );
        assert_eq!((delayed.total, delayed.next.as_deref()), (2, None));
        let failing = parse_page(
            ItemState::Failing,
            reply(vec![Value::Array(vec![bulk("\"b\""), bulk("7")])]),
        )
        .unwrap();
        assert_eq!(failing.items[0].failures, Some(7));
        assert!(
            parse_page(
                ItemState::InFlight,
                reply(vec![Value::Array(vec![bulk("\"b\""), bulk("7")])]),
            )
            .is_err(),
            "an entry of another state's shape"
        );
    }
}
