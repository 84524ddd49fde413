//! Batched adds: one statement with exactly the rules of one-by-one adds (property tests
//! against the one-by-one queue, rate-limited adds included), no deadlocks between concurrent
//! batches, one `NOTIFY` per statement, and a plain add as one autocommit statement.

mod support;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use sqlx::postgres::{PgListener, PgPoolOptions};
use support::{PgServer, unique};
use workq::AddKind;
use workq::AddOptions;
use workq_postgres::{Lease, PgQueue};

async fn queue(server: &PgServer) -> PgQueue<String> {
    PgQueue::builder(unique("batch"))
        .url(server.url())
        .lease_duration(Duration::from_secs(60))
        .poll_interval(Duration::from_secs(30))
        .build()
        .await
        .expect("connect to the test server")
}

/// One add of a batch: an item (of a few, so that they repeat), a priority or none, and no
/// delay or a long one (a short one would make the batch's single instant and the one-by-one
/// adds' several instants order items differently, legitimately).
#[derive(Debug, Clone)]
struct Add {
    item: u8,
    priority: Option<i32>,
    delayed: bool,
}

impl Add {
    fn options(&self) -> AddOptions {
        let mut options = AddOptions::default();
        if let Some(p) = self.priority {
            options = options.priority(p);
        }
        if self.delayed {
            options = options.after(Duration::from_secs(600));
        }
        options
    }
}

/// What a case does to both queues.
#[derive(Debug, Clone)]
enum Op {
    /// A batch: `add_all_with` on one queue, one `add_with` per add on the other.
    Batch(Vec<Add>),
    /// A `try_get` on both.
    Get,
    /// `done` of the held lease at this index (modulo the number held).
    Done(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let add = (
        0..5_u8,
        prop::option::of(-2..3_i32),
        prop::bool::weighted(0.25),
    )
        .prop_map(|(item, priority, delayed)| Add {
            item,
            priority,
            delayed,
        });
    prop_oneof![
        3 => prop::collection::vec(add, 1..8).prop_map(Op::Batch),
        2 => Just(Op::Get),
        2 => (0..4_usize).prop_map(Op::Done),
    ]
}

/// Runs `ops` on a batched queue and a one-by-one queue and checks every answer is the same.
async fn same_answers(server: &PgServer, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let batched = queue(server).await;
    let single = queue(server).await;
    let mut held: VecDeque<(Lease<String>, Lease<String>)> = VecDeque::new();
    for op in ops {
        match op {
            Op::Batch(adds) => {
                let got = batched
                    .add_all_with(adds.iter().map(|a| (a.item.to_string(), a.options())))
                    .await
                    .unwrap();
                let mut want = Vec::new();
                for a in &adds {
                    want.push(
                        single
                            .add_with(a.item.to_string(), a.options())
                            .await
                            .unwrap(),
                    );
                }
                let kinds =
                    |v: &[workq::Added]| -> Vec<AddKind> { v.iter().map(|a| a.kind).collect() };
                prop_assert_eq!(kinds(&got), kinds(&want), "kinds of {:?}", adds);
            }
            Op::Get => {
                let a = batched.try_get().await.unwrap().into_lease();
                let b = single.try_get().await.unwrap().into_lease();
                let view = |l: &Option<Lease<String>>| {
                    l.as_ref().map(|l| (l.item().clone(), l.priority()))
                };
                prop_assert_eq!(view(&a), view(&b));
                if let (Some(a), Some(b)) = (a, b) {
                    held.push_back((a, b));
                }
            }
            Op::Done(i) => {
                if !held.is_empty() {
                    let (a, b) = held.remove(i % held.len()).unwrap();
                    a.done().await.unwrap();
                    b.done().await.unwrap();
                }
            }
        }
        prop_assert_eq!(batched.len().await.unwrap(), single.len().await.unwrap());
    }
    for (a, b) in held {
        a.done().await.unwrap();
        b.done().await.unwrap();
    }
    // Everything that is ready comes out in the same order with the same priorities.
    let mut rest = (Vec::new(), Vec::new());
    while let Some(l) = batched.try_get().await.unwrap().into_lease() {
        rest.0.push((l.item().clone(), l.priority()));
        l.done().await.unwrap();
    }
    while let Some(l) = single.try_get().await.unwrap().into_lease() {
        rest.1.push((l.item().clone(), l.priority()));
        l.done().await.unwrap();
    }
    prop_assert_eq!(rest.0, rest.1);
    prop_assert_eq!(
        batched.delayed_len().await.unwrap(),
        single.delayed_len().await.unwrap()
    );
    Ok(())
}

#[test]
fn a_batch_follows_the_rules_of_adding_its_items_one_by_one() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let config = ProptestConfig {
        cases: 48,
        max_shrink_iters: 200,
        ..ProptestConfig::default()
    };
    proptest!(config, |(ops in prop::collection::vec(op(), 1..30))| {
        runtime.block_on(same_answers(&server, ops))?;
    });
}

