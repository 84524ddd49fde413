//! A ConfigMap controller on the workqueue.
//!
//! With a kubeconfig (`KUBECONFIG`, or `~/.kube/config`) it watches the ConfigMaps of the
//! current namespace of that cluster and reconciles them (read only: it reports their size)
//! until Ctrl-C; a real cluster's `https://` address needs the `rustls-tls` feature.
//! Without one it starts the in-process API server, plays a few minutes of a cluster's life
//! in a second (creations, updates, a deletion, a failing object, an expired watch that
//! forces a relist), and ends by itself once every object is reconciled at its newest
//! version, printing the workers' summary and the queue's metrics.
//!
//! ```sh
//! cargo run -p workqueue-kube --example configmap_controller
//! cargo run -p workqueue-kube --features rustls-tls --example configmap_controller  # a cluster
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use workqueue::metrics::prometheus::PrometheusMetrics;
use workqueue::rate_limiter::ExponentialFailure;
use workqueue::{Outcome, WorkQueue};
use workqueue_kube::Controller;
use workqueue_kube::testing::FakeApiServer;

/// What the reconciles have seen: each object's resource version at its last success, and
/// how often the flaky one failed.
#[derive(Default)]
struct Context {
    reconciled: Mutex<HashMap<String, String>>,
    flaky_failures: Mutex<u32>,
}

async fn reconcile(configmap: Arc<ConfigMap>, context: Arc<Context>) -> Result<Outcome, String> {
    let name = configmap.name_any();
    let keys = configmap.data.as_ref().map_or(0, BTreeMap::len);
    // A transient failure, twice: retried with the queue's per-object backoff.
    if name == "flaky" {
        let mut failures = context.flaky_failures.lock().unwrap();
        if *failures < 2 {
            *failures += 1;
            return Err(format!("{name}: the API server timed out"));
        }
    }
    // An object no retry can fix.
    if configmap.labels().contains_key("invalid") {
        println!("giving up on {name}: marked invalid");
        return Ok(Outcome::GiveUp);
    }
    println!(
        "reconciled {}/{name}: {keys} keys (resource version {})",
        configmap.namespace().unwrap_or_default(),
        configmap.resource_version().unwrap_or_default(),
    );
    context
        .reconciled
        .lock()
        .unwrap()
        .insert(name, configmap.resource_version().unwrap_or_default());
    Ok(Outcome::Done)
}

fn kubeconfig_present() -> bool {
    std::env::var_os("KUBECONFIG").is_some()
        || std::env::var_os("HOME")
            .map(|home| PathBuf::from(home).join(".kube/config"))
            .is_some_and(|path| path.exists())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if kubeconfig_present() {
        against_a_cluster().await
    } else {
        in_process().await;
        Ok(())
    }
}

/// Watches a real cluster until Ctrl-C.
async fn against_a_cluster() -> Result<(), Box<dyn std::error::Error>> {
    let client = kube::Client::try_default().await.map_err(|error| {
        format!("cannot reach the cluster in your kubeconfig ({error}); https needs --features rustls-tls")
    })?;
    let configmaps: Api<ConfigMap> = Api::default_namespaced(client);
    let queue: WorkQueue<ObjectRef<ConfigMap>> = WorkQueue::builder().name("configmaps").build();
    println!("watching the cluster's ConfigMaps; Ctrl-C stops");
    let summary = Controller::with_queue(queue, configmaps, watcher::Config::default())
        .workers(|workers| workers.count(4).max_retries(5))
        .run(reconcile, Arc::new(Context::default()))
        .run_until(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
    println!("{summary}");
    Ok(())
}

fn configmap(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some("default".to_owned()),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                .collect(),
        ),
        ..ConfigMap::default()
    }
}

/// Plays a cluster's changes against the in-process API server and stops once settled.
async fn in_process() {
    println!("no kubeconfig: running against an in-process API server");
    let server = FakeApiServer::start().await;
    for index in 0..8 {
        server.apply(&configmap(&format!("app-{index}"), &[("replicas", "1")]));
    }
    server.apply(&configmap("flaky", &[("mode", "eventually")]));
    let mut invalid = configmap("broken", &[]);
    invalid.metadata.labels = Some(BTreeMap::from([("invalid".to_owned(), "true".to_owned())]));
    server.apply(&invalid);

    let mut registry = Registry::default();
    let queue: WorkQueue<ObjectRef<ConfigMap>> = WorkQueue::builder()
        .name("configmaps")
        .metrics(PrometheusMetrics::new(&mut registry))
        .rate_limiter(ExponentialFailure::new(
            Duration::from_millis(5),
            Duration::from_secs(1),
        ))
        .build();
    let context = Arc::new(Context::default());
    let controller = Controller::with_queue(
        queue.clone(),
        Api::<ConfigMap>::namespaced(server.client(), "default"),
        watcher::Config::default(),
    )
    .workers(|workers| {
        workers
            .count(4)
            .max_retries(5)
            .timeout(Duration::from_secs(30))
            .on_give_up(|gave_up| {
                println!("gave up on {:?} ({})", gave_up.item.name, gave_up.reason)
            })
    })
    .run(reconcile, context.clone());
    controller
        .store()
        .wait_until_ready()
        .await
        .expect("the first list");

    // A cluster's life: updates (several to one object while it waits), a new object, a
    // deletion, and an expired watch that makes the watcher relist.
    for replicas in ["2", "3", "4"] {
        server.apply(&configmap("app-0", &[("replicas", replicas)]));
    }
    server.apply(&configmap("app-8", &[("replicas", "1")]));
    server.delete::<ConfigMap>(Some("default"), "app-7");
    server.expire_watches();
    server.apply(&configmap("app-1", &[("replicas", "5")]));

    let store = controller.store().clone();
    let settled = async {
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let reconciled = context.reconciled.lock().unwrap().clone();
            let current = store.state().iter().all(|object| {
                object.labels().contains_key("invalid")
                    || reconciled.get(&object.name_any()) == object.resource_version().as_ref()
            });
            let idle = queue.is_empty() && queue.delayed_len() == 0 && queue.processing_len() == 0;
            if current && idle && server.requests().lists >= 2 {
                return;
            }
        }
    };
    let summary = controller.run_until(settled).await;

    println!("{summary}");
    println!("API server: {:?}", server.requests());
    let mut metrics = String::new();
    encode(&mut metrics, &registry).expect("encode the metrics");
    for line in metrics.lines().filter(|line| {
        line.starts_with("workqueue_adds_total") || line.starts_with("workqueue_retries_total")
    }) {
        println!("{line}");
    }
    assert!(summary.is_drained());
    // The invalid object, given up once, or twice if the relist queued it again after.
    assert!((1..=2).contains(&summary.given_up), "{summary}");
    assert_eq!(*context.flaky_failures.lock().unwrap(), 2);
}
