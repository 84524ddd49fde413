//! Sources of keys through kube's real client against the in-process API server: kube's
//! stream constructors (`for_stream` with a predicate, `owns_stream`, `watches_stream`, the
//! shared-reflector variants), and sources that fail: a panicking mapper, a watcher that
//! cannot list, watch failures after the first list, a stream that ends.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use workq::Outcome;
use workq_kube::testing::FakeApiServer;
use workq_kube::{Controller, ErrorKind};

mod support;
use support::{Every, Widget, configmap, eventually, widget};

/// Reconciles seen: (name, generation, status message).
type Calls = Arc<Mutex<Vec<(String, i64, Option<String>)>>>;

async fn record(widget: Arc<Widget>, calls: Calls) -> Outcome {
    calls.lock().unwrap().push((
        widget.name_any(),
        widget.metadata.generation.unwrap_or_default(),
        widget.status.as_ref().map(|status| status.message.clone()),
    ));
    Outcome::Done
}

fn count(calls: &Calls, name: &str) -> usize {
    calls
        .lock()
        .unwrap()
        .iter()
        .filter(|(n, ..)| n == name)
        .count()
}

/// The widgets' label that names a widget to reconcile for a config map.
fn labelled_for(widget: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("widget".to_owned(), widget.to_owned())])
}

