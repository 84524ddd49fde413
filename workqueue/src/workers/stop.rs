//! [`StopToken`]: a stop signal that threads can block on and tasks can await.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use slab::Slab;

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
/// use workqueue::StopToken;
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
    /// Wakes threads blocked in `wait`.
    condvar: Condvar,
}

#[derive(Default)]
struct State {
    /// Tasks awaiting `stopped`, keyed by the id their future holds.
    wakers: Slab<Waker>,
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
        let (wakers, callbacks) = {
            let mut state = self.inner.state.lock();
            (
                std::mem::take(&mut state.wakers),
                std::mem::take(&mut state.callbacks),
            )
        };
        for (_, callback) in callbacks {
            callback();
        }
        self.inner.condvar.notify_all();
        for (_, waker) in wakers {
            waker.wake();
        }
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
    /// use workqueue::StopToken;
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
            waker: None,
        }
    }

    /// Blocks the thread until the token is stopped.
    ///
    /// # Blocking
    ///
    /// Parks the calling thread; in async code await [`stopped`](Self::stopped) instead.
    pub fn wait(&self) {
        let mut state = self.inner.state.lock();
        while !self.is_stopped() {
            self.inner.condvar.wait(&mut state);
        }
    }

    /// Blocks the thread until the token is stopped or `timeout` passes; returns
    /// [`is_stopped`](Self::is_stopped).
    ///
    /// # Blocking
    ///
    /// Parks the calling thread for at most `timeout`.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        let deadline = Instant::now().checked_add(timeout);
        let mut state = self.inner.state.lock();
        while !self.is_stopped() {
            match deadline {
                Some(deadline) => {
                    if self
                        .inner
                        .condvar
                        .wait_until(&mut state, deadline)
                        .timed_out()
                    {
                        break;
                    }
                }
                None => self.inner.condvar.wait(&mut state),
            }
        }
        self.is_stopped()
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
    /// Our key in the token's waker list while registered.
    waker: Option<usize>,
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
        match self.waker {
            Some(key) if state.wakers.contains(key) => {
                let slot = &mut state.wakers[key];
                if !slot.will_wake(cx.waker()) {
                    slot.clone_from(cx.waker());
                }
            }
            _ => self.waker = Some(state.wakers.insert(cx.waker().clone())),
        }
        Poll::Pending
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Some(key) = self.waker.take() {
            let mut state = self.token.inner.state.lock();
            if state.wakers.contains(key) {
                drop(state.wakers.remove(key));
            }
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
