//! `wq-bench --profile`: what the server did per item while an implementation ran a
//! workload, read from the server's own counters before and after, so that the figures do
//! not depend on how loaded the machine is (unlike items/s).
//!
//! On Redis (`INFO all`): commands per item (every call, the ones scripts make included),
//! the three most-called commands per item, script calls (`EVAL`, `EVALSHA`, `FCALL`) per
//! item and their time, the server's CPU per 1,000 items (`used_cpu_user` +
//! `used_cpu_sys`), and network bytes in and out per item. On PostgreSQL: statements per
//! item (with `pg_stat_statements`), transactions per item, WAL bytes per item, rows
//! fetched, inserted, updated and deleted per item (`pg_stat_database`), and, when the
//! server runs on this machine, the CPU of its processes per 1,000 items (`/proc`).
//!
//! Every figure counts everything the server did in between: the implementation's setup and
//! clean-up too (a table created if missing, a queue deleted), which a run of 100,000 items
//! makes small. The readings are taken with nothing else of the bench running; another
//! client of the same server would count too.

pub(crate) mod metrics;
mod postgres;
mod procfs;
mod redis;

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

use crate::server::{Backend, Server};
use crate::util::text;

/// Figures of one implementation: (metric, value).
pub(crate) type Figures = Vec<(&'static str, f64)>;

pub(crate) use metrics::*;

/// How many of the most-called commands get a figure of their own.
const TOP_COMMANDS: usize = 3;

/// The metric of a command's own figure, `cmd_NAME_per_item`, kept for the rest of the run
/// (a figure's metric is a `&'static str`; the commands a run sees are a few dozen at most,
/// each kept once).
fn command_metric(name: &str) -> &'static str {
    static NAMES: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let metric = format!("{COMMAND_PREFIX}{}{COMMAND_SUFFIX}", name.to_lowercase());
    let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    let names = names.get_or_insert_with(HashSet::new);
    if let Some(known) = names.get(metric.as_str()) {
        return known;
    }
    let leaked: &'static str = Box::leak(metric.into_boxed_str());
    names.insert(leaked);
    leaked
}

/// `count` per item.
fn per_item(count: u64, items: usize) -> f64 {
    #[expect(clippy::cast_precision_loss, reason = "counts stay far below 2^52")]
    let (count, items) = (count as f64, items.max(1) as f64);
    count / items
}

/// `total` per 1,000 items.
fn per_thousand(total: f64, items: usize) -> f64 {
    #[expect(
        clippy::cast_precision_loss,
        reason = "item counts stay far below 2^52"
    )]
    let items = items.max(1) as f64;
    total * 1000.0 / items
}

/// The profile's connection to a server.
enum Probe {
    Redis(::redis::aio::MultiplexedConnection),
    Postgres(postgres::Probe),
}

/// A reading of the server's counters.
enum Reading {
    Redis(redis::Reading),
    Postgres(postgres::Reading),
}

/// Reads a server's counters around each implementation's run of a workload.
pub(crate) struct Profiler<'a> {
    server: &'a Server,
    probe: Probe,
}

impl<'a> Profiler<'a> {
    /// Connects to `server`; what it cannot measure there goes into the server's notes.
    pub(crate) fn connect(server: &'a Server) -> Result<Self, String> {
        let mut notes = Vec::new();
        let probe = server.runtime.block_on(async {
            match server.backend {
                Backend::Redis => {
                    let client = ::redis::Client::open(server.url.as_str()).map_err(text)?;
                    let connection = client
                        .get_multiplexed_async_connection()
                        .await
                        .map_err(text)?;
                    Ok::<_, String>(Probe::Redis(connection))
                }
                Backend::Postgres => Ok(Probe::Postgres(
                    postgres::Probe::connect(&server.url, &mut notes).await?,
                )),
            }
        })?;
        for note in notes {
            server.note(note);
        }
        Ok(Self { server, probe })
    }

    /// Reads the counters now.
    fn read(&mut self) -> Result<Reading, String> {
        let mut notes = Vec::new();
        let reading = self.server.runtime.block_on(async {
            match &mut self.probe {
                Probe::Redis(connection) => Ok(Reading::Redis(redis::read(connection).await?)),
                Probe::Postgres(probe) => {
                    Ok::<_, String>(Reading::Postgres(probe.read(&mut notes).await?))
                }
            }
        });
        for note in notes {
            self.server.note(note);
        }
        reading
    }

    /// Runs `run`, which handles `items` items, between two readings; its result, and the
    /// profile's figures (none, and a note, when a reading failed).
    pub(crate) fn around<T>(&mut self, items: usize, run: impl FnOnce() -> T) -> (T, Figures) {
        let before = self.read();
        let out = run();
        let figures = match (before, self.read()) {
            (Ok(Reading::Redis(b)), Ok(Reading::Redis(a))) => redis::figures(&b, &a, items),
            (Ok(Reading::Postgres(b)), Ok(Reading::Postgres(a))) => {
                postgres::figures(&b, &a, items)
            }
            (Err(e), _) | (_, Err(e)) => {
                self.server.note(format!("profile not read: {e}"));
                Vec::new()
            }
            _ => Vec::new(),
        };
        (out, figures)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_s_metric_is_kept_once_and_every_profile_figure_has_a_unit() {
        let a = command_metric("EVALSHA");
        assert_eq!(a, "cmd_evalsha_per_item");
        assert!(std::ptr::eq(a, command_metric("evalsha")));
        assert!(is_profile_metric(a) && is_profile_metric(CPU_MS));
        assert!(!is_profile_metric("items_per_s"));
        assert_eq!(format_value(CPU_MS, 12.34).as_deref(), Some("12.3 ms"));
        assert_eq!(format_value(WAL_BYTES, 812.6).as_deref(), Some("813 B"));
        assert_eq!(format_value(COMMANDS, 3.456).as_deref(), Some("3.46"));
        assert_eq!(format_value("items_per_s", 1.0), None);
        assert!((per_item(3, 2) - 1.5).abs() < 1e-12);
        assert!((per_thousand(5.0, 10_000) - 0.5).abs() < 1e-12);
    }
}
