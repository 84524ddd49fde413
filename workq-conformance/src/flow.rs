//! The flow control suite: groups taking turns, concurrency limits and hand-out
//! rates, as rules over the `workq::Queue` trait, so every backend runs the same text.
//!
//! A backend implements [`FlowFactory`]: a fresh queue built as a [`FlowSpec`] says, or
//! [`Unsupported`] with the reason while it has no flow control yet; each rule then prints
//! `skipped: <reason>` on stderr and passes, so the suite can be instantiated everywhere and
//! each skip names its cause (a backend may also put `#[ignore = "..."]` on its
//! instantiation, which `cargo test` lists as ignored with the reason). Instantiate every rule
//! with `workq_conformance::for_each_flow_rule!(its_macro)`.
//!
//! Items are `"group/name"` keys; the spec's queue groups them by the part before the `/`.
//! The rules wait on real time (a backend's server has its own clock): a wait that must not
//! end is bounded by [`HELD`], and every pacing check is a lower bound.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::{Duration, Instant};

use workq::{AddOptions, Queue, QueueLease, WorkQueue};

/// Calls `$suite!(rule, rule, ...)` with the name of every rule in
/// [`flow::rules`](crate::flow::rules).
#[macro_export]
macro_rules! for_each_flow_rule {
    ($suite:ident) => {
        $suite!(
            groups_take_turns_within_a_priority,
            a_group_hands_out_in_the_order_its_items_became_ready,
            priorities_stay_strict_across_groups,
            a_group_at_its_limit_does_not_hold_back_the_others,
            a_dropped_lease_wakes_a_getter_held_back_by_the_queue_wide_limit,
            a_per_group_override_changes_one_groups_limit,
            an_item_re_added_while_processing_waits_for_its_own_done,
            the_hand_out_rate_paces_gets,
            a_group_out_of_tokens_leaves_the_turns_to_the_others,
            a_heavier_group_gets_more_turns,
        );
    };
}

/// Calls `$suite!(rule, ...)` with the name of every rule in
/// [`flow::workers_rules`](crate::flow::workers_rules) (feature `workers`).
#[macro_export]
macro_rules! for_each_flow_workers_rule {
    ($suite:ident) => {
        $suite!(a_worker_pool_never_exceeds_the_limits_and_serves_quiet_groups_first,);
    };
}

/// How long a rule waits to see that a getter stays held back.
pub const HELD: Duration = Duration::from_millis(150);

/// How long a rule waits for a wake-up that must come.
pub const WAKE: Duration = Duration::from_secs(10);

/// The flow control a rule asks for. The queue groups `"group/name"` items by `group`.
#[derive(Debug, Clone, Default)]
pub struct FlowSpec {
    /// `Builder::max_in_flight`.
    pub max_in_flight: Option<usize>,
    /// `Builder::max_in_flight_per_group`.
    pub max_in_flight_per_group: Option<usize>,
    /// `Builder::group_max_in_flight`, per group.
    pub group_limits: Vec<(String, usize)>,
    /// `Builder::group_weight`, per group.
    pub group_weights: Vec<(String, u32)>,
    /// `Builder::hand_out_rate`: per second, burst.
    pub hand_out_rate: Option<(f64, u32)>,
    /// `Builder::group_hand_out_rate`, per group: per second, burst.
    pub group_rates: Vec<(String, f64, u32)>,
}

impl FlowSpec {
    /// The in-memory queue this spec describes.
    pub fn build_memory(&self) -> WorkQueue<String> {
        let mut builder = WorkQueue::builder().group_by(|item: &String| group_of(item).to_owned());
        if let Some(n) = self.max_in_flight {
            builder = builder.max_in_flight(n);
        }
        if let Some(n) = self.max_in_flight_per_group {
            builder = builder.max_in_flight_per_group(n);
        }
        for (group, n) in &self.group_limits {
            builder = builder.group_max_in_flight(group.clone(), *n);
        }
        for (group, w) in &self.group_weights {
            builder = builder.group_weight(group.clone(), *w);
        }
        if let Some((rate, burst)) = self.hand_out_rate {
            builder = builder.hand_out_rate(rate, burst);
        }
        for (group, rate, burst) in &self.group_rates {
            builder = builder.group_hand_out_rate(group.clone(), *rate, *burst);
        }
        builder.build()
    }
}

