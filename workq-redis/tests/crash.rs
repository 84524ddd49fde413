//! Nothing lost, never twice at once, on real servers, under every fault a deployment meets.
//!
//! Each scenario starts its own `redis-server` (a free loopback port, its own data directory,
//! stopped by PID), runs worker *processes* (this binary re-executed with `--worker`) that
//! record a history, and applies timed faults: `kill -9` of workers mid-item, a graceful stop
//! that aborts a worker's handler mid-item, `SIGSTOP` of a worker or of the server past the
//! lease, `kill -9` of the server and a restart from its AOF (also while a large AOF loads), a
//! restart from a snapshot older than the tokens handed out since, a full server
//! (`maxmemory`, `noeviction`), and a busy script (`BUSY`). Each worker process is either one
//! get-work-done loop or a pool of `Workers`, which end their items in batched steps
//! (`done_and_next_many`, as they do on Redis by default); the `workers_` scenarios run the
//! faults on pools. A checker then proves, from the histories:
//!
//! - **nothing acknowledged lost**: every acknowledged add of an item (with its sequence number
//!   `s`, taken on the server from the counter behind lease tokens) is followed by a
//!   processing of that item under a lease whose token is larger than `s` and whose `done` was
//!   accepted (or may have been: killed while `done` was in flight);
//! - **never twice at once**: two processings of one item may overlap in time (all processes
//!   read one host's clock) only where a lease could legitimately expire: the older holder was
//!   live during a pause of its process, a pause of the server, or a server restart that lost
//!   its lease. Any other overlap fails, whatever the `done`s said; and in every overlap the
//!   older holder's `done` must have been refused (fencing);
//! - **delays honoured**: an item added with a delay (or rate limited) is not handed out before
//!   the add was sent plus its delay;
//! - **tokens never go backwards**: every token handed out after a server restart is larger
//!   than every token handed out before it.
//!
//! Control runs must make the checker fail: persistence off (losses), fencing switched off
//! (a stale holder's `done` accepted during an overlap) and no re-queue of an item re-added
//! while processing (losses), the last two through the library's test-only `Mutation`s
//! (feature `fault-injection`), with loops and with pools. The busy-script run also requires
//! every `done` to be settled (accepted or refused, none left unsure): a `BUSY` is waited out.
//!
//! This is a test binary without the standard harness (it runs child processes); it prints
//! one line per scenario and a `test result:` line. Filters on the command line select
//! scenarios by substring. Without `redis-server` it fails with a note naming the package,
//! unless `WQ_SKIP_REDIS_TESTS=1` (outside CI), when the scenarios count as ignored.

use workq_conformance::servers::redis as server;

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use server::{Durability, RedisServer};
use workq::{AddKind, AddOptions, DoneMany, Outcome, Queue, QueueLease, Workers};
use workq_redis::{Error, Mutation, RateLimit, RedisQueue};

/// Microseconds since the Unix epoch: one clock for every process on this host.
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A small deterministic generator (no dependency needed for a few random choices).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407)
            | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

// ===== the worker process =====

/// Runs one worker: get, work, done, until the queue is shut down; every step is appended to
/// the history file before or after it happens (see the checker for which). With
/// `WQ_GRACEFUL=1` the worker stops gracefully when its standard input closes: it aborts the
/// handler it is running (the lease is dropped, so released), shuts its handle down and exits.
/// With `WQ_POOL=n` the process runs a pool of `n` `Workers` instead ([`pool_main`]).
fn worker_main() -> ExitCode {
    let env = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let url = env("WQ_URL");
    let name = env("WQ_QUEUE");
    let log = PathBuf::from(env("WQ_LOG"));
    let lease_ms: u64 = env("WQ_LEASE_MS").parse().unwrap();
    let work: Vec<u64> = env("WQ_WORK_MS")
        .split(',')
        .map(|s| s.parse().unwrap())
        .collect();
    let mutation = match std::env::var("WQ_MUTATION").as_deref() {
        Ok("no-fencing") => Some(Mutation::NoFencing),
        Ok("no-dirty-requeue") => Some(Mutation::NoDirtyRequeue),
        _ => None,
    };
    let graceful = std::env::var("WQ_GRACEFUL").is_ok_and(|v| v == "1");
    let (work_min, work_max, slow_pct, slow_ms) = (work[0], work[1], work[2], work[3]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Closed standard input is the graceful stop request.
    let (stop_tx, mut stop) = tokio::sync::watch::channel(false);
    if graceful {
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
            let _ = stop_tx.send(true);
        });
    }
    let pool: usize = std::env::var("WQ_POOL")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    runtime.block_on(async move {
        let queue: RedisQueue<String> = loop {
            let mut builder = RedisQueue::builder(name.as_str())
                .url(url.as_str())
                .lease_duration(Duration::from_millis(lease_ms))
                .poll_interval(Duration::from_millis(500))
                .response_timeout(Duration::from_millis(1000))
                .retry_deadline(Duration::from_secs(30))
                .check_persistence(false);
            if let Some(mutation) = mutation {
                builder = builder.mutation(mutation);
            }
            match builder.build().await {
                Ok(queue) => break queue,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        let mut rng = Rng::new(u64::from(std::process::id()) ^ now_us());
        if pool > 0 {
            pool_main(queue, &log, pool, rng, work, graceful.then_some(stop)).await;
            return;
        }
        let mut history = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("open the history");
        let mut record = |line: String| {
            // One write per line: a kill can cut off at most the line being written.
            history.write_all(line.as_bytes()).unwrap();
        };
        let stopped = |stop: &tokio::sync::watch::Receiver<bool>| *stop.borrow();
        loop {
            if stopped(&stop) {
                break;
            }
            let got = tokio::select! {
                got = queue.get() => got,
                _ = stop.changed(), if graceful => break,
            };
            let lease = match got {
                Ok(Some(lease)) => lease,
                Ok(None) => break,
                Err(_) => {
                    record(format!("X get - {}\n", now_us()));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let (item, token) = (lease.item().clone(), lease.token());
            record(format!("S {item} {token} {}\n", now_us()));
            let ms = if rng.below(100) < slow_pct {
                slow_ms
            } else {
                work_min + rng.below(work_max - work_min + 1)
            };
            // The handler owns the lease while it works: aborting it drops the lease.
            let mut handler = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                lease
            });
            let finished = tokio::select! {
                finished = &mut handler => finished,
                _ = stop.changed(), if graceful => {
                    handler.abort();
                    let _ = (&mut handler).await;
                    // Recorded before the release (spawned by the drop) can run on this
                    // single-threaded runtime: nobody else holds the item yet.
                    record(format!("A {item} {token} {}\n", now_us()));
                    break;
                }
            };
            let Ok(lease) = finished else { break };
            record(format!("E {item} {token} {}\n", now_us()));
            // A worker that lost its lease still tries to commit: the server must refuse.
            let outcome = match lease.done().await {
                Ok(()) => "ok",
                Err(Error::LeaseLost) => "stale",
                Err(_) => "unknown",
            };
            record(format!("D {item} {token} {outcome}\n"));
        }
        // A graceful stop: this handle only; the dropped lease's release gets time to go out.
        queue.shut_down();
        tokio::time::sleep(Duration::from_millis(300)).await;
    });
    ExitCode::SUCCESS
}

// ===== the worker process, as a pool of `Workers` (batched steps) =====

/// A process's history file, shared by its tasks: one write per line.
#[derive(Clone)]
struct History(Arc<Mutex<File>>);

impl History {
    fn open(log: &std::path::Path) -> Self {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("open the history");
        History(Arc::new(Mutex::new(file)))
    }

    /// One write per line: a kill can cut off at most the line being written.
    fn record(&self, line: &str) {
        self.0.lock().unwrap().write_all(line.as_bytes()).unwrap();
    }

    /// A `done`'s outcome, as the checker reads it.
    fn done(&self, (item, token): &(String, u64), outcome: Result<(), &Error>) {
        let outcome = match outcome {
            Ok(()) => "ok",
            Err(Error::LeaseLost) => "stale",
            Err(_) => "unknown",
        };
        self.record(&format!("D {item} {token} {outcome}\n"));
    }
}

/// The queue a pool of `Workers` runs on in a worker process: the process's `RedisQueue`
/// unchanged (its batch limit and steps in flight included, so the pool batches its steps
/// as it does on Redis), with each lease's token carried in its item, so that the handler
/// can record which lease it works under, and each `done` the pool settles recorded with
/// its outcome. A step is recorded too (`B dones asked handed-out`), for the run's figures.
#[derive(Clone)]
struct Recorded {
    queue: RedisQueue<String>,
    history: History,
}

/// A lease of [`Recorded`]: its item is the item and the lease's token. One dropped without
/// a `done` or a release (its worker's task aborted by a graceful stop) is recorded as
/// released (`A`) as it drops: the Redis lease's drop releases it, after that.
#[derive(Debug)]
struct RecordedLease {
    lease: Option<workq_redis::Lease<String>>,
    item: (String, u64),
    history: History,
}

impl RecordedLease {
    /// The Redis lease, to end: this one then records nothing as it drops.
    fn take(mut self) -> workq_redis::Lease<String> {
        self.lease.take().expect("a lease is ended once")
    }
}

impl Drop for RecordedLease {
    fn drop(&mut self) {
        if self.lease.take().is_some() {
            let (item, token) = &self.item;
            self.history
                .record(&format!("A {item} {token} {}\n", now_us()));
        }
    }
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("History")
    }
}

