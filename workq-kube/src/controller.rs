//! [`Controller`]: the builder. Sources of keys (the main kind, `owns`, `watches`, streams,
//! outside triggers), the queue, the workers' settings, the error policy and the stop.

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use workq::{Queue, WorkQueue, Workers};

use crate::defaults::DEFAULT_SYNC_TIMEOUT;
use crate::gate::ControllerQueue;
use crate::leader::LeaderElection;
use crate::policy::{self, ErrorAction, Policy};
use crate::running::Configure;
use crate::sources::{
    self, BackoffFactory, Role, Source, SourceBuilder, object_items, watcher_items,
};
use crate::{ObjectKey, ReconcileResult, Running};

/// A kube-rs controller on a [`workq`] queue: a reflector [`Store`] and watchers feed the
/// queue with object keys, and [`Workers`] reconcile them.
///
/// - The main kind's objects are keyed by their [`ObjectRef`] (as the queue's
///   [`ObjectKey`] encoding); [`owns`](Self::owns) and [`watches`](Self::watches) (and
///   their `_stream` variants) map other kinds' objects to keys of the main kind.
/// - Keys from a list enter at [`LIST_PRIORITY`] (-100), when the list is complete (the
///   store then holds every listed object); keys from watch events at [`WATCH_PRIORITY`] (0).
/// - No key is handed to a worker before the main store has completed its first list;
///   keys that come earlier (an outside trigger) wait in the queue.
/// - An object changed many times while its key waits is reconciled once; an object is never
///   reconciled by two workers at once (the queue's rules, also across processes on a shared
///   backend).
/// - The reconcile gets the object from the store. An object no longer in the store (deleted
///   before its key came out) is done without a call, and counted in
///   [`Running::objects_gone`]: as with kube's `Controller`, clean-up belongs in finalizers.
/// - What the reconcile returns ([`ReconcileResult`]) says what happens next: done (the
///   per-object failure count is forgotten), requeue after a delay, retry, or give up. An
///   error is retried with the queue's per-object exponential backoff for as long as it
///   fails, unless an [`error_policy`](Self::error_policy) decides otherwise.
/// - While an object waits for the retry of a failure, only a change of its spec (a new
///   `metadata.generation`), the start of its deletion, or its deletion brings the retry
///   forward: the status the failing reconcile wrote, a child it touched or a resync do not
///   (they neither burn nor reset its backoff, kubernetes#132805). Kinds without a
///   generation (ConfigMaps, Secrets) wait for the retry on every change.
/// - A source that panics, or a stream of yours that ends, stops the controller with an
///   [`Error`](crate::Error); watch failures are retried with the watcher's backoff, logged
///   and counted (metrics, [`Running::feed_stats`]); a watcher whose first list does not
///   complete within the [`sync_timeout`](Self::sync_timeout) stops the controller.
///
/// # Examples
///
/// See the [crate documentation](crate) for a controller running against an in-process API
/// server.
///
/// [`LIST_PRIORITY`]: crate::LIST_PRIORITY
/// [`WATCH_PRIORITY`]: crate::WATCH_PRIORITY
#[must_use = "a controller does nothing until it runs"]
pub struct Controller<K, Q = WorkQueue<ObjectRef<K>>>
where
    K: Resource + 'static,
    K::DynamicType: Eq + Hash,
    Q: Queue,
{
    /// The queue the caller chose, if any.
    queue: Option<Q>,
    /// Builds the default queue (named, with metrics) when none was chosen.
    default_queue: Option<fn(&str) -> Q>,
    /// The controller's name: the default queue's, and the metrics label.
    name: Option<String>,
    /// The main kind's dynamic type (`()` for static types).
    pub(crate) dyntype: K::DynamicType,
    /// The main watcher's objects, read by the reconcile.
    pub(crate) store: Store<K>,
    /// Every source of keys, the main one first.
    pub(crate) sources: Vec<SourceBuilder<K>>,
    /// The caller's pool settings, if any.
    configure: Option<Configure<Q>>,
    /// The caller's error policy, if any.
    error_policy: Option<Policy<K>>,
    /// Makes the backoff of each watcher.
    backoff: BackoffFactory,
    /// How long the first lists may take.
    sync_timeout: Duration,
    /// Futures that start a graceful stop.
    graceful: Vec<BoxFuture<'static, ()>>,
    /// Whether SIGTERM and Ctrl-C stop the controller (a second one by force).
    on_signal: bool,
    /// The main watcher's client and namespace, for a leader election's Lease.
    main_api: Option<(kube::Client, String)>,
    /// The leader election, if the controller runs only on the leader.
    election: Option<LeaderElection>,
}

