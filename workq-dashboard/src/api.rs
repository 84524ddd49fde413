//! The JSON API: listings, pages of items, one item, the charts' samples, actions (each
//! logged and counted), and `/metrics`.

use std::sync::Arc;

use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;
use workq::admin::{
    Action, AdminError, End, ItemState, Page, PageQuery, QueueSummary, redact_urls_in,
};

use crate::config::Config;
use crate::guard::{action_of_path, forwarded_for, peer};
use crate::respond::{Refusal, answer_error, cut, naming, now_ms, refuse_as};
use crate::state::{AppState, Reads, Registered, Shared};
use crate::target::Target;

/// An error of a source as the API answers it: the status says whose fault it is, the text
/// holds no secret.
pub(crate) fn error_response(e: &AdminError) -> Response {
    let status = match e {
        AdminError::NotFound => StatusCode::NOT_FOUND,
        AdminError::Unsupported => StatusCode::FORBIDDEN,
        AdminError::BadRequest(_) => StatusCode::BAD_REQUEST,
        AdminError::ShutDown => StatusCode::CONFLICT,
        AdminError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::BAD_GATEWAY,
    };
    answer_error(status, &redact_urls_in(&e.to_string()))
}

/// A queue as `/api/queues` lists it: the label of its source, then its figures.
#[derive(Serialize)]
struct QueueView<'a> {
    source: &'a str,
    #[serde(flatten)]
    summary: &'a QueueSummary,
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
            .ok_or_else(|| answer_error(StatusCode::NOT_FOUND, "no such source"));
    }
    if state.sources.len() == 1 {
        return Ok(&state.sources[0]);
    }
    let Some(name) = name else {
        return Err(answer_error(StatusCode::BAD_REQUEST, "give ?source="));
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
        [] => Err(answer_error(StatusCode::NOT_FOUND, "no such queue")),
        _ => Err(answer_error(
            StatusCode::CONFLICT,
            "a queue of that name is in several sources: give ?source=",
        )),
    }
}

