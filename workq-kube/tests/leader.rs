//! Leader election against the in-process API server: replicas of one controller, each in a
//! thread with its own tokio runtime and its own client (a process each, as far as the
//! controller can tell), electing a leader on a Lease with short timings (lease 2 s, renew
//! deadline 1 s, retry period 200 ms).
//!
//! Every reconcile records when it started and ended, and which replica ran it; every test
//! checks that no two replicas ever reconciled at the same time. Timing figures are printed
//! (`--nocapture`), and bound only by the rules' own limits.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use tokio::sync::oneshot;
use workq_kube::testing::FakeApiServer;
use workq_kube::{Controller, LeaderElection};

use support::{configmap, eventually};

const LEASE: &str = "configmaps-leader";
const LEASE_DURATION: Duration = Duration::from_secs(2);
const RENEW_DEADLINE: Duration = Duration::from_secs(1);
const RETRY_PERIOD: Duration = Duration::from_millis(200);
/// client-go's `JitterFactor`: the acquire loop waits up to 2.2 retry periods.
const JITTERED_RETRY: Duration = Duration::from_millis(440);
/// What a few round trips to the API server on a loaded test machine may add to a rule's
/// bound.
const ROUND_TRIPS: Duration = Duration::from_millis(500);

/// One reconcile: which replica, when it started, when it ended (or was dropped).
#[derive(Debug, Clone)]
struct Interval {
    replica: String,
    object: String,
    start: Instant,
    end: Option<Instant>,
}

/// What every replica's reconciles recorded.
#[derive(Default)]
struct Record {
    intervals: Mutex<Vec<Interval>>,
}

impl Record {
    /// The first reconcile `replica` started after `after`.
    fn first_start(&self, replica: &str, after: Instant) -> Option<Instant> {
        self.intervals
            .lock()
            .unwrap()
            .iter()
            .filter(|i| i.replica == replica && i.start >= after)
            .map(|i| i.start)
            .min()
    }

    /// The end of the last reconcile of `replica` (now for one still running).
    fn last_end(&self, replica: &str) -> Option<Instant> {
        let now = Instant::now();
        self.intervals
            .lock()
            .unwrap()
            .iter()
            .filter(|i| i.replica == replica)
            .map(|i| i.end.unwrap_or(now))
            .max()
    }

    fn count(&self, replica: &str) -> usize {
        self.intervals
            .lock()
            .unwrap()
            .iter()
            .filter(|i| i.replica == replica)
            .count()
    }

    /// Fails if two replicas ever reconciled at the same time.
    fn assert_one_leader_at_a_time(&self) {
        let now = Instant::now();
        let intervals = self.intervals.lock().unwrap();
        for a in intervals.iter() {
            for b in intervals.iter() {
                if a.replica < b.replica
                    && a.start < b.end.unwrap_or(now)
                    && b.start < a.end.unwrap_or(now)
                {
                    panic!("two replicas reconciled at once: {a:?} and {b:?}");
                }
            }
        }
    }
}

/// Records the end of a reconcile when it is dropped: at its end, or when it is cancelled.
struct Recording {
    record: Arc<Record>,
    index: usize,
}

impl Drop for Recording {
    fn drop(&mut self) {
        self.record.intervals.lock().unwrap()[self.index].end = Some(Instant::now());
    }
}

/// What a replica's reconcile gets.
struct Context {
    replica: String,
    record: Arc<Record>,
    /// An object whose reconcile takes a minute, if any.
    slow: Option<&'static str>,
}

/// Every object is reconciled over and over (30 ms of work, then again 10 ms later), so that
/// the leader is always busy and a second leader would show at once.
async fn reconcile(object: Arc<ConfigMap>, context: Arc<Context>) -> Result<Action, kube::Error> {
    let name = object.name_any();
    let index = {
        let mut intervals = context.record.intervals.lock().unwrap();
        intervals.push(Interval {
            replica: context.replica.clone(),
            object: name.clone(),
            start: Instant::now(),
            end: None,
        });
        intervals.len() - 1
    };
    let _recording = Recording {
        record: context.record.clone(),
        index,
    };
    let work = if context.slow == Some(name.as_str()) {
        Duration::from_secs(60)
    } else {
        Duration::from_millis(30)
    };
    tokio::time::sleep(work).await;
    Ok(Action::requeue(Duration::from_millis(10)))
}

