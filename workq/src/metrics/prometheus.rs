//! Kubernetes' workqueue series on [`prometheus-client`](prometheus_client).
//!
//! [`PrometheusMetrics::new`] registers one collector into your
//! [`Registry`]; every queue built with it (and a
//! name) becomes a `name` label value of these series, with Kubernetes' names, help texts,
//! types and buckets (`k8s.io/component-base/metrics/prometheus/workqueue`):
//!
//! | series | type |
//! | --- | --- |
//! | `workqueue_depth` | gauge |
//! | `workqueue_adds_total` | counter |
//! | `workqueue_queue_duration_seconds` | histogram, buckets 1e-8 ... 10 |
//! | `workqueue_work_duration_seconds` | histogram, buckets 1e-8 ... 10 |
//! | `workqueue_unfinished_work_seconds` | gauge, read at scrape time |
//! | `workqueue_longest_running_processor_seconds` | gauge, read at scrape time |
//! | `workqueue_retries_total` | counter |
//!
//! and two that Kubernetes users have asked for (kubernetes#135543, #138256):
//!
//! | series | type |
//! | --- | --- |
//! | `workqueue_delayed_items` | gauge, read at scrape time: items waiting for a delay |
//! | `workqueue_rate_limiter_delay_seconds` | histogram, buckets 1 ms ... about 17 min: delays the rate limiter handed out |
//!
//! and, for queues with flow control ([`Builder::group_by`](crate::Builder::group_by), limits,
//! hand-out rates), read at scrape time:
//!
//! | series | type |
//! | --- | --- |
//! | `workqueue_groups_ready` | gauge: groups with items waiting to be handed out |
//! | `workqueue_group_saturated` | gauge: groups at their in-flight limit |
//! | `workqueue_group_depth`, `workqueue_group_in_flight` | gauges with a `group` label, for the top N groups only, when asked for ([`PrometheusMetrics::set_group_series`]) |
//!
//! A queue without flow control adds none of these, so Kubernetes' series stay as they are.
//!
//! # Examples
//!
//! ```
//! use prometheus_client::{encoding::text::encode, registry::Registry};
//! use workq::{WorkQueue, metrics::prometheus::PrometheusMetrics};
//!
//! let mut registry = Registry::default();
//! let metrics = PrometheusMetrics::new(&mut registry);
//! let queue = WorkQueue::builder().name("pods").metrics(metrics).build();
//! queue.add("default/web-0");
//!
//! let mut text = String::new();
//! encode(&mut text, &registry).unwrap();
//! assert!(text.contains(r#"workqueue_depth{name="pods"} 1"#));
//! assert!(text.contains(r#"workqueue_adds_total{name="pods"} 1"#));
//! ```
//!
//! # Exposition formats
//!
//! `prometheus-client` writes OpenMetrics text, which Prometheus scrapes as is (serve it as
//! `application/openmetrics-text; version=1.0.0; charset=utf-8`). In it a counter's
//! `# HELP` and `# TYPE` lines name the family (`workqueue_adds`) and the sample carries
//! `_total`. Kubernetes components serve the classic Prometheus text format (version 0.0.4),
//! where those lines name `workqueue_adds_total` too. Choosing a format from the scraper's
//! `Accept` header and writing the classic one are the HTTP server's job: the
//! `metrics_service` example shows one way, rewriting the OpenMetrics text.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::{MetricsProvider, QueueMetrics, QueueProbe};
use crate::stats::{FlowStats, GroupStats, QueueStats};

const DEPTH_HELP: &str = "Current depth of workqueue";
const ADDS_HELP: &str = "Total number of adds handled by workqueue";
const QUEUE_DURATION_HELP: &str =
    "How long in seconds an item stays in workqueue before being requested.";
const WORK_DURATION_HELP: &str = "How long in seconds processing an item from workqueue takes.";
const UNFINISHED_HELP: &str = "How many seconds of work has done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases.";
const LONGEST_HELP: &str =
    "How many seconds has the longest running processor for workqueue been running.";
