//! The sources of one dashboard, each under a label, behind one object-safe trait; and the
//! listing each shares: requests that arrive while a listing runs wait for it and take its
//! answer, so any number of open pages, the sampler and `/metrics` cost the server at most
//! one listing at a time per source.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use crate::source::{
    Action, ItemDetail, ItemPage, Outcome, PageRequest, QueueView, Source, SourceError,
    SourceStatus,
};

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// [`Source`] with boxed futures, so that sources of different types sit in one list.
pub(crate) trait DynSource: Send + Sync + 'static {
    fn kind(&self) -> &'static str;
    fn has_actions(&self) -> bool;
    fn has_items(&self) -> bool;
    fn status(&self) -> BoxFuture<'_, SourceStatus>;
    fn queues(&self) -> BoxFuture<'_, Result<Vec<QueueView>, SourceError>>;
    fn queue<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<QueueView, SourceError>>;
    fn items<'a>(
        &'a self,
        name: &'a str,
        request: &'a PageRequest,
    ) -> BoxFuture<'a, Result<ItemPage, SourceError>>;
    fn item<'a>(
        &'a self,
        name: &'a str,
        item: &'a str,
    ) -> BoxFuture<'a, Result<ItemDetail, SourceError>>;
    fn act<'a>(
        &'a self,
        name: &'a str,
        action: &'a Action,
    ) -> BoxFuture<'a, Result<Outcome, SourceError>>;
}

impl<S: Source> DynSource for S {
    fn kind(&self) -> &'static str {
        Source::kind(self)
    }
    fn has_actions(&self) -> bool {
        Source::has_actions(self)
    }
    fn has_items(&self) -> bool {
        Source::has_items(self)
    }
    fn status(&self) -> BoxFuture<'_, SourceStatus> {
        Box::pin(Source::status(self))
    }
    fn queues(&self) -> BoxFuture<'_, Result<Vec<QueueView>, SourceError>> {
        Box::pin(Source::queues(self))
    }
    fn queue<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<QueueView, SourceError>> {
        Box::pin(Source::queue(self, name))
    }
    fn items<'a>(
        &'a self,
        name: &'a str,
        request: &'a PageRequest,
    ) -> BoxFuture<'a, Result<ItemPage, SourceError>> {
        Box::pin(Source::items(self, name, request))
    }
    fn item<'a>(
        &'a self,
        name: &'a str,
        item: &'a str,
    ) -> BoxFuture<'a, Result<ItemDetail, SourceError>> {
        Box::pin(Source::item(self, name, item))
    }
    fn act<'a>(
        &'a self,
        name: &'a str,
        action: &'a Action,
    ) -> BoxFuture<'a, Result<Outcome, SourceError>> {
        Box::pin(Source::act(self, name, action))
    }
}

/// A listing and when it finished.
type Listing = (Instant, Result<Arc<Vec<QueueView>>, SourceError>);

/// One source of the dashboard.
pub(crate) struct Registered {
    /// Its label: its kind, with `-2`, `-3`... for a second source of one kind.
    pub(crate) label: String,
    pub(crate) source: Box<dyn DynSource>,
    /// The last listing; its lock is held while a listing runs, so concurrent callers wait
    /// for that one instead of sending their own.
    listing: tokio::sync::Mutex<Option<Listing>>,
    /// Since when the server has been unreachable, in milliseconds since the Unix epoch.
    down_since: Mutex<Option<u64>>,
}

impl Registered {
    pub(crate) fn new(label: String, source: Box<dyn DynSource>) -> Self {
        Registered {
            label,
            source,
            listing: tokio::sync::Mutex::new(None),
            down_since: Mutex::new(None),
        }
    }

    /// The queues, labelled with this source. A call made while another's listing runs takes
    /// that listing's answer (it is as fresh as an answer given the moment the call came);
    /// a call made after the last listing finished lists anew.
    pub(crate) async fn queues(&self) -> Result<Arc<Vec<QueueView>>, SourceError> {
        let asked = Instant::now();
        let mut slot = self.listing.lock().await;
        if let Some((finished, listing)) = slot.as_ref()
            && *finished > asked
        {
            return listing.clone();
        }
        let listing = self.source.queues().await.map(|mut queues| {
            for q in &mut queues {
                q.source.clone_from(&self.label);
                // What a server says about a queue is shown: no URL in it keeps a secret.
                if let Some(why) = &mut q.broken {
                    *why = crate::redact::scrub(why);
                }
            }
            Arc::new(queues)
        });
        self.note(&listing);
        *slot = Some((Instant::now(), listing.clone()));
        listing
    }

    /// Forgets the kept listing (after an action changed the figures).
    pub(crate) async fn invalidate(&self) {
        *self.listing.lock().await = None;
    }

    /// Records whether a call reached the server.
    pub(crate) fn note<T>(&self, result: &Result<T, SourceError>) {
        let mut down = self.down_since.lock();
        match result {
            Err(SourceError::Unavailable(_)) => {
                down.get_or_insert_with(crate::respond::now_ms);
            }
            Err(SourceError::Backend(_)) | Err(SourceError::NotFound) => {}
            _ => *down = None,
        }
    }

    /// Since when the server has been unreachable, if it is.
    pub(crate) fn down_since(&self) -> Option<u64> {
        *self.down_since.lock()
    }
}

/// The label of the next source of `kind`, given those taken.
pub(crate) fn label_for(kind: &str, taken: &[Registered]) -> String {
    let mut label = kind.to_owned();
    let mut n = 1;
    while taken.iter().any(|r| r.label == label) {
        n += 1;
        label = format!("{kind}-{n}");
    }
    label
}
