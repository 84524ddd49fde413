//! A web dashboard for workq queues: a page, a JSON API under `/api/` and Prometheus
//! metrics under `/metrics`, as one [`axum::Router`].
//!
//! The router reads its queues from one or more sources, each an operator contract
//! ([`admin::Admin`], from `workq`) that a backend implements: `workq_redis::RedisAdmin`
//! lists every queue under a key prefix of a Redis server or cluster,
//! `workq_postgres::PgAdmin` every queue of a database, and both page through their items
//! and act on them (pause and resume, requeue, delete or purge dead letters, retry or remove
//! one item, forget an item's failures, pause or resume a periodic schedule);
//! [`admin::MemoryAdmin`] shows the in-process [`workq::WorkQueue`]s of this process through
//! their [`QueueProbe`]s, read-only. The
//! dashboard knows no backend: everything it shows and does goes through the contract, so a
//! backend's new operator call reaches the page without a change here. [`Dashboard`] serves
//! several sources on one page (Redis and PostgreSQL queues side by side); [`router`] serves
//! one.
//!
//! ```no_run
//! use workq_dashboard::admin::MemoryAdmin;
//! use workq_dashboard::{Config, Server, generate_token};
//!
//! # async fn run() -> std::io::Result<()> {
//! let source = MemoryAdmin::new();
//! // Queues built with the source as their metrics provider show up on the page.
//! let queue: workq::WorkQueue<String> =
//!     workq::WorkQueue::builder().name("pods").metrics(source.clone()).build();
//! // A random token, printed once: the page wants it, whoever asks.
//! let token = generate_token();
//! let config = Config { token: Some(token.clone()), ..Config::default() };
//! let app = axum::Router::new()
//!     .route("/healthz", axum::routing::get(|| async { "ok" }))
//!     .nest_service("/dashboard", workq_dashboard::router(source, config));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! println!("http://127.0.0.1:8080/dashboard/?token={token}");
//! // Bounded connections, a header timeout, and the client's address for the audit log.
//! Server::new(listener).serve(app).await
//! # }
//! ```
//!
//! # Flow control and periodic schedules
//!
//! A queue's page shows, beside its figures, what its `stats` and `schedules` answer: for a
//! queue with flow control its groups (the [`Config::groups_shown`] with the most ready
//! items: ready, in flight, in-flight limit, how long the oldest has waited) and its limits
//! (queue-wide and per-group in-flight limits, weights, hand-out rates, in the words of
//! [`FlowLimits::described`](workq::flow::FlowLimits::described)), and its periodic
//! schedules (spec, time zone, next tick, last tick taken, paused or running, since when),
//! each paused and resumed from its row. `/api/queues/{name}` carries them as `flow`,
//! `groups`, `limits`, `limits_described` and `schedules`. `/metrics` adds, for the queues
//! with flow control, the in-process provider's `workqueue_groups_ready` and
//! `workqueue_group_saturated`, and, when [`Config::group_series`] asks for them,
//! `workqueue_group_depth` and `workqueue_group_in_flight` for the top groups of each queue
//! (label `group`); a scrape reads the flow control of at most [`Config::flow_queues`]
//! queues per source, and leaves a queue found without it for a minute. Group and schedule
//! names are cut at 240 bytes on the page, as items are.
//!
//! # Serving it safely
//!
//! The page shows every item and can purge, requeue and remove them: keep it to its
//! operators by listening on **loopback** (`127.0.0.1`), always with **a token**, and on
//! another address only **behind a reverse proxy** that ends TLS or with **TLS** of its own
//! ([`Server::tls_pem`]). `wq dashboard` (crate `workq-cli`) refuses to start otherwise
//! unless told to serve plain HTTP. In detail:
//!
//! - **With a token**, always, unless only this machine can reach it and everything on this
//!   machine may read and act on the queues. [`generate_token`] makes one (256 bits);
//!   [`Dashboard::router`] refuses a weak one ([`check_token`]: under [`MIN_TOKEN_BITS`]
//!   bits, or characters that are not URL-safe). The API wants `Authorization: Bearer
//!   TOKEN`; a browser opens `/?token=TOKEN` once (percent-encoding is read), which sets an
//!   HttpOnly, SameSite=Strict cookie scoped to the dashboard's path (`Secure` when the
//!   public URL is `https`) and drops the token from the address. The page holds no secret.
//!   Missing or wrong tokens are answered 401 and counted
//!   (`workqueue_dashboard_auth_failures_total`); wrong ones, past five from one address (one
//!   IPv6 /64) in ten minutes, are answered later and later, up to 5 s.
//! - **Without a token** the router answers only clients whose address it sees and is
//!   loopback, naming a loopback `Host` (or the public URL's; this stops DNS rebinding), and
//!   not forwarded by a proxy for another address. Served without the client's address
//!   (`axum::serve(listener, app)` with no `ConnectInfo`), it refuses every request and says
//!   how to fix it. Every process of this machine is trusted then, and so is a reverse proxy
//!   on it: nginx's `proxy_pass` reaches the dashboard from 127.0.0.1 and, by default, says
//!   nothing of its client. So a [public URL](Config::public_url) needs a token.
//! - **Served by [`Server`]**: at most 512 connections (64 per client: an IPv4 address, or
//!   an IPv6 /64, whose addresses one machine may all use), closed as they come past the
//!   caps, so thousands of idle sockets cost no file descriptors and keep no one else out;
//!   10 s to send a request's headers; HTTPS with rustls ([`Server::tls_pem`], feature
//!   `tls`). [`Server::from_listener`] serves on any axum listener that gives client
//!   addresses. The router itself refuses a body over
//!   [`Config::body_limit`] (64 KiB) with 413 before reading it, and answers 408 after
//!   [`Config::request_timeout`] (30 s), however it is served.
//! - **Behind a reverse proxy**, set [`Config::public_url`] to the URL operators open
//!   (`https://ops.example.com/wq/`): nginx's defaults rewrite `Host` to the upstream's
//!   address and add no `X-Forwarded-*` header, so the browser's `Origin` is checked against
//!   the public URL instead of `Host`.
//! - Every action is a `POST` that must carry the header `X-Wq-Csrf: 1` (a cross-site form
//!   cannot set a header, and cross-site scripts cannot without a CORS preflight, which the
//!   dashboard never grants) and, when the browser sends them, a same-origin `Origin` (the
//!   public URL's, or the `Host`'s) and `Sec-Fetch-Site`.
//! - [`Config::read_only`] turns every action off. Every action and every refusal (a
//!   missing or wrong token, a client off this machine, the CSRF and origin checks, the
//!   read-only switch, a body over the limit or unreadable, a request over the time limit)
//!   is logged through `tracing` (target `workq_dashboard::audit`: client address,
//!   action, queue, the item or dead letter the request named, cut to 240 bytes, result,
//!   reason) and counted in `/metrics`
//!   (`workqueue_dashboard_actions_total{action,result}`,
//!   `workqueue_dashboard_refusals_total{reason}`).
//! - No secret goes out: every server URL shown or logged is
//!   [redacted](admin::redact_url) from its parsed form (user information, and every query
//!   value but a few known harmless ones), and so is every URL in a server's error message.

