//! [`AddOptions`] and the queue's [`Builder`].

use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::WorkQueue;
use super::locked::{Grouper, Inner, Shared, TimerState};
#[cfg(doc)]
use crate::Lease;
use crate::clock::{Clock, ClockListener, RealClock};
use crate::metrics::{MetricsProvider, QueueProbe};
use crate::rate_limiter::{self, RateLimiter};
use crate::state::State;
use crate::state::flow::{Flow, FlowConfig, Rate};
use crate::sync::{AtomicUsize, Condvar, Mutex};
use crate::waiters::Waiters;

/// Options for [`WorkQueue::add_with`]: an optional delay, a rate-limited flag and an optional
/// priority. This is controller-runtime's `AddOpts`.
///
/// `AddOptions::default()` is a plain [`add`](WorkQueue::add): no delay, not rate limited, no
/// priority.
///
/// # Priorities
///
/// - Higher is handed out first, over the whole `i32` range; items of one priority come out in
///   the order they became ready.
/// - No priority given means: a new item gets priority 0; a queued or delayed item keeps its
///   priority. A plain add never raises a low-priority item (controller-runtime reads a missing
///   priority as 0 and raises it); `.priority(0)` raises it when asked.
/// - A re-add can raise a queued or delayed item's priority, never lower it. A raised item goes
///   behind the items already waiting at its new priority; a re-add at its own priority does
///   not move it.
/// - A delayed item keeps its priority. Items that become due in one step join the ready order
///   earliest-due first, ties in the order of their first delayed add, behind the items
///   already ready.
/// - An item being processed is not queued. Re-added while its [`Lease`] is out, it is queued
///   anew when the lease drops, at the tail of its priority, with the highest priority given by
///   the re-adds since it was handed out (0 if none gave one), which may be lower than before.
/// - [`Lease::priority`] is the priority the item was handed out with.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use workq::{AddOptions, WorkQueue};
///
/// let queue = WorkQueue::new();
/// queue.add_with("default/web-0", AddOptions::default().priority(10));
/// queue.add_with("default/web-1", AddOptions::default().after(Duration::from_secs(5)));
/// assert_eq!(queue.len(), 1);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AddOptions {
    /// Wait this long before the item is ready; zero means now.
    pub(super) after: Duration,
    /// Ask the rate limiter for a delay too; the shorter of the two wins.
    pub(super) rate_limited: bool,
    /// The priority; `None` keeps a known item's priority and gives a new one 0.
    pub(super) priority: Option<i32>,
}

impl AddOptions {
    /// Adds the item once `delay` has passed (see [`WorkQueue::add_after`]).
    #[must_use]
    pub fn after(mut self, delay: Duration) -> Self {
        self.after = delay;
        self
    }

    /// Delays the item by what the queue's rate limiter says (see
    /// [`WorkQueue::add_rate_limited`]). With [`after`](Self::after) too, the shorter delay
    /// wins, as in controller-runtime.
    #[must_use]
    pub fn rate_limited(mut self) -> Self {
        self.rate_limited = true;
        self
    }

    /// Sets the priority: higher is handed out first; an item never given one has 0. A re-add
    /// can raise an item's priority, never lower it, and a raised item goes behind the items
    /// already waiting at its new priority. See [`AddOptions`] for the full rules.
    #[must_use]
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = Some(priority);
        self
    }

    /// The delay set with [`after`](Self::after).
    pub fn delay(&self) -> Duration {
        self.after
    }

    /// Whether [`rate_limited`](Self::rate_limited) was set.
    pub fn is_rate_limited(&self) -> bool {
        self.rate_limited
    }

    /// The priority set with [`priority`](Self::priority), if any.
    pub fn requested_priority(&self) -> Option<i32> {
        self.priority
    }
}

/// Builds a [`WorkQueue`] with a name, a clock or a rate limiter of your choice.
///
/// # Default
///
/// No name, [`RealClock`], and [`rate_limiter::default_controller`] running on the queue's
/// clock.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use workq::{WorkQueue, clock::FakeClock, rate_limiter::ExponentialFailure};
///
/// let queue: WorkQueue<String> = WorkQueue::builder()
///     .name("pods")
///     .clock(FakeClock::new())
///     .rate_limiter(ExponentialFailure::new(
///         Duration::from_millis(5),
///         Duration::from_secs(60),
///     ))
///     .build();
/// assert_eq!(queue.name(), Some("pods"));
/// ```
#[must_use]
pub struct Builder<T> {
    pub(super) name: Option<String>,
    pub(super) clock: Option<Arc<dyn Clock>>,
    pub(super) limiter: Option<Box<dyn RateLimiter<T>>>,
    pub(super) metrics: Option<Box<dyn MetricsProvider>>,
    pub(super) grouper: Option<Grouper<T>>,
    pub(super) flow: FlowConfig,
}

