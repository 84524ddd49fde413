//! Who may use the dashboard: the token, the loopback rules, the public URL behind a reverse
//! proxy, and the checks that keep another site from acting through an operator's browser.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use axum::extract::{ConnectInfo, OriginalUri, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use subtle::ConstantTimeEq;

use crate::config::PublicUrl;
use crate::respond::{Refusal, naming, refuse_as};
use crate::state::AppState;
use crate::target::{named_item, query_param};

pub(crate) const COOKIE: &str = "wq_dashboard_token";
pub(crate) const CSRF_HEADER: &str = "x-wq-csrf";

/// Whether `host` (a `Host:` header, maybe with a port) names this machine.
pub(crate) fn loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The client addresses a proxy in front says it forwarded for (`X-Forwarded-For`,
/// `X-Real-IP`, `Forwarded: for=`); unreadable ones are kept as text.
pub(crate) fn forwarded_for(headers: &HeaderMap) -> Vec<String> {
    let mut out = Vec::new();
    for v in headers.get_all("x-forwarded-for") {
        if let Ok(v) = v.to_str() {
            out.extend(v.split(',').map(|a| a.trim().to_owned()));
        }
    }
    if let Some(v) = headers.get("x-real-ip").and_then(|v| v.to_str().ok()) {
        out.push(v.trim().to_owned());
    }
    for v in headers.get_all(header::FORWARDED) {
        if let Ok(v) = v.to_str() {
            for part in v.split([',', ';']) {
                if let Some(addr) = part.trim().strip_prefix("for=") {
                    out.push(addr.trim_matches('"').to_owned());
                }
            }
        }
    }
    out.retain(|a| !a.is_empty());
    out
}

/// Whether a forwarded address (`1.2.3.4`, `[::1]:80`, `127.0.0.1:5`) is loopback.
fn loopback_addr(addr: &str) -> bool {
    let bare = addr.trim_start_matches('[');
    let bare = bare.split(']').next().unwrap_or(bare);
    bare.parse::<IpAddr>()
        .or_else(|_| bare.parse::<SocketAddr>().map(|s| s.ip()))
        .is_ok_and(|ip| ip.is_loopback())
}

/// The peer's address, when the server records it (`into_make_service_with_connect_info`).
pub(crate) fn peer(request: &Request) -> Option<SocketAddr> {
    request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0)
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

/// The action a refused `POST` asked for, for the audit log.
pub(crate) fn action_of_path(path: &str) -> &'static str {
    let tail = |s: &str| path.ends_with(s);
    if tail("/schedules/pause") {
        "pause_schedule"
    } else if tail("/schedules/resume") {
        "resume_schedule"
    } else if tail("/pause") {
        "pause"
    } else if tail("/resume") {
        "resume"
    } else if tail("/dead-letters/requeue-all") {
        "requeue_dead_letters"
    } else if tail("/dead-letters/purge") {
        "purge_dead_letters"
    } else if tail("/dead-letters/requeue") {
        "requeue_dead_letter"
    } else if tail("/dead-letters/delete") {
        "delete_dead_letter"
    } else if tail("/items/retry") {
        "retry_now"
    } else if tail("/items/remove") {
        "remove"
    } else if tail("/forget") {
        "forget"
    } else {
        "unknown"
    }
}

/// Why a request without a token is refused when the server does not record peers.
pub(crate) const NO_PEER: &str = "the dashboard has no token and cannot see the client's \
     address, so it cannot tell this machine from the network: set Config::token (see \
     workq_dashboard::generate_token), or serve it with workq_dashboard::Server or \
     into_make_service_with_connect_info::<SocketAddr>()";

/// The tokens a request carries: `Authorization: Bearer T`, and the cookie.
fn carried_tokens(headers: &HeaderMap) -> [Option<&str>; 2] {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    [bearer, cookie_token(headers)]
}

