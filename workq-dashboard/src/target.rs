//! What a request names beyond its queue: the item, dead letter or schedule of an action's body
//! ([`Target`]), and the item a refused request named, for the audit trail
//! ([`named_item`]).

use std::time::Duration;

use axum::extract::Request;
use axum::http::Method;
use serde::Deserialize;

/// The body of the actions that name an item, a dead letter or a schedule.
#[derive(Deserialize, Default)]
pub(crate) struct Target {
    pub(crate) item: Option<String>,
    pub(crate) id: Option<String>,
    pub(crate) schedule: Option<String>,
}

impl Target {
    /// What it names: the item, else the dead letter's id, else the schedule.
    pub(crate) fn named(self) -> Option<String> {
        self.item.or(self.id).or(self.schedule)
    }
}

/// How long a refused request's body is waited for, to name its item in the audit trail: a
/// refusal is answered at once, so a client that trickles its body only goes unnamed.
const NAMING_WAIT: Duration = Duration::from_secs(1);

/// The value of `key` in a query, percent-decoded.
pub(crate) fn query_param(query: Option<&str>, key: &str) -> Option<String> {
    form_urlencoded::parse(query?.as_bytes())
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.into_owned())
}

/// The item (or dead letter id) a refused request names, for the audit trail: `?item=` of
/// its query, else the `item` or `id` of an action's JSON body, read within [`NAMING_WAIT`]
/// and at most `limit` bytes (the body limit). `None` if it names none, or its body does not
/// come in time, is too long or is not such JSON.
pub(crate) async fn named_item(request: Request, limit: usize) -> Option<String> {
    if let Some(item) = query_param(request.uri().query(), "item") {
        return Some(item);
    }
    if request.method() != Method::POST {
        return None;
    }
    let body = tokio::time::timeout(
        NAMING_WAIT,
        axum::body::to_bytes(request.into_body(), limit),
    )
    .await
    .ok()?
    .ok()?;
    serde_json::from_slice::<Target>(&body).ok()?.named()
}
