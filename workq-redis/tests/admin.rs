//! The operator's side over a live `redis-server`: one [`RedisAdmin`] connection for every queue
//! (listing, figures, a restart of the server, a broken queue), pages of items from both ends
//! with search, one item's detail, and the single-item actions, each keeping the queue's
//! rules.

mod support;

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use support::server::{Durability, RedisServer, require, require_with};
use workq::AddOptions;
use workq::admin::{End, ItemState, PageQuery, Retried};
use workq_redis::{RedisAdmin, RedisQueue};

async fn admin(server: &RedisServer) -> RedisAdmin {
    RedisAdmin::connect(redis::Client::open(server.url()).unwrap(), "wq")
        .await
        .unwrap()
}

async fn queue(server: &RedisServer, name: &str) -> RedisQueue<String> {
    RedisQueue::<String>::builder(name)
        .url(server.url())
        .check_persistence(false)
        .build()
        .await
        .unwrap()
}

/// The clients the server counts, less the one asking.
async fn clients(server: &RedisServer) -> usize {
    let mut con = support::raw(server).await;
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut con)
        .await
        .unwrap();
    list.lines().count() - 1
}

fn json(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_lists_every_queue_with_its_figures() {
    let Some(server) = require() else { return };
    for i in 0..60 {
        let q = queue(&server, &format!("q{i:02}")).await;
        for j in 0..=(i % 3) {
            q.add(format!("item-{j}")).await.unwrap();
        }
        drop(q);
    }
    // Failures back off for minutes: "flaky" stays delayed however slow the machine is.
    let q: RedisQueue<String> = RedisQueue::builder("busy")
        .url(server.url())
        .check_persistence(false)
        .rate_limit(workq_redis::RateLimit::exponential(
            Duration::from_secs(300),
            Duration::from_secs(900),
        ))
        .build()
        .await
        .unwrap();
    q.add("a".to_owned()).await.unwrap();
    q.add("b".to_owned()).await.unwrap();
    let lease = q.try_get().await.unwrap().into_lease().unwrap();
    q.add_after("later".to_owned(), Duration::from_secs(600))
        .await
        .unwrap();
    q.add_rate_limited("flaky".to_owned()).await.unwrap();
    q.add_rate_limited("flaky".to_owned()).await.unwrap();
    q.pause().await.unwrap();
    drop(q);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = clients(&server).await;

    let admin = admin(&server).await;
    let all = admin.queues().await.unwrap();
    assert_eq!(all.len(), 61);
    assert!(
        all.windows(2).all(|w| w[0].name < w[1].name),
        "sorted by name"
    );
    for s in &all {
        let name = &s.name;
        assert_eq!(s.broken, None, "{name}");
        if let Some(i) = name.strip_prefix('q') {
            let i: u64 = i.parse().unwrap();
            assert_eq!(s.depth, i % 3 + 1, "{name}");
            assert_eq!(s.counters.unwrap().adds, i % 3 + 1, "{name}");
        }
    }
    let busy = all.iter().find(|s| s.name == "busy").unwrap();
    assert_eq!(
        (busy.depth, busy.in_flight, busy.delayed, busy.failing),
        (1, 1, 2, 1)
    );
    assert_eq!(busy.failures, 2);
    assert!(busy.paused);
    assert!(busy.longest_lease <= Duration::from_secs(60));
    // Handles made by the admin share its one connection.
    for s in &all {
        let q: RedisQueue<String> = admin.queue(&s.name).build().await.unwrap();
        q.stats(1).await.unwrap();
    }
    assert_eq!(
        clients(&server).await,
        before + 1,
        "one connection, whatever the number of queues and handles"
    );
    lease.done().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_the_wrong_type_breaks_only_its_own_queue() {
    let Some(server) = require() else { return };
    queue(&server, "good")
        .await
        .add("x".to_owned())
        .await
        .unwrap();
    let mut con = support::raw(&server).await;
    let _: () = con.set("wq:{bad}:ready", "not a list").await.unwrap();
    let admin = admin(&server).await;
    let all = admin.queues().await.unwrap();
    let names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["bad", "good"]);
    let error = all[0].broken.as_deref().unwrap();
    assert!(error.contains("WRONGTYPE"), "{error}");
    assert_eq!(all[1].depth, 1);
    assert_eq!(all[1].broken, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_answers_again_after_the_server_restarts() {
    let Some(mut server) = require_with(Durability::Always, &[]) else {
        return;
    };
    queue(&server, "jobs")
        .await
        .add("x".to_owned())
        .await
        .unwrap();
    let admin = admin(&server).await;
    assert_eq!(admin.queues().await.unwrap().len(), 1);
    let jobs: RedisQueue<String> = admin.queue("jobs").build().await.unwrap();

    server.kill();
    assert!(admin.queues().await.is_err(), "the server is down");
    assert!(jobs.stats(1).await.is_err());
    server.restart();
    // The script cache is empty after the restart; the connection reconnects by itself.
    let deadline = Instant::now() + Duration::from_secs(30);
    let all = loop {
        match admin.queues().await {
            Ok(all) => break all,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "no answer after the restart: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(all[0].depth, 1, "kept by the AOF");
    assert_eq!(jobs.stats(1).await.unwrap().summary.depth, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_reach_both_ends_of_a_long_dead_letter_list_and_search_it() {
    let Some(server) = require_with(Durability::None, &[]) else {
        return;
    };
    let q = queue(&server, "big").await;
    // 30,000 dead letters, written as the scripts write them; one in the middle is special.
    let mut con = support::raw(&server).await;
    let n = 30_000;
    for chunk in (0..n).collect::<Vec<_>>().chunks(5_000) {
        let mut pipe = redis::pipe();
        for i in chunk {
            let item = if *i == 17_345 {
                json("needle-in-the-middle")
            } else {
                json(&format!("letter-{i}"))
            };
            let entry = serde_json::json!({
                "item": item, "error": "boom", "at_ms": 1, "stalls": 0, "failures": 0,
                "token": "1",
            });
            pipe.rpush("wq:{big}:dead", entry.to_string()).ignore();
        }
        let _: () = pipe.query_async(&mut con).await.unwrap();
    }

    let oldest = q.page(&PageQuery::new(ItemState::Dead, 50)).await.unwrap();
    assert_eq!(oldest.total, n);
    assert_eq!(oldest.items.len(), 50);
    assert_eq!(oldest.items[0].item, json("letter-0"));
    let second = q
        .page(&PageQuery::new(ItemState::Dead, 50).cursor(oldest.next.clone()))
        .await
        .unwrap();
    assert_eq!(second.items[0].item, json("letter-50"));
    let newest = q
        .page(&PageQuery::new(ItemState::Dead, 10).from(End::Last))
        .await
        .unwrap();
    assert_eq!(newest.items[0].item, json(&format!("letter-{}", n - 1)));
    assert_eq!(newest.items[9].item, json(&format!("letter-{}", n - 10)));
    let letter = newest.items[0].dead.as_ref().unwrap();
    assert_eq!(letter.error, "boom");

    // The search looks at 10,000 entries per call at most: it takes two calls to reach the
    // needle from the oldest end, and finds it once.
    let mut cursor: Option<String> = None;
    let mut found = Vec::new();
    let mut calls = 0;
    loop {
        let query = PageQuery::new(ItemState::Dead, 20)
            .cursor(cursor.clone())
            .search(Some("NEEDLE".to_owned()));
        let page = q.page(&query).await.unwrap();
        calls += 1;
        found.extend(page.items);
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(calls, 3, "30,000 entries in calls of 10,000");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].item, json("needle-in-the-middle"));

    // One dead letter by id: requeued once, then gone (idempotent).
    let id = found[0].dead.as_ref().unwrap().id.clone();
    assert!(q.requeue_dead_letter_by_id(&id).await.unwrap());
    assert!(!q.requeue_dead_letter_by_id(&id).await.unwrap());
    assert_eq!(q.len().await.unwrap(), 1);
    let other = newest.items[1].dead.as_ref().unwrap().id.clone();
    assert!(q.delete_dead_letter_by_id(&other).await.unwrap());
    assert!(!q.delete_dead_letter_by_id(&other).await.unwrap());
    assert_eq!(q.stats(1).await.unwrap().summary.dead, n - 2);
    assert!(q.requeue_dead_letter_by_id("hex:zz").await.is_err());

    // The purge drops the list with UNLINK, in one call.
    assert_eq!(q.purge_dead_letters().await.unwrap(), n - 2);
    assert_eq!(q.stats(1).await.unwrap().summary.dead, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_pages_follow_the_hand_out_order_across_priorities() {
    let Some(server) = require() else { return };
    let q = queue(&server, "prio").await;
    for (item, p) in [("a", 0), ("b", 5), ("c", -2), ("d", 0), ("e", 5), ("f", 9)] {
        q.add_with(item.to_owned(), AddOptions::default().priority(p))
            .await
            .unwrap();
    }
    let first = q
        .page(&PageQuery::new(ItemState::Ready, 100))
        .await
        .unwrap();
    let order: Vec<(String, Option<i32>)> = first
        .items
        .iter()
        .map(|e| (e.item.clone(), e.priority))
        .collect();
    let expected = [("f", 9), ("b", 5), ("e", 5), ("a", 0), ("d", 0), ("c", -2)];
    assert_eq!(
        order,
        expected
            .iter()
            .map(|(i, p)| (json(i), Some(*p)))
            .collect::<Vec<_>>()
    );
    // Pages of two from the last end, joined, are the same order reversed.
    let mut back = Vec::new();
    let mut cursor = None;
    loop {
        let query = PageQuery::new(ItemState::Ready, 2)
            .from(End::Last)
            .cursor(cursor.clone());
        let page = q.page(&query).await.unwrap();
        back.extend(page.items.into_iter().map(|e| e.item));
        match page.next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    back.reverse();
    assert_eq!(
        back,
        first
            .items
            .iter()
            .map(|e| e.item.clone())
            .collect::<Vec<_>>()
    );
    // The detail of a queued item tells its place in line.
    let info = q.item_detail(&json("e")).await.unwrap().unwrap();
    assert_eq!(info.states, [ItemState::Ready]);
    assert_eq!((info.priority, info.position), (Some(5), Some(2)));
    // What the pages said is what the queue hands out.
    for (item, _) in expected {
        let lease = q.try_get().await.unwrap().into_lease().unwrap();
        assert_eq!(lease.item(), item);
        lease.done().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_now_and_remove_keep_the_queues_rules() {
    let Some(server) = require() else { return };
    // Failures back off for minutes, so nothing comes due during the test.
    let q: RedisQueue<String> = RedisQueue::builder("ops")
        .url(server.url())
        .check_persistence(false)
        .rate_limit(workq_redis::RateLimit::exponential(
            Duration::from_secs(300),
            Duration::from_secs(900),
        ))
        .build()
        .await
        .unwrap();
    q.add_after("later".to_owned(), Duration::from_secs(600))
        .await
        .unwrap();
    q.add_rate_limited("flaky".to_owned()).await.unwrap();
    let delayed = q
        .page(&PageQuery::new(ItemState::Delayed, 10))
        .await
        .unwrap();
    assert_eq!(delayed.total, 2);
    assert!(delayed.items[0].due_in.unwrap() <= Duration::from_secs(600));

    // A delayed item runs now, once; a second call changes nothing.
    assert_eq!(q.retry_now(&json("later")).await.unwrap(), Retried::Queued);
    assert_eq!(
        q.retry_now(&json("later")).await.unwrap(),
        Retried::AlreadyQueued
    );
    assert_eq!(
        q.retry_now(&json("nobody")).await.unwrap(),
        Retried::Unknown
    );
    assert_eq!(q.len().await.unwrap(), 1);
    assert_eq!(q.delayed_len().await.unwrap(), 1);

    // A failing item keeps its count when retried now.
    assert_eq!(q.retry_now(&json("flaky")).await.unwrap(), Retried::Queued);
    assert_eq!(q.num_requeues("flaky".to_owned()).await.unwrap(), 1);
    let failing = q
        .page(&PageQuery::new(ItemState::Failing, 10))
        .await
        .unwrap();
    assert_eq!(failing.items[0].failures, Some(1));

    // Under a lease: nothing to bring forward, until a delayed re-add is pending.
    let lease = q.try_get().await.unwrap().into_lease().unwrap();
    assert_eq!(
        lease.item(),
        "later",
        "FIFO: retried first, handed out first"
    );
    assert_eq!(
        q.retry_now(&json("later")).await.unwrap(),
        Retried::InFlight
    );
    q.add_after("later".to_owned(), Duration::from_secs(600))
        .await
        .unwrap();
    assert_eq!(
        q.retry_now(&json("later")).await.unwrap(),
        Retried::Deferred
    );
    let info = q.item_detail(&json("later")).await.unwrap().unwrap();
    assert!(info.readded && info.lease.is_some() && !info.states.contains(&ItemState::Ready));
    assert_eq!(info.lease.as_ref().unwrap().token, lease.token());

    // Remove: a leased item keeps its lease, only the pending re-add goes; done works.
    let removed = q.remove(&json("later")).await.unwrap();
    assert!(removed.readd && !removed.queued && removed.leased);
    lease.done().await.unwrap();
    assert!(q.item_detail(&json("later")).await.unwrap().is_none());

    // Remove a queued item: it is gone with its failure count, and a new add queues it once.
    let removed = q.remove(&json("flaky")).await.unwrap();
    assert!(removed.queued && removed.counts);
    assert!(!q.remove(&json("flaky")).await.unwrap().any(), "idempotent");
    assert_eq!(q.len().await.unwrap(), 0);
    q.add("flaky".to_owned()).await.unwrap();
    q.add("flaky".to_owned()).await.unwrap();
    assert_eq!(q.len().await.unwrap(), 1, "dedup holds after a remove");
}

#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_listing_finds_the_queues_of_every_primary() {
    if !support::server::require_binary() {
        return;
    }
    let Some(cluster) = support::server::RedisCluster::start() else {
        return;
    };
    let urls = cluster.urls();
    let names: Vec<String> = (0..30).map(|i| format!("c{i}")).collect();
    for name in &names {
        let q: RedisQueue<String> = RedisQueue::builder(name.as_str())
            .cluster(urls.clone())
            .check_persistence(false)
            .build()
            .await
            .unwrap();
        q.add("x".to_owned()).await.unwrap();
    }
    // The queues' slots are spread over the three primaries.
    let mut per_node = Vec::new();
    for node in &cluster.nodes {
        let mut con = support::raw(node).await;
        let keys: Vec<String> = con.keys("wq:{*}:ready").await.unwrap();
        per_node.push(keys.len());
    }
    assert!(per_node.iter().all(|&n| n > 0), "{per_node:?}");

    let admin = RedisAdmin::connect_cluster(urls, "wq").await.unwrap();
    let mut listed: Vec<String> = admin
        .queues()
        .await
        .unwrap()
        .into_iter()
        .map(|s| {
            assert_eq!(s.depth, 1);
            s.name
        })
        .collect();
    listed.sort();
    let mut expected = names.clone();
    expected.sort();
    assert_eq!(listed, expected);
    let q: RedisQueue<String> = admin.queue("c7").build().await.unwrap();
    assert!(q.pause().await.unwrap());
    assert!(q.try_get().await.unwrap().is_empty());
}

/// On a cluster every primary's settings are checked, each on its own: an eviction policy
/// set on one running primary is reported by the admin's status naming that primary, and by
/// the handle of each queue whose slot it holds (and by no other).
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_has_the_settings_of_every_primary_checked() {
    if !support::server::require_binary() {
        return;
    }
    let Some(cluster) = support::server::RedisCluster::start() else {
        return;
    };
    let urls = cluster.urls();
    let admin = RedisAdmin::cluster(urls.clone(), "wq")
        .unwrap()
        .settings_check_interval(Duration::ZERO);
    let status = |admin: &RedisAdmin| workq::admin::Admin::status(admin);
    workq::admin::Admin::queues(&admin).await.unwrap();
    assert_eq!(status(&admin).warnings, Vec::<String>::new());
    let details = status(&admin).details.unwrap();
    for node in &cluster.nodes {
        assert!(
            details.contains(&format!("127.0.0.1:{}: redis ", node.port())),
            "{details}"
        );
    }

    let evicting = &cluster.nodes[1];
    support::set_eviction(&evicting.url(), "allkeys-lru").await;
    let mut con = support::raw(evicting).await;
    workq::admin::Admin::queues(&admin).await.unwrap();
    assert_eq!(
        status(&admin).warnings,
        [format!(
            "127.0.0.1:{}: maxmemory-policy is \"allkeys-lru\": the server may evict the \
             queue's keys (set noeviction)",
            evicting.port()
        )]
    );

    // A worker's handle reads the primary of its queue's slot, where its keys are.
    let mut seen = [false, false];
    for i in 0..12 {
        let name = format!("w{i}");
        let q: RedisQueue<String> = RedisQueue::builder(name.as_str())
            .cluster(urls.clone())
            .build()
            .await
            .unwrap();
        q.add("x".to_owned()).await.unwrap();
        let keys: Vec<String> = con.keys(format!("wq:{{{name}}}:*")).await.unwrap();
        let on_evicting = !keys.is_empty();
        let problems = q.persistence().unwrap().problems();
        let expected: Vec<String> = if on_evicting {
            vec![
                "maxmemory-policy is \"allkeys-lru\": the server may evict the queue's keys \
                 (set noeviction)"
                    .to_owned(),
            ]
        } else {
            Vec::new()
        };
        assert_eq!(problems, expected, "queue {name}");
        seen[usize::from(on_evicting)] = true;
    }
    assert_eq!(seen, [true, true], "queues on that primary and on others");
}

/// Every command the server has run so far, by `INFO commandstats` (commands run by
/// scripts included).
async fn commands_run(con: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| {
            line.split_once("calls=")?
                .1
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// The commands one listing costs the server, less those of the measure itself.
async fn listing_cost(admin: &RedisAdmin, con: &mut redis::aio::MultiplexedConnection) -> u64 {
    let before = commands_run(con).await;
    admin.queues().await.unwrap();
    commands_run(con).await - before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_costs_the_same_beside_a_million_unrelated_keys() {
    let Some(server) = require_with(Durability::None, &["--enable-debug-command", "yes"]) else {
        return;
    };
    let names = ["jobs", "mail", "pods", "reports", "thumbnails"];
    for name in names {
        queue(&server, name)
            .await
            .add("x".to_owned())
            .await
            .unwrap();
    }
    // A queue of a version that kept no index: its keys only.
    let mut con = support::raw(&server).await;
    let _: () = con.rpush("wq:{legacy}:ready", json("old")).await.unwrap();
    let _: () = con.sadd("wq:{legacy}:dirty", json("old")).await.unwrap();
    let admin = admin(&server).await;
    // The first listing finds it by the first step of the one-time scan (the keyspace is
    // small: one step scans it all), and indexes it.
    let listed: Vec<String> = admin
        .queues()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(
        listed,
        ["jobs", "legacy", "mail", "pods", "reports", "thumbnails"]
    );

    let alone = listing_cost(&admin, &mut con).await;
    // A second or so of the server's time: longer than the default response timeout.
    let mut slow = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection_with_config(
            &redis::AsyncConnectionConfig::new()
                .set_response_timeout(Some(Duration::from_secs(60))),
        )
        .await
        .unwrap();
    let _: () = redis::cmd("DEBUG")
        .arg("POPULATE")
        .arg(1_000_000)
        .arg("junk")
        .query_async(&mut slow)
        .await
        .unwrap();
    let size: u64 = redis::cmd("DBSIZE").query_async(&mut con).await.unwrap();
    assert!(size > 1_000_000, "{size} keys");
    let crowded = listing_cost(&admin, &mut con).await;
    assert_eq!(
        crowded, alone,
        "a listing's commands do not grow with the keyspace"
    );
    let all = admin.queues().await.unwrap();
    assert_eq!(all.len(), 6, "every queue is still found");
    assert!(all.iter().all(|s| s.depth == 1), "{all:?}");

    // A queue deleted through the admin leaves the index, and the listing.
    let pods: RedisQueue<String> = admin.queue("pods").build().await.unwrap();
    pods.delete().await.unwrap();
    let index: Vec<String> = con.smembers("wq:queues").await.unwrap();
    assert!(!index.contains(&"pods".to_owned()), "{index:?}");
    assert_eq!(admin.queues().await.unwrap().len(), 5);
    assert_eq!(admin.queue_names().await.unwrap().len(), 5);
}

/// A name in the index that no queue can have (someone wrote it there) is skipped, and the
/// real queues are listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_name_in_the_index_is_skipped() {
    let Some(server) = require() else { return };
    queue(&server, "jobs")
        .await
        .add("x".to_owned())
        .await
        .unwrap();
    let mut con = support::raw(&server).await;
    let _: () = con
        .sadd("wq:queues", &["a}:x", "white space", "{jobs}", ""])
        .await
        .unwrap();
    let admin = admin(&server).await;
    assert_eq!(admin.queue_names().await.unwrap(), ["jobs"]);
    let listed = admin.queues().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].name.as_str(), listed[0].depth), ("jobs", 1));
}

/// A queue made through the admin's own handles is listed once it holds an item: the handle
/// registers at its first add (not at build, so that an operator's look creates nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_an_admin_handle_adds_to_is_listed() {
    let Some(server) = require() else { return };
    let admin = admin(&server).await;
    assert_eq!(admin.queue_names().await.unwrap(), Vec::<String>::new());
    let made: RedisQueue<String> = admin.queue("made-here").build().await.unwrap();
    assert_eq!(
        admin.queue_names().await.unwrap(),
        Vec::<String>::new(),
        "built, not registered"
    );
    made.add("x".to_owned()).await.unwrap();
    let listed = admin.queues().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].name.as_str(), listed[0].depth), ("made-here", 1));
}
