//! The server's state, shared by the request handlers (`http`, `store`) and the
//! [`FakeApiServer`](super::FakeApiServer) a test holds.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use axum::http::StatusCode;
use serde_json::{Value, json};
use tokio::sync::watch;

/// How many requests the server answered, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Requests {
    /// List requests.
    pub lists: u64,
    /// Watch requests (including those answered with `410 Gone`).
    pub watches: u64,
    /// Lists and watches that asked for metadata only (`PartialObjectMetadata`).
    pub metadata_only: u64,
    /// Watches refused because their resource version had expired.
    pub expired: u64,
    /// Bookmarks sent (one per open watch that allows them, per [`FakeApiServer::bookmark`]).
    ///
    /// [`FakeApiServer::bookmark`]: super::FakeApiServer::bookmark
    pub bookmarks: u64,
    /// The resource version the last watch asked to start from.
    pub watched_from: u64,
    /// Gets of one object.
    pub gets: u64,
    /// Writes: creates, replaces, patches (of objects and of their status).
    pub writes: u64,
    /// Deletes.
    pub deletes: u64,
    /// Requests refused with an error status (not found, conflict, forbidden, ...).
    pub refused: u64,
    /// Requests of a partitioned client, refused without being looked at.
    pub partitioned: u64,
}

/// The header that names a client ([`FakeApiServer::client_named`]).
///
/// [`FakeApiServer::client_named`]: super::FakeApiServer::client_named
pub(super) const CLIENT_HEADER: &str = "x-fake-api-client";

/// The server's state and the signal of its changes.
pub(super) struct Shared {
    /// Objects, log and counters.
    pub(super) state: Mutex<ApiState>,
    /// Bumped on every change, so that open watches look at the log again.
    pub(super) changed: watch::Sender<u64>,
}

/// (resource, namespace or "", name): where an object lives.
pub(super) type Key = (String, String, String);

/// What the server holds.
#[derive(Default)]
pub(super) struct ApiState {
    /// The last resource version given out.
    pub(super) resource_version: u64,
    /// Watches from this resource version or older are refused with `410 Gone`.
    pub(super) expired_through: u64,
    /// Open watches end when this moves on (a dropped connection, or the server's drop).
    pub(super) watch_generation: u64,
    /// The server was dropped: every watch ends.
    pub(super) closed: bool,
    /// The server stopped serving: requests on connections still open get `503`.
    pub(super) down: bool,
    /// Resource -> (apiVersion, kind), learned from the objects written.
    pub(super) kinds: HashMap<String, (String, String)>,
    /// Resources refused with `403 Forbidden`.
    pub(super) forbidden: HashSet<String>,
    /// Clients cut off from the server ([`FakeApiServer::partition`]).
    ///
    /// [`FakeApiServer::partition`]: super::FakeApiServer::partition
    pub(super) partitioned: HashSet<String>,
    /// Every object.
    pub(super) objects: BTreeMap<Key, Value>,
    /// Every change and bookmark in order; resource versions never decrease along it.
    pub(super) log: Vec<Entry>,
    /// The last uid given out.
    pub(super) uid: u64,
    /// Requests answered.
    pub(super) requests: Requests,
}

/// One watch event in the log.
pub(super) struct Entry {
    /// The resource version the event carries.
    pub(super) resource_version: u64,
    /// The resource, or "" for a bookmark (sent on every watch).
    pub(super) resource: String,
    /// The object's namespace, or "".
    pub(super) namespace: String,
    /// `ADDED`, `MODIFIED`, `DELETED` or `BOOKMARK`.
    pub(super) kind: &'static str,
    /// The object (empty for a bookmark).
    pub(super) object: Value,
    /// The object before a `MODIFIED` change, to tell a watch with a selector whether it
    /// entered or left the selection.
    pub(super) previous: Option<Value>,
}

/// An error answer: a `Status` object with its HTTP code.
#[derive(Debug)]
pub(super) struct ApiError {
    pub(super) code: StatusCode,
    pub(super) reason: &'static str,
    pub(super) message: String,
}

impl ApiError {
    pub(super) fn not_found(resource: &str, name: &str) -> Self {
        Self {
            code: StatusCode::NOT_FOUND,
            reason: "NotFound",
            message: format!("{resource} \"{name}\" not found"),
        }
    }

    pub(super) fn bad_request(message: impl Into<String>) -> Self {
        Self {
            code: StatusCode::BAD_REQUEST,
            reason: "BadRequest",
            message: message.into(),
        }
    }

    pub(super) fn invalid(message: impl Into<String>) -> Self {
        Self {
            code: StatusCode::UNPROCESSABLE_ENTITY,
            reason: "Invalid",
            message: message.into(),
        }
    }

    pub(super) fn conflict(message: impl Into<String>) -> Self {
        Self {
            code: StatusCode::CONFLICT,
            reason: "Conflict",
            message: message.into(),
        }
    }

    pub(super) fn already_exists(resource: &str, name: &str) -> Self {
        Self {
            code: StatusCode::CONFLICT,
            reason: "AlreadyExists",
            message: format!("{resource} \"{name}\" already exists"),
        }
    }

    pub(super) fn forbidden(resource: &str) -> Self {
        Self {
            code: StatusCode::FORBIDDEN,
            reason: "Forbidden",
            message: format!("{resource} is forbidden: the fake API server refuses it"),
        }
    }

    /// The `Status` object of this error.
    pub(super) fn status(&self) -> Value {
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code.as_u16(),
        })
    }
}

impl Shared {
    /// Locks the state; a panic elsewhere while it was held does not make it unreadable.
    pub(super) fn lock(&self) -> MutexGuard<'_, ApiState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Releases the state, then wakes the open watches.
    pub(super) fn notify(&self, state: MutexGuard<'_, ApiState>) {
        drop(state);
        self.changed.send_modify(|version| *version += 1);
    }
}
