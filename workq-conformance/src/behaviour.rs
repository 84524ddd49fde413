//! The behaviour suite every backend of the `Queue` rules runs: the rules of docs/api-contract.md's
//! contract as async functions over a small test view of a queue ([`Backend`]), and that view
//! for the in-memory `WorkQueue`. A backend's tests add a [`Factory`] for its own queues and
//! instantiate every rule with `workq_conformance::for_each_rule!(its_macro)`; so Redis,
//! PostgreSQL and the in-memory queue are held to one text of the rules.

use std::collections::HashSet;
use std::future::Future;
use std::time::{Duration, Instant};

use workq::rate_limiter::{ExponentialFailure, MaxOf, RateLimiter, TokenBucket};
use workq::{AddOptions, TryGetError, WorkQueue};

/// Calls `$suite!(rule, rule, ...)` with the name of every rule in
/// [`behaviour::rules`](crate::behaviour::rules).
#[macro_export]
macro_rules! for_each_rule {
    ($suite:ident) => {
        $suite!(
            items_come_out_in_the_order_they_were_added,
            a_duplicate_add_keeps_the_first_position,
            an_item_re_added_while_processing_goes_to_the_tail_when_done,
            an_item_is_never_handed_to_two_workers_at_once,
            re_adds_while_processing_fold_into_one,
            len_counts_only_ready_items,
            add_after_waits_for_the_delay,
            add_after_zero_adds_at_once,
            the_earliest_delay_wins,
            a_later_delay_does_not_postpone,
            add_of_a_delayed_item_makes_it_ready_now_once,
            add_after_of_a_queued_item_keeps_it_queued_once,
            add_after_while_processing_requeues_after_done,
            delayed_items_become_ready_in_due_order,
            an_item_whose_delay_ran_out_comes_before_a_later_add,
            delayed_and_plain_adds_come_out_in_the_order_they_became_ready,
            an_add_of_an_item_whose_delay_ran_out_keeps_its_place,
            rate_limited_retries_back_off_exponentially,
            forget_resets_the_failure_count,
            a_rate_limited_re_add_while_processing_waits_for_done,
            the_token_bucket_limits_the_rate,
            shut_down_ignores_adds_and_drains_queued_items,
            shut_down_wakes_blocked_getters,
            a_delayed_item_is_not_handed_out_after_shut_down,
            done_after_shut_down_requeues_a_re_added_item,
            a_blocked_get_is_woken_by_an_add,
            concurrent_getters_each_get_distinct_items,
            shut_down_with_drain_waits_for_leases,
            a_dropped_lease_of_a_re_added_item_queues_it_once,
            higher_priorities_come_out_first_fifo_within_a_priority,
            len_counts_the_items_of_every_priority,
            a_re_add_raises_a_priority_and_never_lowers_it,
            a_raised_item_joins_the_tail_of_its_new_priority,
            an_add_without_a_priority_keeps_the_items_own,
            a_delayed_item_keeps_its_priority,
            a_delayed_duplicate_with_a_higher_priority_raises_it,
            a_re_add_while_processing_takes_the_highest_re_add_priority,
            a_rate_limited_add_with_a_delay_takes_the_shorter_one,
        );
    };
}

/// The rate limiter a rule asks for; both backends build the same one.
#[derive(Debug, Clone, Copy)]
pub struct Opts {
    /// Exponential backoff: base.
    pub base: Duration,
    /// Exponential backoff: cap.
    pub max: Duration,
    /// A token bucket: rate and burst.
    pub bucket: Option<(f64, u32)>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            base: Duration::from_millis(5),
            max: Duration::from_secs(1000),
            bucket: None,
        }
    }
}

