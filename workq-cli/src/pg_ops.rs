//! `wq postgres ...`: the operator's commands for a queue on PostgreSQL (crate
//! `workq-postgres`), the same as `wq redis ...`.
//!
//! Every subcommand takes the database from `--url` or, better for a URL with a password (a
//! command line is visible to every user of the machine), from `$WQ_POSTGRES_URL`. None of
//! them installs the schema or creates a queue: a mistyped name is an error.
//!
//! - `wq postgres queues`: every queue in the database, with its depth.
//! - `wq postgres stats QUEUE`: depth, delayed, in flight (with lease ages), tracked failures,
//!   stalls, dead letters, shut down and paused.
//! - `wq postgres shutdown QUEUE` / `pause QUEUE` / `resume QUEUE`: shuts the queue down or
//!   pauses it for every process, and back.
//! - `wq postgres dead-letters {list,requeue,requeue-all,purge} QUEUE`: the dead letters.

use std::process::ExitCode;
use std::time::Duration;

use workq::admin::End;
use workq_postgres::PgQueue;

use crate::ops::{View, block_on_as, paused, resumed};

/// Options of `wq postgres`.
#[derive(Debug, clap::Args)]
pub(crate) struct PostgresArgs {
    #[command(subcommand)]
    command: PostgresCommand,
}

#[derive(Debug, clap::Subcommand)]
enum PostgresCommand {
    /// Lists every queue in the database: name, depth, delayed, in flight, dead letters.
    Queues(UrlArgs),
    /// Shows a queue: depth, delayed, in flight with lease ages, tracked failures.
    Stats(StatsArgs),
    /// Shuts the queue down for every process: adds are ignored, queued items are still
    /// handed out, then every worker's get returns None. Undo with `resume`.
    Shutdown(QueueArgs),
    /// Pauses the queue for every process: gets hand out nothing, adds are kept. Undo with
    /// `resume`.
    Pause(QueueArgs),
    /// Ends a `shutdown` or a `pause`, whichever is on.
    Resume(QueueArgs),
    /// Lists, requeues or purges the queue's dead letters.
    #[command(subcommand)]
    DeadLetters(DeadLettersCommand),
}

/// The database.
#[derive(Debug, clap::Args)]
struct UrlArgs {
    /// The database: `postgres://user[:password]@host:port/database` (`?sslmode=require` for
    /// TLS). Default $WQ_POSTGRES_URL; put a URL with a password there, not on the command
    /// line, where every user of the machine can read it.
    #[arg(long, env = "WQ_POSTGRES_URL", hide_env_values = true)]
    url: String,
}

/// The queue an operator command works on.
#[derive(Debug, clap::Args)]
struct QueueArgs {
    #[command(flatten)]
    url: UrlArgs,
    /// The queue's name.
    queue: String,
}

/// Options of `wq postgres stats`.
#[derive(Debug, clap::Args)]
struct StatsArgs {
    #[command(flatten)]
    queue: QueueArgs,
    /// How many in-flight items, failure counts and dead letters to list.
    #[arg(long, default_value_t = 20)]
    limit: usize,
}

