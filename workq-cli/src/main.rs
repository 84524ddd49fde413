//! `wq`: the workqueue command line.
//!
//! - `wq demo`: a simulated controller on the in-memory queue, or with `--redis URL` or
//!   `--postgres URL` on a queue on Redis or PostgreSQL shared by processes (`demo/`).
//! - `wq redis stats|shutdown|pause|resume|dead-letters`: a queue on Redis, for operators
//!   (`ops.rs`); `wq postgres queues|stats|shutdown|pause|resume|dead-letters` the same on
//!   PostgreSQL (`pg_ops.rs`).
//! - `wq dashboard`: a web page, JSON API and metrics for the queues on Redis (a server or a
//!   cluster) and PostgreSQL, side by side, with an audit trail on stderr.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod dashboard;
mod demo;
mod metrics_server;
mod ops;
mod pg_ops;

/// The workqueue command line.
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
    /// Operates a queue on Redis: stats, fleet shutdown, pause and resume, dead letters.
    Redis(ops::RedisArgs),
    /// Operates a queue on PostgreSQL: queues, stats, fleet shutdown, pause and resume, dead
    /// letters.
    Postgres(pg_ops::PostgresArgs),
    /// Serves a web dashboard of the queues on Redis and PostgreSQL:
    /// `wq dashboard --redis URL --postgres URL` (either or both).
    Dashboard(dashboard::DashboardArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Redis(args) => ops::run(args),
        Command::Postgres(args) => pg_ops::run(args),
        Command::Dashboard(args) => dashboard::run(args),
    }
}