fn by_label(configmap: &ConfigMap) -> Option<ObjectRef<Widget>> {
    let namespace = configmap.namespace().unwrap_or_default();
    configmap
        .labels()
        .get("widget")
        .map(|name| ObjectRef::new(name).within(&namespace))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn for_stream_with_a_generation_predicate_reconciles_changes_of_the_spec_only() {
    let server = FakeApiServer::start().await;
    server.apply(&widget("w", 1));
    let widgets = Api::<Widget>::namespaced(server.client(), "default");
    let (reader, writer) = reflector::store();
    let stream = watcher(widgets.clone(), watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .predicate_filter(predicates::generation, Default::default());
    let calls = Calls::default();
    let controller = Controller::for_stream(stream, reader).run(record, calls.clone());
    eventually("the first reconcile", || count(&calls, "w") == 1).await;

    // A status write: filtered out by the predicate. The marker created after it comes
    // through the same stream, so once it is reconciled the status event has been seen.
    widgets
        .patch_status(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "message": "written" } })),
        )
        .await
        .unwrap();
    server.apply(&widget("marker", 1));
    eventually("the marker", || count(&calls, "marker") == 1).await;
    assert_eq!(count(&calls, "w"), 1, "no reconcile for the status write");

    // A change of the spec: a new generation, reconciled.
    widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "size": 2 } })),
        )
        .await
        .unwrap();
    eventually("the spec change", || count(&calls, "w") == 2).await;
    assert_eq!(
        calls.lock().unwrap().last().unwrap(),
        &("w".to_owned(), 2, Some("written".to_owned()))
    );
    controller.shut_down().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owns_stream_and_watches_stream_take_streams_you_build() {
    let server = FakeApiServer::start().await;
    server.apply(&widget("alpha", 1));
    server.apply(&widget("beta", 1));
    let client = server.client();
    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    // Children by their metadata only; related objects filtered to those with a label.
    #[expect(deprecated, reason = "kube's metadata watcher, as `owns` uses it")]
    let children = kube::runtime::metadata_watcher(configmaps.clone(), watcher::Config::default())
        .default_backoff()
        .touched_objects();
    let related = watcher(configmaps, watcher::Config::default().labels("widget"))
        .default_backoff()
        .touched_objects();
    let calls = Calls::default();
    let controller = Controller::new(
        Api::<Widget>::namespaced(client, "default"),
        watcher::Config::default(),
    )
    .owns_stream(children)
    .watches_stream(related, |configmap: ConfigMap| by_label(&configmap))
    .run(record, calls.clone());
    eventually("both widgets", || {
        count(&calls, "alpha") == 1 && count(&calls, "beta") == 1
    })
    .await;

    let alpha_uid = controller
        .store()
        .get(&ObjectRef::new("alpha").within("default"))
        .unwrap()
        .uid()
        .unwrap();
    let mut child = configmap("alpha-child", "v1");
    child.metadata.owner_references = Some(vec![OwnerReference {
        api_version: Widget::api_version(&()).into_owned(),
        kind: Widget::kind(&()).into_owned(),
        name: "alpha".to_owned(),
        uid: alpha_uid,
        controller: Some(true),
        ..OwnerReference::default()
    }]);
    server.apply(&child);
    eventually("alpha for its child", || count(&calls, "alpha") == 2).await;
    let mut labelled = configmap("settings", "v1");
    labelled.metadata.labels = Some(labelled_for("beta"));
    server.apply(&labelled);
    eventually("beta through the mapper", || count(&calls, "beta") == 2).await;
    controller.shut_down().await.unwrap();
    assert!(
        server.requests().metadata_only >= 2,
        "{:?}",
        server.requests()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_streams_feed_two_controllers_from_one_watch() {
    let server = FakeApiServer::start().await;
    server.apply(&widget("alpha", 1));
    let client = server.client();
    let (widget_reader, widget_writer) = reflector::store_shared::<Widget>(64);
    let (first, second) = (
        widget_writer.subscribe().unwrap(),
        widget_writer.subscribe().unwrap(),
    );
    let (_, configmap_writer) = reflector::store_shared::<ConfigMap>(64);
    let configmap_events = configmap_writer.subscribe().unwrap();
    // The root streams are driven on their own, as kube requires.
    let widget_root = tokio::spawn(
        watcher(
            Api::<Widget>::namespaced(client.clone(), "default"),
            watcher::Config::default(),
        )
        .default_backoff()
        .reflect_shared(widget_writer)
        .for_each(|_| std::future::ready(())),
    );
    let configmap_root = tokio::spawn(
        watcher(
            Api::<ConfigMap>::namespaced(client, "default"),
            watcher::Config::default(),
        )
        .default_backoff()
        .reflect_shared(configmap_writer)
        .for_each(|_| std::future::ready(())),
    );
    let (calls, other_calls) = (Calls::default(), Calls::default());
    let controller = Controller::for_shared_stream(first, widget_reader.clone())
        .watches_shared_stream(configmap_events, |configmap: Arc<ConfigMap>| {
            by_label(&configmap)
        })
        .run(record, calls.clone());
    let other = Controller::for_shared_stream(second, widget_reader)
        .name("other-widgets")
        .run(record, other_calls.clone());
    eventually("alpha in both", || {
        count(&calls, "alpha") == 1 && count(&other_calls, "alpha") == 1
    })
    .await;

    server.apply(&widget("beta", 1));
    let mut labelled = configmap("settings", "v1");
    labelled.metadata.labels = Some(labelled_for("alpha"));
    server.apply(&labelled);
    eventually("beta in both, alpha again through the mapper", || {
        count(&calls, "beta") == 1
            && count(&other_calls, "beta") == 1
            && count(&calls, "alpha") == 2
    })
    .await;
    controller.shut_down().await.unwrap();
    other.shut_down().await.unwrap();
    widget_root.abort();
    configmap_root.abort();
    // One list and one watch per kind, however many controllers.
    assert_eq!(server.requests().lists, 2, "{:?}", server.requests());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_mapper_stops_the_controller_with_an_error() {
    let server = FakeApiServer::start().await;
    server.apply(&widget("alpha", 1));
    let client = server.client();
    let calls = Calls::default();
    let controller = Controller::new(
        Api::<Widget>::namespaced(client.clone(), "default"),
        watcher::Config::default(),
    )
    .watches(
        Api::<ConfigMap>::namespaced(client, "default"),
        watcher::Config::default(),
        |configmap: ConfigMap| {
            assert_ne!(
                configmap.name_any(),
                "poison",
                "the mapper cannot read poison"
            );
            by_label(&configmap)
        },
    )
    .run(record, calls.clone());
    eventually("alpha", || count(&calls, "alpha") == 1).await;

    server.apply(&configmap("poison", "v1"));
    let error = tokio::time::timeout(Duration::from_secs(30), controller.wait())
        .await
        .expect("the controller stops by itself")
        .expect_err("with an error");
    match error.kind() {
        ErrorKind::TriggerPanicked { trigger, message } => {
            assert_eq!(trigger, "watches ConfigMap");
            assert!(
                message.contains("the mapper cannot read poison"),
                "{message}"
            );
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(error.summary().succeeded, 1);
    assert!(error.to_string().contains("panicked"), "{error}");
}

/// A controller of the widget `alpha` that owns ConfigMaps, which it is forbidden to list,
/// with `sync_timeout`.
fn owning_forbidden_configmaps(
    server: &FakeApiServer,
    sync_timeout: Duration,
    calls: &Calls,
) -> workq_kube::Running<Widget, workq::WorkQueue<ObjectRef<Widget>>> {
    server.apply(&widget("alpha", 1));
    server.forbid::<ConfigMap>();
    let client = server.client();
    Controller::new(
        Api::<Widget>::namespaced(client.clone(), "default"),
        watcher::Config::default(),
    )
    .owns(
        Api::<ConfigMap>::namespaced(client, "default"),
        watcher::Config::default(),
    )
    .trigger_backoff(|| Every(Duration::from_millis(20)))
    .sync_timeout(sync_timeout)
    .run(record, calls.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_cannot_list_stops_the_controller_after_the_sync_timeout() {
    let server = FakeApiServer::start().await;
    let calls = Calls::default();
    let controller = owning_forbidden_configmaps(&server, Duration::from_millis(500), &calls);

    let error = tokio::time::timeout(Duration::from_secs(30), controller.wait())
        .await
        .expect("the controller stops by itself")
        .expect_err("with an error");
    match error.kind() {
        ErrorKind::NotSynced {
            trigger,
            timeout,
            last_error,
        } => {
            assert_eq!(trigger, "owns ConfigMap");
            assert_eq!(*timeout, Duration::from_millis(500));
            let last_error = last_error.as_deref().unwrap_or_default();
            assert!(last_error.contains("forbidden"), "{last_error}");
        }
        other => panic!("unexpected {other:?}"),
    }
    // The main kind listed and was reconciled meanwhile.
    assert_eq!(count(&calls, "alpha"), 1);
}

/// `sync_timeout(Duration::MAX)` means no limit: a watcher that cannot list keeps the
/// controller waiting (and reconciling what it has) instead of stopping it, lists once it
/// may, and the controller stops when asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_timeout_of_duration_max_waits_without_a_limit() {
    let server = FakeApiServer::start().await;
    let calls = Calls::default();
    let controller = owning_forbidden_configmaps(&server, Duration::MAX, &calls);
    eventually("the main kind reconciled", || count(&calls, "alpha") == 1).await;
    let lists = server.requests().lists;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        server.requests().lists > lists,
        "the forbidden list is retried meanwhile"
    );
    server.allow::<ConfigMap>();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let summary = tokio::time::timeout(Duration::from_secs(10), controller.shut_down())
        .await
        .expect("stops when asked")
        .expect("without an error");
    assert_eq!(summary.succeeded, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_failures_after_the_first_list_are_retried_counted_and_survived() {
    let server = FakeApiServer::start().await;
    server.apply(&widget("alpha", 1));
    let calls = Calls::default();
    let controller = Controller::new(
        Api::<Widget>::namespaced(server.client(), "default"),
        watcher::Config::default(),
    )
    .name("flaky-widgets")
    .trigger_backoff(|| Every(Duration::from_millis(20)))
    .run(record, calls.clone());
    eventually("alpha", || count(&calls, "alpha") == 1).await;

    server.forbid::<Widget>();
    eventually("failures counted", || {
        controller.feed_stats().watch_errors >= 3
    })
    .await;
    let mut metrics = String::new();
    workq_kube::metrics::encode(&mut metrics).unwrap();
    assert!(
        metrics.contains(
            r#"workqueue_kube_watch_errors_total{controller="flaky-widgets",trigger="Widget"}"#
        ),
        "{metrics}"
    );

    server.allow::<Widget>();
    server.apply(&widget("alpha", 2));
    eventually("the change after the outage", || {
        count(&calls, "alpha") == 2
    })
    .await;
    let summary = controller
        .shut_down()
        .await
        .expect("a watch outage is not fatal");
    assert_eq!(summary.succeeded, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_yours_that_ends_stops_the_controller() {
    let server = FakeApiServer::start().await;
    server.apply(&widget("alpha", 1));
    server.apply(&widget("beta", 1));
    let (reader, writer) = reflector::store();
    // Two objects, then the stream is over.
    let stream = watcher(
        Api::<Widget>::namespaced(server.client(), "default"),
        watcher::Config::default(),
    )
    .reflect(writer)
    .applied_objects()
    .take(2);
    let controller = Controller::for_stream(stream, reader).run(record, Calls::default());
    let error = tokio::time::timeout(Duration::from_secs(30), controller.wait())
        .await
        .expect("the controller stops by itself")
        .expect_err("with an error");
    assert_eq!(
        *error.kind(),
        ErrorKind::TriggerEnded {
            trigger: "for_stream Widget".to_owned()
        }
    );
}
