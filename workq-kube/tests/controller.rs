//! The controller runner with kube's real client, over HTTP, against the in-process API
//! server (`testing::FakeApiServer`): lists, watches, relists, retries, metrics, stop.
//!
//! Waits are for states (a count reached, a queue length), never for a span of time; the
//! generous limit in `eventually` only turns a hang into a failure.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use workq::clock::FakeClock;
use workq::metrics::prometheus::PrometheusMetrics;
use workq::rate_limiter::ExponentialFailure;
use workq::{Outcome, WorkQueue};
use workq_kube::Controller;
use workq_kube::testing::FakeApiServer;

mod support;
use support::{Widget, configmap, eventually, value_of, widget};

/// What the reconciles saw, and the gate that holds the object named `blocker`.
struct Recorder {
    /// (name, value) per reconcile, in the order they started.
    calls: Mutex<Vec<(String, String)>>,
    /// Reconciles running now.
    running: Mutex<HashMap<String, usize>>,
    /// Whether two reconciles ever ran for one object at once.
    overlapped: Mutex<bool>,
    /// The most reconciles that ran at once.
    peak: Mutex<usize>,
    /// Reconciles finished.
    finished: Mutex<usize>,
    /// `blocker` (or every object, with `hold_all`) waits while this is false.
    open: watch::Sender<bool>,
    /// Hold every reconcile at the gate, not only `blocker`'s.
    hold_all: bool,
    /// Names whose reconcile fails.
    failing: Vec<&'static str>,
}

impl Recorder {
    fn new() -> Arc<Self> {
        Self::with(false, Vec::new())
    }

    fn with(hold_all: bool, failing: Vec<&'static str>) -> Arc<Self> {
        Arc::new(Self {
            calls: Mutex::default(),
            running: Mutex::default(),
            overlapped: Mutex::new(false),
            peak: Mutex::new(0),
            finished: Mutex::new(0),
            open: watch::channel(true).0,
            hold_all,
            failing,
        })
    }

    fn calls(&self) -> Vec<(String, String)> {
        self.calls.lock().unwrap().clone()
    }

    fn names(&self) -> Vec<String> {
        self.calls().into_iter().map(|(name, _)| name).collect()
    }

    fn count(&self, name: &str) -> usize {
        self.names().iter().filter(|n| *n == name).count()
    }

    fn in_flight(&self) -> usize {
        self.running.lock().unwrap().values().sum()
    }

    fn close(&self) {
        self.open.send_replace(false);
    }

    fn open(&self) {
        self.open.send_replace(true);
    }
}

async fn reconcile(configmap: Arc<ConfigMap>, recorder: Arc<Recorder>) -> Result<Action, String> {
    let name = configmap.name_any();
    recorder
        .calls
        .lock()
        .unwrap()
        .push((name.clone(), value_of(&configmap)));
    {
        let mut running = recorder.running.lock().unwrap();
        let count = running.entry(name.clone()).or_default();
        *count += 1;
        if *count > 1 {
            *recorder.overlapped.lock().unwrap() = true;
        }
        let total = running.values().sum();
        let mut peak = recorder.peak.lock().unwrap();
        *peak = (*peak).max(total);
    }
    if recorder.hold_all || name == "blocker" {
        let mut open = recorder.open.subscribe();
        open.wait_for(|open| *open).await.unwrap();
    }
    *recorder.running.lock().unwrap().get_mut(&name).unwrap() -= 1;
    *recorder.finished.lock().unwrap() += 1;
    if recorder.failing.contains(&name.as_str()) {
        return Err(format!("{name} cannot be reconciled"));
    }
    Ok(Action::await_change())
}

