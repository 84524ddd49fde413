//! The in-process API server through kube's real client: single-object calls, patches and
//! the status subresource, selectors, finalizers, and kube's `finalizer` function end to end on
//! a controller.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{self, Event};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::json;
use workq_kube::Controller;
use workq_kube::testing::FakeApiServer;

mod support;
use support::{Widget, WidgetStatus, configmap, eventually, widget};

/// The HTTP code of a refused call.
fn code<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> u16 {
    match result {
        Err(kube::Error::Api(status)) => status.code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn get_create_replace_and_delete_follow_the_api_rules() {
    let server = FakeApiServer::start().await;
    let configmaps = Api::<ConfigMap>::namespaced(server.client(), "default");
    let created = configmaps
        .create(&PostParams::default(), &configmap("web", "v1"))
        .await
        .unwrap();
    assert!(created.uid().is_some());
    assert_eq!(
        created.metadata.generation, None,
        "core kinds have no generation"
    );
    assert_eq!(
        code(
            configmaps
                .create(&PostParams::default(), &configmap("web", "v1"))
                .await
        ),
        409
    );
    assert_eq!(configmaps.get("web").await.unwrap().uid(), created.uid());
    assert_eq!(code(configmaps.get("missing").await), 404);

    // A replace naming an old resource version conflicts; the current one goes through.
    let mut stale = created.clone();
    configmaps
        .replace("web", &PostParams::default(), &{
            let mut next = created.clone();
            next.data = Some(BTreeMap::from([("value".into(), "v2".into())]));
            next
        })
        .await
        .unwrap();
    stale.data = Some(BTreeMap::from([("value".into(), "stale".into())]));
    assert_eq!(
        code(
            configmaps
                .replace("web", &PostParams::default(), &stale)
                .await
        ),
        409
    );
    assert_eq!(
        configmaps.get("web").await.unwrap().data.unwrap()["value"],
        "v2"
    );

    configmaps
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(code(configmaps.get("web").await), 404);
    assert_eq!(
        code(configmaps.delete("web", &DeleteParams::default()).await),
        404
    );
    let requests = server.requests();
    assert_eq!((requests.deletes, requests.refused), (2, 5));
}

#[tokio::test]
async fn patches_merge_json_and_apply_with_the_status_subresource() {
    let server = FakeApiServer::start().await;
    let widgets = Api::<Widget>::namespaced(server.client(), "default");
    let mut new = widget("w", 1);
    new.status = Some(WidgetStatus {
        message: "ignored on create".into(),
    });
    let created = widgets.create(&PostParams::default(), &new).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    assert_eq!(
        created.status, None,
        "the status subresource sets the status"
    );

    // A merge patch of the spec: a new generation.
    let patched = widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "size": 2 } })),
        )
        .await
        .unwrap();
    assert_eq!(
        (patched.spec.size, patched.metadata.generation),
        (2, Some(2))
    );

    // The status subresource changes the status only, with no new generation; the object's
    // own endpoint keeps the stored status.
    let with_status = widgets
        .patch_status(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "message": "ready" }, "spec": { "size": 99 } })),
        )
        .await
        .unwrap();
    assert_eq!(with_status.status.unwrap().message, "ready");
    assert_eq!(
        (with_status.spec.size, with_status.metadata.generation),
        (2, Some(2))
    );
    let ignored = widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "message": "no" } })),
        )
        .await
        .unwrap();
    assert_eq!(ignored.status.unwrap().message, "ready");
    assert_eq!(
        ignored.metadata.generation,
        Some(2),
        "nothing but the status changed"
    );

    // A JSON patch with a test that holds, and one that does not.
    let operations = |expected: u32| -> json_patch::Patch {
        serde_json::from_value(json!([
            { "op": "test", "path": "/spec/size", "value": expected },
            { "op": "replace", "path": "/spec/size", "value": 3 },
        ]))
        .unwrap()
    };
    let tested = widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Json::<()>(operations(2)),
        )
        .await
        .unwrap();
    assert_eq!((tested.spec.size, tested.metadata.generation), (3, Some(3)));
    assert_eq!(
        code(
            widgets
                .patch(
                    "w",
                    &PatchParams::default(),
                    &Patch::Json::<()>(operations(2))
                )
                .await
        ),
        422
    );
    // A merge patch naming an old resource version conflicts.
    assert_eq!(
        code(
            widgets
                .patch(
                    "w",
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({ "metadata": { "resourceVersion": "1" }, "spec": { "size": 4 } })
                    ),
                )
                .await
        ),
        409
    );

    // Server-side apply creates, then merges.
    let apply = PatchParams::apply("tests").force();
    let applied = widgets
        .patch(
            "v",
            &apply,
            &Patch::Apply(json!({
                "apiVersion": "example.com/v1", "kind": "Widget",
                "metadata": { "name": "v" }, "spec": { "size": 7 },
            })),
        )
        .await
        .unwrap();
    assert_eq!(
        (applied.spec.size, applied.metadata.generation),
        (7, Some(1))
    );
    let applied = widgets
        .patch(
            "v",
            &apply,
            &Patch::Apply(json!({
                "apiVersion": "example.com/v1", "kind": "Widget",
                "metadata": { "name": "v", "labels": { "tier": "front" } }, "spec": { "size": 8 },
            })),
        )
        .await
        .unwrap();
    assert_eq!(
        (applied.spec.size, applied.labels()["tier"].as_str()),
        (8, "front")
    );
}

