//! Flow control on Redis: every rule of the shared flow suite (`workq_conformance::flow`),
//! alone and driving a pool of `Workers` (whose steps are batched on Redis), over
//! `RedisQueue` on a `redis-server` the test starts itself; then what is Redis's own: the
//! settings kept on the server for every process (the last handle built wins, the others
//! follow and say so), limits across handles built separately as processes would build
//! them, a restart from the AOF, the operator's view, and `delete` leaving no key behind.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use workq_conformance::flow::{FlowFactory, FlowSpec, Unsupported};
use workq_redis::{Builder, RedisQueue};

use support::{RedisServer, next};

/// Where a factory's queues live.
enum Place {
    /// A server of the test's own.
    Server(RedisServer),
    /// A three-node cluster of the test's own (feature `cluster`).
    #[cfg(feature = "cluster")]
    Cluster(support::server::RedisCluster),
}

/// Queues with flow control on a server (or a cluster) of the test's own.
struct RedisFlow {
    place: Place,
    next: AtomicUsize,
}

impl RedisFlow {
    fn start() -> Option<Self> {
        Some(RedisFlow {
            place: Place::Server(support::server::require()?),
            next: AtomicUsize::new(0),
        })
    }

    #[cfg(feature = "cluster")]
    fn start_cluster() -> Option<Self> {
        if !support::server::require_binary() {
            return None;
        }
        Some(RedisFlow {
            place: Place::Cluster(support::server::RedisCluster::start()?),
            next: AtomicUsize::new(0),
        })
    }

    fn name(&self) -> String {
        format!("flow-{}", self.next.fetch_add(1, Ordering::Relaxed))
    }

    /// A handle on queue `name` built as `spec` says.
    fn builder(&self, name: &str, spec: &FlowSpec) -> Builder<String> {
        let builder = base(name);
        let builder = match &self.place {
            Place::Server(server) => builder.url(server.url()),
            #[cfg(feature = "cluster")]
            Place::Cluster(cluster) => builder.cluster(cluster.urls()),
        };
        workq_conformance::with_flow_spec!(builder, spec)
    }
}

/// A builder of queue `name` with the tests' lease and poll settings.
fn base(name: &str) -> Builder<String> {
    RedisQueue::builder(name)
        .lease_duration(Duration::from_secs(10))
        // Far above the wake-up bounds the rules assert: a wake-up is never a poll.
        .poll_interval(Duration::from_secs(30))
}

/// A handle on queue `name` of the server at `url` built as `spec` says.
fn flow_builder(url: &str, name: &str, spec: &FlowSpec) -> Builder<String> {
    workq_conformance::with_flow_spec!(base(name).url(url), spec)
}

impl FlowFactory for RedisFlow {
    type Q = RedisQueue<String>;

    async fn flow_queue(&self, spec: FlowSpec) -> Result<RedisQueue<String>, Unsupported> {
        Ok(self
            .builder(&self.name(), &spec)
            .build()
            .await
            .expect("connect to the test server"))
    }

    /// Handles built one by one, each with its own connections, as processes build them.
    async fn flow_handles(
        &self,
        spec: FlowSpec,
        n: usize,
    ) -> Result<Vec<RedisQueue<String>>, Unsupported> {
        let name = self.name();
        let mut handles = Vec::with_capacity(n);
        for _ in 0..n {
            handles.push(
                self.builder(&name, &spec)
                    .build()
                    .await
                    .expect("connect to the test server"),
            );
        }
        Ok(handles)
    }

    async fn expiring_flow_queue(
        &self,
        spec: FlowSpec,
        lease: Duration,
    ) -> Result<RedisQueue<String>, Unsupported> {
        Ok(self
            .builder(&self.name(), &spec)
            .lease_duration(lease)
            .auto_renew(false)
            .build()
            .await
            .expect("connect to the test server"))
    }

    /// Nothing sent: the lease expires on the server.
    fn crash(lease: workq_redis::Lease<String>) {
        lease.abandon();
    }
}

