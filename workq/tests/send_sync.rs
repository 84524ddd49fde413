//! Compile-time checks of the auto traits the public types promise: if one of these stops
//! holding, this file stops compiling.
//!
//! The items used are the smallest that satisfy the queue's bound; a type that is `Send` or
//! `Sync` for them is so for every `T: Eq + Hash + Clone + Send + Sync + 'static`, since the
//! queue's types only ever require those bounds.

use std::error::Error;
use std::future::Future;

use workq::clock::{Clock, FakeClock, RealClock};
use workq::rate_limiter::{
    ExponentialFailure, FastSlow, MaxOf, RateLimiter, TokenBucket, WithMaxWait,
};
use workq::{AddOptions, Builder, Lease, TryGetError, WorkQueue};

fn assert_send<T: Send>() {}
fn assert_sync<T: Sync>() {}
fn assert_clone<T: Clone>() {}
fn assert_debug<T: std::fmt::Debug>() {}
fn assert_send_value<T: Send>(_: &T) {}
fn assert_rate_limiter<T, R: RateLimiter<T> + 'static>() {}

/// An item that is not `Debug`, to show no public type needs `T: Debug`.
#[derive(PartialEq, Eq, Hash, Clone)]
struct Opaque;

#[test]
fn work_queue_is_send_sync_clone_and_debug() {
    assert_send::<WorkQueue<String>>();
    assert_sync::<WorkQueue<String>>();
    assert_clone::<WorkQueue<String>>();
    assert_debug::<WorkQueue<Opaque>>();
}

#[test]
fn lease_is_send_and_debug() {
    assert_send::<Lease<String>>();
    assert_debug::<Lease<Opaque>>();
}

#[test]
fn get_future_is_send() {
    let queue: WorkQueue<String> = WorkQueue::new();
    let get = queue.get();
    assert_send_value(&get);
    fn assert_future<F: Future<Output = Option<Lease<String>>>>(_: &F) {}
    assert_future(&get);
}

#[test]
fn drain_future_is_send() {
    let queue: WorkQueue<String> = WorkQueue::new();
    let drain = queue.shut_down_with_drain();
    assert_send_value(&drain);
}

#[test]
fn a_spawned_tokio_task_can_await_get() {
    // tokio::spawn needs a Send + 'static future: the usual worker loop.
    fn assert_spawnable<F: Future + Send + 'static>(_: F) {}
    let queue: WorkQueue<String> = WorkQueue::new();
    assert_spawnable(async move {
        while let Some(lease) = queue.get().await {
            drop(lease);
        }
    });
}

#[test]
fn builder_and_options_are_send() {
    assert_send::<Builder<String>>();
    assert_debug::<Builder<Opaque>>();
    assert_send::<AddOptions>();
    assert_sync::<AddOptions>();
}

#[test]
fn try_get_error_is_a_thread_safe_error() {
    fn assert_error<E: Error + Send + Sync + 'static>() {}
    assert_error::<TryGetError>();
}

#[test]
fn clocks_are_send_sync() {
    fn assert_clock<C: Clock>() {}
    assert_clock::<RealClock>();
    assert_clock::<FakeClock>();
    assert_clone::<FakeClock>();
    assert_send::<FakeClock>();
    assert_sync::<FakeClock>();
}

#[test]
fn rate_limiters_are_send_sync() {
    assert_rate_limiter::<String, ExponentialFailure<String>>();
    assert_rate_limiter::<String, FastSlow<String>>();
    assert_rate_limiter::<String, TokenBucket>();
    assert_rate_limiter::<String, MaxOf<String>>();
    assert_rate_limiter::<String, WithMaxWait<String>>();
    assert_rate_limiter::<String, Box<dyn RateLimiter<String>>>();
    assert_rate_limiter::<String, std::sync::Arc<dyn RateLimiter<String>>>();
    assert_send::<TokenBucket>();
    assert_sync::<TokenBucket>();
}
