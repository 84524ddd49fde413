//! Metrics: client-go's `TestMetrics` sequence (util/workqueue/metrics_test.go), checked
//! after every step through a recording provider and through the Prometheus exposition,
//! plus the rules client-go leaves untested (retries, delayed items, rate limiter delays,
//! unnamed queues).

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use workq::QueueStats;
use workq::WorkQueue;
use workq::clock::FakeClock;
use workq::metrics::{MetricsProvider, QueueMetrics, QueueProbe};
use workq::rate_limiter::ExponentialFailure;

/// Everything a queue reported, in the shape of client-go's test metrics.
#[derive(Debug, Default, Clone, PartialEq)]
struct Recorded {
    adds: u64,
    depth: i64,
    latency: Vec<f64>,
    work: Vec<f64>,
    retries: u64,
    rate_limited: Vec<f64>,
}

#[derive(Clone, Default)]
struct TestProvider {
    recorded: Arc<Mutex<Recorded>>,
    probe: Arc<Mutex<Option<QueueProbe>>>,
    names: Arc<Mutex<Vec<String>>>,
}

impl TestProvider {
    fn snapshot(&self) -> Recorded {
        self.recorded.lock().clone()
    }

    fn stats(&self) -> QueueStats {
        self.probe.lock().as_ref().unwrap().stats().unwrap()
    }
}

struct TestRecorder(Arc<Mutex<Recorded>>);

impl QueueMetrics for TestRecorder {
    fn add(&self) {
        let mut r = self.0.lock();
        r.adds += 1;
        r.depth += 1;
    }
    fn get(&self, queued_for: Duration) {
        let mut r = self.0.lock();
        r.depth -= 1;
        r.latency.push(queued_for.as_secs_f64());
    }
    fn done(&self, worked_for: Duration) {
        self.0.lock().work.push(worked_for.as_secs_f64());
    }
    fn retry(&self) {
        self.0.lock().retries += 1;
    }
    fn rate_limited(&self, delay: Duration) {
        self.0.lock().rate_limited.push(delay.as_secs_f64());
    }
}

