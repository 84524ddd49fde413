//! [`Lease`]: an item handed out by the queue, marked done when dropped.

use std::fmt;
use std::hash::Hash;
use std::ops::Deref;
use std::sync::Arc;

use crate::queue::locked::Shared;
use crate::state::Popped;

/// The claim on one item while a worker processes it.
///
/// [`WorkQueue::get`](crate::WorkQueue::get) and its siblings hand items out as leases.
/// While a lease is alive the item is never handed to another worker; adds of it are
/// remembered, and it is queued again (once, at the tail) when the lease is dropped.
/// Dropping the lease is client-go's `Done`: it cannot be forgotten, cannot happen twice,
/// and happens too when the worker panics and unwinds.
///
/// A lease dereferences to the item.
///
/// # Examples
///
/// ```
/// use workq::WorkQueue;
///
/// let queue = WorkQueue::new();
/// queue.add("default/web-0");
/// let lease = queue.try_get().unwrap();
/// queue.add("default/web-0"); // re-added while processing
/// assert_eq!(queue.len(), 0); // not handed out again yet
/// drop(lease); // done: now it is queued again
/// assert_eq!(queue.len(), 1);
/// ```
#[must_use = "dropping a lease marks its item done"]
pub struct Lease<T> {
    /// The queue, to mark the item done on drop.
    shared: Arc<Shared<T>>,
    /// A clone of the item.
    item: T,
    /// The item's slot in the queue's state, reserved until this lease drops.
    slot: u32,
    /// The priority the item was handed out with.
    priority: i32,
    /// The trace contexts of the adds that queued the item.
    #[cfg(feature = "otel")]
    links: Option<Box<crate::otel::Links>>,
}

impl<T> Lease<T> {
    /// The lease of an item the queue popped (its slot stays reserved until the lease
    /// drops).
    #[inline]
    pub(crate) fn new(shared: Arc<Shared<T>>, popped: Popped<T>) -> Self {
        Self {
            shared,
            item: popped.item,
            slot: popped.slot,
            priority: popped.priority,
            #[cfg(feature = "otel")]
            links: popped.links,
        }
    }

    /// The item.
    pub fn item(&self) -> &T {
        &self.item
    }

    /// The priority the item was handed out with (0 unless priorities are used; see
    /// [`AddOptions::priority`](crate::AddOptions::priority)).
    pub fn priority(&self) -> i32 {
        self.priority
    }

    /// Marks the item done, as dropping the lease does. This is client-go's `Done`.
    pub fn done(self) {}

    /// The trace contexts of the adds that queued the item since it was last handed out, in
    /// the order of the adds: at most [`MAX_LINKS`](crate::otel::MAX_LINKS), the first
    /// ones (feature `otel`; see [`otel`](crate::otel)).
    #[cfg(feature = "otel")]
    pub fn links(&self) -> &[crate::otel::TraceLink] {
        self.links.as_ref().map_or(&[], |links| &links.list)
    }

    /// How many adds carried a trace context that was dropped because the item had
    /// [`MAX_LINKS`](crate::otel::MAX_LINKS) already (feature `otel`).
    #[cfg(feature = "otel")]
    pub fn links_dropped(&self) -> u32 {
        self.links.as_ref().map_or(0, |links| links.dropped)
    }
}

impl<T: Eq + Hash + Clone + Send + Sync + 'static> Lease<T> {
    /// Hands the lease back unprocessed: the item is queued again at once, at the head of
    /// its priority (where it was taken from), and the lease is done; `false` if the queue
    /// is shut down and refused the re-add (the lease is then done as it drops).
    pub(crate) fn release(mut self) -> bool {
        // The links go back with the item, so its next hand-out links to the adds behind it.
        #[cfg(feature = "otel")]
        if let Some(links) = &self.links {
            self.shared.restore_links(self.slot, links.clone());
        }
        let released = self
            .shared
            .release(self.slot, self.item.clone(), self.priority);
        if released {
            // Done already: the drop below must not do it again.
            self.slot = DONE;
        }
        released
    }

    /// Marks the item done and hands out the next ready item, in one round of the queue's
    /// lock (what [`Queue::done_and_next`](crate::Queue::done_and_next) does in memory).
    pub(crate) fn done_and_try_get(mut self) -> Option<Lease<T>> {
        let next = self.shared.done_then_pop(self.slot);
        // Done already: the drop below must not do it again.
        self.slot = DONE;
        next.map(|popped| Lease::new(self.shared.clone(), popped))
    }
}

impl<T> Deref for Lease<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.item
    }
}

impl<T> AsRef<T> for Lease<T> {
    fn as_ref(&self) -> &T {
        &self.item
    }
}

/// [`Lease::slot`] of a lease whose item is done already (the state never hands out this
/// slot: it would be the 4 billionth item held at once).
const DONE: u32 = u32::MAX;

impl<T> Drop for Lease<T> {
    fn drop(&mut self) {
        if self.slot != DONE {
            self.shared.done(self.slot);
        }
    }
}

impl<T> fmt::Debug for Lease<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("priority", &self.priority)
            .finish_non_exhaustive()
    }
}
