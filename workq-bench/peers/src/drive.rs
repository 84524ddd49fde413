//! The workloads, written once over [`Peer`], the way `wq-bench` runs them on our queues
//! (`workq-bench/src/distributed.rs` and `fleet/`): the same sizes, batches of 100 adds, the
//! same number of producers and consumers, the same clocks and the same figures.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::peer::{Error, Handler, Job, Peer, Result};

/// Items per batch of adds, as on our side.
pub(crate) const ADD_BATCH: usize = 100;
/// Keys of the dedup workload (W3).
const W3_KEYS: u64 = 1_000;
/// The longest a workload may take to drain before the run is given up.
const DRAIN_LIMIT: Duration = Duration::from_secs(600);
/// How often a paced producer adds what is due (W7).
const TICK: Duration = Duration::from_millis(2);

/// The figures of one run: (metric, value).
pub(crate) type Figures = Vec<(&'static str, f64)>;

/// Set when the run is abandoned: the producers add nothing more.
static STOPPED: AtomicBool = AtomicBool::new(false);

/// Stops the producers of this process (before its queue is deleted).
pub(crate) fn stop_adding() {
    STOPPED.store(true, Ordering::SeqCst);
}

/// Whether the run was abandoned (its clean-up is under way on another thread).
pub(crate) fn abandoned() -> bool {
    STOPPED.load(Ordering::SeqCst)
}

/// Adds `jobs` to `queue`, unless the run was abandoned.
pub(crate) async fn add<P: Peer>(queue: &P, jobs: &[Job]) -> Result<()> {
    if abandoned() {
        return Err("the run was abandoned".into());
    }
    queue.add(jobs).await
}

/// The queue this process made, for the clean-up of an interrupted run.
static LIVE: Mutex<Option<String>> = Mutex::new(None);

/// A queue name no other run uses, noted as this process's queue.
pub(crate) fn queue_name(workload: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        "wq-bench-{}-{}-{}",
        workload.to_ascii_lowercase(),
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    *LIVE.lock().unwrap_or_else(|e| e.into_inner()) = Some(name.clone());
    name
}

/// The queue this process made, if any.
pub(crate) fn live_queue() -> Option<String> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// A handler that counts the jobs it sees in `seen`.
fn counter(seen: Arc<AtomicUsize>) -> Handler {
    Arc::new(move |_| {
        seen.fetch_add(1, Ordering::Relaxed);
        Box::pin(async {})
    })
}

/// Waits until `done()` holds, polling every `every`; an error after [`DRAIN_LIMIT`].
pub(crate) async fn wait_until(
    what: &str,
    every: Duration,
    mut done: impl AsyncFnMut() -> Result<bool>,
) -> Result<()> {
    let started = Instant::now();
    while !done().await? {
        if started.elapsed() > DRAIN_LIMIT {
            return Err(format!("{what} did not happen in {DRAIN_LIMIT:?}").into());
        }
        tokio::time::sleep(every).await;
    }
    Ok(())
}

/// W1: 1 producer adds `n` distinct jobs in batches; 1 worker (concurrency 1) runs them.
pub(crate) async fn w1<P: Peer>(url: &str, n: usize) -> Result<Figures> {
    let queue = P::open(url, &queue_name("w1")).await?;
    queue.delete().await?;
    let seen = Arc::new(AtomicUsize::new(0));
    let workers = queue.work(1, counter(seen.clone())).await?;
    let started = Instant::now();
    let jobs: Vec<Job> = (0..n as u64).map(Job::now).collect();
    for chunk in jobs.chunks(ADD_BATCH) {
        add(&queue, chunk).await?;
    }
    wait_until("W1's drain", Duration::from_millis(1), async || {
        Ok(seen.load(Ordering::Relaxed) >= n)
    })
    .await?;
    let elapsed = started.elapsed();
    workers.stop().await?;
    queue.delete().await?;
    Ok(vec![("items_per_s", n as f64 / elapsed.as_secs_f64())])
}

/// W3 and W3P: 4 producers add `adds` jobs in batches while 2 workers (concurrency 1 each)
/// run them. W3 (`unique`): the same 1,000 keys over and over, through the peer's unique-job
/// feature; adds/s, then deliveries and wall once drained. W3P: distinct jobs, every add a
/// job; adds/s only, nothing drained.
pub(crate) async fn w3<P: Peer>(url: &str, adds: usize, unique: bool) -> Result<Figures> {
    let queue = P::open(url, &queue_name(if unique { "w3" } else { "w3p" })).await?;
    queue.delete().await?;
    let deliveries = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..2 {
        workers.push(queue.work(1, counter(deliveries.clone())).await?);
    }
    let per_producer = adds / 4;
    let started = Instant::now();
    let producers: Vec<_> = (0..4_u64)
        .map(|p| {
            let queue = queue.clone();
            tokio::spawn(async move {
                let jobs: Vec<Job> = (0..per_producer as u64)
                    .map(|k| {
                        if unique {
                            // W3's key order, as on our side.
                            Job {
                                unique: true,
                                ..Job::now((k * 7 + p * 13) % W3_KEYS)
                            }
                        } else {
                            Job::now(p * per_producer as u64 + k)
                        }
                    })
                    .collect();
                for chunk in jobs.chunks(ADD_BATCH) {
                    add(&queue, chunk).await?;
                }
                Ok::<_, Error>(())
            })
        })
        .collect();
    for producer in producers {
        producer.await??;
    }
    let adds_per_s = (per_producer * 4) as f64 / started.elapsed().as_secs_f64();
    if !unique {
        // W3P times the adds alone: the workers stop where they are.
        for workers in workers {
            workers.stop().await?;
        }
        queue.delete().await?;
        return Ok(vec![("adds_per_s", adds_per_s)]);
    }
    wait_until("W3's drain", Duration::from_millis(5), async || {
        Ok(queue.pending().await? == 0)
    })
    .await?;
    let wall = started.elapsed();
    for workers in workers {
        workers.stop().await?;
    }
    queue.delete().await?;
    Ok(vec![
        ("adds_per_s", adds_per_s),
        ("deliveries", deliveries.load(Ordering::Relaxed) as f64),
        ("wall_s", wall.as_secs_f64()),
    ])
}

/// W4: 1 producer adds `n` jobs with a random delay in [0, 2 s] (fixed seed) in batches; 2
/// workers (`concurrency` each, as many as our consumer takes per round trip on the same
/// server) record lateness = start of the job minus its intended time. A job that starts
/// before its time counts as 0 late.
pub(crate) async fn w4<P: Peer>(url: &str, n: usize, concurrency: usize) -> Result<Figures> {
    let queue = P::open(url, &queue_name("w4")).await?;
    queue.delete().await?;
    let due: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let lateness: Arc<Mutex<Vec<f64>>> = Arc::default();
    let handler: Handler = {
        let (due, lateness) = (due.clone(), lateness.clone());
        Arc::new(move |id| {
            let now = Instant::now();
            let at = due.lock().unwrap().get(&id).copied();
            if let Some(at) = at {
                // Signed: a job may start before its time.
                let late = if now >= at {
                    (now - at).as_secs_f64() * 1000.0
                } else {
                    -((at - now).as_secs_f64() * 1000.0)
                };
                lateness.lock().unwrap().push(late);
            }
            Box::pin(async {})
        })
    };
    let mut workers = Vec::new();
    for _ in 0..2 {
        workers.push(queue.work(concurrency, handler.clone()).await?);
    }
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(42);
    for chunk_start in (0..n as u64).step_by(ADD_BATCH) {
        let now = Instant::now();
        let batch: Vec<Job> = {
            let mut due_now = due.lock().unwrap();
            (chunk_start..(chunk_start + ADD_BATCH as u64).min(n as u64))
                .map(|id| {
                    let delay = Duration::from_millis(rng.random_range(0..2000));
                    due_now.insert(id, now + delay);
                    Job {
                        delay,
                        ..Job::now(id)
                    }
                })
                .collect()
        };
        add(&queue, &batch).await?;
    }
    let adds_per_s = n as f64 / started.elapsed().as_secs_f64();
    wait_until("W4's drain", Duration::from_millis(5), async || {
        Ok(lateness.lock().unwrap().len() >= n)
    })
    .await?;
    let wall = started.elapsed();
    for workers in workers {
        workers.stop().await?;
    }
    queue.delete().await?;
    let mut late = std::mem::take(&mut *lateness.lock().unwrap());
    late.sort_by(f64::total_cmp);
    // Early starts count as on time in the percentiles, and give the earliest start.
    let early_max = late.first().map_or(0.0, |first| (-first).max(0.0));
    let pct = |p: f64| late[((p / 100.0) * late.len() as f64) as usize % late.len()].max(0.0);
    Ok(vec![
        ("add_after_per_s", adds_per_s),
        ("lateness_p50_ms", pct(50.0)),
        ("lateness_p99_ms", pct(99.0)),
        (
            "lateness_max_ms",
            late.last().map_or(0.0, |last| last.max(0.0)),
        ),
        ("early_max_ms", early_max),
        ("wall_s", wall.as_secs_f64()),
    ])
}

/// Nanoseconds since the Unix epoch: the clock every process of a run shares.
fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// How W7's producer adds: a flood, or paced at a rate (items/s).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Load {
    Flood,
    Paced(f64),
    /// W7B's burn-down: every job added before the worker processes start, in batches of
    /// [`BACKLOG_BATCH`]; timed from their start to the last handler's end.
    Backlog,
}

