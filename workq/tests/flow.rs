//! Flow control through the queue's handle: getters held back by a limit or a token sleep
//! and wake when a lease is dropped or the token is due (on a fake clock, and on the real
//! one through the timer), limits hold under concurrent getters and leases dropped by other
//! threads, shut down keeps the limits and the pace, and the metrics report the groups.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use workq::clock::FakeClock;
use workq::{TryGetError, WorkQueue};

fn grouped() -> workq::Builder<String> {
    WorkQueue::builder()
        .group_by(|key: &String| key.split_once('/').map_or("", |(ns, _)| ns).to_owned())
}

/// Receives within a generous bound, or fails naming what was awaited.
fn recv<T>(rx: &mpsc::Receiver<T>, what: &str) -> T {
    rx.recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("{what} did not happen"))
}

#[test]
fn a_getter_held_back_by_a_group_limit_wakes_when_a_lease_is_dropped() {
    let queue = grouped().max_in_flight_per_group(1).build();
    queue.add("a/1".to_owned());
    queue.add("a/2".to_owned());
    let first = queue.try_get().unwrap();
    assert_eq!(queue.try_get().unwrap_err(), TryGetError::Empty);
    assert_eq!(queue.len(), 1, "the held-back item is still queued");
    let (tx, rx) = mpsc::channel();
    let getter = {
        let queue = queue.clone();
        thread::spawn(move || {
            tx.send(queue.blocking_get().map(|l| l.item().clone()))
                .unwrap();
        })
    };
    assert!(
        rx.recv_timeout(Duration::from_millis(50)).is_err(),
        "the getter waits while the group is at its limit"
    );
    drop(first);
    assert_eq!(recv(&rx, "the wake-up").as_deref(), Some("a/2"));
    getter.join().unwrap();
}

#[test]
fn an_async_getter_held_back_by_the_queue_wide_limit_wakes_when_a_lease_is_dropped() {
    let queue: WorkQueue<String> = WorkQueue::builder().max_in_flight(1).build();
    queue.add("x".to_owned());
    queue.add("y".to_owned());
    let first = queue.try_get().unwrap();
    let (tx, rx) = mpsc::channel();
    let getter = {
        let queue = queue.clone();
        thread::spawn(move || {
            let lease = futures::executor::block_on(queue.get());
            tx.send(lease.map(|l| l.item().clone())).unwrap();
        })
    };
    assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
    first.done();
    assert_eq!(recv(&rx, "the wake-up").as_deref(), Some("y"));
    getter.join().unwrap();
}

#[test]
fn a_getter_waiting_for_a_token_wakes_when_the_fake_clock_reaches_it() {
    let clock = FakeClock::new();
    let queue: WorkQueue<String> = WorkQueue::builder()
        .clock(clock.clone())
        .hand_out_rate(10.0, 1)
        .build();
    for item in ["a", "b"] {
        queue.add(item.to_owned());
    }
    drop(queue.try_get().unwrap());
    assert_eq!(queue.try_get().unwrap_err(), TryGetError::Empty);
    let (tx, rx) = mpsc::channel();
    let getter = {
        let queue = queue.clone();
        thread::spawn(move || {
            tx.send(queue.blocking_get().map(|l| l.item().clone()))
                .unwrap();
        })
    };
    clock.step(Duration::from_millis(99));
    assert!(
        rx.recv_timeout(Duration::from_millis(50)).is_err(),
        "no token yet"
    );
    clock.step(Duration::from_millis(1));
    assert_eq!(recv(&rx, "the token").as_deref(), Some("b"));
    getter.join().unwrap();
}

#[test]
fn a_getter_waiting_for_a_token_sleeps_until_the_timer_wakes_it() {
    // The real clock: the timer thread serves tokens. Only a lower bound is asserted (the
    // pace); how soon after the token the getter runs is the benchmark's business.
    let queue: WorkQueue<String> = WorkQueue::builder().hand_out_rate(50.0, 1).build();
    for i in 0..4 {
        queue.add(format!("item-{i}"));
    }
    let start = Instant::now();
    for _ in 0..4 {
        drop(queue.blocking_get().unwrap());
    }
    assert!(
        start.elapsed() >= Duration::from_millis(59),
        "4 hand-outs at 50/s with a burst of 1 take 60 ms, took {:?}",
        start.elapsed()
    );
}