#[tokio::test]
async fn label_and_field_selectors_filter_lists_and_watches() {
    let server = FakeApiServer::start().await;
    for (name, app) in [("a", Some("web")), ("b", Some("db")), ("c", None)] {
        let mut object = configmap(name, "v1");
        object.metadata.labels = app.map(|app| BTreeMap::from([("app".into(), app.into())]));
        server.apply(&object);
    }
    let configmaps = Api::<ConfigMap>::namespaced(server.client(), "default");
    let names = |list: kube::core::ObjectList<ConfigMap>| -> Vec<String> {
        list.items.iter().map(ResourceExt::name_any).collect()
    };
    for (labels, expected) in [
        ("app=web", vec!["a"]),
        ("app in (web, db)", vec!["a", "b"]),
        ("app!=web", vec!["b", "c"]),
        ("!app", vec!["c"]),
    ] {
        let list = configmaps
            .list(&ListParams::default().labels(labels))
            .await
            .unwrap();
        assert_eq!(names(list), expected, "{labels}");
    }
    let list = configmaps
        .list(&ListParams::default().fields("metadata.name=b"))
        .await
        .unwrap();
    assert_eq!(names(list), ["b"]);
    assert_eq!(
        code(
            configmaps
                .list(&ListParams::default().labels("app in web"))
                .await
        ),
        400
    );

    // A watch with a selector: an object that leaves the selection is deleted from the
    // store, one that enters it is added.
    let (store, writer) = reflector::store();
    let watch = tokio::spawn(
        watcher(
            configmaps.clone(),
            watcher::Config::default().labels("app=web"),
        )
        .reflect(writer)
        .for_each(|_| std::future::ready(())),
    );
    store.wait_until_ready().await.unwrap();
    let in_store = |name: &str| store.get(&ObjectRef::new(name).within("default")).is_some();
    assert!(in_store("a") && !in_store("b"));
    let relabel = |app: &str| Patch::Merge(json!({ "metadata": { "labels": { "app": app } } }));
    configmaps
        .patch("a", &PatchParams::default(), &relabel("db"))
        .await
        .unwrap();
    configmaps
        .patch("b", &PatchParams::default(), &relabel("web"))
        .await
        .unwrap();
    eventually("a out, b in", || !in_store("a") && in_store("b")).await;
    watch.abort();
}