impl Recorded {
    fn wrap(&self, lease: workq_redis::Lease<String>) -> RecordedLease {
        RecordedLease {
            item: (lease.item().clone(), lease.token()),
            lease: Some(lease),
            history: self.history.clone(),
        }
    }
}

impl QueueLease for RecordedLease {
    type Item = (String, u64);
    type Error = Error;

    fn item(&self) -> &(String, u64) {
        &self.item
    }

    fn priority(&self) -> i32 {
        self.lease.as_ref().expect("a lease not ended").priority()
    }

    async fn done(self) -> Result<(), Error> {
        let (item, history) = (self.item.clone(), self.history.clone());
        let outcome = self.take().done().await;
        history.done(&item, outcome.as_ref().copied());
        outcome
    }

    async fn release(self) -> Result<bool, Error> {
        let (item, token) = &self.item;
        self.history
            .record(&format!("A {item} {token} {}\n", now_us()));
        QueueLease::release(self.take()).await
    }
}

impl Queue for Recorded {
    type Item = (String, u64);
    type Lease = RecordedLease;
    type Error = Error;

    fn is_lease_lost(error: &Error) -> bool {
        error.is_lease_lost()
    }

    fn name(&self) -> Option<&str> {
        Queue::name(&self.queue)
    }

    async fn add_with(&self, item: (String, u64), options: AddOptions) -> Result<bool, Error> {
        Queue::add_with(&self.queue, item.0, options).await
    }

    async fn forget(&self, item: &(String, u64)) -> Result<(), Error> {
        self.queue.forget(&item.0).await
    }

    async fn num_requeues(&self, item: &(String, u64)) -> Result<usize, Error> {
        self.queue.num_requeues(&item.0).await
    }

    async fn len(&self) -> Result<usize, Error> {
        self.queue.len().await
    }

    async fn get(&self) -> Result<Option<RecordedLease>, Error> {
        match Queue::get(&self.queue).await {
            Ok(lease) => Ok(lease.map(|lease| self.wrap(lease))),
            Err(error) => {
                self.history.record(&format!("X get - {}\n", now_us()));
                Err(error)
            }
        }
    }

    async fn done_and_next(
        &self,
        lease: RecordedLease,
        forget: bool,
    ) -> Result<Option<RecordedLease>, Error> {
        let item = lease.item.clone();
        let outcome = Queue::done_and_next(&self.queue, lease.take(), forget).await;
        self.history.done(&item, outcome.as_ref().map(|_| ()));
        Ok(outcome?.map(|lease| self.wrap(lease)))
    }

    async fn retry_and_done(
        &self,
        lease: RecordedLease,
        options: AddOptions,
        forget: bool,
    ) -> Result<Option<RecordedLease>, Error> {
        let item = lease.item.clone();
        match Queue::retry_and_done(&self.queue, lease.take(), options, forget).await {
            Ok(Some(back)) => Ok(Some(self.wrap(back))),
            outcome => {
                self.history.done(&item, outcome.as_ref().map(|_| ()));
                outcome.map(|_| None)
            }
        }
    }

    async fn done_and_next_many(
        &self,
        leases: Vec<(RecordedLease, bool)>,
        max: usize,
    ) -> Result<DoneMany<RecordedLease, Error>, Error> {
        let items: Vec<(String, u64)> = leases.iter().map(|(l, _)| l.item.clone()).collect();
        let leases = leases.into_iter().map(|(l, f)| (l.take(), f)).collect();
        match Queue::done_and_next_many(&self.queue, leases, max).await {
            Ok(step) => {
                for (item, outcome) in items.iter().zip(&step.done) {
                    self.history.done(item, outcome.as_ref().copied());
                }
                self.history
                    .record(&format!("B {} {max} {}\n", items.len(), step.next.len()));
                Ok(DoneMany {
                    done: step.done,
                    next: step.next.into_iter().map(|l| self.wrap(l)).collect(),
                })
            }
            Err(error) => {
                self.history.record(&format!(
                    "X step {} {}\n",
                    items.len(),
                    error.to_string().replace(' ', "_")
                ));
                // Whether any of the dones applied is unknown.
                for item in &items {
                    self.history.done(item, Err(&error));
                }
                Err(error)
            }
        }
    }

    fn batch_limit(&self) -> usize {
        Queue::batch_limit(&self.queue)
    }

    fn steps_in_flight(&self) -> usize {
        Queue::steps_in_flight(&self.queue)
    }

    fn shut_down(&self) -> Vec<(String, u64)> {
        Queue::shut_down(&self.queue);
        Vec::new()
    }

    async fn shut_down_with_drain(&self) -> Result<(), Error> {
        self.queue.shut_down_with_drain().await
    }

    async fn is_shutting_down(&self) -> Result<bool, Error> {
        self.queue.is_shutting_down().await
    }
}

/// Runs a pool of `count` `Workers` on `queue` (batched steps, as on Redis by default) until
/// the queue is shut down for the fleet and empty, or, with `stop`, until it says so: a
/// graceful stop, after which the handlers still running 20 ms later are aborted mid-item
/// (their leases released as they drop) and the process exits. The handler records the
/// start and the end of its work (`S`, `E`), the queue each `done` the pool's steps settle
/// (`D`).
async fn pool_main(
    queue: RedisQueue<String>,
    log: &std::path::Path,
    count: usize,
    rng: Rng,
    work: Vec<u64>,
    stop: Option<tokio::sync::watch::Receiver<bool>>,
) {
    let history = History::open(log);
    let recorded = Recorded {
        queue: queue.clone(),
        history: history.clone(),
    };
    let rng = Arc::new(Mutex::new(rng));
    let (work_min, work_max, slow_pct, slow_ms) = (work[0], work[1], work[2], work[3]);
    let mut workers = Workers::new(recorded).count(count).retry_forever();
    if stop.is_some() {
        workers = workers.shutdown_timeout(Duration::from_millis(20));
    }
    let workers = workers.spawn_async(move |(item, token): (String, u64)| {
        let history = history.clone();
        let ms = {
            let mut rng = rng.lock().unwrap();
            if rng.below(100) < slow_pct {
                slow_ms
            } else {
                work_min + rng.below(work_max - work_min + 1)
            }
        };
        async move {
            history.record(&format!("S {item} {token} {}\n", now_us()));
            tokio::time::sleep(Duration::from_millis(ms)).await;
            history.record(&format!("E {item} {token} {}\n", now_us()));
            Outcome::Done
        }
    });
    match stop {
        Some(mut stop) => {
            workers
                .run_until(async move {
                    let _ = stop.wait_for(|stopped| *stopped).await;
                })
                .await;
            // The dropped leases' releases get time to go out.
            queue.shut_down();
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        None => {
            workers.wait().await;
        }
    }
}

// ===== the harness =====

/// One fault, at a point of the run.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// `kill -9` a random worker (a fresh one starts).
    KillWorker,
    /// Close a random worker's standard input: it aborts its handler mid-item, so its lease is
    /// dropped (released), and exits (a fresh one starts).
    StopWorker,
    /// `SIGSTOP` a random worker for this long, then `SIGCONT`.
    PauseWorker(Duration),
    /// `SIGSTOP` the server for this long (a partition), then `SIGCONT`.
    PauseServer(Duration),
    /// `kill -9` the server, restart it from its data directory after this long.
    KillServer(Duration),
    /// `SAVE` a snapshot now; a later [`Fault::KillServer`] restarts from it.
    Snapshot,
    /// Step the server's clock forward by this many seconds (libfaketime's control file).
    StepClock(u64),
    /// A script keeps the server busy for this long (it answers every other call `BUSY`),
    /// then `SCRIPT KILL`.
    BusyServer(Duration),
}

