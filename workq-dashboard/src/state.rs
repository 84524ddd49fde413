//! What every request shares: the sources (each an [`Admin`] under a label, with the listing
//! it shares), the settings, the history and the counters.
//!
//! A source's listing is shared: requests that arrive while a listing runs wait for it and
//! take its answer, so any number of open pages, the sampler and `/metrics` cost the server
//! at most one listing at a time per source.

use std::sync::Arc;
use std::time::Instant;

use workq::admin::{Admin, AdminError, QueueSummary};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::config::{Config, PublicUrl};
use crate::history::History;
use crate::token::Failures;

/// Labels of the action counter: `action`, `result`.
pub(crate) type ActionLabels = Vec<(&'static str, String)>;

/// What every request shares.
pub(crate) struct Shared {
    pub(crate) sources: Vec<Registered>,
    pub(crate) config: Config,
    pub(crate) public: Option<PublicUrl>,
    pub(crate) history: History,
    /// Actions by name and result, for `/metrics`.
    pub(crate) actions: Family<ActionLabels, Counter>,
    /// Refused requests by reason, for `/metrics`.
    pub(crate) refusals: Family<ActionLabels, Counter>,
    /// Requests with a missing or wrong token, for `/metrics`.
    pub(crate) auth_failures: Counter,
    /// Failed attempts by client, to slow down guessing.
    pub(crate) failures: Failures,
    /// Whether the log said once that requests are refused for want of peer addresses.
    pub(crate) no_peer_told: std::sync::atomic::AtomicBool,
    /// When a page or a scraper last read, for the sampler.
    pub(crate) reads: Arc<Reads>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.reads.close();
    }
}

pub(crate) type AppState = Arc<Shared>;

/// When the figures were last read (a page, a scraper): the sampler runs only while they
/// are.
#[derive(Default)]
pub(crate) struct Reads {
    last: parking_lot::Mutex<Option<tokio::time::Instant>>,
    closed: std::sync::atomic::AtomicBool,
    /// Notified by a read and by the close; the sampler waits on it while nobody reads.
    pub(crate) wake: tokio::sync::Notify,
}

impl Reads {
    /// A page or a scraper reads now.
    pub(crate) fn touch(&self) {
        *self.last.lock() = Some(tokio::time::Instant::now());
        self.wake.notify_one();
    }

    pub(crate) fn active(&self, window: std::time::Duration) -> bool {
        self.last.lock().is_some_and(|t| t.elapsed() < window)
    }

    fn close(&self) {
        self.closed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.wake.notify_one();
    }

    pub(crate) fn closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Shared {
    /// Whether any source can act.
    pub(crate) fn any_actions(&self) -> bool {
        self.sources.iter().any(|s| s.admin.capabilities().actions)
    }

    pub(crate) fn read_only(&self, r: &Registered) -> bool {
        self.config.read_only || !r.admin.capabilities().actions
    }
}

/// A listing and when it finished.
type Listing = (Instant, Result<Arc<Vec<QueueSummary>>, AdminError>);

/// One source of the dashboard: a backend's [`Admin`] under a label.
pub(crate) struct Registered {
    /// Its label: its kind, with `-2`, `-3`... for a second source of one kind.
    pub(crate) label: String,
    pub(crate) admin: Box<dyn Admin>,
    /// The last listing; its lock is held while a listing runs, so concurrent callers wait
    /// for that one instead of sending their own.
    listing: tokio::sync::Mutex<Option<Listing>>,
    /// Since when the server has been unreachable, in milliseconds since the Unix epoch.
    down_since: parking_lot::Mutex<Option<u64>>,
    /// The queues `/metrics` last found without flow control, and when.
    pub(crate) no_flow: crate::flow::NoFlow,
}

impl Registered {
    pub(crate) fn new(label: String, admin: Box<dyn Admin>) -> Self {
        Registered {
            label,
            admin,
            listing: tokio::sync::Mutex::new(None),
            down_since: parking_lot::Mutex::new(None),
            no_flow: crate::flow::NoFlow::default(),
        }
    }

    /// The queues. A call made while another's listing runs takes that listing's answer
    /// (it is as fresh as an answer given the moment the call came); a call made after the
    /// last listing finished lists anew.
    pub(crate) async fn queues(&self) -> Result<Arc<Vec<QueueSummary>>, AdminError> {
        let asked = Instant::now();
        let mut slot = self.listing.lock().await;
        if let Some((finished, listing)) = slot.as_ref()
            && *finished > asked
        {
            return listing.clone();
        }
        let listing = self.admin.queues().await.map(|mut queues| {
            for q in &mut queues {
                // What a server says about a queue is shown: no URL in it keeps a secret.
                if let Some(why) = &mut q.broken {
                    *why = workq::admin::redact_urls_in(why);
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
    pub(crate) fn note<T>(&self, result: &Result<T, AdminError>) {
        let mut down = self.down_since.lock();
        match result {
            Err(AdminError::Unavailable(_)) => {
                down.get_or_insert_with(crate::respond::now_ms);
            }
            Err(AdminError::Backend(_) | AdminError::NotFound) => {}
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