/// Jobs per batch of a burn-down's backlog (untimed): apalis's `push_all` of 5,000, River's
/// bench command's batch, did not finish; 1,000 does.
const BACKLOG_BATCH: usize = 1_000;

/// W7's shape and load, as `wq-bench` passes them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fleet {
    pub(crate) load: Load,
    pub(crate) items: usize,
    pub(crate) processes: u32,
    pub(crate) workers: u32,
    pub(crate) handler_ms: u32,
}

/// A worker process of W7: this program again, as `PEER W7-worker QUEUE PROCESSES WORKERS
/// HANDLER_MS ITEMS`.
struct Child {
    process: tokio::process::Child,
    stdout: BufReader<tokio::process::ChildStdout>,
}

/// W7, one phase: this process adds the items; `processes` child processes each run workers
/// with `workers` concurrency whose handler sleeps `handler_ms`; figures as on our side
/// (items/s for a flood; pickup p50/p99/max for a paced load).
pub(crate) async fn w7<P: Peer>(peer: &str, url: &str, fleet: Fleet) -> Result<Figures> {
    let name = queue_name("w7");
    let queue = P::open(url, &name).await?;
    queue.delete().await?;
    // Deleted however the phase ends: a phase given up leaves up to a flood of jobs behind.
    let measured = w7_phase(peer, url, fleet, &name, &queue).await;
    let deleted = queue.delete().await;
    let figures = measured?;
    deleted?;
    Ok(figures)
}