/// What a run must show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Every rule holds.
    Pass,
    /// A control run: the checker must report lost adds.
    Losses,
    /// A control run: the checker must report a stale holder's `done` accepted in an overlap.
    FencingViolation,
}

/// How a scenario runs.
#[derive(Debug, Clone)]
struct Scenario {
    name: &'static str,
    durability: Durability,
    /// Worker processes.
    workers: usize,
    /// 0: each process is one get-work-done loop; n: each runs a pool of n `Workers`, which
    /// end their items in batched steps.
    pool: usize,
    lease_ms: u64,
    /// Work per item: min, max, percentage of slow items, slow duration (ms).
    work: [u64; 4],
    /// Distinct items added, and adds in all (the rest are re-adds of hot or earlier items).
    distinct: usize,
    adds: usize,
    hot_keys: usize,
    /// Re-adds pick among the last this many distinct items (0: among all so far).
    readd_recent: usize,
    /// Pause between adds.
    add_every: Duration,
    /// Percentages of adds that are `add_after` (delay 50-400 ms) and `add_rate_limited`,
    /// each of a fresh item.
    delayed_pct: u64,
    rate_limited_pct: u64,
    /// Item names padded to this many bytes (a full server fills sooner).
    pad: usize,
    /// Faults at these points of the run (ms from its start).
    faults: Vec<(u64, Fault)>,
    /// Keys of filler loaded (and rewritten into the AOF) before the run.
    filler_keys: u64,
    /// `maxmemory` set once this many adds are acknowledged, a little below the memory used
    /// then.
    memory_limit_after: Option<usize>,
    mutation: Option<&'static str>,
    graceful: bool,
    /// Run the server under libfaketime (Debian package faketime), whose offset the
    /// [`Fault::StepClock`] faults change.
    skew: bool,
    expect: Expect,
    /// The run must show at least this many refused (stale) dones, released leases, and adds
    /// refused by a full server: the fault really happened.
    min_stale: usize,
    min_released: usize,
    min_refused_adds: usize,
    /// The run must show no `get` that returned an error to a worker.
    no_get_errors: bool,
    /// The run must leave no `done` unsure: every one accepted or refused (a fault that
    /// refuses calls without running them, like `BUSY`, is waited out).
    no_unknown_dones: bool,
}

struct Worker {
    child: Child,
    log: PathBuf,
}

/// A span of the run in which a lease could legitimately expire: a pause of one worker's
/// process (`log`), or of the whole server (`None`).
#[derive(Debug, Clone)]
struct Window {
    log: Option<PathBuf>,
    from: u64,
    to: u64,
}

struct Harness {
    scenario: Scenario,
    server: RedisServer,
    queue_name: String,
    dir: PathBuf,
    workers: Vec<Worker>,
    spawned: usize,
    /// Log file -> kill time, for workers killed with `kill -9`.
    killed: HashMap<PathBuf, u64>,
    windows: Vec<Window>,
    /// Server restarts: (kill time, back up time).
    restarts: Vec<(u64, u64)>,
    /// When the snapshot the server restarts from was taken (adds after it are not kept).
    snapshot_at: Option<u64>,
    /// The longest a restart took to answer `PING` (a large AOF loading).
    longest_restart: Duration,
    /// libfaketime's control file, when the server runs under it.
    clock_file: Option<PathBuf>,
    /// Busy scripts run.
    busy: usize,
}

