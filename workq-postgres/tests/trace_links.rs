//! Trace links on PostgreSQL (feature `otel`): an add records the `traceparent` of the span
//! it is made in, in the item's row, and the lease that hands the item out, in any process,
//! carries it to the worker's `workqueue.item` span.
//!
//! The shared trace suite (`workq_conformance::trace`, which the in-memory queue and Redis
//! run too) on a server of the test's own; then PostgreSQL's own: `Workers` linking their
//! spans, an add in another process, adds in the caller's transaction, what a hand-made
//! client may send (the SQL stores only well-formed `traceparent`s), rows that never hold
//! more than four links, a queue whose adds carry none calling what it called before, an
//! operator's remove, a done, a dead letter and its requeue, a periodic tick's add, and a
//! linked add that waits for no row another transaction holds.
#![cfg(feature = "otel")]

mod support;

use std::time::Duration;

use sqlx::PgPool;
use workq::otel::TraceLink;
use workq_conformance::trace::{
    Recorder, TraceFactory, add_in_a_child, assert_tick_add_linked, child_args, child_report,
    process_once, rules,
};
use workq_postgres::{Lease, PgQueue};

use support::{PgServer, unique};

/// Fresh queues on a server of the test's own.
struct PgTrace {
    server: PgServer,
}

impl TraceFactory for PgTrace {
    type Q = PgQueue<String>;

    async fn queue(&self, grouped: bool) -> PgQueue<String> {
        let builder = PgQueue::builder(unique("trace"))
            .url(self.server.url())
            .lease_duration(Duration::from_secs(30))
            .poll_interval(Duration::from_secs(10));
        let builder = if grouped {
            builder.group_by(|item: &String| item.split_once('/').map_or("", |(g, _)| g).to_owned())
        } else {
            builder
        };
        builder.build().await.expect("connect to the test server")
    }

    async fn expiring_queue(&self, lease: Duration) -> Option<PgQueue<String>> {
        Some(
            PgQueue::builder(unique("trace-expiring"))
                .url(self.server.url())
                .lease_duration(lease)
                .auto_renew(false)
                .poll_interval(Duration::from_millis(50))
                .build()
                .await
                .expect("connect to the test server"),
        )
    }

    fn crash(lease: Lease<String>) {
        lease.abandon();
    }

    /// A duplicate add whose row holds four links already writes nothing, so its drop is
    /// not counted.
    fn counts_every_dropped_link(&self) -> bool {
        false
    }
}

/// Instantiates every trace rule on PostgreSQL.
macro_rules! trace_suite {
    ($($rule:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    let Some(server) = super::PgServer::start() else {
                        return;
                    };
                    super::rules::$rule(&super::PgTrace { server }).await;
                }
            )*
        }
    };
}

workq_conformance::for_each_trace_rule!(trace_suite);

/// A well-formed `traceparent`.
const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

async fn queue(server: &PgServer, name: &str) -> PgQueue<String> {
    PgQueue::builder(name)
        .url(server.url())
        .lease_duration(Duration::from_secs(30))
        .poll_interval(Duration::from_millis(200))
        .build()
        .await
        .expect("connect to the test server")
}

async fn admin(server: &PgServer) -> PgPool {
    PgPool::connect(&server.url()).await.unwrap()
}

/// The next lease of `queue`, waiting for it.
async fn next(queue: &PgQueue<String>) -> Lease<String> {
    tokio::time::timeout(Duration::from_secs(10), queue.get())
        .await
        .expect("an item within 10 s")
        .unwrap()
        .expect("not shut down")
}

/// Adds `item` to `queue` inside a new span of `producer`'s; returns the span's link.
async fn add_in_span(producer: &Recorder, queue: &PgQueue<String>, item: &str) -> TraceLink {
    let (added, link) = producer.in_span(queue.add(item.to_owned())).await;
    added.unwrap();
    link
}