impl MetricsProvider for TestProvider {
    fn new_queue(&self, name: &str, probe: QueueProbe) -> Box<dyn QueueMetrics> {
        self.names.lock().push(name.to_owned());
        *self.probe.lock() = Some(probe);
        Box::new(TestRecorder(self.recorded.clone()))
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

fn named_queue(clock: &FakeClock, provider: &TestProvider) -> WorkQueue<&'static str> {
    WorkQueue::builder()
        .name("test")
        .clock(clock.clone())
        .metrics(provider.clone())
        .build()
}

#[test]
fn client_go_test_metrics_sequence_step_by_step() {
    let clock = FakeClock::new();
    let provider = TestProvider::default();
    let queue = named_queue(&clock, &provider);
    assert_eq!(*provider.names.lock(), ["test"]);

    // Add foo: adds 1, depth 1.
    queue.add("foo");
    let r = provider.snapshot();
    assert_eq!((r.adds, r.depth), (1, 1));

    // 50 µs later it is handed out: latency 5e-05.
    clock.step(Duration::from_micros(50));
    let lease = queue.try_get().unwrap();
    assert_eq!(*lease, "foo");
    let r = provider.snapshot();
    assert_eq!(r.depth, 0);
    assert_eq!(r.latency.len(), 1);
    assert!(close(r.latency[0], 5e-05), "latency {:?}", r.latency);

    // Five adds while processing count once: adds 2, depth 1.
    for _ in 0..5 {
        queue.add("foo");
    }
    let r = provider.snapshot();
    assert_eq!((r.adds, r.depth), (2, 1));

    // Done 25 µs later: work duration 2.5e-05; depth stays 1 (the item is queued again).
    clock.step(Duration::from_micros(25));
    drop(lease);
    let r = provider.snapshot();
    assert_eq!(r.work.len(), 1);
    assert!(close(r.work[0], 2.5e-05), "work {:?}", r.work);
    assert_eq!(r.depth, 1);

    // Handed out again: latency measured from the re-add, 2.5e-05.
    let lease = queue.try_get().unwrap();
    let r = provider.snapshot();
    assert_eq!(r.latency.len(), 2);
    assert!(close(r.latency[1], 2.5e-05), "latency {:?}", r.latency);
    assert_eq!(r.depth, 0);

    // 1 ms of processing: unfinished work and longest running processor read 0.001 s.
    clock.step(Duration::from_millis(1));
    let stats = provider.stats();
    assert_eq!(stats.unfinished_work, Duration::from_millis(1));
    assert_eq!(stats.longest_running, Duration::from_millis(1));
    assert_eq!(stats.processing, 1);

    // Done: work duration 0.001.
    drop(lease);
    let r = provider.snapshot();
    assert_eq!(r.work.len(), 2);
    assert!(close(r.work[1], 0.001), "work {:?}", r.work);
    let stats = provider.stats();
    assert_eq!(stats.unfinished_work, Duration::ZERO);
    assert_eq!(stats.longest_running, Duration::ZERO);
    assert_eq!(r.retries, 0);
}

/// `Queue::done_and_next` records what a done and a get record: the work duration of the
/// item it ends and the queue latency of the one it hands out.
#[test]
fn done_and_next_records_the_done_and_the_get() {
    use workq::Queue;
    let clock = FakeClock::new();
    let provider = TestProvider::default();
    let queue = named_queue(&clock, &provider);
    queue.add("a");
    queue.add("b");
    let a = queue.try_get().unwrap();
    clock.step(Duration::from_micros(40));
    let b = futures::executor::block_on(Queue::done_and_next(&queue, a, false))
        .unwrap()
        .unwrap();
    assert_eq!(*b, "b");
    let r = provider.snapshot();
    assert_eq!(r.work.len(), 1);
    assert!(close(r.work[0], 4e-05), "work {:?}", r.work);
    assert_eq!(r.latency.len(), 2);
    assert!(close(r.latency[1], 4e-05), "latency {:?}", r.latency);
    assert_eq!(r.depth, 0);
    drop(b);
    assert_eq!(provider.stats().processing, 0);
}

#[test]
fn unfinished_work_sums_every_lease_and_longest_is_the_oldest() {
    let clock = FakeClock::new();
    let provider = TestProvider::default();
    let queue = named_queue(&clock, &provider);
    queue.add("a");
    queue.add("b");
    let a = queue.try_get().unwrap();
    clock.step(Duration::from_secs(2));
    let b = queue.try_get().unwrap();
    clock.step(Duration::from_secs(1));
    let stats = provider.stats();
    assert_eq!(stats.unfinished_work, Duration::from_secs(4)); // 3 s + 1 s
    assert_eq!(stats.longest_running, Duration::from_secs(3));
    drop(a);
    let stats = provider.stats();
    assert_eq!(stats.unfinished_work, Duration::from_secs(1));
    assert_eq!(stats.longest_running, Duration::from_secs(1));
    drop(b);
}

#[test]
fn every_add_after_and_rate_limited_add_counts_a_retry_while_running() {
    let clock = FakeClock::new();
    let provider = TestProvider::default();
    let queue = WorkQueue::builder()
        .name("test")
        .clock(clock.clone())
        .metrics(provider.clone())
        .rate_limiter(ExponentialFailure::new(
            Duration::from_millis(5),
            Duration::from_secs(10),
        ))
        .build();
    queue.add_after("a", Duration::ZERO); // client-go counts zero delays too
    queue.add_after("b", Duration::from_secs(1));
    queue.add_rate_limited("c");
    queue.add_rate_limited("c");
    queue.add("d"); // a plain add is not a retry
    let r = provider.snapshot();
    assert_eq!(r.retries, 4);
    assert_eq!(r.rate_limited.len(), 2);
    assert!(close(r.rate_limited[0], 0.005) && close(r.rate_limited[1], 0.010));
    // Only a and d are dirty so far: b and c wait for their delays.
    assert_eq!((r.adds, r.depth), (2, 2));
    assert_eq!(provider.stats().delayed, 2);

    // When b and c come due they are adds, and latency counts from when they were due.
    clock.step(Duration::from_secs(1));
    let r = provider.snapshot();
    assert_eq!((r.adds, r.depth), (4, 4));
    assert_eq!(provider.stats().delayed, 0);

    queue.shut_down();
    queue.add_after("e", Duration::from_secs(1));
    assert_eq!(
        provider.snapshot().retries,
        4,
        "no retries counted after shut down"
    );
}

#[test]
fn delayed_item_due_while_processing_counts_one_add() {
    let clock = FakeClock::new();
    let provider = TestProvider::default();
    let queue = named_queue(&clock, &provider);
    queue.add("a");
    let lease = queue.try_get().unwrap();
    queue.add_after("a", Duration::from_secs(1));
    clock.step(Duration::from_secs(1));
    // Due while processing: dirty, counted in depth though not in len (as client-go).
    let r = provider.snapshot();
    assert_eq!((r.adds, r.depth), (2, 1));
    assert_eq!(queue.len(), 0);
    drop(lease);
    assert_eq!(queue.len(), 1);
    assert_eq!(provider.snapshot().depth, 1);
}

#[test]
fn unnamed_queues_record_nothing() {
    let provider = TestProvider::default();
    let queue = WorkQueue::builder().metrics(provider.clone()).build();
    queue.add("a");
    drop(queue.try_get().unwrap());
    assert!(provider.names.lock().is_empty());
    assert_eq!(provider.snapshot(), Recorded::default());
}

#[test]
fn probe_returns_none_once_the_queue_is_dropped() {
    let provider = TestProvider::default();
    let queue: WorkQueue<&str> = WorkQueue::builder()
        .name("gone")
        .metrics(provider.clone())
        .build();
    assert!(provider.probe.lock().as_ref().unwrap().stats().is_some());
    drop(queue);
    assert!(provider.probe.lock().as_ref().unwrap().stats().is_none());
}

#[cfg(feature = "prometheus")]
mod prometheus {
    use super::*;
    use prometheus_client::encoding::text::encode;
    use prometheus_client::registry::Registry;
    use workq::metrics::prometheus::PrometheusMetrics;

