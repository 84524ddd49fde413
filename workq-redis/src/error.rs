//! Errors.

use std::fmt;

/// What can go wrong talking to the queue.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The server could not be reached, or answered with an error.
    Redis(redis::RedisError),
    /// An item could not be serialized.
    Serialize(serde_json::Error),
    /// The lease was no longer this holder's: it expired and was reclaimed (and perhaps handed
    /// to another worker). The fencing token made the server refuse the call, so it changed
    /// nothing.
    LeaseLost,
    /// A `done` whose first attempt failed on the connection was retried, and the retry found
    /// the lease gone: the first attempt may or may not have been applied.
    OutcomeUnknown,
    /// The queue's configuration is unusable (for example a name with `{` or `}`).
    Config(String),
    /// The server answered something this crate does not understand.
    Protocol(String),
    /// The queue cannot do what was asked. Every option of [`workq::AddOptions`] is
    /// supported today; the variant stays for capabilities a later version may lack.
    Unsupported(&'static str),
    /// The server is older than [`MIN_REDIS_VERSION`](crate::MIN_REDIS_VERSION), or its
    /// version could not be read: the queue needs features it lacks (script flags).
    UnsupportedServer(String),
    /// The queue is shut down (this handle, or the queue for every process): an operator
    /// call that would queue items again (a dead letter's requeue) was refused and changed
    /// nothing.
    ShutDown,
}

impl Error {
    /// Returns `true` for [`Error::LeaseLost`].
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, Error::LeaseLost)
    }

    /// Returns `true` if the error came from the connection (the call may be retried).
    pub fn is_connection(&self) -> bool {
        match self {
            Error::Redis(e) => {
                e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
            }
            _ => false,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Redis(e) => write!(f, "redis: {e}"),
            Error::Serialize(e) => write!(f, "cannot serialize the item: {e}"),
            Error::LeaseLost => f.write_str("the lease was lost (expired and reclaimed)"),
            Error::OutcomeUnknown => {
                f.write_str("the connection failed during done; whether it was applied is unknown")
            }
            Error::Config(msg) => write!(f, "invalid configuration: {msg}"),
            Error::Protocol(msg) => write!(f, "unexpected reply: {msg}"),
            Error::Unsupported(what) => write!(f, "not supported: {what}"),
            Error::UnsupportedServer(msg) => write!(f, "unsupported server: {msg}"),
            Error::ShutDown => {
                f.write_str("the queue is shut down: nothing was queued again (resume it first)")
            }
        }
    }
}

/// A server state that passes by itself: an operation waits it out (with backoff, up to the
/// queue's [retry deadline](crate::Builder::retry_deadline)) instead of failing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transient {
    /// The connection failed or timed out; the connection manager reconnects. The call may or
    /// may not have been applied.
    Connection,
    /// The server refused the call without running it: `LOADING` (replaying its AOF or RDB),
    /// `BUSY` (a script runs), `TRYAGAIN`, `MASTERDOWN`, `CLUSTERDOWN`.
    Refused,
    /// `READONLY`: the server is a replica now (a failover): reconnect, to find the primary.
    ReadOnly,
}

impl Transient {
    /// The transient state behind `error`, if it is one.
    pub(crate) fn of(error: &Error) -> Option<Self> {
        let Error::Redis(e) = error else {
            return None;
        };
        match e.code() {
            Some("LOADING" | "BUSY" | "TRYAGAIN" | "MASTERDOWN" | "CLUSTERDOWN") => {
                return Some(Transient::Refused);
            }
            Some("READONLY") => return Some(Transient::ReadOnly),
            _ => {}
        }
        error.is_connection().then_some(Transient::Connection)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Redis(e) => Some(e),
            Error::Serialize(e) => Some(e),
            _ => None,
        }
    }
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        Error::Redis(e)
    }
}
