//! An in-process Kubernetes API server for tests and examples: [`FakeApiServer`].
//!
//! No API server can run in a unit test, and kube's own `Client` is the thing to exercise, so
//! this module serves the two calls a controller makes, list and watch, over real HTTP on a
//! loopback port, for any kind (ConfigMaps, custom resources): resource versions, bookmarks,
//! `410 Gone` for an expired watch (which makes kube's watcher relist), and watches that drop.
//! Feature `testing`.
//!
//! It is written here because no crate serves the Kubernetes watch protocol in process;
//! kube's own tests mock the client's HTTP service instead of running a server.
//!
//! What it does not do: selectors (label and field selectors are ignored), pagination (a list
//! returns every object at once), single-object `GET` and writes over HTTP (tests change
//! objects with [`FakeApiServer::apply`] and [`FakeApiServer::delete`]), authentication.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use kube::Resource;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How many list and watch requests the server answered, and how many watches it refused
/// with `410 Gone`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Requests {
    /// List requests.
    pub lists: u64,
    /// Watch requests (including those answered with `410 Gone`).
    pub watches: u64,
    /// Watches refused because their resource version had expired.
    pub expired: u64,
    /// Bookmarks sent (one per open watch that allows them, per [`FakeApiServer::bookmark`]).
    pub bookmarks: u64,
    /// The resource version the last watch asked to start from.
    pub watched_from: u64,
}

/// An in-process API server speaking list and watch over HTTP on `127.0.0.1`.
///
/// Objects live as JSON, keyed by resource (`v1/configmaps`, `example.com/v1/widgets`),
/// namespace and name. Every change takes the next resource version and is kept in a log that
/// watches replay from the version they ask for.
///
/// The server stops when dropped: its open watches end.
///
/// # Examples
///
/// ```
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::Api;
/// use kube::api::ObjectMeta;
/// use workqueue_kube::testing::FakeApiServer;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let server = FakeApiServer::start().await;
/// server.apply(&ConfigMap {
///     metadata: ObjectMeta {
///         name: Some("web".into()),
///         namespace: Some("default".into()),
///         ..ObjectMeta::default()
///     },
///     ..ConfigMap::default()
/// });
/// let configmaps: Api<ConfigMap> = Api::namespaced(server.client(), "default");
/// let list = configmaps.list(&Default::default()).await.unwrap();
/// assert_eq!(list.items.len(), 1);
/// # }
/// ```
pub struct FakeApiServer {
    /// State shared with the request handlers.
    shared: Arc<Shared>,
    /// `http://127.0.0.1:PORT`.
    url: String,
    /// The accept loop.
    server: JoinHandle<()>,
}

impl fmt::Debug for FakeApiServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeApiServer")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// The server's state and the signal of its changes.
struct Shared {
    /// Objects, log and counters.
    state: Mutex<ApiState>,
    /// Bumped on every change, so that open watches look at the log again.
    changed: watch::Sender<u64>,
}

/// What the server holds.
#[derive(Default)]
struct ApiState {
    /// The last resource version given out.
    resource_version: u64,
    /// Watches from this resource version or older are refused with `410 Gone`.
    expired_through: u64,
    /// Open watches end when this moves on (a dropped connection, or the server's drop).
    watch_generation: u64,
    /// The server was dropped: every watch ends.
    closed: bool,
    /// Resource -> (apiVersion, kind), learned from the objects applied.
    kinds: HashMap<String, (String, String)>,
    /// (resource, namespace or "", name) -> object.
    objects: BTreeMap<(String, String, String), Value>,
    /// Every change and bookmark in order; resource versions never decrease along it.
    log: Vec<Entry>,
    /// The last uid given out.
    uid: u64,
    /// Requests answered.
    requests: Requests,
}

