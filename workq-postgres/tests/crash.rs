//! Nothing acknowledged lost, no two live holders at once, on a real PostgreSQL under the
//! faults a deployment meets: `kill -9` of worker processes mid-item, `kill -9` of the server
//! and a restart, a worker `SIGSTOP`ped past its lease, and 32 workers on a few hot keys.
//!
//! Workers are processes (this test binary re-run as the ignored test `worker_process`) of
//! one of two kinds. `steps`: tasks that end each item with `done_and_get` (the `done` and
//! the next item in one call). `workers`: a `Workers` pool, whose workers send their `done`s
//! through batched steps (`done_and_next_many`: one statement for the `done`s of every
//! worker that finished meanwhile and their next items, the default on PostgreSQL), over a
//! wrapper of the queue that records what passes through it. Both append their history to a
//! file: `S item token time` when a lease is handed out, `D item token time` before its
//! `done` (or release) is sent (after the handler's end), `E item token result` after. A
//! producer in the test records every acknowledged add with its sequence number. The checker
//! then proves, from the histories:
//!
//! - **nothing acknowledged lost**: every acknowledged add (sequence `s`) is followed by a
//!   processing of its item under a lease whose token is larger than `s` and whose `done` was
//!   accepted (or may have been: the worker was killed after sending it);
//! - **no overlap of live holders**: two processings of one item overlap in time (one host's
//!   clock) only while the older holder was paused or the server was down (a lease can
//!   legitimately expire then), and in every overlap the older holder's `done` was refused.
//!
//! Controls must make the checker fail: fencing switched off (a paused holder's stale `done`
//! is accepted) and no re-queue of an item re-added while processing (acknowledged adds
//! lost), both through the crate's test-only `Mutation`s.
//!
//! This checker is the Redis crate's idea, written for this harness: the Redis one is bound
//! to its own harness (per-log pause windows, snapshot restarts, AOF states) and history
//! format, and the two share no code path that would make a common module smaller than
//! these two hundred lines.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::{PgServer, unique};
use workq::AddKind;
use workq::{AddOptions, DoneMany, Outcome, Queue, QueueLease, Workers};
use workq_postgres::{Error, Lease, Mutation, PgQueue};

/// Microseconds since the Unix epoch: one clock for every process on this host.
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The environment variable that makes `worker_process` a worker.
const WORKER_ENV: &str = "WQ_PG_CRASH_WORKER";

// ===== the worker process =====

/// A worker process: `tasks` workers on one handle, each `get`, record, work `work_ms`,
/// record, `done`, record, until killed. Run by the harness through [`Scenario::spawn`];
/// without its environment variable it does nothing (it is ignored by default).
#[test]
#[ignore = "a worker process of the crash scenarios, started by them"]
fn worker_process() {
    let Ok(config) = std::env::var(WORKER_ENV) else {
        return;
    };
    let fields: Vec<&str> = config.split('|').collect();
    let [url, name, log, tasks, work_ms, lease_ms, mutation, kind] = fields[..] else {
        panic!("bad worker configuration {config}");
    };
    let tasks: usize = tasks.parse().unwrap();
    let work = Duration::from_millis(work_ms.parse().unwrap());
    let lease = Duration::from_millis(lease_ms.parse().unwrap());
    let steps_log = format!("{log}.steps");
    let log = Arc::new(Mutex::new(
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap(),
    ));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let mut builder = PgQueue::<String>::builder(name)
            .url(url)
            .max_connections(u32::try_from(tasks).unwrap() + 4)
            .lease_duration(lease)
            .renew_every(lease / 4)
            .poll_interval(Duration::from_millis(200))
            .retry_deadline(Duration::from_secs(60))
            .max_stalls(0);
        match mutation {
            "no-fencing" => builder = builder.mutation(Mutation::NoFencing),
            "no-dirty-requeue" => builder = builder.mutation(Mutation::NoDirtyRequeue),
            _ => {}
        }
        let queue = builder.build().await.expect("worker connects");
        let record: Record = Arc::new(move |line: String| {
            let mut file = log.lock().unwrap();
            file.write_all(line.as_bytes()).unwrap();
            file.flush().unwrap();
        });
        if kind == "workers" {
            let steps = Mutex::new(
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(steps_log)
                    .unwrap(),
            );
            let logged = Logged {
                queue: queue.clone(),
                record: record.clone(),
                steps: Arc::new(move |line: String| {
                    let mut file = steps.lock().unwrap();
                    file.write_all(line.as_bytes()).unwrap();
                }),
            };
            assert!(logged.batch_limit() > 1, "Workers batch their steps here");
            let _workers =
                Workers::new(logged)
                    .count(tasks)
                    .spawn_async(move |_: String| async move {
                        tokio::time::sleep(work).await;
                        Outcome::Done
                    });
            // Until killed.
            std::future::pending::<()>().await;
        }
        let mut handles = Vec::new();
        for _ in 0..tasks {
            let queue = queue.clone();
            let record = record.clone();
            handles.push(tokio::spawn(async move {
                // The lease handed out with the last `done`, if any.
                let mut next = None;
                loop {
                    let lease = match next.take() {
                        Some(lease) => lease,
                        None => match queue.get().await {
                            Ok(Some(lease)) => lease,
                            Ok(None) => return,
                            Err(_) => {
                                tokio::time::sleep(Duration::from_millis(50)).await;
                                continue;
                            }
                        },
                    };
                    let (item, token) = (lease.item().clone(), lease.token());
                    record(format!("S {item} {token} {}\n", now_us()));
                    tokio::time::sleep(work).await;
                    record(format!("D {item} {token} {}\n", now_us()));
                    // The done and the next item in one call, as `Workers` end an item.
                    let result = match queue.done_and_get(lease, false).await {
                        Ok(taken) => {
                            next = taken;
                            "ok"
                        }
                        Err(Error::LeaseLost) => "refused",
                        Err(_) => "unknown",
                    };
                    record(format!("E {item} {token} {result}\n"));
                }
            }));
        }
        for handle in handles {
            let _ = handle.await;
        }
    });
}

