//! Controller replicas sharing one `RedisQueue<String>`: every object is reconciled, never by
//! two replicas at once. The Redis server is the test's own (`redis-server` on a free loopback
//! port); without the binary the test fails, unless `WQ_SKIP_REDIS_TESTS=1` outside CI.

// The Redis tests' server helper, shared rather than copied.
#[path = "../../workqueue-redis/tests/support/server.rs"]
mod server;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use workqueue::Outcome;
use workqueue_kube::Controller;
use workqueue_kube::testing::FakeApiServer;
use workqueue_redis::RedisQueue;

/// What both replicas' reconciles saw.
#[derive(Default)]
struct Shared {
    /// Objects being reconciled now, by any replica.
    running: Mutex<HashSet<String>>,
    /// Whether two replicas ever reconciled one object at once.
    overlapped: Mutex<bool>,
    /// (name, value) per reconcile, and which replica ran it.
    calls: Mutex<Vec<(String, String, usize)>>,
}

struct Replica {
    id: usize,
    shared: Arc<Shared>,
}

async fn reconcile(configmap: Arc<ConfigMap>, replica: Arc<Replica>) -> Outcome {
    let name = configmap.name_any();
    if !replica.shared.running.lock().unwrap().insert(name.clone()) {
        *replica.shared.overlapped.lock().unwrap() = true;
    }
    // Long enough for the other replica to try the same key if the queue let it.
    tokio::time::sleep(Duration::from_millis(2)).await;
    let value = configmap
        .data
        .as_ref()
        .and_then(|data| data.get("value"))
        .cloned()
        .unwrap_or_default();
    replica
        .shared
        .calls
        .lock()
        .unwrap()
        .push((name.clone(), value, replica.id));
    replica.shared.running.lock().unwrap().remove(&name);
    Outcome::Done
}

fn configmap(name: &str, value: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some("default".to_owned()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("value".to_owned(), value.to_owned())])),
        ..ConfigMap::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_sharing_a_redis_queue_reconcile_each_object_one_at_a_time() {
    if !server::require_binary() {
        return;
    }
    let redis = server::RedisServer::start().expect("redis-server starts");
    let api = FakeApiServer::start().await;
    for index in 0..20 {
        api.apply(&configmap(&format!("web-{index}"), "v1"));
    }
    let shared = Arc::new(Shared::default());
    let mut replicas = Vec::new();
    for id in 0..2 {
        // Each replica has its own client, watcher and store, as separate processes would.
        let queue: RedisQueue<String> = RedisQueue::connect(&redis.url(), "configmaps")
            .await
            .expect("connect to the test's redis-server");
        let replica = Arc::new(Replica {
            id,
            shared: shared.clone(),
        });
        replicas.push(
            Controller::with_queue(
                queue,
                Api::<ConfigMap>::namespaced(api.client(), "default"),
                watcher::Config::default(),
            )
            .workers(|workers| workers.count(3))
            .run(reconcile, replica),
        );
    }

    let reconciled_at = |value: &str| {
        let calls = shared.calls.lock().unwrap();
        let names: HashSet<&str> = calls
            .iter()
            .filter(|(_, v, _)| v == value)
            .map(|(name, ..)| name.as_str())
            .collect();
        names.len()
    };
    eventually("every object reconciled", || reconciled_at("v1") == 20).await;
    for index in 0..20 {
        api.apply(&configmap(&format!("web-{index}"), "v2"));
    }
    eventually("every change reconciled", || reconciled_at("v2") == 20).await;

    for replica in replicas {
        let summary = replica.shut_down().await.unwrap();
        assert!(summary.is_drained());
    }
    assert!(
        !*shared.overlapped.lock().unwrap(),
        "two replicas held one object at once"
    );
}

/// Waits until `done` holds, checking every 10 ms; fails after 30 s.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..3000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}
