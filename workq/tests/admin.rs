//! The operator's contract (`workq::admin`) on the in-process queues: the admin behaviour
//! suite run on [`MemoryAdmin`] (the figures rules, and `Unsupported` for the rest), the
//! messages of [`act`] for every answer a backend can give, the pointer forwards, and (feature
//! `serde`) the JSON names the dashboard's API has always used.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use workq::WorkQueue;
use workq::admin::{
    Action, ActionOutcome, Admin, AdminError, BoxFuture, Capabilities, MemoryAdmin, QueueSummary,
    Removed, Retried, ServerStatus, Stats, act,
};
use workq::metrics::QueueProbe;
use workq::rate_limiter::ExponentialFailure;
use workq_conformance::admin::AdminFactory;

/// The in-process queues of one test, all reporting to one [`MemoryAdmin`].
#[derive(Default)]
struct MemoryAdminFactory {
    admin: MemoryAdmin,
}

impl AdminFactory for MemoryAdminFactory {
    type Queue = WorkQueue<String>;

    async fn admin(&self) -> Box<dyn Admin> {
        Box::new(self.admin.clone())
    }

    async fn queue(&self, name: &str) -> WorkQueue<String> {
        let hour = Duration::from_secs(3600);
        WorkQueue::builder()
            .name(name)
            .metrics(self.admin.clone())
            .rate_limiter(ExponentialFailure::new(hour, hour * 1000))
            .build()
    }

    async fn dead_letter(&self, _queue: &str, _item: &str) {
        unreachable!("the suite makes dead letters only where the backend has actions");
    }
}

/// Instantiates every rule of the suite on a fresh [`MemoryAdminFactory`].
macro_rules! memory_admin {
    ($($rule:ident),* $(,)?) => {
        mod memory_admin {
            $(
                #[tokio::test]
                async fn $rule() {
                    workq_conformance::admin::rules::$rule(&crate::MemoryAdminFactory::default()).await;
                }
            )*
        }
    };
}

workq_conformance::for_each_admin_rule!(memory_admin);

#[tokio::test]
async fn memory_admin_counts_the_events_of_the_queues_that_report_to_it() {
    let admin = MemoryAdmin::new();
    let queue: WorkQueue<u32> = WorkQueue::builder()
        .name("pods")
        .metrics(admin.clone())
        .build();
    queue.add(1);
    queue.add(2);
    queue.add(2);
    let lease = queue.try_get().expect("an item");
    queue.add_rate_limited(3);
    let pods = admin.summary("pods").await.expect("pods");
    assert_eq!((pods.depth, pods.delayed, pods.in_flight), (1, 1, 1));
    let counters = pods
        .counters
        .expect("counted: the admin is the queue's provider");
    assert_eq!(
        (counters.adds, counters.completions, counters.retries),
        (2, 0, 1),
        "the duplicate add is not counted; the rate-limited one is a retry"
    );
    drop(lease);
    let pods = admin.summary("pods").await.expect("pods");
    assert_eq!(pods.counters.expect("counted").completions, 1);
    assert_eq!(pods.in_flight, 0);
    let stats = admin.stats("pods", 10).await.expect("stats");
    assert_eq!(stats.summary, pods);
    assert!(stats.leases.is_empty() && stats.failures.is_empty());
    assert_eq!(stats.next_delayed_in, None);
}

#[tokio::test]
async fn memory_admin_shows_the_groups_and_the_limits_of_a_queue_with_flow_control() {
    let admin = MemoryAdmin::new();
    let queue: WorkQueue<String> = WorkQueue::builder()
        .name("tenants")
        .metrics(admin.clone())
        .group_by(|key: &String| key.split_once('/').map_or("", |(g, _)| g).to_owned())
        .max_in_flight_per_group(1)
        .group_max_in_flight("big", 3)
        .hand_out_rate(1000.0, 100)
        .build();
    for key in ["noisy/a", "noisy/b", "noisy/c", "quiet/a", "big/a"] {
        queue.add(key.to_owned());
    }
    let lease = queue.try_get().expect("an item");
    assert_eq!(lease.item(), "noisy/a");
    let stats = admin.stats("tenants", 2).await.expect("stats");
    let flow = stats.flow.expect("flow figures");
    assert_eq!(
        (flow.groups, flow.groups_ready, flow.groups_saturated),
        (3, 3, 1)
    );
    let top: Vec<(&str, usize, usize, Option<usize>)> = stats
        .groups
        .iter()
        .map(|g| (g.name.as_str(), g.ready, g.in_flight, g.limit))
        .collect();
    assert_eq!(
        top,
        [("noisy", 2, 1, Some(1)), ("big", 1, 0, Some(3))],
        "the two groups with the most ready items, as many as asked for"
    );
    let limits = stats.limits.expect("limits");
    assert!(limits.grouped);
    assert_eq!(limits.max_in_flight_per_group, Some(1));
    assert_eq!(limits.limit_of("big"), Some(3));
    assert_eq!(limits.hand_out_rate.map(|r| r.burst), Some(100));

    let plain: WorkQueue<u32> = WorkQueue::builder()
        .name("plain")
        .metrics(admin.clone())
        .build();
    plain.add(1);
    let stats = admin.stats("plain", 10).await.expect("stats");
    assert_eq!(
        (stats.flow, stats.groups.len(), stats.limits),
        (None, 0, None)
    );
    drop(lease);
}

