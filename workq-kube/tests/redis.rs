//! Controllers on a `RedisQueue<String>`: replicas sharing it reconcile every object, never
//! two at once; a list's keys enter in batches, at list priority. The Redis server is the
//! test's own (`redis-server` on a free loopback port); without the binary the test fails,
//! unless `WQ_SKIP_REDIS_TESTS=1` outside CI.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use tokio::sync::watch;
use workq::{Outcome, Queue};
use workq_conformance::servers::redis as server;
use workq_kube::Controller;
use workq_kube::testing::FakeApiServer;
use workq_redis::RedisQueue;

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
        let queue: RedisQueue<String> = RedisQueue::connect(&redis.url(), "replicas")
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
    // controller-runtime's reconcile series on a shared queue too: both replicas (one
    // process here) under the queue's name, which no other test of this binary uses.
    let mut text = String::new();
    workq_kube::metrics::encode(&mut text).unwrap();
    let reconciles = shared.calls.lock().unwrap().len();
    for line in [
        format!(
            r#"controller_runtime_reconcile_total{{controller="replicas",result="success"}} {reconciles}"#
        ),
        r#"controller_runtime_reconcile_errors_total{controller="replicas"} 0"#.to_owned(),
        r#"controller_runtime_max_concurrent_reconciles{controller="replicas"} 3"#.to_owned(),
        r#"controller_runtime_active_workers{controller="replicas"} 0"#.to_owned(),
        format!(
            r#"controller_runtime_reconcile_time_seconds_count{{controller="replicas"}} {reconciles}"#
        ),
    ] {
        assert!(text.contains(&line), "{line} missing from:\n{text}");
    }
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

