//! The periodic rules every backend runs: `workq::periodic` runners over several handles
//! of one queue (several processes' worth: on a server, each handle has connections of its
//! own), on a fake clock laid over a wall time, so that nothing sleeps. A backend's tests
//! implement [`Backend`] and instantiate every rule with
//! `workq_conformance::for_each_periodic_rule!(its_macro)`; the in-memory queue's
//! [`Memory`] is here.
//!
//! A backend stores the instants a runner sends and never reads its own clock for them,
//! which is what lets these rules run a server's queue on a fake clock.

use std::collections::BTreeSet;
use std::future::Future;
use std::time::{Duration, Instant, SystemTime};

use workq::clock::FakeClock;
use workq::periodic::{
    CatchUp, Periodic, PeriodicHandle, Schedule, ScheduleUpdate, TickClaim, TickOutcome,
};
use workq::{AddOptions, Queue, QueueLease, WorkQueue};

/// Calls `$suite!(rule, rule, ...)` with the name of every rule in
/// [`periodic::rules`](crate::periodic::rules).
#[macro_export]
macro_rules! for_each_periodic_rule {
    ($suite:ident) => {
        $suite!(
            three_handles_add_one_item_per_tick,
            a_tick_is_taken_once_and_never_after_a_later_one,
            a_schedule_record_keeps_its_since_spec_and_pause,
            a_pause_skips_ticks_for_every_runner_and_a_resume_catches_none_up,
            a_fleet_back_from_down_catches_up_one_missed_tick,
            catch_up_skip_takes_only_the_ticks_that_come_due,
            jitter_delays_the_claim_and_never_moves_or_skips_a_tick,
            schedules_of_one_queue_keep_their_own_ticks,
            a_shut_down_handle_takes_no_tick_and_stops_its_runner,
        );
    };
}

/// Makes fresh queues of one backend for one test.
pub trait Backend: Send + Sync {
    /// The queues it makes.
    type Q: Queue<Item = String>;
    /// `n` handles on one fresh, empty queue, each as independent of the others as the
    /// backend allows (on a server: connections of its own, as `n` processes would have).
    fn handles(&self, n: usize) -> impl Future<Output = Vec<Self::Q>> + Send;
}

/// The in-memory `WorkQueue`: clones of one queue of a fresh name.
#[derive(Debug)]
pub struct Memory;

impl Backend for Memory {
    type Q = WorkQueue<String>;

    async fn handles(&self, n: usize) -> Vec<WorkQueue<String>> {
        let queue = WorkQueue::builder()
            .name(crate::unique_name("periodic"))
            .build();
        vec![queue; n]
    }
}

/// The wall time the rules start at: 2027-01-15T08:00:00Z, a whole hour.
const START_S: u64 = 1_800_000_000;

/// A minute.
const MINUTE: Duration = Duration::from_secs(60);

/// A fake clock laid over the wall time [`START_S`].
struct Time {
    clock: FakeClock,
    origin: Instant,
}

impl Time {
    fn new() -> Self {
        let clock = FakeClock::new();
        Time {
            origin: clock.now(),
            clock,
        }
    }

    /// The wall time now.
    fn now(&self) -> SystemTime {
        at(Duration::ZERO) + (self.clock.now() - self.origin)
    }

    fn step(&self, d: Duration) {
        self.clock.step(d);
    }

    /// A runner of `schedule` named `name` on `queue`, on this clock, whose items are
    /// `name@<tick in ms>`.
    fn runner<Q: Queue<Item = String>>(
        &self,
        queue: &Q,
        name: &str,
        schedule: Schedule,
    ) -> Periodic<Q> {
        let prefix = name.to_owned();
        Periodic::new(queue.clone(), name, schedule, move |tick| {
            item(&prefix, tick)
        })
        .clock(self.clock.clone(), self.now())
    }
}

/// The instant `d` after the start.
fn at(d: Duration) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(START_S) + d
}

/// The item of tick `tick` of schedule `name`.
fn item(name: &str, tick: SystemTime) -> String {
    let ms = tick
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis();
    format!("{name}@{ms}")
}