#[tokio::test]
async fn memory_admin_shows_a_probe_without_counters_and_forgets_dropped_queues() {
    let queue: WorkQueue<u32> = WorkQueue::new();
    queue.add(7);
    let weak = queue.clone();
    let probe = QueueProbe::new(move || Some(weak.stats()));
    let gone = QueueProbe::new(|| None);
    let admin = MemoryAdmin::new()
        .with_queue("probed", probe)
        .with_queue("gone", gone);
    let clone = admin.clone();
    let reporting: WorkQueue<u32> = WorkQueue::builder()
        .name("reporting")
        .metrics(clone)
        .build();
    let listed = admin.queues().await.expect("queues");
    let names: Vec<&str> = listed.iter().map(|q| q.name.as_str()).collect();
    assert_eq!(
        names,
        ["probed", "reporting"],
        "sorted; the gone probe forgotten"
    );
    assert_eq!(listed[0].depth, 1);
    assert_eq!(listed[0].counters, None, "a probe alone counts nothing");
    assert!(listed[1].counters.is_some(), "clones share the list");
    assert_eq!(admin.summary("gone").await, Err(AdminError::NotFound));
    drop(reporting);
    assert_eq!(admin.summary("reporting").await, Err(AdminError::NotFound));
    assert_eq!(admin.kind(), "memory");
    assert_eq!(admin.capabilities(), Capabilities::figures_only());
    let status = admin.status();
    assert!(status.up && status.error.is_none() && status.warnings.is_empty());
    assert_eq!(status.server, "this process");
    assert!(format!("{admin:?}").contains("probed"), "{admin:?}");
}

#[test]
fn memory_admin_reads_probes_without_holding_its_lock() {
    // A probe is user code: this one reads the admin it is registered with (as a
    // provider's probe that reports its own listing would). Read under the admin's lock, it
    // would wait for that lock for ever.
    let admin = MemoryAdmin::new();
    let inner = admin.clone();
    let looked = Arc::new(AtomicUsize::new(0));
    let seen = looked.clone();
    let probe = QueueProbe::new(move || {
        if seen.fetch_add(1, Ordering::SeqCst) == 0 {
            let others = futures::FutureExt::now_or_never(inner.queues())
                .expect("answered at once")
                .expect("queues");
            assert_eq!(others.len(), 1, "itself");
        }
        Some(workq::QueueStats::default())
    });
    let admin = admin.with_queue("curious", probe);
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let listed = futures::executor::block_on(admin.queues()).expect("queues");
        let _ = done.send(listed.len());
    });
    assert_eq!(
        finished.recv_timeout(Duration::from_secs(30)),
        Ok(1),
        "the listing finished"
    );
    assert!(looked.load(Ordering::SeqCst) >= 2);
}

#[tokio::test]
async fn a_queue_registered_under_a_gone_ones_name_while_it_is_read_is_kept() {
    let admin = MemoryAdmin::new();
    let live: WorkQueue<u32> = WorkQueue::new();
    live.add(1);
    let reading = live.clone();
    let again = admin.clone();
    // The first "pods" is gone; while the listing reads it, a new "pods" registers.
    let gone = QueueProbe::new(move || {
        let reading = reading.clone();
        let _ = again
            .clone()
            .with_queue("pods", QueueProbe::new(move || Some(reading.stats())));
        None
    });
    let admin = admin.with_queue("pods", gone);
    assert!(
        admin.queues().await.expect("queues").is_empty(),
        "read as gone"
    );
    let listed = admin.queues().await.expect("queues");
    assert_eq!(listed.len(), 1, "the new registration is kept");
    assert_eq!(listed[0].depth, 1);
}

