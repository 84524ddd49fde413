//! `wq demo`: a simulated controller on the in-memory queue, the first thing to run. With
//! `--redis URL` or `--postgres URL` the controller runs on a queue on Redis or PostgreSQL
//! shared by processes instead ([`distributed`], one driver for both servers over
//! [`on_redis`] and [`on_postgres`]).
//!
//! Producers emit bursts of change events for a set of objects, the way an informer calls
//! `queue.add` for every watch event: many of them name an object that is already waiting,
//! and the queue merges them. Workers ([`workq::Workers`]) reconcile with a random
//! latency and fail at a configurable rate; failures back off with the chosen rate limiter
//! and are given up after `--max-retries`. A live progress bar shows the traffic; at the end
//! a table shows what happened and two checks the demo made as it ran:
//!
//! - no object was ever reconciled by two workers at once;
//! - every object's last event was reconciled after it arrived (nothing was lost by dedup).
//!
//! The exit code is 0 if both hold, 1 if one fails, 130 if interrupted by Ctrl-C (the run
//! then stops intake, lets in-flight reconciles finish and prints the table anyway). The
//! same `--seed` emits the same events and makes the same reconciles fail; only the thread
//! interleaving differs between runs.

mod args;
pub(crate) mod distributed;
mod format;
pub(crate) mod install;
mod no_server;
mod on_postgres;
mod on_redis;
mod phases;
mod report;
mod setup;
mod world;

use std::process::ExitCode;

use crate::runtime::block_on_as;
pub(crate) use args::DemoArgs;
use no_server::Kind;

/// Runs the demo.
pub(crate) fn run(args: DemoArgs) -> ExitCode {
    let (given, kind) = match (&args.redis, &args.postgres) {
        (Some(url), _) => (url, Kind::Redis),
        (None, Some(url)) => (url, Kind::Postgres),
        (None, None) => {
            return block_on_as("wq demo", async { Ok::<_, String>(simulate(args).await) });
        }
    };
    let (flag, var) = match kind {
        Kind::Redis => ("--redis", "WQ_REDIS_URL"),
        Kind::Postgres => ("--postgres", "WQ_POSTGRES_URL"),
    };
    // The URL given to the flag, or when none was given, the one in the variable.
    let url = if given.is_empty() {
        std::env::var(var).unwrap_or_default()
    } else {
        given.clone()
    };
    if url.is_empty() {
        eprintln!("wq: {flag} without a URL needs {var}");
        eprintln!("{}", no_server::without_url(kind));
        return ExitCode::FAILURE;
    }
    // Nothing answers at the URL: the message names the command that starts a server here.
    if let Some(text) = no_server::check(kind, &url) {
        eprintln!("wq demo: {text}");
        return ExitCode::FAILURE;
    }
    match kind {
        Kind::Redis => block_on_as("wq demo", distributed::run::<on_redis::OnRedis>(args, url)),
        Kind::Postgres => block_on_as(
            "wq demo",
            distributed::run::<on_postgres::OnPostgres>(args, url),
        ),
    }
}

/// The simulation: [`setup`] (Ctrl-C, the world, the queue, workers and producers), the
/// [`phases`] (produce, drain, stop), then the [`report`]: the table and the checks; the exit
/// code follows the checks.
async fn simulate(args: DemoArgs) -> ExitCode {
    let (sim, workers) = match setup::setup(&args).await {
        Ok(started) => started,
        Err(code) => return code,
    };
    let outcome = phases::run(&sim, workers, &args).await;
    report::print(&sim, &outcome);
    let passed = report::checks(&sim, &outcome);
    if args.linger && !outcome.interrupted {
        println!("\nstill serving metrics; Ctrl-C to exit");
        sim.interrupt.stopped().await;
    }
    if let Some(server) = &sim.server {
        server.abort();
    }
    if outcome.interrupted {
        println!("\ninterrupted");
        ExitCode::from(130)
    } else if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
