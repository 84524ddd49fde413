//! The operator's contract on PostgreSQL: every rule of the admin behaviour suite
//! (`workq_conformance::admin`) run on [`PgAdmin`], each rule on a server of its own (the
//! rules name their queues `pods`, `jobs`, ...).

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::PgServer;
use workq::admin::Admin;
use workq_conformance::admin::AdminFactory;
use workq_postgres::{PgAdmin, PgQueue};

/// A server of the rule's own, its queues, and a [`PgAdmin`] over them.
struct PgAdminFactory {
    server: Arc<PgServer>,
}

impl PgAdminFactory {
    fn start() -> Option<Self> {
        Some(PgAdminFactory {
            server: Arc::new(PgServer::start()?),
        })
    }
}

impl AdminFactory for PgAdminFactory {
    type Queue = PgQueue<String>;

    async fn admin(&self) -> Box<dyn Admin> {
        Box::new(PgAdmin::new(&self.server.url()).expect("a valid URL"))
    }

    async fn queue(&self, name: &str) -> PgQueue<String> {
        PgQueue::builder(name)
            .url(self.server.url())
            .backoff(Duration::from_secs(3600), Duration::from_secs(7200))
            .token_bucket(None)
            .lease_duration(Duration::from_secs(30))
            .build()
            .await
            .expect("connect to the test server")
    }

    async fn dead_letter(&self, queue: &str, item: &str) {
        // Added as any JSON, handed out as a string: it does not deserialize, and is moved
        // aside.
        let any: PgQueue<serde_json::Value> = PgQueue::builder(queue)
            .url(self.server.url())
            .build()
            .await
            .expect("connect to the test server");
        let value: serde_json::Value = serde_json::from_str(item).expect("a JSON item");
        any.add(value).await.expect("add");
        let strings = self.queue(queue).await;
        let got = strings.try_get().await.expect("try_get");
        assert!(
            got.into_lease().is_none(),
            "{item} is moved aside, not handed out"
        );
    }
}

/// Instantiates every rule of the suite on a server of its own.
macro_rules! postgres_admin {
    ($($rule:ident),* $(,)?) => {
        mod postgres_admin {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    let Some(factory) = crate::PgAdminFactory::start() else {
                        return;
                    };
                    workq_conformance::admin::rules::$rule(&factory).await;
                }
            )*
        }
    };
}

workq_conformance::for_each_admin_rule!(postgres_admin);
