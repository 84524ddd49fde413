//! A web dashboard for workqueue queues: a page, a JSON API under `/api/` and Prometheus
//! metrics under `/metrics`, as one [`axum::Router`].
//!
//! The router reads its queues from one or more [`Source`]s, one implementation per backend:
//! [`RedisSource`] (feature `redis`, on by default) lists every queue under a key prefix over
//! one reconnecting connection, pages through their items and acts on them (pause and
//! resume, requeue, delete or purge dead letters, retry or remove one item, forget an item's
//! failures); [`MemorySource`] shows in-process [`workqueue::WorkQueue`]s through their
//! [`QueueProbe`]s, read-only. [`Dashboard`] serves several sources on one page (Redis and
//! PostgreSQL queues side by side); [`router`] serves one.
//!
//! ```no_run
//! use workqueue_dashboard::{Config, MemorySource};
//!
//! # async fn run() {
//! let source = MemorySource::new();
//! // Queues built with the source as their metrics provider show up on the page.
//! let queue: workqueue::WorkQueue<String> =
//!     workqueue::WorkQueue::builder().name("pods").metrics(source.clone()).build();
//! let app = axum::Router::new()
//!     .route("/healthz", axum::routing::get(|| async { "ok" }))
//!     .nest_service("/dashboard", workqueue_dashboard::router(source, Config::default()));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await.unwrap();
//! axum::serve(listener, app).await.unwrap();
//! # }
//! ```
//!
//! # Safety
//!
//! - With no [token](Config::token), requests must come from this machine: a client whose
//!   address is not loopback is refused whatever `Host` it sends (when the server records
//!   peers: serve with `into_make_service_with_connect_info::<SocketAddr>()`), so is a request
//!   a proxy forwarded for another address, and the `Host` must be a loopback name
//!   (`localhost`, `127.x.x.x`, `[::1]`) or the [public URL](Config::public_url)'s host, which
//!   stops DNS rebinding from a web page.
//! - With a token, every request needs it: `Authorization: Bearer TOKEN`, or the cookie the
//!   page sets after one visit to `/?token=TOKEN` (HttpOnly, SameSite=Strict, scoped to the
//!   dashboard's path, and `Secure` when the public URL is `https`). The page holds no secret.
//! - Every action is a `POST` that must carry the header `X-Wq-Csrf: 1` (a cross-site form
//!   cannot set a header, and cross-site scripts cannot without a CORS preflight, which the
//!   dashboard never grants) and, when the browser sends them, a same-origin `Origin` (the
//!   public URL's, or the `Host`'s) and `Sec-Fetch-Site`.
//! - Behind a reverse proxy, set [`Config::public_url`] to the URL operators open: nginx's
//!   defaults rewrite `Host` to the upstream's address and add no `X-Forwarded-*` header, so
//!   the browser's `Origin` is checked against the public URL instead of `Host`.
//! - [`Config::read_only`] turns every action off. Every action, done or refused, is logged
//!   through `tracing` (target `workqueue_dashboard::audit`: client address, action, source,
//!   queue, item, result) and counted in `/metrics` (`workqueue_dashboard_actions_total`).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::OriginalUri;
use axum::http::{StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};

mod api;
pub mod exposition;
mod guard;
mod history;
mod memory;
mod metrics;
#[cfg(feature = "postgres")]
mod pg_source;
mod redact;
#[cfg(feature = "redis")]
mod redis_source;
mod source;
mod sources;

pub use history::Sample;
pub use memory::MemorySource;
#[cfg(feature = "postgres")]
pub use pg_source::PgSource;
pub use redact::redact;
#[cfg(feature = "redis")]
pub use redis_source::RedisSource;
pub use source::{
    Action, DeadLetterView, End, ItemDetail, ItemPage, ItemState, ItemView, LeaseView, Outcome,
    PageRequest, QueueView, Source, SourceError, SourceStatus,
};
pub use workqueue::metrics::QueueProbe;

/// How the dashboard behaves.
#[derive(Debug, Clone)]
pub struct Config {
    /// The token every request must carry; `None` allows clients on this machine only.
    pub token: Option<String>,
    /// No actions: every `POST` is refused.
    pub read_only: bool,
    /// How often the figures are sampled for the charts.
    pub sample_every: Duration,
    /// How long samples are kept (the charts' span).
    pub keep: Duration,
    /// The items of one page when the page does not say (at most ten times this on request).
    pub page_limit: usize,
    /// At most this many queues have their samples kept (each source's totals always are):
    /// the ones the page looked at most recently, then the first listed. Bounds the memory
    /// whatever the number of queues.
    pub history_queues: usize,
    /// The URL operators open when the dashboard is served behind a reverse proxy
    /// (`https://ops.example.com/wq/`): its origin is accepted on actions, its host without a
    /// token, its path scopes the cookie, and an `https` URL makes the cookie `Secure`.
    pub public_url: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            token: None,
            read_only: false,
            sample_every: Duration::from_secs(5),
            keep: Duration::from_secs(3600),
            page_limit: 50,
            history_queues: 100,
            public_url: None,
        }
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub(crate) fn refuse(status: StatusCode, why: &str) -> Response {
    (status, axum::Json(serde_json::json!({ "error": why }))).into_response()
}