use std::sync::Arc;

use axum::Router;
use axum::extract::OriginalUri;
use axum::http::{StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};

mod api;
mod client;
mod config;
pub mod exposition;
mod flow;
mod guard;
mod history;
mod metrics;
mod respond;
mod server;
mod state;
mod target;
pub mod text;
mod token;

pub use config::Config;
pub use history::Sample;
pub use server::Server;
pub use token::{MIN_TOKEN_BITS, check_token, generate_token};
/// The operator contract the dashboard reads its sources through (`workq::admin`).
pub use workq::admin;
pub use workq::admin::ActionOutcome;
pub use workq::metrics::QueueProbe;

/// The old name of [`admin::MemoryAdmin`], which moved to `workq`.
#[deprecated(since = "0.1.0", note = "use `workq::admin::MemoryAdmin`")]
pub type MemorySource = workq::admin::MemoryAdmin;

/// `url` as it may be shown or logged: see [`admin::redact_url`], where it moved.
#[deprecated(since = "0.1.0", note = "use `workq::admin::redact_url`")]
pub fn redact(url: &str) -> String {
    workq::admin::redact_url(url)
}

/// A dashboard of one or more sources, each labelled by its
/// [kind](admin::Admin::kind) (a second source of one kind is `kind-2`).
///
/// ```no_run
/// use workq_dashboard::admin::MemoryAdmin;
/// use workq_dashboard::{Config, Dashboard};
///
/// # async fn run() {
/// let app = Dashboard::new(Config::default())
///     .source(MemoryAdmin::new())
///     .router()
///     .expect("a valid configuration");
/// # let _ = app;
/// # }
/// ```
#[derive(Default)]
pub struct Dashboard {
    config: Config,
    sources: Vec<state::Registered>,
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

