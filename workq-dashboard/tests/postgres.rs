//! The dashboard over a live PostgreSQL (`PgAdmin`): every queue of the database listed with
//! its figures and a malformed one as broken, hundreds of queues on at most four connections,
//! a restart of the server, pages from both ends of a million dead letters and a search
//! through them, one item's detail, every action idempotent and saying what it did, a purge
//! that leaves the dashboard answering, and `/metrics` with the series of a Redis queue,
//! side by side with one.

mod support;

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde_json::json;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use support::{PgServer, get, post};
use workq_dashboard::{Config, Dashboard, router};
use workq_postgres::PgAdmin;
use workq_postgres::PgQueue;
use workq_redis::RedisAdmin;

/// A password the test server ignores (it trusts loopback clients): it must never show.
const PASSWORD: &str = "pg-s3cret-pass";

fn url(server: &PgServer) -> String {
    server.url().replacen(
        "postgres://postgres@",
        &format!("postgres://postgres:{PASSWORD}@"),
        1,
    )
}

async fn admin(server: &PgServer) -> PgPool {
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&server.url())
        .await
        .unwrap();
    PgQueue::<String>::migrate(&pool).await.unwrap();
    pool
}

/// Queue `name` on `pool`, as a worker's process would build it.
async fn queue(pool: &PgPool, name: &str) -> PgQueue<String> {
    PgQueue::builder(name)
        .pool(pool.clone())
        .listen(false)
        .lease_duration(Duration::from_secs(600))
        .backoff(Duration::from_secs(60), Duration::from_secs(600))
        .token_bucket(None)
        .build()
        .await
        .unwrap()
}

fn dashboard(server: &PgServer, config: Config) -> axum::Router {
    router(
        PgAdmin::new(&url(server))
            .unwrap()
            .application_name("wq-dashboard"),
        config,
    )
}

/// Writes `n` dead letters of queue `name` (`letter-I`, error `boom I`), with `needle` at
/// the indexes `needles`, in one statement.
async fn bury(pool: &PgPool, name: &str, n: i64, needles: &[i64]) {
    sqlx::query(
        "INSERT INTO workqueue_dead (queue, item, reason, stalls, failures)
         SELECT s.id,
                CASE WHEN i = ANY($3) THEN '\"needle\"' ELSE to_jsonb('letter-' || i)::text END,
                'boom ' || i, 5, 2
         FROM workqueue_queues s, generate_series(0, $2 - 1) i WHERE s.name = $1
         ORDER BY i",
    )
    .bind(name)
    .bind(n)
    .bind(needles)
    .execute(pool)
    .await
    .unwrap();
}

