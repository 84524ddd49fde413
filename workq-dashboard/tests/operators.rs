//! The dashboard as an operator leaves it running, over live `redis-server`s: a broken queue
//! among good ones, hundreds of queues on a few connections, a restart of Redis, pages and
//! search through items, single-item actions that answer what they did, the audit counters,
//! the rules behind a reverse proxy, two sources side by side, and a Redis that may evict
//! the queues' keys warned of.

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, StatusCode};
use redis::AsyncCommands;
use serde_json::json;
use support::{RedisServer, get, post, send};
use workq_dashboard::admin::MemoryAdmin;
use workq_dashboard::{Config, Dashboard, router};
use workq_redis::RedisAdmin;
use workq_redis::RedisQueue;

async fn queue(server: &RedisServer, name: &str) -> RedisQueue<String> {
    RedisQueue::builder(name)
        .url(server.url())
        .check_persistence(false)
        .build()
        .await
        .unwrap()
}

fn dashboard(server: &RedisServer, config: Config) -> axum::Router {
    router(RedisAdmin::new(&server.url(), "wq").unwrap(), config)
}

async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// The clients the server counts, less the one asking.
async fn clients(server: &RedisServer) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut raw(server).await)
        .await
        .unwrap();
    list.lines().count() - 1
}

fn names(all: &serde_json::Value) -> Vec<String> {
    all["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_the_wrong_type_shows_its_queue_as_broken_and_no_other() {
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    queue(&server, "good")
        .await
        .add("x".to_owned())
        .await
        .unwrap();
    let _: () = raw(&server)
        .await
        .set("wq:{bad}:ready", "a string")
        .await
        .unwrap();
    let app = dashboard(&server, Config::default());
    let reply = get(&app, "/api/queues").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let all = reply.json();
    assert_eq!(names(&all), ["bad", "good"]);
    assert!(
        all["queues"][0]["broken"]
            .as_str()
            .unwrap()
            .contains("WRONGTYPE")
    );
    assert_eq!(all["queues"][1]["depth"], 1);
    assert_eq!(all["queues"][1]["broken"], serde_json::Value::Null);
    let text = get(&app, "/metrics").await.body;
    assert!(
        text.contains("workqueue_broken{name=\"bad\",source=\"redis\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("workqueue_depth{name=\"good\",source=\"redis\"} 1"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_queues_take_one_connection() {
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let mut con = raw(&server).await;
    let mut pipe = redis::pipe();
    for i in 0..300 {
        pipe.rpush(format!("wq:{{q{i:03}}}:ready"), "\"x\"")
            .ignore();
        pipe.sadd(format!("wq:{{q{i:03}}}:dirty"), "\"x\"").ignore();
    }
    let _: () = pipe.query_async(&mut con).await.unwrap();
    drop(con);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = clients(&server).await;
    let app = dashboard(
        &server,
        Config {
            sample_every: Duration::from_millis(100),
            ..Config::default()
        },
    );
    let all = get(&app, "/api/queues").await.json();
    assert_eq!(names(&all).len(), 300);
    assert!(
        all["queues"]
            .as_array()
            .unwrap()
            .iter()
            .all(|q| q["depth"] == 1)
    );
    for name in ["q000", "q150", "q299"] {
        assert_eq!(
            get(&app, &format!("/api/queues/{name}")).await.json()["depth"],
            1
        );
        let page = get(&app, &format!("/api/queues/{name}/items?state=ready")).await;
        assert_eq!(page.json()["total"], 1);
    }
    assert_eq!(
        clients(&server).await,
        before + 1,
        "one connection for the listing, the queues and their pages"
    );
    // The history sent is what the page draws: the totals, or one queue.
    let mut last = serde_json::Value::Null;
    for _ in 0..50 {
        last = get(&app, "/api/history").await.json();
        if last["totals"]["redis"]
            .as_array()
            .is_some_and(|s| !s.is_empty())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let totals = last["totals"]["redis"].as_array().unwrap();
    assert_eq!(totals.last().unwrap()["depth"], 300);
    assert!(last.get("queues").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_answers_again_after_redis_restarts() {
    let Some(mut server) = support::durable_redis_server() else {
        return;
    };
    queue(&server, "jobs")
        .await
        .add("x".to_owned())
        .await
        .unwrap();
    let app = dashboard(&server, Config::default());
    assert_eq!(get(&app, "/api/queues").await.status, StatusCode::OK);

    server.kill();
    let down = get(&app, "/api/queues").await;
    assert_eq!(
        down.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        down.body
    );
    let body = down.json();
    assert_eq!(body["sources"][0]["up"], false);
    assert!(body["sources"][0]["down_since_ms"].as_u64().is_some());
    assert_eq!(
        get(&app, "/api/queues/jobs").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );

    let restarted = Instant::now();
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let reply = get(&app, "/api/queues").await;
        if reply.status == StatusCode::OK {
            assert_eq!(reply.json()["queues"][0]["depth"], 1);
            break;
        }
        assert!(Instant::now() < deadline, "still {}", reply.body);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("answered again {:?} after the restart", restarted.elapsed());
    let pause = post(&app, "/api/queues/jobs/pause", json!({})).await;
    assert_eq!(pause.json()["changed"], 1, "{}", pause.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_are_paged_from_both_ends_and_searched() {
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let q = queue(&server, "list").await;
    let items: Vec<String> = (0..25).map(|i| format!("item-{i:02}")).collect();
    q.add_all(items.iter().cloned()).await.unwrap();
    let app = dashboard(&server, Config::default());
    let page = |path: String| {
        let app = app.clone();
        async move {
            let reply = get(&app, &path).await;
            assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.body);
            reply.json()
        }
    };
    let first = page("/api/queues/list/items?state=ready&limit=10".into()).await;
    assert_eq!(first["total"], 25);
    assert_eq!(first["items"][0]["item"], "\"item-00\"");
    assert_eq!(first["prev"], serde_json::Value::Null);
    let next = first["next"].as_str().unwrap();
    let second = page(format!(
        "/api/queues/list/items?state=ready&limit=10&cursor={next}"
    ))
    .await;
    assert_eq!(second["items"][0]["item"], "\"item-10\"");
    let back = second["prev"].as_str().unwrap();
    let again = page(format!(
        "/api/queues/list/items?state=ready&limit=10&cursor={back}"
    ))
    .await;
    assert_eq!(again["items"], first["items"], "prev leads back");
    let last = page("/api/queues/list/items?state=ready&from=last&limit=3".into()).await;
    let tail: Vec<&str> = last["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["item"].as_str().unwrap())
        .collect();
    assert_eq!(tail, ["\"item-24\"", "\"item-23\"", "\"item-22\""]);
    let found = page("/api/queues/list/items?state=ready&q=ITEM-1".into()).await;
    assert_eq!(found["items"].as_array().unwrap().len(), 10);
    let bad = get(&app, "/api/queues/list/items?state=ready&cursor=nonsense").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let unknown_state = get(&app, "/api/queues/list/items?state=sleeping").await;
    assert_eq!(unknown_state.status, StatusCode::BAD_REQUEST);

    let detail = page("/api/queues/list/item?item=%22item-03%22".into()).await;
    assert_eq!(detail["states"], json!(["ready"]));
    assert_eq!(detail["position"], 3);
    assert_eq!(
        get(&app, "/api/queues/list/item?item=%22nobody%22")
            .await
            .status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_item_actions_are_idempotent_and_say_what_they_did() {
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let q = queue(&server, "ops").await;
    q.add_after("later".to_owned(), Duration::from_secs(3600))
        .await
        .unwrap();
    q.add("now".to_owned()).await.unwrap();
    let app = dashboard(&server, Config::default());
    let retry = |item: &str| {
        let app = app.clone();
        let item = item.to_owned();
        async move { post(&app, "/api/queues/ops/items/retry", json!({ "item": item })).await }
    };
    let first = retry("\"later\"").await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    assert_eq!(
        (
            first.json()["changed"].clone(),
            first.json()["message"].clone()
        ),
        (json!(1), json!("queued now"))
    );
    let second = retry("\"later\"").await.json();
    assert_eq!(
        (second["changed"].clone(), second["message"].clone()),
        (json!(0), json!("already queued"))
    );
    assert_eq!(q.len().await.unwrap(), 2);
    assert_eq!(retry("not json").await.status, StatusCode::BAD_REQUEST);

    let removed = post(
        &app,
        "/api/queues/ops/items/remove",
        json!({"item": "\"now\""}),
    )
    .await;
    assert_eq!(removed.json()["changed"], 1, "{}", removed.body);
    let again = post(
        &app,
        "/api/queues/ops/items/remove",
        json!({"item": "\"now\""}),
    )
    .await;
    assert_eq!(again.json()["message"], "not in the queue");
    assert_eq!(q.len().await.unwrap(), 1);
    let missing = post(&app, "/api/queues/ops/items/remove", json!({})).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);

    // A dead letter by id: requeued once; deleting it afterwards finds nothing.
    let text: RedisQueue<String> = queue(&server, "dl").await;
    text.add("poison".to_owned()).await.unwrap();
    let numbers: RedisQueue<u32> = RedisQueue::builder("dl")
        .url(server.url())
        .check_persistence(false)
        .build()
        .await
        .unwrap();
    assert!(numbers.try_get().await.unwrap().is_empty());
    let dead = get(&app, "/api/queues/dl/items?state=dead").await.json();
    let id = dead["items"][0]["dead"]["id"].as_str().unwrap().to_owned();
    let requeued = post(
        &app,
        "/api/queues/dl/dead-letters/requeue",
        json!({ "id": id }),
    )
    .await;
    assert_eq!(requeued.json()["changed"], 1, "{}", requeued.body);
    let deleted = post(
        &app,
        "/api/queues/dl/dead-letters/delete",
        json!({ "id": id }),
    )
    .await;
    assert_eq!(deleted.json()["changed"], 0);
    assert_eq!(text.len().await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_action_is_counted_by_name_and_result() {
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    queue(&server, "jobs")
        .await
        .add("x".to_owned())
        .await
        .unwrap();
    let app = dashboard(&server, Config::default());
    assert_eq!(
        post(&app, "/api/queues/jobs/pause", json!({})).await.json()["changed"],
        1
    );
    assert_eq!(
        post(&app, "/api/queues/jobs/pause", json!({})).await.json()["changed"],
        0
    );
    let forged = send(
        &app,
        Request::post("/api/queues/jobs/resume")
            .header("host", "127.0.0.1:8080")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    let text = get(&app, "/metrics").await.body;
    for line in [
        "workqueue_dashboard_actions_total{action=\"pause\",result=\"ok\"} 2",
        "workqueue_dashboard_actions_total{action=\"resume\",result=\"refused\"} 1",
        "workqueue_dashboard_source_up{source=\"redis\"} 1",
        "workqueue_paused{name=\"jobs\",source=\"redis\"} 1",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
}

/// The warnings of `/api/queues`'s first source about `maxmemory-policy`.
async fn eviction_warnings(app: &axum::Router) -> Vec<String> {
    let reply = get(app, "/api/queues").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.json()["sources"][0]["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap().to_owned())
        .filter(|w| w.contains("maxmemory-policy"))
        .collect()
}

/// A Redis whose `maxmemory-policy` may evict the queues' keys is warned of in the JSON
/// API (the page's banner), read again on a running server, and the warning goes once the
/// policy is `noeviction` again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_policy_is_warned_of_in_the_api() {
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    queue(&server, "jobs")
        .await
        .add("x".to_owned())
        .await
        .unwrap();
    let admin = RedisAdmin::new(&server.url(), "wq")
        .unwrap()
        .settings_check_interval(Duration::ZERO);
    let app = router(admin, Config::default());
    assert_eq!(eviction_warnings(&app).await, Vec::<String>::new());
    let set = |policy: &'static str| {
        let server = &server;
        async move {
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory-policy")
                .arg(policy)
                .query_async(&mut raw(server).await)
                .await
                .unwrap();
        }
    };
    // The listings the dashboard keeps for a moment, then the admin's next call, read the
    // settings again: within seconds, without a restart.
    let settled = |want_some: bool| {
        let app = &app;
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let warnings = eviction_warnings(app).await;
                if warnings.is_empty() != want_some || Instant::now() > deadline {
                    return warnings;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    set("allkeys-lru").await;
    let warnings = settled(true).await;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("allkeys-lru") && warnings[0].contains("noeviction"),
        "{warnings:?}"
    );
    set("noeviction").await;
    assert_eq!(settled(false).await, Vec::<String>::new());
}

fn from(peer: &str, request: axum::http::request::Builder) -> Request<Body> {
    let mut request = request.body(Body::empty()).unwrap();
    request
        .extensions_mut()
        .insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
    request
}

#[tokio::test]
async fn without_a_token_only_this_machine_is_answered_whatever_the_host() {
    let app = router(MemoryAdmin::new(), Config::default());
    let far = send(
        &app,
        from(
            "203.0.113.7:5000",
            Request::get("/api/queues").header("host", "127.0.0.1:8080"),
        ),
    )
    .await;
    assert_eq!(
        far.status,
        StatusCode::FORBIDDEN,
        "a client on another machine"
    );
    let near = send(
        &app,
        from(
            "127.0.0.1:5000",
            Request::get("/api/queues").header("host", "127.0.0.1:8080"),
        ),
    )
    .await;
    assert_eq!(near.status, StatusCode::OK);
    let proxied = send(
        &app,
        from(
            "127.0.0.1:5000",
            Request::get("/api/queues")
                .header("host", "127.0.0.1:8080")
                .header("x-forwarded-for", "198.51.100.4"),
        ),
    )
    .await;
    assert_eq!(
        proxied.status,
        StatusCode::FORBIDDEN,
        "a proxy forwarded it"
    );
}

#[tokio::test]
async fn behind_a_proxy_the_cookie_is_secure_and_scoped_to_the_public_path() {
    let source = MemoryAdmin::new();
    let _q: workq::WorkQueue<u32> = workq::WorkQueue::builder()
        .name("pods")
        .metrics(source.clone())
        .build();
    let app = Dashboard::new(Config {
        token: Some(support::TOKEN.into()),
        public_url: Some("https://ops.example.com/wq".into()),
        ..Config::default()
    })
    .source(source)
    .router()
    .unwrap();
    // nginx's defaults: `Host` is the upstream's address, and no X-Forwarded-* header.
    let visit = send(
        &app,
        from(
            "127.0.0.1:40000",
            Request::get(format!("/?token={}", support::TOKEN)).header("host", "127.0.0.1:8080"),
        ),
    )
    .await;
    assert_eq!(visit.status, StatusCode::SEE_OTHER);
    let cookie = visit.cookie.unwrap();
    for part in ["HttpOnly", "SameSite=Strict", "Path=/wq/", "Secure"] {
        assert!(cookie.contains(part), "{part} in {cookie}");
    }
    let pair = cookie.split(';').next().unwrap().to_owned();
    let page = send(
        &app,
        from(
            "127.0.0.1:40000",
            Request::get("/")
                .header("host", "127.0.0.1:8080")
                .header("cookie", pair),
        ),
    )
    .await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        Dashboard::new(Config {
            public_url: Some("ops.example.com".into()),
            ..Config::default()
        })
        .router()
        .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_public_url_origin_may_act_and_a_foreign_one_may_not() {
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let q = queue(&server, "jobs").await;
    q.add("x".to_owned()).await.unwrap();
    let app = dashboard(
        &server,
        Config {
            token: Some(support::TOKEN.to_owned()),
            public_url: Some("https://ops.example.com/wq/".into()),
            ..Config::default()
        },
    );
    let act = |origin: &str| {
        Request::post("/api/queues/jobs/pause")
            .header("host", "127.0.0.1:8080")
            .header("authorization", format!("Bearer {}", support::TOKEN))
            .header("origin", origin)
            .header("x-wq-csrf", "1")
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(
        send(&app, act("https://evil.example")).await.status,
        StatusCode::FORBIDDEN
    );
    assert!(!q.is_paused().await.unwrap());
    let ok = send(&app, act("https://ops.example.com")).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.body);
    assert!(q.is_paused().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sources_are_listed_side_by_side() {
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    queue(&server, "pods")
        .await
        .add("x".to_owned())
        .await
        .unwrap();
    queue(&server, "redis-only")
        .await
        .add("y".to_owned())
        .await
        .unwrap();
    let memory = MemoryAdmin::new();
    let local: workq::WorkQueue<u32> = workq::WorkQueue::builder()
        .name("pods")
        .metrics(memory.clone())
        .build();
    local.add(1);
    local.add(2);
    let app = Dashboard::new(Config::default())
        .source(RedisAdmin::new(&server.url(), "wq").unwrap())
        .source(memory)
        .router()
        .unwrap();
    let all = get(&app, "/api/queues").await.json();
    let listed: Vec<(String, String, u64)> = all["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| {
            (
                q["source"].as_str().unwrap().to_owned(),
                q["name"].as_str().unwrap().to_owned(),
                q["depth"].as_u64().unwrap(),
            )
        })
        .collect();
    assert!(listed.contains(&("redis".to_owned(), "pods".into(), 1)));
    assert!(listed.contains(&("memory".to_owned(), "pods".into(), 2)));
    assert_eq!(all["sources"].as_array().unwrap().len(), 2);
    assert_eq!(
        get(&app, "/api/queues/pods").await.status,
        StatusCode::CONFLICT
    );
    assert_eq!(
        get(&app, "/api/queues/pods?source=memory").await.json()["depth"],
        2
    );
    assert_eq!(
        get(&app, "/api/queues/redis-only").await.json()["source"],
        "redis"
    );
    let text = get(&app, "/metrics").await.body;
    assert!(
        text.contains("workqueue_depth{name=\"pods\",source=\"memory\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("workqueue_depth{name=\"pods\",source=\"redis\"} 1"),
        "{text}"
    );
    let paused = post(&app, "/api/queues/pods/pause?source=redis", json!({})).await;
    assert_eq!(paused.json()["changed"], 1, "{}", paused.body);
    let refused = post(&app, "/api/queues/pods/pause?source=memory", json!({})).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_source_lists_the_queues_of_every_primary() {
    let Some(cluster) = support::redis_cluster() else {
        return;
    };
    let urls = cluster.urls();
    let names: Vec<String> = (0..24).map(|i| format!("c{i:02}")).collect();
    for name in &names {
        let q: RedisQueue<String> = RedisQueue::builder(name.as_str())
            .cluster(urls.clone())
            .check_persistence(false)
            .build()
            .await
            .unwrap();
        q.add("x".to_owned()).await.unwrap();
    }
    let app = router(RedisAdmin::cluster(urls, "wq").unwrap(), Config::default());
    let all = get(&app, "/api/queues").await.json();
    assert_eq!(self::names(&all), names);
    assert!(
        all["queues"]
            .as_array()
            .unwrap()
            .iter()
            .all(|q| q["depth"] == 1)
    );
    let page = get(&app, "/api/queues/c13/items?state=ready").await.json();
    assert_eq!(page["items"][0]["item"], "\"x\"");
    let paused = post(&app, "/api/queues/c05/pause", json!({})).await;
    assert_eq!(paused.json()["changed"], 1, "{}", paused.body);
}