/// Every item of the queue, taken out (each lease done).
async fn drain<Q: Queue<Item = String>>(queue: &Q) -> BTreeSet<String> {
    let mut items = BTreeSet::new();
    let n = queue.len().await.expect("len");
    for _ in 0..n {
        let lease = queue.get().await.expect("get").expect("an item");
        assert!(items.insert(lease.item().clone()), "{} twice", lease.item());
        lease.done().await.expect("done");
    }
    assert_eq!(queue.len().await.expect("len"), 0);
    items
}

/// How long a rule waits for a runner before it fails instead of hanging (a guard, not a
/// timing goal: on the fake clock a runner answers within microseconds).
const HANG: Duration = Duration::from_secs(60);

/// `wait` under [`HANG`].
async fn guarded<F: Future>(what: &str, wait: F) -> F::Output {
    tokio::time::timeout(HANG, wait)
        .await
        .unwrap_or_else(|_| panic!("a runner never got to {what}"))
}

/// Waits until every runner settled `tick` (or a later one); a runner that ended (its task
/// died) fails it.
async fn settled<Q: Queue>(runners: &[PeriodicHandle<Q>], tick: SystemTime) {
    for runner in runners {
        let status = guarded(
            &format!("tick {tick:?}: {:?}", runner.status()),
            runner.wait_for(|s| s.last_tick >= Some(tick)),
        )
        .await;
        assert!(!status.stopped, "{status:?}");
        assert!(
            status.last_tick >= Some(tick),
            "the runner ended: {status:?}"
        );
    }
}

/// Waits until every runner is registered and waits for `next`.
async fn waiting<Q: Queue>(runners: &[PeriodicHandle<Q>], next: SystemTime) {
    for runner in runners {
        let status = guarded(
            &format!("wait for {next:?}: {:?}", runner.status()),
            runner.wait_for(|s| s.registered.is_some() && s.next_tick == Some(next)),
        )
        .await;
        assert!(!status.stopped, "{status:?}");
    }
}

/// Each status' count of one outcome, summed.
fn sum<Q: Queue>(
    runners: &[PeriodicHandle<Q>],
    f: impl Fn(&workq::periodic::RunnerStatus) -> u64,
) -> u64 {
    runners.iter().map(|r| f(&r.status())).sum()
}

/// The rules, one test each.
pub mod rules {
    #![expect(missing_docs, reason = "each rule's name is its statement")]

    use super::*;

    pub async fn three_handles_add_one_item_per_tick<B: Backend>(backend: &B) {
        let handles = backend.handles(3).await;
        let time = Time::new();
        let every = Schedule::every(MINUTE);
        let runners: Vec<_> = handles
            .iter()
            .map(|q| time.runner(q, "sync", every.clone()).spawn())
            .collect();
        waiting(&runners, at(MINUTE)).await;
        for k in 1..=5 {
            time.step(MINUTE);
            settled(&runners, at(MINUTE * k)).await;
        }
        assert_eq!(sum(&runners, |s| s.added), 5);
        assert_eq!(sum(&runners, |s| s.already_taken), 10);
        let expected: BTreeSet<_> = (1..=5).map(|k| item("sync", at(MINUTE * k))).collect();
        assert_eq!(drain(&handles[0]).await, expected);
        let info = runners[1].info().await.expect("info");
        assert_eq!(info.name, "sync");
        assert_eq!(info.spec, "every 1m");
        assert_eq!(info.since, at(Duration::ZERO));
        assert_eq!(info.last_tick, Some(at(MINUTE * 5)));
        assert_eq!(info.next_tick, Some(at(MINUTE * 6)));
        assert!(!info.paused);
        for runner in runners {
            runner.stop().await;
        }
    }

