//! Deduplicated, delayed and rate-limited work queues: Kubernetes client-go's `workqueue`,
//! for Rust.
//!
//! A [`WorkQueue`] hands out *keys* of work ("`namespace/name`") to workers, with the rules
//! every controller relies on:
//!
//! - **Fair**: items come out in the order they were added.
//! - **Stingy**: an item added many times before a worker picks it up is processed once, and
//!   an item is never processed by two workers at once. Added again while a worker holds it,
//!   it is handed out once more after that worker is done.
//! - **Delayed adds** ([`add_after`](WorkQueue::add_after)): the earliest ready time wins.
//! - **Rate-limited retries** ([`add_rate_limited`](WorkQueue::add_rate_limited),
//!   [`forget`](WorkQueue::forget), [`num_requeues`](WorkQueue::num_requeues)) with
//!   client-go's [`rate_limiter`]s.
//! - **Shutdown** that stops intake, and [shutdown with drain](WorkQueue::shut_down_with_drain)
//!   that waits for in-flight work.
//!
//! # Hello, queue
//!
//! ```
//! use workq::WorkQueue;
//!
//! let queue = WorkQueue::new();
//! queue.add("default/web-0");
//! queue.add("default/web-1");
//! queue.add("default/web-0"); // already queued: no second entry
//!
//! let lease = queue.blocking_get().unwrap();
//! assert_eq!(*lease, "default/web-0");
//! drop(lease); // done
//! assert_eq!(queue.len(), 1);
//! ```
//!
//! # Leases
//!
//! [`get`](WorkQueue::get), [`blocking_get`](WorkQueue::blocking_get) and
//! [`try_get`](WorkQueue::try_get) hand an item out under a [`Lease`]. While the lease lives,
//! the item is not handed to anyone else; dropping it is client-go's `Done`, so it can be
//! neither forgotten nor done twice, and a worker that panics frees its item as it unwinds.
//!
//! ```
//! use workq::WorkQueue;
//!
//! let queue = WorkQueue::new();
//! queue.add("default/web-0");
//! let lease = queue.try_get().unwrap();
//! queue.add("default/web-0"); // changed again while we work on it
//! assert!(queue.try_get().is_err()); // never to two workers at once
//! drop(lease);
//! assert_eq!(*queue.try_get().unwrap(), "default/web-0"); // handed out again after
//! ```
//!
//! # Delays, on a clock you control
//!
//! Every timed decision reads the queue's [`clock::Clock`]. Tests use a
//! [`FakeClock`](clock::FakeClock), so nothing sleeps:
//!
//! ```
//! use std::time::Duration;
//! use workq::{WorkQueue, clock::FakeClock};
//!
//! let clock = FakeClock::new();
//! let queue = WorkQueue::builder().clock(clock.clone()).build();
//! queue.add_after("default/web-0", Duration::from_secs(60));
//! queue.add_after("default/web-0", Duration::from_secs(5)); // the earliest wins
//! assert_eq!(queue.len(), 0);
//! clock.step(Duration::from_secs(5));
//! assert_eq!(queue.len(), 1);
//! ```
//!
//! # The worker loop, with rate-limited retries
//!
//! ```
//! use std::time::Duration;
//! use workq::{WorkQueue, clock::FakeClock, rate_limiter::ExponentialFailure};
//!
//! fn reconcile(key: &str) -> Result<(), String> {
//!     Err(format!("{key}: not ready yet"))
//! }
//!
//! let clock = FakeClock::new();
//! let queue = WorkQueue::builder()
//!     .clock(clock.clone())
//!     .rate_limiter(ExponentialFailure::new(Duration::from_millis(5), Duration::from_secs(60)))
//!     .build();
//! queue.add("default/web-0");
//!
//! let lease = queue.try_get().unwrap();
//! match reconcile(&lease) {
//!     Ok(()) => queue.forget(&lease), // success: reset its backoff
//!     Err(_) => queue.add_rate_limited(*lease), // failure: retry after 5 ms, 10 ms, ...
//! }
//! drop(lease);
//!
//! assert_eq!(queue.num_requeues(&"default/web-0"), 1);
//! clock.step(Duration::from_millis(5));
//! assert_eq!(queue.len(), 1);
//! ```
//!
//! # Shutdown
//!
//! [`shut_down`](WorkQueue::shut_down) stops intake; queued items are still handed out, then
//! getters receive `None`. [`shut_down_with_drain`](WorkQueue::shut_down_with_drain) also
//! waits until every lease is dropped.
//!
//! ```
//! use workq::WorkQueue;
//!
//! let queue = WorkQueue::new();
//! queue.add("default/web-0");
//! let worker = {
//!     let queue = queue.clone();
//!     std::thread::spawn(move || {
//!         let mut processed = 0;
//!         while let Some(_lease) = queue.blocking_get() {
//!             processed += 1;
//!         }
//!         processed
//!     })
//! };
//! queue.blocking_shut_down_with_drain();
//! queue.add("default/web-1"); // ignored: the queue is shut down
//! assert_eq!(worker.join().unwrap(), 1);
//! ```
//!
//! # Async and blocking
//!
//! [`get`](WorkQueue::get) is a future that works on any executor and is cancel safe;
//! [`blocking_get`](WorkQueue::blocking_get) parks a thread; [`try_get`](WorkQueue::try_get)
//! never waits. All three share one queue of waiters, so mixing them is fine.
//!
//! ```
//! use workq::WorkQueue;
//!
//! # futures::executor::block_on(async {
//! let queue = WorkQueue::new();
//! queue.add(42_u64);
//! let lease = queue.get().await.unwrap();
//! assert_eq!(*lease, 42);
//! # });
//! ```
//!
//! # Workers
//!
//! Every controller writes the same loop: get, process, `forget` on success,
//! `add_rate_limited` on error, always done, N workers, stop on shutdown. [`Workers`] runs
//! it for you, on threads or (feature `tokio`) as async tasks: the handler returns an
//! [`Outcome`], panics and timeouts count as failures, items that keep failing are given up
//! (reported, never silently dropped), and stopping drains in-flight items into a summary.
//! See [`Workers`] and the `controller` example.
//!
//! # Traces from the add to the handler
//!
//! With the feature `otel`, an add records the OpenTelemetry context of the span it is made
//! in (through `tracing-opentelemetry`), and the `workqueue.item` span [`Workers`] open for
//! the item links to it, the handler running inside that span: a trace viewer leads from
//! the event that queued an item to its reconcile, and back. Links, not a parent, because
//! the queue deduplicates: one processing may have many adds behind it. Each item keeps the
//! first `otel::MAX_LINKS` of them until it is handed out and counts the rest;
//! `Lease::links` hands them to a worker loop of your own. Their stored form is the W3C
//! `traceparent` (`otel::TraceLink`), the form a backend shared by many processes keeps
//! beside the item (the in-memory queue, `workq-redis` and `workq-postgres` keep them; a
//! backend that does not hands out no links). See the `otel` module. Without the feature nothing is recorded and
//! nothing is paid: the queue's types are the size they were.
//!
//! # Flow control: fair turns, concurrency limits, hand-out rates
//!
//! Within a priority a queue is first in, first out, so one tenant that adds 100,000 items
//! puts every other tenant's single item behind them. [`Builder::group_by`] groups items
//! (the namespace of a key, say) and makes getters take turns between groups within the
//! highest priority that has ready work, FIFO inside a group ([`Builder::group_weight`] for
//! uneven shares). [`Builder::max_in_flight`] and [`Builder::max_in_flight_per_group`] cap
//! the leases out (a group at its limit never holds back another; a dropped lease wakes a
//! waiting getter), and [`Builder::hand_out_rate`] paces hand-outs, for the queue and per
//! group (a getter sleeps until the next token, on the queue's clock). In memory, a lease
//! holds its slot until it is dropped, so the limits count exactly the items being
//! processed. [`WorkQueue::flow_stats`] and [`WorkQueue::top_groups`] report the groups;
//! the Prometheus metrics add `workqueue_groups_ready` and `workqueue_group_saturated`. A
//! queue without any of these pays a few predictable branches per call for them.
//!
//! # Backends
//!
//! [`Queue`] (with its [`QueueLease`]) is the interface of a work queue backend: async
//! `add_with`, `forget`, `num_requeues`, `len`, `get`, `shut_down`, `shut_down_with_drain`,
//! with the backend's own lease and error types. [`WorkQueue`] implements it (errors are
//! [`Infallible`](std::convert::Infallible)), and so does `workq_redis::RedisQueue`, so
//! [`Workers`] run unchanged on a queue shared by many processes.
//!
//! # Metrics
//!
//! Name a queue and give it a [`metrics::MetricsProvider`]: it reports Kubernetes'
//! workqueue metrics (depth, adds, queue and work durations, unfinished work, longest
//! running processor, retries) by client-go's rules. With the `prometheus` feature,
//! `metrics::prometheus::PrometheusMetrics` exports them under Kubernetes' series names,
//! so existing dashboards work. A queue without both records nothing.
//!
//! # Operators
//!
//! [`admin`] is the operator's contract: one [`Admin`](admin::Admin) trait and one set of
//! types (queue figures, pages of items, an item's detail, dead letters, actions) for every
//! backend's queues, what the dashboard and `wq queue` show and do.
//! [`MemoryAdmin`](admin::MemoryAdmin) answers it for the queues of this process.
//!
//! # Features
//!
//! None by default: the queue, [`get`](WorkQueue::get) on any executor and threaded
//! [`Workers`] need no runtime. `tokio` adds async workers and per-item timeouts;
//! `prometheus` adds `metrics::prometheus`; `serde` adds the JSON of the operator's types;
//! `redact` adds `admin::redact_url`; `otel` adds trace links from adds to the workers'
//! spans (`otel`).
//!
//! # Coming from client-go

