//! controller-runtime's `priority` label on `workqueue_depth`, switched on for the
//! process-wide registry (a test binary of its own: the switch is the process's).

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::runtime::watcher;
use tokio::sync::watch;
use workq::Outcome;
use workq_kube::Controller;
use workq_kube::testing::FakeApiServer;

mod support;
use support::{configmap, eventually};

/// The registry's text.
fn metrics() -> String {
    let mut text = String::new();
    workq_kube::metrics::encode(&mut text).unwrap();
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controllers_depth_is_reported_by_priority_when_asked() {
    let server = FakeApiServer::start().await;
    for index in 0..5 {
        server.apply(&configmap(&format!("web-{index}"), "v1"));
    }
    let (open, gate) = watch::channel(false);
    let controller = Controller::new(
        Api::<ConfigMap>::namespaced(server.client(), "default"),
        watcher::Config::default(),
    )
    .name("prioritized")
    .run(
        move |_: Arc<ConfigMap>, _: Arc<()>| {
            let mut gate = gate.clone();
            async move {
                let _ = gate.wait_for(|open| *open).await;
                Outcome::Done
            }
        },
        Arc::new(()),
    );
    // The one worker holds a listed key; four more wait at list priority, then a change.
    eventually("the list queued", || controller.feed_stats().added == 5).await;
    server.apply(&configmap("web-4", "v2"));
    eventually("the change queued", || controller.feed_stats().added == 6).await;
    assert!(metrics().contains(r#"workqueue_depth{name="prioritized"} "#));

    workq_kube::metrics::set_depth_by_priority(true);
    let text = metrics();
    // web-4 was raised from -100 to 0 by its change; one listed key is in flight.
    for line in [
        r#"workqueue_depth{name="prioritized",priority="0"} 1"#,
        r#"workqueue_depth{name="prioritized",priority="-100"} 3"#,
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }
    assert!(!text.contains(r#"workqueue_depth{name="prioritized"} "#));
    open.send_replace(true);
    eventually("drained", || {
        metrics().contains(r#"workqueue_depth{name="prioritized",priority="-100"} 0"#)
    })
    .await;
    controller.shut_down().await.unwrap();
}
