//! loom models of the lock and wake-up layer: one scenario per rule, 2-3 threads, 1-3 items.
//!
//! Compiled only with `--cfg loom`, when `crate::sync` hands the queue loom's mutex, atomics
//! and thread parking, so loom explores every interleaving of the queue's critical sections,
//! parks and wake-ups (bounded by `LOOM_MAX_PREEMPTIONS`). A lost wake-up shows up as a
//! deadlock, which loom reports as a failure. Run them with (see TESTING.md):
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p workq --lib --release loom_
//! ```
//!
//! loom cannot model time, so no model uses the real clock's delays: the ones that need a
//! delay run on a [`FakeClock`](crate::clock::FakeClock), which promotes due items inside
//! `step` and never starts the timer thread.
//!
//! Bookkeeping that only the assertions read (who holds an item) uses `std` atomics: loom
//! runs one model thread at a time, so they need no modelling.

mod loom_flow;
mod loom_lease;
mod loom_queue;
mod loom_shutdown;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts the holders of each of a few small `u32` items, to prove that no item is ever in
/// two workers' hands at once.
#[derive(Clone, Default)]
struct InFlight(Arc<[AtomicUsize; 4]>);

impl InFlight {
    /// Records that the caller now holds `item`; fails if someone else already does.
    fn enter(&self, item: u32) {
        let before = self.0[item as usize].fetch_add(1, Ordering::SeqCst);
        assert_eq!(before, 0, "item {item} handed to two workers at once");
    }

    /// Records that the caller is about to drop its lease on `item`.
    fn leave(&self, item: u32) {
        self.0[item as usize].fetch_sub(1, Ordering::SeqCst);
    }
}