/// Authentication, DNS-rebinding and CSRF checks, and the read-only switch. A refused
/// request's item (`?item=`, or the item or dead letter its body names) is read for the
/// audit trail before the refusal is answered.
pub(crate) async fn guard(
    State(state): State<AppState>,
    OriginalUri(original): OriginalUri,
    request: Request,
    next: Next,
) -> Response {
    if let Some((response, delay)) = admit(&state, original.path(), &request) {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if response.extensions().get::<Refusal>().is_none() {
            return response;
        }
        return naming(response, named_item(request, state.config.body_limit).await);
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
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The guard's verdict on `request`: `None` lets it through; otherwise the answer (a
/// refusal, or the cookie of a visit to `/?token=T`) and how long to hold it (a guessed
/// token, answered later and later).
fn admit(state: &AppState, original_path: &str, request: &Request) -> Option<(Response, Duration)> {
    let refuse = |status, kind, why: &str| Some((refuse_as(status, kind, why), Duration::ZERO));
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let public = state.public.as_ref();
    let peer = peer(request);
    match &state.config.token {
        None => {
            let Some(peer) = peer else {
                if !state
                    .no_peer_told
                    .swap(true, std::sync::atomic::Ordering::Relaxed)
                {
                    tracing::error!(target: "workq_dashboard::audit", "{NO_PEER}");
                }
                return refuse(StatusCode::FORBIDDEN, "no_peer", NO_PEER);
            };
            if !peer.ip().is_loopback() {
                return refuse(
                    StatusCode::FORBIDDEN,
                    "not_loopback",
                    "without a token the dashboard answers clients on this machine only",
                );
            }
            if forwarded_for(headers).iter().any(|a| !loopback_addr(a)) {
                return refuse(
                    StatusCode::FORBIDDEN,
                    "not_loopback",
                    "without a token the dashboard answers clients on this machine only \
                     (a proxy forwarded this request)",
                );
            }
            if !loopback_host(&host) && public.is_none_or(|p| p.host != host) {
                return refuse(
                    StatusCode::FORBIDDEN,
                    "not_loopback",
                    "without a token the dashboard answers loopback hosts only",
                );
            }
        }
        Some(token) => {
            let carried = carried_tokens(headers);
            let ok = carried.iter().flatten().any(|t| same(t, token));
            if !ok {
                // One visit to `/?token=T` sets the cookie and drops the token from the URL.
                let given = query_param(request.uri().query(), "token");
                let visit = request.method() == Method::GET && request.uri().path() == "/";
                if visit && given.as_deref().is_some_and(|g| same(g, token)) {
                    return Some((token_cookie(token, public, original_path), Duration::ZERO));
                }
                state.auth_failures.inc();
                let guessed = given.is_some() || carried.iter().any(Option::is_some);
                // A guess is answered later and later; a request with no token at all (a
                // first visit) guesses nothing and is answered at once.
                let delay = if guessed {
                    state.failures.fail(peer.map(|p| p.ip()))
                } else {
                    Duration::ZERO
                };
                let why = if guessed {
                    "wrong token"
                } else {
                    "a token is needed: open the address `wq dashboard` printed when it \
                     started (it ends with /?token=...), or send Authorization: Bearer TOKEN"
                };
                return Some((
                    refuse_as(StatusCode::UNAUTHORIZED, "unauthorized", why),
                    delay,
                ));
            }
        }
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let why = if state.config.read_only || !state.any_actions() {
            Some(("read_only", "the dashboard is read-only"))
        } else if headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok()) != Some("1") {
            Some(("csrf", "missing the X-Wq-Csrf header"))
        } else if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok())
            && site != "same-origin"
            && site != "none"
        {
            Some(("cross_site", "cross-site request"))
        } else if let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok())
            && !same_origin(origin, &host, public)
        {
            Some(("cross_origin", "cross-origin request"))
        } else {
            None
        };
        if let Some((kind, why)) = why {
            return refuse(StatusCode::FORBIDDEN, kind, why);
        }
    }
    None
}

/// Whether `origin` is the dashboard's own: the public URL's origin, or the origin of the
/// `Host` the request came to.
fn same_origin(origin: &str, host: &str, public: Option<&PublicUrl>) -> bool {
    let origin = origin.to_ascii_lowercase();
    if public.is_some_and(|p| p.origin() == origin) {
        return true;
    }
    let bare = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .unwrap_or("");
    !bare.is_empty() && bare == host
}

/// The answer to `/?token=T`: the cookie, and a redirect to the page without the token. The
/// cookie is scoped to the dashboard's path (the public URL's, else the path the request
/// came to) and `Secure` when the page is served over HTTPS.
fn token_cookie(token: &str, public: Option<&PublicUrl>, original_path: &str) -> Response {
    let path = match public {
        Some(p) => p.path.clone(),
        None => {
            let p = original_path;
            if p.ends_with('/') {
                p.to_owned()
            } else {
                format!("{p}/")
            }
        }
    };
    let https = match public {
        Some(p) => p.scheme == "https",
        // Without a public URL no proxy is trusted (its `X-Forwarded-Proto` could be
        // anyone's), and the dashboard itself speaks plain HTTP.
        None => false,
    };
    let mut cookie = format!("{COOKIE}={token}; HttpOnly; SameSite=Strict; Path={path}");
    if https {
        cookie.push_str("; Secure");
    }
    let mut response = Redirect::to("./").into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_clients_are_read_from_every_header() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "203.0.113.9, 127.0.0.1".parse().unwrap());
        h.insert("x-real-ip", "198.51.100.2".parse().unwrap());
        h.insert(
            header::FORWARDED,
            "for=\"[2001:db8::1]:4711\";proto=https".parse().unwrap(),
        );
        let all = forwarded_for(&h);
        assert_eq!(
            all,
            [
                "203.0.113.9",
                "127.0.0.1",
                "198.51.100.2",
                "[2001:db8::1]:4711"
            ]
        );
        assert!(loopback_addr("127.0.0.1") && loopback_addr("[::1]:80"));
        assert!(!loopback_addr("203.0.113.9") && !loopback_addr("[2001:db8::1]:4711"));
        assert!(!loopback_addr("unknown"));
    }

    #[test]
    fn origins_match_the_host_or_the_public_url() {
        let p = PublicUrl::parse("https://ops.example.com/wq/").unwrap();
        assert!(same_origin(
            "https://ops.example.com",
            "127.0.0.1:8080",
            Some(&p)
        ));
        assert!(same_origin(
            "http://127.0.0.1:8080",
            "127.0.0.1:8080",
            Some(&p)
        ));
        assert!(!same_origin(
            "https://evil.example",
            "127.0.0.1:8080",
            Some(&p)
        ));
        assert!(!same_origin("null", "127.0.0.1:8080", None));
        assert_eq!(
            action_of_path("/x/api/queues/a/dead-letters/requeue-all"),
            "requeue_dead_letters"
        );
        assert_eq!(
            action_of_path("/api/queues/a/schedules/pause"),
            "pause_schedule"
        );
        assert_eq!(action_of_path("/api/queues/a/pause"), "pause");
    }
}
