//! Controller replicas sharing one queue on a server (Redis, PostgreSQL): what their
//! reconciles saw, and the leader-elected pair each backend's tests run.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use workq::{Outcome, Queue};
use workq_kube::testing::FakeApiServer;
use workq_kube::{Controller, LeaderElection};

use super::{configmap, eventually, value_of};

/// What every replica's reconciles saw.
#[derive(Default)]
pub(crate) struct Shared {
    /// Objects being reconciled now, by any replica.
    running: Mutex<HashSet<String>>,
    /// Whether two replicas ever reconciled one object at once.
    overlapped: Mutex<bool>,
    /// (name, value) per reconcile, and which replica ran it.
    pub(crate) calls: Mutex<Vec<(String, String, usize)>>,
}

impl Shared {
    /// Whether two replicas ever reconciled one object at once.
    pub(crate) fn overlapped(&self) -> bool {
        *self.overlapped.lock().unwrap()
    }

    /// How many reconciles ran.
    pub(crate) fn count(&self) -> usize {
        self.calls.lock().unwrap().len()
    }

    /// How many distinct objects were reconciled seeing `value`.
    pub(crate) fn reconciled_at(&self, value: &str) -> usize {
        let calls = self.calls.lock().unwrap();
        let names: HashSet<&str> = calls
            .iter()
            .filter(|(_, v, _)| v == value)
            .map(|(name, ..)| name.as_str())
            .collect();
        names.len()
    }

    /// Whether `name` was reconciled seeing `value`, by `replica` if given.
    pub(crate) fn reconciled(&self, name: &str, value: &str, replica: Option<usize>) -> bool {
        self.calls.lock().unwrap().iter().any(|(n, v, id)| {
            n == name && v == value && replica.is_none_or(|replica| *id == replica)
        })
    }

    /// Whether every reconcile so far ran on `replica`.
    pub(crate) fn all_on(&self, replica: usize) -> bool {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .all(|(.., id)| *id == replica)
    }
}

/// One replica: its number, and what they all saw.
pub(crate) struct Replica {
    pub(crate) id: usize,
    pub(crate) shared: Arc<Shared>,
}

/// Records the ConfigMap's value, noting an overlap with another replica's reconcile of it.
pub(crate) async fn reconcile(configmap: Arc<ConfigMap>, replica: Arc<Replica>) -> Outcome {
    let name = configmap.name_any();
    if !replica.shared.running.lock().unwrap().insert(name.clone()) {
        *replica.shared.overlapped.lock().unwrap() = true;
    }
    // Long enough for the other replica to try the same key if the queue let it.
    tokio::time::sleep(Duration::from_millis(2)).await;
    replica
        .shared
        .calls
        .lock()
        .unwrap()
        .push((name.clone(), value_of(&configmap), replica.id));
    replica.shared.running.lock().unwrap().remove(&name);
    Outcome::Done
}

/// Two leader-elected replicas, each with its own client, store and handle on one shared
/// queue (`queue` connects a handle): both feed the queue (the standby's list and events
/// go to it too: warm standby), only the leader's workers take keys; after the leader's
/// graceful stop the standby leads and reconciles, without a list.
pub(crate) async fn leader_elected_pair<Q, F, Fut>(api: &FakeApiServer, queue: F)
where
    Q: Queue<Item = String>,
    F: Fn() -> Fut,
    Fut: Future<Output = Q>,
{
    for index in 0..5 {
        api.apply(&configmap(&format!("web-{index}"), "v1"));
    }
    let shared = Arc::new(Shared::default());
    let start = |id: usize| {
        let (queue, api_client, shared) = (
            queue(),
            api.client_named(&format!("replica-{id}")),
            shared.clone(),
        );
        async move {
            Controller::with_queue(
                queue.await,
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
        shared.reconciled_at("v1") == 5
    })
    .await;
    second.wait_until_ready().await;
    // Warm standby: the standby's list went to the shared queue...
    eventually("the standby's list added", || {
        second.feed_stats().added == 5
    })
    .await;
    // ... and so do its events; a change is reconciled, by the leader.
    api.apply(&configmap("web-0", "v2"));
    eventually("the change reconciled", || {
        shared.reconciled("web-0", "v2", None)
    })
    .await;
    eventually("the standby's event added", || {
        second.feed_stats().added == 6
    })
    .await;
    assert!(!second.is_leader());
    // (It sees who leads at its first try of the Lease, which under load can come late.)
    eventually("the standby sees replica-0 lead", || {
        second.leader().as_deref() == Some("replica-0")
    })
    .await;
    assert!(shared.all_on(0), "only the leader reconciles");

    let lists = api.requests().lists;
    first.shut_down().await.unwrap();
    eventually("replica-1 leads", || second.is_leader()).await;
    api.apply(&configmap("web-1", "v2"));
    eventually("the next change reconciled by replica-1", || {
        shared.reconciled("web-1", "v2", Some(1))
    })
    .await;
    assert_eq!(api.requests().lists, lists, "a takeover needs no list");
    second.shut_down().await.unwrap();
    assert!(!shared.overlapped());
}
