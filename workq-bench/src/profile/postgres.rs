//! What a PostgreSQL server did, from its statistics views: transactions and rows
//! (`pg_stat_database`), statements (`pg_stat_statements`, where the extension is
//! installed), WAL written (`pg_current_wal_lsn()`), and, when the server runs on this
//! machine, the CPU time of its processes (`/proc`).

use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection, Row};

use super::procfs;
use super::{Figures, per_thousand};
use crate::util::text;

/// How long a reading waits for the connections of the implementation measured to end.
const QUIET_LIMIT: Duration = Duration::from_secs(15);

/// The counters of one reading.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Reading {
    pub(crate) xacts: f64,
    pub(crate) fetched: f64,
    pub(crate) inserted: f64,
    pub(crate) updated: f64,
    pub(crate) deleted: f64,
    pub(crate) wal_bytes: f64,
    /// Calls of top-level statements, with `pg_stat_statements`.
    pub(crate) statements: Option<f64>,
    /// The server's processes' CPU seconds, when it is local.
    pub(crate) cpu_s: Option<f64>,
}

/// A connection of the profile's own to the server.
pub(crate) struct Probe {
    connection: PgConnection,
    /// The postmaster's process id, when the server runs on this machine.
    postmaster: Option<u32>,
    statements: bool,
}

impl Probe {
    /// Connects, and finds out whether the server is local and whether
    /// `pg_stat_statements` is there; what it cannot measure, it says in `notes`.
    pub(crate) async fn connect(url: &str, notes: &mut Vec<String>) -> Result<Self, String> {
        let mut connection = PgConnection::connect(url).await.map_err(text)?;
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut connection)
            .await
            .map_err(text)?;
        let postmaster = u32::try_from(pid)
            .ok()
            .and_then(procfs::stat)
            .filter(|(name, _)| name.starts_with("postgres"))
            .and_then(|(_, times)| times.parent)
            .filter(|&parent| procfs::stat(parent).is_some_and(|(n, _)| n.starts_with("postgres")));
        if postmaster.is_none() {
            notes.push(format!(
                "PostgreSQL server CPU not measured: the server is not on this machine (its \
                 backend {pid} is not among this machine's processes)"
            ));
        }
        let statements = sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pg_stat_statements")
            .fetch_one(&mut connection)
            .await
            .is_ok();
        if !statements {
            notes.push(
                "PostgreSQL statements per item not measured: pg_stat_statements is not \
                 installed (shared_preload_libraries and CREATE EXTENSION); transactions per \
                 item are"
                    .to_owned(),
            );
        }
        Ok(Self {
            connection,
            postmaster,
            statements,
        })
    }

    /// Waits until no other connection to this database is open (the statistics of a
    /// connection reach `pg_stat_database` when it ends), then reads the counters.
    pub(crate) async fn read(&mut self, notes: &mut Vec<String>) -> Result<Reading, String> {
        let begun = Instant::now();
        loop {
            let others: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
            )
            .fetch_one(&mut self.connection)
            .await
            .map_err(text)?;
            if others == 0 {
                break;
            }
            if begun.elapsed() > QUIET_LIMIT {
                notes.push(format!(
                    "PostgreSQL profile: {others} connection(s) still open after {} s; their \
                     statistics may be missing from a figure",
                    QUIET_LIMIT.as_secs()
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The last connection's statistics are written as it exits.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let row = sqlx::query(
            "SELECT (xact_commit + xact_rollback)::float8, tup_fetched::float8, \
             tup_inserted::float8, tup_updated::float8, tup_deleted::float8, \
             (pg_current_wal_lsn() - '0/0'::pg_lsn)::float8 \
             FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(&mut self.connection)
        .await
        .map_err(text)?;
        let statements = if self.statements {
            Some(
                sqlx::query_scalar::<_, f64>(
                    "SELECT coalesce(sum(calls), 0)::float8 FROM pg_stat_statements",
                )
                .fetch_one(&mut self.connection)
                .await
                .map_err(text)?,
            )
        } else {
            None
        };
        Ok(Reading {
            xacts: row.try_get(0).map_err(text)?,
            fetched: row.try_get(1).map_err(text)?,
            inserted: row.try_get(2).map_err(text)?,
            updated: row.try_get(3).map_err(text)?,
            deleted: row.try_get(4).map_err(text)?,
            wal_bytes: row.try_get(5).map_err(text)?,
            statements,
            cpu_s: self.postmaster.and_then(procfs::tree_cpu_s),
        })
    }
}

/// The figures per item of what happened between `before` and `after`.
pub(crate) fn figures(before: &Reading, after: &Reading, items: usize) -> Figures {
    #[expect(
        clippy::cast_precision_loss,
        reason = "item counts stay far below 2^52"
    )]
    let n = items.max(1) as f64;
    let mut out = Vec::new();
    if let (Some(a), Some(b)) = (after.statements, before.statements) {
        out.push((super::STATEMENTS, (a - b) / n));
    }
    out.extend([
        (super::XACTS, (after.xacts - before.xacts) / n),
        (super::WAL_BYTES, (after.wal_bytes - before.wal_bytes) / n),
        (super::ROWS_FETCHED, (after.fetched - before.fetched) / n),
        (super::ROWS_INSERTED, (after.inserted - before.inserted) / n),
        (super::ROWS_UPDATED, (after.updated - before.updated) / n),
        (super::ROWS_DELETED, (after.deleted - before.deleted) / n),
    ]);
    if let (Some(a), Some(b)) = (after.cpu_s, before.cpu_s) {
        out.push((super::CPU_MS, per_thousand((a - b) * 1000.0, items)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deltas_are_per_item_and_cpu_only_when_local() {
        let before = Reading {
            xacts: 10.0,
            wal_bytes: 1_000.0,
            cpu_s: Some(1.0),
            ..Reading::default()
        };
        let after = Reading {
            xacts: 2_010.0,
            fetched: 1_000.0,
            deleted: 1_000.0,
            wal_bytes: 501_000.0,
            cpu_s: Some(3.0),
            ..Reading::default()
        };
        let figures = figures(&before, &after, 1_000);
        let get = |metric: &str| figures.iter().find(|f| f.0 == metric).map(|f| f.1);
        assert_eq!(get(super::super::XACTS), Some(2.0));
        assert_eq!(get(super::super::WAL_BYTES), Some(500.0));
        assert_eq!(get(super::super::ROWS_DELETED), Some(1.0));
        assert_eq!(get(super::super::CPU_MS), Some(2_000.0));
        assert_eq!(get(super::super::STATEMENTS), None);
        let remote = Reading {
            cpu_s: None,
            ..after
        };
        assert!(
            super::figures(&before, &remote, 1_000)
                .iter()
                .all(|f| f.0 != super::super::CPU_MS)
        );
    }
}
