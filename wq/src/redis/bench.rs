//! `wq redis bench URL`: BENCH.md's W1, W3 and W4 on a queue on Redis, beside BullMQ (npm
//! package `bullmq`) doing the same adds and completions on the same server in the same run.
//!
//! Both sides batch adds by 100 (`add_all` / `addBulk`, one round trip per batch) and complete
//! items one at a time; workqueue-redis completes and takes the next item in one round trip
//! (`done_and_get`), as a BullMQ worker does (`moveToFinished` fetches the next job).
//! workqueue-redis does more per item: fenced leases on the server clock, renewed while held,
//! exact client-go dedup (a re-add while processing is delivered once more after `done`).
//!
//! BullMQ runs in `node` from a private directory of this user (`$WQ_BULLMQ_DIR`, default
//! `~/.cache/wq/bullmq-VERSION`, mode 0700, owner checked) where npm installs exactly what
//! the manifest and lockfile in `wq/benchmarks/bullmq/` pin (both compiled into `wq`); without
//! `node`/`npm` its column stays empty and says why.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use workqueue_redis::{Error, Lease, RedisQueue};

/// The BullMQ side, run by `node`.
const BULLMQ_SCRIPT: &str = include_str!("../../benchmarks/bullmq/bench.mjs");
/// The BullMQ release measured (pinned by the manifest below).
const BULLMQ_VERSION: &str = "6.7.0";
/// The manifest of the BullMQ directory: one exact version of `bullmq`.
const BULLMQ_MANIFEST: &str = include_str!("../../benchmarks/bullmq/package.json");
/// The lockfile committed beside it: every transitive package at an exact version with its
/// integrity hash.
const BULLMQ_LOCKFILE: &str = include_str!("../../benchmarks/bullmq/package-lock.json");

