//! `wq`: the workqueue command line.
//!
//! - `wq demo`: a simulated controller on the in-memory queue (the main job).
//! - `wq bench`: the standard workloads of BENCH.md beside their references.
//! - `wq redis stats|shutdown|resume|dead-letters|demo|bench`: a queue on Redis, for operators.
//! - `wq dashboard`: a web page, JSON API and metrics for the queues on Redis.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod dashboard;
mod demo;
mod metrics_server;
mod redis;

/// The workqueue command line.
#[derive(Debug, Parser)]
#[command(name = "wq", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Simulates a controller: producers emit change events, workers reconcile them.
    Demo(demo::DemoArgs),
    /// Runs the standard workloads beside their references and prints one table.
    Bench(bench::BenchArgs),
    /// Operates a queue on Redis: stats, fleet shutdown and resume, dead letters, demo, bench.
    Redis(redis::RedisArgs),
    /// Serves a web dashboard of the queues on Redis: `wq dashboard --redis URL`.
    Dashboard(dashboard::DashboardArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Redis(args) => redis::run(args),
        Command::Dashboard(args) => dashboard::run(args),
    }
}