const RETRIES_HELP: &str = "Total number of retries handled by workqueue";
const DELAYED_HELP: &str = "Current number of items in workqueue waiting for a delay to pass";
const GROUPS_READY_HELP: &str = "Current number of groups with items waiting to be handed out";
const GROUP_SATURATED_HELP: &str = "Current number of groups at their in-flight limit";
const GROUP_DEPTH_HELP: &str =
    "Items waiting to be handed out in the group, for the groups with the most of them";
const GROUP_IN_FLIGHT_HELP: &str =
    "Items of the group being processed, for the groups with the most items waiting";
const RATE_LIMIT_HELP: &str =
    "How long in seconds the rate limiter of workqueue delayed items it was asked about.";

/// Kubernetes' latency buckets: `ExponentialBuckets(10e-9, 10, 10)`, 1e-8 s to 10 s.
fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(10e-9, 10.0, 10)
}

/// Rate limiter delay buckets: 1 ms, 4 ms, ... 4^10 ms (about 17 minutes, beyond the default
/// limiters' 1000 s cap).
fn delay_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.001, 4.0, 11)
}

/// How many distinct priorities a queue's `workqueue_depth` reports by priority before every
/// later one is reported as [`EXCEEDED_CARDINALITY`]: controller-runtime's
/// `maxRecommendedUniquePriorities` (`pkg/internal/metrics/workqueue.go`).
const MAX_PRIORITIES: usize = 25;

/// The `priority` label of depths beyond [`MAX_PRIORITIES`] (controller-runtime's).
const EXCEEDED_CARDINALITY: &str = "exceeded_cardinality_limit";

/// The priorities a queue's depth was reported at, kept so that a priority whose items are
/// gone reads 0 (as a gauge child does), and capped at [`MAX_PRIORITIES`].
#[derive(Default)]
struct Priorities {
    seen: std::collections::BTreeSet<i32>,
    exceeded: bool,
}

/// The series of one queue name.
struct Series {
    name: String,
    /// The priorities its depth was reported at (with the depth by priority on).
    priorities: Mutex<Priorities>,
    depth: AtomicI64,
    adds: AtomicU64,
    retries: AtomicU64,
    queue_duration: Histogram,
    work_duration: Histogram,
    rate_limiter_delay: Histogram,
    /// The newest queue with this name, for the values read at scrape time.
    probe: Mutex<Option<QueueProbe>>,
}

impl Series {
    fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            priorities: Mutex::new(Priorities::default()),
            depth: AtomicI64::new(0),
            adds: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            queue_duration: Histogram::new(latency_buckets()),
            work_duration: Histogram::new(latency_buckets()),
            rate_limiter_delay: Histogram::new(delay_buckets()),
            probe: Mutex::new(None),
        }
    }

    fn stats(&self) -> QueueStats {
        self.probe
            .lock()
            .as_ref()
            .and_then(QueueProbe::stats)
            .unwrap_or_default()
    }

    /// The `workqueue_depth` samples by `priority` label: every priority seen so far (0 when
    /// its items are gone); once more than [`MAX_PRIORITIES`] were seen, the whole depth
    /// under [`EXCEEDED_CARDINALITY`] from then on;
    /// a queue that cannot tell (gone, or another backend's) reports its depth under `""`,
    /// as controller-runtime does for a queue without priorities.
    fn depth_by_priority(&self) -> Vec<(String, i64)> {
        let probe = self.probe.lock().clone();
        let Some(depths) = probe.as_ref().and_then(QueueProbe::depth_by_priority) else {
            return vec![(String::new(), self.depth.load(Ordering::Relaxed))];
        };
        let mut priorities = self.priorities.lock();
        let mut samples: std::collections::BTreeMap<i32, i64> = std::collections::BTreeMap::new();
        let mut total = 0_i64;
        for (priority, count) in depths {
            let count = i64::try_from(count).unwrap_or(i64::MAX);
            total = total.saturating_add(count);
            samples.insert(priority, count);
            if !priorities.exceeded {
                priorities.seen.insert(priority);
                if priorities.seen.len() > MAX_PRIORITIES {
                    priorities.exceeded = true;
                    priorities.seen.clear();
                }
            }
        }
        if priorities.exceeded {
            return vec![(EXCEEDED_CARDINALITY.to_owned(), total)];
        }
        priorities
            .seen
            .iter()
            .rev()
            .map(|priority| {
                (
                    priority.to_string(),
                    samples.get(priority).copied().unwrap_or(0),
                )
            })
            .collect()
    }
}