/// How many scripts the server has run so far (`EVALSHA` and `EVAL` calls): one per add
/// without batching, one per 200 adds with it.
async fn script_calls(url: &str) -> u64 {
    let client = redis::Client::open(url).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut connection)
        .await
        .unwrap();
    info.lines()
        .filter(|line| line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:"))
        .filter_map(|line| {
            let calls = line.split("calls=").nth(1)?;
            calls.split(',').next()?.parse::<u64>().ok()
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_enters_redis_in_batches_at_list_priority() {
    if !server::require_binary() {
        return;
    }
    let redis = server::RedisServer::start_with(server::Durability::None, &[])
        .expect("redis-server starts");
    let api = FakeApiServer::start().await;
    for index in 0..1000 {
        api.apply(&configmap(&format!("web-{index:03}"), "v1"));
    }
    let queue: RedisQueue<String> = RedisQueue::connect(&redis.url(), "configmaps")
        .await
        .unwrap();
    let (open, gate) = watch::channel(false);
    let calls = Arc::new(Mutex::new(Vec::new()));
    let before = script_calls(&redis.url()).await;
    let controller = Controller::with_queue(
        queue.clone(),
        Api::<ConfigMap>::namespaced(api.client(), "default"),
        watcher::Config::default(),
    )
    .run(
        move |configmap: Arc<ConfigMap>, calls: Arc<Mutex<Vec<String>>>| {
            let mut gate = gate.clone();
            async move {
                calls.lock().unwrap().push(configmap.name_any());
                let _ = gate.wait_for(|open| *open).await;
                Outcome::Done
            }
        },
        calls.clone(),
    );
    // The one worker holds the first key; the other 999 wait in Redis.
    eventually("the list's keys added", || {
        controller.feed_stats().added == 1000
    })
    .await;
    eventually("the first key in flight", || {
        calls.lock().unwrap().len() == 1
    })
    .await;
    let scripts = script_calls(&redis.url()).await - before;
    // 5 runs of 200 adds, the worker's hand-out and a few looks at an empty queue; one add at
    // a time would be 1,000 runs.
    assert!(scripts < 50, "{scripts} scripts for a list of 1,000");

    // Listed keys wait at -100: a live change comes out first.
    api.apply(&configmap("web-999", "v2"));
    eventually("the live key added", || {
        controller.feed_stats().added == 1001
    })
    .await;
    assert_eq!(Queue::len(&queue).await.unwrap(), 999);
    open.send_replace(true);
    eventually("every object reconciled", || {
        calls.lock().unwrap().len() == 1000
    })
    .await;
    let summary = controller.shut_down().await.unwrap();
    assert_eq!(calls.lock().unwrap()[1], "web-999");
    assert!(summary.is_drained());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_under_the_controller_is_survived() {
    if !server::require_binary() {
        return;
    }
    let mut redis = server::RedisServer::start().expect("redis-server starts");
    let api = FakeApiServer::start().await;
    api.apply(&configmap("web-0", "v1"));
    // Calls give up after 200 ms of outage, so that the controller's own retries show.
    let queue: RedisQueue<String> = RedisQueue::builder("configmaps")
        .url(redis.url())
        .retry_deadline(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let shared = Arc::new(Shared::default());
    let controller = Controller::with_queue(
        queue,
        Api::<ConfigMap>::namespaced(api.client(), "default"),
        watcher::Config::default(),
    )
    .run(
        reconcile,
        Arc::new(Replica {
            id: 0,
            shared: shared.clone(),
        }),
    );
    let reconciled = |value: &str| {
        shared
            .calls
            .lock()
            .unwrap()
            .iter()
            .any(|(name, v, _)| name == "web-0" && v == value)
    };
    // Done with it (a `done` cut off by the outage would leave its lease to expire, 30 s).
    eventually("the first reconcile", || {
        reconciled("v1") && controller.stats().processed == 1
    })
    .await;

    // Redis goes away (its data is on disk, appendfsync always); a change comes meanwhile.
    redis.kill();
    api.apply(&configmap("web-0", "v2"));
    // The change's add fails (the queue gives up after 200 ms); the controller keeps it and
    // tries again until Redis is back.
    eventually("an add failed", || controller.feed_stats().add_errors >= 2).await;
    let _redis = tokio::task::spawn_blocking(move || {
        redis.restart();
        redis
    })
    .await
    .unwrap();
    eventually("the change reconciled after the restart", || {
        reconciled("v2")
    })
    .await;
    let summary = controller
        .shut_down()
        .await
        .expect("a Redis restart is not fatal");
    assert!(summary.is_drained());
}

/// A replica that stalled past its lease and then fails: the controller's failure path goes
/// to the queue's fenced step (`Queue::retry_and_done`), whose refusal the workers see as a
/// lost lease (`Queue::is_lease_lost`), not as a retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_replicas_failed_reconcile_changes_nothing_on_redis() {
    if !server::require_binary() {
        return;
    }
    let redis = server::RedisServer::start().expect("redis-server starts");
    let api = FakeApiServer::start().await;
    api.apply(&configmap("web-0", "v1"));
    // Leases that expire 300 ms after the hand-out: the replica stalls past it.
    let build = || {
        RedisQueue::<String>::builder("stale")
            .url(redis.url())
            .lease_duration(Duration::from_millis(300))
            .auto_renew(false)
            .build()
    };
    let queue = build().await.unwrap();
    let (fail, failing) = watch::channel(false);
    let started = Arc::new(Mutex::new(0_usize));
    let controller = Controller::with_queue(
        queue,
        Api::<ConfigMap>::namespaced(api.client(), "default"),
        watcher::Config::default(),
    )
    .run(
        move |_: Arc<ConfigMap>, started: Arc<Mutex<usize>>| {
            let mut failing = failing.clone();
            async move {
                *started.lock().unwrap() += 1;
                let _ = failing.wait_for(|fail| *fail).await;
                Err::<Outcome, _>(std::io::Error::other("the stale replica fails"))
            }
        },
        started.clone(),
    );
    eventually("the replica holds the key", || {
        *started.lock().unwrap() == 1
    })
    .await;
    // The lease expires; another process takes the key.
    tokio::time::sleep(Duration::from_millis(450)).await;
    let other = build().await.unwrap();
    let current = tokio::time::timeout(Duration::from_secs(5), Queue::get(&other))
        .await
        .expect("the expired lease is reclaimed")
        .unwrap()
        .expect("not shut down");
    assert_eq!(current.item(), "default/web-0");

    // The stale replica's reconcile fails: its retry is refused whole, and seen as a lost
    // lease, not as a retry.
    fail.send_replace(true);
    eventually("the stale attempt ended", || {
        controller.stats().processed == 1
    })
    .await;
    let stats = controller.stats();
    assert_eq!(stats.lease_lost, 1, "{stats:?}");
    assert_eq!(stats.retried, 0, "{stats:?}");
    workq::QueueLease::done(current).await.unwrap();
    controller.shut_down().await.unwrap();
}

/// Two leader-elected replicas on one Redis queue: both feed it (warm standby), only the
/// leader's workers take keys; after the leader's graceful stop the other one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_elected_replicas_on_a_redis_queue_reconcile_on_the_leader_only() {
    use workq_kube::LeaderElection;
    if !server::require_binary() {
        return;
    }
    let redis = server::RedisServer::start().expect("redis-server starts");
    let api = FakeApiServer::start().await;
    for index in 0..5 {
        api.apply(&configmap(&format!("web-{index}"), "v1"));
    }
    let shared = Arc::new(Shared::default());
    let start = |id: usize| {
        let (url, api_client, shared) = (
            redis.url(),
            api.client_named(&format!("replica-{id}")),
            shared.clone(),
        );
        async move {
            let queue: RedisQueue<String> = RedisQueue::connect(&url, "elected").await.unwrap();
            Controller::with_queue(
                queue,
                Api::<ConfigMap>::namespaced(api_client, "default"),
                watcher::Config::default(),
            )
            .leader_election(
                LeaderElection::new("elected")
                    .identity(format!("replica-{id}"))
                    .lease_duration(Duration::from_secs(2))
                    .renew_deadline(Duration::from_secs(1))
                    .retry_period(Duration::from_millis(200)),
            )
            .run(reconcile, Arc::new(Replica { id, shared }))
        }
    };
    let first = start(0).await;
    eventually("replica-0 leads", || first.is_leader()).await;
    let second = start(1).await;
    eventually("every object reconciled", || {
        shared.calls.lock().unwrap().len() >= 5
    })
    .await;
    second.wait_until_ready().await;
    // The standby's feed adds its events to the shared queue too; a change is reconciled,
    // by the leader.
    api.apply(&configmap("web-0", "v2"));
    eventually("the change reconciled", || {
        shared
            .calls
            .lock()
            .unwrap()
            .iter()
            .any(|(name, value, _)| name == "web-0" && value == "v2")
    })
    .await;
    assert!(!second.is_leader());
    assert!(
        shared.calls.lock().unwrap().iter().all(|(.., id)| *id == 0),
        "only the leader reconciles"
    );

    first.shut_down().await.unwrap();
    eventually("replica-1 leads", || second.is_leader()).await;
    api.apply(&configmap("web-1", "v2"));
    eventually("the next change reconciled by replica-1", || {
        shared
            .calls
            .lock()
            .unwrap()
            .iter()
            .any(|(name, value, id)| name == "web-1" && value == "v2" && *id == 1)
    })
    .await;
    second.shut_down().await.unwrap();
    assert!(!*shared.overlapped.lock().unwrap());
}
