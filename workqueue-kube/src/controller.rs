//! [`Controller`]: watchers feed a queue with object keys, and `Workers` reconcile them.

use std::fmt;
use std::future::{self, Future};
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::stream::{self, BoxStream, SelectAll};
use futures::{Stream, StreamExt};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Lookup, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;
use workqueue::{
    AddOptions, AsyncWorkers, HandlerError, IntoOutcome, Outcome, Queue, StopToken, Summary,
    WorkQueue, Workers,
};

use crate::{ObjectKey, ReconcileResult};

/// The priority of keys from a watcher's list (the first one, and every relist after a watch
/// expired) and from [`Controller::reconcile_all_on`]: controller-runtime's rule, so that a
/// restart's thousands of listed objects do not hold back live changes.
pub const LIST_PRIORITY: i32 = -100;

/// The priority of keys from live watch events and [`Controller::reconcile_on`]. Given
/// explicitly, it raises a key still queued from a list.
pub const WATCH_PRIORITY: i32 = 0;

/// Object references to add to the queue at one priority.
type Batch<K> = (Vec<ObjectRef<K>>, i32);

/// One source of batches: the main watcher, an `owns` or `watches` watcher, or a trigger.
type Trigger<K> = BoxStream<'static, Batch<K>>;

/// The caller's settings for the pool, applied when the controller runs.
type Configure<T, Q> = Box<dyn FnOnce(Workers<T, Q>) -> Workers<T, Q> + Send>;

/// A kube-rs controller on a [`workqueue`] queue: a reflector [`Store`] and watchers feed the
/// queue with object keys, and [`Workers`] reconcile them.
///
/// - The main watcher's objects are keyed by their [`ObjectRef`] (as the queue's
///   [`ObjectKey`] encoding); [`owns`](Self::owns) and [`watches`](Self::watches) map other
///   kinds' events to keys of the main kind.
/// - Keys from a list enter at [`LIST_PRIORITY`] (-100), when the list is complete (the
///   store then holds every listed object); keys from watch events at [`WATCH_PRIORITY`] (0).
/// - An object changed many times while its key waits is reconciled once; an object is never
///   reconciled by two workers at once (the queue's rules, also across processes on a shared
///   backend).
/// - The reconcile gets the object from the store. An object no longer in the store (deleted
///   before its key came out) is done without a call, and counted in
///   [`Running::objects_gone`]: as with kube's `Controller`, clean-up belongs in finalizers.
/// - What the reconcile returns ([`ReconcileResult`]) says what happens next: done (the
///   per-object failure count is forgotten), requeue after a delay, retry with the queue's
///   per-object exponential backoff, or give up. Give-up, panic isolation, timeouts and
///   graceful stop are [`Workers`]'s, set with [`workers`](Self::workers).
///
/// # Examples
///
/// See the [crate documentation](crate) for a controller running against an in-process API
/// server.
#[must_use = "a controller does nothing until it runs"]
pub struct Controller<K, Q = WorkQueue<ObjectRef<K>>>
where
    K: Resource + 'static,
    K::DynamicType: Eq + Hash,
    Q: Queue,
{
    /// The queue the triggers feed and the workers drain.
    queue: Q,
    /// The main kind's dynamic type (`()` for static types).
    dyntype: K::DynamicType,
    /// The main watcher's objects, read by the reconcile.
    store: Store<K>,
    /// Every source of keys, the main watcher first.
    triggers: Vec<Trigger<K>>,
    /// The caller's pool settings, if any.
    configure: Option<Configure<Q::Item, Q>>,
}

impl<K, Q> fmt::Debug for Controller<K, Q>
where
    K: Resource + 'static,
    K::DynamicType: Eq + Hash,
    Q: Queue,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Controller")
            .field("queue", &self.queue.name())
            .field("triggers", &self.triggers.len())
            .finish_non_exhaustive()
    }
}

impl<K> Controller<K>
where
    K: Resource + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + fmt::Debug + Send + Sync + 'static,
{
    /// A controller for the objects `api` lists and watches with `config`, on a new unnamed
    /// in-memory [`WorkQueue`] with client-go's default controller rate limiter. This is
    /// kube's `Controller::new`.
    pub fn new(api: Api<K>, config: watcher::Config) -> Self {
        Controller::with_queue(WorkQueue::new(), api, config)
    }
}