/// `wq postgres dead-letters ...`.
#[derive(Debug, clap::Subcommand)]
enum DeadLettersCommand {
    /// Lists the dead letters, newest first: id, item, reason, stalls, failures.
    List {
        #[command(flatten)]
        queue: QueueArgs,
        /// How many to list.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Moves one dead letter (by its id, as `list` shows it) back to the queue.
    Requeue {
        #[command(flatten)]
        queue: QueueArgs,
        /// The letter's id.
        id: i64,
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

/// Opens the queue of an operator command: items of any shape (they show as stored), no
/// schema installed, no queue created, no `LISTEN` connection.
async fn open(args: &QueueArgs) -> Result<PgQueue<serde_json::Value>, workq_postgres::Error> {
    PgQueue::builder(args.queue.as_str())
        .url(args.url.url.as_str())
        .max_connections(2)
        .migrate(false)
        .create(false)
        .listen(false)
        .retry_deadline(Duration::from_secs(10))
        .build()
        .await
}

/// Runs `work`; reports its error as `wq postgres WHAT: ...`.
fn block_on(
    what: &str,
    work: impl std::future::Future<Output = Result<ExitCode, workq_postgres::Error>>,
) -> ExitCode {
    block_on_as(&format!("wq postgres {what}"), work)
}

/// Runs `wq postgres`.
pub(crate) fn run(args: PostgresArgs) -> ExitCode {
    match args.command {
        PostgresCommand::Queues(args) => block_on("queues", async move {
            let admin = workq_postgres::PgAdmin::new(&args.url)?.application_name("wq");
            let queues = admin.queues().await?;
            println!(
                "{:<40} {:>10} {:>10} {:>10} {:>10}",
                "queue", "depth", "delayed", "in flight", "dead"
            );
            for q in &queues {
                let count = |n: u64| {
                    if q.is_capped(n) {
                        format!("{}+", q.capped_at.unwrap_or_default())
                    } else {
                        n.to_string()
                    }
                };
                println!(
                    "{:<40} {:>10} {:>10} {:>10} {:>10}{}",
                    q.name,
                    count(q.depth),
                    count(q.delayed),
                    count(q.in_flight),
                    count(q.dead),
                    match (q.shut_down, q.paused) {
                        (true, _) => "  shut down",
                        (false, true) => "  paused",
                        _ => "",
                    }
                );
            }
            eprintln!("{} queues", queues.len());
            Ok(ExitCode::SUCCESS)
        }),
        PostgresCommand::Stats(args) => block_on("stats", async move {
            print!("{}", stats(&args).await?);
            Ok(ExitCode::SUCCESS)
        }),
        PostgresCommand::Shutdown(args) => block_on("shutdown", async move {
            open(&args).await?.shut_down_fleet().await?;
            println!(
                "queue {} is shut down for every process (wq postgres resume undoes it)",
                args.queue
            );
            Ok(ExitCode::SUCCESS)
        }),
        PostgresCommand::Pause(args) => block_on("pause", async move {
            let was_running = open(&args).await?.pause().await?;
            println!(
                "queue {} {}",
                args.queue,
                paused(was_running, "wq postgres")
            );
            Ok(ExitCode::SUCCESS)
        }),
        PostgresCommand::Resume(args) => block_on("resume", async move {
            let q = open(&args).await?;
            let was_shut = q.resume_fleet().await?;
            let was_paused = q.resume().await?;
            println!("queue {} {}", args.queue, resumed(was_shut, was_paused));
            Ok(ExitCode::SUCCESS)
        }),
        PostgresCommand::DeadLetters(command) => block_on("dead-letters", dead_letters(command)),
    }
}

async fn dead_letters(command: DeadLettersCommand) -> Result<ExitCode, workq_postgres::Error> {
    match command {
        DeadLettersCommand::List { queue, limit } => {
            let letters = open(&queue).await?.dead_letters(End::Last, limit).await?;
            for l in &letters {
                let at_ms =
                    l.at.duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |at| at.as_millis());
                println!(
                    "{}  {}  {}  (stalls {}, failures {}, at {at_ms} ms)",
                    l.id, l.item, l.error, l.stalls, l.failures
                );
            }
            eprintln!("{} dead letters listed", letters.len());
        }
        DeadLettersCommand::Requeue { queue, id } => {
            let moved = open(&queue)
                .await?
                .requeue_dead_letter_by_id(&id.to_string())
                .await?;
            if !moved {
                eprintln!(
                    "wq postgres dead-letters: no dead letter {id} in {}",
                    queue.queue
                );
                return Ok(ExitCode::FAILURE);
            }
            println!("requeued");
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

async fn stats(args: &StatsArgs) -> Result<String, workq_postgres::Error> {
    let queue = open(&args.queue).await?;
    let stats = queue.stats(args.limit).await?;
    let dead = queue.dead_letters(End::Last, args.limit).await?;
    let s = &stats.summary;
    let n = |count: u64| usize::try_from(count).unwrap_or(usize::MAX);
    let view = View {
        depth: n(s.depth),
        delayed: n(s.delayed),
        next_delayed_in: stats.next_delayed_in,
        in_flight: n(s.in_flight),
        in_flight_dirty: n(s.in_flight_dirty),
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
        failing: n(s.failing),
        failures: stats
            .failures
            .iter()
            .map(|(item, count)| (item.clone(), u64::from(*count)))
            .collect(),
        stalled: n(s.stalled),
        dead: n(s.dead),
        dead_dropped: s.dead_dropped,
        shut_down: s.shut_down,
        paused: s.paused,
        resume: "wq postgres resume",
    };
    let mut out = view.render(&args.queue.queue);
    if !dead.is_empty() {
        out.push_str("  dead letters (newest first):\n");
        for letter in &dead {
            out.push_str(&format!(
                "    {}  {}  {}\n",
                letter.id, letter.item, letter.error
            ));
        }
    }
    Ok(out)
}
