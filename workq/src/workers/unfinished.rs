//! [`Unfinished`]: the list a pool's workers and its step task both add to.

use std::sync::Arc;

use parking_lot::Mutex;

/// The items a pool touched and did not finish that the queue no longer holds (see
/// [`Summary::unfinished`](crate::Summary::unfinished)): filled by the workers and by the
/// step task, which releases the leases no worker took.
pub(crate) type Unfinished<T> = Arc<Mutex<Vec<T>>>;
