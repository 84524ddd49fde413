//! The schema, installed and upgraded by versioned SQL embedded in the crate.
//!
//! Written here rather than with `sqlx::migrate!`: sqlx's migrator keeps its ledger in one
//! table (`_sqlx_migrations`) that the application's own sqlx migrations use too, and it
//! refuses to run when that ledger holds versions it does not know. The queue's ledger is its
//! own table, `workqueue_migrations`, so it lives beside any application schema.
//!
//! The SQL lives in `sql/`: `sql/migrations/000N_*.sql`, each run once, in order, and never
//! edited once released (databases ran it as it was: a change is a new migration, and
//! [`Migration::released`] records each one's checksum, which a unit test holds it to); and
//! `sql/functions.sql`, every function as the migrations leave it, generated from a migrated
//! database by `tests/schema.rs` and never run.

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::{Executor, PgPool};

use crate::error::Error;
use crate::queue::PgQueue;

/// One migration: its version, the oldest schema version whose code still works on the
/// schema it makes, and its SQL.
struct Migration {
    version: i32,
    /// Code built for this version or any newer one runs on the migrated schema. An additive
    /// migration (a new function, table or nullable column) keeps older code's value, so that
    /// the processes of a rolling upgrade that are still old keep starting.
    serves_from: i32,
    sql: &'static str,
    /// The 64-bit FNV-1a of `sql` as it was released: `tests::released_migrations_are_never_edited`
    /// fails when the file's text differs.
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "only the test of released migrations reads it")
    )]
    released: u64,
}

/// The migrations, in order. A released migration is never edited; a change is a new one.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        serves_from: 1,
        sql: include_str!("sql/migrations/0001_schema.sql"),
        released: 0x90a9_51f1_de04_847b,
    },
    // `workqueue_done_get`: a done and the next get in one call. Additive.
    Migration {
        version: 2,
        serves_from: 1,
        sql: include_str!("sql/migrations/0002_done_get.sql"),
        released: 0x1f6a_68fe_84a5_2b76,
    },
    // Items keyed by a hash, queues by id, the ready order by readiness time, batched adds
    // and hand-outs, pause. Breaking: version 2's processes cannot run on it.
    Migration {
        version: 3,
        serves_from: 3,
        sql: include_str!("sql/migrations/0003_keys_and_order.sql"),
        released: 0xdf25_c3d4_b9df_bf14,
    },
    // One lock order everywhere, a step that waits for no row (`workqueue_step`), a failed
    // item's retry fenced like its done (`workqueue_retry_done`), rate-limited batches that
    // spend the bucket in the batch's order. Additive: version 3's processes run on it.
    Migration {
        version: 4,
        serves_from: 3,
        sql: include_str!("sql/migrations/0004_lock_order.sql"),
        released: 0x93f4_5bd0_c078_7bf7,
    },
    // The step waits up to 20 ms for a row another transaction holds (most often the step
    // that handed the lease out, not yet committed) before it gives that done back to be
    // settled in a round trip of its own. Additive.
    Migration {
        version: 5,
        serves_from: 3,
        sql: include_str!("sql/migrations/0005_step_wait.sql"),
        released: 0x3c19_8489_26bc_a67d,
    },
    // Periodic schedules (`workqueue_schedules`, `workqueue_periodic_claim`,
    // `workqueue_periodic_upsert`): a tick taken and its item added in one transaction.
    // Additive.
    Migration {
        version: 6,
        serves_from: 3,
        sql: include_str!("sql/migrations/0006_periodic.sql"),
        released: 0x2dee_1f4b_7424_bf97,
    },
    // Flow control: items' groups, the groups' turns, in-flight limits and hand-out rates
    // (`workqueue_flow`, `workqueue_groups`, `workqueue_arrivals`, `workqueue_flow_get`,
    // `workqueue_enqueue`). Additive: the functions older processes call keep their
    // signatures, and their adds put items in the group "" under flow control.
    Migration {
        version: 7,
        serves_from: 3,
        sql: include_str!("sql/migrations/0007_flow.sql"),
        released: 0x82eb_46dc_53b3_da66,
    },
    // Flow control as the other backends have it: each priority keeps its own turns (a
    // group's places below its highest ready priority, `workqueue_groups.places`), every lease
    // counts (those from before flow control came on too), `workqueue_flow_clear`. Additive.
    Migration {
        version: 8,
        serves_from: 3,
        sql: include_str!("sql/migrations/0008_flow_turns.sql"),
        released: 0xeef1_55f0_5745_1ffd,
    },
    // Trace links: an add's `traceparent` kept beside the item (at most 4), moved to the lease
    // that hands it out, given back by a release or a lost lease (`workqueue_enqueue_traced`,
    // `workqueue_retry_done_traced`; the hand-outs answer two more columns). Additive.
    Migration {
        version: 9,
        serves_from: 3,
        sql: include_str!("sql/migrations/0009_trace_links.sql"),
        released: 0x1ae3_7bb5_3e79_75b5,
    },
    // Grouped hand-outs in bulk: a step gives the slots of the leases it ends back in one
    // call, and a group alone in the turns at its priority takes its hand-outs of a get
    // together (`workqueue_step`, `workqueue_flow_get` replaced). Additive.
    Migration {
        version: 10,
        serves_from: 3,
        sql: include_str!("sql/migrations/0010_bulk_flow.sql"),
        released: 0x02a6_6ba7_e7e2_200b,
    },
    // A lease whose renewal or done waits for its row (an application's transaction holds it)
    // is not taken back meanwhile: those calls take the item's lease lock before the row, and
    // the sweep skips a lease whose lock is held; a renewal reckons its deadline once it has
    // the row (`workqueue_renew`, `workqueue_finish`; `workqueue_done`, `workqueue_reclaim`,
    // `workqueue_retry_done`, `workqueue_step` replaced). Additive.
    Migration {
        version: 11,
        serves_from: 3,
        sql: include_str!("sql/migrations/0011_lease_waits.sql"),
        released: 0x3e30_82e6_9764_3bc1,
    },
];