/// One watch event in the log.
struct Entry {
    /// The resource version the event carries.
    resource_version: u64,
    /// The resource, or "" for a bookmark (sent on every watch).
    resource: String,
    /// The object's namespace, or "".
    namespace: String,
    /// `ADDED`, `MODIFIED`, `DELETED` or `BOOKMARK`.
    kind: &'static str,
    /// The object (empty for a bookmark).
    object: Value,
}

/// The resource a request names, parsed from its path.
struct Target {
    /// `v1` or `group/version`.
    api_version: String,
    /// `v1/configmaps`.
    resource: String,
    /// `None` for a request across namespaces.
    namespace: Option<String>,
}

impl FakeApiServer {
    /// Starts a server on a free loopback port.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, or if no loopback port can be bound.
    pub async fn start() -> Self {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("bind a loopback port for the fake API server");
        let url = format!("http://{}", listener.local_addr().expect("local address"));
        let shared = Arc::new(Shared {
            state: Mutex::new(ApiState::default()),
            changed: watch::channel(0).0,
        });
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let server = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                tracing::error!(%error, "fake API server stopped");
            }
        });
        Self {
            shared,
            url,
            server,
        }
    }

    /// The server's address, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A kube client for this server, with `default` as its default namespace.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url.parse().expect("the server's URL is a URI"));
        kube::Client::try_from(config).expect("a client over plain HTTP")
    }

    /// Creates or replaces `object` (kind, namespace and name from it) and returns the
    /// resource version it now has. The server fills in `apiVersion`, `kind`,
    /// `metadata.resourceVersion` and, for a new object, `metadata.uid`.
    ///
    /// # Panics
    ///
    /// If `object` has no name or does not serialize to a JSON object.
    pub fn apply<K>(&self, object: &K) -> u64
    where
        K: Resource<DynamicType = ()> + Serialize,
    {
        let (resource, api_version, kind) = resource_of::<K>();
        let mut value = serde_json::to_value(object).expect("the object serializes");
        let meta = object.meta();
        let name = meta.name.clone().expect("the object has a name");
        let namespace = meta.namespace.clone().unwrap_or_default();
        let mut state = self.shared.lock();
        state.resource_version += 1;
        let resource_version = state.resource_version;
        let key = (resource.clone(), namespace.clone(), name);
        let uid = match state.objects.get(&key) {
            Some(old) => old["metadata"]["uid"].clone(),
            None => {
                state.uid += 1;
                Value::String(format!("uid-{}", state.uid))
            }
        };
        let fields = value.as_object_mut().expect("the object is a JSON object");
        fields.insert("apiVersion".into(), api_version.clone().into());
        fields.insert("kind".into(), kind.clone().into());
        let metadata = fields
            .entry("metadata")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .expect("metadata is a JSON object");
        metadata.insert(
            "resourceVersion".into(),
            resource_version.to_string().into(),
        );
        metadata.insert("uid".into(), uid);
        let event = if state.objects.insert(key, value.clone()).is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        state.kinds.insert(resource.clone(), (api_version, kind));
        state.log.push(Entry {
            resource_version,
            resource,
            namespace,
            kind: event,
            object: value,
        });
        self.shared.notify(state);
        resource_version
    }

    /// Deletes the `K` named `name` in `namespace` (`None` for a cluster-scoped kind).
    /// Returns whether it existed.
    pub fn delete<K>(&self, namespace: Option<&str>, name: &str) -> bool
    where
        K: Resource<DynamicType = ()>,
    {
        let (resource, ..) = resource_of::<K>();
        let namespace = namespace.unwrap_or_default().to_owned();
        let mut state = self.shared.lock();
        let key = (resource.clone(), namespace.clone(), name.to_owned());
        let Some(mut object) = state.objects.remove(&key) else {
            return false;
        };
        state.resource_version += 1;
        let resource_version = state.resource_version;
        object["metadata"]["resourceVersion"] = resource_version.to_string().into();
        state.log.push(Entry {
            resource_version,
            resource,
            namespace,
            kind: "DELETED",
            object,
        });
        self.shared.notify(state);
        true
    }

    /// How many objects of kind `K` the server holds.
    pub fn count<K>(&self) -> usize
    where
        K: Resource<DynamicType = ()>,
    {
        let (resource, ..) = resource_of::<K>();
        let state = self.shared.lock();
        state
            .objects
            .keys()
            .filter(|(r, ..)| *r == resource)
            .count()
    }

    /// Sends a `BOOKMARK` at the current resource version on every open watch that allows
    /// bookmarks.
    pub fn bookmark(&self) {
        let mut state = self.shared.lock();
        let resource_version = state.resource_version;
        state.log.push(Entry {
            resource_version,
            resource: String::new(),
            namespace: String::new(),
            kind: "BOOKMARK",
            object: Value::Null,
        });
        self.shared.notify(state);
    }

    /// Ends every open watch, as a dropped connection or an API server restart does. The
    /// watchers come back from the resource version they had.
    pub fn drop_watches(&self) {
        let mut state = self.shared.lock();
        state.watch_generation += 1;
        self.shared.notify(state);
    }

    /// Ends every open watch and expires every resource version given out so far, as an
    /// etcd compaction does: the watchers' next watch gets `410 Gone`, and they relist.
    pub fn expire_watches(&self) {
        let mut state = self.shared.lock();
        state.expired_through = state.resource_version;
        // A new version that lists can report and watches can start from.
        state.resource_version += 1;
        state.watch_generation += 1;
        self.shared.notify(state);
    }

    /// The list and watch requests answered so far.
    pub fn requests(&self) -> Requests {
        self.shared.lock().requests
    }

    /// The last resource version given out.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().resource_version
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.closed = true;
        self.shared.notify(state);
        self.server.abort();
    }
}

