//! [`Error`]: why a controller stopped on its own, with what its workers did.

use std::fmt;
use std::time::Duration;

use workq::Summary;

/// Why a controller stopped without being asked to, or was stopped by force.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A source of keys panicked: a `watches` mapper, or a stream given to `for_stream`,
    /// `owns_stream` or `watches_stream`. The controller stopped at once: with that source
    /// gone it would miss changes for ever.
    TriggerPanicked {
        /// The source (`watches Secret`, ...).
        trigger: String,
        /// The panic's message.
        message: String,
    },
    /// A stream given to `for_stream`, `owns_stream` or `watches_stream` (or their shared
    /// variants) ended: the controller would no longer see what it carried. Outside
    /// triggers (`reconcile_on`, `reconcile_all_on`) may end.
    TriggerEnded {
        /// The source.
        trigger: String,
    },
    /// The main store, or a watcher of `owns` or `watches`, did not complete its first list
    /// within the controller's [`sync_timeout`](crate::Controller::sync_timeout) (an RBAC
    /// rule missing, a custom resource not installed, an API server out of reach).
    /// controller-runtime's `CacheSyncTimeout`.
    NotSynced {
        /// The source that has not listed.
        trigger: String,
        /// The timeout.
        timeout: Duration,
        /// The source's last watch error, if it had one.
        last_error: Option<String>,
    },
    /// A second signal forced the stop: reconciles still running were cancelled and their
    /// objects handed back to the queue.
    Forced,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorKind::TriggerPanicked { trigger, message } => {
                write!(f, "trigger `{trigger}` panicked: {message}")
            }
            ErrorKind::TriggerEnded { trigger } => write!(f, "trigger `{trigger}` ended"),
            ErrorKind::NotSynced {
                trigger,
                timeout,
                last_error,
            } => {
                write!(
                    f,
                    "`{trigger}` did not complete its first list in {timeout:?}"
                )?;
                match last_error {
                    Some(error) => write!(f, " (last error: {error})"),
                    None => Ok(()),
                }
            }
            ErrorKind::Forced => f.write_str("stopped by force"),
        }
    }
}

/// A controller that stopped on its own (or by force): why, and what its workers did
/// until then.
///
/// Returned by [`Running::wait`](crate::Running::wait) and its siblings.
pub struct Error<T> {
    /// Why.
    kind: ErrorKind,
    /// What the workers did.
    summary: Summary<T>,
}

impl<T> Error<T> {
    pub(crate) fn new(kind: ErrorKind, summary: Summary<T>) -> Self {
        Self { kind, summary }
    }

    /// Why the controller stopped.
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }

    /// What the workers did.
    pub fn summary(&self) -> &Summary<T> {
        &self.summary
    }

    /// What the workers did, by value.
    pub fn into_summary(self) -> Summary<T> {
        self.summary
    }
}

impl<T> fmt::Debug for Error<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.kind)
            .field("summary", &format_args!("{}", self.summary))
            .finish()
    }
}

impl<T> fmt::Display for Error<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "controller stopped: {}; {}", self.kind, self.summary)
    }
}

impl<T> std::error::Error for Error<T> {}
