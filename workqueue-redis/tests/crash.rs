//! Nothing lost, never twice at once, on real servers.
//!
//! Each scenario starts its own `redis-server` (a free loopback port, its own data directory,
//! stopped by PID), runs worker *processes* (this binary re-executed with `--worker`) that
//! record a history, and applies a nemesis: `kill -9` of workers mid-item, `kill -9` of the
//! server and a restart from its AOF, `SIGSTOP` of a worker past its lease, or 32 workers on
//! hot keys. A checker then proves, from the histories:
//!
//! - **nothing lost**: every acknowledged add of an item (with its sequence number `s`, taken
//!   on the server from the counter behind lease tokens) is followed by a processing of that
//!   item under a lease whose token is larger than `s` and whose `done` was accepted;
//! - **never twice at once**: no two processings of one item whose `done`s were accepted
//!   overlap in time (all processes read one host's clock). Overlaps where one side's `done`
//!   was refused (the fenced, stale holder of a paused worker) are counted separately.
//!
//! A control run with persistence off must report losses: the checker can fail.
//!
//! This is a test binary without the standard harness (it runs child processes); it prints
//! one line per scenario and a `test result:` line. Filters on the command line select
//! scenarios by substring. Without `redis-server` it skips with a note, unless `CI=true`.

#[path = "support/server.rs"]
mod server;

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use server::{Durability, RedisServer};
use workqueue_redis::{AddKind, Error, RedisQueue};

