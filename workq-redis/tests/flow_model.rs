//! Flow control on Redis held against the in-memory queue's state machine, step by step.
//!
//! Each case is a random flow control setting (a queue-wide limit, a per-group limit, one
//! group's own limit, one group's weight) and a random sequence of operations on a few
//! `"group/name"` items in three groups, applied to a fresh Redis queue (on one
//! `redis-server` of the test's own) and to an in-memory queue built alike, comparing every
//! answer: which item `try_get` hands out and at which priority (or that none may go), and
//! `len`. Operations: adds with and without priorities (so raises and re-adds while leased),
//! `try_get`, `done` of a held lease, and rate-limited adds whose delay is so long (1000 s on
//! both sides) that they only make an item delayed. Rates are left out: the two queues' clocks
//! differ. The Lua scripts and `workq/src/state/flow.rs` must then agree on every turn: the
//! rings' order, deficit round robin, saturated groups leaving and rejoining, lazy rings.
//! After each case the Redis structures are checked whole (`support::flow_check`).

mod support;

use std::time::Duration;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use workq::clock::FakeClock;
use workq::rate_limiter::ExponentialFailure;
use workq::{AddOptions, WorkQueue};
use workq_conformance::flow::group_of;
use workq_redis::{RateLimit, RedisQueue};

/// Items in three groups: few, so that adds collide with queued and leased items.
const ITEMS: [&str; 6] = ["a/1", "a/2", "a/3", "b/1", "b/2", "c/1"];

/// A rate-limited add's delay on both sides: longer than any case.
const FOREVER: Duration = Duration::from_secs(1000);

/// A case's flow control setting.
#[derive(Debug, Clone)]
struct Setting {
    max_in_flight: Option<usize>,
    per_group: Option<usize>,
    /// Group `a`'s own limit.
    a_limit: Option<usize>,
    /// Group `b`'s weight.
    b_weight: u32,
}

fn setting() -> impl Strategy<Value = Setting> {
    (
        prop_oneof![Just(None), (1..4_usize).prop_map(Some)],
        prop_oneof![Just(None), (1..3_usize).prop_map(Some)],
        prop_oneof![Just(None), (1..4_usize).prop_map(Some)],
        1..4_u32,
    )
        .prop_map(|(max_in_flight, per_group, a_limit, b_weight)| Setting {
            max_in_flight,
            per_group,
            a_limit,
            b_weight,
        })
}

#[derive(Debug, Clone)]
enum Op {
    Add(usize),
    AddWith(usize, i32),
    TryGet,
    /// `done` of the held lease at this index (modulo the number held).
    Done(usize),
    AddRateLimited(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let item = 0..ITEMS.len();
    prop_oneof![
        4 => item.clone().prop_map(Op::Add),
        2 => (item.clone(), -1..3_i32).prop_map(|(i, p)| Op::AddWith(i, p)),
        5 => Just(Op::TryGet),
        4 => (0..8_usize).prop_map(Op::Done),
        1 => item.prop_map(Op::AddRateLimited),
    ]
}

fn failed(e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

/// `$builder` (in memory or on Redis: the methods have the same names) with `$setting`.
macro_rules! with_setting {
    ($builder:expr, $setting:expr) => {{
        let setting: &Setting = $setting;
        let mut builder = $builder
            .group_by(|item: &String| group_of(item).to_owned())
            .group_weight("b", setting.b_weight);
        if let Some(n) = setting.max_in_flight {
            builder = builder.max_in_flight(n);
        }
        if let Some(n) = setting.per_group {
            builder = builder.max_in_flight_per_group(n);
        }
        if let Some(n) = setting.a_limit {
            builder = builder.group_max_in_flight("a", n);
        }
        builder
    }};
}

async fn run_case(
    url: &str,
    name: &str,
    setting: &Setting,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let redis = with_setting!(
        RedisQueue::builder(name)
            .url(url)
            .rate_limit(RateLimit::exponential(FOREVER, FOREVER))
            .check_persistence(false),
        setting
    )
    .build()
    .await
    .map_err(failed)?;
    let memory = with_setting!(
        WorkQueue::builder()
            .clock(FakeClock::new())
            .rate_limiter(ExponentialFailure::new(FOREVER, FOREVER)),
        setting
    )
    .build();
    // Held leases, pairwise: the same item on both sides.
    let mut held: Vec<(workq_redis::Lease<String>, workq::Lease<String>)> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        let at = format!("step {step} ({op:?}) of {setting:?} {ops:?}");
        match *op {
            Op::Add(i) => {
                redis.add(ITEMS[i].to_owned()).await.map_err(failed)?;
                memory.add(ITEMS[i].to_owned());
            }
            Op::AddWith(i, p) => {
                let options = AddOptions::default().priority(p);
                redis
                    .add_with(ITEMS[i].to_owned(), options)
                    .await
                    .map_err(failed)?;
                memory.add_with(ITEMS[i].to_owned(), options);
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
            Op::Done(_) => {}
            Op::AddRateLimited(i) => {
                redis
                    .add_rate_limited(ITEMS[i].to_owned())
                    .await
                    .map_err(failed)?;
                memory.add_rate_limited(ITEMS[i].to_owned());
            }
        }
        let r = redis.len().await.map_err(failed)?;
        prop_assert_eq!(r, memory.len(), "len after {}", at);
    }
    support::flow_check::check(url, name)
        .await
        .map_err(|e| TestCaseError::fail(format!("{e} after {setting:?} {ops:?}")))?;
    for (r, m) in held {
        r.done().await.map_err(failed)?;
        m.done();
    }
    support::flow_check::check(url, name)
        .await
        .map_err(|e| TestCaseError::fail(format!("{e} after the last dones of {ops:?}")))?;
    redis.delete().await.map_err(failed)?;
    Ok(())
}

#[test]
fn redis_flow_control_matches_the_in_memory_state_machine_step_by_step() {
    let cases = (setting(), vec(op(), 1..60));
    support::run_cases(
        "flow-model",
        128,
        cases,
        |url, name, (setting, ops)| async move { run_case(&url, &name, &setting, &ops).await },
    );
}
