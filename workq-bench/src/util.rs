//! What the workloads share: keys, a runtime for async consumers, timing and statistics
//! helpers, and a description of the machine.
//!
//! Keys are `Arc<str>`, shaped like controller keys (`"ns-<i>/name-<j>"`) and built before
//! any timing starts. An `Arc<str>` clones with one atomic increment, as cheap as copying a
//! Go string header, so neither the queue nor a reference pays for copying key bytes; every
//! implementation receives the same clones.

use std::fmt;
use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::thread::ScopedJoinHandle;
use std::time::{Duration, Instant};

use workq::WorkQueue;

/// An error as the bench reports it: its message.
pub(crate) fn text(e: impl fmt::Display) -> String {
    e.to_string()
}

/// The item type of every workload.
pub(crate) type Key = Arc<str>;

/// The key of index `index`: `"ns-<index / 1000>/name-<index % 1000>"`.
pub(crate) fn key(index: usize) -> Key {
    Arc::from(format!("ns-{}/name-{}", index / 1000, index % 1000))
}

/// Keys `0..n`.
pub(crate) fn keys(n: usize) -> Vec<Key> {
    let mut keys = Vec::with_capacity(n);
    keys.extend((0..n).map(key));
    keys
}

/// The index a key was built from ([`key`] inverted). Panics on a key of another shape.
pub(crate) fn key_index(key: &str) -> usize {
    let rest = key.strip_prefix("ns-").expect("a bench key");
    let (ns, name) = rest.split_once("/name-").expect("a bench key");
    let ns: usize = ns.parse().expect("a bench key");
    let name: usize = name.parse().expect("a bench key");
    ns * 1000 + name
}

/// A tokio multi-thread runtime with as many workers as cores, for async consumers.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Waits at `barrier` with the other threads of a run, then reads the clock.
///
/// Every thread of a run reads its own start time this way and the run starts at the
/// earliest: a thread that merely waits for the others (the bench's main thread) may be
/// scheduled long after they have started, or finished, on a busy machine.
pub(crate) fn go(barrier: &Barrier) -> Instant {
    barrier.wait();
    Instant::now()
}

/// When a run started and ended, gathered from its threads: from the earliest start to
/// the latest end.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    pub(crate) start: Instant,
    pub(crate) end: Instant,
}

impl Span {
    pub(crate) fn new(start: Instant, end: Instant) -> Self {
        Self { start, end }
    }

    /// A span that is only a start (a thread whose end does not count).
    pub(crate) fn starting(start: Instant) -> Self {
        Self { start, end: start }
    }

    /// The span covering both.
    pub(crate) fn merge(self, other: Span) -> Span {
        Span {
            start: self.start.min(other.start),
            end: self.end.max(other.end),
        }
    }

    pub(crate) fn elapsed(&self) -> Duration {
        self.end.saturating_duration_since(self.start)
    }
}

/// `count` per second of `elapsed`.
/// Gets and drops leases until `queue` is shut down and empty; returns how many it got.
pub(crate) fn drain_blocking(queue: &WorkQueue<Key>) -> usize {
    let mut seen = 0;
    while let Some(lease) = queue.blocking_get() {
        black_box(&*lease);
        seen += 1;
    }
    seen
}

/// [`drain_blocking`] for an async consumer.
pub(crate) async fn drain_async(queue: &WorkQueue<Key>) -> usize {
    let mut seen = 0;
    while let Some(lease) = queue.get().await {
        black_box(&*lease);
        seen += 1;
    }
    seen
}

/// Joins producer threads; returns the span from the first one's start to the last one's
/// end.
pub(crate) fn join_producers(producers: Vec<ScopedJoinHandle<'_, Span>>) -> Span {
    producers
        .into_iter()
        .map(|p| p.join().expect("producer"))
        .reduce(Span::merge)
        .expect("producers")
}

pub(crate) fn rate(count: usize, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64().max(1e-9)
}

/// The `q`-quantile (0..=1) of sorted values, nearest rank.
pub(crate) fn quantile(sorted: &[i64], q: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The median of `values` (the mean of the middle two for an even count).
pub(crate) fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The machine a run was taken on, as docs/bench-workloads.md asks reports to say.
pub(crate) struct Machine {
    /// Cores the process may use.
    pub(crate) cores: usize,
    /// The CPU's model name.
    pub(crate) cpu: String,
    /// The 1-minute load average when the run started.
    pub(crate) load: Option<f64>,
    /// The day the run started, `YYYY-MM-DD` (UTC).
    pub(crate) date: String,
}

impl Machine {
    pub(crate) fn detect() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|info| {
                info.lines()
                    .find(|line| line.starts_with("model name"))
                    .and_then(|line| line.split_once(':'))
                    .map(|(_, model)| model.trim().to_owned())
            })
            .unwrap_or_else(|| std::env::consts::ARCH.to_owned());
        let load = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok());
        let date = jiff::Timestamp::now().strftime("%Y-%m-%d").to_string();
        Self {
            cores,
            cpu,
            load,
            date,
        }
    }
}

impl fmt::Display for Machine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} cores, {}", self.cores, self.cpu)?;
        if let Some(load) = self.load {
            write!(f, ", load average {load:.2}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        for i in [0, 1, 999, 1000, 123_456, 999_999, 1_500_000] {
            assert_eq!(key_index(&key(i)), i);
        }
        assert_eq!(&*key(1234), "ns-1/name-234");
    }

    #[test]
    fn quantiles_and_median() {
        let v: Vec<i64> = (1..=100).collect();
        assert_eq!(quantile(&v, 0.5), 50);
        assert_eq!(quantile(&v, 0.99), 99);
        assert_eq!(quantile(&v, 1.0), 100);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