/// Instantiates every flow rule on Redis.
macro_rules! flow_suite {
    ($($rule:ident),* $(,)?) => {
        mod flow {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    let Some(factory) = super::RedisFlow::start() else {
                        return;
                    };
                    workq_conformance::flow::rules::$rule(&factory).await;
                }
            )*
        }
    };
}

workq_conformance::for_each_flow_rule!(flow_suite);

/// Every flow rule, one after the other, on one three-node Redis Cluster (feature
/// `cluster`): every flow key lives in its queue's slot.
#[cfg(feature = "cluster")]
macro_rules! cluster_suite {
    ($($rule:ident),* $(,)?) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn redis_cluster_keeps_every_flow_rule() {
            let Some(factory) = RedisFlow::start_cluster() else {
                return;
            };
            $(
                workq_conformance::flow::rules::$rule(&factory).await;
            )*
        }
    };
}

#[cfg(feature = "cluster")]
workq_conformance::for_each_flow_rule!(cluster_suite);

/// Instantiates every flow rule that drives a pool of `Workers` on Redis.
macro_rules! flow_workers_suite {
    ($($rule:ident),* $(,)?) => {
        mod flow_workers {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    let Some(factory) = super::RedisFlow::start() else {
                        return;
                    };
                    workq_conformance::flow::workers_rules::$rule(&factory).await;
                }
            )*
        }
    };
}

workq_conformance::for_each_flow_workers_rule!(flow_workers_suite);

// ===== What is Redis's own =====

/// A handle on queue `name` with a per-group limit of `limit` (and nothing else but the
/// group function), built on its own as a process builds it.
async fn per_group(server: &RedisServer, name: &str, limit: usize) -> RedisQueue<String> {
    let spec = FlowSpec {
        max_in_flight_per_group: Some(limit),
        ..FlowSpec::default()
    };
    flow_builder(&server.url(), name, &spec)
        .build()
        .await
        .unwrap()
}

/// Two handles built separately (two processes): a lease one holds counts against the
/// group's limit for the other's getters, and its `done` wakes the other's getter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_holds_across_handles_built_separately() {
    let Some(server) = support::server::require() else {
        return;
    };
    let first = per_group(&server, "fleet", 1).await;
    let second = per_group(&server, "fleet", 1).await;
    first.add("g/0".to_owned()).await.unwrap();
    second.add("g/1".to_owned()).await.unwrap();
    second.add("h/0".to_owned()).await.unwrap();
    let held = next(&first).await;
    assert_eq!(held.item(), "g/0");
    let other = next(&second).await;
    assert_eq!(other.item(), "h/0", "another group goes");
    let waiting = {
        let second = second.clone();
        tokio::spawn(async move { next(&second).await.item().clone() })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "g's slot is the first process's");
    held.done().await.unwrap();
    let served = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the other process's done woke the getter")
        .unwrap();
    assert_eq!(served, "g/1");
    other.done().await.unwrap();
}