/// The id of queue `name`.
async fn queue_id(admin: &PgPool, name: &str) -> i32 {
    sqlx::query_scalar("SELECT id FROM workqueue_queues WHERE name = $1")
        .bind(name)
        .fetch_one(admin)
        .await
        .unwrap()
}

/// What the row of the `String` item `item` of queue `name` holds of trace links: its
/// pending links, their drops, the links its lease took, and the row's version (`xmin`:
/// changed by every write).
async fn row(
    admin: &PgPool,
    name: &str,
    item: &str,
) -> (
    Option<Vec<String>>,
    Option<i32>,
    Option<Vec<String>>,
    String,
) {
    sqlx::query_as(
        "SELECT i.links, i.links_dropped, i.lease_links, i.xmin::text
         FROM workqueue_items i JOIN workqueue_queues s ON s.id = i.queue
         WHERE s.name = $1 AND i.key = workqueue_key($2)",
    )
    .bind(name)
    .bind(serde_json::to_string(item).unwrap())
    .fetch_one(admin)
    .await
    .unwrap()
}

/// The worker's `workqueue.item` span links to the spans the item was added in (a trace of
/// its own, not a child of them), and the handler's span is its child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_span_links_to_the_add_and_the_handler_runs_inside_it() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let queue = queue(&server, &unique("linked")).await;
    let producer = Recorder::new();
    let added = add_in_span(&producer, &queue, "default/linked").await;
    let dedup = add_in_span(&producer, &queue, "default/linked").await;
    process_once(&queue, "default/linked", &[added, dedup]).await;
}

/// Across processes: this test binary runs itself as a child process that adds an item
/// inside a span of its own tracer provider and prints the span's `traceparent`; this
/// process's `Workers` process the item, and their span, in this process's exporter, links
/// to exactly that context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_add_in_another_process_links_the_workers_span() {
    if let Some((url, name)) = child_args() {
        // The child: one add, in a span, and its traceparent on stdout.
        let queue: PgQueue<String> = PgQueue::builder(name).url(url).build().await.unwrap();
        child_report(add_in_span(&Recorder::new(), &queue, "default/from-afar").await);
        return;
    }
    let Some(server) = PgServer::start() else {
        return;
    };
    let name = unique("afar");
    let sent = add_in_a_child(
        "an_add_in_another_process_links_the_workers_span",
        &server.url(),
        &name,
    );
    let queue = queue(&server, &name).await;
    let item = process_once(&queue, "default/from-afar", &[sent]).await;
    assert_eq!(
        item.links.links[0].span_context.trace_flags(),
        sent.flags(),
        "the flags crossed too"
    );
}

/// Adds in the caller's transaction (`add_in`, `add_all_in`) link to the span they are made
/// in once the transaction commits; a rolled-back one leaves no link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_in_the_callers_transaction_are_linked() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let queue = queue(&server, &unique("in-tx")).await;
    let producer = Recorder::new();
    let ((), rolled_back) = producer
        .in_span(async {
            let mut tx = admin.begin().await.unwrap();
            queue.add_in(&mut tx, "one".to_owned()).await.unwrap();
            tx.rollback().await.unwrap();
        })
        .await;
    let ((), one) = producer
        .in_span(async {
            let mut tx = admin.begin().await.unwrap();
            queue.add_in(&mut tx, "one".to_owned()).await.unwrap();
            tx.commit().await.unwrap();
        })
        .await;
    let ((), batch) = producer
        .in_span(async {
            let mut tx = admin.begin().await.unwrap();
            queue
                .add_all_in(&mut tx, ["one", "two"].map(String::from))
                .await
                .unwrap();
            tx.commit().await.unwrap();
        })
        .await;
    assert_ne!(rolled_back, one);
    let first = next(&queue).await;
    assert_eq!(
        (first.item().as_str(), first.links()),
        ("one", &[one, batch][..])
    );
    let second = next(&queue).await;
    assert_eq!(
        (second.item().as_str(), second.links()),
        ("two", &[batch][..])
    );
    first.done().await.unwrap();
    second.done().await.unwrap();
}