#[tokio::test]
async fn boxed_and_shared_admins_answer_as_the_admin_inside() {
    let admin = MemoryAdmin::new();
    let queue: WorkQueue<u32> = WorkQueue::builder()
        .name("pods")
        .metrics(admin.clone())
        .build();
    queue.add(1);
    let shared: Arc<dyn Admin> = Arc::new(admin.clone());
    let boxed: Box<dyn Admin> = Box::new(shared.clone());
    let listed = admin.queues().await.expect("queues");
    for other in [&*shared, &*boxed] {
        assert_eq!(other.kind(), "memory");
        assert_eq!(other.capabilities(), Capabilities::figures_only());
        assert_eq!(other.status(), admin.status());
        assert_eq!(other.queues().await.expect("queues"), listed);
        assert_eq!(other.summary("pods").await, admin.summary("pods").await);
        assert_eq!(other.stats("pods", 1).await, admin.stats("pods", 1).await);
        assert_eq!(other.pause("pods").await, Err(AdminError::Unsupported));
    }
    // A scripted admin shows that every method is forwarded, not answered by a default.
    let scripted: Box<dyn Admin> = Box::new(Arc::new(Scripted::default()));
    let all = [
        Action::Pause,
        Action::Resume,
        Action::ShutDownFleet,
        Action::ResumeFleet,
        Action::RequeueDeadLetters,
        Action::PurgeDeadLetters,
        Action::RequeueDeadLetter { id: "1".into() },
        Action::DeleteDeadLetter { id: "1".into() },
        Action::RetryNow { item: "1".into() },
        Action::Remove { item: "1".into() },
        Action::Forget { item: "1".into() },
        Action::PauseSchedule {
            schedule: "nightly".into(),
        },
        Action::ResumeSchedule {
            schedule: "nightly".into(),
        },
    ];
    for action in &all {
        assert!(act(&*scripted, "q", action).await.is_ok(), "{action:?}");
    }
    let query = workq::admin::PageQuery::new(workq::admin::ItemState::Ready, 1);
    assert!(scripted.page("q", &query).await.is_ok());
    assert!(scripted.item_detail("q", "1").await.is_ok());
    assert!(
        scripted
            .dead_letters("q", workq::admin::End::First, 1)
            .await
            .is_ok()
    );
    assert!(scripted.schedules("q").await.is_ok());
}

/// An admin that answers every call with what a test set: the backends' answers, to check
/// what [`act`] says of each.
#[derive(Debug, Default)]
struct Scripted {
    /// What the switches answer.
    switched: bool,
    /// What the bulk actions answer.
    count: u64,
    /// What the dead letter actions answer (a letter found), or `ShutDown`.
    letter: Option<Result<bool, AdminError>>,
    /// What `requeue_dead_letters` answers instead of `count`.
    requeue_all: Option<AdminError>,
    /// What `retry_now` answers.
    retried: Option<Result<Retried, AdminError>>,
    /// What `remove` answers.
    removed: Removed,
    /// What `forget` answers.
    forgot: u32,
    /// Calls answered.
    calls: AtomicUsize,
}

impl Scripted {
    fn answer<'a, T: Send + 'a>(
        &'a self,
        value: Result<T, AdminError>,
    ) -> BoxFuture<'a, Result<T, AdminError>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        Box::pin(async move { value })
    }
}

impl Admin for Scripted {
    fn kind(&self) -> &'static str {
        "scripted"
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::all()
    }
    fn status(&self) -> ServerStatus {
        ServerStatus::new(true, "a script")
    }
    fn queues(&self) -> BoxFuture<'_, Result<Vec<QueueSummary>, AdminError>> {
        self.answer(Ok(vec![QueueSummary::named("q")]))
    }
    fn summary<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<QueueSummary, AdminError>> {
        self.answer(Ok(QueueSummary::named(queue)))
    }
    fn stats<'a>(&'a self, queue: &'a str, _: usize) -> BoxFuture<'a, Result<Stats, AdminError>> {
        self.answer(Ok(Stats::new(QueueSummary::named(queue))))
    }
    fn page<'a>(
        &'a self,
        _: &'a str,
        _: &'a workq::admin::PageQuery,
    ) -> BoxFuture<'a, Result<workq::admin::Page, AdminError>> {
        self.answer(Ok(workq::admin::Page::new(Vec::new(), 0)))
    }
    fn item_detail<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
    ) -> BoxFuture<'a, Result<Option<workq::admin::ItemDetail>, AdminError>> {
        self.answer(Ok(None))
    }
    fn pause<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
        self.answer(Ok(self.switched))
    }
    fn resume<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
        self.answer(Ok(self.switched))
    }
    fn shut_down_fleet<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
        self.answer(Ok(self.switched))
    }
    fn resume_fleet<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<bool, AdminError>> {
        self.answer(Ok(self.switched))
    }
    fn retry_now<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
    ) -> BoxFuture<'a, Result<Retried, AdminError>> {
        self.answer(self.retried.clone().unwrap_or(Ok(Retried::Queued)))
    }
    fn remove<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Result<Removed, AdminError>> {
        self.answer(Ok(self.removed))
    }
    fn forget<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Result<u32, AdminError>> {
        self.answer(Ok(self.forgot))
    }
    fn dead_letters<'a>(
        &'a self,
        _: &'a str,
        _: workq::admin::End,
        _: usize,
    ) -> BoxFuture<'a, Result<Vec<workq::admin::DeadLetter>, AdminError>> {
        self.answer(Ok(Vec::new()))
    }
    fn requeue_dead_letter_by_id<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
    ) -> BoxFuture<'a, Result<bool, AdminError>> {
        self.answer(self.letter.clone().unwrap_or(Ok(true)))
    }
    fn requeue_dead_letters<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<u64, AdminError>> {
        self.answer(match &self.requeue_all {
            Some(e) => Err(e.clone()),
            None => Ok(self.count),
        })
    }
    fn delete_dead_letter_by_id<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
    ) -> BoxFuture<'a, Result<bool, AdminError>> {
        self.answer(self.letter.clone().unwrap_or(Ok(true)))
    }
    fn purge_dead_letters<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<u64, AdminError>> {
        self.answer(Ok(self.count))
    }
    fn schedules<'a>(
        &'a self,
        _: &'a str,
    ) -> BoxFuture<'a, Result<Vec<workq::periodic::ScheduleInfo>, AdminError>> {
        self.answer(Ok(Vec::new()))
    }
    fn pause_schedule<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
        _: bool,
    ) -> BoxFuture<'a, Result<bool, AdminError>> {
        self.answer(Ok(self.switched))
    }
}

