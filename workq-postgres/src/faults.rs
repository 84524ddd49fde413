//! The fault tests' deliberate bugs ([`Mutation`], feature `fault-injection`), which prove
//! that those tests can fail.
//!
//! They live in this client only: the SQL that every deployment installs has no switch that
//! turns fencing or the re-queue of a re-added item off, so no role can reach them from SQL.
//! A mutated client imitates a server without the rule: it takes the token the database holds
//! now instead of its own (no fencing), or clears the re-add before its `done` (no re-queue).

use sqlx::PgPool;

use crate::key::Claim;

/// A deliberate bug, switched on by [`Builder::mutation`](crate::Builder::mutation).
///
/// These exist only to prove that the crate's fault tests can fail. Never use them in a
/// deployment.
#[cfg(feature = "fault-injection")]
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// `done`, renewals and releases are accepted whatever the holder's fencing token.
    NoFencing,
    /// A `done` of an item re-added while it was processed does not queue it again.
    NoDirtyRequeue,
}

/// The mutations a handle runs with.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Faults {
    #[cfg(feature = "fault-injection")]
    pub(crate) no_fencing: bool,
    #[cfg(feature = "fault-injection")]
    pub(crate) no_dirty_requeue: bool,
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

    /// Whether any mutation is on.
    pub(crate) fn any(self) -> bool {
        self.no_fencing || self.no_dirty_requeue
    }

    /// The token a holder of `claim` on queue `queue` sends: its own, or without fencing
    /// whichever the database holds now.
    pub(crate) async fn token_for(self, pool: &PgPool, queue: i32, claim: Claim) -> i64 {
        if !self.no_fencing {
            return claim.token;
        }
        self.current_token(pool, queue, claim)
            .await
            .unwrap_or(claim.token)
    }

    /// The token of the item's lease now, if it is leased.
    async fn current_token(self, pool: &PgPool, queue: i32, claim: Claim) -> Option<i64> {
        let now: Option<Option<i64>> =
            sqlx::query_scalar("SELECT token FROM workqueue_items WHERE queue = $1 AND key = $2")
                .bind(queue)
                .bind(claim.key.as_slice())
                .fetch_optional(pool)
                .await
                .unwrap_or(None);
        now.flatten()
    }

    /// Without fencing, a `done` of an item nobody leases now is taken as the holder's: the
    /// item's row goes (whatever was pending for it). `true` when that happened.
    pub(crate) async fn done_unleased(self, pool: &PgPool, queue: i32, claim: Claim) -> bool {
        if !self.no_fencing || self.current_token(pool, queue, claim).await.is_some() {
            return false;
        }
        let _ = sqlx::query("DELETE FROM workqueue_items WHERE queue = $1 AND key = $2")
            .bind(queue)
            .bind(claim.key.as_slice())
            .execute(pool)
            .await;
        true
    }

    /// Before a `done`: without the re-queue, forgets that the item was re-added.
    pub(crate) async fn before_done(self, pool: &PgPool, queue: i32, claim: Claim) {
        if self.no_dirty_requeue {
            let _ = sqlx::query(
                "UPDATE workqueue_items SET dirty = false, due = NULL
                 WHERE queue = $1 AND key = $2 AND token = $3",
            )
            .bind(queue)
            .bind(claim.key.as_slice())
            .bind(claim.token)
            .execute(pool)
            .await;
        }
    }
}

#[cfg(not(feature = "fault-injection"))]
impl Faults {
    /// Whether any mutation is on: never, in a build without the fault tests' feature.
    pub(crate) fn any(self) -> bool {
        false
    }

    /// The token a holder sends: its own.
    pub(crate) async fn token_for(self, _pool: &PgPool, _queue: i32, claim: Claim) -> i64 {
        claim.token
    }

    /// Nothing before a `done`.
    pub(crate) async fn before_done(self, _pool: &PgPool, _queue: i32, _claim: Claim) {}

    /// A `done` of an item nobody leases is refused.
    pub(crate) async fn done_unleased(self, _pool: &PgPool, _queue: i32, _claim: Claim) -> bool {
        false
    }
}