/// Records into a [`Series`].
struct Recorder(Arc<Series>);

impl QueueMetrics for Recorder {
    fn add(&self) {
        self.0.adds.fetch_add(1, Ordering::Relaxed);
        self.0.depth.fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self, queued_for: Duration) {
        self.0.depth.fetch_sub(1, Ordering::Relaxed);
        self.0.queue_duration.observe(queued_for.as_secs_f64());
    }

    fn done(&self, worked_for: Duration) {
        self.0.work_duration.observe(worked_for.as_secs_f64());
    }

    fn retry(&self) {
        self.0.retries.fetch_add(1, Ordering::Relaxed);
    }

    fn rate_limited(&self, delay: Duration) {
        self.0.rate_limiter_delay.observe(delay.as_secs_f64());
    }
}

/// The queues registered so far; shared by the provider and the collector.
#[derive(Default)]
struct Queues {
    series: Mutex<Vec<Arc<Series>>>,
    /// Whether `workqueue_depth` carries controller-runtime's `priority` label.
    depth_by_priority: std::sync::atomic::AtomicBool,
    /// How many groups per queue get `workqueue_group_depth` / `_in_flight` series (0: none).
    group_series: std::sync::atomic::AtomicUsize,
}

impl fmt::Debug for Queues {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self.series.lock().iter().map(|s| s.name.clone()).collect();
        f.debug_struct("Queues").field("names", &names).finish()
    }
}

/// A [`MetricsProvider`] that exports Kubernetes' workqueue series into a
/// `prometheus-client` registry. See the [module documentation](self).
///
/// Queues with the same name share one set of series, as they do in Kubernetes.
#[derive(Clone, Debug)]
pub struct PrometheusMetrics {
    queues: Arc<Queues>,
}

impl PrometheusMetrics {
    /// Registers the workqueue series in `registry` and returns the provider to pass to
    /// [`Builder::metrics`](crate::Builder::metrics). Call it once per registry.
    pub fn new(registry: &mut Registry) -> Self {
        let queues = Arc::new(Queues::default());
        registry.register_collector(Box::new(WorkqueueCollector(queues.clone())));
        Self { queues }
    }
}

impl PrometheusMetrics {
    /// Gives `workqueue_depth` controller-runtime's `priority` label (its priority queue's
    /// shape, `pkg/controller/priorityqueue/metrics.go` and `pkg/internal/metrics/workqueue.go`):
    /// each queue's depth by the priority its items wait at, every priority seen so far
    /// reported (0 once its items are gone), at most 25 distinct priorities per queue
    /// (beyond, `priority="exceeded_cardinality_limit"`), and `priority=""` for a queue
    /// that cannot tell. Read at each scrape (a walk over the queue's items under its lock).
    ///
    /// Off by default: with it, one queue's depth is several series, so a query or alert on
    /// `workqueue_depth{name="..."}` as one series (client-go's shape, what Kubernetes'
    /// dashboards and alerts use) sees a part of it; `sum by (name)` sees all of it. Turn it
    /// on where controller-runtime's dashboards are used. Takes effect at the next scrape.
    ///
    /// # Examples
    ///
    /// ```
    /// use prometheus_client::{encoding::text::encode, registry::Registry};
    /// use workq::{AddOptions, WorkQueue, metrics::prometheus::PrometheusMetrics};
    ///
    /// let mut registry = Registry::default();
    /// let metrics = PrometheusMetrics::new(&mut registry);
    /// metrics.set_depth_by_priority(true);
    /// let queue = WorkQueue::builder().name("pods").metrics(metrics).build();
    /// queue.add_with("default/listed", AddOptions::default().priority(-100));
    /// queue.add("default/changed");
    ///
    /// let mut text = String::new();
    /// encode(&mut text, &registry).unwrap();
    /// assert!(text.contains(r#"workqueue_depth{name="pods",priority="0"} 1"#));
    /// assert!(text.contains(r#"workqueue_depth{name="pods",priority="-100"} 1"#));
    /// ```
    pub fn set_depth_by_priority(&self, on: bool) {
        self.queues.depth_by_priority.store(on, Ordering::Relaxed);
    }