/// What `act` says of `action` on `admin`.
async fn said(admin: &Scripted, action: Action) -> Result<(u64, String), AdminError> {
    act(admin, "q", &action).await.map(
        |ActionOutcome {
             changed, message, ..
         }| (changed, message),
    )
}

fn ok(changed: u64, message: &str) -> Result<(u64, String), AdminError> {
    Ok((changed, message.to_owned()))
}

#[tokio::test]
async fn act_says_what_each_switch_did() {
    let on = Scripted {
        switched: true,
        ..Scripted::default()
    };
    let off = Scripted::default();
    assert_eq!(said(&on, Action::Pause).await, ok(1, "paused"));
    assert_eq!(said(&off, Action::Pause).await, ok(0, "already paused"));
    assert_eq!(said(&on, Action::Resume).await, ok(1, "resumed"));
    assert_eq!(said(&off, Action::Resume).await, ok(0, "already running"));
    assert_eq!(
        said(&on, Action::ShutDownFleet).await,
        ok(1, "shut down for every process")
    );
    assert_eq!(
        said(&off, Action::ShutDownFleet).await,
        ok(0, "already shut down")
    );
    assert_eq!(
        said(&on, Action::ResumeFleet).await,
        ok(1, "running again for every process")
    );
    assert_eq!(
        said(&off, Action::ResumeFleet).await,
        ok(0, "not shut down")
    );
    let nightly = || "nightly".to_owned();
    assert_eq!(
        said(
            &on,
            Action::PauseSchedule {
                schedule: nightly()
            }
        )
        .await,
        ok(
            1,
            "schedule paused for every process (its ticks are skipped)"
        )
    );
    assert_eq!(
        said(
            &off,
            Action::PauseSchedule {
                schedule: nightly()
            }
        )
        .await,
        ok(0, "schedule paused already")
    );
    assert_eq!(
        said(
            &on,
            Action::ResumeSchedule {
                schedule: nightly()
            }
        )
        .await,
        ok(
            1,
            "schedule running again (the ticks skipped are not caught up)"
        )
    );
    assert_eq!(
        said(
            &off,
            Action::ResumeSchedule {
                schedule: nightly()
            }
        )
        .await,
        ok(0, "schedule running already")
    );
    assert_eq!(on.calls.load(Ordering::Relaxed), 6, "one call per action");
}

#[tokio::test]
async fn act_says_what_the_dead_letter_actions_did() {
    let three = Scripted {
        count: 3,
        ..Scripted::default()
    };
    assert_eq!(
        said(&three, Action::RequeueDeadLetters).await,
        ok(3, "requeued 3 dead letters")
    );
    assert_eq!(
        said(&three, Action::PurgeDeadLetters).await,
        ok(3, "purged 3 dead letters")
    );
    let none = Scripted::default();
    assert_eq!(
        said(&none, Action::RequeueDeadLetters).await,
        ok(0, "requeued 0 dead letters")
    );
    let id = || "7".to_owned();
    assert_eq!(
        said(&none, Action::RequeueDeadLetter { id: id() }).await,
        ok(1, "requeued the dead letter")
    );
    assert_eq!(
        said(&none, Action::DeleteDeadLetter { id: id() }).await,
        ok(1, "deleted the dead letter")
    );
    let gone = Scripted {
        letter: Some(Ok(false)),
        ..Scripted::default()
    };
    let gone_message = "no such dead letter (requeued or deleted already)";
    assert_eq!(
        said(&gone, Action::RequeueDeadLetter { id: id() }).await,
        ok(0, gone_message)
    );
    assert_eq!(
        said(&gone, Action::DeleteDeadLetter { id: id() }).await,
        ok(0, gone_message)
    );
}

