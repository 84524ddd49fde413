//! The operator's actions as data ([`Action`]), what they did ([`ActionOutcome`]), and
//! [`act`], which does one through the contract and says what it did in the words the
//! dashboard and `wq queue` show.

use super::{Admin, AdminError, Retried};

/// What an operator can do to a queue or one of its items: the dashboard's actions and
/// `wq queue`'s. [`act`] does one.
///
/// With the `serde` feature it reads and writes as the dashboard's API names it:
/// `{"action": "retry_now", "item": "\"a\""}`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(tag = "action", rename_all = "snake_case"))]
#[non_exhaustive]
pub enum Action {
    /// Stop handing out items for every process (adds are still taken).
    Pause,
    /// Hand out items again.
    Resume,
    /// Shut the queue down for every process.
    ShutDownFleet,
    /// End a shut down for every process.
    ResumeFleet,
    /// Requeue every dead letter.
    RequeueDeadLetters,
    /// Drop every dead letter, without blocking the server.
    PurgeDeadLetters,
    /// Requeue one dead letter, by its [`DeadLetter::id`](super::DeadLetter::id).
    RequeueDeadLetter {
        /// The dead letter.
        id: String,
    },
    /// Delete one dead letter, by its [`DeadLetter::id`](super::DeadLetter::id).
    DeleteDeadLetter {
        /// The dead letter.
        id: String,
    },
    /// Run a delayed or failing item now (its failure count stays).
    RetryNow {
        /// The item (its JSON text).
        item: String,
    },
    /// Take an item out of the queue (a lease out stays with its holder).
    Remove {
        /// The item (its JSON text).
        item: String,
    },
    /// Clear an item's failure count.
    Forget {
        /// The item (its JSON text).
        item: String,
    },
    /// Pause one of the queue's periodic schedules for every process: its ticks are
    /// skipped, never caught up.
    PauseSchedule {
        /// The schedule's name.
        schedule: String,
    },
    /// Resume one of the queue's periodic schedules.
    ResumeSchedule {
        /// The schedule's name.
        schedule: String,
    },
}

impl Action {
    /// The action's name, as the audit log, `/metrics` and the JSON tag write it
    /// (`pause`, `requeue_dead_letter`, `retry_now`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::ShutDownFleet => "shut_down_fleet",
            Action::ResumeFleet => "resume_fleet",
            Action::RequeueDeadLetters => "requeue_dead_letters",
            Action::PurgeDeadLetters => "purge_dead_letters",
            Action::RequeueDeadLetter { .. } => "requeue_dead_letter",
            Action::DeleteDeadLetter { .. } => "delete_dead_letter",
            Action::RetryNow { .. } => "retry_now",
            Action::Remove { .. } => "remove",
            Action::Forget { .. } => "forget",
            Action::PauseSchedule { .. } => "pause_schedule",
            Action::ResumeSchedule { .. } => "resume_schedule",
        }
    }

    /// The item, dead letter or schedule it names, if it names one.
    pub fn target(&self) -> Option<&str> {
        match self {
            Action::RequeueDeadLetter { id } | Action::DeleteDeadLetter { id } => Some(id),
            Action::PauseSchedule { schedule } | Action::ResumeSchedule { schedule } => {
                Some(schedule)
            }
            Action::RetryNow { item } | Action::Remove { item } | Action::Forget { item } => {
                Some(item)
            }
            Action::Pause
            | Action::Resume
            | Action::ShutDownFleet
            | Action::ResumeFleet
            | Action::RequeueDeadLetters
            | Action::PurgeDeadLetters => None,
        }
    }

    /// Whether it loses something that cannot be brought back (dead letters, an item, a
    /// failure count) or stops every process's work: what a client confirms before it
    /// acts.
    pub fn is_destructive(&self) -> bool {
        match self {
            Action::ShutDownFleet
            | Action::PurgeDeadLetters
            | Action::DeleteDeadLetter { .. }
            | Action::Remove { .. }
            | Action::Forget { .. } => true,
            Action::Pause
            | Action::Resume
            | Action::ResumeFleet
            | Action::RequeueDeadLetters
            | Action::RequeueDeadLetter { .. }
            | Action::RetryNow { .. }
            | Action::PauseSchedule { .. }
            | Action::ResumeSchedule { .. } => false,
        }
    }
}

/// What an action did: how many things it changed, said for the operator.
///
/// Actions are idempotent: repeated, one changes nothing more (`changed: 0`) and says why.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct ActionOutcome {
    /// How many things it changed (items moved, letters dropped; 0 or 1 for a switch).
    pub changed: u64,
    /// What it did, in a few words ("requeued 3 dead letters", "already paused", "queued
    /// now").
    pub message: String,
}

impl ActionOutcome {
    /// An outcome of `changed` things, said as `message`.
    pub fn new(changed: u64, message: impl Into<String>) -> Self {
        ActionOutcome {
            changed,
            message: message.into(),
        }
    }
}

/// An outcome of a switch: `changed` says which message applies.
fn switched(changed: bool, done: &str, already: &str) -> ActionOutcome {
    if changed {
        ActionOutcome::new(1, done)
    } else {
        ActionOutcome::new(0, already)
    }
}