/// Appends a line to the worker's history.
type Record = Arc<dyn Fn(String) + Send + Sync>;

/// The queue as `Workers` see it in a `workers` process: each call goes to the `PgQueue`
/// (its batched steps included), and each hand-out and `done` is recorded, and the number of
/// `done`s of each batched step (in a file of its own).
#[derive(Clone)]
struct Logged {
    queue: PgQueue<String>,
    record: Record,
    steps: Record,
}

/// A lease handed out through [`Logged`].
struct LoggedLease {
    lease: Lease<String>,
    record: Option<Record>,
}

impl std::fmt::Debug for Logged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Logged").finish_non_exhaustive()
    }
}

impl Logged {
    fn started(&self, lease: Lease<String>) -> LoggedLease {
        (self.record)(format!(
            "S {} {} {}\n",
            lease.item(),
            lease.token(),
            now_us()
        ));
        LoggedLease {
            lease,
            record: Some(self.record.clone()),
        }
    }

    fn sending(&self, lease: &Lease<String>) {
        (self.record)(format!(
            "D {} {} {}\n",
            lease.item(),
            lease.token(),
            now_us()
        ));
    }

    fn ended(&self, item: &str, token: u64, result: &Result<(), Error>) {
        (self.record)(format!("E {item} {token} {}\n", outcome(result)));
    }
}

/// How a history names a `done`'s outcome.
fn outcome(result: &Result<(), Error>) -> &'static str {
    match result {
        Ok(()) => "ok",
        Err(Error::LeaseLost) => "refused",
        Err(_) => "unknown",
    }
}

impl std::fmt::Debug for LoggedLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("LoggedLease").field(&self.lease).finish()
    }
}

impl Queue for Logged {
    type Item = String;
    type Lease = LoggedLease;
    type Error = Error;

    fn name(&self) -> Option<&str> {
        Some(self.queue.name())
    }

    async fn add_with(&self, item: String, options: AddOptions) -> Result<bool, Error> {
        Queue::add_with(&self.queue, item, options).await
    }

    async fn forget(&self, item: &String) -> Result<(), Error> {
        self.queue.forget(item).await
    }

    async fn num_requeues(&self, item: &String) -> Result<usize, Error> {
        self.queue.num_requeues(item).await
    }

    async fn len(&self) -> Result<usize, Error> {
        self.queue.len().await
    }

    async fn get(&self) -> Result<Option<LoggedLease>, Error> {
        Ok(self.queue.get().await?.map(|lease| self.started(lease)))
    }