    /// Adds a backend's queues, under its kind's label (`redis`, then `redis-2`, ...); they
    /// are listed beside the others'. Any [`admin::Admin`] will do, a `Box<dyn Admin>` too.
    #[must_use]
    pub fn source(mut self, admin: impl admin::Admin + 'static) -> Self {
        let label = state::label_for(admin.kind(), &self.sources);
        self.sources
            .push(state::Registered::new(label, Box::new(admin)));
        self
    }

    /// The router: the page at `/`, the API under `/api/`, metrics at `/metrics`. Serve it
    /// alone with [`Server`] (or at least with
    /// `into_make_service_with_connect_info::<SocketAddr>()`, so that the loopback rule and
    /// the audit log see the client's address), or mount it with [`Router::nest_service`]
    /// (which also routes `/prefix/` to the page; `nest` would not). While a page or a
    /// scraper reads (and for three samples after, at least 10 s), it samples the figures
    /// every [`Config::sample_every`] for the charts, in a task spawned on the current Tokio
    /// runtime (so call it inside one) that ends when the router is dropped; nobody reading,
    /// it asks the servers nothing.
    ///
    /// # Errors
    ///
    /// A [`Config::token`] that [`check_token`] refuses, a [`Config::public_url`] that is not
    /// an `http(s)://HOST[/PATH]` URL, or a public URL without a token (a proxy serves the
    /// dashboard to other machines, and to the dashboard every request through it comes
    /// from this one).
    pub fn router(self) -> Result<Router, String> {
        if let Some(token) = &self.config.token {
            check_token(token)?;
        }
        let public = self
            .config
            .public_url
            .as_deref()
            .map(config::PublicUrl::parse)
            .transpose()?;
        if public.is_some() && self.config.token.is_none() {
            return Err(
                "a public URL needs a token: behind a reverse proxy every request comes from \
                 this machine, whoever sent it"
                    .into(),
            );
        }
        let reads = Arc::new(state::Reads::default());
        let shared = Arc::new(state::Shared {
            history: history::History::new(
                respond::millis(self.config.keep),
                self.config.history_queues,
            ),
            sources: self.sources,
            config: self.config,
            public,
            actions: Default::default(),
            refusals: Default::default(),
            auth_failures: Default::default(),
            failures: Default::default(),
            no_peer_told: Default::default(),
            reads: reads.clone(),
        });
        tokio::spawn(api::sampler(Arc::downgrade(&shared), reads));
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
            "schedules/pause",
            "schedules/resume",
        ] {
            app = app.route(
                &format!("/api/queues/{{name}}/{verb}"),
                post(move |state, name, which, request| {
                    api::act(state, name, which, request, verb)
                }),
            );
        }
        let body_limit = shared.config.body_limit;
        let request_timeout = shared.config.request_timeout;
        // From the outside in: the audit log sees every answer; the time limit and the body
        // limit hold before authentication; then the guard.
        Ok(app
            .layer(middleware::from_fn_with_state(shared.clone(), guard::guard))
            .layer(tower_http::limit::RequestBodyLimitLayer::new(body_limit))
            .layer(tower_http::timeout::TimeoutLayer::with_status_code(
                StatusCode::REQUEST_TIMEOUT,
                request_timeout,
            ))
            .layer(middleware::from_fn_with_state(shared.clone(), api::audit))
            .with_state(shared))
    }
}

/// The dashboard for one `source` (see [`Dashboard::router`]).
///
/// # Panics
///
/// If [`Dashboard::router`] refuses the configuration (a weak token, a public URL that is not
/// an `http(s)://HOST[/PATH]` URL or has no token); use [`Dashboard`] to get the error
/// instead.
pub fn router(admin: impl admin::Admin + 'static, config: Config) -> Router {
    Dashboard::new(config)
        .source(admin)
        .router()
        .unwrap_or_else(|e| panic!("workq-dashboard: {e}"))
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

#[cfg(test)]
mod tests {
    #[test]
    #[expect(deprecated, reason = "the old names keep compiling for one release")]
    fn the_old_names_still_name_what_moved() {
        let memory: super::MemorySource = workq::admin::MemoryAdmin::new();
        assert_eq!(workq::admin::Admin::kind(&memory), "memory");
        assert_eq!(super::redact("redis://:pw@h:1/"), "redis://***@h:1/");
    }
}
