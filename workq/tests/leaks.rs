//! No leaks, no growth: after many cycles the queue's and the limiters' maps are empty again,
//! resident memory is back near where it started, and dropping the last handle of a queue
//! ends its background work and frees its items.
//!
//! Resident memory comes from `/proc/self/statm` (Linux; elsewhere those checks are skipped).
//! The thresholds are tolerant: a few MiB over the baseline, where a leak of even a few bytes
//! per cycle would show up as tens of MiB. The tests in this file take one lock so that no
//! other test allocates while one of them measures.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use workq::WorkQueue;
use workq::clock::FakeClock;
use workq::rate_limiter::{ExponentialFailure, FastSlow, MaxOf, RateLimiter};

/// Cycles per run.
const CYCLES: usize = 1_000_000;

/// Distinct keys the cycles go round.
const KEYS: usize = 1_000;

/// How far resident memory may end above its baseline.
const TOLERANCE: usize = 4 << 20;

/// Serialises the tests of this file (see the module docs).
fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Resident memory in bytes, or `None` where `/proc/self/statm` does not exist.
fn resident() -> Option<usize> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: usize = statm.split_whitespace().nth(1)?.parse().ok()?;
    // The page size is 4 KiB on every Linux target this crate's CI runs; a larger page only
    // makes the figure bigger, never hides growth.
    Some(pages * 4096)
}

/// Fails if resident memory grew more than [`TOLERANCE`] since `baseline`.
fn assert_back_near(baseline: Option<usize>, what: &str) {
    let (Some(baseline), Some(now)) = (baseline, resident()) else {
        eprintln!("{what}: no /proc/self/statm, resident memory not checked");
        return;
    };
    let grown = now.saturating_sub(baseline);
    eprintln!(
        "{what}: resident {} KiB, baseline {} KiB, grown {} KiB",
        now >> 10,
        baseline >> 10,
        grown >> 10
    );
    assert!(
        grown <= TOLERANCE,
        "{what}: resident memory grew {} KiB over its baseline ({} KiB)",
        grown >> 10,
        baseline >> 10
    );
}

/// `rounds` rounds of: add every key, take and drop every lease.
fn add_get_done_rounds(queue: &WorkQueue<u64>, rounds: usize) {
    for _ in 0..rounds {
        for key in 0..KEYS as u64 {
            queue.add(key);
        }
        while let Ok(lease) = queue.try_get() {
            drop(lease);
        }
    }
}

#[test]
fn a_million_add_get_done_cycles_leave_nothing_behind() {
    let _exclusive = exclusive();
    let queue: WorkQueue<u64> = WorkQueue::new();
    // Warm up first, so the baseline includes the queue's steady-state capacity.
    add_get_done_rounds(&queue, 10);
    let baseline = resident();

    add_get_done_rounds(&queue, CYCLES / KEYS);

    assert_eq!(queue.tracked_len(), 0);
    assert_eq!(queue.len(), 0);
    assert_eq!(queue.delayed_len(), 0);
    assert_eq!(queue.processing_len(), 0);
    assert_back_near(baseline, "add/get/done cycles");
}

#[test]
fn re_adds_while_processing_leave_nothing_behind() {
    let _exclusive = exclusive();
    let queue: WorkQueue<u64> = WorkQueue::new();
    let cycle = |queue: &WorkQueue<u64>| {
        for key in 0..KEYS as u64 {
            queue.add(key);
        }
        // Take every item and re-add it while its lease is out: each comes back once.
        let leases: Vec<_> = std::iter::from_fn(|| queue.try_get().ok()).collect();
        for lease in &leases {
            queue.add(**lease);
        }
        drop(leases);
        while let Ok(lease) = queue.try_get() {
            drop(lease);
        }
    };
    for _ in 0..10 {
        cycle(&queue);
    }
    let baseline = resident();
    for _ in 0..CYCLES / KEYS / 2 {
        cycle(&queue);
    }
    assert_eq!(queue.tracked_len(), 0);
    assert_back_near(baseline, "re-add while processing cycles");
}

