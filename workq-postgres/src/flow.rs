//! Flow control on PostgreSQL: the settings every process of a queue applies, kept beside the
//! queue, and the operator's view of its groups. The hand-outs themselves are SQL
//! (`workqueue_flow_get` and the functions around it, in `sql/migrations/0007_flow.sql`, whose
//! header describes the tables, the indexes and the lock order).
//!
//! # Settings across processes
//!
//! A process's builder keeps a [`workq::flow::FlowControl`]: the group function, which runs
//! in that process at every add (the group's name travels with the add), and the
//! [`FlowLimits`], which the database keeps in `workqueue_flow` and
//! `workqueue_group_settings` so that every process, and [`PgAdmin`](crate::PgAdmin), applies
//! and shows the same ones.
//!
//! A handle built with flow settings compares them at build with the stored ones and, when
//! they differ, writes its own (`workqueue_flow_set`): **the last one built wins**, and it
//! logs a warning naming the settings it replaced. Every write bumps the queue's
//! `flow_version`; the adds, and the gets that sweep, read it, and a handle built with
//! settings that sees a version it did not write compares the stored settings with its own
//! and, if they differ, logs a warning once per change (it applies the stored ones: the SQL
//! reads them, not the process's).
//!
//! A handle built with **no** flow setting changes nothing in the database: on a queue that
//! has flow control it follows the queue's settings (its gets obey the limits; its adds carry
//! no group, so their items join the group `""`, with a warning at build when the queue
//! groups its items). That is what a producer built without `group_by` would be, so it cannot
//! switch a fleet's flow control off by starting; the handles [`PgAdmin`](crate::PgAdmin)
//! opens do not even read the settings. [`PgQueue::clear_flow_control`](crate::PgQueue::clear_flow_control)
//! takes flow control off on purpose ([`PgQueue::delete`](crate::PgQueue::delete) too, with
//! the rest of the queue).
//!
//! Turning flow control on waits for the adds in progress (they hold the queue's adding lock,
//! shared, until their transactions end), puts the items added without a group in the group
//! `""`, and counts the leases out in their groups (those without one in `""`) and in the
//! queue; a build retries it (the wait is bounded by a lock timeout of a second) until the
//! retry deadline.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use sqlx::PgPool;
use workq::flow::{FlowLimits, HandOutRate};
use workq::{FlowStats, GroupStats};

use crate::error::Error;
use crate::inner::Inner;
use crate::units::{count, int, micros, seconds};

/// The longest group name, in bytes (UTF-8): a group's name is a key of the group's row and
/// of its items' index entries.
pub const MAX_GROUP_BYTES: usize = 1024;

/// Refuses a group name the database cannot keep: longer than [`MAX_GROUP_BYTES`], or holding
/// a NUL (PostgreSQL's text cannot).
pub(crate) fn check_group(name: &str) -> Result<(), Error> {
    if name.len() > MAX_GROUP_BYTES {
        return Err(Error::Config(format!(
            "group_by gave a group name of {} bytes; the limit is {MAX_GROUP_BYTES}",
            name.len()
        )));
    }
    if name.contains('\0') {
        return Err(Error::Config(format!(
            "group_by gave the group name {name:?}, which holds a NUL character"
        )));
    }
    Ok(())
}

/// The row of `workqueue_flow` as [`read`] reads it: grouped, the limits, the rates.
type FlowRow = (
    bool,
    Option<i32>,
    Option<i32>,
    Option<f64>,
    Option<i32>,
    Option<f64>,
    Option<i32>,
);

/// A row of `workqueue_group_settings`: name, limit, weight, rate, burst.
type GroupRow = (String, Option<i32>, Option<i32>, Option<f64>, Option<i32>);

/// A rate as stored, if it is one (a row written by hand may not be).
fn rate(per_second: Option<f64>, burst: Option<i32>) -> Option<HandOutRate> {
    let per_second = per_second.filter(|r| r.is_finite() && *r > 0.0)?;
    let burst = u32::try_from(burst?).ok().filter(|&b| b > 0)?;
    Some(HandOutRate::new(per_second, burst))
}