impl<K, Q> Controller<K, Q>
where
    K: Resource + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + fmt::Debug + Send + Sync + 'static,
    Q: Queue,
    Q::Item: ObjectKey<K>,
{
    /// A controller on `queue`: a named [`WorkQueue`] (for the Kubernetes workqueue metrics
    /// series), one with a rate limiter or clock of your choice, or another backend such as
    /// `workqueue_redis::RedisQueue<String>`.
    pub fn with_queue(queue: Q, api: Api<K>, config: watcher::Config) -> Self
    where
        K::DynamicType: Default,
    {
        Self::with_queue_dyntype(queue, api, config, K::DynamicType::default())
    }

    /// [`with_queue`](Self::with_queue) for a kind known only at run time (`DynamicObject`).
    /// This is kube's `Controller::new_with`.
    pub fn with_queue_dyntype(
        queue: Q,
        api: Api<K>,
        config: watcher::Config,
        dyntype: K::DynamicType,
    ) -> Self {
        let writer = reflector::store::Writer::new(dyntype.clone());
        let store = writer.as_reader();
        let events = reflector::reflector(writer, watcher::watcher(api, config).default_backoff());
        let key_type = dyntype.clone();
        let main = batches(events, move |object: K| {
            vec![object.to_object_ref(key_type.clone())]
        });
        Self {
            queue,
            dyntype,
            store,
            triggers: vec![main],
            configure: None,
        }
    }

    /// Reconciles the owner of each `Child` that `api` lists or watches: the owner references
    /// of the main kind (in the child's namespace). A child's change or deletion reconciles
    /// its owner. This is kube's `Controller::owns`.
    pub fn owns<Child>(mut self, api: Api<Child>, config: watcher::Config) -> Self
    where
        Child: Resource + Clone + DeserializeOwned + fmt::Debug + Send + 'static,
        Child::DynamicType: Default + Eq + Hash + Clone,
    {
        let dyntype = self.dyntype.clone();
        let events = watcher::watcher(api, config).default_backoff();
        self.triggers.push(batches(events, move |child: Child| {
            owners(&child, &dyntype)
        }));
        self
    }

    /// Reconciles the objects `mapper` names for each `Other` that `api` lists or watches:
    /// any relation you can compute (a label, a field, a reference by name). This is kube's
    /// `Controller::watches`.
    pub fn watches<Other, I>(
        mut self,
        api: Api<Other>,
        config: watcher::Config,
        mapper: impl Fn(Other) -> I + Send + 'static,
    ) -> Self
    where
        Other: Resource + Clone + DeserializeOwned + fmt::Debug + Send + 'static,
        Other::DynamicType: Default + Eq + Hash + Clone,
        I: IntoIterator<Item = ObjectRef<K>>,
    {
        let events = watcher::watcher(api, config).default_backoff();
        self.triggers.push(batches(events, move |other: Other| {
            mapper(other).into_iter().collect()
        }));
        self
    }

    /// Reconciles each object `refs` names, at [`WATCH_PRIORITY`]: events from outside the
    /// cluster (a webhook, a message queue). This is kube's `Controller::reconcile_on`.
    pub fn reconcile_on(mut self, refs: impl Stream<Item = ObjectRef<K>> + Send + 'static) -> Self {
        self.triggers
            .push(refs.map(|object| (vec![object], WATCH_PRIORITY)).boxed());
        self
    }

    /// Reconciles every object in the store each time `trigger` yields, at
    /// [`LIST_PRIORITY`], as controller-runtime's resyncs do. This is kube's
    /// `Controller::reconcile_all_on`.
    pub fn reconcile_all_on(mut self, trigger: impl Stream<Item = ()> + Send + 'static) -> Self {
        let store = self.store.clone();
        let dyntype = self.dyntype.clone();
        self.triggers.push(
            trigger
                .map(move |()| {
                    let refs = store
                        .state()
                        .iter()
                        .map(|object| object.to_object_ref(dyntype.clone()))
                        .collect();
                    (refs, LIST_PRIORITY)
                })
                .boxed(),
        );
        self
    }

    /// Sets up the pool of workers: `configure` gets [`Workers`] over the controller's queue
    /// and returns it with your settings (`count` for concurrent reconciles, `max_retries`,
    /// `timeout`, `shutdown_timeout`, `on_give_up`, `stop_token`).
    ///
    /// # Default
    ///
    /// [`Workers`]'s defaults: one worker, 15 retries, no timeouts.
    pub fn workers(
        mut self,
        configure: impl FnOnce(Workers<Q::Item, Q>) -> Workers<Q::Item, Q> + Send + 'static,
    ) -> Self {
        self.configure = Some(Box::new(configure));
        self
    }

    /// The store the main watcher fills, the one the reconcile reads. This is kube's
    /// `Controller::store`.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// The queue of object keys.
    pub fn queue(&self) -> &Q {
        &self.queue
    }

    /// Starts the watchers and the workers on the current tokio runtime; `reconcile` is
    /// called with each object to reconcile and `context`. Returns the running controller:
    /// stop it with its [`StopToken`] or [`Running::run_until`].
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, or if the pool's `count` is 0.
    pub fn run<R, Fut, Ctx>(self, reconcile: R, context: Arc<Ctx>) -> Running<K, Q>
    where
        R: Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
        Fut: Future + Send + 'static,
        Fut::Output: ReconcileResult,
        Ctx: Send + Sync + 'static,
    {
        let mut workers = Workers::new(self.queue.clone());
        if let Some(configure) = self.configure {
            workers = configure(workers);
        }
        let gone = Arc::new(AtomicU64::new(0));
        let handler = {
            let (store, dyntype, gone) = (self.store.clone(), self.dyntype, gone.clone());
            let reconcile = Arc::new(reconcile);
            move |key: Q::Item| {
                let object = store.get(&key.to_object_ref(&dyntype));
                let (reconcile, context, gone) = (reconcile.clone(), context.clone(), gone.clone());
                async move {
                    match object {
                        Some(object) => {
                            Reconciled(reconcile(object, context).await.into_reconcile_outcome())
                        }
                        None => {
                            gone.fetch_add(1, Ordering::Relaxed);
                            Reconciled(Ok(Outcome::Done))
                        }
                    }
                }
            }
        };
        let workers = workers.spawn_async(handler);
        let feed = tokio::spawn(feed(
            self.queue,
            stream::select_all(self.triggers),
            workers.stop_token().clone(),
        ));
        Running {
            workers,
            feed,
            store: self.store,
            gone,
        }
    }
}