/// One add of a rate-limited case: as [`Add`], rate-limited or not.
#[derive(Debug, Clone)]
struct LimitedAdd {
    add: Add,
    limited: bool,
}

impl LimitedAdd {
    fn options(&self) -> AddOptions {
        let options = self.add.options();
        if self.limited {
            options.rate_limited()
        } else {
            options
        }
    }
}

/// A queue whose rate limiter gives each item a backoff of `base` (zero or ten minutes) and
/// has a token bucket of one retry an hour with a burst of 3: its delays are long enough that
/// the few milliseconds between one-by-one adds change them by as little.
async fn limited_queue(server: &PgServer, base: Duration) -> PgQueue<String> {
    PgQueue::builder(unique("limited"))
        .url(server.url())
        .lease_duration(Duration::from_secs(60))
        .poll_interval(Duration::from_secs(30))
        .backoff(base, Duration::from_secs(36_000))
        .token_bucket(Some((1.0 / 3600.0, 3)))
        .build()
        .await
        .expect("connect to the test server")
}

/// Runs batches with rate-limited adds (and gets and dones) on a batched queue and a
/// one-by-one queue: the same kinds, the same delays (within the seconds the one-by-one adds
/// take: the bucket refills meanwhile), the same failure counts, the same order.
async fn same_limited_answers(
    server: &PgServer,
    base: Duration,
    ops: Vec<(Vec<LimitedAdd>, u8)>,
) -> Result<(), TestCaseError> {
    let batched = limited_queue(server, base).await;
    let single = limited_queue(server, base).await;
    let mut held: VecDeque<(Lease<String>, Lease<String>)> = VecDeque::new();
    for (adds, then) in ops {
        let got = batched
            .add_all_with(adds.iter().map(|a| (a.add.item.to_string(), a.options())))
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let mut want = Vec::new();
        for a in &adds {
            want.push(
                single
                    .add_with(a.add.item.to_string(), a.options())
                    .await
                    .unwrap(),
            );
        }
        let slack = started.elapsed() + Duration::from_secs(1);
        for ((got, want), a) in got.iter().zip(&want).zip(&adds) {
            prop_assert_eq!(got.kind, want.kind, "{:?} in {:?}", a, adds);
            prop_assert!(
                got.delay.abs_diff(want.delay) <= slack,
                "{:?}: {:?} batched, {:?} one by one",
                a,
                got.delay,
                want.delay
            );
        }
        for item in 0..5_u8 {
            prop_assert_eq!(
                batched.num_requeues(item.to_string()).await.unwrap(),
                single.num_requeues(item.to_string()).await.unwrap()
            );
        }
        match then % 3 {
            0 => {
                let a = batched.try_get().await.unwrap().into_lease();
                let b = single.try_get().await.unwrap().into_lease();
                let view = |l: &Option<Lease<String>>| {
                    l.as_ref().map(|l| (l.item().clone(), l.priority()))
                };
                prop_assert_eq!(view(&a), view(&b));
                if let (Some(a), Some(b)) = (a, b) {
                    held.push_back((a, b));
                }
            }
            1 if !held.is_empty() => {
                let (a, b) = held.remove(usize::from(then) % held.len()).unwrap();
                a.done().await.unwrap();
                b.done().await.unwrap();
            }
            _ => {}
        }
        prop_assert_eq!(batched.len().await.unwrap(), single.len().await.unwrap());
    }
    for (a, b) in held {
        a.done().await.unwrap();
        b.done().await.unwrap();
    }
    let mut rest = (Vec::new(), Vec::new());
    while let Some(l) = batched.try_get().await.unwrap().into_lease() {
        rest.0.push((l.item().clone(), l.priority()));
        l.done().await.unwrap();
    }
    while let Some(l) = single.try_get().await.unwrap().into_lease() {
        rest.1.push((l.item().clone(), l.priority()));
        l.done().await.unwrap();
    }
    prop_assert_eq!(rest.0, rest.1);
    prop_assert_eq!(
        batched.delayed_len().await.unwrap(),
        single.delayed_len().await.unwrap()
    );
    Ok(())
}

