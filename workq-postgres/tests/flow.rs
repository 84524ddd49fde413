//! The shared flow control suite (`workq_conformance::flow`) on `PgQueue`, against a
//! PostgreSQL server the test starts itself: groups taking turns, in-flight limits and
//! hand-out rates, through the `workq::Queue` trait, and the rules that drive a `Workers`
//! pool (whose steps `PgQueue` batches: `Queue::batch_limit` is 64). The in-memory queue runs
//! the same rules in `workq`'s tests; PostgreSQL's own flow tests are in `flow_pg.rs`.

mod support;

use support::{PgServer, flow_builder};
use workq_conformance::flow::{FlowFactory, FlowSpec, Unsupported};
use workq_postgres::PgQueue;

/// Fresh queues with flow control on a server of the test's own.
struct PgFlow {
    server: PgServer,
}

impl FlowFactory for PgFlow {
    type Q = PgQueue<String>;

    async fn flow_queue(&self, spec: FlowSpec) -> Result<PgQueue<String>, Unsupported> {
        Ok(flow_builder(&self.server, &spec)
            .build()
            .await
            .expect("connect to the test server"))
    }
}

/// Instantiates every flow rule on PostgreSQL.
macro_rules! flow_suite {
    ($($rule:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    let Some(server) = super::PgServer::start() else {
                        return;
                    };
                    workq_conformance::flow::rules::$rule(&super::PgFlow { server }).await;
                }
            )*
        }
    };
}

workq_conformance::for_each_flow_rule!(flow_suite);

/// Instantiates the flow rules that drive a `Workers` pool on PostgreSQL.
macro_rules! flow_workers_suite {
    ($($rule:ident),* $(,)?) => {
        mod postgres_workers {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    let Some(server) = super::PgServer::start() else {
                        return;
                    };
                    workq_conformance::flow::workers_rules::$rule(&super::PgFlow { server })
                        .await;
                }
            )*
        }
    };
}

workq_conformance::for_each_flow_workers_rule!(flow_workers_suite);
