//! The feed: one task that moves keys from every source to the queue, through the gate, in
//! batches; counts watch failures; and stops the controller with an error when a source
//! panics, ends for good, or does not complete its first list in time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::{BoxStream, SelectAll};
use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use parking_lot::Mutex;
use tokio::sync::watch;
use tracing::Instrument;
use workq::{AddOptions, Queue, StopToken};

use crate::ObjectKey;
use crate::error::ErrorKind;
use crate::gate::{Admit, Gate};
use crate::sources::{FeedItem, Role, Source};

/// The first wait after a failed add; it doubles up to [`ADD_RETRY_MAX`].
const ADD_RETRY_MIN: Duration = Duration::from_millis(50);
/// The longest wait between two attempts to add keys to a failing backend.
const ADD_RETRY_MAX: Duration = Duration::from_secs(5);

/// Items handled per round: what the sources have ready, up to this many, is added in one
/// call per priority (one round trip on a shared queue).
const ROUND: usize = 512;

/// What the feed has done, shared with [`Running`](crate::Running).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Keys handed to the queue.
    pub(crate) added: AtomicU64,
    /// Keys held back while their object was being reconciled.
    pub(crate) held: AtomicU64,
    /// Keys deferred because their object waits for the retry of a failure.
    pub(crate) deferred: AtomicU64,
    /// Watcher failures (each retried after the watcher's backoff).
    pub(crate) watch_errors: AtomicU64,
    /// Adds the queue failed (each retried).
    pub(crate) add_errors: AtomicU64,
}

/// What a controller's feed has done so far: from [`Running::feed_stats`](crate::Running::feed_stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FeedStats {
    /// Keys handed to the queue (each event's keys, after the rules below; the queue then
    /// merges the duplicates).
    pub added: u64,
    /// Keys held back because their object was being reconciled by this process: added when
    /// the reconcile succeeds, dropped when it fails (the retry reads the newest object).
    pub held: u64,
    /// Keys not added because their object waits for the retry of a failure and the event
    /// did not change its spec (see [`Controller`](crate::Controller)).
    pub deferred: u64,
    /// Watcher failures seen (a watcher retries on its own after its backoff).
    pub watch_errors: u64,
    /// Adds a shared queue failed (its server out of reach); each is retried with backoff
    /// until it goes through, so no key is lost to an outage.
    pub add_errors: u64,
    /// Objects backing off after a failure in this process now.
    pub backing_off: usize,
}

impl Counters {
    pub(crate) fn snapshot(&self, backing_off: usize) -> FeedStats {
        FeedStats {
            added: self.added.load(Ordering::Relaxed),
            held: self.held.load(Ordering::Relaxed),
            deferred: self.deferred.load(Ordering::Relaxed),
            watch_errors: self.watch_errors.load(Ordering::Relaxed),
            add_errors: self.add_errors.load(Ordering::Relaxed),
            backing_off,
        }
    }
}

/// A source's name and role, by index.
struct Meta {
    name: Arc<str>,
    role: Role,
    /// Whether it must still complete its first list.
    unsynced: bool,
    /// Its last failure, for the sync timeout's error.
    last_error: Option<String>,
}

/// Everything the feed task needs.
pub(crate) struct Feed<Q: Queue> {
    /// The queue keys go to (the caller's, not the gate's view).
    pub(crate) queue: Q,
    pub(crate) gate: Arc<Gate<Q::Item>>,
    /// Turns `true` once the main store has completed its first list (within
    /// `sync_timeout`): set here when the main source is this crate's watcher (at its first
    /// list), by a task watching the caller's store otherwise.
    pub(crate) ready: Arc<watch::Sender<bool>>,
    pub(crate) sync_timeout: Duration,
    pub(crate) counters: Arc<Counters>,
    /// Where a failure that stops the controller is left for [`Running`](crate::Running).
    pub(crate) failure: Arc<Mutex<Option<ErrorKind>>>,
    pub(crate) stop: StopToken,
    /// The controller's name, for logs and metrics.
    pub(crate) controller: Arc<str>,
}

