//! The operator's contract on Redis: the admin behaviour suite (`workq-conformance`'s
//! `admin` module) run on [`RedisAdmin`] over a server of each rule's own, and the rules of
//! the contract that are Redis's to keep (a queue with no key is not created by an operator
//! call; a requeue on a queue shut down for every process answers `ShutDown`; `remove` says
//! when a lease stays; a listing counts the dirty leases as `stats` does).

mod support;

use std::time::Duration;

use support::server::{RedisServer, require};
use workq::admin::{Action, Admin, AdminError, End, act};
use workq_conformance::admin::{AdminFactory, text};
use workq_redis::{RateLimit, RedisAdmin, RedisQueue};

/// Queues on a server of the rule's own, and a [`RedisAdmin`] over them.
struct RedisAdminFactory {
    server: RedisServer,
}

impl RedisAdminFactory {
    fn start() -> Option<Self> {
        Some(RedisAdminFactory { server: require()? })
    }
}

impl AdminFactory for RedisAdminFactory {
    type Queue = RedisQueue<String>;

    async fn admin(&self) -> Box<dyn Admin> {
        Box::new(RedisAdmin::new(&self.server.url(), "wq").expect("a valid URL"))
    }

    async fn queue(&self, name: &str) -> RedisQueue<String> {
        let hour = Duration::from_secs(3600);
        RedisQueue::builder(name)
            .url(self.server.url())
            .check_persistence(false)
            .rate_limit(RateLimit::exponential(hour, hour * 1000))
            .build()
            .await
            .expect("connect to the test server")
    }

    /// Added as any JSON by a handle that takes any, then handed out by one of strings:
    /// the text does not deserialize, so the hand-out moves it to the dead letters.
    async fn dead_letter(&self, queue: &str, item: &str) {
        let any: RedisQueue<serde_json::Value> = RedisQueue::builder(queue)
            .url(self.server.url())
            .check_persistence(false)
            .build()
            .await
            .expect("connect to the test server");
        let value: serde_json::Value = serde_json::from_str(item).expect("JSON");
        any.add(value).await.expect("add");
        let strings = self.queue(queue).await;
        assert!(
            strings.try_get().await.expect("try_get").is_empty(),
            "the letter is moved aside, and nothing else is ready"
        );
    }
}

/// Instantiates every rule of the suite on a server of its own.
macro_rules! redis_admin {
    ($($rule:ident),* $(,)?) => {
        mod redis_admin {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    let Some(factory) = crate::RedisAdminFactory::start() else { return };
                    workq_conformance::admin::rules::$rule(&factory).await;
                }
            )*
        }
    };
}

workq_conformance::for_each_admin_rule!(redis_admin);

/// The keys under the prefix, sorted.
async fn keys(server: &RedisServer) -> Vec<String> {
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("wq:*")
        .query_async(&mut con)
        .await
        .unwrap();
    keys.sort();
    keys
}

/// Every call of the contract on a queue that was never made answers `NotFound` and leaves
/// no key behind, whatever the call (the CLI's old commands created the queue's keys).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_on_a_queue_with_no_key_writes_nothing() {
    let Some(factory) = RedisAdminFactory::start() else {
        return;
    };
    let admin = factory.admin().await;
    let before = keys(&factory.server).await;
    for action in [
        Action::Pause,
        Action::Resume,
        Action::ShutDownFleet,
        Action::ResumeFleet,
        Action::RequeueDeadLetters,
        Action::PurgeDeadLetters,
        Action::RetryNow { item: text("a") },
        Action::Remove { item: text("a") },
        Action::Forget { item: text("a") },
    ] {
        assert_eq!(
            act(&*admin, "typo", &action).await,
            Err(AdminError::NotFound),
            "{action:?}"
        );
    }
    assert_eq!(admin.summary("typo").await, Err(AdminError::NotFound));
    assert_eq!(keys(&factory.server).await, before, "no key was written");
}

