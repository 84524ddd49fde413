//! `wq redis ...`: the operator's commands for a queue on Redis (crate `workq-redis`).
//!
//! Every subcommand takes the server from `--url` or, better for a URL with a password (a
//! command line is visible to every user of the machine), from `$WQ_REDIS_URL`.
//!
//! - `wq redis stats QUEUE`: depth, delayed, in flight (with lease ages), tracked failures,
//!   stalls, dead letters, and whether the server's persistence settings keep the queue's
//!   promise.
//! - `wq redis shutdown QUEUE` / `wq redis pause QUEUE` / `wq redis resume QUEUE`: shuts
//!   the queue down or pauses it for every process, and back.
//! - `wq redis dead-letters {list,requeue,requeue-all,purge} QUEUE`: the dead letters.
//!
//! The demo on Redis is an option of its command (`wq demo --redis URL`); `wq redis demo`
//! remains as a deprecated, hidden alias of it that says so on stderr. The benchmarks are a
//! program of their own (`wq-bench --redis URL`, package `workq-bench`).

use std::process::ExitCode;
use std::time::Duration;

use workq::admin::End;
use workq_redis::RedisQueue;

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
    /// Shuts the queue down for every process: adds are ignored, queued items are still
    /// handed out, then every worker's get returns None. Undo with `resume`.
    Shutdown(QueueArgs),
    /// Ends a `shutdown` or a `pause`, whichever is on: adds count again, delayed items come
    /// due and gets hand items out.
    Resume(QueueArgs),
    /// Pauses the queue for every process: gets hand out nothing, adds are kept. Undo with
    /// `resume`.
    Pause(QueueArgs),
    /// Lists, requeues or purges the queue's dead letters.
    #[command(subcommand)]
    DeadLetters(DeadLettersCommand),
    /// Deprecated: `wq demo --redis URL`.
    #[command(hide = true)]
    Demo(crate::demo::distributed::DemoArgs),
}

/// The queue an operator command works on.
#[derive(Debug, clap::Args)]
struct QueueArgs {
    /// The server: `redis://[user:password@]host:port[/db]`, or rediss:// for TLS. Default
    /// $WQ_REDIS_URL; put a URL with a password there, not on the command line, where every
    /// user of the machine can read it.
    #[arg(long, env = "WQ_REDIS_URL", hide_env_values = true)]
    url: String,
    /// The queue's name.
    queue: String,
    /// The prefix of the queue's keys.
    #[arg(long, default_value = "wq")]
    prefix: String,
}

/// Options of `wq redis stats`.
#[derive(Debug, clap::Args)]
struct StatsArgs {
    #[command(flatten)]
    queue: QueueArgs,
    /// How many in-flight items, failure counts and dead letters to list.
    #[arg(long, default_value_t = 20)]
    limit: usize,
}

/// `wq redis dead-letters ...`.
#[derive(Debug, clap::Subcommand)]
enum DeadLettersCommand {
    /// Lists the dead letters, oldest first: item, reason, stalls, failures.
    List {
        #[command(flatten)]
        queue: QueueArgs,
        /// How many to list.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Moves the dead letter of one item (its stored JSON text, as `list` shows it) back to
    /// the queue.
    Requeue {
        #[command(flatten)]
        queue: QueueArgs,
        /// The item's stored text, for example "default/web-0" with its JSON quotes.
        item: String,
    },
    /// Moves every dead letter back to the queue.
    RequeueAll {
        #[command(flatten)]
        queue: QueueArgs,
    },
    /// Deletes every dead letter.
    Purge {
        #[command(flatten)]
        queue: QueueArgs,
    },
}

/// The URL given to `--redis`, or `$WQ_REDIS_URL` for `--redis` alone; `None` (after a
/// message) if neither is there.
pub(crate) fn url_or_env(given: String) -> Option<String> {
    url_from(given, "--redis", "WQ_REDIS_URL")
}

/// The URL given to option `flag`, or when none was given, the one in the environment
/// variable `var`; `None` (having said why) without either.
pub(crate) fn url_from(given: String, flag: &str, var: &str) -> Option<String> {
    if !given.is_empty() {
        return Some(given);
    }
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            eprintln!("wq: {flag} without a URL needs {var}");
            None
        }
    }
}