#[test]
fn rate_limited_and_forget_cycles_empty_the_limiters_and_the_queue() {
    let _exclusive = exclusive();
    let clock = FakeClock::new();
    let exponential = Arc::new(ExponentialFailure::new(
        Duration::from_millis(1),
        Duration::from_secs(1),
    ));
    let fast_slow = Arc::new(FastSlow::new(
        Duration::from_millis(1),
        Duration::from_millis(10),
        3,
    ));
    let limiter: MaxOf<u64> = MaxOf::new(vec![
        Box::new(exponential.clone()) as Box<dyn RateLimiter<u64>>,
        Box::new(fast_slow.clone()),
    ]);
    let queue: WorkQueue<u64> = WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(limiter)
        .build();

    // One round: every key fails twice (two rate-limited adds, the second while its lease
    // is out), then succeeds and is forgotten.
    let round = |queue: &WorkQueue<u64>| {
        for key in 0..KEYS as u64 {
            queue.add_rate_limited(key);
        }
        assert_eq!(exponential.tracked(), KEYS);
        clock.step(Duration::from_millis(1));
        let leases: Vec<_> = std::iter::from_fn(|| queue.try_get().ok()).collect();
        assert_eq!(leases.len(), KEYS);
        for lease in &leases {
            queue.add_rate_limited(**lease);
        }
        drop(leases);
        clock.step(Duration::from_millis(10));
        while let Ok(lease) = queue.try_get() {
            assert_eq!(queue.num_requeues(&lease), 2);
            queue.forget(&lease);
            drop(lease);
        }
    };
    for _ in 0..10 {
        round(&queue);
    }
    let baseline = resident();
    for _ in 0..CYCLES / KEYS / 2 {
        round(&queue);
    }

    assert_eq!(
        exponential.tracked(),
        0,
        "ExponentialFailure keeps forgotten items"
    );
    assert_eq!(fast_slow.tracked(), 0, "FastSlow keeps forgotten items");
    assert_eq!(queue.tracked_len(), 0);
    assert_eq!(queue.delayed_len(), 0);
    assert_back_near(baseline, "add_rate_limited/forget cycles");
}

/// One burst: `items` distinct items, half queued and half delayed, then all handed out.
fn burst(queue: &WorkQueue<u64>, clock: &FakeClock, items: u64) {
    for item in 0..items {
        if item.is_multiple_of(2) {
            queue.add(item);
        } else {
            queue.add_after(item, Duration::from_secs(1 + item % 60));
        }
    }
    clock.step(Duration::from_secs(60));
    assert_eq!(queue.len(), items as usize);
    while let Ok(lease) = queue.try_get() {
        drop(lease);
    }
    assert_eq!(queue.tracked_len(), 0);
}

/// A queue that held a million items gives most of that memory back once empty, and bursts
/// that follow reuse it instead of growing. (How much of a freed heap the allocator returns
/// to the system is its own business, so the first check allows half of the peak; the
/// second is the leak check.)
#[test]
fn bursts_of_distinct_items_give_their_memory_back() {
    let _exclusive = exclusive();
    const BURST: u64 = if cfg!(debug_assertions) {
        100_000
    } else {
        1_000_000
    };
    let clock = FakeClock::new();
    let queue: WorkQueue<u64> = WorkQueue::builder().clock(clock.clone()).build();
    burst(&queue, &clock, 1_000);
    let baseline = resident();

    for item in 0..BURST {
        queue.add(item);
    }
    let peak = resident();
    while let Ok(lease) = queue.try_get() {
        drop(lease);
    }
    assert_eq!(queue.tracked_len(), 0);
    if let (Some(baseline), Some(peak), Some(now)) = (baseline, peak, resident()) {
        let held = peak.saturating_sub(baseline);
        let kept = now.saturating_sub(baseline);
        eprintln!(
            "{BURST} items: peak {} KiB over baseline, {} KiB kept once empty",
            held >> 10,
            kept >> 10
        );
        assert!(
            kept <= TOLERANCE.max(held / 2),
            "an empty queue kept {} KiB of the {} KiB it needed for {BURST} items",
            kept >> 10,
            held >> 10
        );
    }

    burst(&queue, &clock, BURST);
    let after_one = resident();
    for _ in 0..3 {
        burst(&queue, &clock, BURST);
    }
    assert_back_near(after_one, "repeated bursts of distinct items");
}

/// A recorder that records nothing: it makes a named queue keep its metrics timestamps.
struct Silent;