/// A requeue of dead letters while the queue is shut down for every process is refused with
/// `ShutDown` (adds are ignored then, so it would lose nothing but do nothing either) and
/// leaves the letters; after the resume it goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeue_on_a_shut_down_queue_answers_shut_down() {
    let Some(factory) = RedisAdminFactory::start() else {
        return;
    };
    let admin = factory.admin().await;
    factory.dead_letter("pods", "{\"letter\":1}").await;
    factory.dead_letter("pods", "{\"letter\":2}").await;
    let letters = admin.dead_letters("pods", End::First, 10).await.unwrap();
    assert_eq!(letters.len(), 2);
    assert_eq!(admin.shut_down_fleet("pods").await, Ok(true));
    assert_eq!(
        admin.requeue_dead_letters("pods").await,
        Err(AdminError::ShutDown)
    );
    assert_eq!(
        admin
            .requeue_dead_letter_by_id("pods", &letters[0].id)
            .await,
        Err(AdminError::ShutDown)
    );
    let outcome = act(&*admin, "pods", &Action::RequeueDeadLetters)
        .await
        .unwrap();
    assert_eq!(outcome.changed, 0);
    assert!(outcome.message.contains("shut down"), "{}", outcome.message);
    let s = admin.summary("pods").await.unwrap();
    assert_eq!((s.dead, s.depth), (2, 0), "nothing moved");
    assert_eq!(admin.resume_fleet("pods").await, Ok(true));
    assert_eq!(admin.requeue_dead_letters("pods").await, Ok(2));
}

/// `remove` of a leased item with nothing pending takes nothing and says the lease stays;
/// the listing counts a leased item re-added meanwhile as `in_flight_dirty`, as `stats`
/// does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_says_a_lease_stays_and_the_listing_counts_dirty_leases() {
    let Some(factory) = RedisAdminFactory::start() else {
        return;
    };
    let admin = factory.admin().await;
    let queue = factory.queue("pods").await;
    queue.add("a".to_owned()).await.unwrap();
    let lease = queue.try_get().await.unwrap().into_lease().unwrap();
    let removed = admin.remove("pods", &text("a")).await.unwrap();
    assert!(removed.leased && !removed.any(), "{removed:?}");
    let outcome = act(&*admin, "pods", &Action::Remove { item: text("a") })
        .await
        .unwrap();
    assert_eq!(
        outcome.message,
        "being processed with nothing pending: the lease stays with its holder"
    );
    queue.add("a".to_owned()).await.unwrap();
    let listed = admin.queues().await.unwrap();
    assert_eq!(listed[0].in_flight_dirty, 1);
    assert_eq!(listed[0].depth, 0);
    let stats = admin.stats("pods", 10).await.unwrap();
    assert_eq!(stats.summary.in_flight_dirty, listed[0].in_flight_dirty);
    lease.done().await.unwrap();
}

/// The warnings about maxmemory-policy in `status()`.
fn eviction_warnings(admin: &dyn Admin) -> Vec<String> {
    admin
        .status()
        .warnings
        .into_iter()
        .filter(|w| w.contains("maxmemory-policy"))
        .collect()
}

/// A `maxmemory-policy` that may evict the queues' keys, set on a running server, shows in
/// `status()`'s warnings at the admin's next call after its check interval, and in a logged
/// warning, without a reconnect; before the interval the admin reads nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_policy_set_on_a_running_server_is_reported() {
    let Some(factory) = RedisAdminFactory::start() else {
        return;
    };
    // The admin's calls run on this thread (awaited here, not spawned): its log is this one.
    let (log, _logging) = support::Log::capture();
    let url = factory.server.url();
    let checking = RedisAdmin::new(&url, "wq")
        .unwrap()
        .settings_check_interval(Duration::ZERO);
    let hourly = RedisAdmin::new(&url, "wq")
        .unwrap()
        .settings_check_interval(Duration::from_secs(3600));
    factory
        .queue("pods")
        .await
        .add("a".to_owned())
        .await
        .unwrap();
    // Through the contract (the inherent `summary` of `RedisAdmin` is the plain read).
    let (checking, hourly): (&dyn Admin, &dyn Admin) = (&checking, &hourly);
    for admin in [checking, hourly] {
        admin.summary("pods").await.unwrap();
        assert_eq!(eviction_warnings(admin), Vec::<String>::new());
        assert!(admin.status().up);
    }

    let mut con = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query_async(&mut con)
        .await
        .unwrap();
    checking.summary("pods").await.unwrap();
    let warnings = eviction_warnings(checking);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("allkeys-lru"), "{warnings:?}");
    assert!(
        checking
            .status()
            .details
            .unwrap()
            .contains("maxmemory-policy=allkeys-lru"),
        "the details say the setting too"
    );
    let logged = log.text();
    assert!(
        logged.contains("WARN") && logged.contains("maxmemory-policy is \"allkeys-lru\""),
        "{logged}"
    );
    hourly.summary("pods").await.unwrap();
    assert_eq!(
        eviction_warnings(hourly),
        Vec::<String>::new(),
        "read again at most once per interval"
    );

    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .query_async(&mut con)
        .await
        .unwrap();
    checking.queues().await.unwrap();
    assert_eq!(eviction_warnings(checking), Vec::<String>::new(), "fixed");
}