/// The group of a `"group/name"` item.
pub fn group_of(item: &str) -> &str {
    item.split_once('/').map_or("", |(group, _)| group)
}

/// Why a backend cannot run the flow rules yet.
#[derive(Debug, Clone)]
pub struct Unsupported(pub String);

/// Makes fresh queues with flow control for one rule.
pub trait FlowFactory: Send + Sync {
    /// The queues it makes.
    type Q: Queue<Item = String>;
    /// A fresh, empty queue built as `spec` says, or why this backend cannot.
    fn flow_queue(
        &self,
        spec: FlowSpec,
    ) -> impl Future<Output = Result<Self::Q, Unsupported>> + Send;
}

/// The in-memory queue.
#[derive(Debug)]
pub struct Memory;

impl FlowFactory for Memory {
    type Q = WorkQueue<String>;

    async fn flow_queue(&self, spec: FlowSpec) -> Result<WorkQueue<String>, Unsupported> {
        Ok(spec.build_memory())
    }
}

/// The in-memory queue seen as a backend whose steps `Workers` batch (feature `workers`).
#[cfg(feature = "workers")]
#[derive(Debug)]
pub struct BatchedMemory;

#[cfg(feature = "workers")]
impl FlowFactory for BatchedMemory {
    type Q = crate::workers::Batched;

    async fn flow_queue(&self, spec: FlowSpec) -> Result<crate::workers::Batched, Unsupported> {
        Ok(crate::workers::Batched::new(spec.build_memory()))
    }
}

/// The queue, or `None` after printing why the rule is skipped.
async fn queue<F: FlowFactory>(factory: &F, spec: FlowSpec) -> Option<F::Q> {
    match factory.flow_queue(spec).await {
        Ok(queue) => Some(queue),
        Err(Unsupported(reason)) => {
            eprintln!("skipped: {reason}");
            None
        }
    }
}

async fn add<Q: Queue<Item = String>>(queue: &Q, item: &str) {
    add_with(queue, item, AddOptions::default()).await;
}

async fn add_with<Q: Queue<Item = String>>(queue: &Q, item: &str, options: AddOptions) {
    let accepted = queue
        .add_with(item.to_owned(), options)
        .await
        .unwrap_or_else(|_| panic!("adding {item} failed"));
    assert!(accepted, "{item} refused");
}

/// The next lease, within [`WAKE`].
async fn get<Q: Queue<Item = String>>(queue: &Q) -> Q::Lease {
    tokio::time::timeout(WAKE, queue.get())
        .await
        .expect("a get that must be served was not")
        .unwrap_or_else(|_| panic!("get failed"))
        .expect("the queue is not shut down")
}

/// Asserts that a get stays held back for [`HELD`]; the get is cancelled then (a cancelled
/// `get` loses no item: the `Queue` contract).
async fn assert_held<Q: Queue<Item = String>>(queue: &Q, why: &str) {
    if let Ok(got) = tokio::time::timeout(HELD, queue.get()).await {
        let item = got.ok().flatten().map(|lease| lease.item().clone());
        panic!("{why}: a get was served {item:?}");
    }
}

async fn done<L: QueueLease>(lease: L) {
    lease.done().await.unwrap_or_else(|_| panic!("done failed"));
}

/// Gets `n` items, marking each done at once; returns them in order.
async fn take<Q: Queue<Item = String>>(queue: &Q, n: usize) -> Vec<String> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let lease = get(queue).await;
        out.push(lease.item().clone());
        done(lease).await;
    }
    out
}

