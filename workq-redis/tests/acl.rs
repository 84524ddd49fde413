//! The least privileges of docs/redis.md ("ACL users"), on a live server: a queue runs with
//! its workers as an ACL user that has only the worker's rules, and a `RedisAdmin` as a user
//! with only the operator's rules; both work, and the worker's user cannot do what only an
//! operator does (list the queues, end a pause or a shut down, purge dead letters).

mod support;

use std::time::Duration;

use support::server::{RedisServer, require};
use workq::admin::{Admin, AdminError, End, ItemState, PageQuery};
use workq::{AddOptions, Outcome, Workers};
use workq_redis::{RateLimit, RedisAdmin, RedisQueue};

/// The worker's rules, as docs/redis.md gives them (prefix `wq`).
const WORKER: &str = "~wq:* resetchannels -@all +evalsha +script|load +bzpopmin +ping +info \
    +config|get +time +exists +get +set +hget +hset +hdel +hmget +hexists +hincrby +lpop \
    +lpush +rpush +lrem +ltrim +llen +lrange +sadd +srem +sismember +smismember +zadd +zrem \
    +zrange +zrangebyscore +zscore +zmscore +zcard";

/// The operator's rules, as docs/redis.md gives them (prefix `wq`).
const OPERATOR: &str = "~wq:* resetchannels -@all +@read +@write -@dangerous +evalsha \
    +script|load +multi +exec +ping +info +config|get +time +cluster|slots";

/// Makes user `name` with `password` and `rules`.
async fn user(server: &RedisServer, name: &str, password: &str, rules: &str) {
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER")
        .arg(name)
        .arg("reset")
        .arg("on")
        .arg(format!(">{password}"));
    for rule in rules.split_whitespace() {
        cmd.arg(rule);
    }
    let _: () = cmd.query_async(&mut con).await.unwrap();
}

