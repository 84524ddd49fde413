//! The delay timer thread.

use std::hash::Hash;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::locked::{After, Inner, Shared};
use crate::sync::{self, Ordering};

impl<T: Eq + Hash + Clone + Send + Sync + 'static> Shared<T> {
    /// Called by a driving clock (a [`FakeClock`](crate::clock::FakeClock)) after it moved.
    pub(super) fn on_clock_advance(&self) {
        self.locked(|_, _| ((), After::NONE));
    }

    /// Starts the timer thread; called under the lock by the first delayed add.
    pub(super) fn start_timer(self: &Arc<Self>, inner: &mut Inner<T>) {
        let weak = Arc::downgrade(self);
        let name = match &self.name {
            Some(name) => format!("workq-timer-{name}"),
            None => "workq-timer".to_owned(),
        };
        inner.timer.sleeping_until = u64::MAX;
        let spawned = std::thread::Builder::new()
            .name(name)
            .spawn(move || timer_loop(weak));
        // Without the thread, getters waiting for a delayed item would never be woken: fail
        // loudly rather than hang quietly.
        match spawned {
            Ok(handle) => inner.timer.thread = Some(handle),
            Err(err) => panic!("workq: cannot start the delay timer thread: {err}"),
        }
    }
}

/// The delay timer: sleeps until the earliest delayed item (or, with hand-out rates, the
/// next token a getter waits for) is due, promotes it and wakes getters. One per queue, started by the first delayed add, ended by shut down or when the
/// last handle drops.
///
/// A panic in user code it runs (a clock's `now`, a waker, a metrics recorder's panic is
/// contained already) would end the thread and leave getters of delayed items waiting
/// forever: it is caught and logged, and the loop starts again after a short pause (so that
/// a clock that always panics does not spin a core).
fn timer_loop<T: Eq + Hash + Clone + Send + Sync + 'static>(weak: Weak<Shared<T>>) {
    let Some(shared) = weak.upgrade() else {
        return;
    };
    drop(weak);
    loop {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| timer_run(&shared))) {
            Ok(()) => return,
            Err(_) => {
                tracing::error!(
                    queue = shared.name.as_deref().unwrap_or(""),
                    "workq: a clock or waker panicked on the delay timer thread; \
                     the timer goes on"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// The body of [`timer_loop`]; returns when the timer should end.
fn timer_run<T: Eq + Hash + Clone + Send + Sync + 'static>(shared: &Shared<T>) {
    let mut inner = shared.inner.lock();
    loop {
        // With hand-out rates the timer also serves tokens, which items still queued after a
        // shut down need; it then ends with the last handle.
        let stopped = inner.state.is_shutting_down() && !shared.rates;
        if stopped || shared.handles.load(Ordering::Acquire) == 0 {
            return;
        }
        if let Some((_, promoted)) = shared.promote(&mut inner)
            && !promoted.is_idle()
        {
            sync::unlocked(&mut inner, || promoted.run(shared));
            continue;
        }
        match inner.state.next_deadline() {
            None => {
                inner.timer.sleeping_until = u64::MAX;
                shared.timer_cv.wait(&mut inner);
            }
            Some(at) => {
                inner.timer.sleeping_until = at;
                let now = shared.now_ns();
                if at > now {
                    sync::wait_for(&shared.timer_cv, &mut inner, Duration::from_nanos(at - now));
                }
            }
        }
    }
}