impl<K, Q> fmt::Debug for Controller<K, Q>
where
    K: Resource + 'static,
    K::DynamicType: Eq + Hash,
    Q: Queue,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Controller")
            .field("queue", &self.queue.as_ref().map(Queue::name))
            .field("name", &self.name)
            .field("sources", &self.sources.len())
            .field("sync_timeout", &self.sync_timeout)
            .field("on_signal", &self.on_signal)
            .field("election", &self.election)
            .finish_non_exhaustive()
    }
}

/// The default queue: in memory, client-go's default controller rate limiter, named, and
/// reporting to the process-wide metrics registry (feature `prometheus`).
fn default_queue<K>(name: &str) -> WorkQueue<ObjectRef<K>>
where
    K: Resource + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    let builder = WorkQueue::builder().name(name);
    #[cfg(feature = "prometheus")]
    let builder = builder.metrics(crate::metrics::provider());
    builder.build()
}

/// [`default_queue`], taking turns between namespaces
/// ([`Controller::group_by_namespace`]).
fn default_queue_by_namespace<K>(name: &str) -> WorkQueue<ObjectRef<K>>
where
    K: Resource + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    let builder = WorkQueue::builder()
        .name(name)
        .group_by(|object: &ObjectRef<K>| object.namespace.clone().unwrap_or_default());
    #[cfg(feature = "prometheus")]
    let builder = builder.metrics(crate::metrics::provider());
    builder.build()
}

