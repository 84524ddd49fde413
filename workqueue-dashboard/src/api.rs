//! The JSON API: listings, pages of items, one item, the charts' samples, actions (each
//! logged and counted), and `/metrics`.

use std::sync::Arc;

use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde::Deserialize;
use serde_json::json;

use crate::guard::{forwarded_for, peer};
use crate::history::History;
use crate::source::{Action, End, ItemState, PageRequest, SourceError};
use crate::sources::Registered;
use crate::{Config, now_ms, refuse};

/// Labels of the action counter: `action`, `result`.
pub(crate) type ActionLabels = Vec<(&'static str, String)>;

/// What every request shares.
pub(crate) struct Shared {
    pub(crate) sources: Vec<Registered>,
    pub(crate) config: Config,
    pub(crate) public: Option<crate::guard::PublicUrl>,
    pub(crate) history: History,
    /// Actions by name and result, for `/metrics`.
    pub(crate) actions: Family<ActionLabels, Counter>,
}

pub(crate) type AppState = Arc<Shared>;

impl Shared {
    /// Whether any source can act.
    pub(crate) fn any_actions(&self) -> bool {
        self.sources.iter().any(|s| s.source.has_actions())
    }

    fn read_only(&self, r: &Registered) -> bool {
        self.config.read_only || !r.source.has_actions()
    }
}

pub(crate) fn error_response(e: &SourceError) -> Response {
    let status = match e {
        SourceError::NotFound => StatusCode::NOT_FOUND,
        SourceError::Unsupported => StatusCode::FORBIDDEN,
        SourceError::BadRequest(_) => StatusCode::BAD_REQUEST,
        SourceError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        SourceError::Backend(_) => StatusCode::BAD_GATEWAY,
    };
    refuse(status, &e.to_string())
}

#[derive(Deserialize, Default)]
pub(crate) struct Which {
    source: Option<String>,
}

/// The source a request names, or the one that has queue `name` when it names none.
async fn resolve<'a>(
    state: &'a Shared,
    source: Option<&str>,
    name: Option<&str>,
) -> Result<&'a Registered, Response> {
    if let Some(label) = source {
        return state
            .sources
            .iter()
            .find(|r| r.label == label)
            .ok_or_else(|| refuse(StatusCode::NOT_FOUND, "no such source"));
    }
    if state.sources.len() == 1 {
        return Ok(&state.sources[0]);
    }
    let Some(name) = name else {
        return Err(refuse(StatusCode::BAD_REQUEST, "give ?source="));
    };
    let mut found = Vec::new();
    for r in &state.sources {
        if let Ok(queues) = r.queues().await
            && queues.iter().any(|q| q.name == name)
        {
            found.push(r);
        }
    }
    match found.as_slice() {
        [one] => Ok(one),
        [] => Err(refuse(StatusCode::NOT_FOUND, "no such queue")),
        _ => Err(refuse(
            StatusCode::CONFLICT,
            "a queue of that name is in several sources: give ?source=",
        )),
    }
}

pub(crate) async fn api_queues(State(state): State<AppState>, Query(w): Query<Which>) -> Response {
    let mut queues = Vec::new();
    let mut sources = Vec::new();
    let mut any_up = false;
    let mut last_error = None;
    for r in &state.sources {
        if w.source.as_deref().is_some_and(|s| s != r.label) {
            continue;
        }
        let listing = r.queues().await;
        let status = r.source.status().await;
        let (up, error) = match &listing {
            Ok(list) => {
                queues.extend(list.iter().cloned());
                (true, None)
            }
            Err(e) => {
                last_error = Some(e.clone());
                (false, Some(e.to_string()))
            }
        };
        any_up |= up;
        sources.push(json!({
            "label": r.label,
            "kind": r.source.kind(),
            "up": up,
            "error": error,
            "down_since_ms": r.down_since(),
            "server": status.server,
            "warnings": status.warnings,
            "read_only": state.read_only(r),
            "has_items": r.source.has_items(),
        }));
    }
    let body = json!({
        "queues": queues,
        "sources": sources,
        "read_only": state.config.read_only || !state.any_actions(),
        "page_limit": state.config.page_limit,
    });
    let status = match (&last_error, any_up || sources.is_empty()) {
        (_, true) => StatusCode::OK,
        (Some(SourceError::Unavailable(_)), false) => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::BAD_GATEWAY,
    };
    (status, axum::Json(body)).into_response()
}

pub(crate) async fn api_queue(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(w): Query<Which>,
) -> Response {
    let r = match resolve(&state, w.source.as_deref(), Some(&name)).await {
        Ok(r) => r,
        Err(response) => return response,
    };
    let result = r.source.queue(&name).await;
    r.note(&result);
    match result {
        Ok(mut view) => {
            view.source.clone_from(&r.label);
            state.history.view(&r.label, &name);
            axum::Json(view).into_response()
        }
        Err(e) => error_response(&e),
    }
}