/// The SQL stores a trace link only if it is a well-formed `traceparent`: anything else a
/// hand-made client sends in its place (too long or short, uppercase, version `ff`, ids of
/// zeros, wrong separators, not ASCII, blank, empty, NULL) is not stored, and the item is
/// handed out unlinked; the add itself is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_well_formed_traceparents_are_stored() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let name = unique("hand-made");
    let queue = queue(&server, &name).await;
    let id = queue_id(&admin, &name).await;
    let zeros = |range: std::ops::Range<usize>| {
        let mut text = VALID.to_owned();
        text.replace_range(range.clone(), &"0".repeat(range.len()));
        text
    };
    let hostile = [
        Some(format!("{VALID}0")),
        Some(VALID[..54].to_owned()),
        Some(VALID.to_uppercase()),
        Some(format!("ff{}", &VALID[2..])),
        Some(zeros(3..35)),
        Some(zeros(36..52)),
        Some(VALID.replace('-', ",")),
        Some(format!("{}\u{e9}", &VALID[..53])),
        Some(format!("{VALID}\n")),
        Some(String::new()),
        Some(" ".repeat(55)),
        None,
    ];
    let enqueue = "SELECT kinds FROM workqueue_enqueue_traced($1, ARRAY['\"x\"'], NULL,
                       ARRAY[NULL]::integer[], ARRAY[0]::bigint[], ARRAY[false], 0, 0, 0, 0, $2)";
    for text in &hostile {
        let kinds: Vec<i16> = sqlx::query_scalar(enqueue)
            .bind(id)
            .bind(text)
            .fetch_one(&admin)
            .await
            .unwrap();
        assert_ne!(kinds, [0], "the add is made");
        assert_eq!(row(&admin, &name, "x").await.0, None, "stored: {text:?}");
    }
    let lease = next(&queue).await;
    assert!(lease.links().is_empty());
    assert_eq!(lease.links_dropped(), 0);
    lease.done().await.unwrap();
    // The same call with a well-formed one stores it.
    let _: Vec<i16> = sqlx::query_scalar(enqueue)
        .bind(id)
        .bind(VALID)
        .fetch_one(&admin)
        .await
        .unwrap();
    let lease = next(&queue).await;
    assert_eq!(lease.links(), [VALID.parse::<TraceLink>().unwrap()]);
    lease.done().await.unwrap();
}

