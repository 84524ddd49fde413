//! The synchronisation primitives the crate uses, in one place, so that the loom model tests
//! can swap in loom's versions (`RUSTFLAGS="--cfg loom"`; see `src/tests/`).
//!
//! Production builds use `parking_lot` (no poisoning, small and fast uncontended locks) and
//! `std`'s atomics and thread parking. Under loom, thin wrappers give loom's types the same
//! `parking_lot`-shaped API, so no code outside this file knows which is in use. `Arc` and
//! `Weak` stay `std`'s in both: loom's `Arc` has no `Weak`, and reference counts are not
//! what the models check.
//!
//! What loom sees is therefore the queue's lock, its `ready_hint` atomic, the timer's
//! condition variable and every park and unpark of a waiting getter or drain, which is where
//! a wake-up can be lost. What it does not see: the `parking_lot` locks inside
//! [`FakeClock`](crate::clock::FakeClock) and the rate limiters (each held briefly, around
//! no shimmed operation except a `FakeClock` step, which calls the queues with its step lock
//! held, so a model steps a fake clock from one thread only), and the real-time timer thread
//! (loom cannot model time; models use a fake clock, which starts no thread).

#[cfg(not(all(test, loom)))]
mod imp {
    pub(crate) use parking_lot::{Condvar, Mutex, MutexGuard};
    pub(crate) use std::sync::atomic::{AtomicUsize, Ordering};

    pub(crate) mod thread {
        pub(crate) use std::thread::{Thread, current, park, park_timeout};
    }

    /// Unlocks `guard` while `f` runs.
    #[inline]
    pub(crate) fn unlocked<T, R>(guard: &mut MutexGuard<'_, T>, f: impl FnOnce() -> R) -> R {
        MutexGuard::unlocked(guard, f)
    }

    /// Waits on `condvar` for at most `timeout`.
    #[inline]
    pub(crate) fn wait_for<T>(
        condvar: &Condvar,
        guard: &mut MutexGuard<'_, T>,
        timeout: std::time::Duration,
    ) {
        let _ = condvar.wait_for(guard, timeout);
    }
}

#[cfg(all(test, loom))]
mod imp {
    pub(crate) use loom::sync::atomic::{AtomicUsize, Ordering};

    pub(crate) mod thread {
        pub(crate) use loom::thread::{Thread, current, park};

        /// loom does not model time: parks until unparked.
        pub(crate) fn park_timeout(_timeout: std::time::Duration) {
            park();
        }
    }

    /// loom's mutex with `parking_lot`'s API: `lock` returns the guard.
    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    /// The guard of [`Mutex`]; `None` only while a condition variable holds the lock.
    pub(crate) struct MutexGuard<'a, T>(Option<loom::sync::MutexGuard<'a, T>>, &'a Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard(Some(self.0.lock().unwrap()), self)
        }
    }

    impl<T> std::ops::Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.0.as_ref().unwrap()
        }
    }

    impl<T> std::ops::DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.0.as_mut().unwrap()
        }
    }

    /// loom's condition variable with `parking_lot`'s API.
    #[derive(Debug)]
    pub(crate) struct Condvar(loom::sync::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Self(loom::sync::Condvar::new())
        }

        pub(crate) fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
            let inner = guard.0.take().unwrap();
            guard.0 = Some(self.0.wait(inner).unwrap());
        }

        /// Wakes one waiter. loom does not say whether there was one: the answer is always
        /// `true` (nothing in the crate reads it).
        pub(crate) fn notify_one(&self) -> bool {
            self.0.notify_one();
            true
        }

        /// Wakes every waiter. loom does not say how many there were: the answer is always 0
        /// (nothing in the crate reads it).
        pub(crate) fn notify_all(&self) -> usize {
            self.0.notify_all();
            0
        }
    }

    pub(crate) fn unlocked<T, R>(guard: &mut MutexGuard<'_, T>, f: impl FnOnce() -> R) -> R {
        drop(guard.0.take());
        let result = f();
        guard.0 = Some(guard.1.0.lock().unwrap());
        result
    }

    /// loom cannot model time: a timed wait is a plain wait. Models never use the timer.
    pub(crate) fn wait_for<T>(
        condvar: &Condvar,
        guard: &mut MutexGuard<'_, T>,
        _timeout: std::time::Duration,
    ) {
        condvar.wait(guard);
    }
}

pub(crate) use imp::*;
