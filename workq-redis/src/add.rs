//! Adds: the add operations (each answers a [`workq::Added`]), the failure counts that
//! rate-limited adds keep (`forget`, `num_requeues`), and a failed item's step
//! ([`Queue::retry_and_done`](workq::Queue::retry_and_done)): the re-add and the `done` in one
//! script run (`retry_done`), fenced by the lease's token.

use std::borrow::Borrow;
use std::time::Duration;

use redis::{FromRedisValue, ParsingError, Value};
use serde::Serialize;
use serde::de::DeserializeOwned;
use workq::{AddKind, AddOptions, Added};

use crate::error::{Error, Transient};
use crate::lease::Lease;
use crate::queue::RedisQueue;
use crate::reply::{self, number, parts};
use crate::scripts::SCRIPTS;
use crate::trace::traceparent;
use crate::units::{from_now, micros};

/// Reads an add script's reply; `delay` is the caller's, if it chose one.
fn added(value: Value, delay: Option<Duration>) -> Result<Added, Error> {
    let reply: AddReply = reply::parse("add", value)?;
    Ok(Added::new(
        reply.kind,
        reply.seq,
        delay.or(reply.delay).unwrap_or(Duration::ZERO),
    ))
}

/// The reply of the add scripts: `{outcome, seq}`, and `{outcome, seq, delay}` from
/// `add_rate_limited`.
struct AddReply {
    kind: AddKind,
    seq: u64,
    /// The delay the server computed, if it sent one.
    delay: Option<Duration>,
}

impl FromRedisValue for AddReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let parts = parts(value)?;
        let kind = match parts.first().map(number).transpose()? {
            Some(0) => AddKind::Ignored,
            Some(1) => AddKind::Queued,
            Some(2) => AddKind::Duplicate,
            Some(3) => AddKind::Deferred,
            Some(4) => AddKind::Delayed,
            other => return Err(format!("unknown add outcome {other:?}").into()),
        };
        let seq = parts.get(1).map(number).transpose()?.unwrap_or(0).max(0) as u64;
        let delay = parts
            .get(2)
            .map(number)
            .transpose()?
            .map(|us| Duration::from_micros(us.max(0) as u64));
        Ok(AddReply { kind, seq, delay })
    }
}

/// The priority argument of the add scripts: empty when none was given.
fn priority_arg(priority: Option<i32>) -> String {
    priority.map_or_else(String::new, |p| p.to_string())
}

/// Adds per run of the `add_many` script: about a millisecond of the server's time.
const ADD_MANY_CHUNK: usize = 200;

/// What the `retry_done` script did with the lease (its reply's first part).
enum Settled {
    /// Re-added and done.
    Done,
    /// The lease is not the caller's (another holder has the item, or nobody does): nothing
    /// changed.
    NotHeld,
    /// The queue is shut down for every process: the re-add was refused and nothing changed.
    ShutDown,
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> RedisQueue<T> {
    fn encode(item: &T) -> Result<String, Error> {
        serde_json::to_string(item).map_err(Error::Serialize)
    }

    /// The group argument of an add of `item`: what the group function says, or `""` for a
    /// handle without one.
    pub(crate) fn group_arg(&self, item: &T) -> String {
        self.group
            .as_ref()
            .map(|group| group(item))
            .unwrap_or_default()
    }

    /// Marks `item` as needing processing: client-go's `Add`.
    ///
    /// A new item joins the tail; an item already queued stays where it is; an item waiting
    /// for a delay becomes ready now (once); an item being processed is queued again when its
    /// lease ends; after [`shut_down`](Self::shut_down) (of this handle) or
    /// [`shut_down_fleet`](Self::shut_down_fleet) adds are ignored.
    ///
    /// # Errors
    ///
    /// A connection error (after the [retry deadline](crate::Builder::retry_deadline)) leaves it
    /// unknown whether the add was applied; adding again is harmless. A full server
    /// (`maxmemory` under `noeviction`) refuses adds at once with an `OOM` error.
    pub async fn add(&self, item: impl Borrow<T>) -> Result<Added, Error> {
        self.add_delayed(item.borrow(), Duration::ZERO, None).await
    }

    /// Adds `item` as `options` ask: at once, after a delay, rate limited (with a delay too,
    /// the shorter one wins), and with a priority: the in-memory queue's
    /// [`add_with`](workq::WorkQueue::add_with), with its rules across processes.
    ///
    /// Higher priorities are handed out first, in add order within a priority. A re-add can
    /// raise a queued or delayed item's priority (a raised item goes behind the items already
    /// waiting at its new priority), never lower it; without a priority a new item gets 0 and a
    /// known one keeps its own. An item re-added while processing is queued when its lease
    /// ends with the highest priority its re-adds gave since it was handed out (0 if none
    /// gave one); a released or reclaimed item goes back to the head of the higher of that
    /// and the priority it was handed out with. [`Lease::priority`](crate::Lease::priority)
    /// tells a worker the priority of what it holds.
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add).
    pub async fn add_with(
        &self,
        item: impl Borrow<T>,
        options: AddOptions,
    ) -> Result<Added, Error> {
        let item = item.borrow();
        let priority = options.requested_priority();
        if options.is_rate_limited() {
            self.add_limited(item, options.delay(), priority).await
        } else {
            self.add_delayed(item, options.delay(), priority).await
        }
    }

