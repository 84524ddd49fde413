//! `wq redis ...`: operating a queue on Redis (crate `workqueue-redis`).
//!
//! - `wq redis stats URL QUEUE`: depth, delayed, in flight (with lease ages), tracked failures,
//!   stalls, dead letters, and whether the server's persistence settings keep the queue's
//!   promise.
//! - `wq redis demo URL [--workers-only]`: the demo's controller on Redis, shared by processes.
//! - `wq redis bench URL`: W1, W3 and W4 on Redis beside BullMQ on the same server.

pub(crate) mod bench;
pub(crate) mod demo;

use std::process::ExitCode;
use std::time::Duration;

use workqueue_redis::{RedisQueue, Stats};

/// Options of `wq redis`.
#[derive(Debug, clap::Args)]
pub(crate) struct RedisArgs {
    #[command(subcommand)]
    command: RedisCommand,
}

#[derive(Debug, clap::Subcommand)]
enum RedisCommand {
    /// Shows a queue: depth, delayed, in flight with lease ages, tracked failures.
    Stats(StatsArgs),
    /// Runs W1, W3 and W4 on Redis beside BullMQ doing the same on the same server.
    Bench(bench::BenchArgs),
    /// Runs the demo's producers and workers on Redis; --workers-only joins another run.
    Demo(demo::DemoArgs),
}

/// Options of `wq redis stats`.
#[derive(Debug, clap::Args)]
struct StatsArgs {
    /// The server: redis://host:port/db (user:password@ before the host if needed), or rediss:// for TLS.
    url: String,
    /// The queue's name.
    queue: String,
    /// The prefix of the queue's keys.
    #[arg(long, default_value = "wq")]
    prefix: String,
    /// How many in-flight items, failure counts and dead letters to list.
    #[arg(long, default_value_t = 20)]
    limit: usize,
}

/// Runs `wq redis`.
pub(crate) fn run(args: RedisArgs) -> ExitCode {
    match args.command {
        RedisCommand::Stats(args) => block_on("stats", async move {
            let text = stats(&args).await?;
            print!("{text}");
            Ok(ExitCode::SUCCESS)
        }),
        RedisCommand::Demo(args) => run_demo(args),
        RedisCommand::Bench(args) => run_bench(args),
    }
}

/// Runs the demo on Redis: `wq redis demo`, and the entry point for `wq demo --redis URL`.
pub(crate) fn run_demo(args: demo::DemoArgs) -> ExitCode {
    block_on("demo", demo::run(args))
}

/// Runs W1, W3 and W4 on Redis beside BullMQ: `wq redis bench`, and the entry point for
/// `wq bench --redis URL`.
pub(crate) fn run_bench(args: bench::BenchArgs) -> ExitCode {
    block_on("bench", async move {
        let text = bench::run(args).await?;
        print!("{text}");
        Ok(ExitCode::SUCCESS)
    })
}

/// Runs `work` on a two-thread runtime; reports its error as `wq redis WHAT: ...`.
fn block_on(
    what: &str,
    work: impl std::future::Future<Output = Result<ExitCode, workqueue_redis::Error>>,
) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("wq redis {what}: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(work) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("wq redis {what}: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn stats(args: &StatsArgs) -> Result<String, workqueue_redis::Error> {
    // Payloads of any shape: the stats show the stored JSON text.
    let queue: RedisQueue<serde_json::Value> = RedisQueue::builder(args.queue.as_str())
        .url(args.url.as_str())
        .prefix(args.prefix.as_str())
        .response_timeout(Duration::from_secs(5))
        .build()
        .await?;
    let stats = queue.stats(args.limit).await?;
    let dead = queue.dead_letters(args.limit).await?;
    let mut out = render(&args.queue, &stats);
    if !dead.is_empty() {
        out.push_str("  dead letters (oldest first):\n");
        for letter in &dead {
            out.push_str(&format!("    {}  {}\n", letter.item, letter.error));
        }
    }
    if let Some(persistence) = queue.persistence() {
        out.push_str(&format!("server         {persistence}\n"));
        for problem in persistence.problems() {
            out.push_str(&format!("warning        {problem}\n"));
        }
    }
    Ok(out)
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// The stats as aligned text.
fn render(name: &str, stats: &Stats) -> String {
    let mut out = format!("queue          {name}\n");
    out.push_str(&format!("depth          {}\n", stats.depth));
    out.push_str(&format!(
        "delayed        {}{}\n",
        stats.delayed,
        stats
            .next_delayed_in
            .map(|d| format!(" (next due in {})", secs(d)))
            .unwrap_or_default()
    ));
    out.push_str(&format!(
        "in flight      {} ({} re-added while processing)\n",
        stats.in_flight, stats.in_flight_dirty
    ));
    for lease in &stats.leases {
        out.push_str(&format!(
            "    {}  age {}  lease expires in {}  token {}\n",
            lease.item,
            secs(lease.age),
            secs(lease.expires_in),
            lease.token
        ));
    }
    if stats.leases.len() < stats.in_flight {
        out.push_str(&format!(
            "    ... {} more\n",
            stats.in_flight - stats.leases.len()
        ));
    }
    out.push_str(&format!("failures       {} items tracked\n", stats.failing));
    for (item, count) in &stats.failures {
        out.push_str(&format!("    {item}  {count} requeues\n"));
    }
    out.push_str(&format!(
        "stalled        {} items (leases reclaimed)\n",
        stats.stalled
    ));
    out.push_str(&format!("dead letters   {}\n", stats.dead));
    out.push_str(&format!(
        "shut down      {}\n",
        if stats.shut_down { "yes" } else { "no" }
    ));
    out
}
