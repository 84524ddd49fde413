//! Traces from the event to the reconcile (feature `otel`): the workers' `workqueue.item`
//! span a reconcile runs in links to the span its key was added in, the controller's
//! `controller.events` span for a watch event, or a span of the caller's around an add.
//!
//! Spans are exported to memory (`opentelemetry_sdk`'s testing exporter) through one global
//! subscriber, set once for this binary: the controller's workers and feed are tokio tasks on
//! the runtime's threads. Each test finds its spans by its own objects.
#![cfg(feature = "otel")]

mod support;

use std::sync::{Arc, OnceLock};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TracerProvider as _};
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use support::{configmap, eventually, value_of};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use workq::{Outcome, WorkQueue};
use workq_kube::testing::FakeApiServer;
use workq_kube::{Controller, Running};

/// The tracer provider every span of this binary goes to, and its exporter.
struct Recorder {
    provider: SdkTracerProvider,
    exporter: InMemorySpanExporter,
}

fn recorder() -> &'static Recorder {
    static RECORDER: OnceLock<Recorder> = OnceLock::new();
    RECORDER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("controller")));
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other global subscriber in this test binary");
        Recorder { provider, exporter }
    })
}

/// Every span finished so far.
fn spans() -> Vec<SpanData> {
    let recorder = recorder();
    recorder.provider.force_flush().unwrap();
    recorder.exporter.get_finished_spans().unwrap()
}

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv: &&KeyValue| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

fn has(span: &SpanData, key: &str, value: &str) -> bool {
    attribute(span, key).is_some_and(|v| v.as_str() == value)
}

/// Opens a `reconcile` span of its own (the name and the value it saw), as a reconcile
/// instrumented by its author would.
async fn reconcile(configmap: Arc<ConfigMap>, _: Arc<()>) -> Outcome {
    let (name, value) = (configmap.name_any(), value_of(&configmap));
    tracing::info_span!("reconcile", name = %name, value = %value).in_scope(|| {
        tracing::info!("reconciled");
    });
    Outcome::Done
}

/// The controller `controller` on an API server holding the ConfigMap `object`, once that
/// object's first reconcile is exported; with every span exported by then.
async fn traced(
    object: &str,
    controller: &str,
) -> (
    FakeApiServer,
    Running<ConfigMap, WorkQueue<ObjectRef<ConfigMap>>>,
    Vec<SpanData>,
) {
    let _ = recorder();
    let api = FakeApiServer::start().await;
    api.apply(&configmap(object, "v1"));
    let running = Controller::new(
        Api::<ConfigMap>::namespaced(api.client(), "default"),
        watcher::Config::default(),
    )
    .name(controller)
    .run(reconcile, Arc::new(()));
    let spans = exported(object, "v1", 1).await;
    (api, running, spans)
}

/// The `workqueue.item` span that the reconcile of `name` seeing `value` ran in (the parent
/// of its `reconcile` span), once both are exported.
fn item_span_of(spans: &[SpanData], name: &str, value: &str) -> SpanData {
    let reconciles: Vec<&SpanData> = spans
        .iter()
        .filter(|s| s.name == "reconcile" && has(s, "name", name) && has(s, "value", value))
        .collect();
    let [reconcile] = reconciles.as_slice() else {
        panic!("one reconcile of {name} at {value} expected, got {reconciles:?}");
    };
    let item = spans
        .iter()
        .find(|s| s.span_context.span_id() == reconcile.parent_span_id)
        .unwrap_or_else(|| panic!("the reconcile of {name} runs inside a span: {reconcile:?}"));
    assert_eq!(item.name, "workqueue.item", "{item:?}");
    assert_eq!(
        item.span_context.trace_id(),
        reconcile.span_context.trace_id()
    );
    item.clone()
}

/// The (trace id, span id) pairs `span` links to.
fn links(span: &SpanData) -> Vec<(String, SpanId)> {
    span.links
        .links
        .iter()
        .map(|link| {
            (
                link.span_context.trace_id().to_string(),
                link.span_context.span_id(),
            )
        })
        .collect()
}

