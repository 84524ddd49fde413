//! The shared behaviour suite (`workq_conformance::behaviour`): every rule runs, unchanged,
//! against `RedisQueue` on a `redis-server` the test starts itself (a missing binary fails
//! the test; see TESTING.md for the opt-out), and with `--features cluster` on a three-node
//! cluster. The in-memory queue runs the same rules in `workq`'s tests.

mod support;

use workq_conformance::behaviour::rules;

/// Instantiates every rule on Redis.
macro_rules! behaviour_suite {
    ($($rule:ident),* $(,)?) => {
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    let Some(factory) = super::support::RedisFactory::start() else {
                        return;
                    };
                    super::rules::$rule(&factory).await;
                }
            )*
        }
        /// Every rule, one after the other, on one three-node Redis Cluster.
        #[cfg(feature = "cluster")]
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn redis_cluster_keeps_every_rule() {
            let Some(factory) = support::RedisFactory::start_cluster() else {
                return;
            };
            $(
                rules::$rule(&factory).await;
            )*
        }
    };
}

workq_conformance::for_each_rule!(behaviour_suite);