impl<Q: Queue> Feed<Q>
where
    Q::Item: std::fmt::Debug,
{
    /// Runs until the stop, or until a source fails for good (then stops the controller).
    pub(crate) async fn run<K>(self, sources: Vec<Source<K>>)
    where
        K: Resource + 'static,
        K::DynamicType: Clone,
        Q::Item: ObjectKey<K>,
    {
        let mut metas = Vec::new();
        let mut all: SelectAll<BoxStream<'static, (usize, FeedItem<K>)>> = SelectAll::new();
        for (index, source) in sources.into_iter().enumerate() {
            metas.push(Meta {
                name: source.name,
                role: source.role,
                unsynced: source.role == Role::Watcher,
                last_error: None,
            });
            all.push(source.items.map(move |item| (index, item)).boxed());
        }
        let mut rounds = all.ready_chunks(ROUND);
        let mut ready = self.ready.subscribe();
        let mut main_synced = false;
        let deadline = tokio::time::sleep(self.sync_timeout);
        tokio::pin!(deadline);
        let stopped = self.stop.stopped();
        tokio::pin!(stopped);
        let failure = loop {
            let synced = main_synced && metas.iter().all(|meta| !meta.unsynced);
            tokio::select! {
                biased;
                () = &mut stopped => return,
                () = async { let _ = ready.wait_for(|ready| *ready).await; }, if !main_synced => {
                    main_synced = true;
                }
                () = &mut deadline, if !synced => break Some(self.not_synced(&metas, main_synced)),
                round = rounds.next() => match round {
                    Some(round) => {
                        if let Some(failure) = self.handle(round, &mut metas).await {
                            break Some(failure);
                        }
                    }
                    // Every source ended: only outside triggers can (the others fail first).
                    None => break None,
                },
            }
        };
        let Some(failure) = failure else {
            // Nothing more to feed: the workers go on until the stop.
            return stopped.await;
        };
        tracing::error!(controller = %self.controller, error = %failure, "the controller stops");
        self.failure.lock().get_or_insert(failure);
        self.stop.stop();
    }

    /// The error for a sync timeout: the first source that has not listed.
    fn not_synced(&self, metas: &[Meta], main_synced: bool) -> ErrorKind {
        let meta = if main_synced {
            metas.iter().find(|meta| meta.unsynced)
        } else {
            metas.first()
        };
        ErrorKind::NotSynced {
            trigger: meta.map_or_else(String::new, |meta| meta.name.to_string()),
            timeout: self.sync_timeout,
            last_error: meta.and_then(|meta| meta.last_error.clone()),
        }
    }

    /// Handles one round of items; returns the failure that ends the controller, if any.
    async fn handle<K>(
        &self,
        round: Vec<(usize, FeedItem<K>)>,
        metas: &mut [Meta],
    ) -> Option<ErrorKind>
    where
        K: Resource + 'static,
        K::DynamicType: Clone,
        Q::Item: ObjectKey<K>,
    {
        // Keys by priority, highest first, each in the order the events came.
        let mut batches: BTreeMap<std::cmp::Reverse<i32>, Vec<Q::Item>> = BTreeMap::new();
        let mut failure = None;
        // The events that brought keys, the keys that go to the queue, and the first one's
        // object (for the round's span).
        let (mut events, mut added, mut first) = (0, 0, None);
        for (index, item) in round {
            let meta = &mut metas[index];
            match item {
                FeedItem::Keys(keys, priority) => {
                    events += 1;
                    for (object, cause) in keys {
                        let key = Q::Item::from_object_ref(&object);
                        if self.admit(&key, cause, priority).await {
                            added += 1;
                            first.get_or_insert(object);
                            batches
                                .entry(std::cmp::Reverse(priority))
                                .or_default()
                                .push(key);
                        }
                    }
                }
                FeedItem::Listed => {
                    meta.unsynced = false;
                    if index == 0 {
                        // The reflector swapped the main store in at this very event.
                        self.ready.send_replace(true);
                    }
                }
                FeedItem::WatchFailed(error) => {
                    self.counters.watch_errors.fetch_add(1, Ordering::Relaxed);
                    #[cfg(feature = "prometheus")]
                    crate::metrics::watch_error(&self.controller, &meta.name);
                    tracing::warn!(controller = %self.controller, trigger = %meta.name, %error, "watch failed; retrying after the watcher's backoff");
                    meta.last_error = Some(error);
                }
                FeedItem::Panicked(message) => {
                    failure.get_or_insert(ErrorKind::TriggerPanicked {
                        trigger: meta.name.to_string(),
                        message,
                    });
                }
                FeedItem::Ended => match meta.role {
                    Role::Trigger => {
                        tracing::debug!(controller = %self.controller, trigger = %meta.name, "trigger ended");
                    }
                    Role::Watcher | Role::Stream => {
                        failure.get_or_insert(ErrorKind::TriggerEnded {
                            trigger: meta.name.to_string(),
                        });
                    }
                },
            }
        }
        if batches.is_empty() {
            return failure;
        }
        // Keys gathered before a failure are still added: the controller stops gracefully.
        let span = self.events_span(events, added, first.as_ref());
        async {
            for (std::cmp::Reverse(priority), keys) in batches {
                if !self.add(keys, priority).await {
                    // The queue is shut down, or the controller stopped: it is stopping.
                    break;
                }
            }
        }
        .instrument(span)
        .await;
        failure
    }

    /// The span a round's keys are added in: `controller.events`, with the controller's
    /// name, how many events brought keys, how many keys go to the queue, and the object
    /// when there is one (a live change, most of the time), as kube-runtime names it
    /// (`object.ref`). An add records the span it is made in (feature `otel`), so the
    /// reconcile of each key links to the round of events that queued it.
    fn events_span<K>(
        &self,
        events: usize,
        keys: usize,
        object: Option<&ObjectRef<K>>,
    ) -> tracing::Span
    where
        K: Resource,
    {
        let span = tracing::info_span!(
            "controller.events",
            controller = %self.controller,
            events,
            keys,
            "object.ref" = tracing::field::Empty,
        );
        if keys == 1
            && let Some(object) = object
        {
            span.record("object.ref", tracing::field::display(object));
        }
        span
    }

    /// Adds `keys` at `priority`, until the queue takes them: a shared backend's failure
    /// (an outage) is retried with backoff, so that no change is lost to it; the watchers
    /// wait meanwhile. Returns `false` if the queue is shut down or the controller stopped.
    async fn add(&self, keys: Vec<Q::Item>, priority: i32) -> bool {
        let count = keys.len();
        let options = AddOptions::default().priority(priority);
        let mut backoff = ADD_RETRY_MIN;
        loop {
            match self.queue.add_all_with(keys.clone(), options).await {
                Ok(added) => {
                    self.counters
                        .added
                        .fetch_add(added as u64, Ordering::Relaxed);
                    return added == count;
                }
                Err(error) => {
                    self.counters.add_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(controller = %self.controller, %error, keys = count, retry_in = ?backoff, "cannot add keys to the queue; retrying");
                    tokio::select! {
                        () = self.stop.stopped() => return false,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(ADD_RETRY_MAX);
                }
            }
        }
    }

    /// Whether `key` goes to the queue now (see [`Gate::admit`]).
    async fn admit(&self, key: &Q::Item, cause: crate::gate::Cause, priority: i32) -> bool {
        match self.gate.admit(key, cause, priority) {
            Admit::Add => true,
            Admit::Hold => {
                self.counters.held.fetch_add(1, Ordering::Relaxed);
                false
            }
            Admit::Defer => {
                self.counters.deferred.fetch_add(1, Ordering::Relaxed);
                false
            }
            Admit::Verify => match self.queue.num_requeues(key).await {
                Ok(0) => {
                    self.gate.backoff_over(key);
                    true
                }
                Ok(_) => {
                    self.counters.deferred.fetch_add(1, Ordering::Relaxed);
                    false
                }
                // Unknown: add it; an early retry is better than a lost one.
                Err(error) => {
                    tracing::warn!(controller = %self.controller, %error, ?key, "cannot read a key's failures");
                    true
                }
            },
        }
    }
}
