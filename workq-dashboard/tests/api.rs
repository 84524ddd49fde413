//! The dashboard's JSON API, actions, guards and metrics over a live `redis-server`, and the
//! in-process source.

mod support;

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::json;
use support::{RedisServer, get, post, send};
use workq_dashboard::admin::MemoryAdmin;
use workq_dashboard::{Config, router};
use workq_redis::RedisAdmin;
use workq_redis::RedisQueue;

async fn queue<T>(server: &RedisServer, name: &str) -> RedisQueue<T>
where
    T: serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    RedisQueue::builder(name)
        .url(server.url())
        .check_persistence(false)
        .build()
        .await
        .expect("connect")
}

fn dashboard(server: &RedisServer, config: Config) -> axum::Router {
    router(RedisAdmin::new(&server.url(), "wq").unwrap(), config)
}

/// Queue `name` with one dead letter: a stored item that is no number.
async fn with_dead_letter(server: &RedisServer, name: &str) -> RedisQueue<u32> {
    let text: RedisQueue<String> = queue(server, name).await;
    text.add("not a number".to_owned()).await.unwrap();
    let numbers: RedisQueue<u32> = queue(server, name).await;
    assert!(
        numbers.try_get().await.unwrap().is_empty(),
        "the bad item is not handed out"
    );
    assert_eq!(numbers.stats(10).await.unwrap().summary.dead, 1);
    numbers
}

