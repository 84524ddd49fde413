//! The server's HTTP side: routing, the calls on collections (list, watch, create) and on
//! one object (get, replace, patch, delete, and their status subresource), and errors as
//! `Status` objects.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::select::Selector;
use super::state::{ApiError, ApiState, CLIENT_HEADER, Entry, Key, Shared};
use super::store::Written;

/// What a request names, parsed from its path.
struct Target {
    /// `v1` or `group/version`.
    api_version: String,
    /// `v1/configmaps`.
    resource: String,
    /// `None` for a request across namespaces or on a cluster-scoped kind.
    namespace: Option<String>,
    /// One object's name, for calls on an object.
    name: Option<String>,
    /// The call is on the object's `status` subresource.
    status: bool,
}

/// Parses `/api/v1[/namespaces/NS]/PLURAL[/NAME[/status]]` and the same under
/// `/apis/GROUP/VERSION`.
fn target(uri: &Uri) -> Option<Target> {
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    let (api_version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ((*version).to_owned(), rest),
        ["apis", group, version, rest @ ..] => (format!("{group}/{version}"), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", namespace, rest @ ..] if !rest.is_empty() => {
            (Some((*namespace).to_owned()), rest)
        }
        rest => (None, rest),
    };
    let (plural, name, status) = match rest {
        [plural] => (plural, None, false),
        [plural, name] => (plural, Some((*name).to_owned()), false),
        [plural, name, "status"] => (plural, Some((*name).to_owned()), true),
        _ => return None,
    };
    Some(Target {
        resource: format!("{api_version}/{plural}"),
        api_version,
        namespace,
        name,
        status,
    })
}

/// A JSON answer.
fn json_response(code: StatusCode, body: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        json_response(self.code, &self.status())
    }
}

/// Whether the client asked for metadata only (kube's metadata watcher and
/// `list_metadata`).
fn metadata_only(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|accept| accept.to_str().ok())
        .is_some_and(|accept| accept.contains("as=PartialObjectMetadata"))
}

/// An object as `PartialObjectMetadata`.
fn partial(object: &Value) -> Value {
    json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadata",
        "metadata": object["metadata"],
    })
}

/// The selectors of a list or watch.
struct Selection {
    labels: Selector,
    fields: Selector,
}

impl Selection {
    fn parse(params: &HashMap<String, String>) -> Result<Self, ApiError> {
        let read = |name: &str, parse: fn(&str) -> Option<Selector>| {
            let text = params.get(name).map_or("", String::as_str);
            parse(text).ok_or_else(|| ApiError::bad_request(format!("malformed {name}: {text}")))
        };
        Ok(Self {
            labels: read("labelSelector", Selector::labels)?,
            fields: read("fieldSelector", Selector::fields)?,
        })
    }

    fn matches(&self, object: &Value) -> bool {
        self.labels.matches_labels(object) && self.fields.matches_fields(object)
    }
}

/// Answers one request.
pub(super) async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(target) = target(&uri) else {
        return (StatusCode::NOT_FOUND, "not served by the fake API server").into_response();
    };
    let watch = matches!(params.get("watch").map(String::as_str), Some("true" | "1"));
    let client = headers
        .get(CLIENT_HEADER)
        .and_then(|name| name.to_str().ok())
        .map(str::to_owned);
    let mut state = shared.lock();
    if client
        .as_ref()
        .is_some_and(|client| state.partitioned.contains(client))
    {
        state.requests.partitioned += 1;
        return ApiError {
            code: StatusCode::SERVICE_UNAVAILABLE,
            reason: "ServiceUnavailable",
            message: "the fake API server is partitioned from this client".to_owned(),
        }
        .into_response();
    }
    if state.down {
        return ApiError {
            code: StatusCode::SERVICE_UNAVAILABLE,
            reason: "ServiceUnavailable",
            message: "the fake API server is down".to_owned(),
        }
        .into_response();
    }
    if state.forbidden.contains(&target.resource) {
        state.requests.refused += 1;
        if watch {
            state.requests.watches += 1;
        } else if method == Method::GET && target.name.is_none() {
            state.requests.lists += 1;
        }
        return ApiError::forbidden(&target.resource).into_response();
    }
    let answer = match (&method, &target.name) {
        // The state stays locked until the watch is opened: released in between, the server
        // could go down (or the client be partitioned) and the watch open in the new
        // generation, never to end.
        (&Method::GET, None) if watch => {
            return watch_response(
                &shared,
                state,
                target,
                &params,
                metadata_only(&headers),
                client,
            );
        }
        (&Method::GET, None) => list(&mut state, &target, &params, metadata_only(&headers)),
        (&Method::GET, Some(name)) => get(&mut state, &target, name),
        (&Method::POST, None) => create(&mut state, &target, &body),
        (&Method::PUT, Some(name)) => replace(&mut state, &target, name, &body),
        (&Method::PATCH, Some(name)) => patch(&mut state, &target, name, &params, &headers, &body),
        (&Method::DELETE, Some(name)) => delete(&mut state, &target, name),
        _ => Err(ApiError {
            code: StatusCode::METHOD_NOT_ALLOWED,
            reason: "MethodNotAllowed",
            message: format!("{method} is not served here"),
        }),
    };
    match answer {
        Ok((code, object)) => {
            shared.notify(state);
            json_response(code, &object)
        }
        Err(error) => {
            state.requests.refused += 1;
            error.into_response()
        }
    }
}

