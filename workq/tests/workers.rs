//! Workers: handler outcomes become the right queue calls, panics are survived, stops drain
//! or time out, and no item is ever processed by two workers at once.
//!
//! Delays run on a `FakeClock`; real time is used only to wait for workers to reach a state
//! (with a generous bound that turns a hang into a failure), never to assert a duration.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use workq::clock::FakeClock;
use workq::rate_limiter::ExponentialFailure;
use workq::{GiveUp, GiveUpReason, ThreadWorkers};
use workq::{Outcome, StopToken, WorkQueue, Workers};

const BASE: Duration = Duration::from_millis(10);

/// Far above what any correct run needs; only turns a hang into a failure.
const GENEROUS: Duration = Duration::from_secs(30);

/// A queue on a fake clock whose retries wait 10 ms, 20 ms, 40 ms, ...
fn fake_queue() -> (FakeClock, WorkQueue<&'static str>) {
    let clock = FakeClock::new();
    let queue = WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(ExponentialFailure::new(BASE, Duration::from_secs(10)))
        .build();
    (clock, queue)
}

/// Polls `condition` until it holds.
fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let start = Instant::now();
    while !condition() {
        assert!(start.elapsed() < GENEROUS, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn wait_processed<T>(workers: &ThreadWorkers<T>, n: u64)
where
    T: Eq + std::hash::Hash + Clone + Send + Sync + std::fmt::Debug + 'static,
{
    wait_until(&format!("{n} items are processed"), || {
        workers.stats().processed >= n
    });
}

/// A handler that answers from a script, one outcome per call, then `Done`.
fn scripted(outcomes: Vec<Outcome>) -> impl Fn(&&'static str) -> Outcome + Send + Sync {
    let outcomes = Mutex::new(outcomes.into_iter());
    move |_| outcomes.lock().unwrap().next().unwrap_or(Outcome::Done)
}

// ===== Outcomes =====

#[test]
fn done_forgets_the_item() {
    let (clock, queue) = fake_queue();
    queue.add_rate_limited("default/web-0"); // a failure on record
    assert_eq!(queue.num_requeues(&"default/web-0"), 1);
    let workers = Workers::new(queue.clone()).spawn_threads(scripted(vec![Outcome::Done]));
    clock.step(BASE);
    wait_processed(&workers, 1);
    assert_eq!(queue.num_requeues(&"default/web-0"), 0);
    let summary = workers.shut_down();
    assert_eq!((summary.processed, summary.succeeded), (1, 1));
    assert_eq!((summary.retried, summary.given_up), (0, 0));
}

#[test]
fn retry_adds_the_item_rate_limited() {
    let (clock, queue) = fake_queue();
    let workers = Workers::new(queue.clone()).spawn_threads(scripted(vec![Outcome::Retry]));
    queue.add("default/web-0");
    wait_processed(&workers, 1);
    assert_eq!(queue.num_requeues(&"default/web-0"), 1);
    assert_eq!((queue.len(), queue.delayed_len()), (0, 1));

    clock.step(BASE - Duration::from_millis(1));
    assert_eq!((queue.len(), queue.delayed_len()), (0, 1)); // not yet
    clock.step(Duration::from_millis(1));
    wait_processed(&workers, 2);
    assert_eq!(queue.num_requeues(&"default/web-0"), 0); // then done: forgotten

    let summary = workers.shut_down();
    assert_eq!(
        (summary.processed, summary.retried, summary.succeeded),
        (2, 1, 1)
    );
}

#[test]
fn an_error_is_retried_like_retry() {
    let (clock, queue) = fake_queue();
    let calls = AtomicUsize::new(0);
    let workers = Workers::new(queue.clone()).spawn_threads(move |_: &&str| {
        if calls.fetch_add(1, Ordering::SeqCst) == 0 {
            Err("connection refused")
        } else {
            Ok(())
        }
    });
    queue.add("default/web-0");
    wait_processed(&workers, 1);
    assert_eq!(queue.num_requeues(&"default/web-0"), 1);
    clock.step(BASE);
    wait_processed(&workers, 2);
    let summary = workers.shut_down();
    assert_eq!((summary.retried, summary.succeeded), (1, 1));
}

#[test]
fn retry_after_adds_the_item_after_that_delay_and_forgets_its_failures() {
    let (clock, queue) = fake_queue();
    let workers = Workers::new(queue.clone()).spawn_threads(scripted(vec![
        Outcome::Retry,
        Outcome::RetryAfter(Duration::from_secs(30)),
        Outcome::Done,
    ]));
    queue.add("default/web-0");
    wait_processed(&workers, 1);
    clock.step(BASE);
    wait_processed(&workers, 2);
    // RequeueAfter is not a failure: the count from the first retry is forgotten.
    assert_eq!(queue.num_requeues(&"default/web-0"), 0);
    assert_eq!(queue.delayed_len(), 1);

    clock.step(Duration::from_secs(29));
    assert_eq!((queue.len(), queue.delayed_len()), (0, 1));
    clock.step(Duration::from_secs(1));
    wait_processed(&workers, 3);
    let summary = workers.shut_down();
    assert_eq!(
        (summary.processed, summary.retried, summary.succeeded),
        (3, 2, 1)
    );
}

#[test]
fn give_up_forgets_the_item_and_reports_it() {
    let (clock, queue) = fake_queue();
    let reports: Arc<Mutex<Vec<GiveUp<&str>>>> = Arc::default();
    let workers = Workers::new(queue.clone())
        .on_give_up({
            let reports = reports.clone();
            move |gave_up| reports.lock().unwrap().push(gave_up.clone())
        })
        .spawn_threads(scripted(vec![Outcome::Retry, Outcome::GiveUp]));
    queue.add("default/web-0");
    wait_processed(&workers, 1);
    clock.step(BASE);
    wait_processed(&workers, 2);

    assert_eq!(queue.num_requeues(&"default/web-0"), 0);
    assert_eq!((queue.len(), queue.delayed_len()), (0, 0));
    let reports = reports.lock().unwrap().clone();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].item, "default/web-0");
    assert_eq!(reports[0].reason, GiveUpReason::Handler);
    assert_eq!(reports[0].retries, 1);
    assert_eq!(reports[0].error, None);
    let summary = workers.shut_down();
    assert_eq!((summary.given_up, summary.retried), (1, 1));
}