#[test]
fn a_group_out_of_tokens_leaves_the_turns_to_the_others() {
    let clock = FakeClock::new();
    let queue = grouped()
        .clock(clock.clone())
        .group_hand_out_rate("slow", 1.0, 1)
        .build();
    for i in 0..3 {
        queue.add(format!("slow/{i}"));
        queue.add(format!("fast/{i}"));
    }
    let order: Vec<String> = std::iter::from_fn(|| queue.try_get().ok())
        .map(|lease| lease.item().clone())
        .collect();
    assert_eq!(order, ["slow/0", "fast/0", "fast/1", "fast/2"]);
    clock.step(Duration::from_secs(1));
    assert_eq!(queue.try_get().unwrap().item(), "slow/1");
}

#[test]
fn after_shut_down_the_items_still_queued_keep_the_limits_and_the_pace() {
    let clock = FakeClock::new();
    let queue: WorkQueue<String> = WorkQueue::builder()
        .clock(clock.clone())
        .max_in_flight(1)
        .hand_out_rate(1.0, 1)
        .build();
    queue.add("a".to_owned());
    queue.add("b".to_owned());
    queue.shut_down();
    let a = queue.try_get().unwrap();
    assert_eq!(queue.try_get().unwrap_err(), TryGetError::Empty, "limit");
    drop(a);
    assert_eq!(
        queue.try_get().unwrap_err(),
        TryGetError::Empty,
        "no token yet"
    );
    clock.step(Duration::from_secs(1));
    drop(queue.try_get().unwrap());
    assert_eq!(queue.try_get().unwrap_err(), TryGetError::ShutDown);
}

#[test]
fn shut_down_with_a_real_clock_and_a_rate_still_hands_out_the_queued_items() {
    let queue: WorkQueue<String> = WorkQueue::builder().hand_out_rate(100.0, 1).build();
    for i in 0..3 {
        queue.add(format!("item-{i}"));
    }
    queue.shut_down();
    let mut got = 0;
    while let Some(lease) = queue.blocking_get() {
        drop(lease);
        got += 1;
    }
    assert_eq!(got, 3);
}

/// Many getters, leases dropped by other threads at random moments (a lease ending as an
/// expired one would), and re-adds: no group ever has more than its limit out, nor the
/// queue more than its own, and every item is handed out.
#[test]
fn limits_hold_under_concurrent_getters_and_leases_dropped_elsewhere() {
    const GROUPS: usize = 5;
    const PER_GROUP: usize = 2;
    const MAX: usize = 6;
    const ITEMS: usize = 2_000;
    let queue = grouped()
        .max_in_flight(MAX)
        .max_in_flight_per_group(PER_GROUP)
        .group_max_in_flight("g0", 1)
        .build();
    let out: Arc<Vec<AtomicUsize>> = Arc::new((0..GROUPS).map(|_| AtomicUsize::new(0)).collect());
    let total = Arc::new(AtomicUsize::new(0));
    let violations = Arc::new(Mutex::new(Vec::new()));
    let handed = Arc::new(AtomicUsize::new(0));
    let (reaper_tx, reaper_rx) = mpsc::channel::<(workq::Lease<String>, usize)>();
    let reaper = {
        let (out, total) = (out.clone(), total.clone());
        thread::spawn(move || {
            for (lease, group) in reaper_rx {
                out[group].fetch_sub(1, Ordering::SeqCst);
                total.fetch_sub(1, Ordering::SeqCst);
                drop(lease);
            }
        })
    };
    let getters: Vec<_> = (0..4)
        .map(|_| {
            let queue = queue.clone();
            let (out, total, violations, handed) = (
                out.clone(),
                total.clone(),
                violations.clone(),
                handed.clone(),
            );
            let reaper = reaper_tx.clone();
            thread::spawn(move || {
                while let Some(lease) = queue.blocking_get() {
                    let group: usize = lease.item()[1..2].parse().unwrap();
                    let now = out[group].fetch_add(1, Ordering::SeqCst) + 1;
                    let all = total.fetch_add(1, Ordering::SeqCst) + 1;
                    let limit = if group == 0 { 1 } else { PER_GROUP };
                    if now > limit || all > MAX {
                        violations.lock().unwrap().push((group, now, all));
                    }
                    handed.fetch_add(1, Ordering::SeqCst);
                    // Half the leases end here, half on the reaper thread.
                    if handed.load(Ordering::Relaxed) % 2 == 0 {
                        out[group].fetch_sub(1, Ordering::SeqCst);
                        total.fetch_sub(1, Ordering::SeqCst);
                        drop(lease);
                    } else {
                        reaper.send((lease, group)).unwrap();
                    }
                }
            })
        })
        .collect();
    drop(reaper_tx);
    for i in 0..ITEMS {
        queue.add(format!("g{}/{i}", i % GROUPS));
    }
    while handed.load(Ordering::SeqCst) < ITEMS {
        thread::yield_now();
    }
    queue.shut_down();
    for getter in getters {
        getter.join().unwrap();
    }
    reaper.join().unwrap();
    assert_eq!(handed.load(Ordering::SeqCst), ITEMS);
    assert!(
        violations.lock().unwrap().is_empty(),
        "{:?}",
        violations.lock().unwrap()
    );
    assert_eq!(queue.tracked_len(), 0);
}