    pub async fn a_tick_is_taken_once_and_never_after_a_later_one<B: Backend>(backend: &B) {
        let handles = backend.handles(2).await;
        let claim = |tick: u32| {
            TickClaim::new(
                "direct",
                "every 1m",
                at(MINUTE * tick),
                Some(at(MINUTE * (tick + 1))),
                at(MINUTE * tick),
            )
        };
        let add = |q: &B::Q, tick: u32| {
            let q = q.clone();
            async move {
                q.add_on_tick(claim(tick), format!("direct@{tick}"), AddOptions::default())
                    .await
                    .expect("add_on_tick")
            }
        };
        assert_eq!(add(&handles[0], 2).await, TickOutcome::Added);
        assert_eq!(add(&handles[1], 2).await, TickOutcome::AlreadyTaken);
        assert_eq!(add(&handles[0], 2).await, TickOutcome::AlreadyTaken);
        // A late runner never adds a tick older than one taken.
        assert_eq!(add(&handles[1], 1).await, TickOutcome::AlreadyTaken);
        assert_eq!(add(&handles[1], 3).await, TickOutcome::Added);
        let expected: BTreeSet<_> = ["direct@2".to_owned(), "direct@3".to_owned()].into();
        assert_eq!(drain(&handles[0]).await, expected);
        // The record was created by the first claim, with the claim's spec and instants.
        let info = handles[1]
            .upsert_schedule(ScheduleUpdate::read("direct", at(MINUTE * 9)))
            .await
            .expect("read");
        assert_eq!(info.spec, "every 1m");
        assert_eq!(info.since, at(MINUTE * 2));
        assert_eq!(info.last_tick, Some(at(MINUTE * 3)));
        assert_eq!(info.next_tick, Some(at(MINUTE * 4)));
    }

    pub async fn a_schedule_record_keeps_its_since_spec_and_pause<B: Backend>(backend: &B) {
        let handles = backend.handles(2).await;
        let (a, b) = (&handles[0], &handles[1]);
        let upsert = |q: &B::Q, update: ScheduleUpdate| {
            let q = q.clone();
            async move { q.upsert_schedule(update).await.expect("upsert") }
        };
        let info = upsert(a, ScheduleUpdate::read("nightly", at(MINUTE))).await;
        assert_eq!(info.name, "nightly");
        assert_eq!((info.spec.as_str(), info.since), ("", at(MINUTE)));
        assert_eq!(
            (info.last_tick, info.next_tick, info.paused),
            (None, None, false)
        );

        let spec = "cron 0 3 * * * (Europe/Paris)";
        let info = upsert(
            b,
            ScheduleUpdate::register("nightly", spec, Some(at(MINUTE * 60)), at(MINUTE * 2)),
        )
        .await;
        // A second registration sets the spec and the next tick, never `since`.
        assert_eq!((info.spec.as_str(), info.since), (spec, at(MINUTE)));
        assert_eq!(info.next_tick, Some(at(MINUTE * 60)));

        let info = upsert(a, ScheduleUpdate::pause("nightly", true, at(MINUTE * 3))).await;
        assert!(info.paused);
        assert_eq!(info.since, at(MINUTE));
        // Paused: the tick is taken without an item.
        let claim = TickClaim::new("nightly", spec, at(MINUTE * 4), None, at(MINUTE * 4));
        let outcome = b
            .add_on_tick(claim, "nightly@4".to_owned(), AddOptions::default())
            .await
            .expect("add_on_tick");
        assert_eq!(outcome, TickOutcome::Paused);
        assert_eq!(b.len().await.expect("len"), 0);

        // A pause of a paused schedule changes nothing.
        let info = upsert(b, ScheduleUpdate::pause("nightly", true, at(MINUTE * 5))).await;
        assert!(info.paused);
        assert_eq!(info.last_tick, Some(at(MINUTE * 4)));

        // A resume moves `since`, so the paused ticks are never caught up; a second resume
        // moves nothing.
        let info = upsert(a, ScheduleUpdate::pause("nightly", false, at(MINUTE * 6))).await;
        assert!(!info.paused);
        assert_eq!(info.since, at(MINUTE * 6));
        let info = upsert(b, ScheduleUpdate::pause("nightly", false, at(MINUTE * 7))).await;
        assert_eq!(info.since, at(MINUTE * 6));
        assert_eq!(info.spec, spec);
    }