/// The rules. Each takes the backend's factory.
pub mod rules {
    use super::*;

    /// Between two hand-outs of one group, every other group with ready work at that
    /// priority gets one: a noisy group's backlog does not put the quiet groups behind it.
    pub async fn groups_take_turns_within_a_priority<F: FlowFactory>(factory: &F) {
        let Some(queue) = queue(factory, FlowSpec::default()).await else {
            return;
        };
        for i in 0..6 {
            add(&queue, &format!("noisy/{i}")).await;
        }
        for group in ["a", "b", "c"] {
            add(&queue, &format!("{group}/only")).await;
        }
        let got = take(&queue, 9).await;
        let first: HashSet<&str> = got[..4].iter().map(|item| group_of(item)).collect();
        assert_eq!(
            first,
            HashSet::from(["noisy", "a", "b", "c"]),
            "each group had a turn among the first four: {got:?}"
        );
    }

    /// Inside a group, items come out in the order they became ready (a delayed one when
    /// its delay ran out).
    pub async fn a_group_hands_out_in_the_order_its_items_became_ready<F: FlowFactory>(
        factory: &F,
    ) {
        let Some(queue) = queue(factory, FlowSpec::default()).await else {
            return;
        };
        add_with(
            &queue,
            "g/late",
            AddOptions::default().after(Duration::from_millis(100)),
        )
        .await;
        for i in 0..3 {
            add(&queue, &format!("g/{i}")).await;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
        add(&queue, "g/3").await;
        assert_eq!(
            take(&queue, 5).await,
            ["g/0", "g/1", "g/2", "g/late", "g/3"]
        );
    }

    /// Priorities stay strict: fairness applies among the groups of one priority.
    pub async fn priorities_stay_strict_across_groups<F: FlowFactory>(factory: &F) {
        let Some(queue) = queue(factory, FlowSpec::default()).await else {
            return;
        };
        add_with(&queue, "a/low", AddOptions::default().priority(-1)).await;
        add(&queue, "b/zero").await;
        add_with(&queue, "a/high", AddOptions::default().priority(5)).await;
        add_with(&queue, "c/high", AddOptions::default().priority(5)).await;
        let got = take(&queue, 4).await;
        let high: HashSet<&str> = got[..2].iter().map(String::as_str).collect();
        assert_eq!(high, HashSet::from(["a/high", "c/high"]), "{got:?}");
        assert_eq!(got[2..], ["b/zero", "a/low"]);
    }

    /// A group at its limit holds back none of the others, and takes its turn again when
    /// one of its leases is done.
    pub async fn a_group_at_its_limit_does_not_hold_back_the_others<F: FlowFactory>(factory: &F) {
        let spec = FlowSpec {
            max_in_flight_per_group: Some(1),
            ..FlowSpec::default()
        };
        let Some(queue) = queue(factory, spec).await else {
            return;
        };
        for i in 0..3 {
            add(&queue, &format!("noisy/{i}")).await;
        }
        add(&queue, "quiet/0").await;
        let noisy = get(&queue).await;
        assert_eq!(noisy.item(), "noisy/0");
        let quiet = get(&queue).await;
        assert_eq!(quiet.item(), "quiet/0");
        assert_held(&queue, "noisy is at its limit").await;
        assert_eq!(queue.len().await.unwrap_or_else(|_| panic!("len")), 2);
        done(noisy).await;
        assert_eq!(get(&queue).await.item(), "noisy/1");
        done(quiet).await;
    }

    /// A getter held back by the queue-wide limit sleeps, and wakes when a lease is done.
    pub async fn a_dropped_lease_wakes_a_getter_held_back_by_the_queue_wide_limit<
        F: FlowFactory,
    >(
        factory: &F,
    ) {
        let spec = FlowSpec {
            max_in_flight: Some(2),
            ..FlowSpec::default()
        };
        let Some(queue) = queue(factory, spec).await else {
            return;
        };
        for group in ["a", "b", "c"] {
            add(&queue, &format!("{group}/0")).await;
        }
        let first = get(&queue).await;
        let _second = get(&queue).await;
        let waiting = {
            let queue = queue.clone();
            tokio::spawn(async move { get(&queue).await.item().clone() })
        };
        tokio::time::sleep(HELD).await;
        assert!(
            !waiting.is_finished(),
            "two leases are out: the third get waits"
        );
        let started = Instant::now();
        done(first).await;
        let third = tokio::time::timeout(WAKE, waiting)
            .await
            .expect("the done woke the getter")
            .unwrap();
        assert_eq!(third, "c/0");
        assert!(started.elapsed() < WAKE);
    }

    /// `group_max_in_flight` raises or lowers one group's limit.
    pub async fn a_per_group_override_changes_one_groups_limit<F: FlowFactory>(factory: &F) {
        let spec = FlowSpec {
            max_in_flight_per_group: Some(1),
            group_limits: vec![("wide".to_owned(), 3)],
            ..FlowSpec::default()
        };
        let Some(queue) = queue(factory, spec).await else {
            return;
        };
        for i in 0..4 {
            add(&queue, &format!("wide/{i}")).await;
            add(&queue, &format!("narrow/{i}")).await;
        }
        let mut leases = Vec::new();
        for _ in 0..4 {
            leases.push(get(&queue).await);
        }
        let mut per_group: HashMap<String, usize> = HashMap::new();
        for lease in &leases {
            *per_group
                .entry(group_of(lease.item()).to_owned())
                .or_default() += 1;
        }
        assert_eq!(per_group["wide"], 3);
        assert_eq!(per_group["narrow"], 1);
        assert_held(&queue, "both groups are at their limits").await;
        for lease in leases {
            done(lease).await;
        }
    }

    /// An item re-added while it is processed waits for its own done, even with a free slot.
    pub async fn an_item_re_added_while_processing_waits_for_its_own_done<F: FlowFactory>(
        factory: &F,
    ) {
        let spec = FlowSpec {
            max_in_flight_per_group: Some(2),
            ..FlowSpec::default()
        };
        let Some(queue) = queue(factory, spec).await else {
            return;
        };
        add(&queue, "g/x").await;
        let lease = get(&queue).await;
        add(&queue, "g/x").await;
        assert_held(&queue, "its own lease is out").await;
        done(lease).await;
        assert_eq!(get(&queue).await.item(), "g/x");
    }

    /// `hand_out_rate`: gets wait for tokens (a lower bound on the time; the burst goes at
    /// once).
    pub async fn the_hand_out_rate_paces_gets<F: FlowFactory>(factory: &F) {
        let spec = FlowSpec {
            hand_out_rate: Some((20.0, 2)),
            ..FlowSpec::default()
        };
        let Some(queue) = queue(factory, spec).await else {
            return;
        };
        for i in 0..6 {
            add(&queue, &format!("g{}/{i}", i % 2)).await;
        }
        let started = Instant::now();
        take(&queue, 6).await;
        // A burst of 2, then 4 tokens 50 ms apart.
        assert!(
            started.elapsed() >= Duration::from_millis(190),
            "6 gets at 20/s with a burst of 2 took {:?}",
            started.elapsed()
        );
    }

    /// A group waiting for a token of its own leaves the turns to the others.
    pub async fn a_group_out_of_tokens_leaves_the_turns_to_the_others<F: FlowFactory>(factory: &F) {
        let spec = FlowSpec {
            group_rates: vec![("slow".to_owned(), 2.0, 1)],
            ..FlowSpec::default()
        };
        let Some(queue) = queue(factory, spec).await else {
            return;
        };
        for i in 0..3 {
            add(&queue, &format!("slow/{i}")).await;
            add(&queue, &format!("fast/{i}")).await;
        }
        let started = Instant::now();
        let got = take(&queue, 4).await;
        assert_eq!(got[0], "slow/0");
        assert_eq!(got[1..], ["fast/0", "fast/1", "fast/2"], "{got:?}");
        assert!(
            started.elapsed() < Duration::from_millis(400),
            "the fast group did not wait for the slow group's token"
        );
        assert_eq!(take(&queue, 1).await, ["slow/1"]);
        assert!(started.elapsed() >= Duration::from_millis(450));
    }

    /// `group_weight`: a group of weight 3 gets three turns for another's one while both
    /// have ready work.
    pub async fn a_heavier_group_gets_more_turns<F: FlowFactory>(factory: &F) {
        let spec = FlowSpec {
            group_weights: vec![("heavy".to_owned(), 3)],
            ..FlowSpec::default()
        };
        let Some(queue) = queue(factory, spec).await else {
            return;
        };
        for i in 0..9 {
            add(&queue, &format!("heavy/{i}")).await;
            add(&queue, &format!("light/{i}")).await;
        }
        let got = take(&queue, 8).await;
        let heavy = got.iter().filter(|item| group_of(item) == "heavy").count();
        assert_eq!(heavy, 6, "6 heavy for 2 light in 8 hand-outs: {got:?}");
    }
}

/// The rules that drive a `Workers` pool over the queue (feature `workers`).
#[cfg(feature = "workers")]
pub mod workers_rules {
    use std::sync::{Arc, Mutex};

