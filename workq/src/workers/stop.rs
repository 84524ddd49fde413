//! [`StopToken`]: a stop signal that threads can block on and tasks can await.
//!
//! Its waiters are the queue's own wait list ([`Waiters`]): a blocked thread and an awaiting
//! task are both a [`Signal`], woken by being taken off the list, so there is one waiter
//! mechanism in the crate.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use slab::Slab;

use crate::sync::thread;
use crate::waiters::{Signal, Waiters};

/// A stop signal shared by everyone who holds a clone.
///
/// [`stop`](Self::stop) trips it once and for all; threads see it with
/// [`is_stopped`](Self::is_stopped) or block in [`wait`](Self::wait), tasks await
/// [`stopped`](Self::stopped) (on any executor). [`Workers`](super::Workers) stop taking
/// items when it trips, and [`Parallelizer`](crate::Parallelizer) checks it before each
/// piece. It plays the part of a Go `context.Context`'s `Done` channel, or of tokio-util's
/// `CancellationToken`, without depending on either.
///
/// # Examples
///
/// ```
/// use workq::StopToken;
///
/// let stop = StopToken::new();
/// let worker = {
///     let stop = stop.clone();
///     std::thread::spawn(move || {
///         stop.wait(); // blocks until someone calls stop()
///         "stopped"
///     })
/// };
/// stop.stop();
/// assert_eq!(worker.join().unwrap(), "stopped");
/// assert!(stop.is_stopped());
/// ```
#[derive(Clone, Default)]
pub struct StopToken {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Set once, before the callbacks run and the waiters wake.
    stopped: AtomicBool,
    /// Waiters and callbacks.
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Threads blocked in `wait` and tasks awaiting `stopped`: all woken by `stop`.
    waiters: Waiters,
    /// Run once by `stop`, on the stopping thread; removable by key.
    callbacks: Slab<Box<dyn FnOnce() + Send>>,
}

impl StopToken {
    /// Creates a token that has not stopped.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trips the signal: every clone sees it from now on. Calling it again does nothing.
    pub fn stop(&self) {
        if self.inner.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        let (waiters, callbacks) = {
            let mut state = self.inner.state.lock();
            (
                state.waiters.take_all(),
                std::mem::take(&mut state.callbacks),
            )
        };
        for (_, callback) in callbacks {
            callback();
        }
        waiters.wake();
    }

    /// Returns `true` once [`stop`](Self::stop) has been called.
    pub fn is_stopped(&self) -> bool {
        self.inner.stopped.load(Ordering::SeqCst)
    }

    /// A future that completes once the token is stopped. It works on any executor.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping it only stops waiting.
    ///
    /// # Examples
    ///
    /// ```
    /// use workq::StopToken;
    ///
    /// # futures::executor::block_on(async {
    /// let stop = StopToken::new();
    /// stop.stop();
    /// stop.stopped().await;
    /// # });
    /// ```
    pub fn stopped(&self) -> Stopped {
        Stopped {
            token: self.clone(),
            waiter: None,
        }
    }

    /// Blocks the thread until the token is stopped.
    ///
    /// # Blocking
    ///
    /// Parks the calling thread; in async code await [`stopped`](Self::stopped) instead.
    pub fn wait(&self) {
        self.park_until(None);
    }

    /// Blocks the thread until the token is stopped or `timeout` passes; returns
    /// [`is_stopped`](Self::is_stopped).
    ///
    /// # Blocking
    ///
    /// Parks the calling thread for at most `timeout`.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        self.park_until(Instant::now().checked_add(timeout));
        self.is_stopped()
    }

    /// Parks the thread on the token's wait list until it stops, or `deadline` passes.
    fn park_until(&self, deadline: Option<Instant>) {
        let id = {
            let mut state = self.inner.state.lock();
            // Checked under the lock: `stop` sets the flag before taking the waiters.
            if self.is_stopped() {
                return;
            }
            state.waiters.register(Signal::Thread(thread::current()))
        };
        // Parks may wake spuriously: the flag says whether the stop came.
        while !self.is_stopped() {
            match deadline {
                None => thread::park(),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        self.inner.state.lock().waiters.cancel(id);
                        return;
                    }
                    thread::park_timeout(deadline - now);
                }
            }
        }
    }

    /// Runs `callback` when the token stops (at once if it already has). Returns a key for
    /// [`remove_on_stop`](Self::remove_on_stop), or `None` if it ran at once.
    pub(crate) fn on_stop(&self, callback: impl FnOnce() + Send + 'static) -> Option<usize> {
        let mut state = self.inner.state.lock();
        if self.is_stopped() {
            drop(state);
            callback();
            return None;
        }
        Some(state.callbacks.insert(Box::new(callback)))
    }

    /// Forgets a callback registered with [`on_stop`](Self::on_stop) that has not run.
    pub(crate) fn remove_on_stop(&self, key: usize) {
        let mut state = self.inner.state.lock();
        if state.callbacks.contains(key) {
            drop(state.callbacks.remove(key));
        }
    }
}

impl fmt::Debug for StopToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StopToken")
            .field("stopped", &self.is_stopped())
            .finish()
    }
}

/// The future of [`StopToken::stopped`].
#[must_use = "futures do nothing unless polled"]
pub struct Stopped {
    token: StopToken,
    /// Our id in the token's wait list while registered.
    waiter: Option<u64>,
}

impl Future for Stopped {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.token.is_stopped() {
            return Poll::Ready(());
        }
        let inner = self.token.inner.clone();
        let mut state = inner.state.lock();
        // Checked again under the lock: `stop` sets the flag before taking the wakers.
        if self.token.is_stopped() {
            return Poll::Ready(());
        }
        let registered = self
            .waiter
            .is_some_and(|id| state.waiters.update(id, cx.waker()));
        if !registered {
            self.waiter = Some(state.waiters.register(Signal::Task(cx.waker().clone())));
        }
        Poll::Pending
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Some(id) = self.waiter.take() {
            self.token.inner.state.lock().waiters.cancel(id);
        }
    }
}

impl fmt::Debug for Stopped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stopped")
            .field("stopped", &self.token.is_stopped())
            .finish()
    }
}
