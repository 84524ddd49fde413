//! An in-process Kubernetes API server for tests and examples: [`FakeApiServer`].
//!
//! No API server can run in a unit test, and kube's own `Client` is the thing to exercise, so
//! this module serves the API's calls over real HTTP on a loopback port, for any kind
//! (ConfigMaps, custom resources). Feature `testing`.
//!
//! What it serves:
//!
//! - **list and watch**, with resource versions, bookmarks, `410 Gone` for an expired watch
//!   (which makes kube's watcher relist), watches that drop, and label and field selectors
//!   (an object that leaves a watch's selection is sent as `DELETED`, one that enters it as
//!   `ADDED`); metadata-only lists and watches (`PartialObjectMetadata`, what kube's
//!   metadata watcher asks for);
//! - **get, create, replace, delete and patch** of one object: JSON merge patches, JSON
//!   patches (RFC 6902, with `test`), strategic merge patches (read as merge patches) and
//!   server-side apply (read as a merge of the applied object: no field ownership, no
//!   conflicts), on the object or its `status` subresource (every kind has one: a write of
//!   the object keeps the stored status, a write of `/status` changes the status only);
//! - **the server's rules**: a replace or patch naming an old `resourceVersion` gets
//!   `409 Conflict`; `metadata.generation` starts at 1 and goes up on every change outside
//!   `metadata` and `status` and when a deletion starts (kinds of a named group and custom
//!   resources; core kinds such as ConfigMaps have none, as on a real server); an object
//!   with finalizers is deleted in two steps, a `deletionTimestamp` first, then its removal
//!   once its last finalizer is gone (and no finalizer may be added meanwhile), so kube's
//!   `finalizer` function runs end to end.
//!
//! It is written here because no crate serves the Kubernetes API in process; kube's own
//! tests mock the client's HTTP service instead of running a server.
//!
//! It serves any kind, `coordination.k8s.io/v1` Leases included (create, get, replace with a
//! `409 Conflict` on a stale `resourceVersion`, watch): what leader election needs.
//!
//! Clients can be told apart ([`FakeApiServer::client_named`]), so that a test can cut one
//! off from the server as a network partition does ([`FakeApiServer::partition`]): its
//! requests are refused and its watches end, while the other clients go on.
//!
//! What it does not do: pagination (a list returns every object at once), `generateName`,
//! admission, defaulting and validation, authentication (but [`FakeApiServer::forbid`]
//! refuses a kind, as a missing RBAC rule does).

mod http;
mod select;
mod state;
mod store;

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Router;
use kube::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use state::Requests;
use state::{ApiState, CLIENT_HEADER, Entry, Shared};

