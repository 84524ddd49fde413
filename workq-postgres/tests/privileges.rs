//! Production SQL is production: a worker runs with the least privileges the README lists
//! (the schema installed once by its owner), no SQL function has a switch for the fault tests'
//! bugs, and every function keeps its own search_path, so objects a session puts before the
//! queue's (a temporary table) change nothing. Also: names and items the queue takes or
//! refuses.

mod support;

use std::time::Duration;

use serde_json::json;
use sqlx::Executor;
use sqlx::postgres::PgPoolOptions;
use support::{PgServer, unique};
use workq_postgres::{Error, MAX_NAME_BYTES, PgQueue};

/// The grants of the README's "Least privileges" list, for the role `worker`.
const GRANTS: &str = "
    CREATE ROLE worker LOGIN;
    GRANT USAGE ON SCHEMA public TO worker;
    GRANT SELECT, INSERT, UPDATE, DELETE ON workqueue_queues, workqueue_items,
        workqueue_failures, workqueue_dead TO worker;
    GRANT SELECT ON workqueue_migrations TO worker;
    GRANT USAGE ON SEQUENCE workqueue_seq TO worker;
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_role_with_the_listed_grants_runs_the_queue() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let owner = PgPoolOptions::new()
        .max_connections(2)
        .connect(&server.url())
        .await
        .unwrap();
    PgQueue::<String>::migrate(&owner).await.unwrap();
    owner.execute(GRANTS).await.unwrap();
    let worker_url = server.url().replace("postgres@", "worker@");
    let name = unique("least");
    for migrate in [false, true] {
        // With migrate(true) the schema is current, so it is only read.
        let q: PgQueue<String> = PgQueue::builder(name.clone())
            .url(&worker_url)
            .migrate(migrate)
            .lease_duration(Duration::from_millis(600))
            .renew_every(Duration::from_millis(100))
            .build()
            .await
            .unwrap();
        q.add_all(["a", "b"].map(String::from)).await.unwrap();
        q.add_after("c".to_owned(), Duration::from_millis(10))
            .await
            .unwrap();
        q.add_rate_limited("a".to_owned()).await.unwrap();
        assert_eq!(q.num_requeues("a".to_owned()).await.unwrap(), 1);
        q.forget("a".to_owned()).await.unwrap();
        let lease = q.get().await.unwrap().unwrap();
        // Held past its duration: renewals work.
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert!(!lease.is_lost());
        let next = q.done_and_get(lease, true).await.unwrap().unwrap();
        next.done().await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        while let Some(lease) = q.try_get().await.unwrap().into_lease() {
            lease.done().await.unwrap();
        }
        assert!(q.pause().await.unwrap());
        assert!(q.resume().await.unwrap());
        q.stats(10).await.unwrap();
        q.dead_letters(workq::admin::End::Last, 10).await.unwrap();
        q.requeue_dead_letters().await.unwrap();
        q.purge_dead_letters().await.unwrap();
        q.shut_down_fleet().await.unwrap();
        q.resume_fleet().await.unwrap();
        q.delete().await.unwrap();
    }
    // The worker cannot change the schema.
    let worker = PgPoolOptions::new()
        .max_connections(1)
        .connect(&worker_url)
        .await
        .unwrap();
    assert!(worker.execute("DROP TABLE workqueue_items").await.is_err());
    assert!(
        worker
            .execute("CREATE OR REPLACE FUNCTION workqueue_key(x text) RETURNS bytea LANGUAGE sql RETURN NULL")
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_not_installed_is_reported_to_a_process_that_may_not_install_it() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let built = PgQueue::<String>::builder("nothing-yet")
        .url(server.url())
        .migrate(false)
        .build()
        .await;
    let Err(Error::Migrate(message)) = built else {
        panic!("expected a migration error, got {built:?}");
    };
    assert!(message.contains("PgQueue::migrate"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_has_no_fault_switch_and_every_function_keeps_its_search_path() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let q: PgQueue<String> = PgQueue::builder(unique("sql"))
        .url(server.url())
        .build()
        .await
        .unwrap();
    let admin = q.pool();
    // Pinned: a search_path of its own, or a SQL-standard body (bound at creation).
    let (functions, switches, unpinned): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*),
                count(*) FILTER (WHERE 'mutations' = ANY(coalesce(proargnames, '{}'))),
                count(*) FILTER (WHERE prosqlbody IS NULL AND NOT EXISTS (
                    SELECT 1 FROM unnest(coalesce(proconfig, '{}')) c
                    WHERE c LIKE 'search_path=pg_catalog, public, pg_temp%'))
         FROM pg_proc WHERE proname LIKE 'workqueue\\_%'",
    )
    .fetch_one(admin)
    .await
    .unwrap();
    assert!(functions >= 8, "{functions} functions");
    assert_eq!(switches, 0, "a function takes the fault tests' switches");
    assert_eq!(unpinned, 0, "a function without a fixed search_path");

    // A session whose temporary tables would come first in its search_path: the queue's
    // functions still use the queue's tables.
    let mut conn = admin.acquire().await.unwrap();
    conn.execute(
        "CREATE TEMP TABLE workqueue_items (LIKE public.workqueue_items INCLUDING ALL);
         CREATE TEMP TABLE workqueue_queues (LIKE public.workqueue_queues INCLUDING ALL)",
    )
    .await
    .unwrap();
    q.add_in(&mut conn, "x".to_owned()).await.unwrap();
    let shadowed: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_temp.workqueue_items")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(shadowed, 0);
    drop(conn);
    let lease = q
        .try_get()
        .await
        .unwrap()
        .into_lease()
        .expect("queued for real");
    assert_eq!(lease.item(), "x");
    lease.done().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_over_the_limit_are_refused_at_build_and_items_of_any_size_round_trip() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let build = |name: String| {
        PgQueue::<serde_json::Value>::builder(name)
            .url(server.url())
            .build()
    };
    for bad in [
        String::new(),
        "n".repeat(MAX_NAME_BYTES + 1),
        "é".repeat(MAX_NAME_BYTES / 2 + 1),
        "tab\there".to_owned(),
        "nul\0here".to_owned(),
    ] {
        match build(bad.clone()).await {
            Err(Error::Config(message)) => assert!(!message.is_empty()),
            other => panic!("{:?}: expected a config error, got {other:?}", bad.len()),
        }
    }
    let q = build("q".repeat(MAX_NAME_BYTES)).await.unwrap();
    // Items the old schema could not index (over 2,704 bytes), up to 100 kB of JSON.
    let small = json!({"key": "default/web-0"});
    let three_kb = json!({"name": "x".repeat(3000)});
    let big = json!({
        "spec": (0..2000).map(|i| json!({"i": i, "text": "payload-payload-payload-payload"})).collect::<Vec<_>>(),
    });
    assert!(serde_json::to_string(&big).unwrap().len() > 100_000);
    for item in [&small, &three_kb, &big] {
        q.add(item).await.unwrap();
        q.add(item).await.unwrap(); // deduplicated by its hash
    }
    assert_eq!(q.len().await.unwrap(), 3);
    for want in [&small, &three_kb, &big] {
        let lease = q.try_get().await.unwrap().into_lease().unwrap();
        assert_eq!(lease.item(), want);
        lease.done().await.unwrap();
    }
    // Items differing past the old limit are different items.
    let a = json!({"name": format!("{}a", "x".repeat(5000))});
    let b = json!({"name": format!("{}b", "x".repeat(5000))});
    q.add_all([&a, &b]).await.unwrap();
    assert_eq!(q.len().await.unwrap(), 2);
}
