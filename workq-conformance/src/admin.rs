//! The admin behaviour suite: the rules of the operator's contract (`workq::admin::Admin`)
//! as async functions over `Box<dyn Admin>`, and the [`AdminFactory`] a backend's tests
//! implement to run them.
//!
//! A backend's test crate implements [`AdminFactory`] for its server and instantiates every
//! rule with `for_each_admin_rule!(its_macro)`, which calls `its_macro!(rule, rule, ...)`
//! with the name of each function of [`rules`]; so Redis, PostgreSQL and the in-process
//! queues are held to one text of the rules. Each rule checks
//! [`Admin::capabilities`] first: a backend that answers figures only runs the figures rules
//! and is held to answer [`AdminError::Unsupported`] to the rest, and a backend that
//! promises items or actions is held to every rule of the group.
//!
//! The module needs no feature of `workq`: the in-process runs of `workq`'s own tests build
//! without any.

use std::fmt;
use std::future::Future;
use std::time::{Duration, SystemTime};

use workq::admin::{
    Admin, AdminError, End, ItemState, Page, PageQuery, QueueSummary, Removed, Retried,
};
use workq::periodic::{ScheduleInfo, ScheduleUpdate, TickClaim, TickOutcome};
use workq::{AddOptions, Queue, QueueLease};

/// Calls `$suite!(rule, rule, ...)` with the name of every rule in [`rules`].
#[macro_export]
macro_rules! for_each_admin_rule {
    ($suite:ident) => {
        $suite!(
            an_unknown_queue_is_not_found_everywhere,
            queues_are_listed_by_name_with_the_figures_of_summary,
            stats_count_each_state_once,
            capabilities_are_kept,
            the_switches_answer_whether_they_changed_anything,
            pages_list_each_state_in_its_order_from_both_ends,
            cursors_go_on_until_the_state_is_listed,
            a_search_finds_every_match_in_bounded_pages,
            item_detail_names_every_state_of_an_item,
            retry_now_answers_what_it_did,
            remove_is_idempotent_and_keeps_a_lease,
            forget_answers_the_count_it_cleared,
            items_that_are_not_json_are_bad_requests,
            dead_letters_round_trip_by_id,
            schedules_are_listed_by_name_and_paused_one_by_one,
        );
    };
}

/// Makes what one rule needs: an [`Admin`] over a server (or process) of its own, and typed
/// queues on the same server to put items in every state.
///
/// The names a rule gives are its own: a factory for a shared server keeps each rule's
/// queues apart (a key prefix, a database, or a unique suffix it adds itself to every name
/// and takes off again is not allowed: the admin must see the names the rule gave).
pub trait AdminFactory: Send + Sync {
    /// A typed queue on the admin's server; items are strings, stored as their JSON text.
    type Queue: Queue<Item = String>;

    /// The admin under test. Every call answers the same admin or one over the same
    /// queues.
    fn admin(&self) -> impl Future<Output = Box<dyn Admin>> + Send;

    /// A handle on queue `name` of the admin's server (created if the backend creates
    /// queues), whose rate limiter's first delay is at least an hour: a rate-limited item
    /// stays delayed while a rule looks at it. The queue is known to the admin once an item
    /// was added to it.
    fn queue(&self, name: &str) -> impl Future<Output = Self::Queue> + Send;

    /// Makes a dead letter of `item` (a JSON text that is not a string, such as
    /// `{"letter":1}`) in queue `name` the backend's way, as its workers would: an item
    /// whose text does not deserialize as the queue's type is moved aside when it is handed
    /// out. Only called on a backend whose [`Admin::capabilities`] promise actions; the
    /// queue holds nothing ready then.
    fn dead_letter(&self, queue: &str, item: &str) -> impl Future<Output = ()> + Send;
}

/// The stored text of the string `item`: its JSON. The suite's items are plain ASCII words,
/// which need no escaping.
pub fn text(item: &str) -> String {
    format!("\"{item}\"")
}

/// A delay no rule outlives.
const HOUR: Duration = Duration::from_secs(3600);

/// How long a rule waits for an item it knows is ready.
const READY: Duration = Duration::from_secs(10);

/// Adds `item` as `options` say; the queue takes it.
async fn add_with<Q: Queue<Item = String>>(queue: &Q, item: &str, options: AddOptions) {
    let taken = Queue::add_with(queue, item.to_owned(), options)
        .await
        .unwrap_or_else(|e| panic!("add of {item}: {e}"));
    assert!(taken, "the queue refused the add of {item}");
}

/// Adds `item` now.
async fn add<Q: Queue<Item = String>>(queue: &Q, item: &str) {
    add_with(queue, item, AddOptions::default()).await;
}

/// Adds `item` in an hour.
async fn add_later<Q: Queue<Item = String>>(queue: &Q, item: &str) {
    add_with(queue, item, AddOptions::default().after(HOUR)).await;
}

/// Adds `item` rate-limited: one failure, delayed an hour at least.
async fn add_failed<Q: Queue<Item = String>>(queue: &Q, item: &str) {
    add_with(queue, item, AddOptions::default().rate_limited()).await;
}

