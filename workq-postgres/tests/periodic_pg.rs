//! Periodic work on PostgreSQL: every shared periodic rule (`workq_conformance::periodic`)
//! over handles of one queue with pools of their own, on a fake clock, and the fleet test:
//! three processes run one schedule on one queue on a real clock, and the queue holds
//! exactly one item per tick. Plus the rows as the listing reads them.

mod support;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use workq::periodic::{ScheduleUpdate, TickClaim, TickOutcome};
use workq::{AddOptions, Queue};
use workq_conformance::periodic::{Backend, fleet, rules};
use workq_postgres::PgQueue;

use support::PgServer;

struct Pg {
    server: Arc<PgServer>,
}

impl Pg {
    fn start() -> Option<Self> {
        Some(Pg {
            server: Arc::new(PgServer::start()?),
        })
    }
}

/// A handle on queue `name`, with a pool of its own.
async fn connect(url: String, name: String) -> PgQueue<String> {
    PgQueue::builder(name)
        .url(url)
        .build()
        .await
        .expect("connect to the test server")
}

impl Backend for Pg {
    type Q = PgQueue<String>;

    async fn handles(&self, n: usize) -> Vec<PgQueue<String>> {
        let name = support::unique("periodic");
        let mut handles = Vec::new();
        for _ in 0..n {
            handles.push(connect(self.server.url(), name.clone()).await);
        }
        handles
    }
}

/// Instantiates every periodic rule on PostgreSQL.
macro_rules! periodic_suite {
    ($($rule:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    let Some(backend) = super::Pg::start() else {
                        return;
                    };
                    super::rules::$rule(&backend).await;
                }
            )*
        }
    };
}

workq_conformance::for_each_periodic_rule!(periodic_suite);

/// A child of [`three_processes_add_exactly_one_item_per_tick`]; does nothing when run alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_fleet_child() {
    fleet::child(connect).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_add_exactly_one_item_per_tick() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let queue = connect(server.url(), "fleet".to_owned()).await;
    fleet::run("periodic_fleet_child", &server.url(), "fleet", &queue, 3).await;
    let listed = queue.schedules().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].name.as_str(), listed[0].spec.as_str()),
        ("fleet", "every 1s")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listing_reads_every_schedule_and_a_refused_add_takes_no_tick() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let queue = connect(server.url(), "listed".to_owned()).await;
    let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s);
    for name in ["b-hourly", "a-nightly"] {
        queue
            .upsert_schedule(ScheduleUpdate::register(
                name,
                "every 1h",
                Some(at(3600)),
                at(0),
            ))
            .await
            .unwrap();
    }
    let claim = |s: u64| TickClaim::new("b-hourly", "every 1h", at(s), Some(at(s + 3600)), at(s));
    assert_eq!(
        queue
            .add_on_tick(
                claim(3600),
                "x".to_owned(),
                AddOptions::default().priority(5)
            )
            .await
            .unwrap(),
        TickOutcome::Added
    );
    let listed = queue.schedules().await.unwrap();
    let names: Vec<_> = listed.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["a-nightly", "b-hourly"]);
    assert_eq!(listed[1].last_tick, Some(at(3600)));
    assert_eq!(listed[1].next_tick, Some(at(7200)));
    assert_eq!(listed[0].last_tick, None);
    let lease = Queue::get(&queue).await.unwrap().unwrap();
    assert_eq!((lease.item().as_str(), lease.priority()), ("x", 5));
    lease.done().await.unwrap();

    // Shut down for every process: the claim is rolled back with the refused add.
    queue.shut_down_fleet().await.unwrap();
    let other = connect(server.url(), "listed".to_owned()).await;
    assert_eq!(
        other
            .add_on_tick(claim(7200), "y".to_owned(), AddOptions::default())
            .await
            .unwrap(),
        TickOutcome::ShutDown
    );
    let listed = other.schedules().await.unwrap();
    assert_eq!(listed[1].last_tick, Some(at(3600)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_role_with_the_listed_grants_runs_schedules() {
    use sqlx::Executor;
    let Some(server) = PgServer::start() else {
        return;
    };
    let owner = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&server.url())
        .await
        .unwrap();
    PgQueue::<String>::migrate(&owner).await.unwrap();
    // docs/postgres.md's "Least privileges", with the line for periodic schedules.
    owner
        .execute(
            "CREATE ROLE worker LOGIN;
             GRANT USAGE ON SCHEMA public TO worker;
             GRANT SELECT, INSERT, UPDATE, DELETE ON workqueue_queues, workqueue_items,
                 workqueue_failures, workqueue_dead TO worker;
             GRANT SELECT ON workqueue_migrations TO worker;
             GRANT USAGE ON SEQUENCE workqueue_seq TO worker;
             GRANT SELECT, INSERT, UPDATE ON workqueue_schedules TO worker;",
        )
        .await
        .unwrap();
    let queue = connect(
        server.url().replace("postgres@", "worker@"),
        "least".to_owned(),
    )
    .await;
    let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s);
    let info = queue
        .upsert_schedule(ScheduleUpdate::pause("nightly", true, at(0)))
        .await
        .unwrap();
    assert!(info.paused);
    let claim = TickClaim::new("nightly", "every 1h", at(3600), None, at(3600));
    assert_eq!(
        queue
            .add_on_tick(claim, "n".to_owned(), AddOptions::default())
            .await
            .unwrap(),
        TickOutcome::Paused
    );
    queue
        .upsert_schedule(ScheduleUpdate::pause("nightly", false, at(3700)))
        .await
        .unwrap();
    let claim = TickClaim::new("nightly", "every 1h", at(7200), None, at(7200));
    assert_eq!(
        queue
            .add_on_tick(claim, "n".to_owned(), AddOptions::default())
            .await
            .unwrap(),
        TickOutcome::Added
    );
    assert_eq!(queue.schedules().await.unwrap()[0].since, at(3700));
}
