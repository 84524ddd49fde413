//! Per-slot timestamps for the metrics: when an item became dirty and when it was handed
//! out. Kept only by queues that report metrics.

use std::hash::{BuildHasher, Hash};

use super::State;

/// Per-slot timestamps for metrics, kept only for queues that report metrics.
#[derive(Debug, Default)]
pub(super) struct Times {
    /// When the item in a slot last became dirty; [`UNSET`] after it is handed out.
    pub(super) added: Vec<u64>,
    /// When the item in a slot was handed out; [`UNSET`] when it is not processing.
    pub(super) started: Vec<u64>,
}

/// Marks an empty timestamp.
pub(super) const UNSET: u64 = u64::MAX;

impl Times {
    pub(super) fn slot(vec: &mut Vec<u64>, slot: u32) -> &mut u64 {
        let slot = slot as usize;
        if slot >= vec.len() {
            vec.resize((slot + 1).next_power_of_two(), UNSET);
        }
        &mut vec[slot]
    }

    pub(super) fn mark_added(&mut self, slot: u32, at: u64) {
        let added = Self::slot(&mut self.added, slot);
        if *added == UNSET {
            *added = at;
        }
    }
}

impl<T: Eq + Hash + Clone, S: BuildHasher> State<T, S> {
    /// Starts keeping the timestamps metrics need (add, get and done times per item).
    pub(crate) fn enable_times(&mut self) {
        self.times.get_or_insert_with(Box::default);
    }

    /// Items being processed, the sum of their processing times and the longest one, at
    /// `now` (client-go's unfinished work and longest running processor).
    pub(crate) fn in_flight(&self, now: u64) -> (usize, u128, u64) {
        let Some(times) = &self.times else {
            return (self.processing, 0, 0);
        };
        let mut sum = 0u128;
        let mut longest = 0u64;
        for &started in times.started.iter().filter(|&&t| t != UNSET) {
            let age = now.saturating_sub(started);
            sum += u128::from(age);
            longest = longest.max(age);
        }
        (self.processing, sum, longest)
    }
}
