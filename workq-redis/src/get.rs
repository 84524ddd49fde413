//! Getters: [`get`](RedisQueue::get) (which waits), [`try_get`](RedisQueue::try_get),
//! [`done_and_get`](RedisQueue::done_and_get) and
//! [`done_and_get_many`](RedisQueue::done_and_get_many), all made of one look at the queue
//! (the `get` script); the batched step answers the core's [`DoneMany`].

use std::fmt;
use std::time::{Duration, Instant};

use redis::{FromRedisValue, ParsingError, Value};
use serde::Serialize;
use serde::de::DeserializeOwned;
use workq::{DoneMany, TryGet};

use crate::error::{Error, Transient};
use crate::inner::Inner;
use crate::lease::Lease;
use crate::queue::RedisQueue;
use crate::reply::{self, count, number, parts};
use crate::scripts::SCRIPTS;
use crate::trace::LeaseLinks;
use crate::units::{from_now, micros};
use crate::wait::{Owed, Waiting};

/// One attempt of `get`.
enum Attempt<T> {
    Leased(Lease<T>),
    ShutDown,
    /// Nothing ready; something may be due after this long.
    Empty(Option<Duration>),
}

/// The reply of the `get` script.
enum GetReply {
    /// `{1, item, token, priority}`: an item under a new lease; `{1, item, token, priority,
    /// generation}` with flow control (the generation of the queue's settings); `{1, item,
    /// token, priority, generation or nil, links, drops}` when the lease took trace links.
    Leased {
        raw: Vec<u8>,
        token: u64,
        priority: i32,
        generation: Option<u64>,
        links: LeaseLinks,
    },
    /// `{2}`: shut down, nothing ready.
    ShutDown,
    /// `{0, wait}`: nothing ready; something may be due after `wait`.
    Empty(Option<Duration>),
}

impl FromRedisValue for GetReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let mut parts = parts(value)?.into_iter();
        match parts.next().as_ref().map(number).transpose()? {
            Some(1) => {
                let raw = match parts.next() {
                    Some(Value::BulkString(bytes)) => bytes,
                    Some(Value::SimpleString(s)) => s.into_bytes(),
                    other => return Err(format!("expected an item, got {other:?}").into()),
                };
                let token = number(&parts.next().unwrap_or(Value::Nil))?.max(0) as u64;
                let priority = parts.next().as_ref().map(number).transpose()?.unwrap_or(0);
                let priority = i32::try_from(priority)
                    .map_err(|_| ParsingError::from(format!("priority {priority} out of range")))?;
                let generation = match parts.next() {
                    None | Some(Value::Nil) => None,
                    Some(value) => Some(count(&value)?),
                };
                let links = LeaseLinks::read(parts.next(), parts.next())?;
                Ok(GetReply::Leased {
                    raw,
                    token,
                    priority,
                    generation,
                    links,
                })
            }
            Some(2) => Ok(GetReply::ShutDown),
            Some(0) => {
                let wait = parts.next().as_ref().map(number).transpose()?.unwrap_or(-1);
                Ok(GetReply::Empty(
                    (wait >= 0).then(|| Duration::from_micros(wait as u64)),
                ))
            }
            other => Err(format!("unknown get reply {other:?}").into()),
        }
    }
}

/// The reply of the `done` script: whether the caller held the lease (1: done, 2: done and
/// queued again), or not (0: another holder has it, -1: nobody does).
struct DoneReply(bool);

