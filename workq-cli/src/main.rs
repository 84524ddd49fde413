//! `wq`: the workq command line.
//!
//! - `wq demo`: a simulated controller on the in-memory queue, or with `--redis URL` or
//!   `--postgres URL` on a queue on Redis or PostgreSQL shared by processes (`demo/`).
//! - `wq queue list|stats|items|item|pause|resume|shutdown|retry|remove|forget|dead-letters|
//!   schedules|reindex`:
//!   the operator's commands for the queues on Redis or PostgreSQL, the URL's scheme picking
//!   the backend (`queue/`); `wq redis ...` and `wq postgres ...` are the same commands.
//! - `wq dashboard`: a web page, JSON API and metrics for the queues on Redis (a server or a
//!   cluster) and PostgreSQL, side by side, with an audit trail on stderr.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod dashboard;
mod demo;
mod metrics_server;
mod queue;
mod runtime;

/// The workq command line.
#[derive(Debug, Parser)]
#[command(
    name = "wq",
    version,
    about,
    after_help = "The benchmarks are a program of their own, wq-bench (package workq-bench): \
                  cargo run --release -p workq-bench -- --help"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Simulates a controller: producers emit change events, workers reconcile them.
    Demo(demo::DemoArgs),
    /// Operates the queues on Redis or PostgreSQL (the URL's scheme says which): list,
    /// stats, items, pause and resume, fleet shutdown, item actions, dead letters, schedules.
    Queue(queue::QueueArgs),
    /// `wq queue` for Redis (the URL from $WQ_REDIS_URL first).
    Redis(queue::QueueArgs),
    /// `wq queue` for PostgreSQL (the URL from $WQ_POSTGRES_URL first).
    Postgres(queue::QueueArgs),
    /// Serves a web dashboard of the queues on Redis and PostgreSQL:
    /// `wq dashboard --redis URL --postgres URL` (either or both).
    Dashboard(dashboard::DashboardArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Queue(args) => queue::run(args, queue::Alias::Queue),
        Command::Redis(args) => queue::run(args, queue::Alias::Redis),
        Command::Postgres(args) => queue::run(args, queue::Alias::Postgres),
        Command::Dashboard(args) => dashboard::run(args),
    }
}
