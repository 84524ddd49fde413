//! The trace link suite (feature `otel`): an add records the trace context of the span it is
//! made in, and the lease that hands the item out carries it
//! ([`QueueLease::links`]), as rules over the `workq::Queue`
//! trait, so every backend runs the same text. A backend implements [`TraceFactory`] and
//! instantiates every rule with `workq_conformance::for_each_trace_rule!(its_macro)`.
//!
//! The adds are made in spans recorded by a [`Recorder`] of the rule's own (a tracer
//! provider exporting to memory, set as the default subscriber only while the add's future
//! is polled), so what the lease carries can only have come through the queue. The rules
//! read the links on the leases; a backend's own tests check that `Workers` link their spans
//! to them, across processes where the backend is shared ([`Recorder::global`],
//! [`links_of`]).

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing::instrument::WithSubscriber;
use tracing::{Dispatch, Instrument};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use workq::otel::{MAX_LINKS, TraceLink};
use workq::{AddOptions, Queue, QueueLease, WorkQueue};

pub use opentelemetry;
pub use opentelemetry_sdk;

/// Calls `$suite!(rule, rule, ...)` with the name of every rule in
/// [`trace::rules`](crate::trace::rules).
#[macro_export]
macro_rules! for_each_trace_rule {
    ($suite:ident) => {
        $suite!(
            an_add_in_a_span_is_linked_from_the_lease,
            deduplicated_adds_keep_their_links_in_add_order,
            a_hot_key_keeps_the_first_links_and_counts_the_rest,
            an_add_while_processing_links_the_next_hand_out,
            a_released_lease_gives_its_links_back_in_front,
            delayed_and_rate_limited_adds_are_linked,
            an_add_outside_a_recorded_span_links_nothing,
            every_item_of_a_batch_links_to_the_callers_span,
            a_retry_links_the_next_attempt_to_the_span_it_was_made_in,
            a_batched_step_hands_out_the_links,
            grouped_queues_carry_links_too,
            a_lost_lease_gives_its_links_to_the_next_holder,
        );
    };
}

/// A tracer provider exporting the spans it records to memory, and the `tracing`
/// subscribers that record to it.
#[derive(Debug)]
pub struct Recorder {
    provider: SdkTracerProvider,
    exporter: InMemorySpanExporter,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    /// A provider with an in-memory exporter of its own.
    pub fn new() -> Self {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        Recorder { provider, exporter }
    }

    /// A subscriber recording `tracing` spans to this provider (through
    /// `tracing-opentelemetry`).
    pub fn dispatch(&self) -> Dispatch {
        Dispatch::new(
            tracing_subscriber::registry()
                .with(tracing_opentelemetry::layer().with_tracer(self.provider.tracer("workq"))),
        )
    }

    /// The recorder of the global subscriber, set once per test binary: what spans on other
    /// threads (a pool of workers, a runtime's) record to.
    ///
    /// # Panics
    ///
    /// If another global subscriber was set in this test binary.
    pub fn global() -> &'static Recorder {
        static GLOBAL: OnceLock<Recorder> = OnceLock::new();
        GLOBAL.get_or_init(|| {
            let recorder = Recorder::new();
            tracing::dispatcher::set_global_default(recorder.dispatch())
                .expect("no other global subscriber in this test binary");
            recorder
        })
    }

    /// Every span recorded and ended so far.
    ///
    /// # Panics
    ///
    /// If the exporter fails.
    pub fn spans(&self) -> Vec<SpanData> {
        self.provider.force_flush().expect("flush the spans");
        self.exporter
            .get_finished_spans()
            .expect("the finished spans")
    }

    /// Polls `future` inside a new span named `event` recorded here (the span entered and
    /// this recorder's subscriber the default while it is polled); returns its output and
    /// the span's link.
    ///
    /// # Panics
    ///
    /// If the span has no valid context (it is recorded, so it has one).
    pub async fn in_span<F: Future>(&self, future: F) -> (F::Output, TraceLink) {
        let dispatch = self.dispatch();
        let span = tracing::dispatcher::with_default(&dispatch, || tracing::info_span!("event"));
        let link = TraceLink::from_span_context(span.context().span().span_context())
            .expect("a recorded span has a valid context");
        let output = future.instrument(span).with_subscriber(dispatch).await;
        (output, link)
    }
}