fn ids(context: &SpanContext) -> (String, SpanId) {
    (context.trace_id().to_string(), context.span_id())
}

/// Waits until the reconciles of `name` seeing `value` number `count` and each one's span
/// and the span it ran in are exported; returns every span exported.
async fn exported(name: &str, value: &str, count: usize) -> Vec<SpanData> {
    let mut found = Vec::new();
    eventually("the reconciles' spans exported", || {
        found = spans();
        let parents: Vec<SpanId> = found
            .iter()
            .filter(|s| s.name == "reconcile" && has(s, "name", name) && has(s, "value", value))
            .map(|s| s.parent_span_id)
            .collect();
        parents.len() == count
            && parents
                .iter()
                .all(|parent| found.iter().any(|s| s.span_context.span_id() == *parent))
    })
    .await;
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_links_to_the_watch_event_that_queued_its_key() {
    let (api, controller, listed) = traced("traced-listed", "traced-events").await;

    // The list's round of events queued the listed key; the reconcile's span links to it.
    let item = item_span_of(&listed, "traced-listed", "v1");
    let rounds: Vec<&SpanData> = listed
        .iter()
        .filter(|s| s.name == "controller.events" && has(s, "controller", "traced-events"))
        .collect();
    let [list] = rounds.as_slice() else {
        panic!("one round of events so far, got {rounds:?}");
    };
    assert_eq!(links(&item), [ids(&list.span_context)]);
    assert!(has(
        list,
        "object.ref",
        "ConfigMap.v1./traced-listed.default"
    ));

    // A live change: its own round, named after its object, and its own link.
    api.apply(&configmap("traced-changed", "v1"));
    let spans = exported("traced-changed", "v1", 1).await;
    let item = item_span_of(&spans, "traced-changed", "v1");
    let changed: Vec<&SpanData> = spans
        .iter()
        .filter(|s| {
            s.name == "controller.events"
                && has(s, "object.ref", "ConfigMap.v1./traced-changed.default")
        })
        .collect();
    let [event] = changed.as_slice() else {
        panic!("one round for the change expected, got {changed:?}");
    };
    // (Counts as `tracing-opentelemetry` records a `usize`: text or a number.)
    assert!(
        has(event, "events", "1") && has(event, "keys", "1"),
        "{event:?}"
    );
    assert!(has(event, "controller", "traced-events"));
    assert_eq!(links(&item), [ids(&event.span_context)]);
    assert!(item.links.links[0].span_context.is_remote());
    // Linked, not a child: the reconcile's trace is its own.
    assert_ne!(item.span_context.trace_id(), event.span_context.trace_id());
    assert_eq!(attribute(&item, "workqueue.links_dropped"), None);

    controller.shut_down().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_links_to_the_span_of_an_explicit_add() {
    let (_api, controller, _) = traced("traced-added", "traced-adds").await;

    // A webhook, say, asks for the object to be reconciled again, inside its own span.
    let key = ObjectRef::<ConfigMap>::new("traced-added").within("default");
    let request = tracing::info_span!("webhook request");
    let requested = request.context().span().span_context().clone();
    assert!(requested.is_valid() && requested.is_sampled());
    request.in_scope(|| controller.queue().add(key));
    drop(request);
    let spans = exported("traced-added", "v1", 2).await;
    let items: Vec<&SpanData> = spans
        .iter()
        .filter(|s| s.name == "reconcile" && has(s, "name", "traced-added"))
        .map(|reconcile| {
            spans
                .iter()
                .find(|s| s.span_context.span_id() == reconcile.parent_span_id)
                .expect("the reconcile runs inside the workers' span")
        })
        .collect();
    let [first, second] = items.as_slice() else {
        panic!("two reconciles expected, got {items:?}");
    };
    assert_eq!(second.name, "workqueue.item");
    // The second links to the webhook's span alone; the first to the list's round.
    assert_eq!(links(second), [ids(&requested)]);
    assert_eq!(links(first).len(), 1);
    assert_ne!(links(first), links(second));
    // The request's span was exported too: both ends of the link are in the trace store.
    assert!(spans.iter().any(|s| s.span_context == requested));

    controller.shut_down().await.unwrap();
}
