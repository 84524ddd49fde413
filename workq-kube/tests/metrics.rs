//! Metrics by default: the workqueue series of a controller built with `Controller::new`
//! appear in the process-wide registry under its kind, or its name, with no extra code; and
//! controller-runtime's reconcile series, one test per series, each under a controller name
//! of its own. (A test binary of its own: the registry is the process's.)

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::runtime::watcher;
use workq::Outcome;
use workq_kube::Controller;
use workq_kube::testing::FakeApiServer;

mod support;
use support::{Widget, configmap, eventually, metrics, sample, widget};

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

/// The value of `series{controller="<controller>"}`, or of a `result` of
/// `controller_runtime_reconcile_total`; 0 must be there as a sample, not as an absence.
fn value(series: &str, controller: &str) -> f64 {
    let text = metrics();
    sample(&text, series, &format!(r#"controller="{controller}""#))
        .unwrap_or_else(|| panic!("{series} of {controller} missing from:\n{text}"))
}

fn result(controller: &str, result: &str) -> f64 {
    let text = metrics();
    sample(
        &text,
        "controller_runtime_reconcile_total",
        &format!(r#"controller="{controller}",result="{result}""#),
    )
    .unwrap_or_else(|| panic!("{result} of {controller} missing from:\n{text}"))
}

/// How many times each ConfigMap was reconciled, by name.
#[derive(Default)]
struct Calls(std::sync::Mutex<std::collections::HashMap<String, usize>>);

impl Calls {
    /// Counts a call of `name`; returns how many there were before it.
    fn count(&self, name: &str) -> usize {
        let mut calls = self.0.lock().unwrap();
        let before = calls.get(name).copied().unwrap_or(0);
        calls.insert(name.to_owned(), before + 1);
        before
    }
}

/// A server with ConfigMaps of these names.
async fn server_with(names: &[&str]) -> FakeApiServer {
    let server = FakeApiServer::start().await;
    for name in names {
        server.apply(&configmap(name, "v1"));
    }
    server
}

fn configmaps(server: &FakeApiServer) -> Api<ConfigMap> {
    Api::namespaced(server.client(), "default")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reconcile_series_exists_at_zero_from_the_start() {
    let server = server_with(&[]).await;
    let controller = Controller::new(configmaps(&server), watcher::Config::default())
        .name("fresh")
        .workers(|workers| workers.count(5))
        .run(
            |_: Arc<ConfigMap>, _: Arc<()>| async { Outcome::Done },
            Arc::new(()),
        );
    controller.wait_until_ready().await;
    for end in ["success", "error", "requeue", "requeue_after"] {
        assert_eq!(result("fresh", end), 0.0, "{end}");
    }
    for series in [
        "controller_runtime_reconcile_errors_total",
        "controller_runtime_terminal_reconcile_errors_total",
        "controller_runtime_reconcile_panics_total",
        "controller_runtime_reconcile_timeouts_total",
        "controller_runtime_active_workers",
        "controller_runtime_reconcile_time_seconds_count",
    ] {
        assert_eq!(value(series, "fresh"), 0.0, "{series}");
    }
    assert_eq!(
        value("controller_runtime_max_concurrent_reconciles", "fresh"),
        5.0
    );
    controller.shut_down().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_total_counts_each_result() {
    use kube::runtime::controller::Action;
    let server = server_with(&["ok", "later", "again", "broken"]).await;
    let calls = Arc::new(Calls::default());
    let controller = Controller::new(configmaps(&server), watcher::Config::default())
        .name("results")
        .run(
            |configmap: Arc<ConfigMap>, calls: Arc<Calls>| async move {
                let name = configmap.metadata.name.clone().unwrap();
                let first = calls.count(&name) == 0;
                match name.as_str() {
                    "later" => Ok(Action::requeue(Duration::from_secs(3600))),
                    "again" if first => Ok(Action::requeue(Duration::ZERO)),
                    "broken" if first => Err(std::io::Error::other("broken")),
                    _ => Ok(Action::await_change()),
                }
            },
            calls.clone(),
        );
    // ok, later, again twice, broken twice.
    eventually("every reconcile", || controller.stats().processed == 6).await;
    controller.shut_down().await.unwrap();
    assert_eq!(result("results", "success"), 3.0);
    assert_eq!(result("results", "requeue_after"), 1.0);
    assert_eq!(result("results", "requeue"), 1.0);
    assert_eq!(result("results", "error"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_requeue_without_an_error_is_a_requeue() {
    let server = server_with(&["web"]).await;
    let calls = Arc::new(Calls::default());
    let controller = Controller::new(configmaps(&server), watcher::Config::default())
        .name("requeues")
        .run(
            |configmap: Arc<ConfigMap>, calls: Arc<Calls>| async move {
                match calls.count(configmap.metadata.name.as_deref().unwrap()) {
                    0 | 1 => Outcome::Retry,
                    _ => Outcome::Done,
                }
            },
            calls.clone(),
        );
    eventually("three reconciles", || controller.stats().processed == 3).await;
    controller.shut_down().await.unwrap();
    assert_eq!(result("requeues", "requeue"), 2.0);
    assert_eq!(result("requeues", "success"), 1.0);
    assert_eq!(
        value("controller_runtime_reconcile_errors_total", "requeues"),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_total_counts_failed_reconciles() {
    let server = server_with(&["flaky", "fine"]).await;
    let calls = Arc::new(Calls::default());
    let controller = Controller::new(configmaps(&server), watcher::Config::default())
        .name("errors")
        .run(
            |configmap: Arc<ConfigMap>, calls: Arc<Calls>| async move {
                let name = configmap.metadata.name.clone().unwrap();
                if name == "flaky" && calls.count(&name) < 3 {
                    return Err(std::io::Error::other("flaky"));
                }
                Ok(Outcome::Done)
            },
            calls.clone(),
        );
    eventually("every reconcile", || controller.stats().processed == 5).await;
    controller.shut_down().await.unwrap();
    assert_eq!(
        value("controller_runtime_reconcile_errors_total", "errors"),
        3.0
    );
    assert_eq!(result("errors", "error"), 3.0);
    assert_eq!(
        value(
            "controller_runtime_terminal_reconcile_errors_total",
            "errors"
        ),
        0.0,
        "retried errors are not terminal"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_errors_count_the_give_ups_of_the_policy_the_reconcile_and_max_retries() {
    use workq_kube::ErrorAction;
    let server = server_with(&["doomed", "hopeless", "invalid", "flaky"]).await;
    let calls = Arc::new(Calls::default());
    let controller = Controller::new(configmaps(&server), watcher::Config::default())
        .name("terminal")
        .error_policy(|configmap: Arc<ConfigMap>, _: &std::io::Error, _| {
            if configmap.metadata.name.as_deref() == Some("doomed") {
                ErrorAction::GiveUp
            } else {
                ErrorAction::Backoff
            }
        })
        .workers(|workers| workers.max_retries(1))
        .run(
            |configmap: Arc<ConfigMap>, calls: Arc<Calls>| async move {
                let name = configmap.metadata.name.clone().unwrap();
                let before = calls.count(&name);
                match name.as_str() {
                    "invalid" => Ok(Outcome::GiveUp),
                    "flaky" if before == 0 => Err(std::io::Error::other("flaky")),
                    "flaky" => Ok(Outcome::Done),
                    // `doomed` is given up by the policy, `hopeless` after one retry.
                    _ => Err(std::io::Error::other("no")),
                }
            },
            calls.clone(),
        );
    // doomed 1, hopeless 2, invalid 1, flaky 2.
    eventually("every reconcile", || controller.stats().processed == 6).await;
    let summary = controller.shut_down().await.unwrap();
    assert_eq!(summary.given_up, 3, "{summary:?}");
    assert_eq!(
        value(
            "controller_runtime_terminal_reconcile_errors_total",
            "terminal"
        ),
        3.0
    );
    // Every failure is an error: doomed, hopeless twice, invalid, flaky once.
    assert_eq!(
        value("controller_runtime_reconcile_errors_total", "terminal"),
        5.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panics_total_counts_a_panicking_reconcile_as_an_error_too() {
    let server = server_with(&["web"]).await;
    let calls = Arc::new(Calls::default());
    let controller = Controller::new(configmaps(&server), watcher::Config::default())
        .name("panics")
        .run(
            |_: Arc<ConfigMap>, calls: Arc<Calls>| async move {
                if calls.count("web") == 0 {
                    panic!("the reconcile panics");
                }
                Outcome::Done
            },
            calls.clone(),
        );
    eventually("the retry after the panic", || {
        controller.stats().processed == 2
    })
    .await;
    controller.shut_down().await.unwrap();
    assert_eq!(
        value("controller_runtime_reconcile_panics_total", "panics"),
        1.0
    );
    assert_eq!(
        value("controller_runtime_reconcile_errors_total", "panics"),
        1.0
    );
    assert_eq!(result("panics", "success"), 1.0);
    assert_eq!(
        value("controller_runtime_reconcile_timeouts_total", "panics"),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_total_counts_reconciles_the_workers_timeout_cut_off() {
    let server = server_with(&["slow"]).await;
    let calls = Arc::new(Calls::default());
    let controller = Controller::new(configmaps(&server), watcher::Config::default())
        .name("timeouts")
        .workers(|workers| workers.timeout(Duration::from_millis(100)))
        .run(
            |_: Arc<ConfigMap>, calls: Arc<Calls>| async move {
                if calls.count("slow") == 0 {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                Outcome::Done
            },
            calls.clone(),
        );
    eventually("the retry after the timeout", || {
        controller.stats().processed == 2
    })
    .await;
    controller.shut_down().await.unwrap();
    assert_eq!(
        value("controller_runtime_reconcile_timeouts_total", "timeouts"),
        1.0
    );
    assert_eq!(
        value("controller_runtime_reconcile_errors_total", "timeouts"),
        1.0
    );
    assert_eq!(
        value("controller_runtime_reconcile_panics_total", "timeouts"),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_time_is_a_histogram_with_controller_runtimes_buckets() {
    let server = server_with(&["a", "b"]).await;
    let controller = Controller::new(configmaps(&server), watcher::Config::default())
        .name("timing")
        .run(
            |_: Arc<ConfigMap>, _: Arc<()>| async {
                tokio::time::sleep(Duration::from_millis(30)).await;
                Outcome::Done
            },
            Arc::new(()),
        );
    eventually("both reconciled", || controller.stats().processed == 2).await;
    controller.shut_down().await.unwrap();
    let text = metrics();
    let buckets: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("controller_runtime_reconcile_time_seconds_bucket{"))
        .filter(|line| line.contains(r#"controller="timing""#))
        .map(|line| {
            let le = line.split("le=\"").nth(1).unwrap();
            &le[..le.find('"').unwrap()]
        })
        .collect();
    // pkg/internal/controller/metrics/metrics.go, ReconcileTime.
    let expected = [
        0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8,
        0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0,
        15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0,
    ];
    assert_eq!(buckets.len(), expected.len() + 1, "{buckets:?}");
    for (le, expected) in buckets.iter().zip(expected) {
        assert_eq!(le.parse::<f64>().unwrap(), expected);
    }
    assert_eq!(buckets.last(), Some(&"+Inf"));
    let bucket = |le: &str| {
        sample(
            &text,
            "controller_runtime_reconcile_time_seconds_bucket",
            &format!(r#"le="{le}",controller="timing""#),
        )
        .or_else(|| {
            sample(
                &text,
                "controller_runtime_reconcile_time_seconds_bucket",
                &format!(r#"controller="timing",le="{le}""#),
            )
        })
        .unwrap_or_else(|| panic!("bucket {le} missing from:\n{text}"))
    };
    // Each reconcile slept 30 ms.
    assert_eq!(bucket("0.025"), 0.0);
    assert_eq!(bucket("60.0"), 2.0);
    assert_eq!(
        value("controller_runtime_reconcile_time_seconds_count", "timing"),
        2.0
    );
    assert!(value("controller_runtime_reconcile_time_seconds_sum", "timing") >= 0.06);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_workers_counts_the_reconciles_in_flight_and_max_concurrent_the_workers() {
    let server = server_with(&["a", "b"]).await;
    let (open, gate) = tokio::sync::watch::channel(false);
    let controller = Controller::new(configmaps(&server), watcher::Config::default())
        .name("active")
        .workers(|workers| workers.count(3))
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
    assert_eq!(
        value("controller_runtime_max_concurrent_reconciles", "active"),
        3.0
    );
    eventually("two workers busy", || {
        value("controller_runtime_active_workers", "active") == 2.0
    })
    .await;
    open.send_replace(true);
    eventually("both reconciled", || controller.stats().processed == 2).await;
    eventually("the workers idle", || {
        value("controller_runtime_active_workers", "active") == 0.0
    })
    .await;
    controller.shut_down().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scrape_is_kept_for_promtool() {
    let server = server_with(&["web"]).await;
    let controller = Controller::new(configmaps(&server), watcher::Config::default())
        .name("scraped")
        .leader_elected("scraped")
        .run(
            |_: Arc<ConfigMap>, _: Arc<()>| async { Outcome::Done },
            Arc::new(()),
        );
    eventually("reconciled", || controller.stats().processed == 1).await;
    controller.shut_down().await.unwrap();
    // The classic text format Kubernetes components serve, kept for CI's `promtool check
    // metrics` (`.ci/run`).
    let text = workq_kube::metrics::with_registry(|registry| {
        workq_dashboard::exposition::encode_prometheus_text(registry)
    })
    .unwrap();
    let target = std::env::var("CARGO_TARGET_DIR").map_or_else(
        |_| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"),
        std::path::PathBuf::from,
    );
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("kube-metrics.txt"), &text).unwrap();
    assert!(text.contains("# TYPE controller_runtime_reconcile_total counter"));
    assert!(text.contains(r#"leader_election_master_status{name="scraped"} 0"#));
    assert!(text.contains(
        r#"controller_runtime_reconcile_total{controller="scraped",result="success"} 1"#
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_election_master_status_is_one_while_leading() {
    use workq_kube::LeaderElection;
    let server = server_with(&["web"]).await;
    let status = || {
        let text = metrics();
        sample(&text, "leader_election_master_status", r#"name="gauged""#)
            .unwrap_or_else(|| panic!("no leader_election_master_status in:\n{text}"))
    };
    let controller = Controller::new(configmaps(&server), watcher::Config::default())
        .name("gauged")
        .leader_election(
            LeaderElection::new("gauged")
                .lease_duration(Duration::from_secs(2))
                .renew_deadline(Duration::from_secs(1))
                .retry_period(Duration::from_millis(100)),
        )
        .run(
            |_: Arc<ConfigMap>, _: Arc<()>| async { Outcome::Done },
            Arc::new(()),
        );
    eventually("leading", || controller.is_leader()).await;
    assert_eq!(status(), 1.0);
    // Renewals go through the fast path: no slow path while nobody else writes the Lease.
    tokio::time::sleep(Duration::from_millis(350)).await;
    let text = metrics();
    assert_eq!(
        sample(&text, "leader_election_slowpath_total", r#"name="gauged""#).unwrap_or(0.0),
        0.0
    );
    controller.shut_down().await.unwrap();
    assert_eq!(status(), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_election_slowpath_counts_renewals_that_read_the_lease_again() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{Patch, PatchParams};
    use workq_kube::LeaderElection;
    let server = server_with(&["web"]).await;
    let controller = Controller::new(configmaps(&server), watcher::Config::default())
        .name("slowpath")
        .leader_election(
            LeaderElection::new("slowpath")
                .lease_duration(Duration::from_secs(2))
                .renew_deadline(Duration::from_secs(1))
                .retry_period(Duration::from_millis(100)),
        )
        .run(
            |_: Arc<ConfigMap>, _: Arc<()>| async { Outcome::Done },
            Arc::new(()),
        );
    eventually("leading", || controller.is_leader()).await;
    // Someone else writes the Lease (a label): the leader's optimistic renewal conflicts,
    // it reads the Lease again and renews from there, still the leader.
    let leases: Api<Lease> = Api::namespaced(server.client(), "default");
    let label = serde_json::json!({ "metadata": { "labels": { "touched": "yes" } } });
    leases
        .patch("slowpath", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    eventually("a slow-path renewal", || {
        sample(
            &metrics(),
            "leader_election_slowpath_total",
            r#"name="slowpath""#,
        )
        .is_some_and(|count| count >= 1.0)
    })
    .await;
    assert!(controller.is_leader());
    controller.shut_down().await.unwrap();
}