pub(crate) async fn api_queues(State(state): State<AppState>, Query(w): Query<Which>) -> Response {
    state.reads.touch();
    let mut queues = Vec::new();
    let mut sources = Vec::new();
    let mut any_up = false;
    let mut last_error = None;
    for r in &state.sources {
        if w.source.as_deref().is_some_and(|s| s != r.label) {
            continue;
        }
        let listing = r.queues().await;
        let status = r.admin.status();
        let (up, error) = match &listing {
            Ok(list) => {
                queues.extend(list.iter().map(|summary| {
                    serde_json::to_value(QueueView {
                        source: &r.label,
                        summary,
                    })
                    .unwrap_or_default()
                }));
                (true, None)
            }
            Err(e) => {
                last_error = Some(e.clone());
                (false, Some(redact_urls_in(&e.to_string())))
            }
        };
        let capabilities = r.admin.capabilities();
        any_up |= up;
        sources.push(json!({
            "label": r.label,
            "kind": r.admin.kind(),
            "up": up,
            "error": error,
            "down_since_ms": r.down_since(),
            "server": redact_urls_in(&status.server),
            "warnings": status.warnings.iter().map(|w| redact_urls_in(w)).collect::<Vec<_>>(),
            "details": status.details.as_deref().map(redact_urls_in),
            "read_only": state.read_only(r),
            "has_items": capabilities.items,
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
        (Some(AdminError::Unavailable(_)), false) => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::BAD_GATEWAY,
    };
    (status, axum::Json(body)).into_response()
}

pub(crate) async fn api_queue(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(w): Query<Which>,
) -> Response {
    state.reads.touch();
    let r = match resolve(&state, w.source.as_deref(), Some(&name)).await {
        Ok(r) => r,
        Err(response) => return response,
    };
    let result = r.admin.summary(&name).await;
    r.note(&result);
    let mut summary = match result {
        Ok(summary) => summary,
        Err(e) => return error_response(&e),
    };
    state.history.view(&r.label, &name);
    let mut view = serde_json::to_value(QueueView {
        source: &r.label,
        summary: &summary,
    })
    .unwrap_or_default();
    if let Some(why) = &mut summary.broken {
        view["broken"] = json!(redact_urls_in(why));
    } else if let Some(view) = view.as_object_mut() {
        // Its groups, limits and schedules: one `stats` call (at most `groups_shown`
        // groups, leases and failure counts) and one listing of its schedules.
        let stats = r.admin.stats(&name, state.config.groups_shown).await;
        r.note(&stats);
        let schedules = r.admin.schedules(&name).await;
        view.extend(crate::flow::page_parts(stats, schedules));
    }
    axum::Json(view).into_response()
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

/// A reference to an item whose text a listing cut: a hash of its whole text.
fn item_ref(text: &str) -> String {
    use std::hash::{Hash, Hasher};
    // `DefaultHasher::new()` has fixed keys: the same hash in every request of this
    // process, which is all a reference needs (it is matched against the items of the page
    // read again, never trusted).
    let mut h = std::hash::DefaultHasher::new();
    text.hash(&mut h);
    format!("{:016x}", h.finish())
}

/// `text` as the audit trail logs it: cut to
/// [`PREVIEW_BYTES`](crate::respond::PREVIEW_BYTES) (an item named by a request may be as
/// long as the body limit, and whoever sent it chose it).
fn logged(text: &str) -> String {
    cut(text).unwrap_or_else(|| text.to_owned())
}

/// A page as a listing shows it: each item's text and each dead letter's error cut to
/// [`PREVIEW_BYTES`](crate::respond::PREVIEW_BYTES); a cut item says so (`item_truncated`,
/// `item_bytes`) and carries `item_ref`, which `/item?ref=` takes with the page's
/// parameters to show it whole.
fn preview(page: &Page) -> serde_json::Value {
    let mut value = serde_json::to_value(page).unwrap_or_default();
    if let Some(items) = value.get_mut("items").and_then(|i| i.as_array_mut()) {
        for (x, original) in items.iter_mut().zip(&page.items) {
            if let Some(short) = cut(&original.item) {
                x["item"] = json!(short);
                x["item_truncated"] = json!(true);
                x["item_bytes"] = json!(original.item.len());
                x["item_ref"] = json!(item_ref(&original.item));
            }
            if let Some(dead) = &original.dead {
                if let Some(short) = cut(&dead.item) {
                    x["dead"]["item"] = json!(short);
                }
                if let Some(short) = cut(&dead.error) {
                    x["dead"]["error"] = json!(short);
                }
            }
        }
    }
    value
}

fn page_request(config: &Config, q: &ItemsQuery) -> PageQuery {
    let limit = q
        .limit
        .unwrap_or(config.page_limit)
        .clamp(1, config.page_limit.max(1) * 10);
    PageQuery::new(q.state, limit)
        .from(q.from)
        .cursor(q.cursor.clone().filter(|c| !c.is_empty()))
        .search(q.q.as_ref().map(|s| s.trim().to_owned()))
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
    if !r.admin.capabilities().items {
        return error_response(&AdminError::Unsupported);
    }
    let request = page_request(&state.config, &q);
    let result = r.admin.page(&name, &request).await;
    r.note(&result);
    match result {
        Ok(page) => axum::Json(preview(&page)).into_response(),
        Err(e) => error_response(&e),
    }
}

#[derive(Deserialize)]
pub(crate) struct ItemQuery {
    source: Option<String>,
    /// The item's whole text...
    item: Option<String>,
    /// ...or the reference a listing gave for an item it cut, with that listing's
    /// parameters.
    #[serde(rename = "ref")]
    reference: Option<String>,
    state: Option<ItemState>,
    from: Option<End>,
    cursor: Option<String>,
    limit: Option<usize>,
    q: Option<String>,
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
    if !r.admin.capabilities().items {
        return error_response(&AdminError::Unsupported);
    }
    let page = q.state.map(|state| ItemsQuery {
        source: None,
        state,
        from: q.from.unwrap_or_default(),
        cursor: q.cursor,
        limit: q.limit,
        q: q.q,
    });
    let item = match (q.item, q.reference, page) {
        (Some(item), _, _) => item,
        (None, Some(reference), Some(page)) => {
            // The listing again, and the item of that reference in it.
            let listed = r
                .admin
                .page(&name, &page_request(&state.config, &page))
                .await;
            r.note(&listed);
            match listed {
                Ok(listed) => match listed
                    .items
                    .into_iter()
                    .find(|x| item_ref(&x.item) == reference)
                {
                    Some(x) => x.item,
                    None => {
                        return answer_error(
                            StatusCode::NOT_FOUND,
                            "the item is no longer on that page",
                        );
                    }
                },
                Err(e) => return error_response(&e),
            }
        }
        _ => {
            return answer_error(
                StatusCode::BAD_REQUEST,
                "give ?item=TEXT, or ?ref= with the listing's state, from, cursor, limit and q",
            );
        }
    };
    let result = r.admin.item_detail(&name, &item).await;
    r.note(&result);
    match result {
        Ok(Some(detail)) => axum::Json(detail).into_response(),
        Ok(None) => error_response(&AdminError::NotFound),
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
    state.reads.touch();
    let since = q.since.unwrap_or(0);
    let every = crate::respond::millis(state.config.sample_every);
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

/// The queue a path under `/api/queues/` names, percent-decoded.
fn queue_of_path(path: &str) -> Option<String> {
    let rest = path.split("/api/queues/").nth(1)?;
    let name = rest.split('/').next()?;
    Some(percent_decode(name).unwrap_or_else(|| name.to_owned()))
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes: Vec<u8> =
        form_urlencoded::parse(format!("x={}", text.replace('+', "%2B")).as_bytes())
            .next()
            .map(|(_, v)| v.into_owned().into_bytes())?;
    String::from_utf8(bytes).ok()
}

/// The audit layer: every refused request (a missing or wrong token, a client that is not
/// on this machine, a missing CSRF header, a foreign origin, the read-only switch, a body
/// over the limit or unreadable, a request over the time limit) is logged with the client's
/// address, the action and queue it asked for, the item or dead letter it named (`?item=`,
/// or its body's `item` or `id`, cut to [`PREVIEW_BYTES`](crate::respond::PREVIEW_BYTES);
/// none for a body over the limit or that never came), and why, and is counted by reason
/// (`workqueue_dashboard_refusals_total`); a refused action is also counted among the
/// actions (`result="refused"`).
pub(crate) async fn audit(
    State(state): State<AppState>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let client = client_of(request.headers(), peer(&request));
    let response = next.run(request).await;
    let status = response.status();
    let refusal = match response.extensions().get::<Refusal>() {
        Some(r) => r.clone(),
        None if status == StatusCode::PAYLOAD_TOO_LARGE => Refusal {
            kind: "body_too_large",
            reason: format!(
                "the body is over the limit of {} bytes",
                state.config.body_limit
            ),
            item: None,
        },
        None if status == StatusCode::REQUEST_TIMEOUT => Refusal {
            kind: "timeout",
            reason: format!(
                "the request took over {} s",
                state.config.request_timeout.as_secs_f64()
            ),
            item: None,
        },
        None => return response,
    };
    let action = if method == axum::http::Method::POST {
        action_of_path(&path)
    } else {
        ""
    };
    let queue = queue_of_path(&path).unwrap_or_default();
    let item = refusal.item.as_deref().map(logged).unwrap_or_default();
    tracing::warn!(
        target: "workq_dashboard::audit",
        client = ?client,
        method = %method,
        path = ?path,
        action,
        queue = ?queue,
        item = ?item,
        result = "refused",
        status = status.as_u16(),
        reason = %refusal.reason,
        "dashboard request refused"
    );
    state
        .refusals
        .get_or_create(&vec![("reason", refusal.kind.to_owned())])
        .inc();
    if !action.is_empty() {
        state
            .actions
            .get_or_create(&vec![
                ("action", action.to_owned()),
                ("result", "refused".to_owned()),
            ])
            .inc();
    }
    response
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
    let target = action.target().map(logged).unwrap_or_default();
    let r = match resolve(state, source, Some(name)).await {
        Ok(r) => r,
        Err(response) => {
            // Logged as counted: an error (no such source or queue, or a name in several).
            tracing::warn!(
                target: "workq_dashboard::audit",
                client = ?client,
                action = action.name(),
                queue = name,
                item = target.as_str(),
                result = "error",
                status = response.status().as_u16(),
                "dashboard action"
            );
            count(state, &action, "error");
            return response;
        }
    };
    if state.read_only(r) {
        return naming(
            refuse_as(
                StatusCode::FORBIDDEN,
                "read_only",
                "this source is read-only",
            ),
            action.target().map(str::to_owned),
        );
    }
    let result = workq::admin::act(&*r.admin, name, &action).await;
    r.note(&result);
    r.invalidate().await;
    match result {
        Ok(outcome) => {
            tracing::info!(
                target: "workq_dashboard::audit",
                client = ?client,
                source = %r.label,
                queue = name,
                action = action.name(),
                item = target.as_str(),
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
                target: "workq_dashboard::audit",
                client = ?client,
                source = %r.label,
                queue = name,
                action = action.name(),
                item = target.as_str(),
                result = "error",
                error = %redact_urls_in(&e.to_string()),
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
    // Over the limit is refused, never read as an empty body and acted on.
    let body = match axum::body::to_bytes(request.into_body(), state.config.body_limit).await {
        Ok(body) => body,
        Err(e) => {
            let over = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
                || e.to_string().contains("length limit");
            return if over {
                refuse_as(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    &format!(
                        "the body is over the limit of {} bytes",
                        state.config.body_limit
                    ),
                )
            } else {
                refuse_as(
                    StatusCode::BAD_REQUEST,
                    "bad_body",
                    &format!("the body could not be read: {e}"),
                )
            };
        }
    };
    let target: Target = if body.is_empty() {
        Target::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(t) => t,
            Err(e) => return refuse_as(StatusCode::BAD_REQUEST, "bad_body", &format!("body: {e}")),
        }
    };
    // What the body names, for the audit trail if it is refused.
    let named = target
        .item
        .clone()
        .or_else(|| target.id.clone())
        .or_else(|| target.schedule.clone());
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
        "schedules/pause" => {
            need(target.schedule, "schedule").map(|schedule| Action::PauseSchedule { schedule })
        }
        "schedules/resume" => {
            need(target.schedule, "schedule").map(|schedule| Action::ResumeSchedule { schedule })
        }
        _ => return answer_error(StatusCode::NOT_FOUND, "no such action"),
    };
    match action {
        Ok(action) => run_action(&state, &headers, peer, w.source.as_deref(), &name, action).await,
        Err(field) => naming(
            refuse_as(
                StatusCode::BAD_REQUEST,
                "bad_body",
                &format!("the body needs {field:?}"),
            ),
            named,
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
    match r.admin.item_detail(name, item).await {
        Ok(detail) => Ok(detail.and_then(|d| d.dead_letters.first().map(|d| d.id.clone()))),
        Err(AdminError::NotFound) => Ok(None),
        Err(e) => Err(error_response(&e)),
    }
}

pub(crate) async fn metrics_text(State(state): State<AppState>, headers: HeaderMap) -> Response {
    state.reads.touch();
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let mut listings = Vec::new();
    let mut flows = Vec::new();
    for r in &state.sources {
        let listing = r.queues().await.ok();
        if let Some(queues) = &listing {
            let (top, most) = (state.config.group_series, state.config.flow_queues);
            let read = crate::flow::read_flows(r, queues, top, most).await;
            flows.push((r.label.clone(), read));
        }
        listings.push((r.label.clone(), listing));
    }
    let (content_type, body) = crate::metrics::encode(&listings, &flows, &state, accept);
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// How long after the last read the sampler goes on: three samples, and at least 10 s
/// (saturating: a `sample_every` of `Duration::MAX` samples once per read, as long as it
/// is read).
fn idle_after(config: &Config) -> std::time::Duration {
    config
        .sample_every
        .saturating_mul(3)
        .max(std::time::Duration::from_secs(10))
}

/// The sampler: every [`Config::sample_every`] while a page or a scraper reads (and for
/// [`idle_after`] since the last read), one listing of each source goes into the history (a
/// source that is down adds nothing, and the charts keep what they had). Nobody reading, it
/// waits for the next read and asks the servers nothing.
pub(crate) async fn sampler(shared: std::sync::Weak<Shared>, reads: Arc<Reads>) {
    loop {
        if reads.closed() {
            return;
        }
        let Some(state) = shared.upgrade() else {
            return;
        };
        let every = state
            .config
            .sample_every
            .max(std::time::Duration::from_millis(100));
        let window = idle_after(&state.config);
        if !reads.active(window) {
            drop(state);
            reads.wake.notified().await;
            continue;
        }
        for r in &state.sources {
            if let Ok(queues) = r.queues().await {
                state.history.record(&r.label, now_ms(), &queues);
            }
        }
        drop(state);
        tokio::time::sleep(every).await;
    }
}