/// A running controller, from [`Controller::run`].
///
/// Dropping it leaves the controller running until its [`StopToken`] is stopped.
pub struct Running<K, Q>
where
    K: Resource + 'static,
    K::DynamicType: Eq + Hash,
    Q: Queue,
{
    /// The pool reconciling keys.
    workers: AsyncWorkers<Q::Item, Q>,
    /// The task moving keys from the triggers to the queue; it ends on the stop.
    feed: JoinHandle<()>,
    /// The main watcher's objects.
    store: Store<K>,
    /// Keys whose object had left the store when handed out.
    gone: Arc<AtomicU64>,
}

impl<K, Q> fmt::Debug for Running<K, Q>
where
    K: Resource + 'static,
    K::DynamicType: Eq + Hash,
    Q: Queue,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Running")
            .field("workers", &self.workers)
            .field("gone", &self.gone)
            .finish_non_exhaustive()
    }
}

impl<K, Q> Running<K, Q>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
    Q: Queue,
    Q::Item: fmt::Debug,
{
    /// The store the reconcile reads. Await [`Store::wait_until_ready`] to know the first
    /// list is in.
    pub fn store(&self) -> &Store<K> {
        &self.store
    }

    /// The queue of object keys.
    pub fn queue(&self) -> &Q {
        self.workers.queue()
    }

    /// The token that stops the controller: the watchers end, the queue shuts down and the
    /// reconciles in flight finish.
    pub fn stop_token(&self) -> &StopToken {
        self.workers.stop_token()
    }

    /// Stops the controller without waiting (see [`stop_token`](Self::stop_token)).
    pub fn stop(&self) {
        self.workers.stop();
    }

    /// What the workers have done so far (a key whose object was gone counts as succeeded).
    pub fn stats(&self) -> Summary<Q::Item> {
        self.workers.stats()
    }

    /// How many keys came out of the queue after their object had left the store, and were
    /// done without a reconcile.
    pub fn objects_gone(&self) -> u64 {
        self.gone.load(Ordering::Relaxed)
    }

    /// Waits until the controller is stopped (or its queue shut down by someone else and
    /// drained), and returns what the workers did.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropping the future leaves the controller running unobserved.
    pub async fn wait(self) -> Summary<Q::Item> {
        let summary = self.workers.wait().await;
        end_feed(self.feed).await;
        summary
    }

    /// Stops the controller, waits for the reconciles in flight (up to the pool's
    /// `shutdown_timeout`) and returns what the workers did.
    ///
    /// # Cancel safety
    ///
    /// As for [`wait`](Self::wait).
    pub async fn shut_down(self) -> Summary<Q::Item> {
        let summary = self.workers.shut_down().await;
        end_feed(self.feed).await;
        summary
    }

    /// Runs until `signal` completes (`tokio::signal::ctrl_c()`), then shuts down as
    /// [`shut_down`](Self::shut_down) does. This is kube's `graceful_shutdown_on`.
    ///
    /// # Cancel safety
    ///
    /// As for [`wait`](Self::wait).
    pub async fn run_until<S: Future>(self, signal: S) -> Summary<Q::Item> {
        let summary = self.workers.run_until(signal).await;
        end_feed(self.feed).await;
        summary
    }
}

