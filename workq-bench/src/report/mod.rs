//! Figures: what workloads measure ([`Sample`]), their medians over runs ([`Figure`]), and
//! the ways of printing them: the table of a run in memory or beside one reference
//! (`table`), the tables of `--compare`, one per backend with a column per implementation
//! (`compare`), JSON lines (`json`), and the goals shown beside our figures (`goals`).

use std::collections::HashMap;

use crate::util::median;

pub(crate) mod compare;
mod goals;
pub(crate) mod json;
pub(crate) mod table;

/// Our implementation with blocking (thread) consumers.
pub(crate) const OURS: &str = "workq";
/// Our implementation with async consumers on a tokio multi-thread runtime.
pub(crate) const OURS_ASYNC: &str = "workq-async";
/// Our queue on Redis (crate `workq-redis`), with `wq-bench --redis URL`.
pub(crate) const OURS_REDIS: &str = "workq-redis";
/// workq-redis with a consumer that completes and takes items in batches.
pub(crate) const OURS_REDIS_BATCH: &str = "workq-redis-batch";
/// BullMQ (node) on the same Redis server.
pub(crate) const BULLMQ: &str = "bullmq";
/// BullMQ's Rust crate on the same Redis server, with `--compare`.
pub(crate) const BULLMQ_OFFICIAL: &str = "bullmq-official";
/// apalis with its Redis storage on the same Redis server, with `--compare`.
pub(crate) const APALIS_REDIS: &str = "apalis-redis";
/// Our queue on PostgreSQL (crate `workq-postgres`), with `wq-bench --postgres URL`.
pub(crate) const OURS_POSTGRES: &str = "workq-postgres";
/// workq-postgres with a consumer that completes and takes items in batches.
pub(crate) const OURS_POSTGRES_BATCH: &str = "workq-postgres-batch";
/// pg-boss (node) on the same database.
pub(crate) const PGBOSS: &str = "pg-boss";
/// River's Rust crate on the same database, with `--compare`.
pub(crate) const RIVERQUEUE: &str = "riverqueue";
/// apalis with its PostgreSQL storage on the same database, with `--compare`.
pub(crate) const APALIS_POSTGRES: &str = "apalis-postgres";
/// W8's in-memory queue without groups (the reference: one FIFO order).
pub(crate) const OURS_FIFO: &str = "workq-fifo";
/// W8's in-memory queue with groups and limits per group and in all.
pub(crate) const OURS_LIMITED: &str = "workq-limited";
/// W8 on Redis without groups.
pub(crate) const OURS_REDIS_FIFO: &str = "workq-redis-fifo";
/// W8 on Redis with groups and limits.
pub(crate) const OURS_REDIS_LIMITED: &str = "workq-redis-limited";
/// W8 on PostgreSQL without groups.
pub(crate) const OURS_POSTGRES_FIFO: &str = "workq-postgres-fifo";
/// W8 on PostgreSQL with groups and limits.
pub(crate) const OURS_POSTGRES_LIMITED: &str = "workq-postgres-limited";
/// One thread, no locks, `VecDeque` + hash sets (the first practical limit of
/// docs/bench-workloads.md).
pub(crate) const LIMIT: &str = "limit-single-thread";
/// One thread, no locks, the same keys added to a hash set and a `VecDeque` first and then
/// drained: what holding the whole backlog costs, beside W1.
pub(crate) const LIMIT_FILL_DRAIN: &str = "limit-fill-drain";
/// An unbounded crossbeam channel (the second practical limit of docs/bench-workloads.md).
pub(crate) const CROSSBEAM: &str = "crossbeam-channel";
/// tokio-util's `DelayQueue` owned by one task.
pub(crate) const DELAY_QUEUE: &str = "tokio-util-delayqueue";

/// Every metric a figure may have (docs/bench-workloads.md's names; P1's `cycles_per_s`; W7's
/// pickup; W3R's delivery rate; P2-P4's add latency and time per operation).
pub(crate) const METRICS: &[&str] = &[
    "items_per_s",
    "cycles_per_s",
    "adds_per_s",
    "deliveries",
    "deliveries_per_s",
    "add_after_per_s",
    "lateness_p50_ms",
    "lateness_p99_ms",
    "lateness_max_ms",
    "early_max_ms",
    "wall_s",
    "requeues",
    "bytes_per_item",
    "bytes_per_delayed_item",
    "pickup_p50_ms",
    "pickup_p99_ms",
    "pickup_max_ms",
    "add_p50_us",
    "add_p99_us",
    "add_max_us",
    "us_per_op",
    "worker_cycles_per_s",
    "quiet_pickup_p50_ms",
    "quiet_pickup_p99_ms",
    "quiet_pickup_max_ms",
    "noisy_items_per_s",
    "max_group_in_flight",
    "max_leases_held",
];