/// A dashboard of one or more sources, each labelled by its [kind](Source::kind) (a second
/// source of one kind is `kind-2`).
///
/// ```no_run
/// use workqueue_dashboard::{Config, Dashboard, MemorySource};
///
/// # async fn run() {
/// let app = Dashboard::new(Config::default())
///     .source(MemorySource::new())
///     .router()
///     .expect("a valid configuration");
/// # let _ = app;
/// # }
/// ```
#[derive(Default)]
pub struct Dashboard {
    config: Config,
    sources: Vec<sources::Registered>,
}

impl std::fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dashboard")
            .field("config", &self.config)
            .field(
                "sources",
                &self.sources.iter().map(|s| &s.label).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Dashboard {
    /// A dashboard with no source yet.
    pub fn new(config: Config) -> Self {
        Dashboard {
            config,
            sources: Vec::new(),
        }
    }

    /// Adds a source; its queues are listed beside the others'.
    #[must_use]
    pub fn source<S: Source>(mut self, source: S) -> Self {
        let label = sources::label_for(source.kind(), &self.sources);
        self.sources
            .push(sources::Registered::new(label, Box::new(source)));
        self
    }

    /// The router: the page at `/`, the API under `/api/`, metrics at `/metrics`. Serve it
    /// alone (with `into_make_service_with_connect_info::<SocketAddr>()`, so that the
    /// loopback rule and the audit log see the client's address), or mount it with
    /// [`Router::nest_service`] (which also routes `/prefix/` to the page; `nest` would not).
    /// It samples the figures every [`Config::sample_every`] for the charts, in a task spawned
    /// on the current Tokio runtime (so call it inside one) that ends when the router is
    /// dropped.
    ///
    /// # Errors
    ///
    /// A [`Config::public_url`] that is not an `http(s)://HOST[/PATH]` URL.
    pub fn router(self) -> Result<Router, String> {
        let public = self
            .config
            .public_url
            .as_deref()
            .map(guard::PublicUrl::parse)
            .transpose()?;
        let shared = Arc::new(api::Shared {
            history: history::History::new(
                self.config.keep.as_millis() as u64,
                self.config.history_queues,
            ),
            sources: self.sources,
            config: self.config,
            public,
            actions: Default::default(),
        });
        tokio::spawn(api::sampler(Arc::downgrade(&shared)));
        let mut app = Router::new()
            .route("/", get(page))
            .route("/assets/app.js", get(app_js))
            .route("/assets/app.css", get(app_css))
            .route("/api/queues", get(api::api_queues))
            .route("/api/queues/{name}", get(api::api_queue))
            .route("/api/queues/{name}/items", get(api::api_items))
            .route("/api/queues/{name}/item", get(api::api_item))
            .route("/api/history", get(api::api_history))
            .route("/metrics", get(api::metrics_text));
        for verb in [
            "pause",
            "resume",
            "dead-letters/requeue-all",
            "dead-letters/purge",
            "dead-letters/requeue",
            "dead-letters/delete",
            "items/retry",
            "items/remove",
            "forget",
        ] {
            app = app.route(
                &format!("/api/queues/{{name}}/{verb}"),
                post(move |state, name, which, request| {
                    api::act(state, name, which, request, verb)
                }),
            );
        }
        Ok(app
            .layer(middleware::from_fn_with_state(shared.clone(), guard::guard))
            .with_state(shared))
    }
}

/// The dashboard for one `source` (see [`Dashboard::router`]).
///
/// # Panics
///
/// If [`Config::public_url`] is set and is not an `http(s)://HOST[/PATH]` URL (use
/// [`Dashboard`] to get the error instead).
pub fn router<S: Source>(source: S, config: Config) -> Router {
    Dashboard::new(config)
        .source(source)
        .router()
        .unwrap_or_else(|e| panic!("workqueue-dashboard: {e}"))
}

/// The page. Its links are relative, so that it works wherever the router is mounted: mounted
/// with `nest_service("/dashboard", ...)`, a request for `/dashboard` is sent on to
/// `/dashboard/`.
async fn page(OriginalUri(uri): OriginalUri) -> Response {
    let path = uri.path();
    if !path.ends_with('/') {
        let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
        return Redirect::permanent(&format!("{path}/{query}")).into_response();
    }
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("assets/index.html"),
    )
        .into_response()
}

async fn app_js() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("assets/app.js"),
    )
}

async fn app_css() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("assets/app.css"),
    )
}
