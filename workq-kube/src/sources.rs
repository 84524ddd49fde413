//! The controller's sources of keys: watchers and streams turned into [`FeedItem`]s, each
//! guarded so that a panic inside (a mapper's) reaches the feed as an item instead of
//! silently ending the feed.

use std::future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::stream::{self, BoxStream};
use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event};

use crate::defaults::{LIST_PRIORITY, WATCH_PRIORITY};
use crate::gate::{Cause, Spec};

/// Keys with what is known of their events, to add at one priority.
pub(crate) type Keys<K> = Vec<(ObjectRef<K>, Cause)>;

/// What a source hands the feed.
pub(crate) enum FeedItem<K: Resource> {
    /// Keys to add at a priority.
    Keys(Keys<K>, i32),
    /// A watcher completed a list (its first one, or a relist).
    Listed,
    /// A watcher failed; it retries on its own after its backoff.
    WatchFailed(String),
    /// The stream panicked (in a mapper, or in the stream itself) and is over.
    Panicked(String),
    /// The stream ended.
    Ended,
}

/// How a source's end is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A watcher of this crate: it never ends, and its first list must complete within the
    /// sync timeout.
    Watcher,
    /// A stream of the caller's for the main kind or related objects: its end leaves the
    /// controller deaf to them, so it ends the run with an error.
    Stream,
    /// An outside trigger (`reconcile_on`, `reconcile_all_on`): it may end (kube's rule).
    Trigger,
}

/// One source of keys, ready to run.
pub(crate) struct Source<K: Resource> {
    /// Its name in errors, logs and metrics (`ConfigMap`, `owns Secret`, ...).
    pub(crate) name: Arc<str>,
    /// What its end means.
    pub(crate) role: Role,
    /// Its items; guarded against panics, and ending with [`FeedItem::Ended`].
    pub(crate) items: BoxStream<'static, FeedItem<K>>,
}

/// Makes a fresh backoff for one watcher.
pub(crate) type BackoffFactory = Arc<dyn Fn() -> Box<dyn Backoff> + Send + Sync>;

/// kube's default watcher backoff (client-go's: 800 ms doubling to 30 s, with jitter, reset
/// after two quiet minutes).
pub(crate) fn default_backoff() -> BackoffFactory {
    Arc::new(|| Box::new(watcher::DefaultBackoff::default()))
}

/// A source that is built when the controller runs (so that the trigger backoff chosen last
/// applies to every watcher).
pub(crate) type SourceBuilder<K> = Box<dyn FnOnce(&BackoffFactory) -> Source<K> + Send>;

impl<K: Resource + 'static> Source<K> {
    /// A source over `items`, guarded: a panic while polling becomes
    /// [`FeedItem::Panicked`], and the end [`FeedItem::Ended`].
    pub(crate) fn new(
        name: impl Into<Arc<str>>,
        role: Role,
        items: impl Stream<Item = FeedItem<K>> + Send + 'static,
    ) -> Self {
        let items = AssertUnwindSafe(items)
            .catch_unwind()
            .map(|item| match item {
                Ok(item) => item,
                Err(payload) => FeedItem::Panicked(panic_message(payload.as_ref())),
            })
            .chain(stream::once(future::ready(FeedItem::Ended)))
            .boxed();
        Self {
            name: name.into(),
            role,
            items,
        }
    }
}

/// The message of a panic payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(message) = payload.downcast_ref::<&str>() {
        (*message).to_owned()
    } else if let Some(message) = payload.downcast_ref::<String>() {
        message.clone()
    } else {
        "(a panic payload that is not a string)".to_owned()
    }
}

/// Turns a watcher's events into feed items: listed objects in one batch at
/// [`LIST_PRIORITY`] once the list is complete (so the main store, swapped in at the same
/// event, holds them all), changes and deletions one by one at [`WATCH_PRIORITY`].
/// `map` names the keys an object stands for, with what the event tells of them.
pub(crate) fn watcher_items<K, O, S>(
    events: S,
    mut map: impl FnMut(O, bool) -> Keys<K> + Send + 'static,
) -> impl Stream<Item = FeedItem<K>> + Send + 'static
where
    K: Resource + 'static,
    O: Send + 'static,
    S: Stream<Item = watcher::Result<Event<O>>> + Send + 'static,
{
    let mut listed = Vec::new();
    events.flat_map(move |event| {
        let items = match event {
            Ok(Event::Init) => {
                listed.clear();
                vec![]
            }
            Ok(Event::InitApply(object)) => {
                listed.extend(map(object, false));
                vec![]
            }
            Ok(Event::InitDone) => {
                let keys = std::mem::take(&mut listed);
                let mut items = vec![FeedItem::Listed];
                if !keys.is_empty() {
                    items.push(FeedItem::Keys(keys, LIST_PRIORITY));
                }
                items
            }
            Ok(Event::Apply(object)) => keys_item(map(object, false), WATCH_PRIORITY),
            Ok(Event::Delete(object)) => keys_item(map(object, true), WATCH_PRIORITY),
            Err(error) => vec![FeedItem::WatchFailed(error.to_string())],
        };
        stream::iter(items)
    })
}

/// Turns a stream of objects (kube's `applied_objects()` / `touched_objects()` shape) into
/// feed items at [`WATCH_PRIORITY`].
pub(crate) fn object_items<K, O, E, S>(
    objects: S,
    mut map: impl FnMut(O) -> Keys<K> + Send + 'static,
) -> impl Stream<Item = FeedItem<K>> + Send + 'static
where
    K: Resource + 'static,
    O: Send + 'static,
    E: std::fmt::Display,
    S: Stream<Item = Result<O, E>> + Send + 'static,
{
    objects.flat_map(move |object| {
        stream::iter(match object {
            Ok(object) => keys_item(map(object), WATCH_PRIORITY),
            Err(error) => vec![FeedItem::WatchFailed(error.to_string())],
        })
    })
}

/// One batch of keys, or nothing if there are none.
fn keys_item<K: Resource>(keys: Keys<K>, priority: i32) -> Vec<FeedItem<K>> {
    if keys.is_empty() {
        vec![]
    } else {
        vec![FeedItem::Keys(keys, priority)]
    }
}

/// The key of a main object, with what its event tells: a deletion, or its spec marks.
pub(crate) fn own_key<K>(object: &K, deleted: bool, dyntype: &K::DynamicType) -> Keys<K>
where
    K: Resource,
    K::DynamicType: Clone,
{
    let cause = if deleted {
        Cause::Deleted
    } else {
        Cause::Object(Spec::of(object))
    };
    vec![(ObjectRef::from_obj_with(object, dyntype.clone()), cause)]
}

/// The owners of `child` that are of kind `K`, in the child's namespace.
pub(crate) fn owners<K, C>(child: &C, dyntype: &K::DynamicType) -> Keys<K>
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
        .map(|owner| (owner, Cause::Related))
        .collect()
}

/// Keys from a mapper's answer, as related.
pub(crate) fn related<K: Resource>(refs: impl IntoIterator<Item = ObjectRef<K>>) -> Keys<K> {
    refs.into_iter().map(|key| (key, Cause::Related)).collect()
}
