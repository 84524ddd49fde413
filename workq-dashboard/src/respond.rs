//! The answers every handler shares: refusals (which the audit layer logs and counts), other
//! errors, and the clock the sources' `down_since` is read on.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// Milliseconds since the Unix epoch by the system clock (0 if the clock is set before it).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, millis)
}

/// `d` in whole milliseconds, `u64::MAX` for a span longer than that counts (a setting of
/// `Duration::MAX`).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A refusal, as the audit log and `/metrics` tell it: a short fixed label (`unauthorized`,
/// `read_only`, `body_too_large`, ...), why, and the item the request named if it got that
/// far.
#[derive(Debug, Clone)]
pub(crate) struct Refusal {
    pub(crate) kind: &'static str,
    pub(crate) reason: String,
    pub(crate) item: Option<String>,
}

/// A refusal of the request, logged and counted under `kind` by the audit layer.
pub(crate) fn refuse_as(status: StatusCode, kind: &'static str, why: &str) -> Response {
    let mut response = (status, axum::Json(serde_json::json!({ "error": why }))).into_response();
    response.extensions_mut().insert(Refusal {
        kind,
        reason: why.to_owned(),
        item: None,
    });
    response
}

/// `response` with `item` as the item its refusal names (nothing changes if it is no
/// refusal, or `item` is `None`).
pub(crate) fn naming(mut response: Response, item: Option<String>) -> Response {
    if let Some(refusal) = response.extensions_mut().get_mut::<Refusal>()
        && item.is_some()
    {
        refusal.item = item;
    }
    response
}

/// An answer that is no refusal (a queue that is not there, a server that is down): not
/// logged by the audit layer.
pub(crate) fn answer_error(status: StatusCode, why: &str) -> Response {
    (status, axum::Json(serde_json::json!({ "error": why }))).into_response()
}

/// The most bytes of a text from a server a listing shows (an item, a dead letter's error,
/// a group's or a schedule's name); an item's detail shows it whole.
pub(crate) const PREVIEW_BYTES: usize = 240;

/// `text` cut to at most [`PREVIEW_BYTES`] on a character boundary, if it is longer.
pub(crate) fn cut(text: &str) -> Option<String> {
    if text.len() <= PREVIEW_BYTES {
        return None;
    }
    let mut end = PREVIEW_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Some(format!("{}…", &text[..end]))
}