/// A call's answer: a status code and the object.
type Answer = Result<(StatusCode, Value), ApiError>;

/// The key of the object `target` and `name` designate.
fn key(target: &Target, name: &str) -> Key {
    (
        target.resource.clone(),
        target.namespace.clone().unwrap_or_default(),
        name.to_owned(),
    )
}

/// A list of the target's objects at the current resource version.
fn list(
    state: &mut ApiState,
    target: &Target,
    params: &HashMap<String, String>,
    metadata_only: bool,
) -> Answer {
    state.requests.lists += 1;
    if metadata_only {
        state.requests.metadata_only += 1;
    }
    let selection = Selection::parse(params)?;
    let items: Vec<Value> = state
        .objects
        .iter()
        .filter(|((resource, namespace, _), object)| {
            *resource == target.resource
                && target.namespace.as_ref().is_none_or(|ns| ns == namespace)
                && selection.matches(object)
        })
        .map(|(_, object)| {
            if metadata_only {
                partial(object)
            } else {
                object.clone()
            }
        })
        .collect();
    let (api_version, kind) = if metadata_only {
        (
            "meta.k8s.io/v1".to_owned(),
            "PartialObjectMetadataList".to_owned(),
        )
    } else {
        let kind = state
            .kinds
            .get(&target.resource)
            .map_or_else(|| "List".to_owned(), |(_, kind)| format!("{kind}List"));
        (target.api_version.clone(), kind)
    };
    Ok((
        StatusCode::OK,
        json!({
            "kind": kind,
            "apiVersion": api_version,
            "metadata": { "resourceVersion": state.resource_version.to_string() },
            "items": items,
        }),
    ))
}

/// One object.
fn get(state: &mut ApiState, target: &Target, name: &str) -> Answer {
    state.requests.gets += 1;
    let object = state
        .object(&key(target, name))
        .ok_or_else(|| ApiError::not_found(&target.resource, name))?;
    Ok((StatusCode::OK, object.clone()))
}

/// Parses a request's body as a JSON object.
fn json_body(body: &Bytes) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|error| ApiError::bad_request(format!("the body is not JSON: {error}")))?;
    if value.is_object() {
        Ok(value)
    } else {
        Err(ApiError::bad_request("the body is not a JSON object"))
    }
}

/// Learns the target's kind from a body that names it.
fn learn_kind(state: &mut ApiState, target: &Target, body: &Value) -> Result<(), ApiError> {
    if state.kinds.contains_key(&target.resource) {
        return Ok(());
    }
    let kind = body["kind"]
        .as_str()
        .ok_or_else(|| ApiError::bad_request("the body names no kind"))?;
    state.kinds.insert(
        target.resource.clone(),
        (target.api_version.clone(), kind.to_owned()),
    );
    Ok(())
}

