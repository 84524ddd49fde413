//! A web dashboard for workqueue queues: a page, a JSON API under `/api/` and Prometheus
//! metrics under `/metrics`, as one [`axum::Router`].
//!
//! The router reads its queues from a [`Source`]: [`RedisSource`] (feature `redis`, on by
//! default) lists every queue under a key prefix and can act on them (requeue or purge dead
//! letters, pause and resume, forget an item's failures); [`MemorySource`] shows in-process
//! [`workqueue::WorkQueue`]s through their [`QueueProbe`]s, read-only.
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
//! - With no [token](Config::token), requests must name a loopback host (`Host:`
//!   `localhost`, `127.x.x.x` or `[::1]`), which stops DNS rebinding from a web page; bind such
//!   a dashboard to loopback only (`wq dashboard` refuses anything else without a token).
//! - With a token, every request needs it: `Authorization: Bearer TOKEN`, or the cookie the
//!   page sets (HttpOnly, SameSite=Strict) after one visit to `/?token=TOKEN`. The page itself
//!   holds no secret.
//! - Every action is a `POST` that must carry the header `X-Wq-Csrf: 1` (a cross-site form
//!   cannot set a header, and cross-site scripts cannot without a CORS preflight, which the
//!   dashboard never grants) and, when the browser sends them, a same-origin `Origin` and
//!   `Sec-Fetch-Site`.
//! - [`Config::read_only`] turns every action off.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::{OriginalUri, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

pub mod exposition;
mod memory;
mod metrics;
#[cfg(feature = "redis")]
mod redis_source;

pub use memory::MemorySource;
#[cfg(feature = "redis")]
pub use redis_source::{RedisSource, redact};
pub use workqueue::metrics::QueueProbe;

/// One queue's figures, as `/api/queues` lists them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[non_exhaustive]
pub struct QueueView {
    /// The queue's name.
    pub name: String,
    /// Items ready to hand out.
    pub depth: usize,
    /// Items waiting for a delay.
    pub delayed: usize,
    /// Items under a lease.
    pub in_flight: usize,
    /// Items with a failure count.
    pub failing: usize,
    /// The sum of the failure counts listed in the queue's detail.
    pub failures: u64,
    /// Items whose lease expired and was reclaimed (stalls).
    pub stalled: usize,
    /// Dead letters.
    pub dead: usize,
    /// Dead letters dropped by the cap.
    pub dead_dropped: u64,
    /// Whether `get` hands nothing out.
    pub paused: bool,
    /// Whether the queue is shut down.
    pub shut_down: bool,
    /// How long the oldest lease out has been held, in seconds.
    pub longest_running_s: f64,
    /// The sum of how long the leases out have been held, in seconds.
    pub unfinished_work_s: f64,
    /// Adds since the source started counting, where it counts them (in process).
    pub adds_total: Option<u64>,
    /// Completed leases since the source started counting, where it counts them.
    pub completions_total: Option<u64>,
    /// Retries since the source started counting, where it counts them: delayed and
    /// rate-limited adds in process, `add_rate_limited` calls (failures) on Redis.
    pub retries_total: Option<u64>,
}

/// An item under a lease.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LeaseView {
    /// The item (its JSON text).
    pub item: String,
    /// Seconds since it was handed out.
    pub age_s: f64,
    /// Seconds until its lease expires if not renewed.
    pub expires_in_s: f64,
    /// The fencing token of the lease: which holder has it.
    pub token: u64,
}

/// An item's failure count.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FailureView {
    /// The item (its JSON text).
    pub item: String,
    /// Failures since its last `forget`.
    pub failures: u64,
}

/// A dead letter.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeadLetterView {
    /// The item (its JSON text).
    pub item: String,
    /// Why it was moved aside.
    pub error: String,
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Its leases that expired in a row.
    pub stalls: u64,
    /// Its failure count when it was moved.
    pub failures: u64,
}

/// One queue in detail: `/api/queues/{name}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct QueueDetail {
    /// The figures.
    #[serde(flatten)]
    pub view: QueueView,
    /// Items under a lease, the oldest deadlines first.
    pub leases: Vec<LeaseView>,
    /// Failure counts, largest first.
    pub failure_counts: Vec<FailureView>,
    /// Dead letters, oldest first.
    pub dead_letters: Vec<DeadLetterView>,
}