/// Options of `wq redis bench`.
#[derive(Debug, clap::Args)]
pub(crate) struct BenchArgs {
    /// The server: `redis://[user:password@]host:port[/db]`, or rediss:// for TLS. Default
    /// $WQ_REDIS_URL; put a URL with a password there, not on the command line, where every
    /// user of the machine can read it.
    #[arg(long, env = "WQ_REDIS_URL", hide_env_values = true)]
    pub(crate) url: String,
    /// Smaller workloads (a few seconds each).
    #[arg(long)]
    pub(crate) quick: bool,
    /// Workloads to run, comma separated (W1, W3, W4); all by default.
    #[arg(short = 'w', long = "workloads", value_delimiter = ',')]
    pub(crate) workloads: Vec<String>,
    /// Skips BullMQ.
    #[arg(long)]
    pub(crate) no_bullmq: bool,
    /// Prints one JSON object per line and figure instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// One figure of one implementation.
#[derive(Debug, Clone)]
struct Figure {
    workload: &'static str,
    implementation: &'static str,
    metric: String,
    value: f64,
}

type Figures = Vec<(&'static str, f64)>;

/// The sizes of a run: W1 items, W3 adds, W4 items.
fn sizes(quick: bool) -> (usize, usize, usize) {
    if quick {
        (3_000, 20_000, 3_000)
    } else {
        (20_000, 80_000, 10_000)
    }
}

async fn open(url: &str, workload: &str) -> Result<RedisQueue<u64>, Error> {
    let queue = RedisQueue::builder(format!("wq-bench-{workload}-{}", std::process::id()))
        .url(url)
        .lease_duration(Duration::from_secs(30))
        .check_persistence(false)
        .build()
        .await?;
    queue.delete().await?;
    Ok(queue)
}

/// Processes items until the queue is shut down, completing each and taking the next in one
/// round trip; calls `seen` for every item.
async fn consume(
    queue: RedisQueue<u64>,
    mut seen: impl FnMut(&Lease<u64>) + Send,
) -> Result<usize, Error> {
    let mut count = 0;
    let mut current = queue.get().await?;
    while let Some(lease) = current {
        seen(&lease);
        count += 1;
        let (done, next) = queue.done_and_get(lease).await?;
        done?;
        current = match next {
            Some(next) => Some(next),
            None => queue.get().await?,
        };
    }
    Ok(count)
}

/// W1: 1 producer adds `n` distinct keys; 1 consumer gets and completes them.
async fn w1(url: &str, n: usize) -> Result<Figures, Error> {
    let queue = open(url, "w1").await?;
    let started = Instant::now();
    let producer = {
        let queue = queue.clone();
        tokio::spawn(async move {
            let keys: Vec<u64> = (0..n as u64).collect();
            for chunk in keys.chunks(100) {
                queue.add_all(chunk).await?;
            }
            Ok::<_, Error>(())
        })
    };
    let seen = Arc::new(AtomicUsize::new(0));
    let consumer = {
        let (queue, seen) = (queue.clone(), seen.clone());
        tokio::spawn(consume(queue, move |_| {
            seen.fetch_add(1, Ordering::Relaxed);
        }))
    };
    producer.await.expect("producer")?;
    while seen.load(Ordering::Relaxed) < n {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = started.elapsed();
    queue.shut_down().await?;
    consumer.await.expect("consumer")?;
    queue.delete().await?;
    Ok(vec![("items_per_s", n as f64 / elapsed.as_secs_f64())])
}

/// W3: 4 producers add the same 1,000 keys over and over (`adds` in all); 2 consumers.
async fn w3(url: &str, adds: usize) -> Result<Figures, Error> {
    let queue = open(url, "w3").await?;
    let started = Instant::now();
    let per_producer = adds / 4;
    let producers: Vec<_> = (0..4_u64)
        .map(|p| {
            let queue = queue.clone();
            tokio::spawn(async move {
                let keys: Vec<u64> = (0..per_producer as u64)
                    .map(|k| (k * 7 + p * 13) % 1000)
                    .collect();
                for chunk in keys.chunks(100) {
                    queue.add_all(chunk).await?;
                }
                Ok::<_, Error>(())
            })
        })
        .collect();
    let consumers: Vec<_> = (0..2)
        .map(|_| tokio::spawn(consume(queue.clone(), |_| {})))
        .collect();
    for producer in producers {
        producer.await.expect("producer")?;
    }
    let adds_per_s = (per_producer * 4) as f64 / started.elapsed().as_secs_f64();
    while queue.len().await? > 0 || queue.processing_len().await? > 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let wall = started.elapsed();
    queue.shut_down().await?;
    let mut deliveries = 0;
    for consumer in consumers {
        deliveries += consumer.await.expect("consumer")?;
    }
    queue.delete().await?;
    Ok(vec![
        ("adds_per_s", adds_per_s),
        ("deliveries", deliveries as f64),
        ("wall_s", wall.as_secs_f64()),
    ])
}

/// W4: 1 producer adds `n` distinct keys with a random delay in [0, 2 s]; 2 consumers record
/// lateness (time of get minus intended ready time).
async fn w4(url: &str, n: usize) -> Result<Figures, Error> {
    let queue = open(url, "w4").await?;
    let due: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let lateness: Arc<Mutex<Vec<f64>>> = Arc::default();
    let consumers: Vec<_> = (0..2)
        .map(|_| {
            let (due, lateness) = (due.clone(), lateness.clone());
            tokio::spawn(consume(queue.clone(), move |lease| {
                let now = Instant::now();
                let at = due.lock().unwrap().get(lease.item()).copied();
                if let Some(at) = at {
                    let late = now.saturating_duration_since(at).as_secs_f64() * 1000.0;
                    lateness.lock().unwrap().push(late);
                }
            }))
        })
        .collect();
    let started = Instant::now();
    let mut seed: u64 = 42;
    for chunk_start in (0..n as u64).step_by(100) {
        let now = Instant::now();
        let batch: Vec<(u64, Duration)> = {
            let mut due_now = due.lock().unwrap();
            (chunk_start..(chunk_start + 100).min(n as u64))
                .map(|key| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let delay = Duration::from_millis((seed >> 33) % 2000);
                    due_now.insert(key, now + delay);
                    (key, delay)
                })
                .collect()
        };
        queue.add_all_after(batch).await?;
    }
    let adds_per_s = n as f64 / started.elapsed().as_secs_f64();
    while lateness.lock().unwrap().len() < n {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let wall = started.elapsed();
    queue.shut_down().await?;
    for consumer in consumers {
        consumer.await.expect("consumer")?;
    }
    queue.delete().await?;
    let mut late = std::mem::take(&mut *lateness.lock().unwrap());
    late.sort_by(f64::total_cmp);
    let pct = |p: f64| late[((p / 100.0) * late.len() as f64) as usize % late.len()];
    Ok(vec![
        ("add_after_per_s", adds_per_s),
        ("lateness_p50_ms", pct(50.0)),
        ("lateness_p99_ms", pct(99.0)),
        ("lateness_max_ms", *late.last().unwrap_or(&0.0)),
        ("wall_s", wall.as_secs_f64()),
    ])
}

/// The directory BullMQ is installed in: `$WQ_BULLMQ_DIR`, or a directory of this user's
/// cache (`$XDG_CACHE_HOME` or `~/.cache`), never a shared temporary directory where another
/// user could plant code that `node` would run.
fn bullmq_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("WQ_BULLMQ_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .ok_or("neither XDG_CACHE_HOME nor HOME is set; set WQ_BULLMQ_DIR")?;
    Ok(cache.join("wq").join(format!("bullmq-{BULLMQ_VERSION}")))
}

/// Creates `dir` (mode 0700) if needed and checks that it is this user's and private: code
/// installed there is run.
#[cfg(unix)]
fn private_dir(dir: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let meta = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // This process's user: the owner of its /proc entry (Linux), else of a file it creates.
    let me = match std::fs::metadata("/proc/self") {
        Ok(own) => own.uid(),
        Err(_) => {
            let probe = dir.join(".owner-probe");
            std::fs::write(&probe, b"").map_err(|e| format!("{}: {e}", probe.display()))?;
            let uid = std::fs::metadata(&probe).map(|m| m.uid());
            let _ = std::fs::remove_file(&probe);
            uid.map_err(|e| e.to_string())?
        }
    };
    if !meta.is_dir() || meta.uid() != me {
        return Err(format!(
            "{} is not a directory of this user; refusing to run code from it",
            dir.display()
        ));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "{} is open to other users (mode {:o}); make it 0700 or remove it",
            dir.display(),
            meta.permissions().mode() & 0o777
        ));
    }
    Ok(())
}

#[cfg(not(unix))]
fn private_dir(dir: &std::path::Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))
}