/// Microseconds since the Unix epoch: one clock for every process on this host.
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A small deterministic generator (no dependency needed).
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
/// the history file before or after it happens (see the checker for which).
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
    let (work_min, work_max, slow_pct, slow_ms) = (work[0], work[1], work[2], work[3]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let mut history = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("open the history");
        let mut record = |line: String| {
            // One write per line: a kill can cut off at most the line being written.
            history.write_all(line.as_bytes()).unwrap();
        };
        let queue: RedisQueue<String> = loop {
            match RedisQueue::builder(name.as_str())
                .url(url.as_str())
                .lease_duration(Duration::from_millis(lease_ms))
                .poll_interval(Duration::from_millis(500))
                .response_timeout(Duration::from_millis(1000))
                .check_persistence(false)
                .build()
                .await
            {
                Ok(queue) => break queue,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        let mut rng = Rng::new(u64::from(std::process::id()) ^ now_us());
        loop {
            let lease = match queue.get().await {
                Ok(Some(lease)) => lease,
                Ok(None) => break,
                Err(_) => {
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
            tokio::time::sleep(Duration::from_millis(ms)).await;
            record(format!("E {item} {token} {}\n", now_us()));
            // A worker that lost its lease still tries to commit: the server must refuse.
            let outcome = match lease.done().await {
                Ok(()) => "ok",
                Err(Error::LeaseLost) => "stale",
                Err(_) => "unknown",
            };
            record(format!("D {item} {token} {outcome}\n"));
        }
    });
    ExitCode::SUCCESS
}

// ===== the harness =====

/// How a scenario runs.
#[derive(Debug, Clone)]
struct Scenario {
    name: &'static str,
    durability: Durability,
    workers: usize,
    lease_ms: u64,
    /// Work per item: min, max, percentage of slow items, slow duration (ms).
    work: [u64; 4],
    /// Distinct items added, and adds in all (the rest are re-adds of hot or earlier items).
    distinct: usize,
    adds: usize,
    hot_keys: usize,
    /// Pause between adds.
    add_every: Duration,
    nemesis: Nemesis,
    /// The control run: the checker must find losses.
    expect_losses: bool,
    /// The pause run: the checker must find fenced overlaps.
    expect_fenced: bool,
}

#[derive(Debug, Clone, Copy)]
enum Nemesis {
    None,
    /// `kill -9` a random worker every period (and start a fresh one).
    KillWorkers {
        every: Duration,
        count: usize,
    },
    /// `kill -9` the server at these points of the run, restart it after `down`.
    KillServer {
        at_ms: &'static [u64],
        down: Duration,
    },
    /// `SIGSTOP` a random worker for `stop`, `count` times, `every` apart.
    PauseWorkers {
        every: Duration,
        stop: Duration,
        count: usize,
    },
}

struct Worker {
    child: Child,
    log: PathBuf,
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
}

impl Harness {
    fn spawn_worker(&mut self) {
        let log = self.dir.join(format!("worker-{}.log", self.spawned));
        self.spawned += 1;
        File::create(&log).unwrap();
        let s = &self.scenario;
        let child = Command::new(std::env::current_exe().unwrap())
            .arg("--worker")
            .env("WQ_URL", self.server.url())
            .env("WQ_QUEUE", &self.queue_name)
            .env("WQ_LOG", &log)
            .env("WQ_LEASE_MS", s.lease_ms.to_string())
            .env("WQ_WORK_MS", s.work.map(|w| w.to_string()).join(","))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a worker process");
        self.workers.push(Worker { child, log });
    }

    fn kill_worker(&mut self, index: usize) {
        let mut worker = self.workers.swap_remove(index);
        let _ = worker.child.kill();
        let _ = worker.child.wait();
        self.killed.insert(worker.log, now_us());
    }

    fn signal_worker(&self, index: usize, signal: &str) {
        let _ = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.workers[index].child.id().to_string())
            .status();
    }
}

/// One acknowledged add.
struct Add {
    item: String,
    seq: u64,
}

/// What the checker found.
#[derive(Debug, Default)]
struct Report {
    adds: usize,
    processings: usize,
    accepted: usize,
    stale: usize,
    unknown: usize,
    killed_mid_item: usize,
    lost_adds: usize,
    lost_items: Vec<String>,
    raw_overlaps: usize,
    accepted_overlaps: usize,
}

/// One processing of an item under one lease.
#[derive(Debug, Default, Clone)]
struct Processing {
    start: u64,
    end: Option<u64>,
    /// `ok`, `stale`, `unknown`, or empty if no `done` was recorded.
    done: String,
}

impl Processing {
    /// Whether the holder's `done` was (or may have been) accepted.
    fn committed(&self) -> bool {
        self.done == "ok" || self.done == "unknown"
    }
}

fn check(adds: &[Add], logs: &[PathBuf], killed: &HashMap<PathBuf, u64>) -> Report {
    let mut report = Report {
        adds: adds.len(),
        ..Report::default()
    };
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
            let (item, Ok(token)) = (parts[1].to_string(), parts[2].parse::<u64>()) else {
                continue;
            };
            match parts[0] {
                "S" => {
                    let start = parts[3].parse().unwrap_or(0);
                    open.insert(
                        (item, token),
                        Processing {
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
                "D" => {
                    if let Some(mut p) = open.remove(&(item.clone(), token)) {
                        p.done = parts[3].to_string();
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
    for processings in seen.values() {
        for p in processings.values() {
            report.processings += 1;
            match p.done.as_str() {
                "ok" => report.accepted += 1,
                "stale" => report.stale += 1,
                "unknown" => report.unknown += 1,
                _ => {}
            }
        }
        let list: Vec<&Processing> = processings.values().collect();
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                let (a_end, b_end) = (a.end.unwrap_or(u64::MAX), b.end.unwrap_or(u64::MAX));
                if a.start < b_end && b.start < a_end {
                    report.raw_overlaps += 1;
                    if a.committed() && b.committed() {
                        report.accepted_overlaps += 1;
                    }
                }
            }
        }
    }
    let mut lost: Vec<String> = Vec::new();
    for add in adds {
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

/// Adds until the scenario's count is reached; retries what the server did not acknowledge.
async fn produce(queue: RedisQueue<String>, s: Scenario, adds: Arc<Mutex<Vec<Add>>>) {
    let mut rng = Rng::new(7);
    let mut next_distinct = 0;
    for n in 0..s.adds {
        let item = if next_distinct < s.distinct
            && (n * s.distinct / s.adds.max(1) >= next_distinct || s.hot_keys == 0)
        {
            next_distinct += 1;
            format!("item-{}", next_distinct - 1)
        } else if s.hot_keys > 0 {
            format!("hot-{}", rng.below(s.hot_keys as u64))
        } else {
            format!("item-{}", rng.below(next_distinct.max(1) as u64))
        };
        loop {
            match queue.add(item.clone()).await {
                Ok(added) if added.kind != AddKind::Ignored => {
                    adds.lock().unwrap().push(Add {
                        item: item.clone(),
                        seq: added.seq,
                    });
                    break;
                }
                Ok(_) => panic!("the queue was shut down during the run"),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        if !s.add_every.is_zero() {
            tokio::time::sleep(s.add_every).await;
        }
    }
}

/// Waits until nothing is queued, delayed or leased (reads retried through restarts).
async fn drained(queue: &RedisQueue<String>, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(stats) = queue.stats(1).await
            && stats.depth == 0
            && stats.delayed == 0
            && stats.in_flight == 0
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

async fn run(s: Scenario) -> Result<String, String> {
    let Some(server) = RedisServer::start_with(s.durability, &[]) else {
        return Ok("skipped: no redis-server".into());
    };
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
    };
    let producer_queue: RedisQueue<String> = RedisQueue::builder(h.queue_name.as_str())
        .url(h.server.url())
        .response_timeout(Duration::from_millis(1000))
        .check_persistence(false)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    for _ in 0..s.workers {
        h.spawn_worker();
    }
    let adds = Arc::new(Mutex::new(Vec::new()));
    let producer = tokio::spawn(produce(producer_queue.clone(), s.clone(), adds.clone()));
    let started = Instant::now();
    let mut rng = Rng::new(42);
    let mut events = 0;
    match s.nemesis {
        Nemesis::None => {}
        Nemesis::KillWorkers { every, count } => {
            for _ in 0..count {
                tokio::time::sleep(every).await;
                let victim = rng.below(h.workers.len() as u64) as usize;
                h.kill_worker(victim);
                h.spawn_worker();
                events += 1;
            }
        }
        Nemesis::KillServer { at_ms, down } => {
            for point in at_ms {
                tokio::time::sleep_until((started + Duration::from_millis(*point)).into()).await;
                h.server.kill();
                tokio::time::sleep(down).await;
                h.server.restart();
                events += 1;
            }
        }
        Nemesis::PauseWorkers { every, stop, count } => {
            for _ in 0..count {
                tokio::time::sleep(every).await;
                let victim = rng.below(h.workers.len() as u64) as usize;
                h.signal_worker(victim, "STOP");
                tokio::time::sleep(stop).await;
                h.signal_worker(victim, "CONT");
                events += 1;
            }
        }
    }
    tokio::time::timeout(Duration::from_secs(60), producer)
        .await
        .map_err(|_| "the producer did not finish".to_string())?
        .map_err(|e| e.to_string())?;
    let drained = drained(&producer_queue, Duration::from_secs(30)).await;
    let _ = producer_queue.shut_down().await;
    // Workers leave once the queue is shut down and empty.
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
    let adds = std::mem::take(&mut *adds.lock().unwrap());
    let report = check(&adds, &logs, &h.killed);
    let summary = format!(
        "{} workers ({} processes), {} nemesis events, {:.1} s: {} acknowledged adds, {} processings \
         ({} done accepted, {} refused as stale, {} unknown, {} killed mid-item); lost {} adds \
         ({} items); overlaps: {} raw, {} with both dones accepted",
        s.workers,
        h.spawned,
        events,
        started.elapsed().as_secs_f64(),
        report.adds,
        report.processings,
        report.accepted,
        report.stale,
        report.unknown,
        report.killed_mid_item,
        report.lost_adds,
        report.lost_items.len(),
        report.raw_overlaps,
        report.accepted_overlaps,
    );
    let fail = |why: &str| {
        Err(format!(
            "{why}\n    {summary}\n    histories in {}",
            keep(&h)
        ))
    };
    if report.accepted_overlaps > 0 {
        return fail("two live lease holders processed one item at once");
    }
    if s.expect_losses {
        if report.lost_adds == 0 {
            return fail("the control run (no persistence) must report losses");
        }
        return Ok(summary);
    }
    if !drained {
        return fail("the queue did not drain");
    }
    if report.lost_adds > 0 {
        return fail(&format!(
            "acknowledged adds were lost: {:?}",
            &report.lost_items[..report.lost_items.len().min(10)]
        ));
    }
    if s.expect_fenced && report.stale == 0 {
        return fail("the pause should have made a stale holder's done be refused");
    }
    if report.accepted == 0 {
        return fail("nothing was processed");
    }
    Ok(summary)
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
    target.display().to_string()
}

fn scenarios() -> Vec<Scenario> {
    let base = Scenario {
        name: "",
        durability: Durability::Always,
        workers: 6,
        lease_ms: 600,
        work: [2, 20, 5, 900],
        distinct: 300,
        adds: 900,
        hot_keys: 0,
        add_every: Duration::from_millis(4),
        nemesis: Nemesis::None,
        expect_losses: false,
        expect_fenced: false,
    };
    vec![
        Scenario {
            name: "kill_workers_mid_item",
            nemesis: Nemesis::KillWorkers {
                every: Duration::from_millis(300),
                count: 10,
            },
            ..base.clone()
        },
        Scenario {
            name: "kill_redis_and_restart_from_aof",
            workers: 4,
            nemesis: Nemesis::KillServer {
                at_ms: &[1200, 2800],
                down: Duration::from_millis(300),
            },
            ..base.clone()
        },
        Scenario {
            name: "control_without_persistence_reports_losses",
            durability: Durability::None,
            workers: 4,
            // Distinct items only, and work slower than the adds, so a backlog is queued
            // when the server dies and nothing re-adds it afterwards.
            work: [20, 40, 0, 0],
            distinct: 400,
            adds: 400,
            add_every: Duration::from_millis(2),
            expect_losses: true,
            nemesis: Nemesis::KillServer {
                at_ms: &[1500],
                down: Duration::from_millis(300),
            },
            ..base.clone()
        },
        Scenario {
            name: "worker_paused_past_its_lease",
            workers: 4,
            lease_ms: 400,
            work: [80, 150, 0, 0],
            distinct: 60,
            adds: 240,
            add_every: Duration::from_millis(10),
            nemesis: Nemesis::PauseWorkers {
                every: Duration::from_millis(200),
                stop: Duration::from_millis(1000),
                count: 3,
            },
            expect_fenced: true,
            ..base.clone()
        },
        Scenario {
            name: "thirty_two_workers_on_hot_keys",
            workers: 32,
            lease_ms: 2000,
            work: [1, 5, 0, 0],
            distinct: 200,
            adds: 2000,
            hot_keys: 8,
            add_every: Duration::from_micros(500),
            nemesis: Nemesis::KillWorkers {
                every: Duration::from_millis(500),
                count: 4,
            },
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
    if !server::available() {
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
    let (mut passed, mut failed) = (0, 0);
    for s in selected {
        let name = s.name;
        match runtime.block_on(run(s)) {
            Ok(summary) => {
                passed += 1;
                println!("test {name} ... ok\n    {summary}");
            }
            Err(why) => {
                failed += 1;
                println!("test {name} ... FAILED\n    {why}");
            }
        }
    }
    println!(
        "\ntest result: {}. {passed} passed; {failed} failed; 0 ignored; 0 measured; 0 filtered out; finished in {:.2}s\n",
        if failed == 0 { "ok" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
