//! The W7 driver, written once over [`workq::Queue`] and [`Workers`]: what each backend
//! adds to it is [`FleetQueue`] (how to open a handle, add a batch, count what is left, and
//! delete the queue).
//!
//! One *phase* is one queue, one fleet of workers and one producer: the producer adds the
//! phase's items in batches (as fast as the server acknowledges them, or paced at a rate),
//! the fleet handles them, and every process records, per item, when its handler started and
//! ended. On a server the fleet is child processes of this one (`wq-bench --fleet-worker`,
//! see [`super::worker`]); in memory it is [`Workers`] in this process, since an in-memory
//! queue cannot be shared with another.
//!
//! Every time is read from the system's real-time clock ([`now_ns`]), which every process on
//! the machine shares, so a handler start in a child can be held against the acknowledgement
//! of the add in the producer.

use std::future::Future;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufReadExt, BufReader};
use workq::{AsyncWorkers, Queue, WorkQueue, Workers};
use workq_postgres::PgQueue;
use workq_redis::RedisQueue;

use super::protocol::{Spec, Target, parse_record};
use crate::report::Shape;
use crate::util::text;

pub(crate) type Error = String;

/// Nanoseconds since the Unix epoch: the clock every process of a run shares.
pub(crate) fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Items per batch of adds in a flood, on every side.
pub(crate) const ADD_BATCH: usize = 100;

/// How often a paced producer adds what is due.
const TICK: Duration = Duration::from_millis(2);

/// The longest a phase may take to drain before the run is given up.
const DRAIN_LIMIT: Duration = Duration::from_secs(180);

/// What the driver needs of a backend beyond [`Queue`].
pub(crate) trait FleetQueue: Queue<Item = u64> {
    /// Whether other processes can share the queue (then the fleet is child processes).
    const SHARED: bool;

    /// A handle on the queue `name` at `url` (ignored in memory, where it is a new queue).
    fn open(url: &str, name: &str) -> impl Future<Output = Result<Self, Error>> + Send;

    /// Adds `items` as one batch (one round trip, one commit where the backend can).
    fn add_batch(&self, items: &[u64]) -> impl Future<Output = Result<(), Error>> + Send;

    /// Items queued or being processed.
    fn pending(&self) -> impl Future<Output = Result<usize, Error>> + Send;

    /// Deletes the queue and everything in it.
    fn delete(&self) -> impl Future<Output = Result<(), Error>> + Send;
}

impl FleetQueue for WorkQueue<u64> {
    const SHARED: bool = false;

    async fn open(_url: &str, _name: &str) -> Result<Self, Error> {
        Ok(WorkQueue::new())
    }

    async fn add_batch(&self, items: &[u64]) -> Result<(), Error> {
        for &item in items {
            self.add(item);
        }
        Ok(())
    }

    async fn pending(&self) -> Result<usize, Error> {
        Ok(self.len() + self.processing_len())
    }

    async fn delete(&self) -> Result<(), Error> {
        Ok(())
    }
}

impl FleetQueue for RedisQueue<u64> {
    const SHARED: bool = true;

    async fn open(url: &str, name: &str) -> Result<Self, Error> {
        RedisQueue::builder(name)
            .url(url)
            .lease_duration(Duration::from_secs(30))
            .check_persistence(false)
            .build()
            .await
            .map_err(text)
    }

    /// One round trip (`add_all`).
    async fn add_batch(&self, items: &[u64]) -> Result<(), Error> {
        self.add_all(items).await.map(drop).map_err(text)
    }

    async fn pending(&self) -> Result<usize, Error> {
        Ok(self.len().await.map_err(text)? + self.processing_len().await.map_err(text)?)
    }

    async fn delete(&self) -> Result<(), Error> {
        RedisQueue::delete(self).await.map_err(text)
    }
}

impl FleetQueue for PgQueue<u64> {
    const SHARED: bool = true;

    async fn open(url: &str, name: &str) -> Result<Self, Error> {
        PgQueue::builder(name)
            .url(url)
            .lease_duration(Duration::from_secs(30))
            .build()
            .await
            .map_err(text)
    }