/// Whether a higher value of `metric` is better (rates: `Some(true)`) or a lower one (times,
/// latencies, bytes: `Some(false)`); `None` for counts, which are neither (W3's deliveries
/// are fewer with a dedup that drops adds, more with one that keeps them).
pub(crate) fn higher_is_better(metric: &str) -> Option<bool> {
    if crate::profile::metrics::is_profile_metric(metric) {
        Some(false)
    } else if metric.ends_with("_per_s") {
        Some(true)
    } else if metric.ends_with("_ms")
        || metric.ends_with("_us")
        || metric.ends_with("_s")
        || metric == "us_per_op"
        || metric.starts_with("bytes")
    {
        Some(false)
    } else {
        None
    }
}

/// The shape of a fleet workload's run (W7): how many worker processes, how many workers
/// (`Workers::count`, a reference's concurrency) in each, and how long the handler sleeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Shape {
    pub(crate) processes: u32,
    pub(crate) workers: u32,
    pub(crate) handler_ms: u32,
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}p x {}w, {} ms",
            self.processes, self.workers, self.handler_ms
        )
    }
}

/// One number measured once: `value` of `metric` for implementation `imp` in `workload`
/// (at `shape`, for a fleet workload), or why `imp` cannot run the workload.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    pub(crate) workload: &'static str,
    pub(crate) imp: &'static str,
    pub(crate) metric: &'static str,
    pub(crate) value: f64,
    pub(crate) shape: Option<Shape>,
    /// Why there is no value: the implementation cannot run the workload, or (`failed`) its
    /// run failed.
    pub(crate) na: Option<String>,
    /// The run failed (`na` says how): not a workload the implementation cannot run.
    pub(crate) failed: bool,
}

impl Sample {
    pub(crate) fn new(
        workload: &'static str,
        imp: &'static str,
        metric: &'static str,
        value: f64,
    ) -> Self {
        Self {
            workload,
            imp,
            metric,
            value,
            shape: None,
            na: None,
            failed: false,
        }
    }

    /// No value: `imp` cannot run `workload`, for `reason`.
    pub(crate) fn not_applicable(
        workload: &'static str,
        imp: &'static str,
        metric: &'static str,
        reason: &str,
    ) -> Self {
        Self {
            na: Some(reason.to_owned()),
            ..Self::new(workload, imp, metric, f64::NAN)
        }
    }

    /// No value: `imp`'s run of `workload` failed, with `error`.
    pub(crate) fn failed(
        workload: &'static str,
        imp: &'static str,
        metric: &'static str,
        error: &str,
    ) -> Self {
        Self {
            failed: true,
            ..Self::not_applicable(workload, imp, metric, error)
        }
    }

    /// The same sample, taken at `shape`.
    pub(crate) fn at(mut self, shape: Shape) -> Self {
        self.shape = Some(shape);
        self
    }
}

/// One figure of the report: the median of a sample over the runs (or why there is none).
#[derive(Debug, Clone)]
pub(crate) struct Figure {
    pub(crate) workload: &'static str,
    pub(crate) imp: &'static str,
    pub(crate) metric: &'static str,
    pub(crate) shape: Option<Shape>,
    pub(crate) median: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
    pub(crate) runs: usize,
    /// Why there is no value.
    pub(crate) na: Option<String>,
    /// Every run failed (`na` has the first run's error), or, with a value, how many of the
    /// runs failed and the first error (the value is the median of the others).
    pub(crate) failed: Option<(usize, String)>,
}