#[tokio::test]
async fn a_requeue_refused_for_a_shut_down_queue_is_an_outcome_that_changed_nothing() {
    let shut = Scripted {
        letter: Some(Err(AdminError::ShutDown)),
        requeue_all: Some(AdminError::ShutDown),
        retried: Some(Err(AdminError::ShutDown)),
        ..Scripted::default()
    };
    assert_eq!(
        said(&shut, Action::RequeueDeadLetters).await,
        ok(
            0,
            "the queue is shut down: no dead letter was requeued (resume it first)"
        )
    );
    assert_eq!(
        said(&shut, Action::RequeueDeadLetter { id: "1".into() }).await,
        ok(
            0,
            "the queue is shut down: the dead letter stays (resume it first)"
        )
    );
    assert_eq!(
        said(&shut, Action::RetryNow { item: "1".into() }).await,
        ok(0, "the queue is shut down")
    );
    // Other errors are errors, and `ShutDown` of a delete is one too.
    assert_eq!(
        said(&shut, Action::DeleteDeadLetter { id: "1".into() }).await,
        Err(AdminError::ShutDown)
    );
    let down = Scripted {
        requeue_all: Some(AdminError::Unavailable("down".into())),
        ..Scripted::default()
    };
    assert_eq!(
        said(&down, Action::RequeueDeadLetters).await,
        Err(AdminError::Unavailable("down".into()))
    );
}

#[tokio::test]
async fn act_says_what_retry_now_did_in_each_case() {
    let cases = [
        (Retried::Queued, 1, "queued now"),
        (
            Retried::Deferred,
            1,
            "queued again when its current lease ends",
        ),
        (Retried::AlreadyQueued, 0, "already queued"),
        (Retried::InFlight, 0, "being processed; nothing to retry"),
        (Retried::ShutDown, 0, "the queue is shut down"),
        (Retried::Unknown, 0, "not delayed or failing in this queue"),
    ];
    for (retried, changed, message) in cases {
        let admin = Scripted {
            retried: Some(Ok(retried)),
            ..Scripted::default()
        };
        assert_eq!(
            said(&admin, Action::RetryNow { item: "1".into() }).await,
            ok(changed, message),
            "{retried:?}"
        );
    }
}

#[tokio::test]
async fn act_says_what_remove_took_out() {
    // (queued, delayed, readd, counts, leased) and what `act` says of it.
    let cases = [
        (
            (true, false, false, false, false),
            1,
            "taken out of the queue",
        ),
        (
            (false, true, false, false, false),
            1,
            "taken out of the queue",
        ),
        (
            (true, false, false, true, false),
            1,
            "taken out of the queue; its failure count is cleared",
        ),
        (
            (false, false, false, true, false),
            1,
            "its failure count is cleared",
        ),
        (
            (false, false, true, false, true),
            1,
            "its pending re-add is dropped (the lease stays with its holder)",
        ),
        (
            (false, false, false, false, true),
            0,
            "being processed with nothing pending: the lease stays with its holder",
        ),
        ((false, false, false, false, false), 0, "not in the queue"),
    ];
    for ((queued, delayed, readd, counts, leased), changed, message) in cases {
        let mut removed = Removed::default();
        removed.queued = queued;
        removed.delayed = delayed;
        removed.readd = readd;
        removed.counts = counts;
        removed.leased = leased;
        let admin = Scripted {
            removed,
            ..Scripted::default()
        };
        assert_eq!(
            said(&admin, Action::Remove { item: "1".into() }).await,
            ok(changed, message),
            "{removed:?}"
        );
    }
}

#[tokio::test]
async fn act_says_how_many_failures_forget_cleared() {
    let two = Scripted {
        forgot: 2,
        ..Scripted::default()
    };
    let forget = || Action::Forget { item: "1".into() };
    assert_eq!(said(&two, forget()).await, ok(1, "cleared 2 failures"));
    assert_eq!(
        said(&Scripted::default(), forget()).await,
        ok(0, "no failures to clear")
    );
}

