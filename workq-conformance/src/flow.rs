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
//!
//! Some rules need more than one queue handle ([`FlowFactory::flow_handles`]: several
//! processes' handles on a server, clones in memory) or a lease that its holder loses
//! ([`FlowFactory::expiring_flow_queue`] and [`FlowFactory::crash`]: a lease that expires on
//! a server, dropped in memory); their defaults are the in-memory ones.

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
            each_priority_keeps_its_own_turns,
            an_item_handed_back_comes_out_first_in_its_group,
            a_group_at_its_limit_does_not_hold_back_the_others,
            a_dropped_lease_wakes_a_getter_held_back_by_the_queue_wide_limit,
            a_per_group_override_changes_one_groups_limit,
            an_item_re_added_while_processing_waits_for_its_own_done,
            the_hand_out_rate_paces_gets,
            a_group_out_of_tokens_leaves_the_turns_to_the_others,
            the_slowest_hand_out_rates_hold_the_next_item_back,
            a_heavier_group_gets_more_turns,
            between_two_turns_of_a_group_every_other_group_able_to_go_has_one,
            a_lost_lease_frees_its_groups_slot_and_wakes_a_getter,
            limits_hold_with_several_handles_getting_at_once,
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
        crate::with_flow_spec!(WorkQueue::builder(), self).build()
    }
}

/// `$builder` with the settings of the [`FlowSpec`] `$spec`: the group function of
/// `"group/name"` items ([`group_of`]) and every limit, weight and rate. Any backend's
/// builder: the flow methods have the same names everywhere.
#[macro_export]
macro_rules! with_flow_spec {
    ($builder:expr, $spec:expr) => {{
        let spec: &$crate::flow::FlowSpec = $spec;
        let mut builder =
            $builder.group_by(|item: &String| $crate::flow::group_of(item).to_owned());
        if let Some(n) = spec.max_in_flight {
            builder = builder.max_in_flight(n);
        }
        if let Some(n) = spec.max_in_flight_per_group {
            builder = builder.max_in_flight_per_group(n);
        }
        for (group, n) in &spec.group_limits {
            builder = builder.group_max_in_flight(group.clone(), *n);
        }
        for (group, w) in &spec.group_weights {
            builder = builder.group_weight(group.clone(), *w);
        }
        if let Some((rate, burst)) = spec.hand_out_rate {
            builder = builder.hand_out_rate(rate, burst);
        }
        for (group, rate, burst) in &spec.group_rates {
            builder = builder.group_hand_out_rate(group.clone(), *rate, *burst);
        }
        builder
    }};
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

    /// `n` handles on one fresh, empty queue built as `spec` says, as `n` processes would
    /// have them (each built on its own), so that the limits are held across them. By
    /// default `n` clones of one [`flow_queue`](Self::flow_queue): what one process has.
    fn flow_handles(
        &self,
        spec: FlowSpec,
        n: usize,
    ) -> impl Future<Output = Result<Vec<Self::Q>, Unsupported>> + Send {
        async move {
            let queue = self.flow_queue(spec).await?;
            Ok(vec![queue; n])
        }
    }

    /// A fresh, empty queue built as `spec` says whose leases last `lease` unless renewed,
    /// and are not renewed by themselves, so that a lease [`crash`](Self::crash)ed is lost
    /// once `lease` has passed. By default a [`flow_queue`](Self::flow_queue): a backend whose
    /// leases do not expire (in memory, a lease lives as long as its holder).
    fn expiring_flow_queue(
        &self,
        spec: FlowSpec,
        lease: Duration,
    ) -> impl Future<Output = Result<Self::Q, Unsupported>> + Send {
        let _ = lease;
        self.flow_queue(spec)
    }

    /// Lets `lease` go as a worker that dies would: nothing sent, the backend finds out
    /// itself (a server when the lease expires). By default the lease is dropped: in
    /// memory, a holder that dies drops its lease with it.
    fn crash(lease: <Self::Q as Queue>::Lease) {
        drop(lease);
    }
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
    supported(factory.flow_queue(spec).await)
}

/// What a factory made, or `None` after printing why the rule is skipped.
fn supported<T>(made: Result<T, Unsupported>) -> Option<T> {
    match made {
        Ok(made) => Some(made),
        Err(Unsupported(reason)) => {
            eprintln!("skipped: {reason}");
            None
        }
    }
}

/// A small deterministic generator (a linear congruential one): the rules that drive a
/// queue through many random-looking steps take the same steps on every backend and run.
struct Steps(u64);