impl Shared {
    /// Locks the state; a panic elsewhere while it was held does not make it unreadable.
    fn lock(&self) -> MutexGuard<'_, ApiState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Releases the state, then wakes the open watches.
    fn notify(&self, state: MutexGuard<'_, ApiState>) {
        drop(state);
        self.changed.send_modify(|version| *version += 1);
    }
}

/// `K`'s resource key (`v1/configmaps`), apiVersion and kind.
fn resource_of<K: Resource<DynamicType = ()>>() -> (String, String, String) {
    let api_version = K::api_version(&()).into_owned();
    let resource = format!("{api_version}/{}", K::plural(&()));
    (resource, api_version, K::kind(&()).into_owned())
}

/// Parses `/api/v1[/namespaces/NS]/PLURAL` and `/apis/GROUP/VERSION[/namespaces/NS]/PLURAL`.
fn target(uri: &Uri) -> Option<Target> {
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    let (api_version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ((*version).to_owned(), rest),
        ["apis", group, version, rest @ ..] => (format!("{group}/{version}"), rest),
        _ => return None,
    };
    let (namespace, plural) = match rest {
        [plural] => (None, plural),
        ["namespaces", namespace, plural] => (Some((*namespace).to_owned()), plural),
        _ => return None,
    };
    Some(Target {
        resource: format!("{api_version}/{plural}"),
        api_version,
        namespace,
    })
}

/// Answers one request: a list, or a watch with `watch=true`.
async fn handle(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    let Some(target) = target(&uri) else {
        return (StatusCode::NOT_FOUND, "not served by the fake API server").into_response();
    };
    if matches!(params.get("watch").map(String::as_str), Some("true" | "1")) {
        watch_response(shared, target, &params)
    } else {
        list_response(&shared, &target)
    }
}