#[test]
fn actions_name_their_target_and_say_whether_they_lose_something() {
    let item = || "\"a\"".to_owned();
    let cases = [
        (Action::Pause, "pause", None, false),
        (Action::Resume, "resume", None, false),
        (Action::ShutDownFleet, "shut_down_fleet", None, true),
        (Action::ResumeFleet, "resume_fleet", None, false),
        (
            Action::RequeueDeadLetters,
            "requeue_dead_letters",
            None,
            false,
        ),
        (Action::PurgeDeadLetters, "purge_dead_letters", None, true),
        (
            Action::RequeueDeadLetter { id: "7".into() },
            "requeue_dead_letter",
            Some("7"),
            false,
        ),
        (
            Action::DeleteDeadLetter { id: "7".into() },
            "delete_dead_letter",
            Some("7"),
            true,
        ),
        (
            Action::RetryNow { item: item() },
            "retry_now",
            Some("\"a\""),
            false,
        ),
        (
            Action::Remove { item: item() },
            "remove",
            Some("\"a\""),
            true,
        ),
        (
            Action::Forget { item: item() },
            "forget",
            Some("\"a\""),
            true,
        ),
        (
            Action::PauseSchedule {
                schedule: "nightly".into(),
            },
            "pause_schedule",
            Some("nightly"),
            false,
        ),
        (
            Action::ResumeSchedule {
                schedule: "nightly".into(),
            },
            "resume_schedule",
            Some("nightly"),
            false,
        ),
    ];
    for (action, name, target, destructive) in cases {
        assert_eq!(action.name(), name);
        assert_eq!(action.target(), target, "{name}");
        assert_eq!(action.is_destructive(), destructive, "{name}");
    }
}

#[test]
fn errors_say_what_went_wrong() {
    let cases = [
        (AdminError::NotFound, "not found"),
        (AdminError::Unsupported, "this source cannot do that"),
        (
            AdminError::BadRequest("item: x".into()),
            "bad request: item: x",
        ),
        (AdminError::ShutDown, "the queue is shut down"),
        (
            AdminError::Unavailable("refused".into()),
            "server unavailable: refused",
        ),
        (AdminError::Backend("oops".into()), "backend error: oops"),
    ];
    for (error, text) in cases {
        assert_eq!(error.to_string(), text);
    }
    let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(AdminError::NotFound);
    assert_eq!(boxed.to_string(), "not found");
}

#[cfg(feature = "serde")]
mod json {
    //! The JSON the dashboard's API and its page have always read: every name kept.

    use std::time::{Duration, SystemTime};

    use serde_json::{Value, json};
    use workq::admin::{
        Action, ActionOutcome, Counters, DeadLetter, End, InFlight, ItemDetail, ItemState,
        LeaseInfo, Page, PageEntry, PageQuery, QueueSummary, Removed, Retried, ServerStatus, Stats,
    };
    use workq::{AddKind, Added};

    fn round_trip<T>(value: &T) -> Value
    where
        T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
    {
        let json = serde_json::to_value(value).expect("serialize");
        let back: T = serde_json::from_value(json.clone()).expect("deserialize");
        assert_eq!(&back, value, "{json}");
        json
    }

    fn summary() -> QueueSummary {
        let mut s = QueueSummary::named("pods");
        s.depth = 3;
        s.delayed = 2;
        s.in_flight = 1;
        s.in_flight_dirty = 1;
        s.failing = 4;
        s.failures = 9;
        s.stalled = 1;
        s.dead = 5;
        s.dead_dropped = 6;
        s.paused = true;
        s.oldest_ready = Some(Duration::from_millis(2500));
        s.longest_lease = Duration::from_millis(1500);
        s.lease_age_sum = Duration::from_secs(2);
        s.counters = Some(Counters::new(10, 7, 2));
        s
    }

    #[test]
    fn a_queue_summary_reads_as_the_dashboards_queue_listing() {
        let json = round_trip(&summary());
        assert_eq!(
            json,
            json!({
                "name": "pods", "broken": null, "depth": 3, "delayed": 2, "in_flight": 1,
                "in_flight_dirty": 1, "failing": 4, "failures": 9, "stalled": 1, "dead": 5,
                "dead_dropped": 6, "paused": true, "shut_down": false, "oldest_ready_s": 2.5,
                "longest_running_s": 1.5, "unfinished_work_s": 2.0, "adds_total": 10,
                "completions_total": 7, "retries_total": 2, "capped_at": null,
            })
        );
        let mut capped = summary();
        capped.capped_at = Some(2);
        let json = round_trip(&capped);
        assert_eq!(json["capped_at"], 2, "counts over 2 mean more than 2");
        assert!(capped.is_capped(capped.depth) && !capped.is_capped(capped.delayed));
        let broken = round_trip(&QueueSummary::broken("odd", "a key of the wrong type"));
        assert_eq!(broken["broken"], "a key of the wrong type");
        for counter in ["adds_total", "completions_total", "retries_total"] {
            assert_eq!(broken[counter], Value::Null, "written, as null: {counter}");
        }
        let old: QueueSummary = serde_json::from_value(json!({"name": "q", "depth": 1}))
            .expect("a listing that lacks the newer fields");
        assert_eq!((old.depth, old.counters), (1, None));
        let half = serde_json::from_value::<QueueSummary>(json!({"name": "q", "adds_total": 1}));
        assert!(half.is_err(), "counters come together");
        let negative = serde_json::from_value::<QueueSummary>(json!({"longest_running_s": -1.0}));
        assert!(negative.is_err(), "no negative span");
    }

