//! The shared behaviour suite (`workq_conformance::behaviour`) on `PgQueue`, against a
//! PostgreSQL server the test starts itself (a missing server fails the test; set
//! `WQ_SKIP_PG_TESTS=1` outside CI to skip knowingly). The in-memory queue runs the same
//! rules in `workq`'s tests.

mod support;

use workq_conformance::behaviour::rules;

/// Instantiates every rule on PostgreSQL.
macro_rules! behaviour_suite {
    ($($rule:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    let Some(factory) = super::support::PgFactory::start() else {
                        return;
                    };
                    super::rules::$rule(&factory).await;
                }
            )*
        }
    };
}

workq_conformance::for_each_rule!(behaviour_suite);