#[test]
fn an_item_that_keeps_failing_is_given_up_after_max_retries() {
    let (clock, queue) = fake_queue();
    let reports: Arc<Mutex<Vec<GiveUp<&str>>>> = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let workers = Workers::new(queue.clone())
        .max_retries(2)
        .on_give_up({
            let reports = reports.clone();
            move |gave_up| reports.lock().unwrap().push(gave_up.clone())
        })
        .spawn_threads({
            let calls = calls.clone();
            move |_: &&str| -> Result<(), String> {
                let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
                Err(format!("failure {call}"))
            }
        });
    queue.add("default/web-0");
    wait_processed(&workers, 1); // retry 1, after 10 ms
    clock.step(BASE);
    wait_processed(&workers, 2); // retry 2, after 20 ms
    clock.step(2 * BASE);
    wait_processed(&workers, 3); // 2 retries done: given up

    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(queue.num_requeues(&"default/web-0"), 0);
    assert_eq!(queue.delayed_len(), 0);
    let reports = reports.lock().unwrap().clone();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].reason, GiveUpReason::MaxRetries);
    assert_eq!(reports[0].retries, 2);
    let error = reports[0].error.as_ref().expect("the last failure");
    assert_eq!(error.to_string(), "failure 3");
    // The handler's error keeps its type on the way to the callback.
    assert_eq!(
        error.downcast_ref::<String>().map(String::as_str),
        Some("failure 3")
    );
    let summary = workers.shut_down();
    assert_eq!(
        (summary.processed, summary.retried, summary.given_up),
        (3, 2, 1)
    );
}

#[test]
fn retry_forever_never_gives_up() {
    let (clock, queue) = fake_queue();
    let workers = Workers::new(queue.clone())
        .max_retries(0)
        .retry_forever()
        .spawn_threads(|_: &&str| Outcome::Retry);
    queue.add("default/web-0");
    for n in 1..=20 {
        wait_processed(&workers, n);
        clock.step(Duration::from_secs(10)); // the limiter's maximum
    }
    let summary = workers.shut_down();
    assert_eq!(summary.given_up, 0);
    assert!(summary.retried >= 20);
}

