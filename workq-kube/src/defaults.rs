//! The defaults and the priorities a [`Controller`](crate::Controller) starts from, shared by
//! the builder, the sources and the running controller (and re-exported at the crate's root).

use std::time::Duration;

/// The priority of keys from a watcher's list (the first one, and every relist after a watch
/// expired) and from [`Controller::reconcile_all_on`]: controller-runtime's rule, so that a
/// restart's thousands of listed objects do not hold back live changes.
///
/// [`Controller::reconcile_all_on`]: crate::Controller::reconcile_all_on
pub const LIST_PRIORITY: i32 = -100;

/// The priority of keys from live watch events and [`Controller::reconcile_on`]. Given
/// explicitly, it raises a key still queued from a list.
///
/// [`Controller::reconcile_on`]: crate::Controller::reconcile_on
pub const WATCH_PRIORITY: i32 = 0;

/// How long a stop waits for the reconciles in flight by default: within the 30 s Kubernetes
/// gives a pod between `SIGTERM` and `SIGKILL`, with time left to hand leases back.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(25);

/// How long the main store and the watchers of `owns` and `watches` may take to complete
/// their first list by default: controller-runtime's `CacheSyncTimeout`.
pub const DEFAULT_SYNC_TIMEOUT: Duration = Duration::from_secs(120);
