//! The simulation's setup: the Ctrl-C handler, the opening line, the simulated world, the
//! queue (with its metrics server if asked), the workers and the producers.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prometheus_client::registry::Registry;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use tokio::signal::unix::SignalKind;
use workq::AsyncWorkers;
use workq::metrics::prometheus::PrometheusMetrics;
use workq::{StopToken, WorkQueue, Workers};

use super::args::DemoArgs;
use super::format::{count, duration};
use super::world::World;
use crate::metrics_server;

/// How many producer tasks emit events.
const PRODUCERS: usize = 4;

/// How long in-flight reconciles may take to finish once the demo stops its workers.
pub(super) const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// A simulation, set up and running.
pub(super) struct Sim {
    /// Stopped by Ctrl-C.
    pub(super) interrupt: StopToken,
    /// When the simulation started.
    pub(super) started: Instant,
    /// The simulated cluster and what happened to it.
    pub(super) world: Arc<World>,
    /// The queue the producers add to.
    pub(super) queue: WorkQueue<usize>,
    /// The objects given up, as the workers report them.
    pub(super) given_up: Arc<Mutex<Vec<usize>>>,
    /// Producers still running.
    pub(super) producing: Arc<AtomicUsize>,
    /// The metrics server, if `--metrics-addr` was given.
    pub(super) server: Option<tokio::task::JoinHandle<()>>,
}

/// Sets the simulation up and starts it, workers and producers; `Err` with the exit code if
/// the metrics server cannot start.
pub(super) async fn setup(args: &DemoArgs) -> Result<(Sim, AsyncWorkers<usize>), ExitCode> {
    let interrupt = ctrl_c_stops();
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
                return Err(ExitCode::from(2));
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
    // One generator per producer, each seeded from the demo's seed by a generator of its own.
    let mut seeds = SmallRng::seed_from_u64(args.seed);
    for producer in 0..PRODUCERS {
        let share = args.events / PRODUCERS as u64
            + u64::from((producer as u64) < args.events % PRODUCERS as u64);
        tokio::spawn(
            Producer {
                world: world.clone(),
                queue: queue.clone(),
                rng: SmallRng::seed_from_u64(seeds.random()),
                events: share,
                duration: args.duration,
                stop: interrupt.clone(),
                producing: producing.clone(),
            }
            .produce(),
        );
    }
    let sim = Sim {
        interrupt,
        started,
        world,
        queue,
        given_up,
        producing,
        server,
    };
    Ok((sim, workers))
}

/// A token that Ctrl-C (SIGINT) stops: intake stops, the run then winds down as usual and
/// prints what it did. The handler is in place when this returns, before the first line is
/// printed, so a script (or test) that waits for that line can interrupt safely.
fn ctrl_c_stops() -> StopToken {
    let interrupt = StopToken::new();
    if let Ok(mut signal) = tokio::signal::unix::signal(SignalKind::interrupt()) {
        let interrupt = interrupt.clone();
        tokio::spawn(async move {
            if signal.recv().await.is_some() {
                interrupt.stop();
            }
        });
    }
    interrupt
}

/// One producer's share of the events.
struct Producer {
    world: Arc<World>,
    queue: WorkQueue<usize>,
    /// This producer's generator.
    rng: SmallRng,
    events: u64,
    duration: Duration,
    stop: StopToken,
    /// Producers still running; this one decrements it when done.
    producing: Arc<AtomicUsize>,
}

impl Producer {
    /// Emits bursts of events (1 to 8 for one object, back to back, like a rollout's status
    /// updates), paced evenly over the duration. Half the bursts go to a hot tenth of the
    /// objects, so many events name an object that is already waiting.
    async fn produce(mut self) {
        let objects = self.world.len();
        let hot = (objects / 10).max(1);
        let start = tokio::time::Instant::now();
        let mut emitted = 0;
        while emitted < self.events && !self.stop.is_stopped() {
            let object = if self.rng.random_bool(0.5) {
                self.rng.random_range(0..hot)
            } else {
                self.rng.random_range(0..objects)
            };
            let burst = self.rng.random_range(1..=8u64).min(self.events - emitted);
            for _ in 0..burst {
                self.world.event(object);
                self.queue.add(object);
            }
            emitted += burst;
            // An offset from the start, never an `Instant` sum: no duration can overflow it.
            let due = Duration::try_from_secs_f64(
                self.duration.as_secs_f64() * emitted as f64 / self.events as f64,
            )
            .unwrap_or(self.duration);
            tokio::select! {
                () = tokio::time::sleep(due.saturating_sub(start.elapsed())) => {}
                () = self.stop.stopped() => break,
            }
        }
        self.producing.fetch_sub(1, Ordering::SeqCst);
    }
}