#[test]
fn giving_up_is_logged_as_a_warning() {
    capture::install();
    let (_clock, queue) = fake_queue();
    let workers = Workers::new(queue.clone())
        .max_retries(0)
        .spawn_threads(|_: &&str| Err::<(), _>("always broken"));
    queue.add("default/logged-give-up");
    wait_processed(&workers, 1);
    workers.shut_down();
    let events = capture::events();
    let warning = events
        .iter()
        .find(|event| event.contains("default/logged-give-up"))
        .unwrap_or_else(|| panic!("no event names the item: {events:?}"));
    assert!(warning.starts_with("WARN"), "{warning}");
    assert!(warning.contains("giving up on item"), "{warning}");
    assert!(warning.contains("always broken"), "{warning}");
    assert!(warning.contains("too many retries"), "{warning}");
}

// ===== Panics =====

#[test]
fn a_panicking_handler_is_retried_and_its_worker_keeps_running() {
    let (clock, queue) = fake_queue();
    let panicked_once = AtomicBool::new(false);
    let workers = Workers::new(queue.clone())
        .count(1)
        .spawn_threads(move |key: &&str| {
            if *key == "default/web-0" && !panicked_once.swap(true, Ordering::SeqCst) {
                panic!("reconciler bug");
            }
            Outcome::Done
        });
    queue.add("default/web-0");
    queue.add("default/web-1");
    wait_processed(&workers, 2);
    // The lease was released, the item is waiting for its retry, and the one worker went on
    // to the next item.
    assert_eq!(queue.processing_len(), 0);
    assert_eq!(queue.num_requeues(&"default/web-0"), 1);
    assert_eq!(queue.delayed_len(), 1);
    clock.step(BASE);
    wait_processed(&workers, 3);
    let summary = workers.shut_down();
    assert_eq!(summary.panicked, 1);
    assert_eq!(summary.retried, 1);
    assert_eq!(summary.succeeded, 2);
}

#[test]
fn a_panic_counts_as_a_failure_towards_max_retries() {
    let (_clock, queue) = fake_queue();
    let reports: Arc<Mutex<Vec<GiveUp<&str>>>> = Arc::default();
    let workers = Workers::new(queue.clone())
        .max_retries(0)
        .on_give_up({
            let reports = reports.clone();
            move |gave_up| reports.lock().unwrap().push(gave_up.clone())
        })
        .spawn_threads(|_: &&str| -> Outcome { panic!("always") });
    queue.add("default/web-0");
    wait_processed(&workers, 1);
    let summary = workers.shut_down();
    assert_eq!((summary.panicked, summary.given_up), (1, 1));
    let reports = reports.lock().unwrap();
    assert_eq!(
        reports[0].error,
        Some(workq::Failure::Panicked("always".to_owned()))
    );
    assert_eq!(
        reports[0]
            .error
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("handler panicked: always")
    );
}

#[test]
fn a_panicking_give_up_callback_does_not_stop_the_worker() {
    let (_clock, queue) = fake_queue();
    let workers = Workers::new(queue.clone())
        .count(1)
        .on_give_up(|_| panic!("callback bug"))
        .spawn_threads(|_: &&str| Outcome::GiveUp);
    queue.add("default/web-0");
    queue.add("default/web-1");
    wait_processed(&workers, 2);
    assert_eq!(workers.shut_down().given_up, 2);
}

// ===== Stopping =====

#[test]
fn shut_down_stops_intake_and_waits_for_items_in_flight() {
    let (_clock, queue) = fake_queue();
    let (started_tx, started) = mpsc::channel::<()>();
    let (release, released) = mpsc::channel::<()>();
    let released = Mutex::new(released);
    let workers = Workers::new(queue.clone())
        .count(1)
        .spawn_threads(move |_: &&str| {
            started_tx.send(()).unwrap();
            released.lock().unwrap().recv_timeout(GENEROUS).unwrap();
        });
    queue.add("default/slow");
    started.recv_timeout(GENEROUS).unwrap();
    queue.add("default/web-1");
    queue.add("default/web-2");

    let stopping = std::thread::spawn(move || workers.shut_down());
    wait_until("the queue is shut down", || queue.is_shutting_down());
    queue.add("default/too-late"); // ignored
    release.send(()).unwrap();

    let summary = stopping.join().unwrap();
    assert_eq!((summary.processed, summary.succeeded), (1, 1));
    assert!(summary.is_drained());
    assert_eq!(summary.left_in_queue, 2); // never taken: intake had stopped
}

