//! What every request shares: the sources, the settings, the history and the counters.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::config::{Config, PublicUrl};
use crate::history::History;
use crate::sources::Registered;
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
        self.sources.iter().any(|s| s.source.has_actions())
    }

    pub(crate) fn read_only(&self, r: &Registered) -> bool {
        self.config.read_only || !r.source.has_actions()
    }
}