/// `POST`: creates an object (its status is ignored: the status subresource sets it).
fn create(state: &mut ApiState, target: &Target, body: &Bytes) -> Answer {
    state.requests.writes += 1;
    let mut object = json_body(body)?;
    let name = object["metadata"]["name"]
        .as_str()
        .ok_or_else(|| ApiError::invalid("metadata.name is required"))?
        .to_owned();
    let key = key(target, &name);
    if state.object(&key).is_some() {
        return Err(ApiError::already_exists(&target.resource, &name));
    }
    learn_kind(state, target, &object)?;
    object.as_object_mut().expect("checked").remove("status");
    let written = state.write(&key, object)?;
    Ok((StatusCode::CREATED, written.object().clone()))
}

/// Refuses a body whose `metadata.name` is not the one in the URL.
fn check_name(body: &Value, name: &str) -> Result<(), ApiError> {
    match body["metadata"]["name"].as_str() {
        Some(named) if named != name => Err(ApiError::bad_request(format!(
            "the name of the object ({named}) does not match the name on the URL ({name})"
        ))),
        _ => Ok(()),
    }
}

/// Refuses a write that names a resource version other than the object's.
fn check_version(old: &Value, new: &Value) -> Result<(), ApiError> {
    let asked = &new["metadata"]["resourceVersion"];
    if asked.is_null() || *asked == old["metadata"]["resourceVersion"] {
        Ok(())
    } else {
        Err(ApiError::conflict(format!(
            "the object has been modified; please apply your changes to the latest version (asked {asked}, stored {})",
            old["metadata"]["resourceVersion"]
        )))
    }
}

/// The object to store after a write of `new` over `old`: on the object, everything but
/// the status; on the status subresource, the status only.
fn merge_status(old: &Value, mut new: Value, status_only: bool) -> Value {
    if status_only {
        let mut stored = old.clone();
        stored["status"] = new["status"].take();
        stored
    } else {
        let fields = new.as_object_mut().expect("objects are JSON objects");
        match old.get("status") {
            Some(status) => {
                fields.insert("status".into(), status.clone());
            }
            None => {
                fields.remove("status");
            }
        }
        new
    }
}

/// `PUT`: replaces an object, or its status.
fn replace(state: &mut ApiState, target: &Target, name: &str, body: &Bytes) -> Answer {
    state.requests.writes += 1;
    let new = json_body(body)?;
    check_name(&new, name)?;
    let key = key(target, name);
    let old = state
        .object(&key)
        .cloned()
        .ok_or_else(|| ApiError::not_found(&target.resource, name))?;
    check_version(&old, &new)?;
    let written = state.write(&key, merge_status(&old, new, target.status))?;
    Ok((StatusCode::OK, written.object().clone()))
}