/// A limit as stored, if it is one.
fn limit(n: Option<i32>) -> Option<usize> {
    n.and_then(|n| usize::try_from(n).ok()).filter(|&n| n > 0)
}

/// The flow limits queue `id` applies (empty when flow control is off), and the version of
/// its settings.
pub(crate) async fn read(pool: &PgPool, id: i32) -> Result<(FlowLimits, i64), sqlx::Error> {
    let (on, version): (bool, i64) =
        sqlx::query_as("SELECT flow, flow_version FROM workqueue_queues WHERE id = $1")
            .bind(id)
            .fetch_optional(pool)
            .await?
            .unwrap_or((false, 0));
    let mut limits = FlowLimits::default();
    if !on {
        return Ok((limits, version));
    }
    let row: Option<FlowRow> = sqlx::query_as(
        "SELECT grouped, max_in_flight, group_max_in_flight, rate, rate_burst, group_rate,
                group_rate_burst
         FROM workqueue_flow WHERE queue = $1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await?;
    if let Some((grouped, max, per_group, r, burst, group_r, group_burst)) = row {
        limits.grouped = grouped;
        limits.max_in_flight = limit(max);
        limits.max_in_flight_per_group = limit(per_group);
        limits.hand_out_rate = rate(r, burst);
        limits.hand_out_rate_per_group = rate(group_r, group_burst);
    }
    let groups: Vec<GroupRow> = sqlx::query_as(
        "SELECT name, max_in_flight, weight, rate, rate_burst
         FROM workqueue_group_settings WHERE queue = $1 ORDER BY name",
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    for (name, max, weight, r, burst) in groups {
        if let Some(max) = limit(max) {
            limits.group_max_in_flight.insert(name.clone(), max);
        }
        if let Some(weight) = weight.and_then(|w| u32::try_from(w).ok()) {
            limits.group_weights.insert(name.clone(), weight.max(1));
        }
        if let Some(r) = rate(r, burst) {
            limits.group_hand_out_rates.insert(name, r);
        }
    }
    Ok((limits, version))
}

/// A rate as `workqueue_flow_set` takes it: per second, burst, interval in µs.
fn rate_args(rate: Option<HandOutRate>) -> (Option<f64>, Option<i32>, Option<i64>) {
    match rate {
        Some(r) => (
            Some(r.per_second),
            Some(int(r.burst)),
            Some(micros(r.interval()).max(1)),
        ),
        None => (None, None, None),
    }
}

/// Writes `limits` as queue `id`'s flow settings (`workqueue_flow_set`) and returns their new
/// version. The adding lock it may wait for is waited for at most a second per attempt: a
/// timeout rolls the call back, and the caller's retries send it again.
async fn write(pool: &PgPool, id: i32, limits: &FlowLimits) -> Result<i64, sqlx::Error> {
    let names: BTreeSet<&String> = limits
        .group_max_in_flight
        .keys()
        .chain(limits.group_weights.keys())
        .chain(limits.group_hand_out_rates.keys())
        .collect();
    let mut group_names = Vec::with_capacity(names.len());
    let (mut limit_of, mut weight_of) = (Vec::new(), Vec::new());
    let (mut rates, mut bursts, mut rates_us) = (Vec::new(), Vec::new(), Vec::new());
    for name in names {
        group_names.push(name.as_str());
        limit_of.push(limits.group_max_in_flight.get(name).map(|&n| int(n)));
        weight_of.push(limits.group_weights.get(name).map(|&w| int(w.max(1))));
        let (r, b, us) = rate_args(limits.group_hand_out_rates.get(name).copied());
        rates.push(r);
        bursts.push(b);
        rates_us.push(us);
    }
    let (rate, burst, rate_us) = rate_args(limits.hand_out_rate);
    let (group_rate, group_burst, group_rate_us) = rate_args(limits.hand_out_rate_per_group);
    let mut tx = pool.begin().await?;
    sqlx::query("SET LOCAL lock_timeout = '1s'")
        .execute(&mut *tx)
        .await?;
    let version: Option<i64> = sqlx::query_scalar(
        "SELECT workqueue_flow_set($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13,
                                   $14, $15, $16, $17)",
    )
    .bind(id)
    .bind(!limits.is_empty())
    .bind(limits.grouped)
    .bind(limits.max_in_flight.map(int))
    .bind(limits.max_in_flight_per_group.map(int))
    .bind(rate)
    .bind(burst)
    .bind(rate_us)
    .bind(group_rate)
    .bind(group_burst)
    .bind(group_rate_us)
    .bind(&group_names)
    .bind(&limit_of)
    .bind(&weight_of)
    .bind(&rates)
    .bind(&bursts)
    .bind(&rates_us)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(version.unwrap_or(0))
}

/// Takes flow control off queue `id` (`workqueue_flow_clear`); whether it had it.
pub(crate) async fn clear(pool: &PgPool, id: i32) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT workqueue_flow_clear($1)")
        .bind(id)
        .fetch_one(pool)
        .await
}