    #[test]
    fn hostile_json_is_refused_without_a_panic() {
        let cases = [
            json!({"name": "q", "longest_running_s": 1e300}),
            json!({"name": "q", "unfinished_work_s": -0.5}),
            json!({"name": "q", "oldest_ready_s": -1}),
            json!({"name": "q", "depth": -1}),
            json!({"name": 5}),
        ];
        for case in cases {
            assert!(
                serde_json::from_value::<QueueSummary>(case.clone()).is_err(),
                "{case}"
            );
        }
        let far = json!({"id": "1", "item": "x", "error": "", "at_ms": u64::MAX,
                         "stalls": 0, "failures": 0, "token": null});
        // Either read or refused; never a panic.
        let _ = serde_json::from_value::<DeadLetter>(far);
        let lease = json!({"age_s": f64::MAX, "expires_in_s": 0, "token": 1, "holder": null});
        assert!(serde_json::from_value::<LeaseInfo>(lease).is_err());
        let action = json!({"action": "drop_database"});
        assert!(serde_json::from_value::<Action>(action).is_err());
        let missing = json!({"action": "retry_now"});
        assert!(
            serde_json::from_value::<Action>(missing).is_err(),
            "no item"
        );
    }

    #[test]
    fn stats_are_the_summary_with_leases_and_failures() {
        let mut stats = Stats::new(summary());
        stats.next_delayed_in = Some(Duration::from_secs(3));
        let mut lease = LeaseInfo::new(Duration::from_millis(250), Duration::from_secs(30), 42);
        lease.holder = Some("worker-1".into());
        stats.leases = vec![InFlight::new("\"a\"", lease)];
        stats.failures = vec![("\"b\"".into(), 3)];
        let json = round_trip(&stats);
        assert_eq!(json["summary"]["depth"], 3);
        assert_eq!(
            (
                json["summary"]["failures"].clone(),
                json["summary"]["adds_total"].clone()
            ),
            (json!(9), json!(10)),
            "the summary is nested whole: its failures are not the list's"
        );
        assert_eq!(json["next_delayed_in_s"], 3.0);
        assert_eq!(
            json["leases"],
            json!([{"item": "\"a\"", "lease": {
                "age_s": 0.25, "expires_in_s": 30.0, "token": 42, "holder": "worker-1"
            }}])
        );
        assert_eq!(json["failures"], json!([["\"b\"", 3]]));
    }

    fn letter() -> DeadLetter {
        let mut letter = DeadLetter::new("17", "\"a\"");
        letter.error = "stalled".into();
        letter.at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        letter.stalls = 3;
        letter.failures = 1;
        letter.token = Some(9);
        letter
    }

    #[test]
    fn pages_entries_and_dead_letters_keep_the_pages_names() {
        let dead = round_trip(&letter());
        assert_eq!(
            dead,
            json!({"id": "17", "item": "\"a\"", "error": "stalled", "at_ms": 1_700_000_000_123_u64,
                   "stalls": 3, "failures": 1, "token": 9})
        );
        let mut delayed = PageEntry::new("\"d\"", ItemState::Delayed);
        delayed.priority = Some(-1);
        delayed.due_in = Some(Duration::from_millis(1500));
        let mut leased = PageEntry::new("\"l\"", ItemState::InFlight);
        leased.lease = Some(LeaseInfo::new(Duration::ZERO, Duration::from_secs(1), 5));
        let mut failing = PageEntry::new("\"f\"", ItemState::Failing);
        failing.failures = Some(2);
        let mut dead_entry = PageEntry::new("\"a\"", ItemState::Dead);
        dead_entry.dead = Some(letter());
        let mut page = Page::new(vec![delayed, leased, failing, dead_entry], 40);
        page.next = Some("4".into());
        let json = round_trip(&page);
        assert_eq!(
            (json["total"].clone(), json["next"].clone()),
            (json!(40), json!("4"))
        );
        assert_eq!(json["prev"], Value::Null);
        assert_eq!(json["capped_at"], Value::Null, "an exact total");
        assert!(!page.total_is_capped());
        page.capped_at = Some(39);
        assert_eq!(round_trip(&page)["capped_at"], 39);
        assert!(
            page.total_is_capped(),
            "40 of a count capped at 39: more than 39"
        );
        page.capped_at = Some(40);
        assert!(!page.total_is_capped(), "exactly 40");
        let items = &json["items"];
        assert_eq!(
            items[0],
            json!({"item": "\"d\"", "state": "delayed", "priority": -1, "due_in_s": 1.5,
                   "lease": null, "failures": null, "dead": null})
        );
        assert_eq!(items[1]["state"], "in_flight");
        assert_eq!(items[1]["lease"]["expires_in_s"], 1.0);
        assert_eq!(items[2]["failures"], 2);
        assert_eq!(items[3]["dead"]["at_ms"], 1_700_000_000_123_u64);
    }