#[test]
fn a_batch_with_rate_limited_adds_follows_the_rules_of_adding_them_one_by_one() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let config = ProptestConfig {
        cases: 32,
        max_shrink_iters: 200,
        ..ProptestConfig::default()
    };
    let add = (
        0..5_u8,
        prop::option::of(-2..3_i32),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.6),
    )
        .prop_map(|(item, priority, delayed, limited)| LimitedAdd {
            add: Add {
                item,
                priority,
                delayed,
            },
            limited,
        });
    let step = (prop::collection::vec(add, 1..8), any::<u8>());
    proptest!(config, |(
        exponential in any::<bool>(),
        ops in prop::collection::vec(step, 1..12),
    )| {
        let base = if exponential { Duration::from_secs(600) } else { Duration::ZERO };
        runtime.block_on(same_limited_answers(&server, base, ops))?;
    });
}

/// A batch's duplicates of one item apply in order, and the batch keeps its order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_keeps_its_order_and_folds_its_duplicates() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let q = queue(&server).await;
    let added = q
        .add_all(["a", "b", "a", "c", "b"].map(String::from))
        .await
        .unwrap();
    let kinds: Vec<AddKind> = added.iter().map(|a| a.kind).collect();
    assert_eq!(
        kinds,
        [
            AddKind::Queued,
            AddKind::Queued,
            AddKind::Duplicate,
            AddKind::Queued,
            AddKind::Duplicate
        ]
    );
    let mut out = Vec::new();
    while let Some(l) = q.try_get().await.unwrap().into_lease() {
        out.push(l.item().clone());
        l.done().await.unwrap();
    }
    assert_eq!(out, ["a", "b", "c"]);
    // A batch larger than one statement's share, with every item twice.
    let many: Vec<String> = (0..2500).chain(0..2500).map(|i| format!("k{i}")).collect();
    let added = q.add_all(&many).await.unwrap();
    assert_eq!(added.len(), 5000);
    assert_eq!(
        added.iter().filter(|a| a.kind == AddKind::Queued).count(),
        2500
    );
    assert_eq!(q.len().await.unwrap(), 2500);
    let first = q.try_get_many(3).await.unwrap();
    let items: Vec<&str> = first.iter().map(|l| l.item().as_str()).collect();
    assert_eq!(items, ["k0", "k1", "k2"]);
}

/// Concurrent batches of the same items in opposite orders, inside transactions that are not
/// retried, while workers take and finish items: never a deadlock (rows are locked in key
/// order), and every item added is handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_batches_never_deadlock() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let q = queue(&server).await;
    let keys: Arc<Vec<String>> = Arc::new((0..200).map(|i| format!("hot-{i}")).collect());
    let mut tasks = Vec::new();
    for t in 0..4_usize {
        let (q, keys) = (q.clone(), keys.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..25_usize {
                let mut batch: Vec<&String> = keys.iter().collect();
                // Each task and round in another order: forwards, backwards, rotated.
                let shift = (t * 37 + round * 11) % batch.len();
                batch.rotate_left(shift);
                if (t + round) % 2 == 1 {
                    batch.reverse();
                }
                let mut tx = q.pool().begin().await.unwrap();
                let delayed: Vec<(&String, Duration)> = batch
                    .iter()
                    .map(|k| {
                        (
                            *k,
                            Duration::from_millis(if round % 3 == 0 { 50 } else { 0 }),
                        )
                    })
                    .collect();
                q.add_all_after_in(&mut tx, delayed)
                    .await
                    .expect("a batch in a transaction: no deadlock");
                tx.commit().await.unwrap();
            }
        }));
    }
    let worker = {
        let q = q.clone();
        tokio::spawn(async move {
            let mut handed = 0;
            for _ in 0..200 {
                let next = q.try_get_many(16).await.unwrap();
                handed += next.len();
                let out = q
                    .done_and_get_many(next.into_iter().map(|l| (l, false)).collect(), 0)
                    .await
                    .unwrap();
                assert!(out.done.iter().all(Result::is_ok));
            }
            handed
        })
    };
    for task in tasks {
        task.await.unwrap();
    }
    assert!(worker.await.unwrap() > 0);
    // Everything still pending comes out.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut seen = std::collections::HashSet::new();
    loop {
        let next = q.try_get_many(100).await.unwrap();
        if next.is_empty() {
            break;
        }
        for l in &next {
            seen.insert(l.item().clone());
        }
        let _ = q
            .done_and_get_many(next.into_iter().map(|l| (l, false)).collect(), 0)
            .await
            .unwrap();
    }
    assert!(q.processing_len().await.unwrap() == 0);
    assert_eq!(q.len().await.unwrap(), 0);
}