/// A queue as the behaviour suite sees it: `WorkQueue`'s methods, made async. Errors of a
/// backend are panics here (a rule's failure).
#[expect(
    clippy::len_without_is_empty,
    reason = "the methods the rules call, and no more"
)]
pub trait Backend: Clone + Send + Sync + 'static {
    /// What `get` hands out.
    type Lease: Send + 'static;
    /// `add`.
    fn add(&self, item: &str) -> impl Future<Output = ()> + Send;
    /// `add_after`.
    fn add_after(&self, item: &str, delay: Duration) -> impl Future<Output = ()> + Send;
    /// `add_rate_limited`.
    fn add_rate_limited(&self, item: &str) -> impl Future<Output = ()> + Send;
    /// `add_with`.
    fn add_with(&self, item: &str, options: AddOptions) -> impl Future<Output = ()> + Send;
    /// `forget`.
    fn forget(&self, item: &str) -> impl Future<Output = ()> + Send;
    /// `num_requeues`.
    fn num_requeues(&self, item: &str) -> impl Future<Output = usize> + Send;
    /// `len`: the ready items.
    fn len(&self) -> impl Future<Output = usize> + Send;
    /// `get`: waits for an item; `None` once shut down and drained.
    fn get(&self) -> impl Future<Output = Option<Self::Lease>> + Send;
    /// `try_get`.
    fn try_get(&self) -> impl Future<Output = Result<Self::Lease, TryGetError>> + Send;
    /// client-go's `ShutDown` of the queue, for every holder of it.
    fn shut_down(&self) -> impl Future<Output = ()> + Send;
    /// `shut_down_with_drain`: waits for the leases handed out.
    fn shut_down_with_drain(&self) -> impl Future<Output = ()> + Send;
    /// `is_shutting_down`.
    fn is_shutting_down(&self) -> impl Future<Output = bool> + Send;
    /// The item of a lease.
    fn item(lease: &Self::Lease) -> String;
    /// The priority a lease was handed out at.
    fn priority(lease: &Self::Lease) -> i32;
    /// Marks a lease's item done.
    fn done(lease: Self::Lease) -> impl Future<Output = ()> + Send;
}

/// Makes fresh, empty queues for one test.
pub trait Factory: Send + Sync {
    /// The queues it makes.
    type Queue: Backend;
    /// A fresh, empty queue with the rate limiter `opts` asks for.
    fn queue(&self, opts: Opts) -> impl Future<Output = Self::Queue> + Send;
}

// ===== in memory =====

/// The in-memory `WorkQueue` as a [`Backend`].
#[derive(Debug, Clone)]
pub struct Memory(WorkQueue<String>);

/// Makes in-memory queues.
#[derive(Debug)]
pub struct MemoryFactory;

impl Factory for MemoryFactory {
    type Queue = Memory;

    async fn queue(&self, opts: Opts) -> Memory {
        let exponential = ExponentialFailure::new(opts.base, opts.max);
        let queue = match opts.bucket {
            None => WorkQueue::builder().rate_limiter(exponential).build(),
            Some((qps, burst)) => {
                let limiters: Vec<Box<dyn RateLimiter<String>>> = vec![
                    Box::new(exponential),
                    Box::new(TokenBucket::new(qps, burst as usize)),
                ];
                WorkQueue::builder()
                    .rate_limiter(MaxOf::new(limiters))
                    .build()
            }
        };
        Memory(queue)
    }
}

impl Backend for Memory {
    type Lease = workq::Lease<String>;

    async fn add(&self, item: &str) {
        self.0.add(item.to_owned());
    }
    async fn add_after(&self, item: &str, delay: Duration) {
        self.0.add_after(item.to_owned(), delay);
    }
    async fn add_rate_limited(&self, item: &str) {
        self.0.add_rate_limited(item.to_owned());
    }
    async fn add_with(&self, item: &str, options: AddOptions) {
        self.0.add_with(item.to_owned(), options);
    }
    async fn forget(&self, item: &str) {
        self.0.forget(&item.to_owned());
    }
    async fn num_requeues(&self, item: &str) -> usize {
        self.0.num_requeues(&item.to_owned())
    }
    async fn len(&self) -> usize {
        self.0.len()
    }
    async fn get(&self) -> Option<Self::Lease> {
        self.0.get().await
    }
    async fn try_get(&self) -> Result<Self::Lease, TryGetError> {
        self.0.try_get()
    }
    async fn shut_down(&self) {
        self.0.shut_down();
    }
    async fn shut_down_with_drain(&self) {
        self.0.shut_down_with_drain().await;
    }
    async fn is_shutting_down(&self) -> bool {
        self.0.is_shutting_down()
    }
    fn item(lease: &Self::Lease) -> String {
        lease.item().clone()
    }
    fn priority(lease: &Self::Lease) -> i32 {
        lease.priority()
    }
    async fn done(lease: Self::Lease) {
        lease.done();
    }
}

