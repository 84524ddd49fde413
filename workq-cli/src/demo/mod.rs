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
mod no_server;
mod on_postgres;
mod on_redis;
mod phases;
mod report;
mod setup;
mod world;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use workq::StopToken;
use workq::rate_limiter::{
    self, ExponentialFailure, FastSlow, Jitter, MaxOf, RateLimiter, TokenBucket,
};

/// Options of `wq demo`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
The simulation: producers emit bursts of change events for the objects (many duplicates, \
which the queue merges); workers reconcile each object with a random latency and fail at \
--failure-rate; failures back off with --limiter and are given up after --max-retries.

At the end a table shows events added and absorbed by dedup, reconciles, retries, give-ups, \
the add-to-reconcile latency and the throughput, and two checks made while running: no \
object was reconciled by two workers at once, and every object's last event was reconciled \
after it arrived.

On a server (--redis URL or --postgres URL) the queue is shared: run one process with \
producers and workers, and any number with --workers-only on the same --queue. The checks' \
bookkeeping is kept on the same server (keys wq-demo:{QUEUE}:* on Redis; tables wq_demo_* \
on PostgreSQL, created if missing), so they hold across every process. The producing \
process waits for the queue to drain, then shuts it down for every process.

Exit codes: 0 if both checks hold, 1 if one fails, 2 for a bad flag, 130 on Ctrl-C (intake \
stops, reconciles in flight finish, the table is printed).")]
#[command(group(clap::ArgGroup::new("server").args(["redis", "postgres"])))]
pub(crate) struct DemoArgs {
    /// How many objects the simulated cluster holds (1 to 1,000,000); every event names one.
    #[arg(long, default_value = "200", value_name = "N", value_parser = args::objects)]
    objects: usize,

    /// How many change events the producers emit in all, spread over --duration
    /// (1 to 100,000,000).
    #[arg(long, default_value = "10000", value_name = "N", value_parser = args::events)]
    events: u64,

    /// How many workers reconcile at once (1 to 1024).
    #[arg(long, default_value = "8", value_name = "N", value_parser = args::workers)]
    workers: usize,

    /// The fraction of reconciles that fail and are retried with backoff, from 0 to 1
    /// (0.05 is 5%).
    #[arg(long, default_value = "0.05", value_name = "RATE", value_parser = args::failure_rate)]
    failure_rate: f64,

    /// How long the producers emit events: 10s, 1500ms, 2m, or plain seconds (at most 1h).
    /// The run ends shortly after, once the queue has drained.
    #[arg(long, default_value = "10s", value_name = "TIME", value_parser = args::duration)]
    duration: Duration,

    /// Seeds the simulation: the same seed emits the same events and fails the same
    /// reconciles.
    #[arg(long, default_value_t = 1, value_name = "N")]
    seed: u64,

    /// How failed reconciles back off.
    #[arg(long, value_enum, default_value_t = Limiter::Default)]
    limiter: Limiter,

    /// Retries before a failing object is given up (0 to 100).
    #[arg(long, default_value = "5", value_name = "N", value_parser = args::max_retries)]
    max_retries: usize,

    /// The longest simulated reconcile, in milliseconds (0 to 10,000); each one takes a
    /// random time up to this.
    #[arg(long, default_value = "20", value_name = "MS", value_parser = args::latency_ms)]
    latency_ms: u64,

    /// Prints no live progress bar (it is also hidden when stderr is not a terminal).
    #[arg(long)]
    no_progress: bool,

    /// Serves the queue's metrics (Kubernetes' workqueue series) at
    /// http://ADDR/metrics while the demo runs, e.g. 127.0.0.1:9898 (port 0 picks a free one).
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,

    /// With --metrics-addr: keeps serving the metrics after the summary, until Ctrl-C.
    #[arg(long, requires = "metrics_addr")]
    linger: bool,

    /// Runs the producers and workers against the Redis-backed queue at URL
    /// (redis://host:port/db (user:password@ before the host if needed), or rediss:// for TLS) instead of the
    /// in-memory one. Several processes may share it (see --workers-only).
    /// `--redis` alone takes the URL from $WQ_REDIS_URL (keep a password off the command line).
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    redis: Option<String>,

