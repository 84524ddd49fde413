//! `wq demo`: a simulated controller on the in-memory queue, the first thing to run.
//!
//! Producers emit bursts of change events for a set of objects, the way an informer calls
//! `queue.add` for every watch event: many of them name an object that is already waiting,
//! and the queue merges them. Workers ([`workqueue::Workers`]) reconcile with a random
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
mod report;
mod world;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use parking_lot::Mutex;
use prometheus_client::registry::Registry;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use workqueue::metrics::prometheus::PrometheusMetrics;
use workqueue::rate_limiter::{
    self, ExponentialFailure, FastSlow, Jitter, MaxOf, RateLimiter, TokenBucket,
};
use workqueue::{StopToken, WorkQueue, Workers};

use crate::metrics_server;

use self::report::{Table, count, duration, percentile};
use self::world::World;

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

Exit codes: 0 if both checks hold, 1 if one fails, 2 for a bad flag, 130 on Ctrl-C (intake \
stops, reconciles in flight finish, the table is printed).")]
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

    /// With --redis: the queue's name; every process of one demo uses the same.
    #[arg(long, value_name = "NAME", default_value = "demo", requires = "redis")]
    queue: String,

    /// With --redis: runs only workers, on a queue another `wq demo --redis` process
    /// produces into; ends when that process shuts the queue down.
    #[arg(long, requires = "redis")]
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
    if let Some(url) = args.redis {
        let Some(url) = crate::redis::url_or_env(url) else {
            return ExitCode::FAILURE;
        };
        return crate::redis::run_demo(crate::redis::demo::DemoArgs {
            url,
            queue: args.queue,
            objects: args.objects as u64,
            events: args.events,
            workers: args.workers,
            failure_rate: args.failure_rate,
            max_retries: args.max_retries,
            duration: args.duration.as_secs_f64(),
            workers_only: args.workers_only,
        });
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

/// How long the demo waits, after the producers are done, for the queue to drain: retries
/// still waiting for their backoff then are reported, not awaited.
fn drain_grace(duration: Duration) -> Duration {
    (duration / 2).clamp(Duration::from_secs(2), Duration::from_secs(30))
}

async fn simulate(args: DemoArgs) -> ExitCode {
    // Ctrl-C stops intake; the run then winds down as usual and prints what it did. The
    // handler is in place before the first line is printed, so a script (or test) that
    // waits for that line can interrupt safely.
    let interrupt = StopToken::new();
    let mut ctrl_c = Box::pin(tokio::signal::ctrl_c());
    // The first poll installs the handler.
    let installed = tokio::select! {
        biased;
        _ = &mut ctrl_c => false,
        () = std::future::ready(()) => true,
    };
    if installed {
        let interrupt = interrupt.clone();
        tokio::spawn(async move {
            if ctrl_c.await.is_ok() {
                interrupt.stop();
            }
        });
    }

    println!(
        "wq demo: {} objects, {} events over {}, {} workers, failure rate {}%, \
         max retries {}, limiter {}, seed {}",
        count(args.objects as u64),
        count(args.events),
        duration(args.duration),
        args.workers,
        (args.failure_rate * 1000.0).round() / 10.0,
        args.max_retries,
        args.limiter.name(),
        args.seed,
    );

    let started = Instant::now();
    let world = Arc::new(World::new(
        args.objects,
        args.seed,
        args.failure_rate,
        Duration::from_millis(args.latency_ms),
    ));
    let mut builder = WorkQueue::builder()
        .name("demo")
        .rate_limiter(args.limiter.build(args.seed));
    let mut server = None;
    if let Some(addr) = args.metrics_addr {
        let mut registry = Registry::default();
        builder = builder.metrics(PrometheusMetrics::new(&mut registry));
        match metrics_server::serve(addr, Arc::new(registry)).await {
            Ok((bound, task)) => {
                println!("metrics: http://{bound}/metrics");
                server = Some(task);
            }
            Err(err) => {
                eprintln!("wq demo: cannot serve metrics on {addr}: {err}");
                return ExitCode::from(2);
            }
        }
    }
    let queue: WorkQueue<usize> = builder.build();
    let given_up: Arc<Mutex<Vec<usize>>> = Arc::default();
    let workers = Workers::new(queue.clone())
        .count(args.workers)
        .max_retries(args.max_retries)
        .shutdown_timeout(SHUTDOWN_TIMEOUT)
        .on_give_up({
            let given_up = given_up.clone();
            move |gave_up| given_up.lock().push(gave_up.item)
        })
        .spawn_async({
            let world = world.clone();
            move |object: usize| {
                let world = world.clone();
                async move { world.reconcile(object).await }
            }
        });

    let producing = Arc::new(AtomicUsize::new(PRODUCERS));
    for producer in 0..PRODUCERS {
        let share = args.events / PRODUCERS as u64
            + u64::from((producer as u64) < args.events % PRODUCERS as u64);
        tokio::spawn(produce(Producer {
            world: world.clone(),
            queue: queue.clone(),
            seed: world::mix(args.seed.wrapping_add(producer as u64)),
            events: share,
            duration: args.duration,
            stop: interrupt.clone(),
            producing: producing.clone(),
        }));
    }

    let bar = progress_bar(args.duration, args.no_progress);
    let status = |phase: &str| {
        let stats = workers.stats();
        format!(
            "{phase} · given up {} · overlaps {}\n\
             events in {} · reconciles {} · retries {} · depth {} (+{} delayed)",
            count(stats.given_up),
            world.overlaps.load(Ordering::Relaxed),
            count(world.events.load(Ordering::Relaxed)),
            count(world.reconciles.load(Ordering::Relaxed)),
            count(stats.retried),
            count(queue.len() as u64),
            count(queue.delayed_len() as u64),
        )
    };

    // Phase 1: the producers emit their events.
    while producing.load(Ordering::SeqCst) > 0 && !interrupt.is_stopped() {
        bar.set_position(started.elapsed().as_millis() as u64);
        bar.set_message(status("producing"));
        tick(&interrupt).await;
    }
    let produced_at = Instant::now();

    // Phase 2: the queue drains (ready items, reconciles in flight, and retries), within a
    // grace period.
    let grace = drain_grace(args.duration);
    while !interrupt.is_stopped() && produced_at.elapsed() < grace {
        if queue.is_empty() && queue.processing_len() == 0 && queue.delayed_len() == 0 {
            break;
        }
        bar.set_position(bar.length().unwrap_or(0));
        bar.set_message(status("draining"));
        tick(&interrupt).await;
    }
    let active = started.elapsed();

    // Phase 3: stop the workers; reconciles in flight finish.
    bar.set_message(status("stopping"));
    let summary = workers.shut_down().await;
    bar.finish_and_clear();
    let interrupted = interrupt.is_stopped();

    // The table.
    let events = world.events.load(Ordering::Relaxed);
    let absorbed = world.absorbed.load(Ordering::Relaxed);
    let latencies = world.sorted_latencies();
    let latency = |p: f64| percentile(&latencies, p).map_or_else(|| "-".to_owned(), duration);
    let mut table = Table::default();
    table.row("events added", count(events));
    table.row_note(
        "events absorbed by dedup",
        count(absorbed),
        format!("{:.1}% of events", percent(absorbed, events)),
    );
    table.row("reconciles", count(summary.processed));
    table.row("  succeeded", count(summary.succeeded));
    table.row("  retried", count(summary.retried));
    table.row_note(
        "  given up",
        count(summary.given_up),
        given_up_note(&given_up.lock()),
    );
    table.row_note(
        "left in the queue at exit",
        count(summary.left_in_queue as u64),
        if summary.left_in_queue > 0 {
            "retries still backing off: the default limiter allows 10 retries/s \
             overall (try --limiter exponential)"
        } else {
            ""
        },
    );
    table.row("latency add → reconcile p50", latency(50.0));
    table.row("latency add → reconcile p99", latency(99.0));
    table.row_note(
        "throughput",
        format!("{:.0}", summary.processed as f64 / active.as_secs_f64()),
        "reconciles/s",
    );
    table.row("elapsed", duration(started.elapsed()));
    println!();
    print!("{}", table.render());

    // The checks.
    let overlaps = world.overlaps.load(Ordering::SeqCst);
    let exclusive = overlaps == 0;
    println!();
    println!("checks");
    println!(
        "  [{}] no object was reconciled by two workers at once ({} reconciles{})",
        if exclusive { "ok" } else { "FAILED" },
        count(world.reconciles.load(Ordering::Relaxed)),
        if exclusive {
            String::new()
        } else {
            format!(", {overlaps} overlapping")
        },
    );
    let last = world.last_events();
    let reconciled = last.missed.is_empty();
    if interrupted {
        println!(
            "  [skipped] every object's last event was reconciled after it arrived (interrupted)"
        );
    } else {
        println!(
            "  [{}] every object's last event was reconciled after it arrived ({} of {} changed objects{})",
            if reconciled { "ok" } else { "FAILED" },
            count((last.changed - last.missed.len()) as u64),
            count(last.changed as u64),
            if reconciled {
                String::new()
            } else {
                format!(", missed: {}", list(&last.missed))
            },
        );
    }
    if !summary.is_drained() {
        println!(
            "  note: {} reconciles were still running {} after the stop",
            summary.in_flight.len(),
            duration(SHUTDOWN_TIMEOUT)
        );
    }

    if args.linger && !interrupted {
        println!("\nstill serving metrics; Ctrl-C to exit");
        interrupt.stopped().await;
    }
    if let Some(server) = server {
        server.abort();
    }

    if interrupted {
        println!("\ninterrupted");
        ExitCode::from(130)
    } else if exclusive && reconciled {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// One producer's share of the events.
struct Producer {
    world: Arc<World>,
    queue: WorkQueue<usize>,
    seed: u64,
    events: u64,
    duration: Duration,
    stop: StopToken,
    /// Producers still running; this one decrements it when done.
    producing: Arc<AtomicUsize>,
}

/// Emits bursts of events (1 to 8 for one object, back to back, like a rollout's status
/// updates), paced evenly over the duration. Half the bursts go to a hot tenth of the
/// objects, so many events name an object that is already waiting.
async fn produce(producer: Producer) {
    let Producer {
        world,
        queue,
        seed,
        events,
        duration,
        stop,
        producing,
    } = producer;
    let mut rng = SmallRng::seed_from_u64(seed);
    let objects = world.len();
    let hot = (objects / 10).max(1);
    let start = tokio::time::Instant::now();
    let mut emitted = 0;
    while emitted < events && !stop.is_stopped() {
        let object = if rng.random_bool(0.5) {
            rng.random_range(0..hot)
        } else {
            rng.random_range(0..objects)
        };
        let burst = rng.random_range(1..=8u64).min(events - emitted);
        for _ in 0..burst {
            world.event(object);
            queue.add(object);
        }
        emitted += burst;
        let due = start + duration.mul_f64(emitted as f64 / events as f64);
        tokio::select! {
            () = tokio::time::sleep_until(due) => {}
            () = stop.stopped() => break,
        }
    }
    producing.fetch_sub(1, Ordering::SeqCst);
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