/// Waits until `check` holds, for at most 5 s.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(5);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Takes every ready item, in hand-out order, marking each done.
async fn take_all<Q: Backend>(queue: &Q) -> Vec<String> {
    let mut items = Vec::new();
    while let Ok(lease) = queue.try_get().await {
        items.push(Q::item(&lease));
        Q::done(lease).await;
    }
    items
}

/// Takes every ready item with its lease's priority, in hand-out order, marking each done.
async fn take_all_with_priority<Q: Backend>(queue: &Q) -> Vec<(String, i32)> {
    let mut items = Vec::new();
    while let Ok(lease) = queue.try_get().await {
        items.push((Q::item(&lease), Q::priority(&lease)));
        Q::done(lease).await;
    }
    items
}

/// An add with priority `p`.
fn prio(p: i32) -> AddOptions {
    AddOptions::default().priority(p)
}

/// `(item, priority)` pairs, for comparisons.
fn pairs(expected: &[(&str, i32)]) -> Vec<(String, i32)> {
    expected.iter().map(|&(x, p)| (x.to_owned(), p)).collect()
}

/// Waits for the next item with a 5 s limit.
async fn next<Q: Backend>(queue: &Q) -> Q::Lease {
    tokio::time::timeout(Duration::from_secs(5), queue.get())
        .await
        .expect("an item within 5 s")
        .expect("an item, not shut down")
}

/// The rules, one async function each: `rule(&factory).await` panics when the backend breaks
/// it.
pub mod rules {
    #![expect(missing_docs, reason = "each rule's name is its statement")]

    use super::*;

