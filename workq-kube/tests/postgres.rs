//! Controllers on a `PgQueue<String>`: controller-runtime's reconcile series in the
//! process-wide registry and the queue's workqueue series as the dashboard's `/metrics`
//! reports them; leader-elected replicas sharing the queue. The PostgreSQL server is the
//! test's own (`workq-conformance`'s: a free loopback port); without PostgreSQL the test
//! fails naming the package, unless `WQ_SKIP_PG_TESTS=1` outside CI.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use support::{configmap, eventually, metrics, replicas, sample};
use tokio::sync::watch;
use tower::ServiceExt;
use workq_conformance::servers::postgres::PgServer;
use workq_kube::Controller;
use workq_kube::testing::FakeApiServer;
use workq_postgres::{PgAdmin, PgQueue};

/// The dashboard's `/metrics` over every queue of the database, as an operator's Prometheus
/// scrapes it from this machine.
async fn scrape(dashboard: &axum::Router) -> String {
    let mut request = Request::get("/metrics")
        .header("host", "127.0.0.1:8080")
        .body(Body::empty())
        .unwrap();
    request.extensions_mut().insert(axum::extract::ConnectInfo(
        "127.0.0.1:40000".parse::<std::net::SocketAddr>().unwrap(),
    ));
    let response = dashboard.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

/// The queue `pg-metrics`'s sample of the workqueue series `name` in a scrape.
fn queue_sample(text: &str, name: &str) -> Option<f64> {
    sample(text, name, r#"name="pg-metrics",source="postgres""#)
}

/// Scrapes until the queue's samples hold the `expected` values (the dashboard reads the
/// server at most once a second), for up to 30 s; returns the last scrape.
async fn scrape_until(dashboard: &axum::Router, expected: &[(&str, f64)]) -> String {
    let mut text = String::new();
    for _ in 0..300 {
        text = scrape(dashboard).await;
        if expected
            .iter()
            .all(|(name, value)| queue_sample(&text, name) == Some(*value))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (name, value) in expected {
        assert_eq!(
            queue_sample(&text, name),
            Some(*value),
            "{name} in:\n{text}"
        );
    }
    text
}

/// controller-runtime's `series` of the controller `pg-metrics` (with `result` for
/// `reconcile_total`); 0 must be there as a sample, not as an absence.
fn reconciles(series: &str, result: Option<&str>) -> f64 {
    let text = metrics();
    let labels = match result {
        Some(result) => format!(r#"controller="pg-metrics",result="{result}""#),
        None => r#"controller="pg-metrics""#.to_owned(),
    };
    sample(&text, series, &labels).unwrap_or_else(|| panic!("{series}{{{labels}}} in:\n{text}"))
}

/// A controller on PostgreSQL reports controller-runtime's reconcile series by their names
/// (successes, an error and its retry, the reconcile time, the workers busy), and its queue
/// shows in the workqueue series with what waits and what is in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_on_postgres_reports_the_reconcile_and_workqueue_series() {
    let Some(pg) = PgServer::start() else {
        return;
    };
    let api = FakeApiServer::start().await;
    for index in 0..5 {
        api.apply(&configmap(&format!("web-{index}"), "v1"));
    }
    let queue: PgQueue<String> = PgQueue::connect(&pg.url(), "pg-metrics").await.unwrap();
    let dashboard = workq_dashboard::router(
        PgAdmin::new(&pg.url()).unwrap(),
        workq_dashboard::Config::default(),
    );
    // Every reconcile waits for the gate; web-0's first attempt fails.
    let (open, gate) = watch::channel(false);
    let attempts = Arc::new(AtomicUsize::new(0));
    let controller = Controller::with_queue(
        queue,
        Api::<ConfigMap>::namespaced(api.client(), "default"),
        watcher::Config::default(),
    )
    .workers(|workers| workers.count(2))
    .run(
        move |configmap: Arc<ConfigMap>, attempts: Arc<AtomicUsize>| {
            let mut gate = gate.clone();
            async move {
                let _ = gate.wait_for(|open| *open).await;
                let first =
                    configmap.name_any() == "web-0" && attempts.fetch_add(1, Ordering::SeqCst) == 0;
                if first {
                    Err(std::io::Error::other("web-0 fails once"))
                } else {
                    Ok(workq::Outcome::Done)
                }
            }
        },
        attempts.clone(),
    );

    // Two keys in flight, three waiting in PostgreSQL.
    assert_eq!(
        reconciles("controller_runtime_max_concurrent_reconciles", None),
        2.0
    );
    eventually("two workers busy", || {
        reconciles("controller_runtime_active_workers", None) == 2.0
    })
    .await;
    let text = scrape_until(
        &dashboard,
        &[("workqueue_depth", 3.0), ("workqueue_in_flight", 2.0)],
    )
    .await;
    for name in [
        "workqueue_unfinished_work_seconds",
        "workqueue_longest_running_processor_seconds",
    ] {
        assert!(
            queue_sample(&text, name).is_some_and(|seconds| seconds > 0.0),
            "{name} in:\n{text}"
        );
    }
    for name in ["success", "error", "requeue", "requeue_after"] {
        assert_eq!(
            reconciles("controller_runtime_reconcile_total", Some(name)),
            0.0
        );
    }

    // The gate opens: five successes and web-0's error, retried with the queue's backoff.
    open.send_replace(true);
    eventually("every object reconciled", || {
        controller.stats().succeeded == 5
    })
    .await;
    eventually("the workers idle", || {
        reconciles("controller_runtime_active_workers", None) == 0.0
    })
    .await;
    assert_eq!(
        reconciles("controller_runtime_reconcile_total", Some("success")),
        5.0
    );
    assert_eq!(
        reconciles("controller_runtime_reconcile_total", Some("error")),
        1.0
    );
    assert_eq!(
        reconciles("controller_runtime_reconcile_errors_total", None),
        1.0
    );
    assert_eq!(
        reconciles("controller_runtime_terminal_reconcile_errors_total", None),
        0.0
    );
    assert_eq!(
        reconciles("controller_runtime_reconcile_time_seconds_count", None),
        6.0
    );
    // The queue is empty again, and web-0's failure count was forgotten with its success.
    scrape_until(
        &dashboard,
        &[
            ("workqueue_depth", 0.0),
            ("workqueue_in_flight", 0.0),
            ("workqueue_failing_items", 0.0),
            ("workqueue_longest_running_processor_seconds", 0.0),
        ],
    )
    .await;
    assert!(controller.shut_down().await.unwrap().is_drained());
}

/// Two leader-elected replicas on one PostgreSQL queue: both feed it (warm standby), only
/// the leader's workers take keys; after the leader's graceful stop the other one does,
/// without a list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_elected_replicas_on_a_postgres_queue_reconcile_on_the_leader_only() {
    let Some(pg) = PgServer::start() else {
        return;
    };
    let api = FakeApiServer::start().await;
    replicas::leader_elected_pair(&api, || async {
        PgQueue::<String>::connect(&pg.url(), "elected")
            .await
            .unwrap()
    })
    .await;
}
