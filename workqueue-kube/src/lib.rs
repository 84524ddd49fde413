//! kube-rs controllers on client-go's workqueue: per-object backoff, priorities, give-up,
//! metrics, parallel reconciles, and a queue you can swap (in memory, or Redis shared by
//! replicas).
//!
//! A [`Controller`] watches a kind with kube's watcher, keeps its objects in a reflector
//! [`Store`](kube::runtime::reflector::Store), and feeds their keys to a [`workqueue`] queue;
//! [`Workers`](workqueue::Workers) take the keys and call your reconcile with the object from
//! the store.
//!
//! ```
//! use std::collections::BTreeMap;
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::time::Duration;
//!
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::api::ObjectMeta;
//! use kube::runtime::{controller::Action, watcher};
//! use kube::{Api, ResourceExt};
//! use workqueue_kube::Controller;
//! use workqueue_kube::testing::FakeApiServer;
//!
//! #[derive(Default)]
//! struct Context {
//!     reconciled: AtomicUsize,
//! }
//!
//! async fn reconcile(configmap: Arc<ConfigMap>, context: Arc<Context>) -> Result<Action, kube::Error> {
//!     println!("reconciling {}", configmap.name_any());
//!     context.reconciled.fetch_add(1, Ordering::Relaxed);
//!     Ok(Action::await_change())
//! }
//!
//! # fn configmap(name: &str) -> ConfigMap {
//! #     ConfigMap {
//! #         metadata: ObjectMeta { name: Some(name.into()), namespace: Some("default".into()), ..ObjectMeta::default() },
//! #         data: Some(BTreeMap::from([("greeting".into(), "hello".into())])),
//! #         ..ConfigMap::default()
//! #     }
//! # }
//! # #[tokio::main]
//! # async fn main() {
//! // An API server in this process; against a cluster, `kube::Client::try_default()`.
//! let server = FakeApiServer::start().await;
//! server.apply(&configmap("web-0"));
//! server.apply(&configmap("web-1"));
//!
//! let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
//! let context = Arc::new(Context::default());
//! let controller = Controller::new(api, watcher::Config::default())
//!     .workers(|workers| workers.count(4).max_retries(5))
//!     .run(reconcile, context.clone());
//!
//! // A real controller runs until a signal: `controller.run_until(tokio::signal::ctrl_c())`.
//! while context.reconciled.load(Ordering::Relaxed) < 2 {
//!     tokio::time::sleep(Duration::from_millis(10)).await;
//! }
//! let summary = controller.shut_down().await;
//! assert_eq!(summary.succeeded, 2);
//! # }
//! ```
//!
//! # What the runner does
//!
//! - **Keys, not events.** Watch events become [`ObjectRef`](kube::runtime::reflector::ObjectRef)
//!   keys; an object changed many times while its key waits is reconciled once, with the
//!   newest object in the store. A key is never handed to two workers at once.
//! - **Priorities.** Keys from a list (the first one, and the relist after a watch expired with
//!   `410 Gone`) enter at [`LIST_PRIORITY`] (-100), once the list is complete; live watch
//!   events at [`WATCH_PRIORITY`] (0). A restart's relist of thousands of objects does not
//!   hold back the change someone just made (controller-runtime's rule).
//! - **Related kinds.** [`Controller::owns`] reconciles the owner of a changed child (owner
//!   references); [`Controller::watches`] maps any kind's objects to keys with your function.
//! - **Outcomes.** The reconcile returns a [`ReconcileResult`]: `Result<Action, E>` as with
//!   kube, or [`Outcome`](workqueue::Outcome). Success forgets the object's failures;
//!   `Action::requeue(d)` adds it back after `d`; an error retries it with the queue's
//!   per-object exponential backoff (client-go's default controller rate limiter unless you
//!   build the queue with another), and after `max_retries` the object is given up and
//!   reported.
//! - **Gone objects.** A key whose object has left the store when it comes out (deleted while
//!   queued) is done without a call, and counted in [`Running::objects_gone`]. Clean-up
//!   on deletion belongs in finalizers, as with kube's `Controller`.
//! - **Workers.** Reconciles run as `count` tokio tasks, in parallel on a multi-threaded
//!   runtime. Panics are caught and retried, a per-reconcile `timeout` cancels a stuck one,
//!   and a stop lets the reconciles in flight finish: all [`Workers`](workqueue::Workers)
//!   settings, given with [`Controller::workers`].
//! - **Metrics.** Name the queue and give it a metrics provider, and the Kubernetes workqueue
//!   series (`workqueue_depth`, `workqueue_adds_total`, `workqueue_retries_total`, ...) carry
//!   its name:
//!   `WorkQueue::builder().name("configmaps").metrics(PrometheusMetrics::new(&mut registry))`
//!   (feature `prometheus` of `workqueue`), then [`Controller::with_queue`].
//!
//! # Queues and keys
//!
//! The runner is generic over [`workqueue::Queue`]. The queue's item is the key encoding
//! ([`ObjectKey`]): [`ObjectRef<K>`](kube::runtime::reflector::ObjectRef) in memory, or
//! `String` (`"namespace/name"`, client-go's key format) for a queue that stores text, such
//! as `workqueue_redis::RedisQueue<String>`, whose items are JSON.
//!
//! ## Replicas sharing a Redis queue
//!
//! Several replicas of a controller can run [`Controller::with_queue`] on one
//! `RedisQueue<String>` (same Redis, same queue name). What that gives:
//!
//! - each object is reconciled by one replica at a time, and an event seen by every replica
//!   is one queued key (the queue's dedup and leases hold across processes);
//! - reconciles spread over the replicas, and the backoff and give-up counts are shared;
//! - a replica that dies leaves its keys to the others once its leases expire.
//!
//! What it does not replace, leader election included:
//!
//! - every replica still lists and watches the API server and keeps a full store (N times the
//!   watch load and the memory of one controller);
//! - the replicas' stores are not in step: a key can reach a replica whose watch has not yet
//!   seen the newest change, which then reconciles an older object (the change's own event
//!   queues the key again, so it converges; reconciles must tolerate stale reads, as with
//!   any cache);
//! - a lease that expires while its reconcile still runs (a stalled replica) lets another
//!   replica take the key: reconciles run at least once, not exactly once;
//! - work that is not per object (a periodic sweep, a singleton side effect) still needs one
//!   leader: use a `coordination.k8s.io` Lease for that.
//!
//! # Coming from kube-runtime
//!
//! | kube-runtime's `Controller` | here |
//! | --- | --- |
//! | `Controller::new(api, wc)` | [`Controller::new`]`(api, wc)` (an unnamed in-memory queue), or [`Controller::with_queue`]`(queue, api, wc)` |
//! | `Controller::new_with(api, wc, dyntype)` | [`Controller::with_queue_dyntype`]`(queue, api, wc, dyntype)` |
//! | `for_stream`, `for_shared_stream` (and `_with`) | not offered: the runner owns its watcher and store; add keys from elsewhere with [`Controller::reconcile_on`] |
//! | `with_config(Config::default().concurrency(n))` | [`Controller::workers`]`(\|w\| w.count(n))`: `n` tasks in parallel, not one task polling `n` futures |
//! | `Config::debounce(d)` | not offered: events for a waiting key coalesce in the queue |
//! | `trigger_backoff(backoff)` | not offered: every watcher uses kube's `default_backoff()` |
//! | `store()` | [`Controller::store`], [`Running::store`] |
//! | `owns(api, wc)` | [`Controller::owns`]`(api, wc)` |
//! | `owns_with`, `owns_stream`, `owns_shared_stream` (and `_with`) | not offered (static child types, own watchers) |
//! | `watches(api, wc, mapper)` | [`Controller::watches`]`(api, wc, mapper)` |
//! | `watches_with`, `watches_stream`, `watches_shared_stream` (and `_with`) | not offered |
//! | `reconcile_on(stream)` | [`Controller::reconcile_on`]`(stream)`, at priority 0 |
//! | `reconcile_all_on(trigger)` | [`Controller::reconcile_all_on`]`(trigger)`, at priority -100 |
//! | `graceful_shutdown_on(future)` | [`Running::run_until`]`(future)` |
//! | `shutdown_on_signal()` | [`Running::run_until`]`(tokio::signal::ctrl_c())` |
//! | `run(reconcile, error_policy, ctx)`, a stream of results | [`Controller::run`]`(reconcile, ctx)`, a [`Running`] handle: [`stats`](Running::stats), and a [`Summary`](workqueue::Summary) when it stops |
//! | `error_policy` returning `Action::requeue(d)` | the queue's rate limiter: per-object exponential backoff (`WorkQueue::builder().rate_limiter(...)`), `max_retries` and `on_give_up` on [`Controller::workers`] |
//! | `Action::requeue(d)`, `Action::await_change()` | the same, read by the runner ([`action_outcome`]); or [`Outcome`](workqueue::Outcome) |
//!
//! # Features
//!
//! - `latest` (default): k8s-openapi's newest Kubernetes version. k8s-openapi accepts exactly
//!   one version feature in a build: to pick another, turn this crate's default features off
//!   and enable `v1_xx` on your own `k8s-openapi` dependency.
//! - `rustls-tls`: TLS to API servers (kubeconfigs with `https://` clusters, that is every
//!   real cluster), on rustls with ring. Without it, only `http://` servers can be reached.
//! - `testing`: [`testing::FakeApiServer`], an in-process API server for tests and examples.

mod controller;
mod key;
mod outcome;
#[cfg(feature = "testing")]
pub mod testing;

pub use controller::{Controller, LIST_PRIORITY, Running, WATCH_PRIORITY};
pub use key::ObjectKey;
pub use outcome::{ReconcileResult, action_outcome};
