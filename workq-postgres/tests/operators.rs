//! What operators do: dead letters (list, requeue one or all, delete, purge) lose nothing and
//! count what they did, also while the queue is shut down; pause and resume; stats; delete.

mod support;

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use support::{PgServer, unique};
use workq_postgres::{Error, PgQueue};

async fn queue(server: &PgServer, name: &str) -> PgQueue<String> {
    PgQueue::builder(name)
        .url(server.url())
        .lease_duration(Duration::from_secs(30))
        .poll_interval(Duration::from_secs(30))
        .build()
        .await
        .expect("connect to the test server")
}

async fn admin(server: &PgServer) -> PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .connect(&server.url())
        .await
        .unwrap()
}

/// Puts `n` dead letters of items `prefix0..` into queue `q` directly (what a thousand
/// poisoned items would leave).
async fn bury(admin: &PgPool, q: &PgQueue<String>, prefix: &str, n: usize) {
    sqlx::query(
        "INSERT INTO workqueue_dead (queue, item, reason, stalls, failures)
         SELECT s.id, to_jsonb($2 || i)::text, 'stalled', 5, 0
         FROM workqueue_queues s, generate_series(0, $3 - 1) i WHERE s.name = $1",
    )
    .bind(q.name())
    .bind(prefix)
    .bind(i32::try_from(n).unwrap())
    .execute(admin)
    .await
    .unwrap();
}

async fn dead_count(admin: &PgPool, q: &PgQueue<String>) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM workqueue_dead d JOIN workqueue_queues s ON s.id = d.queue
         WHERE s.name = $1",
    )
    .bind(q.name())
    .fetch_one(admin)
    .await
    .unwrap()
}

