//! The charts' samples, kept in memory and bounded whatever the number of queues: each
//! source's totals always, and the samples of at most [`Config::history_queues`] queues,
//! the ones the page looked at most recently first, each at most a [`Config::keep`] long.
//!
//! [`Config::history_queues`]: crate::Config::history_queues
//! [`Config::keep`]: crate::Config::keep

use std::collections::{BTreeMap, HashMap, VecDeque};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use workq::admin::QueueSummary;

/// The most samples kept per series, whatever `keep / sample_every` says.
const MAX_SAMPLES: usize = 2_000;

/// One sample of a queue's figures (or of a source's totals) for the charts.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Sample {
    /// When, in milliseconds since the Unix epoch.
    pub t: u64,
    /// Ready items.
    pub depth: u64,
    /// Items under a lease.
    pub in_flight: u64,
    /// Delayed items.
    pub delayed: u64,
    /// Sum of the failure counts.
    pub failures: u64,
    /// Dead letters.
    pub dead: u64,
    /// [`Counters::adds`](workq::admin::Counters::adds), where the backend counts.
    pub adds: Option<u64>,
    /// [`Counters::completions`](workq::admin::Counters::completions), where the backend
    /// counts.
    pub completions: Option<u64>,
    /// [`Counters::retries`](workq::admin::Counters::retries), where the backend counts.
    pub retries: Option<u64>,
}

impl Sample {
    fn of(t: u64, q: &QueueSummary) -> Self {
        Sample {
            t,
            depth: q.depth,
            in_flight: q.in_flight,
            delayed: q.delayed,
            failures: q.failures,
            dead: q.dead,
            adds: q.counters.map(|c| c.adds),
            completions: q.counters.map(|c| c.completions),
            retries: q.counters.map(|c| c.retries),
        }
    }

    /// The sum of the figures of `queues` (the broken ones count nothing).
    fn total(t: u64, queues: &[QueueSummary]) -> Self {
        let sum = |f: fn(&QueueSummary) -> Option<u64>| -> Option<u64> {
            let mut any = false;
            let mut total = 0u64;
            for q in queues {
                if let Some(n) = f(q) {
                    any = true;
                    total = total.saturating_add(n);
                }
            }
            any.then_some(total)
        };
        Sample {
            t,
            depth: queues.iter().map(|q| q.depth).sum(),
            in_flight: queues.iter().map(|q| q.in_flight).sum(),
            delayed: queues.iter().map(|q| q.delayed).sum(),
            failures: queues.iter().map(|q| q.failures).sum(),
            dead: queues.iter().map(|q| q.dead).sum(),
            adds: sum(|q| q.counters.map(|c| c.adds)),
            completions: sum(|q| q.counters.map(|c| c.completions)),
            retries: sum(|q| q.counters.map(|c| c.retries)),
        }
    }
}

struct Track {
    samples: VecDeque<Sample>,
    /// When the page last asked for this queue (a tick of [`Inner::tick`]).
    viewed: u64,
}

#[derive(Default)]
struct Inner {
    totals: BTreeMap<String, VecDeque<Sample>>,
    queues: HashMap<(String, String), Track>,
    tick: u64,
}

/// The samples of the charts.
pub(crate) struct History {
    keep_ms: u64,
    max_queues: usize,
    inner: Mutex<Inner>,
}

fn push(samples: &mut VecDeque<Sample>, sample: Sample, keep_ms: u64) {
    samples.push_back(sample);
    while samples.len() > MAX_SAMPLES
        || samples
            .front()
            .is_some_and(|s| s.t.saturating_add(keep_ms) < sample.t)
    {
        samples.pop_front();
    }
}