    use super::*;
    use workq::Workers;

    /// A pool of 8 workers over a noisy group's backlog and quiet groups' items: no group
    /// ever has more than its limit in the handler, the pool never more than the queue's,
    /// and each quiet item is handled before most of the noisy backlog.
    pub async fn a_worker_pool_never_exceeds_the_limits_and_serves_quiet_groups_first<
        F: FlowFactory,
    >(
        factory: &F,
    ) {
        let spec = FlowSpec {
            max_in_flight: Some(5),
            max_in_flight_per_group: Some(2),
            ..FlowSpec::default()
        };
        let Some(queue) = queue(factory, spec).await else {
            return;
        };
        for i in 0..200 {
            add(&queue, &format!("noisy/{i}")).await;
        }
        for group in 0..6 {
            add(&queue, &format!("quiet{group}/only")).await;
        }
        #[derive(Default)]
        struct Seen {
            out: HashMap<String, usize>,
            total: usize,
            worst_group: usize,
            worst_total: usize,
            order: Vec<String>,
        }
        let seen = Arc::new(Mutex::new(Seen::default()));
        let handler_seen = seen.clone();
        let workers = Workers::new(queue.clone())
            .count(8)
            .spawn_async(move |item: String| {
                let seen = handler_seen.clone();
                async move {
                    let group = group_of(&item).to_owned();
                    {
                        let mut s = seen.lock().unwrap();
                        let n = s.out.entry(group.clone()).or_default();
                        *n += 1;
                        let n = *n;
                        s.total += 1;
                        s.worst_group = s.worst_group.max(n);
                        s.worst_total = s.worst_total.max(s.total);
                        s.order.push(item);
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    let mut s = seen.lock().unwrap();
                    *s.out.get_mut(&group).unwrap() -= 1;
                    s.total -= 1;
                }
            });
        crate::workers::eventually("the pool to handle every item", || async {
            seen.lock().unwrap().order.len() == 206
        })
        .await;
        let summary = workers.shut_down().await;
        assert_eq!(summary.succeeded, 206);
        let s = seen.lock().unwrap();
        assert!(
            s.worst_group <= 2,
            "a group had {} in the handler",
            s.worst_group
        );
        assert!(
            s.worst_total <= 5,
            "the pool had {} in the handler",
            s.worst_total
        );
        let last_quiet = s
            .order
            .iter()
            .rposition(|item| item.starts_with("quiet"))
            .unwrap();
        assert!(
            last_quiet < 40,
            "the last quiet item came out {last_quiet}th of 206"
        );
    }
}