fn find<'a>(queues: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    queues["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == name)
        .unwrap_or_else(|| panic!("queue {name} not listed in {queues}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_are_listed_with_their_figures() {
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let a: RedisQueue<u32> = queue(&server, "alpha").await;
    for i in 0..3 {
        a.add(i).await.unwrap();
    }
    let lease = a.get().await.unwrap().unwrap();
    a.add_after(7, Duration::from_secs(600)).await.unwrap();
    a.add_rate_limited(9).await.unwrap();
    with_dead_letter(&server, "beta").await;
    let app = dashboard(&server, Config::default());

    let reply = get(&app, "/api/queues").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let all = reply.json();
    let alpha = find(&all, "alpha");
    assert_eq!(alpha["depth"], 2);
    assert_eq!(alpha["in_flight"], 1);
    assert_eq!(
        alpha["delayed"], 2,
        "the delayed and the rate-limited item wait"
    );
    assert_eq!(alpha["failing"], 1);
    assert_eq!(alpha["paused"], false);
    assert_eq!(find(&all, "beta")["dead"], 1);
    assert_eq!(all["read_only"], false);

    let leases = get(&app, "/api/queues/alpha/items?state=in_flight")
        .await
        .json();
    assert_eq!(leases["items"][0]["item"], lease.item().to_string());
    assert_eq!(leases["items"][0]["lease"]["token"], lease.token());
    let failing = get(&app, "/api/queues/alpha/items?state=failing")
        .await
        .json();
    assert_eq!(failing["items"][0]["item"], "9");
    let beta = get(&app, "/api/queues/beta/items?state=dead").await.json();
    assert_eq!(beta["items"][0]["item"], "\"not a number\"");
    assert!(
        !beta["items"][0]["dead"]["error"]
            .as_str()
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        get(&app, "/api/queues/nope").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(get(&app, "/api/queues/alpha").await.json()["depth"], 2);
    // Server-side totals: three adds that queued (the delays are not due), one failure.
    assert_eq!(alpha["adds_total"], 3);
    assert_eq!(alpha["completions_total"], 0);
    assert_eq!(alpha["retries_total"], 1);
    lease.done().await.unwrap();
    let all = get(&app, "/api/queues").await.json();
    assert_eq!(find(&all, "alpha")["completions_total"], 1);

    let page = get(&app, "/").await;
    assert!(page.body.contains("assets/app.js"), "{}", page.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_requeued_one_or_all_and_purged() {
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let q = with_dead_letter(&server, "q").await;
    let text: RedisQueue<String> = queue(&server, "q").await;
    text.add("second".to_owned()).await.unwrap();
    text.add("third".to_owned()).await.unwrap();
    assert!(q.try_get().await.unwrap().is_empty());
    assert!(q.try_get().await.unwrap().is_empty());
    assert_eq!(q.stats(10).await.unwrap().summary.dead, 3);
    let app = dashboard(&server, Config::default());

    let one = post(
        &app,
        "/api/queues/q/dead-letters/requeue",
        json!({"item": "\"second\""}),
    )
    .await;
    assert_eq!(one.status, StatusCode::OK, "{}", one.body);
    assert_eq!(one.json()["count"], 1);
    let stats = q.stats(10).await.unwrap();
    assert_eq!((stats.summary.dead, stats.summary.depth), (2, 1));

    let all = post(&app, "/api/queues/q/dead-letters/requeue-all", json!({})).await;
    assert_eq!(all.json()["count"], 2);
    let stats = q.stats(10).await.unwrap();
    assert_eq!((stats.summary.dead, stats.summary.depth), (0, 3));

    // They fail again, and the purge drops them.
    for _ in 0..3 {
        assert!(q.try_get().await.unwrap().is_empty());
    }
    let purged = post(&app, "/api/queues/q/dead-letters/purge", json!({})).await;
    assert_eq!(purged.json()["count"], 3);
    assert_eq!(q.stats(10).await.unwrap().summary.dead, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_stops_delivery_and_resume_wakes_getters() {
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let q: RedisQueue<u32> = queue(&server, "jobs").await;
    q.add(1).await.unwrap();
    let app = dashboard(&server, Config::default());

    assert_eq!(
        post(&app, "/api/queues/jobs/pause", json!({})).await.json()["count"],
        1
    );
    assert!(q.is_paused().await.unwrap());
    assert_eq!(
        find(&get(&app, "/api/queues").await.json(), "jobs")["paused"],
        true
    );
    assert!(q.try_get().await.unwrap().is_empty());
    q.add(2).await.unwrap();
    assert_eq!(
        q.len().await.unwrap(),
        2,
        "adds are still taken while paused"
    );

    let waiter = {
        let q = q.clone();
        tokio::spawn(async move { q.get().await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "a paused queue hands nothing out");

    assert_eq!(
        post(&app, "/api/queues/jobs/resume", json!({}))
            .await
            .json()["count"],
        1
    );
    let lease = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the resume wakes the getter")
        .unwrap()
        .unwrap()
        .expect("an item");
    assert_eq!(*lease, 1);
    lease.done().await.unwrap();
    assert!(!q.is_paused().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_clears_an_items_failures() {
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let q: RedisQueue<String> = queue(&server, "retry").await;
    q.add_rate_limited("web-0".to_owned()).await.unwrap();
    q.add_rate_limited("web-0".to_owned()).await.unwrap();
    assert_eq!(q.num_requeues("web-0".to_owned()).await.unwrap(), 2);
    let app = dashboard(&server, Config::default());
    let failing = get(&app, "/api/queues/retry/items?state=failing")
        .await
        .json();
    assert_eq!(failing["items"][0]["failures"], 2);
    let item = failing["items"][0]["item"].as_str().unwrap().to_owned();

    let reply = post(&app, "/api/queues/retry/forget", json!({ "item": item })).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.json()["message"], "cleared 2 failures");
    assert_eq!(q.num_requeues("web-0".to_owned()).await.unwrap(), 0);
    let again = post(&app, "/api/queues/retry/forget", json!({ "item": item })).await;
    assert_eq!(again.json()["changed"], 0, "idempotent: {}", again.body);
    let bad = post(
        &app,
        "/api/queues/retry/forget",
        json!({ "item": "not json" }),
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_need_the_csrf_header_and_a_same_origin() {
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let q: RedisQueue<u32> = queue(&server, "jobs").await;
    q.add(1).await.unwrap();
    let app = dashboard(&server, Config::default());
    let attempt = |headers: &[(&str, &str)]| {
        let mut request = Request::post("/api/queues/jobs/pause").header("host", "127.0.0.1:8080");
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        request.body(Body::empty()).unwrap()
    };
    // A cross-site form: no custom header.
    let form = send(&app, attempt(&[("origin", "http://evil.example")])).await;
    assert_eq!(form.status, StatusCode::FORBIDDEN);
    let cross = send(
        &app,
        attempt(&[("x-wq-csrf", "1"), ("origin", "http://evil.example")]),
    )
    .await;
    assert_eq!(cross.status, StatusCode::FORBIDDEN);
    let site = send(
        &app,
        attempt(&[("x-wq-csrf", "1"), ("sec-fetch-site", "cross-site")]),
    )
    .await;
    assert_eq!(site.status, StatusCode::FORBIDDEN);
    assert!(
        !q.is_paused().await.unwrap(),
        "no refused request paused the queue"
    );
    // DNS rebinding: a page whose host name resolves to 127.0.0.1.
    let rebound = send(
        &app,
        Request::get("/api/queues")
            .header("host", "evil.example:8080")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(rebound.status, StatusCode::FORBIDDEN);
    let ok = send(&app, attempt(&[("x-wq-csrf", "1")])).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.body);
    assert!(q.is_paused().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_guards_the_page_and_the_api() {
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let q: RedisQueue<u32> = queue(&server, "jobs").await;
    q.add(1).await.unwrap();
    let config = Config {
        token: Some(support::TOKEN.into()),
        ..Config::default()
    };
    let app = dashboard(&server, config);
    let at = |path: &str, auth: Option<(&str, &str)>| {
        let mut r = Request::get(path).header("host", "dash.internal:8080");
        if let Some((k, v)) = auth {
            r = r.header(k, v);
        }
        r.body(Body::empty()).unwrap()
    };
    assert_eq!(
        send(&app, at("/api/queues", None)).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        send(&app, at("/", None)).await.status,
        StatusCode::UNAUTHORIZED
    );
    let wrong = send(
        &app,
        at(
            "/api/queues",
            Some((
                "authorization",
                &format!("Bearer {}x", &support::TOKEN[1..]),
            )),
        ),
    )
    .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    let bearer = send(
        &app,
        at(
            "/api/queues",
            Some(("authorization", &format!("Bearer {}", support::TOKEN))),
        ),
    )
    .await;
    assert_eq!(bearer.status, StatusCode::OK);
    let visit = send(&app, at(&format!("/?token={}", support::TOKEN), None)).await;
    assert_eq!(visit.status, StatusCode::SEE_OTHER);
    let cookie = visit.cookie.expect("a cookie");
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(
        cookie.contains("Path=/;") || cookie.ends_with("Path=/"),
        "{cookie}"
    );
    assert!(!cookie.contains("Secure"), "plain HTTP: {cookie}");
    let pair = cookie.split(';').next().unwrap().to_owned();
    let page = send(&app, at("/", Some(("cookie", &pair)))).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        !page.body.contains(support::TOKEN),
        "the page holds no secret"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_refuses_every_action() {
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let q = with_dead_letter(&server, "jobs").await;
    let app = dashboard(
        &server,
        Config {
            read_only: true,
            ..Config::default()
        },
    );
    for path in [
        "pause",
        "dead-letters/requeue-all",
        "dead-letters/purge",
        "schedules/pause",
    ] {
        let reply = post(
            &app,
            &format!("/api/queues/jobs/{path}"),
            json!({"schedule": "s"}),
        )
        .await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{path}");
    }
    assert!(!q.is_paused().await.unwrap());
    assert_eq!(q.stats(10).await.unwrap().summary.dead, 1);
    assert_eq!(get(&app, "/api/queues").await.json()["read_only"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_history_follow_the_queues() {
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let q: RedisQueue<u32> = queue(&server, "jobs").await;
    for i in 0..4 {
        q.add(i).await.unwrap();
    }
    with_dead_letter(&server, "other").await;
    // A queue with flow control, so that the scrape CI checks has its series too.
    let (_tenants, lease) = tenants(&server).await;
    let config = Config {
        sample_every: Duration::from_millis(100),
        group_series: 3,
        ..Config::default()
    };
    let app = dashboard(&server, config);
    let text = get(&app, "/metrics").await.body;
    assert!(
        text.contains("workqueue_group_depth{name=\"tenants\",source=\"redis\",group=\"noisy\"} 3"),
        "{text}"
    );
    lease.done().await.unwrap();
    assert!(
        text.contains("workqueue_depth{name=\"jobs\",source=\"redis\"} 4"),
        "{text}"
    );
    // Kept for CI's `promtool check metrics`.
    let target = std::env::var("CARGO_TARGET_DIR").map_or_else(
        |_| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"),
        std::path::PathBuf::from,
    );
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("dashboard-metrics.txt"), &text).unwrap();
    assert!(
        text.contains("workqueue_dead_letters{name=\"other\",source=\"redis\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("workqueue_stalled_items{name=\"jobs\",source=\"redis\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("workqueue_adds_total{name=\"jobs\",source=\"redis\"} 4"),
        "{text}"
    );
    let open = support::send(
        &app,
        Request::get("/metrics")
            .header("host", "localhost")
            .header("accept", "application/openmetrics-text;version=1.0.0")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert!(open.body.ends_with("# EOF\n"), "{}", open.body);

    let mut samples = 0;
    for _ in 0..100 {
        let history = get(&app, "/api/history?queue=jobs").await.json();
        samples = history["samples"].as_array().map_or(0, Vec::len);
        if samples >= 3 {
            assert_eq!(history["samples"][0]["depth"], 4);
            let totals = get(&app, "/api/history").await.json();
            let last = totals["totals"]["redis"]
                .as_array()
                .unwrap()
                .last()
                .unwrap()
                .clone();
            assert_eq!(last["depth"], 4 + 7, "the totals of every queue: {totals}");
            assert_eq!(last["dead"], 1);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(samples >= 3, "the sampler keeps figures for the charts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_password_is_never_shown() {
    let Some(server) = support::redis_server(&["--requirepass", "right-pass"]) else {
        return;
    };
    let url = format!("redis://:wrong-secret-pass@127.0.0.1:{}/", server.port());
    let source = RedisAdmin::new(&url, "wq").unwrap();
    assert!(!format!("{source:?}").contains("wrong-secret-pass"));
    let app = router(source, Config::default());
    let reply = get(&app, "/api/queues").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.json()["sources"][0]["up"], false);
    assert!(!reply.body.contains("wrong-secret-pass"), "{}", reply.body);
    assert_eq!(
        workq_dashboard::admin::redact_url("redis://user:pw@host:1/0"),
        "redis://***@host:1/0"
    );
}

#[tokio::test]
async fn in_process_queues_show_through_their_probes() {
    let source = MemoryAdmin::new();
    let queue: workq::WorkQueue<u32> = workq::WorkQueue::builder()
        .name("pods")
        .metrics(source.clone())
        .build();
    queue.add(1);
    queue.add(2);
    queue.add(2);
    let lease = queue.try_get().expect("an item");
    let app = router(source, Config::default());
    let all = get(&app, "/api/queues").await.json();
    let pods = find(&all, "pods");
    assert_eq!(pods["depth"], 1);
    assert_eq!(pods["in_flight"], 1);
    assert_eq!(pods["adds_total"], 2, "the duplicate add is not counted");
    assert_eq!(all["read_only"], true);
    drop(lease);
    let pods = get(&app, "/api/queues/pods").await.json();
    assert_eq!(
        (pods["in_flight"].clone(), pods["completions_total"].clone()),
        (json!(0), json!(1))
    );
    let text = get(&app, "/metrics").await.body;
    assert!(
        text.contains("workqueue_adds_total{name=\"pods\",source=\"memory\"} 2"),
        "{text}"
    );
    let refused = post(&app, "/api/queues/pods/pause", json!({})).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    drop(queue);
    assert_eq!(get(&app, "/api/queues").await.json()["queues"], json!([]));
}

/// `sample_every` and `keep` of `Duration::MAX` (public fields, no limit) panic nowhere: a
/// read still gets its sample. The sampler's idle window (three samples) overflowed, and
/// its task died before the first sample.
#[tokio::test]
async fn a_sample_every_of_duration_max_still_samples_on_a_read() {
    let source = MemoryAdmin::new();
    let queue: workq::WorkQueue<u32> = workq::WorkQueue::builder()
        .name("pods")
        .metrics(source.clone())
        .build();
    queue.add(1);
    let config = Config {
        sample_every: Duration::MAX,
        keep: Duration::MAX,
        ..Config::default()
    };
    let app = router(source, config);
    let mut history = serde_json::Value::Null;
    for _ in 0..200 {
        history = get(&app, "/api/history?queue=pods").await.json();
        if history["samples"].as_array().is_some_and(|s| !s.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(history["samples"][0]["depth"], 1, "{history}");
    assert_eq!(history["sample_every_ms"], u64::MAX);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_queues_under_the_prefix_are_listed() {
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    for (prefix, name) in [("wq", "mine"), ("team", "theirs"), ("team", "also")] {
        let q: RedisQueue<u32> = RedisQueue::builder(name)
            .url(server.url())
            .prefix(prefix)
            .check_persistence(false)
            .build()
            .await
            .unwrap();
        q.add(1).await.unwrap();
    }
    let app = router(
        RedisAdmin::new(&server.url(), "team").unwrap(),
        Config::default(),
    );
    let names: Vec<String> = get(&app, "/api/queues").await.json()["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["also", "theirs"]);
    let other = post(&app, "/api/queues/mine/pause", json!({})).await;
    assert_eq!(
        other.status,
        StatusCode::NOT_FOUND,
        "a queue of another prefix"
    );
}

#[tokio::test]
async fn the_router_mounts_under_a_path_beside_other_routes() {
    let source = MemoryAdmin::new();
    let queue: workq::WorkQueue<u32> = workq::WorkQueue::builder()
        .name("pods")
        .metrics(source.clone())
        .build();
    queue.add(7);
    let app = axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .nest_service("/dashboard", router(source, Config::default()));
    assert_eq!(get(&app, "/healthz").await.body, "ok");
    let bare = get(&app, "/dashboard").await;
    assert_eq!(bare.status, StatusCode::PERMANENT_REDIRECT);
    let page = get(&app, "/dashboard/").await;
    assert_eq!(page.status, StatusCode::OK);
    // Relative links: they resolve under the mount point.
    assert!(page.body.contains("src=\"assets/app.js\""), "{}", page.body);
    let script = get(&app, "/dashboard/assets/app.js").await;
    assert_eq!(script.status, StatusCode::OK);
    assert!(script.body.contains("X-Wq-Csrf"));
    let all = get(&app, "/dashboard/api/queues").await.json();
    assert_eq!(find(&all, "pods")["depth"], 1);
}

/// Queue `tenants` ([`support::grouped_queue`]): `noisy` has three items ready and one out,
/// a group whose name is 300 bytes long two, `quiet` and `big` one each.
async fn tenants(server: &RedisServer) -> (RedisQueue<String>, workq_redis::Lease<String>) {
    let q = support::grouped_queue(server, "tenants").await;
    let long = "g".repeat(300);
    for key in [
        "noisy/a", "noisy/b", "noisy/c", "noisy/d", "quiet/a", "big/a",
    ] {
        q.add(key.to_owned()).await.unwrap();
    }
    q.add(format!("{long}/a")).await.unwrap();
    q.add(format!("{long}/b")).await.unwrap();
    let lease = q.get().await.unwrap().unwrap();
    assert_eq!(lease.item(), "noisy/a");
    (q, lease)
}

/// A queue's page carries its groups (the top ones, long names cut), its limits (as kept and
/// in words) and its periodic schedules (with their time zone); a schedule is paused and
/// resumed through the API, once each; a queue without any of it says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queues_page_has_its_groups_limits_and_schedules() {
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let (q, lease) = tenants(&server).await;
    let now = std::time::SystemTime::now();
    support::schedules(&q, "tick".to_owned(), now).await;
    let plain: RedisQueue<u32> = queue(&server, "plain").await;
    plain.add(1).await.unwrap();
    let app = dashboard(
        &server,
        Config {
            groups_shown: 2,
            ..Config::default()
        },
    );

    let page = get(&app, "/api/queues/tenants").await.json();
    // The item of the tick taken is in the group "" (its key has no slash).
    assert_eq!(page["depth"], 8, "the figures are there as before: {page}");
    assert_eq!(
        page["flow"],
        json!({"groups_ready": 5, "groups_saturated": 1, "groups": 5})
    );
    let groups = page["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2, "at most groups_shown: {page}");
    assert_eq!(groups[0]["name"], "noisy");
    assert_eq!(
        (
            &groups[0]["ready"],
            &groups[0]["in_flight"],
            &groups[0]["limit"]
        ),
        (&json!(3), &json!(1), &json!(1))
    );
    assert!(groups[0]["oldest_ready_s"].as_f64().is_some(), "{page}");
    let long = &groups[1];
    assert_eq!(long["ready"], 2);
    assert_eq!(long["name_truncated"], true, "{long}");
    assert!(long["name"].as_str().unwrap().len() < 300, "{long}");
    assert_eq!(page["limits"]["max_in_flight_per_group"], 1);
    assert_eq!(page["limits"]["group_max_in_flight"]["big"], 3);
    assert_eq!(
        page["limits_described"],
        json!([
            ["groups", "by the queue's group function, taking turns"],
            ["in flight per group", "at most 1 (big: 3)"],
            ["hand-out rate", "1000/s, burst 100"],
        ])
    );
    let schedules = page["schedules"].as_array().unwrap();
    let names: Vec<&str> = schedules
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["minutely", "nightly"]);
    let ms = |at: std::time::SystemTime| {
        at.duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };
    let hour = Duration::from_secs(3600);
    assert_eq!(
        schedules[1],
        json!({
            "name": "nightly", "spec": "cron 0 3 * * * (Europe/Paris)",
            "time_zone": "Europe/Paris", "since_ms": ms(now - hour), "last_tick_ms": null,
            "next_tick_ms": ms(support::nightly_next_tick(now)), "paused": false,
            "since": workq_dashboard::text::instant(now - hour),
            "last_tick": null,
            "next_tick": workq_dashboard::text::instant(support::nightly_next_tick(now)),
        })
    );
    assert_eq!(
        schedules[0]["time_zone"],
        json!(null),
        "an interval has none"
    );
    assert_eq!(
        schedules[0]["last_tick_ms"],
        ms(now - Duration::from_secs(60))
    );

    // Pause and resume, each once; a schedule the queue does not have is not found.
    let pause = json!({"schedule": "nightly"});
    let reply = post(&app, "/api/queues/tenants/schedules/pause", pause.clone()).await;
    assert_eq!(reply.json()["changed"], 1, "{}", reply.body);
    let reply = post(&app, "/api/queues/tenants/schedules/pause", pause.clone()).await;
    assert_eq!(reply.json()["message"], "schedule paused already");
    let paused = get(&app, "/api/queues/tenants").await.json();
    assert_eq!(paused["schedules"][1]["paused"], true);
    let reply = post(&app, "/api/queues/tenants/schedules/resume", pause).await;
    assert_eq!(reply.json()["changed"], 1, "{}", reply.body);
    let missing = json!({"schedule": "hourly"});
    let reply = post(&app, "/api/queues/tenants/schedules/pause", missing).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.body);
    let reply = post(&app, "/api/queues/tenants/schedules/pause", json!({})).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
    let names = get(&app, "/api/queues/tenants").await.json()["schedules"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(names, 2, "nothing was created");

    let page = get(&app, "/api/queues/plain").await.json();
    assert_eq!(
        (
            &page["flow"],
            &page["groups"],
            &page["limits"],
            &page["schedules"]
        ),
        (&json!(null), &json!([]), &json!(null), &json!([])),
        "{page}"
    );
    assert_eq!(page["limits_described"], json!([]));
    lease.done().await.unwrap();
}

/// `/metrics` reports, for the queues with flow control only, `workqueue_groups_ready` and
/// `workqueue_group_saturated`; the per-group series only when asked for, for the top N
/// groups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_report_the_flow_of_the_queues_that_have_it() {
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let (_q, lease) = tenants(&server).await;
    let plain: RedisQueue<u32> = queue(&server, "plain").await;
    plain.add(1).await.unwrap();
    let text = get(&dashboard(&server, Config::default()), "/metrics")
        .await
        .body;
    for line in [
        "workqueue_groups_ready{name=\"tenants\",source=\"redis\"} 4",
        "workqueue_group_saturated{name=\"tenants\",source=\"redis\"} 1",
        "# TYPE workqueue_groups_ready gauge",
        "# TYPE workqueue_group_saturated gauge",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
    assert!(
        !text.contains("workqueue_groups_ready{name=\"plain\""),
        "{text}"
    );
    assert!(
        !text.contains("workqueue_group_depth"),
        "not asked for: {text}"
    );

    let asked = Config {
        group_series: 2,
        ..Config::default()
    };
    let text = get(&dashboard(&server, asked), "/metrics").await.body;
    for line in [
        "workqueue_group_depth{name=\"tenants\",source=\"redis\",group=\"noisy\"} 3",
        "workqueue_group_in_flight{name=\"tenants\",source=\"redis\",group=\"noisy\"} 1",
        "# TYPE workqueue_group_depth gauge",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
    let per_group = text
        .lines()
        .filter(|l| l.starts_with("workqueue_group_depth{"))
        .count();
    assert_eq!(per_group, 2, "the top two groups only: {text}");
    lease.done().await.unwrap();
}

/// An in-process source that counts the `stats` calls made of it.
#[derive(Debug)]
struct Counting {
    inner: MemoryAdmin,
    stats: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl workq::admin::Admin for Counting {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn capabilities(&self) -> workq::admin::Capabilities {
        self.inner.capabilities()
    }
    fn status(&self) -> workq::admin::ServerStatus {
        self.inner.status()
    }
    fn queues(
        &self,
    ) -> workq::admin::BoxFuture<
        '_,
        Result<Vec<workq::admin::QueueSummary>, workq::admin::AdminError>,
    > {
        self.inner.queues()
    }
    fn summary<'a>(
        &'a self,
        queue: &'a str,
    ) -> workq::admin::BoxFuture<'a, Result<workq::admin::QueueSummary, workq::admin::AdminError>>
    {
        self.inner.summary(queue)
    }
    fn stats<'a>(
        &'a self,
        queue: &'a str,
        limit: usize,
    ) -> workq::admin::BoxFuture<'a, Result<workq::admin::Stats, workq::admin::AdminError>> {
        self.stats.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.stats(queue, limit)
    }
}

/// A scrape reads the flow control of at most `flow_queues` queues, and a queue found without
/// it is not asked again for a while: the reads go to the queues that have it.
#[tokio::test]
async fn a_scrape_reads_the_flow_of_a_bounded_number_of_queues() {
    let source = MemoryAdmin::new();
    let grouped: workq::WorkQueue<String> = workq::WorkQueue::builder()
        .name("f")
        .metrics(source.clone())
        .group_by(support::group_of)
        .build();
    grouped.add("a/1".to_owned());
    let plain: Vec<workq::WorkQueue<u32>> = (1..=4)
        .map(|i| {
            workq::WorkQueue::builder()
                .name(format!("p{i}"))
                .metrics(source.clone())
                .build()
        })
        .collect();
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counting = Counting {
        inner: source,
        stats: calls.clone(),
    };
    let config = Config {
        flow_queues: 3,
        ..Config::default()
    };
    let app = router(counting, config);
    let mut asked = Vec::new();
    for _ in 0..3 {
        let text = get(&app, "/metrics").await.body;
        assert!(
            text.contains("workqueue_groups_ready{name=\"f\",source=\"memory\"} 1"),
            "{text}"
        );
        asked.push(calls.swap(0, std::sync::atomic::Ordering::SeqCst));
    }
    assert_eq!(
        asked,
        [3, 3, 1],
        "f, p1, p2; then f, p3, p4; then f alone (the others have no flow control)"
    );
    drop(plain);
}
