//! Trace links on Redis (feature `otel`): an add records the `traceparent` of the span it is
//! made in beside the item on the server, and the lease that hands the item out, in any
//! process, carries it to the worker's `workqueue.item` span.
//!
//! The shared trace suite (`workq_conformance::trace`, which the in-memory queue runs too)
//! on a server of the test's own (and with `--features cluster` on a three-node cluster);
//! then Redis's own: `Workers` linking their spans, an add in another process, what a
//! hand-made client may send, the keys every end of an item leaves (none), and the commands
//! a get, an add and a done cost with and without links.
#![cfg(feature = "otel")]

mod support;

use std::time::Duration;

use workq::admin::End;
use workq::otel::TraceLink;
use workq_conformance::trace::{
    Recorder, add_in_a_child, child_args, child_report, process_once, rules,
};
use workq_conformance::unique_name;
use workq_redis::RedisQueue;

use support::{RedisServer, next};

/// Instantiates every trace rule on Redis.
macro_rules! trace_suite {
    ($($rule:ident),* $(,)?) => {
        support::on_redis_factory!(redis_cluster_keeps_every_trace_rule; $($rule),*);
    };
}

workq_conformance::for_each_trace_rule!(trace_suite);

/// A well-formed `traceparent`.
const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

async fn queue(server: &RedisServer, name: &str) -> RedisQueue<String> {
    RedisQueue::builder(name)
        .url(server.url())
        .build()
        .await
        .unwrap()
}

/// Adds `item` to `queue` inside a new span of `producer`'s; returns the span's link.
async fn add_in_span(producer: &Recorder, queue: &RedisQueue<String>, item: &str) -> TraceLink {
    let (added, link) = producer.in_span(queue.add(item.to_owned())).await;
    added.unwrap();
    link
}

/// The worker's `workqueue.item` span links to the span the item was added in (a trace of
/// its own, not a child of it), and the handler's span is its child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_span_links_to_the_add_and_the_handler_runs_inside_it() {
    let Some(server) = support::server::require() else {
        return;
    };
    let queue = queue(&server, "linked").await;
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
        let queue: RedisQueue<String> = RedisQueue::builder(name).url(url).build().await.unwrap();
        child_report(add_in_span(&Recorder::new(), &queue, "default/from-afar").await);
        return;
    }
    let Some(server) = support::server::require() else {
        return;
    };
    let name = unique_name("afar");
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

/// The server stores a trace link only if it is a well-formed `traceparent`: anything else
/// a hand-made client sends in its place (too long or short, uppercase, version `ff`, ids of
/// zeros, wrong separators, not ASCII) is not stored, and the item is handed out unlinked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_well_formed_traceparents_are_stored() {
    let Some(server) = support::server::require() else {
        return;
    };
    let name = unique_name("hand-made");
    let queue = queue(&server, &name).await;
    let zeros = |range: std::ops::Range<usize>| {
        let mut text = VALID.to_owned();
        text.replace_range(range.clone(), &"0".repeat(range.len()));
        text
    };
    let hostile = [
        format!("{VALID}0"),
        VALID[..54].to_owned(),
        VALID.to_uppercase(),
        format!("ff{}", &VALID[2..]),
        zeros(3..35),
        zeros(36..52),
        VALID.replace('-', ","),
        format!("{}\u{e9}", &VALID[..53]),
        String::new(),
        " ".repeat(55),
    ];
    for text in &hostile {
        queue
            .add_sending_traceparent("default/x".to_owned(), text)
            .await
            .unwrap();
    }
    assert!(
        support::keys_of(&server, &name)
            .await
            .iter()
            .all(|key| !key.contains("links") && !key.contains("drop")),
        "a hostile traceparent was stored"
    );
    let lease = next(&queue).await;
    assert!(lease.links().is_empty());
    assert_eq!(lease.links_dropped(), 0);
    lease.done().await.unwrap();
    // The same call with a well-formed one stores it.
    queue
        .add_sending_traceparent("default/x".to_owned(), VALID)
        .await
        .unwrap();
    let lease = next(&queue).await;
    assert_eq!(lease.links(), [VALID.parse::<TraceLink>().unwrap()]);
    lease.done().await.unwrap();
}

/// Whether queue `name` has a trace link key.
async fn link_keys(server: &RedisServer, name: &str) -> Vec<String> {
    support::keys_of(server, name)
        .await
        .into_iter()
        .filter(|key| key.ends_with("links") || key.ends_with("drop"))
        .collect()
}