/// The links of an exported span, as [`TraceLink`]s.
pub fn links_of(span: &SpanData) -> Vec<TraceLink> {
    span.links
        .links
        .iter()
        .filter_map(|link| TraceLink::from_span_context(&link.span_context))
        .collect()
}

/// The spans of `spans` named `name` whose attribute `key` reads `value`.
fn spans_where(spans: &[SpanData], name: &str, key: &str, value: &str) -> Vec<SpanData> {
    spans
        .iter()
        .filter(|span| span.name == name)
        .filter(|span| attribute(span, key).is_some_and(|v| v.as_str() == value))
        .cloned()
        .collect()
}

/// The `workqueue.item` spans `recorder` exported for the `String` item `item` (whose
/// attribute is its `Debug` form), and the spans named `reconcile` whose attribute `key` is
/// `item` (what the tests' handlers open).
pub fn item_spans(recorder: &Recorder, item: &str) -> (Vec<SpanData>, Vec<SpanData>) {
    let spans = recorder.spans();
    (
        spans_where(&spans, "workqueue.item", "item", &format!("{item:?}")),
        spans_where(&spans, "reconcile", "key", item),
    )
}

/// Checks what `Workers` recorded of `item` processed once, in `recorder`: one
/// `workqueue.item` span, linked to exactly `expected` (remote contexts) in a trace of its
/// own, with no drop counted, and one `reconcile` span of the handler's, a child of it.
/// Returns the item's span.
///
/// # Panics
///
/// If any of that does not hold.
pub fn assert_processed_once(recorder: &Recorder, item: &str, expected: &[TraceLink]) -> SpanData {
    let (items, reconciles) = item_spans(recorder, item);
    let [span] = items.as_slice() else {
        panic!("one workqueue.item span expected for {item}, got {items:?}");
    };
    assert_eq!(links_of(span), expected);
    assert!(span.links.links.iter().all(|l| l.span_context.is_remote()));
    for link in expected {
        assert_ne!(
            span.span_context.trace_id(),
            link.trace_id(),
            "linked to its cause, not a child of it"
        );
    }
    assert_eq!(attribute(span, "workqueue.links_dropped"), None);
    let [reconcile] = reconciles.as_slice() else {
        panic!("one reconcile span expected for {item}, got {reconciles:?}");
    };
    assert_eq!(reconcile.parent_span_id, span.span_context.span_id());
    assert_eq!(
        reconcile.span_context.trace_id(),
        span.span_context.trace_id()
    );
    span.clone()
}

/// An attribute of an exported span.
pub fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a opentelemetry::Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

/// Makes fresh queues for the trace rules.
pub trait TraceFactory: Send + Sync {
    /// The queues it makes.
    type Q: Queue<Item = String>;

    /// A fresh, empty queue. `grouped`: its `"group/name"` items are grouped by the part
    /// before the `/` (`Builder::group_by`, which puts flow control on), since a backend may
    /// keep a grouped queue's ready items apart.
    fn queue(&self, grouped: bool) -> impl Future<Output = Self::Q> + Send;

    /// A fresh, empty queue whose leases last `lease` unless renewed and are not renewed by
    /// themselves, so that a lease [`crash`](Self::crash)ed is lost once `lease` has passed;
    /// `None` (the default) for a backend whose leases do not expire (in memory, a lease
    /// lives as long as its holder): the rule of a lost lease is skipped.
    fn expiring_queue(&self, lease: Duration) -> impl Future<Output = Option<Self::Q>> + Send {
        let _ = lease;
        async { None }
    }

    /// Lets `lease` go as a worker that dies would: nothing sent. By default the lease is
    /// dropped.
    fn crash(lease: <Self::Q as Queue>::Lease) {
        drop(lease);
    }

    /// Whether [`QueueLease::links_dropped`] counts every add whose link was dropped (the
    /// default); a backend that skips the write of a duplicate add whose item holds
    /// [`MAX_LINKS`] links already does not count those, and the rules then check only the
    /// links.
    fn counts_every_dropped_link(&self) -> bool {
        true
    }
}

/// The in-memory queue.
#[derive(Debug)]
pub struct Memory;

impl TraceFactory for Memory {
    type Q = WorkQueue<String>;

    async fn queue(&self, grouped: bool) -> WorkQueue<String> {
        if grouped {
            WorkQueue::builder()
                .group_by(|item: &String| crate::flow::group_of(item).to_owned())
                .build()
        } else {
            WorkQueue::new()
        }
    }
}