    /// One statement, one commit (`add_all`), as pg-boss's `insert` of an array.
    async fn add_batch(&self, items: &[u64]) -> Result<(), Error> {
        self.add_all(items).await.map(drop).map_err(text)
    }

    async fn pending(&self) -> Result<usize, Error> {
        Ok(self.len().await.map_err(text)? + self.processing_len().await.map_err(text)?)
    }

    async fn delete(&self) -> Result<(), Error> {
        PgQueue::delete(self).await.map_err(text)
    }
}

/// When each item's handler started and ended (real-time nanoseconds, 0 if it did not run),
/// by item; written by the handlers without a lock.
pub(crate) struct Log {
    start: Box<[AtomicI64]>,
    end: Box<[AtomicI64]>,
    handled: AtomicUsize,
}

impl Log {
    /// A log of items `0..items`.
    pub(crate) fn new(items: usize) -> Self {
        Self {
            start: (0..items).map(|_| AtomicI64::new(0)).collect(),
            end: (0..items).map(|_| AtomicI64::new(0)).collect(),
            handled: AtomicUsize::new(0),
        }
    }

    fn record(&self, item: u64, start: i64, end: i64) {
        if let (Some(s), Some(e)) = (self.start.get(item as usize), self.end.get(item as usize)) {
            s.store(start, Ordering::Relaxed);
            e.store(end, Ordering::Relaxed);
        }
        self.handled.fetch_add(1, Ordering::Release);
    }

    /// Handler calls so far.
    pub(crate) fn handled(&self) -> usize {
        self.handled.load(Ordering::Acquire)
    }

    /// Every item that ran: (item, start, end).
    pub(crate) fn records(&self) -> impl Iterator<Item = (u64, i64, i64)> + '_ {
        self.start
            .iter()
            .zip(self.end.iter())
            .enumerate()
            .filter_map(|(item, (s, e))| {
                let start = s.load(Ordering::Relaxed);
                (start != 0).then(|| (item as u64, start, e.load(Ordering::Relaxed)))
            })
    }
}

/// Starts `workers` [`Workers`] over `queue` whose handler sleeps `handler_ms` and records the
/// item in `log`: the fleet's workers, in this process or in a child.
pub(crate) fn spawn_workers<Q: Queue<Item = u64>>(
    queue: Q,
    workers: usize,
    handler_ms: u64,
    log: Arc<Log>,
) -> AsyncWorkers<u64, Q> {
    Workers::new(queue)
        .count(workers)
        .spawn_async(move |item: u64| {
            let log = log.clone();
            async move {
                let start = now_ns();
                if handler_ms > 0 {
                    // A thread's sleep, not tokio's: tokio's timer rounds a deadline up to its
                    // next millisecond tick, so `sleep(1 ms)` lasts about 2 ms (16 workers
                    // in memory handled 7.6 k/s, 2.1 ms an item), while node's
                    // `setTimeout(.., 1)` lasts 1.13 ms. A thread's sleep lasts what it says
                    // (about 1.06 ms), so both sides' handlers take about the same time.
                    let pause = Duration::from_millis(handler_ms);
                    let _ = tokio::task::spawn_blocking(move || std::thread::sleep(pause)).await;
                }
                log.record(item, start, now_ns());
            }
        })
}

/// How the producer adds a phase's items.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Load {
    /// Batches of [`ADD_BATCH`], each as soon as the last is acknowledged.
    Flood,
    /// Items per second: every [`TICK`], the items due by then, in one batch.
    Paced(f64),
    /// A burn-down (W7B): every item added before the fleet starts, in batches of
    /// [`BACKLOG_BATCH`]; the clock starts when the fleet is started and stops at the last
    /// handler's end, as River's bench command measures its burn-down mode.
    Backlog,
}

/// Items per batch of a burn-down's backlog: River's bench command inserts 5,000 at a time.
pub(crate) const BACKLOG_BATCH: usize = 5_000;

/// What one phase measured.
#[derive(Debug)]
pub(crate) struct Measured {
    /// Items over the time from the first add to the last handler's end.
    pub(crate) items_per_s: f64,
    /// Pickup latencies (handler start minus the add's acknowledgement), sorted, in ns;
    /// negative ones (a worker started the item before the acknowledgement reached the
    /// producer) count as 0.
    pub(crate) pickup_ns: Vec<i64>,
}