impl Harness {
    fn spawn_worker(&mut self) {
        let log = self.dir.join(format!("worker-{}.log", self.spawned));
        self.spawned += 1;
        File::create(&log).unwrap();
        let s = &self.scenario;
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .arg("--worker")
            .env("WQ_URL", self.server.url())
            .env("WQ_QUEUE", &self.queue_name)
            .env("WQ_LOG", &log)
            .env("WQ_LEASE_MS", s.lease_ms.to_string())
            .env("WQ_WORK_MS", s.work.map(|w| w.to_string()).join(","))
            .env("WQ_GRACEFUL", if s.graceful { "1" } else { "0" })
            .env("WQ_POOL", s.pool.to_string())
            .stdin(if s.graceful {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(mutation) = s.mutation {
            command.env("WQ_MUTATION", mutation);
        }
        let child = command.spawn().expect("start a worker process");
        self.workers.push(Worker { child, log });
    }

    fn kill_worker(&mut self, index: usize) {
        let mut worker = self.workers.swap_remove(index);
        let _ = worker.child.kill();
        let _ = worker.child.wait();
        self.killed.insert(worker.log, now_us());
    }

    /// Closes the worker's standard input and waits (at most 5 s) for it to exit.
    async fn stop_worker(&mut self, index: usize) {
        let mut worker = self.workers.swap_remove(index);
        drop(worker.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && matches!(worker.child.try_wait(), Ok(None)) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if matches!(worker.child.try_wait(), Ok(None)) {
            // Did not stop: a kill, recorded as such.
            let _ = worker.child.kill();
            self.killed.insert(worker.log.clone(), now_us());
        }
        let _ = worker.child.wait();
    }

    fn signal_worker(&self, index: usize, signal: &str) {
        let _ = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.workers[index].child.id().to_string())
            .status();
    }

    async fn apply(&mut self, fault: Fault, rng: &mut Rng) {
        let victim = rng.below(self.workers.len() as u64) as usize;
        match fault {
            Fault::KillWorker => {
                self.kill_worker(victim);
                self.spawn_worker();
            }
            Fault::StopWorker => {
                self.stop_worker(victim).await;
                self.spawn_worker();
            }
            Fault::PauseWorker(stop) => {
                let from = now_us();
                self.signal_worker(victim, "STOP");
                tokio::time::sleep(stop).await;
                self.signal_worker(victim, "CONT");
                self.windows.push(Window {
                    log: Some(self.workers[victim].log.clone()),
                    from,
                    to: now_us(),
                });
            }
            Fault::PauseServer(stop) => {
                let from = now_us();
                self.server.signal("STOP");
                tokio::time::sleep(stop).await;
                self.server.signal("CONT");
                self.windows.push(Window {
                    log: None,
                    from,
                    to: now_us(),
                });
            }
            Fault::KillServer(down) => {
                let at = now_us();
                self.server.kill();
                tokio::time::sleep(down).await;
                let started = Instant::now();
                // Waits until the server answers PING (not LOADING).
                self.server.restart();
                self.longest_restart = self.longest_restart.max(started.elapsed());
                let up = now_us();
                self.restarts.push((at, up));
                if self.snapshot_at.is_some() {
                    // Leases handed out after the snapshot are gone from the server: their
                    // holders may overlap the next ones until they try to finish.
                    self.windows.push(Window {
                        log: None,
                        from: at,
                        to: up,
                    });
                }
            }
            Fault::Snapshot => {
                let mut con = redis::Client::open(self.server.url())
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap();
                let at = now_us();
                let _: () = redis::cmd("SAVE").query_async(&mut con).await.unwrap();
                self.snapshot_at = Some(at);
            }
            Fault::BusyServer(busy) => {
                let url = self.server.url();
                let script = tokio::spawn(async move {
                    let mut con = redis::Client::open(url)
                        .unwrap()
                        .get_multiplexed_async_connection()
                        .await
                        .unwrap();
                    let _: redis::RedisResult<()> = redis::cmd("EVAL")
                        .arg("while true do end")
                        .arg(0)
                        .query_async(&mut con)
                        .await;
                });
                tokio::time::sleep(busy).await;
                let mut con = redis::Client::open(self.server.url())
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap();
                let killed: redis::RedisResult<()> =
                    redis::cmd("SCRIPT").arg("KILL").query_async(&mut con).await;
                let _ = script.await;
                if killed.is_ok() {
                    self.busy += 1;
                }
            }
            Fault::StepClock(secs) => {
                let at = now_us();
                if let Some(file) = &self.clock_file {
                    std::fs::write(file, format!("+{secs}\n")).unwrap();
                }
                // Every lease live at the step may expire at once.
                self.windows.push(Window {
                    log: None,
                    from: at,
                    to: at + 100_000,
                });
            }
        }
    }
}

/// One acknowledged add.
#[derive(Debug, Clone)]
struct Add {
    item: String,
    seq: u64,
    /// When the acknowledgement came.
    acked: u64,
    /// The item must not be handed out before this (0: no delay).
    not_before: u64,
}

/// What the checker found.
#[derive(Debug, Default)]
struct Report {
    adds: usize,
    /// Adds the checker holds the run to (all but those a snapshot restore legitimately drops).
    checked_adds: usize,
    processings: usize,
    accepted: usize,
    stale: usize,
    unknown: usize,
    released: usize,
    killed_mid_item: usize,
    lost_adds: usize,
    lost_items: Vec<String>,
    raw_overlaps: usize,
    /// Overlaps inside a window where a lease could legitimately expire.
    excused_overlaps: usize,
    /// Overlaps outside every such window: always a failure.
    unexcused_overlaps: Vec<String>,
    /// Overlaps where the older holder's `done` was accepted: always a failure.
    fencing_violations: Vec<String>,
    /// Overlaps where both dones were accepted.
    accepted_overlaps: usize,
    early: Vec<String>,
    tokens_backwards: Vec<String>,
    get_errors: usize,
    /// Batched steps of the pools (`B` lines), the dones they carried, the largest.
    steps: usize,
    step_dones: usize,
    largest_step: usize,
}

/// One processing of an item under one lease.
#[derive(Debug, Default, Clone)]
struct Processing {
    log: PathBuf,
    token: u64,
    start: u64,
    end: Option<u64>,
    /// `ok`, `stale`, `unknown`, `released`, or empty if no `done` was recorded.
    done: String,
}

impl Processing {
    /// Whether the holder's `done` was (or may have been) accepted.
    fn committed(&self) -> bool {
        self.done == "ok" || self.done == "unknown"
    }
    fn end(&self) -> u64 {
        self.end.unwrap_or(u64::MAX)
    }
}

fn read_histories(
    logs: &[PathBuf],
    killed: &HashMap<PathBuf, u64>,
    report: &mut Report,
) -> HashMap<String, BTreeMap<u64, Processing>> {
    // item -> token -> processing
    let mut seen: HashMap<String, BTreeMap<u64, Processing>> = HashMap::new();
    for log in logs {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let kill = killed.get(log).copied();
        let mut open: HashMap<(String, u64), Processing> = HashMap::new();
        for line in text.lines() {
            let parts: Vec<&str> = line.split(' ').collect();
            if parts.len() != 4 {
                continue; // cut off by a kill
            }
            if parts[0] == "X" {
                report.get_errors += 1;
                continue;
            }
            if parts[0] == "B" {
                let dones: usize = parts[1].parse().unwrap_or(0);
                report.steps += 1;
                report.step_dones += dones;
                report.largest_step = report.largest_step.max(dones);
                continue;
            }
            let (item, Ok(token)) = (parts[1].to_string(), parts[2].parse::<u64>()) else {
                continue;
            };
            match parts[0] {
                "S" => {
                    let start = parts[3].parse().unwrap_or(0);
                    open.insert(
                        (item, token),
                        Processing {
                            log: log.clone(),
                            token,
                            start,
                            ..Default::default()
                        },
                    );
                }
                "E" => {
                    if let Some(p) = open.get_mut(&(item, token)) {
                        p.end = parts[3].parse().ok();
                    }
                }
                "D" | "A" => {
                    if let Some(mut p) = open.remove(&(item.clone(), token)) {
                        if parts[0] == "A" {
                            p.end = parts[3].parse().ok();
                            p.done = "released".into();
                        } else {
                            p.done = parts[3].to_string();
                        }
                        seen.entry(item).or_default().insert(token, p);
                    }
                }
                _ => {}
            }
        }
        // Processings the kill interrupted.
        for ((item, token), mut p) in open {
            if p.end.is_some() {
                // Killed while `done` was in flight: it may have been applied.
                p.done = "unknown".into();
            } else {
                p.end = Some(kill.unwrap_or(u64::MAX));
                report.killed_mid_item += 1;
            }
            seen.entry(item).or_default().insert(token, p);
        }
    }
    seen
}

fn check(adds: &[Add], logs: &[PathBuf], h: &Harness) -> Report {
    let mut report = Report {
        adds: adds.len(),
        ..Report::default()
    };
    let seen = read_histories(logs, &h.killed, &mut report);
    for (item, processings) in &seen {
        for p in processings.values() {
            report.processings += 1;
            match p.done.as_str() {
                "ok" => report.accepted += 1,
                "stale" => report.stale += 1,
                "unknown" => report.unknown += 1,
                "released" => report.released += 1,
                _ => {}
            }
        }
        // In token order: `a` is the older holder of every pair.
        let list: Vec<&Processing> = processings.values().collect();
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                if !(a.start < b.end() && b.start < a.end()) {
                    continue;
                }
                report.raw_overlaps += 1;
                let what = format!(
                    "{item}: token {} ({}..{:?}, {}) and token {} ({}..{:?}, {})",
                    a.token, a.start, a.end, a.done, b.token, b.start, b.end, b.done
                );
                let excused = h.windows.iter().any(|w| {
                    w.log.as_ref().is_none_or(|log| *log == a.log)
                        && a.start < w.to
                        && a.end() > w.from
                });
                if excused {
                    report.excused_overlaps += 1;
                } else {
                    report.unexcused_overlaps.push(what.clone());
                }
                if a.done == "ok" {
                    report.fencing_violations.push(what);
                }
                if a.committed() && b.committed() {
                    report.accepted_overlaps += 1;
                }
            }
        }
        // Delays honoured: 2 ms for the clocks' granularity.
        for add in adds.iter().filter(|a| a.item == *item && a.not_before > 0) {
            if let Some(p) = processings
                .values()
                .find(|p| p.start + 2_000 < add.not_before)
            {
                report.early.push(format!(
                    "{item}: handed out {} ms before its delay ended",
                    (add.not_before - p.start) / 1000
                ));
            }
        }
    }
    // Tokens never go backwards across a restart.
    let all: Vec<&Processing> = seen.values().flat_map(|m| m.values()).collect();
    for (down, up) in &h.restarts {
        let before = all
            .iter()
            .filter(|p| p.start < *down)
            .map(|p| p.token)
            .max();
        let after = all.iter().filter(|p| p.start > *up).map(|p| p.token).min();
        if let (Some(before), Some(after)) = (before, after)
            && after <= before
        {
            report.tokens_backwards.push(format!(
                "token {after} after the restart, {before} before it"
            ));
        }
    }
    let mut lost: Vec<String> = Vec::new();
    for add in adds {
        if h.snapshot_at.is_some_and(|at| add.acked >= at) {
            continue; // after the snapshot the server restarts from: legitimately forgotten
        }
        report.checked_adds += 1;
        let done_after = seen
            .get(&add.item)
            .is_some_and(|by_token| by_token.range(add.seq + 1..).any(|(_, p)| p.committed()));
        if !done_after {
            report.lost_adds += 1;
            lost.push(add.item.clone());
        }
    }
    lost.sort();
    lost.dedup();
    report.lost_items = lost;
    report
}

/// What the producer did.
#[derive(Debug, Default)]
struct Produced {
    adds: Vec<Add>,
    /// Adds given up on after a full server refused them for a while (not acknowledged).
    refused: usize,
    /// Attempts that returned an error (retried, or given up).
    errors: usize,
}