/// `PATCH`: a merge patch, a JSON patch, a strategic merge patch (as a merge patch) or a
/// server-side apply (as a merge of the applied object, creating it if needed).
fn patch(
    state: &mut ApiState,
    target: &Target,
    name: &str,
    params: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Answer {
    state.requests.writes += 1;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    let key = key(target, name);
    let old = state.object(&key).cloned();
    let apply = content_type.starts_with("application/apply-patch");
    if apply && params.get("fieldManager").is_none_or(String::is_empty) {
        return Err(ApiError::bad_request(
            "fieldManager is required for apply requests",
        ));
    }
    let Some(old) = old else {
        if !apply {
            return Err(ApiError::not_found(&target.resource, name));
        }
        // Server-side apply creates what is not there.
        let mut object = json_body(body)?;
        check_name(&object, name)?;
        learn_kind(state, target, &object)?;
        if !target.status {
            object.as_object_mut().expect("checked").remove("status");
        }
        let written = state.write(&key, object)?;
        return Ok((StatusCode::CREATED, written.object().clone()));
    };
    let mut patched = old.clone();
    if content_type.starts_with("application/json-patch+json") {
        let json_patch::Patch(mut operations) = serde_json::from_slice(body)
            .map_err(|error| ApiError::bad_request(format!("not a JSON patch: {error}")))?;
        // The API server's JSON patch (evanphx/json-patch) passes a `test` for `null` at a
        // path that does not exist; kube's `finalizer` function relies on it.
        operations.retain(|operation| match operation {
            json_patch::PatchOperation::Test(test) => {
                !(test.value.is_null() && patched.pointer(test.path.as_str()).is_none())
            }
            _ => true,
        });
        json_patch::patch(&mut patched, &operations)
            .map_err(|error| ApiError::invalid(format!("the JSON patch failed: {error}")))?;
    } else if apply
        || content_type.starts_with("application/merge-patch+json")
        || content_type.starts_with("application/strategic-merge-patch+json")
    {
        json_patch::merge(&mut patched, &json_body(body)?);
    } else {
        return Err(ApiError {
            code: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            reason: "UnsupportedMediaType",
            message: format!("the patch type {content_type:?} is not served"),
        });
    }
    if !patched.is_object() {
        return Err(ApiError::invalid("the patch left no object"));
    }
    check_name(&patched, name)?;
    check_version(&old, &patched)?;
    let written = state.write(&key, merge_status(&old, patched, target.status))?;
    Ok((StatusCode::OK, written.object().clone()))
}

/// `DELETE`: removes an object, or starts its deletion if it has finalizers.
fn delete(state: &mut ApiState, target: &Target, name: &str) -> Answer {
    state.requests.deletes += 1;
    let written = state.delete(&key(target, name))?;
    let code = match written {
        Written::Modified(_) => StatusCode::ACCEPTED,
        Written::Created(_) | Written::Deleted(_) => StatusCode::OK,
    };
    Ok((code, written.object().clone()))
}

/// A watch: newline-delimited events after the requested resource version, until the
/// watch's timeout, a dropped connection, or the server's drop; or one `410 Gone` error if
/// that version has expired.
fn watch_response(
    shared: &Arc<Shared>,
    mut state: MutexGuard<'_, ApiState>,
    target: Target,
    params: &HashMap<String, String>,
    metadata_only: bool,
    client: Option<String>,
) -> Response {
    let selection = match Selection::parse(params) {
        Ok(selection) => selection,
        Err(error) => return error.into_response(),
    };
    let bookmarks = params
        .get("allowWatchBookmarks")
        .is_some_and(|v| v == "true");
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(290), Duration::from_secs);
    state.requests.watches += 1;
    if metadata_only {
        state.requests.metadata_only += 1;
    }
    let asked = params
        .get("resourceVersion")
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&v| v != 0);
    let from = asked.unwrap_or(state.resource_version);
    state.requests.watched_from = from;
    // A watch from now never asks for an expired version (on an empty server "now" is 0).
    if asked.is_some_and(|asked| asked <= state.expired_through) {
        state.requests.expired += 1;
        let error = ApiError {
            code: StatusCode::GONE,
            reason: "Expired",
            message: format!(
                "too old resource version: {from} ({})",
                state.expired_through + 1
            ),
        };
        let event = json!({ "type": "ERROR", "object": error.status() });
        return ndjson(Body::from(format!("{event}\n")));
    }
    // Without a resource version (or with "0"), a watch starts now with a synthetic `ADDED`
    // for every object there is, as the API server's does.
    let mut initial = String::new();
    if asked.is_none() {
        for ((resource, namespace, _), object) in &state.objects {
            if *resource == target.resource
                && target.namespace.as_ref().is_none_or(|ns| ns == namespace)
                && selection.matches(object)
            {
                let object = if metadata_only {
                    partial(object)
                } else {
                    object.clone()
                };
                initial.push_str(&json!({ "type": "ADDED", "object": object }).to_string());
                initial.push('\n');
            }
        }
    }
    let kind = state.kinds.get(&target.resource).cloned();
    let watch = Watch {
        initial: (!initial.is_empty()).then_some(initial),
        position: state
            .log
            .partition_point(|entry| entry.resource_version <= from),
        generation: state.watch_generation,
        changes: shared.changed.subscribe(),
        // A `timeoutSeconds` past what the clock counts means no timeout.
        deadline: tokio::time::Instant::now().checked_add(timeout),
        shared: shared.clone(),
        target,
        selection,
        metadata_only,
        bookmarks,
        kind,
        client,
    };
    drop(state);
    ndjson(Body::from_stream(futures::stream::unfold(
        watch,
        Watch::next_chunk,
    )))
}

/// Completes at `deadline`, never without one.
async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// A streaming JSON response.
fn ndjson(body: Body) -> Response {
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(body)
        .expect("a valid response")
}

