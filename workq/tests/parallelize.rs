//! `parallelize_until` and `Parallelizer`: client-go's `TestParallelizeUntil` cases, plus
//! the rules its tests leave out (stopping, zero workers or pieces, panics).

use std::collections::HashSet;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use workq::{Parallelizer, StopToken, parallelize_until};

/// Runs `pieces` pieces and returns how often each one ran.
fn visits(workers: usize, pieces: usize, chunk_size: usize) -> Vec<usize> {
    let counts: Vec<AtomicUsize> = (0..pieces).map(|_| AtomicUsize::new(0)).collect();
    let ran = Parallelizer::new(workers)
        .chunk_size(chunk_size)
        .stop_on(&StopToken::new())
        .run(pieces, |piece| {
            counts[piece].fetch_add(1, Ordering::Relaxed);
        });
    assert_eq!(ran, pieces);
    counts.into_iter().map(AtomicUsize::into_inner).collect()
}

// client-go: parallelizer_test.go TestParallelizeUntil.
#[test]
fn every_piece_runs_exactly_once() {
    for (pieces, workers, chunk_size) in [
        (1000, 10, 1),
        (1000, 10, 10),
        (1000, 10, 100),
        (999, 10, 13),
    ] {
        let counts = visits(workers, pieces, chunk_size);
        assert!(
            counts.iter().all(|&n| n == 1),
            "pieces {pieces}, workers {workers}, chunk {chunk_size}: {counts:?}"
        );
    }
}

#[test]
fn a_chunk_size_below_one_means_one() {
    assert!(visits(4, 50, 0).iter().all(|&n| n == 1));
}

#[test]
fn no_pieces_or_no_workers_run_nothing() {
    let ran = AtomicUsize::new(0);
    let work = |_| {
        ran.fetch_add(1, Ordering::Relaxed);
    };
    assert_eq!(parallelize_until(&StopToken::new(), 4, 0, work), 0);
    assert_eq!(parallelize_until(&StopToken::new(), 0, 10, work), 0);
    assert_eq!(ran.load(Ordering::Relaxed), 0);
}

#[test]
fn no_more_workers_run_than_there_are_chunks() {
    let threads = Mutex::new(HashSet::new());
    Parallelizer::new(16).chunk_size(4).run(10, |_| {
        threads.lock().unwrap().insert(std::thread::current().id());
        std::thread::yield_now();
    });
    assert!(threads.lock().unwrap().len() <= 3); // ceil(10 / 4) chunks
}

#[test]
fn the_calling_thread_is_one_of_the_workers() {
    let caller = std::thread::current().id();
    let on_caller = AtomicUsize::new(0);
    Parallelizer::new(1).run(5, |_| {
        if std::thread::current().id() == caller {
            on_caller.fetch_add(1, Ordering::Relaxed);
        }
    });
    assert_eq!(on_caller.load(Ordering::Relaxed), 5);
}

#[test]
fn a_stopped_token_runs_nothing() {
    let stop = StopToken::new();
    stop.stop();
    assert_eq!(parallelize_until(&stop, 4, 100, |_| unreachable!()), 0);
}

#[test]
fn the_stop_signal_is_checked_before_each_piece() {
    let stop = StopToken::new();
    let ran = AtomicUsize::new(0);
    // One worker, so the order is known: piece 10 stops the run, and no piece after it
    // starts.
    let done = parallelize_until(&stop, 1, 100, |piece| {
        ran.fetch_add(1, Ordering::Relaxed);
        if piece == 10 {
            stop.stop();
        }
    });
    assert_eq!(done, 11);
    assert_eq!(ran.load(Ordering::Relaxed), 11);
}

#[test]
fn stopping_mid_run_abandons_the_rest_with_many_workers() {
    let stop = StopToken::new();
    let counts: Vec<AtomicUsize> = (0..10_000).map(|_| AtomicUsize::new(0)).collect();
    let done = parallelize_until(&stop, 4, counts.len(), |piece| {
        counts[piece].fetch_add(1, Ordering::Relaxed);
        if piece == 100 {
            stop.stop();
        }
    });
    let visited = counts
        .iter()
        .filter(|n| n.load(Ordering::Relaxed) > 0)
        .count();
    assert!(counts.iter().all(|n| n.load(Ordering::Relaxed) <= 1));
    assert_eq!(done, visited);
    assert!(done < counts.len());
}

#[test]
fn a_panic_stops_the_run_and_reaches_the_caller() {
    let ran = AtomicUsize::new(0);
    let result = panic::catch_unwind(AssertUnwindSafe(|| {
        Parallelizer::new(1).run(100, |piece| {
            ran.fetch_add(1, Ordering::Relaxed);
            if piece == 5 {
                panic!("piece {piece} failed");
            }
        })
    }));
    let payload = result.unwrap_err();
    assert_eq!(payload.downcast_ref::<String>().unwrap(), "piece 5 failed");
    assert_eq!(ran.load(Ordering::Relaxed), 6);
}

#[test]
fn work_may_borrow_from_the_caller() {
    let words = ["default/web-0", "default/web-1", "kube-system/dns"];
    let lengths: Vec<AtomicUsize> = words.iter().map(|_| AtomicUsize::new(0)).collect();
    Parallelizer::new(2).run(words.len(), |piece| {
        lengths[piece].store(words[piece].len(), Ordering::Relaxed);
    });
    let lengths: Vec<usize> = lengths.into_iter().map(AtomicUsize::into_inner).collect();
    assert_eq!(lengths, [13, 13, 15]);
}