/// A list of the target's objects at the current resource version.
fn list_response(shared: &Shared, target: &Target) -> Response {
    let mut state = shared.lock();
    state.requests.lists += 1;
    let items: Vec<&Value> = state
        .objects
        .iter()
        .filter(|((resource, namespace, _), _)| {
            *resource == target.resource
                && target.namespace.as_ref().is_none_or(|ns| ns == namespace)
        })
        .map(|(_, object)| object)
        .collect();
    let kind = state
        .kinds
        .get(&target.resource)
        .map_or_else(|| "List".to_owned(), |(_, kind)| format!("{kind}List"));
    let body = json!({
        "kind": kind,
        "apiVersion": target.api_version,
        "metadata": { "resourceVersion": state.resource_version.to_string() },
        "items": items,
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// A watch: newline-delimited events after the requested resource version, until the
/// watch's timeout, a dropped connection, or the server's drop; or one `410 Gone` error if
/// that version has expired.
fn watch_response(
    shared: Arc<Shared>,
    target: Target,
    params: &HashMap<String, String>,
) -> Response {
    let bookmarks = params
        .get("allowWatchBookmarks")
        .is_some_and(|v| v == "true");
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(290), Duration::from_secs);
    let mut state = shared.lock();
    state.requests.watches += 1;
    let from = params
        .get("resourceVersion")
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&v| v != 0)
        .unwrap_or(state.resource_version);
    state.requests.watched_from = from;
    if from <= state.expired_through {
        state.requests.expired += 1;
        let error = json!({
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": format!("too old resource version: {from} ({})", state.expired_through + 1),
                "reason": "Expired",
                "code": 410,
            },
        });
        return ndjson(Body::from(format!("{error}\n")));
    }
    let kind = state.kinds.get(&target.resource).cloned();
    let watch = Watch {
        position: state
            .log
            .partition_point(|entry| entry.resource_version <= from),
        generation: state.watch_generation,
        changes: shared.changed.subscribe(),
        deadline: tokio::time::Instant::now() + timeout,
        shared: shared.clone(),
        target,
        bookmarks,
        kind,
    };
    drop(state);
    ndjson(Body::from_stream(futures::stream::unfold(
        watch,
        Watch::next_chunk,
    )))
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
    /// The next log entry to look at.
    position: usize,
    /// The watch generation it was opened in; it ends when that moves on.
    generation: u64,
    /// Wakes it when the state changes.
    changes: watch::Receiver<u64>,
    /// When the client's `timeoutSeconds` runs out.
    deadline: tokio::time::Instant,
    /// The server.
    shared: Arc<Shared>,
    /// What it watches.
    target: Target,
    /// Whether the client allowed bookmarks.
    bookmarks: bool,
    /// The watched kind's (apiVersion, kind), once known, for bookmarks.
    kind: Option<(String, String)>,
}

impl Watch {
    /// The next chunk of events, or `None` once the watch ends.
    async fn next_chunk(mut self) -> Option<(Result<Bytes, Infallible>, Self)> {
        loop {
            // Mark the current change seen before reading, so none is missed in between.
            self.changes.borrow_and_update();
            if let Some(chunk) = self.read_log()? {
                return Some((Ok(Bytes::from(chunk)), self));
            }
            tokio::select! {
                changed = self.changes.changed() => changed.ok()?,
                () = tokio::time::sleep_until(self.deadline) => return None,
            }
        }
    }

    /// The events logged since the last read, as lines; `Ok(None)` if there are none, `None`
    /// if the watch has ended.
    fn read_log(&mut self) -> Option<Option<String>> {
        let mut state = self.shared.lock();
        if state.closed || state.watch_generation != self.generation {
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
            } else if entry.resource == self.target.resource
                && self
                    .target
                    .namespace
                    .as_ref()
                    .is_none_or(|ns| *ns == entry.namespace)
            {
                json!({ "type": entry.kind, "object": entry.object })
            } else {
                continue;
            };
            chunk.push_str(&line.to_string());
            chunk.push('\n');
        }
        self.position = state.log.len();
        state.requests.bookmarks += bookmarks;
        Some((!chunk.is_empty()).then_some(chunk))
    }
}