impl Inner {
    /// At build. A handle built with flow settings (`self.flow`) compares them with the
    /// stored ones and writes its own when they differ (the last one built wins). One built
    /// without any (`follow`) changes nothing: on a queue with flow control (`stored_on`) it
    /// reads the settings once, to warn when they group items that its adds cannot group (a
    /// failure to read costs the warning, not the build). The handles of
    /// [`PgAdmin`](crate::PgAdmin) do neither.
    pub(crate) async fn sync_flow(
        &self,
        stored_on: bool,
        version: i64,
        follow: bool,
    ) -> Result<(), Error> {
        let Some(own) = &self.flow else {
            if follow && stored_on {
                match read(&self.pool, self.id).await {
                    Ok((found, _)) => warn_at_build(&self.name, None, Some(&found)),
                    Err(error) => tracing::debug!(queue = %self.name, %error,
                        "workq-postgres: the flow settings could not be read"),
                }
            }
            return Ok(());
        };
        self.flow_seen.store(version, Ordering::Relaxed);
        let (stored, version) = self
            .call("flow settings", || read(&self.pool, self.id))
            .await?;
        if stored == *own {
            self.flow_seen.store(version, Ordering::Relaxed);
            return Ok(());
        }
        let version = self
            .call("flow settings", || write(&self.pool, self.id, own))
            .await?;
        self.flow_seen.store(version, Ordering::Relaxed);
        if stored.is_empty() {
            tracing::info!(queue = %self.name, limits = ?own,
                "workq-postgres: flow control settings written for every process");
        } else {
            warn_at_build(&self.name, Some(&stored), None);
        }
        Ok(())
    }