    /// Adds `item` once `delay` has passed on the server's clock: client-go's `AddAfter`.
    ///
    /// A zero delay adds at once. For an item already waiting for a delay the earlier ready
    /// time wins; an item already queued stays queued once.
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add).
    pub async fn add_after(&self, item: impl Borrow<T>, delay: Duration) -> Result<Added, Error> {
        self.add_delayed(item.borrow(), delay, None).await
    }

    /// The `add_after` script (a zero delay adds at once), with a priority or none.
    async fn add_delayed(
        &self,
        item: &T,
        delay: Duration,
        priority: Option<i32>,
    ) -> Result<Added, Error> {
        // Read before the first await, in the caller's span.
        self.add_after_sending(item, delay, priority, traceparent())
            .await
    }

    /// An add whose trace link argument is `text`, whatever it holds: what a hand-made client
    /// may send (for the test that the server keeps only well-formed `traceparent`s).
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub async fn add_sending_traceparent(
        &self,
        item: impl Borrow<T>,
        text: &str,
    ) -> Result<Added, Error> {
        self.add_after_sending(item.borrow(), Duration::ZERO, None, Some(text.to_owned()))
            .await
    }

    /// [`add_delayed`](Self::add_delayed) sending `tp` as the add's trace link (`None`: no
    /// argument).
    async fn add_after_sending(
        &self,
        item: &T,
        delay: Duration,
        priority: Option<i32>,
        tp: Option<String>,
    ) -> Result<Added, Error> {
        if self.is_closed() {
            return Ok(Added::IGNORED);
        }
        self.register_once().await;
        let raw = Self::encode(item.borrow())?;
        let (raw, group, tp) = (&raw, &self.group_arg(item), &tp);
        let value: Value = self
            .inner
            .call("add_after", |mut con| async move {
                let mut invocation = self.inner.invocation(&SCRIPTS.add_after);
                invocation
                    .arg(raw)
                    .arg(micros(delay))
                    .arg(priority_arg(priority))
                    .arg(group);
                if let Some(tp) = tp {
                    invocation.arg(tp);
                }
                invocation.invoke_async(&mut con).await
            })
            .await?;
        added(value, Some(delay))
    }

    /// Adds `item` after the delay the queue's [`RateLimit`](crate::RateLimit) gives it:
    /// client-go's `AddRateLimited`. The item's failure count goes up by one (even after a
    /// fleet-wide shut down, as in client-go); [`forget`](Self::forget) resets it.
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add); a retry after a connection error may count a failure twice.
    pub async fn add_rate_limited(&self, item: impl Borrow<T>) -> Result<Added, Error> {
        self.add_limited(item.borrow(), Duration::ZERO, None).await
    }

    /// The `add_rate_limited` script: the limiter's delay, or `after` if that is shorter (zero:
    /// no delay of the caller's), with a priority or none.
    async fn add_limited(
        &self,
        item: &T,
        after: Duration,
        priority: Option<i32>,
    ) -> Result<Added, Error> {
        let tp = traceparent();
        if self.is_closed() {
            return Ok(Added::IGNORED);
        }
        self.register_once().await;
        let raw = Self::encode(item.borrow())?;
        let (raw, group, tp) = (&raw, &self.group_arg(item), &tp);
        let limit = &self.inner.rate_limit;
        let (qps, burst) = limit.bucket().unwrap_or((0.0, 0));
        let value: Value = self
            .inner
            .call("add_rate_limited", |mut con| async move {
                let mut invocation = self.inner.invocation(&SCRIPTS.add_rate_limited);
                invocation
                    .arg(raw)
                    .arg(micros(limit.base_delay()))
                    .arg(micros(limit.max_delay()))
                    .arg(qps)
                    .arg(burst)
                    .arg(micros(after))
                    .arg(priority_arg(priority))
                    .arg(group);
                if let Some(tp) = tp {
                    invocation.arg(tp);
                }
                invocation.invoke_async(&mut con).await
            })
            .await?;
        added(value, None)
    }

    /// Adds every item, as [`add`](Self::add) does one by one, in one round trip (the
    /// `add_many` script, 200 adds per run: each add follows the rules of one add, and they
    /// apply in order).
    ///
    /// # Errors
    ///
    /// As for [`add`](Self::add); on an error, any prefix of the adds may have been applied.
    pub async fn add_all<I>(&self, items: I) -> Result<Vec<Added>, Error>
    where
        I: IntoIterator,
        I::Item: Borrow<T>,
    {
        self.add_all_after(items.into_iter().map(|item| (item, Duration::ZERO)))
            .await
    }

    /// Adds every item after its delay, as [`add_after`](Self::add_after) does one by one, in
    /// one round trip.
    ///
    /// # Errors
    ///
    /// As for [`add_all`](Self::add_all).
    pub async fn add_all_after<I, B>(&self, items: I) -> Result<Vec<Added>, Error>
    where
        I: IntoIterator<Item = (B, Duration)>,
        B: Borrow<T>,
    {
        self.add_many(items.into_iter().map(|(item, delay)| (item, delay, None)))
            .await
    }

    /// Adds every item after its delay and with its priority (`None`: none given), as
    /// [`add_with`](Self::add_with) does one by one without rate limiting, in one round trip.
    /// Every add links to the caller's span (feature `otel`): one `traceparent` per script
    /// run, after the items.
    pub(crate) async fn add_many<I, B>(&self, items: I) -> Result<Vec<Added>, Error>
    where
        I: IntoIterator<Item = (B, Duration, Option<i32>)>,
        B: Borrow<T>,
    {
        let tp = traceparent();
        let mut args = Vec::new();
        let mut delays = Vec::new();
        for (item, delay, priority) in items {
            let item = item.borrow();
            args.extend([
                Self::encode(item)?,
                micros(delay).to_string(),
                priority_arg(priority),
                self.group_arg(item),
            ]);
            delays.push(delay);
        }
        // `add_many` runs a chunk of adds per call: one script run instead of one per add,
        // short enough (about a millisecond) not to hold up the server's other clients.
        let calls: Vec<_> = args
            .chunks(4 * ADD_MANY_CHUNK)
            .map(|chunk| {
                let mut args = chunk.to_vec();
                args.extend(tp.clone());
                (&SCRIPTS.add_many, args)
            })
            .collect();
        if self.is_closed() {
            return Ok(delays.iter().map(|_| Added::IGNORED).collect());
        }
        self.register_once().await;
        if calls.is_empty() {
            return Ok(Vec::new());
        }
        let deadline = from_now(self.inner.retry_deadline);
        let mut backoff = Duration::from_millis(20);
        let values = loop {
            match self.inner.pipeline(&calls).await {
                // Only a refusal (nothing ran) is retried: after a connection error some adds
                // may have applied, and the caller decides.
                Err(e)
                    if Transient::of(&e) == Some(Transient::Refused)
                        && from_now(backoff) < deadline =>
                {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                other => break other?,
            }
        };
        let mut replies = Vec::with_capacity(delays.len());
        for value in values {
            match value {
                Value::Array(chunk) => replies.extend(chunk),
                other => {
                    return Err(Error::Protocol(format!(
                        "add_many: expected an array of replies, got {other:?}"
                    )));
                }
            }
        }
        if replies.len() != delays.len() {
            return Err(Error::Protocol(format!(
                "add_many: {} replies to {} adds",
                replies.len(),
                delays.len()
            )));
        }
        replies
            .into_iter()
            .zip(delays)
            .map(|(value, delay)| added(value, Some(delay)))
            .collect()
    }

    /// Resets the failure count of `item`: client-go's `Forget`. Call it when processing
    /// succeeded.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn forget(&self, item: impl Borrow<T>) -> Result<(), Error> {
        let raw = Self::encode(item.borrow())?;
        let raw = &raw;
        let _: i64 = self
            .inner
            .call("forget", |mut con| async move {
                redis::cmd("HDEL")
                    .arg(self.inner.keys.fail())
                    .arg(raw)
                    .query_async(&mut con)
                    .await
            })
            .await?;
        Ok(())
    }

    /// [`forget`](Self::forget) of an item's stored text for an operator; answers the count it
    /// cleared (read and cleared together, in one transaction).
    pub(crate) async fn forget_counted(&self, raw: &str) -> Result<u64, Error> {
        let (count, _): (Option<u64>, i64) = self
            .inner
            .call("forget", |mut con| async move {
                redis::pipe()
                    .atomic()
                    .cmd("HGET")
                    .arg(self.inner.keys.fail())
                    .arg(raw)
                    .cmd("HDEL")
                    .arg(self.inner.keys.fail())
                    .arg(raw)
                    .query_async(&mut con)
                    .await
            })
            .await?;
        Ok(count.unwrap_or(0))
    }

    /// How many times `item` was rate limited since it was last forgotten: client-go's
    /// `NumRequeues`.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn num_requeues(&self, item: impl Borrow<T>) -> Result<usize, Error> {
        let raw = Self::encode(item.borrow())?;
        let raw = &raw;
        let count: Option<u64> = self
            .inner
            .call("num_requeues", |mut con| async move {
                redis::cmd("HGET")
                    .arg(self.inner.keys.fail())
                    .arg(raw)
                    .query_async(&mut con)
                    .await
            })
            .await?;
        Ok(count.unwrap_or(0) as usize)
    }

    /// Re-adds `lease`'s item as `options` say (after forgetting its failures if `forget`)
    /// and marks the lease done, in one script run fenced by the lease's token: what
    /// [`add_with`](Self::add_with) then [`Lease::done`] would do while the lease is held,
    /// and nothing at all when it is not (no failure counted, nothing forgotten or
    /// re-added).
    ///
    /// `Ok(None)`: re-added and done. `Ok(Some(lease))`: this handle or the whole queue is shut
    /// down, so the re-add was refused and nothing changed; the lease is handed back, still
    /// held. The lease is renewed until the call is through.
    ///
    /// Transient server states are retried as a `done` retries them (while the lease may still
    /// be valid, and at least the retry deadline). A retry after the connection failed finds
    /// the lease gone if the first attempt was applied; it then changes nothing, so the step
    /// is never applied twice, and the call returns [`Error::OutcomeUnknown`].
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the lease was lost (nothing changed); [`Error::OutcomeUnknown`]
    /// as above; an error that is not transient, or a transient state that outlasted the
    /// retries: then the lease is no longer renewed, and the item is handed out again once it
    /// expires. A full server (`maxmemory`) does not refuse the step: like a release, it
    /// moves an item from in flight back to waiting, which takes about the memory it frees.
    pub(crate) async fn retry_and_done(
        &self,
        lease: Lease<T>,
        options: AddOptions,
        forget: bool,
    ) -> Result<Option<Lease<T>>, Error> {
        // The re-add links to the span it is made in: the worker's, so the next attempt
        // links to the one that failed.
        let tp = traceparent();
        if self.is_closed() {
            return Ok(Some(lease));
        }
        let inner = &self.inner;
        let raw = lease.raw();
        let token = inner.token_for(raw, lease.token()).await;
        inner.before_done(raw, token).await;
        let limit = &inner.rate_limit;
        let (qps, burst) = limit.bucket().unwrap_or((0.0, 0));
        let flag = |on: bool| if on { "1" } else { "0" };
        let group = self.group_arg(lease.item());
        let give_up = inner.settle_deadline();
        // Whether an attempt may have been applied without our seeing the answer.
        let mut unsure = false;
        let mut backoff = Duration::from_millis(20);
        let settled = loop {
            let mut invocation = inner.invocation(&SCRIPTS.retry_done);
            invocation
                .arg(raw)
                .arg(token)
                .arg(flag(forget))
                .arg(flag(options.is_rate_limited()))
                .arg(micros(options.delay()))
                .arg(
                    options
                        .requested_priority()
                        .map_or_else(String::new, |p| p.to_string()),
                )
                .arg(micros(limit.base_delay()))
                .arg(micros(limit.max_delay()))
                .arg(qps)
                .arg(burst)
                .arg(group.as_str());
            if let Some(tp) = &tp {
                invocation.arg(tp);
            }
            let outcome: Result<Value, redis::RedisError> =
                invocation.invoke_async(&mut inner.con()).await;
            let error = match outcome {
                Ok(value) => break settled(value)?,
                Err(e) => Error::from(e),
            };
            let transient = Transient::of(&error);
            if transient.is_none() || from_now(backoff) >= give_up {
                // Not renewed any more: if the step did not apply, the item is handed out
                // again once the lease expires, as after a failed `done`.
                lease.settled();
                return Err(if unsure { Error::OutcomeUnknown } else { error });
            }
            if transient == Some(Transient::Connection) {
                unsure = true;
            }
            if transient == Some(Transient::ReadOnly) {
                inner.reconnect().await;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        };
        match settled {
            Settled::Done => {
                lease.settled();
                Ok(None)
            }
            Settled::ShutDown => Ok(Some(lease)),
            Settled::NotHeld => {
                lease.settled();
                Err(if unsure {
                    Error::OutcomeUnknown
                } else {
                    Error::LeaseLost
                })
            }
        }
    }
}