#[derive(Deserialize)]
pub(crate) struct ItemsQuery {
    source: Option<String>,
    state: ItemState,
    #[serde(default)]
    from: End,
    cursor: Option<String>,
    limit: Option<usize>,
    q: Option<String>,
}

pub(crate) async fn api_items(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(q): Query<ItemsQuery>,
) -> Response {
    let r = match resolve(&state, q.source.as_deref(), Some(&name)).await {
        Ok(r) => r,
        Err(response) => return response,
    };
    if !r.source.has_items() {
        return error_response(&SourceError::Unsupported);
    }
    let request = PageRequest {
        state: q.state,
        from: q.from,
        cursor: q.cursor.filter(|c| !c.is_empty()),
        limit: q
            .limit
            .unwrap_or(state.config.page_limit)
            .clamp(1, state.config.page_limit.max(1) * 10),
        search: q.q.map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()),
    };
    let result = r.source.items(&name, &request).await;
    r.note(&result);
    match result {
        Ok(page) => axum::Json(page).into_response(),
        Err(e) => error_response(&e),
    }
}

#[derive(Deserialize)]
pub(crate) struct ItemQuery {
    source: Option<String>,
    item: String,
}

pub(crate) async fn api_item(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(q): Query<ItemQuery>,
) -> Response {
    let r = match resolve(&state, q.source.as_deref(), Some(&name)).await {
        Ok(r) => r,
        Err(response) => return response,
    };
    if !r.source.has_items() {
        return error_response(&SourceError::Unsupported);
    }
    let result = r.source.item(&name, &q.item).await;
    r.note(&result);
    match result {
        Ok(detail) => axum::Json(detail).into_response(),
        Err(e) => error_response(&e),
    }
}

#[derive(Deserialize)]
pub(crate) struct HistoryQuery {
    source: Option<String>,
    queue: Option<String>,
    since: Option<u64>,
}

/// `/api/history?queue=NAME[&source=S]`: one queue's samples; without `queue`, each
/// source's totals. Only what the page draws.
pub(crate) async fn api_history(
    State(state): State<AppState>,
    Query(q): Query<HistoryQuery>,
) -> Response {
    let since = q.since.unwrap_or(0);
    let every = state.config.sample_every.as_millis() as u64;
    match q.queue {
        Some(name) => {
            let r = match resolve(&state, q.source.as_deref(), Some(&name)).await {
                Ok(r) => r,
                Err(response) => return response,
            };
            state.history.view(&r.label, &name);
            axum::Json(json!({
                "sample_every_ms": every,
                "source": r.label,
                "queue": name,
                "samples": state.history.queue(&r.label, &name, since),
            }))
            .into_response()
        }
        None => axum::Json(json!({
            "sample_every_ms": every,
            "totals": state.history.totals(since),
        }))
        .into_response(),
    }
}

/// Who asked: the peer's address, and the addresses a proxy says it forwarded for.
fn client_of(request_headers: &HeaderMap, peer: Option<std::net::SocketAddr>) -> String {
    let peer = peer.map_or_else(|| "unknown".to_owned(), |p| p.to_string());
    let forwarded = forwarded_for(request_headers);
    if forwarded.is_empty() {
        peer
    } else {
        format!("{peer} for {}", forwarded.join(", "))
    }
}

/// Logs and counts an action the guard refused.
pub(crate) fn audit_refused(state: &Shared, request: &Request, action: &'static str, why: &str) {
    let client = client_of(request.headers(), peer(request));
    tracing::warn!(
        target: "workqueue_dashboard::audit",
        %client,
        action,
        path = %request.uri().path(),
        result = "refused",
        reason = why,
        "dashboard action refused"
    );
    state
        .actions
        .get_or_create(&vec![
            ("action", action.to_owned()),
            ("result", "refused".to_owned()),
        ])
        .inc();
}

/// The body of the actions that name an item or a dead letter.
#[derive(Deserialize, Default)]
pub(crate) struct Target {
    item: Option<String>,
    id: Option<String>,
}

/// Runs an action: resolves the source, acts, logs who did what and what came of it, counts
/// it, and answers what it did.
async fn run_action(
    state: &Shared,
    request_headers: &HeaderMap,
    peer: Option<std::net::SocketAddr>,
    source: Option<&str>,
    name: &str,
    action: Action,
) -> Response {
    let client = client_of(request_headers, peer);
    let r = match resolve(state, source, Some(name)).await {
        Ok(r) => r,
        Err(response) => {
            tracing::warn!(
                target: "workqueue_dashboard::audit",
                %client, action = action.name(), queue = name, result = "not_found",
                "dashboard action"
            );
            count(state, &action, "error");
            return response;
        }
    };
    if state.read_only(r) {
        count(state, &action, "refused");
        return refuse(StatusCode::FORBIDDEN, "this source is read-only");
    }
    let result = r.source.act(name, &action).await;
    r.note(&result);
    r.invalidate().await;
    let target = action.target().unwrap_or("");
    match result {
        Ok(outcome) => {
            tracing::info!(
                target: "workqueue_dashboard::audit",
                %client,
                source = %r.label,
                queue = name,
                action = action.name(),
                item = target,
                result = "ok",
                changed = outcome.changed,
                outcome = %outcome.message,
                "dashboard action"
            );
            count(state, &action, "ok");
            axum::Json(json!({
                "ok": true,
                "action": action.name(),
                "count": outcome.changed,
                "changed": outcome.changed,
                "message": outcome.message,
            }))
            .into_response()
        }
        Err(e) => {
            tracing::warn!(
                target: "workqueue_dashboard::audit",
                %client,
                source = %r.label,
                queue = name,
                action = action.name(),
                item = target,
                result = "error",
                error = %e,
                "dashboard action"
            );
            count(state, &action, "error");
            error_response(&e)
        }
    }
}