/// Adds until the scenario's count is reached; retries what the server did not acknowledge
/// (for at most 30 s, or 300 ms on a full server, after which the add is given up: it was
/// never acknowledged, so nothing is owed for it).
async fn produce(queue: RedisQueue<String>, s: Scenario, out: Arc<Mutex<Produced>>) {
    let mut rng = Rng::new(7);
    let mut next_distinct = 0;
    let pad = |name: String| -> String {
        if name.len() >= s.pad {
            name
        } else {
            let fill = "x".repeat(s.pad - name.len() - 1);
            format!("{name}-{fill}")
        }
    };
    let give_up = if s.memory_limit_after.is_some() {
        Duration::from_millis(300)
    } else {
        Duration::from_secs(30)
    };
    for n in 0..s.adds {
        let roll = rng.below(100);
        // 0: add, 1: add_after (with its delay in ms), 2: add_rate_limited.
        let (item, kind, delay_ms) = if roll < s.delayed_pct {
            (format!("d-{n}"), 1, 50 + rng.below(351))
        } else if roll < s.delayed_pct + s.rate_limited_pct {
            (format!("r-{n}"), 2, 0)
        } else if next_distinct < s.distinct
            && (n * s.distinct / s.adds.max(1) >= next_distinct || s.hot_keys == 0)
            && (s.readd_recent == 0 || next_distinct == 0 || rng.below(2) == 0)
        {
            next_distinct += 1;
            (format!("item-{}", next_distinct - 1), 0, 0)
        } else if s.hot_keys > 0 {
            (format!("hot-{}", rng.below(s.hot_keys as u64)), 0, 0)
        } else if s.readd_recent > 0 {
            let back = rng.below(s.readd_recent.min(next_distinct.max(1)) as u64) as usize;
            (format!("item-{}", next_distinct.max(1) - 1 - back), 0, 0)
        } else {
            (
                format!("item-{}", rng.below(next_distinct.max(1) as u64)),
                0,
                0,
            )
        };
        let item = pad(item);
        let sent = now_us();
        let deadline = Instant::now() + give_up;
        loop {
            let result = match kind {
                1 => {
                    queue
                        .add_after(&item, Duration::from_millis(delay_ms))
                        .await
                }
                2 => queue.add_rate_limited(&item).await,
                _ => queue.add(&item).await,
            };
            match result {
                Ok(added) if added.kind != AddKind::Ignored => {
                    // The earliest any attempt could have come due: the first one was sent
                    // at `sent`; a rate-limited add waits at least the base delay.
                    let not_before = match kind {
                        1 => sent + delay_ms * 1000,
                        2 => sent + RATE_BASE.as_micros() as u64,
                        _ => 0,
                    };
                    out.lock().unwrap().adds.push(Add {
                        item: item.clone(),
                        seq: added.seq,
                        acked: now_us(),
                        not_before,
                    });
                    break;
                }
                Ok(_) => panic!("the queue was shut down during the run"),
                Err(_) if Instant::now() >= deadline => {
                    let mut out = out.lock().unwrap();
                    out.refused += 1;
                    out.errors += 1;
                    break;
                }
                Err(_) => {
                    out.lock().unwrap().errors += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
        if !s.add_every.is_zero() {
            tokio::time::sleep(s.add_every).await;
        }
    }
}

/// The producer's rate limiter: exponential from this base, no token bucket.
const RATE_BASE: Duration = Duration::from_millis(50);

/// Waits until nothing is queued, delayed or leased (reads retried through restarts).
async fn drained(queue: &RedisQueue<String>, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(stats) = queue.stats(1).await
            && stats.summary.depth == 0
            && stats.summary.delayed == 0
            && stats.summary.in_flight == 0
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Loads `keys` filler keys and rewrites the AOF, so that a restart takes a while to load.
async fn load_filler(server: &RedisServer, keys: u64) -> Result<(), String> {
    let mut con = redis::Client::open(server.url())
        .map_err(|e| e.to_string())?
        .get_multiplexed_async_connection_with_config(
            &redis::AsyncConnectionConfig::new().set_response_timeout(None),
        )
        .await
        .map_err(|e| e.to_string())?;
    let _: () = redis::cmd("DEBUG")
        .arg("POPULATE")
        .arg(keys)
        .arg("filler")
        .arg(64)
        .query_async(&mut con)
        .await
        .map_err(|e| e.to_string())?;
    let _: String = redis::cmd("BGREWRITEAOF")
        .query_async(&mut con)
        .await
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("persistence")
            .query_async(&mut con)
            .await
            .map_err(|e| e.to_string())?;
        if info.contains("aof_rewrite_in_progress:0") && info.contains("aof_rewrite_scheduled:0") {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err("the AOF rewrite did not finish".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The memory the server uses now (`used_memory`).
async fn used_memory(server: &RedisServer) -> Result<u64, String> {
    let mut con = redis::Client::open(server.url())
        .map_err(|e| e.to_string())?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut con)
        .await
        .map_err(|e| e.to_string())?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "no used_memory in INFO".to_string())
}

/// Sets `maxmemory` to `limit` bytes.
async fn limit_memory(server: &RedisServer, limit: u64) -> Result<u64, String> {
    let mut con = redis::Client::open(server.url())
        .map_err(|e| e.to_string())?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(limit)
        .query_async(&mut con)
        .await
        .map_err(|e| e.to_string())?;
    Ok(limit)
}

async fn run(s: Scenario) -> Result<String, String> {
    let mut extra: Vec<&str> = Vec::new();
    if s.filler_keys > 0 {
        extra.extend(["--enable-debug-command", "yes"]);
    }
    if s.faults
        .iter()
        .any(|(_, f)| matches!(f, Fault::BusyServer(_)))
    {
        // BUSY answers once a script has run 50 ms, and SCRIPT KILL is taken.
        extra.extend(["--busy-reply-threshold", "50"]);
    }
    let mut clock_file = None;
    let server = if s.skew {
        let file = std::env::temp_dir().join(format!(
            "wq-crash-faketime-{}-{}",
            std::process::id(),
            now_us()
        ));
        std::fs::write(&file, "+0\n").map_err(|e| e.to_string())?;
        let env = match faketime_env(&file) {
            Ok(env) => env,
            // CI must run every scenario.
            Err(why) if std::env::var("CI").is_ok_and(|v| v == "true") => return Err(why),
            Err(why) => return Ok(format!("{IGNORED}{why}")),
        };
        clock_file = Some(file);
        RedisServer::try_start_with_env(s.durability, &extra, &env)
            .ok_or("redis-server did not start under libfaketime")?
    } else {
        RedisServer::start_with(s.durability, &extra).ok_or("no redis-server")?
    };
    if s.filler_keys > 0 {
        load_filler(&server, s.filler_keys).await?;
    }
    let dir = server.dir().join("histories");
    std::fs::create_dir_all(&dir).unwrap();
    let mut h = Harness {
        scenario: s.clone(),
        server,
        queue_name: format!("crash-{}", s.name),
        dir,
        workers: Vec::new(),
        spawned: 0,
        killed: HashMap::new(),
        windows: Vec::new(),
        restarts: Vec::new(),
        snapshot_at: None,
        longest_restart: Duration::ZERO,
        clock_file,
        busy: 0,
    };
    let producer_queue: RedisQueue<String> = RedisQueue::builder(h.queue_name.as_str())
        .url(h.server.url())
        .response_timeout(Duration::from_millis(1000))
        .retry_deadline(Duration::from_secs(30))
        .rate_limit(RateLimit::exponential(RATE_BASE, Duration::from_secs(1)))
        .check_persistence(false)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    for _ in 0..s.workers {
        h.spawn_worker();
    }
    let produced = Arc::new(Mutex::new(Produced::default()));
    let producer = tokio::spawn(produce(producer_queue.clone(), s.clone(), produced.clone()));
    let started = Instant::now();
    let mut rng = Rng::new(42);
    let mut limit = 0;
    if let Some(acked) = s.memory_limit_after {
        // Set once `acked` adds are acknowledged (connections open, scripts loaded, a
        // backlog queued), a little below the memory used then: the server is full from then
        // on, and only `done`s make room. Half the backlog's item bytes (each queued item is
        // held twice: the ready list and the dirty set) are taken off, so the limit stays
        // above what the server uses for anything but items.
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline && produced.lock().unwrap().adds.len() < acked {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let queued = producer_queue.len().await.unwrap_or(0);
        if queued < 40 {
            return Err(format!(
                "no backlog to fill the server with ({queued} queued)"
            ));
        }
        let now = used_memory(&h.server).await?;
        limit = limit_memory(&h.server, now - (queued as u64 / 2) * 2 * s.pad as u64).await?;
    }
    for (at, fault) in &s.faults {
        tokio::time::sleep_until((started + Duration::from_millis(*at)).into()).await;
        h.apply(*fault, &mut rng).await;
    }
    // A producer that cannot finish (a stuck queue) is reported with the histories.
    let producer_finished = match tokio::time::timeout(Duration::from_secs(60), producer).await {
        Ok(result) => {
            result.map_err(|e| e.to_string())?;
            true
        }
        Err(_) => false,
    };
    let drained = producer_finished && drained(&producer_queue, Duration::from_secs(30)).await;
    let stuck = if drained {
        String::new()
    } else {
        format!("; at the end: {:?}", producer_queue.stats(3).await)
    };
    let dead = producer_queue.stats(1).await.map_or(0, |s| s.summary.dead);
    // Every worker leaves once the queue is shut down for the fleet and empty.
    let _ = producer_queue.shut_down_fleet().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    for worker in &mut h.workers {
        while Instant::now() < deadline && matches!(worker.child.try_wait(), Ok(None)) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = worker.child.kill();
        let _ = worker.child.wait();
    }
    let logs: Vec<PathBuf> = (0..h.spawned)
        .map(|n| h.dir.join(format!("worker-{n}.log")))
        .collect();
    let produced = std::mem::take(&mut *produced.lock().unwrap());
    let r = check(&produced.adds, &logs, &h);
    let pools = if s.pool > 0 {
        format!(
            "; pools of {} Workers: {} batched steps, {} dones in them, the largest {}",
            s.pool, r.steps, r.step_dones, r.largest_step
        )
    } else {
        String::new()
    };
    let summary = format!(
        "{} workers ({} processes), {} faults, {:.1} s: {} acknowledged adds ({} checked, {} add \
         errors, {} given up), {} processings ({} done accepted, {} refused as stale, {} \
         unknown, {} released, {} killed mid-item); lost {} adds ({} items); overlaps: {} raw, \
         {} in a fault window, {} outside, {} with the older done accepted, {} with both \
         accepted; {} early, {} token regressions, {} get errors, {} dead letters, longest \
         restart {} ms",
        s.workers * s.pool.max(1),
        h.spawned,
        s.faults.len(),
        started.elapsed().as_secs_f64(),
        r.adds,
        r.checked_adds,
        produced.errors,
        produced.refused,
        r.processings,
        r.accepted,
        r.stale,
        r.unknown,
        r.released,
        r.killed_mid_item,
        r.lost_adds,
        r.lost_items.len(),
        r.raw_overlaps,
        r.excused_overlaps,
        r.unexcused_overlaps.len(),
        r.fencing_violations.len(),
        r.accepted_overlaps,
        r.early.len(),
        r.tokens_backwards.len(),
        r.get_errors,
        dead,
        h.longest_restart.as_millis(),
    ) + &pools
        + &stuck
        + &if limit > 0 {
            format!(", maxmemory {limit} bytes")
        } else {
            String::new()
        };
    let matrix = format!(
        "MATRIX | {} | {} | {} | {} | {} | {} | {} |",
        s.name,
        if s.pool > 0 {
            format!("{} x {} Workers", s.workers, s.pool)
        } else {
            format!("{} loops", s.workers)
        },
        r.checked_adds,
        r.lost_adds,
        r.raw_overlaps,
        r.excused_overlaps,
        r.unexcused_overlaps.len()
    );
    let fail = |why: String| {
        Err(format!(
            "{why}\n    {summary}\n    histories in {}",
            keep(&h)
        ))
    };
    let first = |list: &[String]| list.iter().take(3).cloned().collect::<Vec<_>>().join("; ");
    match s.expect {
        Expect::Losses => {
            if r.lost_adds == 0 {
                return fail("the control run must report lost adds".into());
            }
            return Ok(format!("{summary}\n    {matrix} control: losses found"));
        }
        Expect::FencingViolation => {
            if r.fencing_violations.is_empty() {
                return fail("the control run must report a stale holder's done accepted".into());
            }
            return Ok(format!(
                "{summary}\n    {matrix} control: fencing violations found, e.g. {}",
                first(&r.fencing_violations)
            ));
        }
        Expect::Pass => {}
    }
    if !producer_finished {
        return fail("the producer did not finish in 60 s: adds kept failing".into());
    }
    if !r.unexcused_overlaps.is_empty() {
        return fail(format!(
            "two live holders processed one item at once where no lease could expire: {}",
            first(&r.unexcused_overlaps)
        ));
    }
    if !r.fencing_violations.is_empty() {
        return fail(format!(
            "a stale holder's done was accepted: {}",
            first(&r.fencing_violations)
        ));
    }
    if !r.early.is_empty() {
        return fail(format!(
            "delayed items were handed out early: {}",
            first(&r.early)
        ));
    }
    if !r.tokens_backwards.is_empty() {
        return fail(format!(
            "tokens went backwards: {}",
            first(&r.tokens_backwards)
        ));
    }
    if !drained {
        return fail("the queue did not drain".into());
    }
    if r.lost_adds > 0 {
        return fail(format!(
            "acknowledged adds were lost: {:?}",
            &r.lost_items[..r.lost_items.len().min(5)]
        ));
    }
    if r.accepted == 0 {
        return fail("nothing was processed".into());
    }
    if r.stale < s.min_stale {
        return fail(format!(
            "the fault should have made a stale holder's done be refused ({} seen, {} needed)",
            r.stale, s.min_stale
        ));
    }
    if r.released < s.min_released {
        return fail(format!(
            "the graceful stops should have released leases mid-item ({} seen)",
            r.released
        ));
    }
    if produced.errors < s.min_refused_adds {
        return fail("the server never refused an add: it did not fill up".into());
    }
    if s.pool > 0 && r.step_dones == 0 {
        return fail("the pools ended no item in a batched step".into());
    }
    let busy_faults = s
        .faults
        .iter()
        .filter(|(_, f)| matches!(f, Fault::BusyServer(_)))
        .count();
    if h.busy < busy_faults {
        return fail(format!(
            "only {} of {busy_faults} busy scripts were running when killed",
            h.busy
        ));
    }
    if s.no_unknown_dones && r.unknown > 0 {
        return fail(format!(
            "{} dones were left unsure instead of waiting the fault out",
            r.unknown
        ));
    }
    if s.no_get_errors && r.get_errors > 0 {
        return fail(format!(
            "{} gets returned an error instead of waiting the fault out",
            r.get_errors
        ));
    }
    Ok(format!("{summary}\n    {matrix}"))
}

/// The start of a scenario's summary when it could not run here (counted as ignored).
const IGNORED: &str = "ignored: ";

/// The environment that runs a process under libfaketime with its offset read from `file`
/// at every clock read, or why that cannot be done here. The library's path is the one the
/// Debian `faketime` wrapper preloads.
///
/// Debian's `redis-server` is linked with the shared jemalloc, and libfaketime alone hangs it
/// at start: libfaketime's set-up allocates, jemalloc's first allocation reads the clock, and
/// that read re-enters libfaketime before it is ready (libfaketime issue 130). glibc's
/// `libc_malloc_debug.so.0`, preloaded first, serves those allocations from glibc's own
/// allocator, so the set-up never reaches jemalloc.
fn faketime_env(file: &std::path::Path) -> Result<Vec<(&'static str, String)>, String> {
    let preload = Command::new("faketime")
        .args(["-f", "+0", "sh", "-c", "printf %s \"$LD_PRELOAD\""])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .filter(|p| !p.is_empty());
    let Some(preload) = preload else {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!(
                "faketime not found: CI must run the clock-step scenario (apt-get install faketime)"
            );
        }
        return Err("faketime is not installed (Debian package faketime)".into());
    };
    let preload = match glibc_malloc_debug() {
        Some(malloc) => format!("{malloc} {preload}"),
        None => preload,
    };
    let env = vec![
        ("LD_PRELOAD", preload),
        ("FAKETIME_TIMESTAMP_FILE", file.display().to_string()),
        ("FAKETIME_NO_CACHE", "1".to_string()),
        // An NTP step moves the wall clock only.
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
    ];
    // A bounded probe first: an incompatible binary hangs instead of failing.
    let mut probe = Command::new(std::env::var("WQ_REDIS_SERVER").unwrap_or("redis-server".into()))
        .arg("--version")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(3);
    let status = loop {
        if let Ok(Some(status)) = probe.try_wait() {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = probe.kill();
            let _ = probe.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if status.is_some_and(|s| s.success()) {
        Ok(env)
    } else {
        Err(
            "this redis-server does not run under libfaketime (it hangs at start: \
             libfaketime clashes with the jemalloc it is linked with)"
                .into(),
        )
    }
}

/// Where glibc's `libc_malloc_debug.so.0` is (glibc 2.34 and later), from the loader's cache.
fn glibc_malloc_debug() -> Option<String> {
    let out = Command::new("ldconfig").arg("-p").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| line.trim_start().starts_with("libc_malloc_debug.so.0 "))
        .find_map(|line| line.rsplit("=> ").next().map(|p| p.trim().to_owned()))
}

/// Keeps a failed run's histories (the server's directory is removed with it).
fn keep(h: &Harness) -> String {
    let target = std::env::temp_dir().join(format!("wq-crash-{}-{}", h.scenario.name, now_us()));
    let _ = std::fs::create_dir_all(&target);
    if let Ok(entries) = std::fs::read_dir(&h.dir) {
        for entry in entries.flatten() {
            let _ = std::fs::copy(entry.path(), target.join(entry.file_name()));
        }
    }
    let _ = std::fs::copy(h.server.dir().join("redis.log"), target.join("redis.log"));
    target.display().to_string()
}

/// `count` faults, `every` apart, from `first` on.
fn every(first: u64, every: u64, count: u64, fault: Fault) -> Vec<(u64, Fault)> {
    (0..count).map(|i| (first + i * every, fault)).collect()
}

fn scenarios() -> Vec<Scenario> {
    let ms = Duration::from_millis;
    let base = Scenario {
        name: "",
        durability: Durability::Always,
        workers: 6,
        pool: 0,
        lease_ms: 1000,
        work: [2, 20, 2, 1500],
        distinct: 300,
        adds: 900,
        hot_keys: 0,
        readd_recent: 0,
        add_every: ms(4),
        delayed_pct: 0,
        rate_limited_pct: 0,
        pad: 0,
        faults: Vec::new(),
        filler_keys: 0,
        memory_limit_after: None,
        mutation: None,
        graceful: false,
        skew: false,
        expect: Expect::Pass,
        min_stale: 0,
        min_released: 0,
        min_refused_adds: 0,
        no_get_errors: false,
        no_unknown_dones: false,
    };
    vec![
        Scenario {
            name: "kill_workers_mid_item",
            faults: every(300, 300, 10, Fault::KillWorker),
            ..base.clone()
        },
        Scenario {
            name: "kill_redis_and_restart_from_aof",
            workers: 4,
            lease_ms: 3000,
            faults: vec![
                (1200, Fault::KillServer(ms(300))),
                (2800, Fault::KillServer(ms(300))),
            ],
            ..base.clone()
        },
        Scenario {
            name: "control_kill_redis_without_persistence_reports_losses",
            durability: Durability::None,
            workers: 4,
            // Distinct items only, and work slower than the adds, so a backlog is queued
            // when the server dies and nothing re-adds it afterwards.
            work: [20, 40, 0, 0],
            distinct: 400,
            adds: 400,
            add_every: ms(2),
            expect: Expect::Losses,
            faults: vec![(1500, Fault::KillServer(ms(300)))],
            ..base.clone()
        },
        Scenario {
            name: "sigstop_worker_past_its_lease",
            // Handlers outlive the lease and the pause, so the next holder still works
            // when the paused one wakes up and tries its done.
            workers: 4,
            lease_ms: 300,
            work: [350, 600, 0, 0],
            distinct: 30,
            adds: 60,
            add_every: ms(20),
            faults: every(200, 900, 4, Fault::PauseWorker(ms(500))),
            min_stale: 1,
            ..base.clone()
        },
        Scenario {
            name: "control_sigstop_worker_without_fencing_is_caught",
            // Handlers outlive the lease and the pause, so the next holder still works
            // when the paused one wakes up and tries its done.
            workers: 4,
            lease_ms: 300,
            work: [350, 600, 0, 0],
            distinct: 30,
            adds: 60,
            add_every: ms(20),
            faults: every(200, 900, 4, Fault::PauseWorker(ms(500))),
            mutation: Some("no-fencing"),
            expect: Expect::FencingViolation,
            ..base.clone()
        },
        Scenario {
            name: "control_readd_while_processing_without_dirty_requeue_is_caught",
            workers: 4,
            work: [60, 120, 0, 0],
            distinct: 80,
            adds: 240,
            readd_recent: 4,
            add_every: ms(15),
            mutation: Some("no-dirty-requeue"),
            expect: Expect::Losses,
            ..base.clone()
        },
        Scenario {
            name: "readd_while_processing_under_kill",
            workers: 4,
            work: [60, 120, 0, 0],
            distinct: 80,
            adds: 240,
            readd_recent: 4,
            add_every: ms(15),
            faults: every(500, 700, 4, Fault::KillWorker),
            ..base.clone()
        },
        Scenario {
            name: "thirty_two_workers_on_hot_keys_kill",
            workers: 32,
            lease_ms: 2000,
            work: [1, 5, 0, 0],
            distinct: 200,
            adds: 2000,
            hot_keys: 8,
            add_every: Duration::from_micros(500),
            faults: every(500, 500, 4, Fault::KillWorker),
            ..base.clone()
        },
        Scenario {
            name: "sigstop_redis_past_the_lease",
            workers: 4,
            lease_ms: 500,
            // Slow items outlast the pause, so their leases are past their deadline when the
            // server resumes. Whether they are reclaimed (and the old holder's done refused)
            // or renewed first depends on which queued command the server runs first, so the
            // run requires no stale done, only the rules.
            work: [20, 60, 15, 1500],
            distinct: 60,
            adds: 120,
            add_every: ms(6),
            faults: vec![(800, Fault::PauseServer(ms(1200)))],
            ..base.clone()
        },
        Scenario {
            name: "oom_full_server_keeps_leases_alive",
            workers: 4,
            lease_ms: 600,
            // Slow items must be renewed while the server is full.
            work: [20, 40, 3, 900],
            distinct: 500,
            adds: 500,
            add_every: ms(2),
            pad: 4000,
            memory_limit_after: Some(200),
            min_refused_adds: 20,
            ..base.clone()
        },
        Scenario {
            name: "loading_large_aof_after_kill",
            workers: 4,
            lease_ms: 5000,
            work: [5, 30, 0, 0],
            distinct: 200,
            adds: 400,
            add_every: ms(5),
            filler_keys: 1_000_000,
            faults: vec![(600, Fault::KillServer(ms(100)))],
            no_get_errors: true,
            ..base.clone()
        },
        Scenario {
            name: "snapshot_restore_older_than_tokens",
            // Without persistence, restarted from a `SAVE` taken mid-run. Handlers outlive
            // the restart and renew after it, so their stale leases are refused (not left
            // ambiguous by a done sent into the dead connection).
            // Eight workers, so that on a loaded machine at least one of them still holds a
            // lease from between the snapshot and the kill when the server comes back.
            durability: Durability::None,
            workers: 8,
            lease_ms: 600,
            work: [300, 700, 0, 0],
            distinct: 150,
            adds: 150,
            add_every: ms(5),
            faults: vec![(400, Fault::Snapshot), (1000, Fault::KillServer(ms(50)))],
            min_stale: 1,
            ..base.clone()
        },
        Scenario {
            name: "graceful_stop_aborts_workers_mid_item",
            workers: 4,
            lease_ms: 5000,
            work: [100, 300, 0, 0],
            distinct: 120,
            adds: 240,
            add_every: ms(10),
            graceful: true,
            faults: every(300, 300, 6, Fault::StopWorker),
            min_released: 1,
            ..base.clone()
        },
        Scenario {
            name: "skew_server_clock_stepped_forward_past_the_lease",
            workers: 4,
            lease_ms: 1000,
            work: [50, 150, 0, 0],
            distinct: 150,
            adds: 300,
            add_every: ms(5),
            skew: true,
            faults: vec![(700, Fault::StepClock(5)), (1500, Fault::StepClock(10))],
            // A step past the lease ends the leases held then: their dones must be refused.
            min_stale: 1,
            ..base.clone()
        },
        Scenario {
            name: "delayed_and_rate_limited_adds_kill_workers_and_redis",
            workers: 4,
            lease_ms: 3000,
            work: [5, 30, 0, 0],
            distinct: 200,
            adds: 500,
            add_every: ms(5),
            delayed_pct: 30,
            rate_limited_pct: 20,
            faults: vec![
                (400, Fault::KillWorker),
                (900, Fault::KillServer(ms(200))),
                (1400, Fault::KillWorker),
                (1900, Fault::KillServer(ms(200))),
                (2300, Fault::KillWorker),
            ],
            ..base.clone()
        },
        // The same faults on pools of `Workers`, which end their items in batched steps
        // (`done_and_next_many`: one script run for the dones of several workers and their
        // next items). Each process runs a pool; the histories come from the handlers (start,
        // end) and from the steps (each done's outcome).
        Scenario {
            name: "workers_kill_mid_item",
            workers: 3,
            pool: 4,
            faults: every(300, 300, 10, Fault::KillWorker),
            ..base.clone()
        },
        Scenario {
            name: "workers_kill_redis_and_restart_from_aof",
            workers: 2,
            pool: 4,
            lease_ms: 3000,
            faults: vec![
                (1200, Fault::KillServer(ms(300))),
                (2800, Fault::KillServer(ms(300))),
            ],
            ..base.clone()
        },
        Scenario {
            name: "workers_busy_server_mid_step",
            // A busy script of 300 ms, well inside the lease: every step, get and renewal
            // meets BUSY and waits it out; no lease may expire, so no overlap is excused.
            // Handlers run longer than the 50 ms after which the server answers BUSY, so
            // many end while it does and their steps meet it.
            workers: 2,
            pool: 4,
            lease_ms: 1500,
            work: [60, 250, 0, 0],
            distinct: 200,
            adds: 300,
            add_every: ms(10),
            faults: every(600, 900, 3, Fault::BusyServer(ms(300))),
            no_unknown_dones: true,
            ..base.clone()
        },
        Scenario {
            name: "workers_sigstop_worker_past_its_lease",
            workers: 2,
            pool: 3,
            lease_ms: 300,
            work: [350, 600, 0, 0],
            distinct: 30,
            adds: 60,
            add_every: ms(20),
            faults: every(200, 900, 4, Fault::PauseWorker(ms(500))),
            min_stale: 1,
            ..base.clone()
        },
        Scenario {
            name: "control_workers_sigstop_without_fencing_is_caught",
            workers: 2,
            pool: 3,
            lease_ms: 300,
            work: [350, 600, 0, 0],
            distinct: 30,
            adds: 60,
            add_every: ms(20),
            faults: every(200, 900, 4, Fault::PauseWorker(ms(500))),
            mutation: Some("no-fencing"),
            expect: Expect::FencingViolation,
            ..base.clone()
        },
        Scenario {
            name: "workers_sigstop_redis_past_the_lease",
            workers: 2,
            pool: 3,
            lease_ms: 500,
            work: [20, 60, 15, 1500],
            distinct: 60,
            adds: 120,
            add_every: ms(6),
            faults: vec![(800, Fault::PauseServer(ms(1200)))],
            ..base.clone()
        },
        Scenario {
            name: "workers_readd_while_processing_under_kill",
            workers: 2,
            pool: 3,
            work: [60, 120, 0, 0],
            distinct: 80,
            adds: 240,
            readd_recent: 4,
            add_every: ms(15),
            faults: every(500, 700, 4, Fault::KillWorker),
            ..base.clone()
        },
        Scenario {
            name: "control_workers_readd_without_dirty_requeue_is_caught",
            workers: 2,
            pool: 3,
            work: [60, 120, 0, 0],
            distinct: 80,
            adds: 240,
            readd_recent: 4,
            add_every: ms(15),
            mutation: Some("no-dirty-requeue"),
            expect: Expect::Losses,
            ..base.clone()
        },
        Scenario {
            name: "workers_thirty_two_on_hot_keys_kill",
            workers: 4,
            pool: 8,
            lease_ms: 2000,
            work: [1, 5, 0, 0],
            distinct: 200,
            adds: 2000,
            hot_keys: 8,
            add_every: Duration::from_micros(500),
            faults: every(500, 500, 4, Fault::KillWorker),
            ..base.clone()
        },
        Scenario {
            name: "control_workers_kill_redis_without_persistence_reports_losses",
            durability: Durability::None,
            // Four workers in all, as the loops: a backlog is queued when the server dies.
            workers: 2,
            pool: 2,
            work: [20, 40, 0, 0],
            distinct: 400,
            adds: 400,
            add_every: ms(2),
            expect: Expect::Losses,
            faults: vec![(1500, Fault::KillServer(ms(300)))],
            ..base.clone()
        },
        Scenario {
            name: "workers_oom_full_server_keeps_leases_alive",
            // Four workers in all, as the loops: a backlog fills the server.
            workers: 2,
            pool: 2,
            lease_ms: 600,
            work: [20, 40, 3, 900],
            distinct: 500,
            adds: 500,
            add_every: ms(2),
            pad: 4000,
            memory_limit_after: Some(200),
            min_refused_adds: 20,
            ..base.clone()
        },
        Scenario {
            name: "workers_loading_large_aof_after_kill",
            workers: 2,
            pool: 4,
            lease_ms: 5000,
            work: [5, 30, 0, 0],
            distinct: 200,
            adds: 400,
            add_every: ms(5),
            filler_keys: 1_000_000,
            faults: vec![(600, Fault::KillServer(ms(100)))],
            no_get_errors: true,
            ..base.clone()
        },
        Scenario {
            name: "workers_snapshot_restore_older_than_tokens",
            durability: Durability::None,
            workers: 2,
            pool: 4,
            lease_ms: 600,
            work: [300, 700, 0, 0],
            distinct: 150,
            adds: 150,
            add_every: ms(5),
            faults: vec![(400, Fault::Snapshot), (1000, Fault::KillServer(ms(50)))],
            min_stale: 1,
            ..base.clone()
        },
        Scenario {
            name: "workers_graceful_stop_aborts_workers_mid_item",
            // A stop ends a whole pool: the handlers still running 20 ms after it are
            // aborted, and their leases released as they drop.
            workers: 2,
            pool: 4,
            lease_ms: 5000,
            work: [100, 300, 0, 0],
            distinct: 120,
            adds: 240,
            add_every: ms(10),
            graceful: true,
            faults: every(300, 300, 6, Fault::StopWorker),
            min_released: 1,
            ..base.clone()
        },
        Scenario {
            name: "workers_skew_server_clock_stepped_forward_past_the_lease",
            workers: 2,
            pool: 4,
            lease_ms: 1000,
            work: [50, 150, 0, 0],
            distinct: 150,
            adds: 300,
            add_every: ms(5),
            skew: true,
            faults: vec![(700, Fault::StepClock(5)), (1500, Fault::StepClock(10))],
            min_stale: 1,
            ..base.clone()
        },
        Scenario {
            name: "workers_delayed_and_rate_limited_adds_kill_workers_and_redis",
            workers: 2,
            pool: 4,
            lease_ms: 3000,
            work: [5, 30, 0, 0],
            distinct: 200,
            adds: 500,
            add_every: ms(5),
            delayed_pct: 30,
            rate_limited_pct: 20,
            faults: vec![
                (400, Fault::KillWorker),
                (900, Fault::KillServer(ms(200))),
                (1400, Fault::KillWorker),
                (1900, Fault::KillServer(ms(200))),
                (2300, Fault::KillWorker),
            ],
            ..base
        },
    ]
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--worker") {
        return worker_main();
    }
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let selected: Vec<Scenario> = scenarios()
        .into_iter()
        .filter(|s| filters.is_empty() || filters.iter().any(|f| s.name.contains(f.as_str())))
        .collect();
    if args.iter().any(|a| a == "--list") {
        for s in &selected {
            println!("{}: test", s.name);
        }
        return ExitCode::SUCCESS;
    }
    println!("\nrunning {} tests", selected.len());
    if !server::require_binary() {
        println!(
            "test result: ok. 0 passed; 0 failed; {} ignored; 0 measured; 0 filtered out",
            selected.len()
        );
        return ExitCode::SUCCESS;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let (mut passed, mut failed, mut ignored) = (0, 0, 0);
    for s in selected {
        let name = s.name;
        let began = Instant::now();
        let outcome = runtime.block_on(run(s));
        let took = began.elapsed().as_secs_f64();
        match outcome {
            Ok(summary) if summary.starts_with(IGNORED) => {
                ignored += 1;
                println!("test {name} ... ignored, {}", &summary[IGNORED.len()..]);
            }
            Ok(summary) => {
                passed += 1;
                println!("test {name} ... ok ({took:.1} s)\n    {summary}");
            }
            Err(why) => {
                failed += 1;
                println!("test {name} ... FAILED ({took:.1} s)\n    {why}");
            }
        }
    }
    println!(
        "\ntest result: {}. {passed} passed; {failed} failed; {ignored} ignored; 0 measured; 0 filtered out; finished in {:.2}s\n",
        if failed == 0 { "ok" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