/// Takes the next ready item, which must be `item`.
async fn lease<Q: Queue<Item = String>>(queue: &Q, item: &str) -> Q::Lease {
    let lease = tokio::time::timeout(READY, queue.get())
        .await
        .unwrap_or_else(|_| panic!("{item} was not handed out within {READY:?}"))
        .expect("get")
        .expect("the queue is running");
    assert_eq!(lease.item(), item, "the next item out");
    lease
}

/// Marks `lease` done.
async fn done<L: QueueLease>(lease: L) {
    lease.done().await.expect("done");
}

/// Whether the backend promises actions; if not, every action answers
/// [`AdminError::Unsupported`] (checked here) and the rule ends.
async fn actions_or_refused(admin: &dyn Admin, queue: &str) -> bool {
    if admin.capabilities().actions {
        return true;
    }
    every_action_answers(admin, queue, &AdminError::Unsupported).await;
    false
}

/// Checks that every action on `queue` answers `expected`.
async fn every_action_answers(admin: &dyn Admin, queue: &str, expected: &AdminError) {
    let item = text("any");
    answers(admin.pause(queue).await, expected, "pause");
    answers(admin.resume(queue).await, expected, "resume");
    answers(
        admin.shut_down_fleet(queue).await,
        expected,
        "shut_down_fleet",
    );
    answers(admin.resume_fleet(queue).await, expected, "resume_fleet");
    answers(admin.retry_now(queue, &item).await, expected, "retry_now");
    answers(admin.remove(queue, &item).await, expected, "remove");
    answers(admin.forget(queue, &item).await, expected, "forget");
    answers(
        admin.dead_letters(queue, End::First, 10).await,
        expected,
        "dead_letters",
    );
    answers(
        admin.requeue_dead_letter_by_id(queue, "1").await,
        expected,
        "requeue_dead_letter_by_id",
    );
    answers(
        admin.delete_dead_letter_by_id(queue, "1").await,
        expected,
        "delete_dead_letter_by_id",
    );
    answers(
        admin.requeue_dead_letters(queue).await,
        expected,
        "requeue_dead_letters",
    );
    answers(
        admin.purge_dead_letters(queue).await,
        expected,
        "purge_dead_letters",
    );
    answers(
        admin.pause_schedule(queue, "any", true).await,
        expected,
        "pause_schedule",
    );
}

/// Checks that a call answered the error `expected`.
fn answers<T: fmt::Debug>(answer: Result<T, AdminError>, expected: &AdminError, call: &str) {
    match answer {
        Err(e) if e == *expected => {}
        other => panic!("{call}: expected {expected:?}, got {other:?}"),
    }
}

/// Whether the backend promises items; if not, `page` and `item_detail` answer
/// [`AdminError::Unsupported`] (checked here) and the rule ends.
async fn items_or_refused(admin: &dyn Admin, queue: &str) -> bool {
    if admin.capabilities().items {
        return true;
    }
    for state in ItemState::ALL {
        assert_eq!(
            admin.page(queue, &PageQuery::new(state, 10)).await,
            Err(AdminError::Unsupported),
            "page of {state:?}"
        );
    }
    assert_eq!(
        admin.item_detail(queue, &text("any")).await,
        Err(AdminError::Unsupported),
        "item_detail"
    );
    false
}

/// The items of every page of `state` from `from`, `limit` at a time, following `next`
/// until there is none (at most 1,000 pages); each page holds at most `limit`.
async fn walk(
    admin: &dyn Admin,
    queue: &str,
    state: ItemState,
    from: End,
    limit: usize,
    search: Option<&str>,
) -> Vec<String> {
    let mut items = Vec::new();
    let mut cursor = None;
    for _ in 0..1000 {
        let query = PageQuery::new(state, limit)
            .from(from)
            .cursor(cursor.take())
            .search(search.map(str::to_owned));
        let page = admin.page(queue, &query).await.expect("page");
        assert!(
            page.items.len() <= limit,
            "a page of {state:?} holds {} entries, over the {limit} asked for",
            page.items.len()
        );
        for entry in &page.items {
            assert_eq!(
                entry.state, state,
                "{}: listed in the state asked for",
                entry.item
            );
        }
        items.extend(page.items.into_iter().map(|entry| entry.item));
        match page.next {
            Some(next) => cursor = Some(next),
            None => return items,
        }
    }
    panic!("the pages of {state:?} did not end within 1,000 pages");
}

/// Checks that `call` of `item` answered [`AdminError::BadRequest`].
fn bad_request<T: fmt::Debug>(answer: &Result<T, AdminError>, call: &str, item: &str) {
    assert!(
        matches!(answer, Err(AdminError::BadRequest(_))),
        "{call} of {item:?}: expected a bad request, got {answer:?}"
    );
}

/// The figures a listing and a look at one queue agree on (the spans move with the clock).
fn counts(s: &QueueSummary) -> [u64; 9] {
    [
        s.depth,
        s.delayed,
        s.in_flight,
        s.in_flight_dirty,
        s.failing,
        s.failures,
        s.stalled,
        s.dead,
        s.dead_dropped,
    ]
}

/// The rules, one function each; see [`for_each_admin_rule!`] for their names.
pub mod rules {
    use super::*;