/// [`w7`]'s phase on `queue`, named `name`.
async fn w7_phase<P: Peer>(
    peer: &str,
    url: &str,
    fleet: Fleet,
    name: &str,
    queue: &P,
) -> Result<Figures> {
    let ids: Vec<u64> = (0..fleet.items as u64).collect();
    if let Load::Backlog = fleet.load {
        for chunk in ids.chunks(BACKLOG_BATCH) {
            let jobs: Vec<Job> = chunk.iter().copied().map(Job::now).collect();
            add(queue, &jobs).await?;
        }
    }
    // A burn-down's clock starts with the worker processes.
    let fleet_started = now_ns();
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for _ in 0..fleet.processes {
        let mut process = tokio::process::Command::new(&exe)
            .args([
                peer,
                "W7-worker",
                name,
                &fleet.processes.to_string(),
                &fleet.workers.to_string(),
                &fleet.handler_ms.to_string(),
                &fleet.items.to_string(),
            ])
            .env(P::URL_VAR, url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = BufReader::new(process.stdout.take().ok_or("no stdout")?);
        children.push(Child { process, stdout });
    }
    for child in &mut children {
        let mut line = String::new();
        let read =
            tokio::time::timeout(Duration::from_secs(60), child.stdout.read_line(&mut line)).await;
        if !matches!(read, Ok(Ok(n)) if n > 0 && line.trim() == "ready") {
            return Err(
                format!("a worker process did not start (it said {:?})", line.trim()).into(),
            );
        }
    }
    let mut acks = vec![0_i64; fleet.items];
    let mut first_add = now_ns();
    match fleet.load {
        Load::Backlog => {
            first_add = fleet_started;
            acks.fill(fleet_started);
        }
        Load::Flood => {
            for (n, chunk) in ids.chunks(ADD_BATCH).enumerate() {
                let jobs: Vec<Job> = chunk.iter().copied().map(Job::now).collect();
                add(queue, &jobs).await?;
                acks[n * ADD_BATCH..n * ADD_BATCH + chunk.len()].fill(now_ns());
            }
        }
        Load::Paced(rate) => {
            let started = Instant::now();
            let mut added = 0;
            while added < fleet.items {
                let due = ((started.elapsed().as_secs_f64() * rate) as usize + 1).min(fleet.items);
                if due > added {
                    let jobs: Vec<Job> = ids[added..due].iter().copied().map(Job::now).collect();
                    add(queue, &jobs).await?;
                    acks[added..due].fill(now_ns());
                    added = due;
                }
                tokio::time::sleep(TICK).await;
            }
        }
    }
    wait_until("W7's drain", Duration::from_millis(5), async || {
        // A worker process that ended before the drain (its reason is on its standard error)
        // would leave the rest of the queue there until the drain limit.
        for child in &mut children {
            if let Some(status) = child.process.try_wait()? {
                return Err(
                    format!("a worker process exited with {status} before the drain").into(),
                );
            }
        }
        Ok(queue.pending().await? == 0)
    })
    .await?;
    let mut records = Vec::new();
    for mut child in children {
        drop(child.process.stdin.take());
        let mut line = String::new();
        loop {
            line.clear();
            if child.stdout.read_line(&mut line).await? == 0 {
                break;
            }
            if let Some(record) = parse_record(&line) {
                records.push(record);
            }
        }
        let status = child.process.wait().await?;
        if !status.success() {
            return Err(format!("a worker process exited with {status}").into());
        }
    }
    let (items_per_s, pickups) = summarize(fleet.items, first_add, &acks, &records)?;
    let quantile = |q: f64| quantile_ms(&pickups, q);
    Ok(match fleet.load {
        Load::Flood | Load::Backlog => vec![("items_per_s", items_per_s)],
        Load::Paced(_) => vec![
            ("pickup_p50_ms", quantile(0.50)),
            ("pickup_p99_ms", quantile(0.99)),
            ("pickup_max_ms", quantile(1.0)),
        ],
    })
}

/// The `q` quantile (the nearest rank) of `sorted_ns`, latencies in nanoseconds sorted
/// ascending, in milliseconds; 0 if there are none.
pub(crate) fn quantile_ms(sorted_ns: &[i64], q: f64) -> f64 {
    let rank = (q * sorted_ns.len() as f64).ceil() as usize;
    sorted_ns
        .get(rank.clamp(1, sorted_ns.len().max(1)) - 1)
        .map_or(0.0, |ns| *ns as f64 / 1e6)
}

/// One line of a worker process's report, `ITEM START END`.
fn parse_record(line: &str) -> Option<(u64, i64, i64)> {
    let mut fields = line.split_ascii_whitespace();
    Some((
        fields.next()?.parse().ok()?,
        fields.next()?.parse().ok()?,
        fields.next()?.parse().ok()?,
    ))
}

/// Items/s from the first add to the last handler's end, and the sorted pickup latencies
/// (handler start minus the add's acknowledgement, 0 when it started first), in ns. The same
/// arithmetic as `workq-bench/src/fleet/driver.rs`, which this workspace cannot depend on.
fn summarize(
    items: usize,
    first_add: i64,
    acks: &[i64],
    records: &[(u64, i64, i64)],
) -> Result<(f64, Vec<i64>)> {
    let mut seen = vec![false; items];
    let mut last_end = first_add;
    let mut pickups = Vec::with_capacity(items);
    for &(item, start, end) in records {
        let Some(&ack) = acks.get(item as usize) else {
            return Err(format!("a worker handled item {item}, which was never added").into());
        };
        seen[item as usize] = true;
        last_end = last_end.max(end);
        pickups.push((start - ack).max(0));
    }
    let missing = seen.iter().filter(|s| !**s).count();
    if missing > 0 {
        return Err(format!("{missing} of {items} items were never handled").into());
    }
    pickups.sort_unstable();
    let elapsed = (last_end - first_add).max(1) as f64 / 1e9;
    Ok((items as f64 / elapsed, pickups))
}

/// The worker process's side of W7 (one of `fleet.processes`): workers on queue `name` until
/// standard input ends, then one line per job handled, `ITEM START END` (real-time
/// nanoseconds). An error at once if the workers end before that.
pub(crate) async fn w7_worker<P: Peer>(url: &str, name: &str, fleet: Fleet) -> Result<()> {
    let queue = P::open_shared(url, name, fleet.processes).await?;
    let handler_ms = u64::from(fleet.handler_ms);
    let start: Arc<[AtomicI64]> = (0..fleet.items).map(|_| AtomicI64::new(0)).collect();
    let end: Arc<[AtomicI64]> = (0..fleet.items).map(|_| AtomicI64::new(0)).collect();
    let handler: Handler = {
        let (start, end) = (start.clone(), end.clone());
        Arc::new(move |id| {
            let (start, end) = (start.clone(), end.clone());
            Box::pin(async move {
                let began = now_ns();
                if handler_ms > 0 {
                    // A thread's sleep, as our workers' handler: tokio's timer would round 1 ms
                    // up to about 2.
                    let pause = Duration::from_millis(handler_ms);
                    let _ = tokio::task::spawn_blocking(move || std::thread::sleep(pause)).await;
                }
                if let (Some(s), Some(e)) = (start.get(id as usize), end.get(id as usize)) {
                    s.store(began, Ordering::Relaxed);
                    e.store(now_ns(), Ordering::Relaxed);
                }
            })
        })
    };
    let mut running = queue.work(fleet.workers as usize, handler).await?;
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "ready")?;
        stdout.flush()?;
    }
    let stdin_closed = tokio::task::spawn_blocking(|| {
        let _ = std::io::stdin().lock().read_to_end(&mut Vec::new());
    });
    tokio::select! {
        closed = stdin_closed => closed?,
        cause = running.ended() => {
            return Err(format!("the workers ended before the drain: {cause}").into());
        }
    }
    running.stop().await?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for (id, (s, e)) in start.iter().zip(end.iter()).enumerate() {
        let began = s.load(Ordering::Relaxed);
        if began != 0 {
            writeln!(out, "{id} {began} {}", e.load(Ordering::Relaxed))?;
        }
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_counts_every_item_once_and_measures_from_the_acknowledgement() {
        let acks = [100, 100, 300];
        let records = [(0, 150, 160), (1, 90, 95), (2, 400, 1_000_000_100)];
        let (items_per_s, pickups) = summarize(3, 0, &acks, &records).unwrap();
        assert!((items_per_s - 3.0 / 1.0000001).abs() < 1e-3);
        assert_eq!(pickups, vec![0, 50, 100]);
        assert!(summarize(3, 0, &acks, &records[..2]).is_err());
        assert!(summarize(3, 0, &acks, &[(7, 1, 2)]).is_err());
        assert_eq!(parse_record("7 10 20\n"), Some((7, 10, 20)));
        assert_eq!(parse_record("ready"), None);
    }

    #[test]
    fn a_quantile_is_the_nearest_rank_in_milliseconds() {
        let sorted: Vec<i64> = (1..=100).map(|ms| ms * 1_000_000).collect();
        assert_eq!(quantile_ms(&sorted, 0.50), 50.0);
        assert_eq!(quantile_ms(&sorted, 0.99), 99.0);
        assert_eq!(quantile_ms(&sorted, 1.0), 100.0);
        assert_eq!(quantile_ms(&sorted, 0.0), 1.0);
        assert_eq!(quantile_ms(&[], 0.99), 0.0);
    }

    #[test]
    fn an_abandoned_run_adds_nothing_more() {
        #[derive(Clone)]
        struct Never;
        impl Peer for Never {
            const NAME: &'static str = "never";
            const URL_VAR: &'static str = "NONE";
            async fn open(_: &str, _: &str) -> Result<Self> {
                Ok(Never)
            }
            async fn add(&self, _: &[Job]) -> Result<()> {
                panic!("an add after the run was abandoned")
            }
            async fn work(&self, _: usize, _: Handler) -> Result<crate::peer::Running> {
                unreachable!()
            }
            async fn pending(&self) -> Result<u64> {
                Ok(0)
            }
            async fn delete(&self) -> Result<()> {
                Ok(())
            }
            fn settings() -> String {
                String::new()
            }
        }
        stop_adding();
        let refused = futures::executor::block_on(add(&Never, &[Job::now(1)]));
        assert!(refused.is_err() && abandoned());
    }
}