/// Installs BullMQ in its private directory if needed; returns the script's path.
fn bullmq_ready() -> Result<PathBuf, String> {
    let dir = bullmq_dir()?;
    private_dir(&dir)?;
    let node = Command::new("node").arg("--version").output();
    if !node.is_ok_and(|o| o.status.success()) {
        return Err("node is not installed".into());
    }
    // The committed manifest and lockfile decide what is installed: when either differs from
    // what the directory holds, the directory is reinstalled from them.
    let manifest = dir.join("package.json");
    let lockfile = dir.join("package-lock.json");
    let current = std::fs::read_to_string(&manifest).ok().as_deref() == Some(BULLMQ_MANIFEST)
        && std::fs::read_to_string(&lockfile).ok().as_deref() == Some(BULLMQ_LOCKFILE);
    if !current {
        std::fs::write(&manifest, BULLMQ_MANIFEST).map_err(|e| e.to_string())?;
        std::fs::write(&lockfile, BULLMQ_LOCKFILE).map_err(|e| e.to_string())?;
        let _ = std::fs::remove_dir_all(dir.join("node_modules"));
    }
    if !dir.join("node_modules/bullmq").exists() || !dir.join("node_modules/ioredis").exists() {
        eprintln!("installing bullmq@{BULLMQ_VERSION} into {}", dir.display());
        // `npm install --no-save` follows the lockfile's versions and integrity hashes and
        // writes nothing back. (`npm ci` would be the usual choice, but it refuses a lockfile
        // that lists only the native builds of msgpackr-extract for the platforms the
        // registry served when it was written.)
        let status = Command::new("npm")
            .args([
                "install",
                "--no-save",
                "--no-audit",
                "--no-fund",
                "--silent",
            ])
            .arg("--ignore-scripts")
            .current_dir(&dir)
            .stdout(Stdio::null())
            .status()
            .map_err(|e| format!("npm: {e}"))?;
        if !status.success() {
            return Err("npm install of bullmq from its lockfile failed".into());
        }
    }
    let script = dir.join("bench.mjs");
    std::fs::write(&script, BULLMQ_SCRIPT).map_err(|e| e.to_string())?;
    Ok(script)
}