    /// A call on a queue the backend does not know answers `NotFound` (or `Unsupported`
    /// where the backend has no such call) and creates nothing.
    pub async fn an_unknown_queue_is_not_found_everywhere<F: AdminFactory>(factory: &F) {
        let admin = factory.admin().await;
        let admin = &*admin;
        let known = factory.queue("known").await;
        add(&known, "a").await;
        let name = "never-made";
        assert_eq!(admin.summary(name).await, Err(AdminError::NotFound));
        assert_eq!(admin.stats(name, 10).await, Err(AdminError::NotFound));
        let item = text("a");
        if items_or_refused(admin, name).await {
            for state in ItemState::ALL {
                let query = PageQuery::new(state, 10);
                assert_eq!(admin.page(name, &query).await, Err(AdminError::NotFound));
            }
            assert_eq!(
                admin.item_detail(name, &item).await,
                Err(AdminError::NotFound)
            );
        }
        assert_eq!(admin.schedules(name).await, Err(AdminError::NotFound));
        if actions_or_refused(admin, name).await {
            every_action_answers(admin, name, &AdminError::NotFound).await;
        }
        let names: Vec<String> = admin
            .queues()
            .await
            .expect("queues")
            .into_iter()
            .map(|q| q.name)
            .collect();
        assert_eq!(names, ["known"], "nothing was created");
        drop(known);
    }

    /// `queues` lists every queue sorted by name, each with the figures `summary` gives it,
    /// and `summary` answers for each.
    pub async fn queues_are_listed_by_name_with_the_figures_of_summary<F: AdminFactory>(
        factory: &F,
    ) {
        let admin = factory.admin().await;
        let pods = factory.queue("pods").await;
        let jobs = factory.queue("jobs").await;
        let nodes = factory.queue("nodes").await;
        for item in ["a", "b", "c"] {
            add(&pods, item).await;
        }
        add(&jobs, "a").await;
        add_later(&nodes, "a").await;
        let listed = admin.queues().await.expect("queues");
        let names: Vec<&str> = listed.iter().map(|q| q.name.as_str()).collect();
        assert_eq!(names, ["jobs", "nodes", "pods"]);
        for queue in &listed {
            assert_eq!(queue.broken, None, "{}", queue.name);
            let alone = admin.summary(&queue.name).await.expect("summary");
            assert_eq!(alone.name, queue.name);
            assert_eq!(counts(&alone), counts(queue), "{}", queue.name);
            assert_eq!(
                (alone.paused, alone.shut_down, alone.counters.is_some()),
                (queue.paused, queue.shut_down, queue.counters.is_some()),
                "{}",
                queue.name
            );
        }
        let depths: Vec<(u64, u64)> = listed.iter().map(|q| (q.depth, q.delayed)).collect();
        assert_eq!(depths, [(1, 0), (0, 1), (3, 0)]);
        drop((pods, jobs, nodes));
    }

    /// `stats` counts each item once, in the state it is in: ready, delayed, in flight; a
    /// leased item re-added meanwhile is in flight (and dirty, where the backend tells).
    pub async fn stats_count_each_state_once<F: AdminFactory>(factory: &F) {
        let admin = factory.admin().await;
        let queue = factory.queue("pods").await;
        add(&queue, "leased").await;
        add(&queue, "readded").await;
        let leased = lease(&queue, "leased").await;
        let readded = lease(&queue, "readded").await;
        add(&queue, "readded").await;
        add(&queue, "a").await;
        add(&queue, "b").await;
        add_later(&queue, "later").await;
        add(&queue, "a").await; // a duplicate: still one item
        let stats = admin.stats("pods", 10).await.expect("stats");
        let s = &stats.summary;
        assert_eq!(
            (s.depth, s.delayed, s.in_flight),
            (2, 1, 2),
            "ready a, b; delayed later; leased leased, readded"
        );
        assert!(s.in_flight_dirty <= 1, "{}", s.in_flight_dirty);
        assert!(!s.paused && !s.shut_down);
        assert_eq!(s.broken, None);
        if admin.capabilities().items {
            assert_eq!(s.in_flight_dirty, 1, "readded");
            let mut leases: Vec<&str> = stats.leases.iter().map(|l| l.item.as_str()).collect();
            leases.sort_unstable();
            assert_eq!(leases, [text("leased"), text("readded")]);
            let tokens: Vec<u64> = stats.leases.iter().map(|l| l.lease.token).collect();
            assert_ne!(tokens[0], tokens[1], "each lease has its own token");
            assert!(stats.next_delayed_in.is_some_and(|d| d <= HOUR));
            let one = admin.stats("pods", 1).await.expect("stats");
            assert_eq!(one.leases.len(), 1, "at most the limit");
        } else {
            assert!(
                stats.leases.is_empty(),
                "a backend without items lists no lease"
            );
        }
        assert_eq!(
            counts(&admin.summary("pods").await.expect("summary")),
            counts(s),
            "summary and stats agree"
        );
        done(leased).await;
        done(readded).await;
        let s = admin.summary("pods").await.expect("summary");
        assert_eq!(
            (s.depth, s.delayed, s.in_flight, s.in_flight_dirty),
            (3, 1, 0, 0),
            "readded is queued again"
        );
    }