/// The rules.
pub mod rules {
    use super::*;
    use crate::flow::{add, add_with, done, get};

    /// Adds `item` inside a new span of `recorder`'s; returns the span's link.
    async fn add_in_span<Q: Queue<Item = String>>(
        recorder: &Recorder,
        queue: &Q,
        item: &str,
    ) -> TraceLink {
        recorder.in_span(add(queue, item)).await.1
    }

    /// The item of a lease and its links.
    fn seen<L: QueueLease<Item = String>>(lease: &L) -> (String, Vec<TraceLink>) {
        (lease.item().clone(), lease.links().to_vec())
    }

    /// The lease of an item added in a span links to that span, and to nothing else; once
    /// done, the item starts again with no link.
    pub async fn an_add_in_a_span_is_linked_from_the_lease<F: TraceFactory>(factory: &F) {
        let producer = Recorder::new();
        let queue = factory.queue(false).await;
        let added = add_in_span(&producer, &queue, "default/web-0").await;
        let lease = get(&queue).await;
        assert_eq!(lease.links(), [added]);
        assert_eq!(lease.links_dropped(), 0);
        assert!(lease.links()[0].is_sampled());
        done(lease).await;
        // Added again outside any span: nothing left over from the first hand-out.
        add(&queue, "default/web-0").await;
        let lease = get(&queue).await;
        assert_eq!(seen(&lease), ("default/web-0".to_owned(), Vec::new()));
        done(lease).await;
    }

    /// Deduplicated adds each keep their link, in the order of the adds, up to
    /// [`MAX_LINKS`]; the ones after are counted.
    pub async fn deduplicated_adds_keep_their_links_in_add_order<F: TraceFactory>(factory: &F) {
        let producer = Recorder::new();
        let queue = factory.queue(false).await;
        let mut three = Vec::new();
        for _ in 0..3 {
            three.push(add_in_span(&producer, &queue, "default/three").await);
        }
        let mut many = Vec::new();
        for _ in 0..MAX_LINKS + 2 {
            many.push(add_in_span(&producer, &queue, "default/many").await);
        }
        assert_eq!(
            queue.len().await.ok(),
            Some(2),
            "the adds were deduplicated"
        );
        let lease = get(&queue).await;
        assert_eq!(seen(&lease), ("default/three".to_owned(), three));
        assert_eq!(lease.links_dropped(), 0);
        done(lease).await;
        let lease = get(&queue).await;
        assert_eq!(
            seen(&lease),
            ("default/many".to_owned(), many[..MAX_LINKS].to_vec())
        );
        if factory.counts_every_dropped_link() {
            assert_eq!(lease.links_dropped(), 2);
        }
        done(lease).await;
    }

    /// A key added 10,000 times while it waits (four adds alone, then a batch of the rest)
    /// keeps the links of its first four adds and counts the other 9,996.
    pub async fn a_hot_key_keeps_the_first_links_and_counts_the_rest<F: TraceFactory>(factory: &F) {
        let producer = Recorder::new();
        let queue = factory.queue(false).await;
        let mut first = Vec::new();
        for _ in 0..MAX_LINKS {
            first.push(add_in_span(&producer, &queue, "default/hot").await);
        }
        let rest = vec!["default/hot".to_owned(); 10_000 - MAX_LINKS];
        let (accepted, _) = producer
            .in_span(async { queue.add_all_with(rest, AddOptions::default()).await })
            .await;
        assert_eq!(accepted.ok(), Some(10_000 - MAX_LINKS));
        let lease = get(&queue).await;
        assert_eq!(lease.links(), first);
        if factory.counts_every_dropped_link() {
            assert_eq!(lease.links_dropped() as usize, 10_000 - MAX_LINKS);
        }
        done(lease).await;
    }

    /// An add while the item is processed is kept for its next hand-out, which links to it
    /// alone.
    pub async fn an_add_while_processing_links_the_next_hand_out<F: TraceFactory>(factory: &F) {
        let producer = Recorder::new();
        let queue = factory.queue(false).await;
        let first = add_in_span(&producer, &queue, "default/web-0").await;
        let lease = get(&queue).await;
        assert_eq!(lease.links(), [first]);
        let second = add_in_span(&producer, &queue, "default/web-0").await;
        done(lease).await;
        let lease = get(&queue).await;
        assert_eq!(lease.links(), [second]);
        done(lease).await;
    }

