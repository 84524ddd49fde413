//! kube-rs controllers on client-go's workqueue: per-object backoff that never drops an
//! object, priorities, metrics by default, parallel reconciles, a graceful stop on `SIGTERM`,
//! and a queue you can swap (in memory, or Redis shared by replicas).
//!
//! A [`Controller`] watches a kind with kube's watcher, keeps its objects in a reflector
//! [`Store`](kube::runtime::reflector::Store), and feeds their keys to a [`workq`] queue;
//! [`Workers`](workq::Workers) take the keys and call your reconcile with the object from
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
//! use workq_kube::Controller;
//! use workq_kube::testing::FakeApiServer;
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
//!     .workers(|workers| workers.count(4))
//!     .run(reconcile, context.clone());
//!
//! // A real controller: `.shutdown_on_signal()` before `run`, then `controller.wait().await`,
//! // which returns on SIGTERM or Ctrl-C once the reconciles in flight are done.
//! while context.reconciled.load(Ordering::Relaxed) < 2 {
//!     tokio::time::sleep(Duration::from_millis(10)).await;
//! }
//! let summary = controller.shut_down().await.expect("no source failed");
//! assert_eq!(summary.succeeded, 2);
//!
//! // Its queue is named after the kind: the Kubernetes workqueue series are there.
//! let mut metrics = String::new();
//! workq_kube::metrics::encode(&mut metrics).unwrap();
//! assert!(metrics.contains(r#"workqueue_adds_total{name="configmap"}"#));
//! # }
//! ```
//!
//! # What the runner does
//!
//! - **Keys, not events.** Watch events become [`ObjectRef`](kube::runtime::reflector::ObjectRef)
//!   keys; an object changed many times while its key waits is reconciled once, with the
//!   newest object in the store. A key is never handed to two workers at once.
//! - **The store first.** No key is handed to a worker before the main store has completed
//!   its first list: no reconcile of a half-filled cache, and no "gone" verdict for an object
//!   the list has not brought yet. Keys that come earlier wait in the queue.
//! - **Priorities.** Keys from a list (the first one, and the relist after a watch expired
//!   with `410 Gone`) enter at [`LIST_PRIORITY`] (-100), once the list is complete, in one
//!   batched add ([`Queue::add_all_with`](workq::Queue::add_all_with): one round trip on
//!   Redis); live watch events at [`WATCH_PRIORITY`] (0). A restart's relist of thousands of
//!   objects does not hold back the change someone just made (controller-runtime's rule).
//! - **Related kinds.** [`Controller::owns`] reconciles the owner of a changed child (owner
//!   references; only the children's metadata is watched); [`Controller::watches`] maps any
//!   kind's objects to keys with your function; the `_stream` variants take streams you
//!   build (`predicate_filter`, metadata-only watches, shared reflectors).
//! - **Failures never drop an object.** The reconcile returns a [`ReconcileResult`]:
//!   `Result<Action, E>` as with kube, or [`Outcome`](workq::Outcome). Success forgets
//!   the object's failures; `Action::requeue(d)` adds it back after `d`; an error retries it
//!   with the queue's per-object exponential backoff (client-go's default controller rate
//!   limiter: 5 ms doubling to 1000 s) for as long as it fails. Giving up is a choice: an
//!   [`error_policy`](Controller::error_policy) decides per error (backoff, a fixed delay,
//!   give up), or the workers' `max_retries`.
//! - **A backoff is a backoff.** While an object waits for the retry of a failure, the
//!   status its reconcile wrote, a child it touched, or a resync neither brings the retry
//!   forward nor resets its count; a change of its spec (a new `metadata.generation`) or its
//!   deletion does.
//! - **Gone objects.** A key whose object has left the store when it comes out (deleted while
//!   queued) is done without a call, and counted in [`Running::objects_gone`]. Clean-up
//!   on deletion belongs in finalizers (kube's `finalizer` function works as with kube).
//! - **Workers.** Reconciles run as `count` tokio tasks, in parallel on a multi-threaded
//!   runtime. Panics are caught and retried, a per-reconcile `timeout` cancels a stuck one:
//!   [`Workers`](workq::Workers) settings, given with [`Controller::workers`].
//! - **Stopping.** [`Controller::shutdown_on_signal`] stops on `SIGTERM` or Ctrl-C: no new
//!   reconcile starts, the ones in flight finish (up to [`DEFAULT_SHUTDOWN_TIMEOUT`]), a
//!   shared queue gets its leases back, and [`Running::wait`] returns the summary; a second
//!   signal cancels what still runs and hands it back to the queue.
//! - **Failing sources are loud.** A panicking mapper, or a stream of yours that ends, stops
//!   the controller with an [`Error`]; a watcher that has not completed its first list
//!   within the [`sync_timeout`](Controller::sync_timeout) too. Watch failures are retried
//!   with the watcher's backoff, logged, and counted ([`Running::feed_stats`], and
//!   `workqueue_kube_watch_errors_total`).
//! - **Metrics by default** (feature `prometheus`). The default queue is named after the
//!   kind (lowercase, as controller-runtime names it), unless you [name](Controller::name)
//!   the controller, and reports Kubernetes' workqueue series (`workqueue_depth`,
//!   `workqueue_adds_total`, `workqueue_retries_total`, ...) to the process-wide registry of
//!   [`metrics`]: serve [`metrics::encode`] and they are there. Every controller, on any
//!   queue, also reports controller-runtime's reconcile series
//!   (`controller_runtime_reconcile_total{controller,result}`, errors, terminal errors,
//!   panics, timeouts, `controller_runtime_reconcile_time_seconds`, active workers, max
//!   concurrent reconciles), so kubebuilder's dashboards and alerts read them unchanged.
//! - **Traces from the event to the reconcile** (feature `otel`). A reconcile runs inside
//!   the workers' `workqueue.item` span (with the key), so its own spans are children of
//!   that span. The controller adds each round of events' keys inside a `controller.events`
//!   span (the controller's name, how many events and keys, the key when there is one).
//!   With a `tracing-opentelemetry` layer, an add records the span it is made in, and the
//!   `workqueue.item` span of the reconcile it causes links to it: to the round of watch
//!   events that queued the key, or to your own span around an add to [`Running::queue`]
//!   (a webhook's request, say). Deduplicated adds keep links to the first few (see
//!   `workq::otel`), on a queue that keeps them (the in-memory one does). Events that come
//!   in while their object is being reconciled are added when that reconcile succeeds,
//!   inside its span: the next reconcile links to the one before.
//!
//! # Queues and keys
//!
//! The runner is generic over [`workq::Queue`]. The queue's item is the key encoding
//! ([`ObjectKey`]): [`ObjectRef<K>`](kube::runtime::reflector::ObjectRef) in memory, or
//! `String` (`"namespace/name"`, client-go's key format) for a queue that stores text, such
//! as `workq_redis::RedisQueue<String>`, whose items are JSON.
//!
//! ## Replicas sharing a Redis queue
//!
//! Several replicas of a controller can run [`Controller::with_queue`] on one
//! `RedisQueue<String>` (same Redis, same queue name). What that gives:
//!
//! - each object is reconciled by one replica at a time, and an event seen by every replica
//!   is one queued key (the queue's dedup and leases hold across processes);
//! - reconciles spread over the replicas, and the backoff and give-up counts are shared;
//! - a replica that stops gracefully hands its leases back at once; one that dies leaves its
//!   keys to the others once its leases expire.
//!
//! What it does not replace (leader election is [`Controller::leader_elected`]):
//!
//! - every replica still lists and watches the API server and keeps a full store (N times the
//!   watch load and the memory of one controller);
//! - the replicas' stores are not in step: a key can reach a replica whose watch has not yet
//!   seen the newest change, which then reconciles an older object (the change's own event
//!   queues the key again, so it converges; reconciles must tolerate stale reads, as with
//!   any cache);
//! - a backoff is kept from self-inflicted events by the replica that ran the failed
//!   reconcile; the other replicas see the same events and may add the key before its
//!   delay is over (filter their main stream with `predicate_filter(predicates::generation)`
//!   through [`Controller::for_stream`] if that matters);
//! - a lease that expires while its reconcile still runs (a stalled replica) lets another
//!   replica take the key: reconciles run at least once, not exactly once;
//! - a Redis outage is waited out (adds and hand-outs retry), but a reconcile whose `done`
//!   the outage cut off keeps its key until the lease expires (30 s by default);
//! - work that is not per object (a periodic sweep, a singleton side effect) still needs one
//!   leader: [`Controller::leader_elected`] (below).
//!
//! # Leader election, with warm standby
//!
//! [`Controller::leader_elected`]`("my-operator")` runs the controller only on the replica
//! that holds the `coordination.k8s.io/v1` Lease `my-operator` ([`leader`]: client-go's
//! rules and timings, a 15 s lease, a 10 s renew deadline, a 2 s retry period). The other
//! replicas stand by warm: they watch, keep their stores synced and their queues filled,
//! and hand nothing to their workers, so the one that takes over reconciles at once from
//! what it holds, without a relist.
//!
//! - A leader that cannot renew within its renew deadline steps down before any other
//!   replica can take the lease: no key is handed out from then on, and the reconciles in
//!   flight are cancelled, their keys handed back to the queue. Then it stands by again.
//! - A graceful stop lets the reconciles in flight finish, then releases the Lease: a
//!   standby takes over at its next try (about one retry period). A crashed leader's lease
//!   is taken over once it expires (the lease duration, plus up to about two retry periods).
//! - `leader_election_master_status{name}` (client-go's gauge) says who leads; transitions
//!   are logged; [`Running::is_leader`] and [`Running::leader`] tell too.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use k8s_openapi::api::core::v1::ConfigMap;
//! # use kube::{Api, runtime::watcher};
//! # use workq_kube::Controller;
//! # async fn doc(api: Api<ConfigMap>) {
//! let summary = Controller::new(api, watcher::Config::default())
//!     .leader_elected("configmap-controller") // a Lease in the Api's namespace
//!     .shutdown_on_signal() // SIGTERM: finish what runs, release the Lease, return
//!     .run(|_: Arc<ConfigMap>, _: Arc<()>| async {}, Arc::new(()))
//!     .wait()
//!     .await;
//! # }
//! ```
//!
//! # Coming from kube-runtime
//!
//! Every method of kube-runtime's `Controller` (kube 5.0), and what takes its place here:
//! the same, better, or missing and why.
//!
//! | kube-runtime's `Controller` | here | |
//! | --- | --- | --- |
//! | `Controller::new(api, wc)`, `new_with(api, wc, dyntype)` | [`Controller::new`], [`Controller::new_with`]: an in-memory queue named after the kind, with metrics | better: metrics by default (kube-rs#1917) |
//! | (no queue choice) | [`Controller::with_queue`]`(queue, api, wc)`, [`Controller::on_queue`]`(queue)`: any [`workq::Queue`], Redis shared by replicas included | better (kube-rs#297's "pluggable queue") |
//! | `for_stream(stream, reader)`, `for_stream_with` | [`Controller::for_stream`], [`Controller::for_stream_with`] | same (keys at priority 0: a stream of objects does not say which were listed) |
//! | `for_shared_stream(stream, reader)`, `for_shared_stream_with` | [`Controller::for_shared_stream`], [`Controller::for_shared_stream_with`] | same |
//! | `owns(api, wc)`, `owns_with(api, dyntype, wc)` | [`Controller::owns`]`(api, wc)`, metadata only, any child type | same (no `_with`: the child's dynamic type is not needed) |
//! | `owns_stream`, `owns_shared_stream` (and `_with`) | [`Controller::owns_stream`], [`Controller::owns_shared_stream`] | same; a stream that ends stops the controller with an error |
//! | `watches(api, wc, mapper)`, `watches_with` | [`Controller::watches`]`(api, wc, mapper)` | better: a panicking mapper stops the controller with an error instead of silencing its watch |
//! | `watches_stream`, `watches_shared_stream` (and `_with`) | [`Controller::watches_stream`], [`Controller::watches_shared_stream`] | same |
//! | `reconcile_on(stream)` | [`Controller::reconcile_on`]`(stream)`, at priority 0 | same (stable here; kube's is behind `unstable-runtime`) |
//! | `reconcile_all_on(trigger)` | [`Controller::reconcile_all_on`]`(trigger)`, at priority -100 | better: a resync does not hold back live changes |
//! | `with_config(Config::default().concurrency(n))` | [`Controller::workers`]`(\|w\| w.count(n))` | better: `n` tasks in parallel, not one task polling `n` futures |
//! | `Config::debounce(d)` | missing: events for a waiting key already coalesce in the queue, and a backoff is not cut short by self-inflicted events; a delay on every event would only slow reconciles |  |
//! | `trigger_backoff(backoff)` | [`Controller::trigger_backoff`]`(\|\| backoff)` | same, one backoff per watcher (a factory) |
//! | `store()` | [`Controller::store`], [`Running::store`] | same |
//! | `graceful_shutdown_on(future)` | [`Controller::graceful_shutdown_on`]`(future)`, or [`Running::run_until`]`(future)` | same |
//! | `shutdown_on_signal()` | [`Controller::shutdown_on_signal`]: `SIGTERM` or Ctrl-C, a second one forces | better: the forced stop hands unfinished objects back to the queue, and [`Running::wait`] returns a summary |
//! | `run(reconcile, error_policy, ctx)`, a stream of results | [`Controller::run`]`(reconcile, ctx)`, a [`Running`] handle: [`stats`](Running::stats), [`feed_stats`](Running::feed_stats), and [`wait`](Running::wait) gives a [`Summary`](workq::Summary) or an [`Error`] | different shape: per-reconcile results go to `tracing` and the summary, not a stream |
//! | `error_policy(obj, &err, ctx) -> Action` | [`Controller::error_policy`]`(\|obj, &err, failures\| ...)` returning [`ErrorAction`] or kube's `Action`; by default a per-object exponential backoff, reset on success | better: the per-object failure count kube lacks (kube-rs#1916, #297), and a default that never drops an object |
//! | `Action::requeue(d)`, `Action::await_change()` | the same, read by the runner ([`action_outcome`]); or [`Outcome`](workq::Outcome) | same |
//! | (no metrics) | Kubernetes' workqueue series per controller, controller-runtime's reconcile series, watch failures | better (kube-rs#1917) |
//! | a `reconciling object` span per reconcile | the workers' `workqueue.item` span per reconcile, linked to the spans of the events or adds that queued the key (feature `otel`) | better: a trace leads from the event to the reconcile |
//! | (no leader election: kube-rs#485) | [`Controller::leader_elected`]`(lease)`, [`Controller::leader_election`]`(`[`LeaderElection`]`)`: client-go's rules on a Lease, fencing at the renew deadline, warm standby, release on a graceful stop | better |
//! | `applier(...)` ("hard mode") | missing: [`Workers`](workq::Workers) over any [`Queue`](workq::Queue) is this crate's lower level |  |
//!
//! # Features
//!
//! - `latest` (default): k8s-openapi's newest Kubernetes version. k8s-openapi accepts exactly
//!   one version feature in a build: to pick another, turn this crate's default features off
//!   and enable `v1_xx` on your own `k8s-openapi` dependency.
//! - `prometheus` (default): the process-wide metrics registry ([`metrics`]) the default
//!   queues and the watch-failure counter report to.
//! - `rustls-tls`: TLS to API servers (kubeconfigs with `https://` clusters, that is every
//!   real cluster), on rustls with ring. Without it, only `http://` servers can be reached.
//! - `testing`: [`testing::FakeApiServer`], an in-process API server for tests and examples.
//! - `otel`: trace links from the events to the reconciles (`workq`'s feature `otel`; see
//!   "What the runner does").

mod controller;
mod defaults;
mod error;
mod feed;
mod gate;
mod instruments;
mod key;
pub mod leader;
#[cfg(feature = "prometheus")]
pub mod metrics;
mod names;
mod outcome;
mod policy;
mod relations;
mod running;
mod sources;
#[cfg(feature = "testing")]
pub mod testing;

pub use controller::Controller;
pub use defaults::{DEFAULT_SHUTDOWN_TIMEOUT, DEFAULT_SYNC_TIMEOUT, LIST_PRIORITY, WATCH_PRIORITY};
pub use error::{Error, ErrorKind};
pub use feed::FeedStats;
pub use gate::{ControllerLease, ControllerQueue};
pub use key::ObjectKey;
pub use leader::LeaderElection;
pub use outcome::{ReconcileResult, action_outcome};
pub use policy::ErrorAction;
pub use running::Running;
