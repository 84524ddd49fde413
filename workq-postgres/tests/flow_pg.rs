//! Flow control on PostgreSQL beyond the shared rules (`tests/flow.rs`): limits held across
//! handles on separate pools (as separate processes), an expired lease that frees its group's
//! slot, limits never exceeded under concurrent getters with leases expiring (checked in the
//! database, all along), a server restart between a hand-out and its done, groups forgotten
//! once they hold nothing, the settings written by the last handle built with some (and
//! followed by one built without), flow control coming on and going off with the items kept,
//! every lease counting, turned on while an add is in a transaction, a typed handle's
//! `retry_now`, a batch's priorities, and the operator's view: as on Redis
//! (`workq-redis/tests/flow_redis.rs`) where the two share a rule.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use support::{PgServer, unique};
use workq::Workers;
use workq::admin::Admin;
use workq_conformance::flow::group_of;
use workq_postgres::{Builder, Error, PgAdmin, PgQueue};

/// A handle on queue `name` with a pool of its own, as another process would have, grouping
/// `"group/name"` items. Getters poll every 60 s, and leases last a minute (a getter's sweep
/// comes every 15 s): a getter served within 5 s was woken.
fn handle(server: &PgServer, name: &str) -> Builder<String> {
    PgQueue::builder(name)
        .url(server.url())
        .max_connections(4)
        .lease_duration(Duration::from_secs(60))
        .poll_interval(Duration::from_secs(60))
        .group_by(|item: &String| group_of(item).to_owned())
}

async fn add_all(queue: &PgQueue<String>, items: &[&str]) {
    for item in items {
        queue.add((*item).to_owned()).await.unwrap();
    }
}

/// The next lease, within 10 s.
async fn next(queue: &PgQueue<String>) -> workq_postgres::Lease<String> {
    tokio::time::timeout(Duration::from_secs(10), queue.get())
        .await
        .expect("a get that must be served was not")
        .unwrap()
        .expect("not shut down")
}

/// A handle on queue `name` built without any flow setting, as a producer without `group_by`
/// (or a process of an older version) would have.
async fn plain(server: &PgServer, name: &str) -> PgQueue<String> {
    PgQueue::builder(name)
        .url(server.url())
        .build()
        .await
        .unwrap()
}

/// Takes every item ready now, one by one, each done at once; returns them in order.
async fn drain(queue: &PgQueue<String>) -> Vec<String> {
    let mut items = Vec::new();
    while let Some(lease) = queue.try_get().await.unwrap().into_lease() {
        items.push(lease.item().clone());
        lease.done().await.unwrap();
    }
    items
}

/// Whether a look at the queue finds nothing to hand out.
async fn held_back(queue: &PgQueue<String>) -> bool {
    queue.try_get().await.unwrap().is_empty()
}

/// A pool for the test's own reads of the tables.
async fn reader(server: &PgServer) -> PgPool {
    PgPool::connect(&server.url()).await.unwrap()
}