    pub async fn a_pause_skips_ticks_for_every_runner_and_a_resume_catches_none_up<B: Backend>(
        backend: &B,
    ) {
        let handles = backend.handles(3).await;
        let time = Time::new();
        let every = Schedule::every(MINUTE);
        let runners: Vec<_> = handles[..2]
            .iter()
            .map(|q| time.runner(q, "report", every.clone()).spawn())
            .collect();
        waiting(&runners, at(MINUTE)).await;
        let info = runners[0].pause().await.expect("pause");
        assert!(info.paused);
        for k in 1..=3 {
            time.step(MINUTE);
            settled(&runners, at(MINUTE * k)).await;
        }
        assert_eq!(handles[2].len().await.expect("len"), 0);
        assert_eq!(sum(&runners, |s| s.paused), 3);
        assert_eq!(sum(&runners, |s| s.added), 0);

        // Resumed by the other process: the three ticks are not caught up, by the running
        // runners nor by one that starts now.
        let info = runners[1].resume().await.expect("resume");
        assert!(!info.paused);
        assert_eq!(info.since, at(MINUTE * 3));
        let late = time.runner(&handles[2], "report", every.clone()).spawn();
        waiting(std::slice::from_ref(&late), at(MINUTE * 4)).await;
        assert_eq!(late.status().last_tick, None);
        assert_eq!(handles[2].len().await.expect("len"), 0);

        time.step(MINUTE);
        settled(&runners, at(MINUTE * 4)).await;
        settled(std::slice::from_ref(&late), at(MINUTE * 4)).await;
        let expected: BTreeSet<_> = [item("report", at(MINUTE * 4))].into();
        assert_eq!(drain(&handles[2]).await, expected);
        for runner in runners {
            runner.stop().await;
        }
        late.stop().await;
    }

    pub async fn a_fleet_back_from_down_catches_up_one_missed_tick<B: Backend>(backend: &B) {
        let handles = backend.handles(3).await;
        let time = Time::new();
        let every = Schedule::every(MINUTE);
        let first = time.runner(&handles[0], "backup", every.clone()).spawn();
        waiting(std::slice::from_ref(&first), at(MINUTE)).await;
        time.step(MINUTE);
        settled(std::slice::from_ref(&first), at(MINUTE)).await;
        first.stop().await;

        // The whole fleet is down for five ticks, and comes back with three processes.
        time.step(MINUTE * 5);
        let runners: Vec<_> = handles
            .iter()
            .map(|q| time.runner(q, "backup", every.clone()).spawn())
            .collect();
        waiting(&runners, at(MINUTE * 7)).await;
        assert_eq!(sum(&runners, |s| s.added), 1);
        let expected: BTreeSet<_> =
            [item("backup", at(MINUTE)), item("backup", at(MINUTE * 6))].into();
        assert_eq!(drain(&handles[1]).await, expected);

        // A process restarted while the others run catches nothing up: the tick is taken.
        let again = time.runner(&handles[2], "backup", every.clone()).spawn();
        waiting(std::slice::from_ref(&again), at(MINUTE * 7)).await;
        assert_eq!(again.status().last_tick, None);
        assert_eq!(handles[1].len().await.expect("len"), 0);
        for runner in runners {
            runner.stop().await;
        }
        again.stop().await;
    }

    pub async fn catch_up_skip_takes_only_the_ticks_that_come_due<B: Backend>(backend: &B) {
        let handles = backend.handles(1).await;
        let time = Time::new();
        let every = Schedule::every(MINUTE);
        let first = time.runner(&handles[0], "skip", every.clone()).spawn();
        waiting(std::slice::from_ref(&first), at(MINUTE)).await;
        first.stop().await;
        time.step(MINUTE * 3);
        let runner = time
            .runner(&handles[0], "skip", every.clone())
            .catch_up(CatchUp::Skip)
            .spawn();
        waiting(std::slice::from_ref(&runner), at(MINUTE * 4)).await;
        assert_eq!(handles[0].len().await.expect("len"), 0);
        time.step(MINUTE);
        settled(std::slice::from_ref(&runner), at(MINUTE * 4)).await;
        let expected: BTreeSet<_> = [item("skip", at(MINUTE * 4))].into();
        assert_eq!(drain(&handles[0]).await, expected);
        runner.stop().await;
    }