/// The server connections the dashboard holds.
async fn dashboard_connections(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'wq-dashboard'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

fn names(all: &serde_json::Value) -> Vec<String> {
    all["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["name"].as_str().unwrap().to_owned())
        .collect()
}

fn find<'a>(all: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    all["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == name)
        .unwrap_or_else(|| panic!("no queue {name} in {all}"))
}

async fn ok(app: &axum::Router, path: &str) -> serde_json::Value {
    let reply = get(app, path).await;
    assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.body);
    reply.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_queue_is_listed_with_its_figures_and_a_malformed_one_as_broken() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let jobs = queue(&admin, "jobs").await;
    jobs.add_all(["a", "b", "c"].map(String::from))
        .await
        .unwrap();
    jobs.add_after("later".to_owned(), Duration::from_secs(600))
        .await
        .unwrap();
    jobs.add_rate_limited("flaky".to_owned()).await.unwrap();
    let held = jobs.try_get().await.unwrap().into_lease().unwrap();
    bury(&admin, "jobs", 2, &[]).await;
    queue(&admin, "idle").await;
    // A queue whose name the library refuses, written by hand: no handle can open it.
    sqlx::query("INSERT INTO workqueue_queues (name) VALUES ($1)")
        .bind("bad\u{1}name")
        .execute(&admin)
        .await
        .unwrap();

    let app = dashboard(&server, Config::default());
    let reply = get(&app, "/api/queues").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(!reply.body.contains(PASSWORD), "{}", reply.body);
    let all = reply.json();
    assert_eq!(names(&all), ["bad\u{1}name", "idle", "jobs"]);
    let q = find(&all, "jobs");
    for (field, want) in [
        ("depth", 2),
        ("delayed", 2),
        ("in_flight", 1),
        ("failing", 1),
        ("failures", 1),
        ("stalled", 0),
        ("dead", 2),
    ] {
        assert_eq!(q[field], want, "{field} in {q}");
    }
    assert_eq!(q["source"], "postgres");
    assert_eq!(q["broken"], serde_json::Value::Null);
    assert_eq!(
        q["adds_total"],
        serde_json::Value::Null,
        "PostgreSQL counts no adds"
    );
    assert!(q["longest_running_s"].as_f64().unwrap() >= 0.0);
    assert_eq!(find(&all, "idle")["depth"], 0);
    let bad = find(&all, "bad\u{1}name");
    assert!(
        bad["broken"]
            .as_str()
            .unwrap()
            .contains("control character"),
        "{bad}"
    );
    let source = &all["sources"][0];
    assert_eq!(
        (source["kind"].clone(), source["up"].clone()),
        (json!("postgres"), json!(true))
    );
    let shown = source["server"].as_str().unwrap();
    assert!(shown.starts_with("postgres://***@127.0.0.1:"), "{shown}");
    // The test server runs with fsync off: the operator is told what that can lose.
    assert!(
        source["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().starts_with("fsync is off")),
        "{source}"
    );

    assert_eq!(ok(&app, "/api/queues/jobs").await["depth"], 2);
    assert_eq!(
        get(&app, "/api/queues/nothing").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(&app, "/api/queues/nothing/items?state=ready")
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    let refused = post(&app, "/api/queues/bad%01name/pause", json!({})).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.body);
    let text = get(&app, "/metrics").await.body;
    for line in [
        "workqueue_depth{name=\"jobs\",source=\"postgres\"} 2",
        "workqueue_dead_letters{name=\"jobs\",source=\"postgres\"} 2",
        "workqueue_broken{name=\"jobs\",source=\"postgres\"} 0",
        "workqueue_dashboard_source_up{source=\"postgres\"} 1",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
    held.done().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_queues_take_at_most_four_connections() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    sqlx::query(
        "WITH new AS (
            INSERT INTO workqueue_queues (name)
            SELECT 'q' || lpad(i::text, 3, '0') FROM generate_series(0, 299) i RETURNING id)
         INSERT INTO workqueue_items (queue, key, item, ready, avail_at, seq)
         SELECT id, workqueue_key('\"x\"'), '\"x\"', true, clock_timestamp(),
                nextval('workqueue_seq')
         FROM new",
    )
    .execute(&admin)
    .await
    .unwrap();
    let app = dashboard(
        &server,
        Config {
            sample_every: Duration::from_millis(100),
            ..Config::default()
        },
    );
    let all = ok(&app, "/api/queues").await;
    assert_eq!(names(&all).len(), 300);
    assert!(
        all["queues"]
            .as_array()
            .unwrap()
            .iter()
            .all(|q| q["depth"] == 1 && q["broken"].is_null())
    );
    // Sixty requests at once, on sixty queues: figures, pages and items.
    let mut tasks = Vec::new();
    for i in 0..60 {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let name = format!("q{:03}", i * 5);
            let path = match i % 3 {
                0 => format!("/api/queues/{name}"),
                1 => format!("/api/queues/{name}/items?state=ready"),
                _ => format!("/api/queues/{name}/item?item=%22x%22"),
            };
            (i, ok(&app, &path).await)
        }));
    }
    for task in tasks {
        let (i, answer) = task.await.unwrap();
        match i % 3 {
            0 => assert_eq!(answer["depth"], 1),
            1 => assert_eq!(answer["items"][0]["item"], "\"x\""),
            _ => assert_eq!(answer["states"], json!(["ready"])),
        }
    }
    let held = dashboard_connections(&admin).await;
    assert!(
        (1..=i64::from(PgAdmin::MAX_CONNECTIONS)).contains(&held),
        "{held} connections"
    );
    // The sampler lists the queues for the charts on the same connections.
    let mut totals = serde_json::Value::Null;
    for _ in 0..50 {
        totals = ok(&app, "/api/history").await["totals"]["postgres"].clone();
        if totals.as_array().is_some_and(|s| !s.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(totals.as_array().unwrap().last().unwrap()["depth"], 300);
    assert!(dashboard_connections(&admin).await <= i64::from(PgAdmin::MAX_CONNECTIONS));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_answers_again_after_postgres_restarts() {
    let Some(mut server) = PgServer::start() else {
        return;
    };
    {
        let admin = admin(&server).await;
        queue(&admin, "jobs")
            .await
            .add("x".to_owned())
            .await
            .unwrap();
        admin.close().await;
    }
    let app = dashboard(&server, Config::default());
    assert_eq!(ok(&app, "/api/queues").await["queues"][0]["depth"], 1);
    assert_eq!(
        ok(&app, "/api/queues/jobs/items?state=ready").await["total"],
        1
    );

    server.kill();
    let asked = Instant::now();
    // A backend of the killed server may still answer a query already on its way for a
    // moment (it notices the postmaster's death between statements): ask until it is down.
    let down = loop {
        let reply = get(&app, "/api/queues").await;
        if reply.status != StatusCode::OK || asked.elapsed() > Duration::from_secs(10) {
            break reply;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!(
        "the dashboard said the server was down in {:?}",
        asked.elapsed()
    );
    assert_eq!(
        down.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        down.body
    );
    let body = down.json();
    assert_eq!(body["sources"][0]["up"], false);
    assert!(body["sources"][0]["down_since_ms"].as_u64().is_some());
    assert!(!down.body.contains(PASSWORD));
    for path in ["/api/queues/jobs", "/api/queues/jobs/items?state=ready"] {
        assert_eq!(
            get(&app, path).await.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{path}"
        );
    }

    server.restart();
    let restarted = Instant::now();
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
    assert_eq!(
        ok(&app, "/api/queues/jobs/items?state=ready").await["total"],
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_dead_letters_are_paged_from_both_ends_searched_and_purged() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let dl = queue(&admin, "dl").await;
    const N: i64 = 1_000_000;
    let started = Instant::now();
    bury(&admin, "dl", N, &[123_456, N - 10]).await;
    eprintln!("wrote {N} dead letters in {:?}", started.elapsed());
    let app = dashboard(&server, Config::default());
    let page = |path: String| {
        let app = app.clone();
        async move { ok(&app, &path).await }
    };
    let items = |page: &serde_json::Value| -> Vec<String> {
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["item"].as_str().unwrap().to_owned())
            .collect()
    };

    // From the oldest, and on from its cursor.
    let first = page("/api/queues/dl/items?state=dead&limit=50".into()).await;
    // The count stops at the cap, and says so: "10,000+" on the page.
    let cap = PgAdmin::DEFAULT_COUNT_CAP;
    assert_eq!(
        (&first["total"], &first["capped_at"]),
        (&json!(cap + 1), &json!(cap))
    );
    assert_eq!(items(&first)[0], "\"letter-0\"");
    assert_eq!(first["items"][0]["dead"]["error"], "boom 0");
    assert_eq!(first["items"][0]["dead"]["stalls"], 5);
    let next = first["next"].as_str().unwrap();
    let second = page(format!(
        "/api/queues/dl/items?state=dead&limit=50&cursor={next}"
    ))
    .await;
    assert_eq!(items(&second)[0], "\"letter-50\"");
    // From the newest, and on.
    let started = Instant::now();
    let newest = page("/api/queues/dl/items?state=dead&from=last&limit=50".into()).await;
    eprintln!("the newest page of {N} in {:?}", started.elapsed());
    assert_eq!(items(&newest)[0], format!("\"letter-{}\"", N - 1));
    let next = newest["next"].as_str().unwrap();
    let older = page(format!(
        "/api/queues/dl/items?state=dead&from=last&limit=50&cursor={next}"
    ))
    .await;
    assert_eq!(items(&older)[0], format!("\"letter-{}\"", N - 51));
    // A cursor of another state is a bad request, not a failure.
    let bad = get(
        &app,
        &format!("/api/queues/dl/items?state=ready&cursor={next}"),
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);

    // A search reads a bounded stretch per call: from the newest, the needle near that end
    // comes at once; from the oldest, the one at 123,456 after pages that say "go on".
    let found = page("/api/queues/dl/items?state=dead&from=last&q=NEEDLE".into()).await;
    assert_eq!(items(&found), ["\"needle\""]);
    assert_eq!(
        found["items"][0]["dead"]["error"],
        format!("boom {}", N - 10)
    );
    let mut cursor = String::new();
    let mut calls = 0;
    let hit = loop {
        calls += 1;
        let p = page(format!(
            "/api/queues/dl/items?state=dead&q=needle&cursor={cursor}"
        ))
        .await;
        if let Some(hit) = p["items"].as_array().unwrap().first() {
            break hit.clone();
        }
        cursor = p["next"].as_str().expect("more to search").to_owned();
    };
    assert_eq!(hit["dead"]["error"], "boom 123456");
    assert!(calls > 20, "{calls} bounded calls to reach row 123,456");

    // The needle's detail lists both its letters; requeued by id once.
    let detail = page("/api/queues/dl/item?item=%22needle%22".into()).await;
    assert_eq!(detail["states"], json!(["dead"]));
    assert_eq!(detail["dead_letters"].as_array().unwrap().len(), 2);
    let id = hit["dead"]["id"].as_str().unwrap();
    let requeued = post(
        &app,
        "/api/queues/dl/dead-letters/requeue",
        json!({ "id": id }),
    )
    .await;
    assert_eq!(requeued.json()["changed"], 1, "{}", requeued.body);
    let again = post(
        &app,
        "/api/queues/dl/dead-letters/requeue",
        json!({ "id": id }),
    )
    .await;
    assert_eq!(again.json()["changed"], 0);
    let detail = page("/api/queues/dl/item?item=%22needle%22".into()).await;
    assert_eq!(detail["states"], json!(["ready", "dead"]));

    // The purge of the rest runs in steps: the dashboard answers meanwhile.
    let purge = {
        let app = app.clone();
        tokio::spawn(
            async move { post(&app, "/api/queues/dl/dead-letters/purge", json!({})).await },
        )
    };
    let started = Instant::now();
    let mut answered_meanwhile = 0;
    while !purge.is_finished() {
        let reply = get(&app, "/api/queues/dl").await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        answered_meanwhile += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let purged = purge.await.unwrap();
    eprintln!(
        "purged in {:?}, {answered_meanwhile} look(s) answered meanwhile",
        started.elapsed()
    );
    assert_eq!(purged.json()["changed"], N - 1, "{}", purged.body);
    assert_eq!(
        purged.json()["message"],
        format!("purged {} dead letters", N - 1)
    );
    assert!(answered_meanwhile >= 1);
    let again = post(&app, "/api/queues/dl/dead-letters/purge", json!({})).await;
    assert_eq!(again.json()["changed"], 0);
    assert_eq!(dl.stats(1).await.unwrap().summary.dead, 0);
    assert_eq!(dl.len().await.unwrap(), 1, "the requeued needle");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_items_detail_and_every_action_idempotent_saying_what_it_did() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let q = queue(&admin, "ops").await;
    let failing = queue(&admin, "failing").await;
    q.add_all(["a", "b"].map(String::from)).await.unwrap();
    q.add_after("later".to_owned(), Duration::from_secs(3600))
        .await
        .unwrap();
    let app = dashboard(&server, Config::default());
    let act = |queue: &str, verb: &str, body: serde_json::Value| {
        let app = app.clone();
        let path = format!("/api/queues/{queue}/{verb}");
        async move {
            let reply = post(&app, &path, body).await;
            assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.body);
            let answer = reply.json();
            (
                answer["changed"].as_u64().unwrap(),
                answer["message"].as_str().unwrap().to_owned(),
            )
        }
    };
    let said = |changed: u64, message: &str| (changed, message.to_owned());
    let item = |name: &str| json!({ "item": format!("\"{name}\"") });

    // The detail of a ready item: its place in line.
    let detail = ok(&app, "/api/queues/ops/item?item=%22b%22").await;
    assert_eq!(detail["states"], json!(["ready"]));
    assert_eq!(
        (detail["position"].clone(), detail["priority"].clone()),
        (json!(1), json!(0))
    );

    // Retry now: a delayed item is queued, once.
    let retry = |queue: &'static str, name: &'static str| act(queue, "items/retry", item(name));
    assert_eq!(retry("ops", "later").await, said(1, "queued now"));
    assert_eq!(retry("ops", "later").await, said(0, "already queued"));
    assert_eq!(q.len().await.unwrap(), 3);
    let not_json = post(
        &app,
        "/api/queues/ops/items/retry",
        json!({"item": "not json"}),
    )
    .await;
    assert_eq!(not_json.status, StatusCode::BAD_REQUEST);

    // A failing item: its retry is queued now; done, it is failing only, and "retry now"
    // queues it again (its failures stay); remove takes it out and clears them.
    failing.add_rate_limited("flaky".to_owned()).await.unwrap();
    assert_eq!(retry("failing", "flaky").await, said(1, "queued now"));
    let lease = failing.try_get().await.unwrap().into_lease().unwrap();
    lease.done().await.unwrap();
    let detail = ok(&app, "/api/queues/failing/item?item=%22flaky%22").await;
    assert_eq!(detail["states"], json!(["failing"]));
    assert_eq!(detail["failures"], 1);
    assert_eq!(retry("failing", "flaky").await, said(1, "queued now"));
    assert_eq!(retry("failing", "flaky").await, said(0, "already queued"));
    assert_eq!(
        failing.num_requeues("flaky".to_owned()).await.unwrap(),
        1,
        "a retry keeps the failures"
    );
    assert_eq!(
        act("failing", "items/remove", item("flaky")).await,
        said(1, "taken out of the queue; its failure count is cleared")
    );
    assert_eq!(
        act("failing", "items/remove", item("flaky")).await,
        said(0, "not in the queue")
    );
    assert_eq!(failing.num_requeues("flaky".to_owned()).await.unwrap(), 0);
    assert_eq!(failing.len().await.unwrap(), 0);
    let missing = post(&app, "/api/queues/ops/items/remove", json!({})).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);

    // A leased item with a delayed re-add: queued again when its lease ends, once. Its
    // detail shows the lease's token. Remove drops the re-add and keeps the lease.
    let lease = q.try_get().await.unwrap().into_lease().unwrap();
    assert_eq!(lease.item(), "a");
    q.add_after("a".to_owned(), Duration::from_secs(3600))
        .await
        .unwrap();
    let detail = ok(&app, "/api/queues/ops/item?item=%22a%22").await;
    assert_eq!(detail["states"], json!(["in_flight"]));
    assert_eq!(detail["lease"]["token"], lease.token());
    assert_eq!(detail["readded"], false);
    assert_eq!(
        retry("ops", "a").await,
        said(1, "queued again when its current lease ends")
    );
    assert_eq!(retry("ops", "a").await, said(0, "already queued"));
    assert_eq!(
        ok(&app, "/api/queues/ops/item?item=%22a%22").await["readded"],
        true
    );
    assert_eq!(
        act("ops", "items/remove", item("a")).await,
        said(
            1,
            "its pending re-add is dropped (the lease stays with its holder)"
        )
    );
    assert_eq!(
        act("ops", "items/remove", item("a")).await,
        said(
            0,
            "being processed with nothing pending: the lease stays with its holder"
        )
    );
    lease.done().await.unwrap();
    assert_eq!(
        act("ops", "items/remove", item("b")).await,
        said(1, "taken out of the queue")
    );
    assert_eq!(q.len().await.unwrap(), 1, "later");

    // Forget.
    q.add_rate_limited("f".to_owned()).await.unwrap();
    q.add_rate_limited("f".to_owned()).await.unwrap();
    assert_eq!(
        act("ops", "forget", item("f")).await,
        said(1, "cleared 2 failures")
    );
    assert_eq!(
        act("ops", "forget", item("f")).await,
        said(0, "no failures to clear")
    );

    // Dead letters: one requeued by id, then deleting it finds nothing; another deleted once;
    // one requeued by its item; the rest requeued together, then nothing is left to requeue.
    bury(&admin, "ops", 5, &[]).await;
    let dead = ok(&app, "/api/queues/ops/items?state=dead").await;
    let id = |i: usize| json!({ "id": dead["items"][i]["dead"]["id"].as_str().unwrap() });
    assert_eq!(
        act("ops", "dead-letters/requeue", id(0)).await,
        said(1, "requeued the dead letter")
    );
    let gone = "no such dead letter (requeued or deleted already)";
    assert_eq!(
        act("ops", "dead-letters/delete", id(0)).await,
        said(0, gone)
    );
    assert_eq!(
        act("ops", "dead-letters/delete", id(1)).await,
        said(1, "deleted the dead letter")
    );
    assert_eq!(
        act("ops", "dead-letters/delete", id(1)).await,
        said(0, gone)
    );
    assert_eq!(
        act("ops", "dead-letters/requeue", item("letter-2")).await,
        said(1, "requeued the dead letter")
    );
    let bad_id = post(
        &app,
        "/api/queues/ops/dead-letters/delete",
        json!({"id": "x"}),
    )
    .await;
    assert_eq!(bad_id.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        act("ops", "dead-letters/requeue-all", json!({})).await,
        said(2, "requeued 2 dead letters")
    );
    assert_eq!(
        act("ops", "dead-letters/requeue-all", json!({})).await,
        said(0, "requeued 0 dead letters")
    );
    assert_eq!(q.stats(1).await.unwrap().summary.dead, 0);

    // Pause and resume, each once; while shut down, dead letters stay and retries do nothing.
    assert_eq!(act("ops", "pause", json!({})).await, said(1, "paused"));
    assert_eq!(
        act("ops", "pause", json!({})).await,
        said(0, "already paused")
    );
    assert!(q.is_paused().await.unwrap());
    assert_eq!(act("ops", "resume", json!({})).await, said(1, "resumed"));
    assert_eq!(
        act("ops", "resume", json!({})).await,
        said(0, "already running")
    );
    bury(&admin, "ops", 1, &[]).await;
    q.add_after("late".to_owned(), Duration::from_secs(3600))
        .await
        .unwrap();
    q.shut_down_fleet().await.unwrap();
    assert_eq!(
        act("ops", "dead-letters/requeue-all", json!({})).await,
        said(
            0,
            "the queue is shut down: no dead letter was requeued (resume it first)"
        )
    );
    assert_eq!(
        retry("ops", "late").await,
        said(0, "the queue is shut down")
    );
    assert_eq!(q.stats(1).await.unwrap().summary.dead, 1);
    assert_eq!(ok(&app, "/api/queues/ops").await["shut_down"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_queue_beside_a_redis_one_has_the_same_series() {
    let Some(redis) = support::redis_server(&[]) else {
        return;
    };
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let pg = queue(&admin, "orders").await;
    let rq: workq_redis::RedisQueue<String> = workq_redis::RedisQueue::builder("orders")
        .url(redis.url())
        .check_persistence(false)
        .build()
        .await
        .unwrap();
    for (i, item) in ["a", "b", "c"].into_iter().enumerate() {
        pg.add(item.to_owned()).await.unwrap();
        if i < 2 {
            rq.add(item.to_owned()).await.unwrap();
        }
    }
    let app = Dashboard::new(Config::default())
        .source(RedisAdmin::new(&redis.url(), "wq").unwrap())
        .source(
            PgAdmin::new(&url(&server))
                .unwrap()
                .application_name("wq-dashboard"),
        )
        .router()
        .unwrap();
    let all = ok(&app, "/api/queues").await;
    assert_eq!(all["sources"].as_array().unwrap().len(), 2);
    assert_eq!(
        get(&app, "/api/queues/orders").await.status,
        StatusCode::CONFLICT,
        "two queues of that name"
    );
    assert_eq!(
        ok(&app, "/api/queues/orders?source=postgres").await["depth"],
        3
    );
    assert_eq!(
        ok(&app, "/api/queues/orders?source=redis").await["depth"],
        2
    );
    let paused = post(&app, "/api/queues/orders/pause?source=postgres", json!({})).await;
    assert_eq!(paused.json()["changed"], 1, "{}", paused.body);
    assert!(pg.is_paused().await.unwrap() && !rq.is_paused().await.unwrap());

    let text = get(&app, "/metrics").await.body;
    let series = |source: &str| -> std::collections::BTreeSet<String> {
        let label = format!("name=\"orders\",source=\"{source}\"");
        text.lines()
            .filter(|l| !l.starts_with('#') && l.contains(&label))
            .map(|l| l.split('{').next().unwrap().to_owned())
            .collect()
    };
    let on_redis = series("redis");
    let on_postgres = series("postgres");
    // PostgreSQL keeps no running counts of adds, completions and retries; every other
    // series of a Redis queue is there for a PostgreSQL one.
    let counters: std::collections::BTreeSet<String> = [
        "workqueue_adds_total",
        "workqueue_completions_total",
        "workqueue_retries_total",
    ]
    .map(String::from)
    .into();
    assert!(counters.is_subset(&on_redis), "{on_redis:?}");
    assert_eq!(
        on_postgres,
        on_redis.difference(&counters).cloned().collect(),
        "{text}"
    );
    for line in [
        "workqueue_depth{name=\"orders\",source=\"postgres\"} 3",
        "workqueue_paused{name=\"orders\",source=\"postgres\"} 1",
        "workqueue_dashboard_source_up{source=\"postgres\"} 1",
        "workqueue_dashboard_source_up{source=\"redis\"} 1",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
    // Kept for CI's `promtool check metrics`.
    let target = std::env::var("CARGO_TARGET_DIR").map_or_else(
        |_| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"),
        std::path::PathBuf::from,
    );
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("dashboard-metrics-postgres.txt"), &text).unwrap();
}

/// A statement stuck behind a lock is cancelled by the server when the source's
/// `statement_timeout` passes: giving up on the answer is not enough, the query would go on
/// waiting (and holding a connection) on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_stuck_on_the_server_is_cancelled_there() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let pool = admin(&server).await;
    queue(&pool, "locked").await;
    let app = router(
        PgAdmin::new(&url(&server))
            .unwrap()
            .application_name("wq-dashboard")
            .statement_timeout(Duration::from_secs(1)),
        Config::default(),
    );
    assert_eq!(get(&app, "/api/queues").await.status, StatusCode::OK);
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE workqueue_queues IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let reply = get(&app, "/api/queues").await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{}", reply.body);
    assert!(reply.body.contains("statement timeout"), "{}", reply.body);
    assert!(!reply.body.contains(PASSWORD), "{}", reply.body);
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE application_name = 'wq-dashboard' AND state = 'active'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(waiting, 0, "no statement of the dashboard still runs");
    lock.rollback().await.unwrap();
    assert_eq!(get(&app, "/api/queues").await.status, StatusCode::OK);
}

/// A PostgreSQL queue's page carries its groups, its limits and its periodic schedules as a
/// Redis queue's does; a schedule is paused and resumed through the API; `/metrics` has the
/// queue's flow series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queues_page_has_its_groups_limits_and_schedules() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let pool = admin(&server).await;
    let q: PgQueue<String> = PgQueue::builder("tenants")
        .pool(pool.clone())
        .listen(false)
        .lease_duration(Duration::from_secs(600))
        .group_by(support::group_of)
        .max_in_flight_per_group(1)
        .group_weight("quiet", 2)
        .hand_out_rate_per_group(50.0, 5)
        .build()
        .await
        .unwrap();
    for key in ["noisy/a", "noisy/b", "noisy/c", "quiet/a"] {
        q.add(key.to_owned()).await.unwrap();
    }
    let lease = q.try_get().await.unwrap().into_lease().expect("a lease");
    assert_eq!(lease.item(), "noisy/a");
    let now = std::time::SystemTime::now();
    support::schedules(&q, "cron/tick".to_owned(), now).await;
    let app = dashboard(
        &server,
        Config {
            group_series: 5,
            ..Config::default()
        },
    );

    let page = get(&app, "/api/queues/tenants").await.json();
    assert_eq!(
        page["flow"],
        json!({"groups_ready": 3, "groups_saturated": 1, "groups": 3}),
        "{page}"
    );
    let groups: Vec<(&str, u64, u64)> = page["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["name"].as_str().unwrap(),
                g["ready"].as_u64().unwrap(),
                g["in_flight"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(groups, [("noisy", 2, 1), ("cron", 1, 0), ("quiet", 1, 0)]);
    assert!(
        page["groups"][0]["oldest_ready_s"].as_f64().is_some(),
        "{page}"
    );
    assert_eq!(
        page["limits_described"],
        json!([
            ["groups", "by the queue's group function, taking turns"],
            ["in flight per group", "at most 1"],
            ["weights", "quiet: 2 (the others: 1)"],
            ["hand-out rate per group", "50/s, burst 5"],
        ])
    );
    let schedules = page["schedules"].as_array().unwrap();
    assert_eq!(schedules.len(), 2, "{page}");
    assert_eq!(schedules[1]["name"], "nightly");
    assert_eq!(schedules[1]["time_zone"], "Europe/Paris");
    assert_eq!(schedules[0]["name"], "minutely");
    assert!(schedules[0]["last_tick_ms"].as_u64().is_some(), "{page}");

    let nightly = json!({"schedule": "nightly"});
    let reply = post(&app, "/api/queues/tenants/schedules/pause", nightly.clone()).await;
    assert_eq!(reply.json()["changed"], 1, "{}", reply.body);
    let listed = q.schedules().await.unwrap();
    assert!(listed[1].paused, "{listed:?}");
    let reply = post(
        &app,
        "/api/queues/tenants/schedules/resume",
        nightly.clone(),
    )
    .await;
    assert_eq!(reply.json()["changed"], 1, "{}", reply.body);
    let reply = post(&app, "/api/queues/tenants/schedules/resume", nightly).await;
    assert_eq!(reply.json()["changed"], 0, "{}", reply.body);

    let text = get(&app, "/metrics").await.body;
    for line in [
        "workqueue_groups_ready{name=\"tenants\",source=\"postgres\"} 3",
        "workqueue_group_saturated{name=\"tenants\",source=\"postgres\"} 1",
        "workqueue_group_depth{name=\"tenants\",source=\"postgres\",group=\"noisy\"} 2",
        "workqueue_group_in_flight{name=\"tenants\",source=\"postgres\",group=\"noisy\"} 1",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
    lease.done().await.unwrap();
}
