//! One behaviour suite for both backends: every rule of the shared suite
//! (`workq/tests/conformance`) runs, unchanged, against the
//! in-memory `workq::WorkQueue` and against `RedisQueue` on a `redis-server` the test
//! starts itself (a missing binary fails the test; see TESTING.md for the opt-out).

#[macro_use]
mod support;

use support::conformance::rules;

/// Instantiates every rule for both backends.
macro_rules! behaviour_suite {
    ($($rule:ident),* $(,)?) => {
        mod in_memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    super::rules::$rule(&super::support::MemoryFactory).await;
                }
            )*
        }
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

for_each_rule!(behaviour_suite);
