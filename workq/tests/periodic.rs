//! Periodic work in memory: the shared periodic rules on `WorkQueue`, cron schedules in time
//! zones over daylight saving time changes, and the listing of schedules in `MemoryAdmin`.
//! Everything runs on a fake clock.

#![cfg(feature = "periodic")]

use std::time::{Duration, SystemTime};

use workq::WorkQueue;
use workq::admin::{Admin, AdminError, MemoryAdmin};
use workq::clock::FakeClock;
use workq::periodic::{Periodic, Schedule, TickOutcome};

/// Instantiates every periodic rule in memory.
macro_rules! periodic_suite {
    ($($rule:ident),* $(,)?) => {
        mod in_memory {
            use workq_conformance::periodic::{Memory, rules};
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    rules::$rule(&Memory).await;
                }
            )*
        }
    };
}

workq_conformance::for_each_periodic_rule!(periodic_suite);

/// An instant given as RFC 3339.
fn t(rfc3339: &str) -> SystemTime {
    SystemTime::from(rfc3339.parse::<jiff::Timestamp>().expect("a timestamp"))
}

/// The ticks of `schedule` after `from`, `n` of them, as RFC 3339 in UTC.
fn ticks(schedule: &Schedule, from: &str, n: usize) -> Vec<String> {
    let mut at = t(from);
    (0..n)
        .map(|_| {
            at = schedule.next_after(at).expect("a tick");
            jiff::Timestamp::try_from(at).expect("in range").to_string()
        })
        .collect()
}

#[test]
fn a_fixed_time_in_the_spring_gap_ticks_once_at_the_end_of_the_gap() {
    // 2026-03-08: New York's clocks go from 02:00 EST to 03:00 EDT.
    let s = Schedule::cron_in("30 2 * * *", "America/New_York").unwrap();
    assert_eq!(
        ticks(&s, "2026-03-07T00:00:00Z", 3),
        [
            "2026-03-07T07:30:00Z", // 02:30 EST
            "2026-03-08T07:00:00Z", // 03:00 EDT: the gap's end, once
            "2026-03-09T06:30:00Z", // 02:30 EDT
        ]
    );
}

#[test]
fn a_fixed_time_in_the_autumn_overlap_ticks_once_and_a_wildcard_hour_ticks_twice() {
    // 2026-11-01: New York's clocks go from 02:00 EDT back to 01:00 EST.
    let fixed = Schedule::cron_in("30 1 * * *", "America/New_York").unwrap();
    assert_eq!(
        ticks(&fixed, "2026-10-31T12:00:00Z", 2),
        ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]
    );
    let every_hour = Schedule::cron_in("30 * * * *", "America/New_York").unwrap();
    assert_eq!(
        ticks(&every_hour, "2026-11-01T04:00:00Z", 3),
        [
            "2026-11-01T04:30:00Z", // 00:30 EDT
            "2026-11-01T05:30:00Z", // 01:30 EDT
            "2026-11-01T06:30:00Z", // 01:30 EST, the hour's second pass
        ]
    );
}