/// A batch is one `NOTIFY` (whose payload says how many items became ready), delivered at the
/// commit; a plain add is one statement, committed on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_notifies_once_and_a_plain_add_is_one_statement() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let q = queue(&server).await;
    let admin = PgPoolOptions::new()
        .max_connections(2)
        .connect(&server.url())
        .await
        .unwrap();
    let id: i32 = sqlx::query_scalar("SELECT id FROM workqueue_queues WHERE name = $1")
        .bind(q.name())
        .fetch_one(&admin)
        .await
        .unwrap();
    let mut listener = PgListener::connect(&server.url()).await.unwrap();
    listener.listen(&format!("workqueue_{id}")).await.unwrap();

    let mut tx = q.pool().begin().await.unwrap();
    q.add_all_in(&mut tx, (0..300).map(|i| format!("n{i}")))
        .await
        .unwrap();
    // Nothing before the commit.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), listener.recv())
            .await
            .is_err()
    );
    tx.commit().await.unwrap();
    let note = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("a notification at the commit")
        .unwrap();
    assert_eq!(note.payload(), "300");
    assert!(
        tokio::time::timeout(Duration::from_millis(500), listener.recv())
            .await
            .is_err(),
        "one notification for the batch"
    );

    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&admin)
        .await
        .unwrap();
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(&admin)
        .await
        .unwrap();
    for i in 0..20 {
        q.add(format!("plain{i}")).await.unwrap();
    }
    let (adds, transactions): (i64, i64) = sqlx::query_as(
        "SELECT coalesce(sum(calls) FILTER (WHERE query LIKE '%FROM workqueue_enqueue(%'), 0)::bigint,
                coalesce(sum(calls) FILTER (WHERE upper(query) IN ('BEGIN', 'COMMIT')), 0)::bigint
         FROM pg_stat_statements WHERE toplevel",
    )
    .fetch_one(&admin)
    .await
    .unwrap();
    assert_eq!(adds, 20, "one statement per add");
    assert_eq!(transactions, 0, "no BEGIN or COMMIT around a plain add");
}

/// `Queue::add_all_with` (what a controller's relist calls) is one statement per thousand
/// items on PostgreSQL, with the options' priority, and counts what the queue accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_traits_batched_add_is_one_statement_per_thousand() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let q = queue(&server).await;
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&server.url())
        .await
        .unwrap();
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&admin)
        .await
        .unwrap();
    q.add("live".to_owned()).await.unwrap();
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(&admin)
        .await
        .unwrap();
    let listed: Vec<String> = (0..2500).map(|i| format!("listed-{i}")).collect();
    let accepted = workq::Queue::add_all_with(&q, listed, AddOptions::default().priority(-100))
        .await
        .unwrap();
    assert_eq!(accepted, 2500);
    let calls: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
         WHERE toplevel AND query LIKE '%FROM workqueue_enqueue(%'",
    )
    .fetch_one(&admin)
    .await
    .unwrap();
    assert_eq!(calls, 3, "2,500 items in three statements");
    // The live key (priority 0) comes before the listed ones (-100).
    let first = q.try_get_many(2).await.unwrap();
    assert_eq!(first[0].item(), "live");
    assert_eq!(
        (first[1].item().as_str(), first[1].priority()),
        ("listed-0", -100)
    );
    q.shut_down();
    let refused = workq::Queue::add_all_with(&q, vec!["late".to_owned()], AddOptions::default())
        .await
        .unwrap();
    assert_eq!(refused, 0);
}