fn count(state: &Shared, action: &Action, result: &str) {
    state
        .actions
        .get_or_create(&vec![
            ("action", action.name().to_owned()),
            ("result", result.to_owned()),
        ])
        .inc();
}

/// An action handler: the route's action, made from the request's body when it names a target.
pub(crate) async fn act(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(w): Query<Which>,
    request: Request,
    verb: &'static str,
) -> Response {
    let headers = request.headers().clone();
    let peer = peer(&request);
    let body = axum::body::to_bytes(request.into_body(), 64 * 1024)
        .await
        .unwrap_or_default();
    let target: Target = if body.is_empty() {
        Target::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(t) => t,
            Err(e) => return refuse(StatusCode::BAD_REQUEST, &format!("body: {e}")),
        }
    };
    // What the body lacks, if it lacks what the action needs.
    let need = |what: Option<String>, field: &'static str| what.ok_or(field);
    let action: Result<Action, &'static str> = match verb {
        "pause" => Ok(Action::Pause),
        "resume" => Ok(Action::Resume),
        "dead-letters/requeue-all" => Ok(Action::RequeueDeadLetters),
        "dead-letters/purge" => Ok(Action::PurgeDeadLetters),
        "dead-letters/requeue" => match (target.id, target.item) {
            (Some(id), _) => Ok(Action::RequeueDeadLetter { id }),
            // An item instead of an id: its oldest dead letter.
            (None, Some(item)) => {
                match oldest_letter(&state, w.source.as_deref(), &name, &item).await {
                    Ok(Some(id)) => Ok(Action::RequeueDeadLetter { id }),
                    Ok(None) => {
                        return axum::Json(json!({
                            "ok": true, "action": "requeue_dead_letter", "count": 0,
                            "changed": 0, "message": "no dead letter of that item",
                        }))
                        .into_response();
                    }
                    Err(response) => return response,
                }
            }
            (None, None) => Err("id"),
        },
        "dead-letters/delete" => need(target.id, "id").map(|id| Action::DeleteDeadLetter { id }),
        "items/retry" => need(target.item, "item").map(|item| Action::RetryNow { item }),
        "items/remove" => need(target.item, "item").map(|item| Action::Remove { item }),
        "forget" => need(target.item, "item").map(|item| Action::Forget { item }),
        _ => return refuse(StatusCode::NOT_FOUND, "no such action"),
    };
    match action {
        Ok(action) => run_action(&state, &headers, peer, w.source.as_deref(), &name, action).await,
        Err(field) => refuse(
            StatusCode::BAD_REQUEST,
            &format!("the body needs {field:?}"),
        ),
    }
}

/// The id of the oldest dead letter of `item`, if it has one.
async fn oldest_letter(
    state: &Shared,
    source: Option<&str>,
    name: &str,
    item: &str,
) -> Result<Option<String>, Response> {
    let r = resolve(state, source, Some(name)).await?;
    match r.source.item(name, item).await {
        Ok(detail) => Ok(detail.dead_letters.first().map(|d| d.id.clone())),
        Err(SourceError::NotFound) => Ok(None),
        Err(e) => Err(error_response(&e)),
    }
}

pub(crate) async fn metrics_text(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let mut listings = Vec::new();
    for r in &state.sources {
        listings.push((r.label.clone(), r.queues().await.ok()));
    }
    let (content_type, body) = crate::metrics::encode(&listings, &state.actions, accept);
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// The sampler: every [`Config::sample_every`], one listing of each source goes into the
/// history (a source that is down adds nothing, and the charts keep what they had).
pub(crate) async fn sampler(shared: std::sync::Weak<Shared>) {
    loop {
        let Some(state) = shared.upgrade() else {
            return;
        };
        let every = state
            .config
            .sample_every
            .max(std::time::Duration::from_millis(100));
        for r in &state.sources {
            if let Ok(queues) = r.queues().await {
                state.history.record(&r.label, now_ms(), &queues);
            }
        }
        drop(state);
        tokio::time::sleep(every).await;
    }
}