    /// Parses the exposition into (series with labels, value) pairs, checking every line is
    /// well formed.
    fn scrape(registry: &Registry) -> Vec<(String, f64)> {
        let mut text = String::new();
        encode(&mut text, registry).unwrap();
        assert!(
            text.ends_with("# EOF\n"),
            "OpenMetrics text ends with # EOF"
        );
        text.lines()
            .filter(|line| !line.starts_with('#'))
            .map(|line| {
                let (series, value) = line.rsplit_once(' ').expect("`series value` lines");
                (series.to_owned(), value.parse::<f64>().expect("a number"))
            })
            .collect()
    }

    fn value(samples: &[(String, f64)], series: &str) -> f64 {
        samples
            .iter()
            .find(|(s, _)| s == series)
            .unwrap_or_else(|| panic!("no series {series} in {samples:?}"))
            .1
    }

    /// The cumulative count of histogram `name`'s bucket with upper bound `le`.
    fn bucket(samples: &[(String, f64)], name: &str, le: f64) -> f64 {
        let prefix = format!("{name}_bucket{{le=\"");
        samples
            .iter()
            .find(|(series, _)| {
                series.strip_prefix(&prefix).is_some_and(|rest| {
                    let bound: f64 = rest[..rest.find('"').unwrap()].parse().unwrap();
                    (bound - le).abs() <= le * 1e-9
                })
            })
            .unwrap_or_else(|| panic!("no bucket le={le} of {name}"))
            .1
    }