    /// A statement read the queue's flow settings version `version`: if it is not the one
    /// this handle last wrote or read, and the handle was built with settings, the stored
    /// ones are compared with its own (in the background), and a difference is logged, once
    /// per change.
    pub(crate) fn saw_flow_version(&self, version: Option<i64>) {
        let (Some(version), Some(own)) = (version, &self.flow) else {
            return;
        };
        let seen = self.flow_seen.load(Ordering::Relaxed);
        if version == seen
            || self
                .flow_seen
                .compare_exchange(seen, version, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let Some(me) = self.me.upgrade() else {
            return;
        };
        let own = own.clone();
        tokio::spawn(async move {
            me.compare_flow(&own).await;
        });
    }

    /// Compares the stored flow settings with `own`; logs a difference (flow control taken
    /// off is none: the handle's adds still name their groups, kept in their rows).
    async fn compare_flow(self: Arc<Self>, own: &FlowLimits) {
        match read(&self.pool, self.id).await {
            Ok((stored, _)) if stored != *own && !stored.is_empty() => {
                tracing::warn!(queue = %self.name, stored = ?stored, own = ?own,
                    "workq-postgres: another process replaced this queue's flow control \
                     settings (the last handle built with settings wins); this process applies \
                     the new ones, which are kept in the database");
            }
            Ok(_) => {}
            Err(error) => {
                tracing::debug!(queue = %self.name, %error,
                    "workq-postgres: the flow settings could not be read");
            }
        }
    }
}

/// Logs what a handle finds of the queue's flow control at build: the settings its own
/// replaced (`replaced`), or, for a handle without settings, settings that group the items
/// (`found`), which its adds cannot (it has no group function).
fn warn_at_build(queue: &str, replaced: Option<&FlowLimits>, found: Option<&FlowLimits>) {
    if let Some(previous) = replaced {
        tracing::warn!(
            queue,
            previous = ?previous,
            "workq-postgres: this handle's flow control settings replace other ones another \
             process set (the last handle built with settings wins): every process applies \
             this one's now"
        );
    }
    if found.is_some_and(|found| found.grouped) {
        tracing::warn!(
            queue,
            "workq-postgres: the queue groups its items (another process set its flow \
             control), and this handle has no group function: its adds join the group \"\""
        );
    }
}

/// A group's figures as [`figures`] reads them: name, ready, in flight, the oldest ready
/// item's wait in seconds.
type GroupFigures = (String, i64, i32, Option<f64>);

/// The groups of queue `$1` for operators (at most `$2` group rows and `$2` arrivals, in
/// their keys' order): the groups kept, with the arrivals the next get will fold in added to
/// their ready items (a group that only has arrivals yet is listed too).
const GROUPS: &str = "
    WITH kept AS (
        SELECT name, greatest(ready, 0) AS ready, in_flight, top, saturated
        FROM workqueue_groups WHERE queue = $1 ORDER BY name LIMIT $2
    ), pending AS (
        SELECT a.grp AS name, sum(a.n)::bigint AS n
        FROM (SELECT grp, n FROM workqueue_arrivals WHERE queue = $1 ORDER BY id LIMIT $2) a
        GROUP BY a.grp
    ), groups AS (
        SELECT coalesce(k.name, p.name) AS name,
               coalesce(k.ready, 0) + coalesce(p.n, 0) AS ready,
               coalesce(k.in_flight, 0) AS in_flight,
               k.top IS NOT NULL OR coalesce(p.n, 0) > 0 AS has_ready,
               coalesce(k.saturated, false) AS saturated
        FROM kept k FULL JOIN pending p ON p.name = k.name
    )";

/// Queue `id`'s flow control for operators: its figures, its `top` groups with the most
/// ready items (then the most leases, then by name), and its limits; `None` when it has no
/// flow control. At most `rows` group rows and as many arrivals are read (in their keys'
/// order; `None`: all of them), so the figures of a queue with more live groups than that
/// are those of the first ones.
pub(crate) async fn figures(
    pool: &PgPool,
    id: i32,
    top: i64,
    rows: Option<i64>,
) -> Result<Option<(FlowStats, Vec<GroupStats>, FlowLimits)>, sqlx::Error> {
    let (limits, _) = read(pool, id).await?;
    if limits.is_empty() {
        return Ok(None);
    }
    let (kept, ready, saturated): (i64, i64, i64) = sqlx::query_as(&format!(
        "{GROUPS}
         SELECT count(*), count(*) FILTER (WHERE has_ready), count(*) FILTER (WHERE saturated)
         FROM groups"
    ))
    .bind(id)
    .bind(rows)
    .fetch_one(pool)
    .await?;
    let groups: Vec<GroupFigures> = sqlx::query_as(&format!(
        "{GROUPS}
         SELECT g.name, g.ready, g.in_flight,
                extract(epoch FROM statement_timestamp()
                                   - workqueue_group_oldest($1, g.name))::float8
         FROM (SELECT name, ready, in_flight FROM groups WHERE has_ready OR in_flight > 0
               ORDER BY ready DESC, in_flight DESC, name LIMIT $3) g
         ORDER BY g.ready DESC, g.in_flight DESC, g.name"
    ))
    .bind(id)
    .bind(rows)
    .bind(top)
    .fetch_all(pool)
    .await?;
    let flow = FlowStats::new(count(kept), count(ready), count(saturated));
    let groups = groups
        .into_iter()
        .map(|(name, ready, in_flight, oldest)| {
            let limit = limits.limit_of(&name);
            let mut group = GroupStats::new(name, count(ready), count(in_flight.into()), limit);
            group.oldest_ready = oldest.map(seconds);
            group
        })
        .collect();
    Ok(Some((flow, groups, limits)))
}