/// The settings live beside the queue: every handle applies the queue's, the last handle
/// built with settings replaces them (and says so), a handle built earlier learns of it
/// at its next hand-out and says so once, and a handle built without settings follows them
/// (and says that its adds join the group "").
#[tokio::test(flavor = "current_thread")]
async fn the_settings_live_on_the_server_and_the_last_handle_built_wins() {
    let Some(server) = support::server::require() else {
        return;
    };
    let log = support::Log::default();
    let _logging = log.capture();
    let warnings = |what: &str| log.text().matches(what).count();
    let first = per_group(&server, "settings", 1).await;
    let limits = first
        .flow_limits()
        .await
        .unwrap()
        .expect("settings on the server");
    assert_eq!(
        (limits.grouped, limits.max_in_flight_per_group),
        (true, Some(1))
    );
    assert_eq!(warnings("replace"), 0, "nothing to replace: {}", log.text());
    // The same settings again change nothing.
    let again = per_group(&server, "settings", 1).await;
    assert_eq!(warnings("replace"), 0, "{}", log.text());

    let second = per_group(&server, "settings", 2).await;
    assert_eq!(warnings("replace other ones"), 1, "{}", log.text());
    let limits = first.flow_limits().await.unwrap().unwrap();
    assert_eq!(
        limits.max_in_flight_per_group,
        Some(2),
        "the last one built wins"
    );
    for i in 0..4 {
        second.add(format!("g/{i}")).await.unwrap();
    }
    second.add("h/0".to_owned()).await.unwrap();
    // The first handle applies the new limit (two leases of g), and says so once.
    let a = next(&first).await;
    let b = next(&first).await;
    assert_eq!(warnings("another process replaced"), 1, "{}", log.text());
    let c = next(&again).await;
    assert_eq!(
        (a.item().as_str(), b.item().as_str(), c.item().as_str()),
        ("g/0", "h/0", "g/1")
    );
    assert_eq!(
        warnings("another process replaced"),
        2,
        "the handle `again` too: {}",
        log.text()
    );
    assert!(
        first.try_get().await.unwrap().into_lease().is_none(),
        "g is at the new limit"
    );
    for lease in [a, b, c] {
        lease.done().await.unwrap();
    }

    // Without settings: follows the queue's, warns that it cannot group its adds.
    let plain: RedisQueue<String> = RedisQueue::builder("settings")
        .url(server.url())
        .build()
        .await
        .unwrap();
    assert_eq!(warnings("no group function"), 1, "{}", log.text());
    assert_eq!(
        plain
            .flow_limits()
            .await
            .unwrap()
            .unwrap()
            .max_in_flight_per_group,
        Some(2),
        "nothing changed on the server"
    );
    plain.add("x".to_owned()).await.unwrap();
    let leases: Vec<_> = [next(&plain).await, next(&plain).await, next(&plain).await]
        .into_iter()
        .collect();
    let mut items: Vec<&str> = leases.iter().map(|l| l.item().as_str()).collect();
    items.sort();
    assert_eq!(
        items,
        ["g/2", "g/3", "x"],
        "x in the group \"\", g within its limit"
    );
    assert!(plain.try_get().await.unwrap().into_lease().is_none());
    for lease in leases {
        lease.done().await.unwrap();
    }
    support::flow_check::check(&server.url(), "settings")
        .await
        .unwrap();
}

/// A server restarted from its AOF (`appendfsync always`, the test server's) brings the flow
/// keys back consistent: the counts, lists, rings and leases agree, the leases held across
/// the restart still count against the limit until their dones, and the turns go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_from_the_aof_keeps_the_flow_structures_whole() {
    let Some(mut server) = support::server::require() else {
        return;
    };
    let spec = FlowSpec {
        max_in_flight: Some(3),
        max_in_flight_per_group: Some(2),
        group_weights: vec![("heavy".to_owned(), 2)],
        ..FlowSpec::default()
    };
    let queue = flow_builder(&server.url(), "restart", &spec)
        .build()
        .await
        .unwrap();
    for i in 0..6 {
        queue.add(format!("heavy/{i}")).await.unwrap();
        queue.add(format!("light/{i}")).await.unwrap();
    }
    queue
        .add_with(
            "light/urgent".to_owned(),
            workq::AddOptions::default().priority(3),
        )
        .await
        .unwrap();
    let held = [next(&queue).await, next(&queue).await];
    support::flow_check::check(&server.url(), "restart")
        .await
        .unwrap();
    server.restart();
    support::flow_check::check(&server.url(), "restart")
        .await
        .unwrap();
    // Two leases out, from before the restart: one more may go, not two.
    let third = next(&queue).await;
    assert!(
        queue.try_get().await.unwrap().into_lease().is_none(),
        "three out"
    );
    let mut order = vec![
        held[0].item().clone(),
        held[1].item().clone(),
        third.item().clone(),
    ];
    for lease in held {
        lease.done().await.unwrap();
    }
    third.done().await.unwrap();
    while let Some(lease) = queue.try_get().await.unwrap().into_lease() {
        order.push(lease.item().clone());
        lease.done().await.unwrap();
    }
    assert_eq!(order.len(), 13, "{order:?}");
    assert_eq!(order[0], "light/urgent", "priorities first: {order:?}");
    support::flow_check::check(&server.url(), "restart")
        .await
        .unwrap();
}