/// A row never holds more than four links, however many adds carry one (one at a time, in
/// a batch, while leased, and a release putting its four in front of four pending), and the
/// table refuses a fifth written by hand. A duplicate add whose row holds four already, or
/// made outside a recorded span, does not write the row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_holds_at_most_four_links() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let name = unique("bounded");
    let queue = queue(&server, &name).await;
    let producer = Recorder::new();
    let mut first = Vec::new();
    for _ in 0..6 {
        first.push(add_in_span(&producer, &queue, "hot").await);
    }
    let (links, dropped, _, full) = row(&admin, &name, "hot").await;
    assert_eq!(links.map(|l| l.len()), Some(4));
    assert_eq!(
        dropped, None,
        "the duplicates into a full row wrote nothing"
    );
    // Neither a duplicate into the full row nor one outside a span writes it.
    add_in_span(&producer, &queue, "hot").await;
    queue.add("hot".to_owned()).await.unwrap();
    assert_eq!(
        row(&admin, &name, "hot").await.3,
        full,
        "the row was written"
    );
    // A batch of six into a fresh row keeps four and counts two.
    producer
        .in_span(queue.add_all(["batch"; 6].map(String::from)))
        .await
        .0
        .unwrap();
    let (links, dropped, ..) = row(&admin, &name, "batch").await;
    assert_eq!((links.map(|l| l.len()), dropped), (Some(4), Some(2)));

    // Leased: four more pending, then a release puts the lease's four in front.
    let lease = next(&queue).await;
    assert_eq!(lease.item(), "hot");
    assert_eq!(lease.links(), &first[..4]);
    let mut pending = Vec::new();
    for _ in 0..5 {
        pending.push(add_in_span(&producer, &queue, "hot").await);
    }
    let (links, _, leased, _) = row(&admin, &name, "hot").await;
    assert_eq!(
        (links.map(|l| l.len()), leased.map(|l| l.len())),
        (Some(4), Some(4))
    );
    lease.release().await.unwrap();
    let (links, dropped, leased, _) = row(&admin, &name, "hot").await;
    let first_texts: Vec<String> = first[..4].iter().map(TraceLink::traceparent).collect();
    assert_eq!(
        links,
        Some(first_texts),
        "the lease's links in front, four in all"
    );
    assert_eq!(dropped, Some(4), "the four pending ones counted");
    assert_eq!(leased, None);

    // By hand: the table refuses five.
    let five = sqlx::query(
        "UPDATE workqueue_items SET links = array_fill($1::text, ARRAY[5])
         WHERE key = workqueue_key('\"hot\"')",
    )
    .bind(VALID)
    .execute(&admin)
    .await;
    let error = five.expect_err("five links refused").to_string();
    assert!(error.contains("workqueue_items_links_bound"), "{error}");
}

/// A queue whose adds carry no trace context calls what it called before trace links (the
/// plain `workqueue_enqueue` and `workqueue_retry_done`); one whose adds do calls the
/// `_traced` ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_without_a_span_call_the_plain_functions() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&admin)
        .await
        .unwrap();
    let calls = |needle: &'static str| {
        let admin = admin.clone();
        async move {
            let calls: i64 = sqlx::query_scalar(
                "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
                 WHERE toplevel AND query LIKE '%FROM ' || $1 || '(%'",
            )
            .bind(needle)
            .fetch_one(&admin)
            .await
            .unwrap();
            calls
        }
    };
    let queue = queue(&server, &unique("plain")).await;
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(&admin)
        .await
        .unwrap();
    queue.add("a".to_owned()).await.unwrap();
    queue.add_all(["a", "b"].map(String::from)).await.unwrap();
    let lease = next(&queue).await;
    queue
        .retry_and_done(lease, workq::AddOptions::default(), false)
        .await
        .unwrap();
    assert_eq!(
        (
            calls("workqueue_enqueue").await,
            calls("workqueue_enqueue_traced").await,
            calls("workqueue_retry_done").await,
            calls("workqueue_retry_done_traced").await,
        ),
        (2, 0, 1, 0)
    );
    let producer = Recorder::new();
    add_in_span(&producer, &queue, "c").await;
    let lease = next(&queue).await;
    producer
        .in_span(queue.retry_and_done(lease, workq::AddOptions::default(), false))
        .await
        .0
        .unwrap();
    assert_eq!(
        (
            calls("workqueue_enqueue_traced").await,
            calls("workqueue_retry_done_traced").await,
        ),
        (1, 1)
    );
}

/// An operator's remove of a re-add pending on a leased item forgets that add's links: the
/// lease keeps its own, and a release gives back only those.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_re_add_takes_its_links_with_it() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let name = unique("removed");
    let queue = queue(&server, &name).await;
    let producer = Recorder::new();
    let first = add_in_span(&producer, &queue, "c").await;
    let lease = next(&queue).await;
    add_in_span(&producer, &queue, "c").await;
    queue.remove("\"c\"").await.unwrap();
    assert_eq!(row(&admin, &name, "c").await.0, None);
    lease.release().await.unwrap();
    let lease = next(&queue).await;
    assert_eq!(lease.links(), [first]);
    lease.done().await.unwrap();
}