impl Measured {
    /// The `q`-quantile of the pickup latency, in ms.
    pub(crate) fn pickup_ms(&self, q: f64) -> f64 {
        crate::util::quantile(&self.pickup_ns, q) as f64 / 1e6
    }
}

/// The fleet of one phase.
enum Fleet<Q: Queue<Item = u64>> {
    /// Workers in this process (in memory).
    Local(AsyncWorkers<u64, Q>, Arc<Log>),
    /// Worker processes.
    Children(Vec<Child>),
}

/// A worker process: `wq-bench --fleet-worker`.
struct Child {
    process: tokio::process::Child,
    stdout: BufReader<tokio::process::ChildStdout>,
}

/// A queue name no other run uses.
fn queue_name() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "wq-bench-w7-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The queues of the phases under way on a server: (URL, name).
static LIVE: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());

/// Marks queue `name` at `url` as in use until dropped, so that an interrupted bench deletes
/// it.
struct Live(String);

impl Live {
    fn new<Q: FleetQueue>(url: &str, name: &str) -> Self {
        static WATCH: std::sync::Once = std::sync::Once::new();
        WATCH.call_once(|| {
            tokio::spawn(on_interrupt::<Q>());
        });
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        live.push((url.to_owned(), name.to_owned()));
        Live(name.to_owned())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|(_, name)| *name != self.0);
    }
}

/// On SIGINT or SIGTERM: deletes the queues of the phases under way, then exits (with 130 or
/// 143, as a shell reports a process those signals ended). The worker processes see their
/// input end, stop and exit by themselves.
async fn on_interrupt<Q: FleetQueue>() {
    let code = interrupted().await;
    let live = LIVE.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for (url, name) in live {
        let delete = async {
            if let Ok(queue) = Q::open(&url, &name).await {
                let _ = queue.delete().await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(3), delete).await;
    }
    eprintln!("wq-bench: interrupted; deleted the queues of the fleet phase under way");
    std::process::exit(code);
}

/// Waits for SIGINT (returns 130) or, on Unix, SIGTERM (143).
async fn interrupted() -> i32 {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            return tokio::select! {
                _ = tokio::signal::ctrl_c() => 130,
                _ = term.recv() => 143,
            };
        }
    }
    let _ = tokio::signal::ctrl_c().await;
    130
}

/// Runs one phase of `items` items at `shape` on `target`, the producer adding with `load`.
pub(crate) async fn phase<Q: FleetQueue>(
    target: &Target,
    shape: Shape,
    items: usize,
    load: Load,
) -> Result<Measured, Error> {
    let name = queue_name();
    let _live = Q::SHARED.then(|| Live::new::<Q>(target.url(), &name));
    let queue = Q::open(target.url(), &name).await?;
    queue.delete().await?;
    if let Load::Backlog = load {
        return burn_down(&queue, target, &name, shape, items).await;
    }
    let fleet = start_fleet(&queue, target, &name, shape, items).await?;
    let produced = produce(&queue, items, load).await;
    let drained = match &produced {
        Ok(_) => drain(&queue, &fleet, items).await,
        Err(_) => Ok(()),
    };
    let records = stop_fleet(fleet).await;
    let _ = queue.delete().await;
    let (first_add, acks) = produced?;
    drained?;
    let records = records?;
    summarize(items, first_add, &acks, &records)
}

/// A burn-down: adds the backlog, then starts the fleet and times it from there to the last
/// handler's end.
async fn burn_down<Q: FleetQueue>(
    queue: &Q,
    target: &Target,
    name: &str,
    shape: Shape,
    items: usize,
) -> Result<Measured, Error> {
    let ids: Vec<u64> = (0..items as u64).collect();
    for chunk in ids.chunks(BACKLOG_BATCH) {
        if let Err(e) = queue.add_batch(chunk).await {
            let _ = queue.delete().await;
            return Err(e);
        }
    }
    let started = now_ns();
    let fleet = match start_fleet(queue, target, name, shape, items).await {
        Ok(fleet) => fleet,
        Err(e) => {
            let _ = queue.delete().await;
            return Err(e);
        }
    };
    let drained = drain(queue, &fleet, items).await;
    let records = stop_fleet(fleet).await;
    let _ = queue.delete().await;
    drained?;
    // Every item was there when the clock started.
    summarize(items, started, &vec![started; items], &records?)
}