    /// A lease released unprocessed gives its links back, in front of the links of the adds
    /// made meanwhile, still at most [`MAX_LINKS`] (the rest counted).
    pub async fn a_released_lease_gives_its_links_back_in_front<F: TraceFactory>(factory: &F) {
        let producer = Recorder::new();
        let queue = factory.queue(false).await;
        let mut links = Vec::new();
        for _ in 0..2 {
            links.push(add_in_span(&producer, &queue, "default/web-0").await);
        }
        let lease = get(&queue).await;
        assert_eq!(lease.links(), links);
        for _ in 0..3 {
            links.push(add_in_span(&producer, &queue, "default/web-0").await);
        }
        assert!(lease.release().await.is_ok(), "release failed");
        let lease = get(&queue).await;
        assert_eq!(lease.links(), &links[..MAX_LINKS]);
        if factory.counts_every_dropped_link() {
            assert_eq!(lease.links_dropped(), 1);
        }
        done(lease).await;
    }

    /// Delayed and rate-limited adds record their links as plain adds do.
    pub async fn delayed_and_rate_limited_adds_are_linked<F: TraceFactory>(factory: &F) {
        let producer = Recorder::new();
        let queue = factory.queue(false).await;
        let later = AddOptions::default().after(Duration::from_millis(20));
        let ((), delayed) = producer
            .in_span(add_with(&queue, "default/later", later))
            .await;
        let limited = AddOptions::default().rate_limited();
        let ((), limited) = producer
            .in_span(add_with(&queue, "default/later", limited))
            .await;
        let lease = get(&queue).await;
        assert_eq!(lease.links(), [delayed, limited]);
        done(lease).await;
    }

    /// No recording span, no link: an add outside any span, and one in a span of a
    /// subscriber without OpenTelemetry.
    pub async fn an_add_outside_a_recorded_span_links_nothing<F: TraceFactory>(factory: &F) {
        let queue = factory.queue(false).await;
        add(&queue, "default/plain").await;
        let plain = Dispatch::new(tracing_subscriber::registry());
        let span = tracing::dispatcher::with_default(&plain, || tracing::info_span!("event"));
        add(&queue, "default/plain-2")
            .instrument(span)
            .with_subscriber(plain)
            .await;
        for _ in 0..2 {
            let lease = get(&queue).await;
            assert!(lease.links().is_empty(), "{:?}", seen(&lease));
            assert_eq!(lease.links_dropped(), 0);
            done(lease).await;
        }
    }

    /// Every item of a batch of adds (at once, or after a delay) links to the span the
    /// batch was added in.
    pub async fn every_item_of_a_batch_links_to_the_callers_span<F: TraceFactory>(factory: &F) {
        let producer = Recorder::new();
        let queue = factory.queue(false).await;
        let now = ["default/a", "default/b", "default/c"].map(str::to_owned);
        let (_, at_once) = producer
            .in_span(async {
                queue
                    .add_all_with(now.to_vec(), AddOptions::default())
                    .await
            })
            .await;
        let later = ["default/d", "default/e"].map(str::to_owned);
        let delay = AddOptions::default().after(Duration::from_millis(20));
        let (_, delayed) = producer
            .in_span(async { queue.add_all_with(later.to_vec(), delay).await })
            .await;
        for item in now {
            let lease = get(&queue).await;
            assert_eq!(seen(&lease), (item, vec![at_once]));
            done(lease).await;
        }
        for _ in 0..2 {
            let lease = get(&queue).await;
            assert_eq!(lease.links(), [delayed], "{:?}", seen(&lease));
            done(lease).await;
        }
    }

    /// A retry (the re-add of a failed item and its done, in one step) made inside a span
    /// links the next attempt to that span, not to the adds of the attempt that failed.
    pub async fn a_retry_links_the_next_attempt_to_the_span_it_was_made_in<F: TraceFactory>(
        factory: &F,
    ) {
        let producer = Recorder::new();
        let queue = factory.queue(false).await;
        let added = add_in_span(&producer, &queue, "default/flaky").await;
        let mut lease = get(&queue).await;
        assert_eq!(lease.links(), [added]);
        for options in [AddOptions::default(), AddOptions::default().rate_limited()] {
            // In an async block: the call itself is made inside the span.
            let (handed_back, retried) = producer
                .in_span(async { queue.retry_and_done(lease, options, false).await })
                .await;
            assert!(
                matches!(handed_back, Ok(None)),
                "the retry was applied and the lease is done"
            );
            lease = get(&queue).await;
            assert_eq!(lease.links(), [retried]);
        }
        done(lease).await;
    }