/// The queue's id.
async fn id_of(pool: &PgPool, name: &str) -> i32 {
    sqlx::query_scalar("SELECT id FROM workqueue_queues WHERE name = $1")
        .bind(name)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Two handles on separate pools share the limits: a group at its limit in one is at its
/// limit in the other, the queue-wide limit counts the leases of both, and a done in one wakes
/// a getter waiting in the other (through `NOTIFY`: the getters poll every 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_hold_across_two_processes() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let name = unique("fleet");
    let build = || {
        handle(&server, &name)
            .max_in_flight_per_group(1)
            .max_in_flight(2)
            .build()
    };
    let (a, b) = (build().await.unwrap(), build().await.unwrap());
    add_all(&a, &["x/1", "x/2", "y/1", "z/1"]).await;
    let x1 = next(&a).await;
    assert_eq!(x1.item(), "x/1");
    // x is at its limit for everyone: b hands out another group's item.
    let y1 = next(&b).await;
    assert_eq!(y1.item(), "y/1");
    // Two leases out, one per process: the queue-wide limit holds both back.
    assert!(held_back(&a).await && held_back(&b).await);
    let waiting = {
        let b = b.clone();
        tokio::spawn(async move { next(&b).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the queue-wide limit holds it back");
    let done = Instant::now();
    x1.done().await.unwrap();
    let z1 = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("a's done woke b's getter")
        .unwrap();
    assert!(done.elapsed() < Duration::from_secs(5));
    // z joined the turns before x came back from its limit.
    assert_eq!(z1.item(), "z/1");
    assert!(held_back(&a).await, "two leases out again");
    y1.done().await.unwrap();
    assert_eq!(next(&a).await.item(), "x/2");
    z1.done().await.unwrap();
}

/// A lease that expires (its holder stopped renewing) frees its group's slot when a sweep
/// takes it back: a getter of another process waiting on the group gets the next item, the
/// stale holder's done is refused, and the slot counts the new lease only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_frees_its_groups_slot() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let name = unique("expiry");
    let holder = handle(&server, &name)
        .max_in_flight_per_group(1)
        .lease_duration(Duration::from_millis(300))
        .auto_renew(false)
        .build()
        .await
        .unwrap();
    // This one looks, and sweeps, every 100 ms while it waits; its own leases last a minute.
    let other = handle(&server, &name)
        .max_in_flight_per_group(1)
        .poll_interval(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    add_all(&holder, &["g/1", "g/2", "h/1"]).await;
    let stale = next(&holder).await;
    assert_eq!(stale.item(), "g/1");
    let h1 = next(&other).await;
    assert_eq!(h1.item(), "h/1");
    let started = Instant::now();
    let g2 = next(&other).await;
    assert_eq!(g2.item(), "g/2", "g/1 was taken back to the tail of g");
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "g/2 waited for g/1's lease to expire ({:?})",
        started.elapsed()
    );
    assert!(matches!(stale.done().await, Err(Error::LeaseLost)));
    // g holds one lease (g/2): g/1, ready again, waits for it.
    assert!(held_back(&other).await);
    let pool = reader(&server).await;
    let in_flight: i32 = sqlx::query_scalar(
        "SELECT in_flight FROM workqueue_groups WHERE queue = $1 AND name = 'g'",
    )
    .bind(id_of(&pool, &name).await)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(in_flight, 1);
    g2.done().await.unwrap();
    assert_eq!(next(&other).await.item(), "g/1");
    h1.done().await.unwrap();
}

/// The leases out per group (and in all) as the database has them, at one moment.
async fn leases_out(pool: &PgPool, queue: i32) -> (i64, i64) {
    sqlx::query_as(
        "SELECT coalesce(max(n), 0)::bigint, coalesce(sum(n), 0)::bigint
         FROM (SELECT count(*) AS n FROM workqueue_items
               WHERE queue = $1 AND token IS NOT NULL GROUP BY grp) g",
    )
    .bind(queue)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Three handles on separate pools, four getters each, over 300 items in 20 groups; one
/// handle's leases last 200 ms unrenewed and a third of its holders stall past them (their
/// items are taken back and handed out again), the others release a fifth of their items
/// (dropped leases). Meanwhile a reader checks the database every few milliseconds: no group
/// ever has more than 2 leases out, the queue never more than 6. In the handlers of the
/// handles whose leases do not expire, no group ever runs more than 2 items. At the end every
/// item was handled, and the counts of leases are back to zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_never_exceeded_under_concurrent_getters() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let name = unique("stress");
    let build = |lease: Duration, renew: bool| {
        handle(&server, &name)
            .max_in_flight_per_group(2)
            .max_in_flight(6)
            .lease_duration(lease)
            .auto_renew(renew)
            .poll_interval(Duration::from_millis(200))
            .max_stalls(0)
            .build()
    };
    let handles = vec![
        build(Duration::from_secs(10), true).await.unwrap(),
        build(Duration::from_secs(10), true).await.unwrap(),
        build(Duration::from_millis(200), false).await.unwrap(),
    ];
    let items: Vec<String> = (0..300).map(|i| format!("g{}/{i}", i % 20)).collect();
    handles[0].add_all(&items).await.unwrap();
    let pool = reader(&server).await;
    let queue = id_of(&pool, &name).await;
    let stop = Arc::new(AtomicBool::new(false));
    let checker = {
        let (pool, stop) = (pool.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut worst_group, mut worst_total, mut looks) = (0, 0, 0);
            while !stop.load(Ordering::Relaxed) {
                let (group, total) = leases_out(&pool, queue).await;
                worst_group = worst_group.max(group);
                worst_total = worst_total.max(total);
                looks += 1;
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            (worst_group, worst_total, looks)
        })
    };
    let handled: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let running: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let worst_running = Arc::new(AtomicUsize::new(0));
    let mut getters = Vec::new();
    for (h, queue) in handles.iter().enumerate() {
        for g in 0..4 {
            let queue = queue.clone();
            let (handled, running, worst_running) =
                (handled.clone(), running.clone(), worst_running.clone());
            getters.push(tokio::spawn(async move {
                let mut n = 0_usize;
                while let Some(lease) = queue.get().await.unwrap() {
                    n += 1;
                    let item = lease.item().clone();
                    let group = group_of(&item).to_owned();
                    let expiring = h == 2;
                    if !expiring {
                        let mut running = running.lock().unwrap();
                        let now = running.entry(group.clone()).or_default();
                        *now += 1;
                        worst_running.fetch_max(*now, Ordering::Relaxed);
                    }
                    let stall = expiring && (n + g).is_multiple_of(3);
                    tokio::time::sleep(Duration::from_millis(if stall { 400 } else { 2 })).await;
                    if !expiring {
                        *running.lock().unwrap().get_mut(&group).unwrap() -= 1;
                    }
                    if !expiring && (n + g).is_multiple_of(5) {
                        // Released: handed out again.
                        drop(lease);
                        continue;
                    }
                    match lease.done().await {
                        Ok(()) => *handled.lock().unwrap().entry(item).or_default() += 1,
                        // A stalled holder's lease was taken back (and, under load, maybe
                        // another of this handle's unrenewed ones).
                        Err(Error::LeaseLost) => assert!(expiring, "{item}: lease lost"),
                        Err(error) => panic!("{item}: {error}"),
                    }
                }
            }));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while handled.lock().unwrap().len() < items.len() {
        assert!(
            Instant::now() < deadline,
            "{} of {} items handled",
            handled.lock().unwrap().len(),
            items.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for queue in &handles {
        queue.shut_down();
    }
    for getter in getters {
        getter.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let (worst_group, worst_total, looks) = checker.await.unwrap();
    assert!(looks > 20, "the database was looked at {looks} times");
    assert!(worst_group <= 2, "a group had {worst_group} leases out");
    assert!(worst_total <= 6, "the queue had {worst_total} leases out");
    let worst = worst_running.load(Ordering::Relaxed);
    assert!(worst <= 2, "a group ran {worst} items at once");
    // Every lease ended: the counts are back to zero (leases of stalled holders were taken
    // back by sweeps; wait for the last ones).
    let counted = || async {
        let groups: i64 = sqlx::query_scalar(
            "SELECT coalesce(sum(in_flight), 0)::bigint FROM workqueue_groups WHERE queue = $1",
        )
        .bind(queue)
        .fetch_one(&pool)
        .await
        .unwrap();
        let all: i32 = sqlx::query_scalar("SELECT in_flight FROM workqueue_flow WHERE queue = $1")
            .bind(queue)
            .fetch_one(&pool)
            .await
            .unwrap();
        let leased = leases_out(&pool, queue).await.1;
        (groups, i64::from(all), leased)
    };
    assert_eq!(counted().await, (0, 0, 0));
}

/// The limits and the slots live in the database: a server restart between a hand-out and
/// its done keeps the group at its limit, the done after the restart frees the slot, and a
/// getter that waited across the restart gets the next item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_keeps_the_limits_and_the_slots() {
    let Some(mut server) = PgServer::start() else {
        return;
    };
    let name = unique("restart");
    let queue = handle(&server, &name)
        .max_in_flight_per_group(1)
        .build()
        .await
        .unwrap();
    add_all(&queue, &["g/1", "g/2"]).await;
    let g1 = next(&queue).await;
    let waiting = {
        let queue = queue.clone();
        tokio::spawn(async move { queue.get().await.unwrap().unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.kill();
    server.restart();
    // Back up, g is still at its limit.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match queue.try_get().await {
            Ok(got) => {
                assert!(got.is_empty(), "g is at its limit after the restart");
                break;
            }
            Err(error) => {
                assert!(Instant::now() < deadline, "the server is back: {error}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert!(!waiting.is_finished());
    g1.done().await.unwrap();
    let g2 = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the getter that waited across the restart is served")
        .unwrap();
    assert_eq!(g2.item(), "g/2");
    g2.done().await.unwrap();
}

/// A queue that sees 2,000 groups keeps none of them once they hold nothing: each group's
/// row goes with its last lease (or, while its hand-out bucket refills, with a later sweep),
/// and the arrivals are all folded in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_that_hold_nothing_are_forgotten() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let name = unique("forget");
    let queue = handle(&server, &name)
        .max_in_flight_per_group(1)
        .hand_out_rate_per_group(1000.0, 1)
        .lease_duration(Duration::from_millis(400))
        .build()
        .await
        .unwrap();
    let items: Vec<String> = (0..2000).map(|i| format!("tenant-{i}/job")).collect();
    queue.add_all(&items).await.unwrap();
    let pool = reader(&server).await;
    let id = id_of(&pool, &name).await;
    let rows = || async {
        sqlx::query_as::<_, (i64, i64)>(
            "SELECT (SELECT count(*) FROM workqueue_groups WHERE queue = $1),
                    (SELECT count(*) FROM workqueue_arrivals WHERE queue = $1)",
        )
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    let handled = Arc::new(AtomicUsize::new(0));
    let workers = {
        let handled = handled.clone();
        Workers::new(queue.clone())
            .count(8)
            .spawn_async(move |_: String| {
                handled.fetch_add(1, Ordering::Relaxed);
                async {}
            })
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while handled.load(Ordering::Relaxed) < items.len() {
        assert!(Instant::now() < deadline, "the items were not all handled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The idle workers' getters sweep every 100 ms (a quarter of the lease).
    let deadline = Instant::now() + Duration::from_secs(30);
    while rows().await != (0, 0) {
        assert!(
            Instant::now() < deadline,
            "groups and arrivals left: {:?}",
            rows().await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    workers.shut_down().await;
}

/// What the log of this thread says (a `tracing` writer).
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    fn count(&self, needle: &str) -> usize {
        self.text().matches(needle).count()
    }
}

/// The settings live beside the queue: every handle applies the stored ones, the last handle
/// built with settings replaces them (and says so), one built earlier learns of it at its next
/// add and says so once, one built later with the same settings changes nothing, and one built
/// with its old settings back changes them back; an operator's handle (`PgAdmin`) changes
/// nothing and shows the settings in force; a handle built without settings follows them
/// (and says that its adds join the group ""), and only `clear_flow_control` takes them off.
#[tokio::test]
async fn the_settings_live_in_the_database_and_the_last_handle_built_wins() {
    let Some(server) = PgServer::start() else {
        return;
    };
    // Every task runs on this thread (a current-thread runtime): the log is this one.
    let log = Log::default();
    let writer = log.clone();
    let _logging = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish(),
    );
    const REPLACE: &str = "replace other ones";
    const REPLACED: &str = "another process replaced";
    let name = unique("settings");
    let old = handle(&server, &name)
        .max_in_flight_per_group(1)
        .build()
        .await
        .unwrap();
    let limits = old.flow_limits().await.unwrap().expect("settings stored");
    assert_eq!(
        (limits.grouped, limits.max_in_flight_per_group),
        (true, Some(1))
    );
    let _same = handle(&server, &name)
        .max_in_flight_per_group(1)
        .build()
        .await
        .unwrap();
    assert_eq!(log.count(REPLACE), 0, "the same settings replace nothing");
    let new = handle(&server, &name)
        .max_in_flight_per_group(3)
        .build()
        .await
        .unwrap();
    assert_eq!(log.count(REPLACE), 1, "the build says what it replaced");
    assert_eq!(
        old.flow_limits()
            .await
            .unwrap()
            .unwrap()
            .max_in_flight_per_group,
        Some(3),
        "the last one built wins"
    );
    add_all(&old, &["g/1", "g/2", "g/3", "g/4"]).await;
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(log.count(REPLACED), 1, "one warning, at the first add");
    let mut leases = Vec::new();
    for _ in 0..3 {
        leases.push(next(&old).await);
    }
    assert!(held_back(&old).await, "three of g out: the stored limit");
    add_all(&old, &["h/1"]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(log.count(REPLACED), 1, "once");
    let admin = PgAdmin::new(&server.url()).unwrap();
    let limits = admin.stats(&name, 10).await.unwrap().limits.unwrap();
    assert_eq!(limits.max_in_flight_per_group, Some(3));
    // An operator's handle (built by `PgAdmin` for an item's operation) leaves them alone.
    admin.retry_now(&name, "\"g/4\"").await.unwrap();
    let limits = admin.stats(&name, 10).await.unwrap().limits.unwrap();
    assert_eq!(limits.max_in_flight_per_group, Some(3));
    // Back to the old process's limits: no warning there.
    let _again = handle(&server, &name)
        .max_in_flight_per_group(1)
        .build()
        .await
        .unwrap();
    add_all(&old, &["h/2"]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(log.count(REPLACED), 1);
    drop(new);
    for lease in leases.drain(..) {
        lease.done().await.unwrap();
    }

    // Without settings: follows the stored ones, warns that it cannot group its adds.
    let plain = plain(&server, &name).await;
    assert_eq!(log.count("no group function"), 1, "{}", log.text());
    assert_eq!(
        plain
            .flow_limits()
            .await
            .unwrap()
            .map(|l| l.max_in_flight_per_group),
        Some(Some(1)),
        "nothing changed in the database"
    );
    plain.add("x".to_owned()).await.unwrap();
    let mut items = Vec::new();
    while let Some(lease) = plain.try_get().await.unwrap().into_lease() {
        items.push(lease.item().clone());
        leases.push(lease);
    }
    items.sort();
    assert_eq!(
        items,
        ["g/4", "h/1", "x"],
        "x in the group \"\", g and h within their limit of one"
    );
    let stats = admin.stats(&name, 10).await.unwrap();
    let mut groups: Vec<(&str, usize)> = stats
        .groups
        .iter()
        .map(|g| (g.name.as_str(), g.in_flight))
        .collect();
    groups.sort_unstable();
    assert_eq!(groups, [("", 1), ("g", 1), ("h", 1)]);

    // Taken off on purpose: for every process, once.
    assert!(plain.clear_flow_control().await.unwrap());
    assert!(!old.clear_flow_control().await.unwrap(), "once");
    assert_eq!(old.flow_limits().await.unwrap(), None);
    let stats = admin.stats(&name, 10).await.unwrap();
    assert_eq!((stats.limits, stats.flow), (None, None));
    add_all(&old, &["g/5"]).await;
    let (a, b) = (next(&old).await, next(&old).await);
    assert_eq!(
        (a.item().as_str(), b.item().as_str()),
        ("h/2", "g/5"),
        "no limit holds h or g back now"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(log.count(REPLACED), 1, "taken off is not replaced");
    for lease in leases.into_iter().chain([a, b]) {
        lease.done().await.unwrap();
    }
}

/// Flow control comes on with the first handle built with settings (the items the queue
/// holds without a group join the group "", the leased ones counting as its leases), and goes
/// off with `clear_flow_control` (the ready items handed out in the queue's order again, the
/// delayed one kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_comes_on_and_goes_off_with_the_items_kept() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let name = unique("switch");
    let plain = plain(&server, &name).await;
    add_all(&plain, &["a/0", "a/1", "b/0", "c/0"]).await;
    plain
        .add_with("c/1".to_owned(), workq::AddOptions::default().priority(2))
        .await
        .unwrap();
    plain
        .add_after("d/0".to_owned(), Duration::from_secs(60))
        .await
        .unwrap();
    let leased = next(&plain).await;
    assert_eq!(leased.item(), "c/1");
    let grouped = handle(&server, &name)
        .max_in_flight_per_group(2)
        .build()
        .await
        .unwrap();
    // Everything held is in the group "", which has one lease out of two.
    let one = next(&grouped).await;
    assert_eq!(one.item(), "a/0");
    assert!(held_back(&grouped).await, "the lease from before counts");
    grouped.add("e/0".to_owned()).await.unwrap();
    let e = next(&grouped).await;
    assert_eq!(e.item(), "e/0", "a new add has its group");
    e.done().await.unwrap();
    one.done().await.unwrap();
    leased.done().await.unwrap();

    assert!(plain.clear_flow_control().await.unwrap());
    assert!(!plain.clear_flow_control().await.unwrap(), "once");
    assert_eq!(plain.flow_limits().await.unwrap(), None);
    assert_eq!(drain(&plain).await, ["a/1", "b/0", "c/0"]);
    assert_eq!(plain.delayed_len().await.unwrap(), 1);
    let pool = reader(&server).await;
    let groups: i64 = sqlx::query_scalar("SELECT count(*) FROM workqueue_groups WHERE queue = $1")
        .bind(id_of(&pool, &name).await)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(groups, 0, "every group forgotten");
}

/// Flow control taken off hands the ready items out in the order they became ready, across
/// groups, as a queue without it would: each group's own order kept, an item handed back
/// first in its group, and no group's backlog ahead of another's older items.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_taken_off_hands_out_in_the_order_items_became_ready() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let queue = handle(&server, &unique("off-order"))
        .max_in_flight_per_group(5)
        .build()
        .await
        .unwrap();
    add_all(
        &queue,
        &["noisy/0", "noisy/1", "quiet/0", "noisy/2", "quiet/1"],
    )
    .await;
    let back = next(&queue).await;
    assert_eq!(back.item(), "noisy/0");
    back.release().await.unwrap();
    assert!(queue.clear_flow_control().await.unwrap());
    assert_eq!(
        drain(&queue).await,
        ["noisy/0", "noisy/1", "quiet/0", "noisy/2", "quiet/1"]
    );
}

/// A queue-wide limit counts every lease out, whenever it was handed out: those of a handle
/// built with groups but no limit, and those handed out before flow control came on. And
/// `delete` takes flow control away with the rest of the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_wide_limit_counts_the_leases_handed_out_before_it() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let name = unique("late-limit");
    let plain = plain(&server, &name).await;
    add_all(&plain, &["a/0", "b/0", "c/0", "d/0", "e/0"]).await;
    let before = next(&plain).await;
    let grouped = handle(&server, &name).build().await.unwrap();
    let during = next(&grouped).await;
    assert_eq!(
        (before.item().as_str(), during.item().as_str()),
        ("a/0", "b/0")
    );
    let limited = handle(&server, &name)
        .max_in_flight(3)
        .build()
        .await
        .unwrap();
    let third = next(&limited).await;
    assert_eq!(third.item(), "c/0");
    assert!(
        held_back(&limited).await,
        "three leases out: the one from before flow control, the one from before the limit, \
         and this one"
    );
    before.done().await.unwrap();
    let fourth = next(&limited).await;
    assert_eq!(fourth.item(), "d/0");
    assert!(held_back(&limited).await);

    limited.delete().await.unwrap();
    assert_eq!(
        limited.flow_limits().await.unwrap(),
        None,
        "deleted with the queue"
    );
    add_all(&limited, &["f/0", "f/1", "f/2", "f/3"]).await;
    let mut after = Vec::new();
    while let Some(lease) = limited.try_get().await.unwrap().into_lease() {
        after.push(lease);
    }
    assert_eq!(after.len(), 4, "no limit after the delete");
    drop((during, third, fourth, after));
}

/// An item the queue knows only by its failure count, queued again by `retry_now`, joins the
/// group the handle's group function gives it (an operator's handle has none: the group ""),
/// and under flow control an item's detail has no position (the hand-out order is the groups'
/// turns).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_handles_retry_now_gives_the_item_its_group() {
    use workq::admin::Retried;
    let Some(server) = PgServer::start() else {
        return;
    };
    let name = unique("retry-group");
    let queue = handle(&server, &name)
        .max_in_flight_per_group(5)
        .build()
        .await
        .unwrap();
    let pool = reader(&server).await;
    let id = id_of(&pool, &name).await;
    for item in ["\"t/1\"", "\"u/1\""] {
        sqlx::query(
            "INSERT INTO workqueue_failures (queue, key, item, failures)
             VALUES ($1, workqueue_key($2), $2, 3)",
        )
        .bind(id)
        .bind(item)
        .execute(&pool)
        .await
        .unwrap();
    }
    assert_eq!(queue.retry_now("\"t/1\"").await.unwrap(), Retried::Queued);
    let admin = PgAdmin::new(&server.url()).unwrap();
    assert_eq!(
        admin.retry_now(&name, "\"u/1\"").await.unwrap(),
        Retried::Queued
    );
    let mut groups: Vec<(String, usize)> = admin
        .stats(&name, 10)
        .await
        .unwrap()
        .groups
        .into_iter()
        .map(|g| (g.name, g.ready))
        .collect();
    groups.sort_unstable();
    assert_eq!(groups, [(String::new(), 1), ("t".to_owned(), 1)]);
    let detail = queue.item_detail("\"t/1\"").await.unwrap().unwrap();
    assert_eq!((detail.priority, detail.position), (Some(0), None));
}

/// Within one batch of adds, a group's items at two priorities join the turns of each: the
/// group whose lower-priority item came first in the batch has its turn there first, after
/// its higher-priority item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_joins_the_turns_of_each_of_its_priorities() {
    use workq::AddOptions;
    let Some(server) = PgServer::start() else {
        return;
    };
    let queue = handle(&server, &unique("batch-turns"))
        .build()
        .await
        .unwrap();
    queue
        .add_all_with([
            ("a/0".to_owned(), AddOptions::default()),
            ("b/0".to_owned(), AddOptions::default()),
            ("a/mid".to_owned(), AddOptions::default().priority(1)),
        ])
        .await
        .unwrap();
    assert_eq!(drain(&queue).await, ["a/mid", "a/0", "b/0"]);
}

/// Turning flow control on waits for the adds in progress (here one in a transaction that
/// stays open), so that no item added without a group is left out of the turns: once the
/// transaction commits, the build goes on, and both the item added before and the one added
/// in the transaction are handed out, in the group `""` (the plain process has no group
/// function), one at a time (its limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turning_flow_control_on_waits_for_the_adds_in_progress() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let name = unique("turn-on");
    let plain = plain(&server, &name).await;
    plain.add("a/1".to_owned()).await.unwrap();
    let mut tx = plain.pool().begin().await.unwrap();
    plain.add_in(&mut tx, "b/1".to_owned()).await.unwrap();
    let building = {
        let builder = handle(&server, &name).max_in_flight_per_group(1);
        tokio::spawn(builder.build())
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !building.is_finished(),
        "turning flow control on waits for the add in the open transaction"
    );
    tx.commit().await.unwrap();
    let flowing = tokio::time::timeout(Duration::from_secs(30), building)
        .await
        .expect("the build goes on after the commit")
        .unwrap()
        .unwrap();
    let a1 = next(&flowing).await;
    assert_eq!(a1.item(), "a/1");
    assert!(held_back(&flowing).await, "one group (\"\"): one at a time");
    a1.done().await.unwrap();
    let b1 = next(&flowing).await;
    assert_eq!(b1.item(), "b/1");
    b1.done().await.unwrap();
    let pool = reader(&server).await;
    let groups: Vec<Option<String>> =
        sqlx::query_scalar("SELECT DISTINCT grp FROM workqueue_items WHERE queue = $1")
            .bind(id_of(&pool, &name).await)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(groups.is_empty(), "nothing left: {groups:?}");
}

/// `PgAdmin::stats` shows flow control: the groups kept, with ready items and at their limit;
/// the groups with the most ready items (then in flight, then by name), as many as asked for,
/// with their leases, limits and oldest ready item's wait; and the limits every process
/// applies. A queue without flow control shows none of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_stats_show_the_groups_and_the_limits() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let name = unique("tenants");
    let queue = handle(&server, &name)
        .max_in_flight_per_group(1)
        .group_max_in_flight("big", 3)
        .hand_out_rate(1000.0, 100)
        .build()
        .await
        .unwrap();
    add_all(
        &queue,
        &["noisy/a", "noisy/b", "noisy/c", "quiet/a", "big/a"],
    )
    .await;
    let lease = next(&queue).await;
    assert_eq!(lease.item(), "noisy/a");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let admin = PgAdmin::new(&server.url()).unwrap();
    let stats = admin.stats(&name, 2).await.unwrap();
    let flow = stats.flow.expect("flow figures");
    assert_eq!(
        (flow.groups, flow.groups_ready, flow.groups_saturated),
        (3, 3, 1)
    );
    let top: Vec<(&str, usize, usize, Option<usize>)> = stats
        .groups
        .iter()
        .map(|g| (g.name.as_str(), g.ready, g.in_flight, g.limit))
        .collect();
    assert_eq!(top, [("noisy", 2, 1, Some(1)), ("big", 1, 0, Some(3))]);
    for group in &stats.groups {
        let waited = group.oldest_ready.expect("an oldest ready item");
        assert!(waited >= Duration::from_millis(40), "{waited:?}");
    }
    let limits = stats.limits.expect("limits");
    assert!(limits.grouped);
    assert_eq!(limits.max_in_flight_per_group, Some(1));
    assert_eq!(limits.limit_of("big"), Some(3));
    assert_eq!(limits.hand_out_rate.map(|r| r.burst), Some(100));

    let plain = PgQueue::<String>::builder(unique("plain"))
        .url(server.url())
        .build()
        .await
        .unwrap();
    plain.add("x".to_owned()).await.unwrap();
    let stats = admin.stats(plain.name(), 10).await.unwrap();
    assert_eq!(
        (stats.flow, stats.groups.len(), stats.limits),
        (None, 0, None)
    );
    lease.done().await.unwrap();
}

/// Every kind of add runs the group function in the adding process and sends the group with
/// the item: one by one, in a batch, delayed, rate-limited, in the caller's transaction, and
/// on a periodic tick. A name the database cannot keep is refused, and nothing is added.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_add_sends_its_items_group() {
    use std::time::SystemTime;
    use workq::AddOptions;
    use workq::periodic::TickClaim;
    let Some(server) = PgServer::start() else {
        return;
    };
    let name = unique("adds");
    let q = handle(&server, &name).build().await.unwrap();
    q.add("a/plain".to_owned()).await.unwrap();
    q.add_all(["b/1", "b/2"].map(String::from)).await.unwrap();
    q.add_after("c/later".to_owned(), Duration::from_secs(3600))
        .await
        .unwrap();
    q.add_rate_limited("d/retry".to_owned()).await.unwrap();
    let mut tx = q.pool().begin().await.unwrap();
    q.add_in(&mut tx, "e/tx".to_owned()).await.unwrap();
    q.add_all_with_in(
        &mut tx,
        [("f/tx".to_owned(), AddOptions::default().priority(2))],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let tick = SystemTime::UNIX_EPOCH + Duration::from_secs(3600);
    workq::Queue::add_on_tick(
        &q,
        TickClaim::new("hourly", "every 1h", tick, None, SystemTime::now()),
        "g/tick".to_owned(),
        AddOptions::default(),
    )
    .await
    .unwrap();
    let pool = reader(&server).await;
    let groups: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT item, grp FROM workqueue_items WHERE queue = $1 ORDER BY item")
            .bind(id_of(&pool, &name).await)
            .fetch_all(&pool)
            .await
            .unwrap();
    let expected: Vec<(String, Option<String>)> = [
        "a/plain", "b/1", "b/2", "c/later", "d/retry", "e/tx", "f/tx", "g/tick",
    ]
    .iter()
    .map(|item| (format!("\"{item}\""), Some(group_of(item).to_owned())))
    .collect();
    assert_eq!(groups, expected);

    let long = PgQueue::<String>::builder(unique("long"))
        .url(server.url())
        .group_by(|item: &String| item.repeat(2000))
        .build()
        .await
        .unwrap();
    let refused = long.add("x".to_owned()).await.unwrap_err();
    assert!(
        matches!(&refused, Error::Config(why) if why.contains("2000 bytes")),
        "{refused}"
    );
    let nul = PgQueue::<String>::builder(unique("nul"))
        .url(server.url())
        .group_by(|_: &String| "a\0b")
        .build()
        .await
        .unwrap();
    assert!(matches!(
        nul.add_all(["x", "y"].map(String::from)).await,
        Err(Error::Config(_))
    ));
    assert_eq!(long.len().await.unwrap() + nul.len().await.unwrap(), 0);
}