/// The handler's answer: the reconcile's outcome or failure, passed to the workers as is (so
/// that an error keeps its own type for the give-up report).
struct Reconciled(Result<Outcome, HandlerError>);

impl IntoOutcome for Reconciled {
    fn into_outcome(self) -> Result<Outcome, HandlerError> {
        self.0
    }
}

/// Turns a watcher's events into batches of keys: listed objects in one batch at
/// [`LIST_PRIORITY`] once the list is complete (so the main store, swapped in at the same
/// event, holds them all), changes and deletions one by one at [`WATCH_PRIORITY`].
fn batches<K, O, S>(
    events: S,
    mut map: impl FnMut(O) -> Vec<ObjectRef<K>> + Send + 'static,
) -> Trigger<K>
where
    K: Resource + 'static,
    O: Send + 'static,
    S: Stream<Item = watcher::Result<Event<O>>> + Send + 'static,
{
    let mut listed = Vec::new();
    events
        .filter_map(move |event| {
            let batch = match event {
                Ok(Event::Init) => {
                    listed.clear();
                    None
                }
                Ok(Event::InitApply(object)) => {
                    listed.extend(map(object));
                    None
                }
                Ok(Event::InitDone) => Some((std::mem::take(&mut listed), LIST_PRIORITY)),
                Ok(Event::Apply(object) | Event::Delete(object)) => {
                    Some((map(object), WATCH_PRIORITY))
                }
                Err(error) => {
                    // The watcher recovers on its own (relisting if needed), paced by its
                    // backoff; the next event tells.
                    tracing::warn!(%error, "watch failed, retrying");
                    None
                }
            };
            future::ready(batch.filter(|(refs, _)| !refs.is_empty()))
        })
        .boxed()
}

/// The owners of `child` that are of kind `K`, in the child's namespace.
fn owners<K, C>(child: &C, dyntype: &K::DynamicType) -> Vec<ObjectRef<K>>
where
    K: Resource,
    K::DynamicType: Clone,
    C: Resource,
{
    let meta = child.meta();
    meta.owner_references
        .iter()
        .flatten()
        .filter_map(|owner| {
            ObjectRef::from_owner_ref(meta.namespace.as_deref(), owner, dyntype.clone())
        })
        .collect()
}

/// Moves keys from the triggers to the queue until the stop, or until the queue refuses
/// adds (shut down).
async fn feed<K, Q>(queue: Q, mut triggers: SelectAll<Trigger<K>>, stop: StopToken)
where
    K: Resource + 'static,
    Q: Queue,
    Q::Item: ObjectKey<K>,
{
    let run = async {
        while let Some((refs, priority)) = triggers.next().await {
            let options = AddOptions::default().priority(priority);
            for object in &refs {
                let key = Q::Item::from_object_ref(object);
                match Queue::add_with(&queue, key.clone(), options).await {
                    Ok(true) => {}
                    Ok(false) => return,
                    // A shared backend's failure: the key is lost for now, but the next
                    // event or relist for the object brings it back.
                    Err(error) => tracing::warn!(%error, ?key, "cannot add a key to the queue"),
                }
            }
        }
    };
    tokio::select! {
        () = run => {}
        () = stop.stopped() => {}
    }
}

/// Ends the feeding task after the workers stopped.
async fn end_feed(feed: JoinHandle<()>) {
    feed.abort();
    // A cancelled task is the expected end; a panic in a trigger's mapper is reported.
    if let Err(error) = feed.await
        && error.is_panic()
    {
        tracing::error!(%error, "a trigger panicked");
    }
}