/// The key samples are grouped by.
type FigureKey = (&'static str, &'static str, &'static str, Option<Shape>);

/// What the runs of one figure gave: values, why it is not applicable, failed runs.
#[derive(Default)]
struct Runs {
    values: Vec<f64>,
    na: Option<String>,
    failed: Option<(usize, String)>,
}

/// Groups samples by (workload, implementation, metric, shape), in the order they first
/// appear. A figure any run of which was not applicable is not applicable; the runs that
/// failed are left out of the median and counted, and a figure all of whose runs failed has
/// no value (`na`, the first error, and `failed`).
pub(crate) fn aggregate(samples: &[Sample]) -> Vec<Figure> {
    let mut order: Vec<FigureKey> = Vec::new();
    let mut values: HashMap<FigureKey, Runs> = HashMap::new();
    for s in samples {
        let key = (s.workload, s.imp, s.metric, s.shape);
        let entry = values.entry(key).or_insert_with(|| {
            order.push(key);
            Runs::default()
        });
        match &s.na {
            Some(error) if s.failed => match &mut entry.failed {
                Some((n, _)) => *n += 1,
                None => entry.failed = Some((1, error.clone())),
            },
            Some(reason) => entry.na = Some(reason.clone()),
            None => entry.values.push(s.value),
        }
    }
    order
        .into_iter()
        .map(|key| {
            let Runs {
                values: mut v,
                mut na,
                mut failed,
            } = values.remove(&key).unwrap_or_default();
            if na.is_some() {
                // Not applicable: a failure of the same is beside the point.
                failed = None;
            } else if v.is_empty() {
                na = failed.as_ref().map(|(_, error)| error.clone());
            }
            let min = v.iter().copied().fold(f64::INFINITY, f64::min);
            let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let runs = v.len();
            let median = if na.is_some() {
                f64::NAN
            } else {
                median(&mut v)
            };
            Figure {
                workload: key.0,
                imp: key.1,
                metric: key.2,
                shape: key.3,
                median,
                min,
                max,
                runs,
                na,
                failed,
            }
        })
        .collect()
}

/// A figure's name in the tables.
pub(crate) fn metric_label(metric: &str) -> &str {
    match metric {
        "items_per_s" => "items/s",
        "adds_per_s" => "adds/s",
        "add_after_per_s" => "add_after/s",
        "cycles_per_s" => "cycles/s",
        "deliveries_per_s" => "deliveries/s",
        "lateness_p50_ms" => "lateness p50",
        "lateness_p99_ms" => "lateness p99",
        "lateness_max_ms" => "lateness max",
        "early_max_ms" => "early max",
        "wall_s" => "wall",
        "bytes_per_item" => "bytes/item",
        "bytes_per_delayed_item" => "bytes/delayed item",
        "pickup_p50_ms" => "pickup p50",
        "pickup_p99_ms" => "pickup p99",
        "pickup_max_ms" => "pickup max",
        "add_p50_us" => "add p50",
        "add_p99_us" => "add p99",
        "add_max_us" => "add max",
        "us_per_op" => "time/op",
        "worker_cycles_per_s" => "worker cycles/s",
        "quiet_pickup_p50_ms" => "quiet pickup p50",
        "quiet_pickup_p99_ms" => "quiet pickup p99",
        "quiet_pickup_max_ms" => "quiet pickup max",
        "noisy_items_per_s" => "noisy group's items/s",
        "max_group_in_flight" => "most of one group at once",
        "max_leases_held" => "most leases at once",
        other => crate::profile::metrics::label(other),
    }
}

/// A value with its unit.
pub(crate) fn format_value(metric: &str, v: f64) -> String {
    if !v.is_finite() {
        return "-".to_owned();
    }
    if let Some(text) = crate::profile::metrics::format_value(metric, v) {
        return text;
    }
    if metric.ends_with("_per_s") {
        if v >= 1e6 {
            format!("{:.2} M/s", v / 1e6)
        } else {
            format!("{:.1} k/s", v / 1e3)
        }
    } else if metric.ends_with("_ms") {
        format!("{v:.3} ms")
    } else if metric.ends_with("_us") || metric == "us_per_op" {
        format!("{v:.2} us")
    } else if metric.ends_with("_s") {
        format!("{v:.3} s")
    } else if metric.starts_with("bytes") {
        format!("{v:.1} B")
    } else {
        format!("{v:.0}")
    }
}

/// Whether `imp` is one of ours (W8's queues without groups are the references of those
/// with them, so they are not).
pub(crate) fn is_ours(imp: &str) -> bool {
    [
        OURS,
        OURS_ASYNC,
        OURS_LIMITED,
        OURS_REDIS,
        OURS_REDIS_BATCH,
        OURS_REDIS_LIMITED,
        OURS_POSTGRES,
        OURS_POSTGRES_BATCH,
        OURS_POSTGRES_LIMITED,
    ]
    .contains(&imp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_medians_and_a_not_applicable_run_makes_the_figure_not_applicable() {
        let samples = [
            Sample::new("W1", OURS, "items_per_s", 3.0),
            Sample::new("W1", OURS, "items_per_s", 1.0),
            Sample::new("W1", OURS, "items_per_s", 2.0),
            Sample::not_applicable("W3", APALIS_POSTGRES, "adds_per_s", "no dedup"),
        ];
        let figures = aggregate(&samples);
        assert_eq!(figures.len(), 2);
        assert_eq!(
            (figures[0].median, figures[0].min, figures[0].max),
            (2.0, 1.0, 3.0)
        );
        assert_eq!(figures[0].runs, 3);
        assert_eq!(figures[1].na.as_deref(), Some("no dedup"));
        assert!(figures[1].median.is_nan());
    }

    #[test]
    fn values_carry_their_units() {
        assert_eq!(format_value("items_per_s", 2_500_000.0), "2.50 M/s");
        assert_eq!(format_value("adds_per_s", 12_345.0), "12.3 k/s");
        assert_eq!(format_value("add_p99_us", 3.456), "3.46 us");
        assert_eq!(format_value("lateness_p99_ms", 1.5), "1.500 ms");
        assert_eq!(format_value("wall_s", 2.0), "2.000 s");
        assert_eq!(format_value("deliveries", 1234.4), "1234");
        assert_eq!(higher_is_better("deliveries_per_s"), Some(true));
        assert_eq!(higher_is_better("pickup_p99_ms"), Some(false));
        assert_eq!(higher_is_better("deliveries"), None);
    }
}