impl FromRedisValue for DoneReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        Ok(DoneReply(number(&value)? >= 1))
    }
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> RedisQueue<T> {
    /// Waits for the next item and hands it out under a [`Lease`]: client-go's `Get`.
    ///
    /// Returns `Ok(None)` once this handle is shut down ([`shut_down`](Self::shut_down)), or
    /// the queue is shut down for every process ([`shut_down_fleet`](Self::shut_down_fleet))
    /// and has nothing ready. Promotes delayed items that are due and reclaims expired leases
    /// of dead workers first. While nothing is ready it waits for a wake-up from the server
    /// (one `BZPOPMIN` on a wake-up marker per handle, shared by its getters, on a
    /// connection of its own), so an add in any process wakes a waiting getter.
    ///
    /// Transient server states (a lost connection, a restart, `LOADING`, `BUSY`, `TRYAGAIN`,
    /// `MASTERDOWN`, `READONLY`) are waited out with backoff for up to the
    /// [retry deadline](crate::Builder::retry_deadline), counted from the server's last answer: a
    /// worker loop rides out a server restart.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future loses no item and costs nothing: the shared wait goes on for the
    /// other getters (or ends), a wake-up this getter received but did not use is passed on,
    /// and an item leased by a call whose answer never arrived is reclaimed when that lease
    /// expires.
    ///
    /// # Errors
    ///
    /// Errors that are not transient (for example a server refusing scripts), and transient
    /// ones that outlast the retry deadline.
    pub async fn get(&self) -> Result<Option<Lease<T>>, Error> {
        let _waiting = Waiting::new(&self.inner.wake);
        let mut rx = self.inner.wake.subscribe();
        let mut owed = Owed::new(&self.inner.wake, || self.inner.con());
        loop {
            rx.borrow_and_update();
            let deadline = from_now(self.inner.retry_deadline);
            let attempt = self.attempt(deadline).await;
            owed.set(false);
            match attempt? {
                Attempt::Leased(lease) => return Ok(Some(lease)),
                Attempt::ShutDown => return Ok(None),
                Attempt::Empty(wait) => {
                    let wait = wait.map_or(self.inner.poll, |w| w.min(self.inner.poll));
                    self.inner.ensure_waiter();
                    tokio::select! {
                        changed = rx.changed() => {
                            owed.set(changed.is_ok());
                        }
                        () = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }

    /// Hands out the next item if one is ready now, without waiting: [`TryGet::Leased`],
    /// [`TryGet::Empty`] or [`TryGet::ShutDown`]. Like [`get`](Self::get), it promotes
    /// delayed items that are due and reclaims expired leases first.
    ///
    /// # Errors
    ///
    /// A failure to talk to the server, after the [retry deadline](crate::Builder::retry_deadline).
    pub async fn try_get(&self) -> Result<TryGet<Lease<T>>, Error> {
        let deadline = from_now(self.inner.retry_deadline);
        Ok(match self.attempt(deadline).await? {
            Attempt::Leased(lease) => TryGet::Leased(lease),
            Attempt::ShutDown => TryGet::ShutDown,
            Attempt::Empty(_) => TryGet::Empty,
        })
    }

    /// Marks `lease`'s item done (after forgetting its failures if `forget`: client-go's
    /// `Forget` after a success) and hands out the next ready item, in one round trip and one
    /// script run (`done` then `get`, atomic together): the step
    /// [`Queue::done_and_next`](workq::Queue::done_and_next) of [`workq::Workers`]. `Ok(None)`
    /// when nothing was ready (call [`get`](Self::get) to wait) or the queue (or this handle)
    /// is shut down.
    ///
    /// # Errors
    ///
    /// The `done`'s failure, as [`Lease::done`] reports it: [`Error::LeaseLost`] if the lease
    /// was lost (the server changed nothing; the item was reclaimed), [`Error::OutcomeUnknown`]
    /// if a retry after a lost answer found the lease gone; a lease the step took for the
    /// caller meanwhile is released. Otherwise as for
    /// [`done_and_get_many`](Self::done_and_get_many).
    pub async fn done_and_get(
        &self,
        lease: Lease<T>,
        forget: bool,
    ) -> Result<Option<Lease<T>>, Error> {
        let mut step = self.done_and_get_with(vec![lease], 1, vec![forget]).await?;
        step.done.pop().unwrap_or(Ok(()))?;
        Ok(step.next.pop())
    }

    /// Marks every lease's item done (after forgetting its failures where its flag is set)
    /// and hands out up to `max` ready items, in one round trip and one script run: a batched
    /// worker loop, which pays one round trip for many items (the step
    /// [`Queue::done_and_next_many`](workq::Queue::done_and_next_many) of
    /// [`workq::Workers`]). With no leases it is a [`try_get`](Self::try_get) of up to `max`
    /// items.
    ///
    /// The items handed out are leased from the moment of the call, and their leases are
    /// renewed while held as any lease is; a worker that takes more than it can start soon
    /// only keeps them from the other workers. [`DoneMany::done`] has the outcome of each
    /// lease's `done` (as [`Lease::done`] reports it), in the order of `leases`;
    /// [`DoneMany::next`] has the new leases in hand-out order, fewer than `max` (or none)
    /// when fewer were ready or the queue (or this handle) is shut down. The forgets ride in
    /// the step's one script run, each only where its `done` is accepted.
    ///
    /// Transient server states (`BUSY`, `LOADING`, `READONLY`, `MASTERDOWN`, `TRYAGAIN`, a
    /// dropped connection, a restart) are waited out as [`Lease::done`] waits them out: while
    /// the leases may still be valid, and at least the [retry
    /// deadline](crate::Builder::retry_deadline). The leases are renewed until their dones are
    /// through. A call is one script run, applied whole or not at all; when the connection
    /// failed, the attempt may have run without its answer reaching us: the retries then take
    /// no more items (those the lost attempt took are leased to nobody, and handed out again
    /// when those leases expire), and a `done` they find gone is reported as
    /// [`Error::OutcomeUnknown`], never applied twice.
    ///
    /// # Errors
    ///
    /// A failure that outlasted the retries, or one that is not transient: then whether the
    /// `done`s applied is unknown, the leases are no longer renewed (an item whose `done` did
    /// not apply is handed out again once its lease expires), and leases the call may have
    /// taken are reclaimed when they expire.
    pub async fn done_and_get_many(
        &self,
        leases: Vec<(Lease<T>, bool)>,
        max: usize,
    ) -> Result<DoneMany<Lease<T>, Error>, Error> {
        let (leases, forget) = leases.into_iter().unzip();
        self.done_and_get_with(leases, max, forget).await
    }

    /// [`done_and_get_many`](Self::done_and_get_many) with the leases and their `forget`
    /// flags (one per lease) apart.
    ///
    /// Retries as `done_and_get_many` says: an attempt the server refused (a `BUSY`, say)
    /// did not run and is simply made again; after a connection failure the next attempts
    /// ask for no items (`max` 0), and a `done` they find gone was applied by the lost
    /// attempt, or its lease expired: [`Error::OutcomeUnknown`].
    pub(crate) async fn done_and_get_with(
        &self,
        leases: Vec<Lease<T>>,
        max: usize,
        forget: Vec<bool>,
    ) -> Result<DoneMany<Lease<T>, Error>, Error> {
        debug_assert_eq!(forget.len(), leases.len());
        let inner = &self.inner;
        // Counts as out until the dones are through, for a drain.
        inner.lease_started();
        let _out = LeaseOut(inner);
        let mut tokens = Vec::with_capacity(leases.len());
        for lease in &leases {
            let token = inner.token_for(lease.raw(), lease.token()).await;
            inner.before_done(lease.raw(), token).await;
            tokens.push(token);
        }
        // A handle that is shut down takes nothing more.
        let mut max = if self.is_closed() { 0 } else { max };
        let give_up = if leases.is_empty() {
            from_now(inner.retry_deadline)
        } else {
            inner.settle_deadline()
        };
        // Whether an attempt may have been applied without our seeing the answer.
        let mut unsure = false;
        let mut backoff = Duration::from_millis(20);
        let (started, reply) = loop {
            let started = Instant::now();
            let mut args = Vec::with_capacity(5 + 2 * leases.len());
            args.extend([
                micros(inner.lease).to_string(),
                inner.max_stalls.to_string(),
                inner.dead_letter_cap.to_string(),
                max.to_string(),
                forget_mask(&forget),
            ]);
            for (lease, token) in leases.iter().zip(&tokens) {
                args.extend([lease.raw().to_owned(), token.to_string()]);
            }
            let error = match inner.pipeline(&[(&SCRIPTS.done_get, args)]).await {
                Ok(mut replies) => break (started, replies.pop()),
                Err(error) => error,
            };
            let transient = Transient::of(&error);
            if transient.is_none() || from_now(backoff) >= give_up {
                // Not renewed any more: where the dones did not apply, the items are handed
                // out again once the leases expire, as after a failed `done`.
                let some = !leases.is_empty();
                for lease in leases {
                    lease.settled();
                }
                return Err(if unsure && some {
                    Error::OutcomeUnknown
                } else {
                    error
                });
            }
            if transient == Some(Transient::Connection) {
                unsure = true;
                max = 0;
            }
            if transient == Some(Transient::ReadOnly) {
                inner.reconnect().await;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        };
        let protocol = |what: &dyn fmt::Debug| {
            Error::Protocol(format!(
                "done_get: expected two lists of replies, got {what:?}"
            ))
        };
        let (done, taken) = match reply {
            Some(Value::Array(parts)) => match <[Value; 2]>::try_from(parts) {
                Ok([Value::Array(done), Value::Array(taken)]) => (done, taken),
                other => return Err(protocol(&other)),
            },
            other => return Err(protocol(&other)),
        };
        if done.len() != leases.len() {
            return Err(protocol(&done));
        }
        let done = done
            .into_iter()
            .map(|reply| {
                let done = reply::parse::<DoneReply>("done", reply)?.0;
                Ok(match done {
                    true => Ok(()),
                    false if unsure => Err(Error::OutcomeUnknown),
                    false => Err(Error::LeaseLost),
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        for lease in leases {
            lease.settled();
        }
        let mut next = Vec::with_capacity(taken.len());
        for reply in taken {
            if let Some(Attempt::Leased(lease)) = self.interpret(reply, started).await? {
                next.push(lease);
            }
        }
        Ok(DoneMany { done, next })
    }

    /// One look at the queue (the `get` script), until `deadline` for transient states.
    async fn attempt(&self, deadline: Instant) -> Result<Attempt<T>, Error> {
        loop {
            if self.is_closed() {
                return Ok(Attempt::ShutDown);
            }
            let started = Instant::now();
            let value: Value = self
                .inner
                .call_until("get", deadline, |mut con| async move {
                    self.inner
                        .invocation(&SCRIPTS.get)
                        .arg(micros(self.inner.lease))
                        .arg(self.inner.max_stalls)
                        .arg(self.inner.dead_letter_cap)
                        .invoke_async(&mut con)
                        .await
                })
                .await?;
            if let Some(attempt) = self.interpret(value, started).await? {
                return Ok(attempt);
            }
        }
    }

    /// Reads the answer of the `get` script; `None` if the item was moved to the dead letters.
    async fn interpret(&self, value: Value, started: Instant) -> Result<Option<Attempt<T>>, Error> {
        match reply::parse("get", value)? {
            GetReply::Leased {
                raw,
                token,
                priority,
                generation,
                links,
            } => {
                if let Some(generation) = generation {
                    self.inner.flow.saw(&self.inner.name, generation);
                }
                let decoded = match String::from_utf8(raw) {
                    Ok(text) => serde_json::from_str::<T>(&text)
                        .map(|item| (item, text.clone()))
                        .map_err(|e| (text.into_bytes(), e.to_string())),
                    Err(e) => {
                        let error =
                            format!("the stored item is not valid UTF-8: {}", e.utf8_error());
                        Err((e.into_bytes(), error))
                    }
                };
                match decoded {
                    Ok((item, text)) => Ok(Some(Attempt::Leased(Lease::new(
                        self.inner.clone(),
                        item,
                        text,
                        token,
                        priority,
                        started,
                        links,
                    )))),
                    Err((raw, error)) => {
                        tracing::warn!(
                            queue = %self.inner.name,
                            item = %String::from_utf8_lossy(&raw),
                            %error,
                            "workq-redis: an item cannot be deserialized; moved to the dead-letter list"
                        );
                        self.inner.dead_letter(&raw, token, &error).await?;
                        Ok(None)
                    }
                }
            }
            GetReply::ShutDown => Ok(Some(Attempt::ShutDown)),
            GetReply::Empty(wait) => Ok(Some(Attempt::Empty(wait))),
        }
    }
}

/// The `forget` argument of the `done_get` script: `1` (every item), `0` (none), or one
/// `1` or `0` per item.
fn forget_mask(forget: &[bool]) -> String {
    if forget.iter().all(|&f| f) && !forget.is_empty() {
        "1".to_owned()
    } else if !forget.iter().any(|&f| f) {
        "0".to_owned()
    } else {
        forget.iter().map(|&f| if f { '1' } else { '0' }).collect()
    }
}

/// Ends a lease count taken by `done_and_get_with` when dropped.
struct LeaseOut<'a>(&'a Inner);

impl Drop for LeaseOut<'_> {
    fn drop(&mut self) {
        self.0.lease_ended();
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
                reply::parse::<GetReply>("get", value),
                Err(Error::Protocol(_))
            ));
        }
        let huge = Value::Array(vec![
            Value::Int(1),
            Value::BulkString(b"\"x\"".to_vec()),
            Value::Int(7),
            Value::Int(i64::from(i32::MAX) + 1),
        ]);
        assert!(matches!(
            reply::parse::<GetReply>("get", huge),
            Err(Error::Protocol(_))
        ));
        assert!(matches!(
            reply::parse::<DoneReply>("done", Value::Nil),
            Err(Error::Protocol(_))
        ));
    }

    #[test]
    fn well_formed_replies_are_read() {
        let leased: GetReply = reply::parse(
            "get",
            Value::Array(vec![
                Value::Int(1),
                Value::BulkString(b"\"x\"".to_vec()),
                Value::BulkString(b"42".to_vec()),
                Value::Int(-3),
            ]),
        )
        .unwrap();
        assert!(matches!(
            leased,
            GetReply::Leased { ref raw, token: 42, priority: -3, generation: None, .. } if raw == b"\"x\""
        ));
        // With trace links and no flow control: the generation is nil.
        let linked: GetReply = reply::parse(
            "get",
            Value::Array(vec![
                Value::Int(1),
                Value::BulkString(b"\"x\"".to_vec()),
                Value::Int(7),
                Value::Int(0),
                Value::Nil,
                Value::BulkString(
                    b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_vec(),
                ),
                Value::Int(2),
            ]),
        )
        .unwrap();
        let GetReply::Leased {
            generation, links, ..
        } = linked
        else {
            panic!("a lease expected");
        };
        assert_eq!(generation, None);
        #[cfg(feature = "otel")]
        assert_eq!((links.list.len(), links.dropped), (1, 2));
        let _ = links;
        let empty: GetReply =
            reply::parse("get", Value::Array(vec![Value::Int(0), Value::Int(-1)])).unwrap();
        assert!(matches!(empty, GetReply::Empty(None)));
        assert!(reply::parse::<DoneReply>("done", Value::Int(2)).unwrap().0);
        assert!(!reply::parse::<DoneReply>("done", Value::Int(-1)).unwrap().0);
    }
}