    pub async fn jitter_delays_the_claim_and_never_moves_or_skips_a_tick<B: Backend>(backend: &B) {
        let handles = backend.handles(3).await;
        let time = Time::new();
        let every = Schedule::every(MINUTE);
        // A jitter of ten periods, or of `Duration::MAX` (which panicked the runner): each
        // wait is cut short of the tick after.
        let runners: Vec<_> = [(0, MINUTE / 2), (1, MINUTE * 10), (2, Duration::MAX)]
            .into_iter()
            .map(|(i, jitter)| {
                time.runner(&handles[i], "spread", every.clone())
                    .jitter(jitter)
                    .spawn()
            })
            .collect();
        waiting(&runners, at(MINUTE)).await;
        // To a millisecond before each tick after: every jittered claim of the tick is due.
        time.step(MINUTE * 2 - Duration::from_millis(1));
        for k in 1..=4 {
            settled(&runners, at(MINUTE * k)).await;
            if k < 4 {
                time.step(MINUTE);
            }
        }
        let expected: BTreeSet<_> = (1..=4).map(|k| item("spread", at(MINUTE * k))).collect();
        assert_eq!(drain(&handles[0]).await, expected);
        assert_eq!(sum(&runners, |s| s.added), 4);
        for runner in runners {
            runner.stop().await;
        }
    }

    pub async fn schedules_of_one_queue_keep_their_own_ticks<B: Backend>(backend: &B) {
        let handles = backend.handles(2).await;
        let time = Time::new();
        let runners = [
            time.runner(&handles[0], "fast", Schedule::every(MINUTE))
                .spawn(),
            time.runner(&handles[1], "slow", Schedule::every(MINUTE * 2))
                .spawn(),
        ];
        waiting(&runners[..1], at(MINUTE)).await;
        waiting(&runners[1..], at(MINUTE * 2)).await;
        time.step(MINUTE);
        settled(&runners[..1], at(MINUTE)).await;
        time.step(MINUTE);
        settled(&runners, at(MINUTE * 2)).await;
        let expected: BTreeSet<_> = [
            item("fast", at(MINUTE)),
            item("fast", at(MINUTE * 2)),
            item("slow", at(MINUTE * 2)),
        ]
        .into();
        assert_eq!(drain(&handles[0]).await, expected);
        for runner in runners {
            runner.stop().await;
        }
    }

    pub async fn a_shut_down_handle_takes_no_tick_and_stops_its_runner<B: Backend>(backend: &B) {
        let handles = backend.handles(1).await;
        let time = Time::new();
        let runner = time
            .runner(&handles[0], "closing", Schedule::every(MINUTE))
            .spawn();
        waiting(std::slice::from_ref(&runner), at(MINUTE)).await;
        let _ = Queue::shut_down(&handles[0]);
        time.step(MINUTE);
        let status = runner.wait_for(|s| s.stopped).await;
        assert!(status.stopped);
        assert_eq!(status.last_outcome, Some(TickOutcome::ShutDown));
        assert_eq!(status.added, 0);
        let claim = TickClaim::new("closing", "every 1m", at(MINUTE), None, at(MINUTE));
        assert_eq!(
            handles[0]
                .add_on_tick(claim, "late".to_owned(), AddOptions::default())
                .await
                .expect("add_on_tick"),
            TickOutcome::ShutDown
        );
        runner.stop().await;
    }
}