/// `delete` takes every key of a queue with flow control away, its groups' lists and
/// hashes, rings, parked and idle groups among them: nothing is left to a FLUSH.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_leaves_no_flow_key_behind() {
    let Some(server) = support::server::require() else {
        return;
    };
    let spec = FlowSpec {
        max_in_flight_per_group: Some(1),
        group_limits: vec![("other".to_owned(), 5)],
        group_rates: vec![("slow".to_owned(), 0.5, 1), ("idle".to_owned(), 0.5, 1)],
        ..FlowSpec::default()
    };
    let queue = flow_builder(&server.url(), "gone", &spec)
        .build()
        .await
        .unwrap();
    for item in [
        "slow/0", "slow/1", "busy/0", "busy/1", "idle/0", "raised/0", "other/0",
    ] {
        queue.add(item.to_owned()).await.unwrap();
    }
    queue
        .add_all(["other/1", "other/2", "other/3"].map(str::to_owned))
        .await
        .unwrap();
    queue
        .add_after("later/0".to_owned(), Duration::from_secs(60))
        .await
        .unwrap();
    queue
        .add_with(
            "raised/0".to_owned(),
            workq::AddOptions::default().priority(2),
        )
        .await
        .unwrap();
    // raised/0 (priority 2), then a turn each at 0: slow, busy, idle, other.
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(next(&queue).await);
    }
    let items: Vec<&str> = held.iter().map(|l| l.item().as_str()).collect();
    assert_eq!(items, ["raised/0", "slow/0", "busy/0", "idle/0", "other/0"]);
    // Done: slow may hand out again but waits for its token (parked); idle holds nothing but
    // a refilling bucket; busy stays at its limit; other keeps its turn in the ring.
    let (busy, done): (Vec<_>, Vec<_>) = held.into_iter().partition(|l| l.item() == "busy/0");
    for lease in done {
        lease.done().await.unwrap();
    }
    // other/1, then slow's turn: no token yet, it parks, and other/2 goes.
    let others = [next(&queue).await, next(&queue).await];
    assert_eq!(
        (others[0].item().as_str(), others[1].item().as_str()),
        ("other/1", "other/2")
    );
    let keys = support::keys_of(&server, "gone").await;
    for kind in [
        ":flow", ":fstate", ":fgr", ":frt", ":fq:", ":fg:", ":fr:", ":frings", ":fready", ":fsat",
        ":fpark", ":fidle",
    ] {
        assert!(
            keys.iter().any(|k| k.contains(kind)),
            "the test means to delete a {kind} key: {keys:?}"
        );
    }
    queue.delete().await.unwrap();
    assert_eq!(
        support::keys_of(&server, "gone").await,
        Vec::<String>::new()
    );
    for lease in busy.into_iter().chain(others) {
        lease.abandon();
    }
}

