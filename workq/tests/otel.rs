//! Trace links across the queue (feature `otel`): an add records the adding span's context,
//! and the worker's `workqueue.item` span links to it, with the handler running inside.
//!
//! The producer and the workers record to two tracer providers with two in-memory
//! exporters, as two processes would: the only thing that crosses from one to the other is
//! what the queue carried.
#![cfg(feature = "otel")]

use opentelemetry::Value;
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry_sdk::trace::SpanData;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use workq::otel::{MAX_LINKS, TraceLink};
use workq::{Outcome, QueueLease, WorkQueue, Workers};
use workq_conformance::trace::{Recorder, assert_processed_once, attribute};

/// The workers' side: worker threads record through the global subscriber, set once for
/// this test binary; each test finds its spans by its own item.
fn workers_side() -> &'static Recorder {
    Recorder::global()
}

/// Runs `f` inside a span named `name` recorded by `producer`; returns the span's context.
fn under_span(producer: &Recorder, name: &'static str, f: impl FnOnce()) -> SpanContext {
    tracing::dispatcher::with_default(&producer.dispatch(), || {
        let span = tracing::info_span!("event", name);
        let context = span.context().span().span_context().clone();
        span.in_scope(f);
        context
    })
}

/// Processes every queued item with threaded workers; the handler opens a `reconcile` span.
fn process(queue: &WorkQueue<String>) {
    let _ = workers_side();
    let workers = Workers::new(queue.clone()).spawn_threads(|key: &String| {
        let _reconcile = tracing::info_span!("reconcile", key = %key).entered();
        Outcome::Done
    });
    while queue.processing_len() > 0 || !queue.is_empty() {
        std::thread::yield_now();
    }
    workers.shut_down();
}

/// The `workqueue.item` spans of `item`, and the `reconcile` spans under them.
fn item_spans(item: &str) -> (Vec<SpanData>, Vec<SpanData>) {
    workq_conformance::trace::item_spans(workers_side(), item)
}

fn linked(span: &SpanData) -> Vec<(String, String)> {
    span.links
        .links
        .iter()
        .map(|link| {
            (
                link.span_context.trace_id().to_string(),
                link.span_context.span_id().to_string(),
            )
        })
        .collect()
}

fn ids(context: &SpanContext) -> (String, String) {
    (
        context.trace_id().to_string(),
        context.span_id().to_string(),
    )
}

#[test]
fn the_worker_span_links_to_the_add_and_the_handler_runs_inside_it() {
    let producer = Recorder::new();
    let queue = WorkQueue::builder().name("linked").build();
    let added = under_span(&producer, "pod changed", || {
        queue.add("default/linked-0".to_owned());
    });
    assert!(added.is_valid() && added.is_sampled());
    process(&queue);

    // A trace of its own, linked to its cause; the handler's span a child of it.
    assert_processed_once(
        workers_side(),
        "default/linked-0",
        &[TraceLink::from_span_context(&added).unwrap()],
    );
    // The producer's exporter has the add's span: both ends of the link were exported.
    let exported = producer.spans();
    assert!(exported.iter().any(|s| s.span_context == added));
}

#[test]
fn deduplicated_adds_keep_their_links_up_to_the_bound() {
    let producer = Recorder::new();
    let queue = WorkQueue::new();
    let three: Vec<SpanContext> = (0..3)
        .map(|_| under_span(&producer, "event", || queue.add("default/three".to_owned())))
        .collect();
    let many: Vec<SpanContext> = (0..MAX_LINKS + 2)
        .map(|_| under_span(&producer, "event", || queue.add("default/many".to_owned())))
        .collect();
    assert_eq!(queue.len(), 2, "the adds were deduplicated");
    process(&queue);

    let (items, _) = item_spans("default/three");
    let [item] = items.as_slice() else {
        panic!("one span expected, got {items:?}");
    };
    assert_eq!(linked(item), three.iter().map(ids).collect::<Vec<_>>());

    let (items, _) = item_spans("default/many");
    let [item] = items.as_slice() else {
        panic!("one span expected, got {items:?}");
    };
    // The first adds are kept, the rest counted.
    let first: Vec<_> = many.iter().take(MAX_LINKS).map(ids).collect();
    assert_eq!(linked(item), first);
    assert_eq!(
        attribute(item, "workqueue.links_dropped"),
        Some(&Value::I64(2))
    );
}