/// The schema version this crate needs.
pub const SCHEMA_VERSION: i32 = 11;

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> PgQueue<T> {
    /// Installs or upgrades the schema on `pool` (what [`Builder::build`](crate::Builder::build)
    /// does unless built with [`migrate(false)`](crate::Builder::migrate)).
    ///
    /// # Errors
    ///
    /// [`Error::Migrate`] or [`Error::Database`].
    pub async fn migrate(pool: &PgPool) -> Result<(), Error> {
        migrate(pool).await
    }
}

/// Checks, without changing anything, that the database's schema serves this crate: for a
/// process built with [`migrate(false)`](crate::Builder::migrate), whose role may not create
/// tables.
pub(crate) async fn check(pool: &PgPool) -> Result<(), Error> {
    let newest: Option<(i32, Option<i32>)> = sqlx::query_as(
        "SELECT version, serves_from FROM workqueue_migrations ORDER BY version DESC LIMIT 1",
    )
    .fetch_optional(pool)
    .await
    .map_err(|e| {
        Error::Migrate(format!(
            "cannot read the schema's version ({e}): run the migrations once with a role that \
             may create tables (PgQueue::migrate, or build with migrate(true))"
        ))
    })?;
    match newest {
        Some((version, _)) if version == SCHEMA_VERSION => Ok(()),
        Some((version, Some(oldest))) if version > SCHEMA_VERSION && oldest <= SCHEMA_VERSION => {
            Ok(())
        }
        Some((version, _)) if version > SCHEMA_VERSION => Err(Error::Migrate(format!(
            "the database has schema version {version}, newer than this crate's \
             {SCHEMA_VERSION}, and it does not serve code of version {SCHEMA_VERSION}: \
             upgrade this process"
        ))),
        Some((version, _)) => Err(Error::Migrate(format!(
            "the database has schema version {version}, older than this crate's \
             {SCHEMA_VERSION}: run the migrations (PgQueue::migrate) with the owner role"
        ))),
        None => Err(Error::Migrate(
            "the schema is not installed: run the migrations (PgQueue::migrate) with the owner \
             role"
                .into(),
        )),
    }
}

