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
use workq::admin::{Admin, AdminError, End, ItemState, PageQuery, Retried};
use workq_postgres::{Error, MAX_NAME_BYTES, PgAdmin, PgQueue};

/// The grants of the README's "Least privileges" list, for the role `worker`.
const GRANTS: &str = "
    CREATE ROLE worker LOGIN;
    GRANT USAGE ON SCHEMA public TO worker;
    GRANT SELECT, INSERT, UPDATE, DELETE ON workqueue_queues, workqueue_items,
        workqueue_failures, workqueue_dead TO worker;
    GRANT SELECT ON workqueue_migrations TO worker;
    GRANT USAGE ON SEQUENCE workqueue_seq TO worker;
";

/// The schema's owner's pool on `server`, the schema installed and the worker role made with
/// the listed grants.
async fn installed(server: &PgServer) -> sqlx::PgPool {
    let owner = PgPoolOptions::new()
        .max_connections(2)
        .connect(&server.url())
        .await
        .unwrap();
    PgQueue::<String>::migrate(&owner).await.unwrap();
    owner.execute(GRANTS).await.unwrap();
    owner
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_role_with_the_listed_grants_runs_the_queue() {
    let Some(server) = PgServer::start() else {
        return;
    };
    installed(&server).await;
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
        q.dead_letters(End::Last, 10).await.unwrap();
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

/// The grants of the operator role (docs/postgres.md, "Least privileges"), for the role
/// `operator`: what `PgAdmin` (the dashboard, `wq queue`) needs, and no more.
const OPERATOR_GRANTS: &str = "
    CREATE ROLE operator LOGIN;
    GRANT USAGE ON SCHEMA public TO operator;
    GRANT SELECT ON workqueue_queues, workqueue_items, workqueue_failures, workqueue_dead,
        workqueue_migrations TO operator;
    GRANT UPDATE (paused, shut_down) ON workqueue_queues TO operator;
    GRANT INSERT, UPDATE, DELETE ON workqueue_items TO operator;
    GRANT DELETE ON workqueue_failures, workqueue_dead TO operator;
    GRANT USAGE ON SEQUENCE workqueue_seq TO operator;
";

/// Puts items of queue `name` in every state, as the schema's owner: ready `ready`,
/// delayed `later`, failing and delayed an hour `failed`, failing and in no other state
/// `lone`, leased `held` (the lease is returned), and two dead letters.
async fn every_state(server: &PgServer, name: &str) -> workq_postgres::Lease<String> {
    let q: PgQueue<String> = PgQueue::builder(name)
        .url(server.url())
        .backoff(Duration::from_secs(3600), Duration::from_secs(7200))
        .token_bucket(None)
        .build()
        .await
        .unwrap();
    let any: PgQueue<serde_json::Value> = PgQueue::builder(name)
        .url(server.url())
        .build()
        .await
        .unwrap();
    for letter in [json!({"letter": 1}), json!({"letter": 2})] {
        any.add(letter).await.unwrap();
        assert!(q.try_get().await.unwrap().into_lease().is_none());
    }
    q.add("held".to_owned()).await.unwrap();
    let held = q.get().await.unwrap().unwrap();
    q.add_rate_limited("lone".to_owned()).await.unwrap();
    assert_eq!(q.retry_now("\"lone\"").await.unwrap(), Retried::Queued);
    let lone = q.get().await.unwrap().unwrap();
    assert_eq!(lone.item(), "lone");
    lone.done().await.unwrap();
    q.add("ready".to_owned()).await.unwrap();
    q.add_after("later".to_owned(), Duration::from_secs(3600))
        .await
        .unwrap();
    q.add_rate_limited("failed".to_owned()).await.unwrap();
    held
}

/// Everything `PgAdmin` does, as the role of `url`, on the queue `every_state` filled.
async fn operate(url: &str, name: &str) {
    let admin = PgAdmin::new(url).unwrap();
    let listed = Admin::queues(&admin).await.unwrap();
    assert!(listed.iter().any(|q| q.name == name));
    let s = Admin::summary(&admin, name).await.unwrap();
    assert_eq!(
        (s.depth, s.delayed, s.in_flight, s.failing, s.dead),
        (1, 2, 1, 2, 2),
        "{s:?}"
    );
    let stats = admin.stats(name, 10).await.unwrap();
    assert_eq!(stats.leases.len(), 1);
    for state in ItemState::ALL {
        admin.page(name, &PageQuery::new(state, 10)).await.unwrap();
    }
    let held = admin.item_detail(name, "\"held\"").await.unwrap().unwrap();
    assert_eq!(held.states, [ItemState::InFlight]);

    assert_eq!(admin.pause(name).await, Ok(true));
    assert_eq!(admin.resume(name).await, Ok(true));
    assert_eq!(admin.shut_down_fleet(name).await, Ok(true));
    assert_eq!(
        admin.requeue_dead_letters(name).await,
        Err(AdminError::ShutDown)
    );
    assert_eq!(admin.resume_fleet(name).await, Ok(true));

    assert_eq!(
        admin.retry_now(name, "\"later\"").await,
        Ok(Retried::Queued)
    );
    // Known by its failure count only: added as an add would.
    assert_eq!(admin.retry_now(name, "\"lone\"").await, Ok(Retried::Queued));
    assert_eq!(admin.forget(name, "\"failed\"").await, Ok(1));
    let removed = admin.remove(name, "\"ready\"").await.unwrap();
    assert!(removed.queued, "{removed:?}");

    let letters = admin.dead_letters(name, End::First, 10).await.unwrap();
    assert_eq!(letters.len(), 2);
    assert_eq!(
        admin.requeue_dead_letter_by_id(name, &letters[0].id).await,
        Ok(true)
    );
    assert_eq!(
        admin.delete_dead_letter_by_id(name, &letters[1].id).await,
        Ok(true)
    );
    assert_eq!(admin.requeue_dead_letters(name).await, Ok(0));
    assert_eq!(admin.purge_dead_letters(name).await, Ok(0));
    let s = Admin::summary(&admin, name).await.unwrap();
    assert_eq!(
        (s.depth, s.delayed, s.in_flight, s.failing, s.dead),
        (3, 1, 1, 1, 0),
        "later, lone and a letter's item ready; failed delayed; held; lone failing"
    );
}

/// An operator-role login runs every call of `PgAdmin`; it cannot create or delete a queue,
/// count a failure, write a dead letter, change what a queue holds other than by the
/// operator's calls, or change the schema. The worker role runs every call of `PgAdmin`
/// too: on PostgreSQL no action is an operator's only (a worker's handle has `pause`,
/// `requeue_dead_letters` and the rest), so the roles differ by what the operator cannot do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_role_with_the_listed_grants_runs_pg_admin_and_nothing_more() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let owner = installed(&server).await;
    owner.execute(OPERATOR_GRANTS).await.unwrap();
    let operator_url = server.url().replace("postgres@", "operator@");
    let worker_url = server.url().replace("postgres@", "worker@");
    for url in [&operator_url, &worker_url] {
        let name = unique("operated");
        let held = every_state(&server, &name).await;
        operate(url, &name).await;
        held.done().await.unwrap();
    }

    let name = unique("guarded");
    let _held = every_state(&server, &name).await;
    let denied = |answer: Result<(), Error>, what: &str| match answer {
        Err(e) => assert!(
            ["permission denied", "must be owner"]
                .iter()
                .any(|refusal| e.to_string().contains(refusal)),
            "{what}: {e}"
        ),
        Ok(()) => panic!("{what}: the operator role may not"),
    };
    // A queue the database does not have is not made.
    let made = PgQueue::<String>::builder(unique("new"))
        .url(&operator_url)
        .migrate(false)
        .build()
        .await;
    denied(made.map(drop), "create a queue");
    let q: PgQueue<String> = PgQueue::builder(name.as_str())
        .url(&operator_url)
        .migrate(false)
        .create(false)
        .listen(false)
        .build()
        .await
        .unwrap();
    denied(
        q.add_rate_limited("ready".to_owned()).await.map(drop),
        "count a failure",
    );
    denied(q.delete().await, "delete a queue");
    let operator = PgPoolOptions::new()
        .max_connections(1)
        .connect(&operator_url)
        .await
        .unwrap();
    for (sql, what) in [
        (
            "UPDATE workqueue_queues SET dead_dropped = 0",
            "rewrite a queue's figures",
        ),
        (
            "INSERT INTO workqueue_dead (queue, item, reason, stalls, failures)
             SELECT id, '1', 'x', 0, 0 FROM workqueue_queues",
            "write a dead letter",
        ),
        (
            "UPDATE workqueue_failures SET failures = 0",
            "rewrite a failure count",
        ),
        ("DROP TABLE workqueue_items", "change the schema"),
        ("CREATE TABLE workqueue_extra (x int)", "add to the schema"),
    ] {
        denied(
            operator.execute(sql).await.map(drop).map_err(Error::from),
            what,
        );
    }
    // What it may do, it does through the admin's calls: a switch, a removal.
    let admin = PgAdmin::new(&operator_url).unwrap();
    assert_eq!(admin.pause(&name).await, Ok(true));
}

/// The grants flow control adds (docs/postgres.md, "Least privileges"): a worker's, which
/// writes the settings at build and keeps the groups, and an operator's, which reads them and
/// announces the items it queues again to their groups.
const FLOW_GRANTS: &str = "
    GRANT SELECT, INSERT, UPDATE, DELETE ON workqueue_flow, workqueue_group_settings,
        workqueue_groups, workqueue_arrivals TO worker;
    GRANT SELECT ON workqueue_flow, workqueue_group_settings, workqueue_groups TO operator;
    GRANT SELECT, INSERT ON workqueue_arrivals TO operator;
";

/// A worker role with the listed grants and flow control's runs a queue under flow control
/// (it writes the settings at build, adds, hands out, ends leases, takes flow control off,
/// deletes the queue's contents); an operator role with its grants and flow control's reads the groups and the
/// limits, and queues a delayed item and a dead letter again into their groups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_and_operator_roles_with_the_listed_grants_run_flow_control() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let owner = installed(&server).await;
    owner.execute(OPERATOR_GRANTS).await.unwrap();
    owner.execute(FLOW_GRANTS).await.unwrap();
    let worker_url = server.url().replace("postgres@", "worker@");
    let name = unique("least-flow");
    let q: PgQueue<String> = PgQueue::builder(name.clone())
        .url(&worker_url)
        .migrate(false)
        .group_by(|item: &String| item.split_once('/').map_or("", |(g, _)| g).to_owned())
        .max_in_flight_per_group(1)
        .max_in_flight(4)
        .hand_out_rate(1000.0, 100)
        .group_weight("heavy", 2)
        .build()
        .await
        .unwrap();
    q.add_all(["a/1", "a/2", "b/1"].map(String::from))
        .await
        .unwrap();
    q.add_after("c/later".to_owned(), Duration::from_secs(3600))
        .await
        .unwrap();
    let a1 = q.get().await.unwrap().unwrap();
    let b1 = q.get().await.unwrap().unwrap();
    assert_eq!((a1.item().as_str(), b1.item().as_str()), ("a/1", "b/1"));
    assert!(q.try_get().await.unwrap().is_empty(), "a is at its limit");
    a1.done().await.unwrap();
    drop(b1);
    let admin = PgAdmin::new(&server.url().replace("postgres@", "operator@")).unwrap();
    let stats = admin.stats(&name, 10).await.unwrap();
    assert_eq!(stats.limits.unwrap().max_in_flight, Some(4));
    assert_eq!(stats.flow.unwrap().groups_ready, 2);
    assert_eq!(
        admin.retry_now(&name, "\"c/later\"").await.unwrap(),
        Retried::Queued
    );
    // A dead letter keeps its item's group, and goes back into it.
    sqlx::query(
        "INSERT INTO workqueue_dead (queue, item, reason, stalls, failures, grp)
         SELECT id, '\"d/buried\"', 'stalled', 5, 0, 'd' FROM workqueue_queues WHERE name = $1",
    )
    .bind(&name)
    .execute(&owner)
    .await
    .unwrap();
    assert_eq!(admin.requeue_dead_letters(&name).await.unwrap(), 1);
    let stats = admin.stats(&name, 10).await.unwrap();
    assert!(
        stats.groups.iter().any(|g| g.name == "d"),
        "{:?}",
        stats.groups
    );
    let mut seen = Vec::new();
    while let Some(lease) = q.try_get().await.unwrap().into_lease() {
        seen.push(lease.item().clone());
        lease.done().await.unwrap();
    }
    seen.sort();
    assert_eq!(seen, ["a/2", "b/1", "c/later", "d/buried"]);
    assert!(q.clear_flow_control().await.unwrap());
    q.delete().await.unwrap();
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