    #[test]
    fn kubernetes_series_follow_the_test_metrics_sequence() {
        let clock = FakeClock::new();
        let mut registry = Registry::default();
        let metrics = PrometheusMetrics::new(&mut registry);
        let queue = WorkQueue::builder()
            .name("test")
            .clock(clock.clone())
            .metrics(metrics)
            .build();

        queue.add("foo");
        let s = scrape(&registry);
        assert_eq!(value(&s, r#"workqueue_depth{name="test"}"#), 1.0);
        assert_eq!(value(&s, r#"workqueue_adds_total{name="test"}"#), 1.0);

        clock.step(Duration::from_micros(50));
        let lease = queue.try_get().unwrap();
        let s = scrape(&registry);
        assert_eq!(value(&s, r#"workqueue_depth{name="test"}"#), 0.0);
        assert_eq!(
            value(&s, r#"workqueue_queue_duration_seconds_count{name="test"}"#),
            1.0
        );
        assert!(close(
            value(&s, r#"workqueue_queue_duration_seconds_sum{name="test"}"#),
            5e-05
        ));
        // 5e-05 falls in the 1e-4 bucket and above, not in 1e-5.
        assert_eq!(bucket(&s, "workqueue_queue_duration_seconds", 1e-5), 0.0);
        assert_eq!(bucket(&s, "workqueue_queue_duration_seconds", 1e-4), 1.0);
        assert_eq!(bucket(&s, "workqueue_queue_duration_seconds", 10.0), 1.0);

        for _ in 0..5 {
            queue.add("foo");
        }
        let s = scrape(&registry);
        assert_eq!(value(&s, r#"workqueue_adds_total{name="test"}"#), 2.0);
        assert_eq!(value(&s, r#"workqueue_depth{name="test"}"#), 1.0);

        clock.step(Duration::from_micros(25));
        drop(lease);
        let s = scrape(&registry);
        assert_eq!(
            value(&s, r#"workqueue_work_duration_seconds_count{name="test"}"#),
            1.0
        );
        assert!(close(
            value(&s, r#"workqueue_work_duration_seconds_sum{name="test"}"#),
            2.5e-05
        ));
        assert_eq!(value(&s, r#"workqueue_depth{name="test"}"#), 1.0);

        let lease = queue.try_get().unwrap();
        let s = scrape(&registry);
        assert_eq!(
            value(&s, r#"workqueue_queue_duration_seconds_count{name="test"}"#),
            2.0
        );
        assert!(close(
            value(&s, r#"workqueue_queue_duration_seconds_sum{name="test"}"#),
            7.5e-05
        ));

        clock.step(Duration::from_millis(1));
        let s = scrape(&registry);
        assert!(close(
            value(&s, r#"workqueue_unfinished_work_seconds{name="test"}"#),
            0.001
        ));
        assert!(close(
            value(
                &s,
                r#"workqueue_longest_running_processor_seconds{name="test"}"#
            ),
            0.001
        ));

        drop(lease);
        let s = scrape(&registry);
        assert_eq!(
            value(&s, r#"workqueue_work_duration_seconds_count{name="test"}"#),
            2.0
        );
        assert!(close(
            value(&s, r#"workqueue_work_duration_seconds_sum{name="test"}"#),
            0.001025
        ));
        assert_eq!(
            value(&s, r#"workqueue_unfinished_work_seconds{name="test"}"#),
            0.0
        );
        assert_eq!(value(&s, r#"workqueue_retries_total{name="test"}"#), 0.0);
        assert_eq!(value(&s, r#"workqueue_delayed_items{name="test"}"#), 0.0);
    }

    #[test]
    fn histograms_use_kubernetes_buckets() {
        let mut registry = Registry::default();
        let metrics = PrometheusMetrics::new(&mut registry);
        let _queue: WorkQueue<u32> = WorkQueue::builder().name("q").metrics(metrics).build();
        let s = scrape(&registry);
        let les: Vec<&str> = s
            .iter()
            .filter(|(series, _)| series.starts_with("workqueue_work_duration_seconds_bucket"))
            .map(|(series, _)| {
                let start = series.find("le=\"").unwrap() + 4;
                let end = series[start..].find('"').unwrap() + start;
                &series[start..end]
            })
            .collect();
        let expected: Vec<f64> = (0..10).map(|i| 1e-8 * 10f64.powi(i)).collect();
        assert_eq!(les.len(), 11, "ten buckets and +Inf: {les:?}");
        for (le, want) in les.iter().zip(&expected) {
            let got: f64 = le.parse().unwrap();
            assert!((got - want).abs() / want < 1e-9, "bucket {got} != {want}");
        }
        assert_eq!(les[10], "+Inf");
    }

    #[test]
    fn queues_with_one_name_share_series_and_names_are_labels() {
        let mut registry = Registry::default();
        let metrics = PrometheusMetrics::new(&mut registry);
        let a: WorkQueue<u32> = WorkQueue::builder()
            .name("a")
            .metrics(metrics.clone())
            .build();
        let b: WorkQueue<u32> = WorkQueue::builder()
            .name("b")
            .metrics(metrics.clone())
            .build();
        let b2: WorkQueue<u32> = WorkQueue::builder().name("b").metrics(metrics).build();
        a.add(1);
        b.add(1);
        b2.add(1);
        b2.add(2);
        let s = scrape(&registry);
        assert_eq!(value(&s, r#"workqueue_adds_total{name="a"}"#), 1.0);
        assert_eq!(value(&s, r#"workqueue_adds_total{name="b"}"#), 3.0);
        let depth_series = s
            .iter()
            .filter(|(series, _)| series.starts_with("workqueue_depth{"))
            .count();
        assert_eq!(depth_series, 2);
    }

    #[test]
    fn workqueue_depth_takes_controller_runtimes_priority_label_only_when_asked() {
        use workq::AddOptions;
        let mut registry = Registry::default();
        let metrics = PrometheusMetrics::new(&mut registry);
        let queue = WorkQueue::builder()
            .name("prio")
            .metrics(metrics.clone())
            .build();
        queue.add_with("listed", AddOptions::default().priority(-100));
        queue.add("changed");
        // Client-go's shape by default: one series per queue.
        let samples = scrape(&registry);
        assert_eq!(value(&samples, r#"workqueue_depth{name="prio"}"#), 2.0);

        metrics.set_depth_by_priority(true);
        let samples = scrape(&registry);
        assert_eq!(
            value(&samples, r#"workqueue_depth{name="prio",priority="0"}"#),
            1.0
        );
        assert_eq!(
            value(&samples, r#"workqueue_depth{name="prio",priority="-100"}"#),
            1.0
        );
        assert!(
            !samples
                .iter()
                .any(|(series, _)| series == r#"workqueue_depth{name="prio"}"#)
        );
        // A priority whose items are gone reads 0, as a gauge child does.
        let lease = queue.try_get().unwrap();
        assert_eq!(*lease, "changed");
        let samples = scrape(&registry);
        assert_eq!(
            value(&samples, r#"workqueue_depth{name="prio",priority="0"}"#),
            0.0
        );
        drop(lease);

        // Beyond 25 distinct priorities, every depth is summed under one label.
        for priority in 0..30 {
            queue.add_with(
                Box::leak(format!("p{priority}").into_boxed_str()),
                AddOptions::default().priority(priority),
            );
        }
        let samples = scrape(&registry);
        let depth: Vec<&(String, f64)> = samples
            .iter()
            .filter(|(series, _)| series.starts_with(r#"workqueue_depth{name="prio""#))
            .collect();
        assert_eq!(depth.len(), 1, "{depth:?}");
        assert_eq!(
            value(
                &samples,
                r#"workqueue_depth{name="prio",priority="exceeded_cardinality_limit"}"#
            ),
            31.0
        );

        // A queue that cannot tell (gone here) reports its depth under "".
        drop(queue);
        let samples = scrape(&registry);
        assert!(
            samples
                .iter()
                .any(|(series, _)| series == r#"workqueue_depth{name="prio",priority=""}"#)
        );
    }
}

#[test]
fn depth_by_priority_counts_queued_and_re_added_items_at_their_priority() {
    use workq::AddOptions;
    let queue = WorkQueue::new();
    queue.add_with("listed", AddOptions::default().priority(-100));
    queue.add("changed");
    queue.add_with("urgent", AddOptions::default().priority(5));
    // Delayed items are not in the depth until due.
    queue.add_after("later", Duration::from_secs(3600));
    assert_eq!(queue.depth_by_priority(), [(5, 1), (0, 1), (-100, 1)]);
    // Handed out: out of the depth; re-added while processed: back in, at the re-add's
    // priority (0 without one).
    let lease = queue.try_get().unwrap();
    assert_eq!(*lease, "urgent");
    assert_eq!(queue.depth_by_priority(), [(0, 1), (-100, 1)]);
    queue.add_with("urgent", AddOptions::default().priority(7));
    assert_eq!(queue.depth_by_priority(), [(7, 1), (0, 1), (-100, 1)]);
    // A raised priority moves the item.
    queue.add_with("listed", AddOptions::default().priority(3));
    assert_eq!(queue.depth_by_priority(), [(7, 1), (3, 1), (0, 1)]);
    drop(lease);
    assert_eq!(queue.depth_by_priority(), [(7, 1), (3, 1), (0, 1)]);
    let lease = queue.try_get().unwrap();
    assert_eq!(*lease, "urgent");
    drop(lease);
    let lease = queue.try_get().unwrap();
    queue.add(*lease);
    assert_eq!(queue.depth_by_priority(), [(0, 2)]);
}

/// A recorder that panics on every event.
struct Panicking;

impl QueueMetrics for Panicking {
    fn add(&self) {
        panic!("recorder bug");
    }
    fn get(&self, _: Duration) {
        panic!("recorder bug");
    }
    fn done(&self, _: Duration) {
        panic!("recorder bug");
    }
}

struct PanickingProvider;

impl MetricsProvider for PanickingProvider {
    fn new_queue(&self, _: &str, _: QueueProbe) -> Box<dyn QueueMetrics> {
        Box::new(Panicking)
    }
}

#[test]
fn a_panicking_recorder_loses_no_item_and_blocks_no_drain() {
    let queue = WorkQueue::builder()
        .name("buggy")
        .metrics(PanickingProvider)
        .build();
    queue.add("a");
    let lease = queue.try_get().expect("handed out despite the recorder");
    queue.add("a"); // re-added while processing
    drop(lease); // done: re-queued despite the recorder
    let lease = queue.try_get().expect("handed out again");
    assert_eq!(queue.processing_len(), 1);
    drop(lease);
    assert_eq!(queue.processing_len(), 0);
    queue.blocking_shut_down_with_drain(); // returns: nothing is left in flight
    assert_eq!(queue.tracked_len(), 0);
}
