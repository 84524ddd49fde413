//! The shared behaviour suite (`workq_conformance::behaviour`): every rule runs, unchanged,
//! against `RedisQueue` on a `redis-server` the test starts itself (a missing binary fails
//! the test; see TESTING.md for the opt-out), and with `--features cluster` on a three-node
//! cluster. The in-memory queue runs the same rules in `workq`'s tests.

mod support;

use workq_conformance::behaviour::rules;

/// Instantiates every rule on Redis.
macro_rules! behaviour_suite {
    ($($rule:ident),* $(,)?) => {
        support::on_redis_factory!(redis_cluster_keeps_every_rule; $($rule),*);
    };
}

workq_conformance::for_each_rule!(behaviour_suite);