/// A queue built without any flow setting keeps today's structures (no flow key ever
/// appears) and a get runs the commands it ran before flow control existed: 16, counted by
/// the server (`INFO commandstats`), the check for flow control riding on the check for
/// priorities.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_without_flow_control_keeps_its_structures_and_its_get() {
    let Some(server) = support::server::require() else {
        return;
    };
    let queue: RedisQueue<String> = RedisQueue::builder("plain")
        .url(server.url())
        .build()
        .await
        .unwrap();
    queue
        .add_all(["a", "b", "c"].map(str::to_owned))
        .await
        .unwrap();
    let con = support::raw(&server).await;
    // Warm up (the script is loaded), then count one get.
    next(&queue).await.done().await.unwrap();
    let (lease, ran) = support::commands_run_by(&con, next(&queue)).await;
    assert_eq!(ran, 16);
    lease.done().await.unwrap();
    queue
        .add_with("d".to_owned(), workq::AddOptions::default().priority(1))
        .await
        .unwrap();
    queue
        .add_after("e".to_owned(), Duration::from_millis(1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    while let Some(lease) = queue.try_get().await.unwrap().into_lease() {
        lease.release().await.unwrap();
        next(&queue).await.done().await.unwrap();
    }
    let keys = support::keys_of(&server, "plain").await;
    assert!(
        keys.iter().all(|k| !k.contains(":f")),
        "a flow key on a queue without flow control: {keys:?}"
    );
}

/// The operator's view (`RedisAdmin`, through the contract every backend answers): the
/// groups at a glance, the top groups by ready items with their leases out, limit and
/// oldest ready item's age, and the settings every process applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_sees_the_groups_and_the_limits() {
    use workq::admin::Admin;

    let Some(server) = support::server::require() else {
        return;
    };
    let spec = FlowSpec {
        max_in_flight: Some(10),
        max_in_flight_per_group: Some(1),
        group_limits: vec![("wide".to_owned(), 3)],
        ..FlowSpec::default()
    };
    let queue = flow_builder(&server.url(), "seen", &spec)
        .build()
        .await
        .unwrap();
    for i in 0..5 {
        queue.add(format!("noisy/{i}")).await.unwrap();
    }
    for i in 0..3 {
        queue.add(format!("wide/{i}")).await.unwrap();
    }
    queue.add("quiet/0".to_owned()).await.unwrap();
    // One lease each for noisy (now at its limit) and wide, and quiet's only item.
    let held = [next(&queue).await, next(&queue).await, next(&queue).await];
    tokio::time::sleep(Duration::from_millis(20)).await;
    let admin: Box<dyn Admin> =
        Box::new(workq_redis::RedisAdmin::new(&server.url(), "wq").unwrap());
    let stats = admin.stats("seen", 2).await.unwrap();
    let flow = stats.flow.expect("flow figures");
    assert_eq!(
        (flow.groups_ready, flow.groups_saturated, flow.groups),
        (2, 2, 3),
        "noisy and wide have ready items, noisy and quiet are at their limits"
    );
    let top: Vec<(&str, usize, usize, Option<usize>)> = stats
        .groups
        .iter()
        .map(|g| (g.name.as_str(), g.ready, g.in_flight, g.limit))
        .collect();
    assert_eq!(top, [("noisy", 4, 1, Some(1)), ("wide", 2, 1, Some(3))]);
    let oldest = stats.groups[0]
        .oldest_ready
        .expect("the oldest ready item's age");
    assert!(
        oldest >= Duration::from_millis(20) && oldest < Duration::from_secs(10),
        "{oldest:?}"
    );
    let limits = stats.limits.expect("the settings");
    assert_eq!(
        (
            limits.max_in_flight,
            limits.max_in_flight_per_group,
            limits.limit_of("wide")
        ),
        (Some(10), Some(1), Some(3))
    );
    assert_eq!(stats.summary.depth, 6);
    for lease in held {
        lease.done().await.unwrap();
    }
}

/// An item whose workers keep dying goes to the dead letters with its group, and comes
/// back into that group when an operator requeues it; the keys stay whole throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_keeps_its_group() {
    let Some(server) = support::server::require() else {
        return;
    };
    let queue = workq_conformance::with_flow_spec!(
        RedisQueue::builder("letters")
            .url(server.url())
            .lease_duration(Duration::from_millis(50))
            .auto_renew(false)
            .max_stalls(1),
        &FlowSpec {
            max_in_flight_per_group: Some(1),
            ..FlowSpec::default()
        }
    )
    .build()
    .await
    .unwrap();
    queue.add("poison/0".to_owned()).await.unwrap();
    queue.add("poison/1".to_owned()).await.unwrap();
    next(&queue).await.abandon();
    tokio::time::sleep(Duration::from_millis(80)).await;
    // The expired lease is reclaimed, the item buried, and its slot freed.
    let second = next(&queue).await;
    assert_eq!(second.item(), "poison/1");
    let letters = queue
        .dead_letters(workq::admin::End::First, 10)
        .await
        .unwrap();
    assert_eq!(letters.len(), 1);
    assert!(
        letters[0].id.contains("\"group\":\"poison\""),
        "{}",
        letters[0].id
    );
    support::flow_check::check(&server.url(), "letters")
        .await
        .unwrap();
    assert_eq!(queue.requeue_dead_letters().await.unwrap(), 1);
    support::flow_check::check(&server.url(), "letters")
        .await
        .unwrap();
    assert!(
        queue.try_get().await.unwrap().into_lease().is_none(),
        "back in its group, at its limit"
    );
    second.done().await.unwrap();
    assert_eq!(next(&queue).await.item(), "poison/0");
}