impl workq::metrics::MetricsProvider for Silent {
    fn new_queue(
        &self,
        _name: &str,
        _probe: workq::metrics::QueueProbe,
    ) -> Box<dyn workq::metrics::QueueMetrics> {
        struct Nothing;
        impl workq::metrics::QueueMetrics for Nothing {}
        Box::new(Nothing)
    }
}

/// Runs `body` in a child process of this test binary (the test named `name`, alone), with
/// glibc's dynamic mmap threshold fixed. Freeing a large block raises glibc's threshold for
/// the rest of the process, after which freed memory stays in its heap and resident memory
/// says more about the allocator's history (and the order tests ran in) than about the
/// queue; in a fresh process with a fixed threshold every large block the queue frees goes
/// back to the system. Elsewhere the variable is ignored and the checks stay tolerant.
fn in_fresh_process(name: &str, body: impl FnOnce()) {
    const CHILD: &str = "WORKQUEUE_LEAKS_CHILD";
    if std::env::var_os(CHILD).is_some() {
        body();
        return;
    }
    let status = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("MALLOC_MMAP_THRESHOLD_", "65536")
        .status()
        .expect("cannot run the test binary again");
    assert!(status.success(), "{name} failed in its own process");
}

/// A controller's queue is never empty: one resync key waits for its periodic `add_after`
/// all the time. After a burst of a million items (queued, delayed and raised in priority,
/// on a queue that keeps metrics timestamps) is handed out, most of the memory must come
/// back anyway, and further bursts must not grow it.
#[test]
fn a_burst_gives_its_memory_back_while_a_resync_key_waits() {
    let _exclusive = exclusive();
    in_fresh_process(
        "a_burst_gives_its_memory_back_while_a_resync_key_waits",
        burst_with_a_resync_key,
    );
}

fn burst_with_a_resync_key() {
    const BURST: u64 = if cfg!(debug_assertions) {
        100_000
    } else {
        1_000_000
    };
    const RESYNC: u64 = u64::MAX;
    let clock = FakeClock::new();
    let queue: WorkQueue<u64> = WorkQueue::builder()
        .name("resync")
        .metrics(Silent)
        .clock(clock.clone())
        .build();
    let one_burst = || {
        queue.add_after(RESYNC, Duration::from_secs(3600));
        for item in 0..BURST {
            match item % 4 {
                0 => queue.add_after(item, Duration::from_secs(1 + item % 60)),
                1 => {
                    queue.add_with(item, workq::AddOptions::default().priority(-1));
                    queue.add_with(item, workq::AddOptions::default().priority(1));
                }
                _ => queue.add(item),
            }
        }
        let peak = resident();
        clock.step(Duration::from_secs(60));
        let mut handed = 0u64;
        while let Ok(lease) = queue.try_get() {
            handed += 1;
            drop(lease);
        }
        assert_eq!(handed, BURST);
        assert_eq!(queue.tracked_len(), 1, "only the resync key is left");
        assert_eq!(queue.delayed_len(), 1);
        peak
    };
    // Warm up, so the baseline includes the steady-state capacity of small bursts.
    for item in 0..1_000u64 {
        queue.add(item);
    }
    while let Ok(lease) = queue.try_get() {
        drop(lease);
    }
    let baseline = resident();
    let peak = one_burst();
    let after = resident();
    if let (Some(baseline), Some(peak), Some(after)) = (baseline, peak, after) {
        let held = peak.saturating_sub(baseline);
        let kept = after.saturating_sub(baseline);
        eprintln!(
            "{BURST} items with a resync key waiting: peak {} KiB over baseline, {} KiB kept \
             after the burst",
            held >> 10,
            kept >> 10
        );
        assert!(
            kept <= TOLERANCE.max(held / 2),
            "a queue holding one delayed key kept {} KiB of the {} KiB it needed for {BURST} \
             items",
            kept >> 10,
            held >> 10
        );
    }
    let after_one = resident();
    one_burst();
    one_burst();
    assert_back_near(after_one, "repeated bursts with a resync key waiting");
}