#[test]
fn shut_down_with_a_deadline_reports_what_is_still_in_flight() {
    let (_clock, queue) = fake_queue();
    let (started_tx, started) = mpsc::channel::<()>();
    let (release, released) = mpsc::channel::<()>();
    let released = Mutex::new(released);
    let workers = Workers::new(queue.clone())
        .count(2)
        .shutdown_timeout(Duration::from_millis(20))
        .spawn_threads(move |_: &&str| {
            started_tx.send(()).unwrap();
            released.lock().unwrap().recv_timeout(GENEROUS).unwrap();
        });
    queue.add("default/stuck");
    started.recv_timeout(GENEROUS).unwrap();

    let summary = workers.shut_down();
    assert_eq!(summary.in_flight, vec!["default/stuck"]);
    assert!(!summary.is_drained());
    assert_eq!(summary.processed, 0);

    // The thread finishes on its own once the handler returns.
    release.send(()).unwrap();
    wait_until("the stuck lease is released", || {
        queue.processing_len() == 0
    });
}

#[test]
fn workers_process_what_is_queued_when_the_queue_is_shut_down_then_end() {
    let (_clock, queue) = fake_queue();
    for key in ["default/a", "default/b", "default/c"] {
        queue.add(key);
    }
    queue.shut_down();
    let summary = Workers::new(queue)
        .count(2)
        .spawn_threads(|_: &&str| ())
        .wait();
    assert_eq!(summary.succeeded, 3);
    assert_eq!(summary.left_in_queue, 0);
}

#[test]
fn a_shared_stop_token_stops_the_pool() {
    let (_clock, queue) = fake_queue();
    let stop = StopToken::new();
    let workers = Workers::new(queue.clone())
        .count(3)
        .stop_token(stop.clone())
        .spawn_threads(|_: &&str| ());
    queue.add("default/web-0");
    wait_processed(&workers, 1);
    stop.stop();
    assert!(queue.is_shutting_down());
    let summary = workers.wait();
    assert_eq!(summary.succeeded, 1);
}

#[test]
fn a_token_stopped_before_spawning_stops_the_pool_at_once() {
    let (_clock, queue) = fake_queue();
    queue.add("default/web-0");
    let stop = StopToken::new();
    stop.stop();
    let summary = Workers::new(queue.clone())
        .stop_token(stop)
        .spawn_threads(|_: &&str| ())
        .wait();
    assert_eq!(summary.processed, 0);
    assert_eq!(summary.left_in_queue, 1);
}

#[test]
#[should_panic(expected = "count must be at least 1")]
fn zero_workers_is_refused() {
    let (_clock, queue) = fake_queue();
    let _ = Workers::new(queue).count(0).spawn_threads(|_: &&str| ());
}

// ===== Exclusivity under load =====

#[test]
fn no_item_is_processed_by_two_workers_at_once() {
    const KEYS: usize = 32;
    const READDS: usize = 20;
    let queue: WorkQueue<usize> = WorkQueue::new();
    let busy: Arc<Vec<AtomicBool>> = Arc::new((0..KEYS).map(|_| AtomicBool::new(false)).collect());
    let calls: Arc<Vec<AtomicUsize>> = Arc::new((0..KEYS).map(|_| AtomicUsize::new(0)).collect());
    let overlaps = Arc::new(AtomicUsize::new(0));
    let workers = Workers::new(queue.clone()).count(8).spawn_threads({
        let busy = busy.clone();
        let calls = calls.clone();
        let overlaps = overlaps.clone();
        let queue = queue.clone();
        move |key: &usize| {
            if busy[*key].swap(true, Ordering::SeqCst) {
                overlaps.fetch_add(1, Ordering::SeqCst);
            }
            // Changed again while we work, a few times: it must wait for us.
            if calls[*key].fetch_add(1, Ordering::SeqCst) < READDS {
                queue.add(*key);
            }
            std::thread::yield_now();
            busy[*key].store(false, Ordering::SeqCst);
        }
    });
    for _ in 0..READDS {
        for key in 0..KEYS {
            queue.add(key);
        }
    }
    wait_until("every key is processed after its last re-add", || {
        calls.iter().all(|n| n.load(Ordering::SeqCst) > READDS)
            && queue.is_empty()
            && queue.processing_len() == 0
    });
    let summary = workers.shut_down();
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    assert!(summary.processed > (KEYS * READDS) as u64);
}

