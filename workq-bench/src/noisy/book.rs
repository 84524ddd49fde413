//! W8's own bookkeeping ([`Book`]): every hand-out and every end of a lease, as the bench's
//! handle on the queue sees them ([`super::counted`]), with the leases each group holds, the
//! limits checked at every hand-out, and the times the figures are made of.
//!
//! A lease counts from the moment a call that handed it out returned, to the moment a call
//! that ends it (a `done`, a step's `done`, a release, a drop) was made: a window inside the
//! one the queue itself holds the lease for (it handed the lease out before the call
//! returned, and frees its slot only once the end arrives). So the bench's counts are never
//! above the queue's own, and a count above a limit is a real excess, not an artefact of the
//! bookkeeping.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use workq::clock::{Clock, RealClock};

use super::shape::{Limits, group_of, quiet_index};

/// What a phase measured, from its [`Book`].
#[derive(Debug)]
pub(crate) struct Measured {
    /// Each quiet item's pickup (its hand-out minus its add's acknowledgement, at least 0),
    /// sorted, in ns.
    pub(crate) quiet_pickup_ns: Vec<i64>,
    /// Every item, from the burst's first add to the last `done`.
    pub(crate) items_per_s: f64,
    /// The noisy group's items, from the burst's first add to its last `done`.
    pub(crate) noisy_items_per_s: f64,
    /// The most leases one group held at once.
    pub(crate) most_of_one_group: usize,
    /// The most leases held at once, in all.
    pub(crate) most_in_all: usize,
}

impl Measured {
    /// The `q`-quantile of the quiet items' pickup, in ms.
    pub(crate) fn quiet_pickup_ms(&self, q: f64) -> f64 {
        crate::util::quantile(&self.quiet_pickup_ns, q) as f64 / 1e6
    }
}

/// The leases held now, and the most ever held.
#[derive(Debug, Default)]
struct Held {
    /// Leases held, by group (a group holding none is not in it).
    per_group: HashMap<String, usize>,
    total: usize,
    most_of_one_group: usize,
    most_in_all: usize,
    /// The first excess over a limit, said for the report.
    excess: Option<String>,
}

/// The bookkeeping of one W8 phase. Times are nanoseconds since the phase's start (the
/// burst's first add), 0 meaning "not yet".
pub(crate) struct Book {
    clock: Arc<dyn Clock>,
    start: Instant,
    limits: Option<Limits>,
    noisy: usize,
    held: Mutex<Held>,
    /// When each quiet item's add was acknowledged.
    quiet_acked: Box<[AtomicU64]>,
    /// When each quiet item was first handed out.
    quiet_handed: Box<[AtomicU64]>,
    /// Items whose `done` was acknowledged.
    completed: AtomicUsize,
    last_done: AtomicU64,
    last_noisy_done: AtomicU64,
}

impl Book {
    /// The book of a phase with `noisy` noisy items and `quiet` quiet ones, held to `limits`
    /// (none: nothing to check); its clock starts now.
    pub(crate) fn new(noisy: usize, quiet: usize, limits: Option<Limits>) -> Self {
        Self::on(Arc::new(RealClock), noisy, quiet, limits)
    }

    /// [`new`](Self::new) on `clock`.
    fn on(clock: Arc<dyn Clock>, noisy: usize, quiet: usize, limits: Option<Limits>) -> Self {
        let zeros = || (0..quiet).map(|_| AtomicU64::new(0)).collect();
        Self {
            start: clock.now(),
            clock,
            limits,
            noisy,
            held: Mutex::new(Held::default()),
            quiet_acked: zeros(),
            quiet_handed: zeros(),
            completed: AtomicUsize::new(0),
            last_done: AtomicU64::new(0),
            last_noisy_done: AtomicU64::new(0),
        }
    }