/// The server's URL as user `name`.
fn url_as(server: &RedisServer, name: &str, password: &str) -> String {
    format!("redis://{name}:{password}@127.0.0.1:{}", server.port())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_and_operators_run_with_their_least_privileges() {
    let Some(server) = require() else { return };
    user(&server, "worker", "w-secret-0123456789", WORKER).await;
    user(&server, "operator", "o-secret-0123456789", OPERATOR).await;
    let as_worker = url_as(&server, "worker", "w-secret-0123456789");
    let as_operator = url_as(&server, "operator", "o-secret-0123456789");

    // The worker's side: every producer and worker call, and a pool of workers.
    let jobs: RedisQueue<String> = RedisQueue::builder("jobs")
        .url(as_worker.as_str())
        .lease_duration(Duration::from_secs(2))
        .rate_limit(RateLimit::exponential(
            Duration::from_millis(1),
            Duration::from_millis(10),
        ))
        .build()
        .await
        .expect("the worker's user builds a queue");
    jobs.add_all((0..20).map(|i| format!("job-{i}")))
        .await
        .unwrap();
    jobs.add_with("urgent".to_owned(), AddOptions::default().priority(5))
        .await
        .unwrap();
    jobs.add_after("later".to_owned(), Duration::from_millis(50))
        .await
        .unwrap();
    let lease = jobs.try_get().await.unwrap().into_lease().unwrap();
    assert_eq!(lease.item(), "urgent");
    lease.renew().await.unwrap();
    // A released lease's item goes back to the head of its list (`LPUSH`).
    let dropped = jobs.try_get().await.unwrap().into_lease().unwrap();
    dropped.release().await.unwrap();
    let next = jobs.done_and_get(lease, false).await.unwrap().unwrap();
    jobs.add_rate_limited(next.item().clone()).await.unwrap();
    assert_eq!(jobs.num_requeues(next.item().clone()).await.unwrap(), 1);
    jobs.forget(next.item().clone()).await.unwrap();
    next.done().await.unwrap();
    assert!(jobs.len().await.unwrap() > 0);
    jobs.processing_len().await.unwrap();
    jobs.delayed_len().await.unwrap();
    // An item that does not deserialize goes to the dead letters, by the worker's hand.
    let any: RedisQueue<serde_json::Value> = RedisQueue::builder("jobs")
        .url(as_worker.as_str())
        .build()
        .await
        .unwrap();
    any.add(serde_json::json!({"not": "a string"}))
        .await
        .unwrap();
    let workers = Workers::new(jobs.clone())
        .count(4)
        .spawn_async(|_: String| async { Outcome::Done });
    let mut remaining = usize::MAX;
    for _ in 0..200 {
        remaining = jobs.len().await.unwrap()
            + jobs.delayed_len().await.unwrap()
            + jobs.processing_len().await.unwrap();
        if remaining == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let summary = workers.shut_down().await;
    assert_eq!(remaining, 0, "the workers ran every job");
    assert!(summary.processed >= 20, "{summary:?}");

    // The operator's side: the contract, as the dashboard and wq use it.
    let operator: Box<dyn Admin> = Box::new(RedisAdmin::new(&as_operator, "wq").unwrap());
    let listed = operator
        .queues()
        .await
        .expect("the operator lists the queues");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].dead, 1, "{listed:?}");
    operator.stats("jobs", 10).await.unwrap();
    let page = operator
        .page("jobs", &PageQuery::new(ItemState::Dead, 10))
        .await
        .unwrap();
    assert_eq!(page.items.len(), 1);
    assert_eq!(operator.pause("jobs").await, Ok(true));
    assert_eq!(operator.resume("jobs").await, Ok(true));
    let letters = operator.dead_letters("jobs", End::First, 10).await.unwrap();
    assert_eq!(
        operator
            .requeue_dead_letter_by_id("jobs", &letters[0].id)
            .await,
        Ok(true)
    );
    // (The pool's stop shut its handle, `jobs`, down: another adds.)
    any.add(serde_json::json!("one more")).await.unwrap();
    assert!(
        operator
            .item_detail("jobs", "\"one more\"")
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(operator.shut_down_fleet("jobs").await, Ok(true));
    assert_eq!(operator.resume_fleet("jobs").await, Ok(true));

    // The worker's user cannot do what only an operator does.
    let impostor: Box<dyn Admin> = Box::new(RedisAdmin::new(&as_worker, "wq").unwrap());
    let refused = |answer: Result<String, AdminError>, what: &str| match answer {
        // Refused by the ACL: a command of its own, or one a script runs.
        Err(AdminError::Backend(m))
            if m.contains("NoPerm") || m.contains("can't run this command") => {}
        other => panic!("{what} as the worker: expected an ACL refusal, got {other:?}"),
    };
    refused(
        impostor.queues().await.map(|q| format!("{q:?}")),
        "listing the queues",
    );
    // The scripts' writes are a worker's too, so the worker's user can shut the queue down,
    // but not end the shut down (its `DEL` is an operator's).
    assert_eq!(impostor.shut_down_fleet("jobs").await, Ok(true));
    refused(
        impostor.resume_fleet("jobs").await.map(|b| b.to_string()),
        "ending a shut down",
    );
    assert_eq!(operator.resume_fleet("jobs").await, Ok(true));
    refused(
        impostor
            .purge_dead_letters("jobs")
            .await
            .map(|n| n.to_string()),
        "purging the dead letters",
    );
    // ... which the operator can.
    let purged = operator.purge_dead_letters("jobs").await;
    assert!(purged.is_ok(), "{purged:?}");
}

/// What a worker needs beyond [`WORKER`] on a queue with flow control, as docs/redis.md
/// gives it.
const FLOW_WORKER: &str = "+hgetall +hsetnx";

/// A queue with flow control runs as a worker's user with the few more commands
/// docs/redis.md names (groups, limits, a rate, a release, delayed adds, a pool of
/// workers), and an operator reads its groups and clears its flow control.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_runs_with_the_workers_few_more_commands() {
    let Some(server) = require() else { return };
    user(
        &server,
        "flow-worker",
        "f-secret-0123456789",
        &format!("{WORKER} {FLOW_WORKER}"),
    )
    .await;
    user(&server, "operator", "o-secret-0123456789", OPERATOR).await;
    let as_worker = url_as(&server, "flow-worker", "f-secret-0123456789");
    let as_operator = url_as(&server, "operator", "o-secret-0123456789");
    let fair: RedisQueue<String> = RedisQueue::builder("fair")
        .url(as_worker.as_str())
        .lease_duration(Duration::from_secs(2))
        .group_by(|item: &String| item.split_once('/').map_or("", |(g, _)| g).to_owned())
        .max_in_flight_per_group(1)
        .hand_out_rate_per_group(1000.0, 10)
        .build()
        .await
        .expect("the worker's user builds a queue with flow control");
    fair.add_all(["a/0", "a/1", "b/0"].map(str::to_owned))
        .await
        .unwrap();
    fair.add_after("c/0".to_owned(), Duration::from_millis(20))
        .await
        .unwrap();
    let first = fair.try_get().await.unwrap().into_lease().unwrap();
    assert_eq!(first.item(), "a/0");
    first.release().await.unwrap();
    // a had its turn: b's comes, then a's released item, back at the head of its group.
    for expected in ["b/0", "a/0"] {
        let next = fair.try_get().await.unwrap().into_lease().unwrap();
        assert_eq!(next.item(), expected);
        next.done().await.unwrap();
    }
    let workers = Workers::new(fair.clone())
        .count(3)
        .spawn_async(|_: String| async { Outcome::Done });
    let mut left = usize::MAX;
    for _ in 0..200 {
        left = fair.len().await.unwrap()
            + fair.delayed_len().await.unwrap()
            + fair.processing_len().await.unwrap();
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    workers.shut_down().await;
    assert_eq!(left, 0, "the workers ran every item");

    let operator = RedisAdmin::new(&as_operator, "wq").unwrap();
    let stats = Admin::stats(&operator, "fair", 10).await.unwrap();
    assert!(
        stats.limits.as_ref().is_some_and(|l| l.grouped),
        "{stats:?}"
    );
    let handle: RedisQueue<String> = operator.queue("fair").build().await.unwrap();
    assert!(handle.clear_flow_control().await.unwrap());
}