/// What the test sees of a replica, refreshed every 5 ms by the replica itself.
#[derive(Debug, Default, Clone)]
struct Status {
    leading: bool,
    leader: Option<String>,
    identity: Option<String>,
    store: usize,
    queued: usize,
}

/// A replica: a thread running one controller on its own runtime.
struct Replica {
    name: String,
    status: Arc<Mutex<Status>>,
    stop: Option<oneshot::Sender<()>>,
    kill: Option<oneshot::Sender<()>>,
    /// When the graceful stop returned (the lease released).
    stopped: Arc<Mutex<Option<Instant>>>,
    thread: Option<JoinHandle<()>>,
    ready: Arc<AtomicBool>,
}

fn election(name: &str) -> LeaderElection {
    LeaderElection::new(LEASE)
        .identity(name)
        .lease_duration(LEASE_DURATION)
        .renew_deadline(RENEW_DEADLINE)
        .retry_period(RETRY_PERIOD)
}

impl Replica {
    fn start(server: &Arc<FakeApiServer>, name: &str, record: &Arc<Record>) -> Self {
        Self::start_with(server, name, record, election(name), None)
    }

    fn start_with(
        server: &Arc<FakeApiServer>,
        name: &str,
        record: &Arc<Record>,
        election: LeaderElection,
        slow: Option<&'static str>,
    ) -> Self {
        let status = Arc::new(Mutex::new(Status::default()));
        let stopped = Arc::new(Mutex::new(None));
        let ready = Arc::new(AtomicBool::new(false));
        let (stop, mut stop_rx) = oneshot::channel::<()>();
        let (kill, kill_rx) = oneshot::channel::<()>();
        let thread = {
            let (server, name, record) = (server.clone(), name.to_owned(), record.clone());
            let (status, stopped, ready) = (status.clone(), stopped.clone(), ready.clone());
            std::thread::spawn(move || {
                // One thread: when the test kills the replica, nothing of it runs after.
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let main = async {
                    let api: Api<ConfigMap> =
                        Api::namespaced(server.client_named(&name), "default");
                    let context = Arc::new(Context {
                        replica: name.clone(),
                        record,
                        slow,
                    });
                    let running = Controller::new(api, watcher::Config::default())
                        .name(name.clone())
                        .workers(|workers| workers.count(2))
                        .leader_election(election)
                        .run(reconcile, context);
                    running.wait_until_ready().await;
                    ready.store(true, Ordering::SeqCst);
                    loop {
                        *status.lock().unwrap() = Status {
                            leading: running.is_leader(),
                            leader: running.leader(),
                            identity: running.identity(),
                            store: running.store().state().len(),
                            queued: running.queue().len(),
                        };
                        tokio::select! {
                            _ = &mut stop_rx => break,
                            () = tokio::time::sleep(Duration::from_millis(5)) => {}
                        }
                    }
                    running.shut_down().await.expect("a graceful stop");
                    *stopped.lock().unwrap() = Some(Instant::now());
                    status.lock().unwrap().leading = false;
                };
                runtime.block_on(async {
                    tokio::select! {
                        _ = kill_rx => {}
                        () = main => {}
                    }
                });
                // A crash: every task is dropped where it stands, nothing is released.
                runtime.shutdown_background();
            })
        };
        Self {
            name: name.to_owned(),
            status,
            stop: Some(stop),
            kill: Some(kill),
            stopped,
            thread: Some(thread),
            ready,
        }
    }

    fn status(&self) -> Status {
        self.status.lock().unwrap().clone()
    }

    fn leading(&self) -> bool {
        self.status().leading
    }