#[test]
fn a_hot_key_keeps_a_bounded_number_of_links() {
    let producer = Recorder::new();
    let queue = WorkQueue::new();
    let first = under_span(&producer, "first", || queue.add("default/hot"));
    tracing::dispatcher::with_default(&producer.dispatch(), || {
        for _ in 1..10_000 {
            let _span = tracing::info_span!("event").entered();
            queue.add("default/hot");
        }
    });
    let lease = queue.try_get().unwrap();
    assert_eq!(lease.links().len(), MAX_LINKS);
    assert_eq!(
        lease.links()[0],
        TraceLink::from_span_context(&first).unwrap()
    );
    assert_eq!(lease.links_dropped() as usize, 10_000 - MAX_LINKS);
}

#[test]
fn an_add_while_processing_links_the_next_hand_out() {
    let producer = Recorder::new();
    let queue = WorkQueue::new();
    let first = under_span(&producer, "first", || queue.add("default/web-0"));
    let lease = queue.try_get().unwrap();
    let expected = TraceLink::from_span_context(&first).unwrap();
    assert_eq!(lease.links(), [expected]);
    assert_eq!(lease.links_dropped(), 0);

    let second = under_span(&producer, "second", || queue.add("default/web-0"));
    drop(lease);
    let lease = queue.try_get().unwrap();
    assert_eq!(
        lease.links(),
        [TraceLink::from_span_context(&second).unwrap()]
    );
    drop(lease);
    // Handed out again with nothing added since: no links left over.
    queue.add("default/web-0");
    assert!(queue.try_get().unwrap().links().is_empty());
}

#[test]
fn a_released_lease_gives_its_links_back() {
    let producer = Recorder::new();
    let queue = WorkQueue::new();
    let first = under_span(&producer, "first", || queue.add("default/web-0"));
    let lease = queue.try_get().unwrap();
    // Added again while the lease is out: its link goes behind the first.
    let second = under_span(&producer, "second", || queue.add("default/web-0"));
    futures::executor::block_on(QueueLease::release(lease)).unwrap();
    let lease = queue.try_get().unwrap();
    let expected: Vec<TraceLink> = [first, second]
        .iter()
        .map(|c| TraceLink::from_span_context(c).unwrap())
        .collect();
    assert_eq!(lease.links(), expected);
}

#[test]
fn delayed_and_rate_limited_adds_are_linked_too() {
    let producer = Recorder::new();
    let queue = WorkQueue::new();
    let delayed = under_span(&producer, "delayed", || {
        queue.add_after("default/later", std::time::Duration::from_nanos(1));
    });
    let limited = under_span(&producer, "limited", || {
        queue.add_rate_limited("default/later");
    });
    let lease = queue.blocking_get().unwrap();
    let expected: Vec<TraceLink> = [delayed, limited]
        .iter()
        .map(|c| TraceLink::from_span_context(c).unwrap())
        .collect();
    assert_eq!(lease.links(), expected);
}

#[test]
fn an_add_outside_a_recorded_span_records_nothing() {
    let queue = WorkQueue::new();
    queue.add("default/plain");
    // A span, but no OpenTelemetry layer.
    tracing::subscriber::with_default(tracing_subscriber::registry(), || {
        let _span = tracing::info_span!("event").entered();
        queue.add("default/plain-2");
    });
    for _ in 0..2 {
        let lease = queue.try_get().unwrap();
        assert!(lease.links().is_empty());
        assert_eq!(lease.links_dropped(), 0);
    }
}

#[test]
fn the_link_crosses_as_a_traceparent() {
    let producer = Recorder::new();
    let queue = WorkQueue::new();
    let added = under_span(&producer, "event", || queue.add("default/hop"));
    let lease = queue.try_get().unwrap();
    let text = lease.links()[0].traceparent();
    assert_eq!(
        text,
        format!("00-{}-{}-01", added.trace_id(), added.span_id())
    );
    let parsed: TraceLink = text.parse().unwrap();
    assert_eq!(parsed, lease.links()[0]);
}

#[cfg(feature = "tokio")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_workers_link_too() {
    let producer = Recorder::new();
    let queue: WorkQueue<String> = WorkQueue::new();
    let added = under_span(&producer, "event", || {
        queue.add("default/async".to_owned());
    });
    let _ = workers_side();
    let workers = Workers::new(queue.clone()).spawn_async(|key: String| async move {
        let _reconcile = tracing::info_span!("reconcile", key = %key).entered();
        Outcome::Done
    });
    while queue.processing_len() > 0 || !queue.is_empty() {
        tokio::task::yield_now().await;
    }
    workers.shut_down().await;
    assert_processed_once(
        workers_side(),
        "default/async",
        &[TraceLink::from_span_context(&added).unwrap()],
    );
}
