//! The simulation's run, in three phases: the producers emit their events, the queue drains
//! (within a grace period), the workers stop.

use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use workq::{AsyncWorkers, StopToken, Summary};

use super::args::DemoArgs;
use super::format::count;
use super::setup::Sim;

/// How often the progress bar is redrawn and the phases check whether they are over.
const TICK: Duration = Duration::from_millis(50);

/// What the run ended with.
pub(super) struct PhaseOutcome {
    /// The workers' summary.
    pub(super) summary: Summary<usize>,
    /// From the start to the end of draining (the throughput's denominator).
    pub(super) active: Duration,
    /// Whether Ctrl-C stopped the run.
    pub(super) interrupted: bool,
}

/// Runs the three phases with a progress bar, the last of which stops `workers`.
pub(super) async fn run(sim: &Sim, workers: AsyncWorkers<usize>, args: &DemoArgs) -> PhaseOutcome {
    let Sim {
        interrupt,
        started,
        world,
        queue,
        producing,
        ..
    } = sim;
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
        tick(interrupt).await;
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
        tick(interrupt).await;
    }
    let active = started.elapsed();

    // Phase 3: stop the workers; reconciles in flight finish.
    bar.set_message(status("stopping"));
    let summary = workers.shut_down().await;
    bar.finish_and_clear();
    PhaseOutcome {
        summary,
        active,
        interrupted: interrupt.is_stopped(),
    }
}

/// How long the demo waits, after the producers are done, for the queue to drain: retries
/// still waiting for their backoff then are reported, not awaited.
fn drain_grace(duration: Duration) -> Duration {
    (duration / 2).clamp(Duration::from_secs(2), Duration::from_secs(30))
}

/// Waits one tick, or less if interrupted.
async fn tick(interrupt: &StopToken) {
    tokio::select! {
        () = tokio::time::sleep(TICK) => {}
        () = interrupt.stopped() => {}
    }
}

/// The progress bar of a run of `duration`: hidden when `disabled` or when stderr is not a
/// terminal.
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