    /// A backend answers what its capabilities promise, and refuses the rest with
    /// `Unsupported`; its status names where its queues live.
    pub async fn capabilities_are_kept<F: AdminFactory>(factory: &F) {
        let admin = factory.admin().await;
        let admin = &*admin;
        let queue = factory.queue("pods").await;
        add(&queue, "a").await;
        assert!(!admin.kind().is_empty());
        assert!(
            !admin.status().server.is_empty(),
            "the status names a server"
        );
        let capabilities = admin.capabilities();
        if items_or_refused(admin, "pods").await {
            let page = admin
                .page("pods", &PageQuery::new(ItemState::Ready, 10))
                .await
                .expect("page");
            assert_eq!(page.total, 1);
            assert!(
                admin
                    .item_detail("pods", &text("a"))
                    .await
                    .expect("item")
                    .is_some()
            );
        }
        if actions_or_refused(admin, "pods").await {
            assert_eq!(admin.forget("pods", &text("a")).await, Ok(0));
        }
        assert_eq!(
            admin.capabilities(),
            capabilities,
            "capabilities do not change"
        );
        let status = admin.status();
        assert!(status.up, "the server answered the last call: {status:?}");
    }

    /// `pause`, `resume`, `shut_down_fleet` and `resume_fleet` answer whether they changed
    /// anything, and the figures show the switch.
    pub async fn the_switches_answer_whether_they_changed_anything<F: AdminFactory>(factory: &F) {
        let admin = factory.admin().await;
        let queue = factory.queue("pods").await;
        add(&queue, "a").await;
        if !actions_or_refused(&*admin, "pods").await {
            return;
        }
        let flags = || async {
            let s = admin.summary("pods").await.expect("summary");
            (s.paused, s.shut_down)
        };
        assert_eq!(admin.pause("pods").await, Ok(true));
        assert_eq!(admin.pause("pods").await, Ok(false), "paused already");
        assert_eq!(flags().await, (true, false));
        assert_eq!(admin.resume("pods").await, Ok(true));
        assert_eq!(admin.resume("pods").await, Ok(false), "running already");
        assert_eq!(flags().await, (false, false));
        assert_eq!(admin.resume_fleet("pods").await, Ok(false), "not shut down");
        assert_eq!(admin.shut_down_fleet("pods").await, Ok(true));
        assert_eq!(
            admin.shut_down_fleet("pods").await,
            Ok(false),
            "shut down already"
        );
        assert_eq!(flags().await, (false, true));
        assert_eq!(admin.resume_fleet("pods").await, Ok(true));
        assert_eq!(
            admin.resume_fleet("pods").await,
            Ok(false),
            "running already"
        );
        assert_eq!(flags().await, (false, false));
        assert_eq!(
            admin.summary("pods").await.expect("summary").depth,
            1,
            "a stays"
        );
    }

    /// Each state is listed in its order, from either end: ready by priority then
    /// readiness, delayed soonest due first, dead letters oldest first; `total` counts the
    /// state, and each entry says what its state says about it.
    pub async fn pages_list_each_state_in_its_order_from_both_ends<F: AdminFactory>(factory: &F) {
        let admin = factory.admin().await;
        let queue = factory.queue("pods").await;
        add(&queue, "leased").await;
        let leased = lease(&queue, "leased").await;
        add(&queue, "low").await;
        add_with(&queue, "high", AddOptions::default().priority(5)).await;
        add(&queue, "low-2").await;
        add_later(&queue, "in-an-hour").await;
        add_with(
            &queue,
            "in-a-minute",
            AddOptions::default().after(Duration::from_secs(60)),
        )
        .await;
        add_failed(&queue, "failed").await;
        if !items_or_refused(&*admin, "pods").await {
            drop(leased);
            return;
        }
        let page = |state: ItemState, from: End| {
            let admin = &admin;
            async move {
                admin
                    .page("pods", &PageQuery::new(state, 100).from(from))
                    .await
                    .expect("page")
            }
        };
        let names =
            |page: &Page| -> Vec<String> { page.items.iter().map(|e| e.item.clone()).collect() };

        let ready = page(ItemState::Ready, End::First).await;
        assert_eq!(names(&ready), [text("high"), text("low"), text("low-2")]);
        assert_eq!(ready.total, 3);
        let priorities: Vec<Option<i32>> = ready.items.iter().map(|e| e.priority).collect();
        assert_eq!(priorities, [Some(5), Some(0), Some(0)]);
        let ready = page(ItemState::Ready, End::Last).await;
        assert_eq!(names(&ready), [text("low-2"), text("low"), text("high")]);

        let delayed = page(ItemState::Delayed, End::First).await;
        let soonest = [text("in-a-minute"), text("in-an-hour")];
        assert_eq!(
            names(&delayed)
                .iter()
                .filter(|i| soonest.contains(i))
                .collect::<Vec<_>>(),
            soonest.iter().collect::<Vec<_>>(),
            "soonest due first"
        );
        assert_eq!(delayed.total, 3, "in-a-minute, in-an-hour, failed");
        for entry in &delayed.items {
            assert!(entry.due_in.is_some(), "{entry:?}");
        }
        let minute = delayed.items.iter().find(|e| e.item == text("in-a-minute"));
        assert!(
            minute
                .and_then(|e| e.due_in)
                .is_some_and(|d| d <= Duration::from_secs(60)),
            "{minute:?}"
        );
        let latest = page(ItemState::Delayed, End::Last).await;
        let mut reversed = names(&delayed);
        reversed.reverse();
        assert_eq!(names(&latest), reversed);

        let in_flight = page(ItemState::InFlight, End::First).await;
        assert_eq!(names(&in_flight), [text("leased")]);
        assert!(
            in_flight.items[0].lease.is_some(),
            "an entry in flight has its lease"
        );

        let failing = page(ItemState::Failing, End::First).await;
        assert_eq!(names(&failing), [text("failed")]);
        assert_eq!(failing.items[0].failures, Some(1));
        assert_eq!(failing.total, 1);

        let dead = page(ItemState::Dead, End::First).await;
        assert_eq!((dead.items.len(), dead.total), (0, 0));
        done(leased).await;
    }