/// Flow control comes on with the first handle built with settings (the items the queue
/// holds join the group "", the leased ones counting as its leases), and goes off with
/// `clear_flow_control` (the ready items back in the plain lists, every flow key gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_comes_on_and_goes_off_with_the_items_kept() {
    let Some(server) = support::server::require() else {
        return;
    };
    let plain: RedisQueue<String> = RedisQueue::builder("switch")
        .url(server.url())
        .build()
        .await
        .unwrap();
    for item in ["a/0", "a/1", "b/0", "c/0"] {
        plain.add(item.to_owned()).await.unwrap();
    }
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
    let grouped = per_group(&server, "switch", 2).await;
    support::flow_check::check(&server.url(), "switch")
        .await
        .unwrap();
    // Everything held is in the group "", which has one lease out of two.
    let one = next(&grouped).await;
    assert_eq!(one.item(), "a/0");
    assert!(grouped.try_get().await.unwrap().into_lease().is_none());
    grouped.add("e/0".to_owned()).await.unwrap();
    let e = next(&grouped).await;
    assert_eq!(e.item(), "e/0", "a new add has its group");
    e.done().await.unwrap();
    one.done().await.unwrap();
    leased.done().await.unwrap();
    support::flow_check::check(&server.url(), "switch")
        .await
        .unwrap();

    assert!(plain.clear_flow_control().await.unwrap());
    assert!(!plain.clear_flow_control().await.unwrap(), "once");
    assert_eq!(plain.flow_limits().await.unwrap(), None);
    let keys = support::keys_of(&server, "switch").await;
    assert!(keys.iter().all(|k| !k.contains(":f")), "{keys:?}");
    let mut rest = Vec::new();
    while let Some(lease) = plain.try_get().await.unwrap().into_lease() {
        rest.push(lease.item().clone());
        lease.done().await.unwrap();
    }
    assert_eq!(rest, ["a/1", "b/0", "c/0"]);
    assert_eq!(plain.delayed_len().await.unwrap(), 1);
}

/// Flow control taken off hands the ready items out in the order they became ready, across
/// groups, as a queue without it would: each group's own order kept, an item handed back
/// first in its group, and no group's backlog ahead of another's older items.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_taken_off_hands_out_in_the_order_items_became_ready() {
    let Some(server) = support::server::require() else {
        return;
    };
    let queue = per_group(&server, "off-order", 5).await;
    for item in ["noisy/0", "noisy/1", "quiet/0", "noisy/2", "quiet/1"] {
        queue.add(item.to_owned()).await.unwrap();
    }
    let back = next(&queue).await;
    assert_eq!(back.item(), "noisy/0");
    back.release().await.unwrap();
    assert!(queue.clear_flow_control().await.unwrap());
    let mut order = Vec::new();
    while let Some(lease) = queue.try_get().await.unwrap().into_lease() {
        order.push(lease.item().clone());
        lease.done().await.unwrap();
    }
    assert_eq!(
        order,
        ["noisy/0", "noisy/1", "quiet/0", "noisy/2", "quiet/1"]
    );
}

