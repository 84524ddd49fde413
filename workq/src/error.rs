//! Errors.

use std::fmt;

/// Why [`WorkQueue::try_get`](crate::WorkQueue::try_get) returned no item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TryGetError {
    /// No item is ready now; one may be later.
    Empty,
    /// The queue is shut down and has nothing left to hand out.
    ShutDown,
}

impl TryGetError {
    /// Returns `true` for [`TryGetError::Empty`].
    pub fn is_empty(&self) -> bool {
        matches!(self, TryGetError::Empty)
    }

    /// Returns `true` for [`TryGetError::ShutDown`].
    pub fn is_shut_down(&self) -> bool {
        matches!(self, TryGetError::ShutDown)
    }
}

impl fmt::Display for TryGetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryGetError::Empty => f.write_str("no item is ready"),
            TryGetError::ShutDown => f.write_str("queue is shut down"),
        }
    }
}

impl std::error::Error for TryGetError {}
