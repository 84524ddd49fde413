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
mod checks;
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

pub(crate) use args::DemoArgs;

/// Runs the demo.
pub(crate) fn run(args: DemoArgs) -> ExitCode {
    let server = match (&args.redis, &args.postgres) {
        (Some(url), _) => Some((
            url_from(url.clone(), "--redis", "WQ_REDIS_URL"),
            Server::Redis,
        )),
        (None, Some(url)) => Some((
            url_from(url.clone(), "--postgres", "WQ_POSTGRES_URL"),
            Server::Postgres,
        )),
        (None, None) => None,
    };
    if let Some((url, server)) = server {
        let Some(url) = url else {
            eprintln!("{}", no_server::without_url(server.kind()));
            return ExitCode::FAILURE;
        };
        let args = distributed::DemoArgs {
            url,
            queue: args.queue,
            objects: args.objects as u64,
            events: args.events,
            workers: args.workers,
            failure_rate: args.failure_rate,
            max_retries: args.max_retries,
            duration: args.duration.as_secs_f64(),
            workers_only: args.workers_only,
        };
        return match server {
            Server::Redis => run_distributed(args),
            Server::Postgres if unreachable(no_server::Kind::Postgres, &args.url) => {
                ExitCode::FAILURE
            }
            Server::Postgres => crate::runtime::block_on_as(
                "wq demo",
                distributed::run::<on_postgres::OnPostgres>(args),
            ),
        };
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("wq-demo")
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("wq demo: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(simulate(args))
}

/// The server of `wq demo --redis` or `--postgres`.
#[derive(Debug, Clone, Copy)]
enum Server {
    Redis,
    Postgres,
}

impl Server {
    fn kind(self) -> no_server::Kind {
        match self {
            Server::Redis => no_server::Kind::Redis,
            Server::Postgres => no_server::Kind::Postgres,
        }
    }
}

/// Whether nothing answers at `url`; then the message (with the command that starts a server
/// on this machine) was printed.
fn unreachable(kind: no_server::Kind, url: &str) -> bool {
    match no_server::check(kind, url) {
        Some(text) => {
            eprintln!("wq demo: {text}");
            true
        }
        None => false,
    }
}

/// The URL given to option `flag`, or when none was given, the one in the environment
/// variable `var`; `None` (having said why) without either.
fn url_from(given: String, flag: &str, var: &str) -> Option<String> {
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

/// Runs the demo on Redis: `wq demo --redis URL`.
fn run_distributed(args: distributed::DemoArgs) -> ExitCode {
    if unreachable(no_server::Kind::Redis, &args.url) {
        return ExitCode::FAILURE;
    }
    crate::runtime::block_on_as("wq demo", distributed::run::<on_redis::OnRedis>(args))
}

/// The simulation: [`setup`] (Ctrl-C, the world, the queue, workers and producers), the
/// [`phases`] (produce, drain, stop), the [`report`] table and the [`checks`]; the exit code
/// follows the checks.
async fn simulate(args: DemoArgs) -> ExitCode {
    let (sim, workers) = match setup::setup(&args).await {
        Ok(started) => started,
        Err(code) => return code,
    };
    let outcome = phases::run(&sim, workers, &args).await;
    report::print(&sim, &outcome);
    let passed = checks::print(&sim, &outcome);
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