/// What a dead letter action found when the letter was gone.
const NO_LETTER: &str = "no such dead letter (requeued or deleted already)";

/// Does `action` to `queue` through `admin` and says what it did: the one place the
/// operator's messages are written.
///
/// A requeue refused because the queue is shut down for every process
/// ([`AdminError::ShutDown`]) is an outcome that changed nothing, not an error (the operator
/// resumes the queue first); so is a "retry now" refused for it.
///
/// # Errors
///
/// What `admin` answered: [`AdminError::NotFound`] for an unknown queue,
/// [`AdminError::Unsupported`] where the backend has no actions, and so on.
///
/// # Examples
///
/// ```
/// use workq::admin::{Action, AdminError, MemoryAdmin, act};
///
/// # futures::executor::block_on(async {
/// let admin = MemoryAdmin::new();
/// let _queue: workq::WorkQueue<u32> =
///     workq::WorkQueue::builder().name("pods").metrics(admin.clone()).build();
/// // In-process queues are read-only to operators.
/// assert_eq!(act(&admin, "pods", &Action::Pause).await, Err(AdminError::Unsupported));
/// # });
/// ```
pub async fn act(
    admin: &dyn Admin,
    queue: &str,
    action: &Action,
) -> Result<ActionOutcome, AdminError> {
    Ok(match action {
        Action::Pause => switched(admin.pause(queue).await?, "paused", "already paused"),
        Action::Resume => switched(admin.resume(queue).await?, "resumed", "already running"),
        Action::ShutDownFleet => switched(
            admin.shut_down_fleet(queue).await?,
            "shut down for every process",
            "already shut down",
        ),
        Action::ResumeFleet => switched(
            admin.resume_fleet(queue).await?,
            "running again for every process",
            "not shut down",
        ),
        Action::RequeueDeadLetters => match admin.requeue_dead_letters(queue).await {
            Ok(n) => ActionOutcome::new(n, format!("requeued {n} dead letters")),
            Err(AdminError::ShutDown) => ActionOutcome::new(
                0,
                "the queue is shut down: no dead letter was requeued (resume it first)",
            ),
            Err(e) => return Err(e),
        },
        Action::PurgeDeadLetters => {
            let n = admin.purge_dead_letters(queue).await?;
            ActionOutcome::new(n, format!("purged {n} dead letters"))
        }
        Action::RequeueDeadLetter { id } => {
            match admin.requeue_dead_letter_by_id(queue, id).await {
                Ok(found) => switched(found, "requeued the dead letter", NO_LETTER),
                Err(AdminError::ShutDown) => ActionOutcome::new(
                    0,
                    "the queue is shut down: the dead letter stays (resume it first)",
                ),
                Err(e) => return Err(e),
            }
        }
        Action::DeleteDeadLetter { id } => switched(
            admin.delete_dead_letter_by_id(queue, id).await?,
            "deleted the dead letter",
            NO_LETTER,
        ),
        Action::RetryNow { item } => match admin.retry_now(queue, item).await {
            Ok(retried) => retry_outcome(retried),
            Err(AdminError::ShutDown) => retry_outcome(Retried::ShutDown),
            Err(e) => return Err(e),
        },
        Action::Remove { item } => {
            let removed = admin.remove(queue, item).await?;
            let mut parts = Vec::new();
            if removed.queued || removed.delayed {
                parts.push("taken out of the queue");
            }
            if removed.readd {
                parts.push("its pending re-add is dropped (the lease stays with its holder)");
            }
            if removed.counts {
                parts.push("its failure count is cleared");
            }
            if !parts.is_empty() {
                ActionOutcome::new(1, parts.join("; "))
            } else if removed.leased {
                ActionOutcome::new(
                    0,
                    "being processed with nothing pending: the lease stays with its holder",
                )
            } else {
                ActionOutcome::new(0, "not in the queue")
            }
        }
        Action::Forget { item } => {
            let n = admin.forget(queue, item).await?;
            if n > 0 {
                ActionOutcome::new(1, format!("cleared {n} failures"))
            } else {
                ActionOutcome::new(0, "no failures to clear")
            }
        }
        Action::PauseSchedule { schedule } => switched(
            admin.pause_schedule(queue, schedule, true).await?,
            "schedule paused for every process (its ticks are skipped)",
            "schedule paused already",
        ),
        Action::ResumeSchedule { schedule } => switched(
            admin.pause_schedule(queue, schedule, false).await?,
            "schedule running again (the ticks skipped are not caught up)",
            "schedule running already",
        ),
    })
}

/// What "retry now" did, said for the operator.
fn retry_outcome(retried: Retried) -> ActionOutcome {
    match retried {
        Retried::Queued => ActionOutcome::new(1, "queued now"),
        Retried::Deferred => ActionOutcome::new(1, "queued again when its current lease ends"),
        Retried::AlreadyQueued => ActionOutcome::new(0, "already queued"),
        Retried::InFlight => ActionOutcome::new(0, "being processed; nothing to retry"),
        Retried::ShutDown => ActionOutcome::new(0, "the queue is shut down"),
        Retried::Unknown => ActionOutcome::new(0, "not delayed or failing in this queue"),
    }
}