/// An open watch: where it is in the log, and what ends it.
struct Watch {
    /// The synthetic `ADDED` events to send first, if any.
    initial: Option<String>,
    /// The next log entry to look at.
    position: usize,
    /// The watch generation it was opened in; it ends when that moves on.
    generation: u64,
    /// Wakes it when the state changes.
    changes: watch::Receiver<u64>,
    /// When the client's `timeoutSeconds` runs out; `None` for a timeout past what the
    /// clock counts (no timeout).
    deadline: Option<tokio::time::Instant>,
    /// The server.
    shared: Arc<Shared>,
    /// What it watches.
    target: Target,
    /// Its selectors.
    selection: Selection,
    /// Whether it sends metadata only.
    metadata_only: bool,
    /// Whether the client allowed bookmarks.
    bookmarks: bool,
    /// The watched kind's (apiVersion, kind), once known, for bookmarks.
    kind: Option<(String, String)>,
    /// The client's name, if it gave one: the watch ends when it is partitioned.
    client: Option<String>,
}

impl Watch {
    /// The next chunk of events, or `None` once the watch ends.
    async fn next_chunk(mut self) -> Option<(Result<Bytes, Infallible>, Self)> {
        if let Some(initial) = self.initial.take() {
            return Some((Ok(Bytes::from(initial)), self));
        }
        loop {
            // Mark the current change seen before reading, so none is missed in between.
            self.changes.borrow_and_update();
            if let Some(chunk) = self.read_log()? {
                return Some((Ok(Bytes::from(chunk)), self));
            }
            tokio::select! {
                changed = self.changes.changed() => changed.ok()?,
                () = until(self.deadline) => return None,
            }
        }
    }

    /// The event a log entry makes on this watch, if any: a change that takes an object
    /// into the selection is `ADDED`, one that takes it out `DELETED`.
    fn event_of(&self, entry: &Entry) -> Option<Value> {
        if entry.resource != self.target.resource
            || self
                .target
                .namespace
                .as_ref()
                .is_some_and(|ns| *ns != entry.namespace)
        {
            return None;
        }
        let now = self.selection.matches(&entry.object);
        let before = entry
            .previous
            .as_ref()
            .map(|previous| self.selection.matches(previous));
        let kind = match (entry.kind, before, now) {
            ("MODIFIED", Some(false), true) => "ADDED",
            ("MODIFIED", Some(true), false) => "DELETED",
            ("MODIFIED", Some(false), false) => return None,
            (kind, _, true) => kind,
            ("DELETED", Some(true), false) => "DELETED",
            _ => return None,
        };
        let object = if self.metadata_only {
            partial(&entry.object)
        } else {
            entry.object.clone()
        };
        Some(json!({ "type": kind, "object": object }))
    }

    /// The events logged since the last read, as lines; `Ok(None)` if there are none, `None`
    /// if the watch has ended.
    fn read_log(&mut self) -> Option<Option<String>> {
        let mut state = self.shared.lock();
        if state.closed
            || state.watch_generation != self.generation
            || state.forbidden.contains(&self.target.resource)
            || self
                .client
                .as_ref()
                .is_some_and(|client| state.partitioned.contains(client))
        {
            return None;
        }
        if self.kind.is_none() {
            self.kind = state.kinds.get(&self.target.resource).cloned();
        }
        let mut chunk = String::new();
        let mut bookmarks = 0;
        for entry in &state.log[self.position..] {
            let line = if entry.kind == "BOOKMARK" {
                match (&self.kind, self.bookmarks) {
                    (Some((api_version, kind)), true) => {
                        bookmarks += 1;
                        json!({
                            "type": "BOOKMARK",
                            "object": {
                                "apiVersion": api_version,
                                "kind": kind,
                                "metadata": { "resourceVersion": entry.resource_version.to_string() },
                            },
                        })
                    }
                    _ => continue,
                }
            } else {
                match self.event_of(entry) {
                    Some(event) => event,
                    None => continue,
                }
            };
            chunk.push_str(&line.to_string());
            chunk.push('\n');
        }
        self.position = state.log.len();
        state.requests.bookmarks += bookmarks;
        Some((!chunk.is_empty()).then_some(chunk))
    }
}