    async fn done_and_next(
        &self,
        mut lease: LoggedLease,
        forget: bool,
    ) -> Result<Option<LoggedLease>, Error> {
        lease.record = None;
        let (item, token) = (lease.lease.item().clone(), lease.lease.token());
        self.sending(&lease.lease);
        let result = self.queue.done_and_get(lease.lease, forget).await;
        let next = match result {
            Ok(next) => {
                self.ended(&item, token, &Ok(()));
                next
            }
            Err(error) => {
                let result = Err(error);
                self.ended(&item, token, &result);
                return result.map(|()| None);
            }
        };
        Ok(next.map(|lease| self.started(lease)))
    }

    async fn done_and_next_many(
        &self,
        leases: Vec<(LoggedLease, bool)>,
        max: usize,
    ) -> Result<DoneMany<LoggedLease, Error>, Error> {
        (self.steps)(format!("{}\n", leases.len()));
        let mut sent = Vec::with_capacity(leases.len());
        let mut names = Vec::with_capacity(leases.len());
        for (mut lease, forget) in leases {
            lease.record = None;
            self.sending(&lease.lease);
            names.push((lease.lease.item().clone(), lease.lease.token()));
            sent.push((lease.lease, forget));
        }
        match Queue::done_and_next_many(&self.queue, sent, max).await {
            Ok(DoneMany { done, next }) => {
                for ((item, token), result) in names.iter().zip(&done) {
                    self.ended(item, *token, result);
                }
                Ok(DoneMany {
                    done,
                    next: next.into_iter().map(|l| self.started(l)).collect(),
                })
            }
            Err(error) => {
                for (item, token) in &names {
                    self.ended(item, *token, &Err(Error::OutcomeUnknown));
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

    fn is_lease_lost(error: &Error) -> bool {
        error.is_lease_lost()
    }

    fn shut_down(&self) -> Vec<String> {
        Queue::shut_down(&self.queue)
    }

    async fn shut_down_with_drain(&self) -> Result<(), Error> {
        self.queue.shut_down_with_drain().await
    }

    async fn is_shutting_down(&self) -> Result<bool, Error> {
        self.queue.is_shutting_down().await
    }
}

impl QueueLease for LoggedLease {
    type Item = String;
    type Error = Error;

    fn item(&self) -> &String {
        self.lease.item()
    }

    fn priority(&self) -> i32 {
        self.lease.priority()
    }

    async fn done(mut self) -> Result<(), Error> {
        let record = self.record.take();
        let (item, token) = (self.lease.item().clone(), self.lease.token());
        if let Some(record) = &record {
            record(format!("D {item} {token} {}\n", now_us()));
        }
        let result = self.lease.done().await;
        if let Some(record) = &record {
            record(format!("E {item} {token} {}\n", outcome(&result)));
        }
        result
    }

    async fn release(mut self) -> Result<bool, Error> {
        let record = self.record.take();
        let (item, token) = (self.lease.item().clone(), self.lease.token());
        if let Some(record) = &record {
            record(format!("D {item} {token} {}\n", now_us()));
        }
        let result = QueueLease::release(self.lease).await;
        if let Some(record) = &record {
            record(format!("E {item} {token} released\n"));
        }
        result
    }
}

// ===== the harness =====

/// One worker process and its history file.
struct Worker {
    child: Child,
    log: PathBuf,
    /// When it was killed, if it was.
    killed_at: Option<u64>,
}

/// A span in which a lease could legitimately expire: a pause of one worker (its log), or
/// the server being down (`None`).
struct Window {
    log: Option<PathBuf>,
    from: u64,
    to: u64,
}

/// One run: a server, a queue, worker processes, and what happened to them.
struct Scenario {
    server: PgServer,
    queue: PgQueue<String>,
    dir: PathBuf,
    workers: Vec<Worker>,
    windows: Vec<Window>,
    lease_ms: u64,
    work_ms: u64,
    mutation: &'static str,
    /// `steps` (tasks calling `done_and_get`) or `workers` (a `Workers` pool, batched steps).
    kind: &'static str,
    /// Acknowledged adds: item and sequence number.
    acked: Arc<Mutex<Vec<(String, u64)>>>,
}

impl Scenario {
    async fn start(
        kind: &'static str,
        lease_ms: u64,
        work_ms: u64,
        mutation: &'static str,
    ) -> Option<Self> {
        let server = PgServer::start()?;
        let queue = PgQueue::<String>::builder(unique("crash"))
            .url(server.url())
            .retry_deadline(Duration::from_secs(60))
            .build()
            .await
            .unwrap();
        let dir = std::env::temp_dir().join(format!(
            "wq-pg-crash-{}-{}",
            std::process::id(),
            queue.name()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Some(Scenario {
            server,
            queue,
            dir,
            workers: Vec::new(),
            windows: Vec::new(),
            lease_ms,
            work_ms,
            mutation,
            kind,
            acked: Arc::new(Mutex::new(Vec::new())),
        })
    }

    /// Starts a worker process with `tasks` workers.
    fn spawn(&mut self, tasks: usize) {
        let log = self.dir.join(format!("worker-{}.log", self.workers.len()));
        let config = [
            self.server.url(),
            self.queue.name().to_owned(),
            log.display().to_string(),
            tasks.to_string(),
            self.work_ms.to_string(),
            self.lease_ms.to_string(),
            self.mutation.to_owned(),
            self.kind.to_owned(),
        ]
        .join("|");
        let child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "worker_process",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(WORKER_ENV, config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.workers.push(Worker {
            child,
            log,
            killed_at: None,
        });
    }

    /// `kill -9` of worker `i`.
    fn kill(&mut self, i: usize) {
        let worker = &mut self.workers[i];
        let _ = worker.child.kill();
        let _ = worker.child.wait();
        worker.killed_at.get_or_insert(now_us());
    }

    /// Sends `signal` to worker `i`.
    fn signal(&self, i: usize, signal: &str) {
        let _ = Command::new("kill")
            .arg(signal)
            .arg(self.workers[i].child.id().to_string())
            .status();
    }

    /// Waits until worker `i` is inside a handler (its last line is an `S`), for at most 5 s.
    async fn mid_item(&self, i: usize) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let text = std::fs::read_to_string(&self.workers[i].log).unwrap_or_default();
            if text.lines().last().is_some_and(|l| l.starts_with("S ")) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        false
    }

    /// Pauses worker `i` (mid-item) for `pause`, longer than its lease.
    async fn pause(&mut self, i: usize, pause: Duration) {
        assert!(self.mid_item(i).await, "worker {i} took no item");
        let from = now_us();
        self.signal(i, "-STOP");
        tokio::time::sleep(pause).await;
        self.signal(i, "-CONT");
        self.windows.push(Window {
            log: Some(self.workers[i].log.clone()),
            from,
            to: now_us(),
        });
    }

    /// `kill -9` of the server, down for `down`, then a restart from its data directory.
    fn kill_server(&mut self, down: Duration) {
        let from = now_us();
        self.server.kill();
        std::thread::sleep(down);
        self.server.restart();
        self.windows.push(Window {
            log: None,
            from,
            to: now_us(),
        });
    }

    /// A producer task: `count` adds of `keys` hot keys, one every `every`, some delayed;
    /// each acknowledged add is recorded (a failed one retried until acknowledged).
    fn produce(&self, count: usize, keys: usize, every: Duration) -> tokio::task::JoinHandle<()> {
        let queue = self.queue.clone();
        let acked = self.acked.clone();
        tokio::spawn(async move {
            for i in 0..count {
                let item = format!("k{}", i % keys);
                let options = if i % 7 == 3 {
                    AddOptions::default().after(Duration::from_millis(50))
                } else {
                    AddOptions::default()
                };
                loop {
                    match queue.add_with(&item, options).await {
                        Ok(added) => {
                            assert_ne!(added.kind, AddKind::Ignored);
                            acked.lock().unwrap().push((item.clone(), added.seq));
                            break;
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
                tokio::time::sleep(every).await;
            }
        })
    }

    /// A backlog of `n` distinct items, queued before the workers start. For pools of
    /// `Workers`: while a step is on its way, other workers end items of the backlog, and
    /// the next step carries their `done`s together (adds that trickle in, one at a time,
    /// leave each step one `done`).
    async fn backlog(&self, n: usize) {
        self.produce(n, n, Duration::ZERO).await.unwrap();
    }

    /// Waits until nothing is queued, delayed or leased (for at most `limit`), then kills
    /// every worker and checks the histories.
    async fn finish(mut self, limit: Duration) -> Report {
        let deadline = Instant::now() + limit;
        let mut quiet_since: Option<Instant> = None;
        while Instant::now() < deadline {
            let idle = async {
                Ok::<bool, Error>(
                    self.queue.len().await? == 0
                        && self.queue.delayed_len().await? == 0
                        && self.queue.processing_len().await? == 0,
                )
            }
            .await
            .unwrap_or(false);
            match (idle, quiet_since) {
                (true, Some(since)) if since.elapsed() > Duration::from_millis(300) => break,
                (true, None) => quiet_since = Some(Instant::now()),
                (false, _) => quiet_since = None,
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for i in 0..self.workers.len() {
            if self.workers[i].killed_at.is_none() {
                let _ = self.workers[i].child.kill();
                let _ = self.workers[i].child.wait();
            }
        }
        let acked = self.acked.lock().unwrap().clone();
        let mut report = check(&acked, &self.workers, &self.windows);
        for worker in &self.workers {
            let steps = std::fs::read_to_string(format!("{}.steps", worker.log.display()))
                .unwrap_or_default();
            for size in steps.lines().filter_map(|l| l.parse::<usize>().ok()) {
                report.steps += 1;
                report.largest_step = report.largest_step.max(size);
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        report
    }
}

// ===== the checker =====

/// One processing of an item under one lease.
#[derive(Debug, Default, Clone)]
struct Processing {
    log: PathBuf,
    start: u64,
    /// When the handler ended (`D`), or the worker was killed.
    end: Option<u64>,
    /// `ok`, `refused`, `unknown`, `sent` (killed after sending done), or empty (killed
    /// before).
    done: String,
}

impl Processing {
    /// Whether its `done` was, or may have been, accepted.
    fn may_have_completed(&self) -> bool {
        matches!(self.done.as_str(), "ok" | "unknown" | "sent")
    }
}

/// What the checker found.
#[derive(Debug, Default)]
struct Report {
    adds: usize,
    processings: usize,
    refused: usize,
    excused_overlaps: usize,
    /// Batched steps (`workers` processes): how many, and the most `done`s one carried.
    steps: usize,
    largest_step: usize,
    lost: Vec<String>,
    unexcused_overlaps: Vec<String>,
    stale_done_accepted: Vec<String>,
}

impl Report {
    fn passed(&self) -> bool {
        self.lost.is_empty()
            && self.unexcused_overlaps.is_empty()
            && self.stale_done_accepted.is_empty()
    }
}

fn read(worker: &Worker, seen: &mut HashMap<String, BTreeMap<u64, Processing>>) {
    let text = std::fs::read_to_string(&worker.log).unwrap_or_default();
    for line in text.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        let [kind, item, token, value] = parts[..] else {
            continue; // a line cut by a kill
        };
        let Ok(token) = token.parse::<u64>() else {
            continue;
        };
        let p = seen
            .entry(item.to_owned())
            .or_default()
            .entry(token)
            .or_default();
        match kind {
            "S" => {
                p.log = worker.log.clone();
                p.start = value.parse().unwrap_or(0);
            }
            "D" => {
                p.end = value.parse().ok();
                p.done = "sent".to_owned();
            }
            "E" => p.done = value.to_owned(),
            _ => {}
        }
    }
    // Killed mid-item: the processing ends with the process.
    for processings in seen.values_mut() {
        for p in processings.values_mut() {
            if p.log == worker.log && p.end.is_none() {
                p.end = worker.killed_at;
            }
        }
    }
}

fn check(acked: &[(String, u64)], workers: &[Worker], windows: &[Window]) -> Report {
    let mut seen: HashMap<String, BTreeMap<u64, Processing>> = HashMap::new();
    for worker in workers {
        read(worker, &mut seen);
    }
    let mut report = Report {
        adds: acked.len(),
        ..Report::default()
    };
    for (item, by_token) in &seen {
        let list: Vec<(&u64, &Processing)> = by_token.iter().collect();
        report.processings += list.len();
        report.refused += list.iter().filter(|(_, p)| p.done == "refused").count();
        // In token order: `a` is the older holder of each pair.
        for (i, (ta, a)) in list.iter().enumerate() {
            let a_end = a.end.unwrap_or(u64::MAX);
            for (tb, b) in &list[i + 1..] {
                let b_end = b.end.unwrap_or(u64::MAX);
                if !(a.start < b_end && b.start < a_end) {
                    continue;
                }
                let what = format!(
                    "{item}: token {ta} ({}..{a_end}, {}) and token {tb} ({}..{b_end}, {})",
                    a.start, a.done, b.start, b.done
                );
                let excused = windows.iter().any(|w| {
                    w.log.as_ref().is_none_or(|log| *log == a.log)
                        && a.start < w.to
                        && a_end > w.from
                });
                if excused {
                    report.excused_overlaps += 1;
                } else {
                    report.unexcused_overlaps.push(what.clone());
                }
                if a.done == "ok" {
                    report.stale_done_accepted.push(what);
                }
            }
        }
    }
    for (item, seq) in acked {
        let done_after = seen.get(item).is_some_and(|by_token| {
            by_token
                .range(seq + 1..)
                .any(|(_, p)| p.may_have_completed())
        });
        if !done_after {
            report.lost.push(format!("{item} (added at {seq})"));
        }
    }
    report
}

/// One scenario at a time: they kill processes and time pauses on two shared cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn assert_passed(kind: &str, report: &Report) {
    println!("{kind}: {report:?}");
    assert!(
        report.adds > 0 && report.processings > 0,
        "nothing ran: {report:?}"
    );
    assert!(report.passed(), "the checker failed: {report:?}");
    if kind == "workers" {
        assert!(report.steps > 0, "no batched step: {report:?}");
    }
}

/// Workers per process and the handler's time (ms) of a row whose loops run `tasks` workers
/// for `work_ms`: pools of `Workers` get twice the workers and handlers of 5 ms, and a
/// backlog ([`Scenario::backlog`]), so that their steps carry several `done`s.
fn shape(kind: &str, tasks: usize, work_ms: u64) -> (usize, u64) {
    if kind == "workers" {
        (tasks * 2, 5)
    } else {
        (tasks, work_ms)
    }
}

/// Three worker processes of four workers (pools of eight); four times, the oldest live one
/// is killed (`kill -9`) as soon as it is inside a handler, and a new one started.
async fn kill_9_of_workers_mid_item(kind: &'static str) {
    let _serial = SERIAL.lock().await;
    let (tasks, work_ms) = shape(kind, 4, 20);
    let Some(mut s) = Scenario::start(kind, 600, work_ms, "").await else {
        return;
    };
    if kind == "workers" {
        s.backlog(600).await;
    }
    for _ in 0..3 {
        s.spawn(tasks);
    }
    let producer = s.produce(300, 12, Duration::from_millis(5));
    let mut mid_item_kills = 0;
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        // The oldest live worker, killed as soon as it is inside a handler.
        let victim = s
            .workers
            .iter()
            .position(|w| w.killed_at.is_none())
            .unwrap();
        if s.mid_item(victim).await {
            mid_item_kills += 1;
        }
        s.kill(victim);
        s.spawn(tasks);
    }
    producer.await.unwrap();
    let report = s.finish(Duration::from_secs(60)).await;
    assert_passed(kind, &report);
    assert!(mid_item_kills > 0, "no worker was killed mid-item");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_workers_mid_item_loses_nothing() {
    kill_9_of_workers_mid_item("steps").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_batched_workers_mid_item_loses_nothing() {
    kill_9_of_workers_mid_item("workers").await;
}

/// Three worker processes of four workers (pools of eight); the server is killed (`kill
/// -9`) and restarted 1.5 s later.
async fn kill_9_of_the_server(kind: &'static str) {
    let _serial = SERIAL.lock().await;
    let (tasks, work_ms) = shape(kind, 4, 20);
    let Some(mut s) = Scenario::start(kind, 1000, work_ms, "").await else {
        return;
    };
    if kind == "workers" {
        s.backlog(600).await;
    }
    for _ in 0..3 {
        s.spawn(tasks);
    }
    let producer = s.produce(300, 12, Duration::from_millis(5));
    tokio::time::sleep(Duration::from_millis(500)).await;
    s.kill_server(Duration::from_millis(1500));
    producer.await.unwrap();
    let report = s.finish(Duration::from_secs(90)).await;
    assert_passed(kind, &report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_server_and_a_restart_loses_nothing() {
    kill_9_of_the_server("steps").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_server_under_batched_workers_loses_nothing() {
    kill_9_of_the_server("workers").await;
}

/// Two worker processes (of two workers, pools of four) on four hot keys; the first is
/// paused mid-item for five leases.
async fn paused_past_the_lease(kind: &'static str, mutation: &'static str) -> Option<Report> {
    let (tasks, work_ms) = shape(kind, 2, 100);
    let mut s = Scenario::start(kind, 400, work_ms, mutation).await?;
    if kind == "workers" {
        s.backlog(300).await;
    }
    s.spawn(tasks);
    s.spawn(tasks);
    let producer = s.produce(150, 4, Duration::from_millis(5));
    s.pause(0, Duration::from_millis(2000)).await;
    producer.await.unwrap();
    Some(s.finish(Duration::from_secs(60)).await)
}

async fn a_paused_worker_is_fenced_off(kind: &'static str) {
    let _serial = SERIAL.lock().await;
    let Some(report) = paused_past_the_lease(kind, "").await else {
        return;
    };
    assert_passed(kind, &report);
    assert!(
        report.refused > 0,
        "the paused holder's done was refused: {report:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_paused_past_its_lease_is_fenced_off() {
    a_paused_worker_is_fenced_off("steps").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_workers_paused_past_their_lease_are_fenced_off() {
    a_paused_worker_is_fenced_off("workers").await;
}

/// Four processes of eight workers on six hot keys, no fault.
async fn thirty_two_workers_on_hot_keys(kind: &'static str) {
    let _serial = SERIAL.lock().await;
    let Some(mut s) = Scenario::start(kind, 5000, 2, "").await else {
        return;
    };
    for _ in 0..4 {
        s.spawn(8);
    }
    let producer = s.produce(1500, 6, Duration::ZERO);
    producer.await.unwrap();
    let report = s.finish(Duration::from_secs(60)).await;
    assert_passed(kind, &report);
    assert_eq!(
        report.excused_overlaps, 0,
        "no fault, no excuse: {report:?}"
    );
    if kind == "workers" {
        assert!(
            report.largest_step > 1,
            "no step carried the dones of several workers: {report:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_workers_on_hot_keys_never_overlap() {
    thirty_two_workers_on_hot_keys("steps").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_batched_workers_on_hot_keys_never_overlap() {
    thirty_two_workers_on_hot_keys("workers").await;
}

/// Control: without fencing, the paused holder's stale `done` is accepted, and the checker
/// must say so.
async fn control_without_fencing(kind: &'static str) {
    let _serial = SERIAL.lock().await;
    let Some(report) = paused_past_the_lease(kind, "no-fencing").await else {
        return;
    };
    println!("{kind}: {report:?}");
    assert!(
        !report.stale_done_accepted.is_empty(),
        "the control was caught: {report:?}"
    );
    assert!(!report.passed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_without_fencing_the_checker_fails() {
    control_without_fencing("steps").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_without_fencing_under_batched_workers_the_checker_fails() {
    control_without_fencing("workers").await;
}

/// Control: when a re-add while processing is not queued again, acknowledged adds are lost,
/// and the checker must say so.
async fn control_without_the_dirty_requeue(kind: &'static str) {
    let _serial = SERIAL.lock().await;
    // Each of four keys is held for two seconds, and re-added once while every one of them
    // is held: the re-adds are the keys' last, so without the re-queue they are lost. (A
    // stream of re-adds leaves it to timing whether a key's last add lands while it is held
    // or while it waits, and on a fast machine none may be lost.)
    let Some(mut s) = Scenario::start(kind, 5000, 2000, "no-dirty-requeue").await else {
        return;
    };
    s.spawn(4);
    // The workers are processes that may take seconds to start on a busy machine.
    s.produce(4, 4, Duration::ZERO).await.unwrap();
    let started = Instant::now();
    while s.queue.processing_len().await.unwrap() < 4 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the workers did not take the four keys"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    s.produce(4, 4, Duration::ZERO).await.unwrap();
    let report = s.finish(Duration::from_secs(30)).await;
    println!("{kind}: {report:?}");
    assert!(
        !report.lost.is_empty(),
        "the control was caught: {report:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_without_the_dirty_requeue_the_checker_fails() {
    control_without_the_dirty_requeue("steps").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_without_the_dirty_requeue_under_batched_workers_the_checker_fails() {
    control_without_the_dirty_requeue("workers").await;
}