/// What an operator can do to a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// Requeue the oldest dead letter of this item (its JSON text).
    RequeueDeadLetter(String),
    /// Requeue every dead letter.
    RequeueDeadLetters,
    /// Drop every dead letter.
    PurgeDeadLetters,
    /// Stop handing out items (adds are still taken).
    Pause,
    /// Hand out items again.
    Resume,
    /// Clear an item's failure count (its JSON text).
    Forget(String),
}

/// An error of a [`Source`], shown to the operator (it must hold no secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceError {
    /// No such queue.
    NotFound,
    /// The source cannot do this action.
    Unsupported,
    /// The request was wrong (a bad item, say).
    BadRequest(String),
    /// The backend failed.
    Backend(String),
}

impl std::fmt::Display for SourceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SourceError::NotFound => f.write_str("no such queue"),
            SourceError::Unsupported => f.write_str("this source cannot do that"),
            SourceError::BadRequest(m) => write!(f, "bad request: {m}"),
            SourceError::Backend(m) => write!(f, "backend error: {m}"),
        }
    }
}

impl std::error::Error for SourceError {}

/// Where the dashboard reads its queues from.
pub trait Source: Send + Sync + 'static {
    /// Every queue with its figures, sorted by name.
    fn queues(&self) -> impl Future<Output = Result<Vec<QueueView>, SourceError>> + Send;
    /// One queue in detail, listing at most `limit` leases, failure counts and dead letters.
    fn queue(
        &self,
        name: &str,
        limit: usize,
    ) -> impl Future<Output = Result<QueueDetail, SourceError>> + Send;
    /// Does `action` to queue `name`; returns a figure (how many items it moved, or whether it
    /// changed anything as 0 or 1).
    fn act(
        &self,
        name: &str,
        action: Action,
    ) -> impl Future<Output = Result<u64, SourceError>> + Send;
    /// Warnings for the operator (a server whose persistence can lose acknowledged work).
    fn warnings(&self) -> impl Future<Output = Vec<String>> + Send;
    /// Whether [`act`](Self::act) can do anything at all.
    fn has_actions(&self) -> bool;
}

/// How the dashboard behaves.
#[derive(Debug, Clone)]
pub struct Config {
    /// The token every request must carry; `None` allows loopback hosts only.
    pub token: Option<String>,
    /// No actions: every `POST` is refused.
    pub read_only: bool,
    /// How often the figures are sampled for the charts.
    pub sample_every: Duration,
    /// How long samples are kept (the charts' span).
    pub keep: Duration,
    /// At most this many leases, failure counts and dead letters in a queue's detail.
    pub detail_limit: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            token: None,
            read_only: false,
            sample_every: Duration::from_secs(5),
            keep: Duration::from_secs(3600),
            detail_limit: 100,
        }
    }
}

/// One sample of a queue's figures for the charts.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Sample {
    /// When, in milliseconds since the Unix epoch.
    pub t: u64,
    /// Ready items.
    pub depth: usize,
    /// Items under a lease.
    pub in_flight: usize,
    /// Delayed items.
    pub delayed: usize,
    /// Sum of the listed failure counts.
    pub failures: u64,
    /// Dead letters.
    pub dead: usize,
    /// [`QueueView::adds_total`].
    pub adds: Option<u64>,
    /// [`QueueView::completions_total`].
    pub completions: Option<u64>,
    /// [`QueueView::retries_total`].
    pub retries: Option<u64>,
}

struct Shared<S> {
    source: S,
    config: Config,
    history: Mutex<BTreeMap<String, VecDeque<Sample>>>,
}

type AppState<S> = Arc<Shared<S>>;