    #[test]
    fn an_items_detail_keeps_the_pages_names() {
        let mut detail = ItemDetail::new("\"a\"");
        detail.states = vec![ItemState::Delayed, ItemState::Failing, ItemState::Dead];
        detail.priority = Some(2);
        detail.due_in = Some(Duration::from_secs(60));
        detail.failures = 4;
        detail.dead_letters = vec![letter()];
        let json = round_trip(&detail);
        assert_eq!(json["states"], json!(["delayed", "failing", "dead"]));
        assert_eq!(json["due_in_s"], 60.0);
        for key in [
            "item",
            "priority",
            "position",
            "lease",
            "lease_priority",
            "readded",
            "failures",
            "stalls",
        ] {
            assert!(json.get(key).is_some(), "{key} in {json}");
        }
        assert_eq!(json["dead_letters"][0]["id"], "17");
    }

    #[test]
    fn actions_read_as_the_dashboard_posts_them() {
        let retry: Action = serde_json::from_value(json!({"action": "retry_now", "item": "\"a\""}))
            .expect("action");
        assert_eq!(
            retry,
            Action::RetryNow {
                item: "\"a\"".into()
            }
        );
        for action in [
            Action::Pause,
            Action::ShutDownFleet,
            Action::RequeueDeadLetter { id: "7".into() },
            Action::Forget {
                item: "\"a\"".into(),
            },
            Action::PauseSchedule {
                schedule: "nightly".into(),
            },
            Action::ResumeSchedule {
                schedule: "nightly".into(),
            },
        ] {
            let json = round_trip(&action);
            assert_eq!(
                json["action"],
                action.name(),
                "the tag is the action's name"
            );
        }
        let pause: Action =
            serde_json::from_value(json!({"action": "pause_schedule", "schedule": "nightly"}))
                .expect("action");
        assert_eq!(pause.target(), Some("nightly"));
        assert_eq!(
            round_trip(&ActionOutcome::new(2, "requeued 2 dead letters")),
            json!({"changed": 2, "message": "requeued 2 dead letters"})
        );
    }

    #[test]
    fn the_smaller_types_read_as_their_names() {
        assert_eq!(round_trip(&ItemState::InFlight), json!("in_flight"));
        for state in ItemState::ALL {
            assert_eq!(round_trip(&state), json!(state.name()));
        }
        assert_eq!(round_trip(&End::Last), json!("last"));
        assert_eq!(round_trip(&Retried::AlreadyQueued), json!("already_queued"));
        let mut removed = Removed::default();
        removed.readd = true;
        assert_eq!(
            round_trip(&removed),
            json!({"queued": false, "delayed": false, "readd": true, "counts": false, "leased": false})
        );
        let query = PageQuery::new(ItemState::Dead, 20).from(End::Last);
        assert_eq!(
            round_trip(&query),
            json!({"state": "dead", "from": "last", "cursor": null, "limit": 20, "search": null})
        );
        let parsed: PageQuery =
            serde_json::from_value(json!({"state": "ready", "limit": 5})).expect("defaults");
        assert_eq!(parsed, PageQuery::new(ItemState::Ready, 5));
        let mut status = ServerStatus::new(true, "redis://cache:6379/");
        status.warnings.push("appendonly is off".into());
        assert_eq!(
            round_trip(&status),
            json!({"up": true, "error": null, "server": "redis://cache:6379/",
                   "warnings": ["appendonly is off"], "details": null})
        );
        assert_eq!(
            round_trip(&Added::new(AddKind::Delayed, 3, Duration::from_millis(5))),
            json!({"kind": "delayed", "seq": 3, "delay_s": 0.005})
        );
        assert_eq!(
            round_trip(&workq::admin::AdminError::BadRequest("x".into())),
            json!({"bad_request": "x"})
        );
    }
}

#[test]
fn the_contract_works_across_threads_and_tasks() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    fn send<T: Send>(_: &T) {}
    let admin = MemoryAdmin::new();
    let shared: Arc<dyn Admin> = Arc::new(admin.clone());
    send_sync(&admin);
    send_sync(&shared);
    // What a web handler awaits on a multi-threaded runtime.
    send(&act(&*shared, "q", &Action::Pause));
    send(&shared.queues());
    send_sync(&AdminError::NotFound);
}
