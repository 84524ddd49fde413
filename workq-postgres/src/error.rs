//! Errors.

use std::fmt;

/// What can go wrong talking to the queue.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The database could not be reached, or answered with an error.
    Database(sqlx::Error),
    /// The schema could not be installed or upgraded.
    Migrate(String),
    /// An item could not be serialized.
    Serialize(serde_json::Error),
    /// The lease was no longer this holder's: it expired and was reclaimed (and perhaps handed
    /// to another worker). The fencing token made the database refuse the call, so it changed
    /// nothing.
    LeaseLost,
    /// A `done` whose first attempt failed on the connection was retried, and the retry found
    /// the lease gone: the first attempt may or may not have been applied.
    OutcomeUnknown,
    /// The queue's configuration is unusable (an empty or too long name, no database, a
    /// lease under 10 ms).
    Config(String),
    /// The queue is shut down (for this handle, or for every process): an operator command
    /// that would queue items again refused, and changed nothing.
    ShutDown,
    /// The `LISTEN` connection that wakes getters could not be opened.
    Listen(String),
    /// The database answered something this crate does not expect (a schema changed under
    /// it?).
    Protocol(String),
}

impl Error {
    /// Returns `true` for [`Error::LeaseLost`].
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, Error::LeaseLost)
    }

    /// Returns `true` if the error came from the connection (the call may be retried; it may
    /// or may not have been applied), or from a server that is starting or shutting down.
    pub fn is_connection(&self) -> bool {
        match self {
            Error::Database(e) => match e {
                sqlx::Error::Io(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::WorkerCrashed
                | sqlx::Error::Tls(_) => true,
                // 57P01..57P03: admin shutdown, crash shutdown, cannot connect now; 08xxx:
                // connection exceptions; 40001/40P01: serialization failure, deadlock.
                sqlx::Error::Database(db) => db.code().is_some_and(|code| {
                    code.starts_with("08") || code.starts_with("57P") || code.starts_with("40")
                }),
                _ => false,
            },
            _ => false,
        }
    }
}

impl Error {
    /// Returns `true` if the server refused the statement and rolled it back, so it changed
    /// nothing and may be sent again: a lock it waited for longer than `lock_timeout` (55P03),
    /// a statement cancelled by `statement_timeout` or `pg_cancel_backend` (57014), a
    /// serialization failure (40001) or a deadlock (40P01). The queue retries them as it
    /// retries a lost connection.
    pub fn is_rolled_back(&self) -> bool {
        match self {
            Error::Database(sqlx::Error::Database(db)) => {
                matches!(
                    db.code().as_deref(),
                    Some("55P03" | "57014" | "40001" | "40P01")
                )
            }
            _ => false,
        }
    }

    /// Whether the statement waited out a lock or statement timeout: sent again at once, since
    /// the wait itself was the pause between two tries.
    pub(crate) fn waited(&self) -> bool {
        match self {
            Error::Database(sqlx::Error::Database(db)) => {
                matches!(db.code().as_deref(), Some("55P03" | "57014"))
            }
            _ => false,
        }
    }

    /// Whether a call that failed this way is worth sending again: the connection failed (the
    /// call may or may not have been applied) or the server rolled the call back.
    pub(crate) fn is_transient(&self) -> bool {
        self.is_connection() || self.is_rolled_back()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Database(e) => write!(f, "postgres: {e}"),
            Error::Migrate(msg) => write!(f, "cannot install the schema: {msg}"),
            Error::Serialize(e) => write!(f, "cannot serialize the item: {e}"),
            Error::LeaseLost => f.write_str("the lease was lost (expired and reclaimed)"),
            Error::OutcomeUnknown => {
                f.write_str("the connection failed during done; whether it was applied is unknown")
            }
            Error::Config(msg) => write!(f, "invalid configuration: {msg}"),
            Error::ShutDown => {
                f.write_str("the queue is shut down: nothing was queued again (resume it first)")
            }
            Error::Listen(msg) => write!(f, "cannot listen for wake-ups: {msg}"),
            Error::Protocol(msg) => write!(f, "unexpected answer from the database: {msg}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Database(e) => Some(e),
            Error::Serialize(e) => Some(e),
            _ => None,
        }
    }
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        Error::Database(e)
    }
}