//!
//! | client-go | workq | differences |
//! | --- | --- | --- |
//! | `NewTyped`, `NewTypedDelayingQueue`, `NewTypedRateLimitingQueue` | [`WorkQueue::new`], [`WorkQueue::builder`] | one type carries all three layers; a queue that never delays pays nothing for it |
//! | `TypedQueueConfig{Name, Clock}` | [`Builder::name`], [`Builder::clock`], [`Builder::rate_limiter`] | the default rate limiter is [`rate_limiter::default_controller`], on the queue's clock |
//! | `Add` | [`WorkQueue::add`] | `Add` of an item waiting for a delay makes it ready now and drops the delayed entry, so it is processed once (client-go processes it twice, kubernetes#126027) |
//! | `Get` | [`WorkQueue::get`], [`WorkQueue::blocking_get`], [`WorkQueue::try_get`] | returns `Option<Lease<T>>` instead of `(item, shutdown)`; async, blocking and non-blocking forms; the async one works on any executor and is cancel safe |
//! | `Done` | drop the [`Lease`] (or [`Lease::done`]) | cannot be forgotten or called twice; happens on panic too; no `Done` of an item that was never handed out |
//! | `Len` | [`WorkQueue::len`] | same meaning; also [`WorkQueue::delayed_len`] and [`WorkQueue::processing_len`] |
//! | `ShutDown`, `ShuttingDown` | [`WorkQueue::shut_down`], [`WorkQueue::is_shutting_down`] | the delay timer thread is joined before `shut_down` returns (client-go's `waitingLoop` may outlive it, kubernetes#134323) |
//! | `ShutDownWithDrain` | [`WorkQueue::shut_down_with_drain`] (async), [`WorkQueue::blocking_shut_down_with_drain`] | same rule: returns once no lease is out, or when a plain `shut_down` cuts it short |
//! | `AddAfter` | [`WorkQueue::add_after`] | never blocks (client-go's blocks once 1000 adds are pending); one timer per queue, no 10 s heartbeat; an item already queued stays queued once instead of being added again later; delays round to the nanosecond; `Duration::MAX` saturates |
//! | `AddRateLimited`, `Forget`, `NumRequeues` | [`WorkQueue::add_rate_limited`], [`WorkQueue::forget`], [`WorkQueue::num_requeues`] | same |
//! | controller-runtime `AddWithOpts`, `GetWithPriority` | [`WorkQueue::add_with`] with [`AddOptions`]; [`Lease::priority`] | adds are synchronous; getters drain queued items after `shut_down`; a second `shut_down` is harmless; an add without a priority keeps the item's priority instead of setting 0; an item re-added while processed is queued only when its lease drops, at the tail of its priority (see [`WorkQueue::add_with`]) |
//! | `TypedRateLimiter` | [`rate_limiter::RateLimiter`] | methods take `&T` |
//! | `ItemExponentialFailureRateLimiter` | [`rate_limiter::ExponentialFailure`] | same formula, including the overflow to `max_delay` |
//! | `ItemFastSlowRateLimiter` | [`rate_limiter::FastSlow`] | same |
//! | `BucketRateLimiter` (`rate.NewLimiter`) | [`rate_limiter::TokenBucket`] | runs on the queue's clock, so it is testable with [`FakeClock`](clock::FakeClock); `f64::INFINITY` never delays whatever the burst (`rate.Inf`); NaN, negative rates and a zero burst with a finite rate panic at construction |
//! | `MaxOfRateLimiter`, `WithMaxWaitRateLimiter` | [`rate_limiter::MaxOf`], [`rate_limiter::WithMaxWait`] | same |
//! | `DefaultControllerRateLimiter`, `DefaultItemBasedRateLimiter` | [`rate_limiter::default_controller`], [`rate_limiter::default_item_based`] | same parameters |
//! | `MetricsProvider`, `SetProvider` | [`Builder::metrics`] with a [`metrics::MetricsProvider`] | per queue, not a process-wide global; unfinished work and longest running processor are read at scrape time (no 500 ms ticker goroutine); also delayed items and rate-limiter delays; the recorder is called after the queue's lock is released, so it may read the queue |
//! | `ParallelizeUntil` | [`parallelize_until`], [`Parallelizer`] | the stop signal is a [`StopToken`]; returns how many pieces ran |
//! | (none) | [`rate_limiter::Jitter`] | spreads retries so items that fail together do not retry in lockstep |
//! | per-item limiters' unbounded failure maps (kubernetes#138743) | [`rate_limiter::ExponentialFailure::with_max_tracked`], [`rate_limiter::FastSlow::with_max_tracked`] | tracking is bounded (default [`rate_limiter::DEFAULT_MAX_TRACKED`]); past the bound the least recently failed item is forgotten, so every item still gets client-go's delays |
//! | `clock.RealClock`, `testing.FakeClock` | [`clock::RealClock`], [`clock::FakeClock`] | a queue on a fake clock promotes due items inside `step`, and starts no thread |
//!
//! Items are any `T: Eq + Hash + Clone + Send + Sync + 'static`; the queue clones an item to
//! hand it out and keeps its own copy for dedup until the lease drops, so keys should be
//! cheap to clone.