    /// Now, on the phase's clock (at least 1, so that 0 stays "not yet").
    fn now(&self) -> u64 {
        u64::try_from(self.clock.now().duration_since(self.start).as_nanos())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The queue handed `item` out: one more lease for its group, checked against the
    /// limits.
    pub(crate) fn handed_out(&self, item: &str) {
        let now = self.now();
        if let Some(slot) = quiet_index(item).and_then(|i| self.quiet_handed.get(i)) {
            // The first hand-out is the pickup (an item is handed out again only after a
            // lease was lost or released).
            let _ = slot.compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        }
        let group = group_of(item);
        let mut held = self.held();
        let count = match held.per_group.get_mut(group) {
            Some(count) => {
                *count += 1;
                *count
            }
            None => {
                held.per_group.insert(group.to_owned(), 1);
                1
            }
        };
        held.total += 1;
        held.most_of_one_group = held.most_of_one_group.max(count);
        held.most_in_all = held.most_in_all.max(held.total);
        if held.excess.is_none()
            && let Some(limits) = self.limits
        {
            if count > limits.per_group {
                held.excess = Some(format!(
                    "group {group:?} held {count} leases at once (limit {}), {:.3} s into the \
                     phase",
                    limits.per_group,
                    now as f64 / 1e9
                ));
            } else if held.total > limits.total {
                held.excess = Some(format!(
                    "{} leases were held at once (limit {}), {:.3} s into the phase",
                    held.total,
                    limits.total,
                    now as f64 / 1e9
                ));
            }
        }
    }

    /// A call to end the lease of `item` is being made: its group holds one lease fewer.
    pub(crate) fn ending(&self, item: &str) {
        let group = group_of(item);
        let mut held = self.held();
        if let Some(count) = held.per_group.get_mut(group) {
            *count -= 1;
            if *count == 0 {
                held.per_group.remove(group);
            }
            held.total -= 1;
        }
    }

    /// The queue acknowledged the `done` of `item`.
    pub(crate) fn completed(&self, item: &str) {
        let now = self.now();
        self.last_done.fetch_max(now, Ordering::Relaxed);
        if quiet_index(item).is_none() {
            self.last_noisy_done.fetch_max(now, Ordering::Relaxed);
        }
        self.completed.fetch_add(1, Ordering::Release);
    }

    /// The queue acknowledged the adds of quiet items `from..to`.
    pub(crate) fn acknowledged(&self, from: usize, to: usize) {
        let now = self.now();
        for slot in self.quiet_acked.get(from..to).unwrap_or_default() {
            slot.store(now, Ordering::Relaxed);
        }
    }

    /// Leases held now, in all.
    #[cfg(test)]
    pub(crate) fn held_now(&self) -> usize {
        self.held().total
    }

    /// Items whose `done` was acknowledged so far.
    pub(crate) fn completed_count(&self) -> usize {
        self.completed.load(Ordering::Acquire)
    }

    /// The figures once every item is done; `Err` if a limit was exceeded (the run fails:
    /// the bench checks the limits rather than assuming them) or a quiet item was never
    /// handed out.
    pub(crate) fn figures(&self) -> Result<Measured, String> {
        let held = self.held();
        if let Some(excess) = &held.excess {
            return Err(format!("limits exceeded: {excess}"));
        }
        let mut quiet_pickup_ns = Vec::with_capacity(self.quiet_handed.len());
        for (acked, handed) in self.quiet_acked.iter().zip(self.quiet_handed.iter()) {
            let (acked, handed) = (
                acked.load(Ordering::Relaxed),
                handed.load(Ordering::Relaxed),
            );
            if handed == 0 {
                let missing = self
                    .quiet_handed
                    .iter()
                    .filter(|h| h.load(Ordering::Relaxed) == 0)
                    .count();
                return Err(format!(
                    "{missing} of {} quiet items were never handed out",
                    self.quiet_handed.len()
                ));
            }
            // Handed out before the add's acknowledgement reached the producer: 0.
            quiet_pickup_ns.push(i64::try_from(handed.saturating_sub(acked)).unwrap_or(i64::MAX));
        }
        quiet_pickup_ns.sort_unstable();
        let per_s = |count: usize, ns: &AtomicU64| {
            count as f64 / (ns.load(Ordering::Relaxed).max(1) as f64 / 1e9)
        };
        Ok(Measured {
            quiet_pickup_ns,
            items_per_s: per_s(self.noisy + self.quiet_handed.len(), &self.last_done),
            noisy_items_per_s: per_s(self.noisy, &self.last_noisy_done),
            most_of_one_group: held.most_of_one_group,
            most_in_all: held.most_in_all,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use workq::clock::FakeClock;

    use super::*;
    use crate::noisy::shape::{noisy_item, quiet_item};

    const LIMITS: Limits = Limits {
        per_group: 2,
        total: 3,
    };

    #[test]
    fn a_group_over_its_limit_fails_the_phase_naming_the_group() {
        let book = Book::new(3, 0, Some(LIMITS));
        book.handed_out(&noisy_item(0));
        book.handed_out(&noisy_item(1));
        // A lease whose end is on its way frees its slot in the book at once.
        book.ending(&noisy_item(0));
        book.handed_out(&noisy_item(2));
        assert!(book.figures().is_ok());
        book.handed_out(&noisy_item(0));
        let error = book.figures().unwrap_err();
        assert!(
            error.contains("limits exceeded") && error.contains("\"noisy\" held 3"),
            "{error}"
        );
    }

    #[test]
    fn the_leases_in_all_over_the_limit_fail_the_phase() {
        let book = Book::new(2, 2, Some(LIMITS));
        for item in [noisy_item(0), noisy_item(1), quiet_item(0)] {
            book.handed_out(&item);
        }
        assert!(book.figures().is_err_and(|e| e.contains("never handed")));
        book.handed_out(&quiet_item(1));
        let error = book.figures().unwrap_err();
        assert!(
            error.contains("4 leases were held at once (limit 3)"),
            "{error}"
        );
    }

    #[test]
    fn without_limits_the_most_held_is_counted_but_not_judged() {
        let book = Book::new(5, 0, None);
        for i in 0..5 {
            book.handed_out(&noisy_item(i));
        }
        for i in 0..5 {
            book.ending(&noisy_item(i));
            book.completed(&noisy_item(i));
        }
        let measured = book.figures().unwrap();
        assert_eq!((measured.most_of_one_group, measured.most_in_all), (5, 5));
        assert_eq!(book.completed_count(), 5);
        assert!(measured.items_per_s > 0.0);
    }

    #[test]
    fn a_quiet_pickup_runs_from_the_acknowledgement_to_the_first_hand_out() {
        let clock = FakeClock::new();
        let book = Book::on(Arc::new(clock.clone()), 1, 2, None);
        // Item 0 is handed out before its add's acknowledgement arrives: pickup 0.
        clock.step(Duration::from_millis(1));
        book.handed_out(&quiet_item(0));
        clock.step(Duration::from_millis(1));
        book.acknowledged(0, 2);
        clock.step(Duration::from_millis(3));
        book.handed_out(&quiet_item(1));
        book.ending(&quiet_item(1));
        // A second hand-out of the same item keeps the first time.
        clock.step(Duration::from_millis(5));
        book.handed_out(&quiet_item(1));
        assert_eq!(book.figures().unwrap().quiet_pickup_ns, [0, 3_000_000]);
        // Rates run from the phase's start to the last done: 3 items in 30 ms, the noisy
        // one in 20 ms.
        book.handed_out(&noisy_item(0));
        clock.step(Duration::from_millis(10));
        book.completed(&noisy_item(0));
        clock.step(Duration::from_millis(10));
        book.completed(&quiet_item(0));
        let measured = book.figures().unwrap();
        assert!((measured.items_per_s - 100.0).abs() < 1e-6, "{measured:?}");
        assert!(
            (measured.noisy_items_per_s - 50.0).abs() < 1e-6,
            "{measured:?}"
        );
    }
}
