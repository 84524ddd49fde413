//! The fault tests' deliberate bugs ([`Mutation`], feature `fault-injection`), which prove
//! that those tests can fail.
//!
//! They live in this client only: the scripts every deployment runs have no argument that
//! turns fencing or the re-queue of a re-added item off. A mutated client imitates a server
//! without the rule: it sends the token the server holds now instead of its own (no
//! fencing), or clears the re-add before its `done` (no re-queue). Without the feature, none
//! of it is compiled: no builder method, no type, and the calls below are the plain ones.
//!
//! The calls take what they use of a handle, the command connection (a closure, asked only
//! when a mutation is on) and the queue's keys, not the handle itself, which holds [`Faults`].

use crate::connection::Conn;
use crate::scripts::Keys;

/// A deliberate bug, switched on by [`Builder::mutation`](crate::Builder::mutation) (feature
/// `fault-injection`).
///
/// These exist only to prove that the crate's fault tests can fail: a test turns one on and
/// checks that its history checker reports the loss or overlap the bug causes. Never use them
/// in a deployment.
#[cfg(feature = "fault-injection")]
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// `done`, renewals, releases and retries are accepted whatever the holder's fencing
    /// token, while the item is leased: a stale holder's `done` is accepted as if it were the
    /// current holder's.
    NoFencing,
    /// A `done` of an item that was re-added while it was processed does not queue it again:
    /// the re-add is lost.
    NoDirtyRequeue,
}

/// The mutations a handle runs with (none without the feature).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Faults {
    #[cfg(feature = "fault-injection")]
    no_fencing: bool,
    #[cfg(feature = "fault-injection")]
    no_dirty_requeue: bool,
}

#[cfg(feature = "fault-injection")]
impl Faults {
    /// Switches `mutation` on.
    pub(crate) fn add(&mut self, mutation: Mutation) {
        match mutation {
            Mutation::NoFencing => self.no_fencing = true,
            Mutation::NoDirtyRequeue => self.no_dirty_requeue = true,
        }
    }

    /// The token a holder of `raw` with `token` sends: its own, or without fencing whichever
    /// the server holds now (its own if nobody holds the item). `commands` gives the command
    /// connection of the queue whose keys are `keys`.
    pub(crate) async fn token_for(
        self,
        commands: impl Fn() -> Conn,
        keys: &Keys,
        raw: &str,
        token: u64,
    ) -> u64 {
        if !self.no_fencing {
            return token;
        }
        current_token(commands(), keys, raw).await.unwrap_or(token)
    }

    /// Before a `done` with `token` (the one [`token_for`](Self::token_for) gave): without
    /// the re-queue, forgets that the item was re-added while it was processed.
    pub(crate) async fn before_done(
        self,
        commands: impl Fn() -> Conn,
        keys: &Keys,
        raw: &str,
        token: u64,
    ) {
        if !self.no_dirty_requeue || current_token(commands(), keys, raw).await != Some(token) {
            return;
        }
        let mut con = commands();
        let _: redis::RedisResult<()> = redis::pipe()
            .cmd("SREM")
            .arg(keys.dirty())
            .arg(raw)
            .ignore()
            .cmd("HDEL")
            .arg(keys.prio())
            .arg(raw)
            .ignore()
            .query_async(&mut con)
            .await;
    }
}

/// The token of the item's lease now, if it is leased.
#[cfg(feature = "fault-injection")]
async fn current_token(mut con: Conn, keys: &Keys, raw: &str) -> Option<u64> {
    redis::cmd("HGET")
        .arg(keys.lease())
        .arg(raw)
        .query_async::<Option<u64>>(&mut con)
        .await
        .ok()
        .flatten()
}

#[cfg(not(feature = "fault-injection"))]
impl Faults {
    /// The token a holder sends: its own.
    #[allow(
        clippy::unused_async,
        reason = "the same signature as with the feature"
    )]
    pub(crate) async fn token_for(
        self,
        _commands: impl Fn() -> Conn,
        _keys: &Keys,
        _raw: &str,
        token: u64,
    ) -> u64 {
        token
    }

    /// Nothing before a `done`.
    #[allow(
        clippy::unused_async,
        reason = "the same signature as with the feature"
    )]
    pub(crate) async fn before_done(
        self,
        _commands: impl Fn() -> Conn,
        _keys: &Keys,
        _raw: &str,
        _token: u64,
    ) {
    }
}
