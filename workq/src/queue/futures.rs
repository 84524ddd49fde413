//! The futures of [`WorkQueue::get`] and [`WorkQueue::shut_down_with_drain`].

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::WorkQueue;
use crate::error::TryGetError;
use crate::lease::Lease;
use crate::waiters::Signal;

/// The future of [`WorkQueue::get`].
#[must_use = "futures do nothing unless polled"]
pub struct Get<'a, T> {
    pub(super) queue: &'a WorkQueue<T>,
    /// Our id in the waiter list while registered.
    pub(super) waiter: Option<u64>,
}

impl<T> fmt::Debug for Get<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Get")
            .field("waiting", &self.waiter.is_some())
            .finish()
    }
}

impl<T: Eq + Hash + Clone + Send + Sync + 'static> Future for Get<'_, T> {
    type Output = Option<Lease<T>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let shared = &this.queue.shared;
        let waiter = &mut this.waiter;
        let popped = shared.locked(|inner, _| match shared.pop_locked(inner) {
            (Err(TryGetError::Empty), after) => {
                let registered = match *waiter {
                    Some(id) => inner.waiters.update(id, cx.waker()),
                    None => false,
                };
                if !registered {
                    *waiter = Some(inner.waiters.register(Signal::Task(cx.waker().clone())));
                }
                (Poll::Pending, after)
            }
            (done, after) => {
                if let Some(id) = waiter.take() {
                    inner.waiters.cancel(id);
                }
                (Poll::Ready(done.ok()), after)
            }
        });
        popped.map(|popped| popped.map(|popped| Lease::new(shared.clone(), popped)))
    }
}

impl<T> Drop for Get<'_, T> {
    fn drop(&mut self) {
        let Some(id) = self.waiter.take() else {
            return;
        };
        let shared = &self.queue.shared;
        let mut inner = shared.inner.lock();
        if inner.waiters.cancel(id) {
            return;
        }
        // We were woken for an item we will never take: pass the wake-up on.
        if inner.state.len() > 0 || inner.state.is_shutting_down() {
            let wake = inner.waiters.take_one();
            drop(inner);
            wake.wake();
        }
    }
}

/// The future of [`WorkQueue::shut_down_with_drain`].
#[must_use = "the queue is already shut down; await this to wait for in-flight items"]
pub struct Drain<'a, T> {
    pub(super) queue: &'a WorkQueue<T>,
    /// Our id in the drain waiter list while registered.
    pub(super) waiter: Option<u64>,
}

impl<T> fmt::Debug for Drain<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Drain")
            .field("waiting", &self.waiter.is_some())
            .finish()
    }
}

impl<T> Future for Drain<'_, T> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let shared = &self.queue.shared;
        let mut inner = shared.inner.lock();
        if inner.state.processing() == 0 || !inner.drain {
            if let Some(id) = self.waiter.take() {
                inner.drain_waiters.cancel(id);
            }
            return Poll::Ready(());
        }
        let registered = match self.waiter {
            Some(id) => inner.drain_waiters.update(id, cx.waker()),
            None => false,
        };
        if !registered {
            let id = inner
                .drain_waiters
                .register(Signal::Task(cx.waker().clone()));
            self.waiter = Some(id);
        }
        Poll::Pending
    }
}

impl<T> Drop for Drain<'_, T> {
    fn drop(&mut self) {
        if let Some(id) = self.waiter.take() {
            self.queue.shared.inner.lock().drain_waiters.cancel(id);
        }
    }
}
