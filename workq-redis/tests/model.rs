//! A random-operation model test: [`RedisQueue`] held against the in-memory
//! [`workq::WorkQueue`] step by step.
//!
//! Each case is a random sequence of operations on a few items, applied to a fresh Redis
//! queue (on one `redis-server` of the test's own) and to an in-memory queue, comparing every
//! answer: which item `try_get` hands out (or that none is ready), `len`, `num_requeues`.
//! Operations: `add`, `try_get`, `done` and release of a held lease, `forget`, and
//! `add_rate_limited`, whose delay is so long (1000 s on both sides) that it only counts (the
//! delayed add never comes due while a case runs, so no clock is compared). The in-memory
//! queue has no release (its dropped lease is client-go's deferred `Done`), so the model of a
//! release is spelled out with its operations: done, then the item goes first among the ready
//! ones (re-queued ahead of what was waiting), as the Redis release script puts it at the head.

mod support;

use std::time::Duration;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use workq::WorkQueue;
use workq::clock::FakeClock;
use workq::rate_limiter::ExponentialFailure;
use workq_redis::{RateLimit, RedisQueue};

/// Items: few, so that adds collide with queued and processing items.
const ITEMS: [&str; 4] = ["a", "b", "c", "d"];

/// A rate-limited add's delay on both sides: longer than any case.
const FOREVER: Duration = Duration::from_secs(1000);

#[derive(Debug, Clone)]
enum Op {
    Add(usize),
    TryGet,
    /// `done` of the held lease at this index (modulo the number held).
    Done(usize),
    /// Release of the held lease at this index: dropped without `done`.
    Release(usize),
    Forget(usize),
    AddRateLimited(usize),
    NumRequeues(usize),
    Len,
}

fn op() -> impl Strategy<Value = Op> {
    let item = 0..ITEMS.len();
    prop_oneof![
        4 => item.clone().prop_map(Op::Add),
        4 => Just(Op::TryGet),
        3 => (0..8_usize).prop_map(Op::Done),
        2 => (0..8_usize).prop_map(Op::Release),
        1 => item.clone().prop_map(Op::Forget),
        2 => item.clone().prop_map(Op::AddRateLimited),
        1 => item.prop_map(Op::NumRequeues),
        1 => Just(Op::Len),
    ]
}

fn failed(e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

/// Releases `item`'s memory lease in the model: done, then `item` first among the ready items
/// (the ready ones are taken out and added back behind it; none of them is processing, so
/// taking them out and finishing them changes nothing else).
fn model_release(memory: &WorkQueue<String>, lease: workq::Lease<String>) {
    let item = lease.item().clone();
    lease.done();
    let mut ready = Vec::new();
    while let Ok(lease) = memory.try_get() {
        ready.push(lease.item().clone());
        lease.done();
    }
    memory.add(item.clone());
    for other in ready.into_iter().filter(|o| *o != item) {
        memory.add(other);
    }
}

async fn run_case(url: &str, name: &str, ops: &[Op]) -> Result<(), TestCaseError> {
    let redis: RedisQueue<String> = RedisQueue::builder(name)
        .url(url)
        .rate_limit(RateLimit::exponential(FOREVER, FOREVER))
        .check_persistence(false)
        .build()
        .await
        .map_err(failed)?;
    let memory: WorkQueue<String> = WorkQueue::builder()
        .clock(FakeClock::new())
        .rate_limiter(ExponentialFailure::new(FOREVER, FOREVER))
        .build();
    // Held leases, pairwise: the same item on both sides.
    let mut held: Vec<(workq_redis::Lease<String>, workq::Lease<String>)> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        let at = format!("step {step} ({op:?}) of {ops:?}");
        match *op {
            Op::Add(i) => {
                redis.add(ITEMS[i].to_string()).await.map_err(failed)?;
                memory.add(ITEMS[i].to_string());
            }
            Op::TryGet => {
                if let Some(pair) = support::try_get_both(&redis, &memory, &at).await? {
                    held.push(pair);
                }
            }
            Op::Done(k) if !held.is_empty() => {
                let (r, m) = held.remove(k % held.len());
                r.done().await.map_err(failed)?;
                m.done();
            }
            Op::Release(k) if !held.is_empty() => {
                let (r, m) = held.remove(k % held.len());
                r.release().await.map_err(failed)?;
                model_release(&memory, m);
            }
            Op::Done(_) | Op::Release(_) => {}
            Op::Forget(i) => {
                redis.forget(ITEMS[i].to_string()).await.map_err(failed)?;
                memory.forget(&ITEMS[i].to_string());
            }
            Op::AddRateLimited(i) => {
                redis
                    .add_rate_limited(ITEMS[i].to_string())
                    .await
                    .map_err(failed)?;
                memory.add_rate_limited(ITEMS[i].to_string());
            }
            Op::NumRequeues(i) => {
                let r = redis
                    .num_requeues(ITEMS[i].to_string())
                    .await
                    .map_err(failed)?;
                prop_assert_eq!(r, memory.num_requeues(&ITEMS[i].to_string()), "{}", at);
            }
            Op::Len => {}
        }
        // After every step: the same number of ready items.
        let r = redis.len().await.map_err(failed)?;
        prop_assert_eq!(r, memory.len(), "len after {}", at);
    }
    for (r, m) in held {
        r.done().await.map_err(failed)?;
        m.done();
    }
    redis.delete().await.map_err(failed)?;
    Ok(())
}

#[test]
fn redis_queue_matches_the_in_memory_queue_step_by_step() {
    support::run_cases("model", 64, vec(op(), 1..40), |url, name, ops| async move {
        run_case(&url, &name, &ops).await
    });
}