/// Opens the queue of an operator command (payloads of any shape: they show as stored).
async fn open(args: &QueueArgs) -> Result<RedisQueue<serde_json::Value>, workq_redis::Error> {
    RedisQueue::builder(args.queue.as_str())
        .url(args.url.as_str())
        .prefix(args.prefix.as_str())
        .response_timeout(Duration::from_secs(5))
        .retry_deadline(Duration::from_secs(10))
        .build()
        .await
}

/// Runs `wq redis`.
pub(crate) fn run(args: RedisArgs) -> ExitCode {
    match args.command {
        RedisCommand::Stats(args) => block_on("stats", async move {
            let text = stats(&args).await?;
            print!("{text}");
            Ok(ExitCode::SUCCESS)
        }),
        RedisCommand::Shutdown(args) => block_on("shutdown", async move {
            open(&args).await?.shut_down_fleet().await?;
            println!(
                "queue {} is shut down for every process (wq redis resume undoes it)",
                args.queue
            );
            Ok(ExitCode::SUCCESS)
        }),
        RedisCommand::Resume(args) => block_on("resume", async move {
            let q = open(&args).await?;
            let was_shut = q.resume_fleet().await?;
            let was_paused = q.resume().await?;
            println!("queue {} {}", args.queue, resumed(was_shut, was_paused));
            Ok(ExitCode::SUCCESS)
        }),
        RedisCommand::Pause(args) => block_on("pause", async move {
            let was_running = open(&args).await?.pause().await?;
            println!("queue {} {}", args.queue, paused(was_running, "wq redis"));
            Ok(ExitCode::SUCCESS)
        }),
        RedisCommand::DeadLetters(command) => block_on("dead-letters", dead_letters(command)),
        RedisCommand::Demo(args) => {
            eprintln!("wq redis demo is deprecated: use wq demo --redis URL");
            crate::demo::run_distributed(args)
        }
    }
}

/// What `resume` says it did.
pub(crate) fn resumed(was_shut: bool, was_paused: bool) -> &'static str {
    match (was_shut, was_paused) {
        (true, true) => "resumed (it was shut down and paused)",
        (true, false) => "resumed (it was shut down)",
        (false, true) => "resumed (it was paused)",
        (false, false) => "was neither shut down nor paused",
    }
}

/// What `pause` says it did.
pub(crate) fn paused(was_running: bool, tool: &str) -> String {
    if was_running {
        format!("is paused for every process ({tool} resume undoes it)")
    } else {
        "was paused already".to_owned()
    }
}

/// Runs `work` on a two-thread runtime; reports its error as `wq redis WHAT: ...`.
pub(crate) fn block_on(
    what: &str,
    work: impl std::future::Future<Output = Result<ExitCode, workq_redis::Error>>,
) -> ExitCode {
    block_on_as(&format!("wq redis {what}"), work)
}

