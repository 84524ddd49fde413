//! Failures through kube's real client against the in-process API server: no object is
//! dropped by default, the error policy decides per error, and a backoff is neither burnt nor
//! reset by the events the failing reconcile caused itself.
//!
//! Time is a `FakeClock` on the queue: a retry comes only when the test steps the clock, so
//! "not retried yet" is a state, not a race.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::json;
use workq::WorkQueue;
use workq::clock::FakeClock;
use workq::rate_limiter::ExponentialFailure;
use workq_kube::testing::FakeApiServer;
use workq_kube::{Controller, ErrorAction};

mod support;
use support::{Widget, WidgetStatus, configmap, eventually, value_of, widget};

/// A queue on a fake clock whose backoff is 1 s doubling to `max`.
fn queue_on<T>(clock: &FakeClock, max: Duration) -> WorkQueue<T>
where
    T: Eq + std::hash::Hash + Clone + Send + Sync + 'static,
{
    WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(ExponentialFailure::new(Duration::from_secs(1), max))
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_failing_twenty_times_in_a_row_is_retried_until_it_succeeds() {
    let server = FakeApiServer::start().await;
    server.apply(&configmap("stubborn", "v1"));
    let clock = FakeClock::new();
    let queue = queue_on(&clock, Duration::from_secs(60));
    let attempts = Arc::new(AtomicUsize::new(0));
    // Default settings: no max_retries, no error policy.
    let controller = Controller::with_queue(
        queue.clone(),
        Api::<ConfigMap>::namespaced(server.client(), "default"),
        watcher::Config::default(),
    )
    .run(
        |_: Arc<ConfigMap>, attempts: Arc<AtomicUsize>| async move {
            if attempts.fetch_add(1, Ordering::SeqCst) < 20 {
                Err("not yet")
            } else {
                Ok(Action::await_change())
            }
        },
        attempts.clone(),
    );
    let key = ObjectRef::<ConfigMap>::new("stubborn").within("default");

    for failures in 1..=20_u32 {
        eventually("the failure's retry scheduled", || {
            queue.num_requeues(&key) == failures as usize
                && queue.delayed_len() == 1
                && queue.processing_len() == 0
        })
        .await;
        assert_eq!(attempts.load(Ordering::SeqCst), failures as usize);
        // The capped exponential delay: 1 s, 2 s, 4 s, ... 60 s.
        let delay = Duration::from_secs(1 << (failures - 1).min(6)).min(Duration::from_secs(60));
        clock.step(delay);
    }
    eventually("the 21st attempt", || controller.stats().succeeded == 1).await;
    let summary = controller.shut_down().await.unwrap();
    assert_eq!(attempts.load(Ordering::SeqCst), 21);
    assert_eq!((summary.retried, summary.given_up), (20, 0));
    assert_eq!(
        queue.num_requeues(&key),
        0,
        "a success forgets the failures"
    );
}

/// Why a reconcile failed, by the object's name.
#[derive(Debug)]
enum Failure {
    /// Someone else wrote the object: retry soon.
    Conflict,
    /// No retry can help.
    Invalid,
    /// A transient failure.
    Flaky,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

/// Calls per object, and what the error policy saw: (name, failures in a row).
#[derive(Default)]
struct Seen {
    calls: Mutex<Vec<String>>,
    policy: Mutex<Vec<(String, usize)>>,
}

impl Seen {
    fn calls(&self, name: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|n| *n == name)
            .count()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_policy_decides_per_error_with_the_failures_in_a_row() {
    let server = FakeApiServer::start().await;
    for name in ["conflict", "invalid", "flaky"] {
        server.apply(&configmap(name, "v1"));
    }
    let clock = FakeClock::new();
    let queue: WorkQueue<ObjectRef<ConfigMap>> = queue_on(&clock, Duration::from_secs(1000));
    let seen = Arc::new(Seen::default());
    let given_up = Arc::new(Mutex::new(Vec::new()));
    let controller = Controller::with_queue(
        queue.clone(),
        Api::<ConfigMap>::namespaced(server.client(), "default"),
        watcher::Config::default(),
    )
    .error_policy({
        let seen = seen.clone();
        move |object: Arc<ConfigMap>, error: &Failure, failures| {
            seen.policy
                .lock()
                .unwrap()
                .push((object.name_any(), failures));
            match error {
                Failure::Conflict => ErrorAction::RetryAfter(Duration::from_millis(100)),
                Failure::Invalid => ErrorAction::GiveUp,
                Failure::Flaky => ErrorAction::Backoff,
            }
        }
    })
    .workers({
        let given_up = given_up.clone();
        move |workers| {
            workers
                .on_give_up(move |gave_up| given_up.lock().unwrap().push(gave_up.item.name.clone()))
        }
    })
    .run(
        |object: Arc<ConfigMap>, seen: Arc<Seen>| async move {
            let name = object.name_any();
            seen.calls.lock().unwrap().push(name.clone());
            let calls = seen.calls(&name);
            match name.as_str() {
                "conflict" if calls <= 2 => Err(Failure::Conflict),
                "invalid" => Err(Failure::Invalid),
                "flaky" if calls <= 3 => Err(Failure::Flaky),
                _ => Ok(Action::await_change()),
            }
        },
        seen.clone(),
    );

    // The give-up is reported at once, without a retry.
    eventually("the give-up", || given_up.lock().unwrap().len() == 1).await;
    assert_eq!(*given_up.lock().unwrap(), ["invalid"]);
    // Conflicts retry after the policy's 100 ms; the flaky object after 1 s, then 2 s.
    for step in [100, 100, 800, 2000, 4000] {
        eventually("every retry scheduled", || {
            queue.processing_len() == 0 && queue.is_empty()
        })
        .await;
        clock.step(Duration::from_millis(step));
    }
    eventually("both retried to success", || {
        controller.stats().succeeded == 2
    })
    .await;
    let summary = controller.shut_down().await.unwrap();

    assert_eq!(
        [
            seen.calls("conflict"),
            seen.calls("invalid"),
            seen.calls("flaky")
        ],
        [3, 1, 4]
    );
    let policy = seen.policy.lock().unwrap().clone();
    let failures_of = |name: &str| -> Vec<usize> {
        policy
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, failures)| *failures)
            .collect()
    };
    // The backoff counts failures in a row; a fixed delay starts the count over.
    assert_eq!(failures_of("flaky"), [1, 2, 3]);
    assert_eq!(failures_of("conflict"), [1, 1]);
    assert_eq!(failures_of("invalid"), [1]);
    assert_eq!((summary.given_up, summary.succeeded), (1, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn giving_up_after_n_failures_is_a_choice_and_the_next_change_tries_again() {
    let server = FakeApiServer::start().await;
    server.apply(&configmap("broken", "v1"));
    let clock = FakeClock::new();
    let queue: WorkQueue<ObjectRef<ConfigMap>> = queue_on(&clock, Duration::from_secs(1000));
    let calls = Arc::new(Mutex::new(Vec::new()));
    let controller = Controller::with_queue(
        queue.clone(),
        Api::<ConfigMap>::namespaced(server.client(), "default"),
        watcher::Config::default(),
    )
    .error_policy(|_, _: &String, failures| {
        if failures >= 3 {
            ErrorAction::GiveUp
        } else {
            ErrorAction::Backoff
        }
    })
    .run(
        |object: Arc<ConfigMap>, calls: Arc<Mutex<Vec<String>>>| async move {
            calls.lock().unwrap().push(value_of(&object));
            Err::<Action, _>(format!("{} is broken", object.name_any()))
        },
        calls.clone(),
    );

    for delay in [1, 2] {
        eventually("a retry scheduled", || {
            queue.delayed_len() == 1 && queue.processing_len() == 0
        })
        .await;
        clock.step(Duration::from_secs(delay));
    }
    eventually("the give-up", || controller.stats().given_up == 1).await;
    assert_eq!(*calls.lock().unwrap(), ["v1", "v1", "v1"]);
    assert_eq!(queue.delayed_len(), 0, "nothing left to retry");

    // Given up waits for the next change, which starts over.
    server.apply(&configmap("broken", "v2"));
    eventually("the change reconciled", || calls.lock().unwrap().len() == 4).await;
    assert_eq!(calls.lock().unwrap()[3], "v2");
    controller.shut_down().await.unwrap();
}

/// An error policy's `RetryAfter(Duration::MAX)` means "no limit": the object's retry waits
/// (a year on the queue's clock changes nothing), and the worker goes on with the other
/// objects. The controller took the retry's due time as `now + Duration::MAX`, which
/// panicked and ended the only worker: the next object was never reconciled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_policy_retry_after_duration_max_waits_without_a_limit() {
    let server = FakeApiServer::start().await;
    server.apply(&configmap("never", "v1"));
    let clock = FakeClock::new();
    let queue: WorkQueue<ObjectRef<ConfigMap>> = queue_on(&clock, Duration::from_secs(1000));
    let calls = Arc::new(Mutex::new(Vec::new()));
    let controller = Controller::with_queue(
        queue.clone(),
        Api::<ConfigMap>::namespaced(server.client(), "default"),
        watcher::Config::default(),
    )
    .error_policy(|_, _: &String, _| ErrorAction::RetryAfter(Duration::MAX))
    .workers(|workers| workers.count(1))
    .run(
        |object: Arc<ConfigMap>, calls: Arc<Mutex<Vec<String>>>| async move {
            let name = object.name_any();
            calls.lock().unwrap().push(name.clone());
            if name == "never" {
                Err(format!("{name} is broken"))
            } else {
                Ok(Action::await_change())
            }
        },
        calls.clone(),
    );
    eventually("the retry scheduled", || {
        queue.delayed_len() == 1 && queue.processing_len() == 0
    })
    .await;
    server.apply(&configmap("other", "v1"));
    eventually("the next object reconciled", || {
        calls.lock().unwrap().len() == 2
    })
    .await;
    clock.step(Duration::from_secs(365 * 24 * 3600));
    assert_eq!(
        queue.delayed_len(),
        1,
        "a year later, the retry still waits"
    );
    assert_eq!(*calls.lock().unwrap(), ["never", "other"]);
    let summary = controller.shut_down().await.unwrap();
    assert_eq!((summary.retried, summary.succeeded), (1, 1));
}

/// What the widget reconciles saw: the number of each attempt and the object's failures
/// when it started.
struct Attempts {
    widgets: Api<Widget>,
    queue: WorkQueue<ObjectRef<Widget>>,
    /// The queue's failure count of the widget as each attempt started.
    requeues: Mutex<Vec<usize>>,
    /// Whether an attempt waits until the status it wrote is in the store (its watch event
    /// then comes while it runs).
    wait_for_own_event: Mutex<bool>,
}

/// Fails while the widget's size is below 10, writing the attempt's number to the status
/// first, as reconciles that report their errors do.
async fn write_status_then_fail(
    widget: Arc<Widget>,
    attempts: Arc<Attempts>,
    store: kube::runtime::reflector::Store<Widget>,
) -> Result<Action, kube::Error> {
    let key = ObjectRef::<Widget>::new("w").within("default");
    let attempt = {
        let mut requeues = attempts.requeues.lock().unwrap();
        requeues.push(attempts.queue.num_requeues(&key));
        requeues.len()
    };
    if widget.spec.size >= 10 {
        return Ok(Action::await_change());
    }
    let message = format!("attempt {attempt} failed");
    attempts
        .widgets
        .patch_status(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "message": message } })),
        )
        .await?;
    if *attempts.wait_for_own_event.lock().unwrap() {
        while store
            .get(&key)
            .and_then(|w| w.status.clone())
            .map(|s| s.message)
            != Some(message.clone())
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    Err(kube::Error::Service(
        format!("size {} is too small", widget.spec.size).into(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_a_failing_reconcile_writes_neither_burns_nor_resets_its_backoff() {
    let server = FakeApiServer::start().await;
    server.apply(&widget("w", 1));
    let clock = FakeClock::new();
    let queue = queue_on(&clock, Duration::from_secs(1000));
    let widgets = Api::<Widget>::namespaced(server.client(), "default");
    let attempts = Arc::new(Attempts {
        widgets: widgets.clone(),
        queue: queue.clone(),
        requeues: Mutex::new(Vec::new()),
        wait_for_own_event: Mutex::new(true),
    });
    let builder =
        Controller::with_queue(queue.clone(), widgets.clone(), watcher::Config::default());
    let store = builder.store();
    let controller = builder.run(
        move |widget, attempts| write_status_then_fail(widget, attempts, store.clone()),
        attempts.clone(),
    );
    let key = ObjectRef::<Widget>::new("w").within("default");
    let status = |server: &FakeApiServer| {
        server
            .get::<Widget>(Some("default"), "w")
            .and_then(|w| w.status)
    };

    // Attempt 1 sees its own status event in the store before it fails.
    eventually("the first failure", || {
        queue.num_requeues(&key) == 1 && queue.delayed_len() == 1 && queue.processing_len() == 0
    })
    .await;
    // Its status event reached the feed (held while it ran, or deferred after), and did not
    // queue the widget.
    eventually("the status event handled", || {
        let stats = controller.feed_stats();
        stats.held + stats.deferred >= 1
    })
    .await;
    assert_eq!(queue.len(), 0, "the status event did not queue the widget");
    clock.step(Duration::from_millis(999));
    assert_eq!(
        (queue.len(), queue.processing_len()),
        (0, 0),
        "not before 1 s"
    );

    // Attempt 2 returns as soon as it wrote: its event comes during or after the attempt.
    *attempts.wait_for_own_event.lock().unwrap() = false;
    clock.step(Duration::from_millis(1));
    eventually("the second failure and its own event", || {
        queue.num_requeues(&key) == 2
            && controller.feed_stats().held + controller.feed_stats().deferred >= 2
            && controller.store().get(&key).and_then(|w| w.status.clone())
                == Some(WidgetStatus {
                    message: "attempt 2 failed".into(),
                })
    })
    .await;
    assert_eq!(
        (queue.len(), queue.delayed_len(), queue.processing_len()),
        (0, 1, 0),
        "the retry still waits its 2 s"
    );
    assert_eq!(status(&server).unwrap().message, "attempt 2 failed");

    // A change of the spec (a new generation) cuts the backoff short, without resetting it.
    widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "size": 10 } })),
        )
        .await
        .unwrap();
    eventually("the fixed widget reconciled", || {
        controller.stats().succeeded == 1
    })
    .await;
    let summary = controller.shut_down().await.unwrap();
    assert_eq!(
        *attempts.requeues.lock().unwrap(),
        [0, 1, 2],
        "failure counts as each attempt started"
    );
    assert_eq!(queue.num_requeues(&key), 0, "forgotten after the success");
    assert_eq!((summary.retried, summary.succeeded), (2, 1));
}