/// A dead letter keeps the links of the item it was (its expired lease's, then those of the
/// add pending meanwhile), and a requeue gives them back in front of the links of adds made
/// since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_keeps_its_links_and_a_requeue_gives_them_back() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let name = unique("buried");
    let lease_time = Duration::from_millis(300);
    let queue: PgQueue<String> = PgQueue::builder(&name)
        .url(server.url())
        .lease_duration(lease_time)
        .auto_renew(false)
        .max_stalls(1)
        .poll_interval(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    let producer = Recorder::new();
    let first = add_in_span(&producer, &queue, "d").await;
    next(&queue).await.abandon();
    let second = add_in_span(&producer, &queue, "d").await;
    tokio::time::sleep(lease_time + Duration::from_millis(100)).await;
    assert!(queue.try_get().await.unwrap().into_lease().is_none());
    let kept: (Option<Vec<String>>, Option<i32>) =
        sqlx::query_as("SELECT links, links_dropped FROM workqueue_dead")
            .fetch_one(&admin)
            .await
            .unwrap();
    assert_eq!(
        kept,
        (Some(vec![first.traceparent(), second.traceparent()]), None)
    );
    let letters = queue
        .dead_letters(workq::admin::End::First, 10)
        .await
        .unwrap();
    let [letter] = letters.as_slice() else {
        panic!("one dead letter expected: {letters:?}");
    };
    let third = add_in_span(&producer, &queue, "d").await;
    assert!(queue.requeue_dead_letter(letter).await.unwrap());
    let lease = next(&queue).await;
    assert_eq!(lease.links(), [first, second, third]);
    lease.done().await.unwrap();
}

/// The add a periodic schedule's tick makes (claimed and added in one transaction) links to
/// the span the runner made it in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_periodic_ticks_add_is_linked_too() {
    let Some(server) = PgServer::start() else {
        return;
    };
    assert_tick_add_linked(&queue(&server, &unique("tick")).await).await;
}

/// An add in a span never waits for a row another transaction holds (it would take the row
/// out of the lock order): a duplicate of an item whose row a caller's open transaction has
/// written completes at once, and keeps no link; the next add in a span, once the row is
/// free, links as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_linked_add_waits_for_no_row() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let queue = queue(&server, &unique("no-wait")).await;
    queue.add("x".to_owned()).await.unwrap();
    let mut tx = admin.begin().await.unwrap();
    // A raised priority writes the row: the transaction holds it.
    queue
        .add_with_in(
            &mut tx,
            "x".to_owned(),
            workq::AddOptions::default().priority(5),
        )
        .await
        .unwrap();
    let producer = Recorder::new();
    tokio::time::timeout(Duration::from_secs(5), add_in_span(&producer, &queue, "x"))
        .await
        .expect("the add waited for the row the open transaction holds");
    tx.commit().await.unwrap();
    let linked = add_in_span(&producer, &queue, "x").await;
    let lease = next(&queue).await;
    assert_eq!((lease.priority(), lease.links()), (5, &[linked][..]));
    lease.done().await.unwrap();
}

/// A done clears the links its lease took: a row kept for an add made while processing holds
/// that add's links alone, pending for the next hand-out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_done_clears_the_leases_links() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let name = unique("cleared");
    let queue = queue(&server, &name).await;
    let producer = Recorder::new();
    let first = add_in_span(&producer, &queue, "a").await;
    let lease = next(&queue).await;
    let second = add_in_span(&producer, &queue, "a").await;
    let (links, _, leased, _) = row(&admin, &name, "a").await;
    assert_eq!(
        (links, leased),
        (
            Some(vec![second.traceparent()]),
            Some(vec![first.traceparent()])
        )
    );
    lease.done().await.unwrap();
    let (links, _, leased, _) = row(&admin, &name, "a").await;
    assert_eq!((links, leased), (Some(vec![second.traceparent()]), None));
}
