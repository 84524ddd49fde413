//! Helpers shared by the behaviour tests: wakers that count, one-shot polling, and waits with
//! a generous deadline for calls that must finish (so a bug fails the test instead of hanging
//! the suite).
//!
//! Each test binary uses only some of them.
#![allow(dead_code, reason = "each test binary uses a part of the support")]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::Duration;

/// How long a call that must finish may take before the test gives up on it. Far above what
/// any correct run needs, so it never fires on a slow machine; it only turns a hang into a
/// failure.
pub(crate) const GENEROUS: Duration = Duration::from_secs(30);

/// A waker that counts how often it was woken.
#[derive(Debug, Default)]
pub(crate) struct CountingWaker {
    wakes: AtomicUsize,
}

impl CountingWaker {
    /// A new counting waker and the [`Waker`] to hand to a future.
    pub(crate) fn new() -> (Arc<Self>, Waker) {
        let counter = Arc::new(Self::default());
        let waker = Waker::from(counter.clone());
        (counter, waker)
    }

    /// How many times the waker was woken so far.
    pub(crate) fn wakes(&self) -> usize {
        self.wakes.load(Ordering::SeqCst)
    }
}

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
    }
}

/// Polls `future` once with `waker`.
pub(crate) fn poll_once<F: Future + Unpin>(future: &mut F, waker: &Waker) -> Poll<F::Output> {
    let mut cx = Context::from_waker(waker);
    Pin::new(future).poll(&mut cx)
}

/// Runs `f` on a new thread and returns a handle whose [`Finishing::join`] waits for it, but
/// at most [`GENEROUS`].
pub(crate) fn spawn<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> Finishing<R> {
    let (tx, rx) = mpsc::channel();
    let handle = thread::spawn(move || {
        let result = f();
        // The receiver may be gone if the test already failed; nothing to do then.
        let _ = tx.send(());
        result
    });
    Finishing { handle, done: rx }
}

/// A thread started by [`spawn`].
#[derive(Debug)]
pub(crate) struct Finishing<R> {
    handle: thread::JoinHandle<R>,
    done: mpsc::Receiver<()>,
}

impl<R> Finishing<R> {
    /// Waits for the thread to return, panicking if it takes longer than [`GENEROUS`] (the
    /// call it makes is stuck) or if it panicked.
    #[track_caller]
    pub(crate) fn join(self, what: &str) -> R {
        match self.done.recv_timeout(GENEROUS) {
            Ok(()) => self.handle.join().expect("the thread panicked"),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // The thread ended without sending: it panicked. Surface its panic.
                match self.handle.join() {
                    Ok(_) => unreachable!("a thread that returned has sent"),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("{what} did not finish within {GENEROUS:?}")
            }
        }
    }

    /// Returns `true` once the thread has returned.
    pub(crate) fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }
}