impl<K> Controller<K>
where
    K: Resource + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + fmt::Debug + Send + Sync + 'static,
{
    /// A controller for the objects `api` lists and watches with `config`, on an in-memory
    /// [`WorkQueue`] with client-go's default controller rate limiter, named after the kind
    /// (lowercase, as controller-runtime does) so that its workqueue metrics appear in
    /// [`metrics`](crate::metrics) (feature `prometheus`). This is kube's
    /// `Controller::new`.
    pub fn new(api: Api<K>, config: watcher::Config) -> Self
    where
        K::DynamicType: Default,
    {
        Self::new_with(api, config, K::DynamicType::default())
    }

    /// Makes the default queue take turns between namespaces: within a priority, each
    /// hand-out goes to the next namespace with keys waiting (cluster-scoped objects share
    /// the namespace `""`), so one namespace that changes 100,000 objects at once does not
    /// put every other namespace's keys behind them (kubernetes#25744). Keys of one
    /// namespace still come out in the order they became ready, and priorities stay strict
    /// (a listed key still waits behind watched ones).
    ///
    /// For limits per namespace or hand-out rates, build the queue yourself and pass it
    /// with [`with_queue`](Self::with_queue) or [`on_queue`](Self::on_queue):
    /// `WorkQueue::builder().group_by(|o: &ObjectRef<K>| o.namespace.clone().unwrap_or_default())
    /// .max_in_flight_per_group(4)` (see [`workq::Builder::group_by`]). This applies to the
    /// default queue only; a queue you pass is used as built.
    pub fn group_by_namespace(mut self) -> Self {
        if self.queue.is_none() {
            self.default_queue = Some(default_queue_by_namespace::<K>);
        }
        self
    }

    /// [`new`](Self::new) for a kind known only at run time (`DynamicObject`). This is
    /// kube's `Controller::new_with`.
    pub fn new_with(api: Api<K>, config: watcher::Config, dyntype: K::DynamicType) -> Self {
        let main_api = main_api(&api);
        let (store, main) = watch_main(api, config, dyntype.clone());
        let mut this = Self::from_parts(None, Some(default_queue::<K>), dyntype, store, main);
        this.main_api = Some(main_api);
        this
    }

    /// A controller whose main objects come from `trigger`, a stream you build from kube's
    /// watcher (filtered with `predicate_filter`, say, or metadata only), with `reader` the
    /// store your reflector fills. This is kube's `Controller::for_stream`.
    ///
    /// The stream's items are added at [`WATCH_PRIORITY`] (a stream of objects does not say
    /// which came from a list). No key is handed out before `reader` is ready, so the
    /// stream must go through a reflector (`.reflect(writer)`). If the stream ends, the
    /// controller stops with [`ErrorKind::TriggerEnded`](crate::ErrorKind::TriggerEnded).
    ///
    /// # Examples
    ///
    /// Reconcile only on changes of the spec (not on status writes):
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # use k8s_openapi::api::apps::v1::Deployment;
    /// # use kube::runtime::{predicates, reflector, watcher, WatchStreamExt};
    /// # use kube::Api;
    /// # use workq_kube::Controller;
    /// # async fn doc(api: Api<Deployment>) {
    /// let (reader, writer) = reflector::store();
    /// let deployments = watcher(api, watcher::Config::default())
    ///     .default_backoff()
    ///     .reflect(writer)
    ///     .applied_objects()
    ///     .predicate_filter(predicates::generation, Default::default());
    /// let summary = Controller::for_stream(deployments, reader)
    ///     .shutdown_on_signal()
    ///     .run(|_: Arc<Deployment>, _: Arc<()>| async { }, Arc::new(()))
    ///     .wait()
    ///     .await;
    /// # }
    /// ```
    ///
    /// [`WATCH_PRIORITY`]: crate::WATCH_PRIORITY
    pub fn for_stream<E>(
        trigger: impl Stream<Item = Result<K, E>> + Send + 'static,
        reader: Store<K>,
    ) -> Self
    where
        K::DynamicType: Default,
        E: fmt::Display + Send + 'static,
    {
        Self::for_stream_with(trigger, reader, K::DynamicType::default())
    }

    /// [`for_stream`](Self::for_stream) for a kind known only at run time. This is kube's
    /// `Controller::for_stream_with`.
    pub fn for_stream_with<E>(
        trigger: impl Stream<Item = Result<K, E>> + Send + 'static,
        reader: Store<K>,
        dyntype: K::DynamicType,
    ) -> Self
    where
        E: fmt::Display + Send + 'static,
    {
        let name = format!("for_stream {}", K::kind(&dyntype));
        let key_type = dyntype.clone();
        let main: SourceBuilder<K> = Box::new(move |_: &BackoffFactory| {
            let items = object_items(trigger, move |object: K| {
                sources::own_key(&object, false, &key_type)
            });
            Source::new(name, Role::Stream, items)
        });
        Self::from_parts(None, Some(default_queue::<K>), dyntype, reader, main)
    }

    /// A controller whose main objects come from `trigger`, a subscriber of a shared
    /// reflector (kube's `store_shared` and `Writer::subscribe`, feature
    /// `unstable-runtime` of kube), with `reader` that reflector's store: several
    /// controllers share one watch and one store. This is kube's
    /// `Controller::for_shared_stream`; the rules of [`for_stream`](Self::for_stream)
    /// apply.
    pub fn for_shared_stream(
        trigger: impl Stream<Item = Arc<K>> + Send + 'static,
        reader: Store<K>,
    ) -> Self
    where
        K::DynamicType: Default,
    {
        Self::for_shared_stream_with(trigger, reader, K::DynamicType::default())
    }

    /// [`for_shared_stream`](Self::for_shared_stream) for a kind known only at run time.
    pub fn for_shared_stream_with(
        trigger: impl Stream<Item = Arc<K>> + Send + 'static,
        reader: Store<K>,
        dyntype: K::DynamicType,
    ) -> Self {
        let name = format!("for_shared_stream {}", K::kind(&dyntype));
        let key_type = dyntype.clone();
        let main: SourceBuilder<K> = Box::new(move |_: &BackoffFactory| {
            let items = object_items(trigger.map(Ok::<_, std::convert::Infallible>), {
                move |object: Arc<K>| sources::own_key(&*object, false, &key_type)
            });
            Source::new(name, Role::Stream, items)
        });
        Self::from_parts(None, Some(default_queue::<K>), dyntype, reader, main)
    }
}