/// Every way an item's links end leaves no key behind: a done, an operator's remove (of a
/// queued item, and of a re-add pending for a leased one), a dead letter (which keeps the
/// links, and a requeue restores them), and deleting the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_links_leave_no_key_behind() {
    let Some(server) = support::server::require() else {
        return;
    };
    let name = unique_name("tidy");
    let lease_time = Duration::from_millis(300);
    let queue: RedisQueue<String> = RedisQueue::builder(&name)
        .url(server.url())
        .lease_duration(lease_time)
        .auto_renew(false)
        .max_stalls(1)
        .build()
        .await
        .unwrap();
    let producer = Recorder::new();
    let none = Vec::<String>::new();

    // Done, with an add while processing kept for the next hand-out.
    let first = add_in_span(&producer, &queue, "a").await;
    let lease = next(&queue).await;
    let second = add_in_span(&producer, &queue, "a").await;
    assert_eq!(lease.links(), [first]);
    lease.done().await.unwrap();
    assert_eq!(
        link_keys(&server, &name).await.len(),
        1,
        "the pending add's"
    );
    let lease = next(&queue).await;
    assert_eq!(lease.links(), [second]);
    lease.done().await.unwrap();
    assert_eq!(link_keys(&server, &name).await, none);

    // An operator's remove: of a queued item, then of a re-add pending while leased.
    add_in_span(&producer, &queue, "b").await;
    queue.remove("\"b\"").await.unwrap();
    assert_eq!(link_keys(&server, &name).await, none);
    let first = add_in_span(&producer, &queue, "c").await;
    let lease = next(&queue).await;
    add_in_span(&producer, &queue, "c").await;
    queue.remove("\"c\"").await.unwrap();
    assert_eq!(lease.links(), [first]);
    lease.done().await.unwrap();
    assert_eq!(link_keys(&server, &name).await, none);

    // A dead letter (the lease expired once, with max_stalls 1) keeps the links of the
    // lease and of the add pending meanwhile; a requeue restores them.
    let first = add_in_span(&producer, &queue, "d").await;
    next(&queue).await.abandon();
    let second = add_in_span(&producer, &queue, "d").await;
    tokio::time::sleep(lease_time + Duration::from_millis(50)).await;
    assert!(queue.try_get().await.unwrap().into_lease().is_none());
    assert_eq!(link_keys(&server, &name).await, none);
    let letters = queue.dead_letters(End::First, 10).await.unwrap();
    let [letter] = letters.as_slice() else {
        panic!("one dead letter expected: {letters:?}");
    };
    for link in [first, second] {
        assert!(letter.id.contains(&link.traceparent()), "{letter:?}");
    }
    assert!(queue.requeue_dead_letter(letter).await.unwrap());
    let lease = next(&queue).await;
    assert_eq!(lease.links(), [first, second]);
    lease.done().await.unwrap();
    assert_eq!(link_keys(&server, &name).await, none);

    // Deleting the queue, with links pending and leased.
    add_in_span(&producer, &queue, "e").await;
    let lease = next(&queue).await;
    add_in_span(&producer, &queue, "e").await;
    assert_eq!(link_keys(&server, &name).await.len(), 2);
    queue.delete().await.unwrap();
    assert_eq!(support::keys_of(&server, &name).await, none);
    lease.abandon();
}

/// A queue whose adds carry no trace context runs the commands it ran before trace links
/// existed (the check for links rides on an EXISTS each script run made anyway); links cost
/// two commands per add, three per hand-out and two per done (`INFO commandstats`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_cost_nothing_where_no_add_carries_one() {
    let Some(server) = support::server::require() else {
        return;
    };
    let queue = queue(&server, &unique_name("cost")).await;
    let con = support::raw(&server).await;
    // Warm up: the scripts are loaded.
    queue.add("warm".to_owned()).await.unwrap();
    next(&queue).await.done().await.unwrap();

    let plain = support::PLAIN_COMMANDS;
    assert_eq!(support::plain_commands(&con, &queue, "plain").await, plain);

    let producer = Recorder::new();
    let (_, add) = support::commands_run_by(&con, add_in_span(&producer, &queue, "linked")).await;
    let (lease, get) = support::commands_run_by(&con, next(&queue)).await;
    assert_eq!(lease.links().len(), 1);
    let (done, finish) = support::commands_run_by(&con, lease.done()).await;
    done.unwrap();
    assert_eq!((add, get, finish), (plain.0 + 2, plain.1 + 3, plain.2 + 2));
}

/// The add a periodic schedule's tick makes (claimed and added in one script run) links to
/// the span the runner made it in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_periodic_ticks_add_is_linked_too() {
    use std::time::SystemTime;
    use workq::periodic::{TickClaim, TickOutcome};
    use workq::{AddOptions, Queue};

    let Some(server) = support::server::require() else {
        return;
    };
    let queue = queue(&server, &unique_name("tick")).await;
    let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s);
    let claim = TickClaim::new("hourly", "every 1h", at(3600), Some(at(7200)), at(3600));
    let producer = Recorder::new();
    let (outcome, link) = producer
        .in_span(async {
            queue
                .add_on_tick(claim, "tick".to_owned(), AddOptions::default())
                .await
        })
        .await;
    assert_eq!(outcome.unwrap(), TickOutcome::Added);
    let lease = next(&queue).await;
    assert_eq!(lease.links(), [link]);
    lease.done().await.unwrap();
}