impl<T> fmt::Debug for Builder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("name", &self.name)
            .field("custom_clock", &self.clock.is_some())
            .field("custom_rate_limiter", &self.limiter.is_some())
            .field("metrics", &self.metrics.is_some())
            .field("group_by", &self.grouper.is_some())
            .field("flow", &self.flow)
            .finish()
    }
}

impl<T: Eq + Hash + Clone + Send + Sync + 'static> Builder<T> {
    /// Names the queue. Named queues report metrics; the name is their `name` label.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Runs the queue (delays, and the default rate limiter's token bucket) on `clock`.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Uses `limiter` for [`WorkQueue::add_rate_limited`], [`WorkQueue::forget`] and
    /// [`WorkQueue::num_requeues`].
    pub fn rate_limiter(mut self, limiter: impl RateLimiter<T> + 'static) -> Self {
        self.limiter = Some(Box::new(limiter));
        self
    }

    /// Reports the queue's metrics to `provider` (client-go's `MetricsProvider`). Only named
    /// queues report, as in client-go; see [`metrics`](crate::metrics) for the rules and
    /// `PrometheusMetrics` (feature
    /// `prometheus`) for Kubernetes' series.
    pub fn metrics(mut self, provider: impl MetricsProvider) -> Self {
        self.metrics = Some(Box::new(provider));
        self
    }

    /// Groups the items by `group` (for example the namespace of a `"namespace/name"` key)
    /// and makes getters take turns between groups.
    ///
    /// Within the highest priority that has ready work, each hand-out goes to the next group
    /// in turn (round robin; deficit round robin with [`group_weight`](Self::group_weight));
    /// inside a group items come out in the order they became ready. Priorities stay strict:
    /// a group's turn never hands out a lower priority while a higher one has work another
    /// group may hand out. So one group that adds 100,000 items at once no longer puts
    /// every other group's single item behind them.
    ///
    /// An item's group is what `group` says for it, called once per add before the queue's
    /// lock is taken; it must give the same group for equal items (dedup stays exact: an
    /// item is one item, in one group). Groups are made on first use and forgotten once they
    /// hold nothing (and their [hand-out rate](Self::hand_out_rate_per_group), if any, has
    /// refilled), so a queue may see any number of them over its life.
    ///
    /// Without `group_by`, limits or rates, a queue has none of this and pays a few branches
    /// for it.
    ///
    /// # Examples
    ///
    /// ```
    /// use workq::WorkQueue;
    ///
    /// let queue: WorkQueue<String> = WorkQueue::builder()
    ///     .group_by(|key: &String| key.split_once('/').map_or("", |(ns, _)| ns).to_owned())
    ///     .build();
    /// for i in 0..3 {
    ///     queue.add(format!("noisy/item-{i}"));
    /// }
    /// queue.add("quiet/item-0".to_owned());
    /// let first: Vec<String> = (0..3).map(|_| queue.try_get().unwrap().item().clone()).collect();
    /// assert_eq!(first, ["noisy/item-0", "quiet/item-0", "noisy/item-1"]);
    /// ```
    pub fn group_by<G: Into<String>>(
        mut self,
        group: impl Fn(&T) -> G + Send + Sync + 'static,
    ) -> Self {
        self.grouper = Some(Box::new(move |item| group(item).into()));
        self
    }

    /// Gives the group `group` `weight` turns in a row (deficit round robin) where the
    /// others get one: with weight 3, it gets about three times the hand-outs of a group of
    /// weight 1 while both have ready work. Weight 0 counts as 1.
    pub fn group_weight(mut self, group: impl Into<String>, weight: u32) -> Self {
        self.flow
            .group_weights
            .insert(group.into().into_boxed_str(), weight.max(1));
        self
    }

    /// Hands out at most `limit` items at a time over the whole queue: a getter waits while
    /// `limit` leases are out, and wakes when one is dropped (no polling).
    ///
    /// # Panics
    ///
    /// If `limit` is 0 (nothing could ever be handed out).
    pub fn max_in_flight(mut self, limit: usize) -> Self {
        assert!(limit > 0, "workq: max_in_flight must be at least 1");
        self.flow.max_in_flight = Some(limit);
        self
    }

    /// Hands out at most `limit` items of one group at a time (each group, unless
    /// [`group_max_in_flight`](Self::group_max_in_flight) names it). A ready item of a group
    /// at its limit never holds back another group; when one of its leases is dropped, the
    /// group takes its turn again and a waiting getter wakes.
    ///
    /// An item re-added while it is processed still waits for its own lease to drop.
    ///
    /// # Panics
    ///
    /// If `limit` is 0.
    pub fn max_in_flight_per_group(mut self, limit: usize) -> Self {
        assert!(
            limit > 0,
            "workq: max_in_flight_per_group must be at least 1"
        );
        self.flow.max_in_flight_per_group = Some(limit);
        self
    }

    /// Overrides [`max_in_flight_per_group`](Self::max_in_flight_per_group) for one group.
    ///
    /// # Panics
    ///
    /// If `limit` is 0.
    pub fn group_max_in_flight(mut self, group: impl Into<String>, limit: usize) -> Self {
        assert!(
            limit > 0,
            "workq: a group's max_in_flight must be at least 1"
        );
        self.flow
            .group_limits
            .insert(group.into().into_boxed_str(), limit);
        self
    }

    /// Hands out at most `per_second` items a second over the whole queue, with bursts of
    /// up to `burst`: a getter waits for the next token, asleep until it is due (on the
    /// queue's clock, so a [`FakeClock`](crate::clock::FakeClock) drives it in tests).
    ///
    /// This paces hand-outs (say, calls to an API behind the handler), unlike the
    /// [rate limiter](Self::rate_limiter), which delays re-adds; the two compose. After
    /// [`shut_down`](WorkQueue::shut_down) the items still queued keep the pace.
    ///
    /// # Panics
    ///
    /// If `per_second` is not a positive finite number, or `burst` is 0.
    pub fn hand_out_rate(mut self, per_second: f64, burst: u32) -> Self {
        self.flow.rate = Some(Rate::new(per_second, burst));
        self
    }

    /// Paces every group as [`hand_out_rate`](Self::hand_out_rate) paces the queue, each
    /// with a bucket of its own (unless [`group_hand_out_rate`](Self::group_hand_out_rate)
    /// names it). A group waiting for its token leaves the turns to the others.
    ///
    /// # Panics
    ///
    /// As [`hand_out_rate`](Self::hand_out_rate).
    pub fn hand_out_rate_per_group(mut self, per_second: f64, burst: u32) -> Self {
        self.flow.rate_per_group = Some(Rate::new(per_second, burst));
        self
    }

    /// Overrides [`hand_out_rate_per_group`](Self::hand_out_rate_per_group) for one group.
    ///
    /// # Panics
    ///
    /// As [`hand_out_rate`](Self::hand_out_rate).
    pub fn group_hand_out_rate(
        mut self,
        group: impl Into<String>,
        per_second: f64,
        burst: u32,
    ) -> Self {
        self.flow
            .group_rates
            .insert(group.into().into_boxed_str(), Rate::new(per_second, burst));
        self
    }

    /// Builds the queue.
    pub fn build(self) -> WorkQueue<T> {
        let flow_config = self.flow;
        let grouper = self.grouper;
        let flow = grouper.is_some()
            || flow_config.max_in_flight.is_some()
            || flow_config.max_in_flight_per_group.is_some()
            || !flow_config.group_limits.is_empty()
            || flow_config.has_rates();
        let rates = flow_config.has_rates();
        let clock: Arc<dyn Clock> = self.clock.unwrap_or_else(|| Arc::new(RealClock));
        let limiter = self.limiter.unwrap_or_else(|| {
            Box::new(rate_limiter::default_controller_with_clock(clock.clone()))
        });
        let epoch = clock.now();
        let name = self.name;
        let provider = self.metrics;
        let shared = Arc::new_cyclic(|weak: &Weak<Shared<T>>| {
            let mut state = State::new();
            if flow {
                state.enable_flow(Flow::new(flow_config));
            }
            let hasher = state.hasher().clone();
            let metrics = match (&name, provider) {
                (Some(name), Some(provider)) => {
                    state.enable_times();
                    let weak = weak.clone();
                    let by_priority = weak.clone();
                    let flow_weak = weak.clone();
                    let probe =
                        QueueProbe::new(move || weak.upgrade().map(|shared| shared.probe_stats()))
                            .with_depth_by_priority(move || {
                                by_priority
                                    .upgrade()
                                    .map(|shared| shared.depth_by_priority())
                            })
                            .with_flow(move |top| {
                                flow_weak
                                    .upgrade()
                                    .and_then(|shared| shared.flow_figures(top))
                            });
                    Some(provider.new_queue(name, probe))
                }
                _ => None,
            };
            let weak = weak.clone();
            let callback: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
                if let Some(shared) = weak.upgrade() {
                    shared.on_clock_advance();
                }
            });
            let clock_driven = clock.subscribe(ClockListener::new(Arc::downgrade(&callback)));
            Shared {
                inner: Mutex::new(Inner {
                    state,
                    waiters: Waiters::default(),
                    drain: false,
                    drain_waiters: Waiters::default(),
                    timer: TimerState::default(),
                }),
                ready_hint: AtomicUsize::new(0),
                handles: AtomicUsize::new(1),
                timer_cv: Condvar::new(),
                clock,
                clock_driven,
                epoch,
                limiter,
                hasher,
                name,
                metrics,
                _clock_callback: clock_driven.then_some(callback),
                grouper,
                flow,
                rates,
            }
        });
        if rates && !shared.clock_driven {
            // Tokens are served by the timer: started now, since getters that wait for one
            // only read the lock (and `start_timer` needs the shared handle).
            let mut inner = shared.inner.lock();
            shared.start_timer(&mut inner);
        }
        WorkQueue { shared }
    }
}