#[test]
fn a_zone_moves_the_ticks_and_seconds_and_nicknames_parse() {
    let paris = Schedule::cron_in("0 3 * * MON-FRI", "Europe/Paris").unwrap();
    // Friday 2026-03-27 03:00 CET, then Monday 03:00 CEST (summer time since Sunday).
    assert_eq!(
        ticks(&paris, "2026-03-26T12:00:00Z", 2),
        ["2026-03-27T02:00:00Z", "2026-03-30T01:00:00Z"]
    );
    assert_eq!(
        paris.last_at_or_before(t("2026-03-30T01:00:00Z")),
        Some(t("2026-03-30T01:00:00Z"))
    );
    let seconds = Schedule::cron("*/15 * * * * *").unwrap();
    assert_eq!(
        ticks(&seconds, "2026-01-01T00:00:00Z", 2),
        ["2026-01-01T00:00:15Z", "2026-01-01T00:00:30Z"]
    );
    let hourly = Schedule::cron("@hourly").unwrap();
    assert_eq!(
        ticks(&hourly, "2026-01-01T00:10:00Z", 1),
        ["2026-01-01T01:00:00Z"]
    );
    assert_eq!(hourly.to_string(), "cron @hourly (UTC)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cron_runner_in_a_zone_adds_at_local_time_across_a_daylight_saving_change() {
    let clock = FakeClock::new();
    let queue: WorkQueue<String> = WorkQueue::builder().name("periodic-paris").build();
    let start = t("2026-03-28T12:00:00Z");
    let runner = Periodic::new(
        queue.clone(),
        "nightly",
        Schedule::cron_in("0 3 * * *", "Europe/Paris").unwrap(),
        |tick| jiff::Timestamp::try_from(tick).unwrap().to_string(),
    )
    .clock(clock.clone(), start)
    .spawn();
    runner.wait_for(|s| s.next_tick.is_some()).await;
    let mut now = start;
    // 03:00 CET on the 28th is past; 03:00 CEST on the 29th (the day the clocks go forward)
    // and on the 30th are an hour earlier in UTC.
    for due in ["2026-03-29T01:00:00Z", "2026-03-30T01:00:00Z"] {
        let due = t(due);
        clock.step(due.duration_since(now).unwrap());
        now = due;
        runner.wait_for(|s| s.last_tick == Some(due)).await;
        assert_eq!(
            *queue.try_get().unwrap(),
            jiff::Timestamp::try_from(due).unwrap().to_string()
        );
    }
    assert_eq!(runner.status().added, 2);
    runner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_admin_lists_the_schedules_of_its_queues() {
    let admin = MemoryAdmin::new();
    let queue: WorkQueue<String> = WorkQueue::builder()
        .name("periodic-listed")
        .metrics(admin.clone())
        .build();
    let clock = FakeClock::new();
    let start = t("2027-01-15T08:00:00Z");
    let runner = Periodic::new(
        queue.clone(),
        "hourly",
        Schedule::every(Duration::from_secs(3600)),
        |_| "hourly".to_owned(),
    )
    .clock(clock.clone(), start)
    .spawn();
    runner.wait_for(|s| s.next_tick.is_some()).await;
    clock.step(Duration::from_secs(3600));
    runner
        .wait_for(|s| s.last_outcome == Some(TickOutcome::Added))
        .await;
    runner.pause().await.unwrap();

    let listed = admin.schedules("periodic-listed").await.unwrap();
    assert_eq!(listed.len(), 1);
    let info = &listed[0];
    assert_eq!(
        (info.name.as_str(), info.spec.as_str(), info.paused),
        ("hourly", "every 1h", true)
    );
    assert_eq!(info.since, start);
    assert_eq!(info.last_tick, Some(t("2027-01-15T09:00:00Z")));
    assert_eq!(info.next_tick, Some(t("2027-01-15T10:00:00Z")));
    assert_eq!(
        admin.schedules("periodic-unknown").await,
        Err(AdminError::NotFound)
    );
    // Through `dyn Admin` too.
    let boxed: Box<dyn Admin> = Box::new(admin.clone());
    assert_eq!(boxed.schedules("periodic-listed").await.unwrap(), listed);
    runner.stop().await;
}

#[cfg(feature = "serde")]
#[test]
fn a_schedule_record_is_json_with_instants_in_milliseconds() {
    use workq::periodic::ScheduleInfo;
    let mut info = ScheduleInfo::new("hourly", t("2027-01-15T08:00:00Z"));
    info.spec = "every 1h".to_owned();
    info.last_tick = Some(t("2027-01-15T09:00:00Z"));
    let json = serde_json::to_value(&info).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "name": "hourly",
            "spec": "every 1h",
            "since_ms": 1_800_000_000_000_u64,
            "last_tick_ms": 1_800_003_600_000_u64,
            "next_tick_ms": null,
            "paused": false,
        })
    );
    assert_eq!(serde_json::from_value::<ScheduleInfo>(json).unwrap(), info);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_handle_stops_its_runner() {
    let clock = FakeClock::new();
    let queue: WorkQueue<String> = WorkQueue::builder().name("periodic-dropped").build();
    let start = t("2027-01-15T08:00:00Z");
    let runner = Periodic::new(
        queue.clone(),
        "dropped",
        Schedule::every(Duration::from_secs(60)),
        |_| "x".to_owned(),
    )
    .clock(clock.clone(), start)
    .spawn();
    runner.wait_for(|s| s.next_tick.is_some()).await;
    let other = Periodic::new(
        queue.clone(),
        "watcher",
        Schedule::every(Duration::from_secs(60)),
        |_| "y".to_owned(),
    )
    .clock(clock.clone(), start)
    .spawn();
    other.wait_for(|s| s.next_tick.is_some()).await;
    drop(runner);
    clock.step(Duration::from_secs(60));
    other.wait_for(|s| s.last_tick.is_some()).await;
    // The dropped runner's task sees its stop before the clock's step (`biased`), whenever
    // it runs: it adds nothing.
    assert_eq!(*queue.try_get().unwrap(), "y");
    assert!(queue.try_get().is_err());
    other.stop().await;
}

#[test]
#[should_panic(expected = "must have 1 to 200 bytes")]
fn an_empty_schedule_name_is_refused() {
    let queue: WorkQueue<String> = WorkQueue::new();
    let _ = Periodic::new(queue, "", Schedule::every(Duration::from_secs(1)), |_| {
        String::new()
    });
}
