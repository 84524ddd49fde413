//! What the simulation prints at the end: the table of what happened, and the two checks
//! made as it ran (no object was reconciled by two workers at once, and every object's last
//! event was reconciled after it arrived).

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::format::{count, duration, list};
use super::phases::PhaseOutcome;
use super::setup::{SHUTDOWN_TIMEOUT, Sim};

/// Prints the end-of-run table: events, dedup, reconciles, retries, give-ups, latency,
/// throughput.
pub(super) fn print(sim: &Sim, outcome: &PhaseOutcome) {
    let (world, summary) = (&sim.world, &outcome.summary);
    let events = world.events.load(Ordering::Relaxed);
    let absorbed = world.absorbed.load(Ordering::Relaxed);
    let latencies = world.sorted_latencies();
    let latency = |p: f64| percentile(&latencies, p).map_or_else(|| "-".to_owned(), duration);
    let mut table = Table::default();
    table.row("events added", count(events), "");
    table.row(
        "events absorbed by dedup",
        count(absorbed),
        // Of no events (a run stopped at once), none.
        format!(
            "{:.1}% of events",
            absorbed as f64 * 100.0 / events.max(1) as f64
        ),
    );
    table.row("reconciles", count(summary.processed), "");
    table.row("  succeeded", count(summary.succeeded), "");
    table.row("  retried", count(summary.retried), "");
    table.row(
        "  given up",
        count(summary.given_up),
        given_up_note(&sim.given_up.lock()),
    );
    table.row(
        "left in the queue at exit",
        count(summary.left_in_queue as u64),
        if summary.left_in_queue > 0 {
            "retries still backing off: the default limiter allows 10 retries/s \
             overall (try --limiter exponential)"
        } else {
            ""
        },
    );
    table.row("latency add → reconcile p50", latency(50.0), "");
    table.row("latency add → reconcile p99", latency(99.0), "");
    table.row(
        "throughput",
        format!(
            "{:.0}",
            summary.processed as f64 / outcome.active.as_secs_f64()
        ),
        "reconciles/s",
    );
    table.row("elapsed", duration(sim.started.elapsed()), "");
    println!();
    print!("{}", table.render());
}

/// Prints the checks; true if both hold (the second is skipped, not failed, when
/// interrupted).
pub(super) fn checks(sim: &Sim, outcome: &PhaseOutcome) -> bool {
    let world = &sim.world;
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
    if outcome.interrupted {
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
    if !outcome.summary.is_drained() {
        println!(
            "  note: {} reconciles were still running {} after the stop",
            outcome.summary.in_flight.len(),
            duration(SHUTDOWN_TIMEOUT)
        );
    }
    exclusive && reconciled
}

/// The note beside the give-ups: which objects.
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

/// The `p`-th percentile (0 to 100) of sorted samples, nearest rank.
pub(super) fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// A two-column table: labels left, values right-aligned, optional notes after.
#[derive(Default)]
pub(super) struct Table {
    rows: Vec<(String, String, String)>,
}

impl Table {
    /// A row: its label, its value and a note after it (`""` for none).
    pub(super) fn row(&mut self, label: &str, value: String, note: impl Into<String>) {
        self.rows.push((label.to_owned(), value, note.into()));
    }

    pub(super) fn render(&self) -> String {
        let label_width = self
            .rows
            .iter()
            .map(|(label, _, _)| label.chars().count())
            .max()
            .unwrap_or(0);
        let value_width = self
            .rows
            .iter()
            .map(|(_, value, _)| value.chars().count())
            .max()
            .unwrap_or(0);
        let mut out = String::new();
        for (label, value, note) in &self.rows {
            let line = format!("  {label:<label_width$}  {value:>value_width$}  {note}");
            let _ = writeln!(out, "{}", line.trim_end());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&samples, 50.0), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&samples, 99.0), Some(Duration::from_millis(99)));
        assert_eq!(
            percentile(&samples, 100.0),
            Some(Duration::from_millis(100))
        );
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn tables_align_their_columns() {
        let mut table = Table::default();
        table.row("events", "10".to_owned(), "");
        table.row("reconciles", "1,000".to_owned(), "(fast)");
        assert_eq!(
            table.render(),
            "  events         10\n  reconciles  1,000  (fast)\n"
        );
    }
}
