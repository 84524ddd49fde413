//! One list of getters waiting for an item, blocking threads and async tasks alike.
//!
//! Written by hand rather than built on `event-listener` or `tokio::sync::Notify`: the list
//! lives inside the queue's one lock, so deciding who to wake and changing the queue happen
//! in one critical section (no wake-up can fall between them), loom sees every step through
//! the `sync` shim, and the core needs no async runtime. The idea is flume's `Signal`:
//! a waiter is a thread to unpark or a task to wake.
//!
//! Rules the queue keeps with it:
//! - a waiter is woken by *removing* it from the list, so "am I still registered?" tells a
//!   waiter whether it was woken;
//! - every transition that makes `k` items ready wakes at most `k` waiters, in FIFO order;
//! - a woken async getter whose future is dropped before taking an item passes its wake-up
//!   on (cancel safety).

use std::collections::VecDeque;
use std::fmt;
use std::task::Waker;

use crate::sync::thread::Thread;

/// How to wake one waiter.
pub(crate) enum Signal {
    /// A thread parked in `blocking_get` or a blocking drain.
    Thread(Thread),
    /// A task polling a `get` future.
    Task(Waker),
}

impl Signal {
    /// Wakes the waiter. Call it without the queue's lock held.
    pub(crate) fn wake(self) {
        match self {
            Signal::Thread(thread) => thread.unpark(),
            Signal::Task(waker) => waker.wake(),
        }
    }
}

impl fmt::Debug for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Signal::Thread(_) => f.write_str("Signal::Thread"),
            Signal::Task(_) => f.write_str("Signal::Task"),
        }
    }
}

/// Waiters to wake once the lock is released.
#[derive(Debug, Default)]
pub(crate) enum Wakeups {
    /// Nobody.
    #[default]
    None,
    /// One waiter, the common case, without allocating.
    One(Signal),
    /// Several.
    Many(Vec<Signal>),
}

impl Wakeups {
    /// Wakes them all.
    #[inline]
    pub(crate) fn wake(self) {
        // Most calls have nobody to wake: keep that check at the call site, and skip the
        // drop glue of an empty set (it holds nothing to free).
        if matches!(self, Wakeups::None) {
            std::mem::forget(self);
        } else {
            self.wake_some();
        }
    }

    fn wake_some(self) {
        match self {
            Wakeups::None => {}
            Wakeups::One(signal) => signal.wake(),
            Wakeups::Many(signals) => {
                // A waker is user code: if one panics, the others must still be woken (they
                // were taken off the list), then the first panic goes on.
                let mut panicked = None;
                for signal in signals {
                    if let Err(payload) =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| signal.wake()))
                    {
                        panicked.get_or_insert(payload);
                    }
                }
                if let Some(payload) = panicked {
                    std::panic::resume_unwind(payload);
                }
            }
        }
    }

    /// Adds `other` to these.
    pub(crate) fn merge(self, other: Wakeups) -> Wakeups {
        match (self, other) {
            (Wakeups::None, w) | (w, Wakeups::None) => w,
            (a, b) => {
                let mut all = a.into_vec();
                all.extend(b.into_vec());
                Wakeups::Many(all)
            }
        }
    }

    fn into_vec(self) -> Vec<Signal> {
        match self {
            Wakeups::None => Vec::new(),
            Wakeups::One(signal) => vec![signal],
            Wakeups::Many(signals) => signals,
        }
    }
}

/// The waiting getters, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    /// Registered waiters with their ids; ids increase front to back.
    list: VecDeque<(u64, Signal)>,
    /// The id the next registration gets.
    next_id: u64,
}

impl Waiters {
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Registers a waiter at the back; returns its id.
    pub(crate) fn register(&mut self, signal: Signal) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.list.push_back((id, signal));
        id
    }

    fn position(&self, id: u64) -> Option<usize> {
        self.list.binary_search_by_key(&id, |(i, _)| *i).ok()
    }

    /// Replaces the waker of a registered async waiter. Returns `false` if `id` is no longer
    /// registered (it was woken).
    pub(crate) fn update(&mut self, id: u64, waker: &Waker) -> bool {
        match self.position(id) {
            Some(pos) => {
                match &mut self.list[pos].1 {
                    Signal::Task(old) if old.will_wake(waker) => {}
                    other => *other = Signal::Task(waker.clone()),
                }
                true
            }
            None => false,
        }
    }

    /// Removes waiter `id`. Returns `true` if it was still registered (not woken).
    pub(crate) fn cancel(&mut self, id: u64) -> bool {
        match self.position(id) {
            Some(pos) => {
                self.list.remove(pos);
                true
            }
            None => false,
        }
    }

    /// Takes the oldest waiter to wake it.
    #[inline]
    pub(crate) fn take_one(&mut self) -> Wakeups {
        match self.list.pop_front() {
            Some((_, signal)) => Wakeups::One(signal),
            None => Wakeups::None,
        }
    }

    /// Takes up to `n` waiters, oldest first.
    pub(crate) fn take(&mut self, n: usize) -> Wakeups {
        match n.min(self.list.len()) {
            0 => Wakeups::None,
            1 => self.take_one(),
            k => Wakeups::Many(self.list.drain(..k).map(|(_, s)| s).collect()),
        }
    }

    /// Takes every waiter.
    pub(crate) fn take_all(&mut self) -> Wakeups {
        self.take(self.list.len())
    }
}