impl Steps {
    /// A number below `n`.
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

pub(crate) async fn add<Q: Queue<Item = String>>(queue: &Q, item: &str) {
    add_with(queue, item, AddOptions::default()).await;
}

pub(crate) async fn add_with<Q: Queue<Item = String>>(queue: &Q, item: &str, options: AddOptions) {
    let accepted = queue
        .add_with(item.to_owned(), options)
        .await
        .unwrap_or_else(|_| panic!("adding {item} failed"));
    assert!(accepted, "{item} refused");
}

/// The next lease, within [`WAKE`].
pub(crate) async fn get<Q: Queue<Item = String>>(queue: &Q) -> Q::Lease {
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

pub(crate) async fn done<L: QueueLease>(lease: L) {
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

    /// Each priority keeps its own turns: a group's hand-outs at a higher priority neither
    /// cost it its place among the groups of a lower one nor give it a new one. Here `a`
    /// takes its turns at priority 0 before `b` (its item there became ready first), then
    /// after `b` (it had its turn there), whatever it handed out at priority 1 in between.
    pub async fn each_priority_keeps_its_own_turns<F: FlowFactory>(factory: &F) {
        let Some(queue) = queue(factory, FlowSpec::default()).await else {
            return;
        };
        add_with(&queue, "c/high", AddOptions::default().priority(2)).await;
        for item in ["a/0", "b/0", "a/1", "b/1"] {
            add(&queue, item).await;
        }
        let mut got = take(&queue, 1).await;
        add_with(&queue, "a/mid", AddOptions::default().priority(1)).await;
        got.extend(take(&queue, 2).await);
        assert_eq!(
            got,
            ["c/high", "a/mid", "a/0"],
            "a joined the turns at priority 0 before b, and had no turn there yet"
        );
        add_with(&queue, "a/top", AddOptions::default().priority(1)).await;
        got.extend(take(&queue, 4).await);
        assert_eq!(
            got[3..],
            ["a/top", "b/0", "a/1", "b/1"],
            "a had its turn at priority 0: b's comes first there"
        );
    }

    /// An item handed back unprocessed (a released lease) comes out first in its group, before
    /// the group's items that were waiting; handing it back does not give its group another
    /// turn (the others with ready work have theirs first).
    pub async fn an_item_handed_back_comes_out_first_in_its_group<F: FlowFactory>(factory: &F) {
        let Some(queue) = queue(factory, FlowSpec::default()).await else {
            return;
        };
        for item in ["a/0", "a/1", "b/0"] {
            add(&queue, item).await;
        }
        let lease = get(&queue).await;
        assert_eq!(lease.item(), "a/0");
        assert!(
            lease
                .release()
                .await
                .unwrap_or_else(|_| panic!("release failed")),
            "the lease was the holder's"
        );
        assert_eq!(take(&queue, 3).await, ["b/0", "a/0", "a/1"]);
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

    /// The slowest hand-out rates (`1e-30` a second: one token in about 584 years, past the
    /// span a backend's clock or server takes without a cap), over the queue and for one
    /// group: the burst's item goes, the next waits, and no call fails; the group out of
    /// tokens leaves the turns to the others.
    pub async fn the_slowest_hand_out_rates_hold_the_next_item_back<F: FlowFactory>(factory: &F) {
        let spec = FlowSpec {
            hand_out_rate: Some((1e-30, 1)),
            ..FlowSpec::default()
        };
        let Some(queue) = queue(factory, spec).await else {
            return;
        };
        add(&queue, "g/0").await;
        add(&queue, "g/1").await;
        assert_eq!(take(&queue, 1).await, ["g/0"]);
        assert_held(&queue, "the queue's next token is centuries away").await;

        let spec = FlowSpec {
            group_rates: vec![("slow".to_owned(), 1e-30, 1)],
            ..FlowSpec::default()
        };
        let Some(queue) = super::queue(factory, spec).await else {
            return;
        };
        for item in ["slow/0", "slow/1", "fast/0", "fast/1"] {
            add(&queue, item).await;
        }
        let got = take(&queue, 3).await;
        assert_eq!(got, ["slow/0", "fast/0", "fast/1"]);
        assert_held(&queue, "the group's next token is centuries away").await;
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
    /// Fair turns under a limit, with leases ending in any order and adds meanwhile:
    /// between two hand-outs of one group, every other group that could hand out all along
    /// (it had a ready item and a free slot at every get since) had one. Checked against the
    /// rule's own count of each group's ready items and leases out, over a few hundred
    /// steps taken in the same order everywhere; no group ever has more leases out than its
    /// limit, and a get is served whenever some group can hand out.
    pub async fn between_two_turns_of_a_group_every_other_group_able_to_go_has_one<
        F: FlowFactory,
    >(
        factory: &F,
    ) {
        const LIMIT: usize = 2;
        const GROUPS: [&str; 4] = ["noisy", "a", "b", "c"];
        let spec = FlowSpec {
            max_in_flight_per_group: Some(LIMIT),
            ..FlowSpec::default()
        };
        let Some(queue) = queue(factory, spec).await else {
            return;
        };
        let mut steps = Steps(7);
        let mut ready: HashMap<&str, usize> = HashMap::new();
        let mut out: HashMap<String, usize> = HashMap::new();
        let mut added = 0;
        let mut add_to = async |group: &'static str, ready: &mut HashMap<&str, usize>| {
            added += 1;
            add(&queue, &format!("{group}/{added}")).await;
            *ready.entry(group).or_default() += 1;
        };
        for group in [
            "noisy", "noisy", "noisy", "noisy", "noisy", "noisy", "a", "a", "b",
        ] {
            add_to(group, &mut ready).await;
        }
        let mut leases: Vec<<F::Q as Queue>::Lease> = Vec::new();
        // For each group: the hand-out count when it could last start handing out without a
        // break, and the count after its last hand-out.
        let mut able_since: HashMap<String, usize> = HashMap::new();
        let mut last: HashMap<String, usize> = HashMap::new();
        let mut pops = 0;
        let mut held_checks = 0;
        for _ in 0..300 {
            match steps.below(10) {
                0..=2 => {
                    // The noisy group gets most of the adds.
                    let group = if steps.below(2) == 0 {
                        "noisy"
                    } else {
                        GROUPS[steps.below(GROUPS.len())]
                    };
                    add_to(group, &mut ready).await;
                }
                3..=5 if !leases.is_empty() => {
                    let lease = leases.swap_remove(steps.below(leases.len()));
                    *out.get_mut(group_of(lease.item())).unwrap() -= 1;
                    done(lease).await;
                }
                _ => {
                    let able: HashSet<&str> = GROUPS
                        .into_iter()
                        .filter(|g| {
                            ready.get(g).copied().unwrap_or(0) > 0
                                && out.get(*g).copied().unwrap_or(0) < LIMIT
                        })
                        .collect();
                    for group in &able {
                        able_since.entry((*group).to_owned()).or_insert(pops);
                    }
                    able_since.retain(|group, _| able.contains(group.as_str()));
                    if able.is_empty() {
                        if held_checks < 3 {
                            held_checks += 1;
                            assert_held(&queue, "no group may hand out").await;
                        }
                        continue;
                    }
                    let lease = get(&queue).await;
                    let group = group_of(lease.item()).to_owned();
                    assert!(
                        able.contains(group.as_str()),
                        "{} handed out while its group could not hand out (at its limit, or \
                         nothing ready): {out:?}",
                        lease.item()
                    );
                    if let Some(&previous) = last.get(&group) {
                        for (other, &since) in &able_since {
                            if *other != group && since < previous {
                                assert!(
                                    last.get(other).is_some_and(|&l| l > previous),
                                    "{other} could hand out all along, and waited through two \
                                     turns of {group}"
                                );
                            }
                        }
                    }
                    pops += 1;
                    last.insert(group.clone(), pops);
                    able_since.remove(&group);
                    *ready.get_mut(group.as_str()).unwrap() -= 1;
                    *out.entry(group).or_default() += 1;
                    leases.push(lease);
                }
            }
        }
        assert!(pops > 60, "only {pops} hand-outs");
        for lease in leases {
            done(lease).await;
        }
    }

    /// A lease whose holder dies frees its group's slot once the backend finds it lost (a
    /// server: when the lease has expired and the next get reclaims it; in memory: when the
    /// lease is dropped with its holder), and a getter held back by that group's limit is
    /// served then, asleep until it is, not polling. No item is lost.
    pub async fn a_lost_lease_frees_its_groups_slot_and_wakes_a_getter<F: FlowFactory>(
        factory: &F,
    ) {
        let spec = FlowSpec {
            max_in_flight_per_group: Some(1),
            ..FlowSpec::default()
        };
        let lease_for = Duration::from_millis(500);
        let Some(queue) = supported(factory.expiring_flow_queue(spec, lease_for).await) else {
            return;
        };
        for item in ["g/0", "g/1", "h/0"] {
            add(&queue, item).await;
        }
        let lost = get(&queue).await;
        assert_eq!(lost.item(), "g/0");
        let other = get(&queue).await;
        assert_eq!(other.item(), "h/0", "another group is not held back");
        // Done at once: only g's lease is to be lost.
        done(other).await;
        let waiting = {
            let queue = queue.clone();
            tokio::spawn(async move { get(&queue).await })
        };
        tokio::time::sleep(HELD).await;
        assert!(
            !waiting.is_finished(),
            "g is at its limit: the getter waits"
        );
        F::crash(lost);
        let served = tokio::time::timeout(WAKE, waiting)
            .await
            .expect("the lost lease freed g's slot and woke the getter")
            .unwrap();
        assert_eq!(group_of(served.item()), "g", "{}", served.item());
        let mut seen = vec![served.item().clone()];
        done(served).await;
        while queue.len().await.unwrap_or_else(|_| panic!("len")) > 0 {
            let lease = get(&queue).await;
            seen.push(lease.item().clone());
            done(lease).await;
        }
        assert!(
            seen.iter().any(|item| item == "g/1"),
            "g/1 was lost: {seen:?}"
        );
    }

    /// Several handles (processes, on a server) getting at once, each with several getters
    /// that hold their leases a little while, never have more leases out than the limits
    /// between them: per group and over the queue, at any time. One group has half the
    /// items, so that the queue's limit binds while every group has work and the group's
    /// own once the others ran dry. Every item is handed out once.
    pub async fn limits_hold_with_several_handles_getting_at_once<F: FlowFactory>(factory: &F) {
        use std::sync::{Arc, Mutex};

        const PER_GROUP: usize = 2;
        const MAX: usize = 5;
        const ITEMS: usize = 240;
        let spec = FlowSpec {
            max_in_flight: Some(MAX),
            max_in_flight_per_group: Some(PER_GROUP),
            ..FlowSpec::default()
        };
        let Some(handles) = supported(factory.flow_handles(spec, 3).await) else {
            return;
        };
        for i in 0..ITEMS {
            let group = if i % 2 == 0 { 0 } else { 1 + i % 3 };
            add(&handles[i % handles.len()], &format!("g{group}/{i}")).await;
        }
        #[derive(Default)]
        struct Seen {
            out: HashMap<String, usize>,
            total: usize,
            worst_group: usize,
            worst_total: usize,
            handed: HashSet<String>,
        }
        let seen = Arc::new(Mutex::new(Seen::default()));
        let all_handed = Arc::new(tokio::sync::Notify::new());
        let mut getters = Vec::new();
        for (h, handle) in handles.iter().enumerate() {
            for g in 0..4 {
                let (queue, seen) = (handle.clone(), seen.clone());
                let all_handed = all_handed.clone();
                getters.push(tokio::spawn(async move {
                    let mut steps = Steps((h * 4 + g) as u64);
                    while let Some(lease) = queue.get().await.unwrap_or_else(|_| panic!("get")) {
                        let group = group_of(lease.item()).to_owned();
                        {
                            // From the get's return to the done's call: inside the lease as
                            // the backend counts it, so never more than it allowed.
                            let mut s = seen.lock().unwrap();
                            let n = s.out.entry(group.clone()).or_default();
                            *n += 1;
                            let n = *n;
                            s.total += 1;
                            s.worst_group = s.worst_group.max(n);
                            s.worst_total = s.worst_total.max(s.total);
                            assert!(
                                s.handed.insert(lease.item().clone()),
                                "{} handed out twice",
                                lease.item()
                            );
                            if s.handed.len() == ITEMS {
                                all_handed.notify_one();
                            }
                        }
                        // Until the limits were reached once, a lease is held until they
                        // are (or for a second at most): on a loaded machine, leases held a
                        // few random milliseconds may never overlap enough to reach them, and
                        // the rule would prove nothing. A backend that hands out no more
                        // than it should still lets the others fill the slots left.
                        let until = tokio::time::Instant::now() + Duration::from_secs(1);
                        loop {
                            let filled = {
                                let s = seen.lock().unwrap();
                                s.worst_total == MAX && s.worst_group == PER_GROUP
                            };
                            if filled || tokio::time::Instant::now() >= until {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        tokio::time::sleep(Duration::from_millis(steps.below(4) as u64)).await;
                        {
                            let mut s = seen.lock().unwrap();
                            *s.out.get_mut(&group).unwrap() -= 1;
                            s.total -= 1;
                        }
                        done(lease).await;
                    }
                }));
            }
        }
        tokio::time::timeout(WAKE * 3, all_handed.notified())
            .await
            .expect("every item is handed out");
        for handle in &handles {
            handle.shut_down();
        }
        for getter in getters {
            tokio::time::timeout(WAKE, getter)
                .await
                .expect("a shut down handle's getter returns")
                .unwrap();
        }
        let s = seen.lock().unwrap();
        assert!(
            s.worst_group <= PER_GROUP,
            "a group had {} leases out",
            s.worst_group
        );
        assert!(
            s.worst_total <= MAX,
            "the queue had {} leases out",
            s.worst_total
        );
        assert!(
            s.worst_total == MAX && s.worst_group == PER_GROUP,
            "the getters never filled the limits ({} out, {} in a group): the rule proved \
             little",
            s.worst_total,
            s.worst_group
        );
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