/// Applies the migrations the database lacks, each in its own transaction, under an advisory
/// lock, so that many processes starting at once install the schema once. A schema that is
/// current already is only read, so a role that may not create tables passes.
pub(crate) async fn migrate(pool: &PgPool) -> Result<(), Error> {
    if check(pool).await.is_ok() {
        return Ok(());
    }
    let mut tx = pool.begin().await?;
    // The key is fixed: every process of every queue takes the same lock.
    sqlx::query("SELECT pg_advisory_xact_lock(7310550117463005201)")
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS workqueue_migrations (
            version integer PRIMARY KEY,
            applied_at timestamptz NOT NULL DEFAULT now()
        )",
    )
    .execute(&mut *tx)
    .await?;
    // The oldest code each version serves (see `Migration::serves_from`); empty in rows
    // written before the column existed.
    sqlx::query("ALTER TABLE workqueue_migrations ADD COLUMN IF NOT EXISTS serves_from integer")
        .execute(&mut *tx)
        .await?;
    let newest: Option<(i32, Option<i32>)> = sqlx::query_as(
        "SELECT version, serves_from FROM workqueue_migrations ORDER BY version DESC LIMIT 1",
    )
    .fetch_optional(&mut *tx)
    .await?;
    let applied = newest.map_or(0, |(version, _)| version);
    if let Some((version, serves_from)) = newest.filter(|&(version, _)| version > SCHEMA_VERSION) {
        // A newer process migrated the database: run on it if its schema still serves this
        // crate's code (a rolling upgrade's old processes), refuse otherwise.
        return match serves_from {
            Some(oldest) if oldest <= SCHEMA_VERSION => {
                tx.commit().await?;
                Ok(())
            }
            _ => Err(Error::Migrate(format!(
                "the database has schema version {version}, newer than this crate's \
                 {SCHEMA_VERSION}, and it does not serve code of version {SCHEMA_VERSION}: \
                 upgrade this process"
            ))),
        };
    }
    for migration in MIGRATIONS {
        let version = migration.version;
        if version <= applied {
            continue;
        }
        // Several statements: the simple query protocol (a `&str` without arguments).
        (&mut *tx)
            .execute(migration.sql)
            .await
            .map_err(|e| Error::Migrate(format!("migration {version}: {e}")))?;
        sqlx::query("INSERT INTO workqueue_migrations (version, serves_from) VALUES ($1, $2)")
            .bind(version)
            .bind(migration.serves_from)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{MIGRATIONS, SCHEMA_VERSION};

    /// FNV-1a, 64 bits. A change detector over this crate's own files, not a defence against
    /// anyone (whoever edits a migration can edit its checksum in the same commit; review
    /// sees both): five lines here rather than a dependency for one test.
    fn fnv1a(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    /// A database that ran a migration keeps what it ran: an edit to a released migration
    /// reaches new databases only, and the two then differ silently. So each migration's text
    /// is held to the checksum recorded when it was released.
    #[test]
    fn released_migrations_are_never_edited() {
        for migration in MIGRATIONS {
            let now = fnv1a(migration.sql.as_bytes());
            assert_ne!(
                migration.released, 0,
                "migration {} records no checksum: record `released: {now:#018x}`",
                migration.version
            );
            assert_eq!(
                now,
                migration.released,
                "migration {version} (src/sql/migrations/{version:04}_*.sql) was edited after its \
                 release: its checksum is {now:#018x}, released as {released:#018x}. A database \
                 that ran it keeps the old text, so undo the edit and put the change in a new \
                 migration, {next:04}_*.sql (then regenerate src/sql/functions.sql: WQ_BLESS=1 \
                 cargo test -p workq-postgres --test schema). Only a migration not released yet \
                 may record a new checksum.",
                version = migration.version,
                released = migration.released,
                next = SCHEMA_VERSION + 1,
            );
        }
    }

    /// The migrations are numbered 1, 2, ... in order, the last is [`SCHEMA_VERSION`], each
    /// serves code no newer than itself, and every SQL file of `src/sql/migrations/` is one of
    /// them, in the order of its name: a migration written and not listed never runs.
    #[test]
    fn every_migration_file_runs_in_order() {
        for (i, migration) in MIGRATIONS.iter().enumerate() {
            assert_eq!(usize::try_from(migration.version), Ok(i + 1));
            assert!(migration.serves_from <= migration.version);
        }
        assert_eq!(MIGRATIONS.last().map(|m| m.version), Some(SCHEMA_VERSION));
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/sql/migrations");
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .expect("read src/sql/migrations")
            .map(|entry| entry.expect("a directory entry").path())
            .filter(|path| path.extension().is_some_and(|e| e == "sql"))
            .collect();
        files.sort();
        let names: Vec<_> = files
            .iter()
            .filter_map(|f| f.file_name()?.to_str())
            .collect();
        assert_eq!(
            files.len(),
            MIGRATIONS.len(),
            "src/sql/migrations holds {names:?}; list each in MIGRATIONS"
        );
        for (file, migration) in files.iter().zip(MIGRATIONS) {
            let prefix = format!("{:04}_", migration.version);
            let name = file
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            assert!(
                name.starts_with(&prefix),
                "{name}: migration {} is {prefix}*.sql",
                migration.version
            );
            let text = std::fs::read_to_string(file).expect("read a migration");
            assert!(
                text == migration.sql,
                "{name} is not what MIGRATIONS embeds as version {}",
                migration.version
            );
        }
    }
}
