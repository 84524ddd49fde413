//! The [`Controller`]'s sources besides the main kind: owned children, related objects,
//! streams of them, and outside triggers.

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use workq::Queue;

use crate::defaults::{LIST_PRIORITY, WATCH_PRIORITY};
use crate::names::{kind_of, short_type_name};
use crate::sources::{self, BackoffFactory, FeedItem, Role, Source, object_items, watcher_items};
use crate::{Controller, ObjectKey};

impl<K, Q> Controller<K, Q>
where
    K: Resource + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + fmt::Debug + Send + Sync + 'static,
    Q: Queue,
    Q::Item: ObjectKey<K>,
{
    /// Reconciles the owner of each `Child` that `api` lists or watches: the owner
    /// references of the main kind (in the child's namespace). A child's creation, change
    /// or deletion reconciles its owner. Only the children's metadata is listed and watched
    /// (`PartialObjectMetadata`): the owner references are all it needs. This is kube's
    /// `Controller::owns` (and `owns_with`: any child type, dynamic ones too).
    pub fn owns<Child>(mut self, api: Api<Child>, config: watcher::Config) -> Self
    where
        Child: Resource + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    {
        let dyntype = self.dyntype.clone();
        let name = format!("owns {}", kind_of::<Child>());
        self.sources.push(Box::new(move |backoff: &BackoffFactory| {
            // kube's metadata watcher, deprecated in favour of an `Api<PartialObjectMeta<_>>`
            // that cannot be built from an `Api<Child>`; it makes the same requests.
            #[expect(
                deprecated,
                reason = "the one watcher of metadata an `Api<Child>` can make"
            )]
            let events = kube::runtime::metadata_watcher(api, config).backoff(backoff());
            let items = watcher_items(events, move |child, _| {
                sources::owners::<K, _>(&child, &dyntype)
            });
            Source::new(name, Role::Watcher, items)
        }));
        self
    }

    /// Reconciles the owners of the children `trigger` yields, a stream you build (kube's
    /// `touched_objects()` shape, `predicate_filter`ed or metadata only, say). Its end stops
    /// the controller with [`ErrorKind::TriggerEnded`](crate::ErrorKind::TriggerEnded).
    /// This is kube's `Controller::owns_stream`.
    pub fn owns_stream<Child, E>(
        mut self,
        trigger: impl Stream<Item = Result<Child, E>> + Send + 'static,
    ) -> Self
    where
        Child: Resource + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let dyntype = self.dyntype.clone();
        let name = format!("owns_stream {}", kind_of::<Child>());
        self.sources.push(Box::new(move |_: &BackoffFactory| {
            let items = object_items(trigger, move |child: Child| {
                sources::owners::<K, _>(&child, &dyntype)
            });
            Source::new(name, Role::Stream, items)
        }));
        self
    }

    /// [`owns_stream`](Self::owns_stream) from a subscriber of a shared reflector. This is
    /// kube's `Controller::owns_shared_stream`.
    pub fn owns_shared_stream<Child>(
        mut self,
        trigger: impl Stream<Item = Arc<Child>> + Send + 'static,
    ) -> Self
    where
        Child: Resource + Send + Sync + 'static,
    {
        let dyntype = self.dyntype.clone();
        let name = format!("owns_shared_stream {}", kind_of::<Child>());
        self.sources.push(Box::new(move |_: &BackoffFactory| {
            let objects = trigger.map(Ok::<_, std::convert::Infallible>);
            let items = object_items(objects, move |child: Arc<Child>| {
                sources::owners::<K, _>(&*child, &dyntype)
            });
            Source::new(name, Role::Stream, items)
        }));
        self
    }

    /// Reconciles the objects `mapper` names for each `Other` that `api` lists or watches:
    /// any relation you can compute (a label, a field, a reference by name). A panic in the
    /// mapper stops the controller with
    /// [`ErrorKind::TriggerPanicked`](crate::ErrorKind::TriggerPanicked). This is kube's
    /// `Controller::watches` (and `watches_with`).
    pub fn watches<Other, I>(
        mut self,
        api: Api<Other>,
        config: watcher::Config,
        mapper: impl Fn(Other) -> I + Send + Sync + 'static,
    ) -> Self
    where
        Other: Resource + Clone + DeserializeOwned + fmt::Debug + Send + 'static,
        I: IntoIterator<Item = ObjectRef<K>>,
    {
        let name = format!("watches {}", kind_of::<Other>());
        self.sources.push(Box::new(move |backoff: &BackoffFactory| {
            let events = watcher::watcher(api, config).backoff(backoff());
            let items = watcher_items(events, move |other, _| sources::related(mapper(other)));
            Source::new(name, Role::Watcher, items)
        }));
        self
    }

    /// [`watches`](Self::watches) over a stream you build. Its end stops the controller
    /// with [`ErrorKind::TriggerEnded`](crate::ErrorKind::TriggerEnded). This is kube's
    /// `Controller::watches_stream`.
    pub fn watches_stream<Other, E, I>(
        mut self,
        trigger: impl Stream<Item = Result<Other, E>> + Send + 'static,
        mapper: impl Fn(Other) -> I + Send + Sync + 'static,
    ) -> Self
    where
        Other: Send + 'static,
        E: fmt::Display + Send + 'static,
        I: IntoIterator<Item = ObjectRef<K>>,
    {
        let name = format!("watches_stream {}", short_type_name::<Other>());
        self.sources.push(Box::new(move |_: &BackoffFactory| {
            let items = object_items(trigger, move |other| sources::related(mapper(other)));
            Source::new(name, Role::Stream, items)
        }));
        self
    }

    /// [`watches_stream`](Self::watches_stream) from a subscriber of a shared reflector.
    /// This is kube's `Controller::watches_shared_stream`.
    pub fn watches_shared_stream<Other, I>(
        mut self,
        trigger: impl Stream<Item = Arc<Other>> + Send + 'static,
        mapper: impl Fn(Arc<Other>) -> I + Send + Sync + 'static,
    ) -> Self
    where
        Other: Send + Sync + 'static,
        I: IntoIterator<Item = ObjectRef<K>>,
    {
        let name = format!("watches_shared_stream {}", short_type_name::<Other>());
        self.sources.push(Box::new(move |_: &BackoffFactory| {
            let objects = trigger.map(Ok::<_, std::convert::Infallible>);
            let items = object_items(objects, move |other| sources::related(mapper(other)));
            Source::new(name, Role::Stream, items)
        }));
        self
    }

    /// Reconciles each object `refs` names, at [`WATCH_PRIORITY`]: events from outside the
    /// cluster (a webhook, a message queue). The stream may end. This is kube's
    /// `Controller::reconcile_on`.
    pub fn reconcile_on(mut self, refs: impl Stream<Item = ObjectRef<K>> + Send + 'static) -> Self {
        self.sources.push(Box::new(move |_: &BackoffFactory| {
            let items =
                refs.map(|object| FeedItem::Keys(sources::related([object]), WATCH_PRIORITY));
            Source::new("reconcile_on", Role::Trigger, items)
        }));
        self
    }

    /// Reconciles every object in the store each time `trigger` yields, at
    /// [`LIST_PRIORITY`], as controller-runtime's resyncs do. The stream may end. This is
    /// kube's `Controller::reconcile_all_on`.
    pub fn reconcile_all_on(mut self, trigger: impl Stream<Item = ()> + Send + 'static) -> Self {
        let store = self.store.clone();
        let dyntype = self.dyntype.clone();
        self.sources.push(Box::new(move |_: &BackoffFactory| {
            let items = trigger.map(move |()| {
                let refs = store
                    .state()
                    .into_iter()
                    .map(|object| ObjectRef::from_obj_with(&*object, dyntype.clone()));
                FeedItem::Keys(sources::related(refs), LIST_PRIORITY)
            });
            Source::new("reconcile_all_on", Role::Trigger, items)
        }));
        self
    }
}