    /// Reports per-group series for each queue with flow control: `workqueue_group_depth`
    /// (ready items) and `workqueue_group_in_flight` (leases out), labelled `name` and
    /// `group`, for the `top` groups with the most ready items at each scrape (ties: most in
    /// flight, then by name). 0, the default, reports none.
    ///
    /// The number of series stays bounded however many groups a queue sees (namespaces,
    /// tenants): at most `top` per queue and family, and a group that leaves the top N
    /// leaves the scrape. `workqueue_groups_ready` and `workqueue_group_saturated`, one
    /// series per queue, are reported for every queue with flow control whatever this says.
    /// Takes effect at the next scrape.
    ///
    /// # Examples
    ///
    /// ```
    /// use prometheus_client::{encoding::text::encode, registry::Registry};
    /// use workq::{WorkQueue, metrics::prometheus::PrometheusMetrics};
    ///
    /// let mut registry = Registry::default();
    /// let metrics = PrometheusMetrics::new(&mut registry);
    /// metrics.set_group_series(10);
    /// let queue: WorkQueue<String> = WorkQueue::builder()
    ///     .name("pods")
    ///     .metrics(metrics)
    ///     .group_by(|key: &String| key.split_once('/').map_or("", |(ns, _)| ns).to_owned())
    ///     .max_in_flight_per_group(1)
    ///     .build();
    /// queue.add("team-a/web".to_owned());
    /// queue.add("team-a/db".to_owned());
    /// let lease = queue.try_get().unwrap();
    ///
    /// let mut text = String::new();
    /// encode(&mut text, &registry).unwrap();
    /// assert!(text.contains(r#"workqueue_groups_ready{name="pods"} 1"#));
    /// assert!(text.contains(r#"workqueue_group_saturated{name="pods"} 1"#));
    /// assert!(text.contains(r#"workqueue_group_depth{name="pods",group="team-a"} 1"#));
    /// assert!(text.contains(r#"workqueue_group_in_flight{name="pods",group="team-a"} 1"#));
    /// # drop(lease);
    /// ```
    pub fn set_group_series(&self, top: usize) {
        self.queues.group_series.store(top, Ordering::Relaxed);
    }
}

impl MetricsProvider for PrometheusMetrics {
    fn new_queue(&self, name: &str, probe: QueueProbe) -> Box<dyn QueueMetrics> {
        let mut all = self.queues.series.lock();
        let series = match all.iter().find(|s| s.name == name) {
            Some(series) => series.clone(),
            None => {
                let series = Arc::new(Series::new(name));
                all.push(series.clone());
                series
            }
        };
        *series.probe.lock() = Some(probe);
        Box::new(Recorder(series))
    }
}

/// Picks one of a [`Series`]' histograms.
type PickHistogram = fn(&Series) -> &Histogram;
/// Picks a value read at scrape time.
type PickGauge = fn(&QueueStats) -> f64;
/// Picks a queue's flow control figure.
type PickFlow = fn(&FlowStats) -> usize;
/// Picks a group's figure.
type PickGroup = fn(&GroupStats) -> usize;

/// Encodes every queue's series on each scrape.
#[derive(Debug)]
struct WorkqueueCollector(Arc<Queues>);

