//! The schema, installed and upgraded by versioned SQL embedded in the crate.
//!
//! Written here rather than with `sqlx::migrate!`: sqlx's migrator keeps its ledger in one
//! table (`_sqlx_migrations`) that the application's own sqlx migrations use too, and it
//! refuses to run when that ledger holds versions it does not know. The queue's ledger is its
//! own table, `workqueue_migrations`, so it lives beside any application schema.

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
}

/// The migrations, in order. A released migration is never edited; a change is a new one.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        serves_from: 1,
        sql: include_str!("sql/migrations/0001_schema.sql"),
    },
    // `workqueue_done_get`: a done and the next get in one call. Additive.
    Migration {
        version: 2,
        serves_from: 1,
        sql: include_str!("sql/migrations/0002_done_get.sql"),
    },
    // Items keyed by a hash, queues by id, the ready order by readiness time, batched adds
    // and hand-outs, pause. Breaking: version 2's processes cannot run on it.
    Migration {
        version: 3,
        serves_from: 3,
        sql: include_str!("sql/migrations/0003_keys_and_order.sql"),
    },
    // One lock order everywhere, a step that waits for no row (`workqueue_step`), a failed
    // item's retry fenced like its done (`workqueue_retry_done`), rate-limited batches that
    // spend the bucket in the batch's order. Additive: version 3's processes run on it.
    Migration {
        version: 4,
        serves_from: 3,
        sql: include_str!("sql/migrations/0004_lock_order.sql"),
    },
];

/// The schema version this crate needs.
pub const SCHEMA_VERSION: i32 = 4;

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