fn configmaps(server: &FakeApiServer) -> Api<ConfigMap> {
    Api::namespaced(server.client(), "default")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_list_reconciles_every_object_once() {
    let server = FakeApiServer::start().await;
    for name in ["web-0", "web-1", "web-2"] {
        server.apply(&configmap(name, "v1"));
    }
    let recorder = Recorder::new();
    let controller = Controller::new(configmaps(&server), watcher::Config::default())
        .workers(|workers| workers.count(2))
        .run(reconcile, recorder.clone());

    eventually("three reconciles", || {
        *recorder.finished.lock().unwrap() == 3
    })
    .await;
    let mut names = recorder.names();
    names.sort();
    assert_eq!(names, ["web-0", "web-1", "web-2"]);
    assert_eq!(controller.store().state().len(), 3);
    let summary = controller.shut_down().await.unwrap();
    assert_eq!(summary.processed, 3);
    assert_eq!(summary.succeeded, 3);
    assert_eq!(server.requests().lists, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_changes_overtake_listed_objects() {
    let server = FakeApiServer::start().await;
    server.apply(&configmap("blocker", "v1"));
    for name in ["listed-0", "listed-1", "listed-2"] {
        server.apply(&configmap(name, "v1"));
    }
    let recorder = Recorder::new();
    recorder.close();
    let controller = Controller::new(configmaps(&server), watcher::Config::default())
        .run(reconcile, recorder.clone());

    // One worker: the list's first key (blocker) holds it; the other three wait at -100.
    eventually("blocker in flight", || recorder.in_flight() == 1).await;
    eventually("the listed keys queued", || controller.queue().len() == 3).await;
    server.apply(&configmap("live", "v1"));
    eventually("the live key queued", || controller.queue().len() == 4).await;
    recorder.open();

    eventually("every reconcile", || {
        *recorder.finished.lock().unwrap() == 5
    })
    .await;
    assert_eq!(recorder.names()[..2], ["blocker", "live"]);
    controller.shut_down().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_while_queued_are_coalesced_into_one_reconcile_of_the_latest() {
    let server = FakeApiServer::start().await;
    server.apply(&configmap("blocker", "v1"));
    let recorder = Recorder::new();
    let controller = Controller::new(configmaps(&server), watcher::Config::default())
        .run(reconcile, recorder.clone());
    eventually("the first list", || *recorder.finished.lock().unwrap() == 1).await;

    recorder.close();
    server.apply(&configmap("blocker", "v2"));
    eventually("blocker in flight", || recorder.in_flight() == 1).await;
    for version in 1..=5 {
        server.apply(&configmap("web", &format!("v{version}")));
    }
    eventually("web's five events seen", || {
        controller
            .store()
            .get(&ObjectRef::new("web").within("default"))
            .is_some_and(|web| value_of(&web) == "v5")
    })
    .await;
    assert_eq!(controller.queue().len(), 1, "five events, one key");
    recorder.open();

    eventually("web reconciled", || recorder.count("web") == 1).await;
    eventually("all done", || *recorder.finished.lock().unwrap() == 3).await;
    let summary = controller.shut_down().await.unwrap();
    assert_eq!(recorder.count("web"), 1);
    assert!(
        recorder
            .calls()
            .contains(&("web".to_owned(), "v5".to_owned()))
    );
    assert_eq!(summary.processed, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_deleted_while_queued_is_done_without_a_reconcile() {
    let server = FakeApiServer::start().await;
    server.apply(&configmap("blocker", "v1"));
    server.apply(&configmap("doomed", "v1"));
    let recorder = Recorder::new();
    let controller = Controller::new(configmaps(&server), watcher::Config::default())
        .run(reconcile, recorder.clone());
    eventually("the first list", || *recorder.finished.lock().unwrap() == 2).await;

    recorder.close();
    server.apply(&configmap("blocker", "v2"));
    eventually("blocker in flight", || recorder.in_flight() == 1).await;
    server.apply(&configmap("doomed", "v2"));
    assert!(server.delete::<ConfigMap>(Some("default"), "doomed"));
    eventually("doomed gone from the store", || {
        controller.store().state().len() == 1
    })
    .await;
    recorder.open();

    eventually("doomed's key handled", || controller.objects_gone() == 1).await;
    let summary = controller.shut_down().await.unwrap();
    assert_eq!(
        recorder.count("doomed"),
        1,
        "only the first list's reconcile"
    );
    assert_eq!(summary.processed, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relist_after_410_enters_at_list_priority() {
    let server = FakeApiServer::start().await;
    server.apply(&configmap("blocker", "v1"));
    for name in ["listed-0", "listed-1"] {
        server.apply(&configmap(name, "v1"));
    }
    let recorder = Recorder::new();
    let controller = Controller::new(configmaps(&server), watcher::Config::default())
        .run(reconcile, recorder.clone());
    eventually("the first list", || *recorder.finished.lock().unwrap() == 3).await;

    recorder.close();
    server.apply(&configmap("blocker", "v2"));
    eventually("blocker in flight", || recorder.in_flight() == 1).await;
    server.expire_watches();
    eventually("the relist's keys queued", || {
        server.requests().lists == 2 && controller.queue().len() == 2
    })
    .await;
    assert!(server.requests().expired >= 1);
    server.apply(&configmap("live", "v1"));
    eventually("the live key queued", || controller.queue().len() == 3).await;
    recorder.open();

    // blocker again (queued by the relist while in flight) comes after the live change.
    eventually("every reconcile", || {
        *recorder.finished.lock().unwrap() == 8
    })
    .await;
    let names = recorder.names();
    assert_eq!(names[3..5], ["blocker", "live"]);
    let mut relisted = names[5..].to_vec();
    relisted.sort();
    assert_eq!(relisted, ["blocker", "listed-0", "listed-1"]);
    controller.shut_down().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_watches_and_bookmarks_resume_without_a_relist() {
    let server = FakeApiServer::start().await;
    server.apply(&configmap("web", "v1"));
    let recorder = Recorder::new();
    let controller = Controller::new(
        configmaps(&server),
        watcher::Config::default().any_semantic(),
    )
    .run(reconcile, recorder.clone());
    eventually("the first list", || recorder.count("web") == 1).await;

    // Each drop ends a watch that is open, so that the next change needs a new one.
    eventually("the first watch", || server.requests().watches == 1).await;
    // Changes to another kind move the resource version on; a bookmark tells the watcher.
    server.apply(&widget("elsewhere", 1));
    server.apply(&widget("elsewhere", 2));
    let bookmarked = server.resource_version();
    server.bookmark();
    // The stream delivers what it sent before it ends, so the watcher has the bookmark.
    eventually("the bookmark sent", || server.requests().bookmarks == 1).await;
    server.drop_watches();
    eventually("the watch after the bookmark", || {
        server.requests().watches == 2
    })
    .await;
    assert_eq!(server.requests().watched_from, bookmarked);
    server.apply(&configmap("web", "v2"));
    eventually("the change after the drop", || recorder.count("web") == 2).await;
    server.drop_watches();
    server.apply(&configmap("web", "v3"));
    eventually("the change after the second drop", || {
        recorder.count("web") == 3
    })
    .await;

    assert_eq!(server.requests().lists, 1, "no relist");
    assert_eq!(server.requests().watches, 3);
    assert_eq!(recorder.calls().last().unwrap().1, "v3");
    controller.shut_down().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_back_off_per_object_and_give_up() {
    let server = FakeApiServer::start().await;
    server.apply(&configmap("broken", "v1"));
    server.apply(&configmap("fine", "v1"));
    let clock = FakeClock::new();
    let queue: WorkQueue<ObjectRef<ConfigMap>> = WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(ExponentialFailure::new(
            Duration::from_secs(1),
            Duration::from_secs(1000),
        ))
        .build();
    let given_up = Arc::new(Mutex::new(Vec::new()));
    let recorder = Recorder::with(false, vec!["broken"]);
    let controller = Controller::with_queue(
        queue.clone(),
        configmaps(&server),
        watcher::Config::default(),
    )
    .workers({
        let given_up = given_up.clone();
        move |workers| {
            workers.max_retries(2).on_give_up(move |gave_up| {
                given_up.lock().unwrap().push(gave_up.item.name.clone());
            })
        }
    })
    .run(reconcile, recorder.clone());
    let broken = ObjectRef::<ConfigMap>::new("broken").within("default");
    let fine = ObjectRef::<ConfigMap>::new("fine").within("default");

    // Each failure doubles broken's delay (1 s, then 2 s); fine is untouched by them.
    eventually("the first failure", || {
        queue.num_requeues(&broken) == 1 && recorder.count("fine") == 1
    })
    .await;
    eventually("broken waits its delay", || {
        queue.delayed_len() == 1 && queue.processing_len() == 0
    })
    .await;
    clock.step(Duration::from_millis(999));
    assert_eq!((queue.len(), queue.delayed_len()), (0, 1), "not before 1 s");
    clock.step(Duration::from_millis(1));
    eventually("the second failure", || {
        queue.num_requeues(&broken) == 2 && queue.processing_len() == 0
    })
    .await;
    clock.step(Duration::from_millis(1999));
    assert_eq!((queue.len(), queue.delayed_len()), (0, 1), "not before 2 s");
    clock.step(Duration::from_millis(1));
    eventually("the give-up", || !given_up.lock().unwrap().is_empty()).await;

    assert_eq!(recorder.count("broken"), 3, "one try and two retries");
    assert_eq!(recorder.count("fine"), 1);
    assert_eq!(queue.num_requeues(&fine), 0);
    assert_eq!(queue.num_requeues(&broken), 0, "forgotten when given up");
    assert_eq!(*given_up.lock().unwrap(), ["broken"]);
    let summary = controller.shut_down().await.unwrap();
    assert_eq!(
        (summary.retried, summary.given_up, summary.succeeded),
        (2, 1, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeue_action_adds_the_object_back_after_its_delay() {
    let server = FakeApiServer::start().await;
    server.apply(&configmap("poll", "v1"));
    let clock = FakeClock::new();
    let queue: WorkQueue<ObjectRef<ConfigMap>> = WorkQueue::builder().clock(clock.clone()).build();
    let calls = Arc::new(Mutex::new(0));
    let controller = Controller::with_queue(
        queue.clone(),
        configmaps(&server),
        watcher::Config::default(),
    )
    .run(
        |_: Arc<ConfigMap>, calls: Arc<Mutex<usize>>| async move {
            *calls.lock().unwrap() += 1;
            Ok::<_, String>(Action::requeue(Duration::from_secs(30)))
        },
        calls.clone(),
    );

    eventually("the first reconcile", || {
        *calls.lock().unwrap() == 1 && queue.delayed_len() == 1
    })
    .await;
    clock.step(Duration::from_secs(29));
    assert_eq!(queue.len(), 0);
    clock.step(Duration::from_secs(1));
    eventually("the requeue", || *calls.lock().unwrap() == 2).await;
    let summary = controller.shut_down().await.unwrap();
    assert_eq!(
        summary.retried, 2,
        "a requeue counts as a retry (RetryAfter)"
    );
    assert_eq!(summary.given_up, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciles_run_in_parallel_but_never_two_for_one_object() {
    let server = FakeApiServer::start().await;
    for index in 0..8 {
        server.apply(&configmap(&format!("web-{index}"), "v1"));
    }
    let recorder = Recorder::with(true, Vec::new());
    recorder.close();
    let controller = Controller::new(configmaps(&server), watcher::Config::default())
        .workers(|workers| workers.count(4))
        .run(reconcile, recorder.clone());

    // Four workers hold four objects at once; more events for them wait in the queue.
    eventually("four in flight", || recorder.in_flight() == 4).await;
    for index in 0..8 {
        server.apply(&configmap(&format!("web-{index}"), "v2"));
    }
    eventually("the changes in the store", || {
        controller
            .store()
            .state()
            .iter()
            .all(|web| value_of(web) == "v2")
    })
    .await;
    // The four in flight are held back until their reconcile ends: not queued yet.
    assert_eq!(controller.queue().len(), 4);
    recorder.open();
    eventually("every change reconciled", || {
        (0..8).all(|index| {
            recorder
                .calls()
                .contains(&(format!("web-{index}"), "v2".to_owned()))
        }) && recorder.in_flight() == 0
    })
    .await;

    assert_eq!(*recorder.peak.lock().unwrap(), 4);
    assert!(!*recorder.overlapped.lock().unwrap());
    controller.shut_down().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_queue_exports_the_workqueue_series() {
    let server = FakeApiServer::start().await;
    for name in ["web-0", "web-1", "web-2"] {
        server.apply(&configmap(name, "v1"));
    }
    let mut registry = Registry::default();
    let queue: WorkQueue<ObjectRef<ConfigMap>> = WorkQueue::builder()
        .name("configmaps")
        .metrics(PrometheusMetrics::new(&mut registry))
        .build();
    let recorder = Recorder::new();
    let controller = Controller::with_queue(queue, configmaps(&server), watcher::Config::default())
        .run(reconcile, recorder.clone());
    eventually("three reconciles", || {
        *recorder.finished.lock().unwrap() == 3
    })
    .await;
    let _ = controller.shut_down().await.unwrap();

    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    assert!(
        text.contains(r#"workqueue_adds_total{name="configmaps"} 3"#),
        "{text}"
    );
    assert!(
        text.contains(r#"workqueue_depth{name="configmaps"} 0"#),
        "{text}"
    );
    assert!(
        text.contains(r#"workqueue_work_duration_seconds_count{name="configmaps"} 3"#),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_lets_the_reconciles_in_flight_finish() {
    let server = FakeApiServer::start().await;
    for index in 0..6 {
        server.apply(&configmap(&format!("web-{index}"), "v1"));
    }
    let recorder = Recorder::with(true, Vec::new());
    recorder.close();
    let controller = Controller::new(configmaps(&server), watcher::Config::default())
        .workers(|workers| workers.count(3))
        .run(reconcile, recorder.clone());
    eventually("three in flight", || recorder.in_flight() == 3).await;

    let stop = controller.stop_token().clone();
    let stopping = tokio::spawn(controller.shut_down());
    eventually("the stop", || stop.is_stopped()).await;
    recorder.open();
    let summary = stopping.await.unwrap().unwrap();

    assert!(summary.is_drained());
    assert_eq!(summary.processed, 3, "the three in flight finished");
    assert_eq!(summary.succeeded, 3);
    assert_eq!(
        *recorder.finished.lock().unwrap(),
        3,
        "no new reconcile after the stop"
    );
    assert_eq!(summary.left_in_queue, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_resource_is_reconciled_for_its_owned_and_watched_objects() {
    let server = FakeApiServer::start().await;
    server.apply(&widget("alpha", 1));
    server.apply(&widget("beta", 2));
    let client = server.client();
    let calls = Arc::new(Mutex::new(Vec::<(String, u32)>::new()));
    let controller = Controller::new(
        Api::<Widget>::namespaced(client.clone(), "default"),
        watcher::Config::default(),
    )
    .owns(
        Api::<ConfigMap>::namespaced(client.clone(), "default"),
        watcher::Config::default(),
    )
    .watches(
        Api::<ConfigMap>::namespaced(client, "default"),
        watcher::Config::default(),
        // A relation by label: `widget: NAME` names the widget to reconcile.
        |configmap: ConfigMap| {
            let namespace = configmap.namespace().unwrap_or_default();
            configmap
                .labels()
                .get("widget")
                .map(|name| ObjectRef::new(name).within(&namespace))
        },
    )
    .workers(|workers| workers.count(2))
    .run(
        |widget: Arc<Widget>, calls: Arc<Mutex<Vec<(String, u32)>>>| async move {
            calls
                .lock()
                .unwrap()
                .push((widget.name_any(), widget.spec.size));
            Outcome::Done
        },
        calls.clone(),
    );
    let count = |name: &str| {
        calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(n, _)| n == name)
            .count()
    };
    eventually("both widgets listed", || {
        count("alpha") == 1 && count("beta") == 1
    })
    .await;

    // A child owned by alpha: its creation, change and deletion each reconcile alpha.
    let alpha_uid = controller
        .store()
        .get(&ObjectRef::new("alpha").within("default"))
        .unwrap()
        .uid()
        .unwrap();
    let mut child = configmap("alpha-config", "v1");
    child.metadata.owner_references = Some(vec![OwnerReference {
        api_version: Widget::api_version(&()).into_owned(),
        kind: Widget::kind(&()).into_owned(),
        name: "alpha".to_owned(),
        uid: alpha_uid,
        controller: Some(true),
        ..OwnerReference::default()
    }]);
    server.apply(&child);
    eventually("alpha for its child's creation", || count("alpha") == 2).await;
    server.delete::<ConfigMap>(Some("default"), "alpha-config");
    eventually("alpha for its child's deletion", || count("alpha") == 3).await;

    // A config map labelled for beta reconciles beta through the mapper.
    let mut labelled = configmap("settings", "v1");
    labelled.metadata.labels = Some(BTreeMap::from([("widget".to_owned(), "beta".to_owned())]));
    server.apply(&labelled);
    eventually("beta through the mapper", || count("beta") == 2).await;
    server.apply(&widget("beta", 3));
    eventually("beta's own change", || {
        calls.lock().unwrap().contains(&("beta".to_owned(), 3))
    })
    .await;

    controller.shut_down().await.unwrap();
    assert_eq!(count("alpha"), 3);
    // `owns` listed and watched the config maps' metadata only; `watches` the whole objects.
    assert_eq!(
        server.requests().metadata_only,
        2,
        "{:?}",
        server.requests()
    );
    assert_eq!(count("beta"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_reconcile_is_retried_and_the_controller_goes_on() {
    let server = FakeApiServer::start().await;
    server.apply(&configmap("crashy", "v1"));
    server.apply(&configmap("calm", "v1"));
    let attempts = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
    let controller = Controller::new(configmaps(&server), watcher::Config::default()).run(
        |configmap: Arc<ConfigMap>, attempts: Arc<Mutex<HashMap<String, usize>>>| async move {
            let name = configmap.name_any();
            let attempt = {
                let mut attempts = attempts.lock().unwrap();
                let attempt = attempts.entry(name.clone()).or_default();
                *attempt += 1;
                *attempt
            };
            assert!(
                !(name == "crashy" && attempt == 1),
                "a bug in the reconcile"
            );
            Outcome::Done
        },
        attempts.clone(),
    );

    eventually("crashy's retry and calm", || {
        let attempts = attempts.lock().unwrap();
        attempts.get("crashy") == Some(&2) && attempts.get("calm") == Some(&1)
    })
    .await;
    let summary = controller.shut_down().await.unwrap();
    assert_eq!(
        (summary.panicked, summary.retried, summary.succeeded),
        (1, 1, 2)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outside_triggers_reconcile_one_object_or_all() {
    let server = FakeApiServer::start().await;
    for name in ["web-0", "web-1", "web-2"] {
        server.apply(&configmap(name, "v1"));
    }
    let (one, one_requests) = futures::channel::mpsc::unbounded();
    let (all, all_requests) = futures::channel::mpsc::unbounded();
    let recorder = Recorder::new();
    let controller = Controller::new(configmaps(&server), watcher::Config::default())
        .reconcile_on(one_requests)
        .reconcile_all_on(all_requests)
        .run(reconcile, recorder.clone());
    eventually("the first list", || *recorder.finished.lock().unwrap() == 3).await;

    one.unbounded_send(ObjectRef::new("web-1").within("default"))
        .unwrap();
    eventually("web-1 again", || recorder.count("web-1") == 2).await;
    all.unbounded_send(()).unwrap();
    eventually("everything again", || {
        *recorder.finished.lock().unwrap() == 7
    })
    .await;

    controller.shut_down().await.unwrap();
    assert_eq!(
        ["web-0", "web-1", "web-2"].map(|name| recorder.count(name)),
        [2, 3, 2]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_before_the_first_list_waits_for_the_store() {
    let server = FakeApiServer::start().await;
    for name in ["web-0", "web-1"] {
        server.apply(&configmap(name, "v1"));
    }
    // The first lists fail (a missing RBAC rule, say) until the test allows them.
    server.forbid::<ConfigMap>();
    let (one, requests) = futures::channel::mpsc::unbounded();
    one.unbounded_send(ObjectRef::new("web-0").within("default"))
        .unwrap();
    let recorder = Recorder::new();
    let controller = Controller::new(configmaps(&server), watcher::Config::default())
        .trigger_backoff(|| support::Every(Duration::from_millis(20)))
        .reconcile_on(requests)
        .run(reconcile, recorder.clone());

    // The trigger's key is queued, and lists keep failing after it was.
    eventually("the key queued and lists refused", || {
        controller.feed_stats().added == 1 && controller.feed_stats().watch_errors >= 3
    })
    .await;
    assert_eq!(controller.queue().len(), 1, "kept in the queue");
    assert!(
        recorder.calls().is_empty(),
        "no reconcile on an empty store"
    );
    assert_eq!(
        controller.objects_gone(),
        0,
        "no gone verdict on an empty store"
    );

    server.allow::<ConfigMap>();
    controller.wait_until_ready().await;
    eventually("both objects reconciled", || {
        recorder.count("web-0") >= 1 && recorder.count("web-1") == 1
    })
    .await;
    assert_eq!(controller.objects_gone(), 0);
    let summary = controller.shut_down().await.unwrap();
    // web-0's trigger and its listed key merge in the queue, or come one after the other.
    assert!(recorder.count("web-0") <= 2);
    assert_eq!(summary.succeeded, recorder.calls().len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_outage_is_survived_and_the_changes_meanwhile_reconciled() {
    let server = FakeApiServer::start().await;
    for name in ["web-0", "web-1"] {
        server.apply(&configmap(name, "v1"));
    }
    let recorder = Recorder::new();
    let controller = Controller::new(configmaps(&server), watcher::Config::default())
        .trigger_backoff(|| support::Every(Duration::from_millis(20)))
        .run(reconcile, recorder.clone());
    eventually("the first list", || *recorder.finished.lock().unwrap() == 2).await;

    // Down: watches end, connections are refused; the objects change meanwhile.
    server.stop_serving();
    server.apply(&configmap("web-0", "v2"));
    server.delete::<ConfigMap>(Some("default"), "web-1");
    server.apply(&configmap("web-2", "v1"));
    eventually("the watcher failing", || {
        controller.feed_stats().watch_errors >= 3
    })
    .await;
    server.serve_again().await;

    eventually("the changes reconciled", || {
        recorder
            .calls()
            .contains(&("web-0".to_owned(), "v2".to_owned()))
            && recorder.count("web-2") == 1
            && controller.store().state().len() == 2
    })
    .await;
    let summary = controller
        .shut_down()
        .await
        .expect("an outage is not fatal");
    assert_eq!(summary.given_up, 0);
}

/// A ConfigMap `name` in `namespace`.
fn configmap_in(namespace: &str, name: &str) -> ConfigMap {
    let mut object = configmap(name, "v1");
    object.metadata.namespace = Some(namespace.to_owned());
    object
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_by_namespace_gives_a_quiet_namespace_a_turn_before_a_noisy_backlog() {
    let server = FakeApiServer::start().await;
    server.apply(&configmap_in("noisy", "blocker"));
    for i in 0..5 {
        server.apply(&configmap_in("noisy", &format!("noisy-{i}")));
    }
    server.apply(&configmap_in("quiet", "quiet"));
    let recorder = Recorder::new();
    recorder.close();
    let controller = Controller::new(Api::all(server.client()), watcher::Config::default())
        .group_by_namespace()
        .run(reconcile, recorder.clone());

    // One worker: the list's first key (blocker) holds it; the rest wait, noisy first.
    eventually("blocker in flight", || recorder.in_flight() == 1).await;
    eventually("the listed keys queued", || controller.queue().len() == 6).await;
    recorder.open();
    eventually("every reconcile", || {
        *recorder.finished.lock().unwrap() == 7
    })
    .await;
    let names = recorder.names();
    assert_eq!(
        names[..2],
        ["blocker", "quiet"],
        "the quiet namespace's turn comes before the noisy backlog: {names:?}"
    );
    controller.shut_down().await.unwrap();
}