impl History {
    pub(crate) fn new(keep_ms: u64, max_queues: usize) -> Self {
        History {
            keep_ms,
            max_queues,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Records one listing of source `label` at time `t`.
    pub(crate) fn record(&self, label: &str, t: u64, queues: &[QueueSummary]) {
        let mut inner = self.inner.lock();
        let keep = self.keep_ms;
        push(
            inner.totals.entry(label.to_owned()).or_default(),
            Sample::total(t, queues),
            keep,
        );
        for q in queues.iter().filter(|q| q.broken.is_none()) {
            let key = (label.to_owned(), q.name.clone());
            if let Some(track) = inner.queues.get_mut(&key) {
                push(&mut track.samples, Sample::of(t, q), keep);
            } else if inner.queues.len() < self.max_queues {
                let mut samples = VecDeque::new();
                push(&mut samples, Sample::of(t, q), keep);
                inner.queues.insert(key, Track { samples, viewed: 0 });
            }
        }
        // Queues gone for longer than the charts' span are forgotten.
        inner
            .queues
            .retain(|_, track| track.samples.back().is_some_and(|s| s.t + keep >= t));
    }

    /// The page looks at queue `name` of `label`: keep its samples from now on, in the place
    /// of the queue looked at least recently if the history is full.
    pub(crate) fn view(&self, label: &str, name: &str) {
        let mut inner = self.inner.lock();
        inner.tick += 1;
        let tick = inner.tick;
        let key = (label.to_owned(), name.to_owned());
        if let Some(track) = inner.queues.get_mut(&key) {
            track.viewed = tick;
            return;
        }
        if inner.queues.len() >= self.max_queues {
            let oldest = inner
                .queues
                .iter()
                .min_by_key(|(_, t)| t.viewed)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                inner.queues.remove(&oldest);
            }
        }
        if self.max_queues > 0 {
            inner.queues.insert(
                key,
                Track {
                    samples: VecDeque::new(),
                    viewed: tick,
                },
            );
        }
    }

    /// The samples of one queue after `since`.
    pub(crate) fn queue(&self, label: &str, name: &str, since: u64) -> Vec<Sample> {
        let inner = self.inner.lock();
        inner
            .queues
            .get(&(label.to_owned(), name.to_owned()))
            .map(|t| t.samples.iter().filter(|s| s.t > since).copied().collect())
            .unwrap_or_default()
    }

    /// The totals of every source after `since`.
    pub(crate) fn totals(&self, since: u64) -> BTreeMap<String, Vec<Sample>> {
        let inner = self.inner.lock();
        inner
            .totals
            .iter()
            .map(|(label, s)| {
                (
                    label.clone(),
                    s.iter().filter(|x| x.t > since).copied().collect(),
                )
            })
            .collect()
    }

    /// How many queues have samples kept.
    #[cfg(test)]
    pub(crate) fn tracked(&self) -> usize {
        self.inner.lock().queues.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queues(n: u64) -> Vec<QueueSummary> {
        (0..n)
            .map(|i| {
                let mut q = QueueSummary::named(format!("q{i}"));
                q.depth = i;
                q
            })
            .collect()
    }

    #[test]
    fn the_history_is_bounded_whatever_the_number_of_queues() {
        let history = History::new(60_000, 10);
        let many = queues(1_000);
        for t in 0..5_000u64 {
            history.record("redis", t * 1_000, &many);
        }
        assert_eq!(history.tracked(), 10);
        let totals = history.totals(0);
        let kept = &totals["redis"];
        assert!(kept.len() <= 61, "a minute of samples: {}", kept.len());
        assert_eq!(kept.last().unwrap().depth, (0..1_000).sum::<u64>());
        assert!(history.queue("redis", "q5", 0).len() <= 61);
        assert!(history.queue("redis", "q500", 0).is_empty(), "not tracked");
    }

    #[test]
    fn a_viewed_queue_takes_the_place_of_the_one_looked_at_least_recently() {
        let history = History::new(60_000, 2);
        let many = queues(5);
        history.record("redis", 1_000, &many);
        history.view("redis", "q0");
        history.view("redis", "q4");
        history.record("redis", 2_000, &many);
        assert!(history.queue("redis", "q1", 0).is_empty(), "evicted");
        assert_eq!(history.queue("redis", "q4", 0).len(), 1);
        assert_eq!(history.queue("redis", "q0", 0).len(), 2);
        assert_eq!(history.tracked(), 2);
    }
}