#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]
#![cfg_attr(
    loom,
    allow(
        dead_code,
        unreachable_pub,
        reason = "a loom build runs only the loom models, which leave most of the crate unused"
    )
)]

mod added;
pub mod admin;
mod backend;
pub mod clock;
mod error;
pub mod flow;
mod lease;
#[cfg(feature = "tokio")]
#[doc(hidden)]
pub mod lease_clock;
pub mod metrics;
#[cfg(feature = "otel")]
pub mod otel;
mod parallelize;
pub mod periodic;
mod queue;
pub mod rate_limiter;
mod state;
mod stats;
mod sync;
mod waiters;
mod workers;

#[cfg(all(test, loom))]
mod tests;

pub use added::{AddKind, Added};
pub use backend::{DoneMany, Queue, QueueLease, TryGet};
pub use error::TryGetError;
pub use lease::Lease;
pub use parallelize::{Parallelizer, parallelize_until};
pub use queue::{AddOptions, Builder, Drain, Get, WorkQueue};
pub use stats::{FlowStats, GroupStats, QueueStats};
#[cfg(feature = "tokio")]
pub use workers::AsyncWorkers;
pub use workers::{
    DEFAULT_MAX_RETRIES, Failure, GiveUp, GiveUpReason, HandlerError, IntoOutcome, Outcome,
    StopToken, Stopped, Summary, ThreadWorkers, Workers,
};
