//! Controllers on a `RedisQueue<String>`: replicas sharing it reconcile every object, never
//! two at once; a list's keys enter in batches, at list priority. The Redis server is the
//! test's own (`redis-server` on a free loopback port); without the binary the test fails,
//! unless `WQ_SKIP_REDIS_TESTS=1` outside CI.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use support::replicas::{self, Replica, Shared, reconcile};
use support::{configmap, eventually};
use tokio::sync::watch;
use workq::{Outcome, Queue};
use workq_conformance::servers::redis as server;
use workq_kube::Controller;
use workq_kube::testing::FakeApiServer;
use workq_redis::RedisQueue;

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

    eventually("every object reconciled", || {
        shared.reconciled_at("v1") == 20
    })
    .await;
    for index in 0..20 {
        api.apply(&configmap(&format!("web-{index}"), "v2"));
    }
    eventually("every change reconciled", || {
        shared.reconciled_at("v2") == 20
    })
    .await;

    for replica in replicas {
        let summary = replica.shut_down().await.unwrap();
        assert!(summary.is_drained());
    }
    assert!(!shared.overlapped(), "two replicas held one object at once");
    // controller-runtime's reconcile series on a shared queue too: both replicas (one
    // process here) under the queue's name, which no other test of this binary uses.
    let mut text = String::new();
    workq_kube::metrics::encode(&mut text).unwrap();
    let reconciles = shared.count();
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
    let reconciled = |value: &str| shared.reconciled("web-0", value, None);
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
/// leader's workers take keys; after the leader's graceful stop the other one does, without
/// a list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_elected_replicas_on_a_redis_queue_reconcile_on_the_leader_only() {
    if !server::require_binary() {
        return;
    }
    let redis = server::RedisServer::start().expect("redis-server starts");
    let api = FakeApiServer::start().await;
    replicas::leader_elected_pair(&api, || async {
        RedisQueue::<String>::connect(&redis.url(), "elected")
            .await
            .unwrap()
    })
    .await;
}