    pub async fn items_come_out_in_the_order_they_were_added<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        for key in ["c", "a", "b"] {
            queue.add(key).await;
        }
        assert_eq!(take_all(&queue).await, ["c", "a", "b"]);
    }

    pub async fn a_duplicate_add_keeps_the_first_position<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        queue.add("a").await;
        queue.add("b").await;
        queue.add("a").await;
        assert_eq!(queue.len().await, 2);
        assert_eq!(take_all(&queue).await, ["a", "b"]);
    }

    pub async fn an_item_re_added_while_processing_goes_to_the_tail_when_done<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        queue.add("a").await;
        queue.add("b").await;
        let a = queue.try_get().await.unwrap();
        queue.add("a").await;
        queue.add("c").await;
        F::Queue::done(a).await;
        assert_eq!(take_all(&queue).await, ["b", "c", "a"]);
    }

    pub async fn an_item_is_never_handed_to_two_workers_at_once<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        queue.add("key").await;
        let lease = queue.try_get().await.unwrap();
        queue.add("key").await;
        assert_eq!(queue.try_get().await.err(), Some(TryGetError::Empty));
        assert_eq!(queue.len().await, 0);
        F::Queue::done(lease).await;
        assert_eq!(take_all(&queue).await, ["key"]);
    }

    pub async fn re_adds_while_processing_fold_into_one<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        queue.add("key").await;
        let lease = queue.try_get().await.unwrap();
        for _ in 0..5 {
            queue.add("key").await;
        }
        F::Queue::done(lease).await;
        assert_eq!(take_all(&queue).await, ["key"]);
        assert_eq!(queue.try_get().await.err(), Some(TryGetError::Empty));
    }

    pub async fn len_counts_only_ready_items<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        queue.add("ready").await;
        queue.add("processing").await;
        queue.add_after("delayed", Duration::from_secs(60)).await;
        assert_eq!(queue.len().await, 2, "a delayed item is not counted");
        let ready = queue.try_get().await.unwrap();
        let processing = queue.try_get().await.unwrap();
        assert_eq!(
            queue.len().await,
            0,
            "items being processed are not counted"
        );
        queue.add("processing").await;
        assert_eq!(
            queue.len().await,
            0,
            "a re-add while processing is not counted"
        );
        F::Queue::done(processing).await;
        assert_eq!(queue.len().await, 1, "counted again once done");
        F::Queue::done(ready).await;
    }

    pub async fn add_after_waits_for_the_delay<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        let start = Instant::now();
        queue.add_after("key", Duration::from_millis(300)).await;
        assert_eq!(queue.len().await, 0);
        let lease = next(&queue).await;
        assert!(
            start.elapsed() >= Duration::from_millis(295),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(F::Queue::item(&lease), "key");
    }

    pub async fn add_after_zero_adds_at_once<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        queue.add_after("key", Duration::ZERO).await;
        assert_eq!(queue.len().await, 1);
    }

    pub async fn the_earliest_delay_wins<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        let start = Instant::now();
        queue.add_after("key", Duration::from_secs(60)).await;
        queue.add_after("key", Duration::from_millis(100)).await;
        let lease = next(&queue).await;
        assert!(start.elapsed() < Duration::from_secs(5));
        assert_eq!(F::Queue::item(&lease), "key");
        F::Queue::done(lease).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            queue.try_get().await.err(),
            Some(TryGetError::Empty),
            "once"
        );
    }

    pub async fn a_later_delay_does_not_postpone<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        let start = Instant::now();
        queue.add_after("key", Duration::from_millis(100)).await;
        queue.add_after("key", Duration::from_secs(60)).await;
        let _lease = next(&queue).await;
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    pub async fn add_of_a_delayed_item_makes_it_ready_now_once<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        queue.add_after("key", Duration::from_millis(200)).await;
        queue.add("key").await;
        assert_eq!(queue.len().await, 1);
        let lease = queue.try_get().await.unwrap();
        F::Queue::done(lease).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(queue.try_get().await.err(), Some(TryGetError::Empty));
    }

    pub async fn add_after_of_a_queued_item_keeps_it_queued_once<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        queue.add("key").await;
        queue.add_after("key", Duration::from_millis(100)).await;
        assert_eq!(take_all(&queue).await, ["key"]);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(queue.try_get().await.err(), Some(TryGetError::Empty));
    }

    pub async fn add_after_while_processing_requeues_after_done<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        queue.add("key").await;
        let lease = queue.try_get().await.unwrap();
        queue.add_after("key", Duration::from_millis(100)).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(queue.try_get().await.err(), Some(TryGetError::Empty));
        F::Queue::done(lease).await;
        assert_eq!(take_all(&queue).await, ["key"]);
    }

    pub async fn delayed_items_become_ready_in_due_order<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        queue.add_after("a", Duration::from_millis(300)).await;
        queue.add_after("b", Duration::from_millis(100)).await;
        queue.add_after("c", Duration::from_millis(200)).await;
        tokio::time::sleep(Duration::from_millis(450)).await;
        assert_eq!(take_all(&queue).await, ["b", "c", "a"]);
    }

    /// client-go's order: a delayed item joins the queue when its delay runs out, so it comes
    /// before an item added later, whether or not a get looked at the queue in between.
    pub async fn an_item_whose_delay_ran_out_comes_before_a_later_add<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        queue.add_after("a", Duration::from_millis(100)).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        queue.add("b").await;
        assert_eq!(take_all(&queue).await, ["a", "b"]);
    }

    /// Ready items come out in the order they became ready: delayed ones at their due time,
    /// the others at their add.
    pub async fn delayed_and_plain_adds_come_out_in_the_order_they_became_ready<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        queue.add("x").await;
        queue.add_after("a", Duration::from_millis(100)).await;
        queue.add_after("c", Duration::from_millis(400)).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
        queue.add("b").await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        queue.add("d").await;
        assert_eq!(take_all(&queue).await, ["x", "a", "b", "c", "d"]);
    }

    /// An add of an item whose delay ran out is a duplicate: the item keeps the place it took
    /// when its delay ran out.
    pub async fn an_add_of_an_item_whose_delay_ran_out_keeps_its_place<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        queue.add_after("a", Duration::from_millis(100)).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        queue.add("b").await;
        queue.add("a").await;
        assert_eq!(queue.len().await, 2);
        assert_eq!(take_all(&queue).await, ["a", "b"]);
    }

    /// Measures how long `add_rate_limited` delays `item`.
    async fn rate_limited_delay<Q: Backend>(queue: &Q, item: &str) -> Duration {
        let start = Instant::now();
        queue.add_rate_limited(item).await;
        let lease = next(queue).await;
        let waited = start.elapsed();
        Q::done(lease).await;
        waited
    }

    pub async fn rate_limited_retries_back_off_exponentially<F: Factory>(f: &F) {
        let opts = Opts {
            base: Duration::from_millis(100),
            max: Duration::from_millis(350),
            bucket: None,
        };
        let queue = f.queue(opts).await;
        let first = rate_limited_delay(&queue, "key").await;
        assert_eq!(queue.num_requeues("key").await, 1);
        let second = rate_limited_delay(&queue, "key").await;
        let third = rate_limited_delay(&queue, "key").await;
        assert_eq!(queue.num_requeues("key").await, 3);
        assert!(first >= Duration::from_millis(95), "{first:?}");
        assert!(second >= Duration::from_millis(195), "{second:?}");
        assert!(
            third >= Duration::from_millis(345),
            "capped at max: {third:?}"
        );
        assert!(
            third < Duration::from_millis(395 + 300),
            "capped at max: {third:?}"
        );
        assert_eq!(queue.num_requeues("other").await, 0);
    }

    pub async fn forget_resets_the_failure_count<F: Factory>(f: &F) {
        let opts = Opts {
            base: Duration::from_millis(100),
            max: Duration::from_secs(10),
            bucket: None,
        };
        let queue = f.queue(opts).await;
        queue.add_rate_limited("key").await;
        queue.add_rate_limited("key").await;
        assert_eq!(queue.num_requeues("key").await, 2);
        queue.forget("key").await;
        assert_eq!(queue.num_requeues("key").await, 0);
        let _ = next(&queue).await;
        assert_eq!(queue.num_requeues("key").await, 0);
    }

    pub async fn a_rate_limited_re_add_while_processing_waits_for_done<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        queue.add("key").await;
        let lease = queue.try_get().await.unwrap();
        queue.add_rate_limited("key").await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(queue.try_get().await.err(), Some(TryGetError::Empty));
        F::Queue::done(lease).await;
        assert_eq!(take_all(&queue).await, ["key"]);
    }

    pub async fn the_token_bucket_limits_the_rate<F: Factory>(f: &F) {
        let opts = Opts {
            base: Duration::from_micros(1),
            max: Duration::from_micros(1),
            bucket: Some((10.0, 2)),
        };
        let queue = f.queue(opts).await;
        let start = Instant::now();
        for item in ["a", "b", "c", "d"] {
            queue.add_rate_limited(item).await;
        }
        assert!(queue.len().await < 4, "the bucket holds two tokens");
        let mut got = HashSet::new();
        for _ in 0..4 {
            let lease = next(&queue).await;
            got.insert(F::Queue::item(&lease));
            F::Queue::done(lease).await;
        }
        assert_eq!(got.len(), 4);
        assert!(
            start.elapsed() >= Duration::from_millis(190),
            "{:?}",
            start.elapsed()
        );
    }

    pub async fn shut_down_ignores_adds_and_drains_queued_items<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        queue.add("a").await;
        queue.add("b").await;
        assert!(!queue.is_shutting_down().await);
        queue.shut_down().await;
        assert!(queue.is_shutting_down().await);
        queue.add("c").await;
        let a = next(&queue).await;
        let b = next(&queue).await;
        assert_eq!([F::Queue::item(&a), F::Queue::item(&b)], ["a", "b"]);
        assert!(queue.get().await.is_none());
        assert_eq!(queue.try_get().await.err(), Some(TryGetError::ShutDown));
    }

    pub async fn shut_down_wakes_blocked_getters<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        let getters: Vec<_> = (0..3)
            .map(|_| {
                let queue = queue.clone();
                tokio::spawn(async move { queue.get().await.is_none() })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let start = Instant::now();
        queue.shut_down().await;
        for getter in getters {
            let woke = tokio::time::timeout(Duration::from_secs(8), getter).await;
            assert!(woke.expect("woken").unwrap(), "get returns None");
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    }

    /// In memory the delayed item is dropped; on Redis it is kept for a resume. Either way it
    /// is not handed out.
    pub async fn a_delayed_item_is_not_handed_out_after_shut_down<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        queue.add_after("key", Duration::from_millis(100)).await;
        queue.shut_down().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(queue.try_get().await.err(), Some(TryGetError::ShutDown));
    }

    pub async fn done_after_shut_down_requeues_a_re_added_item<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        queue.add("key").await;
        let lease = queue.try_get().await.unwrap();
        queue.add("key").await;
        queue.shut_down().await;
        F::Queue::done(lease).await;
        assert_eq!(take_all(&queue).await, ["key"]);
        assert_eq!(queue.try_get().await.err(), Some(TryGetError::ShutDown));
    }

    pub async fn a_blocked_get_is_woken_by_an_add<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        let getter = {
            let queue = queue.clone();
            tokio::spawn(async move { queue.get().await.map(|l| F::Queue::item(&l)) })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let start = Instant::now();
        queue.add("key").await;
        let got = tokio::time::timeout(Duration::from_secs(8), getter).await;
        assert_eq!(got.expect("woken").unwrap().as_deref(), Some("key"));
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    }

    pub async fn concurrent_getters_each_get_distinct_items<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let getters: Vec<_> = (0..4)
            .map(|_| {
                let queue = queue.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    // Keep the lease until the test has seen all four, so none comes twice.
                    let lease = queue.get().await.unwrap();
                    tx.send(F::Queue::item(&lease)).unwrap();
                    lease
                })
            })
            .collect();
        for i in 0..4 {
            queue.add(&i.to_string()).await;
        }
        let mut got = HashSet::new();
        for _ in 0..4 {
            let item = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .expect("every getter gets one")
                .unwrap();
            got.insert(item);
        }
        assert_eq!(got.len(), 4);
        for getter in getters {
            F::Queue::done(getter.await.unwrap()).await;
        }
    }

    pub async fn shut_down_with_drain_waits_for_leases<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        queue.add("key").await;
        let lease = queue.try_get().await.unwrap();
        let drain = {
            let queue = queue.clone();
            tokio::spawn(async move { queue.shut_down_with_drain().await })
        };
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(!drain.is_finished(), "waits for the lease");
        assert!(queue.is_shutting_down().await);
        F::Queue::done(lease).await;
        tokio::time::timeout(Duration::from_secs(5), drain)
            .await
            .expect("drained once the lease is done")
            .unwrap();
    }

    /// In memory a dropped lease is client-go's deferred `Done`; on Redis it is a release.
    /// For an item re-added while processing both queue it again, once.
    pub async fn a_dropped_lease_of_a_re_added_item_queues_it_once<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        queue.add("key").await;
        let lease = queue.try_get().await.unwrap();
        queue.add("key").await;
        drop(lease);
        eventually("the item is queued again", || async {
            queue.len().await == 1
        })
        .await;
        assert_eq!(take_all(&queue).await, ["key"]);
    }
    pub async fn higher_priorities_come_out_first_fifo_within_a_priority<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        queue.add_with("a", AddOptions::default()).await;
        queue.add_with("b", prio(1)).await;
        queue.add_with("c", prio(-1)).await;
        queue.add("d").await;
        queue.add_with("e", prio(1)).await;
        queue.add_with("f", prio(i32::MAX)).await;
        queue.add_with("g", prio(-1)).await;
        queue.add_with("h", prio(0)).await;
        queue.add_with("i", prio(i32::MIN)).await;
        assert_eq!(
            take_all_with_priority(&queue).await,
            pairs(&[
                ("f", i32::MAX),
                ("b", 1),
                ("e", 1),
                ("a", 0),
                ("d", 0),
                ("h", 0),
                ("c", -1),
                ("g", -1),
                ("i", i32::MIN),
            ])
        );
        assert_eq!(queue.len().await, 0);
    }

    pub async fn len_counts_the_items_of_every_priority<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        queue.add_with("a", prio(3)).await;
        queue.add("b").await;
        queue.add_with("c", prio(-3)).await;
        queue.add_with("d", prio(3)).await;
        assert_eq!(queue.len().await, 4);
        let lease = next(&queue).await;
        assert_eq!(
            (F::Queue::item(&lease), F::Queue::priority(&lease)),
            ("a".into(), 3)
        );
        assert_eq!(queue.len().await, 3, "the leased item is not counted");
        F::Queue::done(lease).await;
        assert_eq!(take_all(&queue).await, ["d", "b", "c"]);
        assert_eq!(queue.len().await, 0);
    }

    pub async fn a_re_add_raises_a_priority_and_never_lowers_it<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        queue.add_with("up", prio(1)).await;
        queue.add_with("up", prio(2)).await;
        queue.add_with("down", prio(2)).await;
        queue.add_with("down", prio(1)).await;
        assert_eq!(queue.len().await, 2, "each item is queued once");
        assert_eq!(
            take_all_with_priority(&queue).await,
            pairs(&[("up", 2), ("down", 2)])
        );
        // A raise moves a queued item ahead of the items of its old priority.
        queue.add("foo").await;
        queue.add("bar").await;
        queue.add("baz").await;
        queue.add_with("baz", prio(1)).await;
        assert_eq!(queue.len().await, 3);
        assert_eq!(
            take_all_with_priority(&queue).await,
            pairs(&[("baz", 1), ("foo", 0), ("bar", 0)])
        );
    }

    pub async fn a_raised_item_joins_the_tail_of_its_new_priority<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        queue.add_with("foo", prio(0)).await;
        queue.add_with("bar", prio(1)).await;
        queue.add_with("foo", prio(1)).await;
        queue.add_with("low", prio(-5)).await;
        queue.add_with("low", prio(-1)).await;
        queue.add_with("lower", prio(-2)).await;
        assert_eq!(
            take_all_with_priority(&queue).await,
            pairs(&[("bar", 1), ("foo", 1), ("low", -1), ("lower", -2)])
        );
    }

    pub async fn an_add_without_a_priority_keeps_the_items_own<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        queue.add_with("high", prio(3)).await;
        queue.add_with("low", prio(-2)).await;
        queue.add("mid").await;
        queue.add("high").await;
        queue.add("low").await;
        queue.add_after("low", Duration::ZERO).await;
        // A delayed item keeps its priority through an add without one, too.
        queue
            .add_with(
                "later",
                AddOptions::default()
                    .after(Duration::from_secs(3600))
                    .priority(-7),
            )
            .await;
        queue.add("later").await;
        assert_eq!(
            take_all_with_priority(&queue).await,
            pairs(&[("high", 3), ("mid", 0), ("low", -2), ("later", -7)])
        );
    }

    pub async fn a_delayed_item_keeps_its_priority<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        // Long enough that three calls to a server on a loaded machine end before it.
        let delay = Duration::from_secs(1);
        queue
            .add_with("late", AddOptions::default().after(delay).priority(5))
            .await;
        queue
            .add_with("later", AddOptions::default().after(delay).priority(-5))
            .await;
        queue.add("now").await;
        assert_eq!(queue.len().await, 1);
        eventually("both delayed items are ready", || async {
            queue.len().await == 3
        })
        .await;
        assert_eq!(
            take_all_with_priority(&queue).await,
            pairs(&[("late", 5), ("now", 0), ("later", -5)])
        );
    }

    pub async fn a_delayed_duplicate_with_a_higher_priority_raises_it<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        // Queued: a delayed add with a higher priority raises it, and it stays queued once.
        queue.add("a").await;
        queue.add("b").await;
        queue
            .add_with(
                "b",
                AddOptions::default()
                    .after(Duration::from_secs(3600))
                    .priority(2),
            )
            .await;
        assert_eq!(queue.len().await, 2);
        assert_eq!(
            take_all_with_priority(&queue).await,
            pairs(&[("b", 2), ("a", 0)])
        );
        // Delayed: the highest priority of its delayed adds goes with it once it is added.
        let hour = AddOptions::default().after(Duration::from_secs(3600));
        queue.add_with("c", hour.priority(1)).await;
        queue.add_with("c", hour.priority(4)).await;
        queue.add_with("c", hour.priority(2)).await;
        queue.add("d").await;
        assert_eq!(queue.len().await, 1, "c is still delayed");
        queue.add("c").await;
        assert_eq!(
            take_all_with_priority(&queue).await,
            pairs(&[("c", 4), ("d", 0)])
        );
        // A delayed item at 0 added with a higher priority and no delay is ready at once.
        queue.add_with("e", hour.priority(0)).await;
        queue.add_with("e", prio(1)).await;
        assert_eq!(queue.len().await, 1);
        assert_eq!(take_all_with_priority(&queue).await, pairs(&[("e", 1)]));
    }

    pub async fn a_re_add_while_processing_takes_the_highest_re_add_priority<F: Factory>(f: &F) {
        let queue = f.queue(Opts::default()).await;
        queue.add_with("foo", prio(5)).await;
        let lease = next(&queue).await;
        assert_eq!(F::Queue::priority(&lease), 5);
        queue.add_with("foo", prio(1)).await;
        queue.add_with("foo", prio(3)).await;
        queue.add("foo").await;
        queue.add_with("foo", prio(2)).await;
        queue.add_with("bar", prio(3)).await;
        queue.add_with("baz", prio(2)).await;
        assert_eq!(
            queue.len().await,
            2,
            "the re-added item waits for its lease"
        );
        F::Queue::done(lease).await;
        // At the tail of priority 3, behind bar.
        let first = next(&queue).await;
        assert_eq!(
            (F::Queue::item(&first), F::Queue::priority(&first)),
            ("bar".into(), 3)
        );
        F::Queue::done(first).await;
        let lease = next(&queue).await;
        assert_eq!(
            (F::Queue::item(&lease), F::Queue::priority(&lease)),
            ("foo".into(), 3)
        );
        // Re-adds without a priority: queued at 0 when done, not at the lease's 3.
        queue.add("foo").await;
        queue.add_with("neg", prio(-1)).await;
        F::Queue::done(lease).await;
        assert_eq!(
            take_all_with_priority(&queue).await,
            pairs(&[("baz", 2), ("foo", 0), ("neg", -1)])
        );
        // A negative re-add priority counts as given.
        queue.add_with("foo", prio(4)).await;
        let lease = next(&queue).await;
        queue.add_with("foo", prio(-3)).await;
        queue.add_with("other", prio(-2)).await;
        F::Queue::done(lease).await;
        assert_eq!(
            take_all_with_priority(&queue).await,
            pairs(&[("other", -2), ("foo", -3)])
        );
    }

    pub async fn a_rate_limited_add_with_a_delay_takes_the_shorter_one<F: Factory>(f: &F) {
        let queue = f
            .queue(Opts {
                base: Duration::from_secs(3600),
                ..Opts::default()
            })
            .await;
        // Long enough that three calls to a server on a loaded machine end before it.
        queue
            .add_with(
                "soon",
                AddOptions::default()
                    .rate_limited()
                    .after(Duration::from_secs(1))
                    .priority(2),
            )
            .await;
        queue.add("now").await;
        assert_eq!(
            queue.num_requeues("soon").await,
            1,
            "the limiter counted it"
        );
        assert_eq!(queue.len().await, 1);
        eventually("the shorter delay passed", || async {
            queue.len().await == 2
        })
        .await;
        assert_eq!(
            take_all_with_priority(&queue).await,
            pairs(&[("soon", 2), ("now", 0)])
        );
        // The limiter's delay wins when it is the shorter one.
        let queue = f.queue(Opts::default()).await;
        let start = Instant::now();
        queue
            .add_with(
                "x",
                AddOptions::default()
                    .rate_limited()
                    .after(Duration::from_secs(3600)),
            )
            .await;
        let lease = next(&queue).await;
        assert!(start.elapsed() < Duration::from_secs(5));
        assert_eq!(F::Queue::item(&lease), "x");
    }
}