    /// Pages of one item each, followed by their `next`, list the whole state once, in
    /// order, from either end.
    pub async fn cursors_go_on_until_the_state_is_listed<F: AdminFactory>(factory: &F) {
        let admin = factory.admin().await;
        let queue = factory.queue("pods").await;
        let items: Vec<String> = (0..7).map(|i| format!("item-{i}")).collect();
        for item in &items {
            add(&queue, item).await;
        }
        for item in &items[..3] {
            add_later(&queue, item).await; // queued already: stays queued
        }
        if !items_or_refused(&*admin, "pods").await {
            return;
        }
        let expected: Vec<String> = items.iter().map(|i| text(i)).collect();
        for limit in [1, 3, 100] {
            let first = walk(&*admin, "pods", ItemState::Ready, End::First, limit, None).await;
            assert_eq!(first, expected, "limit {limit}, from the first");
            let last = walk(&*admin, "pods", ItemState::Ready, End::Last, limit, None).await;
            let mut reversed = expected.clone();
            reversed.reverse();
            assert_eq!(last, reversed, "limit {limit}, from the last");
        }
        let empty = walk(&*admin, "pods", ItemState::Delayed, End::First, 2, None).await;
        assert!(empty.is_empty(), "{empty:?}");
    }

    /// A search lists only the items that contain its text, in any case; followed to the
    /// end, its pages find every match, each page within the limit, while `total` counts
    /// the whole state.
    pub async fn a_search_finds_every_match_in_bounded_pages<F: AdminFactory>(factory: &F) {
        let admin = factory.admin().await;
        let queue = factory.queue("pods").await;
        let mut needles = Vec::new();
        for i in 0..40 {
            let item = if i % 9 == 4 {
                let needle = format!("Needle-{i}");
                needles.push(text(&needle));
                needle
            } else {
                format!("hay-{i}")
            };
            add(&queue, &item).await;
        }
        if !items_or_refused(&*admin, "pods").await {
            return;
        }
        for limit in [1, 2, 100] {
            let found = walk(
                &*admin,
                "pods",
                ItemState::Ready,
                End::First,
                limit,
                Some("nEEDLE"),
            )
            .await;
            assert_eq!(found, needles, "limit {limit}");
        }
        let query = PageQuery::new(ItemState::Ready, 100).search(Some("needle".to_owned()));
        let page = admin.page("pods", &query).await.expect("page");
        assert_eq!(
            page.total, 40,
            "total counts the state, whatever the search"
        );
        let none = walk(
            &*admin,
            "pods",
            ItemState::Ready,
            End::First,
            5,
            Some("no such text"),
        )
        .await;
        assert!(none.is_empty());
    }

    /// `item_detail` is `None` for an item the queue does not know, and names every state
    /// of one it knows, with what each state says.
    pub async fn item_detail_names_every_state_of_an_item<F: AdminFactory>(factory: &F) {
        let admin = factory.admin().await;
        let queue = factory.queue("pods").await;
        add(&queue, "leased").await;
        add(&queue, "readded").await;
        let leased = lease(&queue, "leased").await;
        let readded = lease(&queue, "readded").await;
        add(&queue, "readded").await;
        add(&queue, "first").await;
        add_with(&queue, "second", AddOptions::default().priority(-1)).await;
        add_later(&queue, "later").await;
        add_failed(&queue, "failed").await;
        if !items_or_refused(&*admin, "pods").await {
            drop((leased, readded));
            return;
        }
        let detail = |item: &'static str| {
            let admin = &admin;
            async move {
                admin
                    .item_detail("pods", &text(item))
                    .await
                    .expect("item_detail")
                    .unwrap_or_else(|| panic!("{item} is known"))
            }
        };
        assert_eq!(
            admin.item_detail("pods", &text("unknown")).await,
            Ok(None),
            "an unknown item"
        );

        let first = detail("first").await;
        assert_eq!(first.item, text("first"));
        assert_eq!(first.states, [ItemState::Ready]);
        assert_eq!((first.position, first.priority), (Some(0), Some(0)));
        let second = detail("second").await;
        assert_eq!((second.position, second.priority), (Some(1), Some(-1)));