fn bullmq(
    script: &PathBuf,
    url: &str,
    workload: &'static str,
    size: usize,
) -> Result<Vec<Figure>, String> {
    // The URL goes through the environment: a password in it stays out of the process list.
    let output = Command::new("node")
        .arg(script)
        .env("WQ_REDIS_URL", url)
        .arg(workload)
        .arg(size.to_string())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| e.to_string())?;
    if !output.status.success() {
        return Err(format!("node exited with {}", output.status));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .map(|v| Figure {
            workload,
            implementation: "bullmq",
            metric: v["metric"].as_str().unwrap_or("?").to_owned(),
            value: v["value"].as_f64().unwrap_or(f64::NAN),
        })
        .collect())
}

/// Runs `wq redis bench`.
pub(crate) async fn run(args: BenchArgs) -> Result<String, Error> {
    let (n1, n3, n4) = sizes(args.quick);
    let selected = |w: &str| {
        args.workloads.is_empty() || args.workloads.iter().any(|x| x.eq_ignore_ascii_case(w))
    };
    let probe: RedisQueue<u64> = RedisQueue::builder("wq-bench-probe")
        .url(args.url.as_str())
        .build()
        .await?;
    let server = probe
        .persistence()
        .map(ToString::to_string)
        .unwrap_or_default();
    let script = if args.no_bullmq {
        Err("skipped (--no-bullmq)".to_string())
    } else {
        bullmq_ready()
    };
    let mut figures = Vec::new();
    let mut notes = Vec::new();
    let workloads: [(&'static str, usize); 3] = [("W1", n1), ("W3", n3), ("W4", n4)];
    for (workload, size) in workloads {
        if !selected(workload) {
            continue;
        }
        eprintln!("{workload}: workqueue-redis ({size})");
        let ours = match workload {
            "W1" => w1(&args.url, size).await?,
            "W3" => w3(&args.url, size).await?,
            _ => w4(&args.url, size).await?,
        };
        figures.extend(ours.into_iter().map(|(metric, value)| Figure {
            workload,
            implementation: "workqueue-redis",
            metric: metric.to_owned(),
            value,
        }));
        match &script {
            Ok(script) => {
                eprintln!("{workload}: bullmq ({size})");
                match bullmq(script, &args.url, workload, size) {
                    Ok(theirs) => figures.extend(theirs),
                    Err(e) => notes.push(format!("{workload} bullmq: {e}")),
                }
            }
            Err(e) => notes.push(format!("bullmq not measured: {e}")),
        }
    }
    notes.dedup();
    if args.json {
        let mut out = String::new();
        for f in &figures {
            out.push_str(&format!(
                "{{\"workload\": \"{}\", \"impl\": \"{}\", \"metric\": \"{}\", \"value\": {}}}\n",
                f.workload, f.implementation, f.metric, f.value
            ));
        }
        return Ok(out);
    }
    Ok(table(&figures, &server, &notes))
}

fn table(figures: &[Figure], server: &str, notes: &[String]) -> String {
    let mut out = format!("server: {server}\n\n");
    out.push_str(&format!(
        "{:<4} {:<18} {:>16} {:>12} {:>8}\n",
        "", "metric", "workqueue-redis", "bullmq", "ratio"
    ));
    let mut rows: Vec<(&str, &str)> = Vec::new();
    for f in figures {
        if !rows.contains(&(f.workload, f.metric.as_str())) {
            rows.push((f.workload, f.metric.as_str()));
        }
    }
    let find = |w: &str, m: &str, i: &str| {
        figures
            .iter()
            .find(|f| f.workload == w && f.metric == m && f.implementation == i)
            .map(|f| f.value)
    };
    for (workload, metric) in rows {
        let ours = find(workload, metric, "workqueue-redis");
        let theirs = find(workload, metric, "bullmq");
        let show = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
        let ratio = match (ours, theirs) {
            (Some(a), Some(b)) if b != 0.0 && metric.ends_with("_per_s") => {
                format!("{:.2}x", a / b)
            }
            _ => String::new(),
        };
        out.push_str(&format!(
            "{workload:<4} {metric:<18} {:>16} {:>12} {ratio:>8}\n",
            show(ours),
            show(theirs)
        ));
    }
    for note in notes {
        out.push_str(&format!("note: {note}\n"));
    }
    out
}