/// Runs `work` on a two-thread runtime; reports its error as `COMMAND: ...`.
pub(crate) fn block_on_as<E: std::fmt::Display>(
    command: &str,
    work: impl std::future::Future<Output = Result<ExitCode, E>>,
) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("{command}: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(work) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{command}: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn dead_letters(command: DeadLettersCommand) -> Result<ExitCode, workq_redis::Error> {
    match command {
        DeadLettersCommand::List { queue, limit } => {
            let letters = open(&queue).await?.dead_letters(End::First, limit).await?;
            for letter in &letters {
                let at_ms = letter
                    .at
                    .duration_since(std::time::SystemTime::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_millis();
                println!(
                    "{}  {}  (stalls {}, failures {}, at {at_ms} ms)",
                    letter.item, letter.error, letter.stalls, letter.failures
                );
            }
            eprintln!("{} dead letters listed", letters.len());
        }
        DeadLettersCommand::Requeue { queue, item } => {
            let q = open(&queue).await?;
            let letters = q.dead_letters(End::First, usize::MAX / 2).await?;
            let Some(letter) = letters.iter().find(|l| l.item == item) else {
                eprintln!("wq redis dead-letters: no dead letter for {item}");
                return Ok(ExitCode::FAILURE);
            };
            let moved = q.requeue_dead_letter(letter).await?;
            println!("{}", if moved { "requeued" } else { "already gone" });
        }
        DeadLettersCommand::RequeueAll { queue } => {
            let n = open(&queue).await?.requeue_dead_letters().await?;
            println!("{n} dead letters requeued");
        }
        DeadLettersCommand::Purge { queue } => {
            let n = open(&queue).await?.purge_dead_letters().await?;
            println!("{n} dead letters purged");
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn stats(args: &StatsArgs) -> Result<String, workq_redis::Error> {
    let queue = open(&args.queue).await?;
    let stats = queue.stats(args.limit).await?;
    let dead = queue.dead_letters(End::First, args.limit).await?;
    let figures = &stats.summary;
    let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    let view = View {
        depth: size(figures.depth),
        delayed: size(figures.delayed),
        next_delayed_in: stats.next_delayed_in,
        in_flight: size(figures.in_flight),
        in_flight_dirty: size(figures.in_flight_dirty),
        leases: stats
            .leases
            .iter()
            .map(|l| {
                (
                    l.item.clone(),
                    l.lease.age,
                    l.lease.expires_in,
                    l.lease.token,
                )
            })
            .collect(),
        failing: size(figures.failing),
        failures: stats
            .failures
            .iter()
            .map(|(item, n)| (item.clone(), u64::from(*n)))
            .collect(),
        stalled: size(figures.stalled),
        dead: size(figures.dead),
        dead_dropped: figures.dead_dropped,
        shut_down: figures.shut_down,
        paused: figures.paused,
        resume: "wq redis resume",
    };
    let mut out = view.render(&args.queue.queue);
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

/// A queue's figures as `wq redis stats` and `wq postgres stats` print them, whichever
/// server holds the queue.
pub(crate) struct View {
    pub(crate) depth: usize,
    pub(crate) delayed: usize,
    pub(crate) next_delayed_in: Option<Duration>,
    pub(crate) in_flight: usize,
    pub(crate) in_flight_dirty: usize,
    /// Item, age, time until the lease expires, token.
    pub(crate) leases: Vec<(String, Duration, Duration, u64)>,
    pub(crate) failing: usize,
    pub(crate) failures: Vec<(String, u64)>,
    pub(crate) stalled: usize,
    pub(crate) dead: usize,
    pub(crate) dead_dropped: u64,
    pub(crate) shut_down: bool,
    pub(crate) paused: bool,
    /// The command that ends a shut down or a pause.
    pub(crate) resume: &'static str,
}

impl View {
    /// The figures as aligned text.
    pub(crate) fn render(&self, name: &str) -> String {
        let mut out = format!("queue          {name}\n");
        out.push_str(&format!("depth          {}\n", self.depth));
        out.push_str(&format!(
            "delayed        {}{}\n",
            self.delayed,
            self.next_delayed_in
                .map(|d| format!(" (next due in {})", secs(d)))
                .unwrap_or_default()
        ));
        out.push_str(&format!(
            "in flight      {} ({} re-added while processing)\n",
            self.in_flight, self.in_flight_dirty
        ));
        for (item, age, expires_in, token) in &self.leases {
            out.push_str(&format!(
                "    {item}  age {}  lease expires in {}  token {token}\n",
                secs(*age),
                secs(*expires_in),
            ));
        }
        if self.leases.len() < self.in_flight {
            out.push_str(&format!(
                "    ... {} more\n",
                self.in_flight - self.leases.len()
            ));
        }
        out.push_str(&format!("failures       {} items tracked\n", self.failing));
        for (item, count) in &self.failures {
            out.push_str(&format!("    {item}  {count} requeues\n"));
        }
        out.push_str(&format!(
            "stalled        {} items (leases reclaimed)\n",
            self.stalled
        ));
        out.push_str(&format!(
            "dead letters   {} ({} dropped by the cap)\n",
            self.dead, self.dead_dropped
        ));
        let flag = |on: bool| {
            if on {
                format!("yes, for every process ({} QUEUE)", self.resume)
            } else {
                "no".to_owned()
            }
        };
        out.push_str(&format!("shut down      {}\n", flag(self.shut_down)));
        out.push_str(&format!("paused         {}\n", flag(self.paused)));
        out
    }
}
