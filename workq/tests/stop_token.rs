//! `StopToken`: blocked threads and awaiting tasks share one wait list, and one `stop` wakes
//! them all.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::task::noop_waker;
use workq::StopToken;

#[test]
fn wait_timeout_returns_false_when_nobody_stops() {
    let stop = StopToken::new();
    assert!(!stop.wait_timeout(Duration::from_millis(20)));
    assert!(!stop.is_stopped());
}

#[test]
fn wait_timeout_returns_true_at_once_when_stopped() {
    let stop = StopToken::new();
    stop.stop();
    assert!(stop.wait_timeout(Duration::from_secs(3600)));
    stop.wait(); // returns too
}

#[test]
fn a_stop_wakes_blocked_threads_and_awaiting_tasks_alike() {
    let stop = StopToken::new();
    let mut handles = Vec::new();
    for n in 0..6 {
        let stop = stop.clone();
        handles.push(std::thread::spawn(move || match n % 3 {
            0 => {
                stop.wait();
                true
            }
            1 => stop.wait_timeout(Duration::from_secs(3600)),
            _ => {
                futures::executor::block_on(stop.stopped());
                true
            }
        }));
    }
    // Let them register (not required for correctness: a late waiter sees the flag).
    std::thread::sleep(Duration::from_millis(20));
    let started = Instant::now();
    stop.stop();
    for handle in handles {
        assert!(handle.join().unwrap());
    }
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[test]
fn a_dropped_stopped_future_leaves_the_others_registered() {
    let stop = StopToken::new();
    let waker = noop_waker();
    let mut cx = Context::from_waker(&waker);
    {
        let mut dropped = pin!(stop.stopped());
        assert_eq!(dropped.as_mut().poll(&mut cx), Poll::Pending);
    }
    let mut kept = pin!(stop.stopped());
    assert_eq!(kept.as_mut().poll(&mut cx), Poll::Pending);
    let waiter = {
        let stop = stop.clone();
        std::thread::spawn(move || stop.wait())
    };
    std::thread::sleep(Duration::from_millis(10));
    stop.stop();
    waiter.join().unwrap();
    assert_eq!(kept.as_mut().poll(&mut cx), Poll::Ready(()));
}