/// The client and namespace of the main kind's `Api` (its client's default namespace for an
/// `Api::all`): where a leader election's Lease lives by default.
fn main_api<K>(api: &Api<K>) -> (kube::Client, String)
where
    K: Resource + Clone + 'static,
{
    let client = api.clone().into_client();
    let namespace = api
        .namespace()
        .map_or_else(|| client.default_namespace().to_owned(), str::to_owned);
    (client, namespace)
}

/// The main kind's store and watcher.
fn watch_main<K>(
    api: Api<K>,
    config: watcher::Config,
    dyntype: K::DynamicType,
) -> (Store<K>, SourceBuilder<K>)
where
    K: Resource + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync + 'static,
{
    let writer = reflector::store::Writer::new(dyntype.clone());
    let store = writer.as_reader();
    let name = K::kind(&dyntype).into_owned();
    let main: SourceBuilder<K> = Box::new(move |backoff: &BackoffFactory| {
        let events = reflector::reflector(writer, watcher::watcher(api, config).backoff(backoff()));
        let items = watcher_items(events, move |object: K, deleted| {
            sources::own_key(&object, deleted, &dyntype)
        });
        Source::new(name, Role::Watcher, items)
    });
    (store, main)
}

impl<K, Q> Controller<K, Q>
where
    K: Resource + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + fmt::Debug + Send + Sync + 'static,
    Q: Queue,
    Q::Item: ObjectKey<K>,
{
    fn from_parts(
        queue: Option<Q>,
        default_queue: Option<fn(&str) -> Q>,
        dyntype: K::DynamicType,
        store: Store<K>,
        main: SourceBuilder<K>,
    ) -> Self {
        Self {
            queue,
            default_queue,
            name: None,
            dyntype,
            store,
            sources: vec![main],
            configure: None,
            error_policy: None,
            backoff: sources::default_backoff(),
            sync_timeout: DEFAULT_SYNC_TIMEOUT,
            graceful: Vec::new(),
            on_signal: false,
            main_api: None,
            election: None,
        }
    }

    /// A controller on `queue`: one with a rate limiter or clock of your choice, or another
    /// backend such as `workq_redis::RedisQueue<String>`. Name it for the Kubernetes
    /// workqueue metrics series, and give it a metrics provider
    /// ([`metrics::provider`](crate::metrics::provider) for the process-wide registry).
    pub fn with_queue(queue: Q, api: Api<K>, config: watcher::Config) -> Self
    where
        K::DynamicType: Default,
    {
        Self::with_queue_dyntype(queue, api, config, K::DynamicType::default())
    }

    /// [`with_queue`](Self::with_queue) for a kind known only at run time (`DynamicObject`).
    pub fn with_queue_dyntype(
        queue: Q,
        api: Api<K>,
        config: watcher::Config,
        dyntype: K::DynamicType,
    ) -> Self {
        let main_api = main_api(&api);
        let (store, main) = watch_main(api, config, dyntype.clone());
        let mut this = Self::from_parts(Some(queue), None, dyntype, store, main);
        this.main_api = Some(main_api);
        this
    }

    /// Runs the controller on `queue` instead (see [`with_queue`](Self::with_queue)): for
    /// the stream constructors, which start on the default queue.
    ///
    /// # Panics
    ///
    /// After [`workers`](Self::workers): its settings are for the other queue's type, so
    /// call this first.
    pub fn on_queue<Q2>(self, queue: Q2) -> Controller<K, Q2>
    where
        Q2: Queue,
        Q2::Item: ObjectKey<K>,
    {
        assert!(
            self.configure.is_none(),
            "Controller::on_queue must come before Controller::workers"
        );
        Controller {
            queue: Some(queue),
            default_queue: None,
            name: self.name,
            dyntype: self.dyntype,
            store: self.store,
            sources: self.sources,
            configure: None,
            error_policy: self.error_policy,
            backoff: self.backoff,
            sync_timeout: self.sync_timeout,
            graceful: self.graceful,
            on_signal: self.on_signal,
            main_api: self.main_api,
            election: self.election,
        }
    }

    /// Names the controller: its default queue (and so the `name` label of the workqueue
    /// series) and the `controller` label of its watch failures. Default: the kind,
    /// lowercase. A queue you gave keeps its own name.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Decides what becomes of an object whose reconcile returned an error: retry with the
    /// per-object backoff, retry after a fixed delay, or give up ([`ErrorAction`], or kube's
    /// `Action`). `policy` gets the object, the error with its own type (annotate it:
    /// `|object, error: &kube::Error, failures| ...`), and how many times in a row the
    /// object has failed, this time included. This is kube's `error_policy`, given once
    /// for the controller (kube-rs#297), with the per-object count kube's lacks.
    ///
    /// An error of another type than the policy's is backed off, with a warning. Panics and
    /// timeouts (the workers' `timeout`) are backed off without asking the policy.
    ///
    /// # Default
    ///
    /// No policy: every error is [`ErrorAction::Backoff`], for as long as it fails.
    ///
    /// # Examples
    ///
    /// ```
    /// # use k8s_openapi::api::core::v1::ConfigMap;
    /// # use kube::Api;
    /// # use kube::runtime::watcher;
    /// use std::time::Duration;
    /// use workq_kube::{Controller, ErrorAction};
    /// # fn doc(api: Api<ConfigMap>) {
    /// let controller = Controller::new(api, watcher::Config::default()).error_policy(
    ///     |_object, error: &kube::Error, failures| match error {
    ///         // Someone else wrote the object: try again soon.
    ///         kube::Error::Api(status) if status.code == 409 => ErrorAction::RetryAfter(Duration::from_millis(100)),
    ///         // Give up on an object after 20 failures in a row.
    ///         _ if failures >= 20 => ErrorAction::GiveUp,
    ///         _ => ErrorAction::Backoff,
    ///     },
    /// );
    /// # }
    /// ```
    pub fn error_policy<E, A>(
        mut self,
        policy: impl Fn(Arc<K>, &E, usize) -> A + Send + Sync + 'static,
    ) -> Self
    where
        E: 'static,
        A: Into<ErrorAction>,
    {
        self.error_policy = Some(policy::erase(policy));
        self
    }

    /// Sets up the pool of workers: `configure` gets [`Workers`] over the controller's queue
    /// and returns it with your settings (`count` for concurrent reconciles, `timeout`,
    /// `shutdown_timeout`, `on_give_up`, `stop_token`, and `max_retries` to give up after
    /// that many retries).
    ///
    /// # Default
    ///
    /// One worker; retries for as long as an object fails ([`Workers::retry_forever`]:
    /// giving up is your choice, with `max_retries` or an
    /// [`error_policy`](Self::error_policy)); a stop waits up to
    /// [`DEFAULT_SHUTDOWN_TIMEOUT`] for the reconciles in flight; no per-reconcile timeout.
    ///
    /// [`DEFAULT_SHUTDOWN_TIMEOUT`]: crate::DEFAULT_SHUTDOWN_TIMEOUT
    pub fn workers(
        mut self,
        configure: impl FnOnce(
            Workers<Q::Item, ControllerQueue<Q>>,
        ) -> Workers<Q::Item, ControllerQueue<Q>>
        + Send
        + 'static,
    ) -> Self {
        self.configure = Some(Box::new(configure));
        self
    }

    /// The backoff of the controller's watchers (the main one, `owns`, `watches`) after a
    /// failure: `backoff` makes one per watcher. Streams you give bring their own. This is
    /// kube's `Controller::trigger_backoff`.
    ///
    /// # Default
    ///
    /// kube's `DefaultBackoff`: 800 ms doubling to 30 s, with jitter, reset after two quiet
    /// minutes (client-go's reflector backoff).
    pub fn trigger_backoff<B>(mut self, backoff: impl Fn() -> B + Send + Sync + 'static) -> Self
    where
        B: Backoff + 'static,
    {
        self.backoff = Arc::new(move || Box::new(backoff()));
        self
    }

    /// How long the main store, and the watchers of [`owns`](Self::owns) and
    /// [`watches`](Self::watches), may take to complete their first list; past it the
    /// controller stops with [`ErrorKind::NotSynced`](crate::ErrorKind::NotSynced) instead
    /// of waiting for ever (controller-runtime's `CacheSyncTimeout`).
    ///
    /// # Default
    ///
    /// [`DEFAULT_SYNC_TIMEOUT`], two minutes.
    pub fn sync_timeout(mut self, timeout: Duration) -> Self {
        self.sync_timeout = timeout;
        self
    }

    /// Starts a graceful stop when `trigger` completes: no new reconcile starts, the ones in
    /// flight finish (up to the workers' `shutdown_timeout`), the watchers end. Several
    /// calls add up: the first to complete stops. This is kube's
    /// `Controller::graceful_shutdown_on`.
    pub fn graceful_shutdown_on(
        mut self,
        trigger: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        self.graceful.push(trigger.boxed());
        self
    }

    /// Stops gracefully on `SIGTERM` (what Kubernetes sends a pod) or Ctrl-C (`SIGINT`), as
    /// [`graceful_shutdown_on`](Self::graceful_shutdown_on) does; a second signal forces
    /// the stop: the reconciles still running are cancelled and their objects handed back
    /// to the queue, and [`Running::wait`] returns
    /// [`ErrorKind::Forced`](crate::ErrorKind::Forced). This is kube's
    /// `Controller::shutdown_on_signal`.
    ///
    /// The handlers are installed when the controller runs, and stay installed afterwards
    /// (tokio's signal handlers cannot be removed): once the controller has stopped, these
    /// signals no longer end the process by themselves.
    pub fn shutdown_on_signal(mut self) -> Self {
        self.on_signal = true;
        self
    }

    /// Runs the controller only on the replica that holds the `coordination.k8s.io/v1` Lease
    /// named `lease_name` (in the main `Api`'s namespace), with client-go's timings: see
    /// [`leader_election`](Self::leader_election).
    ///
    /// # Panics
    ///
    /// On a controller built from a stream (no `Api` to take the client from): use
    /// [`leader_election`](Self::leader_election) with a [`LeaderElection::client`] there.
    pub fn leader_elected(self, lease_name: impl Into<String>) -> Self {
        assert!(
            self.main_api.is_some(),
            "Controller::leader_elected needs the main Api's client: on a controller built from a stream, use Controller::leader_election(LeaderElection::new(name).client(client))"
        );
        self.leader_election(LeaderElection::new(lease_name))
    }

    /// Runs the controller only on the leader of `election`, with **warm standby**: every
    /// replica watches, keeps its stores synced and its queue filled, but only the leader
    /// hands keys to its workers. A replica that takes over starts reconciling from its
    /// own warm store and queue, without a relist.
    ///
    /// - The leader election follows client-go's rules and timings (see [`LeaderElection`]
    ///   and the [`leader`](crate::leader) module): a crashed leader's lease is taken over
    ///   once it has gone unrenewed for the lease duration (15 s by default), plus up to
    ///   about two retry periods for the standbys to see it; a graceful stop releases it,
    ///   and a standby takes over at its next try (about one retry period, 2 s).
    /// - **Fencing.** A leader that cannot renew within the renew deadline (10 s by default,
    ///   counted from its last successful renewal) steps down before any other replica can
    ///   acquire: no key is handed out from that instant on, and the reconciles in flight are
    ///   cancelled, their futures dropped at their next `.await` and their keys handed back
    ///   to the queue unprocessed (not counted as failures). Keep reconciles async (a
    ///   reconcile that blocks its thread cannot be cancelled), and keep the workers'
    ///   `timeout` in mind: the margin is the lease duration minus the renew deadline.
    /// - It then goes back to standby and tries to acquire again.
    /// - On a graceful stop, the reconciles in flight finish first, then the lease is
    ///   released ([`LeaderElection::release_on_stop`]).
    /// - `leader_election_master_status{name="<lease>"}` is 1 while this replica leads
    ///   ([`metrics`](crate::metrics)); transitions are logged (`became the leader`,
    ///   `stopped leading`, `new leader observed`); [`Running::is_leader`] and
    ///   [`Running::leader`] tell them too.
    ///
    /// # Panics
    ///
    /// If the timings break client-go's rules (the lease duration above the renew deadline,
    /// the renew deadline above 1.2 retry periods, all above zero) or a name is empty.
    /// [`run`](Self::run) panics if the election has no client: a controller built from a
    /// stream needs [`LeaderElection::client`].
    pub fn leader_election(mut self, election: LeaderElection) -> Self {
        if let Err(error) = election.validate() {
            panic!("invalid leader election: {error}");
        }
        self.election = Some(election);
        self
    }

    /// The store the main watcher fills, the one the reconcile reads. This is kube's
    /// `Controller::store`.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Starts the watchers and the workers on the current tokio runtime; `reconcile` is
    /// called with each object to reconcile and `context`. Returns the running controller:
    /// wait for it with [`Running::wait`], stop it with its [`StopToken`](workq::StopToken)
    /// or [`Running::run_until`].
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, if the pool's `count` is 0, or if
    /// [`shutdown_on_signal`](Self::shutdown_on_signal) cannot install its handlers.
    pub fn run<R, Fut, Ctx>(self, reconcile: R, context: Arc<Ctx>) -> Running<K, Q>
    where
        R: Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
        Fut: Future + Send + 'static,
        Fut::Output: ReconcileResult,
        Ctx: Send + Sync + 'static,
    {
        let name = self
            .name
            .unwrap_or_else(|| K::kind(&self.dyntype).to_lowercase());
        let queue = match (self.queue, self.default_queue) {
            (Some(queue), _) => queue,
            (None, Some(make)) => make(&name),
            (None, None) => unreachable!("a controller has a queue or makes its default one"),
        };
        let controller: Arc<str> = queue.name().unwrap_or(&name).into();
        let election = self.election.map(|election| {
            election
                .resolve(self.main_api)
                .unwrap_or_else(|error| panic!("invalid leader election: {error}"))
        });
        let sources = self
            .sources
            .into_iter()
            .map(|build| build(&self.backoff))
            .collect();
        crate::running::start(crate::running::Parts {
            queue,
            controller,
            dyntype: self.dyntype,
            store: self.store,
            sources,
            configure: self.configure,
            error_policy: self.error_policy,
            sync_timeout: self.sync_timeout,
            graceful: self.graceful,
            on_signal: self.on_signal,
            election,
            reconcile,
            context,
        })
    }
}