#[tokio::test]
async fn an_object_with_finalizers_is_deleted_in_two_steps() {
    let server = FakeApiServer::start().await;
    let widgets = Api::<Widget>::namespaced(server.client(), "default");
    let mut new = widget("w", 1);
    new.metadata.finalizers = Some(vec!["example.com/cleanup".into()]);
    widgets.create(&PostParams::default(), &new).await.unwrap();

    let deleting = widgets
        .delete("w", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .expect("the object, still there");
    assert!(deleting.metadata.deletion_timestamp.is_some());
    assert_eq!(
        deleting.metadata.generation,
        Some(2),
        "a deletion start is a new generation"
    );
    assert!(
        widgets.get("w").await.is_ok(),
        "kept while a finalizer is left"
    );
    // No new finalizer on an object being deleted.
    let add =
        Patch::Merge(json!({ "metadata": { "finalizers": ["example.com/cleanup", "other"] } }));
    assert_eq!(
        code(widgets.patch("w", &PatchParams::default(), &add).await),
        422
    );

    let remove = Patch::Merge(json!({ "metadata": { "finalizers": null } }));
    widgets
        .patch("w", &PatchParams::default(), &remove)
        .await
        .unwrap();
    assert_eq!(
        code(widgets.get("w").await),
        404,
        "gone with its last finalizer"
    );
}

/// What the finalizer-driven reconciles did.
#[derive(Default)]
struct Lifecycle {
    applied: Mutex<Vec<String>>,
    cleaned: Mutex<Vec<String>>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubes_finalizer_function_runs_end_to_end_on_a_controller() {
    const FINALIZER: &str = "example.com/cleanup";
    let server = FakeApiServer::start().await;
    let widgets = Api::<Widget>::namespaced(server.client(), "default");
    let lifecycle = Arc::new(Lifecycle::default());
    let controller = Controller::new(widgets.clone(), watcher::Config::default()).run(
        {
            let widgets = widgets.clone();
            move |widget: Arc<Widget>, lifecycle: Arc<Lifecycle>| {
                let widgets = widgets.clone();
                async move {
                    finalizer::finalizer(&widgets, FINALIZER, widget, |event| async move {
                        match event {
                            Event::Apply(widget) => {
                                lifecycle.applied.lock().unwrap().push(widget.name_any());
                            }
                            Event::Cleanup(widget) => {
                                lifecycle.cleaned.lock().unwrap().push(widget.name_any());
                            }
                        }
                        Ok::<_, kube::Error>(Action::await_change())
                    })
                    .await
                }
            }
        },
        lifecycle.clone(),
    );

    widgets
        .create(&PostParams::default(), &widget("w", 1))
        .await
        .unwrap();
    // `finalizer` adds its finalizer (a JSON patch with a test), then applies.
    eventually("applied", || lifecycle.applied.lock().unwrap().len() == 1).await;
    let stored = server.get::<Widget>(Some("default"), "w").unwrap();
    assert_eq!(stored.finalizers(), [FINALIZER]);

    widgets.delete("w", &DeleteParams::default()).await.unwrap();
    eventually("cleaned up and gone", || {
        lifecycle.cleaned.lock().unwrap().len() == 1 && server.count::<Widget>() == 0
    })
    .await;
    let controller_watch_errors = controller.feed_stats().watch_errors;
    let summary = controller.shut_down().await.unwrap();
    assert_eq!(*lifecycle.cleaned.lock().unwrap(), ["w"]);
    assert_eq!(summary.given_up, 0);
    assert_eq!(summary.retried, 0, "no patch conflicted");
    // An empty server's first watch starts from now; nothing expired.
    assert_eq!((server.requests().expired, controller_watch_errors), (0, 0));
}

#[tokio::test]
async fn a_forbidden_kind_is_refused_with_403() {
    let server = FakeApiServer::start().await;
    server.apply(&configmap("web", "v1"));
    let configmaps = Api::<ConfigMap>::namespaced(server.client(), "default");
    server.forbid::<ConfigMap>();
    assert_eq!(code(configmaps.list(&ListParams::default()).await), 403);
    assert_eq!(code(configmaps.get("web").await), 403);
    server.allow::<ConfigMap>();
    assert_eq!(
        configmaps
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
}

/// Sends `request` (a whole HTTP/1.1 request but its `Host` and `Connection` headers) to the
/// server; returns the status code and the body.
async fn raw(
    server: &FakeApiServer,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = server.url().trim_start_matches("http://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (code, body)
}

#[tokio::test]
async fn hostile_requests_are_refused_and_change_nothing() {
    let server = FakeApiServer::start().await;
    server.apply(&configmap("web", "v1"));
    let path = "/api/v1/namespaces/default/configmaps/web";
    let merge = "Content-Type: application/merge-patch+json\r\n";
    let json_patch = "Content-Type: application/json-patch+json\r\n";
    for (method, path, headers, body, expected) in [
        ("PATCH", path, merge, "{not json", 400),
        ("PATCH", path, merge, "5", 400),
        ("PATCH", path, json_patch, r#"{"op":"remove"}"#, 400),
        (
            "PATCH",
            path,
            json_patch,
            r#"[{"op":"remove","path":"/nowhere/deep"}]"#,
            422,
        ),
        ("PATCH", path, "Content-Type: text/plain\r\n", "{}", 415),
        (
            "PATCH",
            path,
            merge,
            r#"{"metadata":{"name":"other"}}"#,
            400,
        ),
        (
            "PATCH",
            path,
            "Content-Type: application/apply-patch+yaml\r\n",
            "{}",
            400,
        ),
        ("PUT", path, "", "[]", 400),
        ("PUT", path, "", r#"{"metadata":{"name":"other"}}"#, 400),
        (
            "POST",
            "/api/v1/namespaces/default/configmaps",
            "",
            r#"{"kind":"ConfigMap"}"#,
            422,
        ),
        (
            "DELETE",
            "/api/v1/namespaces/default/configmaps",
            "",
            "",
            405,
        ),
        (
            "GET",
            "/api/v1/namespaces/default/configmaps/web/status/extra",
            "",
            "",
            404,
        ),
        ("GET", "/nothing/here", "", "", 404),
        (
            "GET",
            "/api/v1/namespaces/default/configmaps?labelSelector=a%20in%20(",
            "",
            "",
            400,
        ),
        (
            "GET",
            "/api/v1/namespaces/default/configmaps?watch=true&fieldSelector=metadata.name",
            "",
            "",
            400,
        ),
    ] {
        let (code, answer) = raw(&server, method, path, headers, body).await;
        assert_eq!(code, expected, "{method} {path} {body}: {answer}");
    }
    // Nothing changed: the object is as it was, at its first resource version.
    let web = server.get::<ConfigMap>(Some("default"), "web").unwrap();
    assert_eq!(support::value_of(&web), "v1");
    assert_eq!(web.resource_version().as_deref(), Some("1"));
    assert_eq!(server.resource_version(), 1);
}

#[tokio::test]
async fn leases_are_created_read_replaced_with_conflicts_and_watched() {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use kube::api::ObjectMeta;

    let server = FakeApiServer::start().await;
    let leases = Api::<Lease>::namespaced(server.client(), "default");
    let lease = |holder: &str| Lease {
        metadata: ObjectMeta {
            name: Some("leader".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            ..LeaseSpec::default()
        }),
    };
    let created = leases
        .create(&PostParams::default(), &lease("a"))
        .await
        .unwrap();
    // Two replicas creating it at once: one gets AlreadyExists.
    assert_eq!(
        code(leases.create(&PostParams::default(), &lease("b")).await),
        409
    );
    let mut changes = watcher(leases.clone(), watcher::Config::default())
        .applied_objects()
        .boxed();
    let first = changes.next().await.unwrap().unwrap();
    assert_eq!(first.spec.unwrap().holder_identity.as_deref(), Some("a"));

    // A replace naming the current resource version goes through; one naming an old one
    // (a replica that lost the race) gets 409 and changes nothing.
    let mut renewed = leases.get("leader").await.unwrap();
    renewed.spec.as_mut().unwrap().holder_identity = Some("b".into());
    let renewed = leases
        .replace("leader", &PostParams::default(), &renewed)
        .await
        .unwrap();
    let mut stale = created.clone();
    stale.spec.as_mut().unwrap().holder_identity = Some("c".into());
    assert_eq!(
        code(
            leases
                .replace("leader", &PostParams::default(), &stale)
                .await
        ),
        409
    );
    let now = leases.get("leader").await.unwrap();
    assert_eq!(now.resource_version(), renewed.resource_version());
    assert_eq!(
        now.spec.unwrap().holder_identity.as_deref(),
        Some("b"),
        "the stale write changed nothing"
    );
    let seen = changes.next().await.unwrap().unwrap();
    assert_eq!(seen.spec.unwrap().holder_identity.as_deref(), Some("b"));
}

#[tokio::test]
async fn a_partitioned_client_is_refused_and_its_watches_end_while_the_others_go_on() {
    let server = FakeApiServer::start().await;
    server.apply(&configmap("web", "v1"));
    let cut = Api::<ConfigMap>::namespaced(server.client_named("cut"), "default");
    let other = Api::<ConfigMap>::namespaced(server.client_named("other"), "default");
    let mut watch = cut
        .watch(&kube::api::WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    // The synthetic ADDED of a watch from "0".
    assert!(watch.next().await.unwrap().is_ok());

    server.partition("cut");
    assert!(
        tokio::time::timeout(std::time::Duration::from_secs(5), watch.next())
            .await
            .expect("the watch ends")
            .is_none()
    );
    assert_eq!(code(cut.get("web").await), 503);
    let mut changed = configmap("web", "v2");
    changed.metadata.resource_version = None;
    assert_eq!(
        code(cut.replace("web", &PostParams::default(), &changed).await),
        503
    );
    assert_eq!(server.requests().partitioned, 2);
    // Nothing it sent was applied; the other client goes on.
    let web = other.get("web").await.unwrap();
    assert_eq!(support::value_of(&web), "v1");
    other
        .replace("web", &PostParams::default(), &changed)
        .await
        .unwrap();

    server.heal("cut");
    assert_eq!(support::value_of(&cut.get("web").await.unwrap()), "v2");
}

/// Reads `stream` until what came holds `needle`, for at most five seconds; returns all read.
async fn read_until(stream: &mut tokio::net::TcpStream, read: &mut String, needle: &str) {
    use tokio::io::AsyncReadExt;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while !read.contains(needle) {
        let mut buffer = [0_u8; 4096];
        let n = tokio::time::timeout_at(deadline, stream.read(&mut buffer))
            .await
            .unwrap_or_else(|_| panic!("no {needle:?} within 5 s; read so far: {read:?}"))
            .unwrap();
        assert!(
            n > 0,
            "the connection closed before {needle:?}; read: {read:?}"
        );
        read.push_str(&String::from_utf8_lossy(&buffer[..n]));
    }
}

/// A watch's `timeoutSeconds` past what the clock counts (`u64::MAX` seconds) means no
/// timeout: the watch answers, sends its events, stays open, and the server goes on answering
/// everyone. The deadline was `now + timeout`, which panicked in the request's task: the
/// connection closed without an answer.
#[tokio::test]
async fn a_watch_with_a_timeout_past_the_clock_has_no_timeout() {
    use tokio::io::AsyncWriteExt;
    let server = FakeApiServer::start().await;
    server.apply(&configmap("web", "v1"));
    let address = server.url().trim_start_matches("http://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    let request = format!(
        "GET /api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds={} HTTP/1.1\r\nHost: {address}\r\n\r\n",
        u64::MAX
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut read = String::new();
    read_until(&mut stream, &mut read, r#""type":"ADDED""#).await;
    assert!(read.starts_with("HTTP/1.1 200"), "{read}");

    // Still open: a change made now reaches it, and the server answers other clients.
    server.apply(&configmap("web", "v2"));
    read_until(&mut stream, &mut read, r#""type":"MODIFIED""#).await;
    let api = Api::<ConfigMap>::namespaced(server.client(), "default");
    assert_eq!(support::value_of(&api.get("web").await.unwrap()), "v2");
    assert_eq!(server.requests().watches, 1);
}
