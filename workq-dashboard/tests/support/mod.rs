//! Test support: a `redis-server` of the test's own (`workq-conformance`'s: a free loopback
//! port, a fresh data directory, stopped by PID when dropped), a PostgreSQL server of the
//! test's own (likewise), and requests to the dashboard's router.

#![allow(dead_code, reason = "each test binary uses a part of the support")]
#![expect(
    unreachable_pub,
    reason = "the helpers are `pub` for the test files that include them"
)]

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;
use workq_conformance::servers::redis as server;

pub(crate) use server::RedisServer;

/// A PostgreSQL server of the test's own. A missing PostgreSQL fails the test, naming the
/// Debian package, unless `WQ_SKIP_PG_TESTS=1` outside CI (then `None`).
#[allow(unused_imports, reason = "not every test binary starts a PostgreSQL")]
pub(crate) use workq_conformance::servers::postgres::PgServer;

/// A `redis-server` without persistence and with `extra` arguments. A missing binary fails
/// the test, naming the Debian package, unless `WQ_SKIP_REDIS_TESTS=1` outside CI (then
/// `None`).
pub(crate) fn redis_server(extra: &[&str]) -> Option<RedisServer> {
    server::require_with(server::Durability::None, extra)
}

/// A token strong enough for the dashboard (tests only: it is in the source).
pub const TOKEN: &str = "Zq3Xv9KpL2mN8rT4wY6bC1dF5gH7jQ0sUe";

/// A response: status, body text and the `Set-Cookie` header if any.
pub struct Reply {
    pub status: StatusCode,
    pub body: String,
    pub cookie: Option<String>,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// Sends `request` to `app` as a server that records peers does: from 127.0.0.1 unless the
/// request names its peer (`ConnectInfo`).
pub async fn send(app: &Router, mut request: Request<Body>) -> Reply {
    if request
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .is_none()
    {
        request.extensions_mut().insert(axum::extract::ConnectInfo(
            "127.0.0.1:40000".parse::<std::net::SocketAddr>().unwrap(),
        ));
    }
    send_without_peer(app, request).await
}

/// Sends `request` to `app` as `axum::serve(listener, app)` does: with no peer address.
pub async fn send_without_peer(app: &Router, request: Request<Body>) -> Reply {
    let response = app.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let cookie = response
        .headers()
        .get("set-cookie")
        .map(|v| v.to_str().unwrap().to_owned());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        body: String::from_utf8_lossy(&bytes).into_owned(),
        cookie,
    }
}

/// A GET with a loopback `Host`.
pub async fn get(app: &Router, path: &str) -> Reply {
    send(
        app,
        Request::get(path)
            .header("host", "127.0.0.1:8080")
            .body(Body::empty())
            .unwrap(),
    )
    .await
}

/// A POST as the page sends it (loopback `Host`, the CSRF header, same origin).
pub async fn post(app: &Router, path: &str, body: serde_json::Value) -> Reply {
    send(
        app,
        Request::post(path)
            .header("host", "127.0.0.1:8080")
            .header("origin", "http://127.0.0.1:8080")
            .header("sec-fetch-site", "same-origin")
            .header("x-wq-csrf", "1")
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap(),
    )
    .await
}

/// A `redis-server` that keeps its data in an append-only file, so a restart keeps the
/// queues.
pub(crate) fn durable_redis_server() -> Option<RedisServer> {
    server::require_with(server::Durability::Always, &[])
}

/// A three-primary Redis Cluster of the test's own.
pub(crate) fn redis_cluster() -> Option<server::RedisCluster> {
    if !server::require_binary() {
        return None;
    }
    server::RedisCluster::start()
}

/// The group of a key `group/name`: the part before the slash.
#[allow(
    clippy::ptr_arg,
    reason = "a group function takes a reference to the queue's item type"
)]
pub fn group_of(key: &String) -> String {
    key.split_once('/').map_or("", |(g, _)| g).to_owned()
}

/// Redis queue `name` with flow control: grouped by [`group_of`], one lease out per group
/// (`big`: three), a hand-out rate of 1000 a second.
pub async fn grouped_queue(server: &RedisServer, name: &str) -> workq_redis::RedisQueue<String> {
    workq_redis::RedisQueue::builder(name)
        .url(server.url())
        .check_persistence(false)
        .group_by(group_of)
        .max_in_flight_per_group(1)
        .group_max_in_flight("big", 3)
        .hand_out_rate(1000.0, 100)
        .build()
        .await
        .expect("connect to the test server")
}

/// The next tick of [`schedules`]' `nightly` after `now`: the coming 02:00 UTC.
pub fn nightly_next_tick(now: std::time::SystemTime) -> std::time::SystemTime {
    let day = 86_400;
    let since_epoch = now
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    let next = (since_epoch.as_secs().saturating_sub(7_200) / day + 1) * day + 7_200;
    std::time::UNIX_EPOCH + std::time::Duration::from_secs(next)
}

/// The schedules of a queue as its runners would have written them, on the runners' clock
/// `now`: `nightly` (a cron at 03:00 in Paris, next tick the coming 02:00 UTC, as in winter)
/// and `minutely` (an interval whose tick of a minute ago was taken, with `item`).
pub async fn schedules<Q: workq::Queue>(queue: &Q, item: Q::Item, now: std::time::SystemTime)
where
    Q::Error: std::fmt::Debug,
{
    use std::time::Duration;
    use workq::periodic::{ScheduleUpdate, TickClaim, TickOutcome};
    let (hour, minute) = (Duration::from_secs(3600), Duration::from_secs(60));
    let nightly = ScheduleUpdate::register(
        "nightly",
        "cron 0 3 * * * (Europe/Paris)",
        Some(nightly_next_tick(now)),
        now - hour,
    );
    queue.upsert_schedule(nightly).await.expect("nightly");
    let claim = TickClaim::new(
        "minutely",
        "every 1m",
        now - minute,
        Some(now),
        now - minute,
    );
    let took = queue
        .add_on_tick(claim, item, workq::AddOptions::default())
        .await;
    assert_eq!(took.expect("a tick"), TickOutcome::Added);
}
