//! A failed item's step ([`Queue::retry_and_done`](workq::Queue::retry_and_done)): the
//! re-add and the `done` in one script run (`retry_done`), fenced by the lease's token.

use std::time::Duration;

use redis::Value;
use serde::Serialize;
use serde::de::DeserializeOwned;
use workq::AddOptions;

use crate::error::{Error, Transient};
use crate::lease::Lease;
use crate::queue::RedisQueue;
use crate::reply::{self, number};
use crate::scripts::SCRIPTS;
use crate::units::{from_now, micros};

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
        if self.is_closed() {
            return Ok(Some(lease));
        }
        let inner = &self.inner;
        let raw = lease.raw();
        let token = inner.faults.token_for(inner, raw, lease.token()).await;
        inner.faults.before_done(inner, raw, token).await;
        let limit = &inner.rate_limit;
        let (qps, burst) = limit.bucket().unwrap_or((0.0, 0));
        let flag = |on: bool| if on { "1" } else { "0" };
        let give_up = inner.settle_deadline();
        // Whether an attempt may have been applied without our seeing the answer.
        let mut unsure = false;
        let mut backoff = Duration::from_millis(20);
        let settled = loop {
            let outcome: Result<Value, redis::RedisError> = inner
                .invocation(&SCRIPTS.retry_done)
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
                .invoke_async(&mut inner.con())
                .await;
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