const COOKIE: &str = "wq_dashboard_token";
const CSRF_HEADER: &str = "x-wq-csrf";

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The dashboard for `source`: the page at `/`, the API under `/api/`, metrics at
/// `/metrics`. Serve it alone, or mount it with [`Router::nest_service`] (which also routes
/// `/prefix/` to the page; `nest` would not). It samples the figures
/// every [`Config::sample_every`] for the charts, in a task spawned on the current Tokio
/// runtime (so call it inside one) that ends when the router is dropped.
pub fn router<S: Source>(source: S, config: Config) -> Router {
    let shared = Arc::new(Shared {
        source,
        config,
        history: Mutex::new(BTreeMap::new()),
    });
    tokio::spawn(sampler(Arc::downgrade(&shared)));
    let guarded = shared.clone();
    Router::new()
        .route("/", get(page))
        .route("/assets/app.js", get(app_js))
        .route("/assets/app.css", get(app_css))
        .route("/api/queues", get(api_queues::<S>))
        .route("/api/queues/{name}", get(api_queue::<S>))
        .route("/api/history", get(api_history::<S>))
        .route("/api/queues/{name}/pause", post(act_pause::<S>))
        .route("/api/queues/{name}/resume", post(act_resume::<S>))
        .route(
            "/api/queues/{name}/dead-letters/requeue",
            post(act_requeue_one::<S>),
        )
        .route(
            "/api/queues/{name}/dead-letters/requeue-all",
            post(act_requeue_all::<S>),
        )
        .route(
            "/api/queues/{name}/dead-letters/purge",
            post(act_purge::<S>),
        )
        .route("/api/queues/{name}/forget", post(act_forget::<S>))
        .route("/metrics", get(metrics_text::<S>))
        .layer(middleware::from_fn_with_state(guarded, guard::<S>))
        .with_state(shared)
}

async fn sampler<S: Source>(shared: Weak<Shared<S>>) {
    loop {
        let Some(state) = shared.upgrade() else {
            return;
        };
        let every = state.config.sample_every.max(Duration::from_millis(100));
        sample(&state).await;
        drop(state);
        tokio::time::sleep(every).await;
    }
}

async fn sample<S: Source>(state: &Shared<S>) {
    let Ok(queues) = state.source.queues().await else {
        return;
    };
    let t = now_ms();
    let keep = state.config.keep.as_millis() as u64;
    let mut history = state.history.lock();
    for q in &queues {
        let samples = history.entry(q.name.clone()).or_default();
        samples.push_back(Sample {
            t,
            depth: q.depth,
            in_flight: q.in_flight,
            delayed: q.delayed,
            failures: q.failures,
            dead: q.dead,
            adds: q.adds_total,
            completions: q.completions_total,
            retries: q.retries_total,
        });
        while samples.front().is_some_and(|s| s.t + keep < t) {
            samples.pop_front();
        }
    }
    history.retain(|_, s| s.back().is_some_and(|last| last.t + keep >= t));
}

/// Whether `host` (a `Host:` header, maybe with a port) names this machine.
fn loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn cookie_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v)
}

fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

fn refuse(status: StatusCode, why: &str) -> Response {
    (status, axum::Json(serde_json::json!({ "error": why }))).into_response()
}