/// An in-process API server speaking the Kubernetes API over HTTP on `127.0.0.1`.
///
/// Objects live as JSON, keyed by resource (`v1/configmaps`, `example.com/v1/widgets`),
/// namespace and name. Every change takes the next resource version and is kept in a log that
/// watches replay from the version they ask for. Tests change objects through kube's client
/// (over HTTP) or directly with [`apply`](Self::apply) and [`delete`](Self::delete).
///
/// The server stops when dropped: its open watches end.
///
/// # Examples
///
/// ```
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::Api;
/// use kube::api::{ObjectMeta, Patch, PatchParams};
/// use workq_kube::testing::FakeApiServer;
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
/// let patch = serde_json::json!({ "data": { "greeting": "hello" } });
/// configmaps.patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
/// let web = configmaps.get("web").await.unwrap();
/// assert_eq!(web.data.unwrap()["greeting"], "hello");
/// # }
/// ```
pub struct FakeApiServer {
    /// State shared with the request handlers.
    shared: Arc<Shared>,
    /// `http://127.0.0.1:PORT`.
    url: String,
    /// The accept loop, while the server serves.
    server: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for FakeApiServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeApiServer")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
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
        let server = std::sync::Mutex::new(Some(serve(listener, shared.clone())));
        Self {
            shared,
            url,
            server,
        }
    }

    /// Stops serving, as an API server that goes down: open watches end, new connections
    /// are refused, and requests on connections still open get `503 Service Unavailable`.
    /// The objects stay (etcd keeps them), and tests may still change them;
    /// [`serve_again`](Self::serve_again) brings the server back on the same address.
    pub fn stop_serving(&self) {
        if let Some(server) = self.accept_loop().take() {
            server.abort();
        }
        let mut state = self.shared.lock();
        state.down = true;
        state.watch_generation += 1;
        self.shared.notify(state);
    }

    /// Serves again on the same address after [`stop_serving`](Self::stop_serving).
    ///
    /// # Panics
    ///
    /// If the address cannot be bound again.
    pub async fn serve_again(&self) {
        if self.accept_loop().is_some() {
            return;
        }
        let address = self.url.trim_start_matches("http://").to_owned();
        let listener = TcpListener::bind(&address)
            .await
            .expect("bind the fake API server's address again");
        self.shared.lock().down = false;
        *self.accept_loop() = Some(serve(listener, self.shared.clone()));
    }

    /// The accept loop's handle.
    fn accept_loop(&self) -> MutexGuard<'_, Option<JoinHandle<()>>> {
        self.server
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
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

    /// A kube client for this server that names itself `name` on every request, so that
    /// [`partition`](Self::partition) can cut it off; otherwise as [`client`](Self::client),
    /// except that it does not retry `503` answers: a partition's refusals reach the caller
    /// at once, as a connection error would.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, or if `name` is not a valid HTTP header value.
    pub fn client_named(&self, name: &str) -> kube::Client {
        let mut config = kube::Config::new(self.url.parse().expect("the server's URL is a URI"));
        config.headers.push((
            axum::http::HeaderName::from_static(CLIENT_HEADER),
            name.parse().expect("a client name is a valid header value"),
        ));
        config.default_retry = false;
        kube::Client::try_from(config).expect("a client over plain HTTP")
    }

    /// Cuts the client named `name` ([`client_named`](Self::client_named)) off from the
    /// server, as a network partition does: from now on its requests are refused with
    /// `503 Service Unavailable` before the server looks at them (nothing it sends is
    /// applied), and its open watches end. The other clients go on.
    /// [`heal`](Self::heal) ends the partition.
    pub fn partition(&self, name: &str) {
        let mut state = self.shared.lock();
        state.partitioned.insert(name.to_owned());
        self.shared.notify(state);
    }

    /// Ends the partition of the client named `name`.
    pub fn heal(&self, name: &str) {
        self.shared.lock().partitioned.remove(name);
    }

    /// Creates or replaces `object` (kind, namespace and name from it, status included) and
    /// returns the resource version it now has, with the server's rules (see the
    /// [module](self)): the server fills in `apiVersion`, `kind`, `metadata.resourceVersion`,
    /// `metadata.generation` and, for a new object, `metadata.uid`.
    ///
    /// # Panics
    ///
    /// If `object` has no name, does not serialize to a JSON object, or adds a finalizer to
    /// an object being deleted.
    pub fn apply<K>(&self, object: &K) -> u64
    where
        K: Resource<DynamicType = ()> + Serialize,
    {
        let (resource, api_version, kind) = resource_of::<K>();
        let value = serde_json::to_value(object).expect("the object serializes");
        let meta = object.meta();
        let name = meta.name.clone().expect("the object has a name");
        let key = (
            resource.clone(),
            meta.namespace.clone().unwrap_or_default(),
            name,
        );
        let mut state = self.shared.lock();
        state.kinds.insert(resource, (api_version, kind));
        if let Err(error) = state.write(&key, value) {
            panic!("the fake API server refused the apply: {}", error.message);
        }
        let resource_version = state.resource_version;
        self.shared.notify(state);
        resource_version
    }

    /// Deletes the `K` named `name` in `namespace` (`None` for a cluster-scoped kind), as a
    /// `DELETE` request does: at once, or first with a `deletionTimestamp` if it has
    /// finalizers. Returns whether it existed.
    pub fn delete<K>(&self, namespace: Option<&str>, name: &str) -> bool
    where
        K: Resource<DynamicType = ()>,
    {
        let (resource, ..) = resource_of::<K>();
        let key = (
            resource,
            namespace.unwrap_or_default().to_owned(),
            name.to_owned(),
        );
        let mut state = self.shared.lock();
        let deleted = state.delete(&key).is_ok();
        self.shared.notify(state);
        deleted
    }

    /// The `K` named `name` in `namespace`, as the server holds it now.
    ///
    /// # Panics
    ///
    /// If the stored object does not deserialize as a `K`.
    pub fn get<K>(&self, namespace: Option<&str>, name: &str) -> Option<K>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
    {
        let (resource, ..) = resource_of::<K>();
        let key = (
            resource,
            namespace.unwrap_or_default().to_owned(),
            name.to_owned(),
        );
        let state = self.shared.lock();
        state.object(&key).map(|object| {
            serde_json::from_value(object.clone()).expect("the stored object deserializes")
        })
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

    /// Refuses every request for kind `K` with `403 Forbidden` from now on (a missing RBAC
    /// rule), and ends its open watches; [`allow`](Self::allow) lifts it.
    pub fn forbid<K>(&self)
    where
        K: Resource<DynamicType = ()>,
    {
        let (resource, ..) = resource_of::<K>();
        let mut state = self.shared.lock();
        state.forbidden.insert(resource);
        state.watch_generation += 1;
        self.shared.notify(state);
    }

    /// Serves kind `K` again after [`forbid`](Self::forbid).
    pub fn allow<K>(&self)
    where
        K: Resource<DynamicType = ()>,
    {
        let (resource, ..) = resource_of::<K>();
        self.shared.lock().forbidden.remove(&resource);
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
            previous: None,
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

    /// The requests answered so far.
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
        if let Some(server) = self.accept_loop().take() {
            server.abort();
        }
    }
}

/// Serves the API on `listener` until aborted.
fn serve(listener: TcpListener, shared: Arc<Shared>) -> JoinHandle<()> {
    let app = Router::new().fallback(http::handle).with_state(shared);
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "fake API server stopped");
        }
    })
}

/// `K`'s resource key (`v1/configmaps`), apiVersion and kind.
fn resource_of<K: Resource<DynamicType = ()>>() -> (String, String, String) {
    let api_version = K::api_version(&()).into_owned();
    let resource = format!("{api_version}/{}", K::plural(&()));
    (resource, api_version, K::kind(&()).into_owned())
}