#[test]
fn a_noisy_group_does_not_hold_back_a_quiet_groups_item() {
    let queue = grouped().build();
    for i in 0..10_000 {
        queue.add(format!("noisy/{i}"));
    }
    queue.add("quiet/only".to_owned());
    let position = (0..)
        .map(|_| queue.try_get().unwrap())
        .position(|lease| lease.item() == "quiet/only")
        .unwrap();
    assert_eq!(
        position, 1,
        "the quiet group's item comes second, not 10,001st"
    );
}

#[test]
fn flow_stats_and_top_groups_report_the_groups() {
    let queue = grouped().max_in_flight_per_group(1).build();
    assert_eq!(WorkQueue::<String>::new().flow_stats(), None);
    for i in 0..3 {
        queue.add(format!("big/{i}"));
    }
    queue.add("small/0".to_owned());
    let leases: Vec<_> = std::iter::from_fn(|| queue.try_get().ok()).collect();
    assert_eq!(leases.len(), 2);
    let stats = queue.flow_stats().unwrap();
    assert_eq!(
        (stats.groups_ready, stats.groups_saturated, stats.groups),
        (1, 2, 2)
    );
    let top: HashMap<String, (usize, usize)> = queue
        .top_groups(10)
        .into_iter()
        .map(|g| (g.name, (g.ready, g.in_flight)))
        .collect();
    assert_eq!(top["big"], (2, 1));
    assert_eq!(top["small"], (0, 1));
    assert_eq!(queue.top_groups(1)[0].name, "big");
}

#[test]
#[should_panic(expected = "max_in_flight must be at least 1")]
fn a_zero_limit_is_refused() {
    let _ = WorkQueue::<String>::builder().max_in_flight(0);
}

#[test]
#[should_panic(expected = "positive number of items per second")]
fn a_nonsense_rate_is_refused() {
    let _ = WorkQueue::<String>::builder().hand_out_rate(f64::NAN, 1);
}

/// One clock step makes two tokens due while two getters wait: the step wakes one getter,
/// and its hand-out, which leaves an item behind, wakes the other (no lease is dropped to
/// do it).
#[test]
fn a_step_that_makes_two_tokens_due_serves_two_waiting_getters() {
    let clock = FakeClock::new();
    let queue: WorkQueue<String> = WorkQueue::builder()
        .clock(clock.clone())
        .hand_out_rate(1.0, 2)
        .build();
    for item in ["a", "b"] {
        queue.add(item.to_owned());
        drop(queue.try_get().unwrap());
    }
    queue.add("c".to_owned());
    queue.add("d".to_owned());
    let (tx, rx) = mpsc::channel();
    let getters: Vec<_> = (0..2)
        .map(|_| {
            let (queue, tx) = (queue.clone(), tx.clone());
            // The leases are kept (sent, not dropped): a done would wake the other getter.
            thread::spawn(move || tx.send(queue.blocking_get()).unwrap())
        })
        .collect();
    // Let both park (a spinning getter finds no token either way).
    thread::sleep(Duration::from_millis(100));
    clock.step(Duration::from_secs(2));
    let first = recv(&rx, "the first token").unwrap();
    let second = recv(&rx, "the second token").unwrap();
    let mut got = vec![first.item().clone(), second.item().clone()];
    got.sort();
    assert_eq!(got, ["c", "d"]);
    for getter in getters {
        getter.join().unwrap();
    }
}