/// Authentication, DNS-rebinding and CSRF checks, and the read-only switch.
async fn guard<S: Source>(
    State(state): State<AppState<S>>,
    request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .to_owned();
    match &state.config.token {
        None => {
            if !loopback_host(&host) {
                return refuse(
                    StatusCode::FORBIDDEN,
                    "without a token the dashboard answers loopback hosts only",
                );
            }
        }
        Some(token) => {
            let bearer = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            let ok = bearer.is_some_and(|b| same(b, token))
                || cookie_token(headers).is_some_and(|c| same(c, token));
            if !ok {
                // One visit to `/?token=T` sets the cookie and drops the token from the URL.
                let query = request.uri().query().unwrap_or("");
                let given = query
                    .split('&')
                    .filter_map(|kv| kv.split_once('='))
                    .find(|(k, _)| *k == "token")
                    .map(|(_, v)| v);
                if request.method() == Method::GET
                    && request.uri().path() == "/"
                    && given.is_some_and(|g| same(g, token))
                {
                    let mut response = Redirect::to("./").into_response();
                    let cookie = format!("{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/");
                    if let Ok(value) = HeaderValue::from_str(&cookie) {
                        response.headers_mut().insert(header::SET_COOKIE, value);
                    }
                    return response;
                }
                return refuse(StatusCode::UNAUTHORIZED, "a token is needed");
            }
        }
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        if state.config.read_only || !state.source.has_actions() {
            return refuse(StatusCode::FORBIDDEN, "the dashboard is read-only");
        }
        if headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok()) != Some("1") {
            return refuse(StatusCode::FORBIDDEN, "missing the X-Wq-Csrf header");
        }
        if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok())
            && site != "same-origin"
            && site != "none"
        {
            return refuse(StatusCode::FORBIDDEN, "cross-site request");
        }
        if let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
            let bare = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"))
                .unwrap_or("");
            if bare != host {
                return refuse(StatusCode::FORBIDDEN, "cross-origin request");
            }
        }
    }
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.insert(
        "content-security-policy",
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; style-src 'self'; frame-ancestors 'none'",
        ),
    );
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn error_response(e: SourceError) -> Response {
    let status = match e {
        SourceError::NotFound => StatusCode::NOT_FOUND,
        SourceError::Unsupported => StatusCode::FORBIDDEN,
        SourceError::BadRequest(_) => StatusCode::BAD_REQUEST,
        SourceError::Backend(_) => StatusCode::BAD_GATEWAY,
    };
    refuse(status, &e.to_string())
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

async fn api_queues<S: Source>(State(state): State<AppState<S>>) -> Response {
    match state.source.queues().await {
        Ok(queues) => axum::Json(serde_json::json!({
            "queues": queues,
            "warnings": state.source.warnings().await,
            "read_only": state.config.read_only || !state.source.has_actions(),
        }))
        .into_response(),
        Err(e) => error_response(e),
    }
}

async fn api_queue<S: Source>(
    State(state): State<AppState<S>>,
    Path(name): Path<String>,
) -> Response {
    match state.source.queue(&name, state.config.detail_limit).await {
        Ok(detail) => axum::Json(detail).into_response(),
        Err(e) => error_response(e),
    }
}

#[derive(Deserialize)]
struct HistoryQuery {
    since: Option<u64>,
}

async fn api_history<S: Source>(
    State(state): State<AppState<S>>,
    Query(q): Query<HistoryQuery>,
) -> Response {
    let since = q.since.unwrap_or(0);
    let history = state.history.lock();
    let queues: BTreeMap<&str, Vec<Sample>> = history
        .iter()
        .map(|(name, s)| {
            (
                name.as_str(),
                s.iter().filter(|x| x.t > since).copied().collect(),
            )
        })
        .collect();
    axum::Json(serde_json::json!({
        "sample_every_ms": state.config.sample_every.as_millis() as u64,
        "queues": queues,
    }))
    .into_response()
}

async fn run_action<S: Source>(state: &Shared<S>, name: &str, action: Action) -> Response {
    let what = format!("{action:?}");
    match state.source.act(name, action).await {
        Ok(n) => {
            tracing::info!(queue = %name, action = %what, result = n, "dashboard action");
            axum::Json(serde_json::json!({ "ok": true, "count": n })).into_response()
        }
        Err(e) => error_response(e),
    }
}

/// The body of the actions that name an item.
#[derive(Deserialize)]
struct ItemBody {
    item: String,
}

async fn act_pause<S: Source>(State(s): State<AppState<S>>, Path(n): Path<String>) -> Response {
    run_action(&s, &n, Action::Pause).await
}

async fn act_resume<S: Source>(State(s): State<AppState<S>>, Path(n): Path<String>) -> Response {
    run_action(&s, &n, Action::Resume).await
}

async fn act_requeue_all<S: Source>(
    State(s): State<AppState<S>>,
    Path(n): Path<String>,
) -> Response {
    run_action(&s, &n, Action::RequeueDeadLetters).await
}

async fn act_purge<S: Source>(State(s): State<AppState<S>>, Path(n): Path<String>) -> Response {
    run_action(&s, &n, Action::PurgeDeadLetters).await
}

async fn act_requeue_one<S: Source>(
    State(s): State<AppState<S>>,
    Path(n): Path<String>,
    axum::Json(body): axum::Json<ItemBody>,
) -> Response {
    run_action(&s, &n, Action::RequeueDeadLetter(body.item)).await
}

async fn act_forget<S: Source>(
    State(s): State<AppState<S>>,
    Path(n): Path<String>,
    axum::Json(body): axum::Json<ItemBody>,
) -> Response {
    run_action(&s, &n, Action::Forget(body.item)).await
}

async fn metrics_text<S: Source>(State(state): State<AppState<S>>, headers: HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    match state.source.queues().await {
        Ok(queues) => {
            let (content_type, body) = metrics::encode_queues(&queues, accept);
            ([(header::CONTENT_TYPE, content_type)], body).into_response()
        }
        Err(e) => error_response(e),
    }
}