impl Collector for WorkqueueCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let series: Vec<Arc<Series>> = self.0.series.lock().clone();
        let stats: Vec<QueueStats> = series.iter().map(|s| s.stats()).collect();
        let label = |s: &Series| [("name", s.name.clone())];

        let mut family =
            encoder.encode_descriptor("workqueue_depth", DEPTH_HELP, None, MetricType::Gauge)?;
        let by_priority = self.0.depth_by_priority.load(Ordering::Relaxed);
        for s in &series {
            if by_priority {
                for (priority, depth) in s.depth_by_priority() {
                    let labels = [("name", s.name.clone()), ("priority", priority)];
                    ConstGauge::new(depth).encode(family.encode_family(&labels)?)?;
                }
            } else {
                let gauge = ConstGauge::new(s.depth.load(Ordering::Relaxed));
                gauge.encode(family.encode_family(&label(s))?)?;
            }
        }

        let mut family =
            encoder.encode_descriptor("workqueue_adds", ADDS_HELP, None, MetricType::Counter)?;
        for s in &series {
            let counter = ConstCounter::new(s.adds.load(Ordering::Relaxed));
            counter.encode(family.encode_family(&label(s))?)?;
        }

        let histograms: [(&str, &str, PickHistogram); 2] = [
            (
                "workqueue_queue_duration_seconds",
                QUEUE_DURATION_HELP,
                |s| &s.queue_duration,
            ),
            ("workqueue_work_duration_seconds", WORK_DURATION_HELP, |s| {
                &s.work_duration
            }),
        ];
        for (name, help, pick) in histograms {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Histogram)?;
            for s in &series {
                pick(s).encode(family.encode_family(&label(s))?)?;
            }
        }

        let gauges: [(&str, &str, PickGauge); 2] = [
            ("workqueue_unfinished_work_seconds", UNFINISHED_HELP, |st| {
                st.unfinished_work.as_secs_f64()
            }),
            (
                "workqueue_longest_running_processor_seconds",
                LONGEST_HELP,
                |st| st.longest_running.as_secs_f64(),
            ),
        ];
        for (name, help, pick) in gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (s, st) in series.iter().zip(&stats) {
                ConstGauge::new(pick(st)).encode(family.encode_family(&label(s))?)?;
            }
        }

        let mut family = encoder.encode_descriptor(
            "workqueue_retries",
            RETRIES_HELP,
            None,
            MetricType::Counter,
        )?;
        for s in &series {
            let counter = ConstCounter::new(s.retries.load(Ordering::Relaxed));
            counter.encode(family.encode_family(&label(s))?)?;
        }

        let mut family = encoder.encode_descriptor(
            "workqueue_delayed_items",
            DELAYED_HELP,
            None,
            MetricType::Gauge,
        )?;
        for (s, st) in series.iter().zip(&stats) {
            let gauge = ConstGauge::new(i64::try_from(st.delayed).unwrap_or(i64::MAX));
            gauge.encode(family.encode_family(&label(s))?)?;
        }

        let top = self.0.group_series.load(Ordering::Relaxed);
        let flows: Vec<_> = series
            .iter()
            .filter_map(|s| {
                let probe = s.probe.lock().clone()?;
                Some((s, probe.flow(top)?))
            })
            .collect();
        if !flows.is_empty() {
            let counts: [(&str, &str, PickFlow); 2] = [
                ("workqueue_groups_ready", GROUPS_READY_HELP, |f| {
                    f.groups_ready
                }),
                ("workqueue_group_saturated", GROUP_SATURATED_HELP, |f| {
                    f.groups_saturated
                }),
            ];
            for (name, help, pick) in counts {
                let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
                for (s, (stats, _)) in &flows {
                    let gauge = ConstGauge::new(i64::try_from(pick(stats)).unwrap_or(i64::MAX));
                    gauge.encode(family.encode_family(&label(s))?)?;
                }
            }
        }
        if top > 0 && !flows.is_empty() {
            let per_group: [(&str, &str, PickGroup); 2] = [
                ("workqueue_group_depth", GROUP_DEPTH_HELP, |g| g.ready),
                ("workqueue_group_in_flight", GROUP_IN_FLIGHT_HELP, |g| {
                    g.in_flight
                }),
            ];
            for (name, help, pick) in per_group {
                let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
                for (s, (_, groups)) in &flows {
                    for group in groups {
                        let labels = [("name", s.name.clone()), ("group", group.name.clone())];
                        let gauge = ConstGauge::new(i64::try_from(pick(group)).unwrap_or(i64::MAX));
                        gauge.encode(family.encode_family(&labels)?)?;
                    }
                }
            }
        }

        let mut family = encoder.encode_descriptor(
            "workqueue_rate_limiter_delay_seconds",
            RATE_LIMIT_HELP,
            None,
            MetricType::Histogram,
        )?;
        for s in &series {
            s.rate_limiter_delay
                .encode(family.encode_family(&label(s))?)?;
        }
        Ok(())
    }
}