    /// Runs the producers and workers against the queue on PostgreSQL at URL
    /// (postgres://user:password@host:port/database; add ?sslmode=require for TLS) instead
    /// of the in-memory one. Several processes may share it (see --workers-only).
    /// `--postgres` alone takes the URL from $WQ_POSTGRES_URL (keep a password off the
    /// command line).
    #[arg(
        long,
        value_name = "URL",
        num_args = 0..=1,
        default_missing_value = "",
        conflicts_with = "redis"
    )]
    postgres: Option<String>,

    /// With --redis or --postgres: the queue's name; every process of one demo uses the same.
    #[arg(long, value_name = "NAME", default_value = "demo", requires = "server")]
    queue: String,

    /// With --redis or --postgres: runs only workers, on a queue another `wq demo` process
    /// on the same server produces into; ends when that process shuts the queue down.
    #[arg(long, requires = "server")]
    workers_only: bool,
}

/// The rate limiters `--limiter` offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Limiter {
    /// client-go's default: per-object exponential 5 ms to 1000 s, and 10 retries/s overall
    /// with a burst of 100 (`rate_limiter::default_controller`).
    Default,
    /// The default with full jitter on the exponential part, so objects failing together
    /// retry apart.
    Jittered,
    /// Per-object exponential 5 ms to 1000 s alone (controller-runtime's default).
    Exponential,
    /// 5 ms for the first 3 retries of an object, then 500 ms.
    FastSlow,
}

impl Limiter {
    fn build(self, seed: u64) -> Box<dyn RateLimiter<usize>> {
        let exponential =
            || ExponentialFailure::new(Duration::from_millis(5), Duration::from_secs(1000));
        match self {
            Limiter::Default => Box::new(rate_limiter::default_controller()),
            Limiter::Jittered => Box::new(MaxOf::new(vec![
                Box::new(Jitter::full(exponential()).with_seed(seed)),
                Box::new(TokenBucket::new(10.0, 100)),
            ])),
            Limiter::Exponential => Box::new(exponential()),
            Limiter::FastSlow => Box::new(FastSlow::new(
                Duration::from_millis(5),
                Duration::from_millis(500),
                3,
            )),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Limiter::Default => "default (client-go's controller limiter)",
            Limiter::Jittered => "jittered",
            Limiter::Exponential => "exponential",
            Limiter::FastSlow => "fast-slow",
        }
    }
}

/// How many producer tasks emit events.
const PRODUCERS: usize = 4;

/// How often the progress bar is redrawn and the phases check whether they are over.
const TICK: Duration = Duration::from_millis(50);

/// How long in-flight reconciles may take to finish once the demo stops its workers.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs the demo.
pub(crate) fn run(args: DemoArgs) -> ExitCode {
    let server = match (&args.redis, &args.postgres) {
        (Some(url), _) => Some((crate::ops::url_or_env(url.clone()), Server::Redis)),
        (None, Some(url)) => Some((
            crate::ops::url_from(url.clone(), "--postgres", "WQ_POSTGRES_URL"),
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
            Server::Postgres => crate::ops::block_on_as(
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

/// Runs the demo on Redis: `wq demo --redis URL` (and the deprecated `wq redis demo`).
pub(crate) fn run_distributed(args: distributed::DemoArgs) -> ExitCode {
    if unreachable(no_server::Kind::Redis, &args.url) {
        return ExitCode::FAILURE;
    }
    crate::ops::block_on_as("wq demo", distributed::run::<on_redis::OnRedis>(args))
}

/// How long the demo waits, after the producers are done, for the queue to drain: retries
/// still waiting for their backoff then are reported, not awaited.
fn drain_grace(duration: Duration) -> Duration {
    (duration / 2).clamp(Duration::from_secs(2), Duration::from_secs(30))
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

/// Waits one tick, or less if interrupted.
async fn tick(interrupt: &StopToken) {
    tokio::select! {
        () = tokio::time::sleep(TICK) => {}
        () = interrupt.stopped() => {}
    }
}

fn progress_bar(duration: Duration, disabled: bool) -> ProgressBar {
    let length = duration.as_millis() as u64;
    if disabled || !std::io::stderr().is_terminal() {
        return ProgressBar::with_draw_target(Some(length), ProgressDrawTarget::hidden());
    }
    let bar = ProgressBar::new(length);
    if let Ok(style) = ProgressStyle::with_template("{spinner} {elapsed:>3} [{bar:24}] {msg}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// Up to five object numbers, then how many more.
fn list(objects: &[usize]) -> String {
    let mut shown: Vec<String> = objects.iter().take(5).map(ToString::to_string).collect();
    if objects.len() > 5 {
        shown.push(format!("and {} more", objects.len() - 5));
    }
    shown.join(", ")
}

fn given_up_note(objects: &[usize]) -> String {
    if objects.is_empty() {
        String::new()
    } else {
        format!(
            "objects {} (logged and reported to on_give_up)",
            list(objects)
        )
    }
}