    /// A graceful stop; returns when it ended (the lease released).
    fn shut_down(&mut self) -> Instant {
        let _ = self.stop.take().unwrap().send(());
        self.thread.take().unwrap().join().unwrap();
        self.stopped.lock().unwrap().expect("the stop completed")
    }

    /// A crash; returns when it happened.
    fn kill(&mut self) -> Instant {
        let _ = self.kill.take().unwrap().send(());
        self.thread.take().unwrap().join().unwrap();
        Instant::now()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(kill) = self.kill.take() {
            let _ = kill.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A server with `count` ConfigMaps.
async fn server(count: usize) -> Arc<FakeApiServer> {
    let server = FakeApiServer::start().await;
    for index in 0..count {
        server.apply(&configmap(&format!("web-{index}"), "v1"));
    }
    Arc::new(server)
}

/// The replicas leading now.
fn leaders(replicas: &[&Replica]) -> Vec<String> {
    replicas
        .iter()
        .filter(|r| r.leading())
        .map(|r| r.name.clone())
        .collect()
}

fn lease_spec(server: &FakeApiServer) -> LeaseSpec {
    server
        .get::<Lease>(Some("default"), LEASE)
        .expect("the Lease exists")
        .spec
        .unwrap_or_default()
}

/// Waits until one of `replicas` leads; returns its index.
async fn wait_for_leader(replicas: &[&Replica]) -> usize {
    let mut found = None;
    eventually("a leader", || {
        found = replicas.iter().position(|r| r.leading());
        found.is_some()
    })
    .await;
    found.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_one_leads_the_other_stands_by_warm_and_takes_over_after_a_release() {
    let server = server(5).await;
    let record = Arc::new(Record::default());
    let mut a = Replica::start(&server, "replica-a", &record);
    eventually("replica-a leads", || a.leading()).await;
    let b = Replica::start(&server, "replica-b", &record);
    eventually("replica-b ready", || b.ready.load(Ordering::SeqCst)).await;
    eventually("replica-a reconciles", || record.count("replica-a") >= 10).await;

    // Warm standby: the follower's store holds every object and its queue every key, it
    // has seen who leads (at its first try of the Lease, which may come after its store is
    // filled), and it reconciles nothing.
    eventually(
        "replica-b's store and queue filled, and the leader seen",
        || {
            let status = b.status();
            status.store == 5 && status.queued == 5 && status.leader.is_some()
        },
    )
    .await;
    let status = b.status();
    assert!(!status.leading);
    assert_eq!(status.leader.as_deref(), Some("replica-a"));
    assert_eq!(status.identity.as_deref(), Some("replica-b"));
    assert_eq!(record.count("replica-b"), 0);
    let spec = lease_spec(&server);
    assert_eq!(spec.holder_identity.as_deref(), Some("replica-a"));
    assert_eq!(spec.lease_duration_seconds, Some(2));
    assert_eq!(spec.lease_transitions, Some(0));

    // A graceful stop releases the lease once its reconciles are over; the follower takes
    // over at its next try, and starts from its warm store and queue: no list.
    let lists = server.requests().lists;
    let released = a.shut_down();
    // Released once its reconciles were over.
    assert!(record.last_end("replica-a").unwrap() <= released);
    let spec = lease_spec(&server);
    // Released (no holder, `leaseDurationSeconds: 1`), unless replica-b was quicker.
    if spec.holder_identity.as_deref() != Some("replica-b") {
        assert_eq!(spec.holder_identity.as_deref(), Some(""));
        assert_eq!(spec.lease_duration_seconds, Some(1));
    }
    eventually("replica-b reconciles", || {
        record.first_start("replica-b", released).is_some()
    })
    .await;
    let takeover = record.first_start("replica-b", released).unwrap() - released;
    println!(
        "graceful takeover (release to the new leader's first reconcile): {takeover:?} (retry period {RETRY_PERIOD:?})"
    );
    // The rule: the standby's next try, within 2.2 retry periods; far below an expiry.
    assert!(takeover < JITTERED_RETRY + ROUND_TRIPS, "{takeover:?}");
    assert_eq!(server.requests().lists, lists, "a takeover needs no list");
    let spec = lease_spec(&server);
    assert_eq!(spec.holder_identity.as_deref(), Some("replica-b"));
    assert_eq!(spec.lease_transitions, Some(1));
    // (The status the test reads is refreshed every 5 ms.)
    eventually("replica-b says it leads", || b.leading()).await;
    record.assert_one_leader_at_a_time();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_a_killed_leader_is_replaced_within_the_lease_duration_and_a_retry() {
    let server = server(5).await;
    let record = Arc::new(Record::default());
    let mut replicas =
        ["replica-a", "replica-b", "replica-c"].map(|name| Replica::start(&server, name, &record));
    let leader = wait_for_leader(&replicas.iter().collect::<Vec<_>>()).await;
    let name = replicas[leader].name.clone();
    eventually("the leader reconciles", || record.count(&name) >= 10).await;
    assert_eq!(
        leaders(&replicas.iter().collect::<Vec<_>>()),
        [name.as_str()]
    );

    let killed = replicas[leader].kill();
    let others: Vec<&Replica> = replicas
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != leader)
        .map(|(_, r)| r)
        .collect();
    let mut next = None;
    eventually("a new leader reconciles", || {
        next = others
            .iter()
            .find(|r| record.first_start(&r.name, killed).is_some())
            .map(|r| r.name.clone());
        next.is_some()
    })
    .await;
    let next = next.unwrap();
    let takeover = record.first_start(&next, killed).unwrap() - killed;
    println!(
        "crash takeover (kill to the new leader's first reconcile): {takeover:?} (lease {LEASE_DURATION:?}, retry {RETRY_PERIOD:?})"
    );
    // The rule: the lease expires a lease duration after the standbys last saw it renewed
    // (up to one jittered retry after the last renewal), and a standby takes it at its next
    // try (up to one more).
    assert!(
        takeover <= LEASE_DURATION + 2 * JITTERED_RETRY + ROUND_TRIPS,
        "{takeover:?}"
    );
    // Nobody takes it before it expired: the last renewal was sent at most a retry period
    // (and took at most a round trip) before the kill.
    assert!(
        takeover >= LEASE_DURATION - RETRY_PERIOD - ROUND_TRIPS,
        "{takeover:?}"
    );
    eventually("one leader", || leaders(&others).len() == 1).await;
    assert_eq!(leaders(&others), [next.as_str()]);
    let spec = lease_spec(&server);
    assert_eq!(spec.holder_identity.as_deref(), Some(next.as_str()));
    assert_eq!(spec.lease_transitions, Some(1));
    record.assert_one_leader_at_a_time();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_stops_before_another_replica_starts() {
    let server = server(5).await;
    let record = Arc::new(Record::default());
    // `web-0`'s reconcile takes a minute: the leader is in the middle of it when it is cut
    // off, and must cancel it (fencing) rather than let it run beside the next leader.
    let replicas = ["replica-a", "replica-b", "replica-c"]
        .map(|name| Replica::start_with(&server, name, &record, election(name), Some("web-0")));
    let all: Vec<&Replica> = replicas.iter().collect();
    let leader = wait_for_leader(&all).await;
    let old = replicas[leader].name.clone();
    eventually("the leader reconciles", || record.count(&old) >= 10).await;
    eventually("the leader is in web-0's long reconcile", || {
        record
            .intervals
            .lock()
            .unwrap()
            .iter()
            .any(|i| i.replica == old && i.object == "web-0" && i.end.is_none())
    })
    .await;

    // The leader's requests are refused from now on, watches and renewals alike.
    let cut = Instant::now();
    server.partition(&old);
    eventually("the old leader steps down", || !replicas[leader].leading()).await;
    let stepped_down = Instant::now();
    let mut next = None;
    eventually("a new leader reconciles", || {
        next = all
            .iter()
            .filter(|r| r.name != old)
            .find(|r| record.first_start(&r.name, cut).is_some())
            .map(|r| r.name.clone());
        next.is_some()
    })
    .await;
    let next = next.unwrap();
    let old_end = record.last_end(&old).unwrap();
    let new_start = record.first_start(&next, cut).unwrap();
    println!(
        "partition: old leader stepped down {:?} after the cut, its last reconcile ended {:?} after it; the new leader started {:?} after the cut ({:?} after the old leader's last reconcile)",
        stepped_down - cut,
        old_end - cut,
        new_start - cut,
        new_start - old_end,
    );
    // The old leader's reconciles ended (cancelled) before the new leader's first one.
    assert!(old_end < new_start, "{old_end:?} vs {new_start:?}");
    // It stepped down at its renew deadline, at most a renew deadline after the cut.
    assert!(stepped_down - cut <= RENEW_DEADLINE + ROUND_TRIPS);
    record.assert_one_leader_at_a_time();

    // Healed, the old leader rejoins as a standby: still one leader.
    server.heal(&old);
    eventually("the old leader sees the new one", || {
        replicas[leader].status().leader.as_deref() == Some(next.as_str())
    })
    .await;
    let healed = Instant::now();
    while healed.elapsed() < 3 * RETRY_PERIOD {
        assert_eq!(leaders(&all), [next.as_str()]);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(record.first_start(&old, new_start), None);
    record.assert_one_leader_at_a_time();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_times_the_lease_by_its_own_clock_whatever_the_timestamps_say() {
    let server = server(2).await;
    let record = Arc::new(Record::default());
    // Another process holds the lease, with a clock a year ahead: its renew times are far
    // in the future, and it keeps renewing.
    let leases: Api<Lease> = Api::namespaced(server.client(), "default");
    let year = k8s_openapi::jiff::SignedDuration::from_hours(24 * 365);
    let far = || MicroTime(k8s_openapi::jiff::Timestamp::now() + year);
    let mut lease = leases
        .create(
            &PostParams::default(),
            &Lease {
                metadata: ObjectMeta {
                    name: Some(LEASE.to_owned()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some("elsewhere".to_owned()),
                    lease_duration_seconds: Some(2),
                    acquire_time: Some(far()),
                    renew_time: Some(far()),
                    lease_transitions: Some(3),
                    ..LeaseSpec::default()
                }),
            },
        )
        .await
        .unwrap();
    let replica = Replica::start(&server, "replica-a", &record);
    let started = Instant::now();
    while started.elapsed() < 2 * LEASE_DURATION {
        tokio::time::sleep(RETRY_PERIOD).await;
        lease.spec.as_mut().unwrap().renew_time = Some(far());
        lease = leases
            .replace(LEASE, &PostParams::default(), &lease)
            .await
            .unwrap();
        assert!(!replica.leading(), "taken while the holder renews");
    }
    assert_eq!(replica.status().leader.as_deref(), Some("elsewhere"));
    // The holder stops renewing (and its timestamps still say it is valid for a year).
    let last_renewal = Instant::now();
    eventually("the replica takes over", || replica.leading()).await;
    let waited = last_renewal.elapsed();
    println!("takeover after the holder's last renewal: {waited:?}");
    assert!(waited >= LEASE_DURATION - RETRY_PERIOD, "{waited:?}");
    assert!(
        waited <= LEASE_DURATION + 2 * JITTERED_RETRY + ROUND_TRIPS,
        "{waited:?}"
    );
    let spec = lease_spec(&server);
    assert_eq!(spec.holder_identity.as_deref(), Some("replica-a"));
    assert_eq!(spec.lease_transitions, Some(4));
}

/// Takeover times, graceful and crash, over `runs` pairs of replicas with `timings`
/// (lease duration, renew deadline, retry period).
async fn measure(timings: (Duration, Duration, Duration), runs: usize) {
    let (lease, renew, retry) = timings;
    let with = |name: &str| {
        LeaderElection::new(LEASE)
            .identity(name)
            .lease_duration(lease)
            .renew_deadline(renew)
            .retry_period(retry)
    };
    let mut graceful = Vec::new();
    let mut crash = Vec::new();
    for run in 0..runs {
        for kill in [false, true] {
            let server = server(5).await;
            let record = Arc::new(Record::default());
            let mut a = Replica::start_with(&server, "replica-a", &record, with("replica-a"), None);
            eventually("replica-a leads", || a.leading()).await;
            let b = Replica::start_with(&server, "replica-b", &record, with("replica-b"), None);
            eventually("replica-b sees replica-a", || {
                b.status().leader.as_deref() == Some("replica-a")
            })
            .await;
            // A random phase against the leader's renewals.
            tokio::time::sleep(retry.mul_f64(1.0 + rand_fraction(run))).await;
            let at = if kill { a.kill() } else { a.shut_down() };
            let mut took = None;
            for _ in 0..6000 {
                if let Some(start) = record.first_start("replica-b", at) {
                    took = Some(start - at);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let took = took.expect("replica-b took over within 30 s");
            record.assert_one_leader_at_a_time();
            if kill { &mut crash } else { &mut graceful }.push(took);
        }
    }
    let report = |what: &str, times: &mut Vec<Duration>| {
        times.sort();
        println!(
            "{what}: min {:?}, median {:?}, max {:?} over {} runs",
            times[0],
            times[times.len() / 2],
            times[times.len() - 1],
            times.len()
        );
    };
    println!("lease {lease:?}, renew deadline {renew:?}, retry period {retry:?}:");
    report(
        "graceful takeover (release to first reconcile)",
        &mut graceful,
    );
    report("crash takeover (kill to first reconcile)", &mut crash);
}

/// A fraction in [0, 1) that differs between runs.
fn rand_fraction(run: usize) -> f64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    f64::from((nanos ^ (run as u32).wrapping_mul(2_654_435_761)) % 1000) / 1000.0
}

/// A measurement, not a test: `cargo test -p workq-kube --all-features --test leader
/// -- --ignored --nocapture measure_`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement (about 15 s)"]
async fn measure_takeovers_with_the_test_timings() {
    measure((LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD), 10).await;
}

/// A measurement with client-go's defaults (about two minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement (about two minutes)"]
async fn measure_takeovers_with_client_go_defaults() {
    use workq_kube::leader::{
        DEFAULT_LEASE_DURATION, DEFAULT_RENEW_DEADLINE, DEFAULT_RETRY_PERIOD,
    };
    measure(
        (
            DEFAULT_LEASE_DURATION,
            DEFAULT_RENEW_DEADLINE,
            DEFAULT_RETRY_PERIOD,
        ),
        4,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_outage_ends_with_one_leader_again() {
    let server = server(5).await;
    let record = Arc::new(Record::default());
    let replicas = ["replica-a", "replica-b"].map(|name| Replica::start(&server, name, &record));
    let all: Vec<&Replica> = replicas.iter().collect();
    let leader = wait_for_leader(&all).await;
    eventually("the leader reconciles", || {
        record.count(&replicas[leader].name) >= 10
    })
    .await;

    // Nobody can renew or acquire while the server is down: the leader steps down at its
    // renew deadline, and nobody leads.
    server.stop_serving();
    let down = Instant::now();
    eventually("no leader", || leaders(&all).is_empty()).await;
    println!(
        "outage: no leader {:?} after the server went down",
        down.elapsed()
    );
    tokio::time::sleep(LEASE_DURATION).await;
    assert!(leaders(&all).is_empty());

    server.serve_again().await;
    let up = Instant::now();
    eventually("one leader again", || leaders(&all).len() == 1).await;
    let leader = wait_for_leader(&all).await;
    eventually("it reconciles", || {
        record.first_start(&replicas[leader].name, up).is_some()
    })
    .await;
    println!(
        "outage: {} leads {:?} after the server came back",
        replicas[leader].name,
        up.elapsed()
    );
    let settled = Instant::now();
    while settled.elapsed() < 3 * RETRY_PERIOD {
        assert_eq!(leaders(&all).len(), 1);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    record.assert_one_leader_at_a_time();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_deleted_under_its_holder_is_not_taken_before_it_would_have_expired() {
    let server = server(5).await;
    let record = Arc::new(Record::default());
    let replicas = ["replica-a", "replica-b"].map(|name| Replica::start(&server, name, &record));
    let all: Vec<&Replica> = replicas.iter().collect();
    let leader = wait_for_leader(&all).await;
    let (name, standby) = (
        replicas[leader].name.clone(),
        replicas[1 - leader].name.clone(),
    );
    eventually("the standby sees the leader", || {
        replicas[1 - leader].status().leader.as_deref() == Some(name.as_str())
    })
    .await;
    eventually("the leader reconciles", || record.count(&name) >= 10).await;
    // Someone deletes the Lease by hand while the leader cannot write it again (cut off):
    // the leader goes on until its renew deadline, so the standby must not create the Lease
    // as its own before the lease it last saw would have expired.
    server.partition(&name);
    let deleted = Instant::now();
    assert!(server.delete::<Lease>(Some("default"), LEASE));
    eventually("the standby takes over", || {
        record.first_start(&standby, deleted).is_some()
    })
    .await;
    let took = record.first_start(&standby, deleted).unwrap() - deleted;
    println!("a deleted Lease: the standby took over {took:?} after the deletion");
    // The standby last saw the record change at most a retry period (and a round trip)
    // before the deletion; it waits a lease duration from then.
    assert!(
        took >= LEASE_DURATION - RETRY_PERIOD - ROUND_TRIPS,
        "{took:?}"
    );
    assert_eq!(
        lease_spec(&server).holder_identity.as_deref(),
        Some(standby.as_str())
    );
    record.assert_one_leader_at_a_time();
    server.heal(&name);
}

/// The longest timings client-go's rules allow (a lease of `i32::MAX` seconds, about 68
/// years, a renew deadline a second shorter, a retry period of a year): the controller
/// leads, reconciles, and on a graceful stop releases the Lease at once (the release is
/// bounded by the renew deadline, plus a second for the task); no instant overflows.
/// `Duration::MAX` for any of the three is refused when the election is given to the
/// controller, with the rule it breaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_timings_lead_and_release_and_duration_max_is_refused() {
    let server = server(1).await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let longest = Duration::from_secs(i32::MAX.unsigned_abs().into());
    let record = Arc::new(Record::default());
    let context = Arc::new(Context {
        replica: "only".to_owned(),
        record: record.clone(),
        slow: None,
    });
    let running = Controller::new(api.clone(), watcher::Config::default())
        .leader_election(
            LeaderElection::new(LEASE)
                .identity("only")
                .lease_duration(longest)
                .renew_deadline(longest - Duration::from_secs(1))
                .retry_period(Duration::from_secs(365 * 24 * 3600)),
        )
        .run(reconcile, context);
    eventually("the object reconciled", || record.count("only") >= 1).await;
    assert!(running.is_leader());
    let spec = lease_spec(&server);
    assert_eq!(spec.holder_identity.as_deref(), Some("only"));
    assert_eq!(spec.lease_duration_seconds, Some(i32::MAX));
    tokio::time::timeout(Duration::from_secs(10), running.shut_down())
        .await
        .expect("a graceful stop")
        .unwrap();
    assert_eq!(lease_spec(&server).holder_identity.as_deref(), Some(""));

    for (election, rule) in [
        (
            LeaderElection::new(LEASE).lease_duration(Duration::MAX),
            "does not fit leaseDurationSeconds",
        ),
        (
            LeaderElection::new(LEASE).renew_deadline(Duration::MAX),
            "must be longer than the renew deadline",
        ),
        (
            LeaderElection::new(LEASE).retry_period(Duration::MAX),
            "1.2 retry periods",
        ),
    ] {
        let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            drop(
                Controller::new(api.clone(), watcher::Config::default()).leader_election(election),
            );
        }))
        .expect_err("refused");
        let message = refused
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(
            message.starts_with("invalid leader election") && message.contains(rule),
            "{message}"
        );
    }
}