/// Raising an item's priority leaves a stale reference in its old priority's queue. A
/// priority that is starved (a higher one always has items) must not pile them up.
#[test]
fn stale_references_of_a_starved_priority_do_not_pile_up() {
    let _exclusive = exclusive();
    let queue: WorkQueue<u64> = WorkQueue::builder().clock(FakeClock::new()).build();
    const KEEP: u64 = u64::MAX;
    queue.add(KEEP); // priority 0, always queued: the queue is never empty
    let cycle = |key: u64| {
        queue.add_with(key, workq::AddOptions::default().priority(-100));
        queue.add_with(key, workq::AddOptions::default().priority(5));
        let lease = queue.try_get().unwrap();
        assert_eq!(*lease, key);
    };
    for key in 0..10_000 {
        cycle(key);
    }
    let baseline = resident();
    // Each cycle would leave one 4-byte reference behind: 16 MiB over the tolerance.
    for key in 0..4 * CYCLES as u64 {
        cycle(key);
    }
    assert_eq!(queue.len(), 1);
    assert_back_near(baseline, "priority raises with a starved priority");
}

/// Names of this process's threads that belong to a queue's delay timer.
fn timer_threads() -> Option<usize> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    Some(
        tasks
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .filter(|name| name.starts_with("workq-time"))
            .count(),
    )
}

/// Waits up to a generous deadline for the number of timer threads to reach `expected`
/// (the kernel's task list can lag a thread's exit by a moment).
fn wait_for_timer_threads(expected: usize) -> Option<usize> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let count = timer_threads()?;
        if count == expected || Instant::now() > deadline {
            return Some(count);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn dropping_the_last_handle_ends_the_timer_and_frees_delayed_items() {
    let _exclusive = exclusive();
    let before = timer_threads();
    let item = Arc::new("default/web-0".to_owned());
    let queue: WorkQueue<Arc<String>> = WorkQueue::new();
    queue.add_after(item.clone(), Duration::from_secs(3600));
    let other_handle = queue.clone();
    assert_eq!(queue.delayed_len(), 1);
    if let Some(before) = before {
        assert_eq!(wait_for_timer_threads(before + 1), Some(before + 1));
    }
    wait_until_timers_sleep();

    drop(queue);
    // Another handle is alive: the timer keeps running.
    if let Some(before) = before {
        assert_eq!(timer_threads(), Some(before + 1));
    }
    drop(other_handle);

    // The last handle joined the timer thread before returning.
    if let Some(before) = before {
        assert_eq!(wait_for_timer_threads(before), Some(before));
    }
    assert_eq!(
        Arc::strong_count(&item),
        1,
        "the queue still holds its item"
    );
}

/// Waits until every timer thread is asleep (state `S` in `/proc/self/task/*/stat`), so that
/// a test proves the drop *wakes* the timer rather than racing its first loop.
fn wait_until_timers_sleep() {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return;
        };
        let awake = tasks.filter_map(Result::ok).any(|task| {
            let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            // The state follows the parenthesised name: "tid (comm) S ...".
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            name.starts_with("workq-time") && !state.starts_with('S')
        });
        if !awake {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn dropping_the_last_handle_with_a_lease_out_ends_the_sleeping_timer() {
    let _exclusive = exclusive();
    let before = timer_threads();
    let queue: WorkQueue<u64> = WorkQueue::new();
    queue.add_after(1, Duration::from_secs(3600));
    queue.add_after(2, Duration::from_millis(1));
    // The timer thread promotes 2 and wakes this getter: it is running its loop.
    let lease = queue.blocking_get().unwrap();
    assert_eq!(*lease, 2);
    // Now it sleeps until 1 is due, an hour from now.
    wait_until_timers_sleep();
    if let Some(before) = before {
        assert_eq!(timer_threads(), Some(before + 1));
    }
    drop(queue);
    if let Some(before) = before {
        assert_eq!(wait_for_timer_threads(before), Some(before));
    }
    // The lease still works on a queue with no handles left.
    drop(lease);
}

#[test]
fn a_queue_on_a_fake_clock_starts_no_thread_and_unsubscribes_when_dropped() {
    let _exclusive = exclusive();
    let before = timer_threads();
    let clock = FakeClock::new();
    let item = Arc::new("default/web-0".to_owned());
    let queue: WorkQueue<Arc<String>> = WorkQueue::builder().clock(clock.clone()).build();
    queue.add_after(item.clone(), Duration::from_secs(3600));
    assert_eq!(timer_threads(), before);
    assert!(clock.has_listeners());
    drop(queue);
    assert!(!clock.has_listeners());
    assert_eq!(Arc::strong_count(&item), 1);
}