/// Starts the fleet and waits until every worker process is ready.
async fn start_fleet<Q: FleetQueue>(
    queue: &Q,
    target: &Target,
    name: &str,
    shape: Shape,
    items: usize,
) -> Result<Fleet<Q>, Error> {
    if !Q::SHARED {
        let log = Arc::new(Log::new(items));
        let workers = spawn_workers(
            queue.clone(),
            shape.workers as usize,
            u64::from(shape.handler_ms),
            log.clone(),
        );
        return Ok(Fleet::Local(workers, log));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find wq itself: {e}"))?;
    let spec = Spec {
        backend: target.id(),
        queue: name.to_owned(),
        workers: shape.workers,
        handler_ms: shape.handler_ms,
        items,
    };
    let mut children = Vec::new();
    for _ in 0..shape.processes {
        let mut command = tokio::process::Command::new(&exe);
        command
            .args(["--fleet-worker", &spec.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        // The URL goes through the environment: a password in it stays out of the process list.
        if let Some(var) = target.url_var() {
            command.env(var, target.url());
        }
        let mut process = command
            .spawn()
            .map_err(|e| format!("cannot start a worker process: {e}"))?;
        let stdout = BufReader::new(process.stdout.take().ok_or("no stdout")?);
        children.push(Child { process, stdout });
    }
    for child in &mut children {
        let mut line = String::new();
        let read =
            tokio::time::timeout(Duration::from_secs(30), child.stdout.read_line(&mut line)).await;
        if !matches!(read, Ok(Ok(n)) if n > 0 && line.trim() == "ready") {
            return Err(format!(
                "a worker process did not start (it said {:?})",
                line.trim()
            ));
        }
    }
    Ok(Fleet::Children(children))
}

/// Adds items `0..items` with `load`; returns when the first add was sent and each item's
/// acknowledgement time.
async fn produce<Q: FleetQueue>(
    queue: &Q,
    items: usize,
    load: Load,
) -> Result<(i64, Vec<i64>), Error> {
    let ids: Vec<u64> = (0..items as u64).collect();
    let mut acks = vec![0_i64; items];
    let first_add = now_ns();
    match load {
        Load::Flood => {
            for (n, chunk) in ids.chunks(ADD_BATCH).enumerate() {
                queue.add_batch(chunk).await?;
                let ack = now_ns();
                acks[n * ADD_BATCH..n * ADD_BATCH + chunk.len()].fill(ack);
            }
        }
        Load::Backlog => {
            return Err("a burn-down adds its backlog before the fleet starts".into());
        }
        Load::Paced(rate) => {
            let started = Instant::now();
            let mut added = 0;
            while added < items {
                let due = ((started.elapsed().as_secs_f64() * rate) as usize + 1).min(items);
                if due > added {
                    queue.add_batch(&ids[added..due]).await?;
                    acks[added..due].fill(now_ns());
                    added = due;
                }
                tokio::time::sleep(TICK).await;
            }
        }
    }
    Ok((first_add, acks))
}

/// Waits until the fleet has handled all `items`.
async fn drain<Q: FleetQueue>(queue: &Q, fleet: &Fleet<Q>, items: usize) -> Result<(), Error> {
    let started = Instant::now();
    loop {
        let done = match fleet {
            Fleet::Local(_, log) => log.handled() >= items,
            Fleet::Children(_) => queue.pending().await? == 0,
        };
        if done {
            return Ok(());
        }
        if started.elapsed() > DRAIN_LIMIT {
            return Err(format!(
                "the workers did not handle {items} items in {DRAIN_LIMIT:?}"
            ));
        }
        let poll = match fleet {
            Fleet::Local(..) => Duration::from_millis(1),
            Fleet::Children(_) => Duration::from_millis(5),
        };
        tokio::time::sleep(poll).await;
    }
}

/// Stops the fleet; every handler call it recorded: (item, start, end).
async fn stop_fleet<Q: FleetQueue>(fleet: Fleet<Q>) -> Result<Vec<(u64, i64, i64)>, Error> {
    match fleet {
        Fleet::Local(workers, log) => {
            workers.shut_down().await;
            Ok(log.records().collect())
        }
        Fleet::Children(children) => {
            let mut records = Vec::new();
            let mut failure = None;
            for mut child in children {
                // End of input: the worker process stops its workers and reports.
                drop(child.process.stdin.take());
                let mut line = String::new();
                loop {
                    line.clear();
                    match child.stdout.read_line(&mut line).await {
                        Ok(0) => break,
                        Ok(_) => {
                            if let Some(record) = parse_record(&line) {
                                records.push(record);
                            }
                        }
                        Err(e) => {
                            failure = Some(format!("reading a worker process: {e}"));
                            break;
                        }
                    }
                }
                match child.process.wait().await {
                    Ok(status) if status.success() => {}
                    Ok(status) => failure = Some(format!("a worker process exited with {status}")),
                    Err(e) => failure = Some(format!("a worker process: {e}")),
                }
            }
            match failure {
                Some(e) => Err(e),
                None => Ok(records),
            }
        }
    }
}

/// The phase's figures from the producer's acknowledgements and the handlers' records.
fn summarize(
    items: usize,
    first_add: i64,
    acks: &[i64],
    records: &[(u64, i64, i64)],
) -> Result<Measured, Error> {
    let mut seen = vec![false; items];
    let mut last_end = first_add;
    let mut pickup_ns = Vec::with_capacity(items);
    for &(item, start, end) in records {
        let Some(ack) = acks.get(item as usize) else {
            return Err(format!(
                "a worker handled item {item}, which was never added"
            ));
        };
        seen[item as usize] = true;
        last_end = last_end.max(end);
        pickup_ns.push((start - ack).max(0));
    }
    let missing = seen.iter().filter(|s| !**s).count();
    if missing > 0 {
        return Err(format!("{missing} of {items} items were never handled"));
    }
    pickup_ns.sort_unstable();
    let elapsed = (last_end - first_add).max(1) as f64 / 1e9;
    Ok(Measured {
        items_per_s: items as f64 / elapsed,
        pickup_ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_counts_every_item_once_and_measures_from_the_acknowledgement() {
        let acks = [100, 100, 300];
        let records = [(0, 150, 160), (1, 90, 95), (2, 400, 1_000_000_100)];
        let measured = summarize(3, 0, &acks, &records).unwrap();
        // The last end is 1 s after the first add.
        assert!((measured.items_per_s - 3.0 / 1.0000001).abs() < 1e-3);
        // An item started before its acknowledgement arrived counts as 0.
        assert_eq!(measured.pickup_ns, vec![0, 50, 100]);
        let missing = summarize(3, 0, &acks, &records[..2]).unwrap_err();
        assert!(missing.contains("1 of 3"), "{missing}");
        let stranger = summarize(3, 0, &acks, &[(7, 1, 2)]).unwrap_err();
        assert!(stranger.contains("never added"), "{stranger}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_phase_in_memory_hands_every_item_to_the_workers() {
        let shape = Shape {
            processes: 1,
            workers: 4,
            handler_ms: 0,
        };
        let measured = phase::<WorkQueue<u64>>(&Target::Memory, shape, 2_000, Load::Flood)
            .await
            .unwrap();
        assert_eq!(measured.pickup_ns.len(), 2_000);
        assert!(measured.items_per_s > 0.0);
        let paced = phase::<WorkQueue<u64>>(&Target::Memory, shape, 500, Load::Paced(10_000.0))
            .await
            .unwrap();
        assert_eq!(paced.pickup_ns.len(), 500);
        let burned = phase::<WorkQueue<u64>>(&Target::Memory, shape, 12_000, Load::Backlog)
            .await
            .unwrap();
        assert_eq!(burned.pickup_ns.len(), 12_000);
        assert!(burned.items_per_s > 0.0);
    }
}
