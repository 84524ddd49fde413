//! Metrics by default: the workqueue series of a controller built with `Controller::new`
//! appear in the process-wide registry under its kind, or its name, with no extra code.
//! (A test binary of its own: the registry is the process's.)

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::runtime::watcher;
use workqueue::Outcome;
use workqueue_kube::Controller;
use workqueue_kube::testing::FakeApiServer;

mod support;
use support::{Widget, configmap, eventually, widget};

/// The registry's text.
fn metrics() -> String {
    let mut text = String::new();
    workqueue_kube::metrics::encode(&mut text).unwrap();
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_controller_reports_the_workqueue_series_under_its_kind_or_name() {
    let server = FakeApiServer::start().await;
    for name in ["alpha", "beta", "gamma"] {
        server.apply(&widget(name, 1));
    }
    server.apply(&configmap("web", "v1"));
    let widgets = Controller::new(
        Api::<Widget>::namespaced(server.client(), "default"),
        watcher::Config::default(),
    )
    .run(
        |_: Arc<Widget>, _: Arc<()>| async { Outcome::Done },
        Arc::new(()),
    );
    let configmaps = Controller::new(
        Api::<ConfigMap>::namespaced(server.client(), "default"),
        watcher::Config::default(),
    )
    .name("settings")
    .run(
        |_: Arc<ConfigMap>, _: Arc<()>| async { Outcome::Done },
        Arc::new(()),
    );
    eventually("every object reconciled", || {
        widgets.stats().succeeded == 3 && configmaps.stats().succeeded == 1
    })
    .await;
    assert_eq!(widgets.queue().name(), Some("widget"));
    widgets.shut_down().await.unwrap();
    configmaps.shut_down().await.unwrap();

    let text = metrics();
    for line in [
        r#"workqueue_adds_total{name="widget"} 3"#,
        r#"workqueue_depth{name="widget"} 0"#,
        r#"workqueue_work_duration_seconds_count{name="widget"} 3"#,
        r#"workqueue_adds_total{name="settings"} 1"#,
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }
}