/// The fleet test: `n` processes (this test binary run again, as children) run one
/// schedule's runner each on one queue on a real clock, and the queue must hold exactly one
/// item per tick. Each process puts its id in its items, so that two processes adding one
/// tick would leave two items (the queue's dedup cannot hide it).
///
/// A backend's test file has two tests: a child, which starts with
/// `if !fleet::child(connect).await { return; }` (a no-op unless started by [`fleet::run`]),
/// and the parent, which calls [`fleet::run`] with the child test's name.
pub mod fleet {
    use std::collections::BTreeMap;
    use std::future::Future;
    use std::path::PathBuf;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant, SystemTime};

    use workq::Queue;
    use workq::periodic::{Periodic, Schedule};

    use super::drain;

    /// Set in the children's environment.
    const CHILD: &str = "WQ_PERIODIC_FLEET_CHILD";

    /// The schedule's period.
    const PERIOD: Duration = Duration::from_secs(1);

    /// Ticks every process must see.
    const TICKS: u32 = 6;

    /// How long the processes get to start before the first tick counted.
    const START_UP: Duration = Duration::from_secs(3);

    /// Milliseconds since the Unix epoch.
    fn ms(at: SystemTime) -> u64 {
        at.duration_since(SystemTime::UNIX_EPOCH)
            .expect("after the epoch")
            .as_millis() as u64
    }

    /// In a child started by [`run`]: connects with `connect(url, queue name)`, runs the
    /// schedule's runner until it settled the last tick, writes how many ticks it added to
    /// its output file, and answers `true`. Anywhere else: answers `false` at once.
    pub async fn child<Q, F, Fut>(connect: F) -> bool
    where
        Q: Queue<Item = String>,
        F: FnOnce(String, String) -> Fut,
        Fut: Future<Output = Q>,
    {
        if std::env::var(CHILD).is_err() {
            return false;
        }
        let env = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} unset"));
        let last: u64 = env("WQ_LAST_MS").parse().expect("a number");
        let out = PathBuf::from(env("WQ_OUT"));
        let queue = connect(env("WQ_URL"), env("WQ_QUEUE")).await;
        let pid = std::process::id();
        let runner = Periodic::new(queue, "fleet", Schedule::every(PERIOD), move |tick| {
            format!("fleet@{}@{pid}", ms(tick))
        })
        .jitter(PERIOD / 4)
        .spawn();
        let last = SystemTime::UNIX_EPOCH + Duration::from_millis(last);
        let status = runner.wait_for(|s| s.last_tick >= Some(last)).await;
        assert!(!status.stopped, "the runner stopped: {status:?}");
        runner.stop().await;
        std::fs::write(&out, status.added.to_string()).expect("write the output");
        true
    }

    /// Runs `processes` children (test `child_test` of this binary, which calls [`child`])
    /// against the queue named `name` at `url`, waits for them, and checks through `queue`
    /// (a handle on that queue) that every tick from the first counted to the last has
    /// exactly one item, that no tick has two, and that the items are what the children
    /// say they added.
    pub async fn run<Q: Queue<Item = String>>(
        child_test: &str,
        url: &str,
        name: &str,
        queue: &Q,
        processes: usize,
    ) {
        let period = PERIOD.as_millis() as u64;
        let first = (ms(SystemTime::now() + START_UP) / period + 1) * period;
        let last = first + u64::from(TICKS - 1) * period;
        let dir = std::env::temp_dir().join(crate::unique_name(&format!(
            "wq-periodic-fleet-{}",
            std::process::id()
        )));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let mut children = Vec::new();
        for i in 0..processes {
            let out = dir.join(format!("child-{i}"));
            let child = Command::new(std::env::current_exe().expect("this test binary"))
                .args([child_test, "--exact", "--nocapture", "--test-threads=1"])
                .env(CHILD, "1")
                .env("WQ_URL", url)
                .env("WQ_QUEUE", name)
                .env("WQ_LAST_MS", last.to_string())
                .env("WQ_OUT", &out)
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("start a child process");
            children.push((child, out));
        }
        // A guard against a hang, not a timing goal.
        let deadline = Instant::now() + START_UP + PERIOD * (TICKS + 60);
        let mut added = 0;
        for (mut child, out) in children {
            let status = loop {
                if let Some(status) = child.try_wait().expect("a child's status") {
                    break Some(status);
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            let status = status.expect("a child process never finished");
            assert!(status.success(), "a child process failed: {status}");
            let n: u64 = std::fs::read_to_string(&out)
                .expect("the child's output")
                .parse()
                .expect("a count");
            added += n;
        }
        let _ = std::fs::remove_dir_all(&dir);

        let items = drain(queue).await;
        let mut by_tick: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        for item in &items {
            let mut parts = item.split('@');
            assert_eq!(parts.next(), Some("fleet"), "{item}");
            let tick: u64 = parts.next().and_then(|t| t.parse().ok()).expect("a tick");
            assert_eq!(tick % period, 0, "{item}");
            by_tick.entry(tick).or_default().push(item.clone());
        }
        for (tick, items) in &by_tick {
            assert_eq!(
                items.len(),
                1,
                "tick {tick} was added by several processes: {items:?}"
            );
        }
        for k in 0..u64::from(TICKS) {
            let tick = first + k * period;
            assert!(
                by_tick.contains_key(&tick),
                "tick {tick} has no item: {by_tick:?}"
            );
        }
        assert_eq!(added, items.len() as u64, "{by_tick:?}");
    }
}
