//! The schema, installed and upgraded by versioned SQL embedded in the crate.
//!
//! Written here rather than with `sqlx::migrate!`: sqlx's migrator keeps its ledger in one
//! table (`_sqlx_migrations`) that the application's own sqlx migrations use too, and it
//! refuses to run when that ledger holds versions it does not know. The queue's ledger is its
//! own table, `workqueue_migrations`, so it lives beside any application schema.

use sqlx::{Executor, PgPool};

use crate::error::Error;

/// The migrations, in order: (version, SQL). A released migration is never edited; a change
/// is a new one.
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("../migrations/0001_schema.sql")),
    // `workqueue_done_get`: a done and the next get in one call.
    (2, include_str!("../migrations/0002_done_get.sql")),
];

/// The schema version this crate needs.
pub const SCHEMA_VERSION: i32 = 2;

/// Applies the migrations the database lacks, each in its own transaction, under an advisory
/// lock, so that many processes starting at once install the schema once.
pub(crate) async fn migrate(pool: &PgPool) -> Result<(), Error> {
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
    let applied: Option<i32> = sqlx::query_scalar("SELECT max(version) FROM workqueue_migrations")
        .fetch_one(&mut *tx)
        .await?;
    let applied = applied.unwrap_or(0);
    if applied > SCHEMA_VERSION {
        return Err(Error::Migrate(format!(
            "the database has schema version {applied}, newer than this crate's {SCHEMA_VERSION}"
        )));
    }
    for &(version, sql) in MIGRATIONS {
        if version <= applied {
            continue;
        }
        // Several statements: the simple query protocol (a `&str` without arguments).
        (&mut *tx)
            .execute(sql)
            .await
            .map_err(|e| Error::Migrate(format!("migration {version}: {e}")))?;
        sqlx::query("INSERT INTO workqueue_migrations (version) VALUES ($1)")
            .bind(version)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}