        let later = detail("later").await;
        assert_eq!(later.states, [ItemState::Delayed]);
        assert!(later.due_in.is_some_and(|d| d <= HOUR && d > HOUR / 2));
        assert_eq!(later.position, None);

        let failed = detail("failed").await;
        assert_eq!(failed.states, [ItemState::Delayed, ItemState::Failing]);
        assert_eq!(failed.failures, 1);

        let held = detail("leased").await;
        assert_eq!(held.states, [ItemState::InFlight]);
        assert!(held.lease.is_some());
        assert!(!held.readded);
        let again = detail("readded").await;
        assert_eq!(again.states, [ItemState::InFlight]);
        assert!(again.readded, "re-added while leased");
        assert_ne!(
            held.lease.as_ref().map(|l| l.token),
            again.lease.as_ref().map(|l| l.token),
            "each lease has its own token"
        );
        done(leased).await;
        done(readded).await;
        assert_eq!(
            admin.item_detail("pods", &text("leased")).await,
            Ok(None),
            "done: the queue knows nothing of it"
        );
    }

    /// "Retry now" brings a delayed or failing item forward (a leased one to when its lease
    /// ends), keeps its failure count, and says what it did in every other case.
    pub async fn retry_now_answers_what_it_did<F: AdminFactory>(factory: &F) {
        let admin = factory.admin().await;
        let queue = factory.queue("pods").await;
        add(&queue, "leased").await;
        add(&queue, "held").await;
        let leased = lease(&queue, "leased").await;
        let held = lease(&queue, "held").await;
        add_later(&queue, "leased").await; // a delayed re-add while leased
        add_later(&queue, "later").await;
        add_failed(&queue, "failed").await;
        add(&queue, "ready").await;
        if !actions_or_refused(&*admin, "pods").await {
            drop((leased, held));
            return;
        }
        let retry = |item: &'static str| {
            let admin = &admin;
            async move { admin.retry_now("pods", &text(item)).await }
        };
        assert_eq!(retry("later").await, Ok(Retried::Queued));
        assert_eq!(retry("later").await, Ok(Retried::AlreadyQueued));
        assert_eq!(retry("failed").await, Ok(Retried::Queued));
        assert_eq!(
            queue
                .num_requeues(&"failed".to_owned())
                .await
                .expect("num_requeues"),
            1,
            "its failure count stays"
        );
        assert_eq!(retry("ready").await, Ok(Retried::AlreadyQueued));
        assert_eq!(retry("leased").await, Ok(Retried::Deferred));
        assert_eq!(retry("leased").await, Ok(Retried::AlreadyQueued));
        assert_eq!(retry("held").await, Ok(Retried::InFlight));
        assert_eq!(retry("unknown").await, Ok(Retried::Unknown));
        let s = admin.summary("pods").await.expect("summary");
        assert_eq!((s.depth, s.delayed), (3, 0), "ready, later, failed");
        done(leased).await;
        assert_eq!(
            admin.summary("pods").await.expect("summary").depth,
            4,
            "leased"
        );

        add_later(&queue, "late").await;
        assert_eq!(admin.shut_down_fleet("pods").await, Ok(true));
        assert_eq!(retry("late").await, Ok(Retried::ShutDown));
        assert_eq!(admin.resume_fleet("pods").await, Ok(true));
        done(held).await;
    }

    /// "Remove" takes a ready or delayed item out and clears its counts, drops the pending
    /// re-add of a leased one and leaves its lease, and finds nothing the second time.
    pub async fn remove_is_idempotent_and_keeps_a_lease<F: AdminFactory>(factory: &F) {
        let admin = factory.admin().await;
        let queue = factory.queue("pods").await;
        add(&queue, "leased").await;
        let leased = lease(&queue, "leased").await;
        add(&queue, "leased").await; // re-added while leased
        add_failed(&queue, "failed").await;
        if !actions_or_refused(&*admin, "pods").await {
            drop(leased);
            return;
        }
        // A failing item neither delayed nor leased: retried, handed out, done.
        assert_eq!(
            admin.retry_now("pods", &text("failed")).await,
            Ok(Retried::Queued)
        );
        done(lease(&queue, "failed").await).await;
        add(&queue, "ready").await;
        add_later(&queue, "later").await;

        let remove = |item: &'static str| {
            let admin = &admin;
            async move { admin.remove("pods", &text(item)).await.expect("remove") }
        };
        let removed = remove("ready").await;
        assert!(
            removed.queued && !removed.delayed && !removed.leased,
            "{removed:?}"
        );
        assert!(removed.any());
        assert_eq!(remove("ready").await, Removed::default(), "gone already");

        let removed = remove("later").await;
        assert!(removed.delayed && !removed.queued, "{removed:?}");
        assert_eq!(remove("later").await, Removed::default());

        let removed = remove("failed").await;
        assert!(
            removed.counts && !removed.queued && !removed.delayed,
            "{removed:?}"
        );
        assert_eq!(
            queue
                .num_requeues(&"failed".to_owned())
                .await
                .expect("num_requeues"),
            0,
            "its failure count is cleared"
        );
        assert_eq!(remove("failed").await, Removed::default());

        let removed = remove("leased").await;
        assert!(
            removed.readd && removed.leased && !removed.counts,
            "{removed:?}"
        );
        let again = remove("leased").await;
        assert!(again.leased && !again.any(), "the lease stays: {again:?}");
        let s = admin.summary("pods").await.expect("summary");
        assert_eq!(
            (s.depth, s.delayed, s.in_flight, s.in_flight_dirty),
            (0, 0, 1, 0)
        );
        done(leased).await;
        assert_eq!(
            admin.summary("pods").await.expect("summary").depth,
            0,
            "the re-add is gone: nothing is queued when the lease ends"
        );
        assert_eq!(remove("unknown").await, Removed::default());
    }

    /// `forget` clears an item's failure count and answers the count it had.
    pub async fn forget_answers_the_count_it_cleared<F: AdminFactory>(factory: &F) {
        let admin = factory.admin().await;
        let queue = factory.queue("pods").await;
        add_failed(&queue, "failed").await;
        add_failed(&queue, "failed").await;
        if !actions_or_refused(&*admin, "pods").await {
            return;
        }
        assert_eq!(admin.forget("pods", &text("failed")).await, Ok(2));
        assert_eq!(admin.forget("pods", &text("failed")).await, Ok(0));
        assert_eq!(
            queue
                .num_requeues(&"failed".to_owned())
                .await
                .expect("num_requeues"),
            0
        );
        assert_eq!(admin.forget("pods", &text("unknown")).await, Ok(0));
        let s = admin.summary("pods").await.expect("summary");
        assert_eq!((s.failing, s.delayed), (0, 1), "forgotten, still delayed");
    }

    /// The item actions take the item's JSON text: anything else is a bad request.
    pub async fn items_that_are_not_json_are_bad_requests<F: AdminFactory>(factory: &F) {
        let admin = factory.admin().await;
        let queue = factory.queue("pods").await;
        add(&queue, "a").await;
        if !actions_or_refused(&*admin, "pods").await {
            return;
        }
        for item in ["a", "{", ""] {
            bad_request(&admin.retry_now("pods", item).await, "retry_now", item);
            bad_request(&admin.remove("pods", item).await, "remove", item);
            bad_request(&admin.forget("pods", item).await, "forget", item);
        }
        assert_eq!(admin.summary("pods").await.expect("summary").depth, 1);
    }

    /// Dead letters are listed oldest first (or newest first), each with an id; by that id
    /// one is requeued or deleted once; all are requeued or purged together, and a second
    /// time finds none.
    pub async fn dead_letters_round_trip_by_id<F: AdminFactory>(factory: &F) {
        let admin = factory.admin().await;
        let queue = factory.queue("pods").await;
        add_later(&queue, "later").await;
        if !actions_or_refused(&*admin, "pods").await {
            return;
        }
        let letters: Vec<String> = (1..=4).map(|i| format!("{{\"letter\":{i}}}")).collect();
        for letter in &letters {
            factory.dead_letter("pods", letter).await;
        }
        let listed = admin
            .dead_letters("pods", End::First, 10)
            .await
            .expect("dead_letters");
        let items: Vec<&str> = listed.iter().map(|d| d.item.as_str()).collect();
        assert_eq!(items, letters, "oldest first");
        let mut ids: Vec<&str> = listed.iter().map(|d| d.id.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 4, "one id each");
        for letter in &listed {
            assert!(!letter.error.is_empty(), "{letter:?} says why");
        }
        let newest = admin
            .dead_letters("pods", End::Last, 2)
            .await
            .expect("dead_letters");
        let items: Vec<&str> = newest.iter().map(|d| d.item.as_str()).collect();
        assert_eq!(
            items,
            [letters[3].as_str(), letters[2].as_str()],
            "newest first, at most the limit"
        );
        assert_eq!(admin.summary("pods").await.expect("summary").dead, 4);
        if admin.capabilities().items {
            let page = admin
                .page("pods", &PageQuery::new(ItemState::Dead, 10))
                .await
                .expect("page");
            let ids: Vec<Option<&str>> = page
                .items
                .iter()
                .map(|e| e.dead.as_ref().map(|d| d.id.as_str()))
                .collect();
            let expected: Vec<Option<&str>> = listed.iter().map(|d| Some(d.id.as_str())).collect();
            assert_eq!(ids, expected, "a page of dead letters carries the letters");
            let detail = admin
                .item_detail("pods", &letters[0])
                .await
                .expect("item_detail")
                .expect("known by its dead letter");
            assert!(detail.states.contains(&ItemState::Dead), "{detail:?}");
            assert_eq!(detail.dead_letters.len(), 1);
        }

        let (first, second) = (&listed[0].id, &listed[1].id);
        assert_eq!(
            admin.requeue_dead_letter_by_id("pods", first).await,
            Ok(true)
        );
        assert_eq!(
            admin.requeue_dead_letter_by_id("pods", first).await,
            Ok(false)
        );
        assert_eq!(
            admin.delete_dead_letter_by_id("pods", first).await,
            Ok(false)
        );
        assert_eq!(
            admin.delete_dead_letter_by_id("pods", second).await,
            Ok(true)
        );
        assert_eq!(
            admin.delete_dead_letter_by_id("pods", second).await,
            Ok(false)
        );
        assert_eq!(
            admin.requeue_dead_letter_by_id("pods", second).await,
            Ok(false)
        );
        let s = admin.summary("pods").await.expect("summary");
        assert_eq!((s.dead, s.depth), (2, 1), "one requeued, one deleted");

        assert_eq!(admin.requeue_dead_letters("pods").await, Ok(2));
        assert_eq!(admin.requeue_dead_letters("pods").await, Ok(0));
        let s = admin.summary("pods").await.expect("summary");
        assert_eq!((s.dead, s.depth), (0, 3));

        // The requeued items still do not deserialize: take them out, make two letters
        // anew, and purge them.
        for letter in [&letters[0], &letters[2], &letters[3]] {
            let removed = admin.remove("pods", letter).await.expect("remove");
            assert!(removed.queued, "{letter}: {removed:?}");
        }
        for letter in &letters[..2] {
            factory.dead_letter("pods", letter).await;
        }
        assert_eq!(admin.purge_dead_letters("pods").await, Ok(2));
        assert_eq!(admin.purge_dead_letters("pods").await, Ok(0));
        assert_eq!(
            admin.dead_letters("pods", End::First, 10).await,
            Ok(Vec::new())
        );
        let s = admin.summary("pods").await.expect("summary");
        assert_eq!((s.dead, s.depth, s.delayed), (0, 0, 1), "later stays");
    }

    /// `schedules` lists a queue's periodic schedules by name, each with the record its
    /// runners wrote (spec, since, last tick taken, next tick, paused: the instants as they
    /// were sent); a queue without any lists none. Where the backend has actions,
    /// `pause_schedule` pauses and resumes one by name and answers whether it changed
    /// anything (a resume moves `since`, so the ticks skipped are not caught up); a schedule
    /// the queue does not have is `NotFound`, and is not created.
    pub async fn schedules_are_listed_by_name_and_paused_one_by_one<F: AdminFactory>(factory: &F) {
        let admin = factory.admin().await;
        let admin = &*admin;
        let queue = factory.queue("crons").await;
        add(&queue, "a").await;
        assert_eq!(admin.schedules("crons").await, Ok(Vec::new()), "none yet");
        // Instants of the runners' clock, far from now: a backend stores what it is sent.
        let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + s);
        let nightly = "cron 0 3 * * * (Europe/Paris)";
        for (name, spec, next) in [("nightly", nightly, 3600), ("minutely", "every 1m", 60)] {
            Queue::upsert_schedule(
                &queue,
                ScheduleUpdate::register(name, spec, Some(at(next)), at(0)),
            )
            .await
            .unwrap_or_else(|e| panic!("register {name}: {e}"));
        }
        let claim = TickClaim::new("minutely", "every 1m", at(60), Some(at(120)), at(61));
        let took = Queue::add_on_tick(&queue, claim, "tick".to_owned(), AddOptions::default());
        assert_eq!(took.await.expect("add_on_tick"), TickOutcome::Added);
        let listed = admin.schedules("crons").await.expect("schedules");
        let names: Vec<&str> = listed.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["minutely", "nightly"], "by name");
        let record = |s: &ScheduleInfo| {
            (
                s.spec.clone(),
                s.since,
                s.last_tick,
                s.next_tick,
                s.paused,
                s.time_zone().map(str::to_owned),
            )
        };
        assert_eq!(
            record(&listed[0]),
            (
                "every 1m".to_owned(),
                at(0),
                Some(at(60)),
                Some(at(120)),
                false,
                None
            )
        );
        assert_eq!(
            record(&listed[1]),
            (
                nightly.to_owned(),
                at(0),
                None,
                Some(at(3600)),
                false,
                Some("Europe/Paris".to_owned())
            )
        );
        if !actions_or_refused(admin, "crons").await {
            return;
        }
        let paused = || async {
            let listed = admin.schedules("crons").await.expect("schedules");
            listed
                .iter()
                .map(|s| (s.name.clone(), s.paused))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            admin.pause_schedule("crons", "nightly", true).await,
            Ok(true)
        );
        assert_eq!(
            admin.pause_schedule("crons", "nightly", true).await,
            Ok(false),
            "paused already"
        );
        assert_eq!(
            paused().await,
            [("minutely".to_owned(), false), ("nightly".to_owned(), true)]
        );
        assert_eq!(
            admin.pause_schedule("crons", "nightly", false).await,
            Ok(true)
        );
        assert_eq!(
            admin.pause_schedule("crons", "nightly", false).await,
            Ok(false),
            "running already"
        );
        let listed = admin.schedules("crons").await.expect("schedules");
        assert!(!listed[1].paused);
        assert!(
            listed[1].since > at(0),
            "the resume moved since to the operator's now: {:?}",
            listed[1].since
        );
        assert_eq!(
            admin.pause_schedule("crons", "hourly", true).await,
            Err(AdminError::NotFound),
            "a schedule the queue does not have"
        );
        let names: Vec<String> = admin
            .schedules("crons")
            .await
            .expect("schedules")
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(names, ["minutely", "nightly"], "nothing was created");
        assert_eq!(
            record(&listed[0]).2,
            Some(at(60)),
            "the other one untouched"
        );
    }
}