/// Reads the reply of the `retry_done` script: `{done, outcome, seq, delay}`.
fn settled(value: Value) -> Result<Settled, Error> {
    let parts = reply::parse::<Vec<Value>>("retry_done", value)?;
    let done = parts
        .first()
        .map(number)
        .transpose()
        .map_err(|e| Error::Protocol(format!("retry_done: {e}")))?;
    match done {
        Some(1 | 2) => Ok(Settled::Done),
        Some(0 | -1) => Ok(Settled::NotHeld),
        Some(3) => Ok(Settled::ShutDown),
        other => Err(Error::Protocol(format!(
            "retry_done: unknown reply {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_replies_are_protocol_errors() {
        let bad = [
            Value::Nil,
            Value::Array(vec![]),
            Value::Array(vec![Value::Int(9)]),
            Value::Array(vec![Value::BulkString(b"x".to_vec())]),
        ];
        for value in bad {
            assert!(matches!(
                reply::parse::<AddReply>("add", value.clone()),
                Err(Error::Protocol(_))
            ));
        }
    }

    #[test]
    fn well_formed_replies_are_read() {
        let added: AddReply = reply::parse(
            "add",
            Value::Array(vec![Value::Int(4), Value::Int(12), Value::Int(1500)]),
        )
        .unwrap();
        assert_eq!(
            (added.kind, added.seq, added.delay),
            (AddKind::Delayed, 12, Some(Duration::from_micros(1500)))
        );
    }
}