// ===== Async workers =====

#[cfg(feature = "tokio")]
mod asynchronous {
    use super::*;
    use workq::AsyncWorkers;

    async fn wait_processed_async<T>(workers: &AsyncWorkers<T>, n: u64)
    where
        T: Eq + std::hash::Hash + Clone + Send + Sync + std::fmt::Debug + 'static,
    {
        for _ in 0..100_000 {
            if workers.stats().processed >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("timed out waiting until {n} items are processed");
    }

    fn scripted_async(
        outcomes: Vec<Outcome>,
    ) -> impl Fn(&'static str) -> std::future::Ready<Outcome> + Send + Sync {
        let script = scripted(outcomes);
        move |key| std::future::ready(script(&key))
    }

    #[tokio::test]
    async fn outcomes_map_to_forget_retry_retry_after_and_give_up() {
        let (clock, queue) = fake_queue();
        let gave_up = Arc::new(AtomicUsize::new(0));
        let workers = Workers::new(queue.clone())
            .on_give_up({
                let gave_up = gave_up.clone();
                move |_| {
                    gave_up.fetch_add(1, Ordering::SeqCst);
                }
            })
            .spawn_async(scripted_async(vec![
                Outcome::Retry,
                Outcome::RetryAfter(Duration::from_secs(5)),
                Outcome::Retry,
                Outcome::GiveUp,
            ]));
        queue.add("default/web-0");
        wait_processed_async(&workers, 1).await;
        assert_eq!(queue.num_requeues(&"default/web-0"), 1);
        clock.step(BASE);
        wait_processed_async(&workers, 2).await;
        assert_eq!(queue.num_requeues(&"default/web-0"), 0);
        clock.step(Duration::from_secs(5));
        wait_processed_async(&workers, 3).await;
        assert_eq!(queue.num_requeues(&"default/web-0"), 1);
        clock.step(BASE);
        wait_processed_async(&workers, 4).await;
        assert_eq!(queue.num_requeues(&"default/web-0"), 0);
        assert_eq!(gave_up.load(Ordering::SeqCst), 1);
        queue.add("default/web-1");
        wait_processed_async(&workers, 5).await;

        let summary = workers.shut_down().await;
        assert_eq!(summary.processed, 5);
        assert_eq!(summary.retried, 3);
        assert_eq!(summary.given_up, 1);
        assert_eq!(summary.succeeded, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn panics_in_the_handler_or_its_future_are_retried() {
        let (clock, queue) = fake_queue();
        let calls = Arc::new(AtomicUsize::new(0));
        let workers = Workers::new(queue.clone()).count(1).spawn_async({
            let calls = calls.clone();
            move |key: &'static str| {
                let call = calls.fetch_add(1, Ordering::SeqCst);
                if call == 0 {
                    panic!("before the future");
                }
                async move {
                    tokio::task::yield_now().await;
                    if call == 1 {
                        panic!("inside the future: {key}");
                    }
                    Outcome::Done
                }
            }
        });
        queue.add("default/web-0");
        wait_processed_async(&workers, 1).await;
        assert_eq!(queue.processing_len(), 0);
        clock.step(BASE);
        wait_processed_async(&workers, 2).await;
        clock.step(2 * BASE);
        wait_processed_async(&workers, 3).await;
        let summary = workers.shut_down().await;
        assert_eq!(summary.panicked, 2);
        assert_eq!(summary.retried, 2);
        assert_eq!(summary.succeeded, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_handler_past_its_timeout_is_cancelled_and_retried() {
        let (clock, queue) = fake_queue();
        let calls = Arc::new(AtomicUsize::new(0));
        let workers = Workers::new(queue.clone())
            .timeout(Duration::from_secs(1))
            .spawn_async({
                let calls = calls.clone();
                move |_: &'static str| {
                    let call = calls.fetch_add(1, Ordering::SeqCst);
                    async move {
                        if call == 0 {
                            tokio::time::sleep(Duration::from_secs(3600)).await;
                        }
                    }
                }
            });
        queue.add("default/web-0");
        wait_processed_async(&workers, 1).await;
        let stats = workers.stats();
        assert_eq!((stats.timed_out, stats.retried), (1, 1));
        assert_eq!(queue.num_requeues(&"default/web-0"), 1);
        clock.step(BASE);
        wait_processed_async(&workers, 2).await;
        let summary = workers.shut_down().await;
        assert_eq!(summary.succeeded, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn shut_down_waits_for_items_in_flight() {
        let (_clock, queue) = fake_queue();
        let workers = Workers::new(queue.clone())
            .count(2)
            .spawn_async(|_: &'static str| tokio::time::sleep(Duration::from_secs(60)));
        queue.add("default/slow-0");
        queue.add("default/slow-1");
        while workers.stats().in_flight.len() < 2 {
            tokio::task::yield_now().await;
        }
        queue.add("default/queued");
        let summary = workers.shut_down().await;
        assert_eq!(summary.succeeded, 2);
        assert!(summary.is_drained());
        assert_eq!(summary.left_in_queue, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn shut_down_with_a_deadline_aborts_and_reports_items_in_flight() {
        let (_clock, queue) = fake_queue();
        let workers = Workers::new(queue.clone())
            .count(2)
            .shutdown_timeout(Duration::from_secs(5))
            .spawn_async(|key: &'static str| async move {
                if key == "default/stuck" {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
            });
        queue.add("default/quick");
        queue.add("default/stuck");
        while workers.stats().processed < 1 || workers.stats().in_flight.is_empty() {
            tokio::task::yield_now().await;
        }
        let summary = workers.shut_down().await;
        assert_eq!(summary.in_flight, vec!["default/stuck"]);
        assert_eq!(summary.succeeded, 1);
        // The aborted task dropped its lease.
        for _ in 0..100 {
            if queue.processing_len() == 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(queue.processing_len(), 0);
    }

    #[tokio::test]
    async fn run_until_stops_when_the_signal_completes() {
        let (_clock, queue) = fake_queue();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let workers = Workers::new(queue.clone())
            .count(2)
            .spawn_async(|_: &'static str| async {});
        queue.add("default/web-0");
        wait_processed_async(&workers, 1).await;
        let running = tokio::spawn(workers.run_until(stop_rx));
        tokio::task::yield_now().await;
        assert!(!queue.is_shutting_down());
        stop_tx.send(()).unwrap();
        let summary = running.await.unwrap();
        assert!(queue.is_shutting_down());
        assert_eq!(summary.succeeded, 1);
    }

    #[tokio::test]
    async fn run_until_returns_when_the_queue_is_shut_down_and_empty() {
        let (_clock, queue) = fake_queue();
        queue.add("default/web-0");
        let workers = Workers::new(queue.clone()).spawn_async(|_: &'static str| async {});
        queue.shut_down();
        let summary = workers.run_until(std::future::pending::<()>()).await;
        assert_eq!(summary.succeeded, 1);
    }

    #[tokio::test]
    async fn a_stop_token_stops_async_workers_too() {
        let (_clock, queue) = fake_queue();
        let stop = StopToken::new();
        let workers = Workers::new(queue.clone())
            .stop_token(stop.clone())
            .spawn_async(|_: &'static str| async {});
        let waiting = tokio::spawn(workers.wait());
        stop.stop();
        let summary = waiting.await.unwrap();
        assert_eq!(summary.processed, 0);
    }
}

// ===== A tracing subscriber that records events, for the give-up warning =====

mod capture {
    use std::fmt::Write as _;
    use std::sync::{Mutex, OnceLock};

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Metadata, Subscriber};

    static EVENTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

    /// Records every event as `LEVEL message field=value ...`.
    struct Recorder;

    struct Line(String);

    impl Visit for Line {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            let _ = write!(self.0, " {}={:?}", field.name(), value);
        }

        fn record_str(&mut self, field: &Field, value: &str) {
            let _ = write!(self.0, " {}={}", field.name(), value);
        }
    }

    impl Subscriber for Recorder {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }

        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }

        fn record(&self, _: &Id, _: &Record<'_>) {}

        fn record_follows_from(&self, _: &Id, _: &Id) {}

        fn event(&self, event: &Event<'_>) {
            let mut line = Line(event.metadata().level().to_string());
            event.record(&mut line);
            EVENTS.lock().unwrap().push(line.0);
        }

        fn enter(&self, _: &Id) {}

        fn exit(&self, _: &Id) {}
    }

    /// Installs the recorder for the whole test binary (events come from worker threads).
    pub(super) fn install() {
        static INSTALLED: OnceLock<()> = OnceLock::new();
        INSTALLED.get_or_init(|| {
            tracing::subscriber::set_global_default(Recorder)
                .expect("no other subscriber in this test binary");
        });
    }

    /// Every event recorded so far.
    pub(super) fn events() -> Vec<String> {
        EVENTS.lock().unwrap().clone()
    }
}

/// The trait's default `done_and_next_many` (the in-memory queue's): each lease's done, its
/// forget only where asked, and at most `max` next items, in order.
#[test]
fn done_and_next_many_by_default_steps_each_lease_in_turn() {
    use workq::{DoneMany, Queue};
    let queue: WorkQueue<&str> = WorkQueue::new();
    for item in ["a", "b", "c", "d"] {
        queue.add(item);
    }
    let a = queue.try_get().unwrap();
    let b = queue.try_get().unwrap();
    // A failure counted for each (a rate-limited re-add while processing).
    queue.add_rate_limited("a");
    queue.add_rate_limited("b");
    let step = Queue::done_and_next_many(&queue, vec![(a, true), (b, false)], 1);
    let DoneMany { done, next } = futures::executor::block_on(step).unwrap();
    assert_eq!(done.len(), 2);
    assert!(done.iter().all(Result::is_ok));
    assert_eq!(queue.num_requeues(&"a"), 0);
    assert_eq!(queue.num_requeues(&"b"), 1);
    let items: Vec<&str> = next.iter().map(|lease| *lease.item()).collect();
    assert_eq!(items, ["c"]);
    assert_eq!(queue.processing_len(), 1);
    assert_eq!(Queue::batch_limit(&queue), 1);
}

/// `Duration::MAX` in every duration a pool takes means "no limit", and nothing panics: a
/// per-item timeout and a shutdown timeout of `Duration::MAX` (async workers), a handler's
/// `RetryAfter(Duration::MAX)`, and a rate limiter whose delays are `Duration::MAX`.
#[cfg(feature = "tokio")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_max_settings_mean_no_limit_for_async_workers() {
    let clock = FakeClock::new();
    let queue: WorkQueue<&'static str> = WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(ExponentialFailure::new(Duration::MAX, Duration::MAX))
        .build();
    let workers = Workers::new(queue.clone())
        .count(2)
        .timeout(Duration::MAX)
        .shutdown_timeout(Duration::MAX)
        .spawn_async(|key: &'static str| async move {
            match key {
                "later" => Outcome::RetryAfter(Duration::MAX),
                "retry" => Outcome::Retry,
                _ => Outcome::Done,
            }
        });
    for key in ["done", "later", "retry"] {
        queue.add(key);
    }
    let start = Instant::now();
    while workers.stats().processed < 3 {
        assert!(start.elapsed() < GENEROUS, "the workers stalled");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(queue.delayed_len(), 2);
    clock.step(Duration::MAX);
    assert_eq!(queue.len(), 0, "a century later, still waiting");
    let summary = workers.shut_down().await;
    assert_eq!((summary.succeeded, summary.retried), (1, 2));
    assert!(summary.is_drained());
    let mut unfinished = summary.unfinished.clone();
    unfinished.sort_unstable();
    assert_eq!(unfinished, ["later", "retry"]);
}

/// A thread pool's `shutdown_timeout(Duration::MAX)` is no limit: the wait waits for the
/// item in flight.
#[test]
fn duration_max_shutdown_timeout_means_no_limit_for_thread_workers() {
    let queue: WorkQueue<&'static str> = WorkQueue::new();
    let (started_tx, started_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    let workers = Workers::new(queue.clone())
        .shutdown_timeout(Duration::MAX)
        .spawn_threads(move |_: &&str| {
            let _ = started_tx.send(());
            let _ = release_rx.lock().unwrap().recv();
        });
    queue.add("slow");
    started_rx.recv().unwrap();
    workers.stop();
    let waiting = std::thread::spawn(move || workers.wait());
    std::thread::sleep(Duration::from_millis(20));
    assert!(
        !waiting.is_finished(),
        "the wait gave up on the item in flight"
    );
    release_tx.send(()).unwrap();
    let summary = waiting.join().unwrap();
    assert_eq!(summary.succeeded, 1);
    assert!(summary.is_drained());
}