    /// The leases a batched step hands out (the done of one lease and the next items, in
    /// one call) carry the links of their items.
    pub async fn a_batched_step_hands_out_the_links<F: TraceFactory>(factory: &F) {
        let producer = Recorder::new();
        let queue = factory.queue(false).await;
        add(&queue, "default/first").await;
        let mut expected = Vec::new();
        for item in ["default/a", "default/b", "default/c"] {
            expected.push((
                item.to_owned(),
                vec![add_in_span(&producer, &queue, item).await],
            ));
        }
        let first = get(&queue).await;
        let step = queue
            .done_and_next_many(vec![(first, false)], 3)
            .await
            .unwrap_or_else(|_| panic!("the step failed"));
        assert!(step.done.iter().all(Result::is_ok), "the done failed");
        let mut handed = Vec::new();
        for lease in step.next {
            handed.push(seen(&lease));
            done(lease).await;
        }
        assert!(!handed.is_empty(), "the step handed out nothing");
        while handed.len() < expected.len() {
            let lease = get(&queue).await;
            handed.push(seen(&lease));
            done(lease).await;
        }
        assert_eq!(handed, expected);
    }

    /// A grouped queue (whose ready items a backend may keep per group) carries the links
    /// as a plain one does: deduplicated adds, a release, a batched step.
    pub async fn grouped_queues_carry_links_too<F: TraceFactory>(factory: &F) {
        let producer = Recorder::new();
        let queue = factory.queue(true).await;
        let a1 = add_in_span(&producer, &queue, "blue/a").await;
        let b = add_in_span(&producer, &queue, "green/b").await;
        let a2 = add_in_span(&producer, &queue, "blue/a").await;
        let mut by_item = std::collections::HashMap::new();
        for _ in 0..2 {
            let lease = get(&queue).await;
            let (item, links) = seen(&lease);
            if item == "blue/a" {
                let a3 = add_in_span(&producer, &queue, "blue/a").await;
                assert!(lease.release().await.is_ok(), "release failed");
                by_item.insert(item, (links, a3));
            } else {
                by_item.insert(item, (links, b));
                done(lease).await;
            }
        }
        let (links, a3) = by_item.remove("blue/a").expect("blue/a handed out");
        assert_eq!(links, [a1, a2]);
        assert_eq!(by_item.remove("green/b").expect("green/b").0, [b]);
        // The released item and a new one: the second handed out by a batched step.
        add(&queue, "green/c").await;
        let first = get(&queue).await;
        let mut handed = vec![seen(&first)];
        let step = queue
            .done_and_next_many(vec![(first, false)], 2)
            .await
            .unwrap_or_else(|_| panic!("the step failed"));
        for lease in step.next {
            handed.push(seen(&lease));
            done(lease).await;
        }
        while handed.len() < 2 {
            let lease = get(&queue).await;
            handed.push(seen(&lease));
            done(lease).await;
        }
        handed.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            handed,
            [
                ("blue/a".to_owned(), vec![a1, a2, a3]),
                ("green/c".to_owned(), Vec::new())
            ]
        );
    }

    /// A lease whose holder dies gives its links to the next holder, in front of those of
    /// the adds made meanwhile (skipped where leases do not expire).
    pub async fn a_lost_lease_gives_its_links_to_the_next_holder<F: TraceFactory>(factory: &F) {
        let lease_time = Duration::from_millis(300);
        let Some(queue) = factory.expiring_queue(lease_time).await else {
            eprintln!("skipped: the backend's leases do not expire");
            return;
        };
        let producer = Recorder::new();
        let first = add_in_span(&producer, &queue, "default/web-0").await;
        let lease = get(&queue).await;
        assert_eq!(lease.links(), [first]);
        F::crash(lease);
        let second = add_in_span(&producer, &queue, "default/web-0").await;
        tokio::time::sleep(lease_time + Duration::from_millis(50)).await;
        let lease = get(&queue).await;
        assert_eq!(
            seen(&lease),
            ("default/web-0".to_owned(), vec![first, second])
        );
        done(lease).await;
    }
}