/// Everything ready, in order.
async fn drain(q: &PgQueue<String>) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let next = q.try_get_many(500).await.unwrap();
        if next.is_empty() {
            return out;
        }
        out.extend(next.iter().map(|l| l.item().clone()));
        let _ = q
            .done_and_get_many(next.into_iter().map(|l| (l, false)).collect(), 0)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeueing_dead_letters_while_shut_down_refuses_and_keeps_them() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let q = queue(&server, &unique("dead")).await;
    bury(&admin, &q, "d", 3).await;
    q.shut_down_fleet().await.unwrap();
    assert!(matches!(
        q.requeue_dead_letters().await,
        Err(Error::ShutDown)
    ));
    let one = q
        .dead_letters(workq::admin::End::Last, 1)
        .await
        .unwrap()
        .remove(0);
    assert!(matches!(
        q.requeue_dead_letter(&one).await,
        Err(Error::ShutDown)
    ));
    assert_eq!(dead_count(&admin, &q).await, 3, "every letter is kept");
    // A handle that is shut down refuses too.
    q.resume_fleet().await.unwrap();
    let closed = queue(&server, q.name()).await;
    closed.shut_down();
    assert!(matches!(
        closed.requeue_dead_letters().await,
        Err(Error::ShutDown)
    ));
    assert_eq!(dead_count(&admin, &q).await, 3);
    // Running: the count is the number of items queued again.
    assert!(q.requeue_dead_letter(&one).await.unwrap());
    assert!(!q.requeue_dead_letter(&one).await.unwrap(), "gone already");
    assert_eq!(q.requeue_dead_letters().await.unwrap(), 2);
    assert_eq!(dead_count(&admin, &q).await, 0);
    let mut items = drain(&q).await;
    items.sort();
    assert_eq!(items, ["d0", "d1", "d2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_dead_letter_lists_are_worked_through_in_steps_with_exact_counts() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let q = queue(&server, &unique("dead-many")).await;
    bury(&admin, &q, "x", 2500).await;
    // Two of them are queued already: their letters count as queued again (the item is).
    q.add("x7".to_owned()).await.unwrap();
    q.add("x2400".to_owned()).await.unwrap();
    assert_eq!(q.requeue_dead_letters().await.unwrap(), 2500);
    assert_eq!(q.len().await.unwrap(), 2500);
    let items = drain(&q).await;
    assert_eq!(items.len(), 2500);
    assert_eq!(items[0], "x7", "the queued item kept its place");
    // Oldest letters first after the items already queued.
    assert_eq!(&items[2..4], ["x0", "x1"]);

    bury(&admin, &q, "y", 2345).await;
    let id = q.dead_letters(workq::admin::End::Last, 1).await.unwrap()[0]
        .id
        .clone();
    assert!(q.delete_dead_letter_by_id(&id).await.unwrap());
    assert!(!q.delete_dead_letter_by_id(&id).await.unwrap());
    assert_eq!(q.purge_dead_letters().await.unwrap(), 2344);
    assert_eq!(q.purge_dead_letters().await.unwrap(), 0);
    assert_eq!(dead_count(&admin, &q).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_queue_hands_out_nothing_keeps_its_adds_and_wakes_getters_on_resume() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let q = queue(&server, &unique("pause")).await;
    assert!(q.pause().await.unwrap(), "it was running");
    assert!(!q.pause().await.unwrap(), "paused already");
    assert!(q.is_paused().await.unwrap());
    q.add("a".to_owned()).await.unwrap();
    q.add_after("b".to_owned(), Duration::from_millis(10))
        .await
        .unwrap();
    assert!(q.try_get().await.unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(q.len().await.unwrap(), 2, "a, and b whose delay ran out");
    assert!(q.try_get().await.unwrap().is_empty());
    // A getter waits (the poll interval is 30 s), and the resume wakes it at once.
    let getter = {
        let q = q.clone();
        tokio::spawn(async move { q.get().await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!getter.is_finished(), "nothing is handed out while paused");
    let resumed = std::time::Instant::now();
    assert!(q.resume().await.unwrap());
    let lease = tokio::time::timeout(Duration::from_secs(10), getter)
        .await
        .expect("woken by the resume, not by a poll")
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(resumed.elapsed() < Duration::from_secs(10));
    assert_eq!(lease.item(), "a");
    lease.done().await.unwrap();
    assert_eq!(drain(&q).await, ["b"]);
    assert!(!q.is_paused().await.unwrap());
    // Paused and shut down for the fleet: getters end.
    q.pause().await.unwrap();
    q.shut_down_fleet().await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), q.get())
        .await
        .expect("a paused queue that is shut down ends its getters")
        .unwrap();
    assert!(ended.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_show_every_part_and_delete_empties_the_queue() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let q: PgQueue<String> = PgQueue::builder(unique("stats"))
        .url(server.url())
        .backoff(Duration::from_secs(60), Duration::from_secs(600))
        .token_bucket(None)
        .build()
        .await
        .unwrap();
    q.add_all(["a", "b", "c"].map(String::from)).await.unwrap();
    q.add_after("later".to_owned(), Duration::from_secs(60))
        .await
        .unwrap();
    q.add_rate_limited("failing".to_owned()).await.unwrap();
    let held = q.try_get().await.unwrap().into_lease().unwrap();
    q.add(held.item().clone()).await.unwrap(); // re-added while leased
    bury(&admin, &q, "dead", 2).await;
    let stats = q.stats(10).await.unwrap();
    let s = &stats.summary;
    assert_eq!(s.depth, 2);
    assert_eq!(s.delayed, 2, "later and the rate-limited retry");
    assert_eq!(s.in_flight, 1);
    assert_eq!(s.in_flight_dirty, 1);
    assert_eq!(s.failing, 1);
    assert_eq!(s.dead, 2);
    assert!(!s.shut_down && !s.paused);
    assert_eq!(s.capped_at, None, "a handle's counts are exact");
    assert_eq!(stats.leases.len(), 1);
    assert_eq!(stats.leases[0].item, "\"a\"");
    assert_eq!(stats.failures, [("\"failing\"".to_owned(), 1)]);
    assert!(
        stats
            .next_delayed_in
            .is_some_and(|d| d <= Duration::from_secs(60))
    );

    q.delete().await.unwrap();
    assert!(held.done().await.unwrap_err().is_lease_lost());
    let stats = q.stats(10).await.unwrap().summary;
    assert_eq!(
        (
            stats.depth,
            stats.delayed,
            stats.in_flight,
            stats.failing,
            stats.dead
        ),
        (0, 0, 0, 0, 0)
    );
    // The handle goes on on the empty queue.
    q.add("again".to_owned()).await.unwrap();
    assert_eq!(drain(&q).await, ["again"]);
}

use workq::AddOptions;
use workq::admin::{ItemState, PageQuery, Removed, Retried};

/// Every page of `query` in turn.
async fn all_pages(q: &PgQueue<String>, mut query: PageQuery) -> (Vec<String>, usize) {
    let mut items = Vec::new();
    let mut pages = 0;
    loop {
        let page = q.page(&query).await.unwrap();
        pages += 1;
        items.extend(page.items.into_iter().map(|i| i.item));
        match page.next {
            Some(next) => query = query.cursor(Some(next)),
            None => return (items, pages),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_of_every_state_reach_both_ends_and_searches_go_on_where_they_stopped() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let q = queue(&server, &unique("pages")).await;
    // Ready: 2,500 at priority 0 and 3 raised to 5, which come first.
    q.add_all((0..2500).map(|i| format!("r{i:04}")))
        .await
        .unwrap();
    for i in [7, 70, 700] {
        q.add_with(format!("r{i:04}"), AddOptions::default().priority(5))
            .await
            .unwrap();
    }
    let mut handout: Vec<String> = ["r0007", "r0070", "r0700"].map(String::from).to_vec();
    handout.extend(
        (0..2500)
            .map(|i| format!("r{i:04}"))
            .filter(|r| !["r0007", "r0070", "r0700"].contains(&r.as_str())),
    );
    let handout: Vec<String> = handout.into_iter().map(|r| format!("\"{r}\"")).collect();
    let (ready, pages) = all_pages(&q, PageQuery::new(ItemState::Ready, 1000)).await;
    assert_eq!((ready.len(), pages), (2503 - 3, 3));
    assert_eq!(ready, handout);
    let (backwards, _) = all_pages(
        &q,
        PageQuery::new(ItemState::Ready, 700).from(workq::admin::End::Last),
    )
    .await;
    let mut reversed = handout.clone();
    reversed.reverse();
    assert_eq!(backwards, reversed);
    let first = q.page(&PageQuery::new(ItemState::Ready, 10)).await.unwrap();
    assert_eq!(first.total, 2500);
    assert_eq!(first.items[0].priority, Some(5));

    // Delayed, soonest first; in flight; failing.
    q.add_all_after((0..30).map(|i| (format!("d{i:02}"), Duration::from_secs(600 + i))))
        .await
        .unwrap();
    let (delayed, _) = all_pages(&q, PageQuery::new(ItemState::Delayed, 7)).await;
    assert_eq!(delayed.len(), 30);
    assert_eq!(delayed[0], "\"d00\"");
    assert_eq!(delayed[29], "\"d29\"");
    let held = q.try_get_many(5).await.unwrap();
    let page = q
        .page(&PageQuery::new(ItemState::InFlight, 10))
        .await
        .unwrap();
    assert_eq!(page.items.len(), 5);
    assert!(page.items.iter().all(|i| i.lease.is_some()));
    q.add_rate_limited("f".to_owned()).await.unwrap();
    let page = q
        .page(&PageQuery::new(ItemState::Failing, 10))
        .await
        .unwrap();
    assert_eq!(
        (page.items[0].item.as_str(), page.items[0].failures),
        ("\"f\"", Some(1))
    );

    // 12,000 dead letters: the newest first from the last end, and a search that has to read
    // more than one stretch of rows finds every match, page after page.
    bury(&admin, &q, "x", 12_000).await;
    let newest = q
        .page(&PageQuery::new(ItemState::Dead, 3).from(workq::admin::End::Last))
        .await
        .unwrap();
    assert_eq!(newest.total, 12_000);
    assert_eq!(newest.items[0].item, "\"x11999\"");
    assert!(
        newest.items[0]
            .dead
            .as_ref()
            .is_some_and(|d| d.error == "stalled")
    );
    let query = PageQuery::new(ItemState::Dead, 50).search(Some("X11".to_owned()));
    let (found, pages) = all_pages(&q, query).await;
    let want = (0..12_000)
        .filter(|i| format!("{i}").starts_with("11"))
        .count();
    assert_eq!(found.len(), want);
    assert!(found.iter().all(|f| f.starts_with("\"x11")));
    assert!(
        pages > 2,
        "a search reads bounded stretches ({pages} pages)"
    );
    // A wildcard in a search is text.
    let page = q
        .page(&PageQuery::new(ItemState::Dead, 10).search(Some("%".to_owned())))
        .await
        .unwrap();
    assert!(page.items.is_empty());
    // A cursor of another state is refused.
    let err = q
        .page(&PageQuery::new(ItemState::Ready, 10).cursor(Some("12".to_owned())))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
    let _ = q
        .done_and_get_many(held.into_iter().map(|l| (l, false)).collect(), 0)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_has_a_detail_and_single_item_actions_are_idempotent() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let q = queue(&server, &unique("one")).await;
    q.add_all(["a", "b", "c"].map(String::from)).await.unwrap();
    let detail = q.item_detail("\"c\"").await.unwrap().unwrap();
    assert_eq!(detail.states, [ItemState::Ready]);
    assert_eq!(detail.position, Some(2));
    assert!(q.item_detail("\"nothing\"").await.unwrap().is_none());

    // A delayed item with failures: retried now, its count kept; a second retry does nothing.
    q.add_after("late".to_owned(), Duration::from_secs(600))
        .await
        .unwrap();
    q.add_rate_limited("late".to_owned()).await.unwrap();
    let detail = q.item_detail("\"late\"").await.unwrap().unwrap();
    assert_eq!(detail.states, [ItemState::Delayed, ItemState::Failing]);
    assert!(detail.due_in.is_some());
    assert_eq!(q.retry_now("\"late\"").await.unwrap(), Retried::Queued);
    assert_eq!(
        q.retry_now("\"late\"").await.unwrap(),
        Retried::AlreadyQueued
    );
    let detail = q.item_detail("\"late\"").await.unwrap().unwrap();
    assert_eq!(detail.states, [ItemState::Ready, ItemState::Failing]);
    assert_eq!((detail.failures, detail.position), (1, Some(3)));

    // A leased item re-added: its detail, then remove drops the re-add and keeps the lease.
    let lease = q.try_get().await.unwrap().into_lease().unwrap();
    q.add(lease.item().clone()).await.unwrap();
    let detail = q.item_detail("\"a\"").await.unwrap().unwrap();
    assert_eq!(detail.states, [ItemState::InFlight]);
    assert!(detail.readded && detail.lease.is_some_and(|l| l.token == lease.token()));
    let removed = q.remove("\"a\"").await.unwrap();
    assert!(removed.readd && removed.leased && !removed.queued && !removed.counts);
    let again = q.remove("\"a\"").await.unwrap();
    assert!(again.leased && !again.any(), "{again:?}");
    lease.done().await.unwrap();
    assert!(
        q.item_detail("\"a\"").await.unwrap().is_none(),
        "not queued again"
    );
    // A queued item goes.
    let removed = q.remove("\"b\"").await.unwrap();
    assert!(removed.queued && !removed.leased && !removed.counts);
    assert_eq!(q.remove("\"b\"").await.unwrap(), Removed::default());
    assert_eq!(drain(&q).await, ["c", "late"]);
    // A queued item with a failure count goes with its count: one call, where the
    // dashboard used to need a second.
    q.add("e".to_owned()).await.unwrap();
    q.add_rate_limited("e".to_owned()).await.unwrap();
    assert_eq!(q.num_requeues("e".to_owned()).await.unwrap(), 1);
    let removed = q.remove("\"e\"").await.unwrap();
    assert!(removed.queued && removed.counts, "{removed:?}");
    assert_eq!(q.num_requeues("e".to_owned()).await.unwrap(), 0, "cleared");
    assert!(q.item_detail("\"e\"").await.unwrap().is_none());

    // A dead item's detail lists its letters.
    bury(&admin, &q, "gone", 1).await;
    let detail = q.item_detail("\"gone0\"").await.unwrap().unwrap();
    assert_eq!(detail.states, [ItemState::Dead]);
    assert_eq!(detail.dead_letters.len(), 1);

    // Run now is refused while the queue is shut down, as an add is.
    q.add_after("later".to_owned(), Duration::from_secs(600))
        .await
        .unwrap();
    q.shut_down_fleet().await.unwrap();
    assert_eq!(q.retry_now("\"later\"").await.unwrap(), Retried::ShutDown);
    assert!(
        q.item_detail("\"later\"")
            .await
            .unwrap()
            .is_some_and(|d| d.due_in.is_some()),
        "still delayed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listing_counts_every_part_of_every_queue_and_one_queue_alone() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let admin = admin(&server).await;
    let q: PgQueue<String> = PgQueue::builder(unique("listed"))
        .url(server.url())
        .backoff(Duration::from_secs(60), Duration::from_secs(600))
        .token_bucket(None)
        .lease_duration(Duration::from_secs(600))
        .build()
        .await
        .unwrap();
    let other = queue(&server, &unique("other")).await;
    q.add_all(["a", "b", "c", "d"].map(String::from))
        .await
        .unwrap();
    q.add_after("later".to_owned(), Duration::from_secs(60))
        .await
        .unwrap();
    // Two failing items, with 1 and 3 failures.
    q.add_rate_limited("f1".to_owned()).await.unwrap();
    for _ in 0..3 {
        q.add_rate_limited("f3".to_owned()).await.unwrap();
    }
    let held = q.try_get_many(2).await.unwrap();
    assert_eq!(held.len(), 2);
    // Leases taken 90 s and 30 s ago, one of them stalled twice before, as the database
    // would have them after expired leases and a slow worker.
    for (item, age, stalls) in [("\"a\"", 90, 2), ("\"b\"", 30, 0)] {
        sqlx::query(
            "UPDATE workqueue_items i SET leased_at = statement_timestamp() - make_interval(secs => $3),
                 stalls = $4
             FROM workqueue_queues s
             WHERE s.name = $1 AND i.queue = s.id AND i.item = $2",
        )
        .bind(q.name())
        .bind(item)
        .bind(f64::from(age))
        .bind(stalls)
        .execute(&admin)
        .await
        .unwrap();
    }
    bury(&admin, &q, "dead", 3).await;
    other.add("x".to_owned()).await.unwrap();
    q.pause().await.unwrap();

    let pg = workq_postgres::PgAdmin::from_pool(admin.clone());
    let all = pg.queues().await.unwrap();
    let listed = all.iter().find(|s| s.name == q.name()).unwrap();
    assert_eq!(
        (
            listed.depth,
            listed.delayed,
            listed.in_flight,
            listed.stalled
        ),
        (2, 3, 2, 1),
        "{listed:?}"
    );
    assert_eq!((listed.failing, listed.failures, listed.dead), (2, 4, 3));
    assert!(listed.paused && !listed.shut_down);
    assert!(
        listed.longest_lease >= Duration::from_secs(90)
            && listed.longest_lease < Duration::from_secs(120),
        "{listed:?}"
    );
    assert!(
        listed.lease_age_sum >= Duration::from_secs(120)
            && listed.lease_age_sum < Duration::from_secs(180),
        "{listed:?}"
    );
    let quiet = all.iter().find(|s| s.name == other.name()).unwrap();
    assert_eq!((quiet.depth, quiet.in_flight, quiet.failures), (1, 0, 0));
    assert_eq!(
        (quiet.longest_lease, quiet.lease_age_sum),
        (Duration::ZERO, Duration::ZERO)
    );

    // One queue alone: the same figures (the lease ages grow by the time between the two).
    let one = pg.summary(q.name()).await.unwrap().unwrap();
    assert_eq!(
        (
            one.depth,
            one.delayed,
            one.in_flight,
            one.stalled,
            one.failing,
            one.failures
        ),
        (2, 3, 2, 1, 2, 4)
    );
    assert_eq!((one.dead, one.paused), (3, true));
    assert!(one.longest_lease >= listed.longest_lease);
    assert!(pg.summary("no such queue").await.unwrap().is_none());
    let _ = q
        .done_and_get_many(held.into_iter().map(|l| (l, false)).collect(), 0)
        .await
        .unwrap();
}