/// With flow control, an operator's page of the ready items lists them group by group
/// (most ready first), each group's in its order, and from the last end the exact
/// reverse; removing one or retrying one keeps the keys whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_pages_removes_and_retries_in_groups() {
    use workq::admin::{End, ItemState, PageQuery, Retried};

    let Some(server) = support::server::require() else {
        return;
    };
    let queue = per_group(&server, "pages", 5).await;
    for item in ["a/0", "b/0", "a/1", "c/0", "a/2", "b/1"] {
        queue.add(item.to_owned()).await.unwrap();
    }
    let page = |from, cursor: Option<String>| {
        PageQuery::new(ItemState::Ready, 4)
            .from(from)
            .cursor(cursor)
    };
    let first = queue.page(&page(End::First, None)).await.unwrap();
    let items: Vec<&str> = first.items.iter().map(|e| e.item.as_str()).collect();
    assert_eq!(
        (items.as_slice(), first.total),
        (["\"a/0\"", "\"a/1\"", "\"a/2\"", "\"b/0\""].as_slice(), 6)
    );
    let second = queue
        .page(&page(End::First, first.next.clone()))
        .await
        .unwrap();
    let items: Vec<&str> = second.items.iter().map(|e| e.item.as_str()).collect();
    assert_eq!(items, ["\"b/1\"", "\"c/0\""]);
    let last = queue.page(&page(End::Last, None)).await.unwrap();
    let items: Vec<&str> = last.items.iter().map(|e| e.item.as_str()).collect();
    assert_eq!(items, ["\"c/0\"", "\"b/1\"", "\"b/0\"", "\"a/2\""]);

    assert!(queue.remove("\"a/1\"").await.unwrap().queued);
    queue
        .add_after("c/1".to_owned(), Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(queue.retry_now("\"c/1\"").await.unwrap(), Retried::Queued);
    support::flow_check::check(&server.url(), "pages")
        .await
        .unwrap();
    let detail = queue.item_detail("\"c/1\"").await.unwrap().unwrap();
    assert_eq!((detail.priority, detail.position), (Some(0), None));
    let mut order = Vec::new();
    while let Some(lease) = queue.try_get().await.unwrap().into_lease() {
        order.push(lease.item().clone());
        lease.done().await.unwrap();
    }
    assert_eq!(order, ["a/0", "b/0", "c/0", "a/2", "b/1", "c/1"]);
}

/// Every kind of add sends the item's group with it: batched adds (now, after a delay,
/// with a priority), a rate-limited add, a periodic tick's add, a failed item's retry; the
/// server keeps each item in the group its function gave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_add_carries_the_items_group() {
    use std::time::SystemTime;
    use workq::periodic::TickClaim;
    use workq::{AddOptions, Queue};

    let Some(server) = support::server::require() else {
        return;
    };
    let queue = flow_builder(&server.url(), "adds", &FlowSpec::default())
        .rate_limit(workq_redis::RateLimit::exponential(
            Duration::from_millis(1),
            Duration::from_millis(10),
        ))
        .build()
        .await
        .unwrap();
    queue
        .add_all(["a/0", "b/0"].map(str::to_owned))
        .await
        .unwrap();
    queue
        .add_all_after([("c/0".to_owned(), Duration::from_millis(5))])
        .await
        .unwrap();
    queue.add_rate_limited("d/0".to_owned()).await.unwrap();
    Queue::add_all_with(
        &queue,
        vec!["e/0".to_owned(), "e/1".to_owned()],
        AddOptions::default().priority(1),
    )
    .await
    .unwrap();
    let now = SystemTime::now();
    let claim = TickClaim::new("tick", "every second", now, None, now);
    Queue::add_on_tick(&queue, claim, "f/0".to_owned(), AddOptions::default())
        .await
        .unwrap();
    queue
        .add_with(
            "g/0".to_owned(),
            AddOptions::default().after(Duration::from_millis(5)),
        )
        .await
        .unwrap();
    let lease = next(&queue).await;
    let failed = lease.item().clone();
    assert!(
        Queue::retry_and_done(&queue, lease, AddOptions::default().rate_limited(), false)
            .await
            .unwrap()
            .is_none()
    );
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(queue.len().await.unwrap(), 8, "every add is ready");
    let mut con = support::raw(&server).await;
    let groups: std::collections::BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg("wq:{adds}:fgr")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(groups.len(), 8, "{groups:?}");
    for (item, group) in &groups {
        let item: String = serde_json::from_str(item).unwrap();
        assert_eq!(
            workq_conformance::flow::group_of(&item),
            group,
            "{groups:?}"
        );
    }
    assert!(
        groups.contains_key(&format!("{failed:?}")),
        "{failed} is back"
    );
    support::flow_check::check(&server.url(), "adds")
        .await
        .unwrap();
}
